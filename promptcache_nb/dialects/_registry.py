"""The registry of wire formats: :func:`get` by name, :func:`detect` from a body or a stream."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import anthropic, openai_chat, openai_responses
from ._base import Dialect
from ._sse import SseEvent, StreamSummary, as_pairs

ANTHROPIC: Dialect = anthropic.ANTHROPIC
OPENAI_CHAT: Dialect = openai_chat.OPENAI_CHAT
OPENAI_RESPONSES: Dialect = openai_responses.OPENAI_RESPONSES

_ALL: tuple[Dialect, ...] = (ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES)
_BY_NAME: dict[str, Dialect] = {d.name: d for d in _ALL}
#: The dialects' names, in registry order.
DIALECTS: tuple[str, ...] = tuple(_BY_NAME)
#: The order top-level keys are read in (a body with ``input`` is Responses whatever else it holds).
_BY_KEYS = (OPENAI_RESPONSES, ANTHROPIC, OPENAI_CHAT)


def get(name: str) -> Dialect:
    """The dialect named ``name`` (``anthropic``, ``openai-chat``, ``openai-responses``).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    d = _BY_NAME.get(name)
    if d is None:
        raise ValueError(f"dialect: must be one of {', '.join(DIALECTS)}, got {name!r}")
    return d


def all_dialects() -> tuple[Dialect, ...]:
    """Every registered dialect."""
    return _ALL


def _message_evidence(m: Any, first: bool) -> Dialect | None:
    """Which API a Messages/Chat message can only belong to, if any (``first``: it is ``messages[0]``).

    A ``system`` message is Chat evidence only first: the Messages API takes one mid-conversation, never first
    (docs/provider_cache_rules.md#anthropic-mid-conversation-system-messages), so a later one is judged by its
    content like any message.
    """
    if not isinstance(m, dict):
        return None
    role = m.get("role")
    if role in ("developer", "tool", "function") or (role == "system" and first) or (
            len(m) > 2 and not openai_chat.MESSAGE_KEYS.isdisjoint(m)):
        return OPENAI_CHAT
    content = m.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                t = part.get("type")
                if t in anthropic.ONLY_PARTS or "cache_control" in part:
                    return ANTHROPIC
                if t in openai_chat.ONLY_PARTS:
                    return OPENAI_CHAT
    return None


def detect(body: Mapping[str, Any]) -> Dialect:
    """The API a request body is written for.

    Decided by the first evidence found, cheapest first: top-level keys only one API has (``input`` /
    ``instructions`` → Responses; ``system``, ``thinking`` ... → Anthropic; ``max_completion_tokens``,
    ``response_format`` ... → Chat), then the tools' shape (``input_schema`` vs ``function``), then the
    messages (roles ``developer`` / ``tool``, a first ``system`` message, ``tool_calls``, content part types;
    a later ``system`` message, which both APIs take, tells only when nothing else does: Chat). A body
    with no evidence at all (user/assistant text only) is read as ``anthropic``; pass ``dialect=`` to
    :func:`~promptcache_nb.request.prepare` to say otherwise.
    """
    keys = body.keys()
    for d in _BY_KEYS:
        if not d.only_keys.isdisjoint(keys):
            return d
    tools = body.get("tools")
    if isinstance(tools, list):
        for tool in tools:
            if isinstance(tool, dict):
                if "input_schema" in tool:
                    return ANTHROPIC
                if "function" in tool or tool.get("type") == "function":
                    return OPENAI_CHAT
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, m in enumerate(messages):
            found = _message_evidence(m, i == 0)
            if found is not None:
                return found
        # a later system message and nothing else to tell: Chat, where a system message may stand anywhere
        if any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
            return OPENAI_CHAT
    return ANTHROPIC


def detect_stream(pairs: list[tuple[str | None, Any]]) -> Dialect:
    """The API a stream of server-sent events comes from: the first event one dialect owns (Chat when none)."""
    for name, data in pairs:
        for d in _BY_KEYS:
            if d.owns_stream_event(name, data):
                return d
    return OPENAI_CHAT


def usage_from_sse(events: Iterable[SseEvent | Mapping[str, Any]], provider: str = "auto") -> StreamSummary:
    """Summarise a complete streamed response: final usage, response id, model and rebuilt content.

    Args:
        events: the stream's events, as :class:`SseEvent` or dicts ``{"event": name, "data": str | JSON}``.
        provider: a dialect name (``anthropic``, ``openai-chat``, ``openai-responses``), ``openai`` (Chat or
            Responses, told apart by the events) or ``auto``.

    Example (``body``: a recorded Anthropic stream)::

        summary = usage_from_sse(parse_sse(body), "anthropic")
        summary.usage["output_tokens"]  # the final count from message_delta, not message_start's placeholder
    """
    pairs = as_pairs(events)
    d = _BY_NAME.get(provider)
    if d is None:
        d = detect_stream(pairs)
        if provider == "openai" and d.provider != "openai":
            d = OPENAI_CHAT
    return d.sse_parse(pairs)
