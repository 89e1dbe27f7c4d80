"""Comparison charts across strategies (used by the CLI report and the Compare widget)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from matplotlib.figure import Figure


def plot_compare(summary: pd.DataFrame, *, ax: Any = None) -> Figure:
    """Horizontal bars per strategy: cache read, write and uncached input tokens (estimated)."""
    if ax is None:
        fig = Figure(figsize=(8, 0.5 * max(len(summary), 2) + 1.2))
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    labels = list(summary["strategy"])
    left = [0] * len(labels)
    for col, color, name in (("cache_read", "#2e7d32", "cache read"), ("cache_write", "#f9a825", "cache write"),
                             ("uncached", "#c62828", "uncached")):
        vals = [int(v) for v in summary[col]]
        ax.barh(labels, vals, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("input tokens over the whole scenario (simulated, estimated tokens)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def plot_cumulative_cost(frames: dict[str, pd.DataFrame], *, ax: Any = None) -> Figure:
    """Cumulative cost per strategy over requests."""
    if ax is None:
        fig = Figure(figsize=(8, 4))
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    for name, df in frames.items():
        ax.plot(df["idx"], df["cost_usd"].cumsum(), label=name)
    ax.set_xlabel("request")
    ax.set_ylabel("cumulative cost (USD)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
