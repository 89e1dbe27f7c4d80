"""A session's view of its project's long-term knowledge (``s.knowledge``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from ._lazy import pandas as pd
from ._util import digest, utc
from .errors import KnowledgeError
from .request import visible
from .session_core import SessionCore, check_texts
from .store import KnowledgeEntry, Store

#: A new knowledge entry's title, content, category and key (``KnowledgeBook`` has a method named ``list``).
_EntrySpec = tuple[str, str, str, "str | None"]
_EntrySpecs = list[_EntrySpec]
_EntryIds = list[str]


class KnowledgeBook:
    """A session's view of its project's long-term knowledge. Changes apply before the next turn."""

    def __init__(self, session: SessionCore) -> None:
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
