"""What ``lab.capture(client)`` adds to an SDK call (issue #24).

An agent loop of ``--requests`` calls (the anthropic SDK, a ~7k-token system prompt, a history growing by one
exchange per call) against the in-process simulator endpoint, run twice per round, alternating: without a capture,
then with one (each call copied as it is read, converted by the importers' code and stored through
``Session.record`` in a file store). Prints the median wall time per call of each run and the overhead; the
capture's share is mostly ``Session.record`` (segmenting the new tail, the store write). Asserts nothing.

    .venv/bin/python benchmarks/bench_capture.py [--requests 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anthropic

import promptcache_nb as pc

SYSTEM = [{"type": "text", "text": "You are the billing platform's support agent. Cite invoice ids. " * 500,
           "cache_control": {"type": "ephemeral"}}]
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def loop(client: anthropic.Anthropic, n: int) -> list[float]:
    history: list[dict] = []
    times = []
    for i in range(n):
        history.append({"role": "user", "content": f"What happened to invoice {8000 + i}? " * 20})
        t0 = time.perf_counter()
        msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, system=SYSTEM, messages=history,
                                     extra_headers={"x-promptcache-at": (T0 + timedelta(seconds=30 * i)).isoformat()})
        times.append(time.perf_counter() - t0)
        history.append({"role": "assistant", "content": msg.content[0].text})
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    with tempfile.TemporaryDirectory() as tmp, pc.SimulatorServer() as server:
        for r in range(args.rounds):
            key = f"sk-bench-{r}"  # a fresh simulator workspace per run: both runs see the same cache states
            client = anthropic.Anthropic(base_url=server.base_url, api_key=key + "a", max_retries=0)
            plain = loop(client, args.requests)
            client.close()
            client = anthropic.Anthropic(base_url=server.base_url, api_key=key + "b", max_retries=0)
            with pc.Lab(Path(tmp, f"r{r}.duckdb"), progress=False) as lab, lab.capture(client) as cap:
                captured = loop(client, args.requests)
            client.close()
            assert cap.stored == args.requests
            a, b = statistics.median(plain) * 1000, statistics.median(captured) * 1000
            a_end, b_end = (statistics.median(x[-10:]) * 1000 for x in (plain, captured))
            print(f"round {r + 1}: median per call {a:.1f} ms without, {b:.1f} ms with the capture "
                  f"(+{b - a:.1f} ms); last 10 calls {a_end:.1f} vs {b_end:.1f} ms (+{b_end - a_end:.1f} ms)")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
