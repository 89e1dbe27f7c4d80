"""The reference 1,000-turn replay: CPU time in total and per request (request 10 vs 1,000), and store size.

One conversation under a strategy: a >= 20k-token stable prefix (host prompt and 12 tools), 6 knowledge
facts, a new one every 100 turns, history growing past 300k estimated tokens. By default it is replayed
as a scenario (``lab.replay``, the path notebooks and the CLI take); ``--interactive`` sends the same turns
with ``Session.step`` one by one instead (one transaction per turn, the Stepper's path).

Targets (issue 14, "Ingest at the floor"): the 1,000-turn replay <= 5 s CPU (``time.process_time``: this
process's CPU, DuckDB's threads included; wall time is printed beside it and depends on the machine's
load); request 1,000 <= 2x request 10 (CPU of ``Session.step``, median of the 10 around each; a replay
writes its rows in bulk when a chunk of turns commits, outside ``step``: the total includes it); store
<= 1.5x unique content bytes. Prints figures; asserts nothing (speed targets live here, not in unit tests).

    .venv/bin/python benchmarks/bench_replay.py [--turns 1000] [--strategy durable_delta] [--interactive]
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
from promptcache_nb.scenario import KnowledgeAdd, KnowledgeSpec, Scenario, ScenarioTurn

WORDS = ("invoice proration ledger webhook retry settlement customer subscription dunning refund "
         "currency tax region audit export schema migration latency queue worker").split()
GAP = timedelta(seconds=20)


def text(seed: int, n_words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] + str((seed + i) % 97) for i in range(n_words))


def scenario(turns: int) -> Scenario:
    host = "\n".join(f"Rule {i}: {text(i, 60)}" for i in range(180))  # >= 20k-token stable prefix
    tools = tuple({"name": f"tool_{i:02d}", "description": text(1000 + i, 120),
                   "input_schema": {"type": "object",
                                    "properties": {"q": {"type": "string", "description": text(i, 20)}}}}
                  for i in range(12))
    facts = tuple(KnowledgeSpec(f"fact-{k}", f"Fact {k}", text(500 + k, 30), "fact") for k in range(6))
    steps = tuple(
        ScenarioTurn(text(i, 70), text(i + 1, 40), after=GAP, events=(
            (KnowledgeAdd(f"learned-{i}", f"Learned {i}", text(i, 25), "gotcha"),) if i and i % 100 == 0 else ()))
        for i in range(turns))
    return Scenario("bench", "claude-sonnet-4-5", datetime(2026, 11, 2, 9, 0, tzinfo=UTC), host, tools, facts,
                    steps, project="bench")


def interactive(lab: pc.Lab, sc: Scenario, strategy: str) -> pc.Session:
    """The same turns through ``Session.step``, one by one."""
    s = lab.session(strategy, "anthropic", sc.model, system=sc.host_prompt, tools=list(sc.tools),
                    project=f"{sc.project}/{strategy}", start=sc.start)
    for spec in sc.knowledge:
        s.knowledge.add(spec.title, spec.content, category=spec.category, key=spec.key, at=sc.start)
    at = sc.start
    for i, turn in enumerate(sc.turns):
        at = at + turn.after if i else at
        for event in turn.events:
            s = s.apply(event, at=at)
        s.step(turn.user, reply=turn.reply, at=at)
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--strategy", default="durable_delta" if "durable_delta" in pc.STRATEGIES else "naive")
    ap.add_argument("--interactive", action="store_true", help="Session.step turn by turn instead of lab.replay")
    args = ap.parse_args()

    sc = scenario(args.turns)
    db = Path(tempfile.mkdtemp()) / "bench.duckdb"
    per_turn: list[float] = []  # CPU seconds of each Session.step
    step = pc.Session.step

    def timed(self, *a, **k):
        t0 = time.process_time()
        try:
            return step(self, *a, **k)
        finally:
            per_turn.append(time.process_time() - t0)

    lab = pc.Lab(db, progress=False)
    pc.Session.step = timed  # type: ignore[method-assign]
    try:
        started, started_cpu = time.perf_counter(), time.process_time()
        if args.interactive:
            s = interactive(lab, sc, args.strategy)
        else:
            s = lab.replay(sc, strategy=args.strategy, cache="anthropic", progress=False)
        total, total_cpu = time.perf_counter() - started, time.process_time() - started_cpu
    finally:
        pc.Session.step = step  # type: ignore[method-assign]
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

    how = "Session.step, turn by turn" if args.interactive else "lab.replay"
    print(f"strategy={args.strategy} turns={args.turns} ({how}) first request={static:,} est. tokens, "
          f"last request={last_total:,} est. tokens")
    print(f"per-request CPU: request 10 = {around(10):.2f} ms, request {args.turns} = "
          f"{around(args.turns - 1):.2f} ms (ratio {around(args.turns - 1) / around(10):.2f}x; target <= 2x)")
    target = f"target <= {5 * args.turns / 1000:g} s" + ("" if args.turns == 1000 else ", scaled from 5 s per 1,000")
    print(f"{args.turns} turns: {total_cpu:.2f} s CPU ({target}); {total:.2f} s wall")
    print(f"store file: {store_bytes / 1e6:.2f} MB; unique block bytes: {unique / 1e6:.2f} MB "
          f"(ratio {store_bytes / unique:.2f}x; target <= 1.5x); logging every body: {every_body / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
