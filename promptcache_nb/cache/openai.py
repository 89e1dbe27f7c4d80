"""OpenAI automatic prompt caching, classic behaviour (gpt-4o … gpt-5.5).

The rules: docs/provider_cache_rules.md#openai-automatic-caching (notes §2.1; §2.2 and §2.3 below are the sections
after it).

Rules modelled, each cited where it is applied:

* caching is automatic for prompts of at least 1,024 tokens, with no write fee (§2.1 [O1][O2]);
* hits come in 128-token increments: 1024, 1152, 1280, … — the 2024 guide's rule [O2] (its example:
  2,006 prompt tokens, 1,920 cached). Later copies drop the sentence [O1][O3]; we follow [O2] and make
  it ``increment=`` (``increment=1`` follows the later copies);
* routing: a request goes to the machine picked by a hash of its first 256 tokens combined with
  ``prompt_cache_key`` [O1]; each machine (shard) has its own cache, so a changed opening or a new key
  lands on a cold machine. The key is read from the body's ``prompt_cache_key`` field, else the
  ``prompt_cache_key=`` parameter;
* the match is the longest live prefix, over *every* prompt the shard holds (§2.3 pseudo-algorithm);
  a processed prompt is cached "afterward on that machine" [O1] and refreshes what it used;
* retention [O1][O3]: ``in_memory`` keeps a prefix while it is used at least every ``idle_ttl``
  (default 5 minutes, the low end of "5–10 minutes of inactivity") and never longer than ``max_age``
  after it was computed ("up to a maximum of one hour"); ``24h`` ("extended") keeps it up to 24 hours.
  A request's own ``prompt_cache_retention`` field (``in_memory`` / ``24h``) wins over ``retention=``
  for the prefixes it stores or uses: each prefix lives by the retention of the request that last
  stored or used it. Sources disagree on the default ([O1] ``in_memory``; [O3] ``24h`` for non-ZDR
  organisations): we use ``in_memory``;
* the in-memory lifetime is a range, not a number: "5 to 10 minutes of inactivity, up to a maximum of one hour"
  [O1] (Azure's copy: "typically clears caches within 5 to 10 minutes of inactivity and always removes them
  within one hour"). An entry idle for less than ``idle_ttl`` is live, one idle for ``idle_ttl_max`` or more is
  gone; in between the provider may have done either, and real Codex traffic shows both (entries read after 27
  idle minutes, others gone after 8). The replay's outcome there stays the expiry (the low end, with the age cap
  of ``max_age``), and the result says what the provider could have served instead: ``detail["retention_open"]
  = {"read_if_kept": tokens, "idle_seconds": gap}`` — read by entries idle less than ``idle_ttl_max``, with no
  age cap ("a maximum of one hour" read as of inactivity). A request's later state is the same either way
  (no write fee: the prompt is cached after it is processed whether it read or not), so the open outcome is
  that one request's. The advice resolves it from the measured read where there is one
  (:mod:`promptcache_nb.advice._anchor`) and widens its intervals where there is none;
* usage is reported as ``prompt_tokens`` with ``prompt_tokens_details.cached_tokens`` a subset of it
  [O1]: in :class:`~promptcache_nb.Usage` that is read = cached, write = 0, uncached = prompt − cached.

Not modelled: the overflow to extra machines above ~15 requests/minute per prefix+key [O1] (only
described qualitatively), GPT-5.6+ explicit breakpoints and 1.25× writes (§2.2), per-organisation
isolation (one simulator = one organisation). Whether a full repeat is capped at n−1 is undocumented;
we do not cap.

Token stream: the prefix models' one rule (:mod:`promptcache_nb.cache._prefix`), OpenAI's own rendering of tools
and system ignored.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from .._options import Duration
from .._util import parse_duration
from ..request import PreparedRequest
from ._base import CacheModel, CacheResult
from ._prefix import ChainInterner, common_prefix_len, divergence, miss_reason, read_only_result, segment_path
from ._reasons import first_request_reason

MIN_TOKENS = 1024
INCREMENT = 128
ROUTING_TOKENS = 256
RETENTIONS = ("in_memory", "24h")


def _seconds(value: str | float | timedelta) -> float:
    return parse_duration(value).total_seconds()


@dataclass
class _Shard:
    """One machine's cache: node id -> when computed / last used, and its latest stored prompt."""

    written: dict[int, float] = field(default_factory=dict)
    used: dict[int, float] = field(default_factory=dict)
    prev_chain: list[int] = field(default_factory=list)
    prev_t: float = 0.0
    # (idle ttl, max age) per node, only once a request asked for another retention than the default
    life: dict[int, tuple[float, float]] | None = None
    prev_life: tuple[float, float] | None = None


class OpenAICache(CacheModel):
    """Simulated OpenAI prompt cache (classic, automatic) for one organisation.

    Example:
        >>> import promptcache_nb as pc
        >>> pc.get_cache_model("openai", idle_ttl="10m").idle_ttl  # seconds
        600.0
    """

    name: ClassVar[str] = "openai"

    class Options(CacheModel.Options):
        retention: Literal["in_memory", "24h"] = Field("in_memory", description="'in_memory' or '24h' "
                                                       "(prompt_cache_retention)")
        idle_ttl: Duration = Field("5m", description="in_memory only: a prefix unused this long is gone "
                                   "(a duration: '5m', seconds, or a timedelta)")
        idle_ttl_max: Duration = Field("1h", validate_default=True, description="in_memory only: the longest "
                                       "idle gap a prefix may survive; between idle_ttl and this the outcome is "
                                       "open (detail['retention_open'])")
        max_age: Duration = Field("1h", validate_default=True, description="in_memory only: the cap on a "
                                  "prefix's lifetime after it was computed (a duration: '1h', seconds, or a "
                                  "timedelta)")
        min_tokens: int = Field(MIN_TOKENS, ge=1, description="shortest cacheable prompt (1,024)")
        increment: int = Field(INCREMENT, ge=1, description="cached counts step by this many tokens above "
                               "min_tokens (128)")
        routing_tokens: int = Field(ROUTING_TOKENS, ge=0, description="how many leading tokens pick the machine")
        prompt_cache_key: str | None = Field(None, description="the routing key when the body has no "
                                             "prompt_cache_key field")

        @field_validator("idle_ttl_max")
        @classmethod
        def _open_above_idle(cls, value: str | float | timedelta, info: ValidationInfo) -> str | float | timedelta:
            idle = info.data.get("idle_ttl")
            if idle is not None and _seconds(idle) > _seconds(value):
                raise ValueError(f"idle_ttl ({idle}) exceeds idle_ttl_max ({value}): the documented range is "
                                 "idle_ttl (5m) to idle_ttl_max (1h)")
            return value

        @field_validator("max_age")
        @classmethod
        def _idle_within_max_age(cls, value: str | float | timedelta, info: ValidationInfo) -> str | float | timedelta:
            idle = info.data.get("idle_ttl")
            if info.data.get("retention") != "24h" and idle is not None and _seconds(idle) > _seconds(value):
                raise ValueError(f"idle_ttl ({idle}) exceeds max_age ({value}): in_memory prefixes live at most "
                                 "max_age; use retention='24h' for longer")
            return value

    options: Options

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: in seconds, from the options (a day each under ``retention="24h"``)
        self.idle_ttl, self.max_age = ((86_400.0, 86_400.0) if self.options.retention == "24h" else
                                       (_seconds(self.options.idle_ttl), _seconds(self.options.max_age)))
        #: in seconds: the longest idle gap an in-memory prefix may survive (the open outcomes end here)
        self.idle_ttl_max = _seconds(self.options.idle_ttl_max)
        self.reset()

    def min_cacheable_tokens(self, model: str) -> int:
        return self.options.min_tokens

    def reset(self) -> None:
        self._chains = ChainInterner()
        self._shards: dict[tuple[int, str | None], _Shard] = {}
        self._prev: dict[str, Any] | None = None

    stream_state: ClassVar[tuple[str, ...]] = ("_prev",)

    def state_horizon_seconds(self) -> float:
        """The longest idle life: ``idle_ttl_max`` for ``in_memory`` (what an open outcome could still read),
        24 hours for ``24h`` (a request of an ``in_memory`` model that asks ``prompt_cache_retention="24h"`` keeps
        its prefixes a day: create the model with ``retention="24h"`` for such traffic, so a resumed session
        replays far enough back)."""
        return 86_400.0 if self.options.retention == "24h" else max(self.idle_ttl, self.idle_ttl_max)

    def replay_window_seconds(self) -> None:
        """None: a prefix in use dies ``max_age`` after it was *computed*, and it is recomputed by the first
        request after that — so when each live prefix was computed depends on the whole run of requests since
        the last idle pause, which a resumed session replays in full."""
        return None

    def validate_model(self, model: str) -> str:
        # Permissive: re-simulating an Anthropic-shaped session under OpenAI's rules keeps its model id.
        return model

    def _life(self, request: PreparedRequest) -> tuple[float, float]:
        """(idle ttl, max age) of the prefixes ``request`` stores: its ``prompt_cache_retention`` if any."""
        asked = request.rest.get("prompt_cache_retention")
        if asked == "24h":
            return 86_400.0, 86_400.0
        if asked == "in_memory" and self.options.retention == "24h":
            return _seconds("5m"), _seconds("1h")
        return self.idle_ttl, self.max_age

    def default_ttl_seconds(self, request: PreparedRequest) -> float:
        return self._life(request)[0]

    def cached_for(self, lcp_tokens: int) -> int:
        """Tokens reported cached for a live shared prefix of ``lcp_tokens`` (1024 + k·128, or 0)."""
        least, step = self.options.min_tokens, self.options.increment
        if lcp_tokens < least:
            return 0
        return least + (lcp_tokens - least) // step * step

    # -- the model ----------------------------------------------------------------------------
    def _open(self, life: tuple[float, float]) -> tuple[float, float]:
        """The longest ``life`` the documented range allows: an in-memory prefix idle less than ``idle_ttl_max``,
        with no age cap; a longer (``24h``) life as it is."""
        idle, max_age = life
        return (max(idle, self.idle_ttl_max), float("inf")) if idle < self.idle_ttl_max else life

    def _match(self, shard: _Shard | None, chain: list[int], t: float, *,
               longest: bool = False) -> tuple[int, str | None]:
        """(leading segments live in the shard, why the shard's latest prompt was dead if it was); ``longest``:
        live by the longest life the documented range allows (:meth:`_open`), not the assumed one."""
        if shard is None or not chain:
            return 0, None
        written, used, life = shard.written, shard.used, shard.life
        default = (self.idle_ttl, self.max_age)
        span = self._open if longest else None
        i, prev_w = 0, float("-inf")
        shared = common_prefix_len(chain, shard.prev_chain)
        if shared:
            # The shard's latest prompt left this run written (computed times non-decreasing along
            # it) and used at prev_t, and nothing touched the shard since: check it in O(1).
            idle, max_age = shard.prev_life or default
            if span is not None:
                idle, max_age = span((idle, max_age))
            if t - shard.prev_t >= idle:
                return 0, "idle"
            if t - written[chain[0]] >= max_age:
                return 0, "max_age"
            i, prev_w = shared, written[chain[shared - 1]]
        while i < len(chain):
            node = chain[i]
            w = written.get(node)
            idle, max_age = default if life is None else life.get(node, default)
            if span is not None:
                idle, max_age = span((idle, max_age))
            # a prefix computed before its own parent was recomputed belonged to the evicted parent
            if w is None or w < prev_w or t - used[node] >= idle or t - w >= max_age:
                break
            prev_w = w
            i += 1
        return i, None

    def process(self, request: PreparedRequest, at: datetime) -> CacheResult:
        t = at.timestamp()
        model = request.model
        root, chain, cum, n = self._chains.prompt(request, "openai", model)
        pkey = request.rest.get("prompt_cache_key", self.options.prompt_cache_key)
        route = chain[min(bisect_left(cum, self.options.routing_tokens), len(chain) - 1)] if chain else root
        shard_id = (route, pkey)
        shard = self._shards.get(shard_id)

        live, dead_why = self._match(shard, chain, t)
        lcp = cum[live - 1] if live else 0
        cached = self.cached_for(min(lcp, n)) if n >= self.options.min_tokens else 0
        stored = n >= self.options.min_tokens  # shorter prompts are not cached at all (§2.1)
        open_read: dict[str, Any] | None = None
        if shard is not None and live < len(chain) and stored:
            # what the provider could have served had it kept the prefix as long as it documents it may
            longest, _ = self._match(shard, chain, t, longest=True)
            kept = self.cached_for(min(cum[longest - 1], n)) if longest > live else 0
            if kept > cached:
                open_read = {"read_if_kept": kept, "idle_seconds": round(t - shard.prev_t, 3)}
        if stored:
            if shard is None:
                shard = self._shards[shard_id] = _Shard()
            shard.used.update(dict.fromkeys(chain, t))
            shard.written.update(dict.fromkeys(chain[live:], t))
            shard.prev_chain, shard.prev_t = chain, t
            life = self._life(request)
            if shard.life is not None or life != (self.idle_ttl, self.max_age):
                # a prefix lives by the retention of the request that last stored or used it
                if shard.life is None:
                    shard.life = {}
                shard.life.update(dict.fromkeys(chain, life))
                shard.prev_life = life

        asked = request.rest.get("prompt_cache_retention")
        detail: dict[str, Any] = {
            "model": model, "retention": asked if asked in RETENTIONS else self.options.retention, "lcp_tokens": lcp,
            "min_tokens": self.options.min_tokens, "increment": self.options.increment, "prompt_cache_key": pkey,
            "hit_path": segment_path(request, live - 1) if cached else None,
        }
        if open_read is not None:
            detail["retention_open"] = open_read
        reason = self._reason(request, model, chain, cum, n, cached, route, pkey, dead_why, t, detail)
        self._prev = {"model": model, "n": n, "chain": chain, "route": route, "key": pkey, "t": t,
                      "stored": stored}
        return read_only_result(n, cum, cached, reason, detail)

    def _reason(self, request: PreparedRequest, model: str, chain: list[int], cum: list[int], n: int, cached: int,
                route: int, pkey: Any, dead_why: str | None, t: float, detail: dict[str, Any]) -> str:
        prev = self._prev
        if prev is None:  # a read on a session's first request came from a session sharing the cache
            return first_request_reason(cached, detail)
        # the divergence is noted on a model switch too (at 0: another model's chain shares nothing)
        shared = divergence(request, chain, prev["chain"] if prev["model"] == model else [], detail)
        if prev["model"] != model:
            detail["previous_model"] = prev["model"]
            return "model_switch"
        if n < self.options.min_tokens:
            return "below_minimum"
        possible = self.cached_for(min(prev["n"], n))
        if cached >= possible > 0:
            return "hit"
        if not prev["stored"]:
            detail["previous_tokens"] = prev["n"]
            return "not_written"  # the previous prompt was below the minimum: nothing was cached
        if route != prev["route"]:
            detail["routing"] = "the first routing tokens changed: a different machine"
            return "prefix_changed"
        if pkey != prev["key"]:
            detail["routing"] = f"prompt_cache_key {prev['key']!r} -> {pkey!r}: a machine without this prefix"
            return "not_written"
        if dead_why is not None:
            detail["expired"] = dead_why
            detail["idle_seconds"] = round(t - prev["t"], 3)
            return "ttl_expired"
        return miss_reason(prev, shared, cum, n)


OpenAIOptions = OpenAICache.Options  # its former name
