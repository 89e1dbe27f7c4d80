"""pandas views over the store: per-session summaries and strategy comparisons."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - pandas loads with the first frame, not with the package
    import pandas as pd

SUMMARY_COLUMNS = [
    "session", "strategy", "cache", "requests", "total_input", "cache_read", "cache_write", "uncached",
    "ideal_cache_read", "cache_read_pct", "efficiency", "breaks", "cost_usd", "cost_no_cache_usd", "saved_usd",
]


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
    read = int(df.cache_read_input_tokens.sum())
    write = int(df.cache_creation_input_tokens.sum())
    uncached = int(df.input_tokens.sum())
    total = read + write + uncached
    cost = float(df.cost_usd.sum())
    cost_nc = float(df.cost_no_cache_usd.sum()) if "cost_no_cache_usd" in df else float("nan")
    return {
        "requests": len(df), "total_input": total, "cache_read": read, "cache_write": write, "uncached": uncached,
        "cache_read_pct": round(100 * read / total, 1) if total else 0.0,
        "cost_usd": round(cost, 4), "cost_no_cache_usd": round(cost_nc, 4), "saved_usd": round(cost_nc - cost, 4),
    }


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Totals of one session's ``turns()`` frame: :func:`usage_totals` plus ``ideal_cache_read``,
    ``efficiency`` (Σ cache read / Σ ideal) and ``breaks``."""
    totals = usage_totals(df)
    read, ideal = totals["cache_read"], int(df.ideal_cache_read.sum())
    order = ("requests", "total_input", "cache_read", "cache_write", "uncached", "ideal_cache_read",
             "cache_read_pct", "efficiency", "breaks", "cost_usd", "cost_no_cache_usd", "saved_usd")
    extra = {
        "ideal_cache_read": ideal,
        "efficiency": round(read / ideal, 4) if ideal else float("nan"),
        "breaks": int(df.broke.fillna(False).astype(bool).sum()) if "broke" in df else 0,
    }
    return {k: totals[k] if k in totals else extra[k] for k in order}


def compare_df(sessions: Iterable[Any]) -> pd.DataFrame:
    """One row per session: cache read %, efficiency vs ideal, writes, breaks and cost."""
    import pandas as pd

    rows = []
    for s in sessions:
        rows.append({"session": s.id, "strategy": s.strategy, "cache": s.cache, **summarize(s.turns())})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
