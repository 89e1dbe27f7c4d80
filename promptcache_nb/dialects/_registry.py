"""The registry of wire formats: :func:`get` by name, :func:`detect` from a body or a stream."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ..usage import Usage, UsageSource
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


#: The ``api`` of :func:`usage_from_openai`: a dialect name (``chat`` and ``responses``: their short forms).
OpenAIApi = Literal["openai-chat", "openai-responses", "chat", "responses"]
_OPENAI_APIS = {"openai-chat": "openai-chat", "openai-responses": "openai-responses", "chat": "openai-chat",
                "responses": "openai-responses"}


def usage_from_anthropic(usage: Any, *, source: UsageSource = "live") -> Usage:
    """Build from an Anthropic ``usage`` object or dict (SDK model or JSON).

    A write with no ``cache_creation`` object (Bedrock, older API versions) keeps its total with an unknown
    split (both parts None, :attr:`~promptcache_nb.usage.Usage.ttl_split_known` False) and the note
    :data:`~promptcache_nb.usage.TTL_SPLIT_UNKNOWN_NOTE`: it is priced at the 5-minute rate, never silently called 5m.

    Server-side compaction (docs/provider_cache_rules.md#anthropic-compaction-usage): the top-level counts
    leave out the ``compaction`` entries of ``usage.iterations``, so each count is the top-level one plus
    those entries' (the documented "sum across all iterations", as the top level is the sum of the others).

    Raises:
        UsageError: a count that is not an int in ``0..MAX_TOKENS``, a ``cache_creation`` or iteration that is
            not an object, or a 5m/1h split above its total, naming the field. Absent counts are None
            (unknown), never 0.

    Example:
        >>> u = usage_from_anthropic({"input_tokens": 180, "output_tokens": 8, "cache_creation_input_tokens": 0,
        ...     "iterations": [{"type": "compaction", "input_tokens": 100, "output_tokens": 82,
        ...                     "cache_creation_input_tokens": 55096}]})
        >>> u.input_tokens, u.cache_creation_input_tokens, u.output_tokens
        (280, 55096, 90)
    """
    return ANTHROPIC.usage(usage, source=source)

def usage_from_openai(usage: Any, *, api: OpenAIApi = "openai-chat", source: UsageSource = "imported") -> Usage:
    """Build from an OpenAI ``usage`` object or dict (Chat Completions or Responses), exactly.

    Chat: ``prompt_tokens``, ``prompt_tokens_details.cached_tokens``, ``completion_tokens``,
    ``completion_tokens_details.reasoning_tokens``. Responses: ``input_tokens``,
    ``input_tokens_details.cached_tokens``, ``output_tokens``, ``output_tokens_details.reasoning_tokens``.
    The prompt figure *includes* the cached tokens (docs/provider_cache_rules.md#openai-usage) and, on models that
    charge for cache writes, the written ones (``*_details.cache_write_tokens``, §2.2), so::

        cache_read_input_tokens     = cached_tokens
        cache_creation_input_tokens = cache_write_tokens, or 0 when not reported
        input_tokens                = prompt - cached - written

    and ``total_input_tokens`` is the prompt figure again. OpenAI writes have no 5m/1h TTLs: the split
    is 0/0 when nothing was written and None (not applicable) when something was. Without any cached
    figure (``*_details`` absent, as some OpenAI-compatible servers send) the split is unknown: input,
    read and write are None. DeepSeek's ``prompt_cache_hit_tokens`` stands in
    for a missing ``cached_tokens`` (the two are equal, §4). Figures are never adjusted.

    Args:
        usage: the ``usage`` object (an SDK model or its JSON dict).
        api: the dialect, ``openai-chat`` (Chat Completions) or ``openai-responses``; ``chat`` and ``responses``
            are accepted too.
        source: ``imported`` (a log) or ``live`` (a response just received).

    Raises:
        UsageError: a shape it does not understand, naming the field (missing prompt figure, a count
            that is not an int in ``0..MAX_TOKENS``, cached + written above the prompt).

    Example:
        >>> u = usage_from_openai({"prompt_tokens": 2006, "completion_tokens": 300,
        ...                        "prompt_tokens_details": {"cached_tokens": 1920}})
        >>> u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.total_input_tokens
        (86, 1920, 0, 2006)
    """
    name = _OPENAI_APIS.get(api)
    if name is None:
        raise ValueError(f"api: must be 'chat' or 'responses' (the dialects openai-chat, openai-responses), "
                         f"got {api!r}")
    return _BY_NAME[name].usage(usage, source=source)
