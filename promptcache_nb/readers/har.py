"""Reader for HAR 1.2 files (browser devtools, mitmproxy, Charles, Proxyman exports): ``har``.

Each ``log.entries[i]`` with an Anthropic Messages or OpenAI Chat / Responses call becomes a request (see
:mod:`._http` for endpoints, streams, usage and sessions); other entries are skipped and counted. Fields used:
``startedDateTime`` (ISO 8601, the request's start), ``request.method``, ``request.url``,
``request.headers``, ``request.postData.text``, ``response.status`` (``0`` means no response),
``response.headers`` and ``response.content.text`` with ``content.encoding: "base64"`` for binary bodies.

HAR stores bodies *after* HTTP content decoding while keeping the ``Content-Encoding`` header, so that
header is ignored here; a body that is still gzip (its magic bytes) is decoded anyway.
``source_ref`` is ``<file>#entries[<i>]`` and a skipped entry's ``line`` is ``i + 1``. ``dedupe_key``: the
provider's request id where the file never gives it to two different calls, else the entry's place and a digest
of what it recorded (:func:`._http.with_trusted_ids`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import ImportFormatError
from ._history import HistoryDecoder
from ._http import HttpExchange, convert_exchange, headers_dict, parse_iso_utc, with_trusted_ids
from ._types import ImportedRequest, Record, SkippedLine

__all__ = ["HarReader"]

_LOG_OBJECT = re.compile(r'"log"\s*:\s*\{')
_HAR_LOG_KEY = re.compile(r'^\s*"(?:version|creator|browser|pages|entries|comment)"\s*:')


def _body(holder: Any, key: str) -> bytes | str | None:
    """``text`` of a postData/content object, base64-decoded when ``encoding`` says so."""
    if not isinstance(holder, Mapping):
        return None
    text = holder.get(key)
    if not isinstance(text, str):
        return None
    if str(holder.get("encoding", "")).lower() == "base64":
        try:
            return base64.b64decode(text, validate=False)
        except (binascii.Error, ValueError):
            return None
    return text


class HarReader:
    """Reads HAR 1.2 JSON documents."""

    name = "har"

    def sniff(self, path: Path, head: str) -> bool:
        """A JSON object whose ``log`` object has ``entries`` or HAR's ``creator``/``version``, ahead of any
        body: exporters write ``log`` first, and its ``version`` and ``creator`` before the entries, so a huge
        first body (past the head) does not hide them."""
        text = head.lstrip()
        if not text.startswith("{"):
            return False
        opening = _LOG_OBJECT.search(text[:4096])
        if opening is None:
            return False
        after = text[opening.end():opening.end() + 4096]
        return _HAR_LOG_KEY.search(after) is not None

    def read(self, path: Path) -> Iterator[Record]:
        """Yield one record per entry, in file order.

        Raises:
            ImportFormatError: the file is not valid JSON or has no ``log.entries`` list.
        """
        file = str(path)
        try:
            with open(path, "rb") as fh:
                doc = json.load(fh)
        except (ValueError, RecursionError) as exc:
            raise ImportFormatError(file, f"not valid HAR JSON ({str(exc).splitlines()[0]})") from None
        entries = doc.get("log", {}).get("entries") if isinstance(doc, dict) and isinstance(doc.get("log"), dict) \
            else None
        if not isinstance(entries, list):
            raise ImportFormatError(file, "not a HAR file: no log.entries list")
        fallback = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
        bodies = HistoryDecoder()
        converted: list[tuple[ImportedRequest | SkippedLine, HttpExchange | None]] = []
        for i, entry in enumerate(entries):
            rec, ex = self._entry(entry, file=file, i=i, fallback=fallback, bodies=bodies)
            if isinstance(rec, ImportedRequest):
                fallback = rec.at  # entries without a time keep the order of those with one
            converted.append((rec, ex))
        yield from with_trusted_ids(converted)

    def _entry(self, entry: Any, *, file: str, i: int, fallback: datetime, bodies: HistoryDecoder
               ) -> tuple[ImportedRequest | SkippedLine, HttpExchange | None]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("request"), Mapping):
            return SkippedLine(file, i + 1, "entry has no request object"), None
        request = entry["request"]
        response: Mapping[str, Any] = entry["response"] if isinstance(entry.get("response"), Mapping) else {}
        started = None
        if entry.get("startedDateTime"):
            try:
                started = parse_iso_utc(entry["startedDateTime"])
            except ValueError:
                return SkippedLine(file, i + 1, f"startedDateTime {entry['startedDateTime']!r} is not ISO 8601"), None
        status = response.get("status")
        if isinstance(status, bool) or not isinstance(status, int) or status <= 0:
            status = None  # HAR writes 0 (or omits the response) for blocked and failed requests
        resp_headers = {k: v for k, v in headers_dict(response.get("headers")).items() if k != "content-encoding"}
        req_headers = {k: v for k, v in headers_dict(request.get("headers")).items() if k != "content-encoding"}
        content: Mapping[str, Any] = response["content"] if isinstance(response.get("content"), Mapping) else {}
        if content.get("mimeType") and "content-type" not in resp_headers:
            resp_headers["content-type"] = str(content["mimeType"])
        ex = HttpExchange(
            method=str(request.get("method") or "GET"),
            url=str(request.get("url") or ""),
            status=status,
            request_body=_body(request.get("postData"), "text"),
            response_body=_body(content, "text"),
            request_headers=req_headers,
            response_headers=resp_headers,
            started_at=started,
        )
        return convert_exchange(ex, file=file, line=i + 1, source_ref=f"{file}#entries[{i}]", fallback_at=fallback,
                                bodies=bodies), ex
