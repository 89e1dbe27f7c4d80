"""Counterfactuals anchored on measured usage: the simulator supplies only the difference a change makes.

Per request, ``counterfactual = measured + scale × (simulated fixed − simulated original)``, where ``scale`` is the
request's measured prompt size over its estimated one (the estimator's drift is not a saving). A request the
simulator does not reproduce (its simulated original reads a share of the prompt more than
:data:`AGREEMENT` away from the measured one: a provider-side miss, a read of another session's entry, an unlogged
change) keeps its measured cost and outcome under any fix, but for what a fix provably changes on it whatever the
provider did: a TTL choice re-prices the writes it made (a short-gap rewrite recurs under a 1h TTL and is billed
at 2× base instead of 1.25×). A request whose history the log lacks (a compaction call logged alone) is never
reproduced.

The interval of a saving comes from how well the simulator reproduces this session's own measured requests:

* the residual of each changed request (measured cost − scaled simulated cost of the original);
* a body fix is our rendition of what an agent would send: its counterfactual cost carries :data:`RENDITION`
  (the strategy-equivalence table's bound, docs/howto/advice.md);
* provider misses recur under any fix: the reads a fix gains are lost at the upper bound of the session's measured
  provider-miss rate;
* what the simulator claims on requests it does not reproduce is counted only in the high end;
* where the provider's documented rule leaves an outcome open (OpenAI's in-memory retention keeps an idle prefix
  somewhere between 5 minutes and an hour: ``detail["retention_open"]`` of :mod:`promptcache_nb.cache.openai`), the
  measured read says which happened, and the original's and every fix's replay of that request take the same
  outcome; without a measurement the replay assumes the expiry, and what the fix would save had the provider kept
  the prefix goes in the high end.

Every figure here is measured where no fix touches it, else ``simulated (counterfactual)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from .._lazy import pandas as pd
from ..usage import Usage

if TYPE_CHECKING:  # pragma: no cover

    from ..analysis import Prices
    from ..analysis.resimulate import StoredTurn


class Original(Protocol):
    """What anchoring reads of a session read back (:class:`~._counterfactual.Original` is one)."""

    @property
    def turns(self) -> Sequence[StoredTurn]: ...

    @property
    def partial(self) -> int | None: ...

    def prices(self, model: str) -> Prices | None: ...

    def history_missing(self, turn: StoredTurn) -> bool: ...

#: The usage sources an endpoint reported.
MEASURED = ("live", "imported")

#: A simulated original reproduces a measured request when their read shares, and their write shares, of the prompt
#: differ by at most this.
AGREEMENT = 0.10

#: The relative error of a body fix's counterfactual cost on the requests it changes: the bound the
#: strategy-equivalence table holds every fix to (tests/test_advice_equivalence.py).
RENDITION = 0.10

#: The usage components a counterfactual moves, in Usage's order.
_PARTS = ("input_tokens", "cache_read_input_tokens", "cache_creation_5m_input_tokens",
          "cache_creation_1h_input_tokens")


def _int(value: Any) -> int:
    return 0 if value is None or value != value else int(value)


def _num(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


@dataclass(frozen=True)
class RequestFit:
    """How the simulated original compares with one measured request.

    Attributes:
        idx: the request. at: when it was sent. model: its model.
        measured: its measured usage (None: the session is simulated, and ``simulated`` stands in).
        measured_cost: its measured cost (None: unpriced).
        simulated: the simulated original's usage of it (None: the cache model could not simulate it).
        simulated_cost: its simulated cost, unscaled.
        scale: measured prompt tokens / estimated prompt tokens (1.0 without a measurement).
        scaled_cost: the simulated original's cost with its prompt tokens scaled to the measured prompt (output
            tokens are the measured ones already: never scaled).
        reproduced: the simulated original's read share is within :data:`AGREEMENT` of the measured one.
        cause: why it is not reproduced (``provider_miss``, ``unexplained_read``, ``unpredicted_write``,
            ``history_missing``, ``below_minimum``, ``ttl``, ``unsupported``), or ``token_drift`` when reproduced
            with a scale more than 10 % from 1, else ``""``.
        gap_seconds: the idle gap before it (None for the first request).
        retention_kept: None when the provider's documented retention decides this request's outcome; else the
            outcome is open (:func:`open_read`) and this says which one the measured read shows — True: the provider
            kept the prefix (``simulated`` is then that outcome), False: it did not, or no measurement says.
    """

    idx: int
    at: datetime
    model: str
    measured: Usage | None
    measured_cost: float | None
    simulated: Usage | None
    simulated_cost: float | None
    scale: float
    reproduced: bool
    cause: str
    gap_seconds: float | None
    scaled_cost: float | None = None
    retention_kept: bool | None = None

    @property
    def residual(self) -> float:
        """Measured cost − scaled simulated cost: the simulator's error on this request, in dollars."""
        if self.measured_cost is None or self.scaled_cost is None:
            return 0.0
        return self.measured_cost - self.scaled_cost

    @property
    def base(self) -> Usage | None:
        """What the counterfactual starts from: the measured usage, or the simulated one without a measurement."""
        return self.measured if self.measured is not None else self.simulated

    @property
    def base_cost(self) -> float | None:
        return self.measured_cost if self.measured is not None else self.simulated_cost


def _usage_of(row: Any, output: int | None) -> Usage | None:
    if _num(row.cache_read_input_tokens) is None or _num(row.input_tokens) is None:
        return None
    return Usage(_int(row.input_tokens), _int(row.cache_read_input_tokens), _int(row.cache_creation_input_tokens),
                 _int(row.cache_creation_5m_input_tokens), _int(row.cache_creation_1h_input_tokens), output)


def share_of(u: Usage, part: str = "cache_read_input_tokens") -> float:
    """The share of ``u``'s prompt in ``part`` (its cache read by default)."""
    total = u.total_input_tokens or 0
    return (getattr(u, part) or 0) / total if total else 0.0


def open_read(detail: Any) -> int | None:
    """The tokens a request could have read had the provider kept its prefix as long as its documented retention
    allows (``detail["retention_open"]["read_if_kept"]`` of a cache model's result), or None: the rule decides."""
    got = detail.get("retention_open") if isinstance(detail, dict) else None
    return int(got["read_if_kept"]) if isinstance(got, dict) and "read_if_kept" in got else None


def _kept(u: Usage, read: int) -> Usage:
    """``u`` had the provider kept the prefix: ``read`` tokens read, the rest of the prompt uncached, writes kept
    (the open outcomes are of providers with no write fee)."""
    writes = _int(u.cache_creation_input_tokens)
    total = _int(u.input_tokens) + _int(u.cache_read_input_tokens) + writes
    return Usage(max(0, total - writes - read), read, writes, _int(u.cache_creation_5m_input_tokens),
                 _int(u.cache_creation_1h_input_tokens), u.output_tokens, "simulated")


def _prompt_scaled(u: Usage, scale: float) -> Usage:
    """``u`` with its prompt parts scaled to the measured prompt size and its output as it is."""
    return Usage(round(scale * _int(u.input_tokens)), round(scale * _int(u.cache_read_input_tokens)),
                 round(scale * _int(u.cache_creation_input_tokens)),
                 round(scale * _int(u.cache_creation_5m_input_tokens)),
                 round(scale * _int(u.cache_creation_1h_input_tokens)), u.output_tokens, "simulated")


def fit_requests(orig: Original, baseline: pd.DataFrame) -> list[RequestFit]:
    """One :class:`RequestFit` per request of ``orig`` (``baseline``: :meth:`Original.simulate` of no fix)."""
    real = baseline[~baseline.ping] if "ping" in baseline else baseline
    fits: list[RequestFit] = []
    prev_at: datetime | None = None
    for t, row in zip(orig.turns, real.itertuples(index=False), strict=True):
        s = t.stored
        sim = None if row.cache_reason == "unsupported" else _usage_of(row, t.output_tokens)
        sim_cost = _num(row.cost_usd)
        if sim_cost is None and sim is not None and (p := orig.prices(t.model)) is not None:
            sim_cost = p.cost(sim, t.at)  # the session's own prices (the replay prices by the price library)
        measured: Usage | None = None
        m_cost: float | None = None
        if s.get("usage_source") in MEASURED and _num(s.get("cache_read_input_tokens")) is not None:
            measured = Usage(_int(s.get("input_tokens")), _int(s.get("cache_read_input_tokens")),
                             _int(s.get("cache_creation_input_tokens")), _int(s.get("cache_creation_5m_input_tokens")),
                             _int(s.get("cache_creation_1h_input_tokens")), t.output_tokens, "imported")
            m_cost = _num(s.get("cost_usd"))
        gap = None if prev_at is None else (t.at - prev_at).total_seconds()
        prev_at = t.at
        scale, reproduced, cause = 1.0, True, ""
        kept_read = open_read(row.cache_detail) if sim is not None else None
        retention_kept = None if kept_read is None else False
        if measured is not None:
            est = sim.total_input_tokens if sim is not None else None
            got = measured.total_input_tokens or 0
            scale = got / est if est else 1.0
            if sim is not None and kept_read is not None and not orig.history_missing(t):
                # the documented retention allows both outcomes: the measured read says which one happened
                alt = _kept(sim, kept_read)
                if abs(share_of(measured) - share_of(alt)) < abs(share_of(measured) - share_of(sim)):
                    sim, retention_kept = alt, True
                    p = orig.prices(t.model)
                    sim_cost = p.cost(sim, t.at) if p is not None else None
            if sim is None:
                reproduced, cause = False, "unsupported"
            elif orig.history_missing(t):
                reproduced, cause = False, "history_missing"
            else:
                diff = share_of(measured) - share_of(sim)
                wrote = share_of(measured, "cache_creation_input_tokens") - share_of(sim, "cache_creation_input_tokens")
                reproduced = abs(diff) <= AGREEMENT and abs(wrote) <= AGREEMENT
                if abs(diff) > AGREEMENT:
                    cause = _disagreement(diff, row.cache_reason, gap, measured)
                elif not reproduced:  # the same read, but a write the replay did not predict (or the reverse)
                    cause = "below_minimum" if row.cache_reason == "below_minimum" else "unpredicted_write"
                elif abs(scale - 1.0) > 0.10:
                    cause = "token_drift"
        scaled_cost = sim_cost
        if sim is not None and sim_cost is not None and scale != 1.0:
            p = orig.prices(t.model)
            priced = p.cost(_prompt_scaled(sim, scale), t.at) if p is not None else None
            # no price of our own to re-price it: the replay's cost, scaled
            scaled_cost = priced if priced is not None else scale * sim_cost
        fits.append(RequestFit(t.idx, t.at, t.model, measured, m_cost, sim, sim_cost, scale, reproduced, cause, gap,
                               scaled_cost, retention_kept))
    return fits


def _disagreement(diff: float, sim_reason: str, gap: float | None, measured: Usage) -> str:
    """Why a measured request's read share differs from the simulated one's (``diff`` = measured − simulated)."""
    if diff > 0:  # the provider read what we did not predict
        if sim_reason == "below_minimum":
            return "below_minimum"
        if sim_reason == "ttl_expired":
            return "ttl"
        return "unexplained_read"  # another session's entry, or an unlogged prefix we sized apart
    if gap is not None and gap > 300 and (measured.cache_creation_input_tokens or 0) > 0:
        return "ttl"  # the provider expired what we kept (an entry it did not refresh, a shorter TTL)
    return "provider_miss"


def miss_rate(fits: list[RequestFit]) -> tuple[float, float]:
    """(measured provider-miss rate among requests the simulator read on, its 90 % Wilson upper bound)."""
    reads = [f for f in fits if f.measured is not None and f.simulated is not None
             and (f.simulated.cache_read_input_tokens or 0) > 0]
    n = len(reads)
    if not n:
        return 0.0, 0.0
    k = sum(1 for f in reads if f.cause == "provider_miss")
    p, z = k / n, 1.2816
    hi = (p + z * z / (2 * n) + z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)
    return p, min(1.0, hi)


@dataclass(frozen=True)
class AnchoredRequest:
    """One request of an anchored counterfactual.

    Attributes:
        origin: the original request it stands for (a ping stands after it). ping: a keep-warm ping.
        usage: its counterfactual usage (tokens scaled to the measured prompt). cost: its counterfactual cost.
        base_cost: the original's cost (measured; simulated without a measurement), 0 for a ping.
        delta: base_cost − cost (positive: saved). raw_delta: what the simulation alone claims, scaled.
        changed: the fix changed its usage. kept: the request is not reproduced and keeps its measured outcome.
    """

    origin: int
    at: datetime
    model: str
    ping: bool
    usage: Usage
    cost: float | None
    base_cost: float | None
    delta: float
    raw_delta: float
    changed: bool
    kept: bool


@dataclass(frozen=True)
class AnchoredReplay:
    """A fix's counterfactual anchored on the measured original, with the interval of its saving."""

    requests: list[AnchoredRequest]
    saved: float
    low: float
    high: float
    base_cost: float
    changed_cost: float
    unknown: bool
    #: the models of the requests it changes that no price covers (their dollars are unknown)
    unpriced: tuple[str, ...] = ()

    @property
    def cost(self) -> float:
        return sum(r.cost or 0.0 for r in self.requests)

    @property
    def changed(self) -> list[int]:
        return sorted({r.origin for r in self.requests if r.changed and not r.ping})


def _parts(u: Usage) -> list[int]:
    """uncached, read, 5m write, 1h write: a write whose split is unknown (no ``cache_creation`` object) is a 5m
    write, as it is priced."""
    w1 = _int(u.cache_creation_1h_input_tokens)
    w5 = max(_int(u.cache_creation_5m_input_tokens), _int(u.cache_creation_input_tokens) - w1)
    return [_int(u.input_tokens), _int(u.cache_read_input_tokens), w5, w1]


def _make(parts: list[int], output: int | None) -> Usage:
    uncached, read, w5, w1 = (max(0, p) for p in parts)
    return Usage(uncached, read, w5 + w1, w5, w1, output, "simulated")


def _shift(base: Usage, delta: list[float]) -> Usage:
    """``base`` moved by ``delta`` (per part), clipped at zero with the prompt's total kept where it can be."""
    parts = [b + d for b, d in zip(_parts(base), delta, strict=True)]
    want = sum(_parts(base)) + round(sum(delta))
    clipped = [max(0, round(p)) for p in parts]
    short = want - sum(clipped)
    if short > 0:
        clipped[0] += short  # what a clipped part could not hold is sent uncached
    elif short < 0:  # take from the largest part (rounding, or a clipped negative)
        k = max(range(4), key=lambda i: clipped[i])
        clipped[k] = max(0, clipped[k] + short)
    return _make(clipped, base.output_tokens)


def _hour_span(base: Usage, prefix: int | None, client_ttls: list[str] | None, share_1h: float | None) -> int | None:
    """How many of ``base``'s written tokens a fix's TTL choice writes at 1h. On a partial log the written span is
    the prompt's tokens from its read onwards, and the 1h breakpoints cover the first ``prefix`` tokens (the
    client's prefix) or the whole prompt; on a full body, the share of the fix's own writes that were 1h."""
    written = _int(base.cache_creation_input_tokens)
    if prefix is not None and client_ttls:
        if client_ttls[-1] == "1h":
            return written
        if client_ttls[0] == "1h":
            start = _int(base.cache_read_input_tokens)
            return max(0, min(start + written, prefix) - start)
        return 0
    return None if share_1h is None else round(written * share_1h)


def _ttl_repriced(base: Usage, w1: int) -> Usage:
    """``base`` with ``w1`` of its writes at 1h, the rest at 5m, as a fix's TTL choice writes them (tokens
    unchanged)."""
    written = _int(base.cache_creation_input_tokens)
    return Usage(_int(base.input_tokens), _int(base.cache_read_input_tokens), written, written - w1, w1,
                 base.output_tokens, "simulated")


def anchor(orig: Original, fits: list[RequestFit], baseline: pd.DataFrame, fixed: pd.DataFrame, *,
           body_fix: bool, ttl_fix: bool, client_ttls: list[str] | None = None) -> AnchoredReplay:
    """``fixed`` (:meth:`Original.simulate` of a plan) anchored on the measured original (see the module;
    ``client_ttls``: a partial log's breakpoint TTLs under the plan)."""
    by_idx = {f.idx: f for f in fits}
    sim_orig = {int(r.idx): r for r in baseline[~baseline.ping].itertuples(index=False)}
    written = fixed.cache_creation_input_tokens.fillna(0).sum()
    share_1h = float(fixed.cache_creation_1h_input_tokens.fillna(0).sum() / written) if written else None
    out: list[AnchoredRequest] = []
    unknown = False
    unpriced: set[str] = set()
    gains = 0.0
    error = 0.0
    rendition = 0.0
    claimed_elsewhere = 0.0
    open_gains = 0.0
    for r in fixed.itertuples(index=False):
        f = by_idx[int(r.idx)]
        p = orig.prices(str(r.model))
        fixed_usage = _usage_of(r, 0 if r.ping else f.simulated.output_tokens if f.simulated else None)
        if r.ping:
            usage = _shift(_make([0, 0, 0, 0], 0), [f.scale * x for x in _parts(fixed_usage)]) \
                if fixed_usage is not None else _make([0, 0, 0, 0], 0)
            cost = p.cost(usage, r.sent_at) if p is not None and fixed_usage is not None else None
            if cost is None:
                unknown = True
                unpriced.add(str(r.model))
            spent = cost or 0.0
            out.append(AnchoredRequest(f.idx, r.sent_at, str(r.model), True, usage, cost, 0.0, -spent, -spent, True,
                                       False))
            rendition += spent if body_fix else 0.0
            continue
        base = f.base
        o = sim_orig[f.idx]
        o_usage = _usage_of(o, f.simulated.output_tokens if f.simulated else None)
        if f.retention_kept and o_usage is not None and fixed_usage is not None:
            # the measured read showed the provider kept the prefix across this gap: so it does under the fix
            o_usage = f.simulated
            if (k := open_read(r.cache_detail)) is not None:
                fixed_usage = _kept(fixed_usage, k)
        if base is None or o_usage is None or fixed_usage is None or p is None or f.base_cost is None:
            if fixed_usage is not None and o_usage is not None and _parts(fixed_usage) != _parts(o_usage):
                unknown = True  # the fix changes a request no price covers: its dollars are unknown, not $0
                unpriced.add(str(r.model))
            # nothing to anchor on, or no price: the request is what it was, and a change to it is unknown
            out.append(AnchoredRequest(f.idx, r.sent_at, str(r.model), False, base or _make([0, 0, 0, 0], None),
                                       f.base_cost, f.base_cost, 0.0, 0.0, False, True))
            continue
        delta_parts = [f.scale * (a - b) for a, b in zip(_parts(fixed_usage), _parts(o_usage), strict=True)]
        moved = any(abs(d) >= 0.5 for d in delta_parts)
        shifted = _shift(base, delta_parts) if moved else base
        # priced only where something moves (most requests of most fixes do not: ~2 library costs each)
        base_priced = p.cost(base, r.sent_at) if moved or not f.reproduced else f.base_cost
        raw_cost = p.cost(shifted, r.sent_at) if moved else base_priced
        raw_delta = 0.0 if raw_cost is None or base_priced is None else base_priced - raw_cost
        if f.reproduced:
            usage = shifted
        elif ttl_fix and _int(base.cache_creation_input_tokens) and (hour := _hour_span(
                base, None if orig.partial is None else round(orig.partial * fits[0].scale), client_ttls,
                share_1h)) is not None:
            usage = _ttl_repriced(base, hour)  # the provider's rewrite recurs, at the fix's TTL price
        else:
            usage = base
        changed = usage is not base and _parts(usage) != _parts(base)
        if not changed:
            cost = f.base_cost
        else:
            priced = p.cost(usage, r.sent_at)
            cost = None if priced is None or base_priced is None else max(0.0, f.base_cost + priced - base_priced)
        if cost is None:
            unknown = True
            unpriced.add(str(r.model))
            cost = f.base_cost
        delta = f.base_cost - cost
        if changed:
            if f.reproduced:
                # the simulator's own error on it, and where the fix's tokens fall when the estimated prompt
                # drifted from the measured one (the scale spreads the drift over the whole prompt)
                error += abs(f.residual) + abs(delta) * abs(1.0 - 1.0 / f.scale) if f.scale > 0 else abs(f.residual)
                if _int(usage.cache_read_input_tokens) > _int(base.cache_read_input_tokens):
                    gains += max(0.0, delta)  # a read the provider may still miss
                rendition += cost if body_fix else 0.0
        if not f.reproduced and moved:
            claimed_elsewhere += max(0.0, raw_delta - delta)
        unresolved = f.retention_kept is None or f.retention_kept is False and f.measured is None
        if unresolved and (kf := open_read(r.cache_detail)) is not None:
            # nothing measured says whether the provider kept the prefix across this gap: the replay assumed not;
            # had it kept it, the fix saves what the kept outcomes differ by (the high end carries it)
            ko = open_read(o.cache_detail)
            kept_o = o_usage if ko is None else _kept(o_usage, ko)
            kept_f = _kept(fixed_usage, kf)
            kept_delta = [f.scale * (a - b) for a, b in zip(_parts(kept_f), _parts(kept_o), strict=True)]
            kept_cost = p.cost(_shift(base, kept_delta), r.sent_at)
            if kept_cost is not None and base_priced is not None:
                open_gains += max(0.0, (base_priced - kept_cost) - delta)
        out.append(AnchoredRequest(f.idx, r.sent_at, str(r.model), False, usage, cost, f.base_cost, delta, raw_delta,
                                   changed, not f.reproduced))
    saved = sum(a.delta for a in out)
    _, miss_hi = miss_rate(fits)
    spread = error + RENDITION * rendition
    low = saved - spread - miss_hi * gains
    high = saved + spread + claimed_elsewhere + open_gains
    changed_cost = sum(a.base_cost or 0.0 for a in out if a.changed and not a.ping)
    high = max(saved, min(high, changed_cost))  # never more than what the requests it changes cost
    base_cost = sum(f.base_cost or 0.0 for f in fits)
    return AnchoredReplay(out, saved, min(low, saved), high, base_cost, changed_cost, unknown,
                          tuple(sorted(unpriced)))
