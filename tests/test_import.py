"""lab.import_log end to end: readers → sessions in a real DuckDB file, idempotent re-import, atomicity, the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.cli import main
from promptcache_nb.errors import ImportFormatError

SYSTEM = [{"type": "text", "text": "You are the on-call assistant for the Ledgerly billing platform. " * 40,
           "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": "query_ledger", "description": "Run a read-only SQL query against the ledger replica.",
          "input_schema": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}}]
QUESTIONS = [
    "Invoice 8812 was charged twice on March 2nd. Can you find both charges?",
    "Were both captures settled, or was one only authorised?",
    "Draft a refund note for the customer, mention the 14-day window.",
    "Which other invoices hit the same retry bug that week?",
    "Summarise the incident for the postmortem channel.",
    "Close the ticket and tag it billing-retry.",
]
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def exchange(i: int, *, model: str = "claude-sonnet-4-5", at: datetime | None = None) -> dict:
    """Request i of a growing conversation, with Anthropic usage a real endpoint would report."""
    messages = []
    for j in range(i + 1):
        messages.append({"role": "user", "content": [{"type": "text", "text": QUESTIONS[j]}]})
        if j < i:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Answer {j}: checked."}]})
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    body = {"model": model, "max_tokens": 1024, "system": SYSTEM, "tools": TOOLS, "messages": messages}
    read = 0 if i == 0 else 2300 + 40 * (i - 1)
    usage = {"input_tokens": 3, "cache_read_input_tokens": read, "cache_creation_input_tokens": 2300 + 40 * i - read,
             "cache_creation": {"ephemeral_5m_input_tokens": 2300 + 40 * i - read, "ephemeral_1h_input_tokens": 0},
             "output_tokens": 120 + i}
    when = at or T0 + timedelta(seconds=45 * i)
    return {"v": 1, "at": when.isoformat().replace("+00:00", "Z"), "method": "POST",
            "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200,
            "request": body,
            "response": {"id": f"msg_01Ledger{i:04d}", "type": "message", "role": "assistant", "model": model,
                         "content": [{"type": "text", "text": f"Answer {i}: checked."}], "stop_reason": "end_turn",
                         "usage": usage},
            "usage": usage, "request_id": f"req_011Ledger{i:04d}", "latency_ms": 900 + i, "provider": "anthropic"}


def write_log(path: Path, lines: list[dict], *, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + tail, encoding="utf-8")
    return path


def test_import_exchanges_stores_measured_requests_byte_for_byte(tmp_path: Path) -> None:
    log = write_log(tmp_path / "proxy.jsonl", [exchange(i) for i in range(4)])
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        res = lab.import_log(log)
        assert res.requests == 4 and res.already_stored == 0 and len(res.skipped) == 0
        (s,) = res.sessions
        assert s.strategy is None and "imported" in repr(s)
        assert s.source == f"exchanges:{log}"
        df = s.turns()
        assert list(df.usage_source) == ["imported"] * 4
        assert list(df.cache_read_input_tokens) == [0, 2300, 2340, 2380]
        assert list(df.cache_creation_input_tokens) == [2300, 40, 40, 40]
        assert list(df.request_id) == [f"req_011Ledger{i:04d}" for i in range(4)]
        refs = lab.sql("SELECT source_ref FROM turns ORDER BY idx").source_ref.tolist()
        assert refs == [f"{log}:{i}" for i in range(1, 5)]
        for i in range(4):
            assert s.turn(i).request == exchange(i)["request"]
        assert s.turn(3).usage.label == "measured"


def test_reimport_adds_only_what_is_new_and_waits_for_a_truncated_line(tmp_path: Path) -> None:
    log = tmp_path / "proxy.jsonl"
    partial_line = json.dumps(exchange(3))[:200]
    write_log(log, [exchange(i) for i in range(3)], tail=partial_line)
    db = tmp_path / "runs.duckdb"
    with pc.Lab(db, progress=False) as lab:
        first = lab.import_log(log)
        assert first.requests == 3 and len(first.skipped) == 0  # the line being written is not an error
        again = lab.import_log(log)
        assert again.requests == 0 and again.already_stored == 3 and again.sessions == []
    write_log(log, [exchange(i) for i in range(5)])
    with pc.Lab(db, progress=False) as lab:
        grown = lab.import_log(log)
        assert grown.requests == 2 and grown.already_stored == 3
        (s,) = grown.sessions
        assert s.n_turns == 5
        assert list(s.turns().idx) == [0, 1, 2, 3, 4]
        assert s.turn(4).request == exchange(4)["request"]


def test_malformed_middle_line_is_skipped_and_named(tmp_path: Path) -> None:
    log = tmp_path / "proxy.jsonl"
    lines = [json.dumps(exchange(0)), "{not json", json.dumps(exchange(1))]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pc.Lab(progress=False) as lab:
        res = lab.import_log(log)
        assert res.requests == 2
        assert res.skipped.to_dict("records")[0]["file"] == str(log)
        assert res.skipped.to_dict("records")[0]["line"] == 2
        assert "<b>" in res._repr_html_() and "skipped" in res._repr_html_()


def test_a_body_the_api_would_refuse_is_stored_and_flagged_one_not_json_is_skipped(tmp_path: Path) -> None:
    """Lenient import (issue 15 item 8): a log holds what was sent, so a body the API would refuse is stored as
    logged, reported in ``flagged`` and kept with its request (``turns.body_problems``); a body that is not JSON is
    skipped."""
    lines = [exchange(i) for i in range(4)]
    del lines[1]["request"]["max_tokens"]
    # request 3 repeats it: a problem in repeated history is flagged where it first appears
    lines[2]["request"]["messages"][0]["content"][0]["type"] = "txt"
    nan = json.dumps(exchange(4)).replace('"max_tokens": 1024', '"max_tokens": 1024, "temperature": NaN')
    log = tmp_path / "proxy.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines) + nan + "\n", encoding="utf-8")
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        res = lab.import_log(log, deep=True)
        assert res.requests == 4 and res.sessions[0].turn(1).request == lines[1]["request"]  # as logged
        assert res.flagged.to_dict("records") == [
            {"file": str(log), "line": 2, "path": "max_tokens", "problem": "Field required"},
            {"file": str(log), "line": 3, "path": "messages[0].content[0].type",
             "problem": "unknown content block type 'txt'"}]
        assert res.skipped.to_dict("records") == [
            {"file": str(log), "line": 5, "reason": "body not understood: temperature: NaN is not a JSON value"}]
        assert repr(res).endswith("1 skipped, 2 body problems flagged)")
        html = res._repr_html_()
        assert "<details><summary>2 body problems the API would refuse (stored as logged)</summary>" in html
        assert "<td>unknown content block type 'txt'</td>" in html
        problems = res.sessions[0].turns().body_problems
        assert problems.isna().tolist() == [True, False, False, True]
        assert json.loads(problems[1]) == [{"path": "max_tokens", "problem": "Field required"}]
    with pc.Lab(tmp_path / "runs.duckdb", read_only=True, progress=False) as lab:  # a later reader sees the flag
        rec = lab.store.read_request(res.sessions[0].id, 2)
        assert rec is not None and rec.problems == [
            {"path": "messages[0].content[0].type", "problem": "unknown content block type 'txt'"}]


def test_unknown_format_names_the_file_and_formats(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text('{"shopping": ["eggs", "flour"]}\n')
    with pc.Lab(progress=False) as lab, pytest.raises(ImportFormatError) as err:
        lab.import_log(notes)
    msg = str(err.value)
    assert "\n" not in msg and str(notes) in msg and "claude-code" in msg and "exchanges" in msg
    with pc.Lab(progress=False) as lab:  # inside a directory walk, such a file is listed, not fatal
        write_log(tmp_path / "proxy.jsonl", [exchange(0)])
        res = lab.import_log(tmp_path)
        assert res.requests == 1
        assert "not a known log format" in set(res.skipped.reason)


def test_a_failing_session_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = write_log(tmp_path / "proxy.jsonl", [exchange(i) for i in range(4)])
    calls = {"n": 0}
    original = pc.Session.record

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise pc.errors.StoreError("disk full (simulated)")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pc.Session, "record", flaky)
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        with pytest.raises(pc.errors.SessionError, match="proxy.jsonl:3: disk full"):
            lab.import_log(log, deep=True)
        assert lab.sql("SELECT count(*) AS n FROM turns").n[0] == 0
        assert lab.sql("SELECT count(*) AS n FROM sessions").n[0] == 0
        monkeypatch.setattr(pc.Session, "record", original)
        assert lab.import_log(log, deep=True).requests == 4


def test_each_request_priced_by_its_own_model_and_unknown_models_reported(tmp_path: Path) -> None:
    lines = [exchange(0), exchange(1, model="claude-opus-4-9"), exchange(2)]
    log = write_log(tmp_path / "proxy.jsonl", lines)
    with pc.Lab(progress=False) as lab:
        with pytest.warns(UserWarning, match="claude-opus-4-9"):
            res = lab.import_log(log, deep=True)
        assert res.requests == 3
        assert res.unknown_models == ["claude-opus-4-9"]
        df = res.sessions[0].turns()
        assert df.cost_usd.isna().tolist() == [False, True, False]
        assert list(df.model) == ["claude-sonnet-4-5", "claude-opus-4-9", "claude-sonnet-4-5"]


def test_cli_import_prints_the_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "proxy.jsonl", [exchange(i) for i in range(3)])
    assert main(["import", str(log), "--db", str(tmp_path / "runs.duckdb"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "3 new requests" in out and "measured" in out and "proxy-" in out
    assert main(["import", str(tmp_path / "missing.jsonl"), "--db", str(tmp_path / "runs.duckdb")]) == 2
    err = capsys.readouterr().err
    assert "missing.jsonl" in err and "\n" == err[-1] and err.count("\n") == 1


def test_record_refuses_anthropic_usage_it_does_not_understand() -> None:
    with pc.Lab(progress=False) as lab:
        s = lab.session(project="u")
        body = exchange(0)["request"]
        for usage, field in (({"input_tokens": "ten", "output_tokens": 1}, "usage.input_tokens"),
                             ({"input_tokens": 5, "cache_read_input_tokens": -3}, "usage.cache_read_input_tokens"),
                             ({"input_tokens": 5, "cache_creation": 7}, "usage.cache_creation")):
            with pytest.raises(pc.errors.SessionError, match=rf"request 0: {field}"):
                s.record(body, at=T0, usage=usage)
        assert s.n_turns == 0
