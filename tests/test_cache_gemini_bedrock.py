"""The Gemini and Bedrock cache models against their documented rules (docs/provider_cache_rules.md#gemini,
#bedrock), their prices, the cache model an import picks, and re-simulating a replayed scenario under them.

Requests are hand-built with fixed token counts per segment, so every expected figure is arithmetic from the rule.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.prices import price_model_id, prices_for
from promptcache_nb.cache import REASONS
from promptcache_nb.cache.bedrock import BedrockCache, converse_usage_of
from promptcache_nb.cache.gemini import GeminiCache
from promptcache_nb.ingest._import import _cache_model_for
from promptcache_nb.readers._http import converse_usage
from promptcache_nb.readers._types import ImportedRequest
from promptcache_nb.request import PreparedRequest, prepare

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
FLASH = "gemini-2.5-flash"
SONNET_BEDROCK = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


def req(*parts: tuple[str, int], model: str = FLASH, system: tuple[tuple[str, int], ...] = (),
        marks: dict[str, dict[str, str]] | None = None, **rest: Any) -> PreparedRequest:
    """A request of ``system`` blocks then one user message of ``parts``: (label, estimated tokens); ``marks``
    puts a ``cache_control`` on the labelled blocks."""
    marks = marks or {}

    def block(label: str) -> dict[str, Any]:
        b: dict[str, Any] = {"type": "text", "text": label}
        if label in marks:
            b["cache_control"] = marks[label]
        return b

    body: dict[str, Any] = {"model": model, "max_tokens": 64, **rest,
                            "messages": [{"role": "user", "content": [block(lab) for lab, _ in parts]}]}
    if system:
        body["system"] = [block(lab) for lab, _ in system]
    r = prepare(body)
    sizes = [n for _, n in (*system, *parts)]
    segs = tuple(dataclasses.replace(s, tokens=n) for s, n in zip(r.segments, sizes, strict=True))
    return dataclasses.replace(r, segments=segs, total_tokens=sum(sizes))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def counts(result: pc.cache.CacheResult) -> tuple[int, int, int]:
    """(uncached, read, written) of a result."""
    u = result.usage
    return u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens


EPHEMERAL = {"type": "ephemeral"}


# -- registry ---------------------------------------------------------------------------------------------------
def test_registered_with_their_options():
    assert {"gemini", "bedrock"} <= set(pc.CACHE_MODELS)
    assert isinstance(pc.get_cache_model("gemini"), GeminiCache)
    bedrock = pc.get_cache_model("bedrock", ttft_seconds=0)
    assert isinstance(bedrock, BedrockCache) and isinstance(bedrock, pc.AnthropicCache)  # a variant, not a copy
    assert issubclass(BedrockCache.Options, pc.AnthropicCache.Options)
    with pytest.raises(pc.errors.InvalidOptionError, match="explicit_ttl"):
        pc.get_cache_model("gemini", explict_ttl="1h")
    with pytest.raises(pc.errors.InvalidOptionError, match="min_per_checkpoint"):
        pc.get_cache_model("bedrock", min_per_checkpont=False)


# -- Gemini implicit caching ------------------------------------------------------------------------------------
def test_gemini_minimums_per_model():
    g = GeminiCache()
    assert g.min_cacheable_tokens("gemini-2.5-flash") == 2048
    assert g.min_cacheable_tokens("models/gemini-2.5-pro") == 2048  # the API's resource name
    assert g.min_cacheable_tokens("gemini-3-pro-preview") == 4096
    assert g.min_cacheable_tokens("gemini-3-flash-preview") == 1024
    assert g.min_cacheable_tokens("claude-sonnet-4-5") == 2048  # another provider's model: the stand-in's rules
    assert GeminiCache(min_tokens={"gemini-2.5-flash": 1024}).min_cacheable_tokens(FLASH) == 1024
    with pytest.raises(pc.errors.UnknownModelError):
        g.min_cacheable_tokens("gemini-9-ultra")  # a Gemini id the table lacks: never a look-alike's minimum


def test_gemini_implicit_hit_on_a_shared_prefix_no_writes():
    g = GeminiCache()
    first = g.process(req(("doc", 3000), ("q1", 300)), at(0))
    second = g.process(req(("doc", 3000), ("q1", 300), ("q2", 200)), at(20))
    assert counts(first) == (3300, 0, 0) and first.reason == "cold"
    assert counts(second) == (200, 3300, 0) and second.reason == "hit"
    assert second.native == {"promptTokenCount": 3500, "cachedContentTokenCount": 3300, "candidatesTokenCount": 0,
                             "totalTokenCount": 3500}
    assert second.usage.raw == second.native
    assert second.segment_states == ("read", "read", "uncached")
    # another prompt with the same opening reads the shared part only
    other = g.process(req(("doc", 3000), ("elsewhere", 400)), at(40))
    assert counts(other) == (400, 3000, 0)
    assert all(r.reason in REASONS for r in (first, second, other))


def test_gemini_below_the_minimum_nothing_is_cached():
    g = GeminiCache()
    g.process(req(("doc", 1500), ("q", 100)), at(0))
    short = g.process(req(("doc", 1500), ("q", 100), ("q2", 100)), at(10))
    assert counts(short) == (1700, 0, 0) and short.reason == "below_minimum"
    # a long prompt whose shared prefix is shorter than the minimum reads nothing either
    g.process(req(("sys", 1000), ("a", 3000)), at(20))
    changed = g.process(req(("sys", 1000), ("b", 3000)), at(30))
    assert counts(changed) == (4000, 0, 0) and changed.reason == "prefix_changed"
    # a larger minimum (Gemini 3 Pro Preview: 4,096) turns the same hit off
    pro = GeminiCache()
    pro.process(req(("doc", 3000), ("q", 300), model="gemini-3-pro-preview"), at(0))
    assert counts(pro.process(req(("doc", 3000), ("q", 300), model="gemini-3-pro-preview"), at(5)))[1] == 0


def test_gemini_lifetime_expiry():
    g = GeminiCache()  # 1 hour by default
    g.process(req(("doc", 3000), ("q", 100)), at(0))
    assert counts(g.process(req(("doc", 3000), ("q", 100), ("r", 10)), at(59 * 60)))[1] == 3100
    late = g.process(req(("doc", 3000), ("q", 100), ("r", 10), ("s", 10)), at(59 * 60 + 3601))
    assert counts(late) == (3120, 0, 0) and late.reason == "ttl_expired"
    assert late.detail["idle_seconds"] == 3601
    short = GeminiCache(lifetime="10m")
    short.process(req(("doc", 3000)), at(0))
    assert short.process(req(("doc", 3000), ("q", 5)), at(9 * 60)).reason == "hit"
    assert short.process(req(("doc", 3000), ("q", 5), ("r", 5)), at(20 * 60)).reason == "ttl_expired"
    assert short.state_horizon_seconds() == 600


def test_gemini_model_switch_and_stand_in():
    g = GeminiCache()
    g.process(req(("doc", 3000)), at(0))
    switched = g.process(req(("doc", 3000), ("q", 5), model="gemini-2.5-pro"), at(5))
    assert switched.reason == "model_switch" and counts(switched)[1] == 0  # caches are per model
    claude = GeminiCache().process(req(("doc", 3000), model="claude-sonnet-4-5"), at(0))
    assert claude.detail["stand_in_model"] == "gemini-2.5-flash"


def test_gemini_discount_is_genai_prices_cached_rate():
    flash, pro = prices_for("gemini-2.5-flash"), prices_for("models/gemini-2.5-pro")
    assert flash.source == "genai-prices google/gemini-2.5-flash"
    assert flash.cache_read == pytest.approx(flash.input * 0.1) and pro.cache_read == pytest.approx(pro.input * 0.1)
    assert flash.cache_write_5m == flash.input  # no write surcharge: an explicit cache is created at the input price
    g = GeminiCache()
    g.process(req(("doc", 3000), ("q", 100)), at(0))
    u = g.process(req(("doc", 3000), ("q", 100), ("r", 900)), at(10)).usage
    assert flash.cost(u) == pytest.approx((900 * 0.30 + 3100 * 0.03) / 1e6)
    assert flash.cost_without_cache(u) == pytest.approx(4000 * 0.30 / 1e6)


def test_gemini_prices_resolve_api_ids_exactly():
    assert price_model_id("models/gemini-2.5-flash") == ("google", "gemini-2.5-flash")
    assert price_model_id("gemini-2.0-flash-001") == ("google", "gemini-2.0-flash")
    assert price_model_id("gemini-2.5-pro-preview-06-05") is None  # a preview is not the stable model
    assert price_model_id("models/gemini-9-ultra") is None


# -- Gemini explicit caching (what-if) --------------------------------------------------------------------------
def test_gemini_explicit_cached_content_ttl_and_storage():
    g = GeminiCache(explicit_ttl="30m")
    system = (("instructions", 2500), ("tools text", 2500))
    created = g.process(req(("q1", 200), system=system), at(0))
    assert counts(created) == (200, 0, 5000)  # the create call: its tokens at the input price
    d = created.detail
    assert d["explicit"] == "created (new)" and d["explicit_tokens"] == 5000
    assert d["storage_token_hours"] == 2500 and d["storage_usd"] == pytest.approx(2500 * 1.00 / 1e6)
    assert created.native["cachedContentTokenCount"] == 5000
    used = g.process(req(("q1", 200), ("q2", 300), system=system), at(10 * 60))
    assert counts(used) == (300, 5200, 0) and used.reason == "hit"  # implicit caching reads on past the object
    assert used.detail["explicit"] == "read" and used.detail["explicit_read_tokens"] == 5000
    other = g.process(req(("another question", 300), system=system), at(11 * 60))
    assert counts(other) == (300, 5000, 0)  # the object's read is guaranteed; the question changed
    assert other.reason == "prefix_changed"
    # not refreshed by use: 30 minutes after its creation it is gone, and created again
    again = g.process(req(("q3", 100), system=system), at(30 * 60 + 1))
    assert counts(again) == (100, 0, 5000) and again.reason == "ttl_expired"
    assert again.detail["explicit"] == "created (expired)"
    # a system instruction below the minimum makes no cachedContents
    small = GeminiCache(explicit_ttl="1h").process(req(("q", 3000), system=(("sys", 500),)), at(0))
    assert small.detail["explicit"].startswith("not created") and counts(small)[2] == 0
    assert GeminiCache(explicit_ttl="1h", storage_usd_per_mtok_hour=2.0).process(
        req(("q", 10), system=system), at(0)).detail["storage_usd"] == pytest.approx(5000 * 2.0 / 1e6)


# -- Bedrock ----------------------------------------------------------------------------------------------------
def test_bedrock_minimums_and_models():
    b = BedrockCache()
    assert b.min_cacheable_tokens(SONNET_BEDROCK) == 1024
    assert b.min_cacheable_tokens("eu.anthropic.claude-haiku-4-5-20251001-v1:0") == 4096
    assert b.min_cacheable_tokens("anthropic.claude-3-5-haiku-20241022-v1:0") == 2048
    assert b.min_cacheable_tokens("claude-opus-4-5") == 4096  # an Anthropic id: the same model's row
    with pytest.raises(pc.errors.UnknownModelError):
        b.min_cacheable_tokens("anthropic.claude-3-haiku-20240307-v1:0")  # Bedrock does not cache it
    with pytest.raises(pc.errors.UnknownModelError):
        b.process(req(("a", 5000), model="anthropic.claude-3-haiku-20240307-v1:0", marks={"a": EPHEMERAL}), at(0))


def test_bedrock_checkpoints_read_and_write_like_anthropic():
    b = BedrockCache(ttft_seconds=0)
    marks = {"doc": EPHEMERAL, "q2": EPHEMERAL}
    first = b.process(req(("doc", 3000), ("q1", 100), model=SONNET_BEDROCK, marks={"doc": EPHEMERAL}), at(0))
    assert counts(first) == (100, 0, 3000) and first.reason == "cold"
    second = b.process(req(("doc", 3000), ("q1", 100), ("q2", 1200), model=SONNET_BEDROCK, marks=marks), at(30))
    assert counts(second) == (0, 3000, 1300) and second.reason == "hit"
    assert second.native == {"inputTokens": 0, "outputTokens": 0, "totalTokens": 4300,
                             "cacheReadInputTokens": 3000, "cacheWriteInputTokens": 1300,
                             "cacheDetails": [{"ttl": "5m", "inputTokens": 1300}]}
    # five minutes untouched: the checkpoints expired
    late = b.process(req(("doc", 3000), ("q1", 100), ("q2", 1200), model=SONNET_BEDROCK, marks=marks), at(30 + 301))
    assert late.reason == "ttl_expired" and counts(late)[1] == 0


def test_bedrock_minimum_is_per_checkpoint():
    # "the first cache checkpoint can be defined after 1,024 tokens and the second after 2,048" [B1]
    marks = {"a": EPHEMERAL, "b": EPHEMERAL}
    body = {"model": SONNET_BEDROCK, "marks": marks}
    r = req(("a", 1100), ("b", 500), model=body["model"], marks=marks)
    assert counts(BedrockCache().process(r, at(0))) == (500, 0, 1100)  # b is 500 past a: no checkpoint there
    assert counts(pc.AnthropicCache().process(r, at(0))) == (0, 0, 1600)  # the Claude API: the whole prefix counts
    assert counts(BedrockCache(min_per_checkpoint=False).process(r, at(0))) == (0, 0, 1600)
    spaced = req(("a", 1100), ("b", 1100), model=SONNET_BEDROCK, marks=marks)
    assert counts(BedrockCache().process(spaced, at(0))) == (0, 0, 2200)


def test_bedrock_has_no_automatic_caching():
    r = req(("doc", 3000), ("q", 100), model=SONNET_BEDROCK, cache_control=EPHEMERAL)
    result = BedrockCache().process(r, at(0))
    assert counts(result) == (3100, 0, 0) and "ignored" in result.detail["automatic_caching"]
    assert counts(pc.AnthropicCache().process(r, at(0))) == (0, 0, 3100)
    assert counts(BedrockCache(automatic_caching=True).process(r, at(0))) == (0, 0, 3100)


def test_bedrock_one_hour_ttl_only_where_listed_and_at_most_four_checkpoints():
    one_hour = {"doc": {"type": "ephemeral", "ttl": "1h"}}
    ok = BedrockCache().process(req(("doc", 3000), ("q", 10), model=SONNET_BEDROCK, marks=one_hour), at(0))
    assert ok.usage.cache_creation_1h_input_tokens == 3000
    assert ok.native["cacheDetails"] == [{"ttl": "1h", "inputTokens": 3000}]
    b = BedrockCache()
    with pytest.raises(pc.errors.InvalidRequestError, match="1h"):
        b.process(req(("doc", 3000), model="us.anthropic.claude-3-7-sonnet-20250219-v1:0", marks=one_hour), at(0))
    assert b.process(req(("doc", 3000), model="us.anthropic.claude-3-7-sonnet-20250219-v1:0",
                         marks={"doc": EPHEMERAL}), at(1)).reason == "cold"  # the refused request left no state
    five = {lab: EPHEMERAL for lab in "abcde"}
    with pytest.raises(pc.errors.InvalidRequestError, match="maximum of 4"):
        b.process(req(*((lab, 1100) for lab in "abcde"), model=SONNET_BEDROCK, marks=five), at(2))


def test_bedrock_usage_names_round_trip():
    u = pc.Usage(input_tokens=10, cache_read_input_tokens=2000, cache_creation_input_tokens=300,
                 cache_creation_5m_input_tokens=100, cache_creation_1h_input_tokens=200, output_tokens=40)
    native = converse_usage_of(u)
    assert native["totalTokens"] == 2350
    back = converse_usage(native)  # the recording proxy's reader of Bedrock Converse usage
    assert (back.input_tokens, back.cache_read_input_tokens, back.cache_creation_input_tokens,
            back.cache_creation_5m_input_tokens, back.cache_creation_1h_input_tokens, back.output_tokens) == (
        10, 2000, 300, 100, 200, 40)


# -- imports pick the provider's model --------------------------------------------------------------------------
def _imported(model: str, provider: str, dialect: str = "anthropic") -> ImportedRequest:
    return ImportedRequest(session_key="s", dedupe_key="d", at=T0, body={}, usage=pc.Usage(1, 0, 0, 0, 0),
                           model=model, source_ref="f:1", dialect=dialect, provider=provider)  # type: ignore[arg-type]


def test_imported_requests_use_their_providers_cache_model():
    assert _cache_model_for(_imported("gemini-2.5-pro", "gemini", "openai-chat")) == "gemini"
    assert _cache_model_for(_imported("gemini-2.5-pro", "google", "openai-chat")) == "gemini"
    assert _cache_model_for(_imported(SONNET_BEDROCK, "anthropic")) == "bedrock"
    assert _cache_model_for(_imported("claude-sonnet-4-5", "amazon-bedrock")) == "bedrock"
    assert _cache_model_for(_imported("claude-sonnet-4-5", "anthropic")) == "anthropic"
    assert _cache_model_for(_imported("gpt-5", "openai", "openai-chat")) == "openai"
    assert _cache_model_for(_imported("gemini-2.5-flash", "gcp.gemini", "openai-chat")) == "gemini"  # OpenTelemetry
    assert _cache_model_for(_imported("amazon.nova-pro-v1:0", "amazon-bedrock", "openai-chat")) == "openai"
    assert _cache_model_for(_imported("claude-sonnet-4-5@20250929", "gcp.vertex_ai")) == "anthropic"


# -- re-simulating a replayed scenario --------------------------------------------------------------------------
def test_resimulate_a_replayed_scenario_under_gemini_and_bedrock(stored_session):
    s = stored_session("durable_delta")
    n = len(pc.resimulate(s, cache="anthropic"))
    g = pc.resimulate(s, cache="gemini")
    assert len(g) == n and set(g.cache_reason) <= set(REASONS)
    assert (g.cache_creation_input_tokens == 0).all() and g.cache_read_input_tokens.sum() > 0
    assert g.attrs["prices"] == "genai-prices google/gemini-2.5-flash"  # a Claude session: Gemini's stand-in
    assert g.cost_usd.notna().all() and (g.cost_usd <= g.cost_no_cache_usd + 1e-12).all()
    b = pc.resimulate(s, cache="bedrock")
    assert len(b) == n and b.cache_read_input_tokens.sum() > 0 and set(b.cache_reason) <= set(REASONS)
    assert b.native.iloc[1]["cacheReadInputTokens"] == b.cache_read_input_tokens.iloc[1]
    table = pc.compare_caches(s, ["anthropic", "bedrock", "gemini"])
    assert list(table.cache) == ["anthropic", "bedrock", "gemini"]
    assert (table.total_input == table.cache_read + table.cache_write + table.uncached).all()


def test_a_session_runs_under_gemini_with_its_own_price():
    system = "You are a careful assistant. " * 600
    with pc.Lab(progress=False) as lab:
        s = lab.session(cache="gemini", model="gemini-2.5-flash", system=system, project="g")
        s.step("hello", reply="hi")
        t = s.step("again", reply="ok")
        assert t.cache_reason == "hit" and t.usage.cache_read_input_tokens > 2048
        assert t.usage.cache_creation_input_tokens == 0
        p = prices_for("gemini-2.5-flash")
        u = t.usage
        assert t.cost_usd == pytest.approx((u.input_tokens * p.input + u.cache_read_input_tokens * p.cache_read
                                            + u.output_tokens * p.output) / 1e6)
        # the default strategy asks for automatic caching, which Bedrock does not take
        b = lab.session(cache="bedrock", model=SONNET_BEDROCK, system=system, project="b")
        b.step("hello", reply="hi")
        assert b.step("again", reply="ok").cache_reason == "no_breakpoint"
