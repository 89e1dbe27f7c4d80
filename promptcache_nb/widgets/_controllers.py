"""Pure controllers behind the widgets: every button is a method here, usable without a kernel.

The ipywidgets views in :mod:`._views` only forward clicks to these methods and copy the resulting
:class:`TurnView` / rows into HTML. Tests and notebooks call the same methods a click calls.

Words: a stored *request* is one Messages API call (``request 7``); a *scenario turn* is one user turn of a
scenario, which sends one request, or several with a tool loop ("scenario turn 4 of 12").
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import live
from .._lazy import pandas as pd
from .._protocols import StoredSession
from ..analysis import compare_df
from ..errors import KnowledgeError, SessionError
from ..lab import Lab
from ..request import PreparedRequest, canonical_bytes
from ..request.diff import diff as _request_diff  # the function (``request.diff`` is the module)
from ..scenario import Event, KnowledgeRemove, KnowledgeUpdate, Scenario, load_scenario
from ..strategies import get_strategy, strategy_names
from ..strategies._base import KNOWLEDGE_CATEGORIES
from ..turn import on_record
from ..usage import Usage
from . import _html

if TYPE_CHECKING:  # pragma: no cover
    from ..live.otel import OtlpBatch, OtlpFollower, OtlpReceiver
    from ..session import Session
    from ..store import KnowledgeEntry
    from ..turn import Turn

Listener = Callable[[str], None]
#: ``progress(done, total)``: called after each unit of a multi-request action (the views' progress bars).
Progress = Callable[[int, int], None]
#: Entries a failed ``KnowledgeController.resolve`` names (a typo in a 100k-entry book is one line, not 100k).
RESOLVE_LISTED = 10
#: The status line once a scenario is played to its end ("Next turn" is then disabled until you type).
FINISHED = "scenario finished — type a message to continue"
#: The strategies of the side-by-side mode: the one that breaks on every edit, and the one that never does.
PAIR = ("naive", "durable_delta")


def live_session(session: Session) -> Session:
    """The session object currently open for ``session.id`` in its Lab.

    ``Session.restart()`` (a button, or a scenario ``restart`` event) closes the old object and opens a
    new one; views holding the old one follow it here instead of failing with "session was restarted".
    """
    lab = Lab.of(session)
    if lab.store.closed:
        return session
    return lab.active_session(session.id) or session


def pending_events(session: Session) -> tuple[str, ...]:
    """Event codes recorded since the last request (knowledge edits, tool changes…)."""
    return session.pending_events


def scenario_conflict(session: Session, event: Event) -> str | None:
    """Why a scenario event cannot apply to the session as the user left it (None: it can).

    A scenario updates or removes knowledge by key. In a Stepper the user may have removed that entry in
    the editor first; the scenario event is then skipped (the user's edit wins) instead of failing the turn.
    """
    if not isinstance(event, KnowledgeUpdate | KnowledgeRemove):
        return None
    book = session.knowledge
    try:
        entry = book.get(book.id_for(event.key))
    except KnowledgeError:
        return "there is no entry with that key"
    return "you removed that entry" if entry.deleted else None


def event_label(session: Session, event: Event) -> str:
    """``knowledge_update:dd2bb9e8 (fact-airflow-retries)``: the code the event would record, and its key."""
    kind = "knowledge_update" if isinstance(event, KnowledgeUpdate) else (
        "knowledge_remove" if isinstance(event, KnowledgeRemove) else type(event).__name__.lower())
    key = getattr(event, "key", None)
    if key is None:
        return kind
    try:
        short = session.knowledge.id_for(key)[:8]
    except KnowledgeError:
        return f"{kind}:{key}"
    return f"{kind}:{short} ({key})"


def _row_dict(df: pd.DataFrame, index: int) -> dict[str, Any]:
    rows = df[df["idx"] == index]
    if rows.empty:
        return {}
    rec = rows.iloc[0].to_dict()
    return {k: (None if _isna_scalar(v) else v) for k, v in rec.items()}


def _isna_scalar(v: Any) -> bool:

    if isinstance(v, list | tuple | dict | str):
        return False
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _strategies(n: int) -> str:
    return f"{n} {'strategy' if n == 1 else 'strategies'}"


@dataclass(frozen=True)
class TurnView:
    """Everything the stepper shows for one stored request (plain values plus rendered HTML parts)."""

    index: int
    at: datetime
    events: tuple[str, ...]
    user_text: str | None
    usage: Usage
    ideal_cache_read: int
    cost_usd: float | None
    cost_no_cache_usd: float | None
    cache_reason: str | None
    cache_detail: dict[str, Any]
    previous: PreparedRequest | None = field(repr=False)
    current: PreparedRequest = field(repr=False)
    segment_states: tuple[str, ...] = field(repr=False, default=())
    diff: Any = field(repr=False, default=None)
    observation: Any = field(repr=False, default=None)
    row: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def label(self) -> str:
        """``measured`` or ``simulated (estimated tokens)``."""
        return self.usage.label

    @property
    def broke(self) -> bool | None:
        """The verdict (the observation's ``broke``, else the stored row's): the request read less than it could
        have. None without usage."""
        value = getattr(self.observation, "broke", None)
        if value is None:
            value = self.row.get("broke")
        return None if value is None or _html._isna(value) else bool(value)

    @property
    def lost_tokens(self) -> int:
        """What a break sent again of what the cache held (0 when it did not break)."""
        return int(getattr(self.observation, "lost_tokens", 0) or 0)

    @property
    def explanation(self) -> str | None:
        """The observation's explanation (from the object, else the stored row)."""
        exp = getattr(self.observation, "explanation", None)
        return exp if exp is not None else self.row.get("explanation")

    def usage_html(self) -> str:
        return _html.usage_html(self.usage, ideal_cache_read=self.ideal_cache_read, cost_usd=self.cost_usd,
                                cost_no_cache_usd=self.cost_no_cache_usd, cache_reason=self.cache_reason)

    def observation_html(self) -> str:
        return _html.observation_html(self.observation, row=self.row, cache_reason=self.cache_reason,
                                      cache_detail=self.cache_detail)

    def diff_html(self) -> str:
        return _html.side_by_side_html(self.previous, self.current, diff=self.diff)

    @property
    def no_states_reason(self) -> str:
        """Why this request has no per-segment states (used only when it has none)."""
        return _html.no_states_reason(self.usage.measured)

    def segment_map_html(self) -> str:
        return _html.segment_map_html(self.current.segments, self.segment_states, why=self.no_states_reason)


class _Observable:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        #: One line saying what the last action did (the views show it under their buttons).
        self.status = ""

    def subscribe(self, fn: Listener) -> None:
        """Call ``fn(what)`` after every change (``"turn"``, ``"restart"``, ``"knowledge"``)."""
        if fn not in self._listeners:
            self._listeners.append(fn)

    def _notify(self, what: str) -> None:
        for fn in list(self._listeners):
            fn(what)


def scenario_position(scenario: Scenario, n_requests: int) -> int:
    """How many scenario turns a session with ``n_requests`` stored requests has played."""
    pos = req = 0
    while pos < len(scenario.turns) and req + 1 + len(scenario.turns[pos].tool_calls) <= n_requests:
        req += 1 + len(scenario.turns[pos].tool_calls)
        pos += 1
    return pos


class StepperController(_Observable):
    """Step a session one scenario turn at a time — or send typed text — and look back at any request.

    A scenario turn applies its events and sends its requests as one transaction (``Lab.atomic``): if
    anything fails, nothing of it is stored or left pending, and "Next turn" can simply be pressed again.
    A scenario event that conflicts with the user's own edit (updating or removing an entry the user
    removed in the editor) is skipped, and ``status`` / ``last_skipped`` say so.

    Args:
        session: the session to drive (``lab.replay(scenario, strategy=..., stop_after=0)`` gives one
            seeded with the scenario's knowledge and no requests yet).
        scenario: a :class:`~promptcache_nb.Scenario` or a YAML path; ``next()`` continues it from the
            session's position, applying each scenario turn's events first.
    """

    def __init__(self, session: Session, scenario: Scenario | str | Path | None = None) -> None:
        super().__init__()
        self._session = session
        if scenario is not None and not isinstance(scenario, Scenario):
            scenario = load_scenario(scenario)
        self.scenario: Scenario | None = scenario
        self.position = scenario_position(scenario, session.n_turns) if scenario is not None else 0
        n = session.n_turns
        self.current: int | None = n - 1 if n else None
        self._states: dict[int, tuple[str, ...]] = {}
        #: first and last request index sent by the latest ``next()`` (a tool loop sends several).
        self.last_batch: tuple[int, int] | None = None
        #: scenario events the latest ``next()`` skipped, each "code (key) — why".
        self.last_skipped: tuple[str, ...] = ()
        #: every skipped scenario event so far, in order.
        self.skipped: list[str] = []
        self._views: dict[int, TurnView] = {}
        self._quiet = False
        self._last_at: tuple[int, datetime] | None = None  # (requests stored, the last one's time)
        #: the side-by-side mode's second stepper (same scenario, another strategy), stepped in lockstep.
        self.partner: StepperController | None = None
        if self.finished:
            self.status = FINISHED

    def _previous_at(self, s: Session) -> datetime | None:
        """When the last stored request was sent (a scenario turn's clock starts there)."""
        n = s.n_turns
        if n == 0:
            return None
        if self._last_at is None or self._last_at[0] != n:  # first use, or requests sent around us
            last = s.last_turn  # a Turn rebuilt from the store: not on every click
            if last is None:
                return None
            self._last_at = (n, last.at)
        return self._last_at[1]

    # -- state ---------------------------------------------------------------------------------
    @property
    def session(self) -> Session:
        """The live session (follows restarts)."""
        self._session = live_session(self._session)
        return self._session

    @property
    def n_requests(self) -> int:
        """Requests stored in the session."""
        return self.session.n_turns

    @property
    def remaining(self) -> int:
        """Scenario turns not played yet (0 without a scenario)."""
        return 0 if self.scenario is None else len(self.scenario.turns) - self.position

    @property
    def pending(self) -> tuple[str, ...]:
        return pending_events(self.session)

    @property
    def finished(self) -> bool:
        """True once every scenario turn is played ("Next turn" then needs a typed message)."""
        return self.scenario is not None and self.remaining <= 0

    @property
    def strategy(self) -> str | None:
        """The session's strategy (None for an imported session)."""
        return self.session.strategy

    def can_next(self, user: str = "") -> bool:
        """Whether "Next turn" has something to do: a typed message, or a scenario turn left to play."""
        return bool(user.strip()) or (self.scenario is not None and not self.finished)

    def _replayed(self, strategy: str) -> StepperController:
        """A new session under ``strategy``, in the same Lab, played to this stepper's scenario position."""
        sc = self.scenario
        if sc is None:
            raise SessionError("switching strategy needs a scenario: pass scenario= to the stepper")

        get_strategy(strategy)  # an unknown name fails here, naming the registered ones
        old = self.session
        s = Lab.of(old).replay(sc, strategy=strategy, cache=old.cache, stop_after=self.position, progress=False)
        return StepperController(s, sc)

    def switch_strategy(self, strategy: str) -> Session:
        """The strategy selector: a new session under ``strategy``, replayed to the same scenario turn.

        The old session stays in the store (``lab.sessions()``); knowledge edits made in the editor stay with
        it. From here on "Next turn" plays the scenario under the new strategy, so a naive agent's cache
        break happens live on the next knowledge edit.
        """
        if self.partner is not None:
            raise SessionError("leave the side-by-side mode before switching strategy")
        if self.scenario is None:
            raise SessionError("switching strategy needs a scenario: pass scenario= to the stepper")
        if strategy == self.strategy:
            self.status = f"already playing {strategy}"
            return self.session
        before = self.strategy
        other = self._replayed(strategy)
        self._adopt(other)
        self.status = (f"switched {before} → {strategy}: a new session ({self.session.id}) replayed to "
                       f"{self._played()}; press Next turn")
        self._notify("restart")
        return self.session

    def _adopt(self, other: StepperController) -> None:
        self._session = other._session
        self.position, self.current = other.position, other.current
        self._states, self._views, self._last_at = other._states, other._views, other._last_at
        self.last_batch, self.last_skipped, self.skipped = None, (), []

    def side_by_side(self, on: bool = True) -> StepperController | None:
        """The "side by side: naive vs durable_delta" mode: this stepper plays ``naive`` and a partner plays
        ``durable_delta`` from the same scenario turn; "Next turn", typed messages and knowledge edits go to
        both. Returns the partner (None when turned off)."""
        if not on:
            self.partner = None
            self.status = f"side by side off: playing {self.strategy}"
            self._notify("restart")
            return None
        if self.partner is not None:
            return self.partner
        left, right = PAIR
        if self.strategy != left:
            self._adopt(self._replayed(left))
        self.partner = self._replayed(right)
        self.status = (f"side by side: {left} (left) and {right} (right), both at {self._played() or 'the start'}; "
                       "edit the knowledge and press Next turn to see which one breaks")
        self._notify("restart")
        return self.partner

    def _played(self) -> str:
        sc = self.scenario
        return "" if sc is None else f"scenario turn {self.position} of {len(sc.turns)}"

    # -- the buttons ---------------------------------------------------------------------------
    def next(self, user: str | None = None, reply: str | None = None) -> Turn:
        """The "Next turn" button: the next scenario turn, or ``user`` (and ``reply``) when given.

        Returns the scenario turn's last request (as ``Session.step`` does); the view shows its *first*
        request, where its events land (``last_batch`` holds both indexes).
        """
        s = self.session
        first = s.n_turns
        self.last_skipped = ()
        if user is not None and user.strip():
            try:
                t = s.step(user, reply)
            except Exception as exc:
                self.status = f"request {first} failed; nothing was stored ({type(exc).__name__})"
                raise
            what = f"sent request {first}: your message"
        else:
            t = self._scenario_turn(s, first)
            what = self.status
        if self.partner is not None:
            pt = self.partner.next(user, reply)
            what += f" · {self.partner.strategy}: request {pt.index}"
        if user is None or not user.strip():
            if self.finished:
                what += f" · {FINISHED}"
        self._states[t.index] = t.segment_states
        self._last_at = (t.index + 1, t.at)
        # A turn with tool calls sends several requests; show its first, where the user message and
        # the turn's events (knowledge edits, tool changes…) land. The slider reaches the others.
        self.current = first
        self.last_batch = (first, t.index)
        self.status = what
        if not self._quiet:
            self._notify("turn")
        return t

    def _scenario_turn(self, s: Session, first: int) -> Turn:
        sc = self.scenario
        if sc is None:
            raise SessionError("no scenario to continue: type a user message, or pass scenario= to the stepper")
        if self.remaining <= 0:
            self.status = FINISHED
            raise SessionError(f"scenario {sc.name!r}: all {len(sc.turns)} scenario turns played; {FINISHED}")
        turn = sc.turns[self.position]
        last_at = self._previous_at(s)
        at = sc.start if last_at is None else last_at + turn.after
        number = f"scenario turn {self.position + 1} of {len(sc.turns)}"
        skipped: list[str] = []
        lab = Lab.of(s)
        try:
            # its events and its requests are one transaction: a failure leaves nothing half-applied
            with lab.atomic():
                for event in turn.events:
                    why = scenario_conflict(s, event)
                    if why is not None:
                        skipped.append(f"{event_label(s, event)} — {why}")
                        continue
                    s = s.apply(event, at=at)
                t = s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
        except Exception as exc:
            self._session = live_session(self._session)
            self._views.clear()
            self.status = (f"{number} failed and changed nothing (its events were undone; press Next turn to "
                           f"retry): {type(exc).__name__}")
            raise
        self._session = s
        self.position += 1
        self.last_skipped = tuple(skipped)
        self.skipped.extend(skipped)
        sent = (f"sent request {first}" if t.index == first
                else f"sent requests {first}–{t.index} (a tool loop)")
        status = f"{number}: {sent}"
        if skipped:
            status += "; skipped scenario event " + "; ".join(skipped)
        self.status = status
        return t

    def run(self, turns: int | None = None, *, progress: Progress | None = None) -> Turn | None:
        """The "Run to end" button: play every remaining scenario turn (or ``turns`` more).

        ``progress(done, total)`` is called after each scenario turn. Stops at the first failure (that
        scenario turn changes nothing; the ones before it stay played). Returns the last request's Turn.
        """
        n = self.remaining if turns is None else max(0, min(turns, self.remaining))
        if self.scenario is None or n == 0:
            self.status = "nothing to run: the scenario is finished" if self.scenario else "no scenario to run"
            return None
        start, first_request = self.position, self.n_requests
        skipped: list[str] = []
        last = None
        self._quiet = True
        try:
            for done in range(1, n + 1):
                last = self.next()
                skipped.extend(self.last_skipped)
                if progress is not None:
                    progress(done, n)
        finally:
            self._quiet = False
            self._notify("turn")
        total = len(self.scenario.turns)
        self.last_skipped = tuple(skipped)
        self.status = (f"played scenario turns {start + 1}–{self.position} of {total}: requests "
                       f"{first_request}–{self.n_requests - 1}")
        if skipped:
            self.status += f"; skipped {_plural(len(skipped), 'scenario event')}: " + "; ".join(skipped)
        if self.finished:
            self.status += f" · {FINISHED}"
        return last

    def _probe(self) -> str:
        """A user message to build "the next request" with: the scenario's next one, else a fixed text."""
        sc = self.scenario
        if sc is not None and self.remaining > 0:
            return sc.turns[self.position].user
        return "(restart check)"

    def restart(self, *, progress: Progress | None = None) -> Session:
        """The "Restart" button: drop every in-memory object and resume from the store alone.

        Checks the claim it makes: the next request is built before and after the restart
        (``Session.preview``) and ``status`` says whether the bytes are identical.
        """
        old = self.session
        probe = self._probe()
        try:
            before: PreparedRequest | None = old.preview(probe)
        except SessionError:  # an imported session: no strategy to build a request with
            before = None
        if progress is not None:
            progress(1, 3)
        new = old.restart()
        self._session = new
        self._views.clear()
        if progress is not None:
            progress(2, 3)
        after = new.preview(probe) if before is not None else None
        if progress is not None:
            progress(3, 3)
        if before is None or after is None:
            self.status = "restarted from the store (an imported session: no next request to compare)"
        else:
            a, b = canonical_bytes(before.body), canonical_bytes(after.body)
            if a == b:
                self.status = (f"restarted from the store: next request is byte-identical ({len(b):,} bytes, "
                               "built before and after the restart)")
            else:
                where = _request_diff(before, after).path
                self.status = (f"restarted from the store, but the next request differs at {where}: the "
                               "strategy kept state outside the store (a bug worth reporting)")
        self._notify("restart")
        return new

    def show(self, index: int) -> TurnView:
        """The request slider: look back at stored request ``index`` (negative counts from the end)."""
        n = self.n_requests
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise SessionError(f"session {self.session.id!r} has requests 0..{n - 1}; there is no request {index}")
        self.current = index
        v = self.view(index)
        assert v is not None  # index is in range
        return v

    # -- reading -------------------------------------------------------------------------------
    def view(self, index: int | None = None) -> TurnView | None:
        """The :class:`TurnView` of ``index`` (default: the one on show); None before the first request."""
        index = self.current if index is None else index
        if index is None:
            return None
        cached = self._views.get(index)
        if cached is not None:
            return cached
        s = self.session
        t = s.turn(index)
        prev = s.turn(index - 1).prepared if index > 0 else None
        df = s.turns()
        v = TurnView(
            index=index, at=t.at, events=tuple(t.events),
            user_text=_row_dict(df, index).get("user_text"), usage=t.usage,
            ideal_cache_read=t.ideal_cache_read, cost_usd=t.cost_usd, cost_no_cache_usd=t.cost_no_cache_usd,
            cache_reason=t.cache_reason, cache_detail=dict(t.cache_detail or {}), previous=prev,
            current=t.prepared, segment_states=self.segment_states(index), diff=t.diff,
            observation=t.observation, row=_row_dict(df, index),
        )
        self._views[index] = v
        return v

    def segment_states(self, index: int) -> tuple[str, ...]:
        """read / write / uncached per segment of stored request ``index`` (stored with the request).

        Measured (live/imported) requests have no per-segment states unless this view stepped them.
        """
        if index not in self._states:
            self._states[index] = self.session.turn(index).segment_states
        return self._states.get(index, ())

    def turns(self) -> pd.DataFrame:
        """``session.turns()`` of the live session (the savings chart's input)."""
        return self.session.turns()

    def header_html(self) -> str:
        v = self.view()
        sc = self.scenario
        return _html.header_html(
            index=None if v is None else v.index, n_requests=self.n_requests, at=None if v is None else v.at,
            events=() if v is None else v.events, user_text=None if v is None else v.user_text,
            scenario=None if sc is None else sc.name, position=self.position,
            n_scenario=None if sc is None else len(sc.turns), pending=self.pending,
            batch=self.last_batch if v is not None and self.last_batch
            and self.last_batch[0] <= v.index <= self.last_batch[1] else None,
        )

    def __repr__(self) -> str:
        sc = "" if self.scenario is None else (f", scenario={self.scenario.name!r}, "
                                               f"played='{self.position} of {len(self.scenario.turns)}'")
        return (f"StepperController(session={self.session.id!r}, request={self.current}, "
                f"requests={self.n_requests}{sc})")


class KnowledgeController(_Observable):
    """List, add, edit and remove a session's knowledge entries; each change applies before the next request.

    Args:
        source: a :class:`~promptcache_nb.Session`, or a :class:`StepperController` (or Stepper) whose
            session it follows — then the stepper shows the pending change and, after "Next turn",
            what the strategy did with it.
    """

    def __init__(self, source: Session | StepperController | Any) -> None:
        super().__init__()
        stepper = getattr(source, "controller", source)
        if isinstance(stepper, StepperController):
            # One event bus: the stepper's. Its view re-renders "pending" on our changes, and our
            # view refreshes the list after scenario events (knowledge_add/update/remove) it plays.
            self._stepper: StepperController | None = stepper
            self._session = stepper.session
            self._listeners = stepper._listeners
        else:
            self._stepper = None
            self._session = cast("Session", source)

    @property
    def message(self) -> str:
        """What the last change did (kept for compatibility: the same text as ``status``)."""
        return self.status

    @property
    def session(self) -> Session:
        if self._stepper is not None:
            return self._stepper.session
        self._session = live_session(self._session)
        return self._session

    def entries(self) -> list[KnowledgeEntry]:
        return self.session.knowledge.list()

    def rows(self) -> list[dict[str, Any]]:
        """title, category, short id, version (and id, key, content) of every current entry (raw text)."""
        return [
            {"id": e.id, "short_id": e.short_id, "key": e.key, "title": e.title, "category": e.category,
             "version": e.version, "content": e.content}
            for e in self.entries()
        ]

    def resolve(self, entry: str) -> str:
        """An entry id from a full id, a short id (unique prefix), a scenario key or an exact title."""
        entries = self.entries()
        for e in entries:
            if entry in (e.id, e.key):
                return e.id
        by_prefix = [e for e in entries if e.id.startswith(entry)] if len(entry) >= 4 else []
        if len(by_prefix) == 1:
            return by_prefix[0].id
        by_title = [e for e in entries if e.title == entry]
        if len(by_title) == 1:
            return by_title[0].id
        # name the candidates when several match, else the current entries: the first few, never 100k of them
        several = by_prefix if len(by_prefix) > 1 else by_title if len(by_title) > 1 else []
        shown = several or entries
        known = ", ".join(f"{e.short_id} ({_html.visible(e.title)[:60]})" for e in shown[:RESOLVE_LISTED])
        if len(shown) > RESOLVE_LISTED:
            known += f", … ({len(shown):,} in all)"
        what = "entries matching it" if several else "current entries"
        raise KnowledgeError(f"no single knowledge entry matches {entry!r}; {what}: {known or '(none)'}")

    def categories(self) -> tuple[str, ...]:
        """The categories an entry may have: the known set plus those already in this book (sorted)."""
        return tuple(sorted({*KNOWLEDGE_CATEGORIES, *(e.category for e in self.entries())}))

    def check_category(self, category: str) -> str:
        """``category`` stripped, or a :class:`KnowledgeError` naming the valid ones (a typo is refused)."""

        name = category.strip()
        valid = self.categories()
        if name in valid:
            return name
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        self.status = f"unknown category {name!r}{hint}; valid categories: {', '.join(valid)}"
        raise KnowledgeError(self.status)

    def _refuse(self, message: str) -> None:
        self.status = message
        raise KnowledgeError(message)

    def _partners(self) -> list[Session]:
        st = self._stepper
        return [st.partner.session] if st is not None and st.partner is not None else []

    @staticmethod
    def _twin(session: Session, entry: KnowledgeEntry) -> str | None:
        """The id of ``entry``'s counterpart in another session's book (same scenario key, else same title)."""
        for e in session.knowledge.list():
            if (entry.key is not None and e.key == entry.key) or (entry.key is None and e.title == entry.title):
                return e.id
        return None

    def add(self, title: str, content: str, *, category: str = "note") -> str:
        """The "Add entry" button. Returns the new entry's id."""
        if not title.strip() or not content.strip():
            self._refuse("to add an entry, type its title and content (and a category), then press Add entry")
        category = self.check_category(category or "note")
        entry_id = self.session.knowledge.add(title, content, category=category)
        for other in self._partners():
            other.knowledge.add(title, content, category=category)
        self.status = f"added {entry_id[:8]} ({_html.visible(title)}); it applies before the next request"
        self._notify("knowledge")
        return entry_id

    def edit(self, entry: str, *, title: str | None = None, content: str | None = None,
             category: str | None = None) -> bool:
        """The "Save changes" button. False (and nothing written) when nothing changed."""
        if not entry:
            self._refuse("(new entry) is selected: pick the entry to change in the list, edit it, then press "
                         "Save changes (Add entry saves a new one)")
        entry_id = self.resolve(entry)
        for name, value in (("title", title), ("content", content), ("category", category)):
            if value is not None and not value.strip():
                self._refuse(f"{name} must not be empty; to drop the entry use Remove entry")
        if category is not None:
            category = self.check_category(category)
        before = self.session.knowledge.get(entry_id)
        changed = self.session.knowledge.update(entry_id, title=title, content=content, category=category)
        for other in self._partners():
            twin = self._twin(other, before)
            if twin is not None:
                other.knowledge.update(twin, title=title, content=content, category=category)
        self.status = (f"updated {entry_id[:8]}; it applies before the next request" if changed
                       else f"{entry_id[:8]} unchanged: nothing to save")
        self._notify("knowledge")
        return changed

    def remove(self, entry: str) -> None:
        """The "Remove entry" button."""
        if not entry:
            self._refuse("(new entry) is selected: pick the entry to remove in the list, then press Remove entry")
        entry_id = self.resolve(entry)
        before = self.session.knowledge.get(entry_id)
        self.session.knowledge.remove(entry_id)
        for other in self._partners():
            twin = self._twin(other, before)
            if twin is not None:
                other.knowledge.remove(twin)
        self.status = f"removed {entry_id[:8]}; it applies before the next request"
        self._notify("knowledge")

    @property
    def pending(self) -> tuple[str, ...]:
        return pending_events(self.session)

    def table_html(self) -> str:
        return _html.knowledge_table_html(self.rows(), pending=self.pending)

    def __repr__(self) -> str:
        return f"KnowledgeController(session={self.session.id!r}, entries={len(self.entries())})"


class CompareController(_Observable):
    """Step one scenario under several strategies in lockstep, and summarise them side by side.

    Args:
        scenario: a :class:`~promptcache_nb.Scenario` or a YAML path.
        strategies: strategy names (default: every registered strategy, ``pc.STRATEGIES``).
        cache: the cache model every session uses.
        lab: where the sessions live (default: a new in-memory Lab, so nothing touches a file).
    """

    def __init__(self, scenario: Scenario | str | Path, *, strategies: Iterable[str] | None = None,
                 cache: str = "anthropic", lab: Lab | None = None) -> None:
        super().__init__()

        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        self.strategies: tuple[str, ...] = tuple(strategies) if strategies is not None else strategy_names()
        if not self.strategies:
            raise SessionError("Compare needs at least one strategy")
        self.cache = cache
        self._own_lab = lab is None
        self.lab = lab if lab is not None else Lab(progress=False)
        self.steppers: dict[str, StepperController] = {}
        for name in self.strategies:
            s = self.lab.replay(self.scenario, strategy=name, cache=cache, stop_after=0, progress=False)
            self.steppers[name] = StepperController(s, self.scenario)

    @property
    def position(self) -> int:
        """Scenario turns every strategy has played."""
        return min(st.position for st in self.steppers.values())

    @property
    def remaining(self) -> int:
        return len(self.scenario.turns) - self.position

    @property
    def finished(self) -> bool:
        """True once every strategy has played every scenario turn."""
        return self.remaining <= 0

    @property
    def sessions(self) -> list[Session]:
        return [st.session for st in self.steppers.values()]

    def _check_not_finished(self) -> None:
        if self.finished:
            raise SessionError(
                f"scenario {self.scenario.name!r} is finished: every strategy has played all "
                f"{len(self.scenario.turns)} scenario turns (the table and chart are the result)")

    def next(self) -> dict[str, Turn]:
        """The "Next turn (all)" button: every strategy plays the next scenario turn."""
        self._check_not_finished()
        out = {name: st.next() for name, st in self.steppers.items()}
        sent = sum(b[1] - b[0] + 1 for b in (st.last_batch for st in self.steppers.values()) if b)
        self.status = (f"scenario turn {self.position} of {len(self.scenario.turns)}: "
                       f"{_plural(sent, 'request')} under {_strategies(len(out))}")
        self._notify("turn")
        return out

    def run(self, turns: int | None = None, *, progress: Progress | None = None) -> pd.DataFrame:
        """The "Run to end" button (or ``turns`` more); returns :meth:`summary`.

        ``progress(done, total)`` is called after each strategy's scenario turn
        (``total`` = scenario turns × strategies).
        """
        self._check_not_finished()
        start = self.position
        n = self.remaining if turns is None else max(0, min(turns, self.remaining))
        total, done = n * len(self.steppers), 0
        for _ in range(n):
            for st in self.steppers.values():
                st.next()
                done += 1
                if progress is not None:
                    progress(done, total)
        self.status = (f"played scenario turns {start + 1}–{self.position} of {len(self.scenario.turns)} under "
                       f"{_strategies(len(self.steppers))}")
        self._notify("turn")
        return self.summary()

    def summary(self) -> pd.DataFrame:
        """:func:`~promptcache_nb.compare_df` of the sessions, plus each one's last cache reason."""
        df = compare_df(self.sessions)
        last = []
        for s in self.sessions:
            t = s.turns()
            last.append(None if t.empty else t["cache_reason"].iloc[-1])
        return df.assign(last_reason=last)

    def table_html(self) -> str:
        return _html.summary_table_html(self.summary().to_dict("records"))

    def close(self) -> None:
        """Close the Lab if this controller created it."""
        if self._own_lab:
            self.lab.close()

    def __repr__(self) -> str:
        return (f"CompareController(scenario={self.scenario.name!r}, strategies={len(self.strategies)}, "
                f"cache={self.cache!r}, played='{self.position} of {len(self.scenario.turns)}')")


#: Requests the monitor's table lists (the latest ones; the totals count every request).
MONITOR_ROWS = 20


class MonitorController(_Observable):
    """The live monitor's state: one row per stored request of a session, the running totals, the latest request.

    Fed by the session's :func:`~promptcache_nb.turn.on_record` (each request stored, a capture's call as it
    finishes), so a view over it updates without polling the store; requests stored before it was made are read
    once from the store. Over an :class:`~promptcache_nb.live.OtlpReceiver` it follows every request the receiver
    stores, whatever its session (each export's rows, once committed: :meth:`add_batch`), from when it was made;
    over an :class:`~promptcache_nb.live.OtlpFollower` (or the URL of a receiver in another process, such as
    ``promptcache-nb otel STORE``), the same, polled. Works without a kernel; :meth:`html` is what the widget shows.
    """

    def __init__(self, source: Session | OtlpReceiver | OtlpFollower | str, *, follow: bool = True) -> None:
        super().__init__()

        self._lock = threading.Lock()  # a capture (or the receiver) adds from the thread that stored the request
        self.rows: list[dict[str, Any]] = []
        self.latest: Turn | None = None
        self._latest_row: dict[str, Any] | None = None  # a receiver's latest request (usage only: no body)
        self._totals = {"read": 0, "prompt": 0, "saved": 0.0, "priced": 0}
        self.session: Session | None = None
        self.receiver: OtlpReceiver | OtlpFollower | None = None
        if isinstance(source, str):  # a receiver's URL: it runs in another process, which holds the store
            follower: Any = live.OtlpFollower  # loaded on first use (live/__init__): starlette, httpx
            source = cast("OtlpFollower", follower(source))
        if not isinstance(source, StoredSession):  # an OTLP receiver: its batches, as they are stored
            self.receiver = source
            self._unsubscribe = source.subscribe(self.add_batch) if follow else None
            return
        session = source
        self.session = session
        df = session.turns()
        for row in df.to_dict("records"):
            self._add_row(_monitor_row(row))
        if len(df):
            self.latest = session.last_turn
        self._unsubscribe = on_record(session, self.add) if follow else None

    def add_batch(self, batch: OtlpBatch) -> None:
        """Take the requests one receiver export stored (what the receiver calls)."""
        if not batch.rows:
            return
        with self._lock:
            for row in batch.rows:
                self._add_row({**_monitor_row(row), "session_id": row["session_id"]})
            self._latest_row = self.rows[-1]
        self.status = f"{batch.stored} request(s) stored from {batch.signal}"
        self._notify("turn")

    def _add_row(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        t = self._totals
        t["read"] += row["read"] or 0
        t["prompt"] += (row["read"] or 0) + (row["write"] or 0) + (row["uncached"] or 0)
        if row["cost_usd"] is not None and row["cost_no_cache_usd"] is not None:
            t["saved"] += row["cost_no_cache_usd"] - row["cost_usd"]
            t["priced"] += 1

    def add(self, turn: Turn) -> None:
        """Take one newly stored request (what a capture calls)."""
        u = turn.usage
        row = _monitor_row({
            "idx": turn.index, "request_id": turn.request_id, "model": turn.request.get("model"),
            "usage_source": u.source, "cache_read_input_tokens": u.cache_read_input_tokens,
            "cache_creation_input_tokens": u.cache_creation_input_tokens, "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens, "cost_usd": turn.cost_usd, "cost_no_cache_usd": turn.cost_no_cache_usd,
            "broke": None if turn.observation is None else turn.observation.broke})
        with self._lock:
            self._add_row(row)
            self.latest = turn
        self.status = f"request {turn.index} stored"
        self._notify("turn")

    def close(self) -> None:
        """Stop following the session."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @property
    def n_requests(self) -> int:
        return len(self.rows)

    @property
    def read_pct(self) -> float | None:
        """Σ cache read / Σ prompt tokens × 100 over the requests so far (None before any)."""
        t = self._totals
        return None if not t["prompt"] else t["read"] * 100.0 / t["prompt"]

    @property
    def saved_usd(self) -> float | None:
        """Σ (cost without caching − cost) over the priced requests (None when none is priced)."""
        return self._totals["saved"] if self._totals["priced"] else None

    @property
    def following(self) -> str:
        """What it follows: ``session <id>`` or ``OTLP receiver <url>``."""
        if self.session is not None:
            return f"session {self.session.id}"
        assert self.receiver is not None
        return f"OTLP receiver {self.receiver.url if self.receiver.running else '(stopped)'}"

    @property
    def followed_repr(self) -> str:
        """``session='<id>'`` or ``receiver='<url>'``: what a repr names."""
        kind, _, name = self.following.rpartition(" ")
        return f"{'session' if self.session is not None else 'receiver'}={name!r}"

    def header_html(self) -> str:
        read = "—" if self.read_pct is None else f"{self.read_pct:.1f} %"
        breaks = sum(1 for r in self.rows if r["broke"])
        kind, _, name = self.following.rpartition(" ")
        return (f'<div style="font-size:13px"><b>live monitor</b> · {kind} <code>{_html.esc(name)}'
                f'</code> · <span data-field="requests">{self.n_requests:,}</span> requests · read '
                f'<span data-field="read_pct">{read}</span> of prompt tokens from the cache · '
                f'<span data-field="saved">{_html.fmt_usd(self.saved_usd)}</span> saved · '
                f'<span data-field="breaks">{breaks}</span> breaks</div>')

    def table_html(self) -> str:
        shown = self.rows[-MONITOR_ROWS:]
        head = ("<tr>" + "".join(f'<th style="padding:1px 6px;text-align:left">{h}</th>' for h in (
            "request", "request id", "usage", "read", "write", "uncached", "output", "cost", "break")) + "</tr>")
        body = "".join(
            "<tr>" + "".join(f'<td style="padding:1px 6px">{v}</td>' for v in (
                r["index"], _html.text_html(r["request_id"] or "—"), _html.esc(r["source"]),
                _html.fmt_int(r["read"]), _html.fmt_int(r["write"]), _html.fmt_int(r["uncached"]),
                _html.fmt_int(r["output"]), _html.fmt_usd(r["cost_usd"]), "yes" if r["broke"] else "")) + "</tr>"
            for r in shown)
        more = self.n_requests - len(shown)
        note = f'<div style="color:#777">… and {more:,} earlier</div>' if more > 0 else ""
        return f'<table class="pcnb-monitor" style="border-collapse:collapse;font-size:12px">{head}{body}</table>{note}'

    def latest_html(self) -> str:
        """The latest request's usage, prefix diff and observation ("" before any)."""
        t = self.latest
        r = self._latest_row
        if t is None and r is not None:  # a receiver's: measured usage, no body to diff
            usage = Usage(input_tokens=r["uncached"], cache_read_input_tokens=r["read"],
                          cache_creation_input_tokens=r["write"], output_tokens=r["output"], source="imported")
            return (f"<div><b>session <code>{_html.esc(r['session_id'])}</code> request {r['index']}</b></div>"
                    + _html.usage_html(usage, cost_usd=r["cost_usd"], cost_no_cache_usd=r["cost_no_cache_usd"]))
        if t is None:
            return '<div style="color:#777">no request yet: calls appear here as they finish</div>'
        previous = getattr(t.diff, "previous", None) if t.diff is not None else None
        return (f"<div><b>request {t.index}</b></div>"
                + _html.usage_html(t.usage, ideal_cache_read=t.ideal_cache_read, cost_usd=t.cost_usd,
                                   cost_no_cache_usd=t.cost_no_cache_usd)
                + _html.side_by_side_html(previous, t.prepared, diff=t.diff)
                + _html.observation_html(t.observation))

    def html(self) -> str:
        with self._lock:
            return self.header_html() + self.table_html() + self.latest_html()

    def __repr__(self) -> str:
        read = "—" if self.read_pct is None else f"{self.read_pct:.1f}%"
        return f"MonitorController({self.followed_repr}, requests={self.n_requests}, read={read})"


def _monitor_row(row: dict[str, Any]) -> dict[str, Any]:
    def value(key: str) -> Any:
        v = row.get(key)
        return None if v is None or _isna_scalar(v) else v

    def count(key: str) -> int | None:
        v = value(key)
        return None if v is None else int(v)

    cost, no_cache = value("cost_usd"), value("cost_no_cache_usd")
    return {"index": int(row["idx"]), "request_id": value("request_id"), "source": value("usage_source") or "",
            "read": count("cache_read_input_tokens"), "write": count("cache_creation_input_tokens"),
            "uncached": count("input_tokens"), "output": count("output_tokens"),
            "cost_usd": None if cost is None else float(cost),
            "cost_no_cache_usd": None if no_cache is None else float(no_cache), "broke": bool(value("broke"))}
