"""Pure controllers behind the widgets: every button is a method here, usable without a kernel.

The ipywidgets views in :mod:`._views` only forward clicks to these methods and copy the resulting
:class:`TurnView` / rows into HTML. Tests and notebooks call the same methods a click calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..analysis import compare_df
from ..errors import KnowledgeError, SessionError
from ..request import PreparedRequest
from ..scenario import Scenario, load_scenario
from ..usage import Usage
from . import _html

if TYPE_CHECKING:  # pragma: no cover
    from ..session import Lab, Session, Turn
    from ..store import KnowledgeEntry

Listener = Callable[[str], None]


def live_session(session: Session) -> Session:
    """The session object currently open for ``session.id`` in its Lab.

    ``Session.restart()`` (a button, or a scenario ``restart`` event) closes the old object and opens a
    new one; views holding the old one follow it here instead of failing with "session was restarted".
    """
    lab = session._lab
    if lab.store.closed:
        return session
    return lab.active_session(session.id) or session


def pending_events(session: Session) -> tuple[str, ...]:
    """Event codes recorded since the last request (knowledge edits, tool changes…)."""
    return session.pending_events


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

    def segment_map_html(self) -> str:
        return _html.segment_map_html(self.current.segments, self.segment_states)


class _Observable:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []

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
    """Step a session turn by turn — from a scenario or typed text — and look back at any turn.

    Args:
        session: the session to drive (``lab.replay(scenario, strategy=..., stop_after=0)`` gives one
            seeded with the scenario's knowledge and no turns yet).
        scenario: a :class:`~promptcache_nb.Scenario` or a YAML path; ``next()`` continues it from the
            session's position, applying each turn's events first.
    """

    def __init__(self, session: Session, scenario: Scenario | str | Path | None = None) -> None:
        super().__init__()
        self._session = session
        if scenario is not None and not isinstance(scenario, Scenario):
            scenario = load_scenario(scenario)
        self.scenario: Scenario | None = scenario
        self.position = scenario_position(scenario, session.n_turns) if scenario is not None else 0
        self._events_applied_for: int | None = None  # scenario turn whose events are already applied
        n = session.n_turns
        self.current: int | None = n - 1 if n else None
        self._states: dict[int, tuple[str, ...]] = {}
        #: first and last request index sent by the latest ``next()`` (a tool loop sends several).
        self.last_batch: tuple[int, int] | None = None
        self._views: dict[int, TurnView] = {}

    # -- state ---------------------------------------------------------------------------------
    @property
    def session(self) -> Session:
        """The live session (follows restarts)."""
        self._session = live_session(self._session)
        return self._session

    @property
    def n_turns(self) -> int:
        return self.session.n_turns

    @property
    def remaining(self) -> int:
        """Scenario turns not played yet (0 without a scenario)."""
        return 0 if self.scenario is None else len(self.scenario.turns) - self.position

    @property
    def pending(self) -> tuple[str, ...]:
        return pending_events(self.session)

    # -- the buttons ---------------------------------------------------------------------------
    def next(self, user: str | None = None, reply: str | None = None) -> Turn:
        """The "Next turn" button: the next scenario turn, or ``user`` (and ``reply``) when given.

        Returns the turn's last request (as ``Session.step`` does); the view shows the turn's *first*
        request, where its events land (``last_batch`` holds both indexes).
        """
        s = self.session
        first = s.n_turns
        if user is not None and user.strip():
            t = s.step(user, reply)
        else:
            if self.scenario is None:
                raise SessionError(
                    "no scenario to continue: type a user message, or pass scenario= to the stepper")
            if self.remaining <= 0:
                raise SessionError(
                    f"scenario {self.scenario.name!r} is finished ({len(self.scenario.turns)} turns); "
                    "type a user message to keep going"
                )
            turn = self.scenario.turns[self.position]
            last = s.last_turn
            at = self.scenario.start if last is None else last.at + turn.after
            # events are committed when applied; a retry after a failed step must not apply them twice
            if self._events_applied_for != self.position:
                for event in turn.events:
                    s = s.apply(event, at=at)
                self._events_applied_for = self.position
            self._session = s
            t = s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
            self.position += 1
        self._states[t.index] = t.segment_states
        # A turn with tool calls sends several requests; show its first, where the user message and
        # the turn's events (knowledge edits, tool changes…) land. The slider reaches the others.
        self.current = first
        self.last_batch = (first, t.index)
        self._notify("turn")
        return t

    def restart(self) -> Session:
        """The "Restart" button: drop every in-memory object and resume from the store alone."""
        self._session = self.session.restart()
        self._views.clear()
        self._notify("restart")
        return self._session

    def show(self, index: int) -> TurnView:
        """The turn slider: look back at stored request ``index`` (negative counts from the end)."""
        n = self.n_turns
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise SessionError(f"session {self.session.id!r} has turns 0..{n - 1}; there is no turn {index}")
        self.current = index
        return self.view(index)

    # -- reading -------------------------------------------------------------------------------
    def view(self, index: int | None = None) -> TurnView | None:
        """The :class:`TurnView` of ``index`` (default: the one on show); None before the first turn."""
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
        """read / write / uncached per segment of stored request ``index``.

        Turns rebuilt from the store carry no cache result, so for simulated sessions the session's
        cache model is replayed over the stored requests (deterministic: the same decisions again).
        Measured (live/imported) turns have no per-segment states unless this view stepped them.
        """
        if index not in self._states:
            self._states[index] = self.session.turn(index).segment_states  # stored with the turn
        return self._states.get(index, ())

    def turns(self) -> pd.DataFrame:
        """``session.turns()`` of the live session (the savings chart's input)."""
        return self.session.turns()

    def header_html(self) -> str:
        v = self.view()
        sc = self.scenario
        return _html.header_html(
            index=None if v is None else v.index, n_turns=self.n_turns, at=None if v is None else v.at,
            events=() if v is None else v.events, user_text=None if v is None else v.user_text,
            scenario=None if sc is None else sc.name, position=self.position,
            n_scenario=None if sc is None else len(sc.turns), pending=self.pending,
            batch=self.last_batch if v is not None and self.last_batch
            and self.last_batch[0] <= v.index <= self.last_batch[1] else None,
        )

    def __repr__(self) -> str:
        sc = "" if self.scenario is None else f", scenario={self.scenario.name!r}, played={self.position}"
        return (f"StepperController(session={self.session.id!r}, turn={self.current}, "
                f"n_turns={self.n_turns}{sc})")


class KnowledgeController(_Observable):
    """List, add, edit and remove a session's knowledge entries; each change applies before the next turn.

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
            self._session = source
        self.message = ""

    @property
    def session(self) -> Session:
        if self._stepper is not None:
            return self._stepper.session
        self._session = live_session(self._session)
        return self._session

    def entries(self) -> list[KnowledgeEntry]:
        return self.session.knowledge.list()

    def rows(self) -> list[dict[str, Any]]:
        """title, category, short id, version (and id, key, content) of every current entry."""
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
        known = ", ".join(f"{e.short_id} ({e.title})" for e in entries) or "(none)"
        raise KnowledgeError(f"no single knowledge entry matches {entry!r}; current entries: {known}")

    def add(self, title: str, content: str, *, category: str = "note") -> str:
        """The "Add entry" button. Returns the new entry's id."""
        entry_id = self.session.knowledge.add(title, content, category=category or "note")
        self.message = f"added {entry_id[:8]} ({title}); it applies before the next turn"
        self._notify("knowledge")
        return entry_id

    def edit(self, entry: str, *, title: str | None = None, content: str | None = None,
             category: str | None = None) -> bool:
        """The "Save changes" button. False (and nothing written) when nothing changed."""
        entry_id = self.resolve(entry)
        for name, value in (("title", title), ("content", content), ("category", category)):
            if value is not None and not value.strip():
                raise KnowledgeError(f"{name} must not be empty; to drop the entry use remove({entry!r})")
        changed = self.session.knowledge.update(entry_id, title=title, content=content, category=category)
        self.message = (f"updated {entry_id[:8]}; it applies before the next turn" if changed
                        else f"{entry_id[:8]} unchanged: nothing to save")
        self._notify("knowledge")
        return changed

    def remove(self, entry: str) -> None:
        """The "Remove entry" button."""
        entry_id = self.resolve(entry)
        self.session.knowledge.remove(entry_id)
        self.message = f"removed {entry_id[:8]}; it applies before the next turn"
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
        from ..session import Lab
        from ..strategies import strategy_names

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
        return min(st.position for st in self.steppers.values())

    @property
    def remaining(self) -> int:
        return len(self.scenario.turns) - self.position

    @property
    def sessions(self) -> list[Session]:
        return [st.session for st in self.steppers.values()]

    def next(self) -> dict[str, Turn]:
        """The "Next turn (all)" button: every strategy plays the next scenario turn."""
        out = {name: st.next() for name, st in self.steppers.items()}
        self._notify("turn")
        return out

    def run(self, turns: int | None = None) -> pd.DataFrame:
        """The "Run to end" button (or ``turns`` more); returns :meth:`summary`."""
        n = self.remaining if turns is None else min(turns, self.remaining)
        for _ in range(n):
            for st in self.steppers.values():
                st.next()
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
                f"cache={self.cache!r}, played={self.position}/{len(self.scenario.turns)})")
