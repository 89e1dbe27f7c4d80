"""What-ifs over a stored session under the Anthropic cache model: other TTLs, keep-warm pings, and
where (and why) the cache was rebuilt.

* :func:`ttl_whatif` rewrites every ``cache_control`` ttl of every stored body (explicit markers and the
  top-level automatic one) and replays the session: per-turn usage and cost with 5m vs 1h entries
  (1h writes cost 2× base input, 5m writes 1.25×; reads refresh either for free — rules §1.6-1.7).
* :func:`keep_warm` adds a ping every ``every`` during each gap between requests: the previous request
  re-sent with ``max_tokens: 0`` (rules §1.6 "pre-warming"), which reads — and so refreshes — the cached
  prefix. It reports the rebuilds the pings avoid and what they cost.
* :func:`rebuilds` lists the turns that read less than the previous request left behind, with the cache
  model's reason code and a one-line cause (TTL expiry, the segment that changed, model switch,
  below-minimum prefix, lookback exceeded...).

All figures are simulated over estimated tokens; costs use the session's prices (its explicit
``prices=`` or genai-prices for each turn's model).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import pandas as pd

from .._util import fmt_duration, parse_duration
from ..cache import AnthropicCache
from ..usage import Usage
from .prices import Prices, prices_for
from .resimulate import StoredTurn, _resolve, load_turns

WHATIF_COLUMNS = [
    "ttl", "idx", "at", "gap_seconds", "total_tokens", "input_tokens", "cache_read_input_tokens",
    "cache_creation_input_tokens", "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens",
    "output_tokens", "cache_reason", "cost_usd",
]

REBUILD_COLUMNS = [
    "idx", "at", "gap_seconds", "expected_read", "read", "lost_tokens", "reason", "cause", "changed_path",
    "detail",
]


def _session_prices(row: dict[str, Any]) -> Any:
    if row["config"].get("prices"):
        fixed = Prices(**row["config"]["prices"])
        return lambda _model: fixed
    return prices_for


def _anthropic(row: dict[str, Any]) -> AnthropicCache:
    params = row["config"].get("cache_params", {}) if row["cache_model"] == "anthropic" else {}
    return AnthropicCache(**params)


def _with_output(usage: Usage, output: int | None) -> Usage:
    return Usage(usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens,
                 usage.cache_creation_5m_input_tokens, usage.cache_creation_1h_input_tokens, output,
                 "simulated", usage.raw)


def _gaps(turns: list[StoredTurn]) -> list[float | None]:
    return [None] + [(b.at - a.at).total_seconds() for a, b in zip(turns, turns[1:], strict=False)]


def ttl_whatif(
    lab_or_session: Any,
    session_id: str | None = None,
    ttls: Iterable[str] = ("5m", "1h"),
) -> pd.DataFrame:
    """Per-turn usage and cost of a stored session had every cache breakpoint used each TTL.

    Args:
        lab_or_session: a Session, or a Lab with ``session_id``.
        ttls: the TTLs to compare (``"5m"``, ``"1h"``).

    Returns:
        Long format, one row per (ttl, turn): ``ttl, idx, at, gap_seconds``, the usage columns,
        ``cache_reason`` and ``cost_usd``. Totals: ``df.groupby("ttl")[["cost_usd"]].sum()``.

    Example:
        >>> df = pc.ttl_whatif(s)                                  # doctest: +SKIP
        >>> df.groupby("ttl").cost_usd.sum()                       # doctest: +SKIP
    """
    lab, sid = _resolve(lab_or_session, session_id)
    row = lab.store.session_row(sid)
    price = _session_prices(row)
    frames = []
    for ttl in ttls:
        if ttl not in ("5m", "1h"):
            raise ValueError(f"ttl must be '5m' or '1h' (Anthropic's two TTLs), got {ttl!r}")
        turns = load_turns(lab, sid, ttl=ttl)
        cache = _anthropic(row)
        gaps = _gaps(turns)
        rows = []
        for t, gap in zip(turns, gaps, strict=True):
            res = cache.process(t.request, t.at)
            u = _with_output(res.usage, t.output_tokens)
            rows.append((ttl, t.idx, t.at, gap, t.request.total_tokens, u.input_tokens,
                         u.cache_read_input_tokens, u.cache_creation_input_tokens,
                         u.cache_creation_5m_input_tokens, u.cache_creation_1h_input_tokens, u.output_tokens,
                         res.reason, price(t.model).cost(u, t.at)))
        frames.append(pd.DataFrame(rows, columns=WHATIF_COLUMNS))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=WHATIF_COLUMNS)


def _is_rebuild(idx: int, read: int | None, expected: int, reason: str | None) -> bool:
    return idx > 0 and read is not None and read < expected and reason != "hit"


def keep_warm(
    session: Any,
    every: str | float | timedelta = "4m",
    *,
    session_id: str | None = None,
    max_gap: str | float | timedelta | None = None,
    ttl: str | None = None,
) -> dict[str, Any]:
    """What a keep-warm ping every ``every`` would have saved, and cost.

    A ping re-sends the previous request with ``max_tokens: 0`` at ``prev + every``, ``prev + 2·every``...
    up to the next request, reading (and so refreshing) the cached prefix; it costs the tokens it reads
    (and writes, if its entry had already expired). Both runs are simulated with the Anthropic model.

    Args:
        session: a Session (or a Lab, with ``session_id``).
        every: the ping interval, e.g. ``"4m"`` (under a 5m TTL).
        max_gap: do not keep gaps longer than this warm (pinging overnight rarely pays); None = all.
        ttl: rewrite every breakpoint to this TTL first (``"5m"`` / ``"1h"``), as in :func:`ttl_whatif`.

    Returns:
        A dict: ``every_seconds, pings, ping_cost_usd, rebuilds_without, rebuilds_with, rebuilds_avoided,
        cost_without_usd`` (requests only), ``cost_with_usd`` (requests + pings), ``net_saving_usd``, and
        ``turns``: a per-turn DataFrame of both runs.

    Example:
        >>> pc.keep_warm(s, every="4m")["rebuilds_avoided"]       # doctest: +SKIP
    """
    lab, sid = _resolve(session, session_id)
    row = lab.store.session_row(sid)
    price = _session_prices(row)
    step = parse_duration(every)
    if step.total_seconds() <= 0:
        raise ValueError(f"every must be a positive duration, got {every!r}")
    limit = None if max_gap is None else parse_duration(max_gap).total_seconds()
    turns = load_turns(lab, sid, ttl=ttl)
    gaps = _gaps(turns)
    plain, warm = _anthropic(row), _anthropic(row)
    out_rows = []
    pings = 0
    ping_cost = 0.0
    prev: StoredTurn | None = None
    prev_total = 0
    for t, gap in zip(turns, gaps, strict=True):
        n_pings = 0
        if prev is not None and (limit is None or gap <= limit):
            at = prev.at + step
            while at < t.at:
                res = warm.process(prev.request, at)
                ping_cost += price(prev.model).cost(_with_output(res.usage, 0), at) or 0.0
                n_pings += 1
                at += step
        pings += n_pings
        a, b = plain.process(t.request, t.at), warm.process(t.request, t.at)
        ua, ub = _with_output(a.usage, t.output_tokens), _with_output(b.usage, t.output_tokens)
        expected = min(prev_total, t.request.total_tokens)
        p = price(t.model)
        out_rows.append({
            "idx": t.idx, "at": t.at, "gap_seconds": gap, "pings_before": n_pings,
            "read_without": ua.cache_read_input_tokens, "read_with": ub.cache_read_input_tokens,
            "reason_without": a.reason, "reason_with": b.reason,
            "rebuild_without": _is_rebuild(t.idx, ua.cache_read_input_tokens, expected, a.reason),
            "rebuild_with": _is_rebuild(t.idx, ub.cache_read_input_tokens, expected, b.reason),
            "cost_without_usd": p.cost(ua, t.at), "cost_with_usd": p.cost(ub, t.at),
        })
        prev, prev_total = t, t.request.total_tokens
    df = pd.DataFrame(out_rows)
    without = int(df.rebuild_without.sum()) if len(df) else 0
    with_ = int(df.rebuild_with.sum()) if len(df) else 0
    cost_without = float(df.cost_without_usd.sum()) if len(df) else 0.0
    cost_with = (float(df.cost_with_usd.sum()) if len(df) else 0.0) + ping_cost
    return {
        "every_seconds": step.total_seconds(), "pings": pings, "ping_cost_usd": ping_cost,
        "rebuilds_without": without, "rebuilds_with": with_, "rebuilds_avoided": without - with_,
        "cost_without_usd": cost_without, "cost_with_usd": cost_with,
        "net_saving_usd": cost_without - cost_with, "turns": df,
    }


def _cause(reason: str | None, detail: dict[str, Any], gap: float | None) -> str:
    """One line a notebook reader can act on."""
    if reason == "ttl_expired":
        ttl = detail.get("expired_ttl") or detail.get("expired") or "cached"
        idle = detail.get("expired_after_seconds", detail.get("idle_seconds", gap))
        return "TTL expiry" if idle is None else f"TTL expiry: the {ttl} entry was idle {fmt_duration(idle)}"
    if reason == "prefix_changed":
        return f"prefix changed at {detail.get('divergence_path')}"
    if reason == "model_switch":
        return f"model switch from {detail.get('previous_model')}"
    if reason == "below_minimum":
        return f"prefix below the {detail.get('min_tokens', 'minimum')}-token minimum: nothing was cached"
    if reason == "lookback_exceeded":
        return (f"breakpoint too far back: the entry at {detail.get('unreached_path')} lies beyond the "
                "20-position lookback")
    if reason == "no_breakpoint":
        return "no cache_control in the request"
    if reason == "not_written":
        return "the previous request wrote no entry covering this prefix"
    if reason == "evicted":
        return "evicted under capacity pressure"
    return str(reason)


def rebuilds(session: Any, *, session_id: str | None = None) -> pd.DataFrame:
    """The turns that read less than the previous request left behind, each with its cause.

    A rebuild is a request (not the first) whose cache read is below ``min(previous total, own total)``
    and whose cache model did not report ``hit``. Reads and totals are the stored ones (measured when
    the session was live or imported); the reason and detail are the session's cache model's (for an
    Anthropic session: TTL expiry, prefix change with the segment that changed, model switch,
    below-minimum prefix, lookback exceeded...). Turns stored without a reason are explained by
    re-simulating the session under the Anthropic model.

    Example:
        >>> pc.rebuilds(s)[["idx", "cause", "lost_tokens"]]        # doctest: +SKIP
    """
    lab, sid = _resolve(session, session_id)
    df = lab.store.sql(
        """SELECT idx, "at", total_tokens, input_tokens, cache_read_input_tokens, cache_creation_input_tokens,
                  cache_reason, cache_detail FROM turns WHERE session_id = ? ORDER BY idx""",
        [sid],
    )
    reasons = list(df.cache_reason)
    details = [json.loads(d) if isinstance(d, str) else {} for d in df.cache_detail]
    if any(r is None for r in reasons):
        row = lab.store.session_row(sid)
        cache = _anthropic(row)
        for i, t in enumerate(load_turns(lab, sid)):
            res = cache.process(t.request, t.at)
            if reasons[i] is None:
                reasons[i], details[i] = res.reason, res.detail
    rows = []
    prev_total: int | None = None
    prev_at = None
    for i, r in enumerate(df.itertuples(index=False)):
        parts = (r.input_tokens, r.cache_read_input_tokens, r.cache_creation_input_tokens)
        measured = None if any(pd.isna(p) for p in parts) else int(sum(parts))
        total = measured if measured is not None else int(r.total_tokens)
        read = None if pd.isna(r.cache_read_input_tokens) else int(r.cache_read_input_tokens)
        gap = None if prev_at is None else (r.at - prev_at).total_seconds()
        if prev_total is not None:
            expected = min(prev_total, total)
            if _is_rebuild(r.idx, read, expected, reasons[i]):
                detail = details[i]
                rows.append({
                    "idx": r.idx, "at": r.at, "gap_seconds": gap, "expected_read": expected, "read": read,
                    "lost_tokens": expected - read, "reason": reasons[i],
                    "cause": _cause(reasons[i], detail, gap),
                    "changed_path": detail.get("divergence_path") if reasons[i] == "prefix_changed" else None,
                    "detail": detail,
                })
        prev_total, prev_at = total, r.at
    return pd.DataFrame(rows, columns=REBUILD_COLUMNS)
