"""Causes the provider documents (issue #36 item 6): a thinking change, and a first request that read.

Anthropic: changing the thinking parameters (enabled/disabled, budget) invalidates the cached message prefixes;
cached tools and system prompts stay valid (docs/provider_cache_rules.md#anthropic-invalidation). A rebuild after
one is ``thinking_changed`` — from pi's ``thinking_level_change`` event or from a ``thinking`` field that differs
— in the measured cause and in the Anthropic simulation alike. A session's first request that read tokens read an
entry another session wrote: it is no cold cache.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.cause import NOISE_FLOOR
from promptcache_nb.cache._reasons import NOT_REBUILD, thinking_change
from promptcache_nb.request import prepare

# test-only (tests/fixtures/logs links to the shipped example logs, which other tests import whole)
PI_THINKING = next((Path(__file__).parent / "fixtures" / "pi_thinking" / "--home-ann-ledger-thinking--").glob("*.jsonl"))
T0 = datetime(2026, 11, 4, 10, 0, tzinfo=UTC)
SYSTEM = "You reconcile the ledger service's payouts against the bank statements and explain each mismatch. " * 90
TOOLS = [{"name": "read_statement", "description": "Read one bank statement line by id. " * 20,
          "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}}]
BUDGET = {"type": "enabled", "budget_tokens": 2048}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def body(n_turns: int, *, thinking: dict | None = BUDGET, system: str = SYSTEM) -> dict:
    msgs: list[dict] = []
    for i in range(n_turns):
        if i:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"Statement line {i - 1} matches."}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"Check payout batch {i} against line {i}."}]})
    out = {"model": "claude-sonnet-4-5", "max_tokens": 16_000, "tools": TOOLS,
           "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}], "messages": msgs,
           "cache_control": {"type": "ephemeral"}}
    if thinking is not None:
        out["thinking"] = thinking
    return out


def usage(uncached: int, read: int, write: int) -> dict:
    return {"input_tokens": uncached, "cache_read_input_tokens": read, "cache_creation_input_tokens": write,
            "output_tokens": 300}


@pytest.fixture
def lab(tmp_path: Path):
    with pc.Lab(tmp_path / "thinking.duckdb", progress=False) as lab:
        yield lab


# -- the rule ----------------------------------------------------------------------------------------------
def test_the_rule_compares_the_thinking_field_and_reads_the_event() -> None:
    high = {"type": "enabled", "budget_tokens": 8192}
    assert thinking_change({"thinking": BUDGET}, {"thinking": dict(BUDGET)}) is None  # equal values, other objects
    assert thinking_change({"thinking": BUDGET}, {"thinking": high}) == {
        "thinking_before": '{"budget_tokens":2048,"type":"enabled"}', "thinking_now": '{"budget_tokens":8192,"type":"enabled"}'}
    assert thinking_change({}, {"thinking": {"type": "disabled"}}) is not None  # turned on or off counts
    assert thinking_change({}, {}, ["model_switch"]) is None
    assert thinking_change({}, {}, ["thinking_level_change"]) == {"thinking_event": "thinking_level_change"}


# -- pi: the event ------------------------------------------------------------------------------------------
def test_a_pi_thinking_level_change_then_a_rebuild_is_thinking_changed(lab: pc.Lab) -> None:
    res = lab.import_log(PI_THINKING, progress=False)
    assert res.requests == 8 and list(res.skipped.reason) == ["stopReason 'aborted' with zero usage: not a billed request"]
    s = res.sessions[0]
    df = s.turns()
    events = [json.loads(e) if e else [] for e in df.events]
    changed = [i for i, e in enumerate(events) if "thinking_level_change" in e]
    assert changed == [0, 3, 7]  # the last passed on by the aborted stub before it
    rows = pc.rebuilds(s)
    assert list(rows.idx) == [3, 7] and set(rows.reason) == {"thinking_changed"}
    for r in rows.itertuples():
        prev, cur = df.iloc[r.idx - 1], df.iloc[r.idx]
        held = int(prev.input_tokens + prev.cache_read_input_tokens + prev.cache_creation_input_tokens)
        lost = min(held - int(cur.cache_read_input_tokens), int(cur.cache_creation_input_tokens))
        assert r.lost_tokens == lost > NOISE_FLOOR  # measured, never adjusted
        t = s.turn(int(r.idx))
        assert t.cache_reason == "thinking_changed" and r.explanation in t.observation.explanation
        assert "thinking level changed before this request" in r.cause and "tools and system stay cached" in r.cause
        assert "Provider-side miss" not in t.observation.explanation
    assert set(df.cache_reason[1:]) - {"thinking_changed"} <= NOT_REBUILD  # nothing else is called a rebuild


def test_a_pi_first_request_that_read_is_not_cold(lab: pc.Lab) -> None:
    s = lab.import_log(PI_THINKING, progress=False).sessions[0]
    first = s.turn(0)
    read = first.usage.cache_read_input_tokens
    assert read and first.cache_reason == "hit"
    text = first.observation.explanation
    assert "Cold" not in text and f"read {read:,} tokens another session of this account wrote" in text


# -- Anthropic bodies: the field ------------------------------------------------------------------------------
def test_a_measured_thinking_budget_change_is_thinking_changed(lab: pc.Lab) -> None:
    s = lab.session(project="measured-thinking")
    s.record(body(4), at=at(0), usage=usage(3, 0, 31_000))
    s.record(body(5), at=at(20), usage=usage(3, 31_000, 900))
    t = s.record(body(6, thinking={"type": "enabled", "budget_tokens": 8192}), at=at(40),
                 usage=usage(3, 24_100, 8_800))
    row = pc.rebuilds(s).iloc[0]
    assert (row.idx, row.reason, t.cache_reason) == (2, "thinking_changed", "thinking_changed")
    assert row.lost_tokens == 31_903 - 24_100
    assert row.detail["thinking_before"] == '{"budget_tokens":2048,"type":"enabled"}'
    assert row.detail["divergence_path"] == "thinking"
    assert row.cause.startswith("thinking changed from {\"budget_tokens\":2048")


def test_a_thinking_change_with_an_earlier_change_is_that_prefix_change(lab: pc.Lab) -> None:
    s = lab.session(project="measured-both")
    s.record(body(4), at=at(0), usage=usage(3, 0, 31_000))
    t = s.record(body(5, thinking=None, system=SYSTEM.replace("mismatch", "difference", 1)), at=at(20),
                 usage=usage(3, 1_200, 31_000))
    assert t.cache_reason == "prefix_changed"  # the system changed too: more than a thinking change loses


def test_the_simulation_rewrites_the_messages_and_reads_tools_and_system(lab: pc.Lab) -> None:
    s = lab.session(project="simulated-thinking")
    s.record(body(4), at=at(0))
    s.record(body(5), at=at(20))
    t = s.record(body(6, thinking={"type": "disabled"}), at=at(40))
    assert t.cache_reason == "thinking_changed" and t.cache_result is not None
    assert t.cache_result.detail["thinking_now"] == '{"type":"disabled"}'
    kinds = [seg.kind for seg in prepare(t.request).segments]
    states = t.segment_states
    before_messages = [st for k, st in zip(kinds, states, strict=True) if k in ("tool", "system")]
    messages = [st for k, st in zip(kinds, states, strict=True) if k not in ("tool", "system")]
    assert before_messages and set(before_messages) == {"read"}  # tools and system stay cached
    assert "read" not in messages and "write" in messages  # the messages are written again
    read = t.usage.cache_read_input_tokens
    assert read and read < t.usage.total_input_tokens  # type: ignore[operator]
    # the same body again, thinking unchanged: everything the previous request wrote is read
    again = s.record(body(6, thinking={"type": "disabled"}), at=at(60))
    assert again.cache_reason == "hit" and again.usage.cache_read_input_tokens > read  # type: ignore[operator]
    assert "Thinking changed from" in t.observation.explanation


def test_a_measured_first_request_reads_another_sessions_entry(lab: pc.Lab) -> None:
    warm = lab.session(project="first-read").record(body(1), at=at(0), usage=usage(3, 17_450, 2_100))
    assert warm.cache_reason == "hit" and "Cold" not in warm.observation.explanation
    assert "read 17,450 tokens another session of this account wrote, and wrote 2,100 more" in \
        warm.observation.explanation
    cold = lab.session(project="first-cold").record(body(1), at=at(0), usage=usage(3, 0, 19_550))
    assert cold.cache_reason == "cold"
    assert "Cold cache: nothing was cached before this request; it wrote 19,550 tokens" in cold.observation.explanation


def test_a_shared_cache_names_the_session_whose_entry_a_first_request_read(lab: pc.Lab) -> None:
    parent = lab.session(project="scope", cache_scope="project", start=T0)
    for n in (1, 2, 3):
        parent.record(body(n), at=at(20 * n))
    child = lab.session(project="scope", cache_scope="project", start=T0)
    t = child.record(body(3), at=at(70))  # a sub-agent re-sending the parent's prefix: simulated
    assert t.cache_reason == "hit" and t.cache_result is not None
    assert t.cache_result.detail["read_from_session"] == parent.id
    assert f"tokens session {parent.id} wrote" in t.observation.explanation
    # measured: the read is the API's; which session wrote it is the simulation's answer, said as such
    other = lab.session(project="scope", cache_scope="project", start=T0)
    m = other.record(body(3), at=at(80), usage=usage(3, 17_450, 120))
    assert m.cache_reason == "hit"
    assert ("read 17,450 tokens another session of this account wrote, and wrote 120 more (in the simulated "
            f"shared cache, session {parent.id} wrote the entry it read)") in m.observation.explanation
