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
import sys
import warnings
from datetime import datetime
from typing import Any, Protocol

from . import analysis as _analysis
from ._shared import CACHE_SCOPES, cache_scope_of  # noqa: F401 - re-exported from their old home
from .errors import SessionError
from .live import Backend
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
from .session_core import CoreHost
from .session_core import check_texts as check_texts  # its old home: the workspace checks texts with it too
from .session_knowledge import KnowledgeBook
from .session_record import SessionRecording
from .session_views import SessionViews
from .store import Store
from .turn import TURN_COLUMNS  # noqa: F401 - re-exported from its old home

COMPACTION_HEADER = "Summary of the conversation so far:\n\n"
COMPACTION_ACK = "Understood. I have the summary and will continue from it."


class SessionHost(CoreHost, Protocol):
    """What a Session is handed by its Lab: the store, what sessions share, and reopening."""

    def open_session(self, session_id: str, *, backend: Backend | None = None) -> Session: ...


class Session(SessionViews, SessionRecording):
    """One agent conversation under one strategy and one cache model. Create with :meth:`Lab.new_session`, continue
    a stored one with :meth:`Lab.open_session`.

    Its parts: the state and how it changes (``session_core.py``), the request path (``session_record.py``), the
    reads back (``session_views.py``), the knowledge book (``session_knowledge.py``)."""

    _lab: SessionHost  # the Lab that opened it, which can also reopen it (restart)

    @property
    def lab(self) -> SessionHost:
        """The Lab this session belongs to (its store, tokenizer and path)."""
        return self._lab

    @property
    def knowledge(self) -> KnowledgeBook:
        """The project's long-term knowledge (a view made on access: no Session <-> book reference cycle)."""
        return KnowledgeBook(self)

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

    def __repr__(self) -> str:
        strategy = "imported" if self.strategy is None else repr(self.strategy)
        return (f"Session({self.id!r}, strategy={strategy}, cache={self.cache!r}, model={self.model!r}, "
                f"project={self.project!r}, turns={self._state.next_index})")


_WARNED: set[str] = set()


def __getattr__(name: str) -> Any:
    """``promptcache_nb.session.Lab``, the name's old home, still works (one DeprecationWarning): the Lab is read
    from the loaded package, never imported from here (a session never imports the Lab)."""
    if name == "Lab":

        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn("promptcache_nb.session.Lab moved: use promptcache_nb.Lab", DeprecationWarning,
                          stacklevel=2)
        return sys.modules["promptcache_nb"].Lab  # loaded: importing this module loads the package first
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
