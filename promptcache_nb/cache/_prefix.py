"""Shared machinery of the token-prefix caches (OpenAI, DeepSeek, vLLM).

These providers match *tokens*, not Anthropic's breakpoint blocks. We have no real token ids, only the
canonical body's segments with estimated token counts, so the token stream of a request is modelled as
its segments laid end to end: token ``k`` of a request is identified by the chain of segments before
it plus its offset inside its own segment. Consequences, stated once for every model here:

* the longest common prefix (LCP) of two requests, in tokens, is the tokens of their shared leading
  segments — a segment that differs at all shares *no* tokens (in reality a changed block usually
  keeps a few leading tokens, so the models are slightly pessimistic there);
* provider rendering differences are ignored: a request re-simulated under OpenAI, DeepSeek or vLLM
  has the same segments and the same estimated counts as under Anthropic (tool definitions, system
  prompt and message framing are rendered differently by each provider's chat template in reality);
* a segment is identified by ``(kind, role, content_hash)``; ``cache_control`` markers never matter.

A chain of segments is interned into small integers (``ChainInterner``): node ``i`` of a request
stands for "the prefix through segment ``i``". Consecutive requests of a session share most of their
chain, so each request hashes only its new segments; the O(n) parts (copying the shared chain, the
cumulative token counts) run in C-level list operations.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable
from operator import attrgetter
from typing import Any, NamedTuple

from .._util import common_prefix_length
from ..request import PreparedRequest
from ..usage import Usage
from ._base import CacheResult
from ._reasons import Reason, first_request_reason

segment_key = attrgetter("kind", "role", "content_hash")
_tokens = attrgetter("tokens")


common_prefix_len = common_prefix_length  # the shared helper (C-level slice compares)


def cumulative_tokens(request: PreparedRequest) -> list[int]:
    """Estimated tokens through each segment (cached on the request)."""
    return request.cumulative_tokens()


class ChainInterner:
    """Interns segment chains: node id of segment ``i`` = id of (node id of ``i-1``, segment key).

    Two requests share node ``i`` exactly when their first ``i + 1`` segments are equal. ``chain()``
    reuses the previous call's chain for the shared leading run, so only new segments are interned.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[Hashable, ...], int] = {}
        self._prev_root: int | None = None
        self._prev_keys: list[tuple[Any, ...]] = []
        self._prev_chain: list[int] = []

    def root(self, *salt: Hashable) -> int:
        """The node every chain with this salt (model, cache salt...) starts from."""
        return self._ids.setdefault(("root", *salt), len(self._ids))

    def chain(self, root: int, request: PreparedRequest) -> tuple[list[tuple[Any, ...]], list[int]]:
        """(segment keys, node id per segment) of ``request``."""
        keys = list(map(segment_key, request.segments))
        shared = common_prefix_len(keys, self._prev_keys) if root == self._prev_root else 0
        chain = self._prev_chain[:shared]
        ids = self._ids
        parent = chain[-1] if chain else root
        for key in keys[shared:]:
            parent = ids.setdefault((parent, key), len(ids))
            chain.append(parent)
        self._prev_root, self._prev_keys, self._prev_chain = root, keys, chain
        return keys, chain

    def prompt(self, request: PreparedRequest, *salt: Hashable) -> Prompt:
        """``request`` as a token-prefix cache sees it, its chain started from ``salt``'s root."""
        root = self.root(*salt)
        _keys, chain = self.chain(root, request)
        cum = cumulative_tokens(request)
        return Prompt(root, chain, cum, cum[-1] if cum else 0)


class Prompt(NamedTuple):
    """A request as a token-prefix cache sees it (:meth:`ChainInterner.prompt`)."""

    root: int  #: the node its chain starts from (one per salt: provider, model, cache salt...)
    chain: list[int]  #: node id per segment: the prefix through that segment
    cum: list[int]  #: estimated tokens through each segment
    tokens: int  #: estimated prompt tokens



def compared(prev: dict[str, Any] | None, request: PreparedRequest, model: str, chain: list[int], read: int,
             detail: dict[str, Any]) -> str | tuple[dict[str, Any], int]:
    """How a request's reason starts: decided already (a session's first request: ``cold``, or a ``hit`` on what
    a session sharing the cache wrote; a ``model_switch``), or the previous request (``prev``: its ``model``,
    ``chain`` and ``n`` tokens) and how many leading segments ``chain`` shares with its chain (noted in ``detail``
    with the path where they part)."""
    if prev is None:  # a read on a session's first request came from a session sharing the cache
        return first_request_reason(read, detail)
    if prev["model"] != model:
        detail["previous_model"] = prev["model"]
        return "model_switch"
    return prev, divergence(request, chain, prev["chain"], detail)


def divergence(request: PreparedRequest, chain: list[int], previous: list[int], detail: dict[str, Any]) -> int:
    """How many leading segments ``chain`` shares with the ``previous`` request's chain (noted in ``detail``, with
    the path of the first segment they do not share)."""
    shared = common_prefix_len(chain, previous)
    detail["divergence_index"] = shared
    detail["divergence_path"] = segment_path(request, shared)
    return shared


def miss_reason(prev: dict[str, Any], shared: int, cum: list[int], n: int) -> str:
    """The reason of a miss nothing else explains: ``prefix_changed`` when the prompt left the previous one's
    segments before the tokens both hold, else ``not_written`` (the previous request did not write it)."""
    if shared < len(prev["chain"]) and (cum[shared - 1] if shared else 0) < min(prev["n"], n):
        return "prefix_changed"
    return "not_written"


def states_for(cum: list[int], read: int) -> tuple[str, ...]:
    """Per-segment ``read`` / ``uncached`` for a token-prefix cache that read ``read`` tokens.

    A segment counts as read when all of its tokens were; no-write-fee providers have no ``write``.
    """
    k = bisect_right(cum, read) if read else 0
    return ("read",) * k + ("uncached",) * (len(cum) - k)


def read_only_usage(prompt_tokens: int, cached: int, native: dict[str, Any]) -> Usage:
    """Usage of a provider with no write fee: read = cached, write = 0, uncached = prompt − cached."""
    return Usage(
        input_tokens=prompt_tokens - cached, cache_read_input_tokens=cached, cache_creation_input_tokens=0,
        cache_creation_5m_input_tokens=0, cache_creation_1h_input_tokens=0, source="simulated", raw=native,
    )


def read_only_result(n: int, cum: list[int], read: int, reason: str, detail: dict[str, Any],
                     native: dict[str, Any] | None = None) -> CacheResult:
    """The result of a request of ``n`` prompt tokens to a cache with no write fee that read ``read`` of them.
    ``native``: the provider's usage object; by default OpenAI's (``prompt_tokens`` and
    ``prompt_tokens_details.cached_tokens``), which vLLM's server reports too."""
    if native is None:
        native = {"prompt_tokens": n, "prompt_tokens_details": {"cached_tokens": read}}
    return CacheResult(read_only_usage(n, read, native), Reason(reason), detail, states_for(cum, read), native)


def segment_path(request: PreparedRequest, index: int) -> str | None:
    segs = request.segments
    return segs[index].path if 0 <= index < len(segs) else None
