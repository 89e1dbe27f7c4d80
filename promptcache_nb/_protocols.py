"""The seams between a Lab, its sessions and the functions that read them, as protocols (a leaf: no runtime
imports of the package).

* :class:`LabLike`: what reading a stored session needs (a store, a tokenizer, a path): a
  :class:`~promptcache_nb.Lab`.
* :class:`StoredSession`: a session object (its id and Lab): a :class:`~promptcache_nb.Session`.
* :class:`SessionHost`: what a Session is handed by the Lab that opens it: the store, the shared simulated caches
  and knowledge cache (``_shared.py``), and a way to open a session again (``Session.restart``). A Session never
  imports the Lab; the Lab calls only a Session's public methods.
* :func:`on_record`: who hears of each request stored into a session (a capture's live monitor, a savings
  chart): the session announces a request once its transaction committed, whoever sent it (a step, a Stepper
  click, a capture, ``record``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: a leaf imports no stage
    from ._shared import KnowledgeCache, ScopeCaches
    from .live import Backend
    from .session import Session, Turn
    from .store import Store
    from .tokens import Tokenizer


class LabLike(Protocol):
    """A workspace of stored sessions (a :class:`~promptcache_nb.Lab`)."""

    @property
    def store(self) -> Store: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def path(self) -> str: ...


@runtime_checkable
class StoredSession(Protocol):
    """A session object: its id and the Lab that stores it (a :class:`~promptcache_nb.Session`)."""

    @property
    def id(self) -> str: ...

    @property
    def lab(self) -> LabLike: ...


class SessionHost(LabLike, Protocol):
    """What a Session is handed by its Lab: the store, what sessions share, and reopening."""

    @property
    def caches(self) -> ScopeCaches: ...

    @property
    def knowledge_cache(self) -> KnowledgeCache: ...

    def open_session(self, session_id: str, *, backend: Backend | None = None) -> Session: ...


def resolve_session(lab_or_session: LabLike | StoredSession, session_id: str | None) -> tuple[LabLike, str]:
    """(lab, session id) from ``(lab, id)`` or a Session (``session_id`` omitted)."""
    if session_id is None:
        if not isinstance(lab_or_session, StoredSession):
            raise TypeError("pass a Session, or a Lab and a session_id")
        return lab_or_session.lab, lab_or_session.id
    if isinstance(lab_or_session, StoredSession):
        return lab_or_session.lab, session_id  # a Session and another id: that session of the same Lab
    return lab_or_session, session_id


def ensure_analysed(lab: LabLike, session_id: str) -> None:
    """Analyse ``session_id``'s bodies when a usage-first import stored only its measured figures (the first use
    of a session's bodies: ``Lab.analyze``); nothing otherwise."""
    if session_id in lab.store.unanalysed_ids():
        analyze = getattr(lab, "analyze", None)
        if analyze is not None:
            analyze([session_id], progress=False)


# Listeners by session id (a restarted Session object keeps its id, so they follow it); a capture stores from the
# thread that finished its call, hence the lock.
_LISTENERS_LOCK = threading.RLock()
_LISTENERS: dict[str, list[Callable[[Turn], None]]] = {}


def on_record(session: StoredSession | str, fn: Callable[[Turn], None]) -> Callable[[], None]:
    """Call ``fn(turn)`` after each request stored into ``session`` (once committed, in order); returns the
    unsubscribe function.

    ``fn`` runs in the thread that stored the request (the kernel's, or the one a capture's call finished in);
    an exception in it is logged, never raised into the step, click or SDK call that stored the request.
    """
    sid = session if isinstance(session, str) else session.id
    with _LISTENERS_LOCK:
        _LISTENERS.setdefault(sid, []).append(fn)

    def unsubscribe() -> None:
        with _LISTENERS_LOCK:
            fns = _LISTENERS.get(sid, [])
            if fn in fns:
                fns.remove(fn)
            if not fns:
                _LISTENERS.pop(sid, None)

    return unsubscribe


def has_record_listeners(session_id: str) -> bool:
    """Whether anyone listens (an import of 10k requests skips the bookkeeping when no one does)."""
    return session_id in _LISTENERS


def notify_recorded(session_id: str, turns: Sequence[Turn]) -> None:
    """Tell ``session_id``'s listeners of ``turns`` (just committed), each listener every turn in order."""
    with _LISTENERS_LOCK:
        fns = list(_LISTENERS.get(session_id, ()))
    for turn in turns:
        for fn in fns:
            try:
                fn(turn)
            except Exception:
                logging.getLogger(__name__).exception("a listener of session %s failed", session_id)
