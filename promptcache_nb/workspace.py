"""Workspace: a DuckDB-backed workspace of sessions, and what they share (the :class:`~promptcache_nb.Lab` below the
writers that import into it: ``lab.py`` adds them).

A Lab owns the store (one connection), creates and opens :class:`~promptcache_nb.Session` objects
(:meth:`Lab.new_session`, :meth:`Lab.open_session`, :meth:`Lab.create_session` for the importers), and owns what
several sessions share (``_shared.py``): the simulated provider caches (one per cache scope, rebuilt from the store
when missing) and each project's knowledge. Sessions get them through the ``session.SessionHost`` protocol and
never import this module; the Lab uses only a Session's public methods. Replays and imports run through
sessions, so every request goes through the one pipeline (``pipeline.py``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Self, TypedDict, Unpack

from . import analysis as _analysis
from ._config import SessionConfig
from ._lazy import pandas as pd
from ._shared import (  # noqa: F401 - CacheWindow, ScopeKey, scope_key: re-exported from their old home
    CACHE_SCOPES,
    CacheWindow,
    KnowledgeCache,
    ScopeCaches,
    ScopeKey,
    cache_scope_of,
    scope_key,
)
from ._util import parse_duration, progress_bar, utc
from .analysis.calibrate import Calibration
from .analysis.limits import prompt_past_context_window
from .analysis.prices import Prices
from .cache import CacheModel, get_cache_model
from .errors import PromptCacheError, SessionError
from .live import Backend
from .request import canonical_json
from .scenario import DEFAULT_START, Restart, Scenario, ScenarioTurn, load_scenario, set_model_check, set_prompt_check
from .session import Session, check_texts
from .store import Store, sigint_deferred
from .store._codecs import state_columns
from .strategies import get_strategy
from .tokens import DEFAULT_TOKENIZER, Tokenizer

# a scenario's models are checked when it loads, against the table Lab.session validates with
set_model_check(get_cache_model("anthropic").validate_model)
set_prompt_check(prompt_past_context_window)  # a host prompt past the model's context window: one warning

#: Scenario turns per transaction of ``Lab.replay``: a COMMIT and the bulk writes cost a few ms each, so 100 turns
#: make them negligible; an interrupted replay loses at most that many turns.
REPLAY_CHUNK_TURNS = 100


def _reopens(turn: ScenarioTurn) -> bool:
    """The turn restarts its session, which reloads it from the store."""
    return any(isinstance(e, Restart) for e in turn.events)


def _replay_chunks(turns: Sequence[ScenarioTurn], size: int) -> Iterator[tuple[int, int]]:
    """``(first, stop)`` ranges of ``turns`` replayed as one transaction each: up to ``size`` turns, and a turn
    that :func:`_reopens` its session alone (the reload must find everything before it stored)."""
    first = 0
    while first < len(turns):
        stop = first + 1
        if not _reopens(turns[first]):
            while stop < len(turns) and stop - first < size and not _reopens(turns[stop]):
                stop += 1
        yield first, stop
        first = stop


@dataclass(frozen=True, kw_only=True)
class SessionOptions:
    """What a new session is made of: the arguments of :meth:`Workspace.new_session` (and :meth:`Workspace.session`),
    their defaults written here once. Checked when the session is created, not here.

    Example:
        >>> SessionOptions(strategy="durable_delta", system="You are terse.").model
        'claude-sonnet-4-5'
    """

    strategy: str = "naive"  #: one of ``pc.STRATEGIES``
    cache: str = "anthropic"  #: one of ``pc.CACHE_MODELS``
    model: str = "claude-sonnet-4-5"  #: the model id (validated against the cache model's table)
    project: str = "default"  #: knowledge is scoped to a project
    system: str = ""  #: the host prompt
    tools: list[dict[str, Any]] | None = None  #: tool JSON
    start: datetime | None = None  #: the session clock's first timestamp (UTC); None: the scenario default
    step: str | timedelta = "30s"  #: the default gap between turns
    backend: Backend | None = None  #: where requests go (None: the in-process simulator)
    cache_params: dict[str, Any] | None = None  #: the cache model's options
    strategy_params: dict[str, Any] | None = None  #: the strategy's options
    prices: Prices | None = None  #: explicit prices for a model genai-prices does not know
    calibration: Calibration | str | None = None  #: a ``Calibration``, or ``"stored"`` (the latest saved)
    cache_scope: str | None = None  #: who shares the simulated provider cache (None: ``"session"``)


class SessionArgs(TypedDict, total=False):
    """The keyword arguments of :meth:`Workspace.new_session` and :meth:`Workspace.session` after ``strategy``,
    ``cache`` and ``model``: the other fields of :class:`SessionOptions` (their defaults and meaning there)."""

    project: str
    system: str
    tools: list[dict[str, Any]] | None
    start: datetime | None
    step: str | timedelta
    backend: Backend | None
    cache_params: dict[str, Any] | None
    strategy_params: dict[str, Any] | None
    prices: Prices | None
    calibration: Calibration | str | None
    cache_scope: str | None


#: The arguments a stored session is compared on when ``Workspace.session(id=...)`` is given others too.
_STORED_OPTIONS = ("strategy", "cache", "model", "project")


def _checked_args(method: str, args: dict[str, Any]) -> dict[str, Any]:
    """``args``, refused as Python refuses an unknown keyword argument (``**`` takes any name at run time)."""
    unknown = sorted(set(args) - SessionArgs.__optional_keys__)
    if unknown:
        raise TypeError(f"Workspace.{method}() got an unexpected keyword argument {unknown[0]!r}")
    return args


def _signature(*, given: bool) -> inspect.Signature:
    """The signature ``help()`` and a notebook show for :meth:`Workspace.new_session` (each argument with its
    :class:`SessionOptions` default) or, ``given``, :meth:`Workspace.session` (None: omitted; and ``id``)."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for f in dataclasses.fields(SessionOptions):
        kind = (inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name in ("strategy", "cache", "model")
                else inspect.Parameter.KEYWORD_ONLY)
        annotation = f"{f.type} | None" if given and "None" not in str(f.type) else f.type
        params.append(inspect.Parameter(f.name, kind, default=None if given else f.default, annotation=annotation))
        if given and f.name == "tools":
            params.append(inspect.Parameter("id", inspect.Parameter.KEYWORD_ONLY, default=None,
                                            annotation="str | None"))
    return inspect.Signature(params, return_annotation="Session")


class Workspace:
    """What a :class:`~promptcache_nb.Lab` is below the writers that import into it (``ingest/``): the store, the
    sessions it opens and creates, and what they share. The ingest works on a Workspace (a worker process opens
    one per file group); notebooks use :class:`~promptcache_nb.Lab`, which adds ``import_log``, ``analyze`` and
    ``capture``."""

    def __init__(self, path: str | Path | None = ":memory:", *, tokenizer: Tokenizer | None = None,
                 progress: bool = True, read_only: bool = False,
                 trace: Callable[[str, Any], None] | None = None) -> None:
        if path is None:
            path = ":memory:"  # "no path" (an unset setting): in memory, never a file named "None"
        elif not isinstance(path, str | os.PathLike):
            raise TypeError(f"Lab(path): a file path (str or Path) or None, got {type(path).__name__}")
        self.path: str = os.fspath(path)
        self._setup(Store(self.path, read_only=read_only, trace=trace), tokenizer, progress)

    @classmethod
    def over_store(cls, store: Store, *, tokenizer: Tokenizer | None = None, progress: bool = True) -> Self:
        """A Lab over a store opened some other way: ``pc.fleet.open`` gives one whose tables are views over a
        Parquet dataset (read-only)."""
        lab = cls.__new__(cls)
        lab.path = store.path
        lab._setup(store, tokenizer, progress)
        return lab

    def _setup(self, store: Store, tokenizer: Tokenizer | None, progress: bool) -> None:
        self.store = store  # trace=print: every statement, as it runs
        self.tokenizer = tokenizer or DEFAULT_TOKENIZER
        self.progress = progress
        #: Each project's knowledge, read once and kept up to date (``_shared.KnowledgeCache``): handed to sessions.
        self.knowledge_cache = KnowledgeCache(self.store)
        #: The simulated provider caches, one per cache scope (``_shared.ScopeCaches``): they outlive a restarted
        #: Session object (a provider's cache does not restart with the agent) and are rebuilt from the store
        #: when missing. Handed to sessions.
        self.caches = ScopeCaches(self)
        # Weak: sessions hold their Lab, never the reverse, so `del lab` (with no session left) closes the
        # file at once instead of waiting for the garbage collector to break a Lab <-> Session cycle.
        self._open: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()

    @property
    def read_only(self) -> bool:
        """True when opened with ``read_only=True``: reading works, every write raises StoreError."""
        return self.store.read_only

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store (releases the file lock). Sessions of this Lab stop working."""
        for s in list(self._open.values()):
            s.close()
        self._open.clear()
        self.store.close()

    def __repr__(self) -> str:
        state = "closed" if self.store.closed else f"{self.store.session_count()} sessions"
        return f"{type(self).__name__}({self.path!r}, {state})"

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Several changes as one transaction: all stored, or none (the Stepper's "Next turn").

        Scenario events and the request they precede are applied inside the block. If anything raises,
        the store rolls back and every open session object reloads from it, so a failed turn changes
        nothing: no half-applied event, nothing left pending. After a ``restart`` event inside the block,
        use the session object ``apply`` returned (or ``lab.active_session(id)``).

        Example:
            >>> with lab.atomic():  # doctest: +SKIP
            ...     s.knowledge.remove(s.knowledge.id_for("tone"))
            ...     s.step("Next question")
        """
        with self._all_or_nothing(self.store.transaction()):
            yield

    @contextmanager
    def batch(self) -> Iterator[None]:
        """:meth:`atomic`, with the inserts deferred and written in bulk when the block ends
        (``Store.batch``): imports store a session's requests this way. Reads inside the block do not see the
        deferred rows."""
        with self._all_or_nothing(self.store.batch()):
            yield

    @contextmanager
    def _all_or_nothing(self, transaction: AbstractContextManager[None]) -> Iterator[None]:
        store = self.store
        commits = store.commit_count
        serial: int | None = None
        try:
            with transaction:
                serial = store.tx_serial
                yield
        except BaseException:
            # Rolled back (the transaction's exit did that before we get here): no object may keep what the
            # store lost. Only the sessions that took in a change of this transaction are reloaded; the others
            # hold what is stored, and reloading every open one made a Ctrl-C wait for reads (~0.5 s in `demo`).
            if store.commit_count == commits:
                with sigint_deferred():  # a second Ctrl-C waits: objects half reloaded would disagree with the store
                    store.ensure_rolled_back()
                    self.knowledge_cache.clear()
                    self.caches.drop_all()  # they saw requests the store lost: rebuilt on next use
                    for s in list(self._open.values()):
                        if not s.closed and serial is not None and s.changed_in(serial):
                            s.reload()  # closes itself when created inside the block (it no longer exists)
            raise

    def active_session(self, session_id: str) -> Session | None:
        """The Session object currently open for ``session_id`` (the one a restart returned), if any."""
        s = self._open.get(session_id)
        return None if s is None or s.closed else s

    def forget_session(self, session_id: str) -> None:
        """Delete a session and everything stored for it, in the current transaction; its open object is
        closed and every simulated cache is rebuilt on next use (they saw its requests). The importer uses this
        to store a session again in time order when a request that started earlier arrives late."""
        self.store.delete_session(session_id)
        s = self._open.pop(session_id, None)
        if s is not None:
            s.close()
        self.caches.drop_all()

    def sql(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> pd.DataFrame:
        """Run SQL against the store and return a DataFrame. Tables: see docs/schema.md."""
        return self.store.sql(query, params)

    def sessions(self) -> pd.DataFrame:
        """Every session of this Lab (id, project, strategy, cache model, model, creation time, ``analysed``),
        oldest first. ``analysed`` is False for a session a usage-first import stored whose bodies are not
        analysed yet (:meth:`analyze`)."""
        return self.store.sessions_frame()

    def summary(self, *, by: str | None = None) -> pd.DataFrame:
        """Every session at once, in one query: one row per session (``by`` omitted), or the measured requests
        per ``"project"``, ``"model"`` or ``"day"`` (UTC) with their measured cache read %, cost, rebuilds and
        dollars lost to them (:mod:`~promptcache_nb.analysis.rollups` for the columns).

        Example:
            >>> lab.summary()[["session", "requests", "cache_read_pct", "rebuilds", "cost_usd"]]  # doctest: +SKIP
            >>> lab.summary(by="project")                                                       # doctest: +SKIP
        """
        if by is None:
            return _analysis.session_summary(self)
        return _analysis.group_summary(self, by)

    def open_session(self, session_id: str, *, backend: Backend | None = None) -> Session:
        """A stored session, to continue it. Opening a session that is already open returns that same object
        (with ``backend``, when given, as its backend), so the object a notebook holds keeps working. What
        continuing needs (the last request rebuilt, the history) is read on first use: reading it back
        (``pc.rebuilds(s)``, ``s.turns()``) costs only those reads.

        Example:
            >>> s = lab.open_session("s001-naive")  # doctest: +SKIP
        """
        s = self.active_session(session_id)
        if s is not None:
            if backend is not None:
                s.backend = backend
            return s
        row = self.store.session_row(session_id)
        if row is None:
            known = self.store.session_ids()
            raise SessionError(f"no session {session_id!r} in {self.path!r}; known: {', '.join(known) or '(none)'}")
        s = Session(self, row, backend=backend)
        self._open[session_id] = s
        return s

    def session(self, strategy: str | None = None, cache: str | None = None, model: str | None = None, *,
                id: str | None = None, **options: Unpack[SessionArgs]) -> Session:  # noqa: A002 - the documented name
        """:meth:`new_session`, or :meth:`open_session` with ``id=`` (then every other argument but
        ``backend`` must be omitted or match the stored session: a stored session keeps its own settings).

        Example:
            >>> s = lab.session(system="You are terse.")  # doctest: +SKIP
            >>> lab.session(id=s.id) is s  # doctest: +SKIP
            True
        """
        # the arguments given (None: omitted), by SessionOptions field
        given: dict[str, Any] = {k: v for k, v in (
            ("strategy", strategy), ("cache", cache), ("model", model), *_checked_args("session", dict(options)).items()
        ) if v is not None}
        backend = given.pop("backend", None)
        if id is None:
            return self._new_session(SessionOptions(backend=backend, **given))
        s = self.open_session(id, backend=backend)
        stored = {k: getattr(s, k) for k in _STORED_OPTIONS}
        clash = [f"{k}={v!r}" for k, v in given.items() if k not in stored or v != stored[k]]
        if clash:
            raise SessionError(f"lab.session(id={id!r}, {', '.join(clash)}): a stored session keeps its own "
                               "settings; use lab.open_session(id) to continue it, lab.new_session(...) for a new one")
        return s

    def new_session(self, strategy: str = SessionOptions.strategy, cache: str = SessionOptions.cache,
                    model: str = SessionOptions.model, **options: Unpack[SessionArgs]) -> Session:
        """Create a session.

        The arguments are the fields of :class:`SessionOptions` (their defaults live there).

        Args:
            strategy: one of ``pc.STRATEGIES``.
            cache: one of ``pc.CACHE_MODELS``.
            model: the Anthropic model id (validated against the cache model's table).
            project: knowledge is scoped to a project.
            system: the host prompt. tools: Anthropic tool JSON.
            start: the session clock's first timestamp (UTC); later turns default to +``step``.
            backend: where requests go (default: the in-process simulator).
            prices: explicit prices for a model genai-prices does not know.
            calibration: opt in to a token-estimate calibration: a ``pc.analysis.Calibration``, or ``"stored"`` for
                the latest one saved in this Lab for ``model`` (``pc.calibrate(...).save(lab)``).
            cache_scope: who shares the simulated provider cache (a provider caches per workspace, not per
                conversation): ``"session"`` (the default: this session alone), ``"project"`` (every session
                of ``project`` with the same cache model and parameters: a sub-agent or a compaction call
                that re-sends the parent's prefix reads the parent's entries), ``"account"`` (every session of
                the default account with the same cache model: as the provider shares a cache across an
                organisation / workspace) or ``"lab"`` (every session of this Lab). Imported sessions are in
                the ``"account"`` scope (``import_log(account=...)``).

        Example:
            >>> s = lab.new_session("durable_delta", system="You are terse.", project="demo")  # doctest: +SKIP
        """
        return self._new_session(SessionOptions(strategy=strategy, cache=cache, model=model,
                                                **_checked_args("new_session", dict(options))))

    def _new_session(self, options: SessionOptions, *, extra: dict[str, Any] | None = None) -> Session:
        """:meth:`new_session`; ``extra`` starts its state's ``extra`` (``replay``'s id namespace)."""
        o = options
        check_texts(SessionError, "lab.session", system=o.system, tools=o.tools)
        if o.cache_scope is not None and o.cache_scope not in CACHE_SCOPES:
            raise SessionError(f"cache_scope={o.cache_scope!r}: use one of {', '.join(map(repr, CACHE_SCOPES))}")
        strat = get_strategy(o.strategy)
        strategy_params = strat.check_params(o.strategy_params)  # a misspelt option fails here, naming the valid ones
        cache_params = o.cache_params or {}
        cache_model = get_cache_model(o.cache, **cache_params)
        model = cache_model.validate_model(o.model)
        if o.prices is None:
            _analysis.default_prices(cache_model.name, model)  # fail now, not at turn 1
        start = utc(o.start) if o.start is not None else DEFAULT_START
        n = self.store.session_count() + 1
        session_id = f"s{n:03d}-{strat.name}"
        while self.store.session_row(session_id) is not None:
            n += 1
            session_id = f"s{n:03d}-{strat.name}"
        calibration = o.calibration
        if isinstance(calibration, str):
            if calibration != "stored":
                raise SessionError(f"calibration={calibration!r}: pass a pc.analysis.Calibration or 'stored'")
            calibration = _analysis.load_calibration(self, model)
        config = SessionConfig(
            start=start, step_seconds=parse_duration(o.step).total_seconds(), cache_params=cache_params,
            strategy_params=strategy_params, cache_scope=o.cache_scope or "session",
            prices=None if o.prices is None else {k: getattr(o.prices, k) for k in
                                                  ("input", "output", "cache_read", "cache_write_5m",
                                                   "cache_write_1h", "source")},
            calibration=None if calibration is None else {
                "model": calibration.model, "ratio": float(calibration.ratio),
                "overhead": float(calibration.overhead)},
        )
        return self.create_session(config, session_id=session_id, project=o.project, strategy=strat.name,
                                   cache=cache_model.name, model=model, system=o.system, tools=o.tools, extra=extra,
                                   backend=o.backend)

    def create_session(self, config: SessionConfig, *, session_id: str, project: str, model: str,
                       strategy: str | None = None, cache: str = "anthropic", system: str = "",
                       tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None,
                       source: str | None = None, parent_id: str | None = None,
                       backend: Backend | None = None, known_new: bool = False) -> Session:
        """Store a new session as given, checked no further, and open it: its row (created at ``config.start``)
        and first state, in one transaction (the caller's, when inside :meth:`atomic` / :meth:`batch`). The
        importers call it for each new imported session (``strategy`` None, ``source`` the log it came from);
        :meth:`new_session` validates its arguments, then calls it. ``known_new``: the caller has checked that no
        session has this id (an import asks once for all of its sessions), so it is not looked up again.
        """
        store = self.store
        row, state = self.store_new_session(config, session_id=session_id, project=project, model=model,
                                            strategy=strategy, cache=cache, system=system, tools=tools, extra=extra,
                                            source=source, parent_id=parent_id, known_new=known_new)
        # opened from what was just written, as the store gives it back (JSON columns parsed): not read again
        stored_row = {**row, "config": json.loads(canonical_json(row["config"]))}
        s = Session(self, stored_row, backend=backend,
                    new_state=store.state_from_row(tuple(state_columns(state).values())))
        self._open[session_id] = s
        return s

    def store_new_session(self, config: SessionConfig, *, session_id: str, project: str, model: str,
                          strategy: str | None = None, cache: str = "anthropic", system: str = "",
                          tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None,
                          source: str | None = None, parent_id: str | None = None, known_new: bool = False
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
        """:meth:`create_session` without opening it: its row and first state are written (in the caller's
        transaction, when inside one) and returned. A usage-first import stores its sessions this way: a session
        is opened (and so analysed) only when something needs it."""
        store = self.store
        if not known_new and store.session_row(session_id) is not None:
            raise SessionError(f"session {session_id!r} already exists in {self.path!r}")
        row: dict[str, Any] = {"id": session_id, "project_id": project, "strategy": strategy, "cache_model": cache,
                               "model": model, "created_at": config.start, "config": config.to_stored()}
        if source is not None or parent_id is not None:
            row.update(source=source, parent_id=parent_id)
        state = {"host_prompt": system, "tools": list(tools or []), "model": model, "extra": dict(extra or {})}
        with store.transaction():
            store.ensure_project(project, config.start)
            store.create_session(row, state)
        return row, state

    def resimulate(self, session_id: str, cache: str | CacheModel = "openai", **kwargs: Any) -> pd.DataFrame:
        """A stored session replayed under another cache model (``pc.resimulate``)."""
        return _analysis.resimulate(self, session_id, cache, **kwargs)

    def move_sessions(self, from_project: str, to_project: str) -> int:
        """Move every session of ``from_project`` (and its prompt-delta rows) to ``to_project``.

        Returns the number of sessions moved. Knowledge stays with its project (Lore's moveSessions).
        """
        store = self.store
        commits = store.commit_count
        n = 0
        try:
            n = store.move_sessions(from_project, to_project)
        finally:
            if store.commit_count != commits:  # moved (also when a Ctrl-C landed right after COMMIT)
                for s in list(self._open.values()):
                    if s.project == from_project:
                        s.project = to_project
        return n

    def replay(
        self,
        scenario: Scenario | str | Path,
        *,
        strategy: str = "naive",
        cache: str = "anthropic",
        project: str | None = None,
        backend: Backend | None = None,
        progress: bool | None = None,
        cache_params: dict[str, Any] | None = None,
        strategy_params: dict[str, Any] | None = None,
        stop_after: int | None = None,
        chunk_turns: int = REPLAY_CHUNK_TURNS,
    ) -> Session:
        """Replay a scenario under one strategy and cache model; returns the session.

        Each replay gets its own knowledge project (``<scenario project>/<strategy>``, suffixed when taken)
        so side-by-side replays never see each other's knowledge edits.

        The store is written in chunks: the events and requests of up to ``chunk_turns`` scenario turns are
        one transaction (:meth:`batch`: rows written in bulk when the chunk ends), a scenario turn is never
        split across two, and a turn with a ``restart`` event (which reopens the session from the store) is
        a transaction of its own. If the replay fails or is interrupted, the chunk it was in is rolled back
        and every earlier one stays stored; continuing the scenario from the stored position sends what an
        uninterrupted replay sends. ``chunk_turns=1`` commits every turn (as the Stepper's "Next turn").
        """
        if chunk_turns < 1:
            raise ValueError(f"chunk_turns must be at least 1, got {chunk_turns!r}")
        sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        strat = get_strategy(strategy)
        base = project or f"{sc.project}/{strat.name}"
        project_id, k = base, 1
        while self.store.project_exists(project_id):
            k += 1
            project_id = f"{base}-{k}"
        extra = None
        if project_id != base:
            # Replaying again (a re-run cell): derive generated ids from the first replay's names, so the
            # same scenario gives the same entry ids, bytes and token counts; knowledge stays separate.
            sessions = self.sessions()
            first = sessions[sessions["project_id"] == base]["id"]
            # without a first session, the new session's own id (what a missing "session" name means)
            extra = {"_id_namespace": {"project": base, **({"session": str(first.iloc[0])} if len(first) else {})}}
        # the session row and its starting knowledge commit together: a kill between them would leave a session
        # that resumes with no knowledge and sends other requests than an uninterrupted replay
        with self.atomic():
            s = self._new_session(SessionOptions(
                strategy=strat.name, cache=cache, model=sc.model, project=project_id, system=sc.host_prompt,
                tools=list(sc.tools), start=sc.start, backend=backend, cache_params=cache_params,
                strategy_params=strategy_params), extra=extra)
            s.knowledge.add_many(sc.knowledge, at=sc.start)
            s.clear_pending_events()
        show = self.progress if progress is None else progress
        played = sc.turns if stop_after is None else sc.turns[:stop_after]
        bar = progress_bar(total=sum(1 + len(t.tool_calls) for t in played), desc=f"{sc.name} · {strat.name}",
                           enabled=show, unit="req")
        at = sc.start
        i, turn = 0, played[0] if played else None
        try:
            for first, stop in _replay_chunks(played, chunk_turns):
                # a scenario turn's events and its requests are in one transaction (as the Stepper's "Next
                # turn"): a kill between an event and its request leaves neither, so continuing the scenario
                # from the stored position never applies an event twice. A restart reads the store, which
                # must hold what came before it, so its turn is not deferred.
                with self.atomic() if _reopens(played[first]) else self.batch():
                    for i in range(first, stop):
                        turn = played[i]
                        if i > 0:
                            at = at + turn.after
                        for event in turn.events:
                            s = s.apply(event, at=at)
                        t = s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
                        at = t.at
                        bar.update(1 + len(turn.tool_calls))
        except PromptCacheError as exc:
            if turn is not None and turn.line and sc.path:
                exc.args = (f"{sc.path}:{turn.line}: turns[{i}]: {exc}",)
            raise
        finally:
            bar.close()
        return s


# what help() and a notebook's signature tip show: every argument by name, with its default (``**options`` at run
# time, typed by SessionArgs for a type checker)
Workspace.new_session.__signature__ = _signature(given=False)  # type: ignore[attr-defined]
Workspace.session.__signature__ = _signature(given=True)  # type: ignore[attr-defined]
