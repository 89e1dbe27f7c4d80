"""Anthropic Messages (``POST /v1/messages``): detect, segment, validate, rebuild, usage, SSE and errors.

Segments, in the cache-prefix order tools → system → messages (docs/provider_cache_rules.md#anthropic-prefix-order):
each tool, each system block (or the system string), each message content block (or a message's string content).
Paths ``tools[3]``, ``system[2]``, ``messages[5].content[0]``. A mid-conversation ``role: "system"`` message is a
message like any other, at its position in the prefix, with role ``system``
(docs/provider_cache_rules.md#anthropic-mid-conversation-system-messages). :func:`message_segments` is the one
rule for a message: ``prepare``'s trusted and checked paths and the segment count of a body plan all use it.

Validation follows the ``anthropic`` SDK's ``MessageCreateParams``: ``model``, ``max_tokens`` and ``messages``
required; ``max_tokens`` an integer ≥ 0 — 0 is documented pre-warming (docs/provider_cache_rules.md
#anthropic-ttl-and-refresh); roles ``user`` / ``assistant``, the first one ``user``, and ``system`` where the API
places a mid-conversation system message — never first, right after a user turn (or an assistant turn ending in
a server tool use), followed by an assistant turn or nothing, never two in a row, text blocks only; non-empty
content except a final assistant prefill; every content block with a known ``type``; a ``tool_result`` answers a
``tool_use`` of the message just before it, and a ``tool_use`` is answered in the message just after it; tools
named, uniquely, and a custom tool with an ``input_schema``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import starmap
from operator import itemgetter
from typing import Any

from ..errors import UsageError
from ..usage import (
    TTL_SPLIT_UNKNOWN_NOTE,
    Usage,
    UsageSource,
    _add,
    _check_split,
    _count,
    _details,
)
from ._base import DialectBase, DialectName, Placement, ProviderDiagnosis, SegmentSink, Unit
from ._problems import Problems, type_name, well_formed
from ._sse import Pairs, StreamSummary, encode_event, halves

__all__ = ["ANTHROPIC", "DIAGNOSTICS_BETA", "AnthropicMessages", "ProviderDiagnosis", "message_segments",
           "merge_anthropic_stream_usage", "read_diagnosis", "with_diagnostics"]

#: Top-level keys only the Messages API has (the API reference).
ONLY_KEYS = frozenset({
    "system", "stop_sequences", "top_k", "thinking", "mcp_servers", "container", "context_management",
    "cache_control", "output_config", "speed",
})
#: Content part types only Messages has (detection).
ONLY_PARTS = frozenset({
    "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking", "server_tool_use",
    "web_search_tool_result", "search_result", "container_upload", "mcp_tool_use", "mcp_tool_result",
})
#: Top-level fields that never affect cache matching (ignored for the divergence, listed). ``diagnostics`` names
#: the previous response for the provider's cache diagnosis (docs/provider_cache_rules.md#anthropic-cache-diagnostics):
#: it changes on every request and is not part of the prompt.
VOLATILE_FIELDS: tuple[str, ...] = (
    "cache_control", "diagnostics", "max_tokens", "metadata", "stop_sequences", "stream", "temperature", "top_k",
    "top_p",
)
#: Top-level fields that invalidate the cache from a level on (the §1.3 table, as cache/anthropic.py keys it).
FIELD_LEVELS = {
    "model": "tools", "speed": "system", "tool_choice": "messages", "thinking": "messages",
    "output_config": "messages",
}
#: The top-level fields this format splits into segments.
SEGMENTED = ("tools", "system", "messages")
#: Anthropic's error ``type`` per HTTP status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
#: Messages one Messages request may hold (the SDK's ``MessageCreateParams.messages``).
MAX_MESSAGES = 100_000

#: Content block ``type`` values of the Messages API: every ``*BlockParam`` of the anthropic SDK's
#: ``MessageContentParam`` and of its beta ``BetaContentBlockParam`` (tests/test_validate.py checks the
#: installed SDK adds none), plus ``tool_reference`` (tools loaded by tool search).
BLOCK_TYPES = frozenset({
    "text", "image", "document", "search_result", "thinking", "redacted_thinking", "tool_use", "tool_result",
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
    "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "tool_search_tool_result",
    "container_upload", "mcp_tool_use", "mcp_tool_result", "mcp_tool_listing", "compaction", "fallback",
    "advisor_tool_result", "tool_addition", "tool_removal", "tool_reference",
})
#: Roles of a Messages message: ``system`` only mid-conversation (docs/provider_cache_rules.md
#: #anthropic-mid-conversation-system-messages), where the SDK's ``SystemMessageParam`` has it.
ROLES = ("user", "assistant", "system")
#: Ids a ``tool_result`` may answer: a client tool call, or a server tool call the client runs itself.
_TOOL_CALL_BLOCKS = ("tool_use", "server_tool_use")


# -- segments: the one rule ------------------------------------------------------------------------------------
def tool_segment(i: int, tool: Any) -> Unit:
    return (f"tools[{i}]", "tool", None, tool)


def system_segment(i: int | None, block: Any) -> Unit:
    """A system block (``i`` None: the system string)."""
    return ("system" if i is None else f"system[{i}]", "system", None, block)


def message_segments(i: int, role: str, content: Any) -> list[Unit]:
    """The segments of ``messages[i]``: one per content block (the first ``msg-start``, later ones ``msg``), one for
    string content (``msg-str``) or empty content (``msg-empty``)."""
    if isinstance(content, str):
        return [(f"messages[{i}].content", "msg-str", role, content)]
    if not content:
        return [(f"messages[{i}].content", "msg-empty", role, content)]
    return [(f"messages[{i}].content[{j}]", "msg-start" if j == 0 else "msg", role, block)
            for j, block in enumerate(content)]


_CONTENT = itemgetter("content")


def messages_width(messages: list[Any]) -> int:
    """``sum(len(message_segments(...)))`` over ``messages`` without building one: a block each, one for string or
    empty content (C-speed passes, bar one type test per message)."""
    contents = list(map(_CONTENT, messages))
    lists = [c for c in contents if isinstance(c, list)]
    return len(contents) - len(lists) + sum(map(len, lists)) + lists.count([])


def _segment(sink: SegmentSink) -> Sequence[str]:
    body, shape = sink.body, sink.shape
    check_top(body)
    tools = body.get("tools")
    shape["tools"] = "absent" if tools is None else "list"
    if tools is not None:
        sink.section("tools", tools, lambda i, t: sink.seg(*tool_segment(i, t)))
    system = body.get("system")
    if system is None:
        shape["system"] = "absent"
    elif isinstance(system, str):
        shape["system"] = "str"
        sink.section("system", [system], lambda i, s: sink.seg(*system_segment(None, s)), scalar=True)
    else:
        shape["system"] = "list"

        def system_block(i: int, block: Any) -> None:
            check_system_block(i, block)
            sink.seg(*system_segment(i, block))

        sink.section("system", system, system_block)
    messages = body.get("messages")
    shape["messages"] = "absent" if messages is None else "list"

    def message(i: int, msg: Any) -> None:
        check_message(i, msg)
        for unit in message_segments(i, msg["role"], msg["content"]):
            sink.seg(*unit)

    if messages is not None:
        sink.section("messages", messages, message)
    return SEGMENTED


# -- structure checks (one-line ValueErrors naming the field; prepare and the validator share them) -----------
def check_top(body: dict[str, Any]) -> None:
    if "tools" in body and not isinstance(body["tools"], list):
        raise ValueError("tools: must be a list of tool definitions (omit the key for none)")
    if "system" in body and not isinstance(body["system"], str | list):
        raise ValueError("system: must be a string or a list of text blocks (omit the key for none)")
    if not isinstance(body.get("messages", []), list):
        raise ValueError("messages: must be a list")


def check_system_block(i: int, block: Any) -> None:
    if not isinstance(block, dict):
        raise ValueError(f"system[{i}]: must be a content block object")


def check_message(i: int, m: Any) -> None:
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


# -- validation (the API's refusals, in body order) -----------------------------------------------------
def _validate(body: Mapping[str, Any], out: Problems, partial: bool, skip: int, prev_len: int) -> None:
    # in prefix order (docs/provider_cache_rules.md#anthropic-prefix-order): the first problem is the first one
    # in the prompt. A present key must hold a value: none of the three is nullable.
    if "tools" in body:
        _anthropic_tools(body["tools"], out)
    if "system" in body:
        _anthropic_system(body["system"], out)
    if "messages" in body:
        _anthropic_messages(body["messages"], out, partial, skip, prev_len)


def _anthropic_system(system: Any, out: Problems) -> None:
    if isinstance(system, str):
        return
    if not isinstance(system, list):
        out.add("system", "must be a string or a list of text blocks (omit the key for none), "
                          f"got {type_name(system)}")
        return
    for i, block in enumerate(system):
        if not isinstance(block, Mapping) or block.get("type") != "text":
            got = repr(block.get("type")) if isinstance(block, Mapping) else type_name(block)
            out.add(f"system[{i}]", f"must be a text block, got {got}")


def _anthropic_messages(messages: Any, out: Problems, partial: bool, skip: int, prev_len: int) -> None:
    if not isinstance(messages, list):
        out.add("messages", f"must be a list of messages, got {type_name(messages)}")
        return
    if not messages:
        if not partial:
            out.add("messages", "at least one message is required")
        return
    if len(messages) > MAX_MESSAGES:
        out.add("messages", f"at most {MAX_MESSAGES:,} messages, got {len(messages):,}")
    last = len(messages) - 1
    if 0 < skip == prev_len <= last:  # the previous body's final message is final no more
        m = messages[skip - 1]
        if isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("content") in ("", []):
            out.add(f"messages[{skip - 1}].content", _EMPTY_CONTENT)
    calls: dict[str, str] = {}  # tool call ids of the message just before -> where ("" for a server tool call)
    before: _Before = None  # the message just before: its role and whether it ends in a server tool call
    # the repeated messages were checked with the previous body: the last one is replayed, muted, for its calls
    for i, m, o in well_formed(messages, max(0, skip - 1), skip, out, check_message):
        if m is None:
            calls, before = {}, None
            continue
        role, content = m["role"], m["content"]
        if role not in ROLES:
            o.add(f"messages[{i}].role", f"must be 'user', 'assistant' or 'system', got {role!r}")
        elif role == "system":
            _system_placement(i, before, o)
        elif i == 0 and role != "user":
            o.add("messages[0].role", f"the first message must use the user role, got {role!r}")
        if role == "user" and i > 1 and before is not None and before[0] == "system":  # a first one is told
            o.add(f"messages[{i}].role", f"must be 'assistant' after the 'system' message messages[{i - 1}] (a "
                                         "system message is the last message or is followed by an assistant turn)")
        if (content == "" or content == []) and not (role == "assistant" and i == last):
            o.add(f"messages[{i}].content", _EMPTY_CONTENT)
        blocks = content if isinstance(content, list) else []
        answered: set[str] = set()
        for j, block in enumerate(blocks):
            where = f"messages[{i}].content[{j}]"
            t = block.get("type")
            if "type" not in block:
                o.add(f"{where}.type", "Field required")
            elif t not in BLOCK_TYPES:
                o.add(f"{where}.type", f"unknown content block type {t!r}")
            elif role == "system" and t != "text":
                o.add(f"{where}.type", f"a 'system' message holds text blocks only, got {t!r}")
            elif t == "tool_result" and role == "user":
                tid = block.get("tool_use_id")
                if not isinstance(tid, str):
                    o.add(f"{where}.tool_use_id", "Field required" if tid is None else f"must be a string, got {tid!r}")
                elif tid not in calls:
                    o.add(f"{where}.tool_use_id", f"no tool_use with id {tid!r} in the previous message; each "
                                                  "tool_result answers a tool_use of the message just before it")
                else:
                    answered.add(tid)
        if role == "user":
            for tid, where in calls.items():
                if where and tid not in answered:
                    o.add(where, f"tool_use {tid!r} has no tool_result in the next message; each tool_use is "
                                 "answered by a tool_result in the message just after it")
        calls = {}
        if role == "assistant":
            for j, b in enumerate(blocks):
                if b.get("type") in _TOOL_CALL_BLOCKS and isinstance(b.get("id"), str):
                    # a server tool's result comes back in the same message; the client may still answer it
                    calls[b["id"]] = f"messages[{i}].content[{j}].id" if b["type"] == "tool_use" else ""
        before = (role, bool(blocks) and blocks[-1].get("type") == "server_tool_use")


_EMPTY_CONTENT = "all messages must have non-empty content except for the optional final assistant message"
#: The message before the one being checked: (its role, whether it ends in a server tool call); None for none or
#: a malformed one.
_Before = tuple[str, bool] | None


def _system_placement(i: int, before: _Before, out: Problems) -> None:
    """Where a mid-conversation ``system`` message may stand (docs/provider_cache_rules.md
    #anthropic-mid-conversation-system-messages): never first, right after a user message or an assistant message
    that ends in a server tool call, never next to another system message. The message after it (an assistant
    turn, or none) is checked with that message."""
    where = f"messages[{i}].role"
    if i == 0:
        out.add(where, "a 'system' message cannot be the first message; instructions that apply from the start go "
                       "in the top-level `system` field")
    elif before is None:
        return  # the message before is malformed, reported on its own
    elif before[0] == "system":
        out.add(where, f"consecutive 'system' messages are not allowed (messages[{i - 1}] is one); merge them")
    elif before[0] == "assistant" and not before[1]:
        out.add(where, "a 'system' message must follow a user message (or an assistant message that ends in a "
                       "server tool use), got one after an assistant message")


def _anthropic_tools(tools: Any, out: Problems) -> None:
    if not isinstance(tools, list):
        out.add("tools", f"must be a list of tool definitions (omit the key for none), got {type_name(tools)}")
        return
    seen: dict[str, int] = {}
    for k, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            out.add(f"tools[{k}]", f"must be a tool definition object, got {type_name(tool)}")
            continue
        name = tool.get("name")
        if "name" not in tool:
            out.add(f"tools[{k}].name", "Field required")
        elif not isinstance(name, str) or not name:
            out.add(f"tools[{k}].name", f"must be a non-empty string, got {name!r}")
        elif name in seen:
            out.add(f"tools[{k}].name", f"duplicate tool name {name!r} (also tools[{seen[name]}]); tool names "
                                        "must be unique")
        else:
            seen[name] = k
        if tool.get("type", "custom") in ("custom", None) and not isinstance(tool.get("input_schema"), Mapping):
            out.add(f"tools[{k}].input_schema", "Field required" if "input_schema" not in tool
                    else "must be a JSON schema object")


# -- usage -------------------------------------------------------------------------------------------------------
def usage_from_payload(usage: Any, *, source: UsageSource = "live") -> Usage:
    """:func:`~promptcache_nb.dialects.usage_from_anthropic` (documented there)."""
    raw = usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else usage
    if not isinstance(raw, dict):
        raise UsageError(f"usage: must be an object, got {type(raw).__name__}")
    raw = dict(raw)
    uncached, read, written, w5, w1, output = _counts(raw, "usage")
    unsplit = bool(written) and w5 is None and w1 is None
    if "iterations" in raw:
        for i, iteration in _compaction_iterations(raw):
            more = _counts(iteration, f"usage.iterations[{i}]")
            unsplit = unsplit or (bool(more[2]) and more[3] is None and more[4] is None)
            uncached, read, written, w5, w1, output = starmap(
                _add, zip((uncached, read, written, w5, w1, output), more, strict=True))
    notes: tuple[str, ...] = ()
    if unsplit:
        w5 = w1 = None  # a split nobody reported stays unknown
        notes = (TTL_SPLIT_UNKNOWN_NOTE,)
    elif written is not None and w5 is None and w1 is None:
        w5 = w1 = 0  # nothing written: nothing to split
    elif written is not None and (w5 or 0) + (w1 or 0) > written:
        _check_split(written, w5, w1, "usage")
    return Usage(uncached, read if read is not None else (0 if written is not None else None), written, w5, w1,
                 output, source, raw, None, notes)


def _counts(raw: dict[str, Any], where: str) -> tuple[int | None, ...]:
    """``(input, cache read, cache write, 5m write, 1h write, output)`` of one Anthropic usage object (the top
    level or one of its ``iterations``), checked."""
    creation = _details(raw, "cache_creation", where)
    return (_count(raw, "input_tokens", where), _count(raw, "cache_read_input_tokens", where),
            _count(raw, "cache_creation_input_tokens", where),
            _count(creation, "ephemeral_5m_input_tokens", f"{where}.cache_creation"),
            _count(creation, "ephemeral_1h_input_tokens", f"{where}.cache_creation"),
            _count(raw, "output_tokens", where))


def _compaction_iterations(raw: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """The ``compaction`` entries of ``usage.iterations`` (server-side compaction) with their positions; [] when
    there are none."""
    iterations = raw.get("iterations")
    if iterations is None:
        return []
    if not isinstance(iterations, list):
        raise UsageError(f"usage.iterations: must be a list, got {type(iterations).__name__}")
    for i, it in enumerate(iterations):
        if not isinstance(it, dict):
            raise UsageError(f"usage.iterations[{i}]: must be an object, got {type(it).__name__}")
    return [(i, it) for i, it in enumerate(iterations) if it.get("type") == "compaction"]


# -- server-sent events --------------------------------------------------------------------------------------------
_STREAM_EVENTS = frozenset({"message_start", "content_block_start", "content_block_delta", "message_delta"})

#: Counts message_start reports for real (its output_tokens is a placeholder, so the delta's always wins).
_INPUT_COUNTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def merge_anthropic_stream_usage(start: dict[str, Any] | None, delta: dict[str, Any]) -> dict[str, Any]:
    """The usage of a streamed Anthropic message: ``message_start``'s usage combined with one ``message_delta``'s.

    The rule, from the Messages streaming docs ("The token counts shown in the ``usage`` field of the
    ``message_delta`` event are *cumulative*", https://docs.anthropic.com/en/docs/build-with-claude/streaming) and
    the SDK's ``MessageDeltaUsage`` (every count optional but ``output_tokens``):

    - start from ``message_start``'s ``message.usage`` (input, cache read, cache write and its 5m/1h
      ``cache_creation`` split; ``output_tokens`` there is a placeholder);
    - every field ``message_delta`` carries with a value replaces it (cumulative, so the delta's figure is the
      whole call's); a field it omits or sends as null keeps ``message_start``'s figure, so the cache read
      reported only at the start is never lost;
    - a cumulative input count cannot fall: a delta input/cache figure *below* ``message_start``'s is a
      placeholder (Anthropic-compatible gateways send ``0`` for figures they do not track), not a total, and
      ``message_start``'s figure stays. Except when the delta carries ``iterations`` (server-side compaction):
      its top-level figures then describe the final iteration and are taken as sent;
    - when the delta changes ``cache_creation_input_tokens`` without its own ``cache_creation`` object, the
      start's 5m/1h split no longer sums to the total and is dropped (the split becomes unknown, never wrong).

    Several ``message_delta`` events (server tools) are merged in order; each is cumulative, so the last wins.
    """
    usage = dict(start or {})
    compaction = isinstance(delta.get("iterations"), list)
    for key, value in delta.items():
        if value is None:
            continue
        before = usage.get(key)
        if (not compaction and key in _INPUT_COUNTS and _is_int(before) and _is_int(value)
                and value < before):
            continue
        usage[key] = value
    written_before = (start or {}).get("cache_creation_input_tokens")
    if ("cache_creation" not in delta and "cache_creation" in usage
            and usage.get("cache_creation_input_tokens") != written_before):
        del usage["cache_creation"]
    return usage


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sse_parse(pairs: Pairs) -> StreamSummary:
    usage: dict[str, Any] | None = None
    response_id = model = stop_reason = error = diagnostics = None
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, list[str]] = {}
    complete = False
    for name, data in pairs:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        if kind == "message_start":
            message = data.get("message") or {}
            response_id = message.get("id")
            model = message.get("model")
            diagnostics = message.get("diagnostics")
            if isinstance(message.get("usage"), dict):
                usage = dict(message["usage"])
        elif kind == "content_block_start":
            blocks[int(data.get("index", len(blocks)))] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta":
            index = int(data.get("index", 0))
            block = blocks.setdefault(index, {})
            delta = data.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif dtype == "input_json_delta":
                partial_json.setdefault(index, []).append(delta.get("partial_json", ""))
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif dtype == "signature_delta":
                block["signature"] = delta.get("signature")
            elif dtype == "citations_delta":
                block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "message_delta":
            stop_reason = (data.get("delta") or {}).get("stop_reason", stop_reason)
            delta_usage = data.get("usage")
            if isinstance(delta_usage, dict):
                usage = merge_anthropic_stream_usage(usage, delta_usage)
                complete = True
        elif kind == "error":
            err = data.get("error") or {}
            error = f"{err.get('type', 'error')}: {err.get('message', '')}".strip().rstrip(":")
    for index, parts in partial_json.items():
        text = "".join(parts)
        try:
            blocks[index]["input"] = json.loads(text) if text else {}
        except ValueError:
            blocks[index]["input"] = text  # keep what came: a stream cut inside a tool call
    content = [blocks[i] for i in sorted(blocks)]
    return StreamSummary("anthropic", usage, response_id, model, content, stop_reason, error, len(pairs), complete,
                         diagnostics)


def sse_write(message: dict[str, Any]) -> list[bytes]:
    """The Messages streaming events for a complete message (usage in message_start and message_delta)."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**usage, "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for i, block in enumerate(message["content"]):
        events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                               "content_block": {"type": "text", "text": ""}}))
        for piece in halves(block["text"]):
            events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                   "delta": {"type": "text_delta", "text": piece}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    final_usage = {k: usage[k] for k in (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")}
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(("message_delta", {"type": "message_delta", "usage": final_usage, "delta": delta}))
    events.append(("message_stop", {"type": "message_stop"}))
    return [encode_event(name, data) for name, data in events]


# -- cache diagnostics (docs/provider_cache_rules.md#anthropic-cache-diagnostics) ----------------------------------

#: The beta header value that enabled cache diagnostics while they were a beta; the GA API no longer needs it and
#: still accepts it, so a request that opts in sends it for endpoints of either era.
DIAGNOSTICS_BETA = "cache-diagnosis-2026-04-07"
#: The provider's ``cache_miss_reason.type`` values (the SDK's ``CacheMissReason`` union).
PROVIDER_MISS_REASONS = ("model_changed", "system_changed", "tools_changed", "messages_changed",
                         "previous_message_not_found", "unavailable")
#: Stored when the request named a previous message and the response reported no divergence (``diagnostics``
#: null), and when the diagnosis was still running as the response was serialised (``cache_miss_reason`` null).
NO_DIVERGENCE, PENDING = "none", "pending"


def with_diagnostics(body: Mapping[str, Any], previous_message_id: str | None) -> dict[str, Any]:
    """``body`` asking for the provider's cache diagnosis against ``previous_message_id`` (None on a
    conversation's first request: it opts in, so the provider keeps this request's fingerprint for the next).
    A body that already asks keeps its own ``diagnostics``."""
    if isinstance(body.get("diagnostics"), Mapping):
        return dict(body)
    return {**body, "diagnostics": {"previous_message_id": previous_message_id}}


def read_diagnosis(request: Mapping[str, Any] | None, diagnostics: Any) -> ProviderDiagnosis | None:
    """The provider's diagnosis of a request, from the request body and its response's ``diagnostics`` value
    (None when the response had none or null); None when there is nothing to read.

    A response ``diagnostics`` object is read whatever the request holds (a log may keep only the response);
    a null one means "no divergence" only when the request named a previous message (on a first request it
    means nothing was compared).
    """
    if isinstance(diagnostics, Mapping):
        reason = diagnostics.get("cache_miss_reason")
        if reason is None:
            return ProviderDiagnosis(PENDING)
        kind = reason.get("type") if isinstance(reason, Mapping) else None
        if not isinstance(kind, str) or not kind:
            return None
        missed = reason.get("cache_missed_input_tokens")
        return ProviderDiagnosis(kind, missed if _is_int(missed) and missed >= 0 else None)
    asked = request.get("diagnostics") if isinstance(request, Mapping) else None
    if isinstance(asked, Mapping) and isinstance(asked.get("previous_message_id"), str):
        return ProviderDiagnosis(NO_DIVERGENCE)
    return None


def error_body(status: int, message: str, request_id: str) -> bytes:
    """``{"type": "error", "error": {"type", "message"}, "request_id"}``."""
    error = {"type": ERROR_TYPES.get(status, "api_error"), "message": message}
    return json.dumps({"type": "error", "error": error, "request_id": request_id}).encode()


class AnthropicMessages(DialectBase):
    """The Anthropic Messages format (:class:`~promptcache_nb.dialects.Dialect`)."""

    name: DialectName = "anthropic"
    provider = "anthropic"
    list_key = "messages"
    only_keys = ONLY_KEYS
    volatile_fields: tuple[str, ...] = VOLATILE_FIELDS
    field_levels: Mapping[str, str] = FIELD_LEVELS
    limit_fields: tuple[str, ...] = ("max_tokens",)
    limits_nullable = False
    implicit_caching = False
    count_tokens_endpoint = True
    stream_placeholder_usage = True
    logged_usage_counts: tuple[str, ...] = ("input_tokens", "output_tokens")
    fast_path = True
    whole_units = False
    scalar_keys: Mapping[str, str] = {}
    placements: Mapping[str, Placement] = {
        "tool": ("tools", "value"), "system": ("system", "value"), "msg-str": ("messages", "message"),
        "msg-empty": ("messages", "message"), "msg-start": ("messages", "first block"),
        "msg": ("messages", "next block")}
    cache_diagnostics = True

    def segment(self, sink: SegmentSink) -> Sequence[str]:
        return _segment(sink)

    def units_width(self, units: list[Any]) -> int:
        return messages_width(units)

    def system_count(self, body: Mapping[str, Any], shape: Mapping[str, Any], rest: Mapping[str, Any]) -> int:
        system = body.get("system")
        return 0 if system is None else 1 if isinstance(system, str) else len(system)

    def required_fields(self, body: Mapping[str, Any], *, count_tokens: bool) -> list[str]:
        return ["model", "messages"] if count_tokens else ["model", "max_tokens", "messages"]

    def validate(self, body: Mapping[str, Any], out: Problems, partial: bool, skip: int, prev_len: int) -> None:
        _validate(body, out, partial, skip, prev_len)

    def usage(self, payload: Any, *, source: UsageSource) -> Usage:
        return usage_from_payload(payload, source=source)

    def reply(self, response: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        content = response.get("content")
        return [c for c in content if isinstance(c, dict)] if isinstance(content, list) else None

    def owns_stream_event(self, name: str | None, data: Any) -> bool:
        kind = (data.get("type") if isinstance(data, dict) else None) or name or ""
        return kind in _STREAM_EVENTS

    def sse_parse(self, pairs: Pairs) -> StreamSummary:
        return sse_parse(pairs)

    def sse_write(self, response: dict[str, Any], *, include_usage: bool = True) -> list[bytes]:
        return sse_write(response)

    def error_body(self, status: int, message: str, request_id: str) -> bytes:
        return error_body(status, message, request_id)

    def diagnosis(self, request: Mapping[str, Any] | None, diagnostics: Any) -> ProviderDiagnosis | None:
        return read_diagnosis(request, diagnostics)


ANTHROPIC = AnthropicMessages()
