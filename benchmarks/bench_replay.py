"""1,000-turn replay: per-turn time at turn 10 vs 1,000, total time, and store size.

Targets (Foundation brief): turn 1,000 <= 2x turn 10; total <= 10 s on 2 cores; store <= 1.5x unique
content bytes. Prints figures; asserts nothing (speed targets live here, not in unit tests).

    .venv/bin/python benchmarks/bench_replay.py [--turns 1000] [--strategy durable_delta]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import promptcache_nb as pc

WORDS = ("invoice proration ledger webhook retry settlement customer subscription dunning refund "
         "currency tax region audit export schema migration latency queue worker").split()


def text(seed: int, n_words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] + str((seed + i) % 97) for i in range(n_words))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--strategy", default="durable_delta" if "durable_delta" in pc.STRATEGIES else "naive")
    args = ap.parse_args()

    host = "\n".join(f"Rule {i}: {text(i, 60)}" for i in range(180))  # >= 20k-token stable prefix
    tools = [{"name": f"tool_{i:02d}", "description": text(1000 + i, 120),
              "input_schema": {"type": "object", "properties": {"q": {"type": "string", "description": text(i, 20)}}}}
             for i in range(12)]
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    tmp = Path(tempfile.mkdtemp())
    db = tmp / "bench.duckdb"
    lab = pc.Lab(db, progress=False)
    s = lab.session(args.strategy, "anthropic", "claude-sonnet-4-5", system=host, tools=tools, project="bench")
    for k in range(6):
        s.knowledge.add(f"Fact {k}", text(500 + k, 30), category="fact", at=t0)
    per_turn: list[float] = []
    started = time.perf_counter()
    for i in range(args.turns):
        if i and i % 100 == 0:
            s.knowledge.add(f"Learned {i}", text(i, 25), category="gotcha", at=t0 + timedelta(seconds=20 * i))
        t_start = time.perf_counter()
        s.step(text(i, 70), reply=text(i + 1, 40), at=t0 + timedelta(seconds=20 * i))
        per_turn.append(time.perf_counter() - t_start)
    total = time.perf_counter() - started
    df = s.turns()
    last_total = int(df.total_tokens.iloc[-1])
    static = int(df.total_tokens.iloc[0])
    lab.close()

    # unique content bytes vs what logging every body would take
    lab = pc.Lab(db, progress=False)
    unique = int(lab.sql("select sum(bytes) b from blocks").b[0])
    every_body = int(lab.sql("select sum(body_bytes) b from turns").b[0])
    lab.close()
    store_bytes = os.path.getsize(db) + (os.path.getsize(str(db) + ".wal") if os.path.exists(str(db) + ".wal") else 0)

    def around(i: int) -> float:
        window = per_turn[max(0, i - 5): i + 5]
        return statistics.median(window) * 1000

    print(f"strategy={args.strategy} turns={args.turns} first request={static:,} est. tokens, "
          f"last request={last_total:,} est. tokens")
    print(f"per-turn time: turn 10 = {around(10):.2f} ms, turn {args.turns} = {around(args.turns - 1):.2f} ms "
          f"(ratio {around(args.turns - 1) / around(10):.2f}x; target <= 2x)")
    print(f"total time: {total:.2f} s (target <= 10 s)")
    print(f"store file: {store_bytes / 1e6:.2f} MB; unique block bytes: {unique / 1e6:.2f} MB "
          f"(ratio {store_bytes / unique:.2f}x; target <= 1.5x); logging every body: {every_body / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
