"""Readers for Gemini CLI, OpenCode and Cline / Roo Code logs (#28): every era, the traps of
../shared/reference/agent_log_formats.md §5–7, and ``promptcache-nb import --agent``."""

from __future__ import annotations

import json
import shutil
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import promptcache_nb as pc
from promptcache_nb.cli import main
from promptcache_nb.errors import ImportFormatError
from promptcache_nb.readers import ImportedRequest, SkippedLine, detect, gemini_cli
from promptcache_nb.readers._history import HistoryDecoder
from promptcache_nb.readers._locations import agent_log_files

LOGS = pc.data_path("logs")
GEMINI = LOGS / "gemini_cli" / "chats"
GEMINI_MAIN = GEMINI / "session-2026-06-02T09-12-3f0c6a41.jsonl"
GEMINI_SID = "3f0c6a41-8a7e-4c55-9b0e-2d61f4a0c9aa"
CLINE = LOGS / "cline"
CLINE_TASK = CLINE / "saoudrizwan.claude-dev" / "tasks" / "1780580012345"
ROO_TASK = CLINE / "rooveterinaryinc.roo-cline" / "tasks" / "6f0c2b1e-9d4a-4c3e-8b7f-1a2d3c4e5f60"
OPENCODE_SQL = Path(__file__).parent / "fixtures" / "opencode" / "opencode_db.sql"


def read(path: Path) -> tuple[list[ImportedRequest], list[SkippedLine]]:
    reader = detect(path)
    records = list(reader.read(path))
    return ([r for r in records if isinstance(r, ImportedRequest)], [r for r in records if isinstance(r, SkippedLine)])


def opencode_db(tmp_path: Path) -> Path:
    """OpenCode's database built from the SQL fixture (a real SQLite file, as OpenCode writes it)."""
    db = tmp_path / "opencode.db"
    con = sqlite3.connect(db)
    con.executescript(OPENCODE_SQL.read_text())
    con.commit()
    con.close()
    return db


# --- Gemini CLI ----------------------------------------------------------------------------------------------


def test_gemini_jsonl_is_replayed_last_record_wins_rewound_calls_count(tmp_path):
    reqs, skipped = read(_copy_chat(tmp_path, telemetry=None))  # the chat alone (no telemetry.log beside it)
    assert detect(GEMINI_MAIN).name == "gemini-cli"
    ids = [r.dedupe_key.rsplit("/", 1)[1] for r in reqs]
    # g-06 was rewound away (the $rewindTo after it) but it was billed: it stays a request
    assert ids == ["g-01", "g-02", "g-03", "g-04", "g-05", "g-06", "g-07", "g-08", "g-09"]
    assert {r.session_key for r in reqs} == {GEMINI_SID} and all(r.provider == "gemini" for r in reqs)
    by = dict(zip(ids, reqs, strict=True))
    # the tokens arrive on a later record of the same id: the last record wins
    u = by["g-02"].usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (10237 - 8180, 8180, 0)
    assert u.total_input_tokens == 10237  # promptTokenCount is inclusive of the cached tokens
    assert (u.output_tokens, u.reasoning_tokens) == (412 + 530, 530)  # thinking is billed as output
    # the request after the rewind does not send the rewound turn; after /compress it starts from the summary
    assert by["g-07"].events == ("rewind",) and len(by["g-07"].body["messages"]) == len(by["g-06"].body["messages"])
    assert by["g-07"].body["messages"][-1]["content"][0]["text"].startswith("Run the test suite")
    assert by["g-09"].events == ("compaction",)
    first = by["g-09"].body["messages"][0]["content"][0]["text"]
    assert first.startswith("<state_snapshot>") and len(by["g-09"].body["messages"]) == 3
    # the client's made-up reply inside the checkpoint is neither a request nor an unreadable line
    assert skipped == []
    # a tool call and its result: an assistant tool_calls entry, then its tool message
    msgs = by["g-02"].body["messages"]
    assert msgs[1]["tool_calls"][0]["id"] == msgs[2]["tool_call_id"] == "read_file-1780391530-1"
    assert by["g-04"].at - by["g-03"].at > timedelta(hours=1, minutes=29)


def test_gemini_tool_results_logged_twice_are_sent_once(tmp_path):
    """Newer clients also write a tool's response as a synthetic user message: one tool message, not two."""
    call = {"id": "c1", "name": "ls", "args": {}, "status": "success", "timestamp": "2026-06-01T10:00:01.000Z",
            "result": [{"functionResponse": {"id": "c1", "name": "ls", "response": {"output": "a.py"}}}]}
    lines = [{"sessionId": "s-1", "projectHash": "h", "startTime": "2026-06-01T10:00:00.000Z"},
             {"id": "u1", "timestamp": "2026-06-01T10:00:00.000Z", "type": "user", "content": [{"text": "list"}]},
             {"id": "g1", "timestamp": "2026-06-01T10:00:01.000Z", "type": "gemini", "content": "", "model": "gemini-2.5-pro",
              "tokens": {"input": 3000, "output": 5, "cached": 0, "total": 3005}, "toolCalls": [call]},
             {"id": "u2", "timestamp": "2026-06-01T10:00:02.000Z", "type": "user",
              "content": [{"functionResponse": {"id": "c1", "name": "ls", "response": {"output": "a.py"}}}]},
             {"id": "g2", "timestamp": "2026-06-01T10:00:03.000Z", "type": "gemini", "content": "a.py",
              "model": "gemini-2.5-pro", "tokens": {"input": 3020, "output": 3, "cached": 2048, "total": 3023}}]
    path = tmp_path / "session-2026-06-01T10-00-s1.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    reqs, _ = read(path)
    roles = [m["role"] for m in reqs[1].body["messages"]]
    assert roles == ["user", "assistant", "tool"]


def test_gemini_subagent_and_legacy_json():
    sub = next((GEMINI / GEMINI_SID).glob("*.jsonl"))
    reqs, _ = read(sub)
    assert [(r.session_kind, r.parent_key) for r in reqs] == [("subagent", GEMINI_SID)] * 2
    legacy = GEMINI / "session-2026-03-10T14-05-8b21d0c4.json"
    reqs, skipped = read(legacy)
    assert detect(legacy).name == "gemini-cli"
    assert len(reqs) == 3 and reqs[0].source_ref.endswith("#messages[1]")
    # the legacy recorder lost one call's usage: listed, not invented
    assert len(skipped) == 1 and "no token usage" in skipped[0].reason


def test_gemini_resumed_legacy_chat_converted_beside_it_is_stored_once(tmp_path):
    """Resuming a legacy .json chat writes a .jsonl copy beside it (same session and message ids)."""
    legacy = GEMINI / "session-2026-03-10T14-05-8b21d0c4.json"
    doc = json.loads(legacy.read_text())
    meta = {k: doc[k] for k in ("sessionId", "projectHash", "startTime", "lastUpdated")}
    shutil.copy(legacy, tmp_path / legacy.name)
    (tmp_path / (legacy.name + "l")).write_text("".join(json.dumps(x) + "\n" for x in [meta, *doc["messages"]]))
    with pc.Lab(tmp_path / "g.duckdb", progress=False) as lab:
        res = lab.import_log(tmp_path)
        assert len(res.sessions) == 1 and res.requests == 3


def test_gemini_bad_counts_cost_one_line(tmp_path):
    base = {"timestamp": "2026-06-01T10:00:01.000Z", "type": "gemini", "content": "x", "model": "gemini-2.5-pro"}
    lines = [{"sessionId": "s-2", "projectHash": "h"},
             {**base, "id": "a", "tokens": {"input": 100, "output": 1, "cached": 500, "total": 101}},
             {**base, "id": "b", "tokens": {"input": "lots", "output": 1, "cached": 0, "total": 1}},
             {**base, "id": "c", "tokens": {"input": 2000, "output": 1, "cached": 1024, "total": 2001}},
             {"what": "else"}]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    reqs, skipped = read(path)
    assert [r.dedupe_key for r in reqs] == ["s-2/c"]
    reasons = sorted((s.line, s.reason) for s in skipped)
    assert reasons[0] == (2, "tokens.cached (500) exceeds tokens.input (100)")
    assert reasons[1][0] == 3 and reasons[1][1].startswith("tokens.input: must be a non-negative int")
    assert reasons[2][0] == 5 and "not a Gemini CLI chat record" in reasons[2][1]


def test_gemini_import_is_exact_and_provider_is_gemini(tmp_path):
    with pc.Lab(tmp_path / "g.duckdb", progress=False) as lab:
        first = lab.import_log(LOGS / "gemini_cli")
        again = lab.import_log(LOGS / "gemini_cli")
        assert first.requests == 14 and again.requests == 0 and again.already_stored == 14
        main_session = next(s for s in first.sessions if s.parent_id is None and len(s.turns()) == 9)
        df = main_session.turns()
        assert df.cache_read_input_tokens.tolist()[:3] == [0, 8180, 10111]
        assert df.cache_creation_input_tokens.sum() == 0  # implicit caching bills no write


# --- OpenCode -------------------------------------------------------------------------------------------------


def test_opencode_database_step_finish_parts_are_the_requests(tmp_path):
    db = opencode_db(tmp_path)
    before = db.read_bytes()
    assert detect(db).name == "opencode"
    reqs, skipped = read(db)
    assert skipped == [] and len(reqs) == 11
    assert db.read_bytes() == before and not list(tmp_path.glob("opencode.db-*"))  # opened read-only
    main_reqs = [r for r in reqs if r.parent_key is None]
    sub = [r for r in reqs if r.parent_key is not None]
    assert len(main_reqs) == 9 and {r.session_kind for r in sub} == {"subagent"}
    assert {r.parent_key for r in sub} == {main_reqs[0].session_key}
    # per-step usage, never the message totals (which only hold the last step)
    assert [r.usage.cache_creation_input_tokens for r in main_reqs[:3]] == [14210, 2301, 880]
    assert [r.usage.cache_read_input_tokens for r in main_reqs[:3]] == [0, 14210, 16511]
    # the step-start row's time is the request start
    con = sqlite3.connect(db)
    starts = [t for (t,) in con.execute("select time_created from part where json_extract(data, '$.type') = "
                                        "'step-start' and session_id = ? order by id", (main_reqs[0].session_key,))]
    con.close()
    assert [int(r.at.timestamp() * 1000) for r in main_reqs] == starts
    # the summary call is a request; the next one sends the history from the compaction on
    assert main_reqs[7].events == ("compaction",) and len(main_reqs[7].body["messages"]) == 3
    assert len(main_reqs[6].body["messages"]) > 10
    tool_use = main_reqs[1].body["messages"][1]["content"][1]
    assert tool_use["type"] == "tool_use" and main_reqs[1].body["messages"][2]["content"][0]["type"] == "tool_result"


def test_opencode_json_tree_and_export_read_like_the_database(tmp_path):
    db_reqs, _ = read(opencode_db(tmp_path))
    tree = sorted((LOGS / "opencode" / "storage" / "session").glob("*/*.json"))
    tree_reqs = [r for f in tree for r in read(f)[0]]
    key = lambda r: (r.dedupe_key, r.at, r.usage, r.events, json.dumps(r.body, sort_keys=True))  # noqa: E731
    assert sorted(map(key, tree_reqs)) == sorted(map(key, db_reqs))  # times decoded from the ascending part ids
    # a part file read alone points at its session file; with the session file there, it is read through it
    part = next((LOGS / "opencode" / "storage" / "part").glob("*/*.json"))
    assert read(part) == ([], [])
    copy = tmp_path / "storage" / "part" / part.parent.name
    copy.mkdir(parents=True)
    shutil.copy(part, copy / part.name)
    reqs, skipped = read(copy / part.name)
    assert reqs == [] and "which is missing" in skipped[0].reason
    # `opencode export` output
    session = json.loads(tree[0].read_text())
    messages = []
    for mf in sorted((LOGS / "opencode" / "storage" / "message" / session["id"]).glob("*.json")):
        info = json.loads(mf.read_text())
        parts = [json.loads(p.read_text()) for p in sorted((LOGS / "opencode" / "storage" / "part" / info["id"]
                                                            ).glob("*.json"))]
        messages.append({"info": info, "parts": parts})
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"info": session, "messages": messages}, indent=2))
    assert sorted(map(key, read(export)[0])) == sorted(map(key, read(tree[0])[0]))


def test_opencode_reasoning_counted_apart_is_added_to_output(tmp_path):
    info = {"id": "ses_e8aa00000001abcdefghijklmn", "time": {"created": 1780395000000}}
    def step(total: int | None) -> dict:
        tokens = {"input": 10, "output": 100, "reasoning": 40, "cache": {"read": 1000, "write": 0}}
        if total is not None:
            tokens["total"] = total
        return {"id": "prt_e8aa0000a001x", "type": "step-finish", "tokens": tokens}
    out = []
    for total in (1150, 1110, None):  # newer builds: apart; older: output holds it; unknown: as logged
        msg = {"info": {"id": "msg_e8aa00009001x", "role": "assistant", "modelID": "claude-sonnet-4-5",
                        "providerID": "anthropic", "time": {"created": 1780395001000}}, "parts": [step(total)]}
        path = tmp_path / f"export-{total}.json"
        path.write_text(json.dumps({"info": info, "messages": [msg]}))
        out.append(read(path)[0][0].usage.output_tokens)
    assert out == [140, 100, 100]


# --- Cline and Roo Code ---------------------------------------------------------------------------------------


def test_cline_classic_task_usage_bodies_and_skips():
    ui = CLINE_TASK / "ui_messages.json"
    assert detect(ui).name == "cline"
    reqs, skipped = read(ui)
    assert len(reqs) == 6 and {r.session_key for r in reqs} == {"1780580012345"}
    # Anthropic provider: tokensIn is already the uncached input
    assert [(r.usage.input_tokens, r.usage.cache_read_input_tokens) for r in reqs[:2]] == [(4, 0), (3, 13120)]
    assert reqs[0].usage.notes  # a write without its 5m/1h split says so
    reasons = " | ".join(s.reason for s in skipped)
    assert "without usage (529 Overloaded)" in reasons and "subagent_usage" in reasons
    assert sum(r.usage.total_input_tokens or 0 for r in reqs) < 100_000  # the 48k aggregate was not added
    # bodies from api_conversation_history.json; the truncated request leaves out messages 2..7
    assert len(reqs[3].body["messages"]) == 7 and reqs[3].body["messages"][-1]["role"] == "user"
    last = reqs[5].body["messages"]
    assert len(last) == 5 and "Add pagination" in last[0]["content"][0]["text"]
    assert reqs[5].at - reqs[3].at > timedelta(minutes=12)


def test_roo_inclusive_tokens_in_and_condense_event():
    reqs, skipped = read(ROO_TASK / "ui_messages.json")
    assert [r.usage.input_tokens for r in reqs] == [6, 8, 13, 6]  # tokensIn − cacheReads − cacheWrites
    assert reqs[1].usage.total_input_tokens == 13010
    assert reqs[3].events == ("compaction",) and "condense_context" in skipped[0].reason
    assert {r.provider for r in reqs} == {"anthropic"}  # from apiProtocol: Roo logs no model id


def _task(tmp_path: Path, name: str, reqs: list[dict], **extra) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    ui = [{"ts": 1770000000000 + i * 1000, "type": "say", "say": "api_req_started", "text": json.dumps(r), **extra}
          for i, r in enumerate(reqs)]
    (folder / "ui_messages.json").write_text(json.dumps(ui))
    return folder / "ui_messages.json"


def test_cline_tokens_in_meaning_depends_on_the_writer(tmp_path):
    # Roo before 2025-10-31, Anthropic protocol: tokensIn below the cache figures, so it is the uncached input
    old = _task(tmp_path, "1769999999001", [{"apiProtocol": "anthropic", "tokensIn": 5, "tokensOut": 9,
                                             "cacheWrites": 900, "cacheReads": 12000}])
    assert read(old)[0][0].usage.input_tokens == 5
    # Cline through an OpenAI-compatible provider: prompt_tokens, cached included
    openai = _task(tmp_path, "1769999999002", [{"tokensIn": 5000, "tokensOut": 9, "cacheWrites": 0,
                                                "cacheReads": 4096}],
                   modelInfo={"providerId": "openai", "modelId": "gpt-5", "mode": "act"})
    u = read(openai)[0][0].usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.total_input_tokens) == (904, 4096, 5000)
    # a file read as inclusive whose count is below its cache figures: that request is skipped, by name
    bad = _task(tmp_path, "1769999999003", [{"tokensIn": 10, "tokensOut": 1, "cacheReads": 50, "cacheWrites": 0}],
                modelInfo={"providerId": "openai", "modelId": "gpt-5", "mode": "act"})
    reqs, skipped = read(bad)
    assert reqs == [] and "tokensIn (10) is below cacheReads + cacheWrites (50)" in skipped[0].reason


def test_cline_sdk_sessions_and_sub_agents():
    folder = CLINE / "sessions" / "sess_01JX4M6S2R8E"
    reqs, _ = read(folder / "sess_01JX4M6S2R8E.messages.json")
    assert [r.usage.input_tokens for r in reqs] == [6, 6]  # inputTokens includes cache reads and writes
    assert reqs[1].usage.cache_read_input_tokens == 12402 and reqs[1].request_id == "msg_01SDKb"
    sub, _ = read(folder / "tester-01.messages.json")
    assert (sub[0].session_key, sub[0].parent_key, sub[0].session_kind) == (
        "sess_01JX4M6S2R8E/tester-01", "sess_01JX4M6S2R8E", "subagent")


def test_cline_companion_files_are_read_through_ui_messages(tmp_path):
    assert read(CLINE_TASK / "api_conversation_history.json") == ([], [])
    alone = tmp_path / "1780000000000"
    alone.mkdir()
    shutil.copy(CLINE_TASK / "api_conversation_history.json", alone)
    reqs, skipped = read(alone / "api_conversation_history.json")
    assert reqs == [] and "ui_messages.json beside it, which is missing" in skipped[0].reason


def test_cline_import_walk_reports_no_companion_file(tmp_path):
    with pc.Lab(tmp_path / "c.duckdb", progress=False) as lab:
        res = lab.import_log(CLINE)
        assert res.requests == 13
        assert all("ui_messages" in f or "sessions" in f for f in res.skipped.file)
        assert lab.import_log(CLINE).requests == 0


# --- promptcache-nb import --agent ----------------------------------------------------------------------------


def test_import_agent_reads_the_usual_location(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    chats = home / ".gemini" / "tmp" / "shop" / "chats"
    shutil.copytree(GEMINI, chats)
    monkeypatch.setenv("HOME", str(home))
    files = agent_log_files("gemini-cli", home=home, env={})
    assert len(files) == 3
    assert main(["import", "--db", str(tmp_path / "a.duckdb"), "--agent", "gemini-cli", "--quiet"]) == 0
    assert "14 new requests" in capsys.readouterr().out
    data = home / ".local" / "share" / "opencode"
    data.mkdir(parents=True)
    shutil.copy(opencode_db(tmp_path), data / "opencode.db")
    assert agent_log_files("opencode", home=home, env={}) == [data / "opencode.db"]
    assert agent_log_files("opencode", home=home, env={"OPENCODE_DB": str(tmp_path / "opencode.db")}) == [
        tmp_path / "opencode.db"]


def test_import_agent_without_logs_is_one_line_naming_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    assert main(["import", "--db", str(tmp_path / "a.duckdb"), "--agent", "codex", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"looked in {tmp_path}/.codex/sessions/**/*.jsonl" in err
    with pytest.raises(ImportFormatError, match="cline: no logs found; looked in .*saoudrizwan.claude-dev"):
        agent_log_files("cline", home=tmp_path, env={})
    assert not (tmp_path / "a.duckdb").exists()


# --- Gemini CLI telemetry outfile ------------------------------------------------------------------------------
TELEMETRY = LOGS / "gemini_cli" / "telemetry.log"


def _copy_chat(tmp_path: Path, *, telemetry: str | None) -> Path:
    chats = tmp_path / "gemini" / "chats"
    chats.mkdir(parents=True)
    chat = Path(shutil.copy(GEMINI_MAIN, chats / GEMINI_MAIN.name))
    if telemetry is not None:
        (tmp_path / "gemini" / "telemetry.log").write_text(telemetry)
    return chat


def test_gemini_telemetry_request_text_gives_the_bodies_as_sent(tmp_path):
    with_text, _ = read(GEMINI_MAIN)  # the shipped telemetry.log sits beside the chats folder
    chat_only, _ = read(_copy_chat(tmp_path, telemetry=None))
    assert len(with_text) == len(chat_only) == 9
    for sent, logged in zip(with_text, chat_only, strict=True):
        system, env = sent.body["messages"][:2]
        # the system instruction, from the operation.details record beside the response (never in the chat file)
        assert system["role"] == "system" and system["content"].startswith("You are an interactive CLI agent")
        assert "--- Context from: GEMINI.md ---" in system["content"]
        assert env["content"][0]["text"].startswith("This is the Gemini CLI. We are setting up the context")
        assert sent.usage == logged.usage and sent.dedupe_key == logged.dedupe_key and sent.partial  # no tools
        assert logged.body["messages"][0]["role"] == "user"  # the chat alone has no system instruction
    # before the /compress checkpoint the chat's own history follows the environment turn exactly
    for sent, logged in zip(with_text[:8], chat_only[:8], strict=True):
        assert sent.body["messages"][3:] == logged.body["messages"]
    # g-04 was retried after a 429: the failed attempt's request is answered by its api_error, so g-05 (same
    # prompt) gets its own request text, with g-04's call and result in it
    g05 = with_text[4].body["messages"]
    assert any(m.get("tool_calls", [{}])[0].get("function", {}).get("name") == "write_file" for m in g05
               if m["role"] == "assistant" and m.get("tool_calls"))


def _telemetry_records() -> list[dict]:
    text, decoder, out, i = TELEMETRY.read_text(), json.JSONDecoder(), [], 0
    while i < len(text):
        obj, i = decoder.raw_decode(text, i)
        out.append(obj)
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def _responses(records: list[dict]) -> list[dict]:
    return [r["attributes"] for r in records if r["attributes"]["event.name"] == "gemini_cli.api_response"]


def _dump(records: list[dict]) -> str:
    return "".join(json.dumps(r, indent=2) + "\n" for r in records)


def _sent_with_telemetry(reqs: list[ImportedRequest]) -> list[str]:
    return [r.dedupe_key.rsplit("/", 1)[1] for r in reqs
            if any(isinstance(m["content"], list) and m["content"][0]["text"].startswith("This is the Gemini CLI")
                   for m in r.body["messages"][:2])]


def _details(records: list[dict]) -> list[dict]:
    """The operation.details records written beside responses (they carry the usage)."""
    return [r["attributes"] for r in records if r["attributes"]["event.name"] == DETAILS
            and "gen_ai.usage.input_tokens" in r["attributes"]]


DETAILS = "gen_ai.client.inference.operation.details"


def test_gemini_system_instruction_pairs_with_its_response_only(tmp_path):
    records = _telemetry_records()
    details = _details(records)
    assert len(details) == 9  # one per response (the request-side records carry no usage)
    details[0]["event.timestamp"] = "2026-06-02T09:12:11.000Z"  # not its response's time: not its record
    details[1]["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": "Be brief."},
                                                           {"type": "text", "content": "Cite files."}])
    details[2]["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": "x" * (160 * 1024)}])
    details[3]["gen_ai.system_instructions"] = json.dumps([{"type": "tool_call", "name": "ls"}])  # not text
    details[4]["gen_ai.system_instructions"] = "{not json"
    reqs, _ = read(_copy_chat(tmp_path, telemetry=_dump(records)))
    systems = [r.body["messages"][0] if r.body["messages"][0]["role"] == "system" else None for r in reqs]
    assert systems[0] is None  # no operation.details at g-01's response time
    assert systems[1] == {"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                                        {"type": "text", "text": "Cite files."}]}
    assert systems[2] is None  # as long as Gemini CLI's 160 KiB cut: maybe cut, so left out
    assert systems[3] is None and systems[4] is None
    assert all(s is not None and s["content"].startswith("You are an interactive CLI agent") for s in systems[5:])
    assert _sent_with_telemetry(reqs) == [f"g-0{i}" for i in range(1, 10)]  # the contents pair as before


def test_gemini_telemetry_pairs_by_session_counts_and_time_only(tmp_path):
    records = _telemetry_records()
    g01, _, g03, *_ = _responses(records)
    g01["session.id"] = "another-session"  # another session's call is not this chat's
    g03["input_token_count"] += 1  # nor a call whose counts differ
    reqs, _ = read(_copy_chat(tmp_path / "a", telemetry=_dump(records)))
    assert _sent_with_telemetry(reqs) == ["g-02", "g-04", "g-05", "g-06", "g-07", "g-08", "g-09"]
    records = _telemetry_records()
    _responses(records)[0]["event.timestamp"] = "2026-06-02T11:12:10.570Z"  # two hours from the chat's
    reqs, _ = read(_copy_chat(tmp_path / "b", telemetry=_dump(records)))
    assert "g-01" not in _sent_with_telemetry(reqs) and len(_sent_with_telemetry(reqs)) == 8


def test_gemini_telemetry_file_alone_is_listed_not_counted(tmp_path):
    assert detect(TELEMETRY).name == "gemini-cli"
    reqs, skipped = read(TELEMETRY)
    assert reqs == [] and "telemetry outfile (9 API calls)" in skipped[0].reason
    lab = pc.Lab(tmp_path / "lab.duckdb")
    try:
        res = lab.import_log([GEMINI_MAIN, TELEMETRY], progress=False)
        assert res.requests == 9  # the chat's calls once: the telemetry adds bodies, never requests
    finally:
        lab.close()


def test_import_agent_knows_every_agents_usual_place_and_its_override(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    shutil.copytree(LOGS / "pi" / "--home-ann-ledger-api--", home / ".pi" / "agent" / "sessions" / "--p--")
    shutil.copytree(LOGS / "pi" / "omp", home / ".omp" / "agent" / "sessions")
    shutil.copytree(LOGS / "openclaw", home / ".openclaw")
    shutil.copytree(LOGS / "claude_code", home / ".claude" / "projects")
    shutil.copytree(LOGS / "codex", tmp_path / "codex-home" / "sessions")
    found = {a: agent_log_files(a, home=home, env={"CODEX_HOME": str(tmp_path / "codex-home")})
             for a in ("pi", "openclaw", "claude-code", "codex")}
    assert len(found["pi"]) == 3 and any(f.parent.name.endswith("_7c2e41d0b9a3") for f in found["pi"])  # sub-agent
    assert sorted(f.name for f in found["openclaw"])[:2] == ["9b1d6f0e-3a52-4c47-b8e1-5d0c2e7a4f19.jsonl",
                                                          "anthropic-payload.jsonl"]
    assert len(found["claude-code"]) == len(list((LOGS / "claude_code").rglob("*.jsonl")))
    assert len(found["codex"]) == len(list((LOGS / "codex").rglob("*.jsonl")))
    # an agent's own variable wins over the usual folder
    assert agent_log_files("pi", home=tmp_path / "nobody",
                           env={"PI_CODING_AGENT_DIR": str(home / ".pi" / "agent")}) == [
        f for f in found["pi"] if ".pi" in f.parts]
    monkeypatch.setenv("HOME", str(home))
    for var in ("PI_CODING_AGENT_DIR", "OMP_CODING_AGENT_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert main(["import", "--db", str(tmp_path / "a.duckdb"), "--agent", "pi", "--quiet"]) == 0
    out = capsys.readouterr().out
    ref = pc.Lab(tmp_path / "ref.duckdb")
    try:
        res = ref.import_log(found["pi"], progress=False)
        assert f"{res.requests} new requests" in out  # the CLI read the same three files
        assert sum(1 for s in res.sessions if s.parent_id) == 2  # oh-my-pi's side call and its sub-agent
    finally:
        ref.close()


def test_gemini_telemetry_request_text_reuses_the_history_parsed_for_the_call_before(monkeypatch):
    """Each request_text repeats the contents of the call before it: the reader's HistoryDecoder hands that
    history back as the objects already parsed (and converted), and the bodies are exactly those of a plain
    ``json.loads`` of every request_text."""
    decoders: list[HistoryDecoder] = []

    class Recorded(HistoryDecoder):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            decoders.append(self)

    class Plain:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def loads(self, text: str) -> Any:
            return json.loads(text)

    monkeypatch.setattr(gemini_cli, "HistoryDecoder", Recorded)
    reqs, _ = read(GEMINI_MAIN)
    monkeypatch.setattr(gemini_cli, "HistoryDecoder", Plain)
    plain, _ = read(GEMINI_MAIN)
    assert [r.body for r in reqs] == [r.body for r in plain] and len(reqs) == 9
    # the decoder path was taken: per call, the leading contents equal to the previous call's came back reused
    sent = [json.loads(c.request_text) for c in gemini_cli._telemetry_calls(TELEMETRY) if c.request_text]
    assert len(sent) == 9
    shared = [next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
              for a, b in zip(sent, sent[1:], strict=False)]
    (decoder,) = decoders
    assert decoder.reused == sum(shared) > 0
    # ...and their Chat messages are the previous body's very objects, as is an unchanged system message
    for before, after, k in zip(reqs, reqs[1:], shared, strict=False):
        now, then = after.body["messages"], before.body["messages"]
        assert k == 0 or now[1] is then[1]
        assert now[0] is then[0] or now[0] != then[0] or now[0]["role"] != "system"


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["user", "gemini", "rewrite", "rewind", "compress"]),
                              st.integers(0, 5), st.integers(0, 3)), max_size=25))
def test_gemini_replay_joins_only_what_changed_and_equals_a_full_join(ops):
    """The chat's bodies are joined incrementally (records appended or re-written since the last request); at
    every step they equal joining every record again."""
    replay = gemini_cli._Replay()
    sent: dict[str, list[dict]] = {}  # each gemini turn's body as the records stood when it was first written
    for step, (kind, n, call) in enumerate(ops):
        ids = list(replay.order)
        if kind == "rewind":
            replay.rewind(ids[n % len(ids)] if ids and n < 4 else "unknown")
        elif kind == "compress":
            replay.replace([replay.records[m] for m in ids[n % 3:]], step)
        else:
            mid = ids[n % len(ids)] if kind == "rewrite" and ids else f"m{step}"
            result = [{"functionResponse": {"id": f"c{call}", "name": "ls", "response": {"output": str(step)}}}]
            if kind == "user" or (kind == "rewrite" and n % 2):
                record = {"id": mid, "type": "user", "content": [{"text": f"t{step}"}] if call else result}
            else:
                record = {"id": mid, "type": "gemini", "content": f"a{step}",
                          "toolCalls": [{"id": f"c{call}", "name": "ls", "args": {}, "result": result}]}
            if mid not in replay.records and mid not in replay.pending and record["type"] == "gemini":
                sent[mid] = gemini_cli._chat_messages([replay.records[m] for m in replay.order])
            replay.put(record, step)
        assert replay.messages() == gemini_cli._chat_messages([replay.records[m] for m in replay.order])
    # a body taken earlier is a list of its own: what was joined since never changed it
    assert {mid: p.body_messages for mid, p in replay.pending.items()} == sent
