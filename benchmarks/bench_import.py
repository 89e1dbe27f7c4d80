"""Import of a 1,000-request proxy log (the path users take): time vs the json.loads floor, request 10 vs 1,000.

Generates an ``exchanges`` JSON Lines log (the recording proxy's format) of one Anthropic conversation: a
~20k-token system + tools prefix, history growing past 150k estimated tokens, measured usage on every line.
Then measures, in one process:

- the floor: ``json.loads`` of every line;
- ``lab.import_log(log)`` into a fresh DuckDB file, total wall time, and the time of each ``Session.record``
  call (request 10 vs request 1,000, median of the 5 around each).

Targets (issue "Real traffic in", item 6): request 1,000 <= 2x request 10; whole import <= 3x the floor.
The floor parses every line whole; the importer does not: its ``HistoryDecoder`` (``readers/_history.py``) takes
the history items a body repeats from the line before by comparing their JSON text, so on a growing log the import
can be faster than the floor. The ``s.record(fresh body)`` line is the path without that help: each body parsed
whole by the caller, its history compared item by item.
Both are printed in wall time and in CPU time (``time.process_time``: this process, DuckDB's threads included),
which a shared machine's load disturbs less. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_import.py [--requests 1000]
"""

from __future__ import annotations

import argparse
import json
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


def generate(path: Path, n: int) -> int:
    """Write the log; returns the estimated tokens of the last request."""
    host = "\n".join(f"Rule {i}: {text(i, 60)}" for i in range(180))
    system = [{"type": "text", "text": host, "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": f"tool_{i:02d}", "description": text(1000 + i, 120),
              "input_schema": {"type": "object", "properties": {"q": {"type": "string", "description": text(i, 20)}}}}
             for i in range(12)]
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    messages: list[dict] = []
    total = 20_000
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            messages.append({"role": "user", "content": [{"type": "text", "text": f"Step {i}: {text(i, 40)}"}]})
            body = {"model": "claude-sonnet-4-5", "max_tokens": 2048, "system": system, "tools": tools,
                    "messages": messages}
            new = 150 + (i % 7) * 10
            usage = {"input_tokens": 3, "cache_read_input_tokens": total if i else 0,
                     "cache_creation_input_tokens": new if i else total + new, "output_tokens": 80}
            total += new
            line = {"v": 1, "at": (t0 + timedelta(seconds=20 * i)).isoformat(), "method": "POST",
                    "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200,
                    "request": body, "response": None, "usage": usage, "request_id": f"req_{i:06d}",
                    "latency_ms": 800, "provider": "anthropic"}
            fh.write(json.dumps(line) + "\n")
            messages = messages + [{"role": "assistant", "content": [{"type": "text", "text": text(5000 + i, 35)}]}]
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    log = tmp / "proxy.jsonl"
    generate(log, args.requests)
    size_mb = log.stat().st_size / 1e6

    t, c = time.perf_counter(), time.process_time()
    with log.open(encoding="utf-8") as fh:
        for line in fh:
            json.loads(line)
    floor, floor_cpu = time.perf_counter() - t, time.process_time() - c

    times: list[float] = []
    original = pc.Session.record

    def timed(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            times.append(time.perf_counter() - t0)

    pc.Session.record = timed  # type: ignore[method-assign]
    try:
        t, c = time.perf_counter(), time.process_time()
        with pc.Lab(tmp / "import.duckdb", progress=False) as lab:
            res = lab.import_log(log)
            last_tokens = int(lab.sql("SELECT max(total_tokens) AS t FROM turns").t[0])
        total, total_cpu = time.perf_counter() - t, time.process_time() - c
    finally:
        pc.Session.record = original  # type: ignore[method-assign]

    def around(i: int) -> float:
        return statistics.median(times[max(0, i - 3): i + 2]) * 1000

    r10, rn = around(10), around(len(times) - 1)
    print(f"log: {args.requests} requests, {size_mb:.1f} MB, last request {last_tokens:,} est. tokens")
    print(f"json.loads floor: {floor:.2f} s, {floor_cpu:.2f} s CPU")
    print(f"import_log: {total:.2f} s = {total / floor:.1f}x the floor; {total_cpu:.2f} s CPU = "
          f"{total_cpu / floor_cpu:.1f}x the floor's CPU (target <= 3x); {res.requests} requests stored")
    print(f"record() inside the import (bodies already segmented) at request 10: {r10:.1f} ms; "
          f"at request {len(times)}: {rn:.1f} ms ({rn / r10:.2f}x, target <= 2x)")
    print(f"record() total {sum(times):.2f} s; reading + segmenting {total - sum(times):.2f} s")
    record_fresh_bodies(log, tmp / "record.duckdb")


def record_fresh_bodies(log: Path, db: Path) -> None:
    """The path a user's own loop takes: ``s.record(body, usage=...)`` on a freshly parsed body each request
    (validation, segmenting against the previous body and the store write all inside the timed call)."""
    cpu: list[float] = []
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    with pc.Lab(db, progress=False) as lab, log.open(encoding="utf-8") as fh:
        s = lab.session()
        for i, line in enumerate(fh):
            call = json.loads(line)
            c = time.process_time()
            s.record(call["request"], at=t0 + timedelta(seconds=30 * i), usage=call["usage"])
            cpu.append(time.process_time() - c)
    first, last = statistics.median(cpu[:50]) * 1000, statistics.median(cpu[-50:]) * 1000
    print(f"s.record(fresh body) CPU: median of requests 1-50 {first:.1f} ms, of the last 50 {last:.1f} ms "
          f"({last / first:.2f}x, target <= 2x); {sum(cpu):.2f} s for {len(cpu)} requests")

    def near(i: int) -> float:  # median of the 20 requests around request i (1-based)
        lo = max(0, min(i - 10, len(cpu) - 20))
        return statistics.median(cpu[lo: lo + 20]) * 1000

    at = {i: near(i) for i in (10, 100, len(cpu))}
    print("s.record(fresh body) CPU per call, median of 20 around each: "
          + ", ".join(f"request {i:,} {ms:.1f} ms" for i, ms in at.items())
          + f" ({at[len(cpu)] / at[10]:.2f}x request 10)")


if __name__ == "__main__":
    main()
