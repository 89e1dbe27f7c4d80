"""Prices per model from the maintained ``genai-prices`` library (cache read/write rates included).

Model ids resolve **exactly**: the id itself, its dated snapshots (``claude-sonnet-4-5-20250929``,
``gpt-5-2025-08-07``, compact ``gpt-5.2-20251211``), ``-latest`` and the aliases genai-prices lists for
the model by name (``gpt-5.6`` → ``gpt-5.6-sol``, ``gpt-5.2-codex`` → ``gpt-5.2``). genai-prices itself
also matches by prefix (``claude-sonnet-4-5-anything`` → ``claude-sonnet-4-5``), which would price an id
it does not know as another model (``claude-opus-4-9`` at ``claude-opus-4``'s rates): every match it
returns is checked against the requested id (:func:`price_model_id`) and refused otherwise.

A model without an exact price raises :class:`~promptcache_nb.errors.PriceError` from :func:`prices_for`
unless the caller passes an explicit :class:`Prices` — never a silent zero; sessions store such requests
with a NULL cost and one :class:`~promptcache_nb.errors.UnpricedModelWarning`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

from .._util import model_base_id
from ..errors import PriceError
from ..usage import Usage


@dataclass(frozen=True)
class Prices:
    """USD per million tokens (the base tier).

    Prices from genai-prices carry ``model_ref`` (the library's own model id, exactly resolved) and
    ``provider_id``: their costs are computed by genai-prices itself, at the request's time (``at``), so
    context-size tiers (e.g. Sonnet above 200k input tokens) and time-of-day rates (e.g. DeepSeek's
    off-peak discount) apply, and reasoning tokens the usage reports are passed on (priced when the
    library prices them apart; they are part of the output otherwise). Explicit prices (no ``model_ref``)
    use the rates.
    """

    input: float
    output: float
    cache_read: float
    cache_write_5m: float
    cache_write_1h: float
    source: str = "user"
    model_ref: str | None = None
    provider_id: str | None = None

    def cost(self, usage: Usage, at: datetime | None = None) -> float | None:
        """Cost of one request sent at ``at``; None when the usage is unknown."""
        uncached, read, write = usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens
        if uncached is None or read is None or write is None:
            return None
        w1h = usage.cache_creation_1h_input_tokens or 0
        if self.model_ref is not None:
            return _library_cost(self.model_ref, self.provider_id, at, total=uncached + read + write,
                                 read=read, write=write,
                                 write_1h=w1h, output=usage.output_tokens or 0, reasoning=_reasoning(usage))
        w5m = write - w1h
        total = (
            uncached * self.input
            + read * self.cache_read
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
            return _library_cost(self.model_ref, self.provider_id, at, total=total, read=0, write=0, write_1h=0,
                                 output=usage.output_tokens or 0, reasoning=_reasoning(usage))
        return (total * self.input + (usage.output_tokens or 0) * self.output) / 1e6


# genai-prices is called at a fixed reference time when the caller gives none, so results never depend
# on the wall clock (time-of-day rates would otherwise change a notebook's figures between runs).
REFERENCE_TIME = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


# Where providers report reasoning tokens (a part of the output tokens): OpenAI Chat Completions,
# OpenAI Responses, Codex's rollout logs.
_REASONING_PATHS = (("completion_tokens_details", "reasoning_tokens"), ("output_tokens_details", "reasoning_tokens"),
                    ("reasoning_output_tokens",))


def _reasoning(usage: Usage) -> int:
    """Reasoning tokens in the usage's raw payload (0 when it reports none)."""
    raw = usage.raw or {}
    for path in _REASONING_PATHS:
        value: Any = raw
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _library_cost(model_ref: str, provider_id: str | None, at: datetime | None, *, total: int, read: int,
                  write: int, write_1h: int, output: int, reasoning: int = 0) -> float:
    from genai_prices import Usage as GUsage
    from genai_prices import calc_price

    fields = {"input_tokens": total, "cache_read_tokens": read, "cache_write_tokens": write,
              "cache_write_1h_tokens": write_1h, "output_tokens": output}
    if 0 < reasoning <= output:
        fields["output_reasoning_tokens"] = reasoning  # a part of the output: priced apart only if the model is
    usage = GUsage(**fields)
    calc = calc_price(usage, model_ref=model_ref, provider_id=provider_id,
                      genai_request_timestamp=at or REFERENCE_TIME)
    return float(calc.total_price)


def _match_names(logic: Any) -> tuple[set[str], list[str]]:
    """The ids a genai-prices match clause names outright (equals / starts_with values) and its regexes."""
    names: set[str] = set()
    regexes: list[str] = []
    for attr in ("equals", "starts_with"):
        value = getattr(logic, attr, None)
        if isinstance(value, str):
            names.add(value.lower())
    regex = getattr(logic, "regex", None)
    if isinstance(regex, str):
        regexes.append(regex)
    for sub in getattr(logic, "or_", None) or ():
        n, r = _match_names(sub)
        names |= n
        regexes += r
    return names, regexes


def _is_exact(ref: str, model: Any) -> bool:
    """True when ``ref`` names ``model`` (its id or an id its clause lists, dated or ``-latest`` included),
    not merely starts like it."""
    names, regexes = _match_names(model.match)
    names.add(model.id.lower())
    ref = ref.lower()
    if ref in names or model_base_id(ref) in names:
        return True
    return any(re.fullmatch(rx, ref) for rx in regexes)


@lru_cache(maxsize=512)
def price_model_id(model: str) -> tuple[str, str] | None:
    """``(provider id, model id)`` of ``model`` in genai-prices, resolved exactly; None when it has no exact
    entry (an unknown id, or one the library would only match by prefix).

    Example:
        >>> price_model_id("claude-sonnet-4-5-20250929"), price_model_id("claude-opus-4-9")
        (('anthropic', 'claude-sonnet-4-5'), None)
    """
    from genai_prices import data_snapshot

    try:
        provider, found = data_snapshot.get_snapshot().find_provider_model(model, None, None, None)
    except LookupError:
        return None
    return (provider.id, found.id) if _is_exact(model, found) else None


@lru_cache(maxsize=512)
def price_provider(model: str) -> str | None:
    """The genai-prices provider whose ids ``model`` looks like (``gpt-…`` → ``openai``), known model or not."""
    from genai_prices import data_snapshot

    try:
        return data_snapshot.get_snapshot().find_provider(model.lower(), None, None).id
    except LookupError:
        return None


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

    The id resolves exactly (see the module docstring): ``claude-sonnet-4-5-20250929`` is
    ``claude-sonnet-4-5``, ``claude-opus-4-9`` is not ``claude-opus-4``.

    Raises:
        PriceError: genai-prices has no exact entry for ``model``.

    Example:
        >>> prices_for("claude-sonnet-4-5").cache_read
        0.3
    """
    from genai_prices import Usage as GUsage
    from genai_prices import calc_price

    resolved = price_model_id(model)
    if resolved is None:
        raise PriceError(
            f"no exact price for model {model!r} in genai-prices (an unknown id is never priced as a model it "
            "merely starts like); pass prices=pc.Prices(input=..., output=..., cache_read=..., "
            "cache_write_5m=..., cache_write_1h=...)"
        )
    provider_id, model_id = resolved
    calc = calc_price(GUsage(input_tokens=1, output_tokens=1), model_ref=model_id, provider_id=provider_id,
                      genai_request_timestamp=REFERENCE_TIME)
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
        model_ref=model_id,
        provider_id=provider_id,
    )
