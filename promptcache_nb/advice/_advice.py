"""Ranked advice: every applicable fix run alone and all together over a session's own requests.

Every saving is measured against the session's measured cost: the simulation supplies only the difference a fix
makes, request by request (:mod:`._anchor`), with an interval from how well the replay reproduces this session's
own measured requests (``confidence``; :func:`~._fidelity.fidelity` per request). A fix *saves* only when the low
end of its interval is above zero; a Lab's headline adds each session's best fix once.
"""

from __future__ import annotations

import html
import math
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._lazy import pandas as pd
from .._util import escape_dollars
from ..analysis.frames import html_table
from ..request.diff import visible
from ..session import Session
from ..usage import Usage
from . import _fixes
from ._anchor import AnchoredReplay, RequestFit, _int
from ._compaction import COMPACTION_COLUMNS, NOT_SIMULATED, compaction_rows
from ._counterfactual import COUNTERFACTUAL, Original, open_stored, originals, store_counterfactual
from ._fixes import _n
from ._howto import how_to_apply as _how_to_apply

if TYPE_CHECKING:  # pragma: no cover

    from ..lab import Lab

FINDING_COLUMNS = [
    "session", "fix", "action", "evidence", "requests", "cost_changed", "tokens_saved", "usd_saved", "usd_saved_low",
    "usd_saved_high", "saved", "pct_of_cost", "extra_tokens", "confidence", "verdict", "why", "how",
    "cost_basis", "cost_basis_usd", "cost_counterfactual_usd", "cost_measured_usd", "kept_requests", "source",
    "label",
]

NOT_POSSIBLE_COLUMNS = ["session", "fix", "why"]

PROVIDER_MISS_COLUMNS = ["session", "requests", "first_at", "last_at", "rebuilt_tokens", "lost_usd", "share_of_cost",
                         "how", "label"]

#: What each finding tells the reader to do (the one-line summary's verb).
ACTIONS: dict[str, str] = {
    "frozen_prefix": "Freeze the tools and system prompt, never rewrite history",
    "tail_volatile": "Move what keeps changing (the clock, counters) out of the system prompt",
    "durable_deltas": "Pin the system prompt and send its changes as durable deltas",
    "breakpoints": "Put cache breakpoints on the tools, the system prompt and the newest message",
    "ttl": "Choose 5m or 1h per cache breakpoint from the idle gaps",
    "keep_warm": "Keep the cache warm through idle gaps with pings",
    "stagger": "Send same-prefix requests after the first has begun answering, not at once",
    "all": "Apply together every fix that saves alone",
}

#: Above this relative error of the scaled baseline against the measured cost, the confidence is called low.
LOW_CONFIDENCE = 0.25

#: A fix whose saving is within this many dollars of zero "saves nothing".
NOTHING = 5e-5

#: The label of a figure that is the session's own measured usage.
MEASURED_LABEL = "measured"


def _confidence(fits: list[RequestFit]) -> tuple[float | None, str]:
    """(relative cost error of the scaled baseline vs the measured usage, one line on how well the replay
    reproduces this session's measured requests)."""
    measured = [f for f in fits if f.measured is not None]
    if not measured:
        return None, "no measured usage: the original is simulated too"
    cost = sum(f.measured_cost or 0.0 for f in measured)
    err = sum(abs(f.residual) for f in measured) / cost if cost > 0 else None
    agree = sum(f.reproduced for f in measured) / len(measured)
    text = f"replay reproduces {agree:.0%} of {len(measured)} measured requests"
    if err is not None:
        text += f", cost error ±{err:.0%}" + (" — low: the replay disagrees" if err > LOW_CONFIDENCE else "")
    return err, text


def _base_costs(fits: list[RequestFit]) -> tuple[float, str, float | None]:
    """(the session's cost advice is measured against, its label, its measured cost or None)."""
    measured = [f for f in fits if f.measured is not None]
    if measured and all(f.measured_cost is not None for f in measured):
        cost = sum(f.measured_cost or 0.0 for f in measured) + sum(f.simulated_cost or 0.0 for f in fits
                                                                   if f.measured is None)
        return cost, MEASURED_LABEL, cost
    return sum(f.base_cost or 0.0 for f in fits), "simulated", None


def _decimals(width: float) -> int:
    """Decimals a dollar figure with an interval ``width`` wide supports (at least 2, at most 4)."""
    if width <= 0 or not math.isfinite(width):
        return 4
    return max(2, min(4, 1 - math.floor(math.log10(width))))


def saved_text(saved: float, low: float, high: float) -> str:
    """``$0.25 ($0.19 to $0.31)``, rounded to what the interval supports."""
    if max(abs(saved), abs(low), abs(high)) < NOTHING:
        return "$0"
    d = _decimals(high - low)
    return f"{_money(saved, d)} ({_money(low, d)} to {_money(high, d)})"


def _money(x: float, decimals: int) -> str:
    return f"{'-' if x < 0 else ''}${abs(x):,.{decimals}f}"


def _verdict(rep: AnchoredReplay) -> tuple[str, str]:
    """(verdict, why): ``saves`` only when the low end is above zero."""
    if rep.unknown:
        return "unknown", (f"no price for {', '.join(rep.unpriced)}: what it saves or costs on the requests it "
                           "changes is unknown, not $0")
    if rep.low > NOTHING:
        return "saves", ""
    if rep.high < -NOTHING:
        return "costs more", "it costs more across the whole interval"
    if abs(rep.saved) < NOTHING and abs(rep.high) < NOTHING and abs(rep.low) < NOTHING:
        return "saves nothing", "no request's cost changes"
    return "no saving we can show", (f"the interval {saved_text(rep.saved, rep.low, rep.high)} spans zero: the "
                                     "replay does not reproduce this session closely enough to tell")


def _evaluate(session_id: str, orig: Original, fixes: tuple[str, ...]) -> tuple[list[dict[str, Any]],
                                                                                  list[dict[str, Any]]]:
    """Findings and not-possible rows of one session."""
    baseline = orig.baseline()
    fits = orig.fits()
    base_read = [int(x) for x in baseline[~baseline.ping].cache_read_input_tokens.fillna(0)]
    base_total = int(baseline.total_tokens.sum())
    err, confidence = _confidence(fits)
    if orig.calibration_note and orig.measured:
        confidence += f"; tokens {orig.calibration_note}"  # which token count the replay used, and why
    basis_cost, basis, measured_cost = _base_costs(fits)
    client = orig.client
    source = f"{len(orig.turns)} requests"
    rows: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    applicable: list[str] = []

    def finding(name: str, plan: _fixes.Plan, evidence: str) -> dict[str, Any]:
        df = orig.simulate(plan)
        rep = orig.anchored(plan, df)
        real = df[~df.ping]
        read = real.cache_read_input_tokens.fillna(0).to_numpy()
        moved = [int(i) for i, a, b in zip(real.idx, base_read, read, strict=True) if a != b]
        verdict, why = _verdict(rep)
        saved, low, high = (math.nan, math.nan, math.nan) if rep.unknown else (rep.saved, rep.low, rep.high)
        kept = sum(1 for r in rep.requests if r.kept and not r.ping and r.raw_delta != 0)
        how = _how(client, name, plan)
        return {
            "session": session_id, "fix": name, "action": ACTIONS[name], "evidence": evidence,
            "requests": moved, "cost_changed": rep.changed, "tokens_saved": int(read.sum() - sum(base_read)),
            "usd_saved": saved,
            "usd_saved_low": low, "usd_saved_high": high,
            "saved": "unknown" if rep.unknown else saved_text(rep.saved, rep.low, rep.high),
            "pct_of_cost": saved / basis_cost if basis_cost else math.nan,
            "extra_tokens": int(df.total_tokens.sum()) - base_total, "confidence": confidence, "verdict": verdict,
            "why": why, "how": how, "cost_basis": basis, "cost_basis_usd": basis_cost,
            "cost_counterfactual_usd": rep.cost, "cost_measured_usd": measured_cost, "kept_requests": kept,
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
        together = finding("all", plan, ", ".join(applicable))
        best = max((r for r in rows if r["fix"] in applicable), key=lambda r: r["usd_saved"])
        if together["usd_saved"] < best["usd_saved"]:
            together["evidence"] += (f"; saves less than {best['fix']} alone ({_usd(best['usd_saved'])}): the fixes "
                                     "overlap (what one saves, another changes again) — apply "
                                     f"{best['fix']} alone")
        rows.append(together)
    return rows, missing


def _provider_misses(session_id: str, orig: Original, cost: float) -> dict[str, Any] | None:
    """What went to rebuilds the provider made with the logged prefix unchanged (measured requests the
    replay reads on): the rebuilt tokens are measured, their loss priced as reads instead of writes."""
    fits = [f for f in orig.fits() if f.cause == "provider_miss" and f.measured is not None
            and f.simulated is not None]
    if not fits:
        return None
    lost = 0.0
    rebuilt = 0
    for f in fits:
        m, sim = f.measured, f.simulated
        assert m is not None and sim is not None
        # what the replay read and the provider did not: written again, or (a cache with no writes) sent uncached
        missed = max(0, round(f.scale * _int(sim.cache_read_input_tokens)) - _int(m.cache_read_input_tokens))
        p = orig.prices(f.model)
        if p is None or not missed:
            continue
        written = min(missed, _int(m.cache_creation_input_tokens))
        w1 = round(written * _int(m.cache_creation_1h_input_tokens) / max(1, _int(m.cache_creation_input_tokens)))
        as_sent = p.cost(Usage(missed - written, 0, written, written - w1, w1, 0), f.at) or 0.0
        as_read = p.cost(Usage(0, missed, 0, 0, 0, 0), f.at) or 0.0
        lost += as_sent - as_read
        rebuilt += missed
    return {"session": session_id, "requests": [f.idx for f in fits], "first_at": fits[0].at, "last_at": fits[-1].at,
            "rebuilt_tokens": rebuilt, "lost_usd": lost, "share_of_cost": lost / cost if cost else math.nan,
            "how": _how(orig.client, "provider_miss", None),
            "label": "measured rebuilds (the replay read there); loss priced as reads instead of writes"}


def _how(client: str, fix: str, plan: _fixes.Plan | None) -> str:
    """How to apply ``fix`` in the client that wrote the log (:func:`~._howto.how_to_apply`); ``all`` has none of
    its own (each member's row says how)."""
    if fix == "all":
        return ""
    detail: dict[str, Any] = {}
    if plan is not None and fix in plan.applied:
        detail.update(plan.applied[fix].detail)
        if fix == "keep_warm":
            detail["ttl"] = "1h" if list(plan.cache_params.get("client_ttls") or ["5m"])[-1] == "1h" else "5m"
    how = _how_to_apply(client, fix, detail=detail)
    if how.switch and how.switch not in how.text:
        return f"{how.text} Set: {how.switch}."
    return how.text


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
    #: per session, what went to rebuilds the provider made with the logged prefix unchanged
    #: (:data:`PROVIDER_MISS_COLUMNS`); a cost no fix here removes
    provider_misses: pd.DataFrame | None = None
    #: per session advised: (the cost its findings are measured against, ``measured`` / ``simulated``)
    _costs: dict[str, tuple[float, str]] = field(default_factory=dict, compare=False)

    label = COUNTERFACTUAL

    def best(self) -> pd.DataFrame:
        """Each session's best finding that saves (its low end above zero), at most one per session: what a Lab's
        headline adds up (an alternative a session was told to skip is never counted)."""
        saves = self.findings[self.findings.verdict == "saves"]
        return saves.sort_values("usd_saved", ascending=False, kind="stable").drop_duplicates("session")

    def summary(self) -> str:
        """One line: the best fix per session (on a Lab: summed, each session's best counted once), what it saves
        of the measured cost, with its interval, on how many requests."""
        if not len(self.findings) and (self.provider_misses is None or not len(self.provider_misses)):
            return "No fix applies to these requests."
        n = sum(self._requests.values())
        base, basis = self._base()
        best = self.best()
        line = ""
        unknown = self.findings[self.findings.verdict == "unknown"]
        if not len(best) and len(unknown):
            models = sorted({m for why in unknown.why for m in _unpriced_models(why)})
            line = (f"What the fixes save on {_these(n)} is unknown: no price for {', '.join(models)} "
                    f"({COUNTERFACTUAL}).")
        elif not len(best):
            line = f"No fix saves anything we can show on {_these(n)} ({COUNTERFACTUAL})."
        else:
            saved, low, high = (float(best.usd_saved.sum()), float(best.usd_saved_low.sum()),
                                float(best.usd_saved_high.sum()))
            fixes = list(dict.fromkeys(best.fix))
            what = ACTIONS[fixes[0]] if len(fixes) == 1 else f"Best fix per session ({', '.join(fixes)})"
            share = f" ({saved / base:.0%})" if base > 0 else ""
            line = (f"{what}: saves {saved_text(saved, low, high)} of {_usd(base)} {basis}{share} on {_these(n)} "
                    f"({COUNTERFACTUAL}, anchored on measured usage).")
        if self.provider_misses is not None and len(self.provider_misses):
            lost = float(self.provider_misses.lost_usd.sum())
            if lost > (float(best.usd_saved.sum()) if len(best) else 0.0):
                line += (f" Provider-side misses (prefix unchanged) cost {_usd(lost)} of {_usd(base)}: more than any "
                         "fix saves — see provider_misses.")
        return line

    def _base(self) -> tuple[float, str]:
        """(the advised sessions' cost, ``measured`` / ``simulated``): every session advised, with a finding or
        not."""
        if not self._costs:
            return 0.0, "simulated"
        basis = MEASURED_LABEL if all(b == MEASURED_LABEL for _, b in self._costs.values()) else "simulated"
        return sum(c for c, _ in self._costs.values()), basis

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
            names = tuple(f for f, v in zip(rows.fix, rows.verdict, strict=True) if f != "all" and v == "saves")
        elif fix in set(rows.fix):
            names = (fix,)
        else:
            why = self.not_possible[(self.not_possible.session == sid) & (self.not_possible.fix == fix)]
            if len(why):
                raise ValueError(f"{fix} is not possible on {sid}: {why.iloc[0].why}")
            raise ValueError(f"unknown fix {fix!r}; known: {', '.join(_fixes.FIX_NAMES)}, all")
        orig = self._kept.get(sid)
        if orig is None:  # read back as advise() read it: the same requests, memo and cache
            orig = Original.load(open_stored(self._lab, sid))
        return store_counterfactual(orig, _fixes.check_fixes(names))

    def _shown(self) -> pd.DataFrame:
        df = self.findings.copy()
        df["requests"] = [_requests_text(r) for r in df.requests]
        return df[["session", "fix", "saved", "pct_of_cost", "tokens_saved", "extra_tokens", "requests",
                   "verdict", "why", "evidence", "how", "confidence"]]

    def text(self, width: int = 120) -> str:
        """The findings as plain text: one line per fix (verdict, saving with its interval, share of the measured
        cost, requests changed), then its evidence, why, how to apply it and the replay's fidelity, wrapped (never
        cut) at ``width`` characters (the CLI prints this)."""
        many = len(self._requests) > 1
        lines: list[str] = []
        pad = " " * 4

        def wrap(text: str, indent: str = pad) -> None:
            lines.extend(textwrap.wrap(visible(text), width, initial_indent=indent, subsequent_indent=indent + "  ",
                                       break_long_words=True, break_on_hyphens=False) or [indent])

        for r in self.findings.itertuples(index=False):
            who = f"{r.session}: " if many else ""
            verdict = "saving unknown" if r.verdict == "unknown" else f"{r.verdict} {r.saved}"
            wrap(f"{who}{r.fix} — {verdict}, {_pct(r.pct_of_cost)} of the {r.cost_basis} cost, "
                 f"reads change on {_n(len(r.requests), 'request')}, cost on {len(r.cost_changed)}", "")
            wrap(f"evidence: {r.evidence}")
            if r.why:
                wrap(f"why: {r.why}")
            if r.how:
                wrap(f"how: {r.how}")
            wrap(f"fidelity: {r.confidence}")
        if self.provider_misses is not None:
            for m in self.provider_misses.itertuples(index=False):
                who = f"{m.session}: " if many else ""
                wrap(f"{who}provider misses — {len(m.requests)} rebuilds with the logged prefix unchanged lost "
                     f"{_usd(m.lost_usd)} ({_pct(m.share_of_cost)} of the measured cost), {m.first_at:%Y-%m-%d %H:%M} "
                     f"to {m.last_at:%H:%M}", "")
                if m.how:
                    wrap(f"how: {m.how}")
        if self.compactions is not None:
            for c in self.compactions.itertuples(index=False):
                who = f"{c.session} " if many else ""
                wrap(f"compaction {who}request {c.idx}: {c.verdict}", "")
            if len(self.compactions):
                wrap(f"({NOT_SIMULATED})")
        for fix, rows in self.not_possible.groupby("fix", sort=False):
            where = rows.session.iloc[0] if len(rows) == 1 else f"{len(rows)} sessions"
            wrap(f"{fix} not possible ({where}): {rows.why.iloc[0]}", "")
        return "\n".join([*textwrap.wrap(visible(self.summary()), width), *lines])

    def __repr__(self) -> str:
        return f"Advice — {self.text()}"

    def _repr_html_(self) -> str:
        # evidence quotes the user's prompts: escaped, invisible characters shown (request.diff.visible)
        table = html_table

        parts = [f"<div class='pcnb-advice'><p><b>{html.escape(visible(self.summary()))}</b></p>",
                 f"<p>Savings are <b>{COUNTERFACTUAL}</b>, anchored on the measured cost: per request, the measured "
                 "usage plus the difference the fix makes in the replay, scaled to the measured prompt; a request "
                 "the replay does not reproduce keeps its measured cost. Each saving carries the interval this "
                 "session's own fidelity supports; it <i>saves</i> only when the low end is above zero.</p>",
                 table(self._shown())]
        if self.provider_misses is not None and len(self.provider_misses):
            parts += ["<p>Provider-side misses (measured rebuilds with the logged prefix unchanged)</p>",
                      table(self.provider_misses.drop(columns=["label"]))]
        if self.fleet is not None:
            parts += ["<p>Fleet roll-up</p>", table(self.fleet)]
        if self.compactions is not None and len(self.compactions):
            parts += [f"<p>Compaction timing ({html.escape(NOT_SIMULATED)})</p>",
                      table(self.compactions.drop(columns=["sent_at"]))]
        if len(self.not_possible):
            parts += [f"<details><summary>{len(self.not_possible)} fixes not possible</summary>",
                      table(self.not_possible), "</details>"]
        return escape_dollars("".join(parts) + "</div>")


def _unpriced_models(why: str) -> list[str]:
    """The model names of an ``unknown`` verdict's why (``no price for a, b: ...``)."""
    head = why.removeprefix("no price for ").split(":", 1)[0]
    return [m.strip() for m in head.split(",") if m.strip()] if why.startswith("no price for ") else []


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
    names = _fixes.check_fixes(fixes if fixes is not None else _fixes.FIX_NAMES)
    one = isinstance(session_or_lab, Session)
    lab = session_or_lab.lab if isinstance(session_or_lab, Session) else session_or_lab
    rows: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    requests: dict[str, int] = {}
    kept: dict[str, Original] = {}
    compactions: list[dict[str, Any]] = []
    misses: list[dict[str, Any]] = []
    costs: dict[str, tuple[float, str]] = {}
    # a Lab's sessions one at a time (every fix replays each), one session's bodies held
    for orig in originals(session_or_lab, desc="advising"):
        sid = str(orig.row["id"])
        requests[sid] = len(orig.turns)
        if one:
            kept[sid] = orig
        cost, basis, _ = _base_costs(orig.fits())
        costs[sid] = (cost, basis)
        got, miss = _evaluate(sid, orig, names)
        rows += got
        missing += miss
        lost = _provider_misses(sid, orig, cost)
        if lost is not None:
            misses.append(lost)
        compactions += compaction_rows(orig)
    findings = pd.DataFrame(rows, columns=[*FINDING_COLUMNS, "replay_error"])
    findings = findings.sort_values("usd_saved", ascending=False, kind="stable").reset_index(drop=True)
    fleet = None
    if not isinstance(session_or_lab, Session):
        saves = findings[findings.verdict == "saves"]
        fleet = (findings.groupby("fix", sort=False)
                 .agg(sessions=("session", "nunique"), usd_saved=("usd_saved", "sum"),
                      usd_saved_low=("usd_saved_low", "sum"), usd_saved_high=("usd_saved_high", "sum"),
                      tokens_saved=("tokens_saved", "sum"), extra_tokens=("extra_tokens", "sum"))
                 .reset_index().sort_values("usd_saved", ascending=False, kind="stable").reset_index(drop=True))
        fleet["sessions_it_saves_on"] = [int((saves.fix == f).sum()) for f in fleet.fix]
    timing = pd.DataFrame(compactions, columns=COMPACTION_COLUMNS)
    timing.attrs["not_simulated"] = NOT_SIMULATED
    return Advice(findings, pd.DataFrame(missing, columns=NOT_POSSIBLE_COLUMNS), fleet, lab, requests, timing, kept,
                  pd.DataFrame(misses, columns=PROVIDER_MISS_COLUMNS), costs)


