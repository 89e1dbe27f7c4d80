"""A self-contained HTML report of a strategy comparison (tables + charts inlined, no network)."""

from __future__ import annotations

import base64
import html
import io
import warnings
from pathlib import Path
from typing import Any

from ._lazy import pandas as pd
from ._util import escape_dollars
from .plots import plot_compare, plot_cumulative_cost
from .request.diff import visible


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    with warnings.catch_warnings():  # a name in a script the font lacks is drawn as boxes, not an error
        warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
        fig.savefig(buf, format="png", dpi=110)
    return base64.b64encode(buf.getvalue()).decode()


REPORT_COLUMNS = {
    "strategy": "strategy", "cache": "cache model", "requests": "requests", "cache_read_pct": "cache read %",
    "efficiency": "efficiency vs ideal", "cache_read": "cache read", "cache_write": "cache write",
    "uncached": "uncached", "breaks": "breaks", "cost_usd": "cost $", "cost_no_cache_usd": "no-cache $",
    "saved_usd": "saved $",
}


def _format(summary: pd.DataFrame) -> pd.DataFrame:
    """Readable strings: thousands separators, fixed decimals, friendly headers."""
    out = pd.DataFrame()
    for col, label in REPORT_COLUMNS.items():
        if col not in summary:
            continue
        values = summary[col]
        if col in ("cache_read", "cache_write", "uncached", "requests", "breaks"):
            out[label] = [f"{int(v):,}" for v in values]
        elif col == "efficiency":
            out[label] = [f"{float(v):.3f}" for v in values]
        elif col == "cache_read_pct":
            out[label] = [f"{float(v):.1f}" for v in values]
        elif col.endswith("_usd"):
            out[label] = [_usd(v) for v in values]
        else:
            out[label] = [visible(str(v)) for v in values]  # names are data: no bidi, no lone surrogate
    return out


def _usd(value: Any) -> str:
    """Dollars with four decimals: a small scenario's costs are fractions of a cent, never "0.01"."""
    if value is None or pd.isna(value):
        return "–"
    return f"{float(value):,.4f}"


def write_report(path: str | Path, summary: pd.DataFrame, frames: dict[str, pd.DataFrame], *,
                 title: str, notes: list[str] | None = None) -> Path:
    """Write an HTML page with the summary table and two charts; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # every name and note is shown as data: escaped, invisible characters as markers (``⟨RLO⟩``)
    if "strategy" in summary:
        summary = summary.assign(strategy=[visible(str(v)) for v in summary["strategy"]])
    frames = {visible(str(name)): df for name, df in frames.items()}
    title = visible(title)
    # money as money wherever the page is shown beside math (a notebook's output, a docs site with MathJax)
    table = escape_dollars(_format(summary).to_html(index=False, escape=True))
    notes_html = escape_dollars("".join(f"<li>{html.escape(visible(n))}</li>" for n in (notes or [])))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}
th{{background:#f3f3f3}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Token figures are <b>simulated</b>: a cache model applied to <b>estimated</b> token counts
(offline tokenizer). Costs from genai-prices.</p>
<ul>{notes_html}</ul>
{table}
<h2>Where the input tokens went</h2>
<img alt="tokens per strategy" src="data:image/png;base64,{_png(plot_compare(summary))}">
<h2>Cumulative cost</h2>
<img alt="cumulative cost" src="data:image/png;base64,{_png(plot_cumulative_cost(frames))}">
</body></html>"""
    path.write_text(page, encoding="utf-8")
    return path
