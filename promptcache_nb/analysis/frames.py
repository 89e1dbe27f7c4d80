"""pandas views over the store: per-session summaries and strategy comparisons."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._lazy import pandas as pd
from .._util import escape_dollars
from ..request.diff import visible

SUMMARY_COLUMNS = [
    "session", "strategy", "cache", "requests", "total_input", "cache_read", "cache_write", "uncached",
    "ideal_cache_read", "cache_read_pct", "efficiency", "breaks", "rebuilds", "cost_usd", "cost_no_cache_usd",
    "saved_usd",
]

#: What ``breaks`` and ``rebuilds`` count, in one sentence (the summaries' docstrings and docs/providers.md say it).
BREAKS_VS_REBUILDS = (
    "breaks counts OpenClaw breaks — the cache read fell at least 5 % and 1,000 tokens below the previous "
    "read, or to 0 with nothing changed — while rebuilds counts the requests that had to send again more than "
    "256 tokens of what the previous request held (pc.rebuilds), so a cache lost after an earlier partial read, "
    "or a small loss, is a rebuild without being a break, and a read that fell because the prompt got shorter "
    "is a break without being a rebuild."
)


def efficiency(df: pd.DataFrame) -> float:
    """Σ cache_read / Σ ideal_cache_read — one line of pandas, kept here to name it."""
    ideal = df.ideal_cache_read.sum()
    return float(df.cache_read_input_tokens.sum() / ideal) if ideal else float("nan")


#: Old column names that still work, as aliases of the current ones (``compare_caches`` said ``read_pct``).
SUMMARY_ALIASES = {"read_pct": "cache_read_pct"}


def usage_totals(df: pd.DataFrame) -> dict[str, Any]:
    """The token and cost totals of any per-request frame with the usage columns (``Session.turns()``,
    :func:`~promptcache_nb.resimulate`, :func:`~promptcache_nb.ttl_whatif` per TTL...): ``requests,
    total_input, cache_read, cache_write, uncached, cache_read_pct, cost_usd, cost_no_cache_usd, saved_usd``
    — the one vocabulary every summary uses."""
    sums = {
        "requests": len(df), "cache_read": int(df.cache_read_input_tokens.sum()),
        "cache_write": int(df.cache_creation_input_tokens.sum()), "uncached": int(df.input_tokens.sum()),
        "cost_usd": _priced_sum(df.cost_usd),
        "cost_no_cache_usd": _priced_sum(df.cost_no_cache_usd) if "cost_no_cache_usd" in df else float("nan"),
    }
    totals = derived_totals(sums)
    del totals["efficiency"]
    return totals


def derived_totals(sums: dict[str, Any]) -> dict[str, Any]:
    """From summed figures (``requests, cache_read, cache_write, uncached, cost_usd, cost_no_cache_usd``, and
    ``ideal_cache_read`` when known) the summaries' totals: ``requests, total_input, cache_read, cache_write,
    uncached, cache_read_pct, efficiency, cost_usd, cost_no_cache_usd, saved_usd`` — computed here for every
    summary (a frame's, :func:`~promptcache_nb.analysis.rollups.session_summary`'s SQL sums)."""
    read, write, uncached = int(sums["cache_read"]), int(sums["cache_write"]), int(sums["uncached"])
    total = read + write + uncached
    ideal = sums.get("ideal_cache_read")
    cost, cost_nc = _float(sums["cost_usd"]), _float(sums["cost_no_cache_usd"])
    return {
        "requests": int(sums["requests"]), "total_input": total, "cache_read": read, "cache_write": write,
        "uncached": uncached, "cache_read_pct": round(100 * read / total, 1) if total else 0.0,
        "efficiency": round(read / int(ideal), 4) if ideal else float("nan"),
        "cost_usd": round(cost, 4), "cost_no_cache_usd": round(cost_nc, 4), "saved_usd": round(cost_nc - cost, 4),
    }


def _float(value: Any) -> float:
    """A summed cost: SQL's NULL (nothing priced) is NaN — unknown, never $0."""
    return float("nan") if value is None else float(value)


def _priced_sum(costs: pd.Series) -> float:
    """Σ of a cost column over its priced rows; NaN when no row is priced (pandas would say 0)."""
    return float(costs.sum(min_count=1))


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Totals of one session's ``turns()`` frame: :func:`usage_totals` plus ``ideal_cache_read``,
    ``efficiency`` (Σ cache read / Σ ideal), ``breaks`` (OpenClaw breaks) and ``rebuilds`` (requests that sent
    again more than 256 tokens of what the previous one held). The two differ: :data:`BREAKS_VS_REBUILDS`."""
    sums = {
        "requests": len(df), "cache_read": int(df.cache_read_input_tokens.sum()),
        "cache_write": int(df.cache_creation_input_tokens.sum()), "uncached": int(df.input_tokens.sum()),
        "ideal_cache_read": int(df.ideal_cache_read.sum()), "cost_usd": _priced_sum(df.cost_usd),
        "cost_no_cache_usd": _priced_sum(df.cost_no_cache_usd) if "cost_no_cache_usd" in df else float("nan"),
    }
    totals = derived_totals(sums)
    order = ("requests", "total_input", "cache_read", "cache_write", "uncached", "ideal_cache_read",
             "cache_read_pct", "efficiency", "breaks", "rebuilds", "cost_usd", "cost_no_cache_usd", "saved_usd")
    extra = {
        "ideal_cache_read": sums["ideal_cache_read"],
        "breaks": count_rebuilds(df),  # one verdict: a break is a rebuild
        "rebuilds": count_rebuilds(df),
    }
    return {k: totals[k] if k in totals else extra[k] for k in order}


def count_rebuilds(df: pd.DataFrame) -> int:
    """The rows of a ``turns()`` frame that :func:`~promptcache_nb.rebuilds` lists (at its default noise floor):
    those that broke the cache, the one verdict (``broke``: the rebuild rule, stored with each request)."""
    return int(df.broke.fillna(False).astype(bool).sum()) if "broke" in df else 0


def compare_df(sessions: Iterable[Any]) -> pd.DataFrame:
    """One row per session: cache read %, efficiency vs ideal, writes, breaks and cost."""
    rows = []
    for s in sessions:
        rows.append({"session": s.id, "strategy": s.strategy, "cache": s.cache, **summarize(s.turns())})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def html_table(df: pd.DataFrame) -> str:
    """``df`` as an HTML table for a notebook: cells are data, so escaped, with invisible characters (and lone
    surrogates) shown as markers (:func:`~promptcache_nb.request.diff.visible`)."""
    shown = df.map(lambda v: visible(v) if isinstance(v, str) else v)
    # long text wraps between words (inside one only when it must): the table fits the notebook's width
    style = ("<style>.pcnb-frame td, .pcnb-frame th {white-space: normal; overflow-wrap: anywhere; "
             "max-width: 28em}</style>")
    return escape_dollars(f'<div class="pcnb-frame">{style}{shown.to_html(index=False, escape=True)}</div>')
