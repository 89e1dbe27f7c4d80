"""Re-simulating a stored 1,000-turn session under every cache model.

Builds a cache-stable session (a >= 20k-token system prompt and tools, top-level automatic caching,
messages growing by one user and one assistant message per request) with ``Session.record()``, then
times ``pc.resimulate`` under each registered cache model and ``pc.compare_caches`` over all of them.
Target (issue 3): < 2 s per model on 2 cores. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_resimulate.py [--turns 1000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import promptcache_nb as pc

WORDS = ("invoice proration ledger webhook retry settlement customer subscription dunning refund "
         "currency tax region audit export schema migration latency queue worker").split()


def text(seed: int, n_words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] + str((seed + i) % 97) for i in range(n_words))


def build(lab: pc.Lab, turns: int) -> pc.Session:
    host = "\n".join(f"Rule {i}: {text(i, 60)}" for i in range(180))  # >= 20k-token stable prefix
    tools = [{"name": f"tool_{i:02d}", "description": text(1000 + i, 120),
              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}} for i in range(12)]
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    s = lab.session(project="bench")
    msgs: list[dict] = []
    for i in range(turns):
        msgs.append({"role": "user", "content": [{"type": "text", "text": text(i, 20)}]})
        # every 50th gap is 6 minutes, so TTL expiries show up in the comparison
        at = t0 + timedelta(seconds=20 * i + 340 * (i // 50))
        s.record({"model": "claude-sonnet-4-5", "max_tokens": 1024, "cache_control": {"type": "ephemeral"},
                  "system": [{"type": "text", "text": host}], "tools": tools, "messages": msgs}, at=at)
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": text(i + 1, 12)}]})
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=1000)
    args = ap.parse_args()
    db = Path(tempfile.mkdtemp()) / "bench.duckdb"
    lab = pc.Lab(db, progress=False)
    started = time.perf_counter()
    s = build(lab, args.turns)
    df = s.turns()
    print(f"built {args.turns} turns in {time.perf_counter() - started:.1f} s "
          f"(first request {df.total_tokens.iloc[0]:,} tokens, last {df.total_tokens.iloc[-1]:,})")

    started = time.perf_counter()
    pc.analysis.load_turns(lab, s.id)
    print(f"load_turns (3 queries + rebuild every body): {time.perf_counter() - started:.3f} s")
    for name in pc.CACHE_MODELS:
        started = time.perf_counter()
        out = pc.resimulate(lab, s.id, cache=name)
        took = time.perf_counter() - started
        read = out.cache_read_input_tokens.sum() / out.total_tokens.sum()
        print(f"resimulate cache={name:<10} {took:6.3f} s   read {read:6.1%}   ${out.cost_usd.sum():9.2f}   "
              f"{'OK' if took < 2 else 'SLOW'} (target < 2 s)")
    started = time.perf_counter()
    table = pc.compare_caches(s)
    took = time.perf_counter() - started
    print(f"compare_caches (all {len(table)} models, bodies read once): {took:.3f} s")
    print(table.to_string(index=False))
    lab.close()


if __name__ == "__main__":
    main()
