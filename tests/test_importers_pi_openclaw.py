"""pi / oh-my-pi session files and OpenClaw's transcripts, cache trace and payload log (issue #28), and the
cross-check of our cache-break observation against OpenClaw's own."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import promptcache_nb as pc
from promptcache_nb.readers import detect
from promptcache_nb.readers.openclaw import OpenClawReader
from promptcache_nb.readers.pi import PiReader

LOGS = pc.data_path("logs")
PI_FILE = next((LOGS / "pi" / "--home-ann-ledger-api--").glob("*.jsonl"))
OMP_FILE = next((LOGS / "pi" / "omp").glob("*/*.jsonl"))
OMP_CHILD = next((LOGS / "pi" / "omp").glob("*/*/*.jsonl"))  # the task tool's sub-agent, in the parent's folder
CLAW = LOGS / "openclaw"
CLAW_TRANSCRIPT = next((CLAW / "agents").rglob("*.jsonl"))
T0 = datetime(2026, 2, 10, 9, 0, tzinfo=UTC)


@pytest.fixture
def lab(tmp_path: Path) -> pc.Lab:
    lab = pc.Lab(tmp_path / "lab.duckdb")
    yield lab
    lab.close()


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def iso(dt: datetime) -> str:
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def usage(inp: int, cr: int, cw: int, out: int, **extra: Any) -> dict[str, Any]:
    return {"input": inp, "output": out, "cacheRead": cr, "cacheWrite": cw, "totalTokens": inp + cr + cw + out,
            "cost": {"total": 0.01}, **extra}


def assistant(eid: str, parent: str | None, at: datetime, u: dict[str, Any], *, model: str = "claude-sonnet-4-5",
              api: str = "anthropic-messages", provider: str = "anthropic", stop: str = "stop",
              text: str = "ok") -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": iso(at + timedelta(seconds=3)),
            "message": {"role": "assistant", "content": [{"type": "text", "text": text}], "api": api,
                        "provider": provider, "model": model, "usage": u, "stopReason": stop, "timestamp": ms(at)}}


def user(eid: str, parent: str | None, at: datetime, text: str) -> dict[str, Any]:
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": iso(at),
            "message": {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": ms(at)}}


def write(path: Path, objs: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def header(sid: str = "5f0c2b1e-0000-4000-8000-00000000a001", **extra: Any) -> dict[str, Any]:
    return {"type": "session", "version": 3, "id": sid, "timestamp": iso(T0), "cwd": "/home/ann/proj", **extra}


# -- pi ----------------------------------------------------------------------------------------------------
def test_pi_fixture_is_detected_and_imported_with_its_events_branch_and_causes(lab: pc.Lab) -> None:
    assert detect(PI_FILE).name == "pi"
    before = (PI_FILE.read_bytes(), PI_FILE.stat().st_mtime_ns)
    res = lab.import_log(PI_FILE, progress=False)
    assert (PI_FILE.read_bytes(), PI_FILE.stat().st_mtime_ns) == before  # pi migrates in place; we only read
    assert res.requests == 12
    assert list(res.skipped.reason) == ["stopReason 'aborted' with zero usage: not a billed request"]
    s = res.sessions[0]
    df = s.turns()
    events = [json.loads(e) for e in df.events]
    assert events[8] == ["compaction"] and events[9] == ["model_switch"]
    assert list(df.model[9:]) == ["claude-opus-4-5"] * 3
    # the request after /tree is sent its own branch's history: not the abandoned branch's turns
    branch = json.dumps(s.turn(10).request)
    assert "Actually drop the rounding idea" in branch
    assert "Also round half-even" not in branch and "changelog" not in branch
    # the request after the compaction starts from the summary and keeps the entries from firstKeptEntryId
    compacted = s.turn(8).request["messages"]
    assert compacted[0]["content"][0]["text"].startswith("Fixed partial refunds for JPY")
    assert "Also round half-even" in json.dumps(compacted)
    causes = dict(zip(pc.rebuilds(s).idx, pc.rebuilds(s).reason, strict=True))
    assert causes == {6: "ttl_expired", 8: "compaction", 9: "model_switch", 10: "prefix_changed"}


def test_pi_session_identity_comes_from_the_header_not_the_file_name(lab: pc.Lab, tmp_path: Path) -> None:
    a = shutil.copy(PI_FILE, tmp_path / "copy-a.jsonl")
    res = lab.import_log([PI_FILE, a], progress=False)
    assert len(res.sessions) == 1 and res.requests == 12


def test_pi_version_1_chains_entries_in_file_order(lab: pc.Lab, tmp_path: Path) -> None:
    v1 = [{"type": "session", "id": "0a1b2c3d-0000-4000-8000-000000000001", "timestamp": iso(T0), "cwd": "/p",
           "provider": "anthropic", "modelId": "claude-sonnet-4-5", "thinkingLevel": "off"}]
    for i in range(3):
        at = T0 + timedelta(minutes=i)
        v1.append({"type": "message", "timestamp": iso(at),
                   "message": {"role": "user", "content": f"question {i}", "timestamp": ms(at)}})
        a = assistant("x", None, at + timedelta(seconds=1), usage(3, 0 if i == 0 else 5000 + 200 * (i - 1), 200, 20))
        del a["id"], a["parentId"]
        v1.append(a)
    path = write(tmp_path / "v1.jsonl", v1)
    assert detect(path).name == "pi"
    res = lab.import_log(path, progress=False)
    assert res.requests == 3
    last = res.sessions[0].turn(2).request["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]


def test_pi_inclusive_input_eras_are_converted_with_a_note(lab: pc.Lab, tmp_path: Path) -> None:
    early = datetime(2025, 11, 20, 9, 0, tzinfo=UTC)
    lines = [header(), user("u1", None, T0, "hi"),
             assistant("a1", "u1", T0, usage(9000, 6000, 0, 10), api="google-generative-ai", provider="google",
                       model="gemini-2.5-pro"),
             user("u2", "a1", early, "again"),
             assistant("a2", "u2", early, usage(7000, 4000, 0, 10), api="openai-responses", provider="openai",
                       model="gpt-5"),
             user("u3", "a2", T0, "once more"),
             assistant("a3", "u3", T0 + timedelta(seconds=5), usage(7000, 4000, 0, 10), api="openai-responses",
                       provider="openai", model="gpt-5")]
    path = write(tmp_path / "s.jsonl", lines)
    recs = [r for r in PiReader().read(path) if hasattr(r, "usage")]
    assert [r.usage.input_tokens for r in recs] == [3000, 3000, 7000]  # google: inclusive; openai < 0.12.10 too
    assert "input - cacheRead" in recs[0].usage.notes[0] and not recs[2].usage.notes
    assert [r.provider for r in recs] == ["google", "openai", "openai"]


def test_pi_bad_usage_costs_one_line(lab: pc.Lab, tmp_path: Path) -> None:
    lines = [header(), user("u1", None, T0, "hi"), assistant("a1", "u1", T0, usage(3, -5, 100, 10)),
             user("u2", "a1", T0 + timedelta(seconds=9), "more"),
             assistant("a2", "u2", T0 + timedelta(seconds=10), usage(3, 0, 900, 10)),
             {"type": "message", "id": "a3", "parentId": "a2", "timestamp": iso(T0)}]
    res = lab.import_log(write(tmp_path / "s.jsonl", lines), progress=False)
    assert res.requests == 1
    reasons = list(res.skipped.reason)
    assert any("message.usage.cacheRead" in r for r in reasons)
    assert "message entry without a message object" in reasons
    assert list(res.skipped.line) == [3, 6]


def test_pi_fork_skips_the_requests_copied_from_its_parent(lab: pc.Lab, tmp_path: Path) -> None:
    parent_lines = [header(), user("u1", None, T0, "hi"), assistant("a1", "u1", T0, usage(3, 0, 4000, 10))]
    parent = write(tmp_path / "parent.jsonl", parent_lines)
    later = T0 + timedelta(minutes=1)
    fork = write(tmp_path / "fork.jsonl", [
        header("5f0c2b1e-0000-4000-8000-00000000f0f0", parentSession=str(parent)), *parent_lines[1:],
        user("u2", "a1", later, "and then?"), assistant("a2", "u2", later, usage(3, 4000, 300, 10))])
    res = lab.import_log([parent, fork], progress=False)
    assert res.requests == 3 - 1
    assert any("copied from the parent session" in r for r in res.skipped.reason)


def test_oh_my_pi_title_slot_cttl_split_and_model_usage(lab: pc.Lab) -> None:
    assert detect(OMP_FILE).name == "pi"
    res = lab.import_log(OMP_FILE, progress=False)
    main = next(s for s in res.sessions if s.parent_id is None)
    side = next(s for s in res.sessions if s.parent_id is not None)
    df = main.turns()
    assert list(df.cache_creation_1h_input_tokens) == list(df.cache_creation_input_tokens)  # cttl: all 1h
    assert side.model == "claude-haiku-4-5" and len(side.turns()) == 1  # auto-thinking: a request of its own
    assert any("subagent:explore" in r for r in res.skipped.reason)  # a roll-up, counted in its own file


# -- OpenClaw ------------------------------------------------------------------------------------------------
def test_openclaw_transcript_skips_delivery_mirrors(lab: pc.Lab) -> None:
    assert detect(CLAW_TRANSCRIPT).name == "openclaw"
    assert not PiReader().sniff(CLAW_TRANSCRIPT, CLAW_TRANSCRIPT.read_text())
    res = lab.import_log(CLAW_TRANSCRIPT, progress=False)
    assert res.requests == 7
    assert (res.skipped.reason.str.startswith("OpenClaw delivery mirror")).sum() == 6


def test_openclaw_cache_trace_alone_gives_bodies_usage_and_openclaws_observation(lab: pc.Lab) -> None:
    trace = CLAW / "logs" / "cache-trace.jsonl"
    assert detect(trace).name == "openclaw"
    res = lab.import_log(trace, progress=False)
    s = res.sessions[0]
    assert res.requests == 7
    assert "personal assistant running inside OpenClaw" in json.dumps(s.turn(0).request["system"])
    cc = pc.analysis.openclaw_crosscheck(s)
    observed = cc[cc.agent_broke.notna()]
    assert list(observed.idx) == [0, 1, 3, 4, 5, 6]  # once per run: with the run's last call
    assert observed.agree.all()
    # a tool-loop run: OpenClaw observes the run's usage totals, we each call
    assert cc.loc[3, "agent_cache_read"] == 12420 + 12720 and cc.loc[3, "cache_read"] == 12720
    assert list(cc.loc[5, "agent_changes"]) == ["systemPrompt"] == list(cc.loc[5, "changes"])


def test_openclaw_payload_log_without_its_trace_counts_the_run_usage_once(lab: pc.Lab, tmp_path: Path) -> None:
    alone = shutil.copy(CLAW / "logs" / "anthropic-payload.jsonl", tmp_path / "anthropic-payload.jsonl")
    res = lab.import_log(alone, progress=False)
    assert res.requests == 6  # 7 calls in 6 runs: the tool loop's first call has no usage of its own
    assert res.skipped.reason.str.contains("writes usage once per run").sum() == 1
    df = res.sessions[0].turns()
    assert df.cache_read_input_tokens.sum() == 12000 + 12720 + 0 + 2400 + 14500


def test_openclaw_folder_stores_each_request_once_with_the_full_body(lab: pc.Lab) -> None:
    res = lab.import_log(CLAW, progress=False)
    assert len(res.sessions) == 1 and res.requests == 7
    s = res.sessions[0]
    assert all("tools" in s.turn(i).request for i in range(7))  # the payload log's bodies win
    assert pc.analysis.openclaw_crosscheck(s).agree.dropna().all()


def test_openclaw_trace_options_are_never_stored(lab: pc.Lab, tmp_path: Path) -> None:
    secret = "sk-ant-api03-" + "Z" * 40
    runs = _agreeing_trace(tmp_path, n=2)
    lines = [json.loads(x) for x in runs.read_text().splitlines()]
    for ev in lines:
        if ev["stage"] == "stream:context":
            ev["options"] = {"apiKey": secret, "headers": {"x-api-key": secret}}
    write(runs, lines)
    lab.import_log(runs, progress=False)
    lab.close()
    assert secret.encode() not in (tmp_path / "lab.duckdb").read_bytes()


def _agreeing_trace(tmp_path: Path, *, n: int = 5) -> Path:
    """A cache trace as OpenClaw writes it (agent_log_formats.md §2.3): one call per run, so its observation and
    ours see the same usage. Run 3 changes the system prompt and its read drops; run 4 is a stable hit."""
    sid, key = "c7a1e0f2-0000-4000-8000-0000000000cc", "agent:main:main"
    system = "You are a personal assistant running inside OpenClaw. " * 200
    reads = [0, 9000, 9400, 2100, 11300][:n]
    writes = [9000, 400, 300, 9500, 200][:n]
    events: list[dict[str, Any]] = []
    context: list[dict[str, Any]] = []
    prev_read: int | None = None
    for r in range(n):
        at = T0 + timedelta(minutes=r)
        sys_r = system + ("Memory: the Q2 plan is due Friday." if r >= 3 else "")
        base = {"runId": f"run-{r}", "sessionId": sid, "sessionKey": key, "provider": "anthropic",
                "modelId": "claude-sonnet-4-5", "modelApi": "anthropic-messages"}
        context.append({"role": "user", "content": f"request {r}", "timestamp": ms(at)})
        fps = [hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest() for m in context]
        events.append({"ts": iso(at), "seq": 1, "stage": "stream:context", **base,
                       "model": {"id": "claude-sonnet-4-5", "provider": "anthropic", "api": "anthropic-messages"},
                       "system": sys_r, "systemDigest": hashlib.sha256(sys_r.encode()).hexdigest(),
                       "messages": list(context), "messageCount": len(context),
                       "messageRoles": [m["role"] for m in context], "messageFingerprints": fps})
        answer = {"role": "assistant", "content": [{"type": "text", "text": f"answer {r}"}], "api": "anthropic-messages",
                  "provider": "anthropic", "model": "claude-sonnet-4-5", "stopReason": "stop",
                  "usage": usage(4, reads[r], writes[r], 30), "timestamp": ms(at) + 5}
        context.append(answer)
        events.append({"ts": iso(at + timedelta(seconds=4)), "seq": 2, "stage": "session:after", **base,
                       "messages": list(context)})
        changed = [{"code": "systemPrompt", "detail": "system prompt digest changed"}] if r == 3 else []
        if prev_read and reads[r] < 0.95 * prev_read and prev_read - reads[r] >= 1000:
            result = {"options": {"previousCacheRead": prev_read, "cacheRead": reads[r], "changes": changed}}
        elif changed:
            result = {"note": "state changed without a cache-read break",
                      "options": {"cacheRead": reads[r], "changes": changed}}
        else:
            result = {"note": "stable cache inputs", "options": {"cacheRead": reads[r]}}
        events.append({"ts": iso(at + timedelta(seconds=4)), "seq": 3, "stage": "cache:result", **base, **result})
        prev_read = reads[r]
    return write(tmp_path / "logs" / "cache-trace.jsonl", events)


def test_crosscheck_agrees_with_openclaw_on_a_trace_written_from_its_schema(lab: pc.Lab, tmp_path: Path) -> None:
    trace = _agreeing_trace(tmp_path)
    assert OpenClawReader().sniff(trace, trace.read_text())
    s = lab.import_log(trace, progress=False).sessions[0]
    cc = pc.analysis.openclaw_crosscheck(s)
    assert len(cc) == 5 and cc.agree.tolist() == [True] * 5
    assert cc.openclaw_broke.tolist() == cc.agent_broke.tolist() == [False, False, False, True, False]
    broke = cc.loc[3]
    assert broke.previous_cache_read == broke.agent_previous_cache_read == 9400
    assert list(broke.changes) == list(broke.agent_changes) == ["systemPrompt"]


def test_openclaw_sqlite_era_is_read_read_only(lab: pc.Lab, tmp_path: Path) -> None:
    import sqlite3

    agent_db, state_db = tmp_path / "openclaw-agent.sqlite", tmp_path / "openclaw.sqlite"
    con = sqlite3.connect(agent_db)
    con.execute("CREATE TABLE transcript_events (session_id TEXT, seq INTEGER, event_json TEXT, created_at INTEGER, "
                "PRIMARY KEY (session_id, seq))")
    lines = CLAW_TRANSCRIPT.read_text().splitlines()
    con.executemany("INSERT INTO transcript_events VALUES (?, ?, ?, ?)",
                    [("9b1d6f0e", i, line, i) for i, line in enumerate([*lines, "{not json"])])
    con.commit()
    con.close()
    con = sqlite3.connect(state_db)
    con.execute("CREATE TABLE diagnostic_events (scope TEXT, event_key TEXT, payload_json TEXT, created_at INTEGER)")
    rows = []
    for scope, name in (("diagnostics.cache_trace", "cache-trace.jsonl"),
                        ("diagnostics.anthropic_payload", "anthropic-payload.jsonl")):
        for i, line in enumerate((CLAW / "logs" / name).read_text().splitlines()):
            rows.append((scope, f"k{i}", line, i))
    con.executemany("INSERT INTO diagnostic_events VALUES (?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.sqlite")}
    assert detect(agent_db).name == detect(state_db).name == "openclaw"
    res = lab.import_log([agent_db, state_db], progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.sqlite")} == before
    assert res.requests == 7 and len(res.sessions) == 1
    assert res.skipped.reason.str.contains("not valid JSON").sum() == 1
    s = res.sessions[0]
    assert all("tools" in s.turn(i).request for i in range(7))
    assert pc.analysis.openclaw_crosscheck(s).agree.dropna().all()


def test_openclaw_payload_log_beside_its_transcript_takes_each_calls_usage_from_it(lab: pc.Lab,
                                                                                  tmp_path: Path) -> None:
    shutil.copytree(CLAW / "agents", tmp_path / "agents")
    (tmp_path / "logs").mkdir()
    shutil.copy(CLAW / "logs" / "anthropic-payload.jsonl", tmp_path / "logs")
    rotated = next((tmp_path / "agents").rglob("*.jsonl"))
    rotated.rename(rotated.with_name(rotated.name + ".reset.2026-04-01T10-00-00.000Z"))  # a rotated transcript
    res = lab.import_log(tmp_path, progress=False)
    assert res.requests == 7 and len(res.sessions) == 1  # every call, once: the payload's body, the transcript's usage
    s = res.sessions[0]
    assert all("tools" in s.turn(i).request for i in range(7))
    assert not res.skipped.reason.str.contains("once per run").any()


def test_openclaw_trace_pairs_a_retried_call_and_skips_its_zero_usage_error(lab: pc.Lab, tmp_path: Path) -> None:
    trace = _agreeing_trace(tmp_path, n=2)
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    call = next(e for e in events if e["stage"] == "stream:context" and e["runId"] == "run-1")
    after = next(e for e in events if e["stage"] == "session:after" and e["runId"] == "run-1")
    failed = {**after["messages"][-1], "stopReason": "error", "usage": usage(0, 0, 0, 0),
              "timestamp": after["messages"][-1]["timestamp"] - 3}
    after["messages"].insert(len(after["messages"]) - 1, failed)  # the error, then the retry that answered
    events.insert(events.index(call), {**call, "seq": 0})
    write(trace, events)
    res = lab.import_log(trace, progress=False)
    assert res.requests == 2
    assert list(res.skipped.reason) == ["stopReason 'error' with zero usage: not a billed request"]


def test_pi_openai_completions_reasoning_counted_twice_is_corrected_or_flagged(tmp_path: Path) -> None:
    """pi-ai stores output = completion_tokens + reasoning_tokens (completion already holds reasoning): a provider
    total below the four counts' sum gives the excess back; pi's own total cannot, and says so; oh-my-pi's
    reasoningTokens (a part of output) is kept, output untouched."""
    doubled = usage(1200, 8000, 0, 900)
    doubled["totalTokens"] -= 400  # the provider's total_tokens: 500 completion tokens, 400 of them reasoning
    lines = [header(), user("u1", None, T0, "hi"),
             assistant("a1", "u1", T0, doubled, api="openai-completions", provider="openai", model="o4-mini"),
             user("u2", "a1", T0 + timedelta(seconds=9), "more"),
             assistant("a2", "u2", T0 + timedelta(seconds=10), usage(1200, 8000, 0, 900), api="openai-completions",
                       provider="openai", model="o4-mini"),
             user("u3", "a2", T0 + timedelta(seconds=19), "again"),
             assistant("a3", "u3", T0 + timedelta(seconds=20), usage(1200, 8000, 0, 500, reasoningTokens=400),
                       api="openai-completions", provider="openai", model="o4-mini"),
             user("u4", "a3", T0 + timedelta(seconds=29), "and anthropic"),
             assistant("a4", "u4", T0 + timedelta(seconds=30), usage(3, 8000, 100, 900))]
    recs = [r for r in PiReader().read(write(tmp_path / "s.jsonl", lines)) if hasattr(r, "usage")]
    assert [r.usage.output_tokens for r in recs] == [500, 900, 500, 900]
    assert "output = output - 400" in recs[0].usage.notes[0]
    assert "upper bound" in recs[1].usage.notes[0]
    assert recs[2].usage.reasoning_tokens == 400 and not recs[2].usage.notes
    assert not any("reasoning" in n for n in recs[3].usage.notes)


def test_oh_my_pi_subagent_file_has_its_parent_session_and_its_system_prompt(lab: pc.Lab, tmp_path: Path) -> None:
    res = lab.import_log([OMP_FILE, OMP_CHILD], progress=False)
    main = next(s for s in res.sessions if s.parent_id is None)
    child = next(s for s in res.sessions if s.config["session_key"] == "a41f07c2d95e")
    assert child.parent_id == main.id and child.config["session_kind"] == "subagent"
    turns = child.turns()
    assert len(turns) == 4 and child.turn(0).request["system"][0]["text"].startswith("You are explore")
    # the parent's roll-up of the same calls is not counted again: it equals the child's own sum
    rollup = next(json.loads(line) for line in OMP_FILE.read_text().splitlines() if '"subagent:explore"' in line)
    assert int(turns.output_tokens.sum()) == rollup["usage"]["output"]
    assert int(turns.cache_read_input_tokens.sum()) == rollup["usage"]["cacheRead"]
    # without the parent file beside it, the folder's name still names the parent session
    lone = tmp_path / "sessions" / "-w" / OMP_CHILD.parent.name / OMP_CHILD.name
    lone.parent.mkdir(parents=True)
    shutil.copy(OMP_CHILD, lone)
    assert {r.parent_key for r in PiReader().read(lone) if hasattr(r, "usage")} == {"7c2e41d0b9a3"}
    # a file in an ordinary folder is no sub-agent
    assert {r.parent_key for r in PiReader().read(PI_FILE) if hasattr(r, "usage")} == {None}
