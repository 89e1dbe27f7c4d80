"""The cached per-model rate table gives genai-prices' own ``calc_price`` result, exactly.

``Prices.cost`` prices each request from a table compiled once per model price period
(``prices._rate_table``) instead of calling the library; these tests compare the two over many models,
usages (tier boundaries, cache reads, 5m/1h writes, reasoning, invalid counts) and request times
(either side of every price change and time-of-day window the data has).
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, time, timedelta

import pytest
from genai_prices import Usage as GUsage
from genai_prices import calc_price, data_snapshot
from genai_prices.types import ModelPrice, StartDateConstraint, TieredPrices, TimeOfDateConstraint

import promptcache_nb as pc
from promptcache_nb.analysis import prices as prices_mod
from promptcache_nb.analysis.prices import REFERENCE_TIME, prices_for

# Providers our cache models price, in full; every other provider's models are sampled (one in SAMPLE).
FULL = {"anthropic", "openai", "deepseek", "google"}
SAMPLE = 7


def _library(model_ref: str, provider_id: str, at: datetime, fields: dict[str, int]) -> float | str:
    """genai-prices' own result (or the exception it raises), as priced before the table existed."""
    try:
        calc = calc_price(GUsage(**fields), model_ref=model_ref, provider_id=provider_id,
                          genai_request_timestamp=at)
    except (ValueError, LookupError) as exc:
        return type(exc).__name__
    return float(calc.total_price)


def _ours(model_ref: str, provider_id: str, at: datetime, fields: dict[str, int]) -> float | str:
    try:
        return prices_mod._library_cost(
            model_ref, provider_id, at, total=fields["input_tokens"], read=fields["cache_read_tokens"],
            write=fields["cache_write_tokens"], write_1h=fields["cache_write_1h_tokens"],
            output=fields["output_tokens"], reasoning=fields.get("output_reasoning_tokens", 0))
    except (ValueError, LookupError) as exc:
        return type(exc).__name__


def _periods(model) -> list[ModelPrice]:
    return [model.prices] if isinstance(model.prices, ModelPrice) else [c.prices for c in model.prices]


def _times(model) -> list[datetime]:
    """The reference time, and either side of every price change and time-of-day boundary."""
    out = [REFERENCE_TIME]
    for c in [] if isinstance(model.prices, ModelPrice) else model.prices:
        if isinstance(c.constraint, StartDateConstraint):
            start = datetime.combine(c.constraint.start_date, time(0), UTC)
            out += [start - timedelta(seconds=1), start]
        elif isinstance(c.constraint, TimeOfDateConstraint):
            for t in (c.constraint.start_time, c.constraint.end_time):
                edge = datetime.combine(REFERENCE_TIME.date(), t if t.tzinfo else t.replace(tzinfo=UTC))
                out += [edge - timedelta(seconds=1), edge]
    return out


def _usages(model) -> list[dict[str, int]]:
    """Usages around every tier start (and 0): reads, 5m and 1h writes, reasoning, invalid counts."""
    starts = {0} | {t.start for mp in _periods(model) for v in mp.__dict__.values()
                    if isinstance(v, TieredPrices) for t in v.tiers}
    out = []
    for start in sorted(starts):
        for total in sorted({max(start - 1, 0), start, start + 1, start + 54_321}):
            out += [
                {"input_tokens": total, "cache_read_tokens": total // 2, "cache_write_tokens": total // 4,
                 "cache_write_1h_tokens": total // 8, "output_tokens": 777, "output_reasoning_tokens": 300},
                {"input_tokens": total, "cache_read_tokens": 0, "cache_write_tokens": total,
                 "cache_write_1h_tokens": total, "output_tokens": 1},
                {"input_tokens": total, "cache_read_tokens": total, "cache_write_tokens": 0,
                 "cache_write_1h_tokens": 0, "output_tokens": 0},
            ]
    out += [
        dict.fromkeys(("input_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens",
                       "output_tokens"), 0),
        # invalid: more 1h writes than writes, more reads than input (the library raises: so must we)
        {"input_tokens": 9, "cache_read_tokens": 0, "cache_write_tokens": 3, "cache_write_1h_tokens": 4,
         "output_tokens": 5},
        {"input_tokens": 9, "cache_read_tokens": 10, "cache_write_tokens": 0, "cache_write_1h_tokens": 0,
         "output_tokens": 5},
    ]
    return out


def _models():
    for provider in data_snapshot.get_snapshot().providers:
        for i, model in enumerate(provider.models):
            if provider.id in FULL or i % SAMPLE == 0:
                yield provider, model


def test_table_equals_calc_price_over_models_usages_and_times():
    cases = mismatches = 0
    seen_tiers = seen_changes = False
    for provider, model in _models():
        times = _times(model)
        seen_changes |= len(times) > 1
        seen_tiers |= any(isinstance(v, TieredPrices) for mp in _periods(model) for v in mp.__dict__.values())
        for at in times:
            for fields in _usages(model):
                cases += 1
                expected, got = _library(model.id, provider.id, at, fields), _ours(model.id, provider.id, at, fields)
                if expected != got:
                    mismatches += 1
                    assert expected == got, (provider.id, model.id, at, fields)
    assert cases > 5_000 and seen_tiers and seen_changes and mismatches == 0


def test_the_table_is_what_prices_the_models_we_use(monkeypatch):
    """The table path really runs (not a fallback to the library) for the models sessions use."""
    import genai_prices

    def refuse(*a, **k):
        raise AssertionError("calc_price called")

    u = pc.Usage(input_tokens=3, cache_read_input_tokens=250_000, cache_creation_input_tokens=400,
                 cache_creation_1h_input_tokens=100, output_tokens=80)
    expected = {m: (prices_for(m).cost(u), prices_for(m).cost_without_cache(u))
                for m in ("claude-sonnet-4-5", "claude-opus-4-1", "gpt-5", "deepseek-chat", "gemini-2.5-pro")}
    monkeypatch.setattr(genai_prices, "calc_price", refuse)
    for model, (cost, without) in expected.items():
        p = prices_for(model)
        assert (p.cost(u), p.cost_without_cache(u)) == (cost, without), model
    # DeepSeek's off-peak window: the table follows the library's price period per request time
    ds = prices_for("deepseek-chat")
    assert ds.cost(u, datetime(2026, 11, 2, 10, tzinfo=UTC)) != ds.cost(u, datetime(2026, 11, 2, 17, tzinfo=UTC))


def test_a_changed_snapshot_gets_its_own_table():
    """Prices updated at run time (genai-prices' UpdatePrices sets a custom snapshot) are never served
    from a table compiled for the old ones."""
    u = pc.Usage(input_tokens=100_000, cache_read_input_tokens=0, cache_creation_input_tokens=0,  # base tier
                 output_tokens=0)
    sonnet = prices_for("claude-sonnet-4-5")
    before = sonnet.cost(u)
    snap = copy.deepcopy(data_snapshot.get_snapshot())
    _, model = snap.find_provider_model("claude-sonnet-4-5", None, "anthropic", None)
    price = model.get_prices(REFERENCE_TIME)
    price.input_mtok = TieredPrices(base=price.input_mtok.base * 2, tiers=price.input_mtok.tiers) \
        if isinstance(price.input_mtok, TieredPrices) else price.input_mtok * 2
    data_snapshot.set_custom_snapshot(snap)
    try:
        assert sonnet.cost(u) == pytest.approx(2 * before)
    finally:
        data_snapshot.set_custom_snapshot(None)
    assert sonnet.cost(u) == before
