"""The typed usage record every stage shares.

Arithmetic (Anthropic's, provider_cache_rules.md §1.8):
``total_input = input_tokens + cache_read_input_tokens + cache_creation_input_tokens``, and
``cache_creation_input_tokens = cache_creation_5m_input_tokens + cache_creation_1h_input_tokens``.
``None`` means unknown, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

UsageSource = Literal["simulated", "live", "imported"]


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
    """

    input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_creation_5m_input_tokens: int | None = None
    cache_creation_1h_input_tokens: int | None = None
    output_tokens: int | None = None
    source: UsageSource = "simulated"
    raw: dict[str, Any] | None = field(default=None, compare=False)

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
    def measured(self) -> bool:
        """True when the figures came from an endpoint (live or imported), not a simulation."""
        return self.source != "simulated"

    @property
    def label(self) -> str:
        return "measured" if self.measured else "simulated (estimated tokens)"

    def with_source(self, source: UsageSource) -> Usage:
        return replace(self, source=source)

    @classmethod
    def from_anthropic(cls, usage: Any, *, source: UsageSource = "live") -> Usage:
        """Build from an Anthropic ``usage`` object or dict (SDK model or JSON)."""
        raw = usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else dict(usage)
        creation = raw.get("cache_creation") or {}
        written = raw.get("cache_creation_input_tokens")
        w5 = creation.get("ephemeral_5m_input_tokens")
        w1 = creation.get("ephemeral_1h_input_tokens")
        if written is not None and w5 is None and w1 is None:
            w5, w1 = written, 0  # older responses carry no split: everything was 5m
        return cls(
            input_tokens=raw.get("input_tokens"),
            cache_read_input_tokens=raw.get("cache_read_input_tokens", 0 if written is not None else None),
            cache_creation_input_tokens=written,
            cache_creation_5m_input_tokens=w5,
            cache_creation_1h_input_tokens=w1,
            output_tokens=raw.get("output_tokens"),
            source=source,
            raw=raw,
        )

    def to_anthropic(self) -> dict[str, Any]:
        """The Messages API ``usage`` object for these figures."""
        return {
            "input_tokens": self.input_tokens or 0,
            "cache_creation_input_tokens": self.cache_creation_input_tokens or 0,
            "cache_read_input_tokens": self.cache_read_input_tokens or 0,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_creation_5m_input_tokens or 0,
                "ephemeral_1h_input_tokens": self.cache_creation_1h_input_tokens or 0,
            },
            "output_tokens": self.output_tokens or 0,
        }
