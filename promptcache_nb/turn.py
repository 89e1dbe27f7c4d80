"""Turn: one stored request as a session hands it back, and who hears of each one stored (:func:`on_record`).

A capture's live monitor or a savings chart subscribes with :func:`on_record`; the session announces a request once
its transaction committed, whoever sent it (a step, a Stepper click, a capture, ``record``).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from .request import PreparedRequest, canonical_bytes, prepare
from .usage import Usage

if TYPE_CHECKING:
    from .cache import CacheResult

# Columns of s.turns(): everything a notebook user wants, JSON blobs left in SQL.
TURN_COLUMNS = (
    "idx", "sent_at", "model", "user_text", "events", "n_segments", "total_tokens",
    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens", "output_tokens", "reasoning_tokens",
    "usage_source", "ideal_cache_read", "cost_usd", "cost_no_cache_usd", "cache_reason", "diverge_path", "diverge_byte",
    "diverge_token", "shared_prefix_tokens", "pure_append", "broke", "openclaw_broke", "previous_cache_read", "changes",
    "explanation", "request_id", "body_problems", "cost_source", "notes", "latency_ms",
    "provider_cache_miss_reason", "provider_cache_missed_tokens",
)


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
        cost_source: where ``cost_usd`` came from (``turns.cost_source``): a price source, or ``reported by
            provider`` (the response's own ``usage.cost``); None when unpriced. ``usage.notes`` says what the
            figures assumed.
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
        cost_source: str | None = None,
    ) -> None:
        self.cost_source = cost_source
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
        self._reply = reply
        self.request_id = request_id
        self.cache_result = cache_result
        self.diff = diff
        self.observation = observation
        self._prepared = prepared
        self._body: bytes | None = None
        self._prompt_cache_info = prompt_cache_info
        self._segment_states = segment_states

    @property
    def reply(self) -> list[dict[str, Any]] | None:
        """The answer's content blocks (a private copy, made on first use: never the history's own objects;
        an import makes thousands of Turns and reads none of them)."""
        if "_reply_copy" not in self.__dict__:
            self.__dict__["_reply_copy"] = copy.deepcopy(self._reply)
        return cast("list[dict[str, Any]] | None", self.__dict__["_reply_copy"])

    @reply.setter
    def reply(self, value: list[dict[str, Any]] | None) -> None:
        self.__dict__["_reply_copy"] = value

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


class HasId(Protocol):
    """A session object, as far as its listeners are concerned: its id."""

    @property
    def id(self) -> str: ...


# Listeners by session id (a restarted Session object keeps its id, so they follow it); a capture stores from the
# thread that finished its call, hence the lock.
_LISTENERS_LOCK = threading.RLock()
_LISTENERS: dict[str, list[Callable[[Turn], None]]] = {}


def on_record(session: HasId | str, fn: Callable[[Turn], None]) -> Callable[[], None]:
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
