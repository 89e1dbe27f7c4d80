"""DeepSeek context caching on disk, the 2024 launch rules (docs/provider_cache_rules.md#deepseek [D1][D3]).

Rules modelled (the "legacy" pseudo-algorithm of §4):

* on by default; every request triggers construction of a disk cache of its prompt [D1][D2];
* only prefixes identical "starting from the 0th token" hit, and the storage unit is 64 tokens, so
  ``hit = floor(LCP / 64) * 64`` where LCP is the longest common prefix with *any* live prior prompt;
  content under 64 tokens is never a hit [D1];
* "cache construction takes seconds": a prompt is usable only ``construction_delay`` after the request
  that built it started (default 2 s, our reading of "seconds") [D1];
* unused caches are cleared "usually within a few hours to a few days": a prefix unused for
  ``lifetime`` is gone (default 6 h, the low end; a parameter) [D1];
* usage is ``prompt_cache_hit_tokens`` + ``prompt_cache_miss_tokens`` = ``prompt_tokens``, with
  ``prompt_tokens_details.cached_tokens`` = hit [D2][D3]; no write or storage fee [D1]. In
  :class:`~promptcache_nb.Usage`: read = hit, write = 0, uncached = miss.

Sources disagree: the current V4 docs [D2] replace the 64-token rule with "cache prefix units"
persisted at ends of input/output, at detected common prefixes and at unpublished fixed intervals; the
unpublished interval makes V4 unsimulable exactly, so we implement the 2024 rule (``unit=64``).
Caching is best-effort with "no 100% guarantee" [D1]; the model is deterministic (always hits).

Token stream: the prefix models' one rule (:mod:`promptcache_nb.cache._prefix`), DeepSeek's own rendering of tools
and system ignored.
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import datetime
from typing import Any, ClassVar

from pydantic import Field

from .._options import Duration
from .._util import parse_duration
from ..request import PreparedRequest
from ._base import CacheModel, CacheResult
from ._prefix import ChainInterner, common_prefix_len, compared, miss_reason, read_only_result, segment_path

UNIT_TOKENS = 64


class DeepSeekCache(CacheModel):
    """Simulated DeepSeek disk cache for one user (caches are isolated per user [D1]).

    Example:
        >>> import promptcache_nb as pc
        >>> pc.get_cache_model("deepseek").min_cacheable_tokens("deepseek-chat")  # hits come in 64-token units
        64
    """

    name: ClassVar[str] = "deepseek"

    class Options(CacheModel.Options):
        unit: int = Field(UNIT_TOKENS, ge=1, description="storage unit in tokens (64)")
        construction_delay: Duration = Field(2.0, description="before a request's prompt is usable by later ones "
                                             "(a duration: '2s', seconds, or a timedelta)")
        lifetime: Duration = Field("6h", description="an unused prefix is cleared after this long (a duration: "
                                   "'6h', seconds, or a timedelta)")

    options: Options

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: in seconds, from the options
        self.construction_delay = parse_duration(self.options.construction_delay).total_seconds()
        self.lifetime = parse_duration(self.options.lifetime).total_seconds()
        self.reset()

    def min_cacheable_tokens(self, model: str) -> int:
        return self.options.unit  # hits come in whole units

    def reset(self) -> None:
        self._chains = ChainInterner()
        self._written: dict[int, float] = {}  # node id -> start of the request that (re)built it
        self._used: dict[int, float] = {}
        self._last_chain: list[int] = []  # the previous request of the same model, fully written
        self._last_t = 0.0
        self._prev: dict[str, Any] | None = None

    stream_state: ClassVar[tuple[str, ...]] = ("_prev",)

    def state_horizon_seconds(self) -> float:
        """``lifetime``: a prefix unused that long is cleared [D1]."""
        return self.lifetime

    def validate_model(self, model: str) -> str:
        return model

    def default_ttl_seconds(self, request: PreparedRequest) -> float:
        return self.lifetime

    def _match(self, chain: list[int], t: float) -> tuple[int, str | None]:
        """(leading segments usable now, why the previous prompt's run was not, if it was not)."""
        written, used = self._written, self._used
        ready = t - self.construction_delay
        i, prev_w = 0, float("-inf")
        shared = common_prefix_len(chain, self._last_chain)
        if shared:
            # The previous request wrote (or kept) this whole run at or before _last_t, with build
            # times non-decreasing along it, and used all of it at _last_t.
            if t - self._last_t >= self.lifetime:
                return 0, "cleared"
            built = bisect_right(range(shared), ready, key=lambda k: written[chain[k]])
            if built < shared:
                return built, "constructing"
            i, prev_w = shared, written[chain[shared - 1]]
        while i < len(chain):
            node = chain[i]
            w = written.get(node)
            if w is None or w < prev_w or t - used[node] >= self.lifetime:
                break
            if w > ready:
                return i, "constructing"
            prev_w = w
            i += 1
        return i, None

    def _write(self, chain: list[int], live: int, why: str | None, t: float) -> None:
        """Every request builds its prompt's cache; a build already under way keeps its start time."""
        if why != "constructing":
            self._written.update(dict.fromkeys(chain[live:], t))
        else:
            written, used = self._written, self._used
            prev_w = written[chain[live - 1]] if live else float("-inf")
            for node in chain[live:]:
                w = written.get(node)
                if w is None or w < prev_w or t - used[node] >= self.lifetime:
                    w = written[node] = t
                prev_w = w
        self._used.update(dict.fromkeys(chain, t))

    def process(self, request: PreparedRequest, at: datetime) -> CacheResult:
        t = at.timestamp()
        model = request.model
        _root, chain, cum, n = self._chains.prompt(request, "deepseek", model)
        if self._prev is not None and self._prev["model"] != model:
            self._last_chain = []  # another model's chain shares no nodes with this one
        live, why = self._match(chain, t)
        lcp = cum[live - 1] if live else 0
        hit = lcp // self.options.unit * self.options.unit
        pending = self._written[chain[live]] + self.construction_delay - t if why == "constructing" else None
        self._write(chain, live, why, t)
        self._last_chain, self._last_t = chain, t

        native = {
            "prompt_tokens": n, "prompt_cache_hit_tokens": hit, "prompt_cache_miss_tokens": n - hit,
            "prompt_tokens_details": {"cached_tokens": hit},
        }
        detail: dict[str, Any] = {"model": model, "lcp_tokens": lcp, "unit": self.options.unit,
                                  "hit_path": segment_path(request, live - 1) if hit else None}
        if pending is not None:
            detail["construction_pending_seconds"] = round(pending, 3)
        reason = self._reason(request, model, chain, cum, n, hit, why, t, detail)
        self._prev = {"model": model, "n": n, "chain": chain, "t": t}
        return read_only_result(n, cum, hit, reason, detail, native)

    def _reason(self, request: PreparedRequest, model: str, chain: list[int], cum: list[int], n: int, hit: int,
                why: str | None, t: float, detail: dict[str, Any]) -> str:
        found = compared(self._prev, request, model, chain, hit, detail)
        if isinstance(found, str):
            return found
        prev, shared = found
        if n < self.options.unit:
            return "below_minimum"
        possible = min(prev["n"], n) // self.options.unit * self.options.unit
        if hit >= possible > 0:
            return "hit"
        if possible == 0:
            detail["previous_tokens"] = prev["n"]
            return "not_written"
        if why == "cleared":
            detail["idle_seconds"] = round(t - prev["t"], 3)
            return "ttl_expired"
        if why == "constructing":
            return "not_written"  # the previous prompt's cache is still being built
        return miss_reason(prev, shared, cum, n)


DeepSeekOptions = DeepSeekCache.Options  # its former name
