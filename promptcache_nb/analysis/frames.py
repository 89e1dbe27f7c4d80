"""pandas views over the store: per-session summaries and strategy comparisons."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

SUMMARY_COLUMNS = [
    "session", "strategy", "cache", "requests", "total_input", "cache_read", "cache_write", "uncached",
    "ideal_cache_read", "cache_read_pct", "efficiency", "breaks", "cost_usd", "cost_no_cache_usd", "saved_usd",
]


def efficiency(df: pd.DataFrame) -> float:
    """Σ cache_read / Σ ideal_cache_read — one line of pandas, kept here to name it."""
    ideal = df.ideal_cache_read.sum()
    return float(df.cache_read_input_tokens.sum() / ideal) if ideal else float("nan")


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Totals of one session's ``turns()`` frame."""
    read = int(df.cache_read_input_tokens.sum())
    write = int(df.cache_creation_input_tokens.sum())
    uncached = int(df.input_tokens.sum())
    total = read + write + uncached
    ideal = int(df.ideal_cache_read.sum())
    cost = float(df.cost_usd.sum())
    cost_nc = float(df.cost_no_cache_usd.sum())
    return {
        "requests": len(df), "total_input": total, "cache_read": read, "cache_write": write,
        "uncached": uncached, "ideal_cache_read": ideal,
        "cache_read_pct": round(100 * read / total, 1) if total else 0.0,
        "efficiency": round(read / ideal, 4) if ideal else float("nan"),
        "breaks": int(df.broke.fillna(False).astype(bool).sum()) if "broke" in df else 0,
        "cost_usd": round(cost, 4), "cost_no_cache_usd": round(cost_nc, 4), "saved_usd": round(cost_nc - cost, 4),
    }


def compare_df(sessions: Iterable[Any]) -> pd.DataFrame:
    """One row per session: cache read %, efficiency vs ideal, writes, breaks and cost."""
    rows = []
    for s in sessions:
        rows.append({"session": s.id, "strategy": s.strategy, "cache": s.cache, **summarize(s.turns())})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
