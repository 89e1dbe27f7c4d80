"""JSON Lines reading shared by the line-oriented readers: the growing-file and bad-line rules live here, once.

Rules (the issue's "Bad input"): lines are numbered from 1; a blank line is consumed silently; a line that is
not a JSON object is reported as a :class:`SkippedLine` and reading continues; a *last* line without its
trailing newline that does not parse is a record still being written, so it is neither reported nor counted
(the next import reads it whole). A last line without a newline that *does* parse is complete and counted.
The iterator ends with one :class:`ReadProgress` giving the number of lines fully consumed.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, NamedTuple

from orjson import loads as _orjson_loads

from .._util import digest
from ._types import ReadProgress, SkippedLine

__all__ = ["COMPRESSED_SUFFIXES", "JsonLine", "UnreadableLog", "compression_of", "fast_loads", "iter_json_lines",
           "json_objects_in_head", "open_log", "parse_timestamp", "read_log_bytes"]

#: Read buffer: a logged request body is often a megabyte on one line, which the default 8 KiB buffer reads in
#: many small pieces (about 3x the time of reading the same file in 1 MiB pieces).
READ_BUFFER = 1 << 20


#: Compressed logs are read transparently, by name (``x.jsonl.gz``): rotated and archived agent logs are often
#: compressed, and a walk that passed over them silently lost whole sessions.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


class UnreadableLog(OSError):
    """A log that cannot be opened as named: a compression this machine cannot read, or a corrupt archive."""


def compression_of(path: Path) -> str | None:
    """``gz``, ``bz2``, ``xz`` or ``zst`` from the file name's last suffix; None for a plain file."""
    suffix = path.suffix.lower()
    return suffix[1:] if suffix in COMPRESSED_SUFFIXES else None


def open_log(path: Path) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed on the fly when its name says it is compressed.

    Raises:
        UnreadableLog: a ``.zst`` file without the ``zstandard`` package (``pip install zstandard``).
    """
    kind = compression_of(path)
    if kind is None:
        return open(path, "rb", buffering=READ_BUFFER)  # noqa: SIM115 - the caller closes it
    if kind == "gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile is a binary IO
    if kind == "bz2":
        return bz2.open(path, "rb")
    if kind == "xz":
        return lzma.open(path, "rb")
    try:
        import zstandard  # optional (the zstd extra): only .zst logs need it
    except ImportError:
        raise UnreadableLog(f"{path}: a zstd-compressed log needs the zstandard package (pip install zstandard)"
                            ) from None
    raw = open(path, "rb")  # noqa: SIM115 - closed with the reader (closefd)
    stream = zstandard.ZstdDecompressor().stream_reader(raw, read_size=READ_BUFFER, closefd=True)
    return io.BufferedReader(stream, READ_BUFFER)  # lines, as for the other kinds


def read_log_bytes(path: Path, limit: int | None = None) -> bytes:
    """The (decompressed) bytes of ``path``, or its first ``limit`` bytes. A corrupt archive raises
    :class:`UnreadableLog` naming the file."""
    try:
        with open_log(path) as fh:
            if limit is None:
                return fh.read()
            return _read_upto(fh, limit)
    except (EOFError, lzma.LZMAError, gzip.BadGzipFile, zlib_error()) as exc:
        raise UnreadableLog(f"{path}: corrupt {compression_of(path)} archive ({exc})") from None


def _read_upto(fh: IO[bytes], limit: int) -> bytes:
    # a decompressing stream may return fewer bytes than asked before its end
    parts, got = [], 0
    while got < limit:
        chunk = fh.read(limit - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def zlib_error() -> type[Exception]:
    return zlib.error


class JsonLine(NamedTuple):
    """One parsed JSON object and its 1-based line number (a named tuple: one is made per line read)."""

    line: int
    obj: dict[str, Any]
    offset: int = 0  #: where the line starts in the (decompressed) file
    raw: bytes = b""  #: the line's bytes, newline included

    def span(self) -> tuple[int, int, str]:
        """(offset, length, digest) of the line: where an imported request's bytes live (``turns.source_*``)."""
        return self.offset, len(self.raw), digest(self.raw, tag="line")


def fast_loads(raw: bytes) -> Any:
    """``json.loads(raw)``'s value, parsed by orjson (about 2.5x faster) whenever orjson accepts the text; what
    orjson refuses (a lone surrogate escape, NaN, an integer past 64 bits, nesting past its limit, bad JSON) is
    ``json.loads``' to decide, so the values and the errors are the standard library's."""
    try:
        return _orjson_loads(raw)
    except ValueError:  # orjson.JSONDecodeError is a ValueError
        return json.loads(raw)


def iter_json_lines(path: Path, loads: Callable[[bytes], Any] = fast_loads
                    ) -> Iterator[JsonLine | SkippedLine | ReadProgress]:
    """Yield each line of ``path`` parsed, bad lines as :class:`SkippedLine`, then a :class:`ReadProgress`.

    ``loads``: the parser of one line's bytes (:func:`fast_loads`, or a :class:`HistoryDecoder`'s, which reuses
    the history a body repeats from the line before). Each :class:`JsonLine` says where its bytes are (offset and
    length in the decompressed file) and keeps them (``raw``) for a reader that digests the lines it uses."""
    file = str(path)
    consumed = 0
    offset = 0
    with open_log(path) as fh:
        # a plain file's lines come straight from it (a generator around each line costs a tenth of the parse
        # floor); a compressed stream's through _lines, which names a corrupt archive
        lines = fh if compression_of(path) is None else _lines(fh, path)
        for number, raw in enumerate(lines, start=1):
            start = offset
            offset += len(raw)
            complete = raw.endswith(b"\n")
            if raw.isspace():  # no copies of the line: json.loads takes bytes and skips the newline
                if complete:
                    consumed = number
                continue
            try:
                obj = loads(raw)
            except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
                if not complete:
                    break  # the writer is mid-line: leave it for the next import
                consumed = number
                yield SkippedLine(file, number, f"not valid JSON ({_short(exc)})")
                continue
            except RecursionError:  # the C parser gives up near 1,000 levels: one line, not the import
                consumed = number
                yield SkippedLine(file, number, "JSON nested too deep to read (about 1,000 levels or more)")
                continue
            consumed = number
            if not isinstance(obj, dict):
                yield SkippedLine(file, number, f"a JSON {type(obj).__name__}, not an object")
                continue
            yield JsonLine(number, obj, start, raw)
    yield ReadProgress(file, consumed)


def _lines(fh: IO[bytes], path: Path) -> Iterator[bytes]:
    """The lines of ``fh``; a corrupt compressed stream ends them with :class:`UnreadableLog`."""
    try:
        yield from fh
    except UnreadableLog:
        raise
    except (EOFError, lzma.LZMAError, gzip.BadGzipFile, zlib_error(), OSError) as exc:
        raise UnreadableLog(f"{path}: cannot read on ({exc})") from None


#: Inside :func:`head_objects_memo`: each head's JSON objects (up to :data:`_MEMO_LIMIT`), parsed once however
#: many readers sniff it (detection asks every reader; most parse the head's lines).
_head_memo: dict[str, list[dict[str, Any]]] | None = None
_MEMO_LIMIT = 20


@contextmanager
def head_objects_memo() -> Iterator[None]:
    """Within the block, :func:`json_objects_in_head` parses a given head once (the heads are dropped after)."""
    global _head_memo
    outer, _head_memo = _head_memo, {}
    try:
        yield
    finally:
        _head_memo = outer


def json_objects_in_head(head: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """The JSON objects on the complete lines of ``head`` (a file's first bytes), for ``sniff``; at most ``limit``."""
    memo = _head_memo
    if memo is None or limit > _MEMO_LIMIT:
        return _objects_in_head(head, limit)
    found = memo.get(head)
    if found is None:
        found = memo[head] = _objects_in_head(head, _MEMO_LIMIT)
    return found[:limit]  # the first ``limit`` of the first 20: what a search for ``limit`` finds


def _objects_in_head(head: str, limit: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    lines = head.split("\n")
    for text in lines[:-1]:  # the last piece may be cut mid-line
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            found.append(obj)
            if len(found) >= limit:
                break
    if not found and lines[-1].strip():
        # a one-line file without a trailing newline
        try:
            obj = json.loads(lines[-1])
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            found.append(obj)
    return found


def parse_timestamp(value: Any) -> datetime:
    """An ISO 8601 timestamp with an offset or ``Z`` → aware UTC datetime. Raises ValueError otherwise."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"timestamp missing or not a string: {value!r}")
    dt = datetime.fromisoformat(value)
    if dt.tzinfo is None:
        raise ValueError(f"timestamp {value!r} has no timezone")
    return dt.astimezone(UTC)


def _short(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg}: column {exc.colno}"
    return str(exc).split("\n", 1)[0][:120]
