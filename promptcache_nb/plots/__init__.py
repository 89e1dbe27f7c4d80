"""Plots are functions ``plot_x(df, *, ax=None) -> Figure``: fixed default sizes, never ``plt.show()``.

They take the frames of :mod:`promptcache_nb.analysis` (``session.turns()``, ``compare_df``) and draw on a
new figure (or on ``ax``). A notebook shows the returned figure as a cell's last expression.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import mpl_figure, mpl_ticker
from .._lazy import pandas as pd
from ..usage import sources_label

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SAVINGS_SIZE = (8.0, 4.0)
COMPARE_SIZE = (9.0, 3.4)

# One colour per usage component, shared with the widgets' segment map (read / write / uncached).
COLORS = {
    "read": "#2e8b57", "write": "#e0a030", "uncached": "#c8553d", "ideal": "#1f3b73", "saved": "#6a3d9a",
}


def _literal(name: str) -> str:
    """A name drawn as itself: two ``$`` in a label would make matplotlib parse the text between them as
    math (and raise on what is not valid TeX, e.g. a strategy named ``$frac{$``)."""
    return name.replace("$", r"\$")


def _ylabel(ax: Axes, what: str, label: str) -> None:
    """The y label says what is counted and what the figures are (simulated / measured / counterfactual) on a
    second line: it survives a caller's ``ax.set_title(name)`` and never covers data or the title."""
    ax.set_ylabel(f"{what}\n{label}")


def _label_of(df: pd.DataFrame, label: str | None) -> str:
    if label is not None:
        return label
    return sources_label(df["usage_source"].dropna().unique() if "usage_source" in df else ())


def _headroom(ax: Axes, top: float, *, room: float = 1.12) -> None:
    """Token axes start at 0 and end above the tallest bar: never a bar cut at the frame. On an axis shared
    with charts drawn before (``plt.subplots(sharey=True)``) the limit only grows, so none of them is cut."""
    want = top * room if top > 0 else 1.0
    if len(ax.get_shared_y_axes().get_siblings(ax)) > 1:
        want = max(want, ax.get_ylim()[1])
    ax.set_ylim(0, want)


def _thousands(ax: Axes) -> None:
    """Whole numbers with separators on the y axis: never matplotlib's "1e6" offset above it."""
    ax.yaxis.set_major_formatter(mpl_ticker.FuncFormatter(lambda v, _pos: f"{v:,.0f}"))


def _dollars(ax: Axes) -> None:
    """Plain dollars on the y axis (no offset, no scientific notation): "0.08", not "8e-2" or "+1e-3"."""
    fmt = mpl_ticker.ScalarFormatter(useOffset=False)
    fmt.set_scientific(False)
    ax.yaxis.set_major_formatter(fmt)


def _figure(ax: Axes | None, size: tuple[float, float]) -> tuple[Figure, Axes]:
    # Figure() rather than plt.figure(): no pyplot state, so library calls never pop up or leak figures.
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    fig = mpl_figure.Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def plot_savings(df: pd.DataFrame, *, ax: Axes | None = None, highlight: int | None = None,
                 saved_ylim: tuple[float, float] | None = None, label: str | None = None) -> Figure:
    """Per-request stacked bars (cache read, cache write, uncached), the ideal read, and $ saved.

    Args:
        df: a session's ``turns()`` frame (columns ``idx``, ``cache_read_input_tokens``,
            ``cache_creation_input_tokens``, ``input_tokens``, ``ideal_cache_read``, ``cost_usd``,
            ``cost_no_cache_usd``).
        ax: draw on this axes instead of a new 8×4 in figure.
        highlight: mark this request (its ``idx``): the one a Stepper's slider shows.
        saved_ylim: the right ($ saved) axis's limits; give two charts that are compared the same
            (:func:`saved_limits`), so equal heights mean equal dollars.
        label: what the figures are, on the y label's second line; default from the frame's ``usage_source``
            (``simulated (estimated tokens)``, ``measured``); a counterfactual passes its own.

    The right axis is the cumulative dollars saved against sending the same requests with no caching
    (``cost_no_cache_usd − cost_usd``); it goes down on requests whose cache writes cost more than they save.

    Example:
        >>> fig = plot_savings(session.turns())  # doctest: +SKIP
    """
    fig, ax = _figure(ax, SAVINGS_SIZE)
    x = df["idx"].to_numpy() if "idx" in df else range(len(df))
    read = df["cache_read_input_tokens"].fillna(0).to_numpy(dtype=float)
    write = df["cache_creation_input_tokens"].fillna(0).to_numpy(dtype=float)
    uncached = df["input_tokens"].fillna(0).to_numpy(dtype=float)
    ax.bar(x, read, color=COLORS["read"], label="cache read")
    ax.bar(x, write, bottom=read, color=COLORS["write"], label="cache write")
    ax.bar(x, uncached, bottom=read + write, color=COLORS["uncached"], label="uncached")
    totals = read + write + uncached
    ideal = (df["ideal_cache_read"].fillna(0).to_numpy(dtype=float) if "ideal_cache_read" in df and len(df)
             else read[:0])
    if highlight is not None and len(df) and highlight in set(x):
        # an outline around the bar and a band behind it, labelled above the tallest bar (room made below)
        i = list(x).index(highlight)
        ax.axvspan(highlight - 0.5, highlight + 0.5, color=COLORS["ideal"], alpha=0.10, zorder=0, linewidth=0)
        ax.bar([highlight], [max(totals[i], 1.0)], fill=False, edgecolor=COLORS["ideal"], linewidth=1.8, zorder=3)
        top = float(max(totals.max(), ideal.max(initial=0.0)))
        ax.annotate(f"request {highlight}", (highlight, top * 1.02), ha="center", va="bottom",
                    fontsize="x-small", color=COLORS["ideal"])
    if len(ideal):
        ax.step(x, ideal, where="mid", color=COLORS["ideal"], linestyle="--", linewidth=1.5,
                label="ideal cache read")
    _headroom(ax, float(max(totals.max(initial=0.0), ideal.max(initial=0.0))))
    _thousands(ax)
    ax.set_xlabel("request")
    _ylabel(ax, "input tokens", _label_of(df, label))
    ax.margins(x=0.02)
    if len(df):
        ax.set_xticks(list(x) if len(df) <= 30 else list(x)[:: max(1, len(df) // 15)])
    handles, labels = ax.get_legend_handles_labels()
    if {"cost_usd", "cost_no_cache_usd"} <= set(df.columns) and len(df):
        saved = (df["cost_no_cache_usd"].astype(float) - df["cost_usd"].astype(float)).fillna(0).cumsum()
        ax2 = ax.twinx()
        (line,) = ax2.plot(x, saved.to_numpy(), color=COLORS["saved"], marker="o", markersize=3,
                           label="cumulative $ saved vs no cache")
        # the right axis's zero, drawn in the $ line's colour and labelled, so it never reads as a token level
        ax2.axhline(0, color=COLORS["saved"], linewidth=0.8, linestyle=":", alpha=0.7)
        ax2.annotate("$0", (1.0, 0.0), xycoords=("axes fraction", "data"), xytext=(-3, 2),
                     textcoords="offset points", ha="right", va="bottom", fontsize="x-small",
                     color=COLORS["saved"])
        ax2.set_ylim(*(saved_ylim if saved_ylim is not None else saved_limits(df)))
        _dollars(ax2)
        ax2.set_ylabel("$ saved (cumulative)", color=COLORS["saved"])
        ax2.tick_params(axis="y", colors=COLORS["saved"])
        handles.append(line)
        labels.append(line.get_label())
    # Below the axes: inside, it would cover the first bars (usually the tallest writes).
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3, fontsize="small",
              frameon=False)
    ax.set_title("where each request's input tokens came from")
    return fig


def saved_limits(*frames: pd.DataFrame) -> tuple[float, float]:
    """One ($ saved) axis range covering every frame's cumulative savings: ``plot_savings(df, saved_ylim=...)``
    for charts shown side by side."""
    lo, hi = 0.0, 0.0
    for df in frames:
        if {"cost_usd", "cost_no_cache_usd"} <= set(df.columns) and len(df):
            saved = (df["cost_no_cache_usd"].astype(float) - df["cost_usd"].astype(float)).fillna(0).cumsum()
            lo, hi = min(lo, float(saved.min())), max(hi, float(saved.max()))
    pad = 0.05 * (hi - lo) or 0.01
    return lo - pad, hi + pad


def plot_compare(summary: pd.DataFrame, *, ax: Axes | None = None,
                 label: str = "simulated (estimated tokens)") -> Figure:
    """One group of bars per strategy: total cache read, write and uncached tokens, efficiency on top.

    Args:
        summary: :func:`promptcache_nb.compare_df` output (columns ``strategy``, ``cache_read``,
            ``cache_write``, ``uncached``, ``efficiency``, ``cost_usd``).
        ax: draw on this axes instead of a new 9×3.4 in figure.
        label: what the figures are (the y label's second line); a comparison replays through the simulator.
    """
    fig, ax = _figure(ax, COMPARE_SIZE)
    names = [_literal(n) for n in summary["strategy"].astype(str)]
    x = list(range(len(names)))
    read = summary["cache_read"].to_numpy(dtype=float)
    write = summary["cache_write"].to_numpy(dtype=float)
    uncached = summary["uncached"].to_numpy(dtype=float)
    ax.bar(x, read, color=COLORS["read"], label="cache read")
    ax.bar(x, write, bottom=read, color=COLORS["write"], label="cache write")
    ax.bar(x, uncached, bottom=read + write, color=COLORS["uncached"], label="uncached")
    for i, (eff, cost) in enumerate(zip(summary["efficiency"], summary["cost_usd"], strict=True)):
        eff_txt = "n/a" if pd.isna(eff) else f"{float(eff):.2f}"  # a ratio 0–1, as in every table
        ax.annotate(f"{eff_txt}\n${float(cost):.3f}", (i, read[i] + write[i] + uncached[i]), ha="center",
                    va="bottom", fontsize="x-small", xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, names, rotation=20, ha="right", fontsize="small")
    _ylabel(ax, "input tokens (sum)", label)
    _thousands(ax)
    ax.set_title("input tokens per strategy (label: efficiency 0–1 vs ideal, cost)")
    _headroom(ax, float((read + write + uncached).max()) if len(names) else 0.0, room=1.3)  # room for the labels
    # outside the axes, to the right: inside, it covered the first bar's label
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    return fig


def plot_cumulative_cost(frames: dict[str, pd.DataFrame], *, ax: Axes | None = None,
                         label: str | None = None) -> Figure:
    """Cumulative cost per strategy over requests (one shared $ axis), labelled with what the figures are
    (``label``; default from the frames' ``usage_source``)."""
    fig, ax = _figure(ax, SAVINGS_SIZE)
    for name, df in frames.items():
        ax.plot(df["idx"], df["cost_usd"].cumsum(), label=_literal(str(name)))
    ax.set_xlabel("request")
    _ylabel(ax, "cumulative cost (USD)",
            _label_of(pd.concat(list(frames.values())) if frames else pd.DataFrame(), label))
    _dollars(ax)
    ax.set_ylim(bottom=0)
    ax.set_title("cumulative cost per strategy")
    # outside the axes, to the right: inside, it covers the curves' ends
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    return fig


def plot_cache_compare(read_pct: pd.DataFrame, *, ax: Axes | None = None,
                       label: str = "simulated (estimated tokens)", colors: Sequence[str] | None = None) -> Figure:
    """Grouped bars: one group per cache model, one bar per layout (a row of ``read_pct``), the cache read as a
    percentage of input tokens.

    Args:
        read_pct: rows = layouts (strategies), columns = cache models, values = cache read % (0–100): e.g.
            ``pd.concat({name: pc.compare_caches(s).set_index("cache") ...})["cache_read_pct"].unstack("cache")``.
        ax: draw on this axes instead of a new 8×3.4 in figure.
        label: what the figures are (the y label's second line).
        colors: one per layout.
    """
    fig, ax = _figure(ax, COMPARE_SIZE)
    caches = [_literal(str(c)) for c in read_pct.columns]
    n = max(len(read_pct.index), 1)
    width = 0.8 / n
    palette = list(colors) if colors is not None else [COLORS["uncached"], COLORS["read"], COLORS["ideal"],
                                                       COLORS["write"], COLORS["saved"]]
    for k, (layout, row) in enumerate(read_pct.iterrows()):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(caches))]
        ax.bar(xs, row.to_numpy(dtype=float), width=width, label=_literal(str(layout)),
               color=palette[k % len(palette)])
    ax.set_xticks(list(range(len(caches))), caches)
    _ylabel(ax, "cache read, % of input", label)
    top = float(read_pct.to_numpy(dtype=float).max()) if read_pct.size else 0.0
    _headroom(ax, min(top, 100.0) or 100.0)
    # outside the axes, to the right: inside, it covered a bar
    ax.legend(title="layout", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    return fig


__all__ = ["COLORS", "plot_cache_compare", "plot_compare", "plot_cumulative_cost", "plot_savings", "saved_limits"]
