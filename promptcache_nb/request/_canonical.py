"""Canonical JSON and request segments.

A request is the exact JSON body of an API call in one of three *dialects*: ``anthropic`` (Messages),
``openai-chat`` (Chat Completions) or ``openai-responses`` (Responses). Wherever bytes are compared or
hashed we use one canonical serialization: ``json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` encoded as UTF-8.

A request splits into *segments*, in the provider's cache-prefix order (docs/provider_cache_rules.md):

* ``anthropic`` — tools → system → messages (docs/provider_cache_rules.md#anthropic-prefix-order): each
  tool, each system block (or the system string), each message content block (or a message's string content).
  Paths ``tools[3]``, ``system[2]``, ``messages[5].content[0]``. A mid-conversation ``role: "system"`` message
  is a message like any other, at its position in the prefix, with role ``system``
  (docs/provider_cache_rules.md#anthropic-mid-conversation-system-messages).
* ``openai-chat`` — tools → structured-output schema → messages
  (docs/provider_cache_rules.md#openai-prefix-order): each tool,
  ``response_format``, each whole message (``messages[3]``: role, content, ``tool_calls``, ``tool_call_id``
  ... in one segment, so every key round-trips).
* ``openai-responses`` — tools → schema (``text``) → ``instructions`` → input (same section): each tool,
  ``text``, ``instructions``, the ``input`` string or each ``input[5]`` item.

Each segment has a path, a content hash that ignores ``cache_control`` (markers never change what
matches) and a storage hash over its exact bytes. A log that lacks part of the prompt (no system prompt,
no tools) can be given a measured *unlogged prefix*: one synthetic segment first (path
``(unlogged prefix)``, kind ``unlogged``) that carries the measured size and no content
(docs/provider_cache_rules.md#unlogged-prefix).

Segment kinds: ``tool``, ``system``, ``schema``, ``msg-start`` (first block of an Anthropic message),
``msg`` (a later block), ``msg-str`` (string content), ``msg-empty``, ``msg-whole`` (a whole OpenAI chat
message), ``item`` (a Responses input item) and ``unlogged``.
"""

from __future__ import annotations

import copy as _copy
import json
import marshal
import weakref
from dataclasses import dataclass, field
from itertools import accumulate, compress, count, repeat
from operator import attrgetter, eq, is_not, itemgetter
from typing import Any, Literal

from .._util import common_prefix_length, digest
from ..tokens import DEFAULT_TOKENIZER, Tokenizer, segment_tokens

Dialect = Literal["anthropic", "openai-chat", "openai-responses"]
DIALECTS: tuple[str, ...] = ("anthropic", "openai-chat", "openai-responses")
TOP_LEVEL_SEGMENTED = ("tools", "system", "messages")
UNLOGGED_PATH = "(unlogged prefix)"
_TOKENS = attrgetter("tokens")
_NBYTES = attrgetter("nbytes")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_bytes(value: Any) -> bytes:
    """The one byte serialization used for comparing and hashing request JSON."""
    return canonical_json(value).encode("utf-8")


def content_hash(element: Any) -> str:
    """Hash of a segment as the cache sees it: ``cache_control`` removed, everything else exact."""
    if isinstance(element, dict) and "cache_control" in element:
        element = {k: v for k, v in element.items() if k != "cache_control"}
    return digest(canonical_bytes(element), tag="seg")


@dataclass(frozen=True)
class Segment:
    """One cacheable position of a request.

    ``kind`` is one of the kinds listed in the module docstring; ``role`` is set for messages (and
    Responses message items).
    """

    path: str
    kind: str
    role: str | None
    content_hash: str
    block_hash: str
    tokens: int
    cache_control: dict[str, Any] | None
    element: Any = field(repr=False, compare=False)
    nbytes: int = 0
    chain_key: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        # What the store's prefix tree records for this position (kind, role and exact bytes); a plain
        # attribute so per-turn key lists are built at C speed.
        if not self.chain_key:
            object.__setattr__(self, "chain_key", f"{self.kind}:{self.role or ''}:{self.block_hash}")

    @property
    def level(self) -> str:
        """tools, system or messages: the level of the Anthropic invalidation table.

        The unlogged prefix stands for what a partial log lacks (tools and system), so it is ``tools``;
        an OpenAI structured-output schema is "a prefix to the system message", so ``system``.
        """
        kind = self.kind
        if kind == "tool" or kind == "unlogged":
            return "tools"
        return "system" if kind == "system" or kind == "schema" else "messages"


    @property
    def message_index(self) -> int | None:
        """The index of the message (``messages[i]``) or Responses input item (``input[i]``)."""
        path = self.path
        if path.startswith("messages["):
            return int(path[9 : path.index("]")])
        if path.startswith("input["):
            return int(path[6 : path.index("]")])
        return None


class SegmentMemo:
    """Memoises per-segment hashing and token counting so each distinct segment is done once.

    Elements passed with ``trusted=True`` are keyed by identity (strategies rebuild bodies from the
    same history objects every turn and never mutate them); everything else by content hash.

    A tokenizer that picks an estimator per model (``for_model``, the default
    :class:`~promptcache_nb.tokens.ModelTokenizer`) gets one view per estimator (:meth:`for_model`): hashes
    are shared, token counts and segments are not.
    """

    def __init__(self, tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> None:
        self.tokenizer = tokenizer
        self._by_id: dict[int, tuple[Any, str, str, dict | None, int]] = {}
        self._tokens: dict[tuple[str, str], int] = {}
        self._segments: dict[int, Segment] = {}  # trusted elements: the Segment last built for them
        self._views: dict[int, tuple[Tokenizer, SegmentMemo]] = {}

    def for_model(self, model: Any) -> SegmentMemo:
        """The memo counting with ``model``'s estimator (itself when its tokenizer counts every model alike)."""
        pick = getattr(self.tokenizer, "for_model", None)
        if pick is None:
            return self
        tok = pick(model if isinstance(model, str) else str(model or ""))
        if tok is self.tokenizer:
            return self
        got = self._views.get(id(tok))
        if got is None:
            view = SegmentMemo(tok)
            view._by_id = self._by_id  # hashes do not depend on the tokenizer
            got = self._views[id(tok)] = (tok, view)
        return got[1]

    def hashes(self, element: Any, *, trusted: bool) -> tuple[str, str, dict | None, int]:
        """(content hash, storage hash, cache_control, canonical byte length) of one segment."""
        if trusted and not isinstance(element, str):
            hit = self._by_id.get(id(element))
            if hit is not None and hit[0] is element:
                return hit[1], hit[2], hit[3], hit[4]
        cc = element.get("cache_control") if isinstance(element, dict) else None
        exact = canonical_bytes(element)
        if cc is None:
            chash = bhash = digest(exact, tag="seg")
        else:
            chash, bhash = content_hash(element), digest(exact, tag="seg")
        if trusted and not isinstance(element, str):
            self._by_id[id(element)] = (element, chash, bhash, cc, len(exact))
        return chash, bhash, cc, len(exact)

    def tokens(self, kind: str, chash: str, element: Any) -> int:
        frame_class = "msg-start" if kind in ("msg-start", "msg-str") else kind
        key = (frame_class, chash)
        n = self._tokens.get(key)
        if n is None:
            n = segment_tokens(frame_class if kind != "msg-str" else "msg-str", element, self.tokenizer)
            self._tokens[key] = n
        return n


@dataclass(frozen=True)
class PreparedRequest:
    """A request body with its segments, token counts and shape; the unit every later stage uses.

    ``shape`` records how the body's segmented fields looked (absent, string, list), the dialect when it
    is not ``anthropic`` and the unlogged prefix's measured size when there is one: with ``rest`` (the
    other top-level fields) and the segments it rebuilds the exact body (:func:`rebuild_body`).
    ``tokenizer`` names the estimator that counted its tokens (``o200k_base``, ``heuristic-v1``...).
    """

    body: dict[str, Any] = field(repr=False)
    segments: tuple[Segment, ...]
    shape: dict[str, Any]
    rest: dict[str, Any]
    total_tokens: int
    tokenizer: str = field(default="", compare=False)

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def dialect(self) -> str:
        """``anthropic``, ``openai-chat`` or ``openai-responses``."""
        return self.shape.get("dialect", "anthropic")

    @property
    def unlogged_prefix_tokens(self) -> int | None:
        """Measured tokens of the prompt the log did not record (None: the body is complete)."""
        return self.shape.get("unlogged")

    @property
    def canonical(self) -> bytes:
        return canonical_bytes(self.body)

    def cumulative_tokens(self) -> list[int]:
        """Tokens through each segment (computed once per request, extending the previous request's sums
        over the leading segments the two share; treat as read-only)."""
        cum = self.__dict__.get("_cum")
        if cum is None:
            prev, k = prefix_record(self)
            cum = extend_cumulative(self.segments, prev, k)
            object.__setattr__(self, "_cum", cum)
        return cum

    @property
    def segment_bytes(self) -> int:
        """Bytes of the segments' canonical JSON (envelopes not counted)."""
        n = self.__dict__.get("_nbytes")
        if n is None:
            prev, k = prefix_record(self)
            pn = prev.__dict__.get("_nbytes") if prev is not None else None
            segs = self.segments
            if pn is not None and k:  # the previous request's size, its tail after the shared run swapped
                n = pn - sum(map(_NBYTES, prev.segments[k:])) + sum(map(_NBYTES, segs[k:]))  # type: ignore[union-attr]
            else:
                n = sum(map(_NBYTES, segs))
            object.__setattr__(self, "_nbytes", n)
        return n

    def tokens_before_messages(self) -> int:
        return sum(s.tokens for s in self.segments if s.kind in ("tool", "system", "schema", "unlogged"))


class LoggedBody(dict):
    """A request body rebuilt from its segments (``rebuild_body``, ``Store.turn_body``): a plain ``dict``
    equal to the body as logged, which also remembers what :func:`prepare` needs to rebuild the very same
    segments — the dialect when it is not ``anthropic`` and the unlogged prefix's measured size.

    So ``prepare(store.turn_body(sid, i))`` is the stored request again, for every dialect and for partial
    bodies, without every caller having to read the shape. Explicit ``prepare`` arguments win.
    """

    dialect: str | None = None
    unlogged_prefix_tokens: int | None = None


# -- dialects ---------------------------------------------------------------------------------------
# Top-level keys only one API has (the OpenAI and Anthropic API references).
_RESPONSES_KEYS = frozenset({
    "input", "instructions", "previous_response_id", "max_output_tokens", "text", "reasoning", "include",
    "truncation", "conversation", "prompt", "background", "max_tool_calls",
})
_ANTHROPIC_KEYS = frozenset({
    "system", "stop_sequences", "top_k", "thinking", "mcp_servers", "container", "context_management",
    "cache_control", "output_config", "speed",
})
_CHAT_KEYS = frozenset({
    "max_completion_tokens", "response_format", "n", "logprobs", "top_logprobs", "stream_options",
    "frequency_penalty", "presence_penalty", "logit_bias", "seed", "parallel_tool_calls", "reasoning_effort",
    "modalities", "audio", "prediction", "functions", "function_call", "web_search_options", "stop", "store",
    "user", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "verbosity",
})
_CHAT_ROLES: dict[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    # reasoning_content and prefix: DeepSeek's documented extensions of the assistant message
    "assistant": frozenset({"role", "content", "name", "tool_calls", "function_call", "refusal", "audio",
                            "annotations", "reasoning_content", "prefix"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
    "function": frozenset({"role", "content", "name"}),  # deprecated, still accepted by the API
}
_CHAT_PARTS: dict[str, frozenset[str]] = {
    "system": frozenset({"text"}), "developer": frozenset({"text"}), "tool": frozenset({"text"}),
    "function": frozenset({"text"}),
    "user": frozenset({"text", "image_url", "input_audio", "file"}),
    "assistant": frozenset({"text", "refusal"}),
}
_CHAT_ONLY_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
_ANTHROPIC_ONLY_PARTS = frozenset({
    "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking", "server_tool_use",
    "web_search_tool_result", "search_result", "container_upload", "mcp_tool_use", "mcp_tool_result",
})
_CHAT_TOOL_TYPES = frozenset({"function", "custom"})
_RESPONSES_TOOL_TYPES = frozenset({
    "function", "file_search", "computer", "computer_use_preview", "web_search", "web_search_2025_08_26",
    "web_search_preview", "web_search_preview_2025_03_11", "mcp", "code_interpreter",
    "programmatic_tool_calling", "image_generation", "local_shell", "shell", "custom", "namespace",
    "tool_search", "apply_patch",
})
#: Responses input item types (the openai SDK's ``ResponseInputItemParam`` union).
RESPONSES_ITEM_TYPES = frozenset({
    "message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
    "reasoning", "web_search_call", "file_search_call", "computer_call", "computer_call_output",
    "local_shell_call", "local_shell_call_output", "shell_call", "shell_call_output", "apply_patch_call",
    "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "mcp_call",
    "image_generation_call", "code_interpreter_call", "tool_search_call", "tool_search_output",
    "additional_tools", "configuration_update", "compaction", "compaction_trigger", "item_reference",
    "program", "program_output",
})
_RESPONSES_ROLES = frozenset({"user", "assistant", "system", "developer"})
_RESPONSES_PARTS = frozenset({"input_text", "input_image", "input_file", "input_audio", "output_text", "refusal"})


_CHAT_MSG_KEYS = frozenset(_CHAT_ROLES["assistant"] | _CHAT_ROLES["tool"]) - {"role", "content"}


def _message_evidence(m: Any, first: bool) -> str | None:
    """Which API a Messages/Chat message can only belong to, if any (``first``: it is ``messages[0]``).

    A ``system`` message is Chat evidence only first: the Messages API takes one mid-conversation, never first
    (docs/provider_cache_rules.md#anthropic-mid-conversation-system-messages), so a later one is judged by its
    content like any message.
    """
    if not isinstance(m, dict):
        return None
    role = m.get("role")
    if role in ("developer", "tool", "function") or (role == "system" and first) or (
            len(m) > 2 and not _CHAT_MSG_KEYS.isdisjoint(m)):
        return "openai-chat"
    content = m.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                t = part.get("type")
                if t in _ANTHROPIC_ONLY_PARTS or "cache_control" in part:
                    return "anthropic"
                if t in _CHAT_ONLY_PARTS:
                    return "openai-chat"
    return None


def detect_dialect(body: dict[str, Any]) -> str:
    """The API a request body is written for: ``anthropic``, ``openai-chat`` or ``openai-responses``.

    Decided by the first evidence found, cheapest first: top-level keys only one API has (``input`` /
    ``instructions`` → Responses; ``system``, ``thinking`` ... → Anthropic; ``max_completion_tokens``,
    ``response_format`` ... → Chat), then the tools' shape (``input_schema`` vs ``function``), then the
    messages (roles ``developer`` / ``tool``, a first ``system`` message, ``tool_calls``, content part types;
    a later ``system`` message, which both APIs take, tells only when nothing else does: Chat). A body
    with no evidence at all (user/assistant text only) is read as ``anthropic``; pass ``dialect=`` to
    :func:`prepare` to say otherwise.
    """
    keys = body.keys()
    if not _RESPONSES_KEYS.isdisjoint(keys):
        return "openai-responses"
    if not _ANTHROPIC_KEYS.isdisjoint(keys):
        return "anthropic"
    if not _CHAT_KEYS.isdisjoint(keys):
        return "openai-chat"
    tools = body.get("tools")
    if isinstance(tools, list):
        for tool in tools:
            if isinstance(tool, dict):
                if "input_schema" in tool:
                    return "anthropic"
                if "function" in tool or tool.get("type") == "function":
                    return "openai-chat"
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, m in enumerate(messages):
            found = _message_evidence(m, i == 0)
            if found is not None:
                return found
        # a later system message and nothing else to tell: Chat, where a system message may stand anywhere
        if any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
            return "openai-chat"
    return "anthropic"


# -- validation (one-line errors naming the field) ----------------------------------------------------

def _check_body(body: dict[str, Any]) -> None:
    """Reject Messages shapes the API rejects (and that could not round-trip byte for byte)."""
    _check_anthropic_top(body)
    system = body.get("system")
    for i, block in enumerate(system if isinstance(system, list) else ()):
        _check_system_block(i, block)
    for i, m in enumerate(body.get("messages", [])):
        _check_anthropic_message(i, m)


def _check_anthropic_top(body: dict[str, Any]) -> None:
    if "tools" in body and not isinstance(body["tools"], list):
        raise ValueError("tools: must be a list of tool definitions (omit the key for none)")
    if "system" in body and not isinstance(body["system"], str | list):
        raise ValueError("system: must be a string or a list of text blocks (omit the key for none)")
    if not isinstance(body.get("messages", []), list):
        raise ValueError("messages: must be a list")


def _check_system_block(i: int, block: Any) -> None:
    if not isinstance(block, dict):
        raise ValueError(f"system[{i}]: must be a content block object")


def _check_anthropic_message(i: int, m: Any) -> None:
    if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise ValueError(f"messages[{i}]: each message needs 'role' and 'content'")
    extra = set(m) - {"role", "content"}
    if extra:
        raise ValueError(f"messages[{i}]: unsupported keys {sorted(extra)}")
    content = m["content"]
    if not isinstance(content, str | list):
        raise ValueError(f"messages[{i}].content: must be a string or a list of content blocks")
    for j, block in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(block, dict):
            raise ValueError(f"messages[{i}].content[{j}]: must be a content block object")


def _check_tool(i: int, tool: Any, allowed: frozenset[str]) -> None:
    if not isinstance(tool, dict):
        raise ValueError(f"tools[{i}]: must be a tool definition object")
    t = tool.get("type")
    if t not in allowed:
        raise ValueError(f"tools[{i}].type: unknown tool type {t!r}")
    if allowed is _CHAT_TOOL_TYPES:
        inner = tool.get(t)
        if not isinstance(inner, dict) or not isinstance(inner.get("name"), str):
            raise ValueError(f"tools[{i}].{t}: must be an object with a 'name'")


def _check_chat_message(i: int, m: Any) -> None:
    if not isinstance(m, dict):
        raise ValueError(f"messages[{i}]: must be a message object")
    role = m.get("role")
    allowed = _CHAT_ROLES.get(role) if isinstance(role, str) else None
    if allowed is None or not isinstance(role, str):
        raise ValueError(f"messages[{i}].role: unknown role {role!r}")
    for k in m:
        if k not in allowed:
            raise ValueError(f"messages[{i}].{k}: unknown key for a {role!r} message")
    if "content" not in m:
        if role != "assistant" or not (m.get("tool_calls") or m.get("function_call")):
            raise ValueError(f"messages[{i}].content: missing")
    content = m.get("content")
    if content is None:
        if role not in ("assistant", "function"):
            raise ValueError(f"messages[{i}].content: must be a string or a list of content parts")
    elif isinstance(content, list):
        parts = _CHAT_PARTS[role]
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise ValueError(f"messages[{i}].content[{j}]: must be a content part object")
            if part.get("type") not in parts:
                raise ValueError(
                    f"messages[{i}].content[{j}].type: unknown content part type {part.get('type')!r} "
                    f"for a {role!r} message")
    elif not isinstance(content, str):
        raise ValueError(f"messages[{i}].content: must be a string or a list of content parts")
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise ValueError(f"messages[{i}].tool_call_id: required (a string) for a 'tool' message")
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise ValueError(f"messages[{i}].tool_calls: must be a list")
        for j, call in enumerate(calls):
            t = call.get("type") if isinstance(call, dict) else None
            if t not in _CHAT_TOOL_TYPES:
                raise ValueError(f"messages[{i}].tool_calls[{j}].type: unknown tool call type {t!r}")
            if not isinstance(call.get(t), dict):
                raise ValueError(f"messages[{i}].tool_calls[{j}].{t}: must be an object")


def _check_item(i: int, item: Any) -> None:
    if not isinstance(item, dict):
        raise ValueError(f"input[{i}]: must be an input item object")
    t = item.get("type")
    if t is None:
        if "role" in item:
            t = "message"  # an EasyInputMessage: the type is optional
        elif set(item) == {"id"}:
            return  # an item_reference: the type is optional
        else:
            raise ValueError(f"input[{i}].type: missing (an item needs a type, or role and content)")
    if t not in RESPONSES_ITEM_TYPES:
        raise ValueError(f"input[{i}].type: unknown item type {t!r}")
    if t != "message":
        return
    role = item.get("role")
    if role not in _RESPONSES_ROLES:
        raise ValueError(f"input[{i}].role: unknown role {role!r}")
    content = item.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            pt = part.get("type") if isinstance(part, dict) else None
            if pt not in _RESPONSES_PARTS:
                raise ValueError(f"input[{i}].content[{j}].type: unknown content part type {pt!r}")
    elif not isinstance(content, str):
        raise ValueError(f"input[{i}].content: must be a string or a list of content parts")


# -- prepare ---------------------------------------------------------------------------------------

def unlogged_segment(tokens: int) -> Segment:
    """The synthetic first segment of a partial body: ``tokens`` measured, no content.

    Its element is a small marker (``{"unlogged_prefix_tokens": N}``), so its hashes — and with them the
    prefix chains of every cache model — change exactly when the measured size changes.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"unlogged_prefix_tokens: must be a non-negative int, got {tokens!r}")
    marker = {"unlogged_prefix_tokens": tokens}
    h = digest(canonical_bytes(marker), tag="seg")
    return Segment(UNLOGGED_PATH, "unlogged", None, h, h, tokens, None, marker, 0)


def prepare(
    body: dict[str, Any], *, memo: SegmentMemo | None = None, trusted: bool = False,
    previous: PreparedRequest | None = None, dialect: str | None = None,
    unlogged_prefix_tokens: int | None = None, copy: bool = False,
) -> PreparedRequest:
    """Split a request body into segments (hashes and estimated tokens), in cache-prefix order.

    Args:
        body: an Anthropic Messages, OpenAI Chat Completions or OpenAI Responses body.
        memo: per-segment hashing / token memo (the session's, so its tokenizer counts); the estimator of
            the body's ``model`` is used (:meth:`SegmentMemo.for_model`).
        trusted: the body was built by our strategies from immutable history objects: with ``previous``,
            messages that are the very same objects at the same index reuse its segments.
        previous: the request before this one. For untrusted bodies (imports, ``Session.record``) every
            tool, system block, message and input item that is *exactly* the previous body's at the same
            index reuses its segments, so only the new tail is validated, hashed and counted. "Exactly"
            is checked on ``marshal`` bytes (C speed): unlike ``==`` they tell ``1``, ``1.0`` and ``True``
            apart (whose canonical JSON differs), so a reused segment's bytes are the current body's.
            ``previous`` must not have been mutated since it was prepared. A message list
            :func:`~promptcache_nb.request.validate_request` (with a ``previous``) checked last is not marshalled
            again (``Session.record`` and imports check, then prepare): do not change it in place in between.
        dialect: ``anthropic``, ``openai-chat`` or ``openai-responses``; detected from the body when
            omitted (:func:`detect_dialect`).
        unlogged_prefix_tokens: measured tokens of a prompt prefix the log did not record (a partial
            body): one synthetic ``unlogged`` segment first (see :func:`unlogged_segment`).
        copy: the returned request owns its body: new parts are deep copies and unchanged parts are
            ``previous.body``'s (already owned) objects — a deep copy at the cost of the new tail.

    Raises:
        ValueError: a shape the API would reject or this model does not understand, in one line that
            names the field (``input[4].type: unknown item type 'foo'``).

    Example:
        >>> from promptcache_nb.request import prepare
        >>> p = prepare({"model": "gpt-4o", "messages": [
        ...     {"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]})
        >>> p.dialect, [s.path for s in p.segments]
        ('openai-chat', ['messages[0]', 'messages[1]'])
    """
    dialect, pinned, unlogged_prefix_tokens = _read_arguments(body, dialect, unlogged_prefix_tokens)
    memo = (memo or SegmentMemo()).for_model(body.get("model"))  # the estimator of this body's model
    if trusted and dialect == "anthropic" and not copy and not pinned:
        return _prepare_trusted(body, memo, previous, unlogged_prefix_tokens)
    return _Builder(body, dialect, memo, previous, unlogged_prefix_tokens, copy, pinned).build()


def _read_arguments(body: Any, dialect: str | None, unlogged: int | None) -> tuple[str, bool, int | None]:
    """How :func:`prepare` (and :class:`BodyPlan`) reads a body and its arguments: (dialect, pinned, unlogged
    prefix tokens).

    A :class:`LoggedBody` supplies what is not given; ``pinned`` is an explicit ``anthropic`` the body
    alone would not tell (the shape must record it).
    """
    if dialect is None:
        dialect = getattr(body, "dialect", None)
    if unlogged is None:
        unlogged = getattr(body, "unlogged_prefix_tokens", None)
    if not isinstance(body, dict):
        raise TypeError(f"request body must be a dict, got {type(body).__name__}")
    pinned = False
    if dialect is None:
        dialect = detect_dialect(body)
    elif dialect not in DIALECTS:
        raise ValueError(f"dialect: must be one of {', '.join(DIALECTS)}, got {dialect!r}")
    elif dialect == "anthropic":
        pinned = detect_dialect(body) != "anthropic"
    return dialect, pinned, unlogged


def _prepare_trusted(
    body: dict[str, Any], memo: SegmentMemo, previous: PreparedRequest | None, unlogged: int | None,
) -> PreparedRequest:
    """Messages bodies our strategies built from immutable history objects: messages that are the very
    same objects at the same index reuse the previous request's segments wholesale, so a turn costs
    O(messages), not O(blocks), in Python."""
    segs: list[Segment] = []
    shape: dict[str, Any] = {}

    cached = memo._segments

    def add(path: str, kind: str, role: str | None, element: Any) -> None:
        # the same history object at the same position: reuse its Segment (the common case)
        seg = cached.get(id(element))
        if (seg is not None and seg.element is element and seg.path == path and seg.kind == kind
                and seg.role == role):
            segs.append(seg)
            return
        chash, bhash, cc, nbytes = memo.hashes(element, trusted=True)
        seg = Segment(path, kind, role, chash, bhash, memo.tokens(kind, chash, element), cc, element, nbytes)
        if not isinstance(element, str):
            cached[id(element)] = seg
        segs.append(seg)

    if unlogged is not None:
        segs.append(unlogged_segment(unlogged))
    tools = body.get("tools")
    if tools is None:
        shape["tools"] = "absent"
    else:
        shape["tools"] = "list"
        for i, tool in enumerate(tools):
            add(f"tools[{i}]", "tool", None, tool)
    system = body.get("system")
    if system is None:
        shape["system"] = "absent"
    elif isinstance(system, str):
        shape["system"] = "str"
        add("system", "system", None, system)
    else:
        shape["system"] = "list"
        for i, block in enumerate(system):
            add(f"system[{i}]", "system", None, block)
    messages = body.get("messages")
    shape["messages"] = "absent" if messages is None else "list"
    if unlogged is not None:
        shape["unlogged"] = unlogged
    prev_msgs: list = []
    prev_spans: list[tuple[int, int]] = []
    if (previous is not None and previous.__dict__.get("_msg_spans") is not None
            and previous.tokenizer == memo.tokenizer.name):
        prev_msgs = previous.body.get("messages") or []
        prev_spans = previous.__dict__["_msg_spans"]
    spans: list[tuple[int, int]] = []
    msgs = messages or []
    m0 = len(segs)  # where the messages start
    # the leading run of segments equal to the previous request's at the same positions (tools and system
    # blocks a strategy rebuilds each turn are equal, not the same objects: a short compare)
    run = common_prefix_length(tuple(segs), previous.segments[:m0]) if prev_spans else 0  # type: ignore[union-attr]
    k = identity_prefix(msgs, prev_msgs) if prev_spans else 0
    k = min(k, len(prev_spans))
    if k:
        # the leading messages that are the previous body's very objects: their segments and spans in one
        # slice each, so a turn's Python work is its new messages only
        a0, b0 = prev_spans[0][0], prev_spans[k - 1][1]
        segs.extend(previous.segments[a0:b0])  # type: ignore[union-attr]
        spans = prev_spans[:k] if a0 == m0 else [(a + m0 - a0, b + m0 - a0) for a, b in prev_spans[:k]]
        if run == m0 and a0 == m0:
            run = b0
    for i in range(k, len(msgs)):
        msg = msgs[i]
        start = len(segs)
        if i < len(prev_spans) and msg is prev_msgs[i]:
            a, b = prev_spans[i]
            segs.extend(previous.segments[a:b])  # type: ignore[union-attr]
            spans.append((start, len(segs)))
            continue
        role, content = msg["role"], msg["content"]
        if isinstance(content, str):
            add(f"messages[{i}].content", "msg-str", role, content)
        elif not content:
            add(f"messages[{i}].content", "msg-empty", role, content)
        else:
            for j, block in enumerate(content):
                add(f"messages[{i}].content[{j}]", "msg-start" if j == 0 else "msg", role, block)
        spans.append((start, len(segs)))
    rest = {key: v for key, v in body.items() if key not in TOP_LEVEL_SEGMENTED}
    cum = extend_cumulative(segs, previous, run)
    req = PreparedRequest(body, tuple(segs), shape, rest, cum[-1] if cum else 0, memo.tokenizer.name)
    object.__setattr__(req, "_msg_spans", spans)
    object.__setattr__(req, "_cum", cum)
    mark_prefix(req, previous, run)
    return req


_EXACT = object()  # placeholder of an element marshal cannot serialise: never equal to anything


def _snapshots(units: list[Any]) -> list[Any]:
    """Per-unit ``marshal`` (format 2) bytes: type-exact, C-speed, no object references or interning.

    Equal bytes mean equal values of equal types (``1``, ``1.0`` and ``True`` differ, floats bit for
    bit), hence equal canonical JSON. Format 2 is used because later formats add back-references that
    depend on reference counts, which would make equal bodies look different.
    """
    try:
        return list(map(marshal.dumps, units, repeat(2)))
    except ValueError:  # something JSON-encodable marshal does not know: compare it as "different"
        out: list[Any] = []
        for u in units:
            try:
                out.append(marshal.dumps(u, 2))
            except ValueError:
                out.append(object())
        return out


#: The unit list whose bytes were computed last by :func:`remember_snapshots` (``validate_request``'s message or input
#: list), and those bytes. Two more uses of that very list follow it in an import or ``Session.record``: the
#: ``prepare`` of the same body, and the next request's check (whose ``previous`` it is); both take the bytes from
#: here instead of marshalling the list again. One entry; like ``previous``, the list must not be changed between.
_LAST_SNAPSHOTS: list[tuple[list[Any], list[Any]]] = []


def remembered_snapshots(units: list[Any]) -> list[Any] | None:
    """:func:`_snapshots` of ``units`` if they are the very list remembered last (and as long), else None."""
    last = _LAST_SNAPSHOTS[0] if _LAST_SNAPSHOTS else None
    return last[1] if last is not None and last[0] is units and len(last[1]) == len(units) else None


def remember_snapshots(units: list[Any], snaps: list[Any] | None = None) -> list[Any]:
    """:func:`_snapshots` of ``units`` (or ``snaps``, the caller's), remembered for the next uses of the same list."""
    if snaps is None:
        snaps = remembered_snapshots(units)
    if snaps is None:
        snaps = _snapshots(units)
    _LAST_SNAPSHOTS[:] = [(units, snaps)]
    return snaps


def _hand_over_snapshots(logged: dict[str, Any], owned: dict[str, Any]) -> None:
    """``prepare(copy=True)`` stored a copy of the unit list remembered last: the next request's check compares
    against that copy (its ``previous``), so the remembered bytes (equal values, hence equal bytes) move to it."""
    last = _LAST_SNAPSHOTS[0] if _LAST_SNAPSHOTS else None
    if last is None:
        return
    for key, units in logged.items():
        if units is last[0] and isinstance(owned.get(key), list) and len(owned[key]) == len(units):
            _LAST_SNAPSHOTS[:] = [(owned[key], last[1])]
            return


class _Builder:
    """One untrusted ``prepare``: sections in cache-prefix order, each a list of *units* (a tool, a
    system block, a message, an input item) that turn into one or more segments."""

    # BodyPlan's two partial modes (a whole prepare sets neither):
    plan: list[tuple[str, list[Any], Any]] | None = None  # planning: (key, units, emit) recorded, nothing built
    keys: list[tuple[str, str, str | None, str]] | None = None  # planning: (content hash, kind, role, path) emitted
    until: int | None = None  # a prefix: build only the units that make the first ``until`` segments
    cut = False  # ... and some units were left out

    def __init__(self, body: dict[str, Any], dialect: str, memo: SegmentMemo,
                 previous: PreparedRequest | None, unlogged: int | None, copy_: bool, pinned: bool) -> None:
        self.body, self.dialect, self.memo, self.unlogged, self.copy = body, dialect, memo, unlogged, copy_
        usable = (previous is not None and previous.dialect == dialect
                  and previous.__dict__.get("_units") is not None
                  and previous.tokenizer == memo.tokenizer.name)  # its segments' counts are this estimator's
        self.previous = previous if usable else None
        self.segs: list[Segment] = []
        self.shape: dict[str, Any] = {} if dialect == "anthropic" and not pinned else {"dialect": dialect}
        self.units: dict[str, list[tuple[int, int]]] = {}
        self.snaps: dict[str, list[Any]] = {}
        self.owned: dict[str, Any] = {}  # copy=True: segmented key -> the owned value
        # the leading run of segments that are the previous request's objects at the same positions
        self.run, self.run_len = self.previous is not None, 0

    # -- helpers ----------------------------------------------------------------------------------
    def seg(self, path: str, kind: str, role: str | None, element: Any) -> None:
        memo = self.memo
        chash, bhash, cc, nbytes = memo.hashes(element, trusted=False)
        if self.keys is not None:  # planning: what a diff compares, no token count
            self.keys.append((chash, kind, role, path))
            return
        self.segs.append(
            Segment(path, kind, role, chash, bhash, memo.tokens(kind, chash, element), cc, element, nbytes))

    def section(self, key: str, units: list[Any], emit: Any, *, scalar: bool = False) -> None:
        """Segments of one section's units; units exactly equal to the previous body's at the same index
        reuse its segments (and, with ``copy``, its objects).

        The leading run of equal units is taken in bulk (slices, at C speed); only the units after it go
        through the Python loop — usually just the new tail.
        """
        if self.plan is not None:
            self.plan.append((key, units, emit))
            return
        prev = self.previous
        segs = self.segs
        k = 0
        tail: list[bool] = []  # reuse flags for units k.. that the previous body also has
        prev_units = prev_spans = None
        if prev is not None and prev.shape.get(key) == self.shape.get(key):  # same shape: str vs list
            prev_spans = prev.__dict__["_units"].get(key)
        if prev is not None and prev_spans:
            prev_snaps = _prev_snapshots(prev, key)
            cur = remembered_snapshots(units)  # the list validate_request just checked: its bytes are known
            if cur is None:
                cur = _snapshots(units)
            n = min(len(cur), len(prev_snaps))
            k = common_prefix_length(cur[:n], prev_snaps[:n])
            tail = list(map(eq, cur[k:n], prev_snaps[k:n]))
            # share the previous request's bytes for equal units: memory stays O(unique content)
            self.snaps[key] = (prev_snaps[:k] + [p if r else c for c, p, r in zip(cur[k:n], prev_snaps[k:n], tail,
                                                                                  strict=True)] + cur[n:])
            prev_units = _units_of(prev.body, key)
        spans: list[tuple[int, int]] = []
        owned: list[Any] = []
        if k:
            a0 = prev_spans[0][0]  # type: ignore[index]
            start = len(segs)
            segs.extend(prev.segments[a0 : prev_spans[k - 1][1]])  # type: ignore[union-attr, index]
            shift = start - a0
            spans = prev_spans[:k] if shift == 0 else [(a + shift, b + shift) for a, b in prev_spans[:k]]  # type: ignore[index]
            if self.copy:
                owned = prev_units[:k]  # type: ignore[index]
            if self.run and shift == 0:
                self.run_len = len(segs)
            else:
                self.run = False
        for i in range(k, len(units)):
            if self.until is not None and len(segs) >= self.until:
                self.cut = True
                break
            unit = units[i]
            start = len(segs)
            j = i - k
            if j < len(tail) and tail[j]:
                a, b = prev_spans[i]  # type: ignore[index]
                segs.extend(prev.segments[a:b])  # type: ignore[union-attr]
                if self.copy:
                    owned.append(prev_units[i])  # type: ignore[index]
                if self.run and a == start:
                    self.run_len = len(segs)
                else:
                    self.run = False
            else:
                self.run = False
                if self.copy:
                    unit = _copy.deepcopy(unit)
                    owned.append(unit)
                emit(i, unit)
            spans.append((start, len(segs)))
        self.units[key] = spans
        if self.copy:
            self.owned[key] = owned[0] if scalar else owned

    # -- per dialect ------------------------------------------------------------------------------
    def build(self) -> PreparedRequest:
        body, shape, prev = self.body, self.shape, self.previous
        if self.unlogged is not None:
            first = prev.segments[0] if prev is not None and prev.segments else None
            if first is not None and first.kind == "unlogged" and first.tokens == self.unlogged:
                self.segs.append(first)
                self.run_len = 1
            else:
                self.segs.append(unlogged_segment(self.unlogged))
                self.run = False
        segmented = getattr(self, "_" + self.dialect.replace("-", "_"))()
        if self.unlogged is not None:
            shape["unlogged"] = self.unlogged
        rest = {k: v for k, v in body.items() if k not in segmented}
        if self.copy:
            rest = _copy.deepcopy(rest)
            owned = self.owned
            body = {k: (owned[k] if k in owned else rest[k]) for k in body}
        cum = extend_cumulative(self.segs, prev, self.run_len)
        req = PreparedRequest(body, tuple(self.segs), shape, rest, cum[-1] if cum else 0, self.memo.tokenizer.name)
        object.__setattr__(req, "_cum", cum)
        if self.cut:  # a prefix (BodyPlan.prefix): never a ``previous`` to reuse units from
            object.__setattr__(req, "_partial", True)
            return req
        object.__setattr__(req, "_units", self.units)
        object.__setattr__(req, "_snaps", self.snaps)
        if self.copy:
            _hand_over_snapshots(self.body, body)
        if prev is not None:
            object.__setattr__(req, "_prefix_of", (weakref.ref(prev), self.run_len))
        if self.dialect == "anthropic":
            object.__setattr__(req, "_msg_spans", self.units.get("messages", []))
        return req

    def _anthropic(self) -> tuple[str, ...]:
        body, shape = self.body, self.shape
        _check_anthropic_top(body)
        tools = body.get("tools")
        shape["tools"] = "absent" if tools is None else "list"
        if tools is not None:
            self.section("tools", tools, lambda i, t: self.seg(f"tools[{i}]", "tool", None, t))
        system = body.get("system")
        if system is None:
            shape["system"] = "absent"
        elif isinstance(system, str):
            shape["system"] = "str"
            self.section("system", [system], lambda i, s: self.seg("system", "system", None, s), scalar=True)
        else:
            shape["system"] = "list"

            def system_block(i: int, block: Any) -> None:
                _check_system_block(i, block)
                self.seg(f"system[{i}]", "system", None, block)

            self.section("system", system, system_block)
        messages = body.get("messages")
        shape["messages"] = "absent" if messages is None else "list"

        def message(i: int, msg: Any) -> None:
            _check_anthropic_message(i, msg)
            role, content = msg["role"], msg["content"]
            if isinstance(content, str):
                self.seg(f"messages[{i}].content", "msg-str", role, content)
            elif not content:
                self.seg(f"messages[{i}].content", "msg-empty", role, content)
            else:
                for j, block in enumerate(content):
                    self.seg(f"messages[{i}].content[{j}]", "msg-start" if j == 0 else "msg", role, block)

        if messages is not None:
            self.section("messages", messages, message)
        return TOP_LEVEL_SEGMENTED

    def _tools(self, allowed: frozenset[str]) -> list[str]:
        tools = self.body.get("tools")
        if tools is None:
            self.shape["tools"] = "absent"
            return []
        if not isinstance(tools, list):
            raise ValueError("tools: must be a list of tool definitions")
        self.shape["tools"] = "list"

        def tool(i: int, t: Any) -> None:
            _check_tool(i, t, allowed)
            self.seg(f"tools[{i}]", "tool", None, t)

        self.section("tools", tools, tool)
        return ["tools"]

    def _schema(self, key: str) -> list[str]:
        value = self.body.get(key)
        if value is None:
            return []
        if not isinstance(value, dict):
            raise ValueError(f"{key}: must be an object")
        self.section(key, [value], lambda i, v: self.seg(key, "schema", None, v), scalar=True)
        return [key]

    def _openai_chat(self) -> list[str]:
        body, shape = self.body, self.shape
        if "input" in body or "system" in body:
            raise ValueError(f"{'input' if 'input' in body else 'system'}: not a Chat Completions field")
        segmented = self._tools(_CHAT_TOOL_TYPES) + self._schema("response_format")
        messages = body.get("messages")
        if messages is None:
            shape["messages"] = "absent"
            return segmented
        if not isinstance(messages, list):
            raise ValueError("messages: must be a list")
        shape["messages"] = "list"

        def message(i: int, m: Any) -> None:
            _check_chat_message(i, m)
            self.seg(f"messages[{i}]", "msg-whole", m["role"], m)

        self.section("messages", messages, message)
        return [*segmented, "messages"]

    def _openai_responses(self) -> list[str]:
        body, shape = self.body, self.shape
        if "messages" in body or "system" in body:
            raise ValueError(f"{'messages' if 'messages' in body else 'system'}: not a Responses field")
        segmented = self._tools(_RESPONSES_TOOL_TYPES) + self._schema("text")
        instructions = body.get("instructions")
        if instructions is None:
            shape["instructions"] = "absent"
        elif isinstance(instructions, str):
            shape["instructions"] = "str"
            self.section("instructions", [instructions],
                         lambda i, s: self.seg("instructions", "system", None, s), scalar=True)
            segmented.append("instructions")
        else:
            raise ValueError("instructions: must be a string")
        inp = body.get("input")
        if inp is None:
            shape["input"] = "absent"
        elif isinstance(inp, str):
            shape["input"] = "str"
            self.section("input", [inp], lambda i, s: self.seg("input", "msg-str", "user", s), scalar=True)
            segmented.append("input")
        elif isinstance(inp, list):
            shape["input"] = "list"

            def item(i: int, it: Any) -> None:
                _check_item(i, it)
                self.seg(f"input[{i}]", "item", it.get("role"), it)

            self.section("input", inp, item)
            segmented.append("input")
        else:
            raise ValueError("input: must be a string or a list of input items")
        return segmented


_CONTENT = itemgetter("content")


def _messages_width(messages: list[Any]) -> int:
    """Segments of Messages messages, as ``_Builder._anthropic`` splits them: one per content block, one for
    string or empty content (C-speed passes, bar one type test per message)."""
    contents = list(map(_CONTENT, messages))
    lists = [c for c in contents if isinstance(c, list)]
    return len(contents) - len(lists) + sum(map(len, lists)) + lists.count([])


class BodyPlan:
    """A request body's segmented sections in cache-prefix order, planned without building a segment: for
    reading part of a body (:func:`~promptcache_nb.diff` of raw bodies stops at the first divergence).

    Everything it builds is what :func:`prepare` builds, by the same code and memo: :meth:`unit_keys`
    (one unit's segment keys, no token count), :meth:`prefix` (the request through its first ``n``
    segments) and :meth:`prepared` (``prepare(body)`` itself, on first call). Only the top-level shape is
    checked up front; a unit is validated when something builds it.

    ``sections`` lists the non-empty sections as (key, units); a partial body's unlogged prefix is a section
    of its own (key ``(unlogged prefix)``, one unit: the measured size). ``shape``, ``rest`` and
    ``dialect`` are the prepared request's.
    """

    def __init__(self, body: dict[str, Any], *, memo: SegmentMemo | None = None, dialect: str | None = None,
                 unlogged_prefix_tokens: int | None = None) -> None:
        self.body = body
        self._arguments = (dialect, unlogged_prefix_tokens)
        self.dialect, self._pinned, self.unlogged = _read_arguments(body, dialect, unlogged_prefix_tokens)
        self._memo = memo or SegmentMemo()
        self._planner = self._builder()
        planner = self._planner
        planner.plan = []
        segmented = getattr(planner, "_" + self.dialect.replace("-", "_"))()
        if self.unlogged is not None:
            planner.shape["unlogged"] = self.unlogged
        self.shape = planner.shape
        self.rest = {k: v for k, v in body.items() if k not in segmented}
        self.sections: list[tuple[str, list[Any]]] = [(key, units) for key, units, _ in planner.plan if units]
        self._emit = [emit for _, units, emit in planner.plan if units]
        if self.unlogged is not None:
            self.sections.insert(0, (UNLOGGED_PATH, [self.unlogged]))
            self._emit.insert(0, None)
        self._keys: dict[tuple[int, int], list[tuple[str, str, str | None, str]]] = {}
        self._prefixes: dict[int, PreparedRequest] = {}
        self._whole: PreparedRequest | None = None
        self._n_segments: int | None = None

    def _builder(self) -> _Builder:
        memo = self._memo.for_model(self.body.get("model"))
        return _Builder(self.body, self.dialect, memo, None, self.unlogged, False, self._pinned)

    def width(self, section: int, start: int, stop: int) -> int:
        """How many segments units ``[start, stop)`` of a section make."""
        key, units = self.sections[section]
        if key == "messages" and self.dialect == "anthropic":
            return _messages_width(units[start:stop])
        return stop - start

    @property
    def n_segments(self) -> int:
        """``len(prepare(body).segments)``, from the units alone."""
        if self._n_segments is None:
            self._n_segments = sum(self.width(s, 0, len(units)) for s, (_, units) in enumerate(self.sections))
        return self._n_segments

    def unit_keys(self, section: int, index: int) -> list[tuple[str, str, str | None, str]]:
        """(content hash, kind, role, path) of each segment of one unit, as ``prepare`` builds them (the unit
        is validated; no token is counted)."""
        got = self._keys.get((section, index))
        if got is None:
            units = self.sections[section][1]
            emit = self._emit[section]
            if emit is None:  # the unlogged prefix
                seg = unlogged_segment(units[0])
                got = [(seg.content_hash, seg.kind, seg.role, seg.path)]
            else:
                planner = self._planner
                planner.keys = got = []
                try:
                    emit(index, units[index])
                finally:
                    planner.keys = None
            self._keys[(section, index)] = got
        return got

    def prefix(self, n: int) -> PreparedRequest:
        """The request through (at least) its first ``n`` segments: ``prepare``'s very segments, hashes and
        token counts; the whole request when ``n`` reaches its end. A shorter one is for reading only (the
        segments after are missing)."""
        if n >= self.n_segments:
            return self.prepared()
        got = self._prefixes.get(n)
        if got is None:
            builder = self._builder()
            builder.until = n
            got = self._prefixes[n] = builder.build()
        return got

    def prepared(self) -> PreparedRequest:
        """``prepare(body)`` with this plan's memo (built on the first call)."""
        if self._whole is None:
            dialect, unlogged = self._arguments
            self._whole = prepare(self.body, memo=self._memo, dialect=dialect, unlogged_prefix_tokens=unlogged)
        return self._whole


def prefix_record(p: PreparedRequest) -> tuple[PreparedRequest | None, int]:
    """(the previous request, how many leading segments ``p`` shares with it: :func:`shared_prefix_of`);
    (None, 0) when unknown."""
    rec = p.__dict__.get("_prefix_of")
    if rec is None:
        return None, 0
    prev = rec[0]()
    return (prev, rec[1]) if prev is not None else (None, 0)


def extend_cumulative(segments: Any, previous: PreparedRequest | None, shared: int) -> list[int]:
    """Cumulative tokens of ``segments``: ``previous``'s sums for the first ``shared`` (its very segments),
    then only the new tail is added up — O(new segments) per request, the shared run a list copy."""
    pcum = previous.__dict__.get("_cum") if previous is not None and shared else None
    if pcum is None or len(pcum) < shared:
        return list(accumulate(map(_TOKENS, segments)))
    cum = pcum[:shared]
    tail = accumulate(map(_TOKENS, segments[shared:]), initial=pcum[shared - 1])
    next(tail)  # the initial value itself
    cum.extend(tail)
    return cum


def identity_prefix(a: Any, b: Any) -> int:
    """How many leading items of ``a`` and ``b`` are the very same objects (C-speed, stops at the first
    difference; equal but distinct objects do not count)."""
    n = min(len(a), len(b))
    return next(compress(count(), map(is_not, a[:n] if len(a) > n else a, b[:n] if len(b) > n else b)), n)


def mark_prefix(p: PreparedRequest, previous: PreparedRequest | None, shared: int) -> None:
    """Record that ``p``'s first ``shared`` segments equal ``previous``'s (see :func:`shared_prefix_of`):
    per-segment lists derived from ``previous`` (cumulative tokens, keys, hashes, markers) are then
    extended rather than recomputed."""
    if previous is None:
        return
    object.__setattr__(p, "_prefix_of", (weakref.ref(previous), shared))


def _units_of(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    return value if isinstance(value, list) else [value]


def _prev_snapshots(prev: PreparedRequest, key: str) -> list[Any]:
    """The previous request's per-unit bytes (computed from its body the first time they are needed)."""
    snaps = prev.__dict__["_snaps"]
    got = snaps.get(key)
    if got is None:
        got = snaps[key] = _snapshots(_units_of(prev.body, key))
    return got


def shared_prefix_of(p: PreparedRequest, previous: PreparedRequest) -> int:
    """How many leading segments of ``p`` equal ``previous``'s at the same positions (mostly its very
    Segment objects; at least equal paths, kinds, roles, hashes, tokens and markers), as
    ``prepare(..., previous=previous)`` or the stored-request loader recorded it (0 when unknown).
    Everything keyed by segment content (diffs, prefix chains, stored blocks, cumulative tokens) can start
    after them."""
    rec = p.__dict__.get("_prefix_of")
    return rec[1] if rec is not None and rec[0]() is previous else 0


def rebuild_body(shape: dict[str, Any], rest: dict[str, Any], chain: list[tuple[str, str | None, Any]]) -> dict:
    """Inverse of :func:`prepare`: a body from its shape, other fields and (kind, role, element) list.

    The ``unlogged`` segment is not part of the body and is skipped. When the shape names a dialect or an
    unlogged prefix the result is a :class:`LoggedBody` carrying both, so ``prepare(rebuild_body(...))``
    rebuilds the same segments.
    """
    dialect = shape.get("dialect", "anthropic")
    unlogged = shape.get("unlogged")
    body: dict[str, Any] = dict(rest) if "dialect" not in shape and unlogged is None else LoggedBody(rest)
    if isinstance(body, LoggedBody):
        body.dialect = dialect
        body.unlogged_prefix_tokens = unlogged
    if shape.get("tools") == "list":
        body["tools"] = []
    if dialect != "anthropic":
        return _rebuild_openai(body, shape, dialect, chain)
    if shape.get("system") == "list":
        body["system"] = []
    if shape.get("messages") == "list":
        body["messages"] = []
    for kind, role, element in chain:
        if kind == "tool":
            body["tools"].append(element)
        elif kind == "system":
            if shape.get("system") == "str":
                body["system"] = element
            else:
                body["system"].append(element)
        elif kind in ("msg-str", "msg-empty"):
            body["messages"].append({"role": role, "content": element})
        elif kind == "msg-start":
            body["messages"].append({"role": role, "content": [element]})
        elif kind == "msg":
            body["messages"][-1]["content"].append(element)
        elif kind != "unlogged":
            raise ValueError(f"unknown segment kind {kind!r}")
    return body


def _rebuild_openai(body: dict[str, Any], shape: dict[str, Any], dialect: str,
                    chain: list[tuple[str, str | None, Any]]) -> dict:
    key = "messages" if dialect == "openai-chat" else "input"
    if shape.get(key) == "list":
        body[key] = []
    for kind, _role, element in chain:
        if kind == "tool":
            body["tools"].append(element)
        elif kind in ("msg-whole", "item"):
            body[key].append(element)
        elif kind == "schema":
            body["response_format" if dialect == "openai-chat" else "text"] = element
        elif kind == "system":
            body["instructions"] = element
        elif kind == "msg-str":
            body["input"] = element
        elif kind != "unlogged":
            raise ValueError(f"unknown segment kind {kind!r} for {dialect}")
    return body
