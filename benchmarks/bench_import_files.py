"""Fixed cost of a log file and of a session on import: 1,000 one-request files vs the same requests in one file.

Generates, in a temporary folder:

- Claude Code: 1,000 one-request transcripts (``_claude_code_history.write_session(..., requests=1)``), each its
  own session, in one project folder; and the same lines concatenated into one file (1,000 sessions, one file).
- proxy log (the recording proxy's ``exchanges`` format): 1,000 one-line files (each file is its own session);
  the same lines in one file split into 1,000 sessions (each line names its end user: ``metadata.user_id``), and
  the same lines in one file as one session.

Each import runs in a fresh child process into a new DuckDB file and is timed there (CPU: ``time.process_time``,
DuckDB's threads included; wall beside it). Printed:

- per-file overhead = (CPU of 1,000 files - CPU of the same sessions in one file) / 1,000;
- per-session overhead (proxy log) = (CPU of 1,000 sessions in one file - CPU of one session of the same
  requests) / 1,000;
- the whole cost per file, for scale.

Target (issue #23 item 1): <= 5 ms per file of fixed overhead above the per-request work. The machine is shared:
run it a few times. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_import_files.py [--files 1000] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _claude_code_history import write_session  # noqa: E402

CHILD = """
import json, sys, time
import promptcache_nb as pc
paths, db = json.loads(sys.argv[1]), sys.argv[2]
c, t = time.process_time(), time.perf_counter()
with pc.Lab(db, progress=False) as lab:
    res = lab.import_log(paths)
    n = len(lab.sessions())
print(json.dumps({"cpu": time.process_time() - c, "wall": time.perf_counter() - t, "requests": res.requests,
                  "sessions": n}))
"""


def claude_code(out: Path, n: int) -> tuple[Path, Path]:
    """``n`` one-request transcripts in ``out/many/<project>``, and the same lines in ``out/one.jsonl``."""
    rng = random.Random(11)
    project = out / "many" / "-home-dev-bench"
    project.mkdir(parents=True)
    start = datetime(2026, 9, 1, 9, 0, tzinfo=UTC)
    with (out / "cc-one.jsonl").open("w", encoding="utf-8") as one:
        for i in range(n):
            path = project / f"s{i:05d}.jsonl"
            write_session(path, project_dir="-home-dev-bench", rng=rng, requests=1, start=start + timedelta(minutes=i),
                          tool_result_lines=20)
            one.write(path.read_text(encoding="utf-8"))
    return out / "many", out / "cc-one.jsonl"


def proxy_logs(out: Path, n: int) -> tuple[Path, Path, Path]:
    """``n`` one-line proxy logs in ``out/proxy-many``; the same lines in one file as ``n`` sessions (each line
    names its user) and as one session (no user named)."""
    many = out / "proxy-many"
    many.mkdir()
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    system = [{"type": "text", "text": "You are a careful billing assistant. " * 40,
               "cache_control": {"type": "ephemeral"}}]
    with (out / "proxy-sessions.jsonl").open("w", encoding="utf-8") as sessions, \
            (out / "proxy-one.jsonl").open("w", encoding="utf-8") as one:
        for i in range(n):
            body = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": system,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": f"Question {i}: why?"}]}]}
            usage = {"input_tokens": 12, "cache_read_input_tokens": 0 if i == 0 else 420,
                     "cache_creation_input_tokens": 420 if i == 0 else 0, "output_tokens": 60}
            line = {"v": 1, "at": (t0 + timedelta(seconds=20 * i)).isoformat(), "method": "POST",
                    "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200,
                    "request": body, "response": None, "usage": usage, "request_id": f"req_{i:06d}",
                    "latency_ms": 800, "provider": "anthropic"}
            one.write(json.dumps(line) + "\n")
            (many / f"call-{i:05d}.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
            named = {**line, "request": {**body, "metadata": {"user_id": f"user-{i:05d}"}}}
            sessions.write(json.dumps(named) + "\n")
    return many, out / "proxy-sessions.jsonl", out / "proxy-one.jsonl"


def timed(paths: list[Path], db: Path, runs: int) -> dict[str, float]:
    """The median CPU and wall seconds of importing ``paths`` into a new store, each run in a fresh process."""
    got = []
    for k in range(runs):
        target = db.with_name(f"{db.stem}-{k}.duckdb")
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps([str(p) for p in paths]), str(target)],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            raise SystemExit(proc.stderr)
        got.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        target.unlink()
    return {"cpu": statistics.median(g["cpu"] for g in got), "wall": statistics.median(g["wall"] for g in got),
            "requests": got[0]["requests"], "sessions": got[0]["sessions"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    n = args.files
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        many, one = claude_code(out, n)
        a, b = timed([many], out / "cc-many", args.runs), timed([one], out / "cc-one", args.runs)
        print(f"Claude Code, {n} one-request files: {a['cpu']:.2f} s CPU ({a['wall']:.2f} s wall), "
              f"{a['requests']} requests, {a['sessions']} sessions; the same lines in one file: {b['cpu']:.2f} s "
              f"CPU ({b['wall']:.2f} s wall)")
        print(f"  per-file overhead: {(a['cpu'] - b['cpu']) / n * 1000:.1f} ms CPU (target <= 5 ms); whole cost "
              f"per file {a['cpu'] / n * 1000:.1f} ms CPU")
        pmany, psessions, pone = proxy_logs(out, n)
        a, b, c = (timed([pmany], out / "p-many", args.runs), timed([psessions], out / "p-sessions", args.runs),
                   timed([pone], out / "p-one", args.runs))
        print(f"proxy log, {n} one-line files: {a['cpu']:.2f} s CPU ({a['wall']:.2f} s wall), {a['sessions']} "
              f"sessions; one file of {b['sessions']} sessions: {b['cpu']:.2f} s CPU; one file, one session: "
              f"{c['cpu']:.2f} s CPU")
        print(f"  per-file overhead: {(a['cpu'] - b['cpu']) / n * 1000:.1f} ms CPU; per-session overhead: "
              f"{(b['cpu'] - c['cpu']) / n * 1000:.1f} ms CPU; file + session: {(a['cpu'] - c['cpu']) / n * 1000:.1f}"
              f" ms CPU (target <= 5 ms); whole cost per file {a['cpu'] / n * 1000:.1f} ms CPU")


if __name__ == "__main__":
    main()
