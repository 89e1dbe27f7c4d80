"""A heavy Claude Code user's history, generated: ``~/.claude/projects/<project>/<session>.jsonl`` shaped files.

Used by the fleet and import benchmarks (not shipped: the package's own example fleet is
``promptcache_nb.fleet.example_fleet``, built from the shipped example logs). Each session is a realistic
transcript as Claude Code 2.x writes it: a user prompt, then per request one ``assistant`` line per content block
(thinking, text, tool_use, each repeating ``message.id``, ``requestId`` and ``usage``) and a ``user`` line holding
the tool result, with the envelope fields every line repeats (``cwd``, ``sessionId``, ``version``,
``gitBranch``, ``uuid``/``parentUuid``, ``timestamp``). Usage grows as a real session's does: the cache read
covers the previous prompt, the write the new tail; an idle gap over 5 minutes now and then rebuilds it.

Defaults give the issue's heavy user: 20 projects x 10 sessions x ~145 requests, ~560 MB.

    .venv/bin/python benchmarks/_claude_code_history.py OUT_DIR [--projects 20] [--sessions 10] [--requests 145]
"""

from __future__ import annotations

import argparse
import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

WORDS = ("invoice proration ledger webhook retry settlement customer subscription dunning refund currency tax "
         "region audit export schema migration latency queue worker decimal rounding cents fixture pytest assert "
         "module import return class def self value total amount balance").split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _code(rng: random.Random, n_lines: int) -> str:
    return "\n".join(f"{i:5d}\t    {rng.choice(WORDS)}_{rng.randrange(99)} = {rng.choice(WORDS)}"
                     f"({rng.choice(WORDS)}, {rng.randrange(1000)})  # {_text(rng, 6)}" for i in range(n_lines))


def write_session(path: Path, *, project_dir: str, rng: random.Random, requests: int, start: datetime,
                  tool_result_lines: int = 160) -> int:
    """Write one session transcript; returns its request count."""
    sid = str(uuid.UUID(int=rng.getrandbits(128)))
    cwd = "/home/dev/" + project_dir.rsplit("-", 1)[-1]
    env = {"isSidechain": False, "userType": "external", "cwd": cwd, "sessionId": sid, "version": "2.0.14",
           "gitBranch": "main"}
    at = start
    parent: str | None = None
    prompt_tokens = 14_000  # Claude Code's system prompt + tools, which the transcript does not hold
    last_at = at

    def line(fh, **fields) -> None:  # noqa: ANN001
        nonlocal parent
        u = str(uuid.UUID(int=rng.getrandbits(128)))
        fh.write(json.dumps({"parentUuid": parent, **env, **fields, "uuid": u,
                             "timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z")}) + "\n")
        parent = u

    with path.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps({"type": "file-history-snapshot", "messageId": str(uuid.uuid4()),
                             "snapshot": {"messageId": "x", "trackedFileBackups": {}, "timestamp": at.isoformat()},
                             "isSnapshotUpdate": False}) + "\n")
        line(fh, type="user", message={"role": "user", "content": _text(rng, 40)})
        new_tokens = 60
        for i in range(requests):
            if prompt_tokens > 150_000:  # Claude Code compacts near the context window: the history restarts
                line(fh, type="system", subtype="compact_boundary", content="Conversation compacted",
                     level="info", compactMetadata={"trigger": "auto", "preTokens": prompt_tokens})
                summary = _text(rng, 400)
                line(fh, type="user", isCompactSummary=True, message={"role": "user", "content": summary})
                prompt_tokens, new_tokens = 14_000, len(summary) // 4
            gap = timedelta(seconds=rng.choice((3, 5, 8, 12, 20, 40)))
            if rng.random() < 0.02:
                gap = timedelta(minutes=rng.choice((6, 12, 45, 90)))
            at += gap
            expired = (at - last_at) > timedelta(minutes=5)
            read = 0 if i == 0 or expired else prompt_tokens
            write = new_tokens if read else prompt_tokens + new_tokens
            prompt_tokens += new_tokens
            last_at = at
            usage = {"input_tokens": rng.randrange(1, 8), "cache_creation_input_tokens": write,
                     "cache_read_input_tokens": read,
                     "cache_creation": {"ephemeral_5m_input_tokens": write, "ephemeral_1h_input_tokens": 0},
                     "output_tokens": rng.randrange(40, 900), "service_tier": "standard"}
            mid = "msg_01" + uuid.UUID(int=rng.getrandbits(128)).hex[:22]
            rid = "req_011C" + uuid.UUID(int=rng.getrandbits(128)).hex[:20]
            tool_id = "toolu_01" + uuid.UUID(int=rng.getrandbits(128)).hex[:22]
            blocks = [{"type": "thinking", "thinking": _text(rng, 60), "signature": "Ep" + "x" * 180},
                      {"type": "text", "text": _text(rng, 30)},
                      {"type": "tool_use", "id": tool_id, "name": rng.choice(("Read", "Bash", "Edit", "Grep")),
                       "input": {"file_path": f"{cwd}/src/{rng.choice(WORDS)}.py", "old_string": _code(rng, 12),
                                 "new_string": _code(rng, 12)}}]
            for block in blocks:
                at += timedelta(milliseconds=rng.randrange(200, 900))
                line(fh, type="assistant", requestId=rid, message={
                    "id": mid, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
                    "content": [block], "stop_reason": None, "stop_sequence": None, "usage": usage})
            at += timedelta(milliseconds=rng.randrange(100, 3000))
            result = _code(rng, tool_result_lines)
            line(fh, type="user", message={"role": "user", "content": [
                {"tool_use_id": tool_id, "type": "tool_result", "content": result}]},
                toolUseResult={"stdout": "", "stderr": "", "interrupted": False})
            # what the next request adds: this response and the tool result (about 4 characters a token)
            new_tokens = (len(result) + sum(len(json.dumps(b)) for b in blocks)) // 4
    return requests


def write_history(out: Path, *, projects: int = 20, sessions: int = 10, requests: int = 145, seed: int = 7,
                  tool_result_lines: int = 160) -> tuple[int, int]:
    """Write the folder; returns (files, requests)."""
    rng = random.Random(seed)
    start = datetime(2026, 9, 1, 9, 0, tzinfo=UTC)
    files = total = 0
    for p in range(projects):
        project_dir = f"-home-dev-service{p:02d}"
        (out / project_dir).mkdir(parents=True, exist_ok=True)
        for s in range(sessions):
            n = max(1, requests + rng.randrange(-20, 21))
            day = start + timedelta(days=(p * sessions + s) % 90, hours=rng.randrange(0, 8))
            path = out / project_dir / f"{uuid.UUID(int=rng.getrandbits(128))}.jsonl"
            total += write_session(path, project_dir=project_dir, rng=rng, requests=n, start=day,
                                   tool_result_lines=tool_result_lines)
            files += 1
    return files, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--projects", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--requests", type=int, default=145)
    args = ap.parse_args()
    files, reqs = write_history(args.out, projects=args.projects, sessions=args.sessions, requests=args.requests)
    size = sum(f.stat().st_size for f in args.out.rglob("*.jsonl"))
    print(f"{files} files, {reqs:,} requests, {size / 1e6:.0f} MB in {args.out}")


if __name__ == "__main__":
    main()
