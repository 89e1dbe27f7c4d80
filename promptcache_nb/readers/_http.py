"""One recorded HTTP exchange → one :class:`ImportedRequest` (or a :class:`SkippedLine` saying why not).

Shared by the ``vcr``, ``har`` and ``exchanges`` readers: each turns its own container into
:class:`HttpExchange` values and calls :func:`convert_exchange`.

Endpoints (matched on the URL path's ending, so proxies' prefixes and Azure deployments work):

- ``POST …/v1/messages`` → dialect ``anthropic``, provider ``anthropic``;
- ``POST …/chat/completions`` → ``openai-chat``, provider ``openai``;
- ``POST …/responses`` → ``openai-responses``, provider ``openai``.

Anything else (``/v1/messages/count_tokens``, batches, files, models, ``GET /v1/responses/{id}``…) is skipped
as ``endpoint not analysed: <path>`` (so is an analysed path called with another method than POST). A non-2xx
status is skipped as ``HTTP <status>``; a call with no response as ``no response``.

Streamed responses are recognised by ``content-type: text/event-stream``, by pre-parsed events, or by
``"stream": true`` in the request with a body that is not JSON, and summarised by
:func:`._sse.usage_from_sse`. An OpenAI Chat stream sent without ``stream_options.include_usage`` carries no
usage: it is skipped as ``streamed without usage`` (never stored as 0 tokens). An Anthropic stream cut before
``message_delta`` keeps its input and cache figures with ``output_tokens`` unknown (None); a stream that
reports an error is skipped as ``stream ended with an error: …``. ``gzip`` and ``deflate`` bodies are decoded
(also when only the gzip magic bytes say so); other encodings are skipped naming them.

Usage conversion (``source="imported"``, the native payload kept in ``Usage.raw``):

- Anthropic: ``dialects.usage_from_anthropic`` after checking the shape (``input_tokens``/``output_tokens``
  integers, cache figures integers when present).
- OpenAI: ``dialects.usage_from_openai`` (cached and written tokens are *included* in ``prompt_tokens`` /
  ``input_tokens``: ``uncached = prompt - cached - written``, write 0 unless reported; no cached figure at all
  means the split is unknown, not 0).
- A usage object whose shape is not understood is skipped as ``unknown usage shape: <field>: <problem>``.

Amazon Bedrock Runtime (``POST …/model/<model-id>/invoke``, ``/invoke-with-response-stream``, ``/converse``,
``/converse-stream``; :func:`bedrock_call`) → dialect ``anthropic``, provider ``anthropic`` for Claude models
(other Bedrock models are skipped naming the model). The model comes from the URL (the body has none);
InvokeModel bodies and responses are the Messages shape, Converse bodies are translated to it
(:func:`converse_request_to_messages`) and Converse usage names are read (:func:`converse_usage`). Streams are
``application/vnd.amazon.eventstream`` (:func:`aws_event_stream`).

Account: the organisation or workspace the provider billed and cached the call under, when a response header
names it (``anthropic-organization-id``, ``anthropic-workspace-id``, ``openai-organization``, ``openai-project``);
an id, never anything derived from an API key.

Request id: the ``request-id`` / ``x-request-id`` (Bedrock: ``x-amzn-requestid``) response header, else the id
the container recorded, else the response's ``id``. ``dedupe_key`` is that id as converted here; the readers
then replace it where the id is not trustworthy (:func:`with_trusted_ids` for cassettes and HAR files, the
first-occurrence rule of the proxy's log), so a redacted id never makes two calls one.

Sessions (``session_key``): one session per file (the path the reader was given, so two files of one name in
different folders are two sessions) and provider — ``"<file>|anthropic"`` /
``"<file>|openai"`` — split further when the request names its end user or conversation: Anthropic
``metadata.user_id``, OpenAI ``prompt_cache_key`` (else ``user``, else ``safety_identifier``), appended as
``"|<value>"``. HTTP recordings carry no conversation id, and a cassette or HAR file is usually one test or
one browsing session, so the file is the natural unit; the request's own cache-routing key is the only
finer signal that the provider itself honours.

Timestamps (``at``): the container's own start time, else the response ``Date`` header, else the response
body's ``created`` / ``created_at``, else the caller's fallback (the file's modification time); always UTC.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import re
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from .._util import SIMULATOR_HEADER, digest
from ..dialects import DialectName as Dialect
from ..dialects import get as get_format
from ..usage import Usage
from ._history import HistoryDecoder
from ._sse import SseEvent, StreamSummary, parse_sse, usage_from_sse
from ._types import ImportedRequest, SkippedLine

MAX_DECODED_BYTES = 512 * 1024 * 1024  # a decompression bomb stops here, with a one-line reason


@dataclass(frozen=True)
class HttpExchange:
    """One recorded HTTP call, as neutral as the containers allow.

    Attributes:
        method: HTTP method (``POST``).
        url: the full URL (a bare path is fine).
        status: HTTP status, or None when no response came back.
        request_body: raw bytes/str (possibly gzip) or an already parsed JSON object.
        response_body: raw bytes/str or a parsed JSON object; None when only ``sse``/``usage`` are known.
        request_headers: header name (any case) → value.
        response_headers: header name (any case) → value.
        started_at: when the request was sent, when the container records it (UTC).
        sse: the stream's events, when the container stores them already split (the proxy's log).
        usage: the provider's native usage as recorded beside the body (the proxy's log); used only when the
            body or stream yields none.
        request_id: an id the container recorded itself.
        error: why no (complete) response came back, when the container says.
    """

    method: str
    url: str
    status: int | None
    request_body: bytes | str | dict[str, Any] | None
    response_body: bytes | str | dict[str, Any] | None = None
    request_headers: Mapping[str, str] = field(default_factory=dict)
    response_headers: Mapping[str, str] = field(default_factory=dict)
    started_at: datetime | None = None
    sse: list[SseEvent | Mapping[str, Any]] | None = None
    usage: dict[str, Any] | None = None
    request_id: str | None = None
    error: str | None = None


class _Skip(Exception):
    """Internal: the exchange is not a request we store; ``args[0]`` is the reason."""


def headers_dict(headers: Any) -> dict[str, str]:
    """Normalise recorded headers to ``{lowercase name: value}``.

    Accepts a mapping of name → str or list of str (vcrpy), or a list of ``{"name", "value"}`` (HAR). The
    first value wins for repeated names (``content-type`` and ids are never meaningfully repeated).
    """
    out: dict[str, str] = {}
    if isinstance(headers, Mapping):
        items: Iterable[tuple[Any, Any]] = headers.items()
    elif isinstance(headers, list):
        items = ((h.get("name"), h.get("value")) for h in headers if isinstance(h, Mapping))
    else:
        return out
    for name, value in items:
        if name is None:
            continue
        if isinstance(value, list | tuple):
            value = value[0] if value else ""
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        out.setdefault(str(name).lower(), "" if value is None else str(value))
    return out


def endpoint_dialect(method: str, url: str) -> Dialect | None:
    """The dialect of an analysed endpoint, or None for any other call."""
    if method.upper() != "POST":
        return None
    path = urlsplit(url).path.rstrip("/")
    if path.endswith("/v1/messages"):  # not "/messages": OpenAI Assistants threads have one too
        return "anthropic"
    if path.endswith("/chat/completions"):
        return "openai-chat"
    if path.endswith("/responses"):
        return "openai-responses"
    return None


# --- Amazon Bedrock ---------------------------------------------------------------------------------------

_BEDROCK_PATH = re.compile(
    r"/model/(?P<model>[^/]+)/(?P<op>invoke|invoke-with-response-stream|converse|converse-stream)$")


@dataclass(frozen=True)
class BedrockCall:
    """A Bedrock Runtime call: the operation and the model id its URL names.

    Attributes:
        operation: ``invoke``, ``invoke-with-response-stream`` (InvokeModel: the body and response are the
            model's own API, the Anthropic Messages shape for Claude) or ``converse``, ``converse-stream``
            (Bedrock's model-neutral Converse shape).
        model: the model id from the URL, percent-decoded; an inference-profile or foundation-model ARN is cut
            to the id after its last ``/`` (``arn:…:inference-profile/us.anthropic.claude-…`` →
            ``us.anthropic.claude-…``).
    """

    operation: str
    model: str

    @property
    def streamed(self) -> bool:
        return self.operation.endswith("stream")

    @property
    def converse(self) -> bool:
        return self.operation.startswith("converse")


def bedrock_call(method: str, url: str) -> BedrockCall | None:
    """The Bedrock Runtime operation of ``POST …/model/<model-id>/<operation>``, or None for any other call.

    The URL is ``https://bedrock-runtime.<region>.amazonaws.com/model/<model-id>/invoke`` (also
    ``/invoke-with-response-stream``, ``/converse``, ``/converse-stream``); the id is percent-encoded in the
    path (an ARN's ``:`` and ``/``) and may be a cross-region inference profile
    (``us.anthropic.claude-sonnet-4-5-20250929-v1:0``).
    """
    if method.upper() != "POST":
        return None
    match = _BEDROCK_PATH.search(urlsplit(url).path.rstrip("/"))
    if match is None:
        return None
    model = unquote(match.group("model"))
    if model.startswith("arn:") and "/" in model:
        model = model.rsplit("/", 1)[1]
    return BedrockCall(match.group("op"), model)


def converse_usage(raw: Any) -> Usage:
    """Convert Bedrock Converse ``usage`` (``TokenUsage``) to :class:`Usage`, the native object kept in ``raw``.

    Fields (Bedrock API reference, ``TokenUsage``): ``inputTokens`` (the tokens not read from or written to the
    cache, as Anthropic's ``input_tokens``: AWS's prompt-caching guide reports reads and writes beside it, and
    ``totalTokens`` = input + output + reads + writes), ``outputTokens``, ``cacheReadInputTokens``,
    ``cacheWriteInputTokens`` and ``cacheDetails`` (``[{"ttl": "5m" | "1h", "inputTokens": n}]``, the writes
    by TTL). Without ``cacheDetails`` the 5m/1h split of a write is not reported.
    """
    if not isinstance(raw, Mapping):
        raise _Skip(f"unknown usage shape: usage: must be an object, got {type(raw).__name__}")
    for name in ("inputTokens", "outputTokens"):
        if raw.get(name) is None:
            raise _Skip(f"unknown usage shape: usage.{name}: missing")
    shaped: dict[str, Any] = {"input_tokens": raw.get("inputTokens"), "output_tokens": raw.get("outputTokens")}
    if raw.get("cacheReadInputTokens") is not None:
        shaped["cache_read_input_tokens"] = raw["cacheReadInputTokens"]
    if raw.get("cacheWriteInputTokens") is not None:
        shaped["cache_creation_input_tokens"] = raw["cacheWriteInputTokens"]
    details = raw.get("cacheDetails")
    if isinstance(details, list) and details:
        split = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
        for item in details:
            ttl = item.get("ttl") if isinstance(item, Mapping) else None
            key = {"5m": "ephemeral_5m_input_tokens", "1h": "ephemeral_1h_input_tokens"}.get(str(ttl))
            if key is None:
                raise _Skip(f"unknown usage shape: usage.cacheDetails: ttl {ttl!r} is not 5m or 1h")
            split[key] += item.get("inputTokens") or 0
        shaped["cache_creation"] = split
    return replace(anthropic_usage(shaped), raw=dict(raw))


def _converse_block(block: Any) -> dict[str, Any] | None:
    """One Converse content block as the Anthropic block it stands for (None for a ``cachePoint``)."""
    if not isinstance(block, Mapping):
        return {"type": "unknown", "value": block}
    if "text" in block:
        return {"type": "text", "text": block["text"]}
    if "toolUse" in block:
        use = block["toolUse"] or {}
        return {"type": "tool_use", "id": use.get("toolUseId"), "name": use.get("name"), "input": use.get("input", {})}
    if "toolResult" in block:
        result = block["toolResult"] or {}
        parts = []
        for part in result.get("content") or []:
            if isinstance(part, Mapping) and "json" in part:
                parts.append({"type": "text", "text": json.dumps(part["json"], sort_keys=True)})
            else:
                converted = _converse_block(part)
                if converted is not None:
                    parts.append(converted)
        out: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.get("toolUseId"), "content": parts}
        if result.get("status") == "error":
            out["is_error"] = True
        return out
    if "reasoningContent" in block:
        text = (block["reasoningContent"] or {}).get("reasoningText") or {}
        return {"type": "thinking", "thinking": text.get("text", ""), "signature": text.get("signature", "")}
    if "cachePoint" in block:
        return None
    kind = next(iter(block), "unknown")  # image, document, video…: kept under their Converse name
    return {"type": str(kind), "source": block.get(kind)}


def _converse_blocks(blocks: Any, where: str) -> list[dict[str, Any]]:
    """Converse blocks → Anthropic blocks; a ``cachePoint`` becomes ``cache_control`` on the block before it."""
    if not isinstance(blocks, list):
        raise _Skip(f"request body {where} is not a list of Converse content blocks")
    out: list[dict[str, Any]] = []
    for block in blocks:
        converted = _converse_block(block)
        if converted is not None:
            out.append(converted)
            continue
        if out:
            ttl = ((block.get("cachePoint") or {}).get("ttl") if isinstance(block, Mapping) else None)
            out[-1]["cache_control"] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return out


def converse_request_to_messages(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A Converse request body as the Anthropic Messages body it sends to a Claude model on Bedrock.

    ``system`` and each message's ``content`` are lists of Converse blocks (``text``, ``toolUse``,
    ``toolResult``, ``image``…, and ``cachePoint`` markers, which set ``cache_control`` on the block before
    them); ``toolConfig.tools`` holds ``toolSpec`` entries (``inputSchema.json``) and ``cachePoint`` markers;
    ``inferenceConfig.maxTokens`` is ``max_tokens``. The order of blocks, and so the cache prefix, is kept.
    """
    out: dict[str, Any] = {"model": model}
    config = body.get("inferenceConfig")
    if isinstance(config, Mapping) and config.get("maxTokens") is not None:
        out["max_tokens"] = config["maxTokens"]
    tool_config = body.get("toolConfig")
    if isinstance(tool_config, Mapping) and isinstance(tool_config.get("tools"), list):
        tools: list[dict[str, Any]] = []
        for tool in tool_config["tools"]:
            spec = tool.get("toolSpec") if isinstance(tool, Mapping) else None
            if isinstance(spec, Mapping):
                schema = spec.get("inputSchema") or {}
                tools.append({"name": spec.get("name"), "description": spec.get("description", ""),
                              "input_schema": schema.get("json", schema) if isinstance(schema, Mapping) else {}})
            elif isinstance(tool, Mapping) and "cachePoint" in tool and tools:
                tools[-1]["cache_control"] = {"type": "ephemeral"}
        out["tools"] = tools
    if body.get("system") is not None:
        out["system"] = _converse_blocks(body["system"], "system")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _Skip("request body has no messages list (Converse)")
    out["messages"] = [
        {"role": m.get("role"), "content": _converse_blocks(m.get("content"), f"messages[{i}].content")}
        if isinstance(m, Mapping) else m
        for i, m in enumerate(messages)
    ]
    return out


def aws_event_stream(data: bytes) -> list[tuple[dict[str, str], bytes]]:
    """Split an ``application/vnd.amazon.eventstream`` body into (string headers, payload) messages.

    Each message: total length (4 bytes, big-endian), headers length (4), prelude CRC32 (4), headers,
    payload, message CRC32 (4); a header is a 1-byte name length, the name, a 1-byte value type and the value
    (type 7, a string: 2-byte length and UTF-8). Raises ``_Skip`` naming the offset of a damaged message.
    """
    sizes = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}  # fixed-size value types (bool true/false: 0)
    messages: list[tuple[dict[str, str], bytes]] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 16:
            raise _Skip(f"event stream cut at byte {pos}")
        total, header_len, prelude_crc = struct.unpack_from(">III", data, pos)
        if zlib.crc32(data[pos:pos + 8]) != prelude_crc or total < 16 + header_len or pos + total > len(data):
            raise _Skip(f"event stream message at byte {pos} is damaged")
        headers: dict[str, str] = {}
        h = pos + 12
        end = h + header_len
        while h < end:
            name_len = data[h]
            name = data[h + 1:h + 1 + name_len].decode("utf-8", errors="replace")
            kind = data[h + 1 + name_len]
            h += 2 + name_len
            if kind in (6, 7):  # byte array, string
                (length,) = struct.unpack_from(">H", data, h)
                value = data[h + 2:h + 2 + length]
                if kind == 7:
                    headers[name] = value.decode("utf-8", errors="replace")
                h += 2 + length
            elif kind in sizes:
                h += sizes[kind]
            else:
                raise _Skip(f"event stream header type {kind} at byte {h} is unknown")
        messages.append((headers, data[end:pos + total - 4]))
        pos += total
    return messages


def _bedrock_stream(data: bytes, call: BedrockCall) -> tuple[StreamSummary, dict[str, Any] | None]:
    """Summarise a Bedrock stream: its Anthropic events (InvokeModel) or Converse events.

    InvokeModel streams carry each Anthropic Messages event base64-encoded in a ``chunk`` event's
    ``{"bytes": …}``; the last one adds ``amazon-bedrock-invocationMetrics`` (token counts in Bedrock's names,
    returned second as a fallback usage). ConverseStream sends ``messageStart``, ``contentBlockDelta``,
    ``messageStop`` and a ``metadata`` event whose ``usage`` is Converse's ``TokenUsage``.
    """
    events: list[dict[str, Any]] = []
    metrics: dict[str, Any] | None = None
    converse_meta: dict[str, Any] | None = None
    text: list[str] = []
    stop_reason: str | None = None
    for headers, payload in aws_event_stream(data):
        kind = headers.get(":event-type") or headers.get(":exception-type") or ""
        if headers.get(":message-type") == "exception":
            raise _Skip(f"stream ended with an error: {headers.get(':exception-type', 'exception')}: "
                        f"{payload[:200].decode('utf-8', errors='replace')}")
        try:
            obj = json.loads(payload) if payload else {}
        except (ValueError, RecursionError):
            raise _Skip(f"event stream {kind or 'event'} payload is not JSON") from None
        if not isinstance(obj, dict):
            continue
        if call.converse:
            if kind == "metadata":
                converse_meta = obj
            elif kind == "contentBlockDelta":
                delta = obj.get("delta") or {}
                if isinstance(delta.get("text"), str):
                    text.append(delta["text"])
            elif kind == "messageStop":
                stop_reason = obj.get("stopReason")
            continue
        try:
            inner = json.loads(base64.b64decode(obj.get("bytes") or ""))
        except (binascii.Error, ValueError):
            raise _Skip("event stream chunk is not base64 JSON") from None
        if isinstance(inner, dict):
            if isinstance(inner.get("amazon-bedrock-invocationMetrics"), dict):
                metrics = inner["amazon-bedrock-invocationMetrics"]
            events.append({"event": inner.get("type"), "data": inner})
    if call.converse:
        usage = converse_meta.get("usage") if converse_meta else None
        content = [{"type": "text", "text": "".join(text)}] if text else []
        return StreamSummary("anthropic", usage, None, None, content, stop_reason, None, 0, usage is not None), None
    fallback = None
    if metrics is not None and metrics.get("inputTokenCount") is not None:
        fallback = {"inputTokens": metrics.get("inputTokenCount"), "outputTokens": metrics.get("outputTokenCount"),
                    "cacheReadInputTokens": metrics.get("cacheReadInputTokenCount"),
                    "cacheWriteInputTokens": metrics.get("cacheWriteInputTokenCount")}
    return usage_from_sse(events, "anthropic"), fallback


def _limited(decompressor: Any, data: bytes, what: str) -> bytes:
    out: bytes = decompressor.decompress(data, MAX_DECODED_BYTES + 1)
    if len(out) > MAX_DECODED_BYTES:
        raise _Skip(f"{what} body decompresses past {MAX_DECODED_BYTES // 2**20} MiB")
    return out


def decode_body(body: bytes | str | None, encoding: str | None, *, what: str = "response") -> bytes | str | None:
    """Undo ``Content-Encoding`` (gzip, deflate; gzip also by its magic bytes). Raises ``_Skip`` otherwise."""
    enc = (encoding or "").strip().lower()
    if isinstance(body, str) or body is None:
        return body
    if enc in ("", "identity") and not body.startswith(b"\x1f\x8b"):
        return body
    if enc in ("gzip", "x-gzip") or body.startswith(b"\x1f\x8b"):
        try:
            return _limited(zlib.decompressobj(16 + zlib.MAX_WBITS), body, what)
        except (zlib.error, gzip.BadGzipFile) as exc:
            raise _Skip(f"{what} body is not valid gzip ({exc})") from None
    if enc == "deflate":
        for wbits in (zlib.MAX_WBITS, -zlib.MAX_WBITS):  # zlib-wrapped, or raw as some servers send
            try:
                return _limited(zlib.decompressobj(wbits), body, what)
            except zlib.error:
                continue
        raise _Skip(f"{what} body is not valid deflate data")
    raise _Skip(f"{what} body encoded with {enc} (not supported; record with decoded bodies)")


def _text(body: bytes | str) -> str:
    return body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body


def _json_body(body: bytes | str | dict[str, Any] | None, what: str,
               bodies: HistoryDecoder | None = None) -> dict[str, Any]:
    if isinstance(body, dict):
        return body
    if body is None:
        raise _Skip(f"{what} body missing")
    try:
        value = (bodies.loads if bodies is not None else json.loads)(_text(body))
    except (ValueError, RecursionError):
        raise _Skip(f"{what} body is not JSON") from None
    if not isinstance(value, dict):
        raise _Skip(f"{what} body is not a JSON object")
    return value


# --- usage conversion -------------------------------------------------------------------------------------


def anthropic_usage(raw: Any) -> Usage:
    """Convert an Anthropic ``usage`` object with ``dialects.usage_from_anthropic`` (``source="imported"``); a log's
    usage must carry both ``input_tokens`` and ``output_tokens``. Refusals become skip reasons naming the field."""
    return convert_usage(raw, "anthropic")


def convert_usage(raw: Any, dialect: Dialect) -> Usage:
    """Native usage of ``dialect`` → :class:`Usage` (``Dialect.usage``, ``source="imported"``); a log's usage must
    carry the counts the format names (``Dialect.logged_usage_counts``). Raises ``_Skip`` naming the field it does
    not understand."""
    fmt = get_format(dialect)
    for name in fmt.logged_usage_counts:
        if isinstance(raw, dict) and raw.get(name) is None:
            raise _Skip(f"unknown usage shape: usage.{name}: missing")
    try:
        return fmt.usage(raw, source="imported")
    except ValueError as exc:
        raise _Skip(f"unknown usage shape: {exc}") from None


# --- the exchange -----------------------------------------------------------------------------------------


def _session_group(body: Mapping[str, Any], provider: str) -> str | None:
    if provider == "anthropic":
        metadata = body.get("metadata")
        value = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    else:
        value = body.get("prompt_cache_key") or body.get("user") or body.get("safety_identifier")
    return str(value) if value else None


def session_key_for(file: str, provider: str, body: Mapping[str, Any]) -> str:
    """The session a request of ``file`` belongs to (see the module docstring)."""
    group = _session_group(body, provider)
    return f"{file}|{provider}" + (f"|{group}" if group else "")


def parse_iso_utc(value: Any) -> datetime:
    """An ISO 8601 timestamp (``Z`` accepted) → aware UTC datetime; naive times are taken as UTC.

    Raises:
        ValueError: ``value`` is not an ISO 8601 string.
    """
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not an ISO 8601 string")
    at = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    return at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)


def parse_http_date(value: Any) -> datetime | None:
    """An RFC 7231 / RFC 2822 date (``Date`` header, Ruby VCR ``recorded_at``) → UTC datetime, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parsedate_to_datetime(value).astimezone(UTC)
    except (TypeError, ValueError, IndexError):
        return None


def _when(ex: HttpExchange, headers: Mapping[str, str], response: Mapping[str, Any] | None,
          fallback: datetime) -> datetime:
    if ex.started_at is not None:
        at = ex.started_at
        return at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)
    dated = parse_http_date(headers.get("date"))
    if dated is not None:
        return dated
    if response:
        stamp = response.get("created_at", response.get("created"))
        if isinstance(stamp, int | float) and not isinstance(stamp, bool):
            return datetime.fromtimestamp(stamp, tz=UTC)
    return fallback


def _is_stream(ex: HttpExchange, headers: Mapping[str, str], body: Mapping[str, Any], text: str | None) -> bool:
    if ex.sse is not None:
        return True
    if "text/event-stream" in headers.get("content-type", "").lower():
        return True
    if body.get("stream") is True and text is not None:
        head = text.lstrip()[:16]
        return head.startswith(("event:", "data:", ":"))
    return False


def convert_exchange(
    ex: HttpExchange, *, file: str, line: int, source_ref: str, fallback_at: datetime,
    bodies: HistoryDecoder | None = None,
) -> ImportedRequest | SkippedLine:
    """Turn one exchange into an :class:`ImportedRequest`, or a :class:`SkippedLine` with a one-line reason.

    Args:
        ex: the exchange.
        file: the file it came from (names the session and the skipped line).
        line: the line (JSON Lines) or the 1-based entry index (documents) for ``SkippedLine``.
        source_ref: where the request was read (``file:line`` or ``file#entries[i]``).
        fallback_at: the time to use when neither the container nor the response carries one.
        bodies: the file's decoder of request body text (reuses the history a body repeats from the one before).
    """
    try:
        return _convert(ex, file=file, source_ref=source_ref, fallback_at=fallback_at, bodies=bodies)
    except _Skip as skip:
        return SkippedLine(file=file, line=line, reason=str(skip.args[0]))


def _convert(ex: HttpExchange, *, file: str, source_ref: str, fallback_at: datetime,
             bodies: HistoryDecoder | None) -> ImportedRequest:
    bedrock = bedrock_call(ex.method, ex.url)
    dialect = "anthropic" if bedrock is not None else endpoint_dialect(ex.method, ex.url)
    path = urlsplit(ex.url).path or ex.url
    if dialect is None:
        raise _Skip(f"endpoint not analysed: {path}")
    if ex.status is None:
        raise _Skip(f"no response: {ex.error}" if ex.error else "no response")
    if not 200 <= ex.status < 300:
        raise _Skip(f"HTTP {ex.status}")
    fmt = get_format(dialect)
    provider = fmt.provider
    req_headers = headers_dict(ex.request_headers)
    resp_headers = headers_dict(ex.response_headers)

    raw_request = ex.request_body
    if not isinstance(raw_request, dict):
        raw_request = decode_body(raw_request, req_headers.get("content-encoding"), what="request")
    body = _json_body(raw_request, "request", bodies if bedrock is None or not bedrock.converse else None)
    if bedrock is not None:
        # an application inference profile's id names no model: an InvokeModel body in the Messages shape
        # (its anthropic_version) still says Claude
        claude = "anthropic." in bedrock.model or "claude" in bedrock.model or (
            not bedrock.converse and "anthropic_version" in body)
        if not claude:
            raise _Skip(f"Bedrock model not analysed (not a Claude model): {bedrock.model}")
        # the model is in the URL only; a Converse body is translated to the Messages body Claude receives
        body = converse_request_to_messages(body, bedrock.model) if bedrock.converse else \
            {"model": bedrock.model, **body}

    raw_response = ex.response_body
    decoded: bytes | str | None = None
    text: str | None = None
    if raw_response is not None and not isinstance(raw_response, dict):
        decoded = decode_body(raw_response, resp_headers.get("content-encoding"))
        text = _text(decoded) if decoded is not None else None

    response: dict[str, Any] | None = None
    cut_short = False
    reply: list[dict[str, Any]] | None = None
    native: Any = None
    fallback_native: Any = ex.usage
    response_id: str | None = None
    response_model: str | None = None
    diagnostics: Any = None  # the response's cache diagnostics (Dialect.diagnosis reads them)
    if bedrock is not None and bedrock.streamed and decoded is not None:
        # a recorder that stored the stream as text decoded it as UTF-8 (vcrpy does when the bytes allow it)
        data = decoded if isinstance(decoded, bytes) else decoded.encode("utf-8", errors="surrogateescape")
        summary, metrics_usage = _bedrock_stream(data, bedrock)
        native = summary.usage
        if native is None and metrics_usage is not None:
            native, bedrock = metrics_usage, BedrockCall("converse-stream", bedrock.model)  # Bedrock's names
        if native is None:
            raise _Skip("streamed without usage")
        reply, response_id = summary.content or None, summary.response_id
        if not bedrock.converse and not summary.complete:
            cut_short = True
    elif _is_stream(ex, resp_headers, body, text):
        events = ex.sse if ex.sse is not None else parse_sse(text or "")
        summary = usage_from_sse(events, dialect)
        if summary.error:
            raise _Skip(f"stream ended with an error: {summary.error}")
        native = summary.usage if summary.usage is not None else ex.usage
        if native is None:
            raise _Skip("streamed without usage")
        reply, response_id, response_model = summary.content or None, summary.response_id, summary.model
        diagnostics = summary.diagnostics
        if fmt.stream_placeholder_usage and summary.usage is not None and not summary.complete:
            cut_short = True  # no message_delta: output_tokens is message_start's placeholder
    else:
        if isinstance(raw_response, dict):
            response = raw_response
        elif text is not None:
            response = _json_body(text, "response")
        if response is not None:
            native = response.get("usage")
            response_id = response.get("id")
            response_model = response.get("model")
            diagnostics = response.get("diagnostics")
            reply = fmt.reply(response)
            if bedrock is not None and bedrock.converse:
                message = (response.get("output") or {}).get("message") or {}
                reply = _converse_blocks(message.get("content") or [], "output") or None
        if native is None:
            native = fallback_native
        if native is None:
            raise _Skip("response has no usage")
    if bedrock is not None and bedrock.converse:
        usage = converse_usage(native)
    else:
        usage = convert_usage(native, dialect)
    if any(k.lower() == SIMULATOR_HEADER for k in resp_headers):
        usage = replace(usage, source="simulated")  # our simulator answered: estimated tokens, not measured
    if cut_short:
        usage = replace(usage, output_tokens=None)  # unknown, not the placeholder

    model = body.get("model") or response_model
    if not isinstance(model, str) or not model:
        raise _Skip("request has no model")
    request_id = (
        resp_headers.get("request-id") or resp_headers.get("x-request-id") or resp_headers.get("x-amzn-requestid")
        or ex.request_id or response_id
    )
    return ImportedRequest(
        account=account_from_headers(resp_headers),
        session_key=session_key_for(file, provider, body),
        dedupe_key=request_id or source_ref,
        at=_when(ex, resp_headers, response, fallback_at),
        body=body,
        usage=usage,
        model=model,
        source_ref=source_ref,
        dialect=dialect,
        partial=False,
        request_id=request_id,
        reply=reply,
        provider=provider,
        provider_diagnosis=fmt.diagnosis(body, diagnostics),
        response_id=response_id if isinstance(response_id, str) else None,
    )


#: Response headers naming the cache's owner, most specific first: a workspace (or OpenAI project) within an
#: organisation (Anthropic isolates caches per workspace on its API; OpenAI caches per organisation / project).
_ACCOUNT_HEADERS = (("anthropic-organization-id", "anthropic-workspace-id"), ("openai-organization", "openai-project"))


def account_from_headers(headers: Mapping[str, str]) -> str | None:
    """The account a response names (``org`` or ``org/workspace``), or None when no header says."""
    for org_header, sub_header in _ACCOUNT_HEADERS:
        org = (headers.get(org_header) or "").strip()
        sub = (headers.get(sub_header) or "").strip()
        if org or sub:
            return "/".join(x for x in (org, sub) if x)
    return None


# --- re-import identity ----------------------------------------------------------------------------------


def exchange_digest(ex: HttpExchange) -> str:
    """A digest of everything an exchange recorded about one call: method, URL, status, both bodies, the stream
    and the usage beside it. Two different calls differ in at least their request body or their response."""
    parts: list[bytes] = []
    for part in (ex.method, ex.url, ex.status, ex.request_body, ex.response_body, ex.sse, ex.usage):
        if isinstance(part, bytes):
            data = part
        elif isinstance(part, str):
            data = part.encode("utf-8", errors="surrogatepass")
        else:
            data = json.dumps(part, sort_keys=True, default=repr).encode("utf-8", errors="surrogatepass")
        parts.append(len(data).to_bytes(8, "big") + data)
    return digest(b"".join(parts), tag="http-exchange")


def position_key(source_ref: str, content_digest: str) -> str:
    """The re-import identity of a request that has no trustworthy id: where it is in its file, and what it is."""
    return f"{source_ref}|{content_digest}"


def with_trusted_ids(converted: list[tuple[ImportedRequest | SkippedLine, HttpExchange | None]]
                     ) -> list[ImportedRequest | SkippedLine]:
    """Give each request of one recorded file (a cassette, a HAR) a ``dedupe_key`` that cannot collide.

    A provider request id is the key only where it is trustworthy: every request of the file that carries it
    is the same call (same :func:`exchange_digest`). Recorders that redact the id (``REQUEST-ID-XXX``, crewAI's
    cassettes) give it to different calls; those, and requests without an id, are keyed by
    :func:`position_key` (the entry's place in the file and its digest), so none is taken for a duplicate.
    """
    digests: dict[int, str] = {}
    by_id: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for rec, _ex in converted:
        if isinstance(rec, ImportedRequest) and rec.request_id:
            counts[rec.request_id] = counts.get(rec.request_id, 0) + 1
    for i, (rec, ex) in enumerate(converted):
        if isinstance(rec, ImportedRequest) and ex is not None and (not rec.request_id or counts[rec.request_id] > 1):
            digests[i] = exchange_digest(ex)  # only where needed: most ids are unique
            if rec.request_id:
                by_id.setdefault(rec.request_id, set()).add(digests[i])
    out: list[ImportedRequest | SkippedLine] = []
    for i, (rec, _ex) in enumerate(converted):
        if isinstance(rec, ImportedRequest):
            rid = rec.request_id
            key = rid if rid and len(by_id.get(rid, ())) <= 1 else position_key(rec.source_ref, digests.get(i, ""))
            if key != rec.dedupe_key:
                rec = replace(rec, dedupe_key=key)
        out.append(rec)
    return out



