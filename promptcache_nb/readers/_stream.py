"""The one loop that passes bad lines and read progress through a line reader (issue 39).

A line reader handles the parsed lines (:class:`~._jsonl.JsonLine`) of what :func:`~._jsonl.iter_json_lines`
yields; everything else goes on unchanged. :class:`ParsedLines` splits the two: iterating it gives the reader its
lines, and :meth:`ParsedLines.around` wraps the reader's own records, passing each bad line (:class:`SkippedLine`)
on before the reader's next record (so in file order) and the :class:`ReadProgress` after the reader's last one
(so after whatever it held until the end of the file: requests kept open for more lines, a note on the whole file).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from ._jsonl import JsonLine
from ._types import ReadProgress, SkippedLine

T = TypeVar("T")


class ParsedLines:
    """The parsed lines of a read, for a reader's loop; bad lines and progress wait for :meth:`around`.

    Example:
        >>> lines = ParsedLines(iter_json_lines(path))                        # doctest: +SKIP
        >>> records = lines.around(requests_of(lines))                        # doctest: +SKIP
    """

    def __init__(self, records: Iterable[JsonLine | SkippedLine | ReadProgress]) -> None:
        self._records = records
        self._skipped: list[SkippedLine] = []  # read, not passed on yet
        self._progress: list[ReadProgress] = []

    def __iter__(self) -> Iterator[JsonLine]:
        for rec in self._records:
            if isinstance(rec, JsonLine):
                yield rec
            elif isinstance(rec, SkippedLine):
                self._skipped.append(rec)
            else:
                self._progress.append(rec)

    def around(self, records: Iterable[T]) -> Iterator[T | SkippedLine | ReadProgress]:
        """``records`` (the reader's, made while it iterates this) with the bad lines read before each one ahead
        of it, and the progress after the last."""
        for rec in records:
            yield from self._passed()
            yield rec
        yield from self._passed()
        yield from self._progress

    def _passed(self) -> Iterator[SkippedLine]:
        if self._skipped:
            skipped, self._skipped = self._skipped, []
            yield from skipped
