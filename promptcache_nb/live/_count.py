"""``pc.count_tokens(body)``: a request's input tokens, from the Messages ``count_tokens`` endpoint when one is
reachable (measured), from the offline estimator of the body's model otherwise (estimated) — labelled either way.

The endpoint (docs/provider_cache_rules.md#anthropic-token-counting, [A7]) is free, has its own
requests-per-minute limit and takes the same inputs as message creation; Anthropic calls its figure "an
estimate" that may include system-added tokens that are not billed, but it is the provider's own tokenizer, so
we label it ``measured``. It does not use the prompt cache. OpenAI has no such endpoint here: OpenAI bodies
are counted offline with their exact BPE.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from .._util import user_stacklevel
from ..errors import APIError, PromptCacheWarning
from ..request import SegmentMemo, prepare
from ..tokens import DEFAULT_TOKENIZER, Tokenizer

#: ``TokenCount.tokenizer`` of a figure the endpoint returned.
ENDPOINT = "count_tokens endpoint"
_KEY_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")


@dataclass(frozen=True)
class TokenCount:
    """How many input tokens a request body holds, and where the figure comes from.

    Attributes:
        input_tokens: the prompt total (everything read, written or left uncached).
        source: ``measured`` (the provider's ``count_tokens`` endpoint), ``simulated`` (a simulator endpoint
            answered: our own estimate over HTTP) or ``estimated`` (counted offline).
        tokenizer: the estimator that counted (``heuristic-v1``, ``o200k_base``...) or ``count_tokens endpoint``.
        model: the body's model.
    """

    input_tokens: int
    source: Literal["measured", "simulated", "estimated"]
    tokenizer: str
    model: str

    @property
    def measured(self) -> bool:
        return self.source == "measured"

    def __int__(self) -> int:
        return self.input_tokens

    def __repr__(self) -> str:
        return f"TokenCount({self.input_tokens:,} {self.source}, {self.tokenizer}, model={self.model!r})"


def _has_key() -> bool:
    return any(os.environ.get(v) for v in _KEY_VARIABLES)


def count_tokens(
    body: dict[str, Any],
    *,
    client: Any = None,
    api: bool | None = None,
    tokenizer: Tokenizer | None = None,
) -> TokenCount:
    """The input tokens of a request body: measured when the Messages ``count_tokens`` endpoint can be asked,
    estimated offline otherwise.

    Args:
        body: an Anthropic Messages body (OpenAI Chat and Responses bodies are always counted offline).
        client: an ``anthropic.Anthropic`` to ask (a :class:`~promptcache_nb.SimulatorServer`'s answers are
            labelled ``simulated``). Default: one built from ``ANTHROPIC_API_KEY`` when it is set.
        api: ``None`` asks the endpoint when a client or a key is at hand and falls back to the estimate (with a
            warning) if the call fails; ``True`` requires the endpoint (errors raise); ``False`` never calls it.
        tokenizer: the offline estimator (default: the estimator of the body's model, as a Lab counts).

    Raises:
        APIError: ``api=True`` and the endpoint could not be asked, or refused the body.

    Example:
        >>> pc.count_tokens({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello world"}]})
        TokenCount(6 estimated, o200k_base, model='gpt-4.1')
    """
    prepared = prepare(body, memo=SegmentMemo(tokenizer or DEFAULT_TOKENIZER))
    estimate = TokenCount(prepared.total_tokens, "estimated", prepared.tokenizer, prepared.model)
    if api is False:
        return estimate
    if not prepared.wire.count_tokens_endpoint:
        if api:
            raise APIError(f"count_tokens: no token-counting endpoint for a {prepared.dialect} body; "
                           "it is counted offline (api=None or False)", error_type="client_error")
        return estimate
    if client is None and not _has_key():
        if api:
            raise APIError("count_tokens(api=True): no client and no ANTHROPIC_API_KEY; pass "
                           "client=anthropic.Anthropic(...) or set the key", error_type="client_error")
        return estimate
    from .anthropic_backend import AnthropicBackend  # imports the anthropic SDK: only when the endpoint is asked

    backend = AnthropicBackend(client, predict=False)
    try:
        n, simulated = backend.count_tokens(prepared.body)
    except APIError as exc:
        if api:
            raise
        warnings.warn(PromptCacheWarning(
            f"count_tokens: the endpoint failed ({exc}); returning the offline estimate"), stacklevel=user_stacklevel())
        return estimate
    finally:
        backend.close()
    return TokenCount(n, "simulated" if simulated else "measured", ENDPOINT, prepared.model)
