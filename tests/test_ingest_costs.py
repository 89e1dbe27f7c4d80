"""What keeps ingest near the parse floor (issue 14): no line copies, the collector paused only during an import,
and only the new tail of a growing history marshalled per ``Session.record``. Counted, not timed (timings live in benchmarks/)."""

from __future__ import annotations

import gc
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
import promptcache_nb.request._canonical as canonical
import promptcache_nb.request.validate as validate
from promptcache_nb.readers._jsonl import JsonLine, iter_json_lines
from promptcache_nb.readers._types import ReadProgress, SkippedLine

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
                assert lab.import_log(log, deep=True).requests == 3
                assert gc.isenabled() is enabled
                # and after an import that fails half-way
                mp.setattr(pc.Session, "record", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk full")))
                log.write_text(log.read_text() + exchange_line(3) + "\n", encoding="utf-8")
                with pytest.raises(RuntimeError, match="disk full"):
                    lab.import_log(log, deep=True)
                assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False, False, False]


def test_record_marshals_only_the_new_tail_of_a_growing_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh body's repeated history is compared with the previous body's (``==``, C speed), not marshalled: only
    its new messages are turned into bytes, once (the check and ``prepare`` share them), and the previous body's
    bytes are handed over from its ``prepare``. Issue 23: the per-call cost of a growing session is its tail."""
    marshalled: list[int] = []  # message units turned into bytes, per request
    real = canonical._snapshots

    def counting(units):
        if units and isinstance(units[0], dict) and "role" in units[0]:  # message lists, not tools or system blocks
            marshalled[-1] += len(units)
        return real(units)

    monkeypatch.setattr(canonical, "_snapshots", counting)
    monkeypatch.setattr(validate, "_snapshots", counting)
    with pc.Lab(None, progress=False) as lab:
        s = lab.session()
        for i in range(12):
            fresh = json.loads(json.dumps(body(i + 1)))  # a new object each request, as a log or an SDK hands it
            marshalled.append(0)
            s.record(fresh, at=T0 + timedelta(seconds=30 * i),
                     usage={"input_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 30,
                            "output_tokens": 7})
        rows = lab.sql("SELECT count(*) AS n FROM turns").n[0]
    assert rows == 12
    # the first request has nothing to compare; the second marshals the first body's one message (not remembered:
    # nothing was compared) for the check and for prepare, and its own two new ones; then two new messages each
    assert marshalled == [0, 1 + 2 + 1] + [2] * 10


def test_record_tells_a_number_from_its_equal_in_a_repeated_message() -> None:
    """The repeated history is compared with ``==`` only where that is exact (strings, None, containers): a message
    holding a number is compared on its bytes, so ``1`` becoming ``1.0`` or ``True`` is a new message (new bytes for
    the cache), and a Decimal there is refused as the first time it appears."""
    from decimal import Decimal

    def tool_body(n_user: int, value: object, *, label: str = "ledger") -> dict:
        b = body(n_user)
        b["messages"][0]["content"].append({"type": "text", "text": label})
        b["messages"].insert(1, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"page": value}}]})
        b["messages"].insert(2, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]})
        return b

    usage = {"input_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 30, "output_tokens": 7}
    with pc.Lab(None, progress=False) as lab:
        s = lab.session()
        for i in range(3):  # a remembered chain: the third compares against the second's remembered flags
            s.record(json.loads(json.dumps(tool_body(i + 1, 1))), at=T0 + timedelta(seconds=30 * i), usage=usage)
        n = 3
        for value in (1.0, True, 2):
            t = s.record(json.loads(json.dumps(tool_body(n + 1, value))), at=T0 + timedelta(seconds=30 * n),
                         usage=usage)
            n += 1
            assert t.request["messages"][1]["content"][0]["input"]["page"] is not None
            assert json.dumps(t.request["messages"][1]["content"][0]["input"]["page"]) == json.dumps(value)
            assert json.dumps(s.turn(t.index).request["messages"][1]["content"][0]["input"]["page"]) == \
                json.dumps(value)
            assert t.diff is not None and str(t.diff.path).startswith("messages[1]")  # a new message for the cache
        # a plain message (strings only) compared with ==: a changed string is new, an equal one repeated
        t = s.record(json.loads(json.dumps(tool_body(n + 1, 2, label="ledger!"))), at=T0 + timedelta(seconds=30 * n),
                     usage=usage)
        assert t.request["messages"][0]["content"][1]["text"] == "ledger!"
        n += 1
        bad = tool_body(n + 1, 2, label="ledger!")
        bad["messages"][1]["content"][0]["input"]["page"] = Decimal(2)
        with pytest.raises(pc.errors.BodyValidationError, match=r"messages\[1\]\.content\[0\]\.input\.page"):
            s.record(bad, at=T0 + timedelta(seconds=30 * n), usage=usage)


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


def test_record_does_the_same_python_work_at_any_history_length() -> None:
    """Issue 23, item 7: ``s.record(fresh body)`` costs its new tail, not its history. Counted two ways on a session
    whose history grows by two messages a request: the Python function calls one ``record`` makes (``sys.setprofile``;
    a per-message Python loop anywhere — validation, hashing, token counts, the diff, the cache model's prefix walk,
    the store write — would add calls for every repeated message) and the ``blocks`` rows it writes. What stays
    O(history) is C-speed: the one ``==`` pass that proves the repeated history unchanged (reading the caller's body
    once) and list copies of per-segment data."""
    import sys

    usage = {"input_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 30, "output_tokens": 7}
    blocks: list[int] = []

    def trace(sql: str, params: object) -> None:
        if blocks and ("INTO blocks" in sql or sql == "APPEND blocks"):
            blocks[-1] += len(params) // 5 if isinstance(params, list) else 1

    calls: list[int] = []

    def profile(frame: object, event: str, arg: object) -> None:
        if event == "call":
            calls[-1] += 1

    with pc.Lab(None, progress=False, trace=trace) as lab:
        s = lab.session()
        for i in range(40):
            fresh = json.loads(json.dumps(body(i + 1)))  # a new object each request, as a log or an SDK hands it
            calls.append(0)
            blocks.append(0)
            sys.setprofile(profile)
            try:
                s.record(fresh, at=T0 + timedelta(seconds=30 * i), usage=usage)
            finally:
                sys.setprofile(None)
        assert len(s.last_turn.request["messages"]) == 79  # type: ignore[union-attr]
    # from the third request on (the first has no previous body, the second compares with one not yet remembered):
    # the same count at 5 and at 79 messages; one Python call per repeated message would add 70
    steady = calls[2:]
    assert max(steady) - min(steady) <= 4, steady
    assert set(blocks[2:]) == {2}, blocks  # the new user message and the previous answer, whatever came before
