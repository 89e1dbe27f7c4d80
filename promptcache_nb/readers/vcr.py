"""Reader for vcrpy / pytest-recording cassettes (YAML, or vcrpy's JSON serializer): ``vcr``.

A cassette is ``{interactions: [{request: {method, uri, body, headers}, response: {status: {code, message},
headers, body: {string}}}], version: 1}``. Bodies are ``str``, ``bytes`` (YAML ``!!binary``) or gzip bytes
with a ``Content-Encoding: [gzip]`` header (recorded without ``decode_compressed_response``); headers map a
name to a list of values. Some projects add ``parsed_body`` (the parsed JSON) beside ``body``: it is used when
the raw body is missing. Ruby-VCR-style cassettes (``http_interactions``, ``recorded_at``, ``body: {encoding,
string | base64_string}``) are read too. Each interaction is converted by :mod:`._http` (endpoints, streams,
usage, sessions).

Cassettes carry no timestamps (vcrpy records none): a request's time is ``recorded_at``, else the response's
``Date`` header, else the response's own ``created`` time, else the previous request's, else the file's
modification time. ``source_ref`` is ``<file>#interactions[<i>]`` and a skipped interaction's ``line`` is
``i + 1``. ``dedupe_key`` is the provider's request id where the cassette never gives it to two different calls,
else the interaction's place and a digest of what it recorded (:func:`._http.with_trusted_ids`): recorders
that redact ids (``REQUEST-ID-XXX``) must not make two calls one.

Detection (:meth:`VcrReader.sniff`) needs no ``uri`` in the head: vcrpy sorts a request's keys, so a large first
body pushes ``uri:`` past any fixed head, while the ``- request:`` item that opens the list is on line 2.

The YAML is read with a *safe* loader and a document over :data:`MAX_CASSETTE_BYTES`, or whose aliases would
expand it (a "billion laughs" bomb) or refer to themselves, is refused with one line.
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

import yaml

from ..errors import ImportFormatError
from ._history import HistoryDecoder
from ._http import HttpExchange, convert_exchange, headers_dict, parse_http_date, with_trusted_ids
from ._jsonl import UnreadableLog, compression_of, read_log_bytes
from ._types import ImportedRequest, Record, SkippedLine

__all__ = ["MAX_CASSETTE_BYTES", "VcrReader"]

MAX_CASSETTE_BYTES = 256 * 1024 * 1024
MAX_ALIASES = 10_000
"""More alias references than this is not a recorded cassette."""

_YAML_SNIFF = re.compile(r"^(?:http_)?interactions:", re.M)
_JSON_SNIFF = re.compile(r'"(?:http_)?interactions"\s*:\s*\[')
# the list's first item opens with its request (vcrpy: "- request:", Ruby VCR: "- request:" too)
_YAML_FIRST_ITEM = re.compile(r"^(?:http_)?interactions:[ \t]*\n(?:[ \t]*#.*\n)*[ \t]*-[ \t]+request:[ \t]*\n", re.M)
_JSON_FIRST_ITEM = re.compile(r'"(?:http_)?interactions"\s*:\s*\[\s*\{\s*"(?:request|response)"\s*:\s*\{')

_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CassetteLoader(_Base):  # type: ignore[misc]
    """The safe loader, plus the Python 2 era ``!!python/unicode`` / ``!!python/str`` string tags."""


def _construct_str(loader: Any, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))


_CassetteLoader.add_constructor("tag:yaml.org,2002:python/unicode", _construct_str)
_CassetteLoader.add_constructor("tag:yaml.org,2002:python/str", _construct_str)


def _check_expansion(root: yaml.Node, file: str) -> None:
    """Refuse a node graph whose aliases repeat content (weight = characters of scalars + nodes).

    Shared nodes are what aliases make; an honest document shares little, a bomb shares exponentially.
    """
    expanded: dict[int, int] = {}
    distinct = 0
    references = 0
    on_path: set[int] = set()

    def weigh(node: yaml.Node) -> int:
        nonlocal distinct, references
        key = id(node)
        if key in expanded:
            references += 1
            if references > MAX_ALIASES:
                raise ImportFormatError(file, f"YAML has more than {MAX_ALIASES} alias references; refused")
            return expanded[key]
        if key in on_path:
            raise ImportFormatError(file, "YAML alias refers to itself; refused")
        on_path.add(key)
        if isinstance(node, yaml.ScalarNode):
            weight = 1 + len(node.value)
            distinct += weight
        else:
            distinct += 1
            children = node.value if isinstance(node, yaml.SequenceNode) else [x for kv in node.value for x in kv]
            weight = 1 + sum(weigh(child) for child in children)
        on_path.discard(key)
        expanded[key] = weight
        return weight

    try:
        total = weigh(root)
    except RecursionError:
        raise ImportFormatError(file, "YAML nests too deeply; refused") from None
    if total > 2 * distinct + 1_000_000:
        raise ImportFormatError(file, f"YAML aliases expand {distinct:,} characters to {total:,} (an alias bomb); "
                                      "refused")


def load_cassette(path: Path) -> Any:
    """Parse a cassette file (YAML or JSON, plain or compressed: ``x.yaml.gz``, ``.bz2``, ``.xz``, ``.zst``) safely.

    Raises:
        ImportFormatError: too large, not valid YAML/JSON, or an alias bomb (one line naming the file).
    """
    file = str(path)
    size = path.stat().st_size
    compressed = compression_of(path) is not None
    if size > MAX_CASSETTE_BYTES and not compressed:
        raise ImportFormatError(file, f"cassette is {size / 2**20:.0f} MiB, over the "
                                      f"{MAX_CASSETTE_BYTES // 2**20} MiB limit; split it")
    try:  # a compressed cassette (x.yaml.gz) decompressed, never past the limit (a decompression bomb)
        data = read_log_bytes(path, MAX_CASSETTE_BYTES + 1)
    except UnreadableLog as exc:
        raise ImportFormatError(file, f"cannot read ({str(exc).removeprefix(f'{path}: ')})") from None
    if len(data) > MAX_CASSETTE_BYTES:
        raise ImportFormatError(file, f"cassette is over the {MAX_CASSETTE_BYTES // 2**20} MiB limit"
                                      f"{' decompressed' if compressed else ''}; split it")
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            pass  # YAML flow mappings look like JSON too
    loader = _CassetteLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, file)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ImportFormatError(file, f"not a valid YAML cassette ({problem}{where})") from None
    finally:
        loader.dispose()


def _body(side: Mapping[str, Any]) -> bytes | str | dict[str, Any] | None:
    """The raw body of a request or response side, else its ``parsed_body``."""
    body = side.get("body")
    if isinstance(body, Mapping):  # response side, and Ruby VCR's request side
        if isinstance(body.get("base64_string"), str):
            try:
                body = base64.b64decode(body["base64_string"])
            except (binascii.Error, ValueError):
                body = None
        else:
            body = body.get("string")
    if isinstance(body, bytearray):
        body = bytes(body)
    if body in (None, "", b"") and isinstance(parsed := side.get("parsed_body"), dict):
        return parsed
    return body if isinstance(body, bytes | str) else None


def _status(response: Mapping[str, Any]) -> int | None:
    status = response.get("status")
    if isinstance(status, Mapping):
        status = status.get("code")
    if isinstance(status, str) and status.isdigit():
        status = int(status)
    return status if isinstance(status, int) and not isinstance(status, bool) and status > 0 else None


class VcrReader:
    """Reads vcrpy / pytest-recording cassettes."""

    name = "vcr"

    def sniff(self, path: Path, head: str) -> bool:
        """A top-level ``interactions:`` key whose first item is a ``request`` (or whose requests have a
        ``uri``), YAML or JSON.

        vcrpy writes a request's keys sorted (``body`` before ``uri``), so a cassette whose first body is larger
        than the head shows no ``uri`` in it: the ``- request:`` item that opens the list identifies it, on a
        head cut anywhere after it."""
        if head.lstrip().startswith("{"):
            return bool(_JSON_SNIFF.search(head)) and ('"uri"' in head or _JSON_FIRST_ITEM.search(head) is not None)
        if re.match(r"(?:http_)?interactions:\s*\[\]\s*$", head.split("\n", 1)[0]):
            return True  # a cassette that recorded nothing
        if _YAML_SNIFF.search(head) is None:
            return False
        return _YAML_FIRST_ITEM.search(head) is not None or re.search(r"^\s+uri:", head, re.M) is not None

    def read(self, path: Path) -> Iterator[Record]:
        """Yield one record per interaction, in cassette order.

        Raises:
            ImportFormatError: the cassette cannot be parsed safely or has no ``interactions`` list.
        """
        file = str(path)
        doc = load_cassette(path)
        interactions = None
        if isinstance(doc, Mapping):
            interactions = doc.get("interactions", doc.get("http_interactions"))
        if not isinstance(interactions, list):
            raise ImportFormatError(file, "not a vcr cassette: no interactions list")
        fallback = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
        bodies = HistoryDecoder()
        converted: list[tuple[ImportedRequest | SkippedLine, HttpExchange | None]] = []
        for i, item in enumerate(interactions):
            rec, ex = self._interaction(item, file=file, i=i, fallback=fallback, bodies=bodies)
            if isinstance(rec, ImportedRequest):
                fallback = rec.at
            converted.append((rec, ex))
        yield from with_trusted_ids(converted)

    def _interaction(self, item: Any, *, file: str, i: int, fallback: datetime, bodies: HistoryDecoder
                     ) -> tuple[ImportedRequest | SkippedLine, HttpExchange | None]:
        request = item.get("request") if isinstance(item, Mapping) else None
        if not isinstance(request, Mapping):
            return SkippedLine(file, i + 1, "interaction has no request"), None
        response = item.get("response") if isinstance(item.get("response"), Mapping) else {}
        ex = HttpExchange(
            method=str(request.get("method") or "GET").upper(),
            url=str(request.get("uri") or request.get("url") or ""),
            status=_status(response),
            request_body=_body(request),
            response_body=_body(response),
            request_headers=headers_dict(request.get("headers")),
            response_headers=headers_dict(response.get("headers")),
            started_at=parse_http_date(item.get("recorded_at")),
        )
        return convert_exchange(ex, file=file, line=i + 1, source_ref=f"{file}#interactions[{i}]",
                                fallback_at=fallback, bodies=bodies), ex
