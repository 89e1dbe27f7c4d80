"""Session identity from the logs' own ids, Claude Code chains of every era, and bad values that cost one line.

Fixtures: ``tests/fixtures/claude_code_eras`` (written by ``make_claude_code_eras.py``: a 1.0.x session with six
inline sidechains, 2.0.x sessions saved under one file name with an agent file beside one) and the shipped logs
(``tests/fixtures/logs``), edited per test in ``tmp_path``.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.readers._types import ImportedRequest, ReadProgress, SkippedLine
from promptcache_nb.readers.claude_code import ClaudeCodeReader
from promptcache_nb.readers.codex import CodexReader

FIXTURES = Path(__file__).parent / "fixtures"
ERAS = FIXTURES / "claude_code_eras"
V1_SID = "7d3e9f21-5c84-4b6a-a0d2-3e1f8c9b4a76"
V1_MAIN = ERAS / "1.0" / "-home-dev-ledger-api" / f"{V1_SID}.jsonl"
MONDAY, TUESDAY, AGENT = "2a8c4e61-0b3d-4f79-8e15-6d2b9a7c3f04", "c95f0d37-8e21-4a6b-b4c3-1f7e2d9a8b60", "5d1e9a7c"
V2 = ERAS / "2.0"
LOGS = FIXTURES / "logs"
CC_SID = "4b2f7c1e-9d3a-4e8b-a6f1-2c5d8e0b7a94"
CC_MAIN = LOGS / "claude_code" / "-home-dev-billing-service" / f"{CC_SID}.jsonl"
CC_SUBAGENT = CC_MAIN.parent / CC_SID / "subagents" / "agent-a3f9c2d1.jsonl"
CODEX_SID = "0199a5b2-7c3e-7d41-9f08-3b6e2a1c5d90"
CODEX = LOGS / "codex" / "2026" / "03" / "03" / f"rollout-2026-03-03T14-05-11-{CODEX_SID}.jsonl"


def read_all(reader, path: Path) -> tuple[list[ImportedRequest], list[SkippedLine]]:
    records = list(reader.read(path))
    assert isinstance(records[-1], ReadProgress)
    reqs = [r for r in records if isinstance(r, ImportedRequest)]
    skipped = [r for r in records if isinstance(r, SkippedLine)]
    return reqs, skipped


def by_session(reqs: list[ImportedRequest]) -> dict[str, list[ImportedRequest]]:
    out: dict[str, list[ImportedRequest]] = defaultdict(list)
    for r in reqs:
        out[r.session_key].append(r)
    return dict(out)


def unanswered_tool_uses(body: dict) -> list[str]:
    """tool_use ids not answered by a tool_result in the next message (the API refuses such a body)."""
    msgs = body["messages"]
    missing = []
    for i, m in enumerate(msgs[:-1]):
        if m["role"] != "assistant":
            continue
        answered = {b.get("tool_use_id") for b in msgs[i + 1]["content"] if b.get("type") == "tool_result"}
        missing += [b["id"] for b in m["content"] if b.get("type") == "tool_use" and b["id"] not in answered]
    return missing


def lines_of(path: Path) -> list:
    """Each line parsed; a line that is not JSON (the shipped logs have one) stays its text."""
    out: list = []
    for x in path.read_text().splitlines():
        try:
            out.append(json.loads(x))
        except ValueError:
            out.append(x)
    return out


def write_lines(path: Path, objs: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def is_token_count(o) -> bool:
    return isinstance(o, dict) and o.get("type") == "event_msg" and o["payload"].get("type") == "token_count"


# ---- Claude Code 1.0.x: inline sidechains -----------------------------------------------------------------


def test_cc_1_0_inline_sidechains_become_one_subagent_session_each():
    reqs, skipped = read_all(ClaudeCodeReader(), V1_MAIN)
    assert skipped == []
    sessions = by_session(reqs)
    roots = [o["uuid"] for o in lines_of(V1_MAIN) if o["isSidechain"] and o["parentUuid"] is None]
    assert len(roots) == 6
    assert set(sessions) == {V1_SID} | {f"{V1_SID}/sidechain-{root}" for root in roots}
    main = sessions[V1_SID]
    assert [r.request_id for r in main] == ["req_011CRa9Lg1AuditPlanW3", "req_011CRa9LgAuditSumm4T",
                                            "req_011CRa9LgFixFxEditQ", "req_011CRa9LgFixFxDoneR"]
    assert {(r.session_kind, r.parent_key) for r in main} == {("main", None)}
    # the main chain never sees a sub-agent's turns: after the six Task calls comes one message with six results
    summary = main[1].body["messages"]
    assert [m["role"] for m in summary] == ["user", "assistant", "user"]
    assert [b["type"] for b in summary[2]["content"]] == ["tool_result"] * 6
    for root in roots:
        chain = sessions[f"{V1_SID}/sidechain-{root}"]
        assert len(chain) == 3
        assert {(r.session_kind, r.parent_key, r.model) for r in chain} == \
            {("subagent", V1_SID, "claude-sonnet-4-20250514")}
        first = chain[0].body["messages"]
        assert len(first) == 1 and first[0]["content"][0]["text"].startswith("Find every place in src/ledger/")
        assert [len(r.body["messages"]) for r in chain] == [1, 3, 5]
        # each request of a chain re-sends the one before it (no other chain's turns in between)
        for before, after in zip(chain, chain[1:], strict=False):
            assert after.body["messages"][: len(before.body["messages"])] == before.body["messages"]
    assert all(r.events == () for r in reqs), "no compaction happened"
    assert [r for r in reqs if unanswered_tool_uses(r.body)] == []


def test_cc_1_0_import_gives_a_main_session_and_six_linked_subagents(tmp_path):
    with pc.Lab(tmp_path / "s.duckdb", progress=False) as lab:
        res = lab.import_log(V1_MAIN.parent)
        assert res.requests == 22 and len(res.skipped) == 0
        assert len(res.flagged) == 0, res.flagged  # no "tool_use has no tool_result" from mixed chains
        mains = [s for s in res.sessions if s.parent_id is None]
        assert len(mains) == 1 and len(res.sessions) == 7
        (main,) = mains
        assert len(main.turns()) == 4
        subs = [s for s in res.sessions if s.parent_id is not None]
        assert {s.parent_id for s in subs} == {main.id}
        assert sorted(len(s.turns()) for s in subs) == [3] * 6
        for s in res.sessions:
            rb = pc.rebuilds(s)
            assert not rb.reason.astype(str).str.contains("ompaction").any(), rb


def test_cc_progress_copies_of_subagent_messages_are_never_requests(tmp_path):
    """2.1.x writes ``progress`` / ``agent_progress`` lines carrying copies of a sub-agent's messages."""
    raw = CC_MAIN.read_text().splitlines()
    sub = lines_of(CC_SUBAGENT)
    progress = [{"parentUuid": None, "isSidechain": False, "userType": "external", "cwd": "/home/dev/billing-service",
                 "sessionId": CC_SID, "version": "2.1.39", "type": "progress",
                 "data": {"message": {"type": s["type"], "message": s["message"], "uuid": s["uuid"],
                                      "timestamp": s["timestamp"]},
                          "normalizedMessages": [], "type": "agent_progress", "agentId": "a3f9c2d1"},
                 "parentToolUseID": "toolu_01Task", "toolUseID": f"agent_msg_{i}",
                 "timestamp": s["timestamp"], "uuid": f"0f0e0d0c-0000-4000-8000-{i:012d}"}
                for i, s in enumerate(sub)]
    path = tmp_path / CC_MAIN.name
    path.write_text("\n".join(raw[:20] + [json.dumps(p) for p in progress] + raw[20:]) + "\n")
    reqs, skipped = read_all(ClaudeCodeReader(), path)
    assert len(reqs) == 11 and {r.session_key for r in reqs} == {CC_SID}
    assert all(r.model == "claude-sonnet-4-5-20250929" for r in reqs)


# ---- Claude Code: identity from sessionId + agentId ---------------------------------------------------------


def test_cc_two_files_with_one_name_are_two_sessions_and_the_agent_file_finds_its_parent():
    mon, _ = read_all(ClaudeCodeReader(), V2 / "monday" / "turn-2.jsonl")
    tue, _ = read_all(ClaudeCodeReader(), V2 / "tuesday" / "turn-2.jsonl")
    agent, _ = read_all(ClaudeCodeReader(), V2 / "tuesday" / f"agent-{AGENT}.jsonl")
    assert {r.session_key for r in mon} == {MONDAY} and len(mon) == 2
    assert {r.session_key for r in tue} == {TUESDAY} and len(tue) == 2
    assert {(r.session_key, r.parent_key, r.session_kind) for r in agent} == \
        {(f"{TUESDAY}/agent-{AGENT}", TUESDAY, "subagent")}


def test_cc_2_0_import_keeps_same_named_sessions_apart(tmp_path):
    with pc.Lab(tmp_path / "s.duckdb", progress=False) as lab:
        res = lab.import_log(V2)
        assert res.requests == 6 and len(res.skipped) == 0 and len(res.flagged) == 0
        mains = {s.turns().request_id.iloc[0]: s for s in res.sessions if s.parent_id is None}
        monday, tuesday = mains.pop("req_011CUmonVatRunA1"), mains.pop("req_011CUtueFeePlanC3")
        assert mains == {}
        (sub,) = [s for s in res.sessions if s.parent_id is not None]
        assert sub.parent_id == tuesday.id  # Tuesday's, not a session named after the file
        assert len(sub.turns()) == 2
        # each session is its own cache chain: Monday's requests are not Tuesday's history
        assert list(monday.turns().cache_read_input_tokens) == [0, 15217]
        assert list(tuesday.turns().cache_read_input_tokens) == [0, 15309]


def test_cc_one_file_holding_two_sessions_yields_two_keys(tmp_path):
    both = tmp_path / "export.jsonl"
    both.write_text((V2 / "monday" / "turn-2.jsonl").read_text() + (V2 / "tuesday" / "turn-2.jsonl").read_text())
    reqs, _ = read_all(ClaudeCodeReader(), both)
    sessions = by_session(reqs)
    assert {k: len(v) for k, v in sessions.items()} == {MONDAY: 2, TUESDAY: 2}
    assert len(sessions[TUESDAY][0].body["messages"]) == 1  # Tuesday starts from its own first message


def test_cc_resumed_session_continues_the_history_it_was_resumed_from(tmp_path):
    """A line of a new sessionId whose parentUuid is in another session's chain continues that conversation."""
    lines = lines_of(V2 / "monday" / "turn-2.jsonl")
    resumed_sid = "e4b7a2c9-31d5-4f08-9a6e-7c2b8d0f1e35"
    last = lines[-1]
    ask = {**lines[0], "parentUuid": last["uuid"], "sessionId": resumed_sid, "uuid": "9a1b2c3d-0000-4000-8000-1",
           "timestamp": "2025-11-03T09:30:00.000Z",
           "message": {"role": "user", "content": "Now fix test_reverse_charge_zero."}}
    answer = json.loads(json.dumps(last))
    answer.update(parentUuid=ask["uuid"], sessionId=resumed_sid, uuid="9a1b2c3d-0000-4000-8000-2",
                  timestamp="2025-11-03T09:30:02.500Z", requestId="req_011CUresumedAnswer1")
    answer["message"]["id"] = "msg_01ResumedAnswer9x"
    reqs, _ = read_all(ClaudeCodeReader(), write_lines(tmp_path / "r.jsonl", [*lines, ask, answer]))
    sessions = by_session(reqs)
    assert {k: len(v) for k, v in sessions.items()} == {MONDAY: 2, resumed_sid: 1}
    (resumed,) = sessions[resumed_sid]
    assert [m["role"] for m in resumed.body["messages"]] == ["user", "assistant", "user", "assistant", "user"]


# ---- Claude Code: bad values cost one line --------------------------------------------------------------------


BAD_USAGE = [
    ("input_tokens", -1, "usage.input_tokens"),
    ("cache_read_input_tokens", "12", "usage.cache_read_input_tokens"),
    ("output_tokens", 1e308, "usage.output_tokens"),
    ("cache_creation_input_tokens", 10**13, "usage.cache_creation_input_tokens"),
    ("input_tokens", 5 * 10**12, "usage.input_tokens"),
]


def _cc_with_usage_of_line_7(tmp_path: Path, edit) -> Path:
    lines = CC_MAIN.read_text().splitlines()
    entry = json.loads(lines[6])  # request 2: a one-line response
    assert entry["message"]["id"] == "msg_01h9XgKAwcPgP3eN4WDMaqW2"
    edit(entry["message"]["usage"])
    lines[6] = json.dumps(entry)
    path = tmp_path / CC_MAIN.name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("field", "value", "named"), BAD_USAGE)
def test_cc_bad_usage_value_skips_that_request_only(tmp_path, field, value, named):
    path = _cc_with_usage_of_line_7(tmp_path, lambda u: u.__setitem__(field, value))
    reqs, skipped = read_all(ClaudeCodeReader(), path)
    assert len(reqs) == 10 and "msg_01h9XgKAwcPgP3eN4WDMaqW2" not in {r.dedupe_key.split("/")[0] for r in reqs}
    bad = [s for s in skipped if s.line == 7]
    assert len(bad) == 1 and bad[0].file == str(path) and bad[0].reason.startswith(f"{named}: "), bad
    # the response is still part of the conversation the next request re-sends
    assert any(b.get("id") == "toolu_01NSPfmN67tXSrXT7Nttm14f"
               for m in reqs[1].body["messages"] for b in m["content"])


def test_cc_nan_usage_skips_that_request_only(tmp_path):
    path = _cc_with_usage_of_line_7(tmp_path, lambda u: u.__setitem__("output_tokens", math.nan))
    assert "NaN" in path.read_text()
    reqs, skipped = read_all(ClaudeCodeReader(), path)
    assert len(reqs) == 10 and [s.line for s in skipped if s.line == 7] == [7]


def test_cc_ttl_split_larger_than_the_write_skips_that_request_only(tmp_path):
    def edit(u):
        u["cache_creation"] = {"ephemeral_5m_input_tokens": 422, "ephemeral_1h_input_tokens": 900}
    reqs, skipped = read_all(ClaudeCodeReader(), _cc_with_usage_of_line_7(tmp_path, edit))
    assert len(reqs) == 10
    (bad,) = [s for s in skipped if s.line == 7]
    assert bad.reason.startswith("usage.cache_creation") and "422" in bad.reason and "900" in bad.reason


def test_cc_lines_that_are_not_transcript_entries_are_reported(tmp_path):
    proxy = {"v": 1, "at": "2026-03-02T10:00:09.000Z", "method": "POST", "url": "https://api.anthropic.com/v1/messages",
             "request": {"model": "claude-sonnet-4-5", "messages": []}, "response": {"usage": {"input_tokens": 3}}}
    lines = CC_MAIN.read_text().splitlines()
    path = tmp_path / CC_MAIN.name
    path.write_text("\n".join(lines[:5] + [json.dumps(proxy), json.dumps({"note": "hand-written"})] + lines[5:]) + "\n")
    reqs, skipped = read_all(ClaudeCodeReader(), path)
    assert len(reqs) == 11
    reasons = {s.line: s.reason for s in skipped}
    assert "recording-proxy" in reasons[6] and "not a Claude Code transcript entry" in reasons[6]
    assert reasons[7].startswith("not a Claude Code transcript entry")
    # known kinds that carry no request (snapshots, queue operations, custom titles, summaries) stay silent
    assert set(reasons) == {6, 7, 27, 33}


# ---- Codex -------------------------------------------------------------------------------------------------


def test_codex_rollout_without_usage_says_so(tmp_path):
    kept = [o for o in lines_of(CODEX)
            if not is_token_count(o)]
    path = write_lines(tmp_path / CODEX.name, kept)
    reqs, skipped = read_all(CodexReader(), path)
    assert reqs == []
    assert [(s.file, s.line) for s in skipped if "token_count" in s.reason] == [(str(path), 0)]
    assert any(s.reason.startswith("no token_count usage in this rollout") for s in skipped)


def _codex_requests(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) of each token_count line that is a request (the first of each written pair)."""
    seen, out = None, []
    for n, o in enumerate(lines_of(path), start=1):
        if is_token_count(o) and o["payload"].get("info"):
            totals = o["payload"]["info"].get("total_token_usage")
            if totals != seen:
                out.append((n, o))
            seen = totals
    return out


@pytest.mark.parametrize(("field", "value"), [
    ("input_tokens", -5), ("cached_input_tokens", "1024"), ("output_tokens", 1e308), ("input_tokens", 10**13),
])
def test_codex_bad_token_count_value_skips_that_request_only(tmp_path, field, value):
    good, _ = read_all(CodexReader(), CODEX)
    objs = lines_of(CODEX)
    target, _ = _codex_requests(CODEX)[1]
    for o in objs[target - 1: target + 1]:  # the event and its copy
        if is_token_count(o):
            o["payload"]["info"]["last_token_usage"][field] = value
    path = write_lines(tmp_path / CODEX.name, objs)
    reqs, skipped = read_all(CodexReader(), path)
    assert len(reqs) == len(good) - 1
    (bad,) = [s for s in skipped if s.line == target]
    assert bad.reason.startswith(f"last_token_usage.{field}: "), bad


def test_codex_bad_cumulative_total_in_an_old_rollout_skips_one_line(tmp_path):
    """Old clients log only ``total_token_usage``: the usage is the difference of two totals."""
    objs = lines_of(CODEX)
    for o in objs:
        if is_token_count(o) and o["payload"].get("info"):
            o["payload"]["info"].pop("last_token_usage", None)
    first, _ = _codex_requests(CODEX)[0]
    for o in objs[first - 1: first + 1]:
        if is_token_count(o):
            o["payload"]["info"]["total_token_usage"]["input_tokens"] = "8000"
    path = write_lines(tmp_path / CODEX.name, objs)
    good, _ = read_all(CodexReader(), CODEX)
    reqs, skipped = read_all(CodexReader(), path)
    assert [s.line for s in skipped if "total_token_usage.input_tokens" in s.reason] == [first]
    # the next request is the difference from that total: unknown too, and said so (never the sum of two requests)
    second, _ = _codex_requests(CODEX)[1]
    assert [s.line for s in skipped if f"previous total (line {first})" in s.reason] == [second]
    assert len(reqs) == len(good) - 2


def test_codex_subagent_thread_hangs_off_its_parent(tmp_path):
    objs = lines_of(CODEX)
    child = "0199a5c1-2d4e-7f60-8a1b-9c0d1e2f3a4b"
    meta = objs[0]
    assert meta["type"] == "session_meta"
    meta["payload"]["id"] = child
    meta["payload"]["source"] = {"subagent": {"thread_spawn": {"parent_thread_id": CODEX_SID, "depth": 1}}}
    path = write_lines(tmp_path / "rollout-2026-03-03T14-09-40-child.jsonl", objs)
    reqs, _ = read_all(CodexReader(), path)
    assert reqs and {(r.session_key, r.parent_key, r.session_kind) for r in reqs} == {(child, CODEX_SID, "subagent")}


def test_codex_session_key_is_the_session_meta_id_whatever_the_file_is_called(tmp_path):
    a = tmp_path / "a" / "rollout.jsonl"
    b = tmp_path / "b" / "rollout.jsonl"
    a.parent.mkdir()
    b.parent.mkdir()
    shutil.copy(CODEX, a)
    objs = lines_of(CODEX)
    objs[0]["payload"]["id"] = "0199a5d0-0000-7000-8000-00000000abcd"
    write_lines(b, objs)
    ka = {r.session_key for r in read_all(CodexReader(), a)[0]}
    kb = {r.session_key for r in read_all(CodexReader(), b)[0]}
    assert ka == {CODEX_SID} and kb == {"0199a5d0-0000-7000-8000-00000000abcd"}
