"""Counterfactual replays: a stored session's own requests, transformed by fixes, run through a cache model.

:func:`counterfactual` stores the result as a new simulated session in the same Lab; the advice
(:mod:`._advice`) runs the same :class:`Original` through :meth:`Original.simulate` without storing anything.
Both count tokens with the same tokenizer (the Lab's, calibrated where the Lab's calibration lowers the error
on comparable measured requests: :func:`~promptcache_nb.analysis.calibrate.calibration_for`), replay the
original bodies the same way (the simulated original), and price with the re-simulation's prices
(:func:`~promptcache_nb.analysis.resimulate.resimulate`). What both report is anchored on the measured original
(:mod:`._anchor`): the measured usage plus the difference between the fixed and the original replay.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from .._config import SessionConfig
from .._lazy import pandas as pd
from .._shared import account_of, cache_scope_of
from .._util import progress_bar
from ..analysis import Prices, calibration_for
from ..analysis.resimulate import (
    SharedStream,
    StoredTurn,
    _resimulate_turns,
    history_missing,
    load_turns,
    request_prices,
)
from ..cache import get_cache_model
from ..errors import PromptCacheError, SessionError
from ..lab import Lab
from ..request import PreparedRequest, SegmentMemo, prepare
from ..session import Session
from ..tokens import session_tokenizer
from ..usage import Usage
from . import _fixes
from ._anchor import MEASURED, AnchoredReplay, RequestFit, anchor, fit_requests
from ._fixes import Plan, Request

#: The label of every counterfactual figure.
COUNTERFACTUAL = "simulated (counterfactual)"


def _partial_reason(unlogged: int) -> str:
    return (f"the log holds no system prompt or tools (an unlogged prefix of {unlogged:,} tokens): there is "
            "nothing to move, pin, freeze or mark")


@dataclass
class Original:
    """A stored session read back for counterfactuals: its requests, its row, the tokenizer they are counted
    with, and the cache model they run through."""

    lab: Lab
    row: dict[str, Any]
    turns: list[StoredTurn]
    calibration: dict[str, Any] | None
    cache: str
    cache_params: dict[str, Any]
    memo: SegmentMemo
    #: the other sessions of its cache scope replayed beside it (:meth:`family`), as stored
    shared: tuple[SharedStream, ...] = ()
    #: simulations by (the bodies' ids, ping flags, cache parameters) -> (those bodies, kept alive; the frame)
    _sims: dict[Any, tuple[list[Any], pd.DataFrame]] = field(default_factory=dict, repr=False)
    _fits: list[RequestFit] | None = field(default=None, repr=False)
    #: the family as the plan's client would have sent it, by the body fixes applied (:meth:`_family_under`)
    _families: dict[Any, tuple[SharedStream, ...]] = field(default_factory=dict, repr=False)
    _kin_streams: list[SharedStream] | None = field(default=None, repr=False)
    _kin_all: dict[str, list[Request]] | None = field(default=None, repr=False)
    #: how its requests are counted and why (:func:`~promptcache_nb.analysis.calibrate.calibration_for`)
    calibration_note: str = ""

    @classmethod
    def load(cls, session: Session, *, cache: str | None = None) -> Original:
        """Read ``session`` back (``cache``: another cache model's name; default the session's)."""
        lab = Lab.of(session)
        row = lab.store.session_row(session.id)
        if row is None:
            raise SessionError(f"no session {session.id!r} in {lab.path!r}")
        # the session's own calibration, else the saved one only where it lowers the error on comparable requests
        choice = calibration_for(lab, row)
        calibration = choice.calibration
        own = calibration == row["config"].get("calibration")
        # the session's own memo when it counts the same way: what importing counted is not counted again
        memo = session.memo if own else SegmentMemo(session_tokenizer(lab.tokenizer, calibration))
        turns = load_turns(lab, session.id, memo=memo)
        name = cache or row["cache_model"]
        params = dict(row["config"].get("cache_params") or {}) if name == row["cache_model"] else {}
        shared = _family(lab, row, turns) if name == row["cache_model"] else ()
        return cls(lab, row, turns, calibration, name, params, memo, shared, calibration_note=choice.why)

    @property
    def partial(self) -> int | None:
        """The unlogged prefix's tokens when the bodies are partial, else None."""
        for t in self.turns:
            if t.request.unlogged_prefix_tokens is not None:
                return t.request.unlogged_prefix_tokens
        return None

    @property
    def measured(self) -> bool:
        return any(t.stored.get("usage_source") in MEASURED for t in self.turns)

    def history_missing(self, turn: StoredTurn) -> bool:
        """The log lacks this request's history: a compaction call logged apart from the conversation it
        summarises (its measured read is the parent's entry, which no replay of its own log can show)."""
        return self.row["config"].get("session_kind") == "compaction" or history_missing(turn)

    @property
    def client(self) -> str:
        """The client that wrote the log (the importer's format name), else ``api``."""
        return str(self.row["config"].get("format") or "api")

    def anchored(self, plan: Plan, fixed: pd.DataFrame | None = None) -> AnchoredReplay:
        """``plan``'s counterfactual anchored on the measured original (:func:`~._anchor.anchor`)."""
        df = self.simulate(plan) if fixed is None else fixed
        return anchor(self, self.fits(), self.baseline(), df,
                      body_fix=bool(_fixes.BODY_FIXES & set(plan.applied)), ttl_fix="ttl" in plan.applied,
                      client_ttls=list(plan.cache_params.get("client_ttls") or ["5m", "5m"]) if self.partial is not None
                      else None)

    def baseline(self) -> pd.DataFrame:
        """The simulated original: the session's own bodies replayed, no fix applied."""
        return self.simulate(self.plan(()))

    def fits(self) -> list[RequestFit]:
        """How the simulated original compares with each measured request (:func:`~._anchor.fit_requests`)."""
        if self._fits is None:
            self._fits = fit_requests(self, self.baseline())
        return self._fits

    def prices(self, model: str) -> Prices | None:
        """The prices a request of ``model`` is costed with (the session's own, else its cache's for the model)."""
        cfg = self.row["config"].get("prices")
        return Prices(**cfg) if cfg else request_prices(self.cache, model)

    def _ping_pays(self, requests: list[Request], params: dict[str, Any]) -> Callable[[int, int], bool]:
        """``worth(i, n)`` for :func:`~._fixes.keep_warm`: do ``n`` pings (each reading the previous request's
        prompt) cost less than what ``requests[i]`` rebuilt in a replay of ``requests`` (its write beyond the
        new tail, at the write price instead of the read price)?"""
        replay: list[Any] = []  # (totals, rows): replayed on the first gap asked about

        def worth(i: int, n: int) -> bool:
            if not replay:
                sim = self.simulate(Plan(list(requests), dict(params)))
                replay.extend(([int(x) for x in sim.total_tokens], list(sim.itertuples(index=False))))
            totals, rows = replay
            row = rows[i]
            p = self.prices(row.model)
            if p is None or pd_isna(row.cache_creation_input_tokens):
                return False
            lost = max(0, int(row.cache_creation_input_tokens) - max(0, totals[i] - totals[i - 1]))
            share_1h = (row.cache_creation_1h_input_tokens or 0) / (row.cache_creation_input_tokens or 1)
            w1h = int(lost * share_1h)
            rebuild = (p.cost(Usage(0, 0, lost, lost - w1h, w1h, 0), row.sent_at) or 0.0) - (
                p.cost(Usage(0, lost, 0, 0, 0, 0), row.sent_at) or 0.0)
            ping = p.cost(Usage(0, totals[i - 1], 0, 0, 0, 0), row.sent_at) or 0.0
            return n * ping < rebuild

        return worth

    def plan(self, fixes: Sequence[str]) -> Plan:
        """The counterfactual requests under ``fixes`` (in application order), and what was not possible."""
        requests = [Request(t.at, t.request.body, t.idx) for t in self.turns]
        params = dict(self.cache_params)
        plan = Plan(requests, params)
        dialects = {t.request.dialect for t in self.turns}
        unlogged = self.partial
        for name in _fixes.check_fixes(fixes):
            if name in _fixes.BODY_FIXES and unlogged is not None:
                plan.not_possible[name] = _partial_reason(unlogged)
                continue
            if name in _fixes.BODY_FIXES and dialects - {"anthropic"}:
                plan.not_possible[name] = (f"bodies in the {', '.join(sorted(dialects - {'anthropic'}))} dialect: "
                                           "only Anthropic Messages bodies are transformed")
                continue
            if name in ("ttl", "keep_warm") and (why := self._no_ttl_choice(name)) is not None:
                plan.not_possible[name] = why
                continue
            if name == "stagger" and "ttft_seconds" not in get_cache_model(self.cache).options.model_dump():
                plan.not_possible[name] = (f"the {self.cache} cache model does not model when a written entry "
                                           "becomes readable: nothing to stagger against")
                continue
            if name == "frozen_prefix":
                done = _fixes.frozen_prefix(plan.requests)
            elif name == "tail_volatile":
                done = _fixes.tail_volatile(plan.requests, family=list(self._kin_requests().values()))
            elif name == "durable_deltas":
                done = _fixes.durable_deltas(plan.requests)
            elif name == "breakpoints":
                done = self._best_breakpoints(plan.requests, params, plan.applied)
            elif name == "ttl":
                done, params = self._best_ttl(plan.requests, params)
            elif name == "keep_warm":
                done = _fixes.keep_warm(plan.requests, ttl_seconds=self._ttl_of(params),
                                        worth=self._ping_pays(plan.requests, params))
            else:
                done = _fixes.stagger(plan.requests, others=[t.at for s in self.shared for t in s.turns])
            plan.requests = done.requests
            plan.applied[name] = done
        plan.cache_params = params
        return plan

    def _no_ttl_choice(self, fix: str) -> str | None:
        """Why ``fix`` (``ttl`` or ``keep_warm``) cannot apply under this cache model, or None: a model whose
        markers choose no TTL (the provider decides), or — for ``ttl`` — one without the 1-hour TTL (Bedrock lists
        it for some models only; a replay with it would be refused). Models the cache cannot simulate are skipped."""
        cache = get_cache_model(self.cache, **self.cache_params)
        ttls: dict[str, tuple[str, ...]] = {}
        for model in sorted({t.model for t in self.turns}):
            try:
                ttls[model] = cache.ttls_for(model)
            except PromptCacheError:
                continue
        if not any(ttls.values()):
            return f"the {self.cache} cache model has no TTL to choose or refresh"
        without = [m for m, t in ttls.items() if "1h" not in t]
        if fix == "ttl" and without:
            return f"no 1-hour TTL for {', '.join(without)} under the {self.cache} cache model"
        return None

    def _best_breakpoints(self, requests: list[Request], params: dict[str, Any],
                          applied: dict[str, _fixes.Applied]) -> _fixes.Applied:
        """:func:`~._fixes.breakpoints` with the system marker on the block that makes this traffic cheapest
        (each of the first 4 system blocks tried by replay, after the fixes ``applied`` so far)."""
        n = min(_fixes.system_blocks(requests), _fixes.MAX_SYSTEM_CANDIDATES)
        if n <= 1:
            return _fixes.breakpoints(requests)
        tried = []
        for i in range(n):
            done = _fixes.breakpoints(requests, system_block=i)
            done.detail["system_block"] = i
            plan = Plan(done.requests, dict(params), applied={**applied, "breakpoints": done})
            tried.append((float(self.simulate(plan).cost_usd.sum()), i, done))
        return min(tried, key=lambda t: (t[0], t[1]))[2]

    def _kin(self) -> list[SharedStream]:
        """The sessions of the family the same client logged with full Anthropic bodies: what a body fix changes
        with this one's (read once)."""
        if self._kin_streams is None:
            self._kin_streams = []
            for stream in self.shared:
                other = self.lab.store.session_row(stream.key)
                if other is None or str(other["config"].get("format") or "api") != self.client:
                    continue
                # the body fixes transform Anthropic Messages bodies only (as plan() checks for this session)
                whole = all(t.request.unlogged_prefix_tokens is None for t in stream.turns)
                if whole and {t.request.dialect for t in stream.turns} == {"anthropic"}:  # body fixes: Anthropic only
                    self._kin_streams.append(stream)
        return self._kin_streams

    def _kin_requests(self) -> dict[str, list[Request]]:
        """Every request of each :meth:`_kin` session (not only those near this one's: a fix learns from all the
        client sent), read once."""
        if self._kin_all is None:
            self._kin_all = {s.key: [Request(t.at, t.request.body, t.idx) for t in load_turns(self.lab, s.key)]
                             for s in self._kin()}
        return self._kin_all

    def _family_under(self, plan: Plan) -> tuple[SharedStream, ...]:
        """The other sessions of the cache scope as ``plan``'s client would have sent them.

        A body fix is a change to the agent, and the agent also sends its sub-agents', compaction calls' and other
        conversations' requests: each session of the family the same client logged (full Anthropic bodies) gets
        the body fixes ``plan`` applied, on its own requests (a fixed sub-agent reads a fixed parent's prefix, as
        the strategy's own replay of both does). Timing fixes (``ttl``, ``keep_warm``, ``stagger``) are this
        session's own; sessions of other clients stay as logged."""
        key = tuple((n, a.detail.get("system_block")) for n, a in plan.applied.items() if n in _fixes.BODY_FIXES)
        if not key or not self.shared:
            return self.shared
        if key in self._families:
            return self._families[key]
        kin = self._kin()
        out = []
        mine = [Request(t.at, t.request.body, t.idx) for t in self.turns]
        learned = self._kin_requests()
        for stream in self.shared:
            if stream not in kin:
                out.append(stream)
                continue
            requests = [Request(t.at, t.request.body, t.idx) for t in stream.turns]
            # learned from all each sent: its own whole history too (the stream holds only what is near this one)
            family = [mine, *learned.values()]
            for name, block in key:
                if name == "frozen_prefix":
                    requests = _fixes.frozen_prefix(requests).requests
                elif name == "tail_volatile":
                    requests = _fixes.tail_volatile(requests, family=family).requests
                elif name == "durable_deltas":
                    requests = _fixes.durable_deltas(requests).requests
                else:
                    requests = _fixes.breakpoints(requests, system_block=block).requests
            turns, prev = [], None
            for t, r in zip(stream.turns, requests, strict=True):
                req = t.request if r.body is t.request.body else prepare(r.body, memo=self.memo, previous=prev,
                                                                          dialect=t.request.dialect)
                turns.append(replace(t, request=req))
                prev = req
            out.append(replace(stream, turns=tuple(turns)))
        self._families[key] = tuple(out)
        return self._families[key]

    def _best_ttl(self, requests: list[Request], params: dict[str, Any]) -> tuple[_fixes.Applied, dict[str, Any]]:
        """:func:`~._fixes.ttl` per breakpoint: each place a 1h run can end (none, tools, system, messages — on a
        partial body the client's assumed prefix and conversation breakpoints, ``client_ttls``) replayed, the
        cheapest kept. When the TTLs as sent are already the cheapest, the cheapest other choice is returned (its
        finding then says it costs more, and what it would have read instead of rebuilt). The evidence names the
        gaps that drove the choice."""
        base = self.simulate(Plan(list(requests), dict(params)))
        tried: list[tuple[float, int, _fixes.Applied, dict[str, Any], bool, pd.DataFrame]] = []
        if self.partial is not None:  # the client's assumed breakpoints (AnthropicCache client_ttls)
            roles = _fixes.PARTIAL_TTL_ROLES
            now = tuple(params.get("client_ttls") or ("5m", "5m"))
            for k, through in enumerate((None, *roles)):
                ttls = _fixes.ttl_roles(through, roles)
                p = {**params, "client_ttls": [ttls[r] for r in roles]}
                same = tuple(p["client_ttls"]) == now
                done = _fixes.Applied(list(requests), [] if same else [r.origin for r in requests],
                                      _fixes.ttl_label(through, roles), {"through": through})
                df = self.simulate(Plan(done.requests, p))
                tried.append((float(df.cost_usd.sum()), k, done, p, same, df))
        else:
            present = _fixes.marked_roles(requests)
            for k, through in enumerate((None, *present)):
                done = _fixes.ttl(requests, through=through)
                done.evidence = _fixes.ttl_label(through, present)
                done.detail = {"through": through}
                df = self.simulate(Plan(done.requests, dict(params)))
                tried.append((float(df.cost_usd.sum()), k, done, dict(params), not done.changed, df))
        best = min(tried, key=lambda t: (t[0], t[1]))
        kept = best[4]
        if kept and len(tried) > 1:
            best = min((t for t in tried if not t[4]), key=lambda t: (t[0], t[1]))
        _, _, done, p, _, df = best
        done.evidence = _ttl_evidence(requests, base, df, done.evidence, kept=kept)
        return done, p

    def _ttl_of(self, params: dict[str, Any]) -> Any:
        """A body's shortest entry lifetime: 1h only when every marker (or assumed breakpoint) is 1h."""
        partial_1h = list(params.get("client_ttls") or ["5m", "5m"]) == ["1h", "1h"]

        def life(body: dict[str, Any]) -> float:
            ttls = _fixes_ttls(body)
            if not ttls:
                return 3600.0 if self.partial is not None and partial_1h else 300.0
            return 3600.0 if all(t == "1h" for t in ttls) else 300.0

        return life

    def prepared(self, plan: Plan) -> list[tuple[Request, PreparedRequest]]:
        """Each request of ``plan`` segmented (an unchanged body keeps the original's segments)."""
        originals = {t.idx: t.request for t in self.turns}
        memo = self.memo
        out: list[tuple[Request, PreparedRequest]] = []
        prev: PreparedRequest | None = None
        for r in plan.requests:
            orig = originals[r.origin]
            if r.body is orig.body:
                req = orig
            else:
                req = prepare(r.body, memo=memo, previous=prev, dialect=orig.dialect,
                              unlogged_prefix_tokens=orig.unlogged_prefix_tokens,
                              unlogged_prefix_of=orig.unlogged_prefix_of)
            out.append((r, req))
            prev = req
        return out

    def simulate(self, plan: Plan, prepared: list[tuple[Request, PreparedRequest]] | None = None) -> pd.DataFrame:
        """Per-request usage and cost of ``plan`` (the re-simulation's columns, plus ``ping``); ``prepared``:
        :meth:`prepared` of ``plan`` when the caller already has it. The same requests at the same times under the
        same cache parameters are simulated once (the memo keeps the bodies it is keyed by alive)."""
        key = (tuple(id(r.body) for r in plan.requests), tuple(r.ping for r in plan.requests),
               tuple(r.at for r in plan.requests), json.dumps(plan.cache_params, sort_keys=True),
               tuple((n, a.detail.get("system_block")) for n, a in plan.applied.items() if n in _fixes.BODY_FIXES))
        hit = self._sims.get(key)
        if hit is not None:
            return hit[1].copy()
        df = self._simulate(plan, prepared)
        self._sims[key] = ([r.body for r in plan.requests], df)
        return df.copy()

    def _simulate(self, plan: Plan, prepared: list[tuple[Request, PreparedRequest]] | None) -> pd.DataFrame:
        outputs = {t.idx: t.output_tokens for t in self.turns}
        models = {t.idx: t.model for t in self.turns}
        turns = [StoredTurn(r.origin, r.at, models[r.origin], req, 0 if r.ping else outputs[r.origin], {})
                 for r, req in (prepared if prepared is not None else self.prepared(plan))]
        df = _resimulate_turns(turns, self.row, self.cache, price_model=None, prices=None,
                               params=dict(plan.cache_params), shared=self._family_under(plan))
        df["ping"] = [r.ping for r in plan.requests]
        return df


def open_stored(lab: Lab, session_id: str) -> Session:
    """A Lab's session as the advice reads it: the open one when the Lab has it, else opened from the store."""
    return lab.active_session(session_id) or lab.session(id=session_id)


def originals(session_or_lab: Session | Lab, *, desc: str) -> Iterator[Original]:
    """A session read back (:meth:`Original.load`), or each original session of a Lab in turn (counterfactuals
    left out, one session's bodies held at a time, a progress bar by request named ``desc``); sessions with no
    request are skipped."""
    if isinstance(session_or_lab, Session):
        lab, todo = Lab.of(session_or_lab), [(session_or_lab.id, 0)]
    else:
        lab = session_or_lab
        todo = [(r["id"], int(r["requests"])) for r in lab.store.original_sessions()]
    bar = progress_bar(total=sum(n for _, n in todo), desc=desc, enabled=lab.progress and len(todo) > 1,
                       unit="req")
    try:
        for sid, n in todo:
            orig = Original.load(session_or_lab if isinstance(session_or_lab, Session) else open_stored(lab, sid))
            if orig.turns:
                yield orig
            del orig
            bar.update(n)
    finally:
        bar.close()


def _family(lab: Lab, row: dict[str, Any], turns: list[StoredTurn]) -> tuple[SharedStream, ...]:
    """The other sessions that shared ``row``'s simulated provider cache, as stored: those of its cache scope
    (``account`` for an imported session: its sub-agents, compaction calls and the account's other
    conversations read each other's entries), with the same cache model and the same parameters but for
    ``client_ttls`` (each its own client's). Only their requests within the cache's longest lifetime before this
    session's first request and up to its last can touch what it reads. Counterfactual sessions are never family."""
    scope = cache_scope_of(row)
    if scope == "session" or not turns:
        return ()
    params = {k: v for k, v in (row["config"].get("cache_params") or {}).items() if k != "client_ttls"}
    horizon = get_cache_model(row["cache_model"], **(row["config"].get("cache_params") or {})).state_horizon_seconds()
    start = turns[0].at - timedelta(seconds=horizon) if horizon is not None else None
    end = turns[-1].at
    candidates: dict[str, dict[str, Any]] = {}
    for other in lab.store.session_rows(row["cache_model"]):
        config = other["config"]
        if other["id"] == row["id"] or config.get("counterfactual_of") or cache_scope_of(other) != scope \
                or scope == "project" and other["project_id"] != row["project_id"] \
                or scope == "account" and account_of(other) != account_of(row):
            continue
        own = dict(config.get("cache_params") or {})
        if {k: v for k, v in own.items() if k != "client_ttls"} == params:
            candidates[other["id"]] = own
    # only those with a request in the window are read back (a heavy user's project holds hundreds of sessions,
    # a few of them near this one: reading every one cost 40 s of one session's advice)
    out = []
    for sid in lab.store.sessions_sending_between(list(candidates), start, end):
        near = [t for t in load_turns(lab, sid, since=start) if t.at <= end]
        if near:
            out.append(SharedStream(sid, near, candidates[sid]))
    return tuple(out)


def _minutes(gap: float) -> str:
    return f"{gap / 60:.0f} min"


def _gap_list(items: list[tuple[int, float]], limit: int = 3) -> str:
    """``the 20 min gap before request 3`` / ``3 gaps (20 min before request 3, 12 min before 9, …)``."""
    if len(items) == 1:
        return f"the {_minutes(items[0][1])} gap before request {items[0][0]}"
    shown = ", ".join(f"{_minutes(g)} before {i}" for i, g in items[:limit])
    return f"{len(items)} gaps ({shown}{', …' if len(items) > limit else ''})"


def _ttl_evidence(requests: Sequence[Request], base: pd.DataFrame, df: pd.DataFrame, choice: str, *,
                  kept: bool) -> str:
    """What drove a TTL choice, in gaps: those after which the choice reads what the TTLs as sent rebuilt (or
    the reverse), and the gaps over an hour that rebuild under any TTL."""
    gaps = [None, *((b.at - a.at).total_seconds() for a, b in zip(requests, requests[1:], strict=False))]
    before = base.cache_read_input_tokens.fillna(0).to_numpy()
    after = df.cache_read_input_tokens.fillna(0).to_numpy()
    gained = [(r.origin, g) for r, g, a, b in zip(requests, gaps, before, after, strict=True)
              if g is not None and b > a]
    lost = [(r.origin, g) for r, g, a, b in zip(requests, gaps, before, after, strict=True)
            if g is not None and b < a]
    middle = [(r.origin, g) for r, g in zip(requests, gaps, strict=True) if g is not None and 300 < g <= 3600]
    longer = [(r.origin, g) for r, g in zip(requests, gaps, strict=True) if g is not None and g > 3600]
    parts = [f"keep the TTLs as sent (the cheapest); the best other choice, {choice}" if kept else choice]
    if gained:
        parts.append(f"reads instead of rebuilding after {_gap_list(gained)}")
    if lost:
        parts.append(f"rebuilds after {_gap_list(lost)} (read as sent, for 2× writes that cost more)")
    if not middle:
        parts.append("no idle gap between 5 and 60 min: a 1h entry outlives no gap a 5m one does not")
    elif not gained and not lost:
        parts.append(f"{_gap_list(middle)} between 5 and 60 min change{'s' if len(middle) == 1 else ''} no read")
    if longer:
        parts.append(f"over 60 min, {_gap_list(longer)} rebuild{'s' if len(longer) == 1 else ''} under any TTL")
    return "; ".join(parts)


def pd_isna(value: Any) -> bool:
    return value is None or value != value  # NaN is the one value unequal to itself


def _fixes_ttls(body: dict[str, Any]) -> list[str]:
    """The TTLs of a body's markers (``5m`` when a marker names none)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            cc = value.get("cache_control")
            if isinstance(cc, dict):
                found.append(str(cc.get("ttl", "5m")))
            for k, v in value.items():
                if k != "cache_control" and isinstance(v, dict | list):
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk({k: v for k, v in body.items() if k in ("tools", "system", "messages", "cache_control")})
    return found


def resolve_fixes(fixes: Sequence[str] | str | None, strategy: str | None) -> tuple[str, ...]:
    """The fix set of ``fixes=`` or ``strategy=`` (exactly one of them)."""
    if (fixes is None) == (strategy is None):
        raise ValueError("pass fixes=[...] or strategy=... (one of them)")
    if strategy is not None:
        return _fixes.strategy_fixes(strategy)
    return _fixes.check_fixes([fixes] if isinstance(fixes, str) else list(fixes or ()))


def counterfactual(
    session: Session,
    *,
    fixes: Sequence[str] | str | None = None,
    strategy: str | None = None,
    cache: str | None = None,
) -> Session:
    """A new simulated session: ``session``'s requests with ``fixes`` applied, at the original times.

    One request per original request (plus the keep-warm pings, events ``keep_warm_ping``), whose bodies are the
    originals transformed by the fixes (:mod:`promptcache_nb.advice._fixes`), run through the session's cache
    model (or ``cache``) with the other sessions of its cache scope beside it, counted with the Lab's tokenizer
    (calibrated only where that lowers the error: :func:`~promptcache_nb.analysis.calibration_for`). Each request's
    stored usage is the original's measured usage plus the difference the fixes make in the replay
    (:mod:`._anchor`), so ``fixes=[]`` stores the measured original and ``pc.advise(s).apply(fix)`` the finding's
    own figures. Output tokens are the original's. The new session is linked: ``cf.counterfactual_of ==
    session.id``, ``cf.fixes`` the fixes applied (both kept in its config), and ``cf.config["fixes_not_possible"]``
    those the data does not support, with why (a partial log: only ``ttl``, ``keep_warm`` and ``stagger``). Every
    figure it holds is ``simulated (counterfactual)``.

    Args:
        session: a stored session (imported, live or simulated).
        fixes: fix names (``pc.advice.FIXES``), or ``strategy``: the fix set a strategy amounts to
            (``"clock_at_tail"``, ``"append_only"``, ``"durable_delta"``).
        cache: another cache model's name (default: the session's, with its parameters).

    Example:
        >>> cf = pc.counterfactual(s, fixes=["tail_volatile"])      # doctest: +SKIP
        >>> cf.turns().cost_usd.sum(), cf.config["counterfactual_of"]  # doctest: +SKIP
    """
    names = resolve_fixes(fixes, strategy)
    orig = Original.load(session, cache=cache)
    return store_counterfactual(orig, names)


def store_counterfactual(orig: Original, names: tuple[str, ...]) -> Session:
    """Store ``orig`` under ``names`` as a new session (see :func:`counterfactual`)."""
    plan = orig.plan(names)
    # the advice's own figures: the measured original plus the difference the fixes make (one computation)
    anchored = orig.anchored(plan).requests
    lab, row = orig.lab, orig.row
    store = lab.store
    n = 1
    while store.session_row(sid := f"{row['id']}-cf{n}") is not None:
        n += 1
    first_at = orig.turns[0].at if orig.turns else row["created_at"]
    config = SessionConfig(
        start=first_at, step_seconds=30, cache_params=plan.cache_params, prices=row["config"].get("prices"),
        calibration=orig.calibration, cache_scope="session", unlogged_prefix_tokens=orig.partial,
        extra={"counterfactual_of": row["id"], "fixes": list(plan.applied),
               "fixes_not_possible": dict(plan.not_possible), "fixes_asked": list(names)})
    with lab.batch():
        s = lab.create_session(config, session_id=sid, project=row["project_id"], model=row["model"],
                               cache=orig.cache, source=f"counterfactual:{row['id']}")
        outputs = {t.idx: t.output_tokens for t in orig.turns}
        for (r, req), a in zip(orig.prepared(plan), anchored, strict=True):
            usage = replace(a.usage, output_tokens=0 if r.ping else outputs[r.origin])
            s.record(r.body, at=r.at, prepared=req, events=("keep_warm_ping",) if r.ping else (),
                     usage=usage, usage_source="simulated")
    return s
