"""promptcache_nb's ingest beside its peers', on the same 1,000-request Anthropic log (issue 14, item 3), or on a
heavy user's Claude Code history (issue 37, ``--claude-code-history``).

``--claude-code-history`` measures only the second: the 200-session history of ``bench_fleet.py`` (generated
under the temporary folder, or ``--history DIR``), the json.loads floor, the usage-first import
``lab.import_log(folder)`` and claude-cache-audit (tokenol and ccusage when given) on the same files, each in a
fresh child process, then PASS / FAIL against issue 37's import targets (CPU <= 2x the floor, <= 300 MB, wall below
claude-cache-audit's). One implementation: ``bench_fleet.import_vs_peers``; ``bench_fleet.py``'s docstring says
how to give the peers (``PCNB_CCA``, ``PCNB_TOKENOL``, ``PCNB_CCUSAGE``)::

    PCNB_CCA=/tmp/cca/wheel .venv/bin/python benchmarks/bench_peers.py --claude-code-history [--projects 20]
        [--sessions 10] [--history DIR]

Without it, on the 1,000-request log:

Generates one ``exchanges`` log with ``bench_import``'s generator (one conversation: a ~20k-token system + tools
prefix, history growing past 150k estimated tokens, measured usage on every line) and times, in this process,
the median of ``--runs`` runs of each, in wall time and in CPU time (``time.process_time``: this process, its
threads included), which a shared machine's load disturbs less:

- **floor**: ``json.loads`` of every line — what any importer pays;
- **promptcache_nb**: ``lab.import_log(log)`` into a fresh DuckDB file;
- **promptcachelint** (when importable): every line parsed and passed to its documented explicit-recording API,
  ``Recorder(keep=None).record("anthropic", body, response=..., at=...)``, then ``analyze(recorder.records)``;
  checked afterwards to report all 1,000 requests, each with its usage;
- **ctxdiff** (when importable): every line parsed and sent through its documented capture API,
  ``trace.init(project, path=...)`` + ``tracer.wrap(client)``, to a fresh ``.ctrace``: the client is a stand-in
  Anthropic client whose ``messages.create`` returns the logged usage (the way ``ctxdiff.demo`` drives it), so
  each call takes the real interceptor -> ``Recorder.build`` (blocks, hashes, token estimates) -> writer thread ->
  SQLite path, and ``tracer.close()`` flushes it; checked afterwards to hold all 1,000 calls (its capture is
  fail-open by design).

Then prints each time as a multiple of the floor, and promptcache_nb's time against each peer's (target: >= 4x
faster than ctxdiff). Installs nothing.
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
import bench_fleet  # noqa: E402 - the Claude Code history comparison, shared with the fleet benchmark
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
    totals = pcl.analyze(recorder.records).totals
    return min(totals.requests, totals.with_usage)  # every request analysed, each with its usage read


class _Messages:
    """``client.messages`` of the stand-in client: ``create`` answers with the logged usage, no network."""

    def __init__(self) -> None:
        self.usage: SimpleNamespace | None = None

    def create(self, **body: object) -> SimpleNamespace:
        return SimpleNamespace(usage=self.usage)


class _AnthropicClient:
    """What ``tracer.wrap`` needs of an ``anthropic.Anthropic``: its module name (ctxdiff detects the provider
    from ``type(client).__module__``, as ``ctxdiff.demo``'s fake clients rely on) and ``messages.create``."""

    __module__ = "anthropic"

    def __init__(self) -> None:
        self.messages = _Messages()


def ctxdiff(log: Path, work: Path) -> int:
    from ctxdiff import trace

    path = work / "peer.ctrace"
    for p in work.glob("peer.ctrace*"):
        p.unlink()
    tracer = trace.init("bench", path=str(path))
    fake = _AnthropicClient()
    client = tracer.wrap(fake)
    for line in lines(log):
        exchange = json.loads(line)
        fake.messages.usage = SimpleNamespace(**exchange["usage"])
        client.messages.create(**exchange["request"])
    tracer.close()  # waits for its writer thread to store every queued call
    with sqlite3.connect(path) as con:  # its capture never raises: count what it stored
        return con.execute("SELECT count(*) FROM call").fetchone()[0]


def timed(fn: Callable[[Path, Path], int], log: Path, work: Path, runs: int,
          want: int | None) -> tuple[float, float]:
    """Median wall and median CPU seconds of ``runs`` runs."""
    walls, cpus = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        got = fn(log, work)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
        if want is not None and got != want:
            raise RuntimeError(f"handled {got} of {want} requests")
    return statistics.median(walls), statistics.median(cpus)


def figures(name: str, spent: tuple[float, float], base: tuple[float, float]) -> str:
    (wall, cpu), (base_wall, base_cpu) = spent, base
    return (f"{name:<17}: {wall:6.2f} s = {wall / base_wall:5.1f}x the floor; "
            f"{cpu:6.2f} s CPU = {cpu / base_cpu:5.1f}x the floor's CPU")


def claude_code_history(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="pcnb-peers-"))
    try:
        history, _ = bench_fleet.history_folder(args, work)
        _, targets = bench_fleet.import_vs_peers(history, work)
        bench_fleet.print_summary(targets)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--claude-code-history", action="store_true",
                    help="issue 37: a heavy user's Claude Code history vs claude-cache-audit, instead of the log")
    bench_fleet.add_history_arguments(ap)
    args = ap.parse_args()
    if args.claude_code_history:
        claude_code_history(args)
        return
    work = Path(tempfile.mkdtemp(prefix="pcnb-peers-"))
    try:
        log = work / "proxy.jsonl"
        bench_import.generate(log, args.requests)
        n = args.requests
        print(f"log: {n:,} Anthropic requests, {log.stat().st_size / 1e6:.1f} MB; median of {args.runs} runs each")
        base = timed(floor, log, work, args.runs, None)
        print(f"json.loads floor : {base[0]:6.2f} s; {base[1]:6.2f} s CPU")
        mine = timed(ours, log, work, args.runs, n)
        print(f"{figures('promptcache_nb', mine, base)} (target <= 3x)")
        for name, version in PEERS.items():
            if importlib.util.find_spec(name) is None:
                print(f"{name:<17}: not importable here; for the ratio, from a side venv: "
                      f"{INSTALL.format(name=name, version=version)}")
                continue
            try:
                theirs = timed(globals()[name], log, work, args.runs, n)
            except Exception as exc:  # noqa: BLE001 - a peer's API that moved (or a short count) is reported
                print(f"{name:<17}: not measured ({type(exc).__name__}: {str(exc)[:160]})")
                continue
            target = " (target >= 4x)" if name == "ctxdiff" else ""
            print(f"{figures(name, theirs, base)}; promptcache_nb is {theirs[0] / mine[0]:.1f}x faster in wall "
                  f"time, {theirs[1] / mine[1]:.1f}x in CPU time{target} (below 1x: slower)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
