"""One verdict per request — did it break the cache? — and OpenClaw's observation beside it
(docs/seed_designs.md#openclaw-break-heuristic; invariant 5 of docs/seed_designs.md#invariants).

A request **broke** the cache when it read less than it could have: it wrote again, or sent uncached, a prefix
the cache held and kept alive for it. That is our rebuild rule, the one :func:`~promptcache_nb.rebuilds` lists
(``analysis/_ideal.py``): a measured request by its measured cause (:func:`~promptcache_nb.analysis.cause.
measured_cause`: more than the noise floor sent again of what the previous request held); a simulated one when
it read less than the previous request carried over and its cache model did not call it a hit. ``turns.broke``,
the observation's words, every widget header, ``pc.rebuilds`` and the cache gate say this one verdict.

OpenClaw's read-drop rule is kept beside it as a cross-check (``turns.openclaw_broke``, and
:func:`~promptcache_nb.openclaw_crosscheck`), never shown as the verdict. Per request we take a
:class:`Snapshot` — model, cache retention, transport, stream strategy, a system prompt digest and a tool digest —
and compare it with the previous request's, emitting :class:`Change` codes in OpenClaw's fixed order ``model``,
``cacheRetention``, ``transport``, ``streamStrategy``, ``systemPrompt``, ``tools``, then ``messages`` (history
not append-only, from OpenClaw's current main). By OpenClaw's rule a request broke the cache when, against the
last cache read seen (the baseline):

* ``cache_read < 0.95 × baseline`` **and** ``baseline − cache_read ≥ 1,000`` (a meaningful drop), or
* it is a *complete miss* — ``cache_read == 0`` with prompt tokens sent — while the snapshot equals the
  one taken at the baseline's request: an unexplained total miss such as a TTL expiry.

There is no OpenClaw break without a baseline above 0 — which is why an agent that never reads its cache (a
clock in the system prompt) never breaks by that rule, and why it is not our verdict. A request without usage
(``cache_read`` None) skips the check and keeps the baseline. Ours differs from OpenClaw in one place: OpenClaw's
complete-miss test needs ``usage.input > 0`` (uncached input), but Anthropic reports a fully re-written
prompt as ``input_tokens ≈ 0`` plus ``cache_creation_input_tokens``, so we count uncached *and* written
tokens as "prompt tokens sent".
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any

from .._util import digest
from ..cache._reasons import explain_reason, where
from ..request import PreparedRequest, canonical_bytes
from ..request.diff import PrefixDiff, marker_indices, sections, visible, visible_html
from ..usage import Usage
from ._ideal import simulated_lost
from .cause import MeasuredCause, MeasuredRequest, prediction_gap

MAX_STABLE_CACHE_READ_RATIO = 0.95  # applied as cache_read * 100 < previous * 95: exact at the edge
MIN_CACHE_BREAK_TOKEN_DROP = 1_000
CHANGE_CODES = ("model", "cacheRetention", "transport", "streamStrategy", "systemPrompt", "tools", "messages")
PROVIDER = "anthropic"


@dataclass(frozen=True)
class Change:
    """One OpenClaw change code and its detail, e.g. ``Change("tools", "3 -> 4 tools; added: grep")``."""

    code: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


@dataclass(frozen=True)
class Snapshot:
    """What OpenClaw fingerprints per request (``beginPromptCacheObservation``).

    Attributes:
        cache_retention: ``long`` when any breakpoint asks for the 1h TTL, ``short`` for 5m
            breakpoints (explicit or automatic), ``none`` without any ``cache_control``.
        transport: ``direct`` (in-process simulator) or ``http`` (an endpoint), as the session knows it.
        stream_strategy: ``stream`` or ``no-stream``, from the body's ``stream`` flag.
        system_digest: digest of the system blocks, ``cache_control`` ignored.
        tool_digest: digest of the sorted (name, description digest, schema digest) of every named tool,
            so tool *order* does not count (it does for the cache: :attr:`PrefixDiff.tools_reordered`).
    """

    provider: str
    model: str
    cache_retention: str
    transport: str
    stream_strategy: str
    system_digest: str
    tool_digest: str
    tool_count: int
    tool_names: tuple[str, ...]
    tools: tuple[tuple[str, str, str], ...] = field(repr=False)


_CACHE_CONTROL = attrgetter("cache_control")
_TOOL_FP: dict[str, tuple[str, str, str] | None] = {}


def _tool_fingerprint(content_hash: str, tool: Any) -> tuple[str, str, str] | None:
    fp = _TOOL_FP.get(content_hash, False)
    if fp is not False:
        return fp  # type: ignore[return-value]
    if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
        tool = tool["function"]  # an OpenAI Chat tool: {"type": "function", "function": {name, ...}}
    name = str(tool.get("name") or "").strip() if isinstance(tool, dict) else ""
    if not name:
        fp = None  # OpenClaw's collectPromptCacheToolNames drops unnamed tools
    else:
        desc = tool.get("description", "")
        schema = {k: v for k, v in tool.items() if k not in ("name", "description", "cache_control")}
        fp = (name, digest(canonical_bytes(desc), tag="tool-desc")[:16],
              digest(canonical_bytes(schema), tag="tool-schema")[:16])
    if len(_TOOL_FP) > 4096:
        _TOOL_FP.clear()
    _TOOL_FP[content_hash] = fp
    return fp


def cache_retention(request: PreparedRequest) -> str:
    """``long`` / ``short`` / ``none`` from the request's ``cache_control`` TTLs."""
    segs = request.segments
    ttls = [segs[i].cache_control for i in marker_indices(request)]  # markers are non-empty dicts
    auto = request.rest.get("cache_control")
    if auto is not None:
        ttls.append(auto)
    if not ttls:
        return "none"
    return "long" if any(isinstance(c, dict) and c.get("ttl") == "1h" for c in ttls) else "short"


def snapshot(request: PreparedRequest, *, transport: str = "direct") -> Snapshot:
    """The OpenClaw snapshot of one request."""
    body = request.body
    t0, sys_start, msg_start = sections(request)  # t0 = 1 after a partial body's unlogged prefix
    system = body.get("system")
    segs = request.segments
    sys_hashes = [s.content_hash for s in segs[sys_start:msg_start]]
    fps = sorted(
        fp for s in segs[t0:sys_start] if (fp := _tool_fingerprint(s.content_hash, s.element)) is not None
    )
    return Snapshot(
        provider=PROVIDER,
        model=request.model,
        cache_retention=cache_retention(request),
        transport=transport,
        stream_strategy="stream" if body.get("stream") else "no-stream",
        system_digest=digest(("\x1f".join(sys_hashes) + f"|{type(system).__name__}").encode(), tag="sys"),
        tool_digest=digest(repr(fps).encode(), tag="tools"),
        tool_count=len(fps),
        tool_names=tuple(fp[0] for fp in fps),
        tools=tuple(fps),
    )


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")


def _tools_detail(a: Snapshot, b: Snapshot) -> str:
    head = "tool set changed with same count" if a.tool_count == b.tool_count else (
        f"{a.tool_count} -> {b.tool_count} tools")
    old = {fp[0]: fp for fp in a.tools}
    new = {fp[0]: fp for fp in b.tools}
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = []
    for name in sorted(set(old) & set(new)):
        what = [w for w, i in (("description", 1), ("schema", 2)) if old[name][i] != new[name][i]]
        if what:
            changed.append(f"{name} ({' and '.join(what)})")
    parts = [head]
    for label, names in (("added", added), ("removed", removed), ("changed", changed)):
        if names:
            parts.append(f"{label}: {_names(names)}")
    return "; ".join(parts)


def snapshot_changes(previous: Snapshot, current: Snapshot) -> list[Change]:
    """OpenClaw's ``diffSnapshots``: the six snapshot codes, in their fixed order (empty when equal)."""
    out: list[Change] = []
    if (previous.provider, previous.model) != (current.provider, current.model):
        before, after = f"{previous.provider}/{previous.model}", f"{current.provider}/{current.model}"
        out.append(Change("model", f"{before} -> {after}"))
    if previous.cache_retention != current.cache_retention:
        out.append(Change("cacheRetention", f"{previous.cache_retention} -> {current.cache_retention}"))
    if previous.transport != current.transport:
        out.append(Change("transport", f"{previous.transport} -> {current.transport}"))
    if previous.stream_strategy != current.stream_strategy:
        out.append(Change("streamStrategy", f"{previous.stream_strategy} -> {current.stream_strategy}"))
    if previous.system_digest != current.system_digest:
        out.append(Change("systemPrompt", "system prompt digest changed"))
    if previous.tool_digest != current.tool_digest:
        out.append(Change("tools", _tools_detail(previous, current)))
    return out


_RESTART_CLASS = ("model", "transport", "cacheRetention")


def history_change(d: PrefixDiff | None, changes: list[Change], events: Any = ()) -> Change | None:
    """The ``messages`` code: previous history not a prefix of the current one (OpenClaw's
    ``historyRewrite``). Skipped after a restart-class change (model, transport, cacheRetention); a
    declared compaction is reported as such rather than as a violation."""
    if d is None or any(c.code in _RESTART_CLASS for c in changes):
        return None
    rewrite = d.history_rewrite
    if rewrite is None:
        return None
    if "compaction" in events:
        return Change("messages", f"compaction changed provider history (first difference: {rewrite})")
    return Change("messages", f"{rewrite}; history must be append-only")


def is_meaningful_drop(previous_cache_read: int, cache_read: int) -> bool:
    """``cache_read < 0.95 × previous`` and a drop of at least 1,000 tokens (exact integer arithmetic)."""
    return (cache_read * 100 < previous_cache_read * 95
            and previous_cache_read - cache_read >= MIN_CACHE_BREAK_TOKEN_DROP)


def rebuild_verdict(*, first: bool, usage: Usage | None, cause: MeasuredCause | None, cache_reason: str | None,
                    previous_total: int | None, implicit: bool) -> tuple[bool | None, int]:
    """The verdict (``broke``) and the tokens it lost, by the rebuild rule :func:`~promptcache_nb.rebuilds` lists
    and ``store/_rollups.py`` selects in SQL: a measured request by its measured cause (``cause.rebuild``: more
    than the noise floor sent again of what the previous request held); a simulated one when it sent again any of
    what the previous request held (:func:`~promptcache_nb.analysis._ideal.simulated_lost`; ``implicit``: the
    provider caches implicitly). None without a reported read; never a break on a session's first request."""
    read = usage.cache_read_input_tokens if usage is not None else None
    if read is None or usage is None:
        return None, 0
    if first:
        return False, 0
    if usage.measured:
        return (True, cause.lost_tokens) if cause is not None and cause.rebuild else (False, 0)
    lost = simulated_lost(previous_total, read, usage.cache_creation_input_tokens, usage.input_tokens, cache_reason,
                          implicit=implicit)
    return lost > 0, lost


def usage_break(baseline: int | None, cache_read: int | None) -> bool | None:
    """OpenClaw's break verdict from usage alone (a usage-first import's request, no body to compare): the read
    fell at least 5 % and 1,000 tokens below ``baseline``, the last reported read. Its other clause, a read of 0
    with nothing changed, needs the two requests' snapshots: the analysis adds it (a baseline under 1,000 tokens
    only: above, a fall to 0 is a meaningful drop already). None without a reported read."""
    if cache_read is None:
        return None
    return bool(baseline) and is_meaningful_drop(int(baseline or 0), cache_read)


@dataclass(frozen=True)
class ObservationState:
    """What the next request's observation needs from the ones before (OpenClaw's tracker).

    Attributes:
        snapshot: the previous request's snapshot.
        last_cache_read: the baseline — the last *reported* cache read (a request without usage keeps it).
        last_read_snapshot: the snapshot of the request that set the baseline (complete-miss test).
        last_cache_touch_at: when a request last reported a cache read or write (OpenClaw's
            ``lastCacheTouchAt``).
        prompt_total: the previous request's prompt total as stored (``input + cache read + cache
            write``: measured when its usage was), for the next request's ideal read; None when unknown.
        last_sent: the last request with measured usage that reached the API (a prompt total above 0), the
            baseline of the next request's :func:`~promptcache_nb.analysis.cause.measured_cause`; None after a
            simulated request.
        last_sent_points: the cache model's retention points of ``last_sent`` (None until the next request
            brings them).
    """

    snapshot: Snapshot | None = None
    last_cache_read: int | None = None
    last_read_snapshot: Snapshot | None = None
    last_cache_touch_at: datetime | None = None
    prompt_total: int | None = None
    last_sent: MeasuredRequest | None = None
    last_sent_points: tuple[tuple[int, float], ...] | None = None


@dataclass(frozen=True)
class Observation:
    """One request's cache-break observation.

    Attributes:
        snapshot: this request's :class:`Snapshot`.
        changes: :class:`Change` codes against the previous request, in OpenClaw's order.
        broke: the verdict: True when the request read less than it could have (our rebuild rule, the module
            docstring), False otherwise, None without usage.
        previous_cache_read: OpenClaw's baseline before this request (None on the first request).
        cache_read: this request's cache read (None without usage).
        complete_miss: OpenClaw's rule: broke because of an unexplained total miss rather than a drop.
        explanation: plain words joining the observation, the prefix diff and the cache model's reason.
        cache_reason: the request's reason code (``hit``, ``ttl_expired``…): for measured usage its one cause
            (:func:`~promptcache_nb.analysis.cause.measured_cause`), else the cache model's.
        openclaw_broke: OpenClaw's read-drop verdict (a cross-check, never the verdict), None without usage.
        lost_tokens: the tokens a break sent again of what the cache held (0 when it did not break).
    """

    snapshot: Snapshot
    changes: tuple[Change, ...]
    broke: bool | None
    previous_cache_read: int | None
    cache_read: int | None
    complete_miss: bool
    explanation: str
    cache_reason: str | None = None
    cache_detail: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    usage: Usage | None = field(default=None, repr=False, compare=False)
    at: datetime | None = field(default=None, repr=False)
    last_cache_touch_at: datetime | None = field(default=None, repr=False)
    diff: PrefixDiff | None = field(default=None, repr=False, compare=False)
    openclaw_broke: bool | None = None
    lost_tokens: int = 0

    @property
    def retention(self) -> str:
        return self.snapshot.cache_retention

    def prompt_cache_info(self) -> dict[str, Any] | None:
        """OpenClaw's context-engine ``promptCache`` payload (``buildContextEnginePromptCacheInfo``).

        Only present fields are copied: ``retention``, ``lastCallUsage`` ({input, output, cacheRead,
        cacheWrite, total}), ``observation`` ({broke, previousCacheRead?, cacheRead?, changes?} — only when
        there is a break, a change or a numeric cache read), ``lastCacheTouchAt`` (ms since the epoch).
        None when nothing is present.
        """
        u = self.usage
        usage = None if u is None else {
            "input": u.input_tokens, "output": u.output_tokens, "cacheRead": u.cache_read_input_tokens,
            "cacheWrite": u.cache_creation_input_tokens,
        }
        if usage is not None and all(v is not None for v in usage.values()):
            usage["total"] = sum(usage.values())  # type: ignore[arg-type]
        observation = None
        if self.openclaw_broke or self.changes or self.cache_read is not None:  # as attempt.ts builds it
            observation = {"broke": bool(self.openclaw_broke), "previousCacheRead": self.previous_cache_read,
                           "cacheRead": self.cache_read, "changes": list(self.changes)}
        touch = None if self.last_cache_touch_at is None else self.last_cache_touch_at.timestamp() * 1000
        return prompt_cache_info(retention=self.snapshot.cache_retention, last_call_usage=usage,
                                 observation=observation, last_cache_touch_at=touch)

    def __repr__(self) -> str:
        codes = ", ".join(c.code for c in self.changes)
        return (f"Observation(broke={self.broke}, cache_read={self.cache_read}, "
                f"previous_cache_read={self.previous_cache_read}, changes=[{codes}])")

    def _repr_html_(self) -> str:
        esc = html.escape
        if self.broke:
            badge = '<b style="color:#b91c1c">cache break</b>'
        elif self.broke is None:
            badge = '<b style="color:#6b7280">no usage</b>'
        else:
            badge = '<b style="color:#15803d">no break</b>'
        reads = f"read {_n(self.cache_read)} (previous {_n(self.previous_cache_read)})" + (
            f" · sent again {self.lost_tokens:,}" if self.broke and self.lost_tokens else "")
        rows = "".join(
            f'<tr><td style="padding:1px 8px"><code>{esc(c.code)}</code></td>'
            f'<td style="padding:1px 8px">{visible_html(c.detail)}</td></tr>'
            for c in self.changes
        )
        table = f'<table style="border-collapse:collapse">{rows}</table>' if rows else ""
        s = self.snapshot
        snap = (f"{esc(s.provider)}/{esc(s.model)} · retention {esc(s.cache_retention)} · "
                f"{esc(s.transport)} · "
                f"{esc(s.stream_strategy)} · system {esc(s.system_digest[:10])} · "
                f"{s.tool_count} tools {esc(s.tool_digest[:10])}")
        return (
            '<div style="font-family:ui-monospace,monospace;font-size:12px">'
            f"<div><b>Observation</b> — {badge} · {esc(reads)}"
            f"{' · reason <code>' + esc(self.cache_reason) + '</code>' if self.cache_reason else ''}</div>"
            f'<div style="color:#6b7280">{snap}</div>{table}'
            f'<div style="margin-top:4px;max-width:60em">{visible_html(self.explanation)}</div></div>'
        )


def prompt_cache_info(
    *,
    retention: str | None = None,
    last_call_usage: dict[str, Any] | None = None,
    observation: dict[str, Any] | None = None,
    last_cache_touch_at: float | None = None,
) -> dict[str, Any] | None:
    """OpenClaw's ``buildContextEnginePromptCacheInfo``: copy only the fields that are present.

    ``last_call_usage`` keys are OpenClaw's (input, output, cacheRead, cacheWrite, total); None values
    are dropped. ``observation`` is ``{broke, previousCacheRead, cacheRead, changes}``; its changes
    (:class:`Change` or dicts) become ``{code, detail}`` and are dropped when empty.
    ``last_cache_touch_at`` (ms since the epoch) is copied only if finite. Returns None when nothing
    is present.
    """
    out: dict[str, Any] = {}
    if retention:
        out["retention"] = retention
    if last_call_usage:
        usage = {k: v for k, v in last_call_usage.items() if v is not None}
        if usage:
            out["lastCallUsage"] = usage
    if observation:
        obs: dict[str, Any] = {"broke": bool(observation.get("broke"))}
        for key in ("previousCacheRead", "cacheRead"):
            value = observation.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                obs[key] = value
        changes = [c.to_dict() if isinstance(c, Change) else {"code": c["code"], "detail": c["detail"]}
                   for c in observation.get("changes") or ()]
        if changes:
            obs["changes"] = changes
        out["observation"] = obs
    if isinstance(last_cache_touch_at, int | float) and math.isfinite(last_cache_touch_at):
        out["lastCacheTouchAt"] = int(last_cache_touch_at)
    return out or None


def _n(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def default_transport(usage: Usage | None) -> str:
    """``http`` for usage measured at an endpoint, else ``direct`` (when the session does not say)."""
    return "http" if usage is not None and usage.source == "live" else "direct"


def observe(
    current: PreparedRequest,
    usage: Usage | None,
    *,
    state: ObservationState | None = None,
    diff: PrefixDiff | None = None,
    previous: PreparedRequest | None = None,
    cache_reason: str | None = None,
    cache_detail: dict[str, Any] | None = None,
    at: datetime | None = None,
    previous_at: datetime | None = None,
    events: Any = (),
    transport: str = "direct",
    cause: MeasuredCause | None = None,
) -> tuple[Observation, ObservationState]:
    """Observe one request; returns the observation and the state the next request needs.

    Args:
        current: the request. usage: its usage (None or ``cache_read_input_tokens`` None = unknown).
        state: what :func:`observe` returned for the previous request (None on the first).
        diff: the prefix diff against the previous request, for the ``messages`` code and the
            explanation. previous: the previous request, used when there is no state yet.
        cache_reason / cache_detail: the cache model's ``CacheResult.reason`` / ``detail``.
        at / previous_at: request times (UTC). events: session events applied before this request.
        transport: ``direct`` or ``http``.
        cause: a measured request's one cause (:func:`~promptcache_nb.analysis.cause.measured_cause`): its
            sentence replaces the cache model's, and ``cache_reason`` / ``cache_detail`` should be its own.
    """
    snap = snapshot(current, transport=transport)
    if state is None and previous is not None:
        state = ObservationState(snapshot=snapshot(previous, transport=transport))
    state = state or ObservationState()
    first = state.snapshot is None
    changes = [] if first else snapshot_changes(state.snapshot, snap)  # type: ignore[arg-type]
    hist = history_change(diff, changes, events)
    if hist is not None:
        changes.append(hist)

    cache_read = usage.cache_read_input_tokens if usage is not None else None
    baseline = state.last_cache_read
    openclaw_broke: bool | None
    complete_miss = False
    if cache_read is None:
        openclaw_broke = None
        next_read, next_read_snap = baseline, state.last_read_snapshot
    else:
        next_read, next_read_snap = cache_read, snap
        openclaw_broke = False
        if baseline is not None and baseline > 0:
            sent = (usage.input_tokens or 0) + (usage.cache_creation_input_tokens or 0)  # type: ignore[union-attr]
            complete_miss = (
                cache_read == 0 and sent > 0 and state.last_read_snapshot is not None
                and not snapshot_changes(state.last_read_snapshot, snap)
            )
            openclaw_broke = is_meaningful_drop(baseline, cache_read) or complete_miss
            complete_miss = complete_miss and not is_meaningful_drop(baseline, cache_read)
    previous_total = state.prompt_total if state.prompt_total is not None else (
        previous.total_tokens if previous is not None else None)
    broke, lost = rebuild_verdict(first=first, usage=usage, cause=cause, cache_reason=cache_reason,
                                  previous_total=previous_total, implicit=current.wire.implicit_caching)
    touched = usage is not None and (
        usage.cache_read_input_tokens is not None or usage.cache_creation_input_tokens is not None)
    touch_at = at if touched and at is not None else state.last_cache_touch_at
    explanation = explain(
        current=current, usage=usage, diff=diff, changes=changes, broke=broke, lost_tokens=lost,
        previous_cache_read=baseline, cache_read=cache_read, cache_reason=cache_reason,
        cache_detail=cache_detail or {}, at=at, previous_at=previous_at, events=events, first=first,
        cause=cause,
    )
    obs = Observation(
        snapshot=snap, changes=tuple(changes), broke=broke, previous_cache_read=baseline,
        cache_read=cache_read,
        complete_miss=complete_miss, explanation=explanation, cache_reason=cache_reason,
        cache_detail=dict(cache_detail or {}), usage=usage, at=at, last_cache_touch_at=touch_at, diff=diff,
        openclaw_broke=openclaw_broke, lost_tokens=lost,
    )
    return obs, ObservationState(snap, next_read, next_read_snap, touch_at,
                                 usage.total_input_tokens if usage is not None else None)


# -- plain words -------------------------------------------------------------------------------

def _with_prediction(cause: str, reason: str, detail: dict[str, Any], usage: Usage | None) -> str:
    """The cache model's cause in its place: as is for simulated usage; for measured usage second to the
    measured figures, and replaced by the disagreement when the measurement contradicts it."""
    if usage is None or not usage.measured or "predicted_usage" not in detail:
        return cause
    gap = prediction_gap(usage, detail)
    if gap is None:
        lowered = cause[:1].lower() + cause[1:] if cause[1:2].islower() else cause  # "TTL" stays
        return f"The simulator predicted the same: {lowered}"
    p_read, m_read = gap
    why = ("likely eviction" if m_read < p_read
           else "the cache held more than the simulator modelled (a longer-lived entry, or an estimate off)")
    return (f"The simulator expected to read {p_read:,} tokens (its reason: {reason}); the API read "
            f"{m_read:,} — {why}.")


def explain(
    *, current: PreparedRequest, usage: Usage | None, diff: PrefixDiff | None, changes: list[Change],
    broke: bool | None, lost_tokens: int, previous_cache_read: int | None, cache_read: int | None,
    cache_reason: str | None, cache_detail: dict[str, Any], at: datetime | None, previous_at: datetime | None,
    events: Any, first: bool, cause: MeasuredCause | None = None,
) -> str:
    """The observation in plain words (deterministic: numbers with thousands separators, no clock).

    The first sentence states the verdict (:func:`rebuild_verdict`); a measured request's cause is ``cause``'s
    sentence, the one its :func:`~promptcache_nb.rebuilds` row states."""
    parts: list[str] = []
    if first:
        parts.append("First request of the session.")
    elif cache_read is None:
        parts.append("No usage reported, so no verdict.")
    elif broke:
        parts.append(f"Cache break: read {cache_read:,} cached tokens and sent again {lost_tokens:,} the cache "
                     "held for it.")
    elif previous_cache_read is not None:
        parts.append(f"Read {cache_read:,} cached tokens (previous request: {previous_cache_read:,}): "
                     "no break.")
    else:
        parts.append(f"Read {cache_read:,} cached tokens: no break.")
    gap = (at - previous_at).total_seconds() if at is not None and previous_at is not None else None
    if cause is not None:
        parts.append(cause.explanation)
    elif cache_reason:
        said = explain_reason(cache_reason, cache_detail, gap=gap, request=current, usage=usage, diff=diff)
        parts.append(_with_prediction(said, cache_reason, cache_detail, usage))
    writer = cache_detail.get("read_from_session")
    if writer and cache_read:
        # one cache per account, as the provider keeps it: a session reads what another of the account wrote
        parts.append(f"The simulated cache entry read was written by session {writer} (same account's cache).")
    if diff is not None:
        if diff.pure_append:
            if diff.identical:
                parts.append("The request repeats the previous one's segments.")
            else:
                parts.append(f"The request only appended {diff.appended} segment"
                             f"{'s' if diff.appended != 1 else ''} to the previous one.")
        elif cache_reason != "prefix_changed":
            parts.append(f"Its prefix diverges from the previous request {where(diff)}; "
                         f"~{diff.shared_prefix_tokens:,} tokens are shared.")
        if diff.tools_reordered:
            parts.append("The tools are the same set in another order: OpenClaw's sorted tool digest "
                         "does not "
                         "see that, but the cache does.")
        if diff.ignored_changes:
            names = ", ".join(c.path for c in diff.ignored_changes)
            parts.append(f"Ignored (never affects caching): {names}.")
    if changes:
        parts.append("Changes: " + "; ".join(f"{c.code} ({c.detail})" for c in changes) + ".")
    if events:
        parts.append("Events before it: " + ", ".join(str(e) for e in events) + ".")
    return visible(" ".join(parts))
