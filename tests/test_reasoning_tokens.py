"""``turns.reasoning_tokens`` (m012): the part of the output a model spent thinking, as its provider reported it.

Gemini reports ``thoughtsTokenCount`` apart from ``candidatesTokenCount`` and bills both as output (Gemini CLI's
``tokens.thoughts`` / ``tokens.output``): the stored output is their sum, as billed, and the thoughts are a split
of it in their own column. Totals and costs are what they were before the column existed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from genai_prices import Usage as GUsage
from genai_prices import calc_price

import promptcache_nb as pc

SID = "5b7e2d90-4c1a-4f3e-9a8d-2e6c0b1f7a35"
MODEL = "gemini-2.5-pro"
#: (input incl. cached, cached, output = candidates, thoughts) per gemini message, as Gemini CLI logs them
CALLS = [(8120, 0, 64, 402), (9305, 8110, 171, 0), (9988, 9290, 45, 1280)]


def _gemini_chat(folder: Path) -> Path:
    """A Gemini CLI JSONL chat (the mutation log of agent_log_formats.md §5): a question, three model calls."""
    chats = folder / "tmp" / "proj" / "chats"
    chats.mkdir(parents=True)
    lines: list[dict] = [{"sessionId": SID, "projectHash": "4e1f" * 16, "startTime": "2026-06-03T10:00:00.000Z",
                          "lastUpdated": "2026-06-03T10:00:00.000Z", "kind": "main"},
                         {"id": "u-1", "timestamp": "2026-06-03T10:00:00.000Z", "type": "user",
                          "content": [{"text": "Why does test_refund_rounding fail on CI only?"}]}]
    for k, (inp, cached, out, thoughts) in enumerate(CALLS):
        gid = f"g-{k + 1}"
        when = f"2026-06-03T10:0{k}:30.000Z"
        lines.append({"id": gid, "timestamp": when, "type": "gemini", "content": f"Step {k + 1}.", "thoughts": [],
                      "tokens": None, "model": MODEL})  # written before its usage arrives: the last record wins
        lines.append({"id": gid, "timestamp": when, "type": "gemini", "content": f"Step {k + 1}.", "thoughts": [],
                      "tokens": {"input": inp, "output": out, "cached": cached, "thoughts": thoughts, "tool": 0,
                                 "total": inp + out + thoughts}, "model": MODEL})
        lines.append({"id": f"u-{k + 2}", "timestamp": f"2026-06-03T10:0{k}:45.000Z", "type": "user",
                      "content": [{"text": f"Go on ({k + 1})."}]})
    path = chats / f"session-2026-06-03T10-00-{SID[:8]}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def test_gemini_thoughts_get_their_own_column_and_the_bill_is_unchanged(tmp_path):
    chat = _gemini_chat(tmp_path)
    with pc.Lab(tmp_path / "s.duckdb", progress=False) as lab:
        res = lab.import_log(chat)
        assert res.requests == len(CALLS) and res.skipped.empty
        df = lab.sql("SELECT idx, input_tokens, cache_read_input_tokens, output_tokens, reasoning_tokens, cost_usd "
                     "FROM turns ORDER BY idx")
        s = lab.session(id=res.sessions[0].id)
        frame = s.turns()
        turn = s.turn(2)
    assert list(df.reasoning_tokens) == [t for *_, t in CALLS]
    assert list(frame.reasoning_tokens) == [t for *_, t in CALLS]  # s.turns() shows it beside output_tokens
    assert list(df.output_tokens) == [out + thoughts for _, _, out, thoughts in CALLS]  # billed as output
    assert turn.usage.reasoning_tokens == CALLS[2][3] and turn.usage.output_tokens == CALLS[2][2] + CALLS[2][3]
    for row, (inp, cached, out, thoughts) in zip(df.itertuples(), CALLS, strict=True):
        assert (row.input_tokens, row.cache_read_input_tokens) == (inp - cached, cached)
        when = datetime(2026, 6, 3, 10, row.idx, 30, tzinfo=UTC)
        # genai-prices' own bill of the logged counts: thoughts priced as output, nothing priced twice
        bill = calc_price(GUsage(input_tokens=inp, cache_read_tokens=cached, output_tokens=out + thoughts),
                          model_ref=MODEL, provider_id="google", genai_request_timestamp=when)
        assert abs(row.cost_usd - float(bill.total_price)) < 1e-12


def test_an_otlp_span_reports_reasoning_inside_its_output(tmp_path):
    def attr(key, value):
        kind = "intValue" if isinstance(value, int) else "stringValue"
        return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}

    span = {"traceId": "a1" * 16, "spanId": "b2" * 8, "name": "chat o4-mini", "kind": 3,
            "startTimeUnixNano": "1780480800000000000", "endTimeUnixNano": "1780480803000000000",
            "attributes": [attr("gen_ai.operation.name", "chat"), attr("gen_ai.provider.name", "openai"),
                           attr("gen_ai.request.model", "o4-mini"), attr("gen_ai.usage.input_tokens", 2100),
                           attr("gen_ai.usage.cache_read.input_tokens", 1024),
                           attr("gen_ai.usage.output_tokens", 900),
                           attr("gen_ai.usage.reasoning.output_tokens", 640)]}
    doc = {"resourceSpans": [{"resource": {"attributes": [attr("service.name", "triage-bot")]},
                              "scopeSpans": [{"scope": {"name": "openai-instrumentation"}, "spans": [span]}]}]}
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pc.Lab(progress=False) as lab:
        lab.import_log(path)
        row = lab.sql("SELECT input_tokens, cache_read_input_tokens, output_tokens, reasoning_tokens FROM turns")
    assert tuple(int(x) for x in row.iloc[0]) == (2100 - 1024, 1024, 900, 640)


def test_requests_that_report_no_reasoning_store_null(tmp_path):
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="You help.")
        s.step("hi", reply="hello", at=datetime(2026, 6, 3, 10, tzinfo=UTC))
        assert lab.sql("SELECT reasoning_tokens FROM turns").reasoning_tokens.isna().all()
