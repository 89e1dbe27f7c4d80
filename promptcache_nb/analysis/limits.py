"""Size limits of a request: its model's context window, and one warning for a request past it.

The context window of a model comes from the maintained ``genai-prices`` data snapshot (its ``context_window``
field, input and output tokens together), the same source as the prices: the model id resolves exactly, as
for prices (:func:`~promptcache_nb.analysis.prices.price_model_id`), so an id genai-prices does not know — or
knows without a window — has no window here, and its requests are never warned about.

A request whose input tokens exceed the window gets one :class:`~promptcache_nb.errors.ContextWindowWarning`
naming the request, the model, the tokens and the window. It is a warning, not an error: the lab simulates,
records and loads what it is given (a provider's API would reject the request). The window counts input and
output together; the check compares the input alone, so it never warns about a request that fits.

Windows are the provider's defaults: a beta that widens one (Anthropic's 1M-token context for Sonnet 4 and
4.5, asked for with a request header the body does not show) is not seen here, so such requests are warned
about although the provider accepts them.

Example:
    >>> context_window("claude-sonnet-4-5-20250929"), context_window("no-such-model")
    (200000, None)
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .._lazy import genai_prices
from ..errors import ContextWindowWarning
from ..tokens import DEFAULT_TOKENIZER, estimator_for
from .prices import price_model_id

if TYPE_CHECKING:  # pragma: no cover
    from ..request import PreparedRequest
    from ..usage import Usage

#: Characters counted at a time by :func:`estimated_tokens` before it checks whether it may stop.
COUNT_CHUNK = 1 << 20


@lru_cache(maxsize=512)
def context_window(model: str) -> int | None:
    """The context window of ``model`` in tokens, per genai-prices; None for a model it does not know
    exactly, or knows without a window.

    Example:
        >>> context_window("gpt-4.1"), context_window("claude-opus-4-6")
        (1000000, 1000000)
    """

    resolved = price_model_id(model)
    if resolved is None:
        return None
    provider_id, model_id = resolved
    for provider in genai_prices.data_snapshot.get_snapshot().providers:
        if provider.id == provider_id:
            for found in provider.models:
                if found.id == model_id:
                    window = found.context_window
                    return int(window) if window else None
    return None


def past_context_window(model: str, tokens: int | None, *, where: str,
                        measured: bool = False) -> ContextWindowWarning | None:
    """The :class:`~promptcache_nb.errors.ContextWindowWarning` for ``tokens`` input tokens of ``model``
    when they exceed its context window, else None (also for an unknown model or unknown tokens). Issues
    nothing: :func:`check_context_window` does.

    Args:
        model: the request's model id.
        tokens: its input tokens (an estimate, or with ``measured`` an endpoint's usage).
        where: the request, as the warning names it (``request 3``, ``support.yaml: host prompt``).
    """
    if tokens is None or not model:
        return None
    window = context_window(model)
    if window is None or tokens <= window:
        return None
    return ContextWindowWarning(where, model, tokens, window, measured=measured)


def check_context_window(model: str, tokens: int | None, *, where: str, measured: bool = False,
                         stacklevel: int = 2) -> bool:
    """Warn once (:class:`~promptcache_nb.errors.ContextWindowWarning`) when ``tokens`` input tokens exceed
    ``model``'s context window; True when it warned. ``stacklevel`` is :func:`warnings.warn`'s, counted from
    the caller of this function (2: its caller's caller).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     check_context_window("claude-sonnet-4-5", 3_500_000, where="request 0")
        True
        >>> str(caught[0].message)[:83]
        'request 0: 3,500,000 estimated input tokens exceed the 200,000-token context window'
    """
    warning = past_context_window(model, tokens, where=where, measured=measured)
    if warning is None:
        return False
    warnings.warn(warning, stacklevel=stacklevel + 1)
    return True


def check_request(prepared: PreparedRequest, *, where: str, usage: Usage | None = None,
                  stacklevel: int = 2) -> bool:
    """:func:`check_context_window` for a prepared request: its measured input tokens when ``usage`` reports
    them (an import, a live endpoint), its estimated ``total_tokens`` otherwise. True when it warned.

    Example:
        >>> from promptcache_nb.request import prepare
        >>> body = {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        >>> check_request(prepare(body), where="request 0")
        False
    """
    measured = usage.total_input_tokens if usage is not None else None
    tokens = measured if measured is not None else prepared.total_tokens
    return check_context_window(prepared.model, tokens, where=where, measured=measured is not None,
                                stacklevel=stacklevel + 1)


def estimated_tokens(text: str, model: str, *, stop_past: int | None = None) -> int:
    """Estimated tokens of ``text`` by ``model``'s estimator (:mod:`promptcache_nb.tokens`).

    With ``stop_past``, the text is counted a megabyte at a time and counting stops once the count is past
    ``stop_past``: the rest is extrapolated at the rate of the part counted. A 14 MB prompt is then known to
    exceed a 200,000-token window after its first megabyte, not after counting all 14.

    Example:
        >>> estimated_tokens("Refunds take five business days.", "claude-sonnet-4-5")
        7
    """
    count = estimator_for(DEFAULT_TOKENIZER, model).count
    if stop_past is None or len(text) <= COUNT_CHUNK:
        return count(text)
    tokens = done = 0
    while done < len(text):
        tokens += count(text[done:done + COUNT_CHUNK])
        done = min(len(text), done + COUNT_CHUNK)
        if tokens > stop_past:
            break
    return tokens if done == len(text) else round(tokens * len(text) / done)


def prompt_past_context_window(model: str, host_prompt: str, tools: Sequence[dict[str, Any]], *,
                               where: str) -> ContextWindowWarning | None:
    """The warning for a scenario whose host prompt and tools — part of every request — alone exceed the
    model's context window (estimated tokens; a huge prompt is counted only until it is past the window),
    else None. :func:`promptcache_nb.scenario.load_scenario` issues it once the Lab installs this check
    (``set_prompt_check``), as it does the model check.
    """
    window = context_window(model)
    if window is None:
        return None  # nothing to compare with: skip the count
    tokens = estimated_tokens(host_prompt, model, stop_past=window) + sum(
        estimated_tokens(json.dumps(tool, ensure_ascii=False), model, stop_past=window) for tool in tools)
    return past_context_window(model, tokens, where=where)
