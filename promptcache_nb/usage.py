"""The typed usage record every stage shares.

Arithmetic (Anthropic's, docs/provider_cache_rules.md#anthropic-usage):
``total_input = input_tokens + cache_read_input_tokens + cache_creation_input_tokens``, and
``cache_creation_input_tokens = cache_creation_5m_input_tokens + cache_creation_1h_input_tokens``.
``None`` means unknown, never 0.

OpenAI reports the prompt *including* what was read from (and written to) the cache (§2.1, §2.2):
:meth:`Usage.from_openai` converts it exactly to the same arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, overload

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
        reasoning_tokens: the part of ``output_tokens`` spent reasoning, when the provider reports it
            (OpenAI ``*_tokens_details.reasoning_tokens``); None when not reported.
    """

    input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_creation_5m_input_tokens: int | None = None
    cache_creation_1h_input_tokens: int | None = None
    output_tokens: int | None = None
    source: UsageSource = "simulated"
    raw: dict[str, Any] | None = field(default=None, compare=False)
    reasoning_tokens: int | None = None  # last: Usage(...) is built positionally around the code

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
        """Build from an Anthropic ``usage`` object or dict (SDK model or JSON).

        Raises:
            ValueError: a count that is not a non-negative int, or a ``cache_creation`` that is not an object,
                naming the field. Absent counts are None (unknown), never 0.
        """
        raw = usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else usage
        if not isinstance(raw, dict):
            raise ValueError(f"usage: must be an object, got {type(raw).__name__}")
        raw = dict(raw)
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            _count(raw, key, "usage")
        creation = _details(raw, "cache_creation")
        written = raw.get("cache_creation_input_tokens")
        w5 = _count(creation, "ephemeral_5m_input_tokens", "usage.cache_creation")
        w1 = _count(creation, "ephemeral_1h_input_tokens", "usage.cache_creation")
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

    @classmethod
    def from_openai(cls, usage: Any, *, api: Literal["chat", "responses"] = "chat",
                    source: UsageSource = "imported") -> Usage:
        """Build from an OpenAI ``usage`` object or dict (Chat Completions or Responses), exactly.

        Chat: ``prompt_tokens``, ``prompt_tokens_details.cached_tokens``, ``completion_tokens``,
        ``completion_tokens_details.reasoning_tokens``. Responses: ``input_tokens``,
        ``input_tokens_details.cached_tokens``, ``output_tokens``, ``output_tokens_details.reasoning_tokens``.
        The prompt figure *includes* the cached tokens (docs/provider_cache_rules.md#openai-usage) and, on models that
        charge for cache writes, the written ones (``*_details.cache_write_tokens``, §2.2), so::

            cache_read_input_tokens     = cached_tokens
            cache_creation_input_tokens = cache_write_tokens, or 0 when not reported
            input_tokens                = prompt - cached - written

        and ``total_input_tokens`` is the prompt figure again. OpenAI writes have no 5m/1h TTLs: the split
        is 0/0 when nothing was written and None (not applicable) when something was. Without any cached
        figure (``*_details`` absent, as some OpenAI-compatible servers send) the split is unknown: input,
        read and write are None. DeepSeek's ``prompt_cache_hit_tokens`` stands in
        for a missing ``cached_tokens`` (the two are equal, §4). Figures are never adjusted.

        Args:
            usage: the ``usage`` object (an SDK model or its JSON dict).
            api: ``chat`` (Chat Completions) or ``responses``.
            source: ``imported`` (a log) or ``live`` (a response just received).

        Raises:
            ValueError: a shape it does not understand, naming the field (missing prompt figure, a count
                that is not a non-negative int, cached + written above the prompt).

        Example:
            >>> u = Usage.from_openai({"prompt_tokens": 2006, "completion_tokens": 300,
            ...                        "prompt_tokens_details": {"cached_tokens": 1920}})
            >>> u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.total_input_tokens
            (86, 1920, 0, 2006)
        """
        if api not in ("chat", "responses"):
            raise ValueError(f"api: must be 'chat' or 'responses', got {api!r}")
        raw = usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else usage
        if not isinstance(raw, dict):
            raise ValueError(f"usage: must be an object, got {type(raw).__name__}")
        raw = dict(raw)
        chat = api == "chat"
        prompt_key, output_key = ("prompt_tokens", "completion_tokens") if chat else ("input_tokens", "output_tokens")
        prompt = _count(raw, prompt_key, "usage", required=True)
        output = _count(raw, output_key, "usage")
        details_key = "prompt_tokens_details" if chat else "input_tokens_details"
        details = _details(raw, details_key)
        cached = _count(details, "cached_tokens", f"usage.{details_key}")
        written = _count(details, "cache_write_tokens", f"usage.{details_key}")
        if cached is None and "prompt_cache_hit_tokens" in raw:
            cached = _count(raw, "prompt_cache_hit_tokens", "usage")
        out_key = "completion_tokens_details" if chat else "output_tokens_details"
        reasoning = _count(_details(raw, out_key), "reasoning_tokens", f"usage.{out_key}")
        if cached is None:
            return cls(output_tokens=output, source=source, raw=raw, reasoning_tokens=reasoning)
        written = written or 0
        if cached + written > prompt:
            what = f"usage.{details_key}.cached_tokens ({cached})" + (
                f" + cache_write_tokens ({written})" if written else "")
            raise ValueError(f"{what} exceeds usage.{prompt_key} ({prompt})")
        return cls(
            input_tokens=prompt - cached - written,
            cache_read_input_tokens=cached,
            cache_creation_input_tokens=written,
            cache_creation_5m_input_tokens=None if written else 0,
            cache_creation_1h_input_tokens=None if written else 0,
            output_tokens=output,
            source=source,
            raw=raw,
            reasoning_tokens=reasoning,
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


@overload
def _count(obj: dict[str, Any], key: str, where: str, *, required: Literal[True]) -> int: ...
@overload
def _count(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> int | None: ...
def _count(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> int | None:
    """A token count from a usage payload: a non-negative int, or None when absent (and not required)."""
    value = obj.get(key)
    if value is None:
        if required:
            raise ValueError(f"{where}.{key}: missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}.{key}: must be a non-negative int, got {value!r}")
    return value


def _details(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"usage.{key}: must be an object, got {type(value).__name__}")
    return value
