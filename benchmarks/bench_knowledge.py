"""Knowledge at scale (issue 15 item 12): ``knowledge.add`` one entry at a time up to 20,000 entries, and
``knowledge.add_many`` of 100,000 entries, on a store file.

Prints (asserts nothing):

* per-add wall time, the median (and mean: the WAL checkpoints DuckDB runs now and then) over a window of 100
  adds ending at add 100, 1,000, 5,000, 10,000 and 20,000 (every add pending for the next request, as between
  two turns);
* the same at the two ends side by side, robust to the machine's load changing during the run: 100 adds to a
  new store (adds 1–100) alternating with 100 adds to the 20,000-entry one (adds 20,002–20,101) — target:
  add 20,000 ≤ 2× add 100;
* ``len(s.knowledge)`` right after an add at the end (the Lab's knowledge list is updated in place, not
  reloaded);
* ``add_many`` of 100,000 entries in a new project (one transaction) — target: seconds — the next ``add`` and
  ``len(s.knowledge)`` after it, and the first read of that book in a new Lab;
* resuming the session with every add still pending (``lab.session(id=...)``).

    .venv/bin/python benchmarks/bench_knowledge.py [--adds 20000] [--many 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import promptcache_nb as pc

WINDOW = 100
CHECKPOINTS = (100, 1_000, 5_000, 10_000, 20_000)


def entry(i: int) -> dict[str, str]:
    return {"title": f"Entry {i}", "content": f"Content of entry {i}: " + "lorem ipsum dolor sit amet " * 8,
            "category": "fact" if i % 2 else "note", "key": f"k{i}"}


def timed(fn, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adds", type=int, default=20_000)
    ap.add_argument("--many", type=int, default=100_000, help="entries for add_many (0: skip)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} (2-core machine, shared with other jobs)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "knowledge.duckdb"
        with pc.Lab(path, progress=False) as lab:
            s = lab.session(system="You are terse.", project="one-by-one")
            s.step("hello", reply="hi")
            per_add: list[float] = []
            t0 = time.perf_counter()
            for i in range(args.adds):
                per_add.append(timed(s.knowledge.add, **entry(i)))
            total = time.perf_counter() - t0
            print(f"\n{args.adds:,} adds in {total:.1f} s ({total / max(args.adds, 1) * 1e3:.2f} ms each on average)")
            first = None
            for n in CHECKPOINTS:
                if n > args.adds:
                    break
                window = per_add[n - WINDOW:n]
                ms, mean = statistics.median(window) * 1e3, statistics.mean(window) * 1e3
                first = first or ms
                print(f"  add {n:>6,}: {ms:6.2f} ms median, {mean:6.2f} ms mean (adds {n - WINDOW + 1:,}–{n:,}); "
                      f"median {ms / first:.2f}× add 100")
            print(f"  pending events: {len(s.pending_events):,}")
            s.knowledge.add(**entry(args.adds))
            print(f"  len(s.knowledge) after an add: {timed(len, s.knowledge) * 1e3:.2f} ms "
                  f"({len(s.knowledge):,} entries)")
            with pc.Lab(Path(tmp) / "new.duckdb", progress=False) as new_lab:
                fresh = new_lab.session(system="You are terse.", project="one-by-one")
                fresh.step("hello", reply="hi")
                small, big = [], []
                for i in range(WINDOW):
                    small.append(timed(fresh.knowledge.add, **entry(i)))
                    big.append(timed(s.knowledge.add, **entry(args.adds + 1 + i)))
            ms_small, ms_big = statistics.median(small) * 1e3, statistics.median(big) * 1e3
            print(f"  side by side: {ms_small:.2f} ms (adds 1–{WINDOW} to a new store) vs {ms_big:.2f} ms "
                  f"(adds {args.adds + 2:,}–{args.adds + 1 + WINDOW:,}): {ms_big / ms_small:.2f}×")
            sid = s.id
        with pc.Lab(path, progress=False) as lab:
            t0 = time.perf_counter()
            s = lab.session(id=sid)
            dt = time.perf_counter() - t0
            print(f"  resume with {len(s.pending_events):,} pending events: {dt * 1e3:.0f} ms")
            if args.many:
                m = lab.session(system="You are terse.", project="bulk")
                len(m.knowledge)  # the Lab holds the project's (empty) book: add_many updates it
                entries = [entry(i) for i in range(args.many)]
                dt = timed(m.knowledge.add_many, entries)
                print(f"\nadd_many of {args.many:,} entries: {dt:.2f} s ({dt / args.many * 1e6:.0f} µs per entry)")
                print(f"  then one add: {timed(m.knowledge.add, **entry(args.many)) * 1e3:.2f} ms; "
                      f"len(m.knowledge): {timed(len, m.knowledge) * 1e3:.2f} ms ({len(m.knowledge):,} entries)")
                mid = m.id
        if args.many:
            with pc.Lab(path, progress=False) as lab:
                m = lab.session(id=mid)
                print(f"  the book read from the store (a new Lab, first use): {timed(len, m.knowledge):.2f} s")
        print(f"\nstore file: {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
