"""SessionConfig: a stored session's configuration, as one typed value.

The store keeps it as canonical JSON in ``sessions.config``; :meth:`SessionConfig.from_stored` reads that dict
and :meth:`SessionConfig.to_stored` writes it back key for key (an unknown key a later version stored is kept
in ``extra``), so a config read and written again is byte-identical. Nothing outside this module reads the
dict by key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

#: The account of sessions whose log names none and whose import gave none: a user's own logs are one account.
DEFAULT_ACCOUNT = "local"

#: Keys every stored config has (a session created by ``Lab.new_session`` or ``Lab.create_session``).
_BASE_KEYS = ("start", "step_seconds", "cache_params", "strategy_params", "cache_scope", "prices", "calibration")
#: Keys an imported session's config has as well (``format`` given), each stored even when None.
_IMPORT_KEYS = ("format", "session_key", "session_kind", "unlogged_prefix_tokens")
#: Keys stored only when set (a config without them reads and writes back byte-identical).
_OPTIONAL_KEYS = ("unlogged_prefix_of", "unlogged_prefix_read")


@dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """What a session was created with (``sessions.config``). Treat the mappings as read-only.

    Example:
        >>> from datetime import UTC, datetime
        >>> cfg = SessionConfig(start=datetime(2026, 1, 5, tzinfo=UTC))
        >>> cfg.to_stored()["step_seconds"]
        30.0
    """

    start: datetime  #: the session clock's first timestamp (UTC)
    step_seconds: float = 30.0  #: the default gap between turns (an int is kept as given: imports store 30)
    cache_params: Mapping[str, Any] = field(default_factory=dict)  #: the cache model's parameters
    strategy_params: Mapping[str, Any] = field(default_factory=dict)  #: the strategy's options, validated
    #: who shares the simulated cache (``session``, ``project``, ``account``, ``lab``); None: an old store that did
    #: not say
    cache_scope: str | None = None
    #: the provider account (organisation / workspace) whose cache the session used, for the ``account`` scope;
    #: None: not said (stored only when set, so configs of other sessions keep their bytes)
    account: str | None = None
    #: explicit prices (the fields of :class:`~promptcache_nb.Prices`), None: genai-prices
    prices: Mapping[str, Any] | None = None
    #: an opted-in calibration (``model``, ``ratio``, ``overhead``), None: none
    calibration: Mapping[str, Any] | None = None
    format: str | None = None  #: imported sessions: the log format (None: a simulated session)  # noqa: A003
    session_key: str | None = None  #: imported sessions: the log's own session key
    session_kind: str | None = None  #: imported sessions: main, sub-agent, compaction...
    #: a partial log's measured unlogged prefix (system + tools), once known
    unlogged_prefix_tokens: int | None = None
    #: whose unlogged prefix it is: the identity the importer read from the log (client, version, model, working
    #: directory) and the variant of it (``ingest/_prefixes.py``); equal for sessions that shared that prefix
    unlogged_prefix_of: str | None = None
    #: the measured cache read of the session's first request (the evidence a shared unlogged prefix rests on)
    unlogged_prefix_read: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  #: stored keys this version does not know, as stored

    @property
    def imported(self) -> bool:
        """True for an imported session's config (it names its log format)."""
        return self.format is not None

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> SessionConfig:
        """The config of a stored ``sessions.config`` dict; keys an older store lacks take their defaults."""
        known = {k: stored[k] for k in (*_BASE_KEYS, *_IMPORT_KEYS, *_OPTIONAL_KEYS, "account")
                 if k in stored and k != "start"}
        for k in ("cache_params", "strategy_params"):
            if known.get(k) is None:
                known.pop(k, None)
        extra = {k: v for k, v in stored.items()
                 if k not in _BASE_KEYS and k not in _IMPORT_KEYS and k not in _OPTIONAL_KEYS and k != "account"}
        return cls(start=datetime.fromisoformat(stored["start"]), extra=extra, **known)

    @staticmethod
    def stored_cache_scope(stored: Mapping[str, Any]) -> str | None:
        """The ``cache_scope`` of a stored config dict (None when it does not say), without reading the rest."""
        scope = stored.get("cache_scope")
        return None if scope is None else str(scope)

    def to_stored(self) -> dict[str, Any]:
        """The dict the store writes as canonical JSON (what :meth:`from_stored` reads back)."""
        out: dict[str, Any] = {
            "start": self.start.isoformat(), "step_seconds": self.step_seconds,
            "cache_params": dict(self.cache_params), "strategy_params": dict(self.strategy_params),
            "cache_scope": self.cache_scope,
            **({} if self.account is None else {"account": self.account}),
            "prices": None if self.prices is None else dict(self.prices),
            "calibration": None if self.calibration is None else dict(self.calibration),
        }
        if self.format is not None:
            out.update(format=self.format, session_key=self.session_key, session_kind=self.session_kind,
                       unlogged_prefix_tokens=self.unlogged_prefix_tokens)
        elif self.unlogged_prefix_tokens is not None:
            out["unlogged_prefix_tokens"] = self.unlogged_prefix_tokens
        for key in _OPTIONAL_KEYS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update(self.extra)
        return out

    def replace(self, **changes: Any) -> SessionConfig:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return replace(self, **changes)
