"""``readers._stream.ParsedLines``: the one loop that passes bad lines and read progress through a line reader.

A reader sees only parsed lines; its own records come out with each bad line ahead of the reader's next record
(file order) and the read progress after the last one, whatever the reader held until the end of the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from promptcache_nb.readers import ReadProgress, SkippedLine
from promptcache_nb.readers._jsonl import JsonLine, iter_json_lines
from promptcache_nb.readers._stream import ParsedLines


def _held_to_the_end(lines: ParsedLines) -> Iterator[str]:
    """A reader that answers every line with an "a" turn at once, holds "b" turns until the end of the file."""
    held = []
    for rec in lines:
        if rec.obj["turn"] == "a":
            yield f"a@{rec.line}"
        else:
            held.append(f"b@{rec.line}")
    yield from held


def test_bad_lines_keep_their_place_and_progress_comes_last(tmp_path: Path) -> None:
    log = tmp_path / "session.jsonl"
    log.write_text('{"turn": "a"}\nnot json\n{"turn": "b"}\n[1, 2]\n{"turn": "a"}\n{"turn": "a", "cut', encoding="utf-8")
    lines = ParsedLines(iter_json_lines(log))
    out = list(lines.around(_held_to_the_end(lines)))
    shown = [o if isinstance(o, str) else f"skip@{o.line}" if isinstance(o, SkippedLine) else f"progress@{o.complete_through}"
             for o in out]
    # line 6 is being written: not read, not counted; the held "b" comes before the progress
    assert shown == ["a@1", "skip@2", "skip@4", "a@5", "b@3", "progress@5"]
    assert isinstance(out[1], SkippedLine) and out[1].file == str(log) and "not valid JSON" in out[1].reason


def test_rows_read_elsewhere_without_progress_still_flush() -> None:
    """Rows from a database come with no progress marker: what the reader holds still comes out, after the
    bad rows read before it."""
    rows = [JsonLine(1, {"turn": "b"}), SkippedLine("db", 2, "not valid JSON"), JsonLine(3, {"turn": "a"})]
    lines = ParsedLines(rows)
    out = list(lines.around(_held_to_the_end(lines)))
    assert out == [SkippedLine("db", 2, "not valid JSON"), "a@3", "b@1"]
    assert not any(isinstance(o, ReadProgress) for o in out)


def test_a_reader_that_yields_nothing_passes_everything_on(tmp_path: Path) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_bytes(b"oops\n")
    lines = ParsedLines(iter_json_lines(log))

    def nothing_of_its_own(lines: ParsedLines) -> Iterator[str]:
        for _ in lines:
            yield "never"  # no line parses: this never runs

    out = list(lines.around(nothing_of_its_own(lines)))
    assert [type(o).__name__ for o in out] == ["SkippedLine", "ReadProgress"]
    assert out[1] == ReadProgress(str(log), 1)
