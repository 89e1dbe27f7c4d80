"""Session: one conversation, composing each request from the stages.

A request travels: scenario event / ``step()`` → strategy (:func:`pipeline.build`) → request (segments,
hashes) → cache model or live API (usage) → :func:`pipeline.advance` (ideal read, cost, diff, observation:
a typed :class:`~promptcache_nb.RequestRecord`) → store (one transaction). The session's in-memory state is
one :class:`~promptcache_nb.pipeline.SessionState` value, swapped only once the store has the change.

:class:`~promptcache_nb.Lab` (``lab.py``) opens sessions and holds what they share (the store, the simulated
provider caches and the knowledge cache: ``_shared.py``). A Session is handed its Lab as a
:class:`SessionHost` (the store, those two shared objects, and ``open_session`` for a
restart) and never imports it; the Lab uses only a Session's public methods (``close``, ``reload``,
``clear_pending_events``).
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from . import analysis as _analysis
from . import pipeline
from ._config import DEFAULT_ACCOUNT, SessionConfig
from ._protocols import LabLike
from ._shared import (  # noqa: F401 - CACHE_SCOPES, cache_scope_of: re-exported from their old home
    CACHE_SCOPES,
    CacheWindow,
    ScopeCache,
    ScopeMember,
    cache_scope_of,
    stored_cache_scope,
)
from ._types import RequestRecord
from ._util import digest, parse_duration, user_stacklevel, utc
from .analysis import limits
from .analysis.prices import Prices
from .cache import CacheModel, CacheResult
from .dialects import get as get_format
from .dialects.anthropic import ProviderDiagnosis
from .errors import (
    APIError,
    BodyValidationError,
    InvalidRequestError,
    KnowledgeError,
    PromptCacheError,
    SessionError,
    UnknownStrategyError,
    UnpricedModelWarning,
)
from .live import Backend, DirectSimulator
from .live._base import SIMULATED_REPLY
from .pipeline import SessionState
from .request import BodyProblem, PreparedRequest, SegmentMemo, check_request, prepare, visible
from .scenario import (
    Compaction,
    Event,
    HostPromptEdit,
    KnowledgeAdd,
    KnowledgeRemove,
    KnowledgeUpdate,
    ModelSwitch,
    Restart,
    ToolsChange,
)
from .store import KnowledgeEntry, Store
from .store._codecs import prefix_chain, state_columns
from .strategies import Strategy, strategy_class
from .tokens import Tokenizer, session_tokenizer
from .turn import TURN_COLUMNS, Turn, has_record_listeners, notify_recorded  # noqa: F401 - TURN_COLUMNS re-exported
from .usage import Usage, UsageSource

if TYPE_CHECKING:
    import pandas as pd

    from ._shared import KnowledgeCache, ScopeCaches
    from .analysis.resimulate import StoredTurn

COMPACTION_HEADER = "Summary of the conversation so far:\n\n"
COMPACTION_ACK = "Understood. I have the summary and will continue from it."

#: A new knowledge entry's title, content, category and key (``KnowledgeBook`` has a method named ``list``).
_EntrySpec = tuple[str, str, str, "str | None"]
_EntrySpecs = list[_EntrySpec]
_EntryIds = list[str]


class KnowledgeBook:
    """A session's view of its project's long-term knowledge. Changes apply before the next turn."""

    def __init__(self, session: Session) -> None:
        self._s = session

    @property
    def _store(self) -> Store:
        return self._s._lab.store

    def _now(self, at: datetime | None) -> datetime:
        return utc(at) if at is not None else self._s._clock_now()

    def list(self) -> list[KnowledgeEntry]:
        """Current entries (latest version, not removed), ordered by id."""
        return self._s._lab.knowledge_cache.entries(self._s.project)

    def __len__(self) -> int:
        return len(self.list())

    def __iter__(self) -> Iterator[KnowledgeEntry]:
        return iter(self.list())

    def get(self, entry_id: str) -> KnowledgeEntry:
        e = self._store.knowledge_entry(entry_id)
        if e is None or e.project_id != self._s.project:
            raise KnowledgeError(f"no knowledge entry {entry_id!r} in project {self._s.project!r}")
        return e

    def id_for(self, key: str) -> str:
        """The entry id of a scenario key."""
        # a removed key may be added again: prefer the live entry, then the most recently updated
        matches = [e for e in self._store.knowledge(self._s.project, include_deleted=True) if e.key == key]
        if matches:
            return max(matches, key=lambda e: (not e.deleted, e.updated_at, e.version)).id
        raise KnowledgeError(f"no knowledge entry with key {key!r} in project {self._s.project!r}")

    def add(self, title: str, content: str, *, category: str = "note", key: str | None = None,
            at: datetime | None = None) -> str:
        """Add an entry; returns its id (deterministic: project + sequence + title)."""
        self._s._check_open()
        return self._add([_new_entry("knowledge.add", title, content, category, key)], at)[0]

    def add_many(self, entries: Iterable[Any], *, at: datetime | None = None) -> _EntryIds:
        """Add several entries in one transaction; returns their ids, in order.

        Each entry is a dict with ``title``, ``content`` and optionally ``category`` (default ``note``) and
        ``key``, or an object with those attributes (a :class:`~promptcache_nb.store.KnowledgeEntry`, a
        scenario's knowledge spec). The ids, rows and pending events are those of :meth:`add` called for each
        in turn, written with one bulk insert: 100,000 entries take seconds. An invalid entry adds none.
        """
        self._s._check_open()
        specs = [_entry_spec(i, e) for i, e in enumerate(entries)]
        return self._add(specs, at) if specs else []

    def _add(self, specs: _EntrySpecs, at: datetime | None) -> _EntryIds:
        """Store new entries (title, content, category, key) and their pending events in one transaction."""
        s = self._s
        project, lab = s.project, s._lab
        first = lab.knowledge_cache.numbered(project)  # counted once per project, then kept by the Lab
        ns = s._id_namespace.get("project", project)
        when = self._now(at)
        entries = [KnowledgeEntry(_entry_id(project, ns, first + i, title), project, 1, title, content, category,
                                  False, when, key) for i, (title, content, category, key) in enumerate(specs)]
        s._note_event(*(f"knowledge_add:{e.short_id}" for e in entries),
                      write=lambda store: store.write_knowledge(entries),
                      committed=lambda: lab.knowledge_cache.changed(project, entries, added=len(entries)))
        return [e.id for e in entries]

    def update(self, entry_id: str, *, title: str | None = None, content: str | None = None,
               category: str | None = None, at: datetime | None = None) -> bool:
        """Write a new version; returns False (and writes nothing) when nothing changed."""
        self._s._check_open()
        check_texts(KnowledgeError, "knowledge.update", title=title, content=content, category=category)
        cur = self.get(entry_id)
        if cur.deleted:
            raise KnowledgeError(f"knowledge entry {entry_id!r} was removed; add a new one instead")
        new = KnowledgeEntry(cur.id, cur.project_id, cur.version + 1, title if title is not None else cur.title,
                             content if content is not None else cur.content,
                             category if category is not None else cur.category, False, self._now(at), cur.key)
        if (new.title, new.content, new.category) == (cur.title, cur.content, cur.category):
            return False
        self._write(new, f"knowledge_update:{cur.short_id}")
        return True

    def remove(self, entry_id: str, *, at: datetime | None = None) -> None:
        self._s._check_open()
        cur = self.get(entry_id)
        if cur.deleted:
            raise KnowledgeError(f"knowledge entry {entry_id!r} is already removed")
        self._write(KnowledgeEntry(cur.id, cur.project_id, cur.version + 1, cur.title, cur.content,
                                   cur.category, True, self._now(at), cur.key), f"knowledge_remove:{cur.short_id}")

    def df(self) -> pd.DataFrame:
        """The current entries as a frame for reading: bidi, zero-width and control characters in the text
        columns are shown (``⟨RLO⟩``, ``↵``: :func:`~promptcache_nb.request.visible`); ``list()`` keeps
        the raw text."""
        import pandas as pd

        rows = [
            {"id": e.id, "short_id": e.short_id, "key": visible(e.key) if e.key else e.key,
             "title": visible(e.title), "category": visible(e.category), "version": e.version,
             "content": visible(e.content)}
            for e in self.list()
        ]
        return pd.DataFrame(rows, columns=["id", "short_id", "key", "title", "category", "version", "content"])

    def _write(self, entry: KnowledgeEntry, event: str) -> None:
        # the entry's new version and its pending event commit together: a kill in between keeps neither
        lab = self._s._lab
        self._s._note_event(event, write=lambda store: store.write_knowledge([entry]),
                            committed=lambda: lab.knowledge_cache.changed(entry.project_id, [entry]))

    def __repr__(self) -> str:
        return f"KnowledgeBook(project={self._s.project!r}, entries={len(self)})"


class SessionHost(LabLike, Protocol):
    """What a Session is handed by its Lab: the store, what sessions share, and reopening."""

    @property
    def caches(self) -> ScopeCaches: ...

    @property
    def knowledge_cache(self) -> KnowledgeCache: ...

    def open_session(self, session_id: str, *, backend: Backend | None = None) -> Session: ...


class Session:
    """One agent conversation under one strategy and one cache model. Create with :meth:`Lab.new_session`, continue
    a stored one with :meth:`Lab.open_session`."""

    def __init__(self, lab: SessionHost, row: dict[str, Any], *, backend: Backend | None,
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
    def lab(self) -> SessionHost:
        """The Lab this session belongs to (its store, tokenizer and path)."""
        return self._lab

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
    def knowledge(self) -> KnowledgeBook:
        """The project's long-term knowledge (a view made on access: no Session <-> book reference cycle)."""
        return KnowledgeBook(self)

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

    def _request_prices(self, model: str, usage: Usage) -> Prices | None:
        """The prices of one request, by its own model: explicit prices, else genai-prices by the exact id
        (measured usage: never a stand-in, :func:`~promptcache_nb.analysis.request_prices`). A model without an
        exact price is unpriced (its cost NULL, or the cost its provider reported), with one
        :class:`~promptcache_nb.errors.UnpricedModelWarning` per session when no cost is known — never another
        model's price."""
        prices = self._prices or _analysis.request_prices(self.cache, model, measured=usage.measured)
        if prices is None and usage.reported_cost is None and not self._warned_unpriced:
            self._warned_unpriced = True
            warnings.warn(UnpricedModelWarning(model, self.id), stacklevel=user_stacklevel())
        return prices

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

    # -- events -------------------------------------------------------------------------------
    def set_tools(self, tools: list[dict[str, Any]]) -> None:
        """Replace the tool set (an MCP reconnect)."""
        self._check_open()
        tools = copy.deepcopy(list(tools))
        check_texts(SessionError, "set_tools", required=("tools",), tools=tools)
        self._note_event("tools", changes={"tools": tools})

    def switch_model(self, model: str) -> None:
        self._check_open()
        model = self._caches.model_for_validation(self._member()).validate_model(model)
        if self._prices is None:
            _analysis.default_prices(self.cache, model)
        self._note_event(f"model_switch:{model}", changes={"model": model})

    def edit_host_prompt(self, text: str | None = None, *, append: str | None = None) -> None:
        """The host prompt file changed: a new ``text``, or ``append`` to the current one."""
        self._check_open()
        # checked before anything changes: a rejected edit leaves the session's prompt as it was
        check_texts(SessionError, "edit_host_prompt", text=text, append=append)
        new = text if text is not None else self._state.strategy_state["host_prompt"]
        if append:
            new = new + append
        self._note_event("host_prompt_edit", changes={"host_prompt": new})

    def compact(self, summary: str) -> None:
        """Replace the history by a summary (the agent's context compaction)."""
        self._check_open()
        check_texts(SessionError, "compact", required=("summary",), summary=summary)
        msgs = [
            {"role": "user", "content": [{"type": "text", "text": COMPACTION_HEADER + summary}]},
            {"role": "assistant", "content": [{"type": "text", "text": COMPACTION_ACK}]},
        ]
        seq = self._state.message_seq

        def write(store: Store) -> None:
            store.compact_messages(self.id)
            store.write_messages(self.id, self._state.next_index, [(seq, msgs[0]), (seq + 1, msgs[1])],
                                 tokenizer=self._memo.tokenizer)

        # the history rewrite and its pending "compaction" event are one transaction
        self._note_event("compaction", write=write, messages=msgs, message_seq=seq + 2)

    def restart(self) -> Session:
        """Drop every in-memory object and resume from the store alone; use the returned session."""
        self._check_open()
        self.close()
        return self._lab.open_session(self.id, backend=self.backend)

    def apply(self, event: Event, *, at: datetime | None = None) -> Session:
        """Apply one scenario event; returns the session to keep using (a new one after a restart)."""
        if isinstance(event, KnowledgeAdd):
            self.knowledge.add(event.title, event.content, category=event.category, key=event.key, at=at)
        elif isinstance(event, KnowledgeUpdate):
            self.knowledge.update(self.knowledge.id_for(event.key), title=event.title, content=event.content,
                                  category=event.category, at=at)
        elif isinstance(event, KnowledgeRemove):
            self.knowledge.remove(self.knowledge.id_for(event.key), at=at)
        elif isinstance(event, ToolsChange):
            if event.replace is not None:
                tools = list(event.replace)
            else:
                tools = [t for t in self._state.strategy_state["tools"] if t.get("name") not in set(event.remove)]
                tools += list(event.add)
            self.set_tools(tools)
        elif isinstance(event, ModelSwitch):
            self.switch_model(event.model)
        elif isinstance(event, HostPromptEdit):
            self.edit_host_prompt(event.text, append=event.append)
        elif isinstance(event, Compaction):
            self.compact(event.summary)
        elif isinstance(event, Restart):
            return self.restart()
        else:  # pragma: no cover - the Event union is closed
            raise TypeError(f"not an event: {event!r}")
        return self

    # -- requests -----------------------------------------------------------------------------
    def step(
        self,
        user: str,
        reply: str | None = None,
        *,
        at: datetime | None = None,
        tool_calls: Iterable[Any] = (),
    ) -> Turn:
        """Send the next user message (and any tool loop) and return the last request's Turn.

        Args:
            user: the user's message.
            reply: the assistant's final answer. ``None`` means "use the model's answer" (live backends);
                the simulator then answers with a fixed acknowledgement.
            at: when the user sent it (UTC). Default: previous request + the session's step gap.
            tool_calls: :class:`~promptcache_nb.scenario.ToolCall` values (or dicts with name, input,
                result): each makes the assistant call a tool and adds one more request.
        """
        self._check_open()
        self._check_strategy()
        at = self._next_at(at)
        calls = [_as_call(c) for c in tool_calls]
        check_texts(SessionError, f"turn {self._state.next_index}", required=("user",), user=user, reply=reply,
                    tool_calls=[[c.name, c.input, c.result] for c in calls])
        turns: list[Turn] = []

        def run(store: Store) -> SessionState:
            # a user turn and its tool loop are one transaction: all of its requests are stored, or none
            state = self._state
            new_msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": user}]}]
            user_text: str | None = user
            when = at
            for call in calls:
                ns = self._id_namespace.get("session", self.id)
                tool_id = "toolu_" + digest(f"{ns}/{state.next_index}".encode(), tag="tool")[:24]
                use = {"role": "assistant", "content": [
                    {"type": "tool_use", "id": tool_id, "name": call.name, "input": call.input}]}
                state = self._built_request(state, store, new_msgs, use, at=when, user_text=user_text, turns=turns)
                result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id, "content": call.result}
                if call.is_error:
                    result["is_error"] = True
                new_msgs = [{"role": "user", "content": [result]}]
                user_text = None
                when = when + call.after
            final = None if reply is None else {"role": "assistant", "content": [{"type": "text", "text": reply}]}
            stored = self._built_request(state, store, new_msgs, final, at=when, user_text=user_text, turns=turns)
            self._announce(store, turns)
            return stored

        self._commit(run, requests=True)
        self._check_context_window(turns)
        return turns[-1]

    def _announce(self, store: Store, turns: list[Turn]) -> None:
        """Tell :func:`~promptcache_nb.turn.on_record` listeners of ``turns`` once they are committed
        (inside ``Lab.atomic``: when the block commits; never when it rolls back)."""
        if has_record_listeners(self.id):
            sid = self.id
            store.on_commit(lambda: notify_recorded(sid, list(turns)))

    def _check_context_window(self, turns: list[Turn]) -> None:
        """One :class:`~promptcache_nb.errors.ContextWindowWarning` for the first stored request of this session
        object past its model's context window (measured input tokens when the usage is measured, else the
        estimate): said once, like an unpriced model, so an imported log of a 1M-context beta session is one
        warning, not one per request. After the commit: a warning turned into an error (``-W error``) never
        undoes a stored request."""
        if self._warned_window:
            return
        for t in turns:
            # stacklevel 3: counted from this method, the warning points at step()'s / record()'s caller
            if limits.check_request(t.prepared, where=f"session {self.id!r}: request {t.index}",
                                    usage=t.usage if t.usage.measured else None, stacklevel=3):
                self._warned_window = True
                return

    def _check_strategy(self) -> None:
        if self._missing_strategy is not None:
            raise SessionError(f"session {self.id!r} is read-only here: {self._missing_strategy}; install the package "
                               "that provides it (or register_strategy it) to step the session")
        if self._strategy is None:
            raise SessionError(f"session {self.id!r} was imported ({self.source}); it has no strategy to build a "
                               "request with: add requests with record(), or replay a scenario in a new session")

    def _next_at(self, at: datetime | None) -> datetime:
        prev_at = self._state.previous_at
        if at is None:
            return (prev_at + self._step_gap) if prev_at else self._start
        # a naive time is ambiguous (local? UTC?) and a string is not parsed here: one line, never a raw error
        got = None
        if not isinstance(at, datetime):
            got = f"{type(at).__name__} {at!r}"[:200]
        elif at.utcoffset() is None:
            got = f"the naive datetime {at.isoformat()}"
        else:
            try:
                at = utc(at)
            except OverflowError:  # year 1 at a positive offset has no UTC time
                got = f"{at.isoformat()}, out of range in UTC"
        if got is not None:
            raise SessionError(f"request {self._state.next_index}: at: must be a timezone-aware datetime, got {got}")
        if prev_at is not None and at < prev_at:
            raise SessionError(
                f"turn {self._state.next_index}: at={at.isoformat()} is before the previous request "
                f"({prev_at.isoformat()}); time only moves forward"
            )
        return at

    def _build(self, state: SessionState, new_msgs: list[dict[str, Any]], *, at: datetime) -> pipeline.Built:
        """The strategy's next request over the history plus ``new_msgs`` (:func:`pipeline.build`)."""
        self._check_strategy()
        assert self._strategy is not None  # checked just above
        return pipeline.build(state, self._strategy, session_id=self.id, project_id=self.project,
                              strategy_name=self.strategy, new_messages=new_msgs, at=at,
                              knowledge=self._lab.knowledge_cache.entries(self.project),
                              params=dict(self._config.strategy_params), memo=self._memo)

    def _built_request(self, state: SessionState, store: Store, new_msgs: list[dict[str, Any]],
                       reply_msg: dict[str, Any] | None, *, at: datetime, user_text: str | None,
                       turns: list[Turn]) -> SessionState:
        """One strategy-built request of a step: built, sent, stored; returns the state after it."""
        built = self._build(state, new_msgs, at=at)
        resp_content, usage, cache_result, request_id, diagnosis = self._send(state, built.prepared, at)
        # A scripted reply or tool call keeps the conversation the scenario's (and comparable across backends);
        # the endpoint's own answer is used when the caller asked for it (reply=None).
        if reply_msg is not None:
            content, history = reply_msg["content"], reply_msg["content"]
        else:
            content = resp_content if resp_content is not None else [{"type": "text", "text": SIMULATED_REPLY}]
            history = pipeline.history_reply(content)
        outcome = pipeline.Outcome(self._with_output(usage, content), cache_result, request_id, content, history,
                                   diagnosis)
        return self._store_request(state, store, built.prepared, at=at, events=list(built.events), outcome=outcome,
                                   built=built, user_text=user_text, turns=turns)

    def preview(self, user: str, *, at: datetime | None = None) -> PreparedRequest:
        """The request ``step(user)`` would send next, built by the strategy but not sent or stored.

        Nothing changes: no request, no state, no delta row. The Stepper's Restart uses it to check that a
        session resumed from the store builds the same bytes as the object it replaced.

        Example:
            >>> before = s.preview("next question").body  # doctest: +SKIP
            >>> s = s.restart()  # doctest: +SKIP
            >>> s.preview("next question").body == before  # doctest: +SKIP
            True
        """
        self._check_open()
        new = [{"role": "user", "content": [{"type": "text", "text": user}]}]
        return self._build(self._state, new, at=self._next_at(at)).prepared

    def record(self, body: dict[str, Any], *, at: datetime | None = None,
               usage: Usage | dict[str, Any] | None = None, request_id: str | None = None,
               events: Iterable[str] = (), reply: list[dict[str, Any]] | None = None,
               source_ref: str | None = None, dedupe_key: str | None = None,
               prepared: PreparedRequest | None = None, dialect: str | None = None,
               unlogged_prefix_tokens: int | None = None, usage_source: UsageSource | None = None,
               body_problems: Iterable[BodyProblem] = (), output_tokens: int | None = None,
               agent_observation: Mapping[str, Any] | None = None, latency_ms: float | None = None,
               source_span: tuple[int, int, str] | None = None,
               provider_diagnosis: ProviderDiagnosis | None = None) -> Turn:
        """Store a request produced elsewhere (a log, a proxy). With ``usage`` it is *imported*
        (measured) usage; without, the session's cache model simulates it. The strategy is not used.

        ``source_ref`` (file:line) and ``dedupe_key`` are kept per request for imports; ``prepared`` lets
        an importer pass a body it already segmented (its own dialect, unlogged prefix, shared prefix).
        ``dialect`` (``anthropic``, ``openai-chat``, ``openai-responses``; detected when omitted) and
        ``unlogged_prefix_tokens`` (a partial body's measured unlogged prefix) are passed to ``prepare``;
        a ``usage`` dict is read in the body's dialect. ``reply`` (the answer's content blocks) and ``request_id``
        are stored as given, with or without ``usage``; without them a simulated request stores the backend's.
        The body is copied; what equals the previous request's body is shared with it, so a growing history costs
        only its new tail.

        The body must follow its API's documented shape (:func:`~promptcache_nb.request.validate_request`), or a
        :class:`~promptcache_nb.errors.BodyValidationError` names the field and nothing is stored. A caller
        passing ``prepared`` vouches for the body: the importer checks it leniently itself (a log holds what was
        sent) and passes what the API would refuse as ``body_problems``, stored with the request
        (``turns.body_problems``). ``output_tokens`` sets a simulated request's output (a counterfactual keeps
        the original's: caching never changes what a model writes). ``agent_observation``: the logging agent's
        own cache observation of this request (OpenClaw's ``cache:result``), stored as
        ``cache_detail["agent_observation"]`` beside ours. ``latency_ms``: how long the live call took
        (``turns.latency_ms``), when it was timed. ``source_span``: (byte offset, length, digest) of the log line
        an imported request was read from. ``provider_diagnosis``: the provider's own diagnosis of the request's
        cache prefix, when its response carried one (``turns.provider_cache_miss_reason``).
        """
        self._check_open()
        state = self._state
        at = self._next_at(at)
        if prepared is None:
            try:
                # strict: what the API would refuse is refused here; the previous body's repeated history was
                # validated with it and is not walked again
                check_request(body, dialect, request=state.next_index, partial=unlogged_prefix_tokens is not None,
                              previous=None if state.previous is None else state.previous.body)
                prepared = prepare(body, memo=self._memo, previous=state.previous, copy=True, dialect=dialect,
                                   unlogged_prefix_tokens=unlogged_prefix_tokens, keep_texts=True)
            except BodyValidationError:
                raise
            except (ValueError, TypeError) as exc:
                raise SessionError(f"request {state.next_index}: {exc}") from None
        if usage is not None:
            # measured figures are authoritative; the cache model only predicts
            measured = self._given_usage(usage, prepared.dialect, usage_source)
            content, request_id_, cache_result = reply, request_id, self._predict(prepared, at)
        else:
            # simulated: what the backend answered (its content and request id) is what is stored, unless the caller
            # gave the answer its agent got (then its output tokens are estimated from that answer)
            content, measured, cache_result, request_id_, sent_diagnosis = self._send(state, prepared, at)
            provider_diagnosis = provider_diagnosis or sent_diagnosis
            if reply is not None:
                content, measured = reply, replace(measured, output_tokens=None)
            if output_tokens is not None:
                measured = replace(measured, output_tokens=output_tokens)
            request_id_ = request_id if request_id is not None else request_id_
        outcome = pipeline.Outcome(self._with_output(measured, content), cache_result, request_id_, content, None,
                                   provider_diagnosis)
        turns: list[Turn] = []

        def write(store: Store) -> SessionState:
            stored = self._store_request(
                state, store, prepared, at=at, events=[*state.pending_events, *events], outcome=outcome, built=None,
                user_text=None, turns=turns, source_ref=source_ref, dedupe_key=dedupe_key,
                body_problems=tuple(body_problems), agent_observation=agent_observation, latency_ms=latency_ms,
                source_span=source_span)
            self._announce(store, turns)
            return stored

        self._commit(write, requests=True)
        self._check_context_window(turns)
        return turns[-1]

    def _given_usage(self, usage: Usage | dict[str, Any], dialect: str, source: UsageSource | None) -> Usage:
        """Measured usage passed to :meth:`record`, read in the body's dialect. Every count is checked (an int in
        ``0..MAX_TOKENS``, a 5m/1h split no larger than its total), a Usage built by hand too: a bad one is a
        one-line SessionError naming the field, before anything reaches the price library or the store."""
        try:
            if isinstance(usage, Usage):
                given = usage.check()
            else:
                given = get_format(dialect).usage(usage, source="imported")
        except ValueError as exc:
            raise SessionError(f"request {self._state.next_index}: {exc}") from None
        if source is not None:  # e.g. a proxy log of our own simulator: simulated
            return given if given.source == source else given.with_source(source)
        return given.with_source("imported") if given.source == "simulated" else given

    def _predict(self, prepared: PreparedRequest, at: datetime) -> CacheResult | None:
        """What the cache model predicts for a request whose usage was measured (the figures stay measured)."""
        cache = self._cache()
        try:
            return cache.process(prepared, at).as_prediction()
        except PromptCacheError:
            # e.g. a model the cache model's table lacks (Claude Code's "<synthetic>"): no prediction; cache
            # models raise before changing state, so the simulated cache goes on unchanged
            return None
        except BaseException:
            self._cache_stale()
            raise

    def _send(self, state: SessionState, prepared: PreparedRequest, at: datetime
              ) -> tuple[list[dict[str, Any]] | None, Usage, CacheResult | None, str | None, ProviderDiagnosis | None]:
        """Send a request through the backend: (reply content, usage, cache result, request id, the provider's
        diagnosis of its cache prefix)."""
        cache = self._cache()
        try:
            resp = self.backend.send(prepared, at=at, cache=cache)
        except APIError as exc:
            self._cache_stale()
            if exc.turn is None:
                raise exc.at_turn(state.next_index) from None
            raise
        except BaseException:
            self._cache_stale()  # the simulated cache may have moved; rebuild it from the store
            raise
        return resp.content, resp.usage, resp.cache_result, resp.request_id, resp.provider_diagnosis

    def _with_output(self, usage: Usage, content: list[dict[str, Any]] | None) -> Usage:
        """Usage with the reply's output tokens estimated when the endpoint did not report them."""
        if usage.output_tokens is not None or content is None:
            return usage
        return replace(usage, output_tokens=pipeline.reply_output_tokens(content, self._lab.tokenizer))

    def _ideal_inputs(self, state: SessionState, prepared: PreparedRequest) -> tuple[list[tuple[int, float]] | None,
                                                                                        int]:
        """The cache model's figures the ideal read needs: the previous request's retention points (None: no
        previous request) and the minimum cacheable length for this request's model."""
        cache = self._cache()
        points = None
        prev = state.previous
        if prev is not None and state.previous_at is not None:
            try:
                points = cache.retention_points(prev)
            except InvalidRequestError:
                points = [(prev.total_tokens, 300.0)]
        try:
            minimum = cache.min_cacheable_tokens(prepared.model)
        except PromptCacheError:
            minimum = 0
        return points, minimum

    def _store_request(self, state: SessionState, store: Store, prepared: PreparedRequest, *, at: datetime,
                       events: list[str], outcome: pipeline.Outcome, built: pipeline.Built | None,
                       user_text: str | None, turns: list[Turn], source_ref: str | None = None,
                       dedupe_key: str | None = None, body_problems: tuple[BodyProblem, ...] = (),
                       agent_observation: Mapping[str, Any] | None = None,
                       latency_ms: float | None = None,
                       source_span: tuple[int, int, str] | None = None) -> SessionState:
        """The pipeline's record of a sent request, written to the store; returns the state after it (the
        caller swaps it in once stored) and appends the request's Turn to ``turns``."""
        points, minimum = self._ideal_inputs(state, prepared)
        step = pipeline.advance(
            state, session_id=self.id, project_id=self.project, prepared=prepared, at=at, events=events,
            outcome=outcome, built=built, user_text=user_text, prices=self._priced(prepared.model, outcome.usage),
            retention_points=points, minimum=minimum,
            transport="direct" if isinstance(self.backend, DirectSimulator) else "http",
            source_ref=source_ref, dedupe_key=dedupe_key, body_problems=body_problems,
            agent_observation=agent_observation, latency_ms=latency_ms, source_span=source_span,
        )
        store.write_request(step.write, tokenizer=self._memo)
        rec, analysis, cache_result = step.record, step.analysis, outcome.cache_result
        turns.append(Turn(
            session_id=self.id, index=rec.idx, at=at, request=prepared.body, usage=step.usage,
            ideal_cache_read=rec.ideal_cache_read or 0, total_tokens=rec.total_tokens or 0, cost_usd=rec.cost_usd,
            cost_no_cache_usd=rec.cost_no_cache_usd, cache_reason=rec.cache_reason,
            cache_detail=analysis.cache_detail, events=events, reply=outcome.reply,
            request_id=rec.request_id, prepared=prepared, cache_result=cache_result, diff=analysis.diff,
            observation=analysis.observation, prompt_cache_info=analysis.prompt_cache_info,
            cost_source=rec.cost_source,
        ))
        return step.state

    def _priced(self, model: str, usage: Usage) -> Prices | None:
        # unknown usage has no cost whatever the price: no lookup, and no "unpriced" warning
        return None if usage.total_input_tokens is None else self._request_prices(model, usage)

    # -- reading back -------------------------------------------------------------------------
    def turns(self) -> pd.DataFrame:
        """One row per request, oldest first. Token figures: see ``usage_source`` (simulated = estimated).
        ``body_problems``: what the API would refuse in an imported body stored as its log held it (JSON list of
        ``{path, problem}``; None when clean)."""
        self._check_open()
        df = self._lab.store.turns_frame(self.id, TURN_COLUMNS)
        # a label for reading: the user's text with invisible characters shown (the body keeps the raw text)
        df["user_text"] = [visible(t) if isinstance(t, str) else t for t in df["user_text"]]
        return df

    def turn(self, index: int) -> Turn:
        """A stored turn, rebuilt from the store (body byte-identical to what was sent)."""
        self._check_open()
        store = self._lab.store
        rec = store.read_request(self.id, index)
        if rec is None:
            raise SessionError(f"session {self.id!r} has no turn {index}")
        return _stored_turn(store, rec, memo=self._memo)

    @property
    def last_turn(self) -> Turn | None:
        n = self._state.next_index
        return None if n == 0 else self.turn(n - 1)

    def deltas(self) -> pd.DataFrame:
        """This session's ``session_prompt_deltas`` rows."""
        return self._lab.store.deltas_frame(self.id)

    def resimulate(self, cache: str | CacheModel = "openai", **kwargs: Any) -> pd.DataFrame:
        """This session's stored requests replayed under another cache model (``pc.resimulate``)."""
        self._check_open()
        return _analysis.resimulate(self._lab, self.id, cache, **kwargs)

    def efficiency(self) -> float | None:
        """Σ cache_read / Σ ideal_cache_read over the session (None before any ideal read)."""
        df = self.turns()
        ideal = df.ideal_cache_read.sum()
        return None if ideal == 0 else float(df.cache_read_input_tokens.sum() / ideal)

    def __repr__(self) -> str:
        strategy = "imported" if self.strategy is None else repr(self.strategy)
        return (f"Session({self.id!r}, strategy={strategy}, cache={self.cache!r}, model={self.model!r}, "
                f"project={self.project!r}, turns={self._state.next_index})")


def _stored_turn(store: Store, rec: RequestRecord, *, memo: SegmentMemo) -> Turn:
    """A stored request as a :class:`Turn`: its body rebuilt, its diff and observation from the stored columns."""
    sid, index = rec.session_id, rec.idx
    bodies = store.turn_bodies(sid, [index - 1, index] if index > 0 else [index])
    body, prev_body = bodies[index], bodies.get(index - 1)
    prepared = prepare(body, memo=memo)  # the session's tokenizer
    diff, obs = _analysis.stored_diff_and_observation(store, sid, index, prev_body, body, memo=memo,
                                                      current=prepared)
    return Turn(
        prepared=prepared,
        session_id=sid, index=index, at=rec.sent_at, request=body, usage=rec.usage,
        ideal_cache_read=rec.ideal_cache_read or 0, total_tokens=rec.total_tokens or 0, cost_usd=rec.cost_usd,
        cost_no_cache_usd=rec.cost_no_cache_usd, cache_reason=rec.cache_reason, cache_detail=rec.detail,
        events=rec.event_codes, request_id=rec.request_id,
        reply=store.resolve_refs([json.loads(rec.reply)], session_id=sid)[0]["content"] if rec.reply else None,
        diff=diff, observation=obs, prompt_cache_info=obs.prompt_cache_info() if obs is not None else None,
        segment_states=rec.segment_states, cost_source=rec.cost_source,
    )


def _entry_id(project: str, namespace: str, number: int, title: str) -> str:
    """A new knowledge entry's id: project + its number in the project (removed entries included) + title."""
    entry_id = digest(f"{project}\x1f{number}\x1f{title}".encode(), tag="ltm")[:26]
    if namespace != project:
        # A repeat replay: the short id (all a prompt shows) is the first replay's, so the same scenario
        # gives the same bytes and token counts; the rest of the id keeps it unique in the table.
        entry_id = digest(f"{namespace}\x1f{number}\x1f{title}".encode(), tag="ltm")[:8] + entry_id[8:]
    return entry_id


_ENTRY_FIELDS = ("title", "content", "category", "key")


def _new_entry(where: str, title: Any, content: Any, category: Any, key: Any) -> _EntrySpec:
    """A new entry's (title, content, category, key), checked: text that can be stored, a non-empty title and
    content."""
    check_texts(KnowledgeError, where, required=("title", "content", "category"), title=title, content=content,
                category=category, key=key)
    if not title.strip() or not content.strip():
        raise KnowledgeError(f"{where}: knowledge entries need a non-empty title and content")
    return title, content, category, key


def _entry_spec(i: int, entry: Any) -> _EntrySpec:
    """Item ``i`` of ``add_many``'s entries (a dict, or an object with the fields as attributes), checked."""
    where = f"knowledge.add_many: entries[{i}]"
    if isinstance(entry, Mapping):
        unknown = sorted(map(str, set(entry) - set(_ENTRY_FIELDS)))
        if unknown:
            raise KnowledgeError(f"{where}: unknown field {', '.join(map(repr, unknown))}; an entry has "
                                 f"{', '.join(_ENTRY_FIELDS)}")
        get = entry.get
    else:
        def get(name: str, default: Any = None) -> Any:
            return getattr(entry, name, default)
    return _new_entry(where, get("title"), get("content"), get("category", "note"), get("key"))


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


def _as_call(c: Any) -> Any:
    from .scenario import ToolCall

    if isinstance(c, ToolCall):
        return c
    if isinstance(c, dict):
        after = parse_duration(c.get("after", 4))
        return ToolCall(c["name"], dict(c.get("input", {})), str(c["result"]), bool(c.get("is_error", False)), after)
    raise TypeError(f"tool_calls items must be ToolCall or dict, got {type(c).__name__}")


_WARNED: set[str] = set()


def __getattr__(name: str) -> Any:
    """``promptcache_nb.session.Lab``, the name's old home, still works (one DeprecationWarning): the Lab is read
    from the loaded package, never imported from here (a session never imports the Lab)."""
    if name == "Lab":
        import sys

        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn("promptcache_nb.session.Lab moved: use promptcache_nb.Lab", DeprecationWarning,
                          stacklevel=2)
        return sys.modules["promptcache_nb"].Lab  # loaded: importing this module loads the package first
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
