"""Lab: a DuckDB-backed workspace of sessions, and what they share.

A Lab owns the store (one connection), opens :class:`~promptcache_nb.Session` objects, and keeps what several
sessions share: the simulated provider caches (one per cache scope, rebuilt from the store when missing) and
each project's knowledge. Lab and Session are one unit split over two modules (see ``session.py``); replays
and imports run through sessions, so every request goes through the one pipeline (``pipeline.py``).
"""

from __future__ import annotations

import bisect
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import analysis as _analysis
from ._util import parse_duration, progress_bar, utc
from .analysis.limits import prompt_past_context_window
from .analysis.prices import Prices
from .cache import CacheModel, get_cache_model
from .errors import PromptCacheError, SessionError
from .live import Backend
from .request import PreparedRequest, canonical_json
from .scenario import DEFAULT_START, Restart, Scenario, ScenarioTurn, set_model_check, set_prompt_check
from .session import Session, check_texts
from .store import KnowledgeEntry, Store
from .strategies import get_strategy
from .tokens import DEFAULT_TOKENIZER, Tokenizer

if TYPE_CHECKING:  # pragma: no cover - pandas loads with the first DataFrame, not with the package
    import pandas as pd

# a scenario's models are checked when it loads, against the table Lab.session validates with
set_model_check(get_cache_model("anthropic").validate_model)
set_prompt_check(prompt_past_context_window)  # a host prompt past the model's context window: one warning

#: (scope, its owner, cache model, canonical parameters): sessions with equal keys share one simulated cache.
ScopeKey = tuple[str, str, str, str]

#: Who shares a simulated provider cache (``lab.session(cache_scope=...)``).
CACHE_SCOPES = ("session", "project", "lab")


def cache_scope_of(row: dict[str, Any]) -> str:
    """A stored session's cache scope: as configured, else ``project`` for an imported session (its sub-agents
    and compaction calls read the parent's entries) and ``session`` for a simulated one."""
    scope = row["config"].get("cache_scope")
    if scope is None:
        scope = "project" if row.get("strategy") is None else "session"
    return scope


def scope_key(scope: str, session_id: str, project_id: str, cache_model: str,
              cache_params: dict[str, Any]) -> ScopeKey:
    """(scope, its owner, cache model, parameters): sessions with equal keys share one simulated cache."""
    owner = session_id if scope == "session" else project_id if scope == "project" else ""
    return (scope, owner, cache_model, canonical_json(cache_params))


def _scope_key_of(row: dict[str, Any]) -> ScopeKey:
    """The scope key of a stored session row."""
    return scope_key(cache_scope_of(row), row["id"], row["project_id"], row["cache_model"],
                     row["config"].get("cache_params", {}))


def _session_scope_key(session: Session) -> ScopeKey:
    return scope_key(session.cache_scope, session.id, session.project, session.cache, session.cache_params)


@dataclass
class _ScopeCache:
    """A simulated provider cache shared by the sessions of one cache scope."""

    model: CacheModel
    ready: bool = False


@dataclass
class _ProjectKnowledge:
    """What the Lab keeps of a project's knowledge between changes: read from the store once, then kept up to date
    by each committed change (``Lab._knowledge_changed``); dropped whole when a rollback may have undone one."""

    entries: list[KnowledgeEntry] | None = None  #: current entries ordered by id (``Store.knowledge``); None: unread
    numbered: int | None = None  #: entries ever added, removed ones included (the next id's number); None: uncounted


_ENTRY_ID = attrgetter("id")


def _with_changes(entries: list[KnowledgeEntry], changed: Sequence[KnowledgeEntry]) -> list[KnowledgeEntry]:
    """``entries`` (current, ordered by id) with the new versions ``changed`` applied, as a new list: a list handed
    out before (``knowledge.list()``, a strategy's context) never changes under its holder."""
    if len(changed) > 8:  # many (add_many): one sort of the union beats an insertion each
        by_id = {e.id: e for e in entries}
        by_id.update((e.id, e) for e in changed)
        return sorted((e for e in by_id.values() if not e.deleted), key=_ENTRY_ID)
    out = list(entries)
    for e in changed:
        i = bisect.bisect_left(out, e.id, key=_ENTRY_ID)
        present = i < len(out) and out[i].id == e.id
        if e.deleted:
            if present:
                del out[i]
        elif present:
            out[i] = e
        else:
            out.insert(i, e)
    return out


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


@dataclass(frozen=True)
class CacheWindow:
    """Where a rebuild of a session's simulated cache starts: ``since`` (None: at its first request)."""

    since: datetime | None


class Lab:
    """A DuckDB-backed workspace of sessions. ``pc.Lab()`` (or ``pc.Lab(None)``) is in-memory;
    ``pc.Lab("runs.duckdb")`` a file.

    One Lab per file per process (hard and symbolic links included). A file that is not a promptcache_nb store
    (another application's DuckDB database, SQLite, text) is refused unchanged. ``read_only=True`` opens an
    existing store to read: it never creates or migrates the file, and every write raises StoreError.
    ``trace`` (e.g. ``print``) is called as ``trace(sql, params)`` before each SQL statement the store runs.

    Example:
        >>> import promptcache_nb as pc
        >>> with pc.Lab() as lab:
        ...     s = lab.session(system="You are terse.", project="demo")
        ...     t = s.step("hello", reply="hi")
        >>> t.index
        0
    """

    def __init__(self, path: str | Path | None = ":memory:", *, tokenizer: Tokenizer | None = None,
                 progress: bool = True, read_only: bool = False,
                 trace: Callable[[str, Any], None] | None = None) -> None:
        if path is None:
            path = ":memory:"  # "no path" (an unset setting): in memory, never a file named "None"
        elif not isinstance(path, str | os.PathLike):
            raise TypeError(f"Lab(path): a file path (str or Path) or None, got {type(path).__name__}")
        self.path: str = os.fspath(path)
        self.store = Store(self.path, read_only=read_only, trace=trace)  # trace=print: every statement, as it runs
        self.tokenizer = tokenizer or DEFAULT_TOKENIZER
        self.progress = progress
        self._knowledge_cache: dict[str, _ProjectKnowledge] = {}
        # Weak: sessions hold their Lab, never the reverse, so `del lab` (with no session left) closes the
        # file at once instead of waiting for the garbage collector to break a Lab <-> Session cycle.
        self._open: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        # The simulated provider caches, one per cache scope (scope_key): they outlive a restarted
        # Session object (a provider's cache does not restart with the agent) and are rebuilt from the store
        # when missing. Weak: the sessions using one keep it, so a Lab that ran many replays does not keep
        # every cache they built.
        self._caches: weakref.WeakValueDictionary[ScopeKey, _ScopeCache] = weakref.WeakValueDictionary()

    @property
    def read_only(self) -> bool:
        """True when opened with ``read_only=True``: reading works, every write raises StoreError."""
        return self.store.read_only

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the store (releases the file lock). Sessions of this Lab stop working."""
        for s in list(self._open.values()):
            s._close()
        self._open.clear()
        self.store.close()

    def __repr__(self) -> str:
        state = "closed" if self.store.closed else f"{self.store.session_count()} sessions"
        return f"Lab({self.path!r}, {state})"

    def _knowledge(self, project: str) -> list[KnowledgeEntry]:
        """A project's current knowledge, ordered by id: read from the store once, then kept up to date (every
        request of its sessions needs it). Treat it as read-only."""
        held = self._knowledge_cache.setdefault(project, _ProjectKnowledge())
        if held.entries is None:
            held.entries = self.store.knowledge(project)
        return held.entries

    def _knowledge_numbered(self, project: str) -> int:
        """How many entries ``project`` ever had, removed ones included: the number of the next one added."""
        held = self._knowledge_cache.setdefault(project, _ProjectKnowledge())
        if held.numbered is None:
            held.numbered = self.store.knowledge_count(project)  # one scan per project, not one per add
        return held.numbered

    def _knowledge_changed(self, project: str, changed: Sequence[KnowledgeEntry], *, added: int = 0) -> None:
        """New versions of ``project``'s entries (``added`` of them new entries) are stored: the Lab's copy follows
        them instead of reading the whole book again. A rollback drops it (``_all_or_nothing``)."""
        held = self._knowledge_cache.get(project)
        if held is None:
            return
        if held.entries is not None:
            held.entries = _with_changes(held.entries, changed)
        if held.numbered is not None:
            held.numbered += added

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
        try:
            with transaction:
                yield
        except BaseException:
            if store.commit_count == commits:  # rolled back: no object may keep what the store lost
                self._knowledge_cache.clear()
                for entry in list(self._caches.values()):
                    entry.ready = False  # simulated caches saw requests the store lost: rebuilt on next use
                for s in list(self._open.values()):
                    if s.closed:
                        continue
                    row = self.store.session_row(s.id)
                    if row is None:
                        s._close()  # created inside the block: it no longer exists
                    else:
                        s._reload(row)
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
            s._close()
        for entry in self._caches.values():
            entry.ready = False

    def sql(self, query: str, params: list | dict | None = None) -> pd.DataFrame:
        """Run SQL against the store and return a DataFrame. Tables: see README "Schema"."""
        return self.store.sql(query, params)

    def sessions(self) -> pd.DataFrame:
        """Every session of this Lab (id, project, strategy, cache model, model, creation time), oldest first."""
        return self.store.sessions_frame()

    def session(
        self,
        strategy: str = "naive",
        cache: str = "anthropic",
        model: str = "claude-sonnet-4-5",
        *,
        project: str = "default",
        system: str = "",
        tools: list[dict[str, Any]] | None = None,
        id: str | None = None,  # noqa: A002 - the README's name
        start: datetime | None = None,
        step: str | timedelta = "30s",
        backend: Backend | None = None,
        cache_params: dict[str, Any] | None = None,
        strategy_params: dict[str, Any] | None = None,
        prices: Prices | None = None,
        calibration: Any = None,
        cache_scope: str | None = None,
    ) -> Session:
        """Create a session, or resume one from the store with ``id=``.

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
                that re-sends the parent's prefix reads the parent's entries) or ``"lab"`` (every session of
                this Lab). Imported sessions default to ``"project"``.
        """
        if id is not None:
            row = self.store.session_row(id)
            if row is None:
                known = self.store.session_ids()
                raise SessionError(f"no session {id!r} in {self.path!r}; known: {', '.join(known) or '(none)'}")
            old = self._open.get(id)
            if old is not None:
                old._close()
            s = Session(self, row, backend=backend, cache_scope=cache_scope_of(row))
            self._open[id] = s
            return s
        return self._new_session(strategy, cache, model, project=project, system=system, tools=tools, start=start,
                                 step=step, backend=backend, cache_params=cache_params,
                                 strategy_params=strategy_params, prices=prices, calibration=calibration,
                                 cache_scope=cache_scope)

    def _new_session(self, strategy: str, cache: str, model: str, *, project: str, system: str,
                     tools: list[dict[str, Any]] | None, start: datetime | None, step: str | timedelta,
                     backend: Backend | None, cache_params: dict[str, Any] | None,
                     strategy_params: dict[str, Any] | None, prices: Prices | None, calibration: Any,
                     cache_scope: str | None, extra: dict[str, Any] | None = None) -> Session:
        """:meth:`session` for a new session; ``extra`` starts its state's ``extra`` (``replay``'s id
        namespace)."""
        check_texts(SessionError, "lab.session", system=system, tools=tools)
        if cache_scope is not None and cache_scope not in CACHE_SCOPES:
            raise SessionError(f"cache_scope={cache_scope!r}: use one of {', '.join(map(repr, CACHE_SCOPES))}")
        strat = get_strategy(strategy)
        strategy_params = strat.check_params(strategy_params)  # a misspelt option fails here, naming the valid ones
        cache_model = get_cache_model(cache, **(cache_params or {}))
        model = cache_model.validate_model(model)
        if prices is None:
            _analysis.default_prices(cache_model.name, model)  # fail now, not at turn 1
        start = utc(start) if start is not None else DEFAULT_START
        n = self.store.session_count() + 1
        session_id = f"s{n:03d}-{strat.name}"
        while self.store.session_row(session_id) is not None:
            n += 1
            session_id = f"s{n:03d}-{strat.name}"
        if isinstance(calibration, str):
            if calibration != "stored":
                raise SessionError(f"calibration={calibration!r}: pass a pc.analysis.Calibration or 'stored'")
            calibration = _analysis.load_calibration(self, model)
        config = {
            "calibration": None if calibration is None else {
                "model": calibration.model, "ratio": float(calibration.ratio),
                "overhead": float(calibration.overhead)},
            "start": start.isoformat(), "step_seconds": parse_duration(step).total_seconds(),
            "cache_params": cache_params or {}, "strategy_params": strategy_params,
            "cache_scope": cache_scope or "session",
            "prices": None if prices is None else {k: getattr(prices, k) for k in
                                                   ("input", "output", "cache_read", "cache_write_5m",
                                                    "cache_write_1h", "source")},
        }
        state = {"host_prompt": system, "tools": list(tools or []), "model": model, "extra": dict(extra or {})}
        store = self.store
        with store.transaction():
            store.ensure_project(project, start)
            store.create_session({"id": session_id, "project_id": project, "strategy": strat.name,
                                  "cache_model": cache_model.name, "model": model, "created_at": start,
                                  "config": config}, state)
        row = store.session_row(session_id)
        assert row is not None  # created just above, in the committed transaction
        s = Session(self, row, backend=backend, cache_scope=cache_scope_of(row))
        self._open[session_id] = s
        return s

    # -- simulated provider caches, one per cache scope ---------------------------------------
    def _scope_cache(self, session: Session) -> _ScopeCache:
        """The cache of ``session``'s scope, rebuilt from the store when the Lab holds none ready."""
        key = _session_scope_key(session)
        entry = self._caches.get(key)
        if entry is None:
            entry = self._caches[key] = _ScopeCache(get_cache_model(session.cache, **session.cache_params))
        if not entry.ready:
            self._rebuild_cache(key, entry, session)
        return entry

    def _existing_cache(self, session: Session) -> _ScopeCache | None:
        """The cache of ``session``'s scope if the Lab holds one (ready or not); never builds one."""
        return self._caches.get(_session_scope_key(session))

    def _cache_for_validation(self, session: Session) -> CacheModel:
        """A cache model of ``session``'s kind to check a model id with (the scope's, else a new one)."""
        entry = self._existing_cache(session)
        return entry.model if entry is not None else get_cache_model(session.cache, **session.cache_params)

    def _cache_window(self, session: Session, last_at: datetime) -> CacheWindow | None:
        """Where a rebuild of ``session``'s cache would start, when the Lab holds no ready cache for it and its
        scope is the session alone; None otherwise."""
        if session.cache_scope != "session":
            return None
        entry = self._existing_cache(session)
        if entry is not None and entry.ready:
            return None
        try:
            model = entry.model if entry is not None else get_cache_model(session.cache, **session.cache_params)
        except (PromptCacheError, TypeError, ValueError):
            return None  # the session still opens; its first simulated request says what is wrong
        return CacheWindow(self._rebuild_since(model, [session.id], last_at))

    def _rebuild_since(self, model: CacheModel, members: list[str], last_at: datetime | None) -> datetime | None:
        """The first request time a rebuild of ``model`` over ``members`` must replay from (None: the first
        request): after the last pause nothing survived (``state_horizon_seconds``), and within the model's
        ``replay_window_seconds`` before the last request."""
        horizon = model.state_horizon_seconds()
        since = self.store.after_last_pause(members, horizon) if horizon is not None else None
        window = model.replay_window_seconds()
        if window is not None and last_at is not None:
            cut = last_at - timedelta(seconds=window)
            since = cut if since is None else max(since, cut)
        return since

    def _drop_cache(self, session: Session) -> None:
        """``session``'s simulated cache may have seen a request the store did not keep: rebuilt on next use."""
        entry = self._existing_cache(session)
        if entry is not None:
            entry.ready = False

    def _rebuild_cache(self, key: ScopeKey, entry: _ScopeCache, session: Session) -> None:
        """Rebuild a scope's cache from the requests that can still matter (:meth:`_rebuild_since`: never from
        before a pause nothing survives, and within the model's replay window before the scope's last request;
        all of them for an LRU cache). Their bodies are rebuilt in bulk (one set of queries per session), and
        the sessions' requests are replayed in time order."""
        model = entry.model
        model.reset()
        model.forget_streams()
        if session.cache_scope == "session":
            members = [session.id]
        else:
            members = [r["id"] for r in self.store.session_rows(session.cache)
                       if _scope_key_of(r) == key]
        since = self._rebuild_since(model, members, self.store.last_request_at(members))
        requests: list[tuple[datetime, str, int, PreparedRequest]] = []
        for sid in members:
            open_ = self._open.get(sid)
            memo = open_._memo if open_ is not None and not open_.closed else None
            preloaded = None
            resume = open_._take_resume_turns() if open_ is not None else None
            if resume is not None:
                window, turns = resume
                start = window.since
                if start is None and since is None or start is not None and since is not None and start <= since:
                    preloaded = [t for t in turns if since is None or t.at >= since]
            if preloaded is None:
                preloaded = _analysis.load_turns(self, sid, since=since, memo=memo)
            requests.extend((t.at, sid, t.idx, t.request) for t in preloaded)
        if len(members) > 1:
            requests.sort(key=lambda r: r[:3])
        for at, sid, _idx, request in requests:
            model.stream(sid)
            # a stored request the model cannot simulate (an unknown model, stored with measured usage) is
            # skipped, as when it was recorded: it never breaks the session
            _analysis.simulate(model, request, at)
        entry.ready = True

    def import_log(self, paths: Any, *, format: str = "auto", project: str | None = None,  # noqa: A002
                   progress: bool | None = None) -> Any:
        """Import agent logs (Claude Code, Codex, vcr cassettes, HAR, the proxy's exchanges, OTLP JSON).

        ``paths`` is a file, a directory (walked), a glob or a list. Each session's new requests are stored in
        one transaction with their **measured** usage; importing the same file again adds only what is new.
        Returns a :class:`~promptcache_nb.ImportResult` (``.sessions``, ``.requests``, ``.skipped``).

        Example:
            >>> res = lab.import_log("~/.claude/projects/-home-me-billing")  # doctest: +SKIP
            >>> res.summary()  # doctest: +SKIP
        """
        from .importers import import_log

        show = self.progress if progress is None else progress
        return import_log(self, paths, format=format, project=project, progress=show)

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
        from .scenario import load_scenario

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
        s = self._new_session(strat.name, cache, sc.model, project=project_id, system=sc.host_prompt,
                              tools=list(sc.tools), start=sc.start, step="30s", backend=backend,
                              cache_params=cache_params, strategy_params=strategy_params, prices=None,
                              calibration=None, cache_scope=None, extra=extra)
        s.knowledge.add_many(sc.knowledge, at=sc.start)  # one transaction however many entries
        s._clear_pending_events()
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
