"""Why a request with measured usage read less than the previous request held: one cause per request.

:func:`measured_cause` is the only place that decides it. The request's stored ``cache_reason`` and
``cache_detail`` (written by the pipeline when the request is recorded), the sentence its
:class:`~promptcache_nb.Observation` states and its :func:`~promptcache_nb.rebuilds` row all come from the
:class:`MeasuredCause` it returns, so they always name the same cause.

**Tokens rebuilt** (measured, never adjusted): what this request had to send again of what the previous
request (the last one that reached the API) held, ``clamp(previous prompt total − cache read, 0, re-sent)``
(:func:`~promptcache_nb.analysis._ideal.rebuilt_tokens`), where *re-sent* is

* the **cache write** on a provider with explicit cache writes (Anthropic: what is never written was never
  cached, so the uncached tail after the last breakpoint is no rebuild);
* **everything not read** (uncached input + any write) on a provider that caches implicitly and reports no
  write (OpenAI, Codex, DeepSeek, Gemini): a prefix the previous request sent is cached whole, so a
  request that reads less re-sends it uncached.

It is a **rebuild** above the noise floor (:data:`NOISE_FLOOR`), unless the previous prompt was shorter
than the provider's minimum cacheable length (nothing could be cached). The cause is the first the evidence
supports, in this order: a model switch; a compaction (the ``compaction`` event, or a history that shrank);
a TTL expiry (the gap since the previous request, which last read or wrote the lost entries, is longer than
their lifetime); a thinking change (see below); a change of the unlogged prefix (a partial log) — only
with evidence: the unlogged prefix's measured size differs, or the read stopped inside it and the measured
prompt total minus the logged estimate moved by more than the estimate of what was appended could explain
(a read past it matched all of it); a prefix change located in the logged body; the 20-block
lookback (the simulator's verdict); else a **provider-side miss** — the logged prefix was unchanged and
nothing in the timing explains it (an eviction, another server or cache namespace).

A thinking change (a ``thinking_level_change`` event, or a ``thinking`` field that differs:
:func:`~promptcache_nb.cache._reasons.thinking_change`) after which the prefix is the same up to the messages is
``thinking_changed``: Anthropic keeps tools and system cached and loses the messages; it comes after the TTL
check (an expiry loses everything, a superset).

A request that is no rebuild is ``cold`` (a first request that read nothing; a first request that read is a
``hit`` on an entry another session wrote), ``below_minimum``, ``no_breakpoint`` (an explicit-cache
request that read and wrote nothing: nothing in it asked for caching), ``unsupported``, or ``hit``. So on a
measured request ``cache_reason`` names a rebuild cause exactly when the request is a rebuild
(``cache._reasons.NOT_REBUILD``).

Measured figures and estimated ones are never compared as if the same unit: estimated positions (the
lifetimes of prefixes, the tokens before the first message) enter only as a fraction of the estimated size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .._util import fmt_duration
from ..cache._reasons import (
    PREDICTION_NOISE_TOKENS,
    Reason,
    explain_reason,
    first_request_reason,
    thinking_change,
)
from ..request import PreparedRequest
from ..request.diff import PrefixDiff, compute_diff
from ..usage import Usage
from ._ideal import carried_over, rebuilt_tokens, same_model

#: Measured rebuilds of at most this many tokens are noise (a previous request's uncached tail, a provider's
#: 128-token cache granularity): the default of :func:`~promptcache_nb.rebuilds` and of the stored cause.
NOISE_FLOOR = 256


#: The unlogged prefix counts as changed when (measured total − logged estimate) moved by more than this
#: share of the estimated tokens appended (the estimator is within ±20 % of measured counts; the shared
#: part's estimate cancels out) and by more than the noise floor.
UNLOGGED_DRIFT_SHARE = 0.25

#: Measured and predicted reads disagree when their shares of the prompt differ by more than this (and by
#: more than :data:`~promptcache_nb.cache._reasons.PREDICTION_NOISE_TOKENS` tokens).
PREDICTION_TOLERANCE = 0.1

_NOTHING_CACHEABLE = frozenset({Reason.BELOW_MINIMUM.value, Reason.NO_BREAKPOINT.value, Reason.UNSUPPORTED.value})


@dataclass(frozen=True)
class MeasuredRequest:
    """One request as the cause analysis sees it.

    Attributes:
        request: the request as stored (segments, estimated tokens, dialect, unlogged prefix).
        at: when it was sent (UTC).
        usage: its measured usage.
        events: session events recorded before it (``compaction``...).
    """

    request: PreparedRequest
    at: datetime
    usage: Usage
    events: tuple[str, ...] = ()

    @property
    def total(self) -> int | None:
        """The measured prompt total (None when a part is unknown)."""
        return self.usage.total_input_tokens


@dataclass(frozen=True)
class MeasuredCause:
    """What :func:`measured_cause` found for one request.

    Attributes:
        reason: a :class:`~promptcache_nb.cache.Reason` code: the rebuild's cause when ``rebuild``, else one of
            ``NOT_REBUILD``.
        rebuild: more than the noise floor was sent again of what the previous request held.
        lost_tokens: measured tokens sent again (``clamp(previous total − read, 0, re-sent)``; 0 without a
            previous request).
        rebuild_reason: the cause the ladder gives whenever ``lost_tokens > 0`` (a caller with a lower noise
            floor lists it); None when nothing was lost.
        detail: the evidence, JSON-ready (stored as ``cache_detail``): the measured figures, the cause's own
            evidence, and the simulator's prediction (``predicted_reason``, ``predicted_usage``).
    """

    reason: str
    rebuild: bool
    lost_tokens: int
    rebuild_reason: str | None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def changed_path(self) -> str | None:
        """The changed segment's path, for a prefix change (logged or unlogged) that was located."""
        return self.detail.get("changed_path")

    @property
    def expected_read(self) -> int:
        return int(self.detail.get("expected_read") or 0)

    @property
    def cause(self) -> str:
        """The short cause a table lists (``TTL expiry: the 5m entry was idle 7m00s``)."""
        return explain_reason(self.rebuild_reason if self.rebuild_reason else self.reason, self.detail,
                              short=True)

    @property
    def explanation(self) -> str:
        """The one sentence the request's observation and its rebuild row both state."""
        return explain_reason(self.reason, self.detail)


def measured_cause(
    previous: MeasuredRequest | None,
    current: MeasuredRequest,
    *,
    diff: PrefixDiff | None = None,
    retention_points: Sequence[tuple[int, float]] | None = None,
    minimum: int = 0,
    predicted_reason: str | None = None,
    predicted_detail: Mapping[str, Any] | None = None,
    noise_floor: int = NOISE_FLOOR,
) -> MeasuredCause | None:
    """The one cause of a measured request (see the module docstring for the rule).

    Args:
        previous: the last request before ``current`` that reached the API (a prompt total above 0), or None.
        current: the request (its usage measured).
        diff: the prefix diff of ``previous.request`` → ``current.request`` (computed when None).
        retention_points: the cache model's ``(estimated prefix tokens, lifetime seconds)`` for
            ``previous.request`` (None: one 5-minute entry over the whole prompt).
        minimum: the provider's minimum cacheable length for ``current``'s model.
        predicted_reason / predicted_detail: the simulator's ``CacheResult`` for ``current`` (a prediction).
        noise_floor: rebuilds of at most this many tokens are ignored.

    Returns:
        The :class:`MeasuredCause`; None when ``current``'s usage is not measured or its figures are unknown.
    """
    usage = current.usage
    read, write, uncached = usage.cache_read_input_tokens, usage.cache_creation_input_tokens, usage.input_tokens
    total = current.total
    if not usage.measured or read is None or write is None or uncached is None or total is None:
        return None
    predicted = dict(predicted_detail or {})
    # the simulator's detail stays (its breakpoints, its assumptions); the measured evidence overrides its keys
    detail: dict[str, Any] = {**predicted, "read": read, "write": write, "total": total}
    if predicted_reason is not None:
        detail["predicted_reason"] = predicted_reason
    if "predicted_usage" in predicted:
        disagreement = prediction_gap(usage, predicted)
        if disagreement is not None:
            detail["predicted_read"] = disagreement[0]
    prev_total = previous.total if previous is not None else None
    if previous is None or not prev_total:
        # nothing of this session was cached yet: a read is an entry another session wrote, no cold cache
        detail["lost_tokens"] = 0  # measured evidence: its sentence states the measured figures
        return MeasuredCause(first_request_reason(read, detail), False, 0, None, detail)
    implicit = current.request.wire.implicit_caching  # no explicit cache writes: all not read was re-sent
    resent = uncached + write if implicit else write
    lost = rebuilt_tokens(prev_total, read, resent)
    detail.update(previous_total=prev_total, resent=resent, implicit=implicit, lost_tokens=lost,
                  expected_read=carried_over(prev_total, total))
    rebuild_reason = _ladder(previous, current, diff, retention_points, minimum, predicted_reason, predicted,
                             detail) if lost > 0 else None
    if rebuild_reason is not None:
        detail["rebuild_reason"] = rebuild_reason
    if lost > noise_floor and prev_total >= minimum:
        return MeasuredCause(rebuild_reason or Reason.PROVIDER_MISS.value, True, lost, rebuild_reason, detail)
    return MeasuredCause(_not_rebuild(prev_total, read, write, implicit, minimum, predicted_reason), False, lost,
                         rebuild_reason, detail)


@dataclass(frozen=True)
class UsageOnly:
    """One request as a usage-first import sees it: no body, only what the log says beside it."""

    model: str
    at: datetime
    usage: Usage
    events: tuple[str, ...] = ()


def usage_cause(previous: UsageOnly | None, current: UsageOnly, *, implicit: bool, minimum: int,
                longest_ttl_seconds: float | None, noise_floor: int = NOISE_FLOOR) -> MeasuredCause | None:
    """:func:`measured_cause` for a request whose body is not analysed yet (a usage-first import).

    Which requests are rebuilds, and how many tokens each lost, are decided exactly as there: they need the
    measured figures only. The cause climbs the part of the ladder that needs no body — a model switch, a
    compaction event, an idle gap longer than any entry could live (``longest_ttl_seconds``: the longest TTL
    the session's client asked for, else the cache model's), a thinking change the log names as an event — and
    is otherwise :attr:`Reason.NOT_ANALYSED`
    until the session is analysed, which runs the whole ladder (a gap between the shortest and the longest TTL,
    a prefix change, a provider miss). ``implicit``: the provider caches implicitly (no cache writes).
    """
    usage = current.usage
    read, write, uncached = usage.cache_read_input_tokens, usage.cache_creation_input_tokens, usage.input_tokens
    total = usage.total_input_tokens
    if not usage.measured or read is None or write is None or uncached is None or total is None:
        return None
    detail: dict[str, Any] = {"read": read, "write": write, "total": total}
    prev_total = previous.usage.total_input_tokens if previous is not None else None
    if previous is None or not prev_total:
        detail["lost_tokens"] = 0
        return MeasuredCause(first_request_reason(read, detail), False, 0, None, detail)
    resent = uncached + write if implicit else write
    lost = rebuilt_tokens(prev_total, read, resent)
    detail.update(previous_total=prev_total, resent=resent, implicit=implicit, lost_tokens=lost,
                  expected_read=carried_over(prev_total, total))
    reason: str | None = None
    if lost > 0:
        gap = (current.at - previous.at).total_seconds()
        if not same_model(previous.model, current.model):
            detail.update(previous_model=previous.model, model=current.model)
            reason = Reason.MODEL_SWITCH.value
        elif "compaction" in current.events:
            reason = Reason.COMPACTION.value
        elif longest_ttl_seconds is not None and gap > longest_ttl_seconds:
            detail.update(gap_seconds=gap, ttl_seconds=longest_ttl_seconds,
                          expired_ttl=_ttl_name(longest_ttl_seconds), expired_after_seconds=gap)
            reason = Reason.TTL_EXPIRED.value
        elif current.events and (thinking := thinking_change({}, {}, current.events)) is not None:
            detail.update(thinking)  # the log said so (pi's thinking_level_change): messages lost, tools kept
            reason = Reason.THINKING_CHANGED.value
        else:
            reason = Reason.NOT_ANALYSED.value
        detail["rebuild_reason"] = reason
    if lost > noise_floor and prev_total >= minimum:
        return MeasuredCause(reason or Reason.NOT_ANALYSED.value, True, lost, reason, detail)
    return MeasuredCause(_not_rebuild(prev_total, read, write, implicit, minimum, None), False, lost, reason,
                         detail)


def prediction_gap(usage: Usage | None, detail: Mapping[str, Any]) -> tuple[int, int] | None:
    """(predicted read, measured read) when a measured request's read disagrees with the cache model's
    prediction (``detail["predicted_usage"]``); None when they agree or there is nothing to compare.

    Reads are compared as shares of each side's prompt total (the prediction counts estimated tokens),
    so an estimator off by 20 % is no disagreement; a read of 0 against a predicted 21k is.
    """
    predicted = detail.get("predicted_usage") or {}
    p_read = predicted.get("cache_read_input_tokens")
    if usage is None or not usage.measured or p_read is None or usage.cache_read_input_tokens is None:
        return None
    m_read = usage.cache_read_input_tokens
    p_total = sum(predicted.get(k) or 0 for k in ("input_tokens", "cache_read_input_tokens",
                                                   "cache_creation_input_tokens"))
    m_total = usage.total_input_tokens or 0
    p_share = p_read / p_total if p_total else 0.0
    m_share = m_read / m_total if m_total else 0.0
    if abs(p_share - m_share) > PREDICTION_TOLERANCE and abs(p_read - m_read) > PREDICTION_NOISE_TOKENS:
        return p_read, m_read
    return None


def _not_rebuild(prev_total: int, read: int, write: int, implicit: bool, minimum: int,
                 predicted_reason: str | None) -> str:
    if prev_total < minimum and read == 0:
        return Reason.BELOW_MINIMUM.value
    if predicted_reason in _NOTHING_CACHEABLE and read == 0:
        return str(predicted_reason)
    if not implicit and read == 0 and write == 0:
        return Reason.NO_BREAKPOINT.value  # an explicit-cache request that cached nothing asked for nothing
    return Reason.HIT.value


def _ladder(previous: MeasuredRequest, current: MeasuredRequest, diff: PrefixDiff | None,
            retention_points: Sequence[tuple[int, float]] | None, minimum: int, predicted_reason: str | None,
            predicted: Mapping[str, Any], detail: dict[str, Any]) -> str:
    prev_req, cur_req = previous.request, current.request
    before, now = prev_req.model, cur_req.model
    if not same_model(before, now):
        detail.update(previous_model=before, model=now)
        return Reason.MODEL_SWITCH.value
    d = diff if diff is not None else compute_diff(prev_req, cur_req)
    n_prev, n_cur = _history_length(prev_req), _history_length(cur_req)
    if "compaction" in current.events or (d.index is not None and n_cur < n_prev and _in_history(d.path)):
        detail["messages"] = [n_prev, n_cur]
        return Reason.COMPACTION.value
    # TTL: the previous request read or wrote everything it held, so its entries' lifetimes run from it
    gap = (current.at - previous.at).total_seconds()
    ttl = _ttl_beyond(retention_points, prev_req, int(detail["previous_total"]), int(detail["read"]))
    if gap > ttl:
        detail.update(gap_seconds=gap, ttl_seconds=ttl, expired_ttl=_ttl_name(ttl), expired_after_seconds=gap)
        return Reason.TTL_EXPIRED.value
    # a thinking change loses the messages' cache only: a divergence before the messages is a prefix change
    thinking = thinking_change(prev_req.rest, cur_req.rest, current.events)
    if thinking is not None and _from_messages_on(d, prev_req, cur_req):
        detail.update(thinking)
        if d.index is not None:
            detail["divergence_path"] = d.path
        return Reason.THINKING_CHANGED.value
    unlogged_before, unlogged_now = prev_req.unlogged_prefix_tokens, cur_req.unlogged_prefix_tokens
    if d.index is not None:
        segs = cur_req.segments if d.index < len(cur_req.segments) else prev_req.segments
        seg = segs[d.index]
        if seg.kind == "unlogged":
            detail.update(unlogged_before=unlogged_before or 0, unlogged_now=unlogged_now or 0,
                          changed_path=seg.path)
            return Reason.UNLOGGED_PREFIX_CHANGED.value
        where = d.path if d.byte_offset is None else f"{d.path} (byte {d.byte_offset:,})"
        detail.update(path=d.path, byte=d.byte_offset, excerpt=None if d.excerpt is None else str(d.excerpt),
                      divergence_path=where, changed_path=d.path)
        return Reason.PREFIX_CHANGED.value
    # a read past the unlogged prefix matched all of it: only a read that stopped inside it can mean it changed
    drift = _unlogged_drift(previous, current) if int(detail["read"]) < (unlogged_now or 0) else None
    if drift is not None:
        detail.update(unlogged_before=drift[0], unlogged_now=drift[1], estimated=True)
        return Reason.UNLOGGED_PREFIX_CHANGED.value
    if predicted_reason == Reason.LOOKBACK_EXCEEDED.value:
        detail["unreached_path"] = predicted.get("unreached_path")
        return Reason.LOOKBACK_EXCEEDED.value
    if unlogged_now is not None and int(detail["read"]) < unlogged_now:
        detail["unlogged"] = unlogged_now  # the read stopped inside the unlogged prefix: said, not claimed
    return Reason.PROVIDER_MISS.value


def _from_messages_on(d: PrefixDiff, prev_req: PreparedRequest, cur_req: PreparedRequest) -> bool:
    """The two requests are the same up to the messages (a pure append, or a divergence in the messages or at a
    messages-level field such as ``thinking``)."""
    if d.index is None:
        return True
    if d.field is not None:
        return cur_req.wire.field_levels.get(d.field) == "messages"
    segs = cur_req.segments if d.index < len(cur_req.segments) else prev_req.segments
    return segs[d.index].level == "messages"


def _unlogged_drift(previous: MeasuredRequest, current: MeasuredRequest) -> tuple[int, int] | None:
    """(before, now) of ``measured total − logged estimate`` for two partial requests whose difference the
    appended content's estimate cannot explain; None otherwise. The estimate of the shared logged part is
    the same on both sides, so only the appended part's estimation error remains."""
    prev_req, cur_req = previous.request, current.request
    if prev_req.unlogged_prefix_tokens is None or cur_req.unlogged_prefix_tokens is None:
        return None
    prev_logged = prev_req.total_tokens - prev_req.unlogged_prefix_tokens
    cur_logged = cur_req.total_tokens - cur_req.unlogged_prefix_tokens
    before = (previous.total or 0) - prev_logged
    now = (current.total or 0) - cur_logged
    appended = max(0, cur_logged - prev_logged)
    if abs(now - before) > max(NOISE_FLOOR, UNLOGGED_DRIFT_SHARE * appended):
        return before, now
    return None


def _ttl_beyond(points: Sequence[tuple[int, float]] | None, req: PreparedRequest, measured_total: int,
                read: int) -> float:
    """The shortest lifetime among ``req``'s cached prefixes longer than what was read (its whole prefix's
    lifetime when none is); positions are estimated, so they are compared as fractions of the whole."""
    points = points or [(req.total_tokens, 300.0)]
    whole = req.total_tokens or 1
    beyond = [ttl for tokens, ttl in points if tokens * measured_total > read * whole]
    return min(beyond) if beyond else points[-1][1]


def _history_length(req: PreparedRequest) -> int:
    """Messages (or Responses input items) in the request's history."""
    body = req.body
    history = body.get("messages", body.get("input"))
    return len(history) if isinstance(history, list) else 0


def _in_history(path: str | None) -> bool:
    return path is not None and path.startswith(("messages", "input"))


def _ttl_name(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return fmt_duration(seconds)
