"""One implementation of each concept: reason codes are an enum whose prose comes from one ``explain``
(used by the observation and by ``rebuilds``), and every summary speaks one column vocabulary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis import frames, observe
from promptcache_nb.analysis.frames import SUMMARY_ALIASES, usage_totals
from promptcache_nb.cache import REASONS, Reason, explain_reason

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOST = "You are the billing support assistant. Answer precisely and cite the ticket. " * 150


def test_reason_codes_are_one_enum() -> None:
    assert REASONS == ("hit", "cold", "model_switch", "below_minimum", "ttl_expired", "lookback_exceeded",
                       "prefix_changed", "thinking_changed", "no_breakpoint", "not_written", "evicted", "unsupported")
    assert set(REASONS) < {r.value for r in Reason}
    assert Reason.TTL_EXPIRED == "ttl_expired"  # stored as text, compared as text
    assert {"compaction", "unlogged_prefix_changed", "provider_miss"} <= {r.value for r in Reason} - set(REASONS)


@pytest.mark.parametrize("reason", list(Reason))
def test_every_reason_has_both_texts(reason: Reason) -> None:
    short, sentence = explain_reason(reason, {}, short=True), explain_reason(reason, {})
    assert short and sentence and "\n" not in short + sentence
    assert sentence.endswith(".")
    assert reason.explain({}, short=True) == short


def test_unknown_codes_are_named_as_they_are() -> None:
    assert explain_reason("spilled_to_disk", {}) == "Cache model reason: spilled_to_disk."
    assert explain_reason("spilled_to_disk", {}, short=True) == "spilled_to_disk"
    assert explain_reason(None, None, short=True) == "None"


def test_the_two_lengths_of_a_ttl_expiry() -> None:
    detail = {"expired_ttl": "5m", "expired_after_seconds": 420.0}
    assert explain_reason("ttl_expired", detail, short=True) == "TTL expiry: the 5m entry was idle 7m00s"
    assert explain_reason("ttl_expired", detail) == (
        "TTL expired: the cached prefix was last used 7m00s before this request, longer than its 5m TTL, so it "
        "had to be written again.")
    # OpenAI's and DeepSeek's models say it with other keys
    assert explain_reason("ttl_expired", {"expired": "idle", "idle_seconds": 600}, short=True) == (
        "TTL expiry: the idle entry was idle 10m00s")


def test_observation_and_rebuilds_use_the_one_explain() -> None:
    assert not hasattr(observe, "_cause")  # the second copy is gone
    with pc.Lab(progress=False) as lab:
        s = lab.session("clock_at_tail", system=HOST, start=T0)
        s.step("hello", reply="hi", at=T0)
        t = s.step("after lunch", reply="back", at=T0 + timedelta(minutes=40))
        assert t.cache_reason == "ttl_expired"
        expected = explain_reason("ttl_expired", t.cache_detail, gap=2400.0, request=t.prepared, usage=t.usage)
        assert expected in t.observation.explanation
        row = pc.rebuilds(s).iloc[0]
        assert row.cause == explain_reason("ttl_expired", t.cache_detail, short=True, gap=2400.0)


def test_summaries_share_one_vocabulary() -> None:
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, start=T0)
        for i in range(3):
            s.step(f"question {i}", reply="ok")
        summary = pc.summarize(s.turns())
        totals = usage_totals(s.turns())
        assert {k: summary[k] for k in totals} == totals
        assert list(summary) == ["requests", "total_input", "cache_read", "cache_write", "uncached",
                                 "ideal_cache_read", "cache_read_pct", "efficiency", "breaks", "rebuilds", "cost_usd",
                                 "cost_no_cache_usd", "saved_usd"]
        compared = pc.compare_caches(s, ["anthropic", "openai"])
        assert "cache_read_pct" in compared and list(compared.read_pct) == list(compared.cache_read_pct)
        own = compared.set_index("cache").loc["anthropic"]
        assert own.cache_read_pct == summary["cache_read_pct"]  # the same session, the same figure
        assert set(totals) <= set(frames.SUMMARY_COLUMNS) and set(totals) <= set(compared.columns)
        assert SUMMARY_ALIASES == {"read_pct": "cache_read_pct"}
