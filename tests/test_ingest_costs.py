"""What keeps ingest near the parse floor (issue 14): no line copies, the collector paused only during an import,
and one marshal of a growing history per ``Session.record``. Counted, not timed (timings live in benchmarks/)."""

from __future__ import annotations

import gc
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
import promptcache_nb.request._canonical as canonical
import promptcache_nb.request.validate as validate
from promptcache_nb.importers._jsonl import JsonLine, iter_json_lines
from promptcache_nb.importers._types import ReadProgress, SkippedLine

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def body(n_user: int) -> dict:
    messages: list[dict] = []
    for i in range(n_user):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"step {i}: reconcile ledger {i}"}]})
        if i < n_user - 1:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": f"done {i}"}]})
    return {"model": "claude-sonnet-4-5", "max_tokens": 512,
            "system": [{"type": "text", "text": "You are a billing agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": messages}


def exchange_line(i: int) -> str:
    return json.dumps({"v": 1, "at": (T0 + timedelta(seconds=20 * i)).isoformat(), "method": "POST",
                       "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200,
                       "request": body(i + 1), "response": None, "request_id": f"req_{i:04d}", "latency_ms": 700,
                       "provider": "anthropic",
                       "usage": {"input_tokens": 4, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 40,
                                 "output_tokens": 9}})


def test_blank_and_crlf_lines_are_consumed_and_numbered_without_copying(tmp_path: Path) -> None:
    log = tmp_path / "proxy.jsonl"
    log.write_bytes(b'{"a": 1}\r\n\r\n   \t\n{"b": 2}\n[1]\n{"c": 3')  # a last line still being written
    got = list(iter_json_lines(log))
    assert [(x.line, x.obj) for x in got if isinstance(x, JsonLine)] == [(1, {"a": 1}), (4, {"b": 2})]
    assert [(x.line, x.reason) for x in got if isinstance(x, SkippedLine)] == [(5, "a JSON list, not an object")]
    assert got[-1] == ReadProgress(str(log), 5)  # the unfinished last line is left for the next import


@pytest.mark.parametrize("enabled", [True, False])
def test_an_import_pauses_the_collector_and_restores_it_as_it_was(tmp_path: Path, enabled: bool) -> None:
    log = tmp_path / "proxy.jsonl"
    log.write_text("".join(exchange_line(i) + "\n" for i in range(3)), encoding="utf-8")
    seen: list[bool] = []
    original = pc.Session.record

    def spy(self, *a, **k):
        seen.append(gc.isenabled())
        return original(self, *a, **k)

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pc.Session, "record", spy)
            with pc.Lab(None, progress=False) as lab:
                assert lab.import_log(log).requests == 3
                assert gc.isenabled() is enabled
                # and after an import that fails half-way
                mp.setattr(pc.Session, "record", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk full")))
                log.write_text(log.read_text() + exchange_line(3) + "\n", encoding="utf-8")
                with pytest.raises(RuntimeError, match="disk full"):
                    lab.import_log(log)
                assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False, False, False]


def test_record_marshals_a_growing_history_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fresh body's messages are turned into bytes once (the check and ``prepare`` share them); the previous
    body's bytes are handed over from its ``prepare``, not computed again from the stored copy."""
    long_lists: list[int] = []
    real = canonical._snapshots

    def counting(units):
        if len(units) > 4:  # the message lists, not the one-block system
            long_lists.append(len(units))
        return real(units)

    monkeypatch.setattr(canonical, "_snapshots", counting)
    monkeypatch.setattr(validate, "_snapshots", counting)
    with pc.Lab(None, progress=False) as lab:
        s = lab.session()
        for i in range(12):
            fresh = json.loads(json.dumps(body(i + 1)))  # a new object each request, as a log or an SDK hands it
            s.record(fresh, at=T0 + timedelta(seconds=30 * i),
                     usage={"input_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 30,
                            "output_tokens": 7})
        rows = lab.sql("SELECT count(*) AS n FROM turns").n[0]
    assert rows == 12
    assert long_lists == [2 * i + 1 for i in range(2, 12)]  # one per request, of that request's own messages


def test_record_without_usage_stores_the_callers_reply_and_request_id(tmp_path: Path) -> None:
    """Simulated usage, but the answer and id the caller's agent got: those are what is stored (and reopened)."""
    answer = [{"type": "text", "text": "The ledger balances after the proration refund of 41.20 EUR."}]
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        s = lab.session()
        t = s.record(body(1), at=T0, reply=answer, request_id="req_from_my_agent")
        plain = s.record(body(2), at=T0 + timedelta(seconds=30))
        sid = s.id
    assert t.reply == answer and t.request_id == "req_from_my_agent"
    assert t.usage.source == "simulated" and t.usage.output_tokens > 0  # estimated from the caller's answer
    assert plain.request_id != "req_from_my_agent" and plain.reply != answer  # the backend's own, as before
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        again = lab.session(id=sid).turn(0)
    assert again.reply == answer and again.request_id == "req_from_my_agent"
