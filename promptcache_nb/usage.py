"""The typed usage record every stage shares.

Arithmetic (Anthropic's, docs/provider_cache_rules.md#anthropic-usage):
``total_input = input_tokens + cache_read_input_tokens + cache_creation_input_tokens``, and
``cache_creation_input_tokens = cache_creation_5m_input_tokens + cache_creation_1h_input_tokens``.
``None`` means unknown, never 0.

OpenAI reports the prompt *including* what was read from (and written to) the cache (§2.1, §2.2):
``dialects.usage_from_openai`` converts it exactly to the same arithmetic.

A leaf: the wire formats (``dialects/``) read their payloads into this record, never the reverse. Every count is
checked where it enters (``dialects.usage_from_anthropic``, ``dialects.usage_from_openai``, :meth:`Usage.check`):
a non-negative ``int`` no larger than :data:`MAX_TOKENS`, and a 5m/1h split no larger than its total;
anything else is a one-line :class:`~promptcache_nb.errors.UsageError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, overload

from .errors import UsageError

UsageSource = Literal["simulated", "live", "imported"]
#: What figures are, by where they came from: the one wording every chart, table and widget shows.
MEASURED = "measured"
SIMULATED = "simulated (estimated tokens)"

#: The largest token count accepted for one request (10**12). The largest context windows hold a few million
#: tokens, so a bigger count is a corrupt or hand-edited log, refused by name rather than stored and summed.
MAX_TOKENS = 10**12

#: The note a request carries when its cache write came without a 5m/1h split (Bedrock, older API versions).
TTL_SPLIT_UNKNOWN_NOTE = ("cache write TTL split not reported (no usage.cache_creation): priced at the "
                          "5-minute write rate")


@dataclass(frozen=True)
class Usage:
    """Token usage of one request.

    Attributes:
        input_tokens: uncached input tokens (after the last cache breakpoint).
        cache_read_input_tokens: tokens served from the prompt cache.
        cache_creation_input_tokens: tokens written to the prompt cache (5m + 1h).
        cache_creation_5m_input_tokens: part of the write with a 5-minute TTL.
        cache_creation_1h_input_tokens: part of the write with a 1-hour TTL.
        output_tokens: generated tokens.
        source: ``simulated`` (a cache model over *estimated* token counts), ``live`` (*measured*: a
            Messages endpoint's response) or ``imported`` (*measured*, from a log).
        raw: the provider's native usage payload, unchanged.
        reasoning_tokens: the part of ``output_tokens`` spent reasoning, when the provider reports it
            (OpenAI ``*_tokens_details.reasoning_tokens``); None when not reported.
        notes: assumptions made reading the payload, one sentence each (e.g. :data:`TTL_SPLIT_UNKNOWN_NOTE`);
            stored with the request (``turns.notes``).
    """

    input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_creation_5m_input_tokens: int | None = None
    cache_creation_1h_input_tokens: int | None = None
    output_tokens: int | None = None
    source: UsageSource = "simulated"
    raw: dict[str, Any] | None = field(default=None, compare=False)
    reasoning_tokens: int | None = None  # after raw: Usage(...) is built positionally around the code
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        # checked wherever a Usage is made (by hand, by a cache model, from a payload): Usage(input_tokens=-5)
        # is a UsageError naming the field, never a price library's ValueError later
        self.check("Usage")

    @property
    def total_input_tokens(self) -> int | None:
        """input + cache read + cache write; None when any part is unknown."""
        parts = (self.input_tokens, self.cache_read_input_tokens, self.cache_creation_input_tokens)
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]

    @property
    def cache_read(self) -> int | None:
        return self.cache_read_input_tokens

    @property
    def cache_write(self) -> int | None:
        return self.cache_creation_input_tokens

    @property
    def uncached(self) -> int | None:
        return self.input_tokens

    @property
    def ttl_split_known(self) -> bool:
        """False when a cache write's 5m/1h split is unknown (both parts None): a write with no
        ``cache_creation`` object (Bedrock, older API versions), or an OpenAI write (no TTLs). Such a write is
        priced at the 5-minute rate."""
        written = self.cache_creation_input_tokens
        return not written or not (self.cache_creation_5m_input_tokens is None
                                   and self.cache_creation_1h_input_tokens is None)

    @property
    def reported_cost(self) -> float | None:
        """The cost in USD the provider reported in the response (OpenRouter's ``usage.cost``); None when not
        reported (or not a finite non-negative number)."""
        value = (self.raw or {}).get("cost")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            return None
        return float(value)

    def check(self, where: str = "usage") -> Usage:
        """This usage, after checking every count as a payload's are checked (a Usage built by hand).

        Raises:
            UsageError: a count that is not an int in ``0..MAX_TOKENS``, or a 5m/1h split above its total,
                naming the field (``usage.input_tokens: ...``).
        """
        for name in _COUNT_FIELDS:
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 0 <= value <= MAX_TOKENS):
                _check_count(value, f"{where}.{name}")  # the rule itself: raises naming the field, or accepts
        _check_split(self.cache_creation_input_tokens, self.cache_creation_5m_input_tokens,
                     self.cache_creation_1h_input_tokens, where)
        return self

    @property
    def measured(self) -> bool:
        """True when the figures came from an endpoint (live or imported), not a simulation."""
        return self.source != "simulated"

    @property
    def label(self) -> str:
        """``measured`` or ``simulated (estimated tokens)``: what every figure of this usage is."""
        return sources_label([self.source])

    def with_source(self, source: UsageSource) -> Usage:
        return replace(self, source=source)

    def to_anthropic(self) -> dict[str, Any]:
        """The Messages API ``usage`` object for these figures (without ``cache_creation`` when the split is
        unknown, as such a response came)."""
        out: dict[str, Any] = {
            "input_tokens": self.input_tokens or 0,
            "cache_creation_input_tokens": self.cache_creation_input_tokens or 0,
            "cache_read_input_tokens": self.cache_read_input_tokens or 0,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_creation_5m_input_tokens or 0,
                "ephemeral_1h_input_tokens": self.cache_creation_1h_input_tokens or 0,
            },
            "output_tokens": self.output_tokens or 0,
        }
        if not self.ttl_split_known:
            del out["cache_creation"]
        return out


@overload
def _count(obj: dict[str, Any], key: str, where: str, *, required: Literal[True]) -> int: ...
@overload
def _count(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> int | None: ...
def _count(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> int | None:
    """A token count from a usage payload: an int in ``0..MAX_TOKENS``, or None when absent (and not required)."""
    value = obj.get(key)
    if value is None:
        if required:
            raise UsageError(f"{where}.{key}: missing")
        return None
    if type(value) is int and 0 <= value <= MAX_TOKENS:  # the common case, without a call
        return value
    return _check_count(value, f"{where}.{key}")


#: The fields :meth:`Usage.check` checks (a Usage is made and checked several times a request: no fields() walk).
_COUNT_FIELDS = tuple(f.name for f in fields(Usage) if f.name.endswith("_tokens"))


def _check_count(value: Any, name: str) -> int | None:
    """``value`` when it is None or an int in ``0..MAX_TOKENS``; else a one-line UsageError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        # a float (1.5, 1e308, NaN, inf) or a string ("12") is no token count, even when it reads as one
        raise UsageError(f"{name}: must be a non-negative int, got {value!r}")
    if value > MAX_TOKENS:
        raise UsageError(f"{name}: {value:,} tokens is not a plausible count for one request "
                         f"(at most {MAX_TOKENS:,})")
    return value


def _check_split(written: int | None, w5: int | None, w1: int | None, where: str) -> None:
    if written is not None and (w5 or 0) + (w1 or 0) > written:
        raise UsageError(f"{where}.cache_creation: ephemeral_5m_input_tokens ({w5}) + ephemeral_1h_input_tokens "
                         f"({w1}) exceeds {where}.cache_creation_input_tokens ({written})")


def _add(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else a + b


def _details(raw: dict[str, Any], key: str, where: str = "usage") -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{where}.{key}: must be an object, got {type(value).__name__}")
    return value


def sources_label(sources: Iterable[str]) -> str:
    """What figures drawn from usage of these ``usage_source`` values are: ``measured`` (live or imported),
    ``simulated (estimated tokens)``, or ``measured and simulated`` when both are mixed (never called one
    kind). No usage at all reads as simulated: what a replay fills in."""
    kinds = {SIMULATED if s == "simulated" else MEASURED for s in sources if isinstance(s, str)}
    if len(kinds) == 2:
        return "measured and simulated"
    return kinds.pop() if kinds else SIMULATED
