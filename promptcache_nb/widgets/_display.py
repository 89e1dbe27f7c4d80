"""What a notebook shows besides widgets: Markdown whose money stays money, and tables a projector can read.

:func:`markdown` is the one way a notebook renders computed prose (``pc.widgets.markdown(f"saves ${x:.2f}")``):
its dollar signs go through :func:`promptcache_nb._util.escape_dollars`, so two amounts in one sentence never
become a formula. :func:`table` shows a DataFrame with readable headers, units (``$``, ``%``, tokens with
thousands separators) and a width that fits a notebook beside JupyterLab's file browser (846 px at 1280×720).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._util import escape_dollars
from ..request.diff import visible

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from IPython.display import Markdown

#: A notebook's width in JupyterLab at 1280×720 with the file browser open (measured in Chromium).
NOTEBOOK_WIDTH_PX = 846

# header words that read better as their unit or in full
_WORDS = {"usd": "$", "pct": "%", "idx": "request", "n": "number of", "tok": "tokens"}
_INTEGER_KINDS = "iu"


def markdown(text: str) -> Markdown:
    """``text`` as Markdown output, every ``$`` shown as a dollar sign (never as math, in any front end).

    Example:
        >>> pc.widgets.markdown(f"saves ${0.19:.2f} of ${0.30:.2f}")  # doctest: +SKIP
    """
    from IPython.display import Markdown  # IPython: present in a kernel, needed only there

    return Markdown(escape_dollars(text, markdown=True))  # type: ignore[no-untyped-call]  # IPython is untyped


def header(column: str) -> str:
    """A readable header: ``cost_usd`` → ``cost $``, ``cache_read_pct`` → ``cache read %``."""
    return " ".join(_WORDS.get(w, w) for w in str(column).split("_") if w)


def _unit(column: str, values: pd.Series, fractions: set[str]) -> str:
    words = str(column).lower().split("_")
    if column in fractions:
        return "fraction"
    if {"usd", "cost"} & set(words) and values.dtype.kind in "fiu":
        return "usd"
    if "pct" in words or "percent" in words:
        return "pct"
    if values.dtype.kind in _INTEGER_KINDS:
        return "int"
    if values.dtype.kind == "f":
        return "float"
    return "text"


def _cell(value: Any, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if hasattr(value, "strftime"):  # to the second (UTC, as stored); a day stored as midnight reads as the day
        midnight = not any(getattr(value, f, 0) for f in ("hour", "minute", "second", "microsecond"))
        return str(value.strftime("%Y-%m-%d" if midnight else "%Y-%m-%d %H:%M:%S"))
    try:
        if unit == "usd":
            return f"${float(value):,.4f}"
        if unit == "pct":
            return f"{float(value):.1f} %"
        if unit == "fraction":
            return f"{100 * float(value):.1f} %"
        if unit == "int":
            return f"{int(value):,}"
        if unit == "float":
            x = float(value)
            return f"{x:,.0f}" if x.is_integer() else f"{x:,.3g}" if abs(x) < 1 else f"{x:,.1f}"
    except (TypeError, ValueError):
        pass
    return visible(str(value))


@dataclass(frozen=True)
class Table:
    """A formatted DataFrame: ``text/html`` that fits the notebook, ``text/plain`` with the same cells."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]
    caption: str = ""

    def _repr_html_(self) -> str:
        th = "".join(f'<th style="text-align:{"right" if n else "left"};padding:2px 8px;white-space:normal;'
                     f'overflow-wrap:normal;word-break:keep-all">{html.escape(h)}</th>'
                     for h, n in zip(self.headers, self.numeric, strict=True))
        number = "text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums"
        text = "text-align:left;overflow-wrap:anywhere"
        body = "".join(
            "<tr>" + "".join(f'<td style="padding:2px 8px;{number if n else text}">{html.escape(v)}</td>'
                             for v, n in zip(row, self.numeric, strict=True)) + "</tr>"
            for row in self.rows)
        caption = (f'<caption style="caption-side:top;text-align:left;font-size:12px;color:#555">'
                   f"{html.escape(self.caption)}</caption>") if self.caption else ""
        return escape_dollars(
            f'<div class="pcnb-table" style="max-width:{NOTEBOOK_WIDTH_PX}px">'
            f'<table style="border-collapse:collapse;font-size:12.5px">{caption}<thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")

    def __repr__(self) -> str:
        widths = [max([len(h), *(len(r[i]) for r in self.rows)]) for i, h in enumerate(self.headers)]

        def line(cells: Iterable[str]) -> str:
            return "  ".join(c.rjust(w) if n else c.ljust(w)
                             for c, w, n in zip(cells, widths, self.numeric, strict=True)).rstrip()

        lines = [self.caption] if self.caption else []
        return "\n".join([*lines, line(self.headers), *(line(r) for r in self.rows)])


def table(df: pd.DataFrame, *, fractions: Iterable[str] = (), labels: Mapping[str, str] | None = None,
          caption: str = "", max_rows: int = 30) -> Table:
    """``df`` for a notebook: readable headers, units, thousands separators, a width that fits 846 px.

    A column is shown in dollars when its name has ``usd`` or ``cost`` in it, as a percentage when it has
    ``pct`` (already 0–100) or is named in ``fractions`` (0–1, shown ×100), and integers with thousands
    separators. ``labels`` renames headers; rows past ``max_rows`` are cut with a last line saying how many.

    Example:
        >>> pc.widgets.table(pc.compare_df([s]), fractions=["agreement"])  # doctest: +SKIP
    """
    fraction_set = set(fractions)
    units = [_unit(str(c), df[c], fraction_set) for c in df.columns]
    shown = df.head(max_rows)
    rows = [tuple(_cell(v, u) for v, u in zip(row, units, strict=True))
            for row in shown.itertuples(index=False, name=None)]
    if len(df) > max_rows:
        rows.append(tuple([f"… {len(df) - max_rows:,} more rows", *[""] * (len(units) - 1)]))
    names = tuple((labels or {}).get(str(c), header(str(c))) for c in df.columns)
    return Table(names, tuple(rows), tuple(u != "text" for u in units), caption)
