"""Import of a long pi session file (``pi`` format) and of an OpenClaw cache trace: reader time and import time.

Generates a pi v3 session of ``--requests`` assistant entries (tool loops: each answer a tool call, its result, an
assistant turn; a user turn every 4 requests; history growing past 150k estimated tokens), and the same
conversation as an OpenClaw ``cache-trace.jsonl`` (each call's ``stream:context`` carries the whole history, as
OpenClaw writes it). Measures, in one process: the ``json.loads`` floor of every line, the reader alone
(``list(reader.read(path))``: it rebuilds every request's context from the ``parentId`` tree) and
``lab.import_log`` into a fresh DuckDB file. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_import_pi.py [--requests 500]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import promptcache_nb as pc
from promptcache_nb.importers.openclaw import OpenClawReader
from promptcache_nb.importers.pi import PiReader

WORDS = ("refund ledger invoice currency exponent rounding webhook retry settlement audit").split()


def text(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] + str((seed + i) % 97) for i in range(n))


def generate(folder: Path, n: int) -> tuple[Path, Path]:
    t0 = datetime(2026, 2, 3, 10, 0, tzinfo=UTC)
    sid = "0f3c9a2e-6b1d-4c8e-9f21-7a5d3e1b8c40"
    lines: list[dict] = [{"type": "session", "version": 3, "id": sid, "timestamp": t0.isoformat(), "cwd": "/p"}]
    trace: list[dict] = []
    context: list[dict] = []
    parent = None
    total = 9000

    def add(obj: dict, at: datetime) -> None:
        nonlocal parent
        eid = f"{len(lines):08x}"
        lines.append({**obj, "id": eid, "parentId": parent, "timestamp": at.isoformat()})
        parent = eid

    for i in range(n):
        at = t0 + timedelta(seconds=20 * i)
        ms = int(at.timestamp() * 1000)
        if i % 4 == 0:
            msg = {"role": "user", "content": [{"type": "text", "text": text(i, 80)}], "timestamp": ms}
        else:
            msg = {"role": "toolResult", "toolCallId": f"t{i - 1}", "toolName": "read",
                   "content": [{"type": "text", "text": text(i, 250)}], "isError": False, "timestamp": ms}
        add({"type": "message", "message": msg}, at)
        context.append(msg)
        trace.append({"ts": at.isoformat(), "seq": 1, "stage": "stream:context", "runId": f"r{i}", "sessionId": sid,
                      "model": {"id": "claude-sonnet-4-5"}, "system": "You are pi.", "messages": context})
        new = 80 + 200 * (i % 4 != 0)
        usage = {"input": 3, "output": 90, "cacheRead": total if i else 0, "cacheWrite": new if i else total + new}
        total += new + 90
        answer = {"role": "assistant", "content": [{"type": "toolCall", "id": f"t{i}", "name": "read",
                                                    "arguments": {"path": f"src/{i}.ts"}}],
                  "api": "anthropic-messages", "provider": "anthropic", "model": "claude-sonnet-4-5",
                  "usage": usage, "stopReason": "toolUse", "timestamp": ms + 100}
        add({"type": "message", "message": answer}, at + timedelta(seconds=3))
        context = [*context, answer]
        trace.append({"ts": at.isoformat(), "seq": 2, "stage": "session:after", "runId": f"r{i}", "sessionId": sid,
                      "messages": context[-1:]})
    pi_file = folder / "session.jsonl"
    pi_file.write_text("".join(json.dumps(x) + "\n" for x in lines))
    trace_file = folder / "cache-trace.jsonl"
    trace_file.write_text("".join(json.dumps(x) + "\n" for x in trace))
    return pi_file, trace_file


def measure(path: Path, reader: object, folder: Path, name: str) -> None:
    t = time.perf_counter()
    for line in path.read_bytes().splitlines():
        json.loads(line)
    floor = time.perf_counter() - t
    t = time.perf_counter()
    n = sum(1 for r in reader.read(path) if hasattr(r, "usage"))  # type: ignore[attr-defined]
    read = time.perf_counter() - t
    lab = pc.Lab(folder / f"{name}.duckdb")
    t, c = time.perf_counter(), time.process_time()
    res = lab.import_log(path, progress=False)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    lab.close()
    print(f"{name}: {path.stat().st_size / 1e6:.1f} MB, {n} requests ({res.requests} stored): json.loads floor "
          f"{floor:.2f} s, reader {read:.2f} s, import {wall:.2f} s wall / {cpu:.2f} s CPU "
          f"({wall / max(floor, 1e-9):.1f}x the floor)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        pi_file, trace_file = generate(folder, args.requests)
        measure(pi_file, PiReader(), folder, "pi")
        measure(trace_file, OpenClawReader(), folder, "openclaw-trace")


if __name__ == "__main__":
    main()
