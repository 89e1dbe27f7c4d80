"""promptcache_nb's ingest beside its peers', on the same 1,000-request Anthropic log (issue 14, item 3).

Generates one ``exchanges`` log with ``bench_import``'s generator (one conversation: a ~20k-token system + tools
prefix, history growing past 150k estimated tokens, measured usage on every line) and times, in this process,
the median of ``--runs`` runs of each:

- **floor**: ``json.loads`` of every line — what any importer pays;
- **promptcache_nb**: ``lab.import_log(log)`` into a fresh DuckDB file;
- **promptcachelint** (when importable): every line parsed and passed to its documented explicit-recording API,
  ``Recorder().record("anthropic", body, response=..., at=...)``, then ``analyze(recorder.records)``;
- **ctxdiff** (when importable): every line parsed and stored into a fresh ``.ctrace`` through the path its client
  wrapper takes for each call (``CTrace.create`` + ``capture.recorder.Recorder`` with its ``AnthropicAdapter``),
  checked afterwards to hold all 1,000 calls (its recorder swallows errors by design).

Then prints each time as a multiple of the floor, and promptcache_nb's time against each peer's. Installs nothing.
A peer that is not importable is skipped with a line saying how to get it: install the peers into a side venv (this
project's environment stays as it is) and put its site-packages on the path of this project's interpreter::

    python3 -m venv /tmp/pcnb-peers && /tmp/pcnb-peers/bin/pip install promptcachelint==0.1.0 ctxdiff==0.5.1
    PYTHONPATH=/tmp/pcnb-peers/lib/python3.11/site-packages .venv/bin/python benchmarks/bench_peers.py

(``python3.11``: the side venv's Python version.) Both names exist on PyPI (checked with ``pip index versions``:
promptcachelint 0.1.0, ctxdiff 0.5.1, each imported under its own name). Their recording APIs are not promised
stable between releases: when a call fails, the script reports that peer as "not measured" with the error instead
of guessing another API.

    .venv/bin/python benchmarks/bench_peers.py [--requests 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_import  # noqa: E402 - the log generator, shared with the import benchmark

import promptcache_nb as pc  # noqa: E402

INSTALL = ("python3 -m venv /tmp/pcnb-peers && /tmp/pcnb-peers/bin/pip install {name}=={version}, then run this "
           "script with PYTHONPATH=/tmp/pcnb-peers/lib/python3.X/site-packages")
PEERS = {"promptcachelint": "0.1.0", "ctxdiff": "0.5.1"}


def lines(log: Path) -> list[str]:
    with log.open(encoding="utf-8") as fh:
        return fh.readlines()


def floor(log: Path, work: Path) -> int:
    for line in lines(log):
        json.loads(line)
    return 0


def ours(log: Path, work: Path) -> int:
    db = work / "pcnb.duckdb"
    for p in work.glob("pcnb.duckdb*"):
        p.unlink()
    with pc.Lab(db, progress=False) as lab:
        return lab.import_log(log).requests


def promptcachelint(log: Path, work: Path) -> int:
    import promptcachelint as pcl

    recorder = pcl.Recorder(keep=None)
    for line in lines(log):
        exchange = json.loads(line)
        at = datetime.fromisoformat(exchange["at"]).timestamp()
        recorder.record("anthropic", exchange["request"], response={"usage": exchange["usage"]}, at=at)
    report = pcl.analyze(recorder.records)
    return report.totals.requests


def ctxdiff(log: Path, work: Path) -> int:
    from ctxdiff.capture.anthropic import AnthropicAdapter
    from ctxdiff.capture.recorder import Recorder
    from ctxdiff.store.ctrace import CTrace

    path = work / "peer.ctrace"
    for p in work.glob("peer.ctrace*"):
        p.unlink()
    trace = CTrace.create(str(path), "bench", "anthropic", "claude-sonnet-4-5")
    recorder = Recorder(trace, AnthropicAdapter(), None)
    for seq, line in enumerate(lines(log)):
        exchange = json.loads(line)
        response = SimpleNamespace(usage=SimpleNamespace(**exchange["usage"]))
        recorder.record(seq, exchange["request"], response, exchange["latency_ms"], None, [])
    trace._conn.close()
    with sqlite3.connect(path) as con:  # its recorder never raises: count what it stored
        return con.execute("SELECT count(*) FROM call").fetchone()[0]


def timed(fn: Callable[[Path, Path], int], log: Path, work: Path, runs: int, want: int | None) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        got = fn(log, work)
        times.append(time.perf_counter() - t)
        if want is not None and got != want:
            raise RuntimeError(f"handled {got} of {want} requests")
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pcnb-peers-"))
    try:
        log = work / "proxy.jsonl"
        bench_import.generate(log, args.requests)
        n = args.requests
        print(f"log: {n:,} Anthropic requests, {log.stat().st_size / 1e6:.1f} MB; median of {args.runs} runs each")
        base = timed(floor, log, work, args.runs, None)
        print(f"json.loads floor : {base:6.2f} s")
        mine = timed(ours, log, work, args.runs, n)
        print(f"promptcache_nb   : {mine:6.2f} s = {mine / base:5.1f}x the floor (target <= 3x)")
        for name, version in PEERS.items():
            if importlib.util.find_spec(name) is None:
                print(f"{name:<17}: not importable here; for the ratio, from a side venv: "
                      f"{INSTALL.format(name=name, version=version)}")
                continue
            try:
                theirs = timed(globals()[name], log, work, args.runs, n)
            except Exception as exc:  # noqa: BLE001 - a peer's API that moved is reported, not guessed at
                print(f"{name:<17}: not measured: its API differs from what this script calls "
                      f"({type(exc).__name__}: {str(exc)[:160]})")
                continue
            print(f"{name:<17}: {theirs:6.2f} s = {theirs / base:5.1f}x the floor; promptcache_nb is "
                  f"{theirs / mine:.1f}x {'faster' if theirs >= mine else 'slower'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
