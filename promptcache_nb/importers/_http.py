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

- Anthropic: :meth:`Usage.from_anthropic` after checking the shape (``input_tokens``/``output_tokens``
  integers, cache figures integers when present).
- OpenAI: :meth:`Usage.from_openai` (cached and written tokens are *included* in ``prompt_tokens`` /
  ``input_tokens``: ``uncached = prompt - cached - written``, write 0 unless reported; no cached figure at all
  means the split is unknown, not 0).
- A usage object whose shape is not understood is skipped as ``unknown usage shape: <field>: <problem>``.

Request id: the ``request-id`` / ``x-request-id`` response header, else the id the container recorded,
else the response's ``id``. ``dedupe_key`` is that id, else the ``source_ref``.

Sessions (``session_key``): one session per file and provider — ``"<file>|anthropic"`` /
``"<file>|openai"`` — split further when the request names its end user or conversation: Anthropic
``metadata.user_id``, OpenAI ``prompt_cache_key`` (else ``user``, else ``safety_identifier``), appended as
``"|<value>"``. HTTP recordings carry no conversation id, and a cassette or HAR file is usually one test or
one browsing session, so the file is the natural unit; the request's own cache-routing key is the only
finer signal that the provider itself honours.

Timestamps (``at``): the container's own start time, else the response ``Date`` header, else the response
body's ``created`` / ``created_at``, else the caller's fallback (the file's modification time); always UTC.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from .._util import SIMULATOR_HEADER
from ..usage import Usage
from ._history import HistoryDecoder
from ._sse import SseEvent, parse_sse, usage_from_sse
from ._types import Dialect, ImportedRequest, SkippedLine

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


def _limited(decompressor: Any, data: bytes, what: str) -> bytes:
    out = decompressor.decompress(data, MAX_DECODED_BYTES + 1)
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
    except ValueError:
        raise _Skip(f"{what} body is not JSON") from None
    if not isinstance(value, dict):
        raise _Skip(f"{what} body is not a JSON object")
    return value


# --- usage conversion -------------------------------------------------------------------------------------


def anthropic_usage(raw: Any) -> Usage:
    """Convert an Anthropic ``usage`` object with :meth:`Usage.from_anthropic` (``source="imported"``); a log's
    usage must carry both ``input_tokens`` and ``output_tokens``. Refusals become skip reasons naming the field."""
    for name in ("input_tokens", "output_tokens"):
        if isinstance(raw, dict) and raw.get(name) is None:
            raise _Skip(f"unknown usage shape: usage.{name}: missing")
    try:
        return Usage.from_anthropic(raw, source="imported")
    except ValueError as exc:
        raise _Skip(f"unknown usage shape: {exc}") from None


def openai_usage(raw: Any, dialect: Dialect) -> Usage:
    """Convert an OpenAI Chat / Responses ``usage`` object with :meth:`Usage.from_openai` (``source="imported"``).

    Its refusals (a shape it does not understand, naming the field) become skip reasons.
    """
    try:
        return Usage.from_openai(raw, api="chat" if dialect == "openai-chat" else "responses", source="imported")
    except ValueError as exc:
        raise _Skip(f"unknown usage shape: {exc}") from None


def convert_usage(raw: Any, dialect: Dialect) -> Usage:
    """Native usage of ``dialect`` → :class:`Usage`; raises ``_Skip`` naming the field it does not understand."""
    if dialect == "anthropic":
        return anthropic_usage(raw)
    return openai_usage(raw, dialect)


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
    dialect = endpoint_dialect(ex.method, ex.url)
    path = urlsplit(ex.url).path or ex.url
    if dialect is None:
        raise _Skip(f"endpoint not analysed: {path}")
    if ex.status is None:
        raise _Skip(f"no response: {ex.error}" if ex.error else "no response")
    if not 200 <= ex.status < 300:
        raise _Skip(f"HTTP {ex.status}")
    provider = "anthropic" if dialect == "anthropic" else "openai"
    req_headers = headers_dict(ex.request_headers)
    resp_headers = headers_dict(ex.response_headers)

    raw_request = ex.request_body
    if not isinstance(raw_request, dict):
        raw_request = decode_body(raw_request, req_headers.get("content-encoding"), what="request")
    body = _json_body(raw_request, "request", bodies)

    raw_response = ex.response_body
    text: str | None = None
    if raw_response is not None and not isinstance(raw_response, dict):
        decoded = decode_body(raw_response, resp_headers.get("content-encoding"))
        text = _text(decoded) if decoded is not None else None

    response: dict[str, Any] | None = None
    cut_short = False
    reply: list[dict[str, Any]] | None = None
    native: Any = None
    response_id: str | None = None
    response_model: str | None = None
    if _is_stream(ex, resp_headers, body, text):
        events = ex.sse if ex.sse is not None else parse_sse(text or "")
        summary = usage_from_sse(events, dialect)
        if summary.error:
            raise _Skip(f"stream ended with an error: {summary.error}")
        native = summary.usage if summary.usage is not None else ex.usage
        if native is None:
            raise _Skip("streamed without usage")
        reply, response_id, response_model = summary.content or None, summary.response_id, summary.model
        if dialect == "anthropic" and summary.usage is not None and not summary.complete:
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
            reply = _reply(response, dialect)
        if native is None:
            native = ex.usage
        if native is None:
            raise _Skip("response has no usage")
    usage = convert_usage(native, dialect)
    if any(k.lower() == SIMULATOR_HEADER for k in resp_headers):
        usage = replace(usage, source="simulated")  # our simulator answered: estimated tokens, not measured
    if cut_short:
        usage = replace(usage, output_tokens=None)  # unknown, not the placeholder

    model = body.get("model") or response_model
    if not isinstance(model, str) or not model:
        raise _Skip("request has no model")
    request_id = (
        resp_headers.get("request-id") or resp_headers.get("x-request-id") or ex.request_id or response_id
    )
    return ImportedRequest(
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
    )


def _reply(response: Mapping[str, Any], dialect: Dialect) -> list[dict[str, Any]] | None:
    if dialect == "anthropic":
        content = response.get("content")
    elif dialect == "openai-chat":
        choices = response.get("choices") or []
        content = [c.get("message") for c in choices[:1] if isinstance(c, Mapping) and c.get("message")]
    else:
        content = response.get("output")
    return [c for c in content if isinstance(c, dict)] if isinstance(content, list) else None
