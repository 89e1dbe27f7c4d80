"""Google Gemini context caching: implicit prefix caching, and explicit ``cachedContents`` as a what-if
(docs/provider_cache_rules.md#gemini, sources [G1]-[G5]).

Implicit caching, the rules modelled, each cited where it is applied:

* on by default for Gemini 2.5 and newer, no opt-in and no cost-saving guarantee [G1][G2]; the model is
  deterministic (every possible hit is taken);
* a request is cached only when its input reaches the model's **minimum input token count**, a dated table
  (:data:`MIN_CACHEABLE_TOKENS`) [G1][G1'][G5]; a hit is a prefix of at least that length;
* the hit is the longest prefix shared with any earlier live prompt of the same model ("put large and common
  contents at the beginning"; "send requests with similar prefix in a short amount of time") [G1];
* **no writes**: storing a prompt costs nothing beyond its input [G5] — read = cached, write = 0;
* the discount is genai-prices' cached-input rate of the request's own model (0.1× for the 2.5+ models today, 0.25×
  at the 2025 launch [G2][G4]), never applied here;
* usage: ``usageMetadata.cachedContentTokenCount`` is a part of ``promptTokenCount`` [G3]; ``CacheResult.native``
  is that object.

Where the docs are silent (stated assumptions, each a parameter): how long an unused prefix lives is not published
("a short amount of time" [G1]; Vertex evicts from memory "as capacity is reclaimed" [G5]) — ``lifetime`` (1 hour
by default, idle time since the prefix was last used); the hit granularity is not published — shared segments,
as for the other token-prefix caches (:mod:`promptcache_nb.cache._prefix`).

**Explicit caching** (``explicit_ttl``, off by default: a what-if, since an explicit cache is a client's choice the
request body does not show). The client puts the request's leading tools and system instruction in a
``cachedContents`` object with that TTL (default 1 hour, "no minimum or maximum bounds") [G1] and sends every request
with it while it lives; it is re-created when it expired or its content changed:

* it needs the model's minimum too [G1]; a shorter one is never created (implicit caching only);
* its lifetime runs from creation and is not refreshed by use (only an explicit update changes it) [G1];
* a request using a live one reads all of it — the hit is guaranteed [G1] — and implicit caching may read further
  [G5];
* the request that creates it reports its tokens as a *write*, billed at the standard input price (genai-prices'
  Gemini write rate is the input rate) [G5]: the create call. The use of the fresh cache by that same request is not
  billed again (an under-count of that many tokens at the cached rate);
* storage: tokens × TTL hours × the model's storage price per million tokens and hour [G4]
  (:data:`STORAGE_USD_PER_MTOK_HOUR`, or ``storage_usd_per_mtok_hour``), charged at creation and reported in
  ``CacheResult.detail`` (``storage_token_hours``, ``storage_usd``): genai-prices prices tokens, not storage, so it
  is not in ``cost_usd``.

A session of another provider's model (a Claude session re-simulated with ``cache="gemini"``) is simulated with the
rules of ``stand_in_model`` (``gemini-2.5-flash``); a Gemini id the table lacks raises UnknownModelError.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from pydantic import Field

from .._options import Duration
from .._util import parse_duration
from ..errors import UnknownModelError
from ..request import PreparedRequest
from ..usage import Usage
from ._base import CacheModel, CacheResult
from ._prefix import ChainInterner, common_prefix_len, compared, cumulative_tokens, read_only_usage, segment_path
from ._reasons import Reason

# Minimum input tokens for context caching per model: the Gemini API's table, copy of 2026-07-07 [G1'] (2.5 Flash
# and Pro at 2,048; 3.x at 4,096), with the models only earlier copies list [G1] (3 Flash Preview 1,024, 3 Pro
# Preview 4,096). Copies conflict for 2.5: 1,024 (Flash) / 2,048 (Pro) at the 2025 launch [G2], 1,024 / 4,096 in
# early 2026 [G1]; Vertex gives 2,048 for every caching request [G5] — we follow the newest copy.
MIN_CACHEABLE_TOKENS: dict[str, int] = {
    "gemini-2.5-flash": 2048,
    "gemini-2.5-pro": 2048,
    "gemini-2.5-flash-lite": 2048,  # Vertex lists it for implicit caching; 2,048 for every caching request [G5]
    "gemini-3-flash-preview": 1024,  # [G1] early 2026
    "gemini-3-pro-preview": 4096,  # [G1]
    "gemini-3.1-pro-preview": 4096,  # [G1']
    "gemini-3.5-flash": 4096,  # [G1']
    "gemini-3.6-flash": 4096,
    "gemini-3.7-flash": 4096,
    "gemini-3.8-flash": 4096,
}
MIN_TABLE_AS_OF = "2026-07-07"

# Explicit-cache storage, USD per million tokens per hour [G4]; a model not listed has no published figure here.
STORAGE_USD_PER_MTOK_HOUR: dict[str, float] = {
    "gemini-2.5-pro": 4.50,
    "gemini-2.5-flash": 1.00,
    "gemini-3.1-pro-preview": 4.50,
}

STAND_IN_MODEL = "gemini-2.5-flash"

# ``models/gemini-2.5-flash`` (the API's resource name) and a stable version suffix (``gemini-2.0-flash-001``).
_RESOURCE = re.compile(r"^(?:publishers/google/)?models/")
_VERSION = re.compile(r"-\d{3}$")

#: segment kinds a ``cachedContents`` object holds: the system instruction and the tools (and a log's unlogged
#: prefix, which stands for them)
_EXPLICIT_KINDS = frozenset({"unlogged", "tool", "system"})


def gemini_base_id(model: str) -> str:
    """A Gemini model id without its resource prefix or stable version suffix, lower-cased; anything else is kept.

    Example:
        >>> gemini_base_id("models/gemini-2.5-flash"), gemini_base_id("gemini-2.0-flash-001")
        ('gemini-2.5-flash', 'gemini-2.0-flash')
    """
    return _VERSION.sub("", _RESOURCE.sub("", model.strip().lower()))


@dataclass
class _Explicit:
    """The live ``cachedContents`` object of one model: its content (a chain node), size and expiry."""

    node: int
    tokens: int
    created: float
    expires: float


class GeminiCache(CacheModel):
    """Simulated Gemini context cache for one project (its options: :class:`GeminiCache.Options`).

    Example:
        >>> import promptcache_nb as pc
        >>> pc.get_cache_model("gemini").min_cacheable_tokens("gemini-3-pro-preview")
        4096
    """

    name: ClassVar[str] = "gemini"
    known_models: ClassVar[tuple[str, ...]] = tuple(MIN_CACHEABLE_TOKENS)

    class Options(CacheModel.Options):
        lifetime: Duration = Field("1h", description="implicit caching: a prefix unused this long is gone "
                                   "(undocumented; a duration: '1h', seconds, or a timedelta)")
        min_tokens: dict[str, int] | None = Field(None, description="per-model overrides of the minimum input "
                                                  "token table")
        stand_in_model: str = Field(STAND_IN_MODEL, description="the Gemini model whose rules a request of another "
                                    "provider's model is simulated with")
        explicit_ttl: Duration | None = Field(None, description="what-if: the client keeps its tools and system "
                                              "instruction in a cachedContents object with this TTL (None: implicit "
                                              "caching only)")
        storage_usd_per_mtok_hour: float | None = Field(None, ge=0, description="explicit caching: storage price "
                                                        "(USD per million tokens per hour) over the model's table")

    options: Options

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: the minimum input tokens per model: the documented table with ``options.min_tokens`` over it
        self.min_tokens = {**MIN_CACHEABLE_TOKENS, **(self.options.min_tokens or {})}
        #: seconds, from the options
        self.lifetime = parse_duration(self.options.lifetime).total_seconds()
        ttl = self.options.explicit_ttl
        self.explicit_ttl = None if ttl is None else parse_duration(ttl).total_seconds()
        self.validate_model(self.options.stand_in_model)
        self.reset()

    def reset(self) -> None:
        self._chains = ChainInterner()
        self._used: dict[int, float] = {}  # node id -> last time a request stored or read it
        self._explicit: dict[str, _Explicit] = {}  # model -> its live cachedContents object
        self._last_chain: list[int] = []  # the latest stored prompt (any model: chains of two models share no node)
        self._last_t = 0.0
        self._prev: dict[str, Any] | None = None

    stream_state: ClassVar[tuple[str, ...]] = ("_prev",)

    def validate_model(self, model: str) -> str:
        """The model's row of the minimum table: a Gemini id (``models/`` prefix and version suffix dropped), or
        ``stand_in_model`` for another provider's model; a Gemini id the table lacks raises UnknownModelError."""
        base = gemini_base_id(model)
        if base in self.min_tokens:
            return base
        if base.startswith("gemini"):
            raise UnknownModelError(model, list(self.min_tokens))
        return gemini_base_id(self.options.stand_in_model)

    def min_cacheable_tokens(self, model: str) -> int:
        return self.min_tokens[self.validate_model(model)]

    def state_horizon_seconds(self) -> float:
        """The longest an entry lives untouched: ``lifetime``, or the explicit TTL when longer."""
        return max(self.lifetime, self.explicit_ttl or 0.0)

    def replay_window_seconds(self) -> None:
        """None: an explicit cache lives from its creation, which the whole run since the last pause decides."""
        return None

    def default_ttl_seconds(self, request: PreparedRequest) -> float:
        return self.lifetime

    def retention_points(self, request: PreparedRequest) -> list[tuple[int, float]]:
        points = [(request.total_tokens, self.lifetime)]
        if self.explicit_ttl is not None:
            points.insert(0, (self._explicit_prefix(request)[1], self.explicit_ttl))
        return points

    @staticmethod
    def _explicit_prefix(request: PreparedRequest) -> tuple[int, int]:
        """(segments, tokens) of the request's leading tools and system instruction: what a cachedContents holds."""
        cum = cumulative_tokens(request)
        k = 0
        for seg in request.segments:
            if seg.kind not in _EXPLICIT_KINDS:
                break
            k += 1
        return k, (cum[k - 1] if k else 0)

    def _implicit(self, chain: list[int], t: float) -> tuple[int, bool]:
        """(leading segments live in the cache, whether a prefix of the previous request expired)."""
        used = self._used
        i = 0
        shared = common_prefix_len(chain, self._last_chain)
        if shared:
            # the latest stored prompt used this whole run at _last_t, the latest use of any entry: one check
            if t - self._last_t >= self.lifetime:
                return 0, True
            i = shared
        while i < len(chain):
            last = used.get(chain[i])
            if last is None:
                return i, False
            if t - last >= self.lifetime:
                return i, True
            i += 1
        return i, False

    def process(self, request: PreparedRequest, at: datetime) -> CacheResult:
        model = self.validate_model(request.model)  # before any state changes
        minimum = self.min_tokens[model]
        t = at.timestamp()
        _root, chain, cum, n = self._chains.prompt(request, "gemini", model)

        live, expired = self._implicit(chain, t)
        lcp = cum[live - 1] if live else 0
        implicit = lcp if n >= minimum and lcp >= minimum else 0  # a prefix shorter than the minimum is not cached
        detail: dict[str, Any] = {"model": model, "lcp_tokens": lcp, "min_tokens": minimum}
        if gemini_base_id(request.model) != model:
            detail["stand_in_model"] = model

        read, write = implicit, 0
        explicit_read = 0
        if self.explicit_ttl is not None:
            read, write, explicit_read = self._use_explicit(request, model, chain, minimum, implicit, t, detail)
        if n >= minimum:  # stored for later requests; nothing is billed for it [G5]
            self._used.update(dict.fromkeys(chain, t))
            self._last_chain, self._last_t = chain, t

        cached = read + write if write else read  # what the API reports: the fresh explicit cache is read too
        native = {"promptTokenCount": n, "cachedContentTokenCount": cached, "candidatesTokenCount": 0,
                  "totalTokenCount": n}
        usage = read_only_usage(n, read, native)
        if write:
            usage = Usage(input_tokens=n - read - write, cache_read_input_tokens=read,
                                cache_creation_input_tokens=write, cache_creation_5m_input_tokens=write,
                                cache_creation_1h_input_tokens=0, source="simulated", raw=native)
        detail["hit_path"] = segment_path(request, _segment_at(cum, read + write) - 1) if read + write else None
        if explicit_read:
            detail["explicit_read_tokens"] = explicit_read
        reason = self._reason(request, model, chain, cum, n, read, write, minimum, expired, t, detail)
        self._prev = {"model": model, "n": n, "chain": chain, "t": t, "stored": n >= minimum}
        k = _segment_at(cum, read + write)
        states = ("read",) * _segment_at(cum, read) + ("write",) * (k - _segment_at(cum, read)) \
            + ("uncached",) * (len(cum) - k)
        return CacheResult(usage, Reason(reason), detail, states, native)

    def _use_explicit(self, request: PreparedRequest, model: str, chain: list[int], minimum: int, implicit: int,
                      t: float, detail: dict[str, Any]) -> tuple[int, int, int]:
        """(read, write, read from the explicit cache) of a request under the explicit what-if."""
        assert self.explicit_ttl is not None
        k, size = self._explicit_prefix(request)
        if k == 0 or size < minimum:
            detail["explicit"] = "not created: below the minimum" if k else "not created: no tools or system"
            return implicit, 0, 0
        node = chain[k - 1]
        live = self._explicit.get(model)
        if live is not None and live.node == node and t < live.expires:
            detail["explicit"] = "read"
            return max(size, implicit), 0, size  # the whole object, and implicit caching beyond it [G5]
        why = "expired" if live is not None and live.node == node else ("changed" if live is not None else "new")
        self._explicit[model] = _Explicit(node, size, t, t + self.explicit_ttl)
        hours = self.explicit_ttl / 3600.0
        rate = self.options.storage_usd_per_mtok_hour
        if rate is None:
            rate = STORAGE_USD_PER_MTOK_HOUR.get(model)
        detail.update({"explicit": f"created ({why})", "explicit_tokens": size, "explicit_ttl_seconds":
                       self.explicit_ttl, "storage_token_hours": size * hours,
                       "storage_usd": None if rate is None else size * hours * rate / 1e6})
        return max(0, implicit - size), size, 0

    def _reason(self, request: PreparedRequest, model: str, chain: list[int], cum: list[int], n: int, read: int,
                write: int, minimum: int, expired: bool, t: float, detail: dict[str, Any]) -> str:
        found = compared(self._prev, request, model, chain, read, detail)
        if isinstance(found, str):
            return found
        prev, shared = found
        got = read + write  # a fresh explicit cache holds what the request sent: no rebuild of what was cached
        if n < minimum:
            return "below_minimum"
        explicit = detail.get("explicit")
        if explicit == "created (expired)":  # the cachedContents object outlived its TTL: written again
            return "ttl_expired"
        if explicit == "created (changed)":
            return "prefix_changed"
        possible = min(prev["n"], n)
        if got >= possible or (got and shared == len(prev["chain"]) and got >= cum[shared - 1]):
            return "hit"
        if not prev["stored"]:
            detail["previous_tokens"] = prev["n"]
            return "not_written"
        if expired:
            detail["idle_seconds"] = round(t - prev["t"], 3)
            return "ttl_expired"
        shared_tokens = cum[shared - 1] if shared else 0
        if shared < len(prev["chain"]) and shared_tokens < possible:
            if shared_tokens < minimum:
                detail["shared_tokens"] = shared_tokens
            return "prefix_changed"
        return "not_written"


def _segment_at(cum: list[int], tokens: int) -> int:
    """How many leading segments ``tokens`` covers whole."""
    return bisect_right(cum, tokens) if tokens else 0


GeminiOptions = GeminiCache.Options
