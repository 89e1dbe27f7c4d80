"""JSON Lines reading shared by the line-oriented readers: the growing-file and bad-line rules live here, once.

Rules (the issue's "Bad input"): lines are numbered from 1; a blank line is consumed silently; a line that is
not a JSON object is reported as a :class:`SkippedLine` and reading continues; a *last* line without its
trailing newline that does not parse is a record still being written, so it is neither reported nor counted
(the next import reads it whole). A last line without a newline that *does* parse is complete and counted.
The iterator ends with one :class:`ReadProgress` giving the number of lines fully consumed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._types import ReadProgress, SkippedLine

__all__ = ["JsonLine", "iter_json_lines", "json_objects_in_head", "parse_timestamp"]

#: Read buffer: a logged request body is often a megabyte on one line, which the default 8 KiB buffer reads in
#: many small pieces (about 3x the time of reading the same file in 1 MiB pieces).
READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class JsonLine:
    """One parsed JSON object and its 1-based line number."""

    line: int
    obj: dict[str, Any]


def iter_json_lines(path: Path, loads: Callable[[bytes], Any] = json.loads
                    ) -> Iterator[JsonLine | SkippedLine | ReadProgress]:
    """Yield each line of ``path`` parsed, bad lines as :class:`SkippedLine`, then a :class:`ReadProgress`.

    ``loads``: the parser of one line's bytes (``json.loads``, or a :class:`HistoryDecoder`'s, which reuses the
    history a body repeats from the line before)."""
    file = str(path)
    consumed = 0
    with open(path, "rb", buffering=READ_BUFFER) as fh:
        for number, raw in enumerate(fh, start=1):
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
            consumed = number
            if not isinstance(obj, dict):
                yield SkippedLine(file, number, f"a JSON {type(obj).__name__}, not an object")
                continue
            yield JsonLine(number, obj)
    yield ReadProgress(file, consumed)


def json_objects_in_head(head: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """The JSON objects on the complete lines of ``head`` (a file's first bytes), for ``sniff``; at most ``limit``."""
    found: list[dict[str, Any]] = []
    lines = head.split("\n")
    for text in lines[:-1]:  # the last piece may be cut mid-line
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found.append(obj)
            if len(found) >= limit:
                break
    if not found and lines[-1].strip():
        # a one-line file without a trailing newline
        try:
            obj = json.loads(lines[-1])
        except ValueError:
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
