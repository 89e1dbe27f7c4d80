"""Ranked advice: every applicable fix run alone and all together over a session's own requests.

Savings are the simulated original (the original bodies replayed through the cache model: the *baseline*)
minus the simulated counterfactual — like for like — and shown beside the measured original. ``confidence`` is
how far that baseline lands from the measured usage: the error bar every saving carries.
"""

from __future__ import annotations

import html
import math
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._util import progress_bar
from ..analysis.frames import html_table
from ..request.diff import visible
from ..session import Session
from . import _fixes
from ._compaction import COMPACTION_COLUMNS, NOT_SIMULATED, compaction_rows
from ._counterfactual import COUNTERFACTUAL, MEASURED, Original, store_counterfactual

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..lab import Lab

FINDING_COLUMNS = [
    "session", "fix", "action", "evidence", "requests", "tokens_saved", "usd_saved", "pct_of_cost", "extra_tokens",
    "confidence", "verdict", "cost_simulated_usd", "cost_counterfactual_usd", "cost_measured_usd", "source", "label",
]

NOT_POSSIBLE_COLUMNS = ["session", "fix", "why"]

#: What each finding tells the reader to do (the one-line summary's verb).
ACTIONS: dict[str, str] = {
    "frozen_prefix": "Freeze the tools and system prompt, never rewrite history",
    "tail_volatile": "Move what keeps changing (the clock, counters) out of the system prompt",
    "durable_deltas": "Pin the system prompt and send its changes as durable deltas",
    "breakpoints": "Put cache breakpoints on the tools, the system prompt and the newest message",
    "ttl": "Choose 5m or 1h per cache breakpoint from the idle gaps",
    "keep_warm": "Keep the cache warm through idle gaps with pings",
    "all": "Apply together every fix that saves alone",
}

#: Above this relative error of the baseline against the measured cost, the confidence is called low.
LOW_CONFIDENCE = 0.25

#: A fix whose saving is within this many dollars of zero "saves nothing".
NOTHING = 5e-5


def _confidence(orig: Original, baseline: pd.DataFrame) -> tuple[float | None, str]:
    """(relative cost error of the baseline vs the measured usage, its label)."""
    import pandas as pd

    measured_cost = 0.0
    simulated_cost = 0.0
    n = 0
    for t, sim in zip(orig.turns, baseline.itertuples(index=False), strict=False):
        cost = t.stored.get("cost_usd")
        if t.stored.get("usage_source") in MEASURED and cost is not None and not pd.isna(cost) \
                and sim.cost_usd is not None and not pd.isna(sim.cost_usd):
            measured_cost += float(cost)
            simulated_cost += float(sim.cost_usd)
            n += 1
    if not n:
        return None, "no measured usage: the original is simulated too"
    if measured_cost <= 0:
        return None, "measured cost is zero"
    err = abs(simulated_cost - measured_cost) / measured_cost
    return err, f"±{err:.0%} vs measured" + (" — low: the replay disagrees" if err > LOW_CONFIDENCE else "")


def _evaluate(session_id: str, orig: Original, fixes: tuple[str, ...]) -> tuple[list[dict[str, Any]],
                                                                                  list[dict[str, Any]]]:
    """Findings and not-possible rows of one session."""
    import pandas as pd

    base_plan = orig.plan(())
    baseline = orig.simulate(base_plan)
    base_cost = float(baseline.cost_usd.sum())
    base_read = baseline.cache_read_input_tokens.fillna(0).to_numpy()
    base_total = int(baseline.total_tokens.sum())
    err, confidence = _confidence(orig, baseline)
    measured = [t.stored.get("cost_usd") for t in orig.turns if t.stored.get("usage_source") in MEASURED]
    measured_cost = float(sum(c for c in measured if c is not None and not pd.isna(c))) if measured else None
    source = f"{len(orig.turns)} requests"
    rows: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    applicable: list[str] = []

    def finding(name: str, plan: _fixes.Plan, evidence: str) -> dict[str, Any]:
        df = orig.simulate(plan)
        real = df[~df.ping]
        cost = float(df.cost_usd.sum())
        read = real.cache_read_input_tokens.fillna(0).to_numpy()
        moved = [int(i) for i, a, b in zip(real.idx, base_read, read, strict=True) if a != b]
        saved = base_cost - cost
        verdict = ("saves nothing" if abs(saved) < NOTHING else "costs more" if saved < 0 else "saves")
        return {
            "session": session_id, "fix": name, "action": ACTIONS[name], "evidence": evidence, "requests": moved,
            "tokens_saved": int(read.sum() - base_read.sum()), "usd_saved": saved,
            "pct_of_cost": saved / base_cost if base_cost else math.nan,
            "extra_tokens": int(df.total_tokens.sum()) - base_total, "confidence": confidence, "verdict": verdict,
            "cost_simulated_usd": base_cost, "cost_counterfactual_usd": cost, "cost_measured_usd": measured_cost,
            "source": source, "label": COUNTERFACTUAL, "replay_error": err,
        }

    for name in fixes:
        plan = orig.plan((name,))
        if name in plan.not_possible:
            missing.append({"session": session_id, "fix": name, "why": plan.not_possible[name]})
            continue
        rows.append(finding(name, plan, plan.applied[name].evidence))
        if rows[-1]["verdict"] == "saves":
            applicable.append(name)
    if len(applicable) > 1:
        plan = orig.plan(tuple(applicable))
        rows.append(finding("all", plan, ", ".join(applicable)))
    return rows, missing


@dataclass(frozen=True, repr=False)
class Advice:
    """What to change, and what it would have saved, on a session's (or a Lab's) own requests.

    Attributes:
        findings: one row per fix (and ``all`` together), ranked by dollars saved: ``session, fix, action,
            evidence`` (where it first bites), ``requests`` (the requests whose cache read it changes),
            ``tokens_saved`` (moved from write/uncached to read), ``usd_saved``, ``pct_of_cost`` (of the
            simulated original), ``extra_tokens`` (what it adds: moved lines, deltas, pings), ``confidence``
            (the baseline's error against the measured usage), ``verdict`` (``saves`` / ``saves nothing`` /
            ``costs more``), the three costs and ``label`` (``simulated (counterfactual)``).
        not_possible: ``session, fix, why`` for the fixes the data cannot support.
        fleet: on a Lab, the findings summed per fix over its sessions (else None).
        compactions: the timing of each compaction as the cache saw it (:func:`~._compaction.compaction_timing`:
            warm or expired, what it discarded and rewrote, the idle gap where it would rebuild once); no saving
            is simulated for another timing (``attrs["not_simulated"]`` says why).
    """

    findings: pd.DataFrame
    not_possible: pd.DataFrame
    fleet: pd.DataFrame | None = None
    _lab: Any = field(default=None, compare=False)
    #: the sessions advised, by id: how many requests each holds
    _requests: dict[str, int] = field(default_factory=dict, compare=False)
    compactions: pd.DataFrame | None = None
    #: a session's advice keeps its session read back for :meth:`apply`; a Lab's keeps none (every session's
    #: bodies at once would grow with the history): ``apply`` reads the one it needs again
    _kept: dict[str, Original] = field(default_factory=dict, compare=False)

    label = COUNTERFACTUAL

    def summary(self) -> str:
        """One line: the best fix (on a Lab: the best summed over its sessions), what it saves of what, on how
        many requests."""
        if not len(self.findings):
            return "No fix applies to these requests."
        n = sum(self._requests.values())
        base = float(self.findings.drop_duplicates("session").cost_simulated_usd.sum())
        if self.fleet is not None:
            top = self.fleet.iloc[0]
            fix, saved = str(top.fix), float(top.usd_saved)
        else:
            top = self.findings.iloc[0]
            fix, saved = str(top.fix), float(top.usd_saved)
        if saved < NOTHING:
            return f"No fix saves anything on {_these(n)} ({COUNTERFACTUAL})."
        return (f"{ACTIONS[fix]}: saves {_usd(saved)} of {_usd(base)} ({saved / base:.0%}) on {_these(n)} "
                f"({COUNTERFACTUAL}).")

    def apply(self, fix: str, session: str | None = None) -> Session:
        """The counterfactual session of ``fix`` (a fix name, or ``"all"``: every applicable one), stored in the
        Lab (:func:`~promptcache_nb.counterfactual`). On a Lab's advice name the ``session``."""
        sid = session
        if sid is None:
            if len(self._requests) != 1:
                raise ValueError(f"this advice covers {len(self._requests)} sessions: name one with session=")
            sid = next(iter(self._requests))
        if sid not in self._requests:
            raise ValueError(f"no session {sid!r} in this advice; known: {', '.join(self._requests)}")
        rows = self.findings[self.findings.session == sid]
        if fix == "all":
            names = tuple(f for f in rows.fix if f != "all")
        elif fix in set(rows.fix):
            names = (fix,)
        else:
            why = self.not_possible[(self.not_possible.session == sid) & (self.not_possible.fix == fix)]
            if len(why):
                raise ValueError(f"{fix} is not possible on {sid}: {why.iloc[0].why}")
            raise ValueError(f"unknown fix {fix!r}; known: {', '.join(_fixes.FIX_NAMES)}, all")
        orig = self._kept.get(sid)
        if orig is None:  # read back as advise() read it: the same requests, memo and cache
            orig = Original.load(_open(self._lab, sid))
        return store_counterfactual(orig, _fixes.check_fixes(names))

    def _shown(self) -> pd.DataFrame:
        df = self.findings.copy()
        df["requests"] = [_requests_text(r) for r in df.requests]
        return df[["session", "fix", "usd_saved", "pct_of_cost", "tokens_saved", "extra_tokens", "requests",
                   "confidence", "verdict", "evidence"]]

    def text(self, width: int = 120) -> str:
        """The findings as plain text, one line per fix plus its evidence, each at most ``width`` characters
        (the CLI prints this)."""
        many = len(self._requests) > 1
        head = f"{'fix':<15} {'verdict':<13} {'usd_saved':>10} {'of cost':>7} {'requests':>8}  "
        lines = [(("session" + " " * 13) if many else "") + head + "confidence"]
        for r in self.findings.itertuples(index=False):
            who = f"{r.session[:19]:<20}" if many else ""
            lines.append(f"{who}{r.fix:<15} {r.verdict:<13} {_usd(r.usd_saved):>10} {_pct(r.pct_of_cost):>7} "
                         f"{len(r.requests):>8}  {r.confidence}")
            lines.append(f"{'':<{len(who) + 16}}{visible(r.evidence)}")
        if self.compactions is not None:
            for c in self.compactions.itertuples(index=False):
                who = f"{c.session} " if many else ""
                lines.append(f"compaction     {who}request {c.idx}: {visible(c.verdict)}")
            if len(self.compactions):
                lines.append(f"{'':<15}({NOT_SIMULATED})")
        for fix, rows in self.not_possible.groupby("fix", sort=False):
            where = rows.session.iloc[0] if len(rows) == 1 else f"{len(rows)} sessions"
            lines.append(f"{fix:<15} not possible ({where}): {visible(rows.why.iloc[0])}")
        cut = [ln if len(ln) <= width else ln[: width - 1] + "…" for ln in lines]
        return "\n".join([*textwrap.wrap(self.summary(), width), *cut])

    def __repr__(self) -> str:
        return f"Advice — {self.text()}"

    def _repr_html_(self) -> str:
        # evidence quotes the user's prompts: escaped, invisible characters shown (request.diff.visible)
        table = html_table

        parts = [f"<div class='pcnb-advice'><p><b>{html.escape(visible(self.summary()))}</b></p>",
                 f"<p>Savings are <b>{COUNTERFACTUAL}</b>: the counterfactual minus the original replayed through "
                 "the same cache model; the measured cost is shown beside them.</p>", table(self._shown())]
        if self.fleet is not None:
            parts += ["<p>Fleet roll-up</p>", table(self.fleet)]
        if self.compactions is not None and len(self.compactions):
            parts += [f"<p>Compaction timing ({html.escape(NOT_SIMULATED)})</p>",
                      table(self.compactions.drop(columns=["at"]))]
        if len(self.not_possible):
            parts += [f"<details><summary>{len(self.not_possible)} fixes not possible</summary>",
                      table(self.not_possible), "</details>"]
        return "".join(parts) + "</div>"


def _these(n: int) -> str:
    return "this request" if n == 1 else f"these {n} requests"


def _usd(x: float) -> str:
    """Dollars with the precision a small session needs ($3.10, $0.0031)."""
    return f"${x:,.2f}" if abs(x) >= 0.1 else f"${x:.4f}"


def _pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.0%}"


def _requests_text(requests: list[int], limit: int = 8) -> str:
    if not requests:
        return "none"
    shown = ", ".join(map(str, requests[:limit]))
    return f"{len(requests)}: {shown}" + (", …" if len(requests) > limit else "")


def advise(session_or_lab: Session | Lab, *, fixes: tuple[str, ...] | None = None) -> Advice:
    """Which fixes would have saved what on this traffic: each applicable fix alone, then all together.

    Args:
        session_or_lab: a stored session, or a Lab (every session but counterfactuals, plus a fleet roll-up).
        fixes: the fixes to try (default: all of ``pc.advice.FIXES``).

    Returns:
        An :class:`Advice`: ``findings`` ranked by ``usd_saved``, ``not_possible``, ``summary()`` and
        ``apply(fix)`` → the counterfactual session.

    Example:
        >>> advice = pc.advise(s)                               # doctest: +SKIP
        >>> advice.summary()                                    # doctest: +SKIP
        >>> cf = advice.apply(advice.findings.fix.iloc[0])      # doctest: +SKIP
    """
    import pandas as pd

    names = _fixes.check_fixes(fixes if fixes is not None else _fixes.FIX_NAMES)
    one = isinstance(session_or_lab, Session)
    if isinstance(session_or_lab, Session):
        lab = session_or_lab.lab
        todo = [(session_or_lab.id, 0)]
    else:
        lab = session_or_lab
        todo = [(r["id"], int(r["requests"])) for r in lab.store.original_sessions()]
    rows: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    requests: dict[str, int] = {}
    kept: dict[str, Original] = {}
    compactions: list[dict[str, Any]] = []
    # a Lab's sessions one at a time: a bar by request (every fix replays each), one session's bodies held
    bar = progress_bar(total=sum(n for _, n in todo), desc="advising", enabled=lab.progress and not one, unit="req")
    try:
        for sid, n in todo:
            s = session_or_lab if isinstance(session_or_lab, Session) else _open(lab, sid)
            orig = Original.load(s)
            if orig.turns:
                requests[sid] = len(orig.turns)
                if one:
                    kept[sid] = orig
                got, miss = _evaluate(sid, orig, names)
                rows += got
                missing += miss
                compactions += compaction_rows(orig)
            del orig
            bar.update(n)
    finally:
        bar.close()
    findings = pd.DataFrame(rows, columns=[*FINDING_COLUMNS, "replay_error"])
    findings = findings.sort_values("usd_saved", ascending=False, kind="stable").reset_index(drop=True)
    fleet = None
    if not isinstance(session_or_lab, Session):
        fleet = (findings.groupby("fix", sort=False)
                 .agg(sessions=("session", "nunique"), usd_saved=("usd_saved", "sum"),
                      tokens_saved=("tokens_saved", "sum"), extra_tokens=("extra_tokens", "sum"))
                 .reset_index().sort_values("usd_saved", ascending=False, kind="stable").reset_index(drop=True))
    timing = pd.DataFrame(compactions, columns=COMPACTION_COLUMNS)
    timing.attrs["not_simulated"] = NOT_SIMULATED
    return Advice(findings, pd.DataFrame(missing, columns=NOT_POSSIBLE_COLUMNS), fleet, lab, requests, timing, kept)


def _open(lab: Lab, session_id: str) -> Session:
    """A Lab's session as advice reads it: the open one when the Lab has it, else opened from the store."""
    return lab.active_session(session_id) or lab.session(id=session_id)
