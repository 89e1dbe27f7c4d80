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

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

from .._lazy import genai_prices
from .._util import model_base_id
from ..errors import PriceError
from ..usage import MAX_TOKENS, Usage


@dataclass(frozen=True)
class Prices:
    """USD per million tokens (the base tier).

    Prices from genai-prices carry ``model_ref`` (the library's own model id, exactly resolved) and
    ``provider_id``: their costs are genai-prices' own, at the request's time (``at``), so context-size
    tiers (e.g. Sonnet above 200k input tokens), price changes and time-of-day rates (e.g. DeepSeek's
    off-peak discount) apply, and reasoning tokens the usage reports are passed on (priced when the
    library prices them apart; they are part of the output otherwise) — computed from a rate table
    cached per model price period, equal to the library's ``calc_price`` to the last digit
    (:func:`_library_cost`). Explicit prices (no ``model_ref``) use the rates.
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

    def costs(self, usage: Usage, at: datetime | None = None) -> tuple[float | None, float | None]:
        """(:meth:`cost`, :meth:`cost_without_cache`) of one request, the model's prices looked up once (a
        usage-first import prices every request both ways)."""
        uncached, read, write = usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens
        if self.model_ref is None or uncached is None or read is None or write is None:
            return self.cost(usage, at), self.cost_without_cache(usage, at)
        output, reasoning, total = usage.output_tokens or 0, _reasoning(usage), uncached + read + write
        cached, uncached_cost = _library_costs(self.model_ref, self.provider_id, at, (
            _usage_fields(total, read, write, usage.cache_creation_1h_input_tokens or 0, output, reasoning),
            _usage_fields(total, 0, 0, 0, output, reasoning)))
        return cached, uncached_cost


@dataclass(frozen=True)
class CostTotal:
    """A sum of per-request costs that keeps what it could not price (:func:`cost_total`).

    A request without a price has an unknown cost, never $0: ``usd`` sums the priced requests only and is None
    when none was priced; ``unpriced`` counts the others and ``unpriced_models`` names their models, so a total
    (or a saving computed from two) can say "unknown" or "N requests left out" instead of reporting $0.
    """

    usd: float | None  #: Σ cost of the priced requests; None when no request was priced (unknown)
    priced: int  #: requests with a cost
    unpriced: int  #: requests without one (their model has no exact price)
    unpriced_models: tuple[str, ...]  #: the models of the unpriced requests, sorted

    @property
    def complete(self) -> bool:
        """Every request was priced: ``usd`` is the whole total."""
        return self.unpriced == 0 and self.usd is not None

    def label(self) -> str:
        """``$1.2345``, ``unknown (no price for m)``, or ``$1.2345 + unknown (3 requests of m)``."""
        models = ", ".join(self.unpriced_models)
        if self.usd is None:
            return f"unknown (no price for {models})" if models else "unknown"
        if not self.unpriced:
            return f"${self.usd:,.4f}"
        return f"${self.usd:,.4f} + unknown ({self.unpriced} requests of {models})"


def cost_total(rows: Iterable[tuple[str, float | None]]) -> CostTotal:
    """The :class:`CostTotal` of ``(model, cost)`` pairs (a frame's ``zip(df.model, df.cost_usd)``; None and NaN
    are unpriced).

    Example:
        >>> cost_total([("claude-sonnet-5", 0.5), ("claude-opus-4-9", None)]).label()
        '$0.5000 + unknown (1 requests of claude-opus-4-9)'
        >>> cost_total([("claude-opus-4-9", float("nan"))]).usd is None
        True
    """
    usd, priced, unpriced, models = 0.0, 0, 0, set()
    for model, cost in rows:
        if cost is None or math.isnan(cost):
            unpriced += 1
            models.add(str(model))
        else:
            usd += float(cost)
            priced += 1
    return CostTotal(usd if priced else None, priced, unpriced, tuple(sorted(models)))


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


#: (snapshot, provider, model) by (snapshot identity, model ref, provider id): a usage-first import prices tens of
#: thousands of requests of a few models (the snapshot is kept, so its id is never reused while held)
_RESOLVED: dict[tuple[int, str, str | None], tuple[Any, Any, Any]] = {}


def _library_cost(model_ref: str, provider_id: str | None, at: datetime | None, *, total: int, read: int,
                  write: int, write_1h: int, output: int, reasoning: int = 0) -> float:
    """genai-prices' cost of one request: from the model's cached rate table when it provably gives the
    library's own result (:func:`_rate_table`), else by ``calc_price`` itself."""
    return _library_costs(model_ref, provider_id, at,
                          (_usage_fields(total, read, write, write_1h, output, reasoning),))[0]


def _usage_fields(total: int, read: int, write: int, write_1h: int, output: int, reasoning: int) -> dict[str, int]:
    """The genai-prices usage of one request, as :func:`_library_costs` prices it."""
    fields = {"input_tokens": total, "cache_read_tokens": read, "cache_write_tokens": write,
              "cache_write_1h_tokens": write_1h, "output_tokens": output}
    if 0 < reasoning <= output:
        fields["output_reasoning_tokens"] = reasoning  # a part of the output: priced apart only if the model is
    return fields


def _library_costs(model_ref: str, provider_id: str | None, at: datetime | None,
                   usages: tuple[dict[str, int], ...]) -> list[float]:
    """:func:`_library_cost` of each of ``usages`` (:func:`_usage_fields`) at one time, the model resolved and its
    price period found once."""
    when = at or REFERENCE_TIME

    # the library's own resolution (once per snapshot and model) and price period: the table outlives neither
    snapshot = genai_prices.data_snapshot.get_snapshot()
    key = (id(snapshot), model_ref, provider_id)
    held = _RESOLVED.get(key)
    if held is None or held[0] is not snapshot:
        if len(_RESOLVED) >= 4096:
            _RESOLVED.clear()
        held = _RESOLVED[key] = (snapshot, *snapshot.find_provider_model(model_ref, None, provider_id, None))
    _, provider, model = held
    # genai-prices rewrites the usage of some Groq models before pricing: the library prices those itself
    table = _rate_table(model.get_prices(when)) if provider.id != "groq" else None
    out = []
    for fields in usages:
        cost = table.cost(fields) if table is not None else None
        if cost is None:
            calc = genai_prices.calc_price(genai_prices.Usage(**fields), model_ref=model_ref,
                                           provider_id=provider_id, genai_request_timestamp=when)
            cost = float(calc.total_price)
        out.append(cost)
    return out


# The usage keys :func:`_library_cost` passes: always, and sometimes (reasoning, when reported).
_ALWAYS_REPORTED = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens",
                    "output_tokens")
_SOMETIMES_REPORTED = ("output_reasoning_tokens",)


@dataclass(frozen=True)
class _RateTable:
    """One genai-prices price period of one model (a ``ModelPrice``) compiled for the usage keys we pass.

    genai-prices prices a usage as: for each priced unit, its *leaf* count (its usage value minus the leaf
    counts of the priced units below it: uncached input = input - cache read - cache write...) times its
    rate (a tier's rate when the total input tokens exceed the tier's start), divided by ``per``, summed
    in the price's key order, in ``Decimal``. :meth:`cost` does exactly that, in the same order.
    """

    # (usage key, base rate, tiers highest first as (start, rate), per), in the price's key order
    lines: tuple[tuple[str, Decimal, tuple[tuple[int, Decimal], ...], int], ...]
    leaves: tuple[tuple[str, tuple[str, ...]], ...]  # (usage key, priced keys below it), most specific first
    tiered: bool
    #: the same lines in integers over one denominator (:func:`_integer_lines`), when that is exact; else None
    scaled: tuple[tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...], int] | None = None

    def cost(self, fields: dict[str, int]) -> float | None:
        """The library's ``float(total_price)``; None where the library would raise (a negative count)."""
        if min(fields.values()) < 0:
            return None
        leaf: dict[str, int] = {"requests": 1}  # genai-prices counts one request per call
        for key, below in self.leaves:
            n = fields.get(key, 0) - sum(leaf[b] for b in below)
            if n < 0:
                return None
            leaf[key] = n
        total_input = fields["input_tokens"] if self.tiered else 0
        if self.scaled is not None:
            lines, denominator = self.scaled
            exact = 0
            for key, base_rate, scaled_tiers in lines:
                if leaf[key]:
                    unit_rate = base_rate
                    for tier_start, scaled_tier in scaled_tiers:
                        if total_input > tier_start:
                            unit_rate = scaled_tier
                            break
                    exact += unit_rate * leaf[key]
            return exact / denominator  # int / int: correctly rounded, as float() of the exact Decimal sum is
        total = Decimal(0)
        for key, rate, tiers, per in self.lines:
            if not leaf[key]:  # adds an exact zero: the sum's value (and so its float) is the same without it
                continue
            for start, tier_rate in tiers:
                if total_input > start:
                    rate = tier_rate
                    break
            total += rate * Decimal(leaf[key]) / per
        return float(total)


# Compiled tables by ModelPrice identity (the object is kept, so its id is never reused); None: no table.
_TABLES: dict[int, tuple[Any, _RateTable | None]] = {}


def _rate_table(model_price: Any) -> _RateTable | None:
    entry = _TABLES.get(id(model_price))
    if entry is None or entry[0] is not model_price:
        if len(_TABLES) >= 4096:  # price snapshots updated at run time leave old periods behind
            _TABLES.clear()
        entry = _TABLES[id(model_price)] = (model_price, _compile_rate_table(model_price))
    return entry[1]


def _compile_rate_table(model_price: Any) -> _RateTable | None:
    """The table of ``model_price``, or None when it cannot be proven to give the library's result."""

    registry = genai_prices.units._get_registry()
    if type(model_price) is not genai_prices.types.ModelPrice:
        return None
    items = [(k, v) for k, v in model_price.__dict__.items() if not k.startswith("_") and v is not None]
    try:
        units = [registry.unit_for_price_key(k) for k, _ in items]
        # the library's own validation of these prices (ancestors, joins, values) depends on no usage
        model_price.calc_price(genai_prices.Usage(input_tokens=10, cache_read_tokens=1, cache_write_tokens=2,
                                      cache_write_1h_tokens=1, output_tokens=2, output_reasoning_tokens=1))
    except (KeyError, ValueError):
        return None  # an unknown key (the library warns and skips it) or invalid prices: the library decides
    priced = {u.usage_key: u for u in units if u.usage_key != "requests"}
    # A priced key we do not pass is inferred by genai-prices: 0, or an error when a more specific or an
    # overlapping key is reported positive. Both conditions only grow with the set of positive keys, so
    # a probe with every other key we may pass positive proves it is 0 for all our usages.
    for key in priced:
        if key in _ALWAYS_REPORTED:
            continue
        probe = genai_prices.Usage(**{k: 1 for k in (*_ALWAYS_REPORTED, *_SOMETIMES_REPORTED) if k != key})
        try:
            if getattr(probe, key) != 0:
                return None
        except ValueError:
            return None
    ordered = sorted(priced.values(), key=lambda u: (-len(u.dimensions), u.usage_key))
    leaves = tuple(
        (u.usage_key, tuple(d.usage_key for d in ordered
                            if d is not u and u.dimensions.items() <= d.dimensions.items()))
        for u in ordered)
    lines = tuple(
        (u.usage_key, v.base, tuple((t.start, t.price) for t in reversed(v.tiers)), u.per)
        if isinstance(v, genai_prices.types.TieredPrices) else (u.usage_key, v, (), u.per)
        for u, (_, v) in zip(units, items, strict=True))
    tiered = any(isinstance(v, genai_prices.types.TieredPrices) for _, v in items)
    return _RateTable(lines=lines, leaves=leaves, tiered=tiered, scaled=_integer_lines(lines))


#: The most digits the Decimal sum may need for :func:`_integer_lines` to hold (the context's 28, with room)
_EXACT_DIGITS = 24


def _integer_lines(lines: tuple[tuple[str, Decimal, tuple[tuple[int, Decimal], ...], int], ...]
                   ) -> tuple[tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...], int] | None:
    """The rate lines as integers over one denominator, or None when that would not be exact.

    ``Σ rate × n / per`` in Decimal is exact when each ``per`` is a power of ten and the sum's digits fit the
    context (every rate has a few decimals; a request has at most ``usage.MAX_TOKENS`` tokens): it is then the
    rational ``Σ R × n / D`` with integer ``R = rate × D / per``, whose float (``int / int``) is correctly
    rounded exactly as ``float(Decimal)`` is. The integer sum skips Decimal's per-term work (a usage-first
    import prices every request twice)."""
    rates = [r for _, base, tiers, _ in lines for r in (base, *(t for _, t in tiers))]
    pers = [per for *_, per in lines]
    if not rates or any(not r.is_finite() or r < 0 for r in rates):
        return None
    if any(per <= 0 or 10 ** (len(str(per)) - 1) != per for per in pers):
        return None  # a per that is no power of ten: Decimal's division may round
    scale = max(max(0, -int(r.as_tuple().exponent)) for r in rates)
    denominator = 10 ** scale * max(pers)
    largest = max(rates) * Decimal(MAX_TOKENS) * len(lines) * 10 ** scale
    if len(str(int(largest))) > _EXACT_DIGITS:
        return None

    def scaled(rate: Decimal, per: int) -> int:
        return int(rate * 10 ** scale) * (max(pers) // per)

    return tuple((key, scaled(base, per), tuple((start, scaled(t, per)) for start, t in tiers))
                 for key, base, tiers, per in lines), denominator


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


#: OpenRouter's vendor prefixes (``mistralai/mistral-large``) whose genai-prices provider id is spelt otherwise;
#: any other prefix is looked up as a provider id as it is (``anthropic``, ``openai``, ``google``, ``x-ai``...).
_VENDOR_PROVIDERS = {"mistralai": "mistral", "meta-llama": "meta", "z-ai": "zai"}


def _exact_match(model: str, provider_id: str | None) -> tuple[str, str] | None:
    """``(provider id, model id)`` of ``model`` among ``provider_id``'s models (all providers' when None), when
    genai-prices' match names it exactly (:func:`_is_exact`); None otherwise."""

    try:
        provider, found = genai_prices.data_snapshot.get_snapshot().find_provider_model(model, None, provider_id, None)
    except LookupError:
        return None
    return (provider.id, found.id) if _is_exact(model, found) else None


#: An Amazon Bedrock model id: optional cross-region prefix, ``anthropic.<model>``, and the version suffix
#: (``us.anthropic.claude-sonnet-4-5-20250929-v1:0``).
_BEDROCK_ID = re.compile(r"(?P<base>(?:[a-z-]+\.)?anthropic\.[a-z0-9.-]+?)-v\d+(?::\d+)?")


def _bedrock_match(model: str, base: str) -> tuple[str, str] | None:
    """genai-prices' ``aws`` entry for a Bedrock id, when its match clause names the id without its version suffix
    outright (``us.anthropic.claude-sonnet-4-5-20250929``); None otherwise (never a look-alike)."""

    try:
        provider, found = genai_prices.data_snapshot.get_snapshot().find_provider_model(model, None, "aws", None)
    except LookupError:
        return None
    # the id itself is the reference genai-prices matches (its entry's own id is not in its clause)
    return (provider.id, model) if base in _clause_strings(found.match) else None


def _clause_strings(logic: Any) -> set[str]:
    """Every string a genai-prices match clause compares with (equals, starts_with, contains)."""
    out = {v.lower() for a in ("equals", "starts_with", "contains") if isinstance(v := getattr(logic, a, None), str)}
    for sub in getattr(logic, "or_", None) or ():
        out |= _clause_strings(sub)
    return out


#: A Gemini id as the API names it beside its model: the resource name (``models/gemini-2.5-flash``, Vertex's
#: ``publishers/google/models/…``) and a stable version (``gemini-2.0-flash-001``, which the version-less id
#: is the alias of).
_GEMINI_ID = re.compile(r"(?:(?:publishers/google/)?models/)?(?P<base>gemini-[a-z0-9.-]+?)(?:-\d{3})?")


def _gemini_match(model: str) -> tuple[str, str] | None:
    """genai-prices' ``google`` entry for a Gemini resource name or stable version, when it names the base id
    exactly (:func:`_is_exact`); None otherwise (a preview or an unknown version is never priced as another)."""
    found = _GEMINI_ID.fullmatch(model.strip().lower())
    if found is None or found.group("base") == model:
        return None
    return _exact_match(found.group("base"), "google")


@lru_cache(maxsize=512)
def price_model_id(model: str) -> tuple[str, str] | None:
    """``(provider id, model id)`` of ``model`` in genai-prices, resolved exactly; None when it has no exact
    entry (an unknown id, or one the library would only match by prefix).

    An OpenRouter-style ``vendor/model`` id resolves through genai-prices' provider matching: OpenRouter's own
    entry for it (``anthropic/claude-sonnet-4.6`` at OpenRouter's price), else the vendor's entry for the model
    (``anthropic/claude-sonnet-4-5`` → ``anthropic``'s ``claude-sonnet-4-5``), exactly as above — never a model
    it merely starts like.

    Example:
        >>> price_model_id("claude-sonnet-4-5-20250929"), price_model_id("claude-opus-4-9")
        (('anthropic', 'claude-sonnet-4-5'), None)
        >>> price_model_id("anthropic/claude-sonnet-4.6")
        ('openrouter', 'anthropic/claude-sonnet-4.6')

    An Amazon Bedrock id resolves to genai-prices' ``aws`` entry that names it (Bedrock's own, regional price):
        >>> price_model_id("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
        ('aws', 'us.anthropic.claude-sonnet-4-5-20250929-v1:0')

    A Gemini resource name or stable version resolves to the ``google`` entry of the id it names:
        >>> price_model_id("models/gemini-2.5-pro"), price_model_id("gemini-2.0-flash-001")
        (('google', 'gemini-2.5-pro'), ('google', 'gemini-2.0-flash'))
    """
    found = _exact_match(model, None)
    if found is None and (bedrock := _BEDROCK_ID.fullmatch(model.lower())) is not None:
        found = _bedrock_match(model, bedrock.group("base"))
    if found is None and "gemini-" in model.lower():
        found = _gemini_match(model)
    if found is None and "/" in model:
        vendor, name = model.split("/", 1)
        vendor = vendor.strip().lower()
        found = _exact_match(model, "openrouter")
        if found is None and vendor and name:
            found = _exact_match(name, _VENDOR_PROVIDERS.get(vendor, vendor))
    return found


@lru_cache(maxsize=512)
def price_provider(model: str) -> str | None:
    """The genai-prices provider whose ids ``model`` looks like (``gpt-…`` → ``openai``), known model or not."""

    try:
        return genai_prices.data_snapshot.get_snapshot().find_provider(model.lower(), None, None).id
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
    computed with them follow genai-prices per request (tiers, price changes, time-of-day rates).

    The id resolves exactly (see the module docstring): ``claude-sonnet-4-5-20250929`` is
    ``claude-sonnet-4-5``, ``claude-opus-4-9`` is not ``claude-opus-4``.

    Raises:
        PriceError: genai-prices has no exact entry for ``model``.

    Example:
        >>> prices_for("claude-sonnet-4-5").cache_read
        0.3
    """

    resolved = price_model_id(model)
    if resolved is None:
        raise PriceError(
            f"no exact price for model {model!r} in genai-prices (an unknown id is never priced as a model it "
            "merely starts like); pass prices=pc.analysis.Prices(input=..., output=..., cache_read=..., "
            "cache_write_5m=..., cache_write_1h=...)"
        )
    provider_id, model_id = resolved
    calc = genai_prices.calc_price(genai_prices.Usage(input_tokens=1, output_tokens=1), model_ref=model_id,
                                   provider_id=provider_id, genai_request_timestamp=REFERENCE_TIME)
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
