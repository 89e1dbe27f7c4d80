"""Anthropic models on Amazon Bedrock: Anthropic's prompt cache with Bedrock's own rules
(docs/provider_cache_rules.md#bedrock, sources [B1]-[B5]).

Bedrock runs the same cache as the Claude API (:mod:`promptcache_nb.cache.anthropic`: cumulative prefix hashes
at breakpoints, the 20-block lookback [B5], refresh on read, 5m and 1h lifetimes, the read = A / 1h write = B − A /
5m write = C − B bill); what differs, each cited where it is applied:

* **cache checkpoints**: a ``cachePoint`` block in Converse's ``system`` / ``messages`` / ``toolConfig.tools``,
  or ``cache_control`` in an InvokeModel Messages body — at most 4 per request [B1]. The recording proxy reads
  a Converse body's ``cachePoint`` as the ``cache_control`` of the block before it, so both arrive here as
  Anthropic markers;
* **no automatic caching**: Bedrock does not take the top-level ``cache_control`` [A3][B1]; a body that has one
  is simulated without it (``detail["automatic_caching"]``) unless ``automatic_caching=True``;
* **the minimum is per checkpoint** [B1]: "the first cache checkpoint can be defined after 1,024 tokens and the
  second after 2,048 tokens" — a checkpoint is created only when the prefix since the previous created one
  reaches the model's minimum (``min_per_checkpoint=False``: the Claude API's whole-prefix rule);
* **its own model table** [B1]: the Claude models Bedrock caches, each with its minimum; any other model (Claude
  3 Haiku, 3 Opus...) raises :class:`~promptcache_nb.errors.UnknownModelError` (Bedrock answers a
  ``cachePoint`` on it with a ValidationException);
* **the 1-hour TTL** only on the models Bedrock lists for it [B1][B3]; a ``ttl: "1h"`` checkpoint on another
  model is a ValidationException (:class:`~promptcache_nb.errors.InvalidRequestError` here);
* **usage names** [B2]: Converse reports ``inputTokens`` (neither read nor written, as Anthropic's
  ``input_tokens``), ``cacheReadInputTokens``, ``cacheWriteInputTokens`` and ``cacheDetails``
  (``[{"ttl": "5m" | "1h", "inputTokens": n}]``, the writes by TTL); ``CacheResult.native`` is that object;
* caches are isolated per AWS account, not per workspace [A2]: one simulated cache per account.

Prices come from genai-prices' ``aws`` provider for a Bedrock id (``us.anthropic.claude-sonnet-4-5-20250929-v1:0``,
regional endpoints at their own price), by each request's own model (docs/provider_cache_rules.md#prices).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

from pydantic import Field

from .._util import model_base_id
from ..errors import InvalidRequestError, UnknownModelError
from ..request import PreparedRequest
from ..usage import Usage
from ._base import CacheResult
from .anthropic import AnthropicCache, ModelRule, resolve_model

# Minimum tokens per cache checkpoint, by model: Bedrock's "Supported models, Regions, and limits" table [B1].
# Sonnet 4.6 and Opus 4.6 are listed by later third-party summaries [B4]; they take the Claude API's minimums [A2].
BEDROCK_MIN_TOKENS: dict[str, int] = {
    "claude-3-7-sonnet": 1024,
    "claude-3-5-haiku": 2048,
    "claude-3-5-sonnet": 1024,  # v2, preview customers only [B1]
    "claude-sonnet-4": 1024,
    "claude-opus-4": 1024,
    "claude-opus-4-1": 1024,
    "claude-sonnet-4-5": 1024,
    "claude-haiku-4-5": 4096,
    "claude-opus-4-5": 4096,
    "claude-sonnet-4-6": 2048,  # the Claude API's dated value [A2]
    "claude-opus-4-6": 4096,
}

# The models whose checkpoints take ``ttl: "1h"`` on Bedrock [B1] ("Claude Opus 4.5, Claude Haiku 4.5 and Claude
# Sonnet 4.5 support the extended 1-hour TTL"), with the 4.6 models later copies add [B3].
EXTENDED_TTL_MODELS: frozenset[str] = frozenset({
    "claude-opus-4-5", "claude-haiku-4-5", "claude-sonnet-4-5", "claude-opus-4-6", "claude-sonnet-4-6",
})
BEDROCK_TABLE_AS_OF = "2026-04"


class BedrockCache(AnthropicCache):
    """Simulated prompt cache of Anthropic models on Amazon Bedrock, one AWS account (its options:
    :class:`BedrockCache.Options`).

    Example:
        >>> import promptcache_nb as pc
        >>> pc.get_cache_model("bedrock").min_cacheable_tokens("us.anthropic.claude-haiku-4-5-20251001-v1:0")
        4096
    """

    name: ClassVar[str] = "bedrock"
    known_models: ClassVar[tuple[str, ...]] = tuple(BEDROCK_MIN_TOKENS)

    class Options(AnthropicCache.Options):
        """Parameters of :class:`BedrockCache` (the Anthropic model's, plus Bedrock's own)."""

        min_tokens: dict[str, int] | None = Field(None, description="per-model overrides of Bedrock's minimum "
                                                  "tokens per cache checkpoint")
        min_per_checkpoint: bool = Field(True, description="each checkpoint needs the minimum since the previous "
                                         "created one (Bedrock's rule); False: only the whole prefix counts")
        automatic_caching: bool = Field(False, description="honour a top-level cache_control (Bedrock ignores "
                                        "automatic caching; True simulates it as on the Claude API)")

    options: Options
    #: minimum tokens per checkpoint, by model: Bedrock's table (``options.min_tokens`` goes over it)
    min_table: ClassVar[Mapping[str, int]] = BEDROCK_MIN_TOKENS

    def model_rule(self, model: str) -> ModelRule:
        """The model's row of Bedrock's table, exactly; a Claude model Bedrock does not list raises
        UnknownModelError (Bedrock answers its ``cachePoint`` with a ValidationException [B1])."""
        rule = self._rules.get(model)
        if rule is None:
            try:
                base = resolve_model(model)
            except UnknownModelError:
                base = model_base_id(model)
            if base not in self.min_tokens:
                raise UnknownModelError(model, list(self.min_tokens))
            rule = self._rules[model] = ModelRule(base, base, None)
        return rule

    def _layout_key(self) -> tuple[Any, ...]:
        return (*super()._layout_key(), self.options.automatic_caching)

    def _automatic(self, req: PreparedRequest) -> Any:
        return req.rest.get("cache_control") if self.options.automatic_caching else None

    def ttls_for(self, model: str) -> tuple[str, ...]:
        """5 minutes on every model Bedrock caches, and 1 hour on the models it lists for it [B1][B3]."""
        return ("5m", "1h") if self.validate_model(model) in EXTENDED_TTL_MODELS else ("5m",)

    def _breakpoints(self, req: PreparedRequest) -> list[tuple[int, str]]:
        marks = super()._breakpoints(req)
        if any(ttl == "1h" for _, ttl in marks):
            if "1h" not in self.ttls_for(req.model):
                raise InvalidRequestError(
                    f"cachePoint.ttl: '1h' is not supported for {req.model} on Bedrock (models with the 1-hour TTL: "
                    f"{', '.join(sorted(EXTENDED_TTL_MODELS))})")
        return marks

    def _writes(self, marks: list[tuple[int, str]], cum: list[int], read: int, minimum: int) -> list[tuple[int, str]]:
        if not self.options.min_per_checkpoint:
            return super()._writes(marks, cum, read, minimum)
        created: list[tuple[int, str]] = []
        last = 0
        for bp, ttl in marks:  # a checkpoint exists only with the minimum since the previous one [B1]
            if cum[bp] - last >= minimum:
                created.append((bp, ttl))
                last = cum[bp]
        return [(bp, ttl) for bp, ttl in created if cum[bp] > read]

    def process(self, request: PreparedRequest, at: datetime) -> CacheResult:
        result = super().process(request, at)
        if not self.options.automatic_caching and request.rest.get("cache_control") is not None:
            result.detail["automatic_caching"] = "ignored: Bedrock takes no top-level cache_control"
        return result

    def _native(self, usage: Usage) -> dict[str, Any]:
        return converse_usage_of(usage)


def converse_usage_of(usage: Usage) -> dict[str, Any]:
    """``usage`` as Bedrock Converse reports it (``TokenUsage`` [B2]); output tokens as given (0 when unset).

    Example:
        >>> converse_usage_of(Usage(10, 2000, 300, 300, 0))["cacheDetails"]
        [{'ttl': '5m', 'inputTokens': 300}]
    """
    uncached, read, write = (usage.input_tokens or 0, usage.cache_read_input_tokens or 0,
                             usage.cache_creation_input_tokens or 0)
    output = usage.output_tokens or 0
    native: dict[str, Any] = {
        "inputTokens": uncached, "outputTokens": output, "totalTokens": uncached + read + write + output,
        "cacheReadInputTokens": read, "cacheWriteInputTokens": write,
    }
    details = [{"ttl": ttl, "inputTokens": n} for ttl, n in (("5m", usage.cache_creation_5m_input_tokens),
                                                            ("1h", usage.cache_creation_1h_input_tokens)) if n]
    if details:
        native["cacheDetails"] = details
    return native


BedrockOptions = BedrockCache.Options
