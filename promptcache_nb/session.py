"""Lab and Session: the one place the stages meet.

A turn travels: scenario event / ``step()`` → strategy (assemble) → request (segments, hashes) → cache
model or live API (usage) → store (one transaction) → analysis (diff, observation, ideal read, cost).
"""

from __future__ import annotations

import copy
import json
import re
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

from . import analysis as _analysis
from ._util import common_prefix_length, digest, parse_duration, progress_bar, utc
from .analysis.prices import Prices
from .cache import CacheModel, CacheResult, get_cache_model
from .errors import (
    APIError,
    InvalidRequestError,
    KnowledgeError,
    PromptCacheError,
    SessionError,
    UnpricedModelWarning,
)
from .live import Backend, DirectSimulator
from .live._base import SIMULATED_REPLY
from .request import (
    PreparedRequest,
    SegmentMemo,
    canonical_bytes,
    canonical_json,
    prepare,
    shared_prefix_of,
    visible,
)
from .scenario import (
    DEFAULT_START,
    Compaction,
    Event,
    HostPromptEdit,
    KnowledgeAdd,
    KnowledgeRemove,
    KnowledgeUpdate,
    ModelSwitch,
    Restart,
    Scenario,
    ToolsChange,
    set_model_check,
)
from .store import Delta, KnowledgeEntry, Store
from .strategies import DeltaTable, StrategyContext, get_strategy
from .tokens import DEFAULT_TOKENIZER, Tokenizer, segment_tokens, session_tokenizer
from .usage import Usage, UsageSource

# a scenario's models are checked when it loads, against the table Lab.session validates with
set_model_check(get_cache_model("anthropic").validate_model)

COMPACTION_HEADER = "Summary of the conversation so far:\n\n"
COMPACTION_ACK = "Understood. I have the summary and will continue from it."

# Columns of s.turns(): everything a notebook user wants, JSON blobs left in SQL.
TURN_COLUMNS = (
    "idx", "at", "model", "user_text", "events", "n_segments", "total_tokens",
    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens", "output_tokens", "usage_source",
    "ideal_cache_read", "cost_usd", "cost_no_cache_usd", "cache_reason", "diverge_path", "diverge_byte",
    "diverge_token", "shared_prefix_tokens", "pure_append", "broke", "previous_cache_read", "changes",
    "explanation", "request_id",
)
_TURN_SELECT = ", ".join('"' + c + '"' for c in TURN_COLUMNS)


class Turn:
    """One request of a session and what it cost.

    Attributes:
        index: 0-based request index in the session (a tool loop makes several requests per user turn).
        at: UTC time the request was sent.
        request: the exact Messages body (dict).
        usage: :class:`~promptcache_nb.Usage` — ``usage.label`` says measured or simulated.
        ideal_cache_read: what a perfectly cache-stable design could have read, in the usage's own
            tokens (measured when the usage is measured; never below the request's own read).
        diff: :class:`~promptcache_nb.PrefixDiff` against the previous request (None on the first).
        observation: :class:`~promptcache_nb.Observation` (OpenClaw semantics) or None.
    """

    def __init__(
        self,
        *,
        session_id: str,
        index: int,
        at: datetime,
        request: dict[str, Any],
        usage: Usage,
        ideal_cache_read: int,
        total_tokens: int,
        cost_usd: float | None,
        cost_no_cache_usd: float | None,
        cache_reason: str | None,
        cache_detail: dict[str, Any] | None,
        events: list[str],
        reply: list[dict[str, Any]] | None,
        request_id: str | None = None,
        prepared: PreparedRequest | None = None,
        cache_result: CacheResult | None = None,
        diff: Any = None,
        observation: Any = None,
        prompt_cache_info: dict[str, Any] | None = None,
        segment_states: tuple[str, ...] = (),
    ) -> None:
        self.session_id = session_id
        self.index = index
        self.at = at
        self._request = request
        self.usage = usage
        self.ideal_cache_read = ideal_cache_read
        self.total_tokens = total_tokens
        self.cost_usd = cost_usd
        self.cost_no_cache_usd = cost_no_cache_usd
        self.cache_reason = cache_reason
        self.cache_detail = cache_detail or {}
        self.events = events
        self.reply = copy.deepcopy(reply)  # never the history's own objects
        self.request_id = request_id
        self.cache_result = cache_result
        self.diff = diff
        self.observation = observation
        self._prepared = prepared
        self._body: bytes | None = None
        self._prompt_cache_info = prompt_cache_info
        self._segment_states = segment_states

    @property
    def request(self) -> dict[str, Any]:
        """The exact Messages body (a private copy: editing it changes neither the store nor history)."""
        copy_ = self.__dict__.get("_request_copy")
        if copy_ is None:
            copy_ = self.__dict__["_request_copy"] = copy.deepcopy(self._request)
        return copy_

    @property
    def body(self) -> bytes:
        """The canonical bytes of the request (sorted keys, compact, UTF-8)."""
        if self._body is None:
            self._body = canonical_bytes(self._request)
        return self._body

    @property
    def prepared(self) -> PreparedRequest:
        if self._prepared is None:
            self._prepared = prepare(self._request)
        return self._prepared

    @property
    def segment_states(self) -> tuple[str, ...]:
        """read / write / uncached per segment, when a local cache model decided this turn."""
        if self.cache_result is not None:
            return self.cache_result.segment_states
        return self._segment_states

    def prompt_cache_info(self) -> dict[str, Any] | None:
        """OpenClaw's context-engine payload for this turn (retention, last-call usage, observation)."""
        return self._prompt_cache_info

    def __repr__(self) -> str:
        u = self.usage
        return (
            f"Turn({self.index}, at={self.at:%Y-%m-%d %H:%M:%S}, read={u.cache_read_input_tokens}, "
            f"write={u.cache_creation_input_tokens}, uncached={u.input_tokens}, {u.label})"
        )


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
        return self._s._lab._knowledge(self._s.project)

    def __len__(self) -> int:
        return len(self.list())

    def __iter__(self):
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
        _check_texts(KnowledgeError, "knowledge.add", required=("title", "content", "category"), title=title,
                     content=content, category=category, key=key)
        if not title.strip() or not content.strip():
            raise KnowledgeError("knowledge entries need a non-empty title and content")
        project = self._s.project
        n = self._store.knowledge_count(project)
        entry_id = digest(f"{project}\x1f{n}\x1f{title}".encode(), tag="ltm")[:26]
        ns = self._s._id_namespace.get("project", project)
        if ns != project:
            # A repeat replay: the short id (all a prompt shows) is the first replay's, so the same scenario
            # gives the same bytes and token counts; the rest of the id keeps it unique in the table.
            entry_id = digest(f"{ns}\x1f{n}\x1f{title}".encode(), tag="ltm")[:8] + entry_id[8:]
        entry = KnowledgeEntry(entry_id, project, 1, title, content, category, False, self._now(at), key)
        self._write(entry, f"knowledge_add:{entry.short_id}")
        return entry_id

    def update(self, entry_id: str, *, title: str | None = None, content: str | None = None,
               category: str | None = None, at: datetime | None = None) -> bool:
        """Write a new version; returns False (and writes nothing) when nothing changed."""
        self._s._check_open()
        _check_texts(KnowledgeError, "knowledge.update", title=title, content=content, category=category)
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

        def forget_cached() -> None:
            lab._knowledge_cache.pop(entry.project_id, None)

        self._s._note_event(event, write=lambda store: store.write_knowledge(entry), committed=forget_cached)

    def __repr__(self) -> str:
        return f"KnowledgeBook(project={self._s.project!r}, entries={len(self)})"


class Session:
    """One agent conversation under one strategy and one cache model. Create with :meth:`Lab.session`."""

    def __init__(self, lab: Lab, row: dict[str, Any], *, backend: Backend | None) -> None:
        self._lab = lab
        self.id: str = row["id"]
        self.project: str = row["project_id"]
        self.strategy: str = row["strategy"]
        self.cache: str = row["cache_model"]
        cfg = row["config"]
        self._config = cfg
        # imported sessions have no strategy: their requests were built by someone else's agent
        self._strategy = get_strategy(self.strategy) if self.strategy is not None else None
        self.source: str | None = row.get("source")
        self.parent_id: str | None = row.get("parent_id")
        self._cache_params = cfg.get("cache_params", {})
        #: Which sessions share this session's simulated provider cache: ``session`` (its own),
        #: ``project`` or ``lab`` (every session of the scope with the same cache model and parameters).
        self.cache_scope: str = cache_scope_of(row)
        # the Lab's cache for that scope, held while this object lives (a restarted session keeps it)
        self._scope_entry: _ScopeCache | None = lab._caches.get(self._scope_key())
        self.backend: Backend = backend or DirectSimulator()
        self._prices = Prices(**cfg["prices"]) if cfg.get("prices") else None
        self._step_gap = timedelta(seconds=cfg.get("step_seconds", 30))
        self._start = datetime.fromisoformat(cfg["start"])
        # an opted-in calibration scales every estimate of this session (ratio per text; README "Calibration");
        # session_tokenizer is the one place that decides it, for every path that counts this session's requests
        self._memo = SegmentMemo(session_tokenizer(lab.tokenizer, cfg.get("calibration")))
        self._closed = False
        self._load()

    # -- loading ------------------------------------------------------------------------------
    def _load(self) -> None:
        store = self._lab.store
        self._state = store.state_row(self.id)
        self._messages = store.messages(self.id)
        self._msg_seq = store.message_count(self.id)
        self._deltas: list[Delta] = store.deltas(self.id)
        last = store.last_turn(self.id)
        self._pending_events: list[str] = []
        self._resume_turns: tuple[Any, list[Any]] | None = None  # (window start, turns) for Lab._rebuild_cache
        # session_state columns as last written (None: unknown, so the next write rewrites the row)
        self._state_written: dict[str, Any] | None = None
        self._prev: PreparedRequest | None = None
        self._prev_at: datetime | None = None
        self._prev_keys: list[str] = []
        self._prev_nodes: list[str] = []
        self._prev_obs: Any = None
        if last is None:
            self._next_idx = 0
        else:
            self._next_idx = last["idx"] + 1
            self._prev_at = last["at"].astimezone(UTC)
            # the last request, and the last one whose cache read is known (the observation's baseline), in
            # one bulk rebuild with the session's memo: never one body query and count per request
            since = last["at"]
            marks = store.usage_marks(self.id)
            if marks is not None and marks.read_idx is not None and marks.read_idx != marks.last_idx:
                read_at = store.turn_row(self.id, marks.read_idx, ("at",))
                if read_at is not None:
                    since = min(since, read_at["at"])
            # A session-scoped cache the Lab holds no ready copy of is rebuilt from a window before the last
            # request (Lab._rebuild_cache): load that window now, with the requests above, in the same queries.
            window = self._lab._cache_window(self, last["at"])
            if window is not None:
                since = min(since, window) if window is not _ALL else None
            turns = _analysis.load_turns(self._lab, self.id, since=since, memo=self._memo)
            if window is not None:
                self._resume_turns = (window, turns)
            loaded = {t.idx: t.request for t in turns}
            self._prev = loaded[last["idx"]]
            self._prev_keys, self._prev_nodes, _ = store.prefix_nodes(self._prev, [], [])
            self._prev_obs = _analysis.observation_state_from_store(store, self.id, requests=loaded)
        self._state_written = store.state_columns(self._state)
        # the history the last strategy-built request saw (StrategyContext.previous_messages)
        built = store.built_from(self.id)
        self._built_messages: list[dict[str, Any]] | None = None
        if built is not None:
            b_idx, b_count, later = built
            self._built_messages = self._messages[:b_count] if not later else store.history_of(self.id, b_idx,
                                                                                              b_count)
        pending = self._state["extra"].get("_pending_events")
        if pending:
            self._pending_events = list(pending)

    @property
    def lab(self) -> Lab:
        """The Lab this session belongs to (its store, tokenizer and path)."""
        return self._lab

    @property
    def knowledge(self) -> KnowledgeBook:
        """The project's long-term knowledge (a view made on access: no Session <-> book reference cycle)."""
        return KnowledgeBook(self)

    @property
    def model(self) -> str:
        return self._state["model"]

    @property
    def host_prompt(self) -> str:
        return self._state["host_prompt"]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._state["tools"])

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation as the agent knows it (a copy)."""
        return copy.deepcopy(self._messages)

    @property
    def n_turns(self) -> int:
        return self._next_idx

    @property
    def pending_events(self) -> tuple[str, ...]:
        """Event codes recorded since the last request (knowledge edits, tool changes...)."""
        return tuple(self._pending_events)

    @property
    def _id_namespace(self) -> dict[str, str]:
        """What generated ids (knowledge entry short ids, ``tool_use`` ids) derive from: this session's id and
        project, or, for a repeat replay of a scenario, those of its first replay (``Lab.replay``)."""
        return self._state["extra"].get("_id_namespace") or {}

    @property
    def cache_params(self) -> dict[str, Any]:
        """Parameters the session's cache model was created with."""
        return dict(self._cache_params)

    @property
    def prices(self) -> Prices:
        """Explicit prices, else the cache model's provider price for this session (see README)."""
        if self._prices is not None:
            return self._prices
        return _analysis.default_prices(self.cache, self.model)

    def _costs(self, model: str, usage: Usage, at: datetime) -> tuple[float | None, float | None]:
        """(cost, cost without caching) of one request, priced by its own model: explicit prices, else
        genai-prices by the exact id. A model without an exact price costs NULL, with one
        :class:`~promptcache_nb.errors.UnpricedModelWarning` per session — never another model's price."""
        if usage.total_input_tokens is None:
            return None, None  # unknown usage has no cost, whatever the price
        prices = self._prices or _analysis.request_prices(self.cache, model)
        if prices is None:
            if not self.__dict__.get("_warned_unpriced"):
                self._warned_unpriced = True
                warnings.warn(UnpricedModelWarning(model, self.id), stacklevel=4)
            return None, None
        return prices.cost(usage, at), prices.cost_without_cache(usage, at)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionError(
                f"session object {self.id!r} was restarted or its Lab closed; use the object restart() "
                "returned, or lab.session(id=...)"
            )
        if self._lab.store.closed:
            raise SessionError("the Lab is closed; open it again with pc.Lab(path) and lab.session(id=...)")

    def _clock_now(self) -> datetime:
        return self._prev_at or self._start

    def _note_event(self, code: str, *, changes: dict[str, Any] | None = None,
                    write: Callable[[Store], None] | None = None, committed: Callable[[], None] | None = None) -> None:
        """Record an event between turns: ``write`` (the change itself, e.g. a knowledge row), the state
        ``changes`` and the pending event are one transaction; the in-memory session moves only once stored."""
        self._commit_state([*self._pending_events, code], changes=changes, write=write, committed=committed)

    def _persist_pending(self) -> None:
        # Events between turns survive a restart (e.g. a compaction recorded just before one).
        self._commit_state(list(self._pending_events))

    def _commit_state(self, pending: list[str], *, changes: dict[str, Any] | None = None,
                      write: Callable[[Store], None] | None = None,
                      committed: Callable[[], None] | None = None) -> None:
        state = {**self._state, **(changes or {})}
        state["extra"] = {**self._state["extra"], "_pending_events": list(pending)}
        store = self._lab.store
        before = store.commit_count
        wrote = False
        cols = None
        try:
            with store.transaction():
                if write is not None:
                    write(store)
                # only the columns that changed (usually just ``extra``'s pending events): the host prompt
                # and tools are large and rarely change
                cols = store.write_state(self.id, state, self._clock_now(), previous=self._state_written)
            wrote = True
        finally:
            # stored (also when a Ctrl-C landed right after COMMIT), or written inside Lab.atomic(), which
            # reloads every open session from the store if its transaction rolls back
            if store.commit_count != before or (wrote and self._lab._atomic_depth):
                self._state, self._pending_events, self._state_written = state, list(pending), cols
                if committed is not None:
                    committed()

    # -- the cache model ----------------------------------------------------------------------
    def _cache(self) -> CacheModel:
        """The session's simulated provider cache: the Lab's instance for this session's cache scope, made
        current for this session's requests (rebuilt from the store when the Lab has none ready)."""
        entry = self._scope_entry = self._lab._scope_cache(self)  # held: the Lab keeps it only weakly
        entry.model.stream(self.id)
        return entry.model

    def _scope_key(self) -> tuple[str, str, str, str]:
        """(scope, its owner, cache model, parameters): sessions with equal keys share one cache."""
        owner = self.id if self.cache_scope == "session" else self.project if self.cache_scope == "project" else ""
        return (self.cache_scope, owner, self.cache, canonical_json(self._cache_params))

    def _cache_stale(self) -> None:
        """The simulated cache may have seen a request the store did not keep: rebuild it before its next use."""
        self._lab._drop_cache(self._scope_key())

    # -- events -------------------------------------------------------------------------------
    def set_tools(self, tools: list[dict[str, Any]]) -> None:
        """Replace the tool set (an MCP reconnect)."""
        self._check_open()
        tools = copy.deepcopy(list(tools))
        _check_texts(SessionError, "set_tools", required=("tools",), tools=tools)
        self._note_event("tools", changes={"tools": tools})

    def switch_model(self, model: str) -> None:
        self._check_open()
        model = self._cache_for_validation().validate_model(model)
        if self._prices is None:
            _analysis.default_prices(self.cache, model)
        self._note_event(f"model_switch:{model}", changes={"model": model})

    def _cache_for_validation(self) -> CacheModel:
        entry = self._lab._caches.get(self._scope_key())
        return entry.model if entry is not None else get_cache_model(self.cache, **self._cache_params)

    def edit_host_prompt(self, text: str | None = None, *, append: str | None = None) -> None:
        """The host prompt file changed: a new ``text``, or ``append`` to the current one."""
        self._check_open()
        # checked before anything changes: a rejected edit leaves the session's prompt as it was
        _check_texts(SessionError, "edit_host_prompt", text=text, append=append)
        new = text if text is not None else self._state["host_prompt"]
        if append:
            new = new + append
        self._note_event("host_prompt_edit", changes={"host_prompt": new})

    def compact(self, summary: str) -> None:
        """Replace the history by a summary (the agent's context compaction)."""
        self._check_open()
        _check_texts(SessionError, "compact", required=("summary",), summary=summary)
        msgs = [
            {"role": "user", "content": [{"type": "text", "text": COMPACTION_HEADER + summary}]},
            {"role": "assistant", "content": [{"type": "text", "text": COMPACTION_ACK}]},
        ]
        seq = self._msg_seq

        def write(store: Store) -> None:
            store.con.execute(
                "UPDATE session_messages SET compacted = true WHERE session_id = ?", [self.id]
            ).fetchall()
            store.write_messages(self.id, self._next_idx, [(seq, msgs[0]), (seq + 1, msgs[1])],
                                 tokenizer=self._memo.tokenizer)

        def committed() -> None:
            self._messages, self._msg_seq = msgs, seq + 2

        # the history rewrite and its pending "compaction" event are one transaction
        self._note_event("compaction", write=write, committed=committed)

    def restart(self) -> Session:
        """Drop every in-memory object and resume from the store alone; use the returned session."""
        self._check_open()
        self._closed = True
        return self._lab.session(id=self.id, backend=self.backend)

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
                tools = [t for t in self._state["tools"] if t.get("name") not in set(event.remove)]
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

    # -- turns --------------------------------------------------------------------------------
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
        if self._strategy is None:
            raise SessionError(f"session {self.id!r} was imported ({self.source}); it has no strategy to build a "
                               "request with: add requests with record(), or replay a scenario in a new session")
        at = self._next_at(at)
        calls = [_as_call(c) for c in tool_calls]
        _check_texts(SessionError, f"turn {self._next_idx}", required=("user",), user=user, reply=reply,
                     tool_calls=[[c.name, c.input, c.result] for c in calls])
        snapshot = self._snapshot()
        commits = self._lab.store.commit_count
        try:
            # a user turn and its tool loop are one transaction: all of its requests are stored, or none
            with self._lab.store.transaction():
                new_msgs = [{"role": "user", "content": [{"type": "text", "text": user}]}]
                user_text: str | None = user
                for call in calls:
                    ns = self._id_namespace.get("session", self.id)
                    tool_id = "toolu_" + digest(f"{ns}/{self._next_idx}".encode(), tag="tool")[:24]
                    use = {"role": "assistant", "content": [
                        {"type": "tool_use", "id": tool_id, "name": call.name, "input": call.input}]}
                    self._request(new_msgs, use, at=at, user_text=user_text)
                    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id, "content": call.result}
                    if call.is_error:
                        result["is_error"] = True
                    new_msgs = [{"role": "user", "content": [result]}]
                    user_text = None
                    at = at + call.after
                final = None if reply is None else {"role": "assistant", "content": [{"type": "text", "text": reply}]}
                return self._request(new_msgs, final, at=at, user_text=user_text)
        except BaseException:
            # rolled back: forget the turn; committed (a Ctrl-C that landed after COMMIT): keep it, as the store does
            if self._lab.store.commit_count == commits:
                self._restore(snapshot)
            raise

    def _snapshot(self) -> tuple:
        return (self._messages, self._msg_seq, self._state, self._state_written, self._deltas, self._prev,
                self._prev_at, self._prev_keys, self._prev_nodes, self._prev_obs, self._next_idx,
                list(self._pending_events), self._built_messages)

    def _restore(self, snapshot: tuple) -> None:
        """Back to the in-memory state before a failed step (the store rolled back with it)."""
        (self._messages, self._msg_seq, self._state, self._state_written, self._deltas, self._prev,
         self._prev_at, self._prev_keys, self._prev_nodes, self._prev_obs, self._next_idx,
         self._pending_events, self._built_messages) = snapshot
        self._cache_stale()  # the simulated provider cache saw requests that were not stored

    def _next_at(self, at: datetime | None) -> datetime:
        if at is None:
            return (self._prev_at + self._step_gap) if self._prev_at else self._start
        at = utc(at)
        if self._prev_at is not None and at < self._prev_at:
            raise SessionError(
                f"turn {self._next_idx}: at={at.isoformat()} is before the previous request "
                f"({self._prev_at.isoformat()}); time only moves forward"
            )
        return at

    def _request(
        self,
        new_msgs: list[dict[str, Any]],
        reply_msg: dict[str, Any] | None,
        *,
        at: datetime,
        user_text: str | None,
    ) -> Turn:
        messages = self._messages + new_msgs
        prepared, state, deltas, events = self._build(messages, at=at)
        return self._send_and_store(
            prepared, at=at, events=list(events), user_text=user_text, new_msgs=new_msgs,
            reply_msg=reply_msg, state=state, deltas=deltas, source_messages=messages,
        )

    def _build(self, messages: list[dict[str, Any]], *, at: datetime
               ) -> tuple[PreparedRequest, dict[str, Any], DeltaTable, tuple[str, ...]]:
        """The strategy's next request over ``messages``, with the state and delta rows it would write."""
        if self._strategy is None:
            raise SessionError(f"session {self.id!r} was imported ({self.source}); it has no strategy to build a "
                               "request with: add requests with record(), or replay a scenario in a new session")
        idx = self._next_idx
        # a copy the strategy may change: the big immutable parts (host prompt, tools) are shared
        state = dict(self._state)
        state["extra"] = json.loads(json.dumps(self._state["extra"]))
        state["extra"].pop("_pending_events", None)
        if state.get("ltm_pin_keys") is not None:
            state["ltm_pin_keys"] = list(state["ltm_pin_keys"])
        deltas = DeltaTable(self._deltas)
        events = tuple(self._pending_events)
        ctx = StrategyContext(
            session_id=self.id, project_id=self.project, request_index=idx, now=at, model=self.model,
            host_prompt=self.host_prompt, tools=self._state["tools"], knowledge=self._lab._knowledge(self.project),
            messages=messages, events=events, state=state, deltas=deltas,
            params=self._config.get("strategy_params", {}), previous_messages=self._built_messages,
        )
        try:
            body = self._strategy.build(ctx)
            prepared = prepare(body, memo=self._memo, trusted=True, previous=self._prev)
        except PromptCacheError:
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise SessionError(f"turn {idx}: strategy {self.strategy!r} built an invalid request: {exc}") from exc
        return prepared, state, deltas, events

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
        messages = self._messages + [{"role": "user", "content": [{"type": "text", "text": user}]}]
        return self._build(messages, at=self._next_at(at))[0]

    def record(self, body: dict[str, Any], *, at: datetime | None = None,
               usage: Usage | dict[str, Any] | None = None, request_id: str | None = None,
               events: Iterable[str] = (), reply: list[dict[str, Any]] | None = None,
               source_ref: str | None = None, dedupe_key: str | None = None,
               prepared: PreparedRequest | None = None, dialect: str | None = None,
               unlogged_prefix_tokens: int | None = None, usage_source: UsageSource | None = None) -> Turn:
        """Store a request produced elsewhere (a log, a proxy). With ``usage`` it is *imported*
        (measured) usage; without, the session's cache model simulates it. The strategy is not used.

        ``source_ref`` (file:line) and ``dedupe_key`` are kept per request for imports; ``prepared`` lets
        an importer pass a body it already segmented (its own dialect, unlogged prefix, shared prefix).
        ``dialect`` (``anthropic``, ``openai-chat``, ``openai-responses``; detected when omitted) and
        ``unlogged_prefix_tokens`` (a partial body's measured unlogged prefix) are passed to ``prepare``;
        a ``usage`` dict is read in the body's dialect. The body is copied; what equals the previous
        request's body is shared with it, so a growing history costs only its new tail.
        """
        self._check_open()
        at = self._next_at(at)
        if prepared is None:
            try:
                prepared = prepare(body, memo=self._memo, previous=self._prev, copy=True, dialect=dialect,
                                   unlogged_prefix_tokens=unlogged_prefix_tokens)
            except (ValueError, TypeError) as exc:
                raise SessionError(f"request {self._next_idx}: {exc}") from None
        given = None
        if usage is not None:
            if isinstance(usage, Usage):
                given = usage
            else:
                try:
                    if prepared.dialect == "anthropic":
                        given = Usage.from_anthropic(usage, source="imported")
                    else:
                        given = Usage.from_openai(
                            usage, api="chat" if prepared.dialect == "openai-chat" else "responses")
                except ValueError as exc:
                    raise SessionError(f"request {self._next_idx}: {exc}") from None
            if usage_source is not None:
                given = given.with_source(usage_source)  # e.g. a proxy log of our own simulator: simulated
            elif given.source == "simulated":
                given = given.with_source("imported")
        return self._send_and_store(
            prepared, at=at, events=list(self._pending_events) + list(events), user_text=None, new_msgs=[],
            reply_msg=None, state=None, deltas=None, source_messages=None, given_usage=given,
            given_request_id=request_id, given_reply=reply,
            extra_columns={"source_ref": source_ref, "dedupe_key": dedupe_key},
        )

    def _send_and_store(
        self, prepared: PreparedRequest, *, at: datetime, events: list[str], user_text: str | None,
        new_msgs: list[dict], reply_msg: dict | None, state: dict | None, deltas: DeltaTable | None,
        source_messages: list[dict] | None, given_usage: Usage | None = None,
        given_request_id: str | None = None, given_reply: list[dict[str, Any]] | None = None,
        extra_columns: dict[str, Any] | None = None,
    ) -> Turn:
        store = self._lab.store
        idx = self._next_idx
        commits, interrupted = store.commit_count, None
        cache = self._cache()
        cache_result: CacheResult | None = None
        request_id = given_request_id
        content = given_reply
        try:
            if given_usage is not None:
                usage = given_usage  # measured figures are authoritative; the cache model only predicts
                try:
                    cache_result = cache.process(prepared, at).as_prediction()
                except PromptCacheError:
                    # e.g. a model the cache model's table lacks (Claude Code's "<synthetic>"): no prediction;
                    # cache models raise before changing state, so the simulated cache goes on unchanged
                    cache_result = None
            else:
                resp = self.backend.send(prepared, at=at, cache=cache)
                usage, cache_result, request_id = resp.usage, resp.cache_result, resp.request_id
                # A scripted reply or tool call keeps the conversation the scenario's (and comparable across
                # backends); the endpoint's own answer is used when the caller asked for it (reply=None).
                content = resp.content if reply_msg is None else None
        except APIError as exc:
            self._cache_stale()
            if exc.turn is None:
                raise exc.at_turn(idx) from None
            raise
        except BaseException:
            self._cache_stale()  # the simulated cache may have moved; rebuild it from the store
            raise
        try:
            if content is None and reply_msg is not None:
                content = reply_msg["content"]
            if content is None and given_usage is None and source_messages is not None:
                content = [{"type": "text", "text": SIMULATED_REPLY}]
            if usage.output_tokens is None and content is not None:
                out = sum(segment_tokens("msg", b, self._lab.tokenizer) for b in content)
                usage = Usage(usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens,
                              usage.cache_creation_5m_input_tokens, usage.cache_creation_1h_input_tokens, out,
                              usage.source, usage.raw)
            ideal = self._ideal(prepared, at, events, usage)
            cost, cost_nc = self._costs(prepared.model, usage, at)
            keys, nodes, node_rows = store.prefix_nodes(prepared, self._prev_keys, self._prev_nodes)
            rest_body = canonical_json({"shape": prepared.shape, "rest": prepared.rest})
            rest_hash = digest(rest_body.encode(), tag="seg")
            block_rows = store.new_blocks(prepared, rest_body, rest_hash,
                                          shared=common_prefix_length(keys, self._prev_keys,
                                                                      shared_prefix_of(prepared, self._prev)
                                                                      if self._prev is not None else 0))
            transport = "direct" if isinstance(self.backend, DirectSimulator) else "http"
            analysis = _analysis.analyse_turn(
                previous=self._prev, current=prepared, usage=usage, cache_result=cache_result,
                previous_state=self._prev_obs, at=at, previous_at=self._prev_at, events=events,
                transport=transport,
            )
            msg_rows: list[tuple[int, dict]] = []
            if source_messages is not None:
                seq = self._msg_seq
                history_reply = _history_reply(content) if reply_msg is None else content
                added = list(new_msgs) + (
                    [{"role": "assistant", "content": history_reply}] if content is not None else [])
                for m in added:
                    msg_rows.append((seq, m))
                    seq += 1
            # the session_state row is rewritten only when it changed (most turns it does not)
            state_to_write: dict[str, Any] | None
            if state is not None:
                state_to_write = state
            else:
                state_to_write = dict(self._state)
                state_to_write["extra"] = {k: v for k, v in self._state["extra"].items() if k != "_pending_events"}
            state_cols = store.state_columns(state_to_write)
            if state_cols == self._state_written:
                state_to_write = None
            turn_row = {
                "session_id": self.id, "idx": idx, "at": at, "model": prepared.model,
                "tail_node": nodes[-1] if nodes else None, "rest_hash": rest_hash,
                "n_segments": len(prepared.segments), "total_tokens": prepared.total_tokens,
                "body_bytes": None, "input_tokens": usage.input_tokens,
                "cache_read_input_tokens": usage.cache_read_input_tokens,
                "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                "cache_creation_5m_input_tokens": usage.cache_creation_5m_input_tokens,
                "cache_creation_1h_input_tokens": usage.cache_creation_1h_input_tokens,
                "output_tokens": usage.output_tokens, "usage_source": usage.source,
                "usage_raw": None if usage.raw is None else canonical_json(usage.raw),
                "ideal_cache_read": ideal, "cost_usd": cost, "cost_no_cache_usd": cost_nc,
                "cache_reason": cache_result.reason if cache_result else None,
                "cache_detail": canonical_json(cache_result.detail) if cache_result else None,
                "events": canonical_json(events), "request_id": request_id, "user_text": _label(user_text),
                "reply": None,  # set below from the stored assistant message (block references)
                "segment_map": encode_segment_map(cache_result.segment_states) if cache_result else None,
                # the history the strategy built it from: the next request's previous_messages after a restart
                "n_messages": len(source_messages) if source_messages is not None else None,
                "transport": transport,
                **analysis.columns,
                **(extra_columns or {}),
            }
            turn_row["body_bytes"] = prepared_size(prepared)
            if content is not None:
                # the reply's content blocks are stored once, in blocks (shared with the history row)
                reply_blocks: dict[str, tuple] = {}
                turn_row["reply"] = store.message_ref({"role": "assistant", "content": content}, reply_blocks,
                                                      self._memo.tokenizer)
                seen = {r[0] for r in block_rows}
                block_rows = block_rows + [r for h, r in reply_blocks.items() if h not in seen]
            store.write_turn(
                turn_row=turn_row, block_rows=block_rows, node_rows=node_rows, messages=msg_rows,
                compact_before=None, state=state_to_write, delta_ops=deltas.ops if deltas else [],
                knowledge_rows=[], project_id=self.project, state_previous=self._state_written,
                tokenizer=self._memo.tokenizer,
            )
        except BaseException as exc:
            self._cache_stale()
            if store.commit_count == commits:
                raise
            interrupted = exc  # record()'s own transaction committed, then a Ctrl-C landed: keep the turn
        # committed: advance the in-memory state
        if source_messages is not None:
            self._messages = source_messages + added[len(new_msgs):]
            self._msg_seq += len(msg_rows)
            self._built_messages = source_messages
        if state is not None:
            self._state = state
        self._state_written = state_cols
        if deltas is not None:
            self._deltas = deltas.list()
        self._prev, self._prev_at, self._prev_keys, self._prev_nodes = prepared, at, keys, nodes
        self._prev_obs = analysis.state
        self._next_idx += 1
        self._pending_events = []
        if interrupted is not None:
            raise interrupted
        return Turn(
            session_id=self.id, index=idx, at=at, request=prepared.body, usage=usage, ideal_cache_read=ideal,
            total_tokens=prepared.total_tokens, cost_usd=cost, cost_no_cache_usd=cost_nc,
            cache_reason=turn_row["cache_reason"], cache_detail=cache_result.detail if cache_result else None,
            events=events, reply=content, request_id=request_id, prepared=prepared, cache_result=cache_result,
            diff=analysis.diff, observation=analysis.observation, prompt_cache_info=analysis.prompt_cache_info,
        )

    def _ideal(self, prepared: PreparedRequest, at: datetime, events: list[str], usage: Usage) -> int:
        """What a perfectly cache-stable design could have read: the one rule of
        :mod:`promptcache_nb.analysis._ideal`, from this request's and the previous one's stored totals
        (measured when measured, never estimates), this session's cache model's TTLs and minimum."""
        prev = self._prev
        points: list[tuple[int, float]] | None = None
        gap = None
        if prev is not None and self._prev_at is not None:
            gap = (at - self._prev_at).total_seconds()
            try:
                points = self._cache().retention_points(prev)
            except InvalidRequestError:
                points = [(prev.total_tokens, 300.0)]
        try:
            minimum = self._cache().min_cacheable_tokens(prepared.model)
        except PromptCacheError:
            minimum = 0
        return _analysis.ideal_read(
            prev, prepared, previous_total=getattr(self._prev_obs, "prompt_total", None),
            current_total=usage.total_input_tokens, gap_seconds=gap, retention_points=points,
            compaction="compaction" in events, minimum=minimum, cache_read=usage.cache_read_input_tokens,
        ).tokens

    # -- reading back -------------------------------------------------------------------------
    def turns(self) -> pd.DataFrame:
        """One row per request, oldest first. Token figures: see ``usage_source`` (simulated = estimated)."""
        self._check_open()
        df = self._lab.store.sql(
            f"SELECT {_TURN_SELECT} FROM turns WHERE session_id = ? ORDER BY idx", [self.id]
        )
        # a label for reading: the user's text with invisible characters shown (the body keeps the raw text)
        df["user_text"] = [visible(t) if isinstance(t, str) else t for t in df["user_text"]]
        return df

    def turn(self, index: int) -> Turn:
        """A stored turn, rebuilt from the store (body byte-identical to what was sent)."""
        self._check_open()
        return self._lab._turn_from_store(self.id, index, memo=self._memo)

    @property
    def last_turn(self) -> Turn | None:
        return None if self._next_idx == 0 else self.turn(self._next_idx - 1)

    def deltas(self) -> pd.DataFrame:
        """This session's ``session_prompt_deltas`` rows."""
        return self._lab.store.sql(
            "SELECT seq, project_id, selector, content FROM session_prompt_deltas WHERE session_id = ? ORDER BY seq",
            [self.id],
        )

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
                f"project={self.project!r}, turns={self._next_idx})")


def prepared_size(prepared: PreparedRequest) -> int:
    """Bytes of the segments' canonical JSON (memoised per segment; envelopes not counted)."""
    return prepared.segment_bytes


_STATE_CODES = {"read": "r", "write": "w", "uncached": "u"}
_CODE_STATES = {v: k for k, v in _STATE_CODES.items()}


def encode_segment_map(states: tuple[str, ...]) -> str | None:
    """Run-length encode per-segment cache states: ("read",)*3 + ("write",) -> "r3w1".

    Each run's end is found with C-speed ``tuple.index`` scans, so the usual three runs (read, write,
    uncached) cost no per-segment Python work."""
    if not states:
        return None
    out, i, n = [], 0, len(states)
    while i < n:
        st = states[i]
        end = n
        for other in _STATE_CODES:
            if other != st:
                try:
                    end = min(end, states.index(other, i, end))
                except ValueError:
                    pass
        out.append(f"{_STATE_CODES[st]}{end - i}")
        i = end
    return "".join(out)


def decode_segment_map(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    out: list[str] = []
    for code, n in re.findall(r"([rwu])(\d+)", text):
        out.extend([_CODE_STATES[code]] * int(n))
    return tuple(out)


def _history_reply(content: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A model's own answer as it enters the history. ``tool_use`` blocks are left out: the session does
    not run tools, and a tool_use without its tool_result makes the next request invalid (HTTP 400).
    ``turn.reply`` keeps the full answer; script tool loops with ``tool_calls=``."""
    if not content or not any(b.get("type") == "tool_use" for b in content):
        return content
    kept = [b for b in content if b.get("type") != "tool_use"]
    if not kept:
        names = ", ".join(sorted({str(b.get("name")) for b in content if b.get("type") == "tool_use"}))
        kept = [{"type": "text", "text": f"(the model asked to call {names}; tool calls are not run here)"}]
    return kept


def _check_texts(error: type[PromptCacheError], where: str, *, required: tuple[str, ...] = (),
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


def _label(text: str | None, limit: int = 160) -> str | None:
    """The user_text column is a label for tables; the full text is in the request body."""
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def _as_call(c: Any) -> Any:
    from .scenario import ToolCall

    if isinstance(c, ToolCall):
        return c
    if isinstance(c, dict):
        after = parse_duration(c.get("after", 4))
        return ToolCall(c["name"], dict(c.get("input", {})), str(c["result"]), bool(c.get("is_error", False)), after)
    raise TypeError(f"tool_calls items must be ToolCall or dict, got {type(c).__name__}")


_ALL = object()  # a cache rebuild window that starts at the first request

#: Who shares a simulated provider cache (``lab.session(cache_scope=...)``).
CACHE_SCOPES = ("session", "project", "lab")


def cache_scope_of(row: dict[str, Any]) -> str:
    """A stored session's cache scope: as configured, else ``project`` for an imported session (its sub-agents
    and compaction calls read the parent's entries) and ``session`` for a simulated one."""
    scope = row["config"].get("cache_scope")
    if scope is None:
        scope = "project" if row.get("strategy") is None else "session"
    return scope


def _scope_key_of(row: dict[str, Any]) -> tuple[str, str, str, str]:
    """:meth:`Session._scope_key` of a stored session row."""
    scope = cache_scope_of(row)
    owner = row["id"] if scope == "session" else row["project_id"] if scope == "project" else ""
    return (scope, owner, row["cache_model"], canonical_json(row["config"].get("cache_params", {})))


@dataclass
class _ScopeCache:
    """A simulated provider cache shared by the sessions of one cache scope."""

    model: CacheModel
    ready: bool = False


class Lab:
    """A DuckDB-backed workspace of sessions. ``pc.Lab()`` is in-memory; ``pc.Lab("runs.duckdb")`` a file.

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

    def __init__(self, path: str | Path = ":memory:", *, tokenizer: Tokenizer | None = None,
                 progress: bool = True, read_only: bool = False,
                 trace: Callable[[str, Any], None] | None = None) -> None:
        self.path = str(path)
        self.store = Store(path, read_only=read_only, trace=trace)  # trace=print: every statement, as it runs
        self.tokenizer = tokenizer or DEFAULT_TOKENIZER
        self.progress = progress
        self._knowledge_cache: dict[str, list[KnowledgeEntry]] = {}
        # Weak: sessions hold their Lab, never the reverse, so `del lab` (with no session left) closes the
        # file at once instead of waiting for the garbage collector to break a Lab <-> Session cycle.
        self._open: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        self._atomic_depth = 0  # > 0 inside atomic(): session objects advance before the outer COMMIT
        # The simulated provider caches, one per cache scope (Session._scope_key): they outlive a restarted
        # Session object (a provider's cache does not restart with the agent) and are rebuilt from the store
        # when missing. Weak: the sessions using one keep it, so a Lab that ran many replays does not keep
        # every cache they built.
        self._caches: weakref.WeakValueDictionary[tuple[str, str, str, str], _ScopeCache] = (
            weakref.WeakValueDictionary())

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
            s._closed = True
        self._open.clear()
        self.store.close()

    def __repr__(self) -> str:
        state = "closed" if self.store.closed else f"{self._count('sessions')} sessions"
        return f"Lab({self.path!r}, {state})"

    def _count(self, table: str) -> int:
        return int(self.store.scalar(f"SELECT count(*) FROM {table}"))

    def _knowledge(self, project: str) -> list[KnowledgeEntry]:
        cached = self._knowledge_cache.get(project)
        if cached is None:
            cached = self._knowledge_cache[project] = self.store.knowledge(project)
        return cached

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
        store = self.store
        commits = store.commit_count
        self._atomic_depth += 1
        try:
            with store.transaction():
                yield
        except BaseException:
            if store.commit_count == commits:  # rolled back: no object may keep what the store lost
                self._knowledge_cache.clear()
                for entry in list(self._caches.values()):
                    entry.ready = False  # simulated caches saw requests the store lost: rebuilt on next use
                for s in list(self._open.values()):
                    if not s._closed:
                        s._load()
            raise
        finally:
            self._atomic_depth -= 1

    def active_session(self, session_id: str) -> Session | None:
        """The Session object currently open for ``session_id`` (the one a restart returned), if any."""
        s = self._open.get(session_id)
        return None if s is None or s._closed else s

    def sql(self, query: str, params: list | dict | None = None) -> pd.DataFrame:
        """Run SQL against the store and return a DataFrame. Tables: see README "Schema"."""
        return self.store.sql(query, params)

    def sessions(self) -> pd.DataFrame:
        return self.sql(
            "SELECT id, project_id, strategy, cache_model, model, created_at FROM sessions ORDER BY created_at, id")

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
            calibration: opt in to a token-estimate calibration: a ``pc.Calibration``, or ``"stored"`` for
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
                known = [r[0] for r in self.store.rows("SELECT id FROM sessions ORDER BY id")]
                raise SessionError(f"no session {id!r} in {self.path!r}; known: {', '.join(known) or '(none)'}")
            old = self._open.get(id)
            if old is not None:
                old._closed = True
            s = Session(self, row, backend=backend)
            self._open[id] = s
            return s
        _check_texts(SessionError, "lab.session", system=system, tools=tools)
        if cache_scope is not None and cache_scope not in CACHE_SCOPES:
            raise SessionError(f"cache_scope={cache_scope!r}: use one of {', '.join(map(repr, CACHE_SCOPES))}")
        strat = get_strategy(strategy)
        strategy_params = strat.check_params(strategy_params)  # a misspelt option fails here, naming the valid ones
        cache_model = get_cache_model(cache, **(cache_params or {}))
        model = cache_model.validate_model(model)
        if prices is None:
            _analysis.default_prices(cache_model.name, model)  # fail now, not at turn 1
        start = utc(start) if start is not None else DEFAULT_START
        n = self._count("sessions") + 1
        session_id = f"s{n:03d}-{strat.name}"
        while self.store.session_row(session_id) is not None:
            n += 1
            session_id = f"s{n:03d}-{strat.name}"
        if isinstance(calibration, str):
            if calibration != "stored":
                raise SessionError(f"calibration={calibration!r}: pass a pc.Calibration or 'stored'")
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
        state = {"host_prompt": system, "tools": list(tools or []), "model": model, "extra": {}}
        store = self.store
        with store.transaction():
            store.ensure_project(project, start)
            store.create_session({"id": session_id, "project_id": project, "strategy": strat.name,
                                  "cache_model": cache_model.name, "model": model, "created_at": start,
                                  "config": config}, state)
        row = store.session_row(session_id)
        assert row is not None  # created just above, in the committed transaction
        s = Session(self, row, backend=backend)
        self._open[session_id] = s
        return s

    # -- simulated provider caches, one per cache scope ---------------------------------------
    def _scope_cache(self, session: Session) -> _ScopeCache:
        """The cache of ``session``'s scope, rebuilt from the store when the Lab holds none ready."""
        key = session._scope_key()
        entry = self._caches.get(key)
        if entry is None:
            entry = self._caches[key] = _ScopeCache(get_cache_model(session.cache, **session._cache_params))
        if not entry.ready:
            self._rebuild_cache(key, entry, session)
        return entry

    def _cache_window(self, session: Session, last_at: datetime) -> Any:
        """Where a rebuild of ``session``'s cache would start (``_ALL``: every request), when the Lab holds no
        ready cache for it and its scope is the session alone; None otherwise."""
        if session.cache_scope != "session":
            return None
        entry = self._caches.get(session._scope_key())
        if entry is not None and entry.ready:
            return None
        try:
            model = entry.model if entry is not None else get_cache_model(session.cache, **session._cache_params)
        except (PromptCacheError, TypeError, ValueError):
            return None  # the session still opens; its first simulated request says what is wrong
        since = self._rebuild_since(model, [session.id], last_at)
        return _ALL if since is None else since

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

    def _drop_cache(self, key: tuple[str, str, str, str]) -> None:
        entry = self._caches.get(key)
        if entry is not None:
            entry.ready = False

    def _rebuild_cache(self, key: tuple[str, str, str, str], entry: _ScopeCache, session: Session) -> None:
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
            memo = open_._memo if open_ is not None and not open_._closed else None
            preloaded, open_resume = None, open_._resume_turns if open_ is not None else None
            if open_ is not None and open_resume is not None:
                open_._resume_turns = None
                start, turns = open_resume
                if start is _ALL and since is None or start is not _ALL and since is not None and start <= since:
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

    def _turn_from_store(self, session_id: str, index: int, memo: SegmentMemo | None = None) -> Turn:
        store = self.store
        row = store.one(
            """SELECT "at", input_tokens, cache_read_input_tokens, cache_creation_input_tokens,
                      cache_creation_5m_input_tokens, cache_creation_1h_input_tokens, output_tokens,
                      usage_source, usage_raw, ideal_cache_read, total_tokens, cost_usd, cost_no_cache_usd,
                      cache_reason, cache_detail, events, reply, request_id, segment_map
               FROM turns WHERE session_id = ? AND idx = ?""",
            [session_id, index],
        )
        if row is None:
            raise SessionError(f"session {session_id!r} has no turn {index}")
        usage = Usage(row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                      json.loads(row[8]) if row[8] else None)
        body = store.turn_body(session_id, index)
        prev_body = store.turn_body(session_id, index - 1) if index > 0 else None
        diff, obs = _analysis.stored_diff_and_observation(store, session_id, index, prev_body, body, memo=memo)
        return Turn(
            prepared=None if memo is None else prepare(body, memo=memo),  # the session's tokenizer
            session_id=session_id, index=index, at=row[0].astimezone(UTC), request=body, usage=usage,
            ideal_cache_read=row[9], total_tokens=row[10], cost_usd=row[11], cost_no_cache_usd=row[12],
            cache_reason=row[13], cache_detail=json.loads(row[14]) if row[14] else None,
            events=json.loads(row[15]), request_id=row[17],
            reply=store.resolve_refs([json.loads(row[16])])[0]["content"] if row[16] else None,
            diff=diff, observation=obs,
            prompt_cache_info=obs.prompt_cache_info() if obs is not None else None,
            segment_states=decode_segment_map(row[18]),
        )

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
        try:
            with store.transaction():
                n, first = store.one("SELECT count(*), min(created_at) FROM sessions WHERE project_id = ?",
                                     [from_project]) or (0, None)  # an aggregate: always one row
                if n == 0:
                    return 0
                store.ensure_project(to_project, first)  # the sessions' own clock, never the wall clock
                store.con.execute("UPDATE sessions SET project_id = ? WHERE project_id = ?",
                                  [to_project, from_project]).fetchall()
                store.con.execute(
                    "UPDATE session_prompt_deltas SET project_id = ? WHERE session_id IN "
                    "(SELECT id FROM sessions WHERE project_id = ?) AND project_id = ?",
                    [to_project, to_project, from_project],
                ).fetchall()
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
    ) -> Session:
        """Replay a scenario under one strategy and cache model; returns the session.

        Each replay gets its own knowledge project (``<scenario project>/<strategy>``, suffixed when taken)
        so side-by-side replays never see each other's knowledge edits.
        """
        from .scenario import load_scenario

        sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        strat = get_strategy(strategy)
        base = project or f"{sc.project}/{strat.name}"
        project_id, k = base, 1
        while self.store.one("SELECT 1 FROM projects WHERE id = ?", [project_id]) is not None:
            k += 1
            project_id = f"{base}-{k}"
        s = self.session(strat.name, cache, sc.model, project=project_id, system=sc.host_prompt,
                         tools=list(sc.tools), start=sc.start, backend=backend, cache_params=cache_params,
                         strategy_params=strategy_params)
        if project_id != base:
            # Replaying again (a re-run cell): derive generated ids from the first replay's names, so the
            # same scenario gives the same entry ids, bytes and token counts; knowledge stays separate.
            sessions = self.sessions()
            first = sessions[sessions["project_id"] == base]["id"]
            s._state["extra"]["_id_namespace"] = {"project": base,
                                                  "session": str(first.iloc[0]) if len(first) else s.id}
        for spec in sc.knowledge:
            s.knowledge.add(spec.title, spec.content, category=spec.category, key=spec.key, at=sc.start)
        s._pending_events = []
        s._persist_pending()
        show = self.progress if progress is None else progress
        played = sc.turns if stop_after is None else sc.turns[:stop_after]
        bar = progress_bar(total=sum(1 + len(t.tool_calls) for t in played), desc=f"{sc.name} · {strat.name}",
                           enabled=show, unit="req")
        at = sc.start
        try:
            for i, turn in enumerate(sc.turns):
                if stop_after is not None and i >= stop_after:
                    break
                if i > 0:
                    at = at + turn.after
                # a scenario turn's events and its requests are one transaction (as the Stepper's "Next
                # turn"): a kill between an event and its request leaves neither, so continuing the scenario
                # from the stored position never applies an event twice
                with self.atomic():
                    for event in turn.events:
                        s = s.apply(event, at=at)
                    t = s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
                at = t.at
                bar.update(1 + len(turn.tool_calls))
        except PromptCacheError as exc:
            if turn.line and sc.path:
                exc.args = (f"{sc.path}:{turn.line}: turns[{i}]: {exc}",)
            raise
        finally:
            bar.close()
        return s
