"""Observation: OpenClaw's break heuristic, change codes, payload, and each cause explained for real."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import promptcache_nb as pc
from promptcache_nb.analysis import observation_state_from_store, stored_diff_and_observation
from promptcache_nb.analysis.observe import (
    CHANGE_CODES,
    ObservationState,
    observe,
    prompt_cache_info,
    snapshot,
)
from promptcache_nb.request import canonical_bytes, prepare
from promptcache_nb.request.diff import compute_diff

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
_OUR_TAGS = re.compile(r"</?(?:b|code|div|i|span|table|td|tr)(?:\s+(?:style|title)=\"[^\"<>]*\")*\s*>")


def assert_safe_html(markup: str) -> None:
    """Only our own tags: any < or > from content is escaped (same check as test_diff.py, flat tests)."""
    stripped = _OUR_TAGS.sub("", markup)
    assert "<" not in stripped and ">" not in stripped, stripped[:200]
    assert markup.count("<div") == markup.count("</div>") and markup.count("<tr") == markup.count("</tr>")


MODEL = "claude-sonnet-4-5"
EPH = {"type": "ephemeral"}
RULES = "Rule: answer billing questions carefully and cite the ledger entry you used. " * 120  # > 1,024
TOOLS = [
    {"name": "lookup_account", "description": "Look up an account.", "input_schema": {"type": "object"}},
    {"name": "refund", "description": "Refund an invoice.", "input_schema": {"type": "object"}},
]


def body(n_messages: int = 1, **over) -> dict:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant",
             "content": [{"type": "text", "text": f"message {i}"}]}
            for i in range(n_messages)]
    out = {"model": MODEL, "max_tokens": 1024, "cache_control": dict(EPH), "tools": copy.deepcopy(TOOLS),
           "system": [{"type": "text", "text": RULES}], "messages": msgs}
    out.update(over)
    return out


def usage(read: int | None, *, write: int = 0, uncached: int = 0) -> pc.Usage:
    """A usage record; ``read=None`` is a response without cache figures."""
    return pc.Usage(input_tokens=uncached, cache_read_input_tokens=read,
                    cache_creation_input_tokens=None if read is None else write, output_tokens=5)


def run(steps: list[tuple[dict, pc.Usage]]) -> list[pc.Observation]:
    """Observe a sequence of (body, usage), chaining state as the session does."""
    out, state, prev = [], None, None
    for i, (b, u) in enumerate(steps):
        cur = prepare(b)
        d = compute_diff(prev, cur) if prev is not None else None
        obs, state = observe(cur, u, state=state, diff=d, at=T0 + timedelta(seconds=30 * i))
        out.append(obs)
        prev = cur
    return out


def reads(*values: int | None, write: int = 100) -> list[pc.Observation]:
    b = body()
    return run([(b, usage(v, write=write)) for v in values])


# -- OpenClaw's read-drop rule (the openclaw_broke cross-check) at its edges ----------------------------------

@pytest.mark.parametrize(("prev", "cur", "broke"), [
    (20_000, 19_000, False),  # exactly 0.95 x previous: not below it
    (20_000, 18_999, True),
    (1_500, 500, True),  # a drop of exactly 1,000
    (1_500, 501, False),  # 999 tokens: too small, though far below 0.95
    (100_000, 99_000, False),  # 1,000 tokens but 0.99 of the previous read
    (20_000, 25_000, False),
])
def test_break_thresholds(prev, cur, broke):
    first, second = reads(prev, cur)
    assert first.openclaw_broke is False and first.previous_cache_read is None
    assert second.openclaw_broke is broke and second.previous_cache_read == prev and second.cache_read == cur
    assert second.complete_miss is False


def test_no_check_without_a_positive_baseline():
    obs = reads(0, 0, 5_000, 0)
    assert [o.openclaw_broke for o in obs] == [False, False, False, True]
    assert [o.previous_cache_read for o in obs] == [None, 0, 0, 5_000]


def test_missing_usage_keeps_the_baseline():
    first, gap, third = reads(20_000, None, 0)
    assert gap.openclaw_broke is None and gap.cache_read is None and gap.previous_cache_read == 20_000
    assert "No usage reported, so no verdict." in gap.explanation
    assert third.openclaw_broke is True and third.previous_cache_read == 20_000


def test_complete_miss_with_an_unchanged_snapshot_is_a_break():
    a, b = reads(800, 0, write=900)
    assert b.openclaw_broke is True and b.complete_miss  # the drop (800) alone is under 1,000 tokens
    # nothing sent besides the read: no complete miss
    _, c = run([(body(), usage(800)), (body(), usage(0, write=0, uncached=0))])
    assert c.openclaw_broke is False
    # the snapshot changed: an explained miss, not a break
    _, d = run([(body(), usage(800)), (body(system="Different prompt."), usage(0, write=900))])
    assert d.openclaw_broke is False and [ch.code for ch in d.changes] == ["systemPrompt"]


def test_complete_miss_compares_with_the_snapshot_of_the_last_cache_read():
    changed = body(system="Different prompt.")
    obs = run([(body(), usage(800)), (changed, usage(None)), (body(), usage(0, write=900))])
    assert obs[2].openclaw_broke is True and obs[2].complete_miss  # same snapshot as the read of request 0
    assert [c.code for c in obs[2].changes] == ["systemPrompt"]  # vs the previous request, though
    obs = run([(body(), usage(800)), (changed, usage(None)), (changed, usage(0, write=900))])
    assert obs[2].openclaw_broke is False


# -- change codes --------------------------------------------------------------------------------

def test_change_codes_come_in_openclaw_order():
    a = prepare(body())
    tools = copy.deepcopy(TOOLS) + [{"name": "grep", "description": "Search.", "input_schema": {}}]
    b_body = body(model="claude-haiku-4-5", stream=True, system=[{"type": "text", "text": "Other."}],
                  tools=tools,
                  cache_control={"type": "ephemeral", "ttl": "1h"})
    b = prepare(b_body)
    st0 = ObservationState(snapshot=snapshot(a, transport="direct"))
    obs, _ = observe(b, usage(0), state=st0, diff=compute_diff(a, b), transport="http")
    codes = [c.code for c in obs.changes]
    assert codes == ["model", "cacheRetention", "transport", "streamStrategy", "systemPrompt", "tools"]
    assert codes == [c for c in CHANGE_CODES if c in codes]
    details = {c.code: c.detail for c in obs.changes}
    assert details["model"] == "anthropic/claude-sonnet-4-5 -> anthropic/claude-haiku-4-5"
    assert details["cacheRetention"] == "short -> long"
    assert details["transport"] == "direct -> http"
    assert details["streamStrategy"] == "no-stream -> stream"
    assert details["systemPrompt"] == "system prompt digest changed"
    assert details["tools"] == "2 -> 3 tools; added: grep"


def test_messages_code_follows_the_snapshot_codes_and_respects_restart_class_changes():
    a = body(3)
    b = copy.deepcopy(a)
    b["system"] = [{"type": "text", "text": "Other."}]
    b["messages"][1]["content"][0]["text"] = "rewritten"
    _, obs = run([(a, usage(5_000)), (b, usage(0, write=10))])
    assert [c.code for c in obs.changes] == ["systemPrompt", "messages"]
    assert obs.changes[1].detail == (
        "message 1 (assistant) differs: content[0] text changed; history must be append-only")
    b["model"] = "claude-haiku-4-5"  # a restart-class change: no history check (OpenClaw main)
    _, obs = run([(a, usage(5_000)), (b, usage(0, write=10))])
    assert [c.code for c in obs.changes] == ["model", "systemPrompt"]


def test_tools_details_and_tool_order():
    a = prepare(body())
    same_count = copy.deepcopy(TOOLS)
    same_count[1]["description"] = "Refund an invoice, partially if asked."
    b = prepare(body(tools=same_count))
    (change,) = observe(b, usage(0), state=ObservationState(snapshot(a)))[0].changes
    assert change.detail == "tool set changed with same count; changed: refund (description)"
    reordered = prepare(body(tools=list(reversed(TOOLS))))
    obs, _ = observe(reordered, usage(0), state=ObservationState(snapshot(a)),
                     diff=compute_diff(a, reordered))
    assert obs.changes == ()  # names are sorted: OpenClaw does not see a reorder...
    assert obs.diff.path == "tools[0]" and obs.diff.tools_reordered  # ... the cache does
    assert "same set in another order" in obs.explanation


def test_snapshot_fields():
    assert snapshot(prepare(body())).cache_retention == "short"
    assert snapshot(prepare(body(cache_control=None))).cache_retention == "none"
    one_hour = body(cache_control=None,
                    system=[{"type": "text", "text": "x", "cache_control": {**EPH, "ttl": "1h"}}])
    assert snapshot(prepare(one_hour)).cache_retention == "long"
    s = snapshot(prepare(body(stream=True)), transport="http")
    assert (s.stream_strategy, s.transport, s.tool_count, s.tool_names) == (
        "stream", "http", 2, ("lookup_account", "refund"))
    # cache_control markers do not change the system digest
    marked = body(system=[{"type": "text", "text": RULES, "cache_control": EPH}])
    assert snapshot(prepare(marked)).system_digest == snapshot(prepare(body())).system_digest


# -- the context-engine payload ------------------------------------------------------------------

def test_prompt_cache_info_copies_only_present_fields():
    assert prompt_cache_info() is None
    assert prompt_cache_info(last_call_usage={"input": None}, last_cache_touch_at=float("inf")) is None
    info = prompt_cache_info(retention="short", last_call_usage={"input": 3, "output": None},
                             observation={"broke": False, "previousCacheRead": None, "cacheRead": 7,
                                          "changes": []},
                             last_cache_touch_at=1_700_000_000_000.0)
    assert info == {"retention": "short", "lastCallUsage": {"input": 3},
                    "observation": {"broke": False, "cacheRead": 7}, "lastCacheTouchAt": 1_700_000_000_000}


def test_turn_prompt_cache_info_shape():
    first, second, third = reads(20_000, 0, None)
    info = second.prompt_cache_info()
    assert info == {
        "retention": "short",
        "lastCallUsage": {"input": 0, "output": 5, "cacheRead": 0, "cacheWrite": 100, "total": 105},
        "observation": {"broke": True, "previousCacheRead": 20_000, "cacheRead": 0},
        "lastCacheTouchAt": int((T0 + timedelta(seconds=30)).timestamp() * 1000),
    }
    # no usage: the touch time is carried forward, no observation (no break, change or read)
    info3 = third.prompt_cache_info()
    assert "observation" not in info3 and info3["lastCacheTouchAt"] == info["lastCacheTouchAt"]
    assert info3["lastCallUsage"] == {"input": 0, "output": 5}


# -- each cause, produced for real through a Lab session -------------------------------------------

def record_session(lab: pc.Lab) -> pc.Session:
    return lab.session(system="unused by record()", start=T0)


def explanation_row(lab: pc.Lab, session: pc.Session, idx: int) -> dict:
    df = lab.sql("SELECT * FROM turns WHERE session_id = ? AND idx = ?", [session.id, idx])
    return df.iloc[0].to_dict()


def test_ttl_expiry_after_a_six_minute_gap():
    with pc.Lab(progress=False) as lab:
        s = record_session(lab)
        s.record(body(1), at=T0)
        t1 = s.record(body(2), at=T0 + timedelta(seconds=30))
        t2 = s.record(body(3), at=T0 + timedelta(seconds=30) + timedelta(minutes=6))
        assert t1.cache_reason == "hit" and t2.cache_reason == "ttl_expired"
        obs = t2.observation
        assert obs.broke is True and obs.previous_cache_read == t1.usage.cache_read_input_tokens > 0
        assert obs.cache_read == 0 and obs.changes == ()
        assert ("TTL expired: the cached prefix was last used 6m00s before this request, longer than its "
                "5m TTL") in obs.explanation
        assert obs.explanation.startswith("Cache break: read 0 cached tokens and sent again ")
        assert "The request only appended 1 segment to the previous one." in obs.explanation
        broken = lab.sql("select idx from turns where broke")
        assert broken.idx.tolist() == [2]


def test_below_minimum_with_a_tiny_prompt():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="You are terse.", start=T0)
        s.step("hi", reply="yo", at=T0)
        t = s.step("again", reply="yo", at=T0 + timedelta(seconds=10))
        assert t.cache_reason == "below_minimum" and t.observation.broke is False
        assert re.search(r"Below the minimum: the prompt up to the last breakpoint is ~\d+ tokens, under "
                         r"claude-sonnet-4-5's 1,024-token minimum", t.observation.explanation)


def test_lookback_exceeded_with_more_than_twenty_new_blocks():
    with pc.Lab(progress=False) as lab:
        s = record_session(lab)
        s.record(body(1), at=T0)
        s.record(body(2), at=T0 + timedelta(seconds=10))
        many = body(2)
        # 21 new blocks: the breakpoint now sits 21 positions after the entry turn 1 wrote (lookback: 20)
        many["messages"].append({"role": "user",
                                 "content": [{"type": "text", "text": f"part {i}"} for i in range(21)]})
        t = s.record(many, at=T0 + timedelta(seconds=20))
        assert t.cache_reason == "lookback_exceeded" and t.observation.broke is True
        explanation = t.observation.explanation
        assert "Lookback exceeded: a live cache entry ends at messages[1].content[0]" in explanation
        assert "20-block lookback" in explanation


def test_prefix_change_by_editing_the_host_prompt():
    host = "You are a careful support agent for a billing platform. " * 120
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=host, start=T0)
        s.step("hello", reply="hi", at=T0)
        s.step("next", reply="ok", at=T0 + timedelta(seconds=10))
        s.edit_host_prompt(append=" ZEBRA rule.")
        t = s.step("again", reply="ok", at=T0 + timedelta(seconds=20))
        obs, d = t.observation, t.diff
        assert t.cache_reason == "prefix_changed" and obs.broke is True
        assert [c.code for c in obs.changes] == ["systemPrompt"]
        where = f"Prefix changed at system[0] (byte {d.byte_offset:,}, ~token {d.token_offset:,})"
        assert where in obs.explanation
        assert "no whole block before it was unchanged" in obs.explanation
        assert "Events before it: host_prompt_edit." in obs.explanation
        assert canonical_bytes(t.request)[d.byte_offset:d.byte_offset + 6] == b" ZEBRA"
        row = explanation_row(lab, s, 2)
        assert row["explanation"] == obs.explanation and row["broke"]
        assert json.loads(row["changes"]) == [
            {"code": "systemPrompt", "detail": "system prompt digest changed"}]


def test_model_switch():
    host = "You are a careful support agent for a billing platform. " * 400  # above haiku's minimum too
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=host, start=T0)
        s.step("hello", reply="hi", at=T0)
        s.step("next", reply="ok", at=T0 + timedelta(seconds=10))
        s.switch_model("claude-haiku-4-5")
        t = s.step("again", reply="ok", at=T0 + timedelta(seconds=20))
        obs = t.observation
        assert t.cache_reason == "model_switch" and obs.broke is True and obs.openclaw_broke is True
        assert [c.code for c in obs.changes] == ["model"]
        assert "Model switch: claude-sonnet-4-5 -> claude-haiku-4-5; caches are kept per model" \
            in obs.explanation
        assert t.diff.path == "model" and t.diff.shared_prefix_tokens == 0


def test_cold_hit_no_breakpoint_and_not_written():
    with pc.Lab(progress=False) as lab:
        s = record_session(lab)
        t0 = s.record(body(1, cache_control=None), at=T0)
        t1 = s.record(body(2, cache_control=None), at=T0 + timedelta(seconds=10))
        t2 = s.record(body(3), at=T0 + timedelta(seconds=20))
        t3 = s.record(body(4), at=T0 + timedelta(seconds=30))
        assert [t.cache_reason for t in (t0, t1, t2, t3)] == ["cold", "no_breakpoint", "not_written", "hit"]
        assert t0.observation.explanation.startswith(
            "First request of the session. Cold cache: nothing was cached")
        assert "No breakpoint: the request has no cache_control marker" in t1.observation.explanation
        assert "Not written: the previous request left no cache entry" in t2.observation.explanation
        assert [c.code for c in t2.observation.changes] == ["cacheRetention"]
        assert "The cache read everything the previous request left cached." in t3.observation.explanation


def test_moved_marker_is_no_break_through_a_session():
    with pc.Lab(progress=False) as lab:
        s = record_session(lab)
        first = body(1, cache_control=None)
        first["messages"][0]["content"][0]["cache_control"] = dict(EPH)
        s.record(first, at=T0)
        second = body(2, cache_control=None)
        second["messages"][1]["content"][0]["cache_control"] = dict(EPH)
        t = s.record(second, at=T0 + timedelta(seconds=10))
        assert t.cache_reason == "hit" and t.observation.broke is False and t.diff.pure_append
        assert "Ignored (never affects caching): breakpoints." in t.observation.explanation
        row = explanation_row(lab, s, 1)
        assert row["pure_append"] and not row["broke"] and row["diverge_path"] is None


def test_history_rewrite_and_declared_compaction():
    with pc.Lab(progress=False) as lab:
        s = record_session(lab)
        s.record(body(3), at=T0)
        rewritten = body(4)
        rewritten["messages"][0]["content"][0]["text"] = "edited"
        t = s.record(rewritten, at=T0 + timedelta(seconds=10))
        assert [c.code for c in t.observation.changes] == ["messages"]
        assert "message 0 (user) differs: content[0] text changed; history must be append-only" in \
            t.observation.explanation
        s2 = lab.session(system="You are a careful support agent. " * 200, start=T0)
        s2.step("one", reply="a", at=T0)
        s2.compact("We talked about billing.")
        t = s2.step("two", reply="b", at=T0 + timedelta(seconds=10))
        (change,) = t.observation.changes
        assert change.code == "messages" and change.detail.startswith("compaction changed provider history")


# -- restart and stored turns -------------------------------------------------------------------

def test_state_survives_a_restart_and_stored_turns_match():
    with pc.Lab(progress=False) as lab:
        s = record_session(lab)
        s.record(body(1), at=T0)
        live = s.record(body(2), at=T0 + timedelta(seconds=30))
        state_before = s._state.observation
        s = s.restart()
        assert observation_state_from_store(lab.store, s.id) == state_before
        t = s.record(body(3), at=T0 + timedelta(minutes=7))
        assert t.cache_reason == "ttl_expired" and t.observation.broke is True
        assert t.observation.previous_cache_read == live.usage.cache_read_input_tokens
        stored = s.turn(2)
        assert stored.observation.explanation == t.observation.explanation
        assert stored.observation.changes == t.observation.changes
        assert stored.observation.broke is True
        assert stored.observation.previous_cache_read == live.usage.cache_read
        assert stored.observation.prompt_cache_info() == t.prompt_cache_info()
        assert repr(stored.diff) == repr(t.diff)
        assert s.turns().broke.tolist() == [False, False, True]
        # turn 0 has no previous request: no diff, the observation from its row (session passes None)
        d0, o0 = stored_diff_and_observation(lab.store, s.id, 0, None, lab.store.turn_body(s.id, 0))
        assert d0 is None and o0.explanation.startswith("First request of the session.")


# -- display -------------------------------------------------------------------------------------

def test_observation_repr_and_html_are_deterministic_and_escaped():
    hostile = [{"name": "<script>alert(1)</script>", "description": '<img src=x onerror="alert(1)">',
                "input_schema": {}}]
    first, second = run([(body(), usage(20_000)), (body(tools=hostile), usage(0, write=50))])
    assert repr(second) == "Observation(broke=True, cache_read=0, previous_cache_read=20000, changes=[tools])"
    markup = second._repr_html_()
    assert "<script>" not in markup and "onerror=\"" not in markup
    assert_safe_html(markup)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=40), st.text(max_size=40))
def test_observation_html_is_safe_for_arbitrary_unicode(name, system):
    tools = [{"name": name, "description": system, "input_schema": {}}]
    changed = body(tools=tools, system=[{"type": "text", "text": system or "x"}])
    _, obs = run([(body(), usage(5_000)), (changed, usage(0, write=10))])
    assert_safe_html(obs._repr_html_())


def test_transport_survives_a_restart():
    """A session reaching its cache over HTTP keeps transport=http after a restart (stored per turn)."""
    import promptcache_nb as pc
    from promptcache_nb.live import Backend, BackendResponse

    class OverHttp(Backend):
        def send(self, request, *, at, cache):
            result = cache.process(request, at)
            return BackendResponse(usage=result.usage, cache_result=result)

    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="You help with invoices. " * 200, backend=OverHttp())
        s.step("a", reply="b", at=t0)
        s = s.restart()
        t = s.step("c", reply="d", at=t0 + timedelta(seconds=20))
        assert [c.code for c in t.observation.changes] == []
        assert lab.sql("select distinct transport from turns").transport.tolist() == ["http"]
