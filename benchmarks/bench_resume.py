"""A long session: resume time, per-request CPU as it grows, and its store size (issue 16).

The reference scenario (``support_agent.yaml``: tool loops, knowledge changes, a restart) is cycled to N
requests: round 0 is the scenario as written; each later round tags its texts ``[round k]`` and, from round 1
on, sends each tool result ``--result-copies`` times (longer log excerpts), so the body passes 1M estimated
tokens by request 3,000. Knowledge events of later rounds that name a removed key re-add it. Its restart
event is kept (an in-process restart; the Lab keeps the provider's cache, as a provider would).

Prints:

* per-request CPU (``time.process_time`` per ``step`` over its requests), the median over one round of the
  scenario (100 requests: the same mix of turns, tool loops and knowledge events) starting at requests 0 /
  950 / 2,900 — the three rounds run interleaved (a fresh session, a copy taken at request 950, and the long
  session's last round, one turn each in turn), so the machine's load weighs on them alike — target: the
  last ≤ 1.5× the first;
* resume time: a fresh process opens a copy of the store taken at 300 / 1,000 / 3,000 requests,
  ``lab.session(id=...)`` and takes the next step (the package and its price data imported beforehand) —
  target: 1,000 requests ≤ 1 s;
* the store at the end: file (+ WAL) bytes vs the unique content bytes of its blocks — target ≤ 1.5×;
* the first ``record`` into a reopened recorded session (issue 23: a proxy log's 1,000 requests, ~2,000 messages
  of ~400 characters, measured usage): a fresh process opens a copy of the store, ``lab.open_session(id)``, and
  records the next request and the one after it, nothing imported beforehand but the package (the price data's
  first load is part of what the user waits for); the median and the fastest of ``--first-runs`` processes —
  target: the first record well under 200 ms.

    .venv/bin/python benchmarks/bench_resume.py [--requests 3000] [--strategy durable_delta] [--recorded 1000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import promptcache_nb as pc
from promptcache_nb.errors import KnowledgeError
from promptcache_nb.scenario import KnowledgeAdd, Scenario, ScenarioTurn

REFERENCE = Path(pc.__file__).parent / "data" / "scenarios" / "support_agent.yaml"
CHECKPOINTS = (300, 1000, 3000)
ROUNDS = (0, 950, 2900)  # per-request CPU: the median over the 100 requests from each


def tagged(text: str, k: int) -> str:
    return text if k == 0 else f"[round {k}] {text}"


def cycled(sc: Scenario, n_requests: int, copies: int) -> list[tuple[int, ScenarioTurn]]:
    """(round, turn) pairs until ``n_requests`` requests."""
    out: list[tuple[int, ScenarioTurn]] = []
    n = k = 0
    while n < n_requests:
        for t in sc.turns:
            calls = tuple(dataclasses.replace(c, result=tagged("\n".join([c.result] * (copies if k else 1)), k))
                          for c in t.tool_calls)
            out.append((k, dataclasses.replace(t, user=tagged(t.user, k), reply=tagged(t.reply, k), tool_calls=calls)))
            n += 1 + len(calls)
            if n >= n_requests:
                break
        k += 1
    return out


def apply(s: pc.Session, event: object, at: object, k: int) -> pc.Session:
    if k and isinstance(event, KnowledgeAdd):
        event = dataclasses.replace(event, title=tagged(event.title, k))
    try:
        return s.apply(event, at=at)  # type: ignore[arg-type]
    except KnowledgeError:  # a later round updates or removes a key an earlier round removed: add it back
        key = event.key  # type: ignore[attr-defined]
        s.knowledge.add(tagged(f"Restored {key}", k), tagged(f"Restored entry {key}", k), key=key, at=at)
        return s


def store_bytes(path: Path) -> int:
    wal = Path(str(path) + ".wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


class Driver:
    """Steps one session through the cycled scenario, a user turn (and its tool loop) at a time."""

    def __init__(self, s: pc.Session, turns: list[tuple[int, ScenarioTurn]], at: object, i: int = 0) -> None:
        self.s, self.turns, self.at, self.i = s, turns, at, i

    def step(self) -> tuple[int, int, float]:
        """One scenario turn: (first request index, requests sent, CPU seconds per request)."""
        k, turn = self.turns[self.i]
        if self.i > 0:
            self.at = self.at + turn.after  # type: ignore[operator]
        for event in turn.events:
            self.s = apply(self.s, event, self.at, k)
        before = self.s.n_turns
        c0 = time.process_time()
        t = self.s.step(turn.user, turn.reply, at=self.at, tool_calls=turn.tool_calls)
        n = self.s.n_turns - before
        self.at, self.i = t.at, self.i + 1
        return before, n, (time.process_time() - c0) / n


def build(tmp: Path, n_requests: int, strategy: str, copies: int) -> tuple[str, dict[tuple[int, int], float], int]:
    """Replay the cycled scenario to ``n_requests`` into ``tmp/session.duckdb``, copying the store at each of
    ``CHECKPOINTS``; its last round runs interleaved with round 0 of a fresh session and the round from request
    950 of a copy, so a change of machine load touches all three alike. Returns (session id, {request: CPU
    per request} of the three measured rounds, the last request's tokens)."""
    sc = pc.load_scenario(REFERENCE)
    turns = cycled(sc, n_requests, copies)
    db = tmp / "session.duckdb"
    measured: dict[tuple[int, int], float] = {}  # (round start, request index) -> CPU per request
    with pc.Lab(db, progress=False) as lab:
        long = Driver(lab.replay(sc, strategy=strategy, stop_after=0), turns, sc.start)
        mid_state = None
        while long.s.n_turns < n_requests - 100 and long.i < len(turns):
            before, n, _ = long.step()
            for mark in (*CHECKPOINTS, ROUNDS[1]):
                if before < mark <= before + n and mark < n_requests:
                    lab.sql("CHECKPOINT")
                    shutil.copy(db, tmp / f"at{mark}.duckdb")
                    if mark == ROUNDS[1]:
                        mid_state = (long.s.id, long.at, long.i)
        with pc.Lab(tmp / "fresh.duckdb", progress=False) as fresh_lab, \
                pc.Lab(tmp / f"at{ROUNDS[1]}.duckdb", progress=False) as mid_lab:
            fresh = Driver(fresh_lab.replay(sc, strategy=strategy, stop_after=0), turns, sc.start)
            drivers = [(fresh, 0)]
            if mid_state is not None:
                sid, at, i = mid_state
                drivers.append((Driver(mid_lab.session(id=sid), turns, at, i), ROUNDS[1]))
            drivers.append((long, ROUNDS[2] if n_requests >= 3000 else n_requests - 100))
            done = False
            while not done:
                done = True
                for d, lo in drivers:
                    if d.s.n_turns < lo + 100 and d.i < len(d.turns):
                        before, n, per = d.step()
                        measured.update({(lo, j): per for j in range(before, before + n)})
                        done = False
        return long.s.id, measured, long.s.last_turn.total_tokens  # type: ignore[union-attr, return-value]


def resume_child(path: str, session_id: str) -> None:
    """In a fresh process: open the store, resume the session, take the next step; print the timings."""
    from promptcache_nb.analysis.prices import prices_for

    prices_for("claude-sonnet-4-5")  # the price data's first load is an import cost, not a resume cost
    w0, c0 = time.perf_counter(), time.process_time()
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(id=session_id)
        w1 = time.perf_counter()
        t = s.step("One more question about the refunds.", reply="Here is the answer.")
        w2, c2 = time.perf_counter(), time.process_time()
        out = {"open": w1 - w0, "total": w2 - w0, "cpu": c2 - c0, "requests": t.index,
               "usage": [t.usage.cache_read_input_tokens, t.usage.cache_creation_input_tokens, t.usage.input_tokens]}
    sys.stdout.write(json.dumps(out))


def resume(path: Path, session_id: str) -> dict:
    code = "import sys, bench_resume as b; b.resume_child(sys.argv[1], sys.argv[2])"
    proc = subprocess.run([sys.executable, "-c", code, str(path), session_id], capture_output=True, text=True,
                          cwd=Path(__file__).parent, check=True)
    return json.loads(proc.stdout)


# -- the first record into a reopened recorded session ----------------------------------------------------------
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
WORDS = ("invoice", "refund", "ledger", "webhook", "customer", "settlement", "proration", "subscription", "currency",
         "migration", "worker", "queue", "schema", "dunning", "audit", "export", "latency", "region", "retry", "tax")


def logged_body(n: int) -> dict[str, Any]:
    """Request ``n`` of a proxy-logged agent: a system prompt, a tool, and a history of ``n`` exchanges whose texts
    are ~400 characters of words and numbers (the shape of issue 23's proxy log), then the next question."""
    def text(i: int, role: str) -> str:
        return f"{role} {i}: " + " ".join(f"{WORDS[(i + j) % len(WORDS)]}{i * 7 + j}" for j in range(36))

    messages: list[dict[str, Any]] = []
    for i in range(n):
        messages.append({"role": "user", "content": [{"type": "text", "text": text(i, "question")}]})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text(i, "answer")}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": text(n, "question"),
                                                  "cache_control": {"type": "ephemeral"}}]})
    return {"model": "claude-sonnet-4-5", "max_tokens": 4096,
            "system": [{"type": "text", "text": "You are a billing agent. " * 40,
                        "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "lookup", "description": "Find a record by id.",
                       "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}}],
            "messages": messages}


def logged_usage(n: int) -> dict[str, int]:
    return {"input_tokens": 3, "cache_read_input_tokens": 150 * n, "cache_creation_input_tokens": 240,
            "output_tokens": 90}


def build_recorded(path: Path, n_requests: int) -> str:
    """``n_requests`` logged requests recorded into one session of a file store; its id."""
    with pc.Lab(path, progress=False) as lab:
        s = lab.new_session("naive", project="logged", start=T0)
        for n in range(n_requests):
            s.record(logged_body(n), at=T0 + timedelta(seconds=30 * n), usage=logged_usage(n))
        return s.id


def first_record_child(path: str, session_id: str, n: str, frames: str) -> None:
    """In a fresh process (the package imported; with ``frames`` "1" also pandas, as in a notebook that has shown
    a frame): open the store and the session, record the next two requests; print the timings."""
    if frames == "1":
        import pandas  # noqa: F401
    k = int(n)
    bodies = [logged_body(k), logged_body(k + 1)]  # built before the clock starts: the caller's, not ours
    w0 = time.perf_counter()
    with pc.Lab(path, progress=False) as lab:
        s = lab.open_session(session_id)
        w1, c1 = time.perf_counter(), time.process_time()
        s.record(bodies[0], at=T0 + timedelta(seconds=30 * k), usage=logged_usage(k))
        w2, c2 = time.perf_counter(), time.process_time()
        s.record(bodies[1], at=T0 + timedelta(seconds=30 * (k + 1)), usage=logged_usage(k + 1))
        w3 = time.perf_counter()
    sys.stdout.write(json.dumps({"open": w1 - w0, "first": w2 - w1, "first_cpu": c2 - c1, "second": w3 - w2}))


def first_record(tmp: Path, n_requests: int, runs: int) -> None:
    db = tmp / "recorded.duckdb"
    started = time.perf_counter()
    sid = build_recorded(db, n_requests)
    print(f"recorded session: {n_requests:,} requests stored in {time.perf_counter() - started:.1f} s")
    got: dict[str, list[dict[str, float]]] = {"0": [], "1": []}
    for i in range(runs):  # the two kinds of process in turn, so the machine's load weighs on them alike
        for frames, results in got.items():
            copy = tmp / f"recorded-{i}-{frames}.duckdb"
            shutil.copy(db, copy)
            code = "import sys, bench_resume as b; b.first_record_child(*sys.argv[1:])"
            proc = subprocess.run([sys.executable, "-c", code, str(copy), sid, str(n_requests), frames],
                                  capture_output=True, text=True, cwd=Path(__file__).parent, check=True)
            results.append(json.loads(proc.stdout))
    for frames, results in got.items():

        def ms(key: str, results: list[dict[str, float]] = results) -> str:
            values = [r[key] * 1000 for r in results]
            return f"{statistics.median(values):.1f} ms (fastest {min(values):.1f})"

        print(f"reopened at {n_requests:,} recorded requests, {'pandas loaded' if frames == '1' else 'no pandas'}, "
              f"median of {runs} processes: Lab + open_session {ms('open')}, first record {ms('first')} "
              f"(CPU {ms('first_cpu')}; target: well under 200 ms), second record {ms('second')}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--strategy", default="durable_delta")
    ap.add_argument("--result-copies", type=int, default=3)
    ap.add_argument("--recorded", type=int, default=1000, help="requests of the recorded session (0: skip it)")
    ap.add_argument("--first-runs", type=int, default=5, help="fresh processes timing the first record")
    ap.add_argument("--only-first-record", action="store_true", help="skip the long strategy session")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp())
    if args.recorded:
        first_record(tmp, args.recorded, args.first_runs)
    if args.only_first_record:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    db = tmp / "session.duckdb"
    started = time.perf_counter()
    sid, cpu, tokens = build(tmp, args.requests, args.strategy, args.result_copies)
    elapsed = time.perf_counter() - started
    shutil.copy(db, tmp / f"at{args.requests}.duckdb")
    print(f"{args.strategy}: {args.requests:,} requests built in {elapsed:.1f} s; last request {tokens:,} est. tokens")

    def median(lo: int) -> float:
        return statistics.median(c for (start, j), c in cpu.items() if start == lo and lo <= j < lo + 100) * 1000

    starts = sorted({start for start, _ in cpu})
    base = median(starts[0])
    print("per-request CPU, median over 100 requests (the rounds run interleaved): " + ", ".join(
        f"requests {lo:,}-{lo + 99:,} = {median(lo):.1f} ms ({median(lo) / base:.2f}x)" for lo in starts)
        + " (target: <= 1.5x)")
    for n in (*[c for c in CHECKPOINTS if c < args.requests], args.requests):
        r = resume(tmp / f"at{n}.duckdb", sid)
        print(f"resume at {n:,} stored requests: open {r['open']:.2f} s, open + next step {r['total']:.2f} s "
              f"(CPU {r['cpu']:.2f} s); next usage read/write/uncached {r['usage']}"
              + (" (target <= 1 s)" if n == 1000 else ""))
    with pc.Lab(db, progress=False) as lab:
        unique = int(lab.sql("SELECT sum(bytes) AS b FROM blocks").b[0])
    size = store_bytes(db)
    print(f"store at {args.requests:,} requests: {size / 1e6:.2f} MB file vs {unique / 1e6:.2f} MB unique block bytes "
          f"(ratio {size / unique:.2f}x; target <= 1.5x)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    main()
