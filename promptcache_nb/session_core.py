"""A session's state and how it changes: loaded from the store on first use, replaced whole once the store has a
change (:class:`~promptcache_nb.pipeline.SessionState`), and the simulated cache its requests go through.

The parts of :class:`~promptcache_nb.Session` build on :class:`SessionCore`: the request path
(``session_record.py``), the reads back (``session_views.py``), the knowledge book (``session_knowledge.py``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from . import analysis as _analysis
from ._config import DEFAULT_ACCOUNT, SessionConfig
from ._protocols import LabLike
from ._shared import (
    CacheWindow,
    ScopeCache,
    ScopeMember,
    stored_cache_scope,
)
from .analysis.prices import Prices
from .cache import CacheModel
from .errors import (
    PromptCacheError,
    SessionError,
    UnknownStrategyError,
)
from .live import Backend, DirectSimulator
from .pipeline import SessionState
from .request import PreparedRequest, SegmentMemo, prepare
from .store import Store
from .store._codecs import prefix_chain, state_columns
from .strategies import Strategy, strategy_class
from .tokens import Tokenizer, session_tokenizer

if TYPE_CHECKING:
    from ._shared import KnowledgeCache, ScopeCaches
    from .analysis.resimulate import StoredTurn


class CoreHost(LabLike, Protocol):
    """What a session's state needs of the Lab that opened it: the store and what sessions share
    (:class:`~promptcache_nb.session.SessionHost` adds reopening)."""

    @property
    def caches(self) -> ScopeCaches: ...

    @property
    def knowledge_cache(self) -> KnowledgeCache: ...


class SessionCore:
    """One agent conversation's identity, configuration and state (the base of :class:`~promptcache_nb.Session`)."""

    def __init__(self, lab: CoreHost, row: dict[str, Any], *, backend: Backend | None,
                 new_state: dict[str, Any] | None = None) -> None:
        self._lab = lab
        self.id: str = row["id"]
        self.project: str = row["project_id"]
        self.strategy: str = row["strategy"]
        self.cache: str = row["cache_model"]
        cfg = self._config = SessionConfig.from_stored(row["config"])
        # imported sessions have no strategy: their requests were built by someone else's agent; a session whose
        # strategy is not registered here (a plugin not installed) opens read-only: stepping it says why
        self._strategy: Strategy | None = None
        self._missing_strategy: UnknownStrategyError | None = None
        if self.strategy is not None:
            try:
                self._strategy = strategy_class(self.strategy).from_stored(dict(cfg.strategy_params))
            except UnknownStrategyError as exc:
                self._missing_strategy = exc
        self.source: str | None = row.get("source")
        self.parent_id: str | None = row.get("parent_id")
        self._cache_params = dict(cfg.cache_params)
        #: Which sessions share this session's simulated provider cache: ``session`` (its own), ``project``,
        #: ``account`` or ``lab`` (every session of the scope with the same cache model and parameters).
        self.cache_scope: str = stored_cache_scope(cfg.cache_scope, imported=self.strategy is None)
        #: The provider account (organisation / workspace) whose cache it used: the ``account`` scope's owner.
        self.account: str = cfg.account or DEFAULT_ACCOUNT
        self._caches = lab.caches
        self._own_options: CacheModel.Options | None = None  # in a shared cache, the options it sends under
        # the Lab's cache for that scope, held while this object lives (a restarted session keeps it)
        self._scope_entry: ScopeCache | None = self._caches.existing(self._member())
        self.backend: Backend = backend or DirectSimulator()
        self._prices = Prices(**cfg.prices) if cfg.prices else None
        self._step_gap = timedelta(seconds=cfg.step_seconds)
        self._start = cfg.start
        # an opted-in calibration scales every estimate of this session (ratio per text; docs/providers.md);
        # session_tokenizer is the one place that decides it, for every path that counts this session's requests
        self._memo = SegmentMemo(session_tokenizer(lab.tokenizer, cfg.calibration))
        self._caches.attach(self.id, self._memo)  # a rebuild of the shared cache counts this session's requests with it
        self._closed = False
        self._warned_unpriced = False
        self._warned_window = False  # a request past the model's context window was reported (once per object)
        #: The outer transaction (``Store.tx_serial``) this object moved ahead of the file in, if one did: a
        #: rollback of that transaction reloads it, and only it (``Lab._all_or_nothing``).
        self._changed_in: int | None = None
        # a session just created (``Lab.create_session``, ``new_state`` its state row) has nothing else stored:
        # its state is known without reading the store back. A stored one's is read on first use (``_state``):
        # a read the notebook asked for (``pc.rebuilds(s)``, ``s.turns()``) needs none of it, and rebuilding the
        # last request's body cost most of opening a long session.
        self._loaded: SessionState | None = None
        if new_state is None:
            self._caches.preload(self.id, None)  # nothing read yet: an earlier object's window is not this one's
        else:
            self._loaded = self._fresh(new_state)
            self._note_change()

    def _member(self) -> ScopeMember:
        """This session as its simulated cache sees it (the project may change: ``Lab.move_sessions``)."""
        return ScopeMember(self.id, self.project, self.cache_scope, self.cache, self._cache_params, self.account)

    # -- loading ------------------------------------------------------------------------------
    @property
    def _state(self) -> SessionState:
        """The session's state: read from the store on first use (:meth:`_load`), then replaced whole by each
        stored change."""
        state = self._loaded
        if state is None:
            state = self._loaded = self._load()
            self._note_change()  # read inside an outer transaction: its rollback must reload this object
        return state

    @_state.setter
    def _state(self, value: SessionState) -> None:
        self._loaded = value

    def _fresh(self, strategy_state: dict[str, Any]) -> SessionState:
        """The state :meth:`_load` reads for a session with no request, message, delta or event stored."""
        self._caches.preload(self.id, None)
        return SessionState(
            strategy_state=strategy_state, written=state_columns(strategy_state), messages=[], message_seq=0,
            built_messages=None, deltas=[], previous=None, previous_at=None, previous_keys=[], previous_nodes=[],
            observation=None, next_index=0, pending_events=())

    def _load(self) -> SessionState:
        """The session's state as the store has it."""
        store = self._lab.store
        strategy_state = store.state_row(self.id)
        messages = store.messages(self.id)
        last = store.last_turn(self.id)
        prev: PreparedRequest | None = None
        prev_at: datetime | None = None
        keys: list[str] = []
        nodes: list[str] = []
        observation: Any = None
        resume: tuple[CacheWindow, list[StoredTurn]] | None = None
        if last is not None:
            prev_at = last["sent_at"].astimezone(UTC)
            # the last request, and the last one whose cache read is known (the observation's baseline), in
            # one bulk rebuild with the session's memo: never one body query and count per request
            since = last["sent_at"]
            marks = store.usage_marks(self.id)
            if marks is not None and marks.read_idx is not None and marks.read_idx != marks.last_idx:
                read_at = store.turn_row(self.id, marks.read_idx, ("sent_at",))
                if read_at is not None:
                    since = min(since, read_at["sent_at"])
            # A session-scoped cache the Lab holds no ready copy of is rebuilt from a window before the last
            # request (ScopeCaches.get): load that window now, with the requests above, in the same queries, and
            # hand them to the Lab's caches for that rebuild.
            window = self._caches.window(self._member(), last["sent_at"])
            if window is not None:
                since = None if window.since is None else min(since, window.since)
            turns = _analysis.load_turns(self._lab, self.id, since=since, memo=self._memo)
            if window is not None:
                resume = (window, turns)
            loaded = {t.idx: t.request for t in turns}
            prev = loaded[last["idx"]]
            keys, nodes, _ = prefix_chain(prev, [], [])
            observation = _analysis.observation_state_from_store(store, self.id, requests=loaded)
        self._caches.preload(self.id, resume)
        # the history the last strategy-built request saw (StrategyContext.previous_messages)
        built = store.built_from(self.id)
        built_messages: list[dict[str, Any]] | None = None
        if built is not None:
            b_idx, b_count, later = built
            built_messages = messages[:b_count] if not later else store.history_of(self.id, b_idx, b_count)
        return SessionState(
            strategy_state=strategy_state, written=state_columns(strategy_state), messages=messages,
            message_seq=store.message_count(self.id), built_messages=built_messages, deltas=store.deltas(self.id),
            previous=prev, previous_at=prev_at, previous_keys=keys, previous_nodes=nodes, observation=observation,
            next_index=0 if last is None else last["idx"] + 1,
            pending_events=tuple(store.pending_events(self.id)),
        )

    def reload(self) -> None:
        """Back to what the store holds: ``Lab.atomic`` / ``Lab.batch`` call it when they roll back a change this
        object saw. A session the store no longer has (created inside the rolled-back block) is closed."""
        self._check_open()
        row = self._lab.store.session_row(self.id)
        if row is None:
            self.close()
            return
        self.project, self._config = row["project_id"], SessionConfig.from_stored(row["config"])
        self._loaded = None  # read again on next use, from what the store now holds
        self._caches.preload(self.id, None)  # a window read before the rollback may hold what it undid
        self._changed_in = None

    def _note_change(self) -> None:
        """Inside an outer transaction this object now holds what may yet be rolled back: note which one."""
        store = self._lab.store
        if store.in_transaction:
            self._changed_in = store.tx_serial

    def changed_in(self, tx_serial: int) -> bool:
        """True when this object took in a change of outer transaction ``tx_serial`` (``Store.tx_serial``): it
        was created, loaded or changed inside it. Its rollback must reload this object, and no other."""
        return self._changed_in == tx_serial

    def close(self) -> None:
        """Stop using this object (the stored session is unchanged; ``lab.open_session(id)`` opens it again).
        A restart, ``Lab.close`` and ``Lab.forget_session`` close it."""
        if not self._closed:
            self._closed = True
            self._caches.detach(self.id, self._memo)

    @property
    def closed(self) -> bool:
        """True once this object was restarted, or its Lab closed: open the session again with
        ``lab.open_session(id)``."""
        return self._closed

    @property
    def config(self) -> dict[str, Any]:
        """The session's stored configuration as a dict (a copy): start, step, cache and strategy parameters,
        prices, calibration, cache scope; for an imported session its format, log key and unlogged prefix. The
        typed value: :attr:`session_config`."""
        return copy.deepcopy(self._config.to_stored())

    @property
    def session_config(self) -> SessionConfig:
        """The session's stored configuration (a :class:`~promptcache_nb.SessionConfig`)."""
        return self._config

    @property
    def counterfactual_of(self) -> str | None:
        """The session this one replays with fixes applied (``pc.counterfactual``), else None."""
        value = self._config.extra.get("counterfactual_of")
        return None if value is None else str(value)

    @property
    def fixes(self) -> tuple[str, ...]:
        """The fixes a counterfactual session applied (``pc.advice.FIXES``); empty for any other session."""
        return tuple(self._config.extra.get("fixes") or ())

    @property
    def memo(self) -> SegmentMemo:
        """The session's segment memo: its tokenizer and the counts it already made (pass it to ``load_turns``
        so a stored request is not counted again). Treat it as read-only."""
        return self._memo

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer that counts this session's requests: the Lab's, calibrated when the session opted in."""
        return self._memo.tokenizer

    @property
    def model(self) -> str:
        return str(self._state.strategy_state["model"])

    @property
    def host_prompt(self) -> str:
        return str(self._state.strategy_state["host_prompt"])

    @property
    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._state.strategy_state["tools"])

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation as the agent knows it (a copy)."""
        return copy.deepcopy(self._state.messages)

    @property
    def n_turns(self) -> int:
        return self._state.next_index

    @property
    def pending_events(self) -> tuple[str, ...]:
        """Event codes recorded since the last request (knowledge edits, tool changes...)."""
        return self._state.pending_events

    @property
    def previous_request(self) -> PreparedRequest | None:
        """The last stored request, segmented with this session's tokenizer (the next request is diffed against
        it); None before the first. Treat it as read-only."""
        return self._state.previous

    @property
    def _id_namespace(self) -> dict[str, str]:
        """What generated ids (knowledge entry short ids, ``tool_use`` ids) derive from: this session's id and
        project, or, for a repeat replay of a scenario, those of its first replay (``Lab.replay``)."""
        return self._state.strategy_state["extra"].get("_id_namespace") or {}

    @property
    def cache_params(self) -> dict[str, Any]:
        """Parameters the session's cache model was created with."""
        return dict(self._cache_params)

    @property
    def prices(self) -> Prices:
        """Explicit prices, else the cache model's provider price for this session (see docs/providers.md)."""
        if self._prices is not None:
            return self._prices
        return _analysis.default_prices(self.cache, self.model)

    def prepare(self, body: dict[str, Any], *, dialect: str | None = None,
                previous: PreparedRequest | None = None, unlogged_prefix_tokens: int | None = None,
                keep_texts: bool = False, unlogged_prefix_of: str | None = None) -> PreparedRequest:
        """Segment a request body with this session's tokenizer (what :meth:`record` stores). ``previous``: the
        request before it (its equal leading segments are reused: a growing history costs only its new tail);
        ``dialect`` and ``unlogged_prefix_tokens`` as in :meth:`record`, ``unlogged_prefix_of`` (the unlogged
        prefix's identity) as in :func:`~promptcache_nb.request.prepare`; ``keep_texts`` for a request passed to
        :meth:`record` next (``prepare``'s: its new segments' JSON is not serialised again to store them)."""
        return prepare(body, memo=self._memo, previous=previous, dialect=dialect,
                       unlogged_prefix_tokens=unlogged_prefix_tokens, keep_texts=keep_texts,
                       unlogged_prefix_of=unlogged_prefix_of)

    def note_unlogged_prefix(self, tokens: int, *, of: str | None = None, read: int | None = None) -> None:
        """Store the size of the prefix (system prompt and tools) a partial log leaves out, measured once from its
        first request (measured total minus the logged part, or the size agreed for its identity): later requests,
        and later imports of the same log, are sized with it. ``of``: the prefix's identity and variant
        (``ingest/_prefixes.py``); ``read``: the first request's measured cache read, the evidence a shared
        prefix rests on. Written in the caller's transaction when there is one."""
        config = self._config.replace(unlogged_prefix_tokens=tokens, unlogged_prefix_of=of, unlogged_prefix_read=read)
        with self._lab.store.transaction():
            self._lab.store.update_session_config(self.id, config.to_stored())
        self._config = config
        self._note_change()

    def _check_open(self) -> None:
        if self._closed:
            raise SessionError(
                f"session object {self.id!r} was restarted or its Lab closed; use the object restart() "
                "returned, or lab.open_session(id)"
            )
        if self._lab.store.closed:
            raise SessionError("the Lab is closed; open it again with pc.Lab(path) and lab.open_session(id)")

    def _clock_now(self) -> datetime:
        return self._state.previous_at or self._start

    # -- changing the state: only once the store has the change ------------------------------------
    def _commit(self, write: Callable[[Store], SessionState], *, requests: bool = False,
                committed: Callable[[], None] | None = None) -> None:
        """Run ``write`` in one transaction and swap in the state it returns once the change is stored.

        Stored means: the transaction committed (also when a Ctrl-C landed right after COMMIT, which is raised
        again), or, inside an outer transaction (``Lab.atomic``, ``Lab.batch``), the write finished: that block
        reloads every open session if it rolls back. Otherwise nothing in memory changed; with ``requests``,
        the simulated cache (which saw them) is rebuilt from the store before its next use.
        """
        store = self._lab.store
        commits = store.commit_count
        done: list[SessionState] = []
        try:
            with store.transaction():
                done.append(write(store))
        except BaseException:
            if store.commit_count == commits or not done:
                if requests:
                    self._cache_stale()
                raise
            self._state = done[0]
            self._note_change()
            if committed is not None:
                committed()
            raise
        self._state = done[0]
        self._note_change()
        if committed is not None:
            committed()

    def _note_event(self, *codes: str, changes: dict[str, Any] | None = None,
                    write: Callable[[Store], None] | None = None, committed: Callable[[], None] | None = None,
                    **state_changes: Any) -> None:
        """Record events between requests: ``write`` (the change itself, e.g. knowledge rows), the state row's
        ``changes`` (``state_changes``: other :class:`SessionState` fields) and one pending-event row per code
        are one transaction; the in-memory session moves only once stored. The next request's transaction
        consumes the rows (``RequestWrite.consumes_pending_events``)."""
        cur = self._state
        values = {**cur.strategy_state, **changes} if changes else cur.strategy_state

        def run(store: Store) -> SessionState:
            if write is not None:
                write(store)
            store.add_pending_events(self.id, len(cur.pending_events), codes)
            cols = cur.written
            if changes:
                # only the columns that changed: the host prompt and tools are large and rarely change
                cols = store.write_state(self.id, values, self._clock_now(), previous=cur.written)
            return replace(cur, strategy_state=values, written=cols, pending_events=cur.pending_events + codes,
                           **state_changes)

        self._commit(run, committed=committed)

    def clear_pending_events(self) -> None:
        """Forget (and store that) the events recorded so far: they are not reported with the next request.
        ``Lab.replay`` sets a scenario's knowledge up this way."""
        cur = self._state
        if not cur.pending_events:
            return

        def run(store: Store) -> SessionState:
            store.clear_pending_events(self.id)
            return replace(cur, pending_events=())

        self._commit(run)

    # -- the cache model ----------------------------------------------------------------------
    def _cache(self) -> CacheModel:
        """The session's simulated provider cache: the Lab's instance for this session's cache scope, made
        current for this session's requests (rebuilt from the store when the Lab has none ready)."""
        member = self._member()
        entry = self._scope_entry = self._caches.get(member)  # held: the Lab keeps it only weakly
        model = entry.model
        model.stream(self.id)
        if self.cache_scope != "session":  # a shared cache: this session's requests go under its own options
            if self._own_options is None or type(self._own_options) is not type(model).Options:
                self._own_options = member.options(model)
            model.use_options(self._own_options)
        return model

    def _cache_stale(self) -> None:
        """The simulated cache may have seen a request the store did not keep: rebuild it before its next use."""
        self._caches.drop(self._member())


def check_texts(error: type[PromptCacheError], where: str, *, required: tuple[str, ...] = (),
                 **values: Any) -> None:
    """Refuse at the boundary what can be neither stored nor sent: a lone surrogate (text decoded with
    ``surrogateescape``, a broken ``\\ud83d`` JSON escape) is not UTF-8, and DuckDB and the API reject it.
    Strings, and the strings inside JSON-like values, are checked; ``None`` means "not given"."""
    for name, value in values.items():
        if value is None:
            if name in required:
                raise error(f"{where}: {name} is required")
            continue
        if not isinstance(value, str | dict | list | tuple):
            raise error(f"{where}: {name} must be a string, not {type(value).__name__}")
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise error(f"{where}: {name} contains a lone surrogate {v[exc.start]!r} at character "
                                f"{exc.start}; text must be valid Unicode (decode its source with "
                                "errors='replace')") from None
            elif isinstance(v, dict):
                stack.extend(v)
                stack.extend(v.values())
            elif isinstance(v, list | tuple):
                stack.extend(v)
