"""OpenAI Responses (``POST /v1/responses``): detect, segment, validate, rebuild, usage, SSE, errors.

Segments, in the cache-prefix order tools → schema (``text``) → ``instructions`` → input
(docs/provider_cache_rules.md#openai-prefix-order): each tool, ``text``, ``instructions``, the ``input`` string or
each ``input[5]`` item. Validation: the essentials (``model``, ``input`` unless a stored prompt or conversation
stands in, items and content parts, a ``function_call_output`` answering a ``function_call``).
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

__all__ = ["ITEM_TYPES", "OPENAI_RESPONSES", "OpenAIResponses"]

#: Top-level keys only Responses has (the API reference).
ONLY_KEYS = frozenset({
    "input", "instructions", "previous_response_id", "max_output_tokens", "text", "reasoning", "include",
    "truncation", "conversation", "prompt", "background", "max_tool_calls",
})
TOOL_TYPES = frozenset({
    "function", "file_search", "computer", "computer_use_preview", "web_search", "web_search_2025_08_26",
    "web_search_preview", "web_search_preview_2025_03_11", "mcp", "code_interpreter",
    "programmatic_tool_calling", "image_generation", "local_shell", "shell", "custom", "namespace",
    "tool_search", "apply_patch",
})
#: Responses input item types (the openai SDK's ``ResponseInputItemParam`` union).
ITEM_TYPES = frozenset({
    "message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
    "reasoning", "web_search_call", "file_search_call", "computer_call", "computer_call_output",
    "local_shell_call", "local_shell_call_output", "shell_call", "shell_call_output", "apply_patch_call",
    "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "mcp_call",
    "image_generation_call", "code_interpreter_call", "tool_search_call", "tool_search_output",
    "additional_tools", "configuration_update", "compaction", "compaction_trigger", "item_reference",
    "program", "program_output",
})
ROLES = frozenset({"user", "assistant", "system", "developer"})
PARTS = frozenset({"input_text", "input_image", "input_file", "input_audio", "output_text", "refusal"})


# -- segments ----------------------------------------------------------------------------------------------------
def _segment(sink: SegmentSink) -> Sequence[str]:
    body, shape = sink.body, sink.shape
    if "messages" in body or "system" in body:
        raise ValueError(f"{'messages' if 'messages' in body else 'system'}: not a Responses field")
    segmented = segment_tools(sink, TOOL_TYPES, False) + segment_schema(sink, "text")
    instructions = body.get("instructions")
    if instructions is None:
        shape["instructions"] = "absent"
    elif isinstance(instructions, str):
        shape["instructions"] = "str"
        sink.section("instructions", [instructions],
                     lambda i, s: sink.seg("instructions", "system", None, s), scalar=True)
        segmented.append("instructions")
    else:
        raise ValueError("instructions: must be a string")
    inp = body.get("input")
    if inp is None:
        shape["input"] = "absent"
    elif isinstance(inp, str):
        shape["input"] = "str"
        sink.section("input", [inp], lambda i, s: sink.seg("input", "msg-str", "user", s), scalar=True)
        segmented.append("input")
    elif isinstance(inp, list):
        shape["input"] = "list"

        def item(i: int, it: Any) -> None:
            check_item(i, it)
            sink.seg(f"input[{i}]", "item", it.get("role"), it)

        sink.section("input", inp, item)
        segmented.append("input")
    else:
        raise ValueError("input: must be a string or a list of input items")
    return segmented


def check_item(i: int, item: Any) -> None:
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
    if t not in ITEM_TYPES:
        raise ValueError(f"input[{i}].type: unknown item type {t!r}")
    if t != "message":
        return
    role = item.get("role")
    if role not in ROLES:
        raise ValueError(f"input[{i}].role: unknown role {role!r}")
    content = item.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            pt = part.get("type") if isinstance(part, dict) else None
            if pt not in PARTS:
                raise ValueError(f"input[{i}].content[{j}].type: unknown content part type {pt!r}")
    elif not isinstance(content, str):
        raise ValueError(f"input[{i}].content: must be a string or a list of content parts")


# -- validation --------------------------------------------------------------------------------------------------
_CALL_OUTPUTS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}


def _validate(body: Mapping[str, Any], out: Problems, partial: bool, skip: int, prev_len: int) -> None:
    if "messages" in body or "system" in body:
        out.add("messages" if "messages" in body else "system", "not a Responses field")
    check_tools(body.get("tools"), TOOL_TYPES, False, out)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        out.add("instructions", f"must be a string, got {type_name(instructions)}")
    items = body.get("input")
    if items is None or isinstance(items, str):
        return
    if not isinstance(items, list):
        out.add("input", f"must be a string or a list of input items, got {type_name(items)}")
        return
    # with stored state (a previous response, a conversation) the call can be in an earlier response
    stored = bool(body.get("previous_response_id") or body.get("conversation"))
    # the repeated items were checked with the previous body: only the calls they hold are taken from them
    calls: set[tuple[str, Any]] = {
        (item["type"], item["call_id"]) for item in items[:skip]
        if isinstance(item, Mapping) and item.get("type") in _CALL_OUTPUTS.values()
        and isinstance(item.get("call_id"), str)}
    for i, item, _ in well_formed(items, skip, skip, out, check_item):
        if item is None:
            continue
        t, call_id = item.get("type"), item.get("call_id")
        if not isinstance(call_id, str):
            continue  # prepare's item check leaves ids alone; an id-less call answers nothing
        if t in _CALL_OUTPUTS.values():
            calls.add((t, call_id))
        elif t in _CALL_OUTPUTS and not stored and (_CALL_OUTPUTS[t], call_id) not in calls:
            out.add(f"input[{i}].call_id", f"no {_CALL_OUTPUTS[t]} with call_id {call_id!r} earlier in input; an "
                                           "output answers a call")


# -- server-sent events ------------------------------------------------------------------------------------------
def sse_parse(pairs: Pairs) -> StreamSummary:
    usage: dict[str, Any] | None = None
    response_id = model = stop_reason = error = None
    output: list[dict[str, Any]] = []
    complete = False
    for name, data in pairs:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        response = data.get("response")
        if isinstance(response, dict):
            response_id = response.get("id", response_id)
            model = response.get("model", model)
            stop_reason = response.get("status", stop_reason)
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                complete = True
                if isinstance(response.get("usage"), dict):
                    usage = dict(response["usage"])
                output = list(response.get("output") or output)
            if kind == "response.failed":
                err = response.get("error") or {}
                error = f"{err.get('code', 'failed')}: {err.get('message', '')}"
        elif kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            index = data.get("output_index", len(output))
            while len(output) <= index:
                output.append({})
            output[index] = data["item"]
        elif kind == "error":
            error = f"{data.get('code') or 'error'}: {data.get('message', '')}"
    return StreamSummary("openai-responses", usage, response_id, model, output, stop_reason, error, len(pairs),
                         complete)


def sse_write(response: dict[str, Any]) -> list[bytes]:
    """Responses events from ``response.created`` to ``response.completed`` (which carries the usage)."""
    item = response["output"][0]
    part = item["content"][0]
    text = part["text"]
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    ids = {"item_id": item["id"], "output_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **ids, "content_index": 0,
         "part": {**part, "text": ""}},
    ]
    events += [{"type": "response.output_text.delta", **ids, "content_index": 0, "delta": piece, "logprobs": []}
               for piece in halves(text)]
    events += [
        {"type": "response.output_text.done", **ids, "content_index": 0, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **ids, "content_index": 0, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return [encode_event(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)]


class OpenAIResponses(OpenAIDialect):
    """The OpenAI Responses format (:class:`~promptcache_nb.dialects.Dialect`)."""

    name: DialectName = "openai-responses"
    list_key = "input"
    only_keys = ONLY_KEYS
    limit_fields: tuple[str, ...] = ("max_output_tokens",)
    usage_keys = ("input_tokens", "output_tokens")
    scalar_keys: Mapping[str, str] = {"schema": "text", "system": "instructions", "msg-str": "input"}
    placements: Mapping[str, Placement] = {
        "tool": ("tools", "value"), "item": ("input", "value"), "msg-str": ("input", "value"),
        "schema": ("text", "value"), "system": ("instructions", "value")}

    def segment(self, sink: SegmentSink) -> Sequence[str]:
        return _segment(sink)

    def system_count(self, body: Mapping[str, Any], shape: Mapping[str, Any], rest: Mapping[str, Any]) -> int:
        return int("text" in body and "text" not in rest) + int(shape.get("instructions") == "str")

    def required_fields(self, body: Mapping[str, Any], *, count_tokens: bool) -> list[str]:
        if {"prompt", "conversation", "previous_response_id"} & body.keys():
            return ["model"]  # a stored prompt or conversation can stand in for the input
        return ["model", "input"]

    def validate(self, body: Mapping[str, Any], out: Problems, partial: bool, skip: int, prev_len: int) -> None:
        _validate(body, out, partial, skip, prev_len)

    def reply(self, response: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        content = response.get("output")
        return [c for c in content if isinstance(c, dict)] if isinstance(content, list) else None

    def owns_stream_event(self, name: str | None, data: Any) -> bool:
        kind = (data.get("type") if isinstance(data, dict) else None) or name or ""
        return kind.startswith("response.")

    def sse_parse(self, pairs: Pairs) -> StreamSummary:
        return sse_parse(pairs)

    def sse_write(self, response: dict[str, Any], *, include_usage: bool = True) -> list[bytes]:
        return sse_write(response)


OPENAI_RESPONSES = OpenAIResponses()
