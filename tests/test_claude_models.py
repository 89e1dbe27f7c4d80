"""Every Claude model genai-prices prices is simulated by the Anthropic cache model, with its documented minimum
cacheable length (or its family's nearest, said on the row) and priced at the library's own read and write rates
for that model (docs/provider_cache_rules.md#anthropic-minimum-length, #anthropic-pricing); Bedrock's entries live
5 minutes, or an hour where Bedrock lists the 1-hour TTL (docs/provider_cache_rules.md#bedrock)."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from genai_prices import Usage as LibraryUsage
from genai_prices import calc_price, data_snapshot

import promptcache_nb as pc
from promptcache_nb.cache.anthropic import MIN_CACHEABLE_TOKENS, model_rule
from promptcache_nb.cache.bedrock import EXTENDED_TTL_MODELS, BedrockCache
from promptcache_nb.request import PreparedRequest, prepare

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
LONG = "word " * 8000  # above every minimum in the table (4,096 at most) under either tokenizer


def priced_claude_models() -> list[str]:
    """The Claude API models genai-prices lists with cache prices, read from the installed library (its Claude 2
    and 1 entries have none: prompt caching came with Claude 3)."""
    provider = next(p for p in data_snapshot.get_snapshot().providers if p.id == "anthropic")
    out = []
    for m in provider.models:
        price = m.get_prices(T0)
        if m.id.startswith("claude-") and getattr(price, "cache_read_mtok", None) is not None:
            out.append(m.id)
    return sorted(out)


CLAUDE_MODELS = priced_claude_models()


def test_the_library_lists_the_2026_models():
    # the walk below is over what the installed genai-prices lists; these are the models issue #36 names
    assert {"claude-sonnet-5", "claude-opus-5", "claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5",
            "claude-fable-5-1", "claude-mythos-5-2"} <= set(CLAUDE_MODELS)


def conversation(model: str, turns: int) -> dict[str, Any]:
    """A long cached system prompt, then ``turns`` user turns (with the assistant's replies between them)."""
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        if i:
            messages.append({"role": "assistant", "content": f"answer {i}"})
        messages.append({"role": "user", "content": f"question {i + 1}"})
    return {"model": model, "max_tokens": 64, "messages": messages,
            "system": [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]}


def library_cost(model: str, usage: pc.Usage, at: datetime) -> float:
    """genai-prices' own price of ``usage`` for ``model`` (its rates, its read and write multipliers)."""
    u = LibraryUsage(input_tokens=usage.total_input_tokens, cache_read_tokens=usage.cache_read_input_tokens,
                     cache_write_tokens=usage.cache_creation_input_tokens,
                     cache_write_1h_tokens=usage.cache_creation_1h_input_tokens, output_tokens=usage.output_tokens or 0)
    return float(calc_price(u, model_ref=model, provider_id="anthropic", genai_request_timestamp=at).total_price)


@pytest.mark.parametrize("model", CLAUDE_MODELS)
def test_every_priced_claude_model_is_simulated_and_priced_at_its_own_rates(model: str):
    with pc.Lab(progress=False) as lab:
        s = lab.session(model=model, project="claude-models")
        first = s.record(conversation(model, 1), at=T0)
        second = s.record(conversation(model, 2), at=T0 + timedelta(seconds=30))
        minimum = pc.AnthropicCache().min_cacheable_tokens(model)
        assert first.cache_reason == "cold" and first.usage.cache_creation_input_tokens >= minimum
        assert second.cache_reason == "hit"
        assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
        for t in (first, second):  # the library's own rates for this very model, read and write multipliers included
            assert t.cost_usd == pytest.approx(library_cost(model, t.usage, t.at), rel=1e-9)
        # the stored session re-simulated under its own cache: every row simulated, none unsupported
        df = pc.resimulate(s, cache="anthropic")
        assert list(df.cache_reason) == ["cold", "hit"]
        assert df.cost_usd.notna().all()


def test_read_multipliers_are_the_models_own_not_a_fixed_tenth():
    # the same hit costs what each model's own read rate says: 0.05x input for Opus 5.5, 0.1x for Opus 5
    reads = {}
    for model in ("claude-opus-5", "claude-opus-5-5"):
        with pc.Lab(progress=False) as lab:
            s = lab.session(model=model, project="multipliers")
            s.record(conversation(model, 1), at=T0)
            hit = s.record(conversation(model, 2), at=T0 + timedelta(seconds=30))
            p = pc.analysis.prices_for(model)
            read = hit.usage.cache_read_input_tokens
            uncached = hit.usage.input_tokens
            assert hit.cost_usd == pytest.approx((uncached * p.input + read * p.cache_read) / 1e6)
            reads[model] = p.cache_read / p.input
    assert reads == {"claude-opus-5": pytest.approx(0.1), "claude-opus-5-5": pytest.approx(0.05)}


# -- the family fallback ---------------------------------------------------------------------------------------------
def test_a_model_without_a_documented_minimum_takes_its_familys_and_says_so():
    rule = model_rule("claude-haiku-5-5")
    assert (rule.model, rule.row) == ("claude-haiku-5-5", "claude-haiku-4-5")
    assert "claude-haiku-4-5" in rule.note and "4,096" in rule.note
    with pc.Lab(progress=False) as lab:
        s = lab.session(model="claude-haiku-5-5", project="fallback")
        t = s.record(conversation("claude-haiku-5-5", 1), at=T0)
        assert t.cache_reason == "cold" and t.cache_detail["model_rule"] == rule.note
        assert t.cache_detail["min_tokens"] == MIN_CACHEABLE_TOKENS["claude-haiku-4-5"]
        documented = lab.session(model="claude-sonnet-5", project="fallback")
        assert "model_rule" not in documented.record(conversation("claude-sonnet-5", 1), at=T0).cache_detail
    # the family's latest documented model at or before it, else the earliest after it
    assert model_rule("claude-opus-4-9").row == "claude-opus-4-8"
    assert model_rule("claude-fable-5-2-20261101").row == "claude-fable-5"
    assert model_rule("claude-3-sonnet").row == "claude-3-5-sonnet"
    # not a Claude model of a known family: still an error naming the valid ones, never a guess
    for bad in ("gpt-4o", "claude-2", "claude-nonexistent-9"):
        with pytest.raises(pc.errors.UnknownModelError, match="valid: claude-3-5-haiku"):
            model_rule(bad)


def test_the_fallback_minimum_is_applied():
    # claude-haiku-5-5 takes Haiku 4.5's 4,096: a 3,000-token prefix is neither written nor read
    cache = pc.AnthropicCache(ttft_seconds=0)
    short = req(("doc", 3000), ("q", 10), model="claude-haiku-5-5", marks={"doc": EPHEMERAL})
    assert counts(cache.process(short, T0)) == (3010, 0, 0)
    assert cache.process(short, T0 + timedelta(seconds=5)).reason == "below_minimum"
    # the same prefix is cached for claude-opus-5-5 (its family's 512)
    opus = pc.AnthropicCache(ttft_seconds=0)
    longer = req(("doc", 3000), ("q", 10), model="claude-opus-5-5", marks={"doc": EPHEMERAL})
    assert counts(opus.process(longer, T0)) == (10, 0, 3000)
    assert counts(opus.process(longer, T0 + timedelta(seconds=5))) == (10, 3000, 0)
    # a model's own override wins over its family's row, and then there is nothing to note
    own = pc.AnthropicCache(min_tokens={"claude-haiku-5-5": 2048})
    r = own.process(short, T0)
    assert counts(r) == (10, 0, 3000) and "model_rule" not in r.detail


# -- Bedrock's lifetimes ---------------------------------------------------------------------------------------------
EPHEMERAL = {"type": "ephemeral"}
SONNET_BEDROCK = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
SONNET_37_BEDROCK = "us.anthropic.claude-3-7-sonnet-20250219-v1:0"


def req(*parts: tuple[str, int], model: str, marks: dict[str, dict[str, str]]) -> PreparedRequest:
    """One user message of ``parts`` (label, tokens); ``marks`` puts a ``cache_control`` on the labelled blocks."""
    blocks = [{"type": "text", "text": lab, **({"cache_control": marks[lab]} if lab in marks else {})}
              for lab, _ in parts]
    r = prepare({"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": blocks}]})
    segs = tuple(dataclasses.replace(s, tokens=n) for s, (_, n) in zip(r.segments, parts, strict=True))
    return dataclasses.replace(r, segments=segs, total_tokens=sum(n for _, n in parts))


def counts(result: pc.cache.CacheResult) -> tuple[int, int, int]:
    u = result.usage
    return u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens


def test_bedrock_entries_live_five_minutes_from_their_last_use():
    b = BedrockCache(ttft_seconds=0)
    r = req(("doc", 3000), ("q", 10), model=SONNET_37_BEDROCK, marks={"doc": EPHEMERAL})
    assert counts(b.process(r, T0)) == (10, 0, 3000)
    kept = b.process(r, T0 + timedelta(seconds=299))  # within 5 minutes: read, and the lifetime starts again
    assert counts(kept) == (10, 3000, 0) and kept.reason == "hit"
    again = b.process(r, T0 + timedelta(seconds=299 + 299))
    assert counts(again) == (10, 3000, 0)
    late = b.process(r, T0 + timedelta(seconds=299 + 299 + 301))  # 5 minutes and a second untouched: gone
    assert late.reason == "ttl_expired" and counts(late) == (10, 0, 3000)
    assert late.detail["expired_ttl"] == "5m" and late.detail["expired_after_seconds"] == pytest.approx(301)
    assert b.default_ttl_seconds(r) == 300.0 and b.state_horizon_seconds() == 3600.0


def test_bedrock_one_hour_entries_outlive_five_minutes_where_listed():
    assert "claude-sonnet-4-5" in EXTENDED_TTL_MODELS
    b = BedrockCache(ttft_seconds=0)
    one_hour = {"doc": {"type": "ephemeral", "ttl": "1h"}}
    r = req(("doc", 3000), ("q", 10), model=SONNET_BEDROCK, marks=one_hour)
    assert b.process(r, T0).usage.cache_creation_1h_input_tokens == 3000
    assert counts(b.process(r, T0 + timedelta(minutes=30))) == (10, 3000, 0)  # past 5 minutes, within the hour
    late = b.process(r, T0 + timedelta(minutes=30, seconds=3601))
    assert late.reason == "ttl_expired" and late.detail["expired_ttl"] == "1h"
    assert b.ttls_for(SONNET_BEDROCK) == ("5m", "1h") and b.ttls_for(SONNET_37_BEDROCK) == ("5m",)
    assert pc.AnthropicCache().ttls_for("claude-sonnet-4-5") == ("5m", "1h")
    assert pc.get_cache_model("openai").ttls_for("gpt-5") == ()


def test_bedrock_sessions_can_take_the_ttl_and_keep_warm_fixes():
    # the counterfactual no longer calls Bedrock's cache TTL-less: a 7-minute gap loses the 5m entry, and both fixes
    # replay; the 1-hour TTL only where Bedrock lists it
    for model, ttl_possible in ((SONNET_BEDROCK, True), (SONNET_37_BEDROCK, False)):
        with pc.Lab(progress=False) as lab:
            s = lab.session(cache="bedrock", model=model, project="bedrock",
                            prices=pc.analysis.Prices(input=3, output=15, cache_read=0.3, cache_write_5m=3.75,
                                                      cache_write_1h=6))
            for i, seconds in enumerate((0, 30, 30 + 420)):
                s.record(conversation(model, i + 1), at=T0 + timedelta(seconds=seconds))
            assert s.turns().cache_reason.tolist() == ["cold", "hit", "ttl_expired"]
            warm = pc.counterfactual(s, fixes=["keep_warm"])
            assert warm.fixes == ("keep_warm",) and warm.turns().cost_usd.sum() < s.turns().cost_usd.sum()
            ttl = pc.counterfactual(s, fixes=["ttl"])
            if ttl_possible:
                assert ttl.fixes == ("ttl",) and ttl.turns().cost_usd.sum() < s.turns().cost_usd.sum()
            else:
                assert ttl.fixes == () and "no 1-hour TTL" in ttl.config["fixes_not_possible"]["ttl"]


# -- an unpriced model's cost is unknown, never $0 --------------------------------------------------------------------
def test_an_unpriced_models_cost_is_unknown_not_zero():
    with pc.Lab(progress=False) as lab:
        # its requests name a model simulated with the opus rule, which genai-prices has no price for
        s = lab.session(model="claude-sonnet-5", project="unpriced")
        with pytest.warns(pc.errors.UnpricedModelWarning, match="claude-opus-4-9"):
            s.record(conversation("claude-opus-4-9", 1), at=T0)
        s.record(conversation("claude-opus-4-9", 2), at=T0 + timedelta(seconds=30))
        df = s.turns()
        assert df.cache_reason.tolist() == ["cold", "hit"] and df.cost_usd.isna().all()
        totals = pc.analysis.summarize(df)
        assert math.isnan(totals["cost_usd"]) and math.isnan(totals["saved_usd"])  # not $0
        total = pc.analysis.cost_total(zip(df.model, df.cost_usd, strict=True))
        assert total.usd is None and not total.complete
        assert total.label() == "unknown (no price for claude-opus-4-9)"
    mixed = pc.analysis.cost_total([("claude-sonnet-5", 0.25), ("claude-opus-4-9", float("nan")), ("x", None)])
    assert (mixed.usd, mixed.priced, mixed.unpriced, mixed.unpriced_models) == (0.25, 1, 2, ("claude-opus-4-9", "x"))


def test_advice_on_unpriced_requests_says_unknown_not_zero():
    with pc.Lab(progress=False) as lab:
        s = lab.session(model="claude-sonnet-5", project="unpriced-advice")
        with pytest.warns(pc.errors.UnpricedModelWarning):
            for i, seconds in enumerate((0, 30, 30 + 420, 30 + 840)):  # two 7-minute gaps: the 5m entry expires
                s.record(conversation("claude-opus-4-9", i + 1), at=T0 + timedelta(seconds=seconds))
        advice = pc.advise(s, fixes=["ttl"])
        ttl = advice.findings.set_index("fix").loc["ttl"]
        assert ttl.tokens_saved > 0  # the simulation moves tokens to reads: only their price is unknown
        assert math.isnan(ttl.usd_saved) and "unknown" in ttl.verdict
        assert "No fix saves anything" not in advice.summary() and "claude-opus-4-9" in advice.summary()
