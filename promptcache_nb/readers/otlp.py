"""Reader for OpenTelemetry GenAI spans and agents' API log events in the OTLP JSON encoding (format ``otlp``).

Files: one ``ExportTraceServiceRequest`` or ``ExportLogsServiceRequest`` document
(``{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}`` / ``{"resourceLogs": [{"scopeLogs":
[{"logRecords": [...]}]}]}``, as SDK file exporters write it, possibly pretty-printed), or JSON Lines of such
documents, one per line (the collector's ``file`` exporter, and the spool of the live receiver,
:class:`promptcache_nb.live.OtlpReceiver`, which maps what it receives with :meth:`OtlpReader.export`: one
mapping for files and the wire); the JSON Lines rules of :mod:`._jsonl` then apply. Attributes are
``{"key", "value": {"stringValue" | "intValue" | "doubleValue" | "boolValue" | "arrayValue" | "kvlistValue"}}``,
and ``intValue`` may be a string (64-bit integers are strings in OTLP JSON).

* **A request** is a span with ``gen_ai.request.model`` or ``gen_ai.usage.input_tokens``, except agent, tool
  and embedding operations (``invoke_agent`` spans may sum their children's usage: counting them would count
  twice).
* **Sessions** group by ``gen_ai.conversation.id``, else by the trace id. ``at`` is the span's start.
* **Re-import identity** (``dedupe_key``): the span's ``traceId/spanId`` where it is trustworthy, else its place
  in the file and a digest of the span (:func:`_span_key`), so spans without ids, or with redacted ones, that
  share a line are never taken for one request.
* **Usage** (semantic conventions): ``gen_ai.usage.cache_read.input_tokens`` and
  ``gen_ai.usage.cache_creation.input_tokens`` (older spellings ``gen_ai.usage.cache_read_input_tokens``,
  ``gen_ai.usage.cache_creation_input_tokens``...) are *included* in ``gen_ai.usage.input_tokens``, so
  uncached input = input − read − write. When that is negative the instrumentation reported Anthropic's
  exclusive figures instead (``input_tokens`` already uncached), and input is taken as the uncached count.
  ``gen_ai.usage.reasoning.output_tokens`` (included in ``gen_ai.usage.output_tokens``) is ``reasoning_tokens``,
  a split of the output that changes no total.
* **Bodies** come from ``gen_ai.system_instructions``, ``gen_ai.input.messages`` and ``gen_ai.tool.definitions``
  (JSON strings in the semconv parts format, ``{"role", "parts": [{"type": "text", "content"}, ...]}``), captured
  only when the agent opted in. Anthropic requests (``gen_ai.provider.name`` / older ``gen_ai.system``) become
  Messages bodies, since the Anthropic cache works on blocks; every other provider becomes an OpenAI Chat
  Completions body (the semconv message shape is the chat shape, and the OpenAI-compatible providers speak it).
  Without captured content the body is ``{"model": m, "messages": []}``; a body lacking any of instructions,
  messages or tool definitions is ``partial``. ``gen_ai.request.max_tokens`` becomes the body's ``max_tokens``.

**Log records** (``resourceLogs``): the event is the record's ``event.name`` attribute, or its body when that is
a string (Claude Code: body ``claude_code.api_request``, ``event.name`` ``api_request``). Attribute values may
be strings (Claude Code sends every value as one). No body is ever logged: each request is usage-only, its body
``{"model": m, "messages": []}`` (``"input": []`` for Codex's Responses API), ``partial``. Sessions group by the
agent's session id. ``at`` is the record's ``event.timestamp`` (else its time), which the agents take when the
response ended: records arrive in that order, so a session received live only ever appends (a start computed as
end − duration would put a short call that overlapped a long one before it). The re-import identity is a digest
of the record (an exporter's retry of a batch is the same record again, never a second request).

* ``claude_code.api_request`` (Claude Code's monitoring docs): ``model``, ``input_tokens`` (Anthropic's: uncached
  only), ``cache_read_tokens``, ``cache_creation_tokens``, ``output_tokens``, ``cost_usd`` (kept as the reported
  cost), ``duration_ms`` (the latency), ``session.id``, ``event.timestamp``.
* ``codex.sse_event`` with ``event.kind`` ``response.completed`` (``codex-rs/otel``): ``input_token_count``
  (the Responses API's: cached included), ``cached_token_count``, ``output_token_count`` (reasoning included),
  ``reasoning_token_count``, ``model``, ``conversation.id``. Its ``codex.api_request`` carries no tokens (one
  per HTTP attempt, retries included) and is not a request here.
* ``gemini_cli.api_response`` (Gemini CLI's ``telemetry.md``): ``input_token_count`` (cached included),
  ``cached_content_token_count``, ``output_token_count`` and ``thoughts_token_count`` (billed as output; also
  ``reasoning_tokens``), ``model``, ``duration_ms``, ``session.id``, ``event.timestamp``.
* a GenAI semantic-conventions event (``gen_ai.client.inference.operation.details``, or any record with
  ``gen_ai.usage.input_tokens``): the span rules above, by its attributes. Gemini CLI emits one beside each
  ``gemini_cli.api_response`` without the cache figure; from a ``gemini-cli`` service it is not counted again.

Other records (prompts, tool results, errors) are not requests and are passed over.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._util import digest
from ..dialects import DialectName as Dialect
from ..errors import PromptCacheError
from ..usage import TTL_SPLIT_UNKNOWN_NOTE, Usage
from ._counts import imported_usage
from ._jsonl import JsonLine, iter_json_lines, parse_timestamp
from ._messages import append_message
from ._types import ImportedRequest, Record, SkippedLine

__all__ = ["OtlpReader"]

_HEAD = re.compile(r'^\s*\{\s*"resource(?:Spans|Logs)"\s*:')
_NOT_MODEL_CALLS = frozenset({"invoke_agent", "create_agent", "execute_tool", "invoke_workflow", "embeddings"})
_READ_KEYS = ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens",
              "gen_ai.usage.input_tokens.cached")
_WRITE_KEYS = ("gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_creation_input_tokens",
               "gen_ai.usage.cache_write_input_tokens", "gen_ai.usage.input_tokens.cache_write")
_CONTENT_KEYS = ("gen_ai.system_instructions", "gen_ai.input.messages", "gen_ai.output.messages",
                 "gen_ai.tool.definitions")
# newer semconv may carry the content on this span event instead of the span
_DETAILS_EVENT = "gen_ai.client.inference.operation.details"


class OtlpReader:
    """Reads OTLP JSON trace files holding GenAI spans (``otlp``); see the module docstring for the rules."""

    name = "otlp"

    def sniff(self, path: Path, head: str) -> bool:
        return bool(_HEAD.match(head))

    def read(self, path: Path) -> Iterator[Record]:
        file = str(path)
        with open(path, "rb") as fh:
            first = fh.readline()
        ids_seen: set[str] = set()  # span ids keyed so far in this file (see _span_key)
        if _is_object(first):  # one document per line (or a one-line document)
            for rec in iter_json_lines(path):
                if isinstance(rec, JsonLine):
                    yield from self.export(rec.obj, file, _line_ref(f"{file}:{rec.line}"), ids_seen)
                else:
                    yield rec
            return
        try:
            doc = json.loads(path.read_bytes())
        except (ValueError, RecursionError) as exc:
            line = exc.lineno if isinstance(exc, json.JSONDecodeError) else 0
            yield SkippedLine(file, line, f"not a valid OTLP JSON document ({str(exc)[:120]})")
            return
        if not isinstance(doc, dict):
            yield SkippedLine(file, 0, "not an OTLP JSON document (the top level is not an object)")
            return
        yield from self.export(doc, file, lambda k: f"{file}#{k}", ids_seen)

    def export(self, doc: dict[str, Any], file: str, ref: Callable[[int], str],
               ids_seen: set[str]) -> Iterator[Record]:
        """The requests (and skipped records) of one OTLP JSON export document: its spans or its log records.

        ``ref(k)`` is the source reference of the document's ``k``-th span or record (``file:line`` for a JSON
        Lines document); ``ids_seen`` the span ids keyed so far in the file (:func:`_span_key`). The live receiver
        calls this on each export it receives, as the reader does on each line of a file."""
        if isinstance(doc.get("resourceLogs"), list):
            yield from self._logs(doc["resourceLogs"], file, ref)
            return
        if not isinstance(doc.get("resourceSpans"), list):
            # a line of another format in a collector's file: listed, never dropped without a word
            yield SkippedLine(file, _line_of(ref(0)), "not an OTLP trace or log export (no resourceSpans or "
                                                      "resourceLogs list)")
            return
        k = 0
        for rs in _list(doc.get("resourceSpans")):
            scopes = _list(rs.get("scopeSpans")) or _list(rs.get("instrumentationLibrarySpans"))
            for ss in scopes:
                for span in _list(ss.get("spans")):
                    k += 1
                    for rec in self._span(span, file, ref(k)):
                        if isinstance(rec, ImportedRequest):
                            rec = replace(rec, dedupe_key=_span_key(span, rec.source_ref, k, ids_seen))
                        yield rec

    def _logs(self, resource_logs: list[Any], file: str, ref: Callable[[int], str]) -> Iterator[Record]:
        k = 0
        for rl in resource_logs:
            if not isinstance(rl, dict):
                continue
            try:
                service = _attributes(_object(rl.get("resource")).get("attributes")).get("service.name")
            except (ValueError, TypeError, OverflowError):
                service = None
            scopes = _list(rl.get("scopeLogs")) or _list(rl.get("instrumentationLibraryLogs"))
            for sl in scopes:
                for record in _list(_object(sl).get("logRecords")):
                    k += 1
                    yield from _log_request(record, file, ref(k), service)

    def _span(self, span: Any, file: str, source_ref: str) -> Iterator[Record]:
        line = _line_of(source_ref)
        if not isinstance(span, dict):
            yield SkippedLine(file, line, f"span {source_ref.rsplit('#', 1)[-1]} is not an object")
            return
        try:
            attrs = _attributes(span.get("attributes"))
            for event in _list(span.get("events")):
                if isinstance(event, dict) and event.get("name") == _DETAILS_EVENT:
                    for key, value in _attributes(event.get("attributes")).items():
                        if key in _CONTENT_KEYS:
                            attrs.setdefault(key, value)
        except (ValueError, TypeError, OverflowError) as exc:  # Overflow: "intValue": 1e400
            yield SkippedLine(file, line, f"span {span.get('name')!r}: bad attribute ({exc})")
            return
        if "gen_ai.request.model" not in attrs and "gen_ai.usage.input_tokens" not in attrs:
            return  # not a GenAI span (HTTP, tool, database...)
        if attrs.get("gen_ai.operation.name") in _NOT_MODEL_CALLS:
            return
        name = span.get("name")
        model = attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model")
        if not isinstance(model, str) or not model:
            yield SkippedLine(file, line, f"span {name!r}: GenAI usage without gen_ai.request.model")
            return
        provider = _provider(attrs.get("gen_ai.provider.name") or attrs.get("gen_ai.system"), model)
        try:
            at = _nanos(span.get("startTimeUnixNano"))
            usage = _usage(attrs, anthropic=provider == "anthropic")
        except (ValueError, TypeError, OverflowError) as exc:
            yield SkippedLine(file, line, f"span {name!r}: {exc}")
            return
        dialect: Dialect = "anthropic" if provider == "anthropic" else "openai-chat"
        system = _parsed(attrs.get("gen_ai.system_instructions"))
        messages = _parsed(attrs.get("gen_ai.input.messages"))
        tools = _parsed(attrs.get("gen_ai.tool.definitions"))
        output = _parsed(attrs.get("gen_ai.output.messages"))
        if provider == "anthropic":
            body = _anthropic_body(model, system, messages, tools)
            reply = [b for m in (output or []) if isinstance(m, dict) for b in _anthropic_blocks(m)] or None
        else:
            body = _chat_body(model, system, messages, tools)
            reply = _chat_messages(output or []) or None
        limit = attrs.get("gen_ai.request.max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
            # the request parameter the span records (the Messages API requires it): after the model, as sent
            body = {"model": model, "max_tokens": limit, **body}
        trace = span.get("traceId")
        conversation = attrs.get("gen_ai.conversation.id")
        yield ImportedRequest(
            session_key=str(conversation) if conversation else str(trace or file),
            dedupe_key=source_ref,  # replaced by _span_key, which sees the whole file's ids
            at=at,
            body=body,
            usage=usage,
            model=model,
            source_ref=source_ref,
            dialect=dialect,
            partial=messages is None or system is None or tools is None,
            request_id=attrs.get("gen_ai.response.id"),
            reply=reply,
            provider=provider,
        )


def _line_ref(ref: str) -> Callable[[int], str]:
    """The source reference of every span or record of one JSON Lines document: its line."""
    return lambda k: ref


def _span_key(span: dict[str, Any], source_ref: str, k: int, ids_seen: set[str]) -> str:
    """The re-import identity of one span: ``<traceId>/<spanId>`` the first time the file names that pair (span
    ids are random and unique per the OTel spec, and the first occurrence keeps its key however a collector's
    file grows), else — no ids, the spec's all-zero invalid ids, or a pair an earlier span already carried (a
    redacted or re-used id) — the span's place in the file (document and span index) and a digest of the span."""
    trace, span_id = span.get("traceId"), span.get("spanId")
    if isinstance(trace, str) and isinstance(span_id, str) and trace.strip("0") and span_id.strip("0"):
        pair = f"{trace}/{span_id}"
        if pair not in ids_seen:
            ids_seen.add(pair)
            return pair
    content = json.dumps(span, sort_keys=True, default=repr).encode("utf-8", errors="surrogatepass")
    return f"{source_ref}/spans[{k}]|{digest(content, tag='otlp-span')}"


# ---- agents' log events ---------------------------------------------------------------------------------

#: The API events that are requests, by the agent that emits them (see the module docstring).
CLAUDE_CODE_EVENT = "claude_code.api_request"
CODEX_EVENT = "codex.sse_event"
GEMINI_CLI_EVENT = "gemini_cli.api_response"
GENAI_EVENT = "gen_ai.client.inference.operation.details"
#: services that log each call twice, once in their own event (with the cache figure) and once as a GenAI event
_OWN_EVENT_SERVICES = frozenset({"gemini-cli"})


def _event_name(record: dict[str, Any], attrs: dict[str, Any]) -> str | None:
    body = _value(record.get("body"))
    name = attrs.get("event.name")
    if isinstance(body, str) and "." in body and (not isinstance(name, str) or body.endswith(name)):
        return body  # Claude Code: body "claude_code.api_request", event.name "api_request"
    return name if isinstance(name, str) else None


def _log_request(record: Any, file: str, source_ref: str, service: Any) -> Iterator[Record]:
    """The request one log record is, if it is one (see the module docstring), or why it could not be read."""
    line = _line_of(source_ref)
    if not isinstance(record, dict):
        yield SkippedLine(file, line, f"log record {source_ref.rsplit('#', 1)[-1]} is not an object")
        return
    try:
        attrs = _attributes(record.get("attributes"))
        name = _event_name(record, attrs)
    except (ValueError, TypeError, OverflowError) as exc:
        yield SkippedLine(file, line, f"log record: bad attribute ({exc})")
        return
    genai = name == GENAI_EVENT or "gen_ai.usage.input_tokens" in attrs
    if name == CODEX_EVENT and attrs.get("event.kind") != "response.completed":
        return  # a streamed event without usage
    if name not in (CLAUDE_CODE_EVENT, CODEX_EVENT, GEMINI_CLI_EVENT) and not genai:
        return  # a prompt, a tool result, an error...
    if genai and name not in (CLAUDE_CODE_EVENT, CODEX_EVENT, GEMINI_CLI_EVENT) and service in _OWN_EVENT_SERVICES:
        return  # counted by the service's own event, which has the cache figure
    try:
        if genai and name not in (CLAUDE_CODE_EVENT, CODEX_EVENT, GEMINI_CLI_EVENT):
            yield from _genai_event(record, attrs, file, source_ref)
            return
        model = attrs.get("model")
        if not isinstance(model, str) or not model:
            raise ValueError("no model attribute")
        end = _event_time(record, attrs)
        duration = _count(attrs, ("duration_ms",))
        session = attrs.get("conversation.id") if name == CODEX_EVENT else attrs.get("session.id")
        raw = {k: v for k, v in sorted(attrs.items()) if k.endswith(("tokens", "token_count", "cost_usd"))}
        if name == CLAUDE_CODE_EVENT:  # Anthropic's figures: input_tokens is the uncached part
            usage = imported_usage(uncached=_required(attrs, "input_tokens"),
                                   read=_count(attrs, ("cache_read_tokens",)) or 0,
                                   write=_count(attrs, ("cache_creation_tokens",)) or 0,
                                   output=_count(attrs, ("output_tokens",)), raw=_with_cost(raw, attrs))
            dialect: Dialect = "anthropic"
            provider, body = "anthropic", {"model": model, "messages": []}
        elif name == CODEX_EVENT:  # the Responses API's: cached included in input, reasoning in output
            total, read = _required(attrs, "input_token_count"), _count(attrs, ("cached_token_count",)) or 0
            output = _count(attrs, ("output_token_count",))
            reasoning = _count(attrs, ("reasoning_token_count",))
            usage = imported_usage(uncached=_part(total, read, "cached_token_count", "input_token_count"),
                                   read=read, write=0, output=output, raw=raw,
                                   reasoning=reasoning if output is None or (reasoning or 0) <= output else None)
            provider, dialect, body = "openai", "openai-responses", {"model": model, "input": []}
        else:  # Gemini: cached included in input; thoughts billed as output beside it
            total = _required(attrs, "input_token_count")
            read = _count(attrs, ("cached_content_token_count",)) or 0
            output, thoughts = _count(attrs, ("output_token_count",)), _count(attrs, ("thoughts_token_count",))
            usage = imported_usage(uncached=_part(total, read, "cached_content_token_count", "input_token_count"),
                                   read=read, write=0,
                                   output=None if output is None else output + (thoughts or 0),
                                   reasoning=thoughts, raw=raw)
            provider, dialect, body = "gemini", "openai-chat", {"model": model, "messages": []}
    except (ValueError, TypeError, OverflowError, PromptCacheError) as exc:
        yield SkippedLine(file, line, f"{name} log record: {exc}")
        return
    yield ImportedRequest(
        session_key=str(session) if session else str(record.get("traceId") or file),
        dedupe_key=_record_key(record), at=end, body=body, usage=usage,
        model=model, source_ref=source_ref, dialect=dialect, partial=True, provider=provider,
        latency_ms=None if duration is None else float(duration))


def _genai_event(record: dict[str, Any], attrs: dict[str, Any], file: str, source_ref: str) -> Iterator[Record]:
    """A GenAI semantic-conventions log event: the span rules, by its attributes (a span's shape around them)."""
    span = {"name": GENAI_EVENT, "attributes": record.get("attributes"), "traceId": record.get("traceId"),
            "startTimeUnixNano": record.get("timeUnixNano") or record.get("observedTimeUnixNano")}
    for rec in OtlpReader()._span(span, file, source_ref):
        yield replace(rec, dedupe_key=_record_key(record)) if isinstance(rec, ImportedRequest) else rec


def _record_key(record: dict[str, Any]) -> str:
    content = json.dumps(record, sort_keys=True, default=repr).encode("utf-8", errors="surrogatepass")
    return f"otlp-log|{digest(content, tag='otlp-log')}"


def _event_time(record: dict[str, Any], attrs: dict[str, Any]) -> datetime:
    stamp = attrs.get("event.timestamp")
    if isinstance(stamp, str) and stamp:
        return parse_timestamp(stamp)
    return _nanos(record.get("timeUnixNano") or record.get("observedTimeUnixNano"))


def _required(attrs: dict[str, Any], key: str) -> int:
    value = _count(attrs, (key,))
    if value is None:
        raise ValueError(f"no {key} attribute")
    return value


def _part(total: int, part: int, part_key: str, total_key: str) -> int:
    if part > total:
        raise ValueError(f"{part_key} ({part}) exceeds {total_key} ({total})")
    return total - part


def _with_cost(raw: dict[str, Any], attrs: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with Claude Code's ``cost_usd`` as the reported ``cost`` (:attr:`Usage.reported_cost`)."""
    try:
        cost = float(attrs["cost_usd"])
    except (KeyError, TypeError, ValueError):
        return raw
    return {**raw, "cost": cost}


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# ---- OTLP values -----------------------------------------------------------------------------------------


def _is_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, RecursionError):
        return False


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _line_of(source_ref: str) -> int:
    tail = source_ref.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in _list(kvs):
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            out[kv["key"]] = _value(kv.get("value"))
    return out


def _value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as a Python value (``intValue`` may be a JSON string)."""
    if not isinstance(v, dict):
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value(x) for x in _list((v["arrayValue"] or {}).get("values"))]
    if "kvlistValue" in v:
        return _attributes((v["kvlistValue"] or {}).get("values"))
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def _nanos(value: Any) -> datetime:
    if value is None:
        raise ValueError("no startTimeUnixNano")
    if isinstance(value, dict) and {"low", "high"} <= value.keys():
        # older OpenTelemetry JS JSON exporters write a fixed64 as its two 32-bit halves
        ns = (int(value["high"]) & 0xFFFFFFFF) << 32 | (int(value["low"]) & 0xFFFFFFFF)
    else:
        ns = int(value)
    if ns <= 0:
        raise ValueError(f"startTimeUnixNano {value!r} is not a time")
    return datetime.fromtimestamp(ns // 1_000_000_000, UTC).replace(microsecond=(ns % 1_000_000_000) // 1000)


def _count(attrs: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"{key} is {value!r}, not a token count")
        number = float(value)
        if number < 0 or number != int(number):
            raise ValueError(f"{key} is {value!r}, not a token count")
        return int(number)
    return None


def _usage(attrs: dict[str, Any], *, anthropic: bool) -> Usage:
    total = _count(attrs, ("gen_ai.usage.input_tokens",))
    read = _count(attrs, _READ_KEYS)
    write = _count(attrs, _WRITE_KEYS)
    if read is not None or write is not None:  # one reported, the other was then zero
        read, write = read or 0, write or 0
    uncached = total
    if total is not None and read is not None and write is not None:
        uncached = total - read - write
        if uncached < 0:
            # The semconv says cache figures are included in input_tokens; a negative remainder means this
            # instrumentation passed Anthropic's figures through, where input_tokens is already uncached.
            uncached = total
    # Spans carry no TTL split. A write's split is then unknown, as in Usage.from_anthropic for an unsplit write:
    # NULL 5m/1h, priced at the 5-minute rate with that assumption noted. No write: 0/0 (nothing to split).
    w5 = w1 = None if write else write
    notes = (TTL_SPLIT_UNKNOWN_NOTE,) if anthropic and write else ()
    output = _count(attrs, ("gen_ai.usage.output_tokens",))
    # part of the output (the semconv: included in output_tokens); one above the output cannot be a part of it
    reasoning = _count(attrs, ("gen_ai.usage.reasoning.output_tokens",))
    if reasoning is not None and output is not None and reasoning > output:
        reasoning = None
    return Usage(
        input_tokens=uncached,
        cache_read_input_tokens=read,
        cache_creation_input_tokens=write,
        cache_creation_5m_input_tokens=w5,
        cache_creation_1h_input_tokens=w1,
        output_tokens=output,
        source="imported",
        raw={k: v for k, v in sorted(attrs.items()) if k.startswith("gen_ai.usage.")},
        reasoning_tokens=reasoning,
        notes=notes,
    )


def _provider(name: Any, model: str) -> str:
    """The provider family that decides the cache model: ``anthropic``, ``openai``, ``deepseek`` or as named."""
    text = str(name or "").lower()
    if "anthropic" in text or (text.startswith(("aws.bedrock", "gcp.vertex")) and "claude" in model.lower()):
        return "anthropic"
    if "openai" in text:  # openai, azure.ai.openai
        return "openai"
    if "deepseek" in text:
        return "deepseek"
    if not text:
        return "anthropic" if model.lower().startswith("claude") else "openai"
    return text


def _parsed(value: Any) -> Any:
    """A content attribute: a JSON string (or already structured); None when absent or unreadable."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    return value if isinstance(value, list) else None


# ---- semconv parts → request bodies ----------------------------------------------------------------------


def _text_of(parts: Any) -> str:
    return "\n".join(str(p.get("content", "")) for p in _list(parts) if isinstance(p, dict)
                     and p.get("type") == "text")


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return {"arguments": value}
    return value if isinstance(value, dict) else {"arguments": value}


def _result_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "\n".join(str(p.get("content", "")) for p in value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _anthropic_block(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": str(part.get("content", ""))}
    if kind == "reasoning":
        return {"type": "thinking", "thinking": str(part.get("content", ""))}
    if kind == "tool_call":
        return {"type": "tool_use", "id": part.get("id"), "name": part.get("name"),
                "input": _arguments(part.get("arguments"))}
    if kind == "tool_call_response":
        return {"type": "tool_result", "tool_use_id": part.get("id"),
                "content": _result_text(part.get("response", part.get("result")))}
    if kind == "blob" and part.get("modality") == "image":
        return {"type": "image", "source": {"type": "base64", "media_type": part.get("mime_type"),
                                            "data": part.get("content")}}
    if kind == "uri" and part.get("modality") == "image":
        return {"type": "image", "source": {"type": "url", "url": part.get("uri")}}
    # A part type with no Messages equivalent: kept as text of its JSON, so the request keeps its measured
    # usage and a stable, comparable segment instead of being refused.
    return {"type": "text", "text": json.dumps(part, ensure_ascii=False, sort_keys=True)}


def _anthropic_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [_anthropic_block(p) for p in _list(message.get("parts")) if isinstance(p, dict)]


def _anthropic_body(model: str, system: list[Any] | None, messages: list[Any] | None,
                    tools: list[Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model}
    if tools:
        body["tools"] = [{"name": t.get("name"), "description": t.get("description", ""),
                          "input_schema": t.get("parameters") or {"type": "object"}}
                         for t in tools if isinstance(t, dict)]
    sys_blocks = [_anthropic_block(p) for p in system or [] if isinstance(p, dict)]
    out: list[dict[str, Any]] = []
    for m in messages or []:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "system":  # the Messages API has one system prompt
            sys_blocks.extend(_anthropic_blocks(m))
            continue
        # tool results travel in user turns in the Messages API
        append_message(out, "assistant" if m.get("role") == "assistant" else "user", _anthropic_blocks(m))
    if sys_blocks:
        body["system"] = sys_blocks
    body["messages"] = out
    return body


def _chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role") or "user")
        parts = [p for p in _list(m.get("parts")) if isinstance(p, dict)]
        if role == "tool":
            for p in parts:
                if p.get("type") == "tool_call_response":
                    out.append({"role": "tool", "tool_call_id": p.get("id"),
                                "content": _result_text(p.get("response", p.get("result")))})
            continue
        msg: dict[str, Any] = {"role": role}
        content = [_chat_part(p) for p in parts if p.get("type") not in ("tool_call", "reasoning")]
        # Chat Completions has no field to send reasoning back: reasoning parts are dropped
        if all(c["type"] == "text" for c in content):
            msg["content"] = "\n".join(c["text"] for c in content) if content else None
        else:
            msg["content"] = content
        calls = [{"id": p.get("id"), "type": "function",
                  "function": {"name": p.get("name"), "arguments": p["arguments"] if isinstance(
                      p.get("arguments"), str) else json.dumps(p.get("arguments") or {}, ensure_ascii=False)}}
                 for p in parts if p.get("type") == "tool_call"]
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _chat_part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": str(part.get("content", ""))}
    if kind == "uri" and part.get("modality") == "image":
        return {"type": "image_url", "image_url": {"url": part.get("uri")}}
    if kind == "blob" and part.get("modality") == "image":
        url = f"data:{part.get('mime_type')};base64,{part.get('content')}"
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "text", "text": json.dumps(part, ensure_ascii=False, sort_keys=True)}  # as for Messages


def _chat_body(model: str, system: list[Any] | None, messages: list[Any] | None,
               tools: list[Any] | None) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _text_of(system)})
    out.extend(_chat_messages(messages or []))
    body: dict[str, Any] = {"model": model, "messages": out}
    if tools:
        body["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                           if k in t}} for t in tools if isinstance(t, dict)]
    return body
