"""Reader for the recording proxy's own log: the ``exchanges`` JSON Lines format (version 1).

The format
==========
One UTF-8 JSON object per line, terminated by ``\\n``, one line per *completed* HTTP call (the proxy writes the
whole line with a single ``write`` after the response body, or its last SSE event, has been relayed). A last
line without its trailing newline that is not a complete JSON object is a call still being written: readers
leave it for the next import (a complete one, e.g. in a hand-edited file, is read). A malformed line elsewhere
is skipped and reported with its line number. Keys are written in this order; readers ignore keys they do not
know, and a line whose ``v`` is newer than the reader's is skipped naming the version.

``EXCHANGES_FORMAT_VERSION = 1``. Fields:

``v`` (int, required)
    The format version, ``1``.
``at`` (str, required)
    When the proxy received the request: ISO 8601 in UTC with an explicit offset or ``Z``
    (``"2026-03-02T09:14:07.512Z"``).
``method`` (str, default ``"POST"``)
    The HTTP method.
``url`` (str, required)
    The full upstream URL the call was forwarded to (no query-string secrets: the proxy drops ``key=``).
``path`` (str, required)
    The request path as the client sent it, e.g. ``"/v1/messages"``; readers choose the dialect from it
    (``/v1/messages`` → Anthropic, ``/v1/chat/completions`` → OpenAI Chat, ``/v1/responses`` → OpenAI
    Responses; anything else is skipped as ``endpoint not analysed: <path>``).
``status`` (int or null, required)
    The upstream's HTTP status; ``null`` when no response came back (then ``error`` says why).
``request`` (object or null, required)
    The request body, parsed JSON, exactly as the client sent it; ``null`` when the body was not JSON.
``response`` (object or null, required)
    The response body, parsed JSON, for a non-streamed response (including error bodies); ``null`` when
    the response was streamed or not JSON.
``sse`` (list, only for streamed responses)
    The Server-Sent Events of a streamed response, in order, as either raw text chunks (a list of ``str``
    whose concatenation is the stream as received) or parsed events (a list of
    ``{"event": str | null, "data": <parsed JSON, or str when not JSON>}``). One line uses one form.
``usage`` (object or null, required)
    The provider's *native* usage object as extracted from ``response`` or ``sse`` by
    :func:`promptcache_nb.readers._sse.usage_from_sse` (Anthropic: ``message_start`` usage with
    ``output_tokens`` replaced by the final ``message_delta`` figure; OpenAI: the ``usage`` object unchanged);
    ``null`` when the response reported none. Readers derive usage from ``response``/``sse`` when present and
    fall back to this field, so a proxy that keeps no response bodies still yields usage.
``request_id`` (str or null, required)
    The provider's request id (``request-id`` or ``x-request-id`` response header), else the response's
    ``id``; ``null`` when neither exists.
``latency_ms`` (number or null, required)
    Milliseconds from receiving the request to relaying the last response byte.
``provider`` (str, optional)
    ``"anthropic"`` or ``"openai"`` when the proxy knows it; readers otherwise infer it from ``path``.
``simulated`` (bool, optional)
    ``true`` when the upstream was promptcache_nb's own simulator endpoint (its ``x-promptcache-simulator``
    response header): the usage is then imported as ``simulated`` (estimated tokens), never as measured.
``error`` (str, optional)
    One line saying why no response came back (connection refused, timeout, client went away).

Reading
=======
A line that is not an exchange object (a Claude Code or Codex entry pasted into the log, any other JSON) is
listed in ``skipped`` with its line and why, never dropped silently; the exchanges around it are read.

Re-import identity (``dedupe_key``): the proxy writes a line when a call *completes*, stamped with when it
*started*, so lines are not in time order and a growing log is re-imported while calls overlap. Each line's
key therefore depends only on the line itself: its ``request_id`` the first time the file names that id (the
provider's ids are unique, and a line once written never changes, so the key stays the same however the file
grows), else — no id, or an id an earlier line already carried (a redacted or constant id) — a digest of the
line's bytes.

Credentials (``x-api-key``, ``authorization``, ``api-key``, cookies) are never written: the format has no
request-header field at all.

Example (one line, wrapped here)::

    {"v": 1, "at": "2026-03-02T09:14:07.512Z", "method": "POST",
     "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200,
     "request": {"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": [...], "messages": [...]},
     "response": {"id": "msg_01...", "type": "message", "content": [...], "usage": {...}},
     "usage": {"input_tokens": 12, "cache_read_input_tokens": 4310, ...}, "request_id": "req_011C...",
     "latency_ms": 1834.2}
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._util import SIMULATOR_HEADER, digest
from ._history import HistoryDecoder
from ._http import HttpExchange, convert_exchange, parse_iso_utc
from ._jsonl import JsonLine, iter_json_lines, json_objects_in_head
from ._sse import parse_sse
from ._types import ImportedRequest, Record, SkippedLine

__all__ = ["EXCHANGES_FORMAT_VERSION", "ExchangesReader"]

EXCHANGES_FORMAT_VERSION = 1
"""The version this module reads and the proxy writes (the ``v`` field)."""

_FIRST_KEYS = re.compile(r'^\s*\{\s*"v"\s*:\s*\d+\s*,\s*"at"\s*:')


def _looks_like_exchange(obj: Any) -> bool:
    return isinstance(obj, dict) and "request" in obj and ("path" in obj or "url" in obj) and "status" in obj


class ExchangesReader:
    """Reads the recording proxy's JSON Lines log (format above) — streamed and non-streamed calls alike."""

    name = "exchanges"

    def sniff(self, path: Path, head: str) -> bool:
        """Most JSON objects on the head's complete lines are exchanges (a stray line of another format, such as
        a Claude Code entry pasted in, does not flip it); or, when the first line is longer than the head (a big
        system prompt), that line starts like one: the proxy writes ``v`` and ``at`` first."""
        objs = json_objects_in_head(head)
        if objs:
            exchanges = sum(1 for obj in objs if _looks_like_exchange(obj))
            return exchanges > 0 and exchanges * 2 >= len(objs)
        first = next((line for line in head.splitlines() if line.strip()), "")
        return bool(_FIRST_KEYS.match(first)) and '"path"' in first and '"request"' in first

    def read(self, path: Path) -> Iterator[Record]:
        """Yield one record per line, then a :class:`ReadProgress` after the last complete line.

        ``dedupe_key`` (see the module docstring, "Re-import identity"): the line's ``request_id`` the first
        time the file names it, else a digest of the line's bytes.
        """
        file = str(path)
        fallback = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
        decoder = HistoryDecoder(("request",))
        raw_line = b""

        def loads(raw: bytes) -> Any:
            nonlocal raw_line
            raw_line = raw  # kept for the line's digest, computed only for lines without a trustworthy id
            return decoder.loads(raw)

        ids_seen: set[str] = set()
        # the shared growing-file and bad-line rules; a body's repeated history is the previous line's objects
        for item in iter_json_lines(path, loads):
            if not isinstance(item, JsonLine):
                yield item
                continue
            rec = self._record(item.obj, file=file, lineno=item.line, fallback=fallback)
            if isinstance(rec, ImportedRequest):
                fallback = rec.at
                rid = rec.request_id
                if rid and rid not in ids_seen:
                    ids_seen.add(rid)
                    key = rid
                else:
                    key = digest(raw_line.rstrip(b"\r\n"), tag="exchanges-line")
                if key != rec.dedupe_key:
                    rec = replace(rec, dedupe_key=key)
            yield rec

    def _record(self, obj: dict[str, Any], *, file: str, lineno: int, fallback: datetime
                ) -> ImportedRequest | SkippedLine:
        if not _looks_like_exchange(obj):
            return SkippedLine(file, lineno, _not_an_exchange(obj))
        version = obj.get("v", EXCHANGES_FORMAT_VERSION)
        if not isinstance(version, int) or version > EXCHANGES_FORMAT_VERSION:
            return SkippedLine(file, lineno, f"exchanges format version {version!r} is newer than this reader "
                                             f"({EXCHANGES_FORMAT_VERSION}); upgrade promptcache_nb")
        started: datetime | None = None
        if obj.get("at") is not None:
            try:
                started = parse_iso_utc(obj["at"])
            except ValueError as exc:
                return SkippedLine(file, lineno, f"at: {_short(exc)}")
        status = obj.get("status")
        if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
            return SkippedLine(file, lineno, f"status is {status!r}, not an HTTP status")
        sse = obj.get("sse")
        events: list[Any] | None = None
        if sse is not None:
            if not isinstance(sse, list):
                return SkippedLine(file, lineno, "sse is not a list")
            if all(isinstance(chunk, str) for chunk in sse):
                events = list(parse_sse(sse))
            elif all(isinstance(ev, dict) for ev in sse):
                events = sse
            else:
                return SkippedLine(file, lineno, "sse mixes raw text chunks and parsed events")
        request = obj.get("request")
        response = obj.get("response")
        usage = obj.get("usage")
        request_id = obj.get("request_id")
        ex = HttpExchange(
            method=str(obj.get("method") or "POST"),
            url=str(obj.get("path") or obj.get("url") or ""),
            status=status,
            request_body=request if isinstance(request, dict | str) else None,
            response_body=response if isinstance(response, dict | str) else None,
            started_at=started,
            sse=events,
            usage=usage if isinstance(usage, dict) else None,
            request_id=request_id if isinstance(request_id, str) and request_id else None,
            error=str(obj["error"]) if obj.get("error") else None,
            response_headers={SIMULATOR_HEADER: "1"} if obj.get("simulated") is True else {},
        )
        rec = convert_exchange(ex, file=file, line=lineno, source_ref=f"{file}:{lineno}", fallback_at=fallback)
        latency = obj.get("latency_ms")
        if isinstance(rec, ImportedRequest) and isinstance(latency, int | float) and not isinstance(latency, bool) \
                and math.isfinite(latency) and latency >= 0:
            rec = replace(rec, latency_ms=float(latency))
        return rec


def _not_an_exchange(obj: dict[str, Any]) -> str:
    """Why a JSON object is not read as a proxy record, naming the format it belongs to when it is recognisable."""
    if "sessionId" in obj and ("uuid" in obj or "parentUuid" in obj or obj.get("type") in ("user", "assistant")):
        return "a claude-code entry, not a proxy record (import the session file itself)"
    if "payload" in obj and "timestamp" in obj:
        return "a codex entry, not a proxy record"
    missing = [key for key in ("request", "path", "status") if key not in obj and not (key == "path" and "url" in obj)]
    return f"not a proxy record: no {', '.join(missing)}"


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200]
