"""Import of one long log per coding agent (#28's readers): reader time and import time against the floor.

For ``--requests`` calls of one conversation (tool loops: each answer a tool call, its result, the next call; a
user turn every 4 requests; history growing past 150k estimated tokens), each agent's own format:

* ``pi``: a pi v3 session (the reader rebuilds every request's context from the ``parentId`` tree);
* ``openclaw-trace``: the same conversation as an OpenClaw ``cache-trace.jsonl`` (each call's ``stream:context``
  carries the whole history, as OpenClaw writes it);
* ``gemini-cli``: a Gemini CLI JSONL mutation log (each answer appended three times as the client fills it in:
  without tokens, with tokens, with its tool call and result; ``$set`` after each) and, beside it, the telemetry
  outfile with ``logPrompts`` (pretty-printed records; every ``api_request`` holds the whole ``contents``);
* ``opencode``: an OpenCode SQLite database (``message`` / ``part`` rows of JSON; one ``step-finish`` per call);
* ``cline``: a Cline task (``ui_messages.json`` with one ``api_req_started`` per call, and the
  ``api_conversation_history.json`` the bodies come from).

Measures, in one process: the ``json.loads`` floor of the same content (every line, every row's JSON, every
whole-file document, the telemetry's records), the reader alone (``list(reader.read(path))``) and
``lab.import_log`` into a fresh DuckDB file (wall and CPU). Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_import_agents.py [--requests 500] [--agents pi,gemini-cli,...]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import promptcache_nb as pc
from promptcache_nb.readers import detect, gemini_cli

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


def iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def loop(n: int) -> list[tuple[int, datetime, str, str, dict[str, int]]]:
    """The conversation every format logs: (i, request start, what was sent last, the result text, usage)."""
    t0 = datetime(2026, 6, 2, 9, 0, tzinfo=UTC)
    out = []
    total = 9000
    for i in range(n):
        new = 80 + 200 * (i % 4 != 0)
        out.append((i, t0 + timedelta(seconds=20 * i), text(i, 80) if i % 4 == 0 else "", text(i, 250),
                    {"input": 3, "output": 90, "read": total if i else 0, "write": new if i else total + new}))
        total += new + 90
    return out


def generate_gemini(folder: Path, n: int) -> tuple[Path, Path]:
    sid = "3f0c6a41-8a7e-4c55-9b0e-2d61f4a0c9aa"
    chats = folder / "gemini" / "chats"
    chats.mkdir(parents=True)
    lines: list[dict] = [{"sessionId": sid, "projectHash": "9d" * 32, "startTime": "2026-06-02T09:00:00.000Z",
                          "lastUpdated": "2026-06-02T09:00:00.000Z", "kind": "main"}]
    contents: list[dict] = [{"role": "user", "parts": [{"text": "This is the Gemini CLI. " + text(0, 300)}]},
                            {"role": "model", "parts": [{"text": "Got it. Thanks for the context!"}]}]
    telemetry: list[dict] = []
    for i, at, prompt, result, u in loop(n):
        if prompt:
            lines.append({"id": f"u-{i}", "timestamp": iso(at), "type": "user", "content": [{"text": prompt}]})
            contents.append({"role": "user", "parts": [{"text": prompt}]})
        end = at + timedelta(seconds=3)
        telemetry.append({"attributes": {"session.id": sid, "event.name": "gemini_cli.api_request",
                                         "event.timestamp": iso(at), "model": "gemini-2.5-pro",
                                         "prompt_id": f"{sid}########{i // 4}",
                                         "request_text": json.dumps(contents)}, "_body": "API request."})
        inclusive = u["input"] + u["read"] + u["write"]
        tokens = {"input": inclusive, "output": u["output"], "cached": u["read"], "thoughts": 0, "tool": 0,
                  "total": inclusive + u["output"]}
        telemetry.append({"attributes": {"session.id": sid, "event.name": "gemini_cli.api_response",
                                         "event.timestamp": iso(end), "model": "gemini-2.5-pro",
                                         "prompt_id": f"{sid}########{i // 4}", "input_token_count": inclusive,
                                         "cached_content_token_count": u["read"],
                                         "output_token_count": u["output"]}, "_body": "API response."})
        call = {"id": f"read_file-{i}", "name": "read_file", "args": {"absolute_path": f"/p/src/{i}.py"}}
        msg = {"id": f"g-{i}", "timestamp": iso(end), "type": "gemini", "content": "", "thoughts": [],
               "tokens": None, "model": "gemini-2.5-pro"}
        response = {"functionResponse": {"id": call["id"], "name": "read_file", "response": {"output": result}}}
        lines += [msg, {**msg, "tokens": tokens},
                  {**msg, "tokens": tokens, "toolCalls": [{**call, "status": "success", "result": [response]}]},
                  {"$set": {"lastUpdated": iso(end)}}]
        contents += [{"role": "model", "parts": [{"functionCall": call}]}, {"role": "user", "parts": [response]}]
    chat = chats / "session-2026-06-02T09-00-3f0c6a41.jsonl"
    chat.write_text("".join(json.dumps(x) + "\n" for x in lines))
    log = folder / "gemini" / "telemetry.log"
    log.write_text("".join(json.dumps(x, indent=2) + "\n" for x in telemetry))
    return chat, log


def generate_opencode(folder: Path, n: int) -> Path:
    db = folder / "opencode.db"
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE session (id text PRIMARY KEY, project_id text, parent_id text, slug text, directory text, "
        "title text, version text, time_created integer, time_updated integer, time_compacting integer);"
        "CREATE TABLE message (id text PRIMARY KEY, session_id text, time_created integer, time_updated integer, "
        "data text);"
        "CREATE TABLE part (id text PRIMARY KEY, message_id text, session_id text, time_created integer, "
        "time_updated integer, data text);")
    sid = "ses_e87cfc0c0001Ky9Pf34qY6Nb3w"
    con.execute("INSERT INTO session VALUES (?, 'p', NULL, 's', '/p', 't', '1.2.4', 0, 0, NULL)", (sid,))
    rows_m: list[tuple] = []
    rows_p: list[tuple] = []
    assistant = user = ""
    for i, at, prompt, result, u in loop(n):
        ms = int(at.timestamp() * 1000)
        if prompt or not assistant:
            user = f"msg_{ms:012x}0001u{i:08d}"
            rows_m.append((user, sid, ms, ms, json.dumps({"role": "user", "time": {"created": ms}, "agent": "build",
                                                          "model": {"providerID": "anthropic",
                                                                    "modelID": "claude-sonnet-4-5"}})))
            rows_p.append((f"prt_{ms:012x}0001u{i:08d}", user, sid, ms, ms,
                           json.dumps({"type": "text", "text": prompt or text(i, 80)})))
            assistant = f"msg_{ms:012x}0002a{i:08d}"
            rows_m.append((assistant, sid, ms, ms, json.dumps({
                "role": "assistant", "time": {"created": ms, "completed": ms + 3000}, "parentID": user,
                "modelID": "claude-sonnet-4-5", "providerID": "anthropic", "mode": "build", "agent": "build",
                "path": {"cwd": "/p", "root": "/p"}, "cost": 0.01, "tokens": {"input": 3, "output": 90,
                                                                              "reasoning": 0,
                                                                              "cache": {"read": 0, "write": 0}}})))
        step = [{"type": "step-start", "snapshot": "4be1c2d0"},
                {"type": "tool", "callID": f"toolu_{i}", "tool": "read", "state": {
                    "status": "completed", "input": {"filePath": f"/p/src/{i}.py"}, "output": result,
                    "title": f"src/{i}.py", "metadata": {}, "time": {"start": ms + 2000, "end": ms + 2100}}},
                {"type": "step-finish", "reason": "tool-calls", "snapshot": "4be1c2d0", "cost": 0.01,
                 "tokens": {"input": u["input"], "output": u["output"], "reasoning": 0,
                            "cache": {"read": u["read"], "write": u["write"]}}}]
        for k, data in enumerate(step):
            rows_p.append((f"prt_{ms:012x}{k + 2:04d}a{i:08d}", assistant, sid, ms + 1000 * k, ms + 1000 * k,
                           json.dumps(data)))
    con.executemany("INSERT INTO message VALUES (?, ?, ?, ?, ?)", rows_m)
    con.executemany("INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)", rows_p)
    con.commit()
    con.close()
    return db


def generate_cline(folder: Path, n: int) -> Path:
    task = folder / "saoudrizwan.claude-dev" / "tasks" / "1780580012345"
    task.mkdir(parents=True)
    ui: list[dict] = [{"ts": 1780580012345, "type": "say", "say": "task", "text": text(0, 80)}]
    history: list[dict] = []
    for i, at, prompt, result, u in loop(n):
        ms = int(at.timestamp() * 1000)
        if prompt or not history:
            history.append({"role": "user", "content": [{"type": "text", "text": prompt or text(i, 80)}]})
        info = {"request": "…", "tokensIn": u["input"], "tokensOut": u["output"], "cacheWrites": u["write"],
                "cacheReads": u["read"], "cost": 0.01}
        ui.append({"ts": ms, "type": "say", "say": "api_req_started", "text": json.dumps(info),
                   "conversationHistoryIndex": len(history) - 2,
                   "modelInfo": {"providerId": "anthropic", "modelId": "claude-sonnet-4-5", "mode": "act"}})
        ui.append({"ts": ms + 2000, "type": "say", "say": "tool", "text": json.dumps({"tool": "readFile",
                                                                                    "path": f"src/{i}.py"})})
        history += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "read_file",
                                                       "input": {"path": f"src/{i}.py"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                  "content": result}]}]
    (task / "api_conversation_history.json").write_text(json.dumps(history))
    ui_file = task / "ui_messages.json"
    ui_file.write_text(json.dumps(ui))
    return ui_file


def floor_lines(*paths: Path) -> Callable[[], None]:
    def run() -> None:
        for path in paths:
            for line in path.read_bytes().splitlines():
                json.loads(line)
    return run


def floor_documents(*paths: Path) -> Callable[[], None]:
    def run() -> None:
        for path in paths:
            json.loads(path.read_bytes())
    return run


def floor_records(path: Path) -> Callable[[], None]:
    """Pretty-printed records back to back (Gemini CLI's telemetry outfile)."""
    def run() -> None:
        text_ = path.read_text()
        decoder, i = json.JSONDecoder(), 0
        while i < len(text_):
            _, i = decoder.raw_decode(text_, i)
            while i < len(text_) and text_[i].isspace():
                i += 1
    return run


def floor_rows(db: Path) -> Callable[[], None]:
    def run() -> None:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        for (data,) in con.execute("SELECT data FROM message UNION ALL SELECT data FROM part"):
            json.loads(data)
        con.close()
    return run


def measure(name: str, path: Path, floors: list[Callable[[], None]], folder: Path, size: int) -> None:
    t = time.process_time()
    for f in floors:
        f()
    floor = time.process_time() - t
    reader = detect(path)
    # the Gemini reader keeps the last telemetry file it parsed: each measurement starts without it
    gemini_cli._read_telemetry.cache_clear()
    t = time.process_time()
    n = sum(1 for r in reader.read(path) if hasattr(r, "usage"))
    read = time.process_time() - t
    gemini_cli._read_telemetry.cache_clear()
    lab = pc.Lab(folder / f"{name}.duckdb")
    t, c = time.perf_counter(), time.process_time()
    res = lab.import_log(path, progress=False)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    lab.close()
    print(f"{name}: {size / 1e6:.1f} MB, {n} requests ({res.requests} stored): json.loads floor {floor:.2f} s CPU, "
          f"reader {read:.2f} s CPU ({read / max(floor, 1e-9):.1f}x), import {wall:.2f} s wall / {cpu:.2f} s CPU "
          f"({cpu / max(floor, 1e-9):.1f}x the floor)", flush=True)


AGENTS = ("pi", "openclaw-trace", "gemini-cli", "opencode", "cline")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--agents", default=",".join(AGENTS), help=f"comma-separated, of {', '.join(AGENTS)}")
    args = ap.parse_args()
    chosen = [a for a in args.agents.split(",") if a]
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        n = args.requests
        if "pi" in chosen or "openclaw-trace" in chosen:
            pi_file, trace_file = generate(folder, n)
            if "pi" in chosen:
                measure("pi", pi_file, [floor_lines(pi_file)], folder, pi_file.stat().st_size)
            if "openclaw-trace" in chosen:
                measure("openclaw-trace", trace_file, [floor_lines(trace_file)], folder, trace_file.stat().st_size)
        if "gemini-cli" in chosen:
            chat, log = generate_gemini(folder, n)
            measure("gemini-cli (chat + telemetry.log)", chat, [floor_lines(chat), floor_records(log)], folder,
                    chat.stat().st_size + log.stat().st_size)
        if "opencode" in chosen:
            db = generate_opencode(folder, n)
            measure("opencode (SQLite)", db, [floor_rows(db)], folder, db.stat().st_size)
        if "cline" in chosen:
            ui = generate_cline(folder, n)
            history = ui.with_name("api_conversation_history.json")
            measure("cline (ui_messages + history)", ui, [floor_documents(ui, history)], folder,
                    ui.stat().st_size + history.stat().st_size)


if __name__ == "__main__":
    main()
