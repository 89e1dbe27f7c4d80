"""Prices per model from the maintained ``genai-prices`` library (cache read/write rates included).

A model the library does not know raises :class:`~promptcache_nb.errors.PriceError` unless the caller
passes an explicit :class:`Prices` — never a silent zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache

from ..errors import PriceError
from ..usage import Usage


@dataclass(frozen=True)
class Prices:
    """USD per million tokens (the base tier).

    Prices from genai-prices carry ``model_ref``: their costs are computed by genai-prices itself, at the
    request's time (``at``), so context-size tiers (e.g. Sonnet above 200k input tokens) and time-of-day
    rates (e.g. DeepSeek's off-peak discount) apply. Explicit prices (no ``model_ref``) use the rates.
    """

    input: float
    output: float
    cache_read: float
    cache_write_5m: float
    cache_write_1h: float
    source: str = "user"
    model_ref: str | None = None

    def cost(self, usage: Usage, at: datetime | None = None) -> float | None:
        """Cost of one request sent at ``at``; None when the usage is unknown."""
        parts = (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens)
        if any(p is None for p in parts):
            return None
        w1h = usage.cache_creation_1h_input_tokens or 0
        if self.model_ref is not None:
            return _library_cost(self.model_ref, at, total=usage.total_input_tokens,
                                 read=usage.cache_read_input_tokens, write=usage.cache_creation_input_tokens,
                                 write_1h=w1h, output=usage.output_tokens or 0)
        w5m = (usage.cache_creation_input_tokens or 0) - w1h
        total = (
            usage.input_tokens * self.input
            + usage.cache_read_input_tokens * self.cache_read
            + w5m * self.cache_write_5m
            + w1h * self.cache_write_1h
            + (usage.output_tokens or 0) * self.output
        )
        return total / 1e6

    def cost_without_cache(self, usage: Usage, at: datetime | None = None) -> float | None:
        """What the same request costs with caching off: every input token at the base rate."""
        total = usage.total_input_tokens
        if total is None:
            return None
        if self.model_ref is not None:
            return _library_cost(self.model_ref, at, total=total, read=0, write=0, write_1h=0,
                                 output=usage.output_tokens or 0)
        return (total * self.input + (usage.output_tokens or 0) * self.output) / 1e6


# genai-prices is called at a fixed reference time when the caller gives none, so results never depend
# on the wall clock (time-of-day rates would otherwise change a notebook's figures between runs).
REFERENCE_TIME = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def _library_cost(model_ref: str, at: datetime | None, *, total: int, read: int, write: int, write_1h: int,
                  output: int) -> float:
    from genai_prices import Usage as GUsage
    from genai_prices import calc_price

    usage = GUsage(input_tokens=total, cache_read_tokens=read, cache_write_tokens=write,
                   cache_write_1h_tokens=write_1h, output_tokens=output)
    return float(calc_price(usage, model_ref=model_ref, genai_request_timestamp=at or REFERENCE_TIME).total_price)


def _num(value: object) -> float:
    # genai-prices gives Decimal, or TieredPrices (base + tiers above a context size): take the base.
    if value is None:
        return 0.0
    if isinstance(value, Decimal | int | float):
        return float(value)
    base = getattr(value, "base", None)
    if base is not None:
        return float(base)
    raise PriceError(f"unexpected price value {value!r}")


@lru_cache(maxsize=128)
def prices_for(model: str) -> Prices:
    """Prices of ``model`` from genai-prices (USD / MTok; the base tier at the reference time). Costs
    computed with them go through genai-prices per request (tiers, time-of-day rates).

    Example:
        >>> prices_for("claude-sonnet-4-5").cache_read
        0.3
    """
    from genai_prices import Usage as GUsage
    from genai_prices import calc_price

    try:
        calc = calc_price(GUsage(input_tokens=1, output_tokens=1), model_ref=model,
                          genai_request_timestamp=REFERENCE_TIME)
    except LookupError as exc:
        raise PriceError(
            f"no price for model {model!r} in genai-prices; pass prices=pc.Prices(input=..., output=..., "
            "cache_read=..., cache_write_5m=..., cache_write_1h=...)"
        ) from exc
    mp = calc.model_price
    inp = _num(mp.input_mtok)
    write_5m = _num(mp.cache_write_mtok) if mp.cache_write_mtok is not None else inp
    return Prices(
        input=inp,
        output=_num(mp.output_mtok),
        cache_read=_num(mp.cache_read_mtok) if mp.cache_read_mtok is not None else inp,
        cache_write_5m=write_5m,
        cache_write_1h=_num(mp.cache_write_1h_mtok) if mp.cache_write_1h_mtok is not None else write_5m,
        source=f"genai-prices {calc.provider.id}/{calc.model.id}",
        model_ref=model,
    )
