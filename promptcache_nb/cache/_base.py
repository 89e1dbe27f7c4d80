"""The interface every provider cache model implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar

from .._options import Options
from ..request import PreparedRequest
from ..usage import Usage

# Why a request read less than the previous request left behind. Stable codes, used in the store.
REASONS = (
    "hit",  # read everything the previous request made cacheable
    "cold",  # first request of the session: nothing to read yet
    "model_switch",  # caches are keyed by model
    "below_minimum",  # prefix shorter than the model's minimum cacheable length
    "ttl_expired",  # an entry matched but had outlived its TTL
    "lookback_exceeded",  # a live entry exists, further back than the 20-position lookback
    "prefix_changed",  # the bytes before the previous breakpoint changed
    "no_breakpoint",  # nothing in the request asks for caching
    "not_written",  # the previous request wrote no entry covering what this one re-sends
    "evicted",  # capacity eviction (LRU caches)
    "unsupported",  # the provider cannot cache this request at all
)


@dataclass(frozen=True)
class CacheResult:
    """What a cache model decided for one request.

    ``segment_states`` has one of ``read``, ``write`` or ``uncached`` per segment, for segment maps.
    ``native`` is the usage object exactly as the provider's API would report it.
    """

    usage: Usage
    reason: str
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
    """A simulated provider prompt cache. Stateful: feed it a session's requests in order."""

    name: ClassVar[str]
    known_models: ClassVar[tuple[str, ...]] = ()
    #: The constructor's keyword parameters as a typed model (what ``get_cache_model`` validates).
    Options: ClassVar[type[Options]] = Options

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

    def retention_points(self, request: PreparedRequest) -> list[tuple[int, float]]:
        """(prefix tokens, lifetime in seconds) pairs: how much of ``request`` a later request could still
        read after a gap. The ideal cache read after a gap keeps the longest prefix whose lifetime covers it."""
        return [(request.total_tokens, self.default_ttl_seconds(request))]
