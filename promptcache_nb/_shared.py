"""What the sessions of one Lab share: the simulated provider caches (one per cache scope) and each project's
knowledge, as two objects a Lab owns and hands to its sessions (``_protocols.SessionHost``).

A provider caches per account, not per conversation: sessions of one cache scope (``session``, ``project``,
``account`` or ``lab``; ``lab.new_session(cache_scope=...)``) with the same cache model and parameters share one
simulated cache. Imported sessions are in the ``account`` scope: the provider never shares a cache across
organisations (Anthropic's API also isolates workspaces; Bedrock per AWS account, Vertex per project, OpenAI and
Gemini per organisation / project), and shares it within one, so that is who shares a simulated cache.
A cache outlives a restarted Session object (a provider's cache does not restart with the agent) and is rebuilt
from the store when missing or when it may have seen a request the store lost.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from . import analysis as _analysis
from ._config import DEFAULT_ACCOUNT, SessionConfig
from .cache import CacheModel, get_cache_model
from .errors import PromptCacheError
from .request import PreparedRequest, SegmentMemo, canonical_json

if TYPE_CHECKING:
    from ._protocols import LabLike
    from .analysis.resimulate import StoredTurn
    from .store import KnowledgeEntry, Store

#: (scope, its owner, cache model, canonical parameters): sessions with equal keys share one simulated cache.
ScopeKey = tuple[str, str, str, str]

#: Who shares a simulated provider cache (``lab.new_session(cache_scope=...)``).
CACHE_SCOPES = ("session", "project", "account", "lab")

#: Cache parameters that belong to a client, not to the cache: sessions that differ only in them share one cache,
#: each sending under its own (an imported Claude Code session's ``client_ttls`` are its own client's, and an entry
#: keeps the TTL of the session that wrote it; ``CacheModel.use_options``).
PER_CLIENT_PARAMS = frozenset({"client_ttls"})


def stored_cache_scope(configured: str | None, *, imported: bool) -> str:
    """A stored session's cache scope: as configured, else ``project`` for an imported session (what an import
    stored before the ``account`` scope existed) and ``session`` for a simulated one."""
    if configured is not None:
        return configured
    return "project" if imported else "session"


def cache_scope_of(row: Mapping[str, Any]) -> str:
    """A stored session row's cache scope (:func:`stored_cache_scope`; a row without a strategy is imported)."""
    return stored_cache_scope(SessionConfig.stored_cache_scope(row["config"]), imported=row.get("strategy") is None)


def account_of(row: Mapping[str, Any]) -> str:
    """A stored session row's account (:data:`DEFAULT_ACCOUNT` when its config names none)."""
    return str(row["config"].get("account") or DEFAULT_ACCOUNT)


def scope_key(scope: str, session_id: str, project_id: str, cache_model: str,
              cache_params: Mapping[str, Any], account: str | None = None) -> ScopeKey:
    """(scope, its owner, cache model, parameters): sessions with equal keys share one simulated cache. The
    owner is the session, its project, its account (``account``, else :data:`DEFAULT_ACCOUNT`) or the Lab."""
    owner = {"session": session_id, "project": project_id, "account": account or DEFAULT_ACCOUNT}.get(scope, "")
    shared = {k: v for k, v in cache_params.items() if scope == "session" or k not in PER_CLIENT_PARAMS}
    return (scope, owner, cache_model, canonical_json(shared))


def _scope_key_of(row: Mapping[str, Any]) -> ScopeKey:
    """The scope key of a stored session row."""
    config = SessionConfig.from_stored(row["config"])
    return scope_key(cache_scope_of(row), row["id"], row["project_id"], row["cache_model"], config.cache_params,
                     config.account)


@dataclass(frozen=True)
class ScopeMember:
    """A session as its simulated cache sees it: which scope it belongs to, with which cache model."""

    session_id: str
    project: str
    scope: str  #: ``session``, ``project``, ``account`` or ``lab``
    cache_model: str
    cache_params: Mapping[str, Any]
    account: str | None = None  #: the provider account, for the ``account`` scope (None: the default one)

    @property
    def key(self) -> ScopeKey:
        return scope_key(self.scope, self.session_id, self.project, self.cache_model, self.cache_params,
                         self.account)

    def new_model(self) -> CacheModel:
        return get_cache_model(self.cache_model, **self.cache_params)

    def options(self, model: CacheModel) -> CacheModel.Options:
        """This member's own options for ``model`` (its scope's): what its requests are processed under."""
        return own_options(model, self.cache_params)


def own_options(model: CacheModel, cache_params: Mapping[str, Any]) -> CacheModel.Options:
    """A session's own options (``cache_params``, its client's TTLs included) for its scope's ``model``."""
    return type(model).Options.stored(cache_params, owner=f"cache model {model.name!r}")


@dataclass
class ScopeCache:
    """A simulated provider cache shared by the sessions of one cache scope."""

    model: CacheModel
    ready: bool = False


@dataclass(frozen=True)
class CacheWindow:
    """Where a rebuild of a session's simulated cache starts: ``since`` (None: at its first request)."""

    since: datetime | None


class ScopeCaches:
    """The simulated provider caches of one Lab, one per cache scope (:data:`ScopeKey`), rebuilt from the store
    when missing or stale.

    Weak: the sessions using a cache hold it (``get``), so a Lab that ran many replays does not keep every cache
    they built. ``lab`` is held weakly too (sessions hold their Lab, never the reverse).
    """

    def __init__(self, lab: LabLike) -> None:
        self._lab = weakref.ref(lab)
        self._caches: weakref.WeakValueDictionary[ScopeKey, ScopeCache] = weakref.WeakValueDictionary()
        # the segment memo of each open session (its tokenizer and counts), used when its requests are rebuilt
        self._memos: weakref.WeakValueDictionary[str, SegmentMemo] = weakref.WeakValueDictionary()
        # requests a resuming session already read for a rebuild of its session-scoped cache (``preload``)
        self._preloaded: dict[str, tuple[CacheWindow, list[StoredTurn]]] = {}

    def _host(self) -> LabLike:
        lab = self._lab()
        assert lab is not None  # a session holds its Lab while it uses the Lab's caches
        return lab

    @property
    def _store(self) -> Store:
        return self._host().store

    # -- what sessions say ------------------------------------------------------------------------
    def attach(self, session_id: str, memo: SegmentMemo) -> None:
        """An open session's segment memo: a rebuild counts its requests with it (its tokenizer, its counts)."""
        self._memos[session_id] = memo

    def detach(self, session_id: str, memo: SegmentMemo) -> None:
        """The session object that attached ``memo`` stopped working."""
        if self._memos.get(session_id) is memo:
            del self._memos[session_id]
        self._preloaded.pop(session_id, None)

    def preload(self, session_id: str, loaded: tuple[CacheWindow, list[StoredTurn]] | None) -> None:
        """The requests a resuming session read from a :meth:`window`, kept for the rebuild of its cache that
        comes next (used once): the store is not read twice. None: it read none (forgets an earlier one)."""
        if loaded is None:
            self._preloaded.pop(session_id, None)
        else:
            self._preloaded[session_id] = loaded

    # -- the caches -------------------------------------------------------------------------------
    def get(self, member: ScopeMember) -> ScopeCache:
        """The cache of ``member``'s scope, rebuilt from the store when none is ready. The caller holds it."""
        key = member.key
        entry = self._caches.get(key)
        if entry is None:
            entry = self._caches[key] = ScopeCache(member.new_model())
        if not entry.ready:
            self._rebuild(key, entry, member)
        return entry

    def existing(self, member: ScopeMember) -> ScopeCache | None:
        """The cache of ``member``'s scope if one is held (ready or not); never builds one."""
        return self._caches.get(member.key)

    def model_for_validation(self, member: ScopeMember) -> CacheModel:
        """A cache model of ``member``'s kind to check a model id with (the scope's, else a new one)."""
        entry = self.existing(member)
        return entry.model if entry is not None else member.new_model()

    def drop(self, member: ScopeMember) -> None:
        """``member``'s cache may have seen a request the store did not keep: rebuilt on next use."""
        entry = self.existing(member)
        if entry is not None:
            entry.ready = False

    def drop_all(self) -> None:
        """Every cache may have seen requests the store lost (a rollback, a deleted session)."""
        for entry in list(self._caches.values()):
            entry.ready = False

    def window(self, member: ScopeMember, last_at: datetime) -> CacheWindow | None:
        """Where a rebuild of ``member``'s cache would start, when no ready cache is held for it and its scope is
        the session alone; None otherwise."""
        if member.scope != "session":
            return None
        entry = self.existing(member)
        if entry is not None and entry.ready:
            return None
        try:
            model = entry.model if entry is not None else member.new_model()
        except (PromptCacheError, TypeError, ValueError):
            return None  # the session still opens; its first simulated request says what is wrong
        return CacheWindow(self._rebuild_since(model, [member.session_id], last_at))

    def _rebuild_since(self, model: CacheModel, members: list[str], last_at: datetime | None) -> datetime | None:
        """The first request time a rebuild of ``model`` over ``members`` must replay from (None: the first
        request): after the last pause nothing survived (``state_horizon_seconds``), and within the model's
        ``replay_window_seconds`` before the last request."""
        horizon = model.state_horizon_seconds()
        since = self._store.after_last_pause(members, horizon) if horizon is not None else None
        window = model.replay_window_seconds()
        if window is not None and last_at is not None:
            cut = last_at - timedelta(seconds=window)
            since = cut if since is None else max(since, cut)
        return since

    def _rebuild(self, key: ScopeKey, entry: ScopeCache, member: ScopeMember) -> None:
        """Rebuild a scope's cache from the requests that can still matter (:meth:`_rebuild_since`: never from
        before a pause nothing survives, and within the model's replay window before the scope's last request;
        all of them for an LRU cache). Their bodies are rebuilt in bulk (one set of queries per session), and
        the sessions' requests are replayed in time order."""
        lab = self._host()
        store = lab.store
        model = entry.model
        model.reset()
        model.forget_streams()
        own: dict[str, CacheModel.Options] = {}  # each member's own options (its client's TTLs)
        if member.scope == "session":
            members = [member.session_id]
        else:
            # a usage-first session has no bodies to replay: it joins the scope's cache once analysed
            unanalysed = store.unanalysed_ids()
            rows = [r for r in store.session_rows(member.cache_model)
                    if _scope_key_of(r) == key and r["id"] not in unanalysed]
            members = [r["id"] for r in rows]
            own = {r["id"]: own_options(model, SessionConfig.from_stored(r["config"]).cache_params) for r in rows}
        last_at = store.last_request_at(members)
        if own:  # entries live as long as the longest-lived member's client keeps them
            model.use_options(max(own.values(), key=lambda o: _horizon(model, o)))
        since = self._rebuild_since(model, members, last_at)
        # only the members that sent since then are read back (one query): a heavy user's project holds hundreds
        # of sessions, a few of them recent (each read cost ~4 ms even when it found nothing)
        sending = set(store.sessions_sending_between(members, since, last_at)) if last_at is not None else set()
        requests: list[tuple[datetime, str, int, PreparedRequest]] = []
        for sid in members:
            preloaded = None
            resume = self._preloaded.pop(sid, None)
            if sid not in sending:
                continue
            if resume is not None:
                window, turns = resume
                start = window.since
                if start is None and since is None or start is not None and since is not None and start <= since:
                    preloaded = [t for t in turns if since is None or t.at >= since]
            if preloaded is None:
                preloaded = _analysis.load_turns(lab, sid, since=since, memo=self._memos.get(sid))
            requests.extend((t.at, sid, t.idx, t.request) for t in preloaded)
        if len(members) > 1:
            requests.sort(key=lambda r: r[:3])
        for at, sid, _idx, request in requests:
            model.stream(sid)
            if own:
                model.use_options(own[sid])
            # a stored request the model cannot simulate (an unknown model, stored with measured usage) is
            # skipped, as when it was recorded: it never breaks the session
            _analysis.simulate(model, request, at)
        entry.ready = True


def _horizon(model: CacheModel, options: CacheModel.Options) -> float:
    """How long an entry can live under ``options`` (seconds; unbounded: infinity). Leaves ``model`` on them."""
    model.use_options(options)
    horizon = model.state_horizon_seconds()
    return float("inf") if horizon is None else horizon


# -- knowledge ------------------------------------------------------------------------------------
@dataclass
class _ProjectKnowledge:
    """What is kept of a project's knowledge between changes: read from the store once, then kept up to date by
    each committed change (``KnowledgeCache.changed``); dropped whole when a rollback may have undone one."""

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


class KnowledgeCache:
    """Each project's current knowledge, read from the store once and then kept up to date (every request of
    its sessions needs it)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._projects: dict[str, _ProjectKnowledge] = {}

    def entries(self, project: str) -> list[KnowledgeEntry]:
        """A project's current knowledge, ordered by id. Treat it as read-only."""
        held = self._projects.setdefault(project, _ProjectKnowledge())
        if held.entries is None:
            held.entries = self._store.knowledge(project)
        return held.entries

    def numbered(self, project: str) -> int:
        """How many entries ``project`` ever had, removed ones included: the number of the next one added."""
        held = self._projects.setdefault(project, _ProjectKnowledge())
        if held.numbered is None:
            held.numbered = self._store.knowledge_count(project)  # one scan per project, not one per add
        return held.numbered

    def changed(self, project: str, changed: Sequence[KnowledgeEntry], *, added: int = 0) -> None:
        """New versions of ``project``'s entries (``added`` of them new entries) are stored: the copy follows
        them instead of reading the whole book again."""
        held = self._projects.get(project)
        if held is None:
            return
        if held.entries is not None:
            held.entries = _with_changes(held.entries, changed)
        if held.numbered is not None:
            held.numbered += added

    def clear(self) -> None:
        """Forget everything (a rollback may have undone a change)."""
        self._projects.clear()
