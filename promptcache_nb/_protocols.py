"""What reading a stored session needs, as protocols (a leaf: no runtime imports of the package), so the
functions that read stored sessions (``analysis/``) never import the Lab or the Session.

* :class:`LabLike`: what reading a stored session needs (a store, a tokenizer, a path): a
  :class:`~promptcache_nb.Lab`.
* :class:`StoredSession`: a session object (its id and Lab): a :class:`~promptcache_nb.Session`.

What a Session is handed by its Lab (``SessionHost``) is declared beside the Session, which needs it
(``session.py``); who hears of each request stored is ``turn.on_record``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: a leaf imports no stage
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
