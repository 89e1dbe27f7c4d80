"""The ideal cache read — what a perfectly cache-stable design could have read — in one place.

Every figure that compares a request's cache read with what it *could* have read calls this module:
``Session`` (the stored ``ideal_cache_read``), :func:`~promptcache_nb.rebuilds` and
:func:`~promptcache_nb.keep_warm`. The rule, for a request after a previous one:

* the previous request's **prompt total** — measured (``input + cache read + cache write``) when its usage
  was measured, the simulated total (= its estimated size) otherwise — capped at this request's prompt
  total (:func:`carried_over`);
* 0 on the first request, after a model switch and after a tool-set change;
* after a gap longer than a TTL in use, only the prefixes whose lifetime covers the gap (the cache
  model's ``retention_points``);
* after a compaction, only the tokens before the first message;
* 0 when that is below the provider's minimum cacheable length;
* never below what the request actually read: a read that happened was possible (a switch back to a model
  whose cache is still warm reads it), so ``cache_read ≤ ideal`` and efficiency ``≤ 1`` on every request.

Measured requests are never compared with estimates: the retention points and the tokens before the
first message are estimated positions, so they enter only as a *fraction* of the estimated size, applied
to the measured total (for a simulated request the fraction is applied to the estimated total itself, so
the figures are exactly the estimator's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._util import model_base_id
from ..request import PreparedRequest

#: Why the ideal is below what the previous request carried over (``None``: it is not).
IDEAL_RULES = ("first", "model_switch", "tools_changed", "ttl", "compaction", "below_minimum")


@dataclass(frozen=True)
class IdealRead:
    """The ideal read of one request.

    Attributes:
        tokens: the ideal cache read (tokens, in the request's own unit: measured or estimated).
        carried: what the previous request carried over before any rule (its total, capped at this one's).
        rule: the rule that lowered ``tokens`` below ``carried`` (one of ``IDEAL_RULES``), else None.
    """

    tokens: int
    carried: int = 0
    rule: str | None = None


def carried_over(previous_total: int | None, current_total: int) -> int:
    """What the previous request left for this one to read at best: its prompt total, capped at this
    request's (0 without a previous request)."""
    return 0 if previous_total is None else max(0, min(previous_total, current_total))


def rebuilt_tokens(previous_total: int | None, cache_read: int | None, cache_write: int | None) -> int:
    """Measured tokens a request had to write again of what the previous request held:
    ``clamp(previous prompt total − cache read, 0, cache write)``. The uncached tail of the previous
    request (never written) and this request's new content (written, but never held) are not rebuilds
    by construction, up to the difference between the two; callers apply a noise floor for that."""
    if previous_total is None or cache_read is None or cache_write is None:
        return 0
    return max(0, min(previous_total - cache_read, cache_write))


def simulated_lost(previous_total: int | None, read: int | None, write: int | None, uncached: int | None,
                   reason: str | None, *, implicit: bool) -> int:
    """Tokens a simulated request sent again of what the previous request held: the measured rule's clamp
    (:func:`rebuilt_tokens`) on the simulator's figures — what it wrote again (everything it did not read, on a
    provider that caches implicitly) of what the previous request held — with no noise floor (estimated figures),
    and nothing for a hit. A tail the previous request never wrote (a conversation with its only breakpoint on the
    system prompt) is no loss: nothing is written again; nor is a prefix the cache model says no entry covered
    (``not_written``: the previous request's write was not readable yet, or never made)."""
    if reason in ("hit", "not_written") or write is None or uncached is None:
        return 0
    return rebuilt_tokens(previous_total, read, uncached + write if implicit else write)


def same_model(a: str | None, b: str | None) -> bool:
    """Two model ids name the same model (dated snapshots and aliases of one model are one cache)."""
    return a is not None and b is not None and (a == b or model_base_id(a) == model_base_id(b))


def tools_of(request: PreparedRequest) -> list[str]:
    """Content hashes of the request's tool definitions (tools come first, after an unlogged prefix: the
    walk stops at the first other segment, so it costs O(tools), not O(segments))."""
    out = []
    for s in request.segments:
        if s.kind == "tool":
            out.append(s.content_hash)
        elif s.kind != "unlogged":
            break
    return out


def _scaled(estimated_part: int, estimated_whole: int, total: int) -> int:
    # an estimated position as the same fraction of a (possibly measured) total; exact when total == whole
    if estimated_whole <= 0:
        return 0
    return estimated_part * total // estimated_whole


def ideal_read(
    previous: PreparedRequest | None,
    current: PreparedRequest,
    *,
    previous_total: int | None = None,
    current_total: int | None = None,
    gap_seconds: float | None = None,
    retention_points: Sequence[tuple[int, float]] | None = None,
    compaction: bool = False,
    minimum: int = 0,
    cache_read: int | None = None,
) -> IdealRead:
    """The ideal cache read of ``current`` (see the module docstring for the rule).

    Args:
        previous: the earlier of the two requests (None for the first request).
        current: the request whose ideal read this is.
        previous_total: ``previous``'s prompt total as stored (measured when measured); default its estimated size.
        current_total: ``current``'s prompt total, the same way.
        gap_seconds: time since ``previous`` (None: no gap rule).
        retention_points: the cache model's ``(estimated prefix tokens, lifetime seconds)`` for ``previous``.
        compaction: the history was replaced by a summary before ``current``.
        minimum: the provider's minimum cacheable length for ``current``'s model.
        cache_read: what ``current`` actually read, a floor for the ideal (None: unknown).
    """
    total = current.total_tokens if current_total is None else current_total
    ideal = _rule(previous, current, previous_total, total, gap_seconds, retention_points, compaction, minimum)
    if cache_read is not None and cache_read > ideal.tokens:
        return IdealRead(min(cache_read, total), ideal.carried, None)
    return ideal


def _rule(previous: PreparedRequest | None, current: PreparedRequest, previous_total: int | None, total: int,
          gap_seconds: float | None, retention_points: Sequence[tuple[int, float]] | None, compaction: bool,
          minimum: int) -> IdealRead:
    if previous is None:
        return IdealRead(0, 0, "first")
    prev_total = previous.total_tokens if previous_total is None else previous_total
    carried = carried_over(prev_total, total)
    if not same_model(previous.model, current.model):
        return IdealRead(0, carried, "model_switch")
    if tools_of(previous) != tools_of(current):
        return IdealRead(0, carried, "tools_changed")
    base, rule = prev_total, None
    points = retention_points or ()
    if gap_seconds is not None and any(gap_seconds > ttl for _, ttl in points):
        # a gap longer than a TTL in use: only the prefixes whose lifetime covers it survive
        surviving = max((tokens for tokens, ttl in points if gap_seconds <= ttl), default=0)
        base, rule = _scaled(surviving, previous.total_tokens, prev_total), "ttl"
    if compaction:
        before = _scaled(current.tokens_before_messages(), current.total_tokens, total)
        if before < base:
            base, rule = before, "compaction"
    base = min(base, total)
    if base < minimum:  # a prefix shorter than the provider's minimum is never cached, however stable
        return IdealRead(0, carried, "below_minimum")
    return IdealRead(base, carried, rule if base < carried else None)
