"""Analyses over many sessions at once vs one session at a time (issue #23 item 2).

Before: a loop over the sessions, calling ``pc.rebuilds(lab, session_id=...)`` and summarising each session's
``turns()`` frame (``pc.analysis.summarize``: what ``ImportResult.summary`` and the CLI did). After: one call for
the whole Lab — ``pc.rebuilds(lab)``, ``lab.summary()`` and ``lab.summary(by="project" | "model" | "day")`` —
computed in SQL over the stored ``turns`` table (``store/_rollups.py``). Both sides must give the same rebuilds
(checked). Each figure is the best of ``--runs`` runs (wall seconds; a shared machine's load only adds time);
the load average is printed beside them.

Targets: <= 3 s for the whole Lab at 29,100 requests; one session <= 20 ms per 1,000 requests.

Input: a store already holding the imported history (``--db``), or a folder of Claude Code logs to import
first (``--logs``); by default a small history is generated with ``_claude_code_history.py`` (``--projects 4
--sessions 5``: 20 sessions, ~2,900 requests) and imported. The issue's heavy user is ``--projects 20
--sessions 10`` (~29,000 requests, ~560 MB; the import takes minutes).

    .venv/bin/python benchmarks/bench_analysis.py [--db FILE.duckdb | --logs DIR] [--projects 4 --sessions 5]
        [--requests 145]   # --projects 1 --sessions 1 --requests 1000: one session of ~1,000 requests

Then one session on a small store vs a big one: the same generated sessions (the first project's ten) imported
alone (1,450 requests) and among others (``--big``: the heavy user's 200 sessions, 29,000 requests; by default 40
sessions, 5,800), each opened (``lab.open_session``) and analysed (``pc.rebuilds(session)``) in CPU time, median
and worst of the ten. A session's cost should follow its own size, not the store's. ``--big-db FILE`` reuses a
store that imported ``_claude_code_history.py``'s default history (``--projects 20 --sessions 10``). Last, on the
big store, what ``bench_fleet.py`` times: ``pc.rebuilds(lab.open_session(id))`` for every session.

    .venv/bin/python benchmarks/bench_analysis.py [--big | --big-db FILE.duckdb] [--skip-lab]

``--one FILE.duckdb`` (repeatable; skips the rest) times the user-facing calls on the largest session of each
store, alone: ``lab.open_session`` (the state a continued session needs is read on first use, not here),
``pc.rebuilds(s)``, ``s.turns()`` and its ``session_summary`` row, CPU median of ``--runs``, and per 1,000 of
its requests. The issue's case: one ~1,000-request session imported alone and among the heavy user's 200
(``--projects 1 --sessions 1 --requests 1000`` logs imported into a new store and into the big one).

    .venv/bin/python benchmarks/bench_analysis.py --one small.duckdb --one big.duckdb --runs 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import promptcache_nb as pc
from promptcache_nb.analysis import summarize
from promptcache_nb.turn import TURN_COLUMNS

HERE = Path(__file__).resolve().parent
TARGET_LAB_S = 3.0
TARGET_MS_PER_1000 = 20.0


def best(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    """(best wall seconds, last result) of ``runs`` calls."""
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, help="a store holding imported sessions (opened read-only)")
    ap.add_argument("--logs", type=Path, help="a folder of Claude Code logs to import first")
    ap.add_argument("--projects", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--requests", type=int, default=145, help="requests per generated session (about)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before-runs", type=int, default=1, help="runs of the (slow) per-session loops")
    ap.add_argument("--big", action="store_true", help="the big store holds the heavy user's 200 sessions")
    ap.add_argument("--big-db", type=Path, help="a store holding _claude_code_history.py's default history")
    ap.add_argument("--skip-lab", action="store_true", help="only the one-session figures")
    ap.add_argument("--one", type=Path, action="append", help="time the calls on this store's largest session")
    args = ap.parse_args()
    if args.one:
        for db in args.one:
            largest_session(db, args.runs)
        return
    if not args.skip_lab:
        whole_lab(args)
    one_session_by_store_size(args)


def _history_store(tmp: Path, name: str, projects: int, sessions: int) -> Path:
    sys.path.insert(0, str(HERE))
    from _claude_code_history import write_history  # type: ignore[import-not-found]

    logs = tmp / name
    write_history(logs, projects=projects, sessions=sessions)
    db = tmp / f"{name}.duckdb"
    t = time.process_time()
    with pc.Lab(db, progress=False) as lab:
        res = lab.import_log(logs)
    print(f"imported {name}: {res.requests:,} requests in {time.process_time() - t:.1f} s CPU", flush=True)
    return db


def _open_and_rebuilds(lab: pc.Lab, sid: str) -> tuple[float, float]:
    """CPU seconds of ``lab.open_session(sid)`` and of ``pc.rebuilds`` on it (the session closed after)."""
    t0 = time.process_time()
    s = lab.open_session(sid)
    t1 = time.process_time()
    pc.rebuilds(s)
    t2 = time.process_time()
    s.close()
    return t1 - t0, t2 - t1


def largest_session(db: Path, runs: int) -> None:
    """CPU of each user-facing call on ``db``'s largest session (median of ``runs``), and per 1,000 requests."""
    with pc.Lab(db, progress=False, read_only=True) as lab:
        sizes = lab.sql("SELECT session_id, count(*) AS n FROM turns GROUP BY ALL ORDER BY n DESC, session_id")
        sid, n, total = str(sizes.session_id[0]), int(sizes.n[0]), int(sizes.n.sum())
        s = lab.open_session(sid)
        calls: dict[str, Callable[[], Any]] = {
            "open_session": lambda: lab.open_session(sid),
            "pc.rebuilds(s)": lambda: pc.rebuilds(s),
            "s.turns()": lambda: s.turns(),
            "summary row": lambda: pc.analysis.session_summary(lab, [sid]),
        }
        for f in calls.values():  # pandas and the price tables load outside every figure
            f()
        s.close()
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(runs):
            for name, f in calls.items():
                t = time.process_time()
                out = f()
                times[name].append(time.process_time() - t)
                if name == "open_session":
                    s = out
            s.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{db.name}: largest session {sid}, {n:,} of the store's {total:,} requests; CPU, median of {runs}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for name, t in med.items():
        print(f"  {name:16}{t * 1000:>8.1f} ms{t / n * 1e6:>10.1f} ms per 1,000 requests")
    both = med["open_session"] + med["pc.rebuilds(s)"]
    print(f"  {'open + rebuilds':16}{both * 1000:>8.1f} ms{both / n * 1e6:>10.1f} ms per 1,000 requests   "
          f"(target <= {TARGET_MS_PER_1000:.0f})")
    every = sum(med.values())
    print(f"  {'all four':16}{every * 1000:>8.1f} ms{every / n * 1e6:>10.1f} ms per 1,000 requests")


def one_session_by_store_size(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-one-session-"))
    small = _history_store(tmp, "small", 1, 10)
    big = args.big_db or _history_store(tmp, "big", 20 if args.big else 4, 10)
    # keyed by the log file's name: the same generated session in both (its id hashes the file's path)
    figures: dict[str, dict[str, tuple[float, float]]] = {}
    sizes: dict[str, int] = {}
    totals: dict[str, int] = {}
    for name, db in (("small", small), ("big", big)):
        with pc.Lab(db, progress=False, read_only=True) as lab:
            rows = lab.sql("SELECT s.id, s.source, count(*) AS n FROM sessions s JOIN turns t ON t.session_id = s.id "
                           "GROUP BY ALL")
            files = {Path(str(src)).name: (sid, int(n)) for sid, src, n in rows.itertuples(index=False)}
            totals[name] = int(rows.n.sum())
            keys = sorted(files) if name == "small" else sorted(figures["small"])
            sizes.update((k, files[k][1]) for k in keys)
            _open_and_rebuilds(lab, files[keys[0]][0])  # the price tables and pandas load outside every figure
            figures[name] = {k: min((_open_and_rebuilds(lab, files[k][0]) for _ in range(args.runs)), key=sum)
                             for k in keys}
    print(f"\none session, opened and analysed (CPU, best of {args.runs} per session; the same "
          f"{len(figures['small'])} sessions in both stores; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    print(f"{'store':30}{'open_session':>16}{'pc.rebuilds':>14}{'both, worst':>14}{'per 1,000 requests':>22}")
    for name in ("small", "big"):
        f = figures[name]
        opens = statistics.median(o for o, _ in f.values())
        rbs = statistics.median(r for _, r in f.values())
        worst = max(o + r for o, r in f.values())
        per = statistics.median((o + r) / sizes[sid] * 1000 for sid, (o, r) in f.items())
        print(f"{name + f' ({totals[name]:,} requests)':30}{opens * 1000:>13.1f} ms{rbs * 1000:>11.1f} ms"
              f"{worst * 1000:>11.1f} ms{per * 1000:>19.1f} ms   (median; target <= {TARGET_MS_PER_1000:.0f})")
    with pc.Lab(big, progress=False, read_only=True) as lab:
        ids = lab.store.session_ids()
        t = time.process_time()
        n = sum(len(pc.rebuilds(lab.open_session(sid))) for sid in ids)
        print(f"\nbig store, pc.rebuilds(lab.open_session(id)) for each of its {len(ids)} sessions: "
              f"{time.process_time() - t:.2f} s CPU ({n:,} rebuilds)")


def whole_lab(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-analysis-"))
    db = args.db
    if db is None:
        logs = args.logs
        if logs is None:
            logs = tmp / "history"
            sys.path.insert(0, str(HERE))
            from _claude_code_history import write_history  # type: ignore[import-not-found]

            write_history(logs, projects=args.projects, sessions=args.sessions, requests=args.requests)
        db = tmp / "lab.duckdb"
        t = time.perf_counter()
        with pc.Lab(db, progress=False) as lab:
            res = lab.import_log(logs)
        print(f"imported {logs}: {res!r} in {time.perf_counter() - t:.1f} s")
    with pc.Lab(db, progress=False, read_only=True) as lab:
        ids = lab.store.session_ids()
        n_requests = int(lab.sql("SELECT count(*) AS n FROM turns").n[0])
        pc.rebuilds(lab, session_id=ids[0])  # pandas and the price tables load once, outside every figure
        print(f"{len(ids)} sessions, {n_requests:,} requests in {db}; load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; best of {args.runs} runs "
              f"({args.before_runs} of the per-session loops)", flush=True)

        def per_session_rebuilds() -> int:
            return sum(len(pc.rebuilds(lab, session_id=sid)) for sid in ids)

        def per_session_summaries() -> int:
            # Session.turns()'s query, without opening each session (which rebuilds its simulated caches)
            return sum(summarize(lab.store.turns_frame(sid, TURN_COLUMNS))["rebuilds"] for sid in ids)

        before_rb, n_before = best(per_session_rebuilds, args.before_runs)
        before_sum, _ = best(per_session_summaries, args.before_runs)
        after_rb, frame = best(lambda: pc.rebuilds(lab), args.runs)
        after_sum, summary = best(lab.summary, args.runs)
        if len(frame) != n_before or int(summary.rebuilds.sum()) != n_before:
            raise SystemExit(f"rebuilds differ: {n_before} one session at a time, {len(frame)} lab-wide, "
                             f"{int(summary.rebuilds.sum())} in lab.summary()")
        groups = {by: best(lambda by=by: lab.summary(by=by), args.runs)[0] for by in ("project", "model", "day")}
        # one session: the largest, called alone (what a notebook cell does)
        sizes = lab.sql("SELECT session_id, count(*) AS n FROM turns GROUP BY ALL ORDER BY n DESC, session_id")
        big, big_n = str(sizes.session_id[0]), int(sizes.n[0])
        one_rb, _ = best(lambda: pc.rebuilds(lab, session_id=big), max(args.runs, 5))
        one_sum, _ = best(lambda: pc.analysis.session_summary(lab, [big]), max(args.runs, 5))

    print(f"\n{'':44}{'before (per session)':>22}{'after (whole Lab)':>20}")
    print(f"{'rebuilds of every session':44}{before_rb:>20.2f} s{after_rb:>18.2f} s   ({len(frame):,} rows)")
    print(f"{'summary of every session':44}{before_sum:>20.2f} s{after_sum:>18.2f} s")
    for by, s in groups.items():
        print(f"{'lab.summary(by=' + repr(by) + ')':44}{'-':>22}{s:>18.2f} s")
    total = after_rb + after_sum + sum(groups.values())
    print(f"\nall of the above, whole Lab: {total:.2f} s for {n_requests:,} requests "
          f"(target <= {TARGET_LAB_S:.0f} s each at 29,100 requests)")
    print(f"one session ({big}, {big_n} requests): rebuilds {one_rb * 1000:.1f} ms, summary {one_sum * 1000:.1f} ms "
          f"= {(one_rb + one_sum) * 1000 / big_n * 1000:.1f} ms per 1,000 requests "
          f"(target <= {TARGET_MS_PER_1000:.0f})")


if __name__ == "__main__":
    main()
