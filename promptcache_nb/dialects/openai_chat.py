"""OpenAI Chat Completions (``POST /v1/chat/completions``): detect, segment, validate, rebuild, usage, SSE, errors.

Segments, in the cache-prefix order tools → structured-output schema → messages
(docs/provider_cache_rules.md#openai-prefix-order): each tool, ``response_format``, each whole message
(``messages[3]``: role, content, ``tool_calls``, ``tool_call_id`` ... in one segment, so every key round-trips).
Validation: the essentials (``model``, ``messages``, roles and content parts, a ``tool`` message answering a
preceding assistant's ``tool_calls``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._base import DialectName, Placement, SegmentSink
from ._openai import (
    OpenAIDialect,
    check_tools,
    segment_schema,
    segment_tools,
)
from ._problems import Problems, type_name, well_formed
from ._sse import Pairs, StreamSummary, encode_event, halves

__all__ = ["OPENAI_CHAT", "OpenAIChat"]

#: Top-level keys only Chat Completions has (the API reference).
ONLY_KEYS = frozenset({
    "max_completion_tokens", "response_format", "n", "logprobs", "top_logprobs", "stream_options",
    "frequency_penalty", "presence_penalty", "logit_bias", "seed", "parallel_tool_calls", "reasoning_effort",
    "modalities", "audio", "prediction", "functions", "function_call", "web_search_options", "stop", "store",
    "user", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "verbosity",
})
ROLES: dict[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    # reasoning_content and prefix: DeepSeek's documented extensions of the assistant message
    "assistant": frozenset({"role", "content", "name", "tool_calls", "function_call", "refusal", "audio",
                            "annotations", "reasoning_content", "prefix"}),
    "tool": frozenset({"role", "content", "tool_call_id"}),
    "function": frozenset({"role", "content", "name"}),  # deprecated, still accepted by the API
}
PARTS: dict[str, frozenset[str]] = {
    "system": frozenset({"text"}), "developer": frozenset({"text"}), "tool": frozenset({"text"}),
    "function": frozenset({"text"}),
    "user": frozenset({"text", "image_url", "input_audio", "file"}),
    "assistant": frozenset({"text", "refusal"}),
}
#: Content part types only Chat has (detection).
ONLY_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
TOOL_TYPES = frozenset({"function", "custom"})
#: Message keys only Chat messages have (detection).
MESSAGE_KEYS = frozenset(ROLES["assistant"] | ROLES["tool"]) - {"role", "content"}


# -- segments ----------------------------------------------------------------------------------------------------
def _segment(sink: SegmentSink) -> Sequence[str]:
    body, shape = sink.body, sink.shape
    if "input" in body or "system" in body:
        raise ValueError(f"{'input' if 'input' in body else 'system'}: not a Chat Completions field")
    segmented = segment_tools(sink, TOOL_TYPES, True) + segment_schema(sink, "response_format")
    messages = body.get("messages")
    if messages is None:
        shape["messages"] = "absent"
        return segmented
    if not isinstance(messages, list):
        raise ValueError("messages: must be a list")
    shape["messages"] = "list"

    def message(i: int, m: Any) -> None:
        check_message(i, m)
        sink.seg(f"messages[{i}]", "msg-whole", m["role"], m)

    sink.section("messages", messages, message)
    return [*segmented, "messages"]


def check_message(i: int, m: Any) -> None:
    if not isinstance(m, dict):
        raise ValueError(f"messages[{i}]: must be a message object")
    role = m.get("role")
    allowed = ROLES.get(role) if isinstance(role, str) else None
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
        parts = PARTS[role]
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
            if t not in TOOL_TYPES:
                raise ValueError(f"messages[{i}].tool_calls[{j}].type: unknown tool call type {t!r}")
            if not isinstance(call.get(t), dict):
                raise ValueError(f"messages[{i}].tool_calls[{j}].{t}: must be an object")


# -- validation --------------------------------------------------------------------------------------------------
def _validate(body: Mapping[str, Any], out: Problems, partial: bool, skip: int, prev_len: int) -> None:
    if "system" in body or "input" in body:
        out.add("system" if "system" in body else "input", "not a Chat Completions field")
    check_tools(body.get("tools"), TOOL_TYPES, True, out)
    messages = body.get("messages")
    if messages is None:
        return
    if not isinstance(messages, list):
        out.add("messages", f"must be a list of messages, got {type_name(messages)}")
        return
    if not messages:
        if not partial:
            out.add("messages", "at least one message is required")
        return
    calls: dict[str, str] = {}  # the last assistant message's tool call ids -> where they are, until answered
    # the repeated messages were checked with the previous body: those since its last assistant message are
    # replayed, muted, for the calls they leave unanswered
    start = next((i for i in range(min(skip, len(messages)) - 1, -1, -1)
                  if isinstance(messages[i], Mapping) and messages[i].get("role") == "assistant"), 0)
    for i, m, o in well_formed(messages, start, skip, out, check_message):
        if m is None:
            calls = {}
            continue
        if m["role"] == "tool":
            tid = m.get("tool_call_id")
            if tid not in calls:
                o.add(f"messages[{i}].tool_call_id", f"no tool call {tid!r} in the preceding assistant message; a "
                                                     "'tool' message answers one of its tool_calls")
            calls.pop(tid, None)
            continue
        for tid, where in calls.items():
            o.add(where, f"tool call {tid!r} has no 'tool' message answering it before messages[{i}]")
        calls = {}
        if m["role"] == "assistant":
            calls = {c["id"]: f"messages[{i}].tool_calls[{j}].id"
                     for j, c in enumerate(m.get("tool_calls") or ()) if isinstance(c.get("id"), str)}


# -- server-sent events ------------------------------------------------------------------------------------------
def sse_parse(pairs: Pairs) -> StreamSummary:
    usage: dict[str, Any] | None = None
    response_id = model = stop_reason = error = None
    text: list[str] = []
    role = "assistant"
    tool_calls: dict[int, dict[str, Any]] = {}
    complete = False
    for _name, data in pairs:
        if not isinstance(data, dict):
            complete = complete or data == "[DONE]"
            continue
        if "error" in data and data.get("object") != "chat.completion.chunk":
            err = data["error"] if isinstance(data["error"], dict) else {"message": str(data["error"])}
            error = f"{err.get('type') or err.get('code') or 'error'}: {err.get('message', '')}"
            continue
        response_id = data.get("id", response_id)
        model = data.get("model", model)
        if isinstance(data.get("usage"), dict):
            usage = dict(data["usage"])
            complete = True
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            role = delta.get("role") or role
            if delta.get("content"):
                text.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                slot = tool_calls.setdefault(
                    int(call.get("index", len(tool_calls))),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                stop_reason = choice["finish_reason"]
    message: dict[str, Any] = {"role": role, "content": "".join(text) if text else None}
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    return StreamSummary("openai-chat", usage, response_id, model, [message], stop_reason, error, len(pairs),
                         complete)


def sse_write(completion: dict[str, Any], *, include_usage: bool) -> list[bytes]:
    """Chat Completions chunks: role, content deltas, finish_reason, then (when asked) usage with no choices."""
    head = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        out = {**head, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            out["usage"] = None  # every chunk but the last carries a null usage (the API's documented shape)
        return out

    message = completion["choices"][0]["message"]
    chunks = [chunk({"role": "assistant", "content": "", "refusal": None}, None)]
    chunks += [chunk({"content": piece}, None) for piece in halves(message["content"] or "")]
    chunks.append(chunk({}, completion["choices"][0]["finish_reason"]))
    if include_usage:
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]})
    return [encode_event(None, c) for c in chunks] + [encode_event(None, "[DONE]")]


class OpenAIChat(OpenAIDialect):
    """The OpenAI Chat Completions format (:class:`~promptcache_nb.dialects.Dialect`)."""

    name: DialectName = "openai-chat"
    list_key = "messages"
    only_keys = ONLY_KEYS
    limit_fields: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
    usage_keys = ("prompt_tokens", "completion_tokens")
    scalar_keys: Mapping[str, str] = {"schema": "response_format"}
    placements: Mapping[str, Placement] = {
        "tool": ("tools", "value"), "msg-whole": ("messages", "value"), "schema": ("response_format", "value")}

    def segment(self, sink: SegmentSink) -> Sequence[str]:
        return _segment(sink)

    def system_count(self, body: Mapping[str, Any], shape: Mapping[str, Any], rest: Mapping[str, Any]) -> int:
        return int("response_format" in body and "response_format" not in rest)

    def required_fields(self, body: Mapping[str, Any], *, count_tokens: bool) -> list[str]:
        return ["model", "messages"]

    def validate(self, body: Mapping[str, Any], out: Problems, partial: bool, skip: int, prev_len: int) -> None:
        _validate(body, out, partial, skip, prev_len)

    def reply(self, response: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        choices = response.get("choices") or []
        content = [c.get("message") for c in choices[:1] if isinstance(c, Mapping) and c.get("message")]
        return [c for c in content if isinstance(c, dict)]

    def owns_stream_event(self, name: str | None, data: Any) -> bool:
        return isinstance(data, dict) and data.get("object") == "chat.completion.chunk"

    def sse_parse(self, pairs: Pairs) -> StreamSummary:
        return sse_parse(pairs)

    def sse_write(self, response: dict[str, Any], *, include_usage: bool = True) -> list[bytes]:
        return sse_write(response, include_usage=include_usage)


OPENAI_CHAT = OpenAIChat()
