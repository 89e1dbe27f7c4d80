"""The What-if controller: tick fixes, see the counterfactual beside the measured original (no kernel needed).

A thin layer over :mod:`promptcache_nb.advice`: the counterfactual of the ticked fixes is planned and simulated
exactly as :func:`~promptcache_nb.counterfactual` and :func:`~promptcache_nb.advise` do (one ``Original`` read of
the session), so the figures here are theirs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._lazy import pandas as pd
from ..advice import COUNTERFACTUAL, advise
from ..advice._advice import _confidence, saved_text
from ..advice._anchor import MEASURED
from ..advice._counterfactual import Original
from ..advice._fixes import FIX_NAMES, FIX_SOURCES, check_fixes
from ..analysis.frames import html_table
from . import _html
from ._controllers import _Observable, live_session

if TYPE_CHECKING:  # pragma: no cover
    from ..session import Session

WHATIF_COLUMNS = ["idx", "sent_at", "measured_cost_usd", "simulated_cost_usd", "counterfactual_cost_usd",
                  "measured_read_pct", "simulated_read_pct", "counterfactual_read_pct", "pings_before", "broke",
                  "cache_reason", "provider_cache_miss_reason"]


def _read_pct(read: Any, total: Any) -> float | None:

    if read is None or total is None or pd.isna(read) or pd.isna(total) or not total:
        return None
    return round(100 * float(read) / float(total), 1)


class WhatIfController(_Observable):
    """What the ticked fixes would have changed on ``session``'s own requests.

    Attributes:
        available: the fixes this session's data supports; not_possible: fix -> why not.
        fixes: the fixes applied now (a subset of ``available``).
    """

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = live_session(session)
        self.original = Original.load(self.session)
        self.not_possible: dict[str, str] = dict(self.original.plan(FIX_NAMES).not_possible)
        self.available: tuple[str, ...] = tuple(f for f in FIX_NAMES if f not in self.not_possible)
        self._baseline = self.original.simulate(self.original.plan(()))
        self._findings: pd.DataFrame | None = None
        self.fixes: tuple[str, ...] = ()
        self.apply_fixes(())

    def apply_fixes(self, fixes: Iterable[str]) -> None:
        """Show the counterfactual of ``fixes`` (an empty set: the original replayed)."""
        names = check_fixes(list(fixes))
        missing = [f for f in names if f in self.not_possible]
        if missing:
            raise ValueError(f"{missing[0]} is not possible on {self.session.id}: {self.not_possible[missing[0]]}")
        self.plan = self.original.plan(names)
        self._prepared = self.original.prepared(self.plan)
        self._cf = self.original.simulate(self.plan, self._prepared)
        self._anchored = self.original.anchored(self.plan, self._cf)
        self.fixes = tuple(self.plan.applied)
        t = self.totals()
        rep = self._anchored
        basis = "measured" if t["measured_cost_usd"] is not None else "simulated"
        self.status = (f"{', '.join(self.fixes) or 'no fix'}: ${t['counterfactual_cost_usd']:.4f} vs "
                       f"${rep.base_cost:.4f} {basis}; saves {saved_text(rep.saved, rep.low, rep.high)} "
                       f"({COUNTERFACTUAL}, anchored on measured usage)")
        self._notify("fixes")

    def toggle(self, fix: str, on: bool) -> None:
        """Tick (``on``) or untick one fix."""
        chosen = set(self.fixes) | {fix} if on else set(self.fixes) - {fix}
        self.apply_fixes(chosen)

    def frame(self) -> pd.DataFrame:
        """One row per original request: measured, simulated-original and counterfactual cost and read %
        (``pings_before``: keep-warm pings sent in the gap before it; their cost is in its counterfactual), and the
        original's verdict: ``broke``, our ``cache_reason`` and, where the provider was asked, its own
        ``provider_cache_miss_reason`` beside it."""

        anchored = self._anchored.requests
        ping_cost: dict[int, float] = {}
        ping_count: dict[int, int] = {}
        origins = [t.idx for t in self.original.turns]
        for a in anchored:
            if a.ping:
                after = origins[origins.index(a.origin) + 1]  # a ping stands after request idx, before the next
                ping_cost[after] = ping_cost.get(after, 0.0) + float(a.cost or 0.0)
                ping_count[after] = ping_count.get(after, 0) + 1
        real = [a for a in anchored if not a.ping]
        rows = []
        for t, b, c in zip(self.original.turns, self._baseline.itertuples(index=False), real, strict=True):
            st = t.stored
            measured = st.get("usage_source") in MEASURED
            total = None if not measured else sum(
                int(st[k]) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
            rows.append((t.idx, t.at, st.get("cost_usd") if measured else None, b.cost_usd,
                         (c.cost or 0.0) + ping_cost.get(t.idx, 0.0),
                         _read_pct(st.get("cache_read_input_tokens"), total) if measured else None,
                         _read_pct(b.cache_read_input_tokens, b.total_tokens),
                         _read_pct(c.usage.cache_read_input_tokens, c.usage.total_input_tokens),
                         ping_count.get(t.idx, 0), st.get("broke"), st.get("cache_reason"),
                         st.get("provider_cache_miss_reason")))
        return pd.DataFrame(rows, columns=WHATIF_COLUMNS)

    def totals(self) -> dict[str, float | None]:
        df = self.frame()
        measured = df.measured_cost_usd.dropna()
        return {"measured_cost_usd": float(measured.sum()) if len(measured) else None,
                "simulated_cost_usd": float(df.simulated_cost_usd.sum()),
                "counterfactual_cost_usd": float(df.counterfactual_cost_usd.sum())}

    def first_changed(self) -> int | None:
        """The first original request whose body the applied fixes changed (None: none)."""
        changed = [i for a in self.plan.applied.values() for i in a.changed]
        return min(changed) if changed else None

    def diff_html(self) -> str:
        """The first changed request, original against counterfactual, side by side (escaped)."""
        k = self.first_changed()
        if k is None:
            return '<div class="pcnb-whatif-diff" style="color:#555">no request body changed</div>'
        original = next(t.request for t in self.original.turns if t.idx == k)
        counterfactual = next(req for r, req in self._prepared if r.origin == k and not r.ping)
        head = f"<div><b>request {k}</b>: original (left) against counterfactual (right)</div>"
        return f'<div class="pcnb-whatif-diff">{head}{_html.side_by_side_html(original, counterfactual)}</div>'

    def findings(self) -> pd.DataFrame:
        """``pc.advise(session).findings`` (computed once, on first use)."""
        if self._findings is None:
            self._findings = advise(self.session).findings
        return self._findings

    def header_html(self) -> str:
        t = self.totals()
        measured = t["measured_cost_usd"]
        _, fidelity = _confidence(self.original.fits())
        parts = [f"measured ${measured:.4f}" if measured is not None else "no measured usage",
                 f"simulated original ${t['simulated_cost_usd']:.4f} ({fidelity})",
                 f"<b>{_html.esc(COUNTERFACTUAL)} ${t['counterfactual_cost_usd']:.4f}</b>"]
        fixes = ", ".join(f"{f} ({FIX_SOURCES[f]})" for f in self.fixes) or "no fix ticked"
        return (f'<div class="pcnb-whatif-head"><div>{_html.esc(self.session.id)} · {len(self.original.turns)} '
                f"requests · {' · '.join(parts)}</div><div style='color:#555'>{_html.esc(fixes)}</div></div>")

    def table_html(self, limit: int = 200) -> str:
        return html_table(self.frame().head(limit))

    def findings_html(self) -> str:
        df = self.findings()[["fix", "verdict", "saved", "pct_of_cost", "tokens_saved", "why", "evidence", "how",
                              "confidence"]]
        return html_table(df)

    def __repr__(self) -> str:
        return (f"WhatIfController(session={self.session.id!r}, fixes={list(self.fixes)}, "
                f"available={list(self.available)})")
