"""How long ``pc.advise`` takes: on the reference scenario, and on a 1,000-request proxy log.

(a) the reference scenario (``support_agent.yaml``, 100 requests) replayed under ``clock_in_system``, then
    ``pc.advise(session)``: six fixes alone and the saving ones together, each a full counterfactual replay;
(b) a 1,000-request ``exchanges`` log written here: an agent with a minute clock in its system prompt (a
    ~9k-token system prompt + tools), tool loops, a compaction every 100 requests and a few idle gaps,
    with the usage the Anthropic cache model reports for each body (as a proxy in front of the offline
    simulator would log it); imported with ``lab.import_log``, then ``pc.advise``.

(c) with ``--lab PATH``: ``pc.advise(lab)`` over every session of an existing store (a ``.duckdb`` file, opened
    read-only) or fleet dataset (a directory, ``pc.fleet.open``), e.g. the heavy user's 200 Claude Code sessions
    (``promptcache-nb import DIR --db heavy.duckdb`` on ``bench_fleet.py``'s generated history): wall, CPU and
    the process's peak RSS (a Lab's advice holds one session's bodies at a time).

Goal (issue 22): advice on 1,000 requests in <= 10 s on this machine. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_advise.py [--requests 1000] [--repeat 3] [--lab PATH]

Prints wall and CPU seconds: on a machine other work shares, CPU seconds are the comparable figure.
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


def write_log(path: Path, n: int) -> None:
    """An exchanges log of ``n`` requests by an agent whose system prompt carries a minute clock."""
    tools = [{"name": f"tool_{i:02d}", "description": text(1000 + i, 120),
              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}} for i in range(10)]
    rules = "\n".join(f"Rule {i}: {text(i, 40)}" for i in range(100))
    t = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    messages: list[dict] = []
    cache = pc.get_cache_model("anthropic")
    previous = None
    with path.open("w", encoding="utf-8") as f:
        for k in range(n):
            if k % 100 == 0:  # a compaction: the history becomes a summary
                messages = [{"role": "user", "content": [{"type": "text", "text": "Summary: " + text(k, 80)}]},
                            {"role": "assistant", "content": [{"type": "text", "text": "Understood."}]}]
            if k % 4 == 0:  # a user turn, then three tool calls
                messages.append({"role": "user", "content": [{"type": "text", "text": text(k, 30)}]})
            else:
                result = {"type": "tool_result", "tool_use_id": f"toolu_{k - 1:04d}", "content": text(k, 90)}
                messages.append({"role": "user", "content": [result]})
            t += timedelta(minutes=7) if k % 150 == 149 else timedelta(seconds=20)
            system = f"{rules}\n\nCurrent time: {t:%Y-%m-%d %H:%M} (Monday)\nRuntime: linux amd64"
            body = {"model": "claude-sonnet-4-5", "max_tokens": 4096, "system": system, "tools": tools,
                    "messages": messages, "cache_control": {"type": "ephemeral"}}
            previous = pc.request.prepare(body, previous=previous)
            u = cache.process(previous, t).usage
            usage = {"input_tokens": u.input_tokens, "cache_read_input_tokens": u.cache_read_input_tokens,
                     "cache_creation_input_tokens": u.cache_creation_input_tokens, "output_tokens": 60}
            reply = [{"type": "tool_use", "id": f"toolu_{k:04d}", "name": "tool_01", "input": {"q": text(k, 5)}}]
            f.write(json.dumps({"v": 1, "at": t.isoformat().replace("+00:00", "Z"), "method": "POST",
                                "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages",
                                "status": 200, "request": body,
                                "response": {"id": f"msg_{k:04d}", "type": "message", "role": "assistant",
                                             "model": "claude-sonnet-4-5", "content": reply, "usage": usage},
                                "usage": usage, "request_id": f"req_{k:04d}", "latency_ms": 800,
                                "provider": "anthropic"}) + "\n")
            messages = [*messages, {"role": "assistant", "content": reply}]


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """(median wall seconds, median CPU seconds, the last result): CPU time is what this process spent, the
    figure to compare on a machine other work shares."""
    wall, cpu, got = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        got = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lab", type=Path, help="also advise every session of this store file or fleet dataset")
    args = ap.parse_args()

    with pc.Lab(progress=False) as lab:
        s = lab.replay(pc.data_path("scenarios") / "support_agent.yaml", strategy="clock_in_system")
        secs, cpu, advice = timed(lambda: pc.advise(s), args.repeat)
        print(f"reference scenario ({len(s.turns())} requests): advise {secs:.2f} s wall, {cpu:.2f} s CPU "
              f"(median of {args.repeat})")
        print("  " + advice.summary())

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "traffic.jsonl"
        write_log(log, args.requests)
        with pc.Lab(progress=False) as lab:
            t0, c0 = time.perf_counter(), time.process_time()
            (s,) = lab.import_log(log).sessions
            print(f"{args.requests}-request log ({log.stat().st_size / 1e6:.0f} MB): imported in "
                  f"{time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU")
            secs, cpu, advice = timed(lambda: pc.advise(s), args.repeat)
            print(f"{args.requests}-request log: advise {secs:.2f} s wall, {cpu:.2f} s CPU (median of "
                  f"{args.repeat}; goal <= 10 s)")
            print("  " + advice.summary())

    if args.lab is not None:
        import resource

        lab = (pc.fleet.open(args.lab, progress=False) if args.lab.is_dir()
               else pc.Lab(args.lab, progress=False, read_only=True))
        with lab:
            n = int(lab.sql("SELECT count(*) AS n FROM turns").n[0])
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            secs, cpu, advice = timed(lambda: pc.advise(lab), 1)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{args.lab.name} ({lab.store.session_count()} sessions, {n:,} requests): advise(lab) {secs:.1f} s "
                  f"wall, {cpu:.1f} s CPU ({1000 * cpu / n:.1f} ms per request), peak RSS {peak:.0f} MB "
                  f"({before:.0f} MB before)")
            print("  " + advice.summary())


if __name__ == "__main__":
    main()
