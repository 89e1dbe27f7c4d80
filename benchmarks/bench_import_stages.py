"""Where a Claude Code import's CPU goes, stage by stage, against the ``json.loads`` floor (issue 23, item 1).

Issue 23 asks an import of any format to cost <= 2x the CPU of ``json.loads`` of its lines. The proxy-log path is
there (``bench_import.py``); Claude Code transcripts are not (``bench_fleet.py``). This script says why, by
running the import's stages one after another over the same folder, each over every request, and printing the
CPU of each alone:

1. **floor**: ``json.loads`` of every line;
2. **read**: the Claude Code reader (``readers.claude_code``), its own parse of every line included: every
   request's body rebuilt from its transcript;
3. **validate**: each body checked as an import checks it (lenient, only the new tail past the previous body);
4. **segment + hash**: each body split into segments, canonical JSON and hashes (``request.prepare`` with a
   tokenizer that counts nothing, so no estimate is made);
5. **token estimates**: the same with the real estimator, minus stage 4;
6. **the whole import** (``lab.import_log`` into a fresh store): stages 2-5 plus the simulated cache, the diff and
   observation, prices, and the store writes; "the rest" is this minus stages 2-5.

Stages 2-4 are what any import that keeps the bodies needs; an import that stores only the measured usage (as
claude-cache-audit does) needs stages 1-2. Stages 2-5 reuse each previous request as the import does, so each
stage's figure is its cost inside the import, give or take the memo hits the import's own order makes.
Prints figures; asserts nothing. A folder of ``*.jsonl`` transcripts; ``_claude_code_history.py`` writes one.

    .venv/bin/python benchmarks/bench_import_stages.py DIR [--runs 3]
    .venv/bin/python benchmarks/bench_import_stages.py --generate --projects 4 --sessions 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class _CountsNothing:
    """A tokenizer that estimates nothing: ``prepare`` with it segments and hashes only."""

    name = "nothing"

    def count(self, text: str) -> int:
        return 0


def _cpu(fn: Any) -> tuple[float, Any]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def floor(files: list[Path]) -> int:
    n = 0
    for f in files:
        with f.open("rb") as fh:
            for line in fh:
                json.loads(line)
                n += 1
    return n


def read(files: list[Path]) -> list[list[Any]]:
    """Each file's requests, grouped by session in file order (what the import stores one session at a time)."""
    from promptcache_nb.readers import ImportedRequest
    from promptcache_nb.readers._registry import detect

    sessions: dict[str, list[Any]] = {}
    for f in files:
        for rec in detect(f).read(f):
            if isinstance(rec, ImportedRequest):
                sessions.setdefault(rec.session_key, []).append(rec)
    return [sorted(reqs, key=lambda r: r.at) for reqs in sessions.values()]


def validate(sessions: list[list[Any]]) -> int:
    from promptcache_nb.request.validate import check_request

    n = 0
    for reqs in sessions:
        prev = None
        for req in reqs:
            check_request(req.body, req.dialect, lenient=True, partial=req.partial, previous=prev)
            prev = req.body
            n += 1
    return n


def segment(sessions: list[list[Any]], tokenizer: Any) -> int:
    from promptcache_nb.request import SegmentMemo, prepare

    segments = 0
    for reqs in sessions:
        memo, prev = SegmentMemo(tokenizer), None
        for req in reqs:
            prev = prepare(req.body, memo=memo, previous=prev, dialect=req.dialect, keep_texts=True)
            segments += len(prev.segments)
    return segments


def whole_import(folder: Path) -> int:
    import promptcache_nb as pc

    with tempfile.TemporaryDirectory() as tmp, pc.Lab(Path(tmp) / "stages.duckdb", progress=False) as lab:
        return lab.import_log(folder).requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", type=Path)
    ap.add_argument("--runs", type=int, default=3, help="runs of each stage; the median is printed")
    ap.add_argument("--generate", action="store_true", help="write a generated history into a temp folder first")
    ap.add_argument("--projects", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=3)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    tmp = None
    if args.generate or args.folder is None:
        from _claude_code_history import write_history

        tmp = tempfile.TemporaryDirectory()
        args.folder = Path(tmp.name) / "projects"
        write_history(args.folder, projects=args.projects, sessions=args.sessions)
    files = sorted(args.folder.rglob("*.jsonl"))
    import pandas  # noqa: F401  # module imports are not a stage's cost: load what the import loads first

    import promptcache_nb  # noqa: F401
    from promptcache_nb.tokens import DEFAULT_TOKENIZER

    figures: dict[str, list[float]] = {}
    for _ in range(args.runs):
        t, lines = _cpu(lambda: floor(files))
        figures.setdefault("floor", []).append(t)
        t, sessions = _cpu(lambda: read(files))
        figures.setdefault("read", []).append(t)
        requests = sum(map(len, sessions))
        figures.setdefault("validate", []).append(_cpu(partial(validate, sessions))[0])
        t, segments = _cpu(partial(segment, sessions, _CountsNothing()))
        figures.setdefault("segment + hash", []).append(t)
        t_full = _cpu(partial(segment, sessions, DEFAULT_TOKENIZER))[0]
        figures.setdefault("token estimates", []).append(t_full - t)
        del sessions
        t, stored = _cpu(lambda: whole_import(args.folder))
        figures.setdefault("whole import", []).append(t)
    med = {k: statistics.median(v) for k, v in figures.items()}
    base = med["floor"]
    size = sum(f.stat().st_size for f in files) / 1e6
    print(f"{len(files)} transcripts, {size:.1f} MB, {lines:,} lines, {requests:,} requests "
          f"({stored:,} stored), {segments:,} segments prepared; CPU, median of {args.runs} runs")
    print(f"{'stage':<40}{'CPU s':>8}{'x floor':>9}{'ms/request':>12}")

    def row(name: str, value: float) -> None:
        print(f"{name:<40}{value:8.2f}{value / base:9.1f}{1000 * value / requests:12.3f}")

    for name in ("floor", "read", "validate", "segment + hash", "token estimates"):
        row(name, med[name])
    staged = sum(med[k] for k in ("read", "validate", "segment + hash", "token estimates"))
    row("the rest (cache, diff, prices, store)", med["whole import"] - staged)
    row("whole import", med["whole import"])
    print("the least an import keeping the bodies needs (read, its parse included, + validate + segment + hash): "
          f"{(med['read'] + med['validate'] + med['segment + hash']) / base:.1f}x the floor; "
          f"an import of the usage alone (read): {med['read'] / base:.1f}x")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
