"""What the two OpenAI formats share: tools, the structured-output schema, usage, errors.

OpenAI reports the prompt *including* what was read from (and written to) the cache
(docs/provider_cache_rules.md#openai-usage): :func:`usage_from_payload` converts it exactly to the Anthropic
arithmetic of :class:`~promptcache_nb.usage.Usage`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError
from ..usage import Usage, UsageSource, _count, _details
from ._base import DialectBase, SegmentSink
from ._problems import Problems, add_line, structure, type_name

#: OpenAI top-level fields that never affect what the prefix cache matches (output limits, sampling,
#: streaming, bookkeeping).
VOLATILE_FIELDS: tuple[str, ...] = (
    "logprobs", "max_completion_tokens", "max_output_tokens", "max_tokens", "metadata", "n", "seed", "stop",
    "store", "stream", "stream_options", "temperature", "top_logprobs", "top_p",
)
#: OpenAI: caches are per model (§2.1); nothing else is documented to invalidate the prefix.
FIELD_LEVELS = {"model": "tools"}
#: OpenAI's error ``type`` / ``code`` for the same statuses.
ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    405: ("invalid_request_error", None),
    408: ("invalid_request_error", "timeout"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    529: ("server_error", "overloaded"),
}


# -- segments ----------------------------------------------------------------------------------------------------
def segment_tools(sink: SegmentSink, allowed: frozenset[str], needs_name: bool) -> list[str]:
    tools = sink.body.get("tools")
    if tools is None:
        sink.shape["tools"] = "absent"
        return []
    if not isinstance(tools, list):
        raise ValueError("tools: must be a list of tool definitions")
    sink.shape["tools"] = "list"

    def tool(i: int, t: Any) -> None:
        check_tool(i, t, allowed, needs_name)
        sink.seg(f"tools[{i}]", "tool", None, t)

    sink.section("tools", tools, tool)
    return ["tools"]


def segment_schema(sink: SegmentSink, key: str) -> list[str]:
    value = sink.body.get(key)
    if value is None:
        return []
    if not isinstance(value, dict):
        raise ValueError(f"{key}: must be an object")
    sink.section(key, [value], lambda i, v: sink.seg(key, "schema", None, v), scalar=True)
    return [key]


def check_tool(i: int, tool: Any, allowed: frozenset[str], needs_name: bool) -> None:
    if not isinstance(tool, dict):
        raise ValueError(f"tools[{i}]: must be a tool definition object")
    t = tool.get("type")
    if t not in allowed:
        raise ValueError(f"tools[{i}].type: unknown tool type {t!r}")
    if needs_name:
        inner = tool.get(t)
        if not isinstance(inner, dict) or not isinstance(inner.get("name"), str):
            raise ValueError(f"tools[{i}].{t}: must be an object with a 'name'")


def check_tools(tools: Any, allowed: frozenset[str], needs_name: bool, out: Problems) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        out.add("tools", f"must be a list of tool definitions, got {type_name(tools)}")
        return
    for k, tool in enumerate(tools):
        broken = structure(check_tool, k, tool, allowed, needs_name)
        if broken is not None:
            add_line(out, broken)


# -- usage -------------------------------------------------------------------------------------------------------
def usage_from_payload(usage: Any, *, prompt_key: str, output_key: str, source: UsageSource) -> Usage:
    """:func:`~promptcache_nb.dialects.usage_from_openai` (documented there) for one format's keys:
    Chat's ``prompt_tokens`` / ``completion_tokens``, Responses' ``input_tokens`` / ``output_tokens``."""
    raw = usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else usage
    if not isinstance(raw, dict):
        raise UsageError(f"usage: must be an object, got {type(raw).__name__}")
    raw = dict(raw)
    prompt = _count(raw, prompt_key, "usage", required=True)
    output = _count(raw, output_key, "usage")
    details_key = prompt_key + "_details"
    details = _details(raw, details_key)
    cached = _count(details, "cached_tokens", f"usage.{details_key}")
    written = _count(details, "cache_write_tokens", f"usage.{details_key}")
    if cached is None and "prompt_cache_hit_tokens" in raw:
        cached = _count(raw, "prompt_cache_hit_tokens", "usage")
    out_key = output_key + "_details"
    reasoning = _count(_details(raw, out_key), "reasoning_tokens", f"usage.{out_key}")
    if cached is None:
        return Usage(output_tokens=output, source=source, raw=raw, reasoning_tokens=reasoning)
    written = written or 0
    if cached + written > prompt:
        what = f"usage.{details_key}.cached_tokens ({cached})" + (
            f" + cache_write_tokens ({written})" if written else "")
        raise UsageError(f"{what} exceeds usage.{prompt_key} ({prompt})")
    return Usage(
        input_tokens=prompt - cached - written,
        cache_read_input_tokens=cached,
        cache_creation_input_tokens=written,
        cache_creation_5m_input_tokens=None if written else 0,
        cache_creation_1h_input_tokens=None if written else 0,
        output_tokens=output,
        source=source,
        raw=raw,
        reasoning_tokens=reasoning,
    )


def error_body(status: int, message: str, request_id: str) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` (the request id travels in headers)."""
    kind, code = ERRORS.get(status, ("server_error", None))
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


class OpenAIDialect(DialectBase):
    """What the two OpenAI formats declare alike (:class:`~promptcache_nb.dialects.Dialect`): the provider, what
    never changes the cached prefix, implicit caching, one segment per unit of the list, the usage arithmetic and
    the error body."""

    provider = "openai"
    volatile_fields: tuple[str, ...] = VOLATILE_FIELDS
    field_levels: Mapping[str, str] = FIELD_LEVELS
    limits_nullable = True
    implicit_caching = True
    count_tokens_endpoint = False
    stream_placeholder_usage = False
    logged_usage_counts: tuple[str, ...] = ()
    fast_path = False
    whole_units = True
    #: the usage object's (prompt, output) count keys
    usage_keys: tuple[str, str]

    def units_width(self, units: list[Any]) -> int:
        return len(units)

    def usage(self, payload: Any, *, source: UsageSource) -> Usage:
        prompt_key, output_key = self.usage_keys
        return usage_from_payload(payload, prompt_key=prompt_key, output_key=output_key, source=source)

    def error_body(self, status: int, message: str, request_id: str) -> bytes:
        return error_body(status, message, request_id)
