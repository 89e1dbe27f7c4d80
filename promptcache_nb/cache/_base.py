"""The interface every provider cache model implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar

from .._options import Options as _Options
from ..request import PreparedRequest
from ..usage import Usage
from ._reasons import REASONS, Reason  # noqa: F401 - re-exported: the codes ``CacheResult.reason`` takes


@dataclass(frozen=True)
class CacheResult:
    """What a cache model decided for one request.

    ``segment_states`` has one of ``read``, ``write`` or ``uncached`` per segment, for segment maps.
    ``native`` is the usage object exactly as the provider's API would report it.
    """

    usage: Usage
    reason: Reason  #: why the request read less than it could (a str subclass: stored as its code)
    detail: dict[str, Any] = field(default_factory=dict)
    segment_states: tuple[str, ...] = ()
    native: dict[str, Any] = field(default_factory=dict)

    def as_prediction(self) -> CacheResult:
        """This result with its usage copied into ``detail["predicted_usage"]``: how a request whose
        measured usage is stored keeps what the simulator expected, to compare the two."""
        predicted = {f: getattr(self.usage, f) for f in PREDICTED_FIELDS}
        return replace(self, detail={**self.detail, "predicted_usage": predicted})


PREDICTED_FIELDS = (
    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens",
)


class CacheModel(ABC):
    """A simulated provider prompt cache. Stateful: feed it a session's requests in order.

    A model declares its parameters once, in a nested ``Options`` model (a subclass of ``CacheModel.Options``,
    described fields with defaults), and reads ``self.options.x``; the constructor takes the same names as
    keyword arguments and checks them (:class:`~promptcache_nb.InvalidOptionError`, one line naming the valid
    ones); its signature and the ``Args:`` of its docstring come from the model.
    """

    name: ClassVar[str]
    known_models: ClassVar[tuple[str, ...]] = ()

    class Options(_Options):
        """The cache model's parameters (what ``get_cache_model`` validates); none by default."""

    #: The validated parameters this model simulates with.
    options: Options

    def __init__(self, **options: Any) -> None:
        self.options = type(self).Options.check(options, owner=f"cache model {self.name!r}")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = cls.Options.signature()  # type: ignore[attr-defined] # read by inspect.signature
        cls.__doc__ = cls.Options.document(cls.__doc__)
        if "Options" in cls.__dict__ and cls.Options.__doc__ is None:  # its own, undocumented: named after it
            cls.Options.__doc__ = f"Parameters of :class:`{cls.__name__}`."

    @abstractmethod
    def process(self, request: PreparedRequest, at: datetime) -> CacheResult:
        """Apply one request at time ``at`` (UTC) and return its usage (output_tokens unset).

        A request the model cannot simulate (an unknown model, an invalid breakpoint layout) raises a
        :class:`~promptcache_nb.PromptCacheError` *before* any state changes, so callers holding measured
        usage can skip it and go on with the same cache."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every cached entry."""

    def validate_model(self, model: str) -> str:
        """Return the canonical model name, or raise UnknownModelError listing the valid ones."""
        return model

    def default_ttl_seconds(self, request: PreparedRequest) -> float:
        """The lifetime the request's cache entries get; used for ideal-read gap checks."""
        return 300.0

    def min_cacheable_tokens(self, model: str) -> int:
        """The shortest prefix this provider caches for ``model`` (0: no minimum)."""
        return 0

    def ttls_for(self, model: str) -> tuple[str, ...]:
        """The lifetimes a request's cache markers may ask for on ``model`` (``"5m"``, ``"1h"``), shortest first:
        what a TTL fix may choose and a keep-warm ping must beat. Empty when the client chooses none (the
        provider decides how long entries live)."""
        return ()

    def retention_points(self, request: PreparedRequest) -> list[tuple[int, float]]:
        """(prefix tokens, lifetime in seconds) pairs: how much of ``request`` a later request could still
        read after a gap. The ideal cache read after a gap keeps the longest prefix whose lifetime covers it."""
        return [(request.total_tokens, self.default_ttl_seconds(request))]

    def state_horizon_seconds(self) -> float | None:
        """The longest an entry can live without being touched (seconds), or None when nothing bounds it
        (an LRU cache without TTL).

        Resuming a session rebuilds the simulated cache from the stored requests, and never from before a
        pause at least this long between two requests: nothing written before it survives the pause, so
        the rebuild is exact from the request after it.
        """
        return None

    def replay_window_seconds(self) -> float | None:
        """How far before the last request a rebuild needs to replay (seconds), or None: back to the last
        pause of :meth:`state_horizon_seconds` (or the first request).

        The default is the horizon itself: every entry alive after the last request was written or
        refreshed within it, so the requests before add nothing but the outcome of the window's first
        requests (which the replay starts cold). That is exact whenever those requests' writes and
        refreshes leave the same entries as the original's hits — as they do for a breakpoint layout that
        keeps its positions and TTLs. Models whose state keeps older information return None.
        """
        return self.state_horizon_seconds()

    # -- request streams: one cache shared by several sessions --------------------------------------------
    #: Attributes that describe "the previous request" of the request stream being processed — what reason
    #: codes compare against and what incremental shortcuts extend. A cache shared by several sessions (a
    #: project's sub-agents and compaction calls reading the parent's entries) keeps one set per session
    #: (:meth:`stream`), so a session's reasons never compare against another session's request.
    stream_state: ClassVar[tuple[str, ...]] = ()

    def stream(self, key: Hashable) -> None:
        """Make ``key``'s request stream current: later :meth:`process` calls compare against that stream's
        previous request. Entries are shared by every stream; a model only ever used by one stream never
        switches (its first stream after :meth:`reset` keeps the model's own state)."""
        d = self.__dict__
        if "_stream_key" not in d:
            self._stream_key = key
            return
        current = d["_stream_key"]
        if current == key:
            return
        streams: dict[Hashable, dict[str, Any]] = d.setdefault("_streams", {})
        streams[current] = {a: getattr(self, a) for a in self.stream_state}
        saved = streams.pop(key, None)
        if saved is None:  # a new stream has no previous request: a reset model's values
            fresh = object.__new__(type(self))
            fresh.__dict__.update(d)
            type(self).reset(fresh)
            saved = {a: getattr(fresh, a) for a in self.stream_state}
        for a, v in saved.items():
            setattr(self, a, v)
        self._stream_key = key
        self._stream_switched()

    def _stream_switched(self) -> None:  # noqa: B027 - a hook: most models keep no such shortcut
        """Another stream may have run since this one's last request: drop shortcuts that assumed not."""

    def use_options(self, options: CacheModel.Options) -> None:
        """Process the next requests under ``options`` (checked: an ``Options`` of this model), keeping every entry.

        A replay of several sessions through one cache gives each its own stream and, with this, its own
        options: an imported Claude Code session's ``client_ttls`` are its own client's, and an entry keeps the
        TTL of the session that wrote it."""
        if options is not self.options:
            self.options = options
            self._options_changed()

    def _options_changed(self) -> None:  # noqa: B027 - a hook: most models derive nothing from their options
        """:meth:`use_options` replaced the options: recompute what was derived from them."""

    def forget_streams(self) -> None:
        """After :meth:`reset`: no stream has a previous request any more."""
        self.__dict__.pop("_streams", None)
        self.__dict__.pop("_stream_key", None)
