"""Per-turn analysis the session stores with each request: prefix diff and cache-break observation.

``analyse_turn`` is called once per request inside the session's write path; its ``columns`` land in
the ``turns`` row:

* ``diverge_path`` / ``diverge_byte`` / ``diverge_token`` — :class:`~promptcache_nb.PrefixDiff`'s
  ``path``, ``byte_offset`` and ``token_offset`` against the previous request (NULL on the first request
  and for a pure append). ``diverge_byte`` is an offset into ``canonical_bytes(body)`` of *this* request:
  the first byte of the first divergent segment (cache-prefix order tools → system → messages) that
  differs from the previous request's segment at the same position, ``cache_control`` ignored; for a
  top-level field divergence (``model``, ``tool_choice``…) the first differing byte of that field's
  value; for a truncated request the byte right after the last shared segment. It is computed from the
  memoised segment sizes, without serialising the body.
* ``shared_prefix_tokens`` — estimated tokens of the whole segments shared before the divergence.
* ``pure_append`` — the previous request is a prefix of this one (cache-wise).
* ``broke`` / ``previous_cache_read`` / ``changes`` / ``explanation`` / ``openclaw_broke`` — the
  :class:`~promptcache_nb.Observation` (``changes`` is a canonical JSON list of ``{code, detail}``): ``broke``
  is the verdict (the rebuild rule), ``openclaw_broke`` OpenClaw's read-drop rule kept as a cross-check.

For a request with measured usage, ``cache_reason`` and ``cache_detail`` are its one cause
(:func:`~promptcache_nb.analysis.cause.measured_cause`), which the explanation states too; the cache
model's verdict is kept in the detail as a prediction (``predicted_reason``, ``predicted_usage``).

Per-turn cost is a few C-speed passes over the segment list (hash keys, common prefix, cumulative
tokens) plus byte work inside the one divergent segment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ..cache import CacheResult
from ..request import PreparedRequest, SegmentMemo, canonical_json, prepare
from ..request.diff import PrefixDiff, compute_diff
from ..store import Store
from ..usage import Usage
from .cause import MeasuredCause, MeasuredRequest, measured_cause
from .observe import (
    Change,
    Observation,
    ObservationState,
    Snapshot,
    default_transport,
    is_meaningful_drop,
    observe,
    snapshot,
)

OBSERVATION_COLUMNS = (
    "diverge_path", "diverge_byte", "diverge_token", "shared_prefix_tokens", "pure_append",
    "broke", "previous_cache_read", "changes", "explanation", "openclaw_broke",
)


@dataclass
class TurnAnalysis:
    columns: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(OBSERVATION_COLUMNS))
    diff: PrefixDiff | None = None
    observation: Observation | None = None
    state: ObservationState | None = None
    prompt_cache_info: dict[str, Any] | None = None
    #: the request's stored ``cache_reason`` / ``cache_detail``: a measured request's one cause, else the cache
    #: model's verdict
    cache_reason: str | None = None
    cache_detail: dict[str, Any] | None = None
    cause: MeasuredCause | None = None


def analyse_turn(
    *,
    previous: PreparedRequest | None,
    current: PreparedRequest,
    usage: Usage,
    cache_result: CacheResult | None,
    previous_state: Any,
    at: datetime,
    previous_at: datetime | None,
    events: list[str],
    transport: str | None = None,
    retention_points: Sequence[tuple[int, float]] | None = None,
    minimum: int = 0,
) -> TurnAnalysis:
    """Diff ``current`` against ``previous`` and observe it; ``state`` feeds the next call.

    ``retention_points`` (the cache model's, for ``previous``) and ``minimum`` (its minimum cacheable length
    for ``current``'s model) feed a measured request's cause."""
    d = compute_diff(previous, current) if previous is not None else None
    st = previous_state if isinstance(previous_state, ObservationState) else None
    cause, next_sent = _cause(st, previous, current, usage, cache_result, d, at, events, retention_points,
                              minimum)
    reason = cause.reason if cause is not None else cache_result.reason if cache_result else None
    detail = cause.detail if cause is not None else cache_result.detail if cache_result else None
    obs, state = observe(
        current, usage, state=st, diff=d, previous=previous, cache_reason=reason, cache_detail=detail, at=at,
        previous_at=previous_at, events=events, transport=transport or default_transport(usage), cause=cause,
    )
    state = replace(state, last_sent=next_sent[0], last_sent_points=next_sent[1])
    if cause is None and detail is not None and obs.broke is not None:
        # a simulated request's loss, beside the cache model's evidence: the SQL rule reads it (store/_rollups.py);
        # not ``lost_tokens``, which marks a measured cause's evidence
        detail = {**detail, "simulated_lost_tokens": obs.lost_tokens}
    columns = {
        "diverge_path": d.path if d else None,
        "diverge_byte": d.byte_offset if d else None,
        "diverge_token": d.token_offset if d else None,
        "shared_prefix_tokens": d.shared_prefix_tokens if d else None,
        "pure_append": d.pure_append if d else None,
        "broke": obs.broke,
        "previous_cache_read": obs.previous_cache_read,
        "changes": canonical_json([c.to_dict() for c in obs.changes]),
        "explanation": obs.explanation,
        "openclaw_broke": obs.openclaw_broke,
    }
    return TurnAnalysis(columns, d, obs, state, obs.prompt_cache_info(), reason, detail, cause)


def _cause(st: ObservationState | None, previous: PreparedRequest | None, current: PreparedRequest, usage: Usage,
           cache_result: CacheResult | None, d: PrefixDiff | None, at: datetime, events: list[str],
           retention_points: Sequence[tuple[int, float]] | None, minimum: int
           ) -> tuple[MeasuredCause | None, tuple[MeasuredRequest | None, tuple[tuple[int, float], ...] | None]]:
    """A measured request's cause against the last request that reached the API, and that baseline for the
    next request (with its retention points once known)."""
    sent = st.last_sent if st is not None else None
    points = st.last_sent_points if st is not None else None
    if sent is not None and sent.request is previous:  # the session's points are this baseline's
        points = tuple(retention_points) if retention_points is not None else None
    cause = None
    if usage.measured and usage.total_input_tokens and (sent is not None or previous is None):
        cause = measured_cause(
            sent, MeasuredRequest(current, at, usage, tuple(events)),
            diff=d if sent is not None and sent.request is previous else None, retention_points=points,
            minimum=minimum, predicted_reason=cache_result.reason if cache_result else None,
            predicted_detail=cache_result.detail if cache_result else None,
        )
    if not usage.measured:
        return cause, (None, None)  # estimated figures are no baseline for measured ones
    if usage.total_input_tokens:
        return cause, (MeasuredRequest(current, at, usage, tuple(events)), None)
    return cause, (sent, points)  # no prompt reached the API (a placeholder entry): the baseline stays


# -- rebuilding from the store ------------------------------------------------------------------

def _snapshot_at(store: Store, session_id: str, idx: int, row: dict[str, Any] | None,
                 requests: Mapping[int, PreparedRequest] | None = None) -> Snapshot:
    """``row`` holds the request's ``usage_source`` and ``transport``; rows from before m004 have no transport.
    ``requests``: requests already rebuilt (by index), used instead of reading the body again."""
    got = requests.get(idx) if requests is not None else None
    prepared = got if got is not None else prepare(store.turn_body(session_id, idx))
    usage_source, transport = (row["usage_source"], row["transport"]) if row else (None, None)
    return snapshot(prepared, transport=transport or ("http" if usage_source == "live" else "direct"))


def _prompt_total(row: dict[str, Any]) -> int | None:
    parts = (row["input_tokens"], row["cache_read_input_tokens"], row["cache_creation_input_tokens"])
    return None if any(p is None for p in parts) else sum(parts)


_STATE_COLUMNS = ("usage_source", "transport", "input_tokens", "cache_read_input_tokens",
                  "cache_creation_input_tokens", "sent_at", "events")


def _state_as_of(store: Store, session_id: str, upto: int | None,
                 requests: Mapping[int, PreparedRequest] | None = None) -> ObservationState | None:
    marks = store.usage_marks(session_id, upto)
    if marks is None:
        return None
    last = store.turn_row(session_id, marks.last_idx, _STATE_COLUMNS)
    snap = _snapshot_at(store, session_id, marks.last_idx, last, requests)
    last_read = read_snap = None
    if marks.read_idx is not None:
        read_row = last if marks.read_idx == marks.last_idx else store.turn_row(session_id, marks.read_idx,
                                                                                _STATE_COLUMNS)
        last_read = read_row["cache_read_input_tokens"] if read_row else None
        read_snap = snap if marks.read_idx == marks.last_idx else _snapshot_at(store, session_id, marks.read_idx,
                                                                                read_row, requests)
    return ObservationState(snap, last_read, read_snap, marks.touch_at.astimezone(UTC) if marks.touch_at else None,
                            _prompt_total(last) if last else None,
                            _last_sent(store, session_id, marks.last_idx, last, requests))


def _last_sent(store: Store, session_id: str, idx: int, row: dict[str, Any] | None,
               requests: Mapping[int, PreparedRequest] | None) -> MeasuredRequest | None:
    """The baseline of the next measured cause after a restart: the last request, when it is measured and
    reached the API (after a placeholder entry the baseline is not looked for further back)."""
    if row is None or row["usage_source"] not in ("live", "imported") or not _prompt_total(row):
        return None
    got = requests.get(idx) if requests is not None else None
    prepared = got if got is not None else prepare(store.turn_body(session_id, idx))
    usage = Usage(row["input_tokens"], row["cache_read_input_tokens"], row["cache_creation_input_tokens"],
                  source=row["usage_source"])
    events = tuple(json.loads(row["events"])) if row["events"] else ()
    return MeasuredRequest(prepared, row["sent_at"].astimezone(UTC), usage, events)


def observation_state_from_store(store: Store, session_id: str, *,
                                 requests: Mapping[int, PreparedRequest] | None = None) -> ObservationState | None:
    """Rebuild the state ``analyse_turn`` needs after a restart (from stored usage and bodies; ``requests``:
    the session's last requests already rebuilt, by index)."""
    return _state_as_of(store, session_id, None, requests)


def stored_diff_and_observation(
    store: Store, session_id: str, index: int, prev_body: dict[str, Any] | None, body: dict[str, Any], *,
    memo: SegmentMemo | None = None, current: PreparedRequest | None = None,
) -> tuple[PrefixDiff | None, Observation]:
    """Diff and observation of a stored turn (``Session.turn``); ``prev_body`` None for turn 0; ``current``:
    ``body`` already prepared with ``memo`` (not segmented again).

    The observation is rebuilt from the stored columns (so it matches what was written, whatever
    tokenizer the Lab used); turns stored without them are observed again.
    """
    memo = memo or SegmentMemo()  # the session's memo: its tokenizer (and calibration) for the figures
    prev_p = None if prev_body is None else prepare(prev_body, memo=memo)
    cur_p = current if current is not None else prepare(body, memo=memo, previous=prev_p)
    d = None if prev_p is None else compute_diff(prev_p, cur_p)
    row = store.turn_row(session_id, index, _OBSERVED_COLUMNS)
    if row is None:
        raise LookupError(f"session {session_id!r} has no turn {index}")
    at = row["sent_at"].astimezone(UTC)
    usage = Usage(*(row[c] for c in _USAGE_COLUMNS))
    detail = json.loads(row["cache_detail"]) if row["cache_detail"] else {}
    events = json.loads(row["events"]) if row["events"] else []
    transport = row["transport"] or default_transport(usage)
    if row["changes"] is None or row["explanation"] is None:
        prev = store.turn_row(session_id, index - 1, ("sent_at",)) if index else None
        obs, _ = observe(
            cur_p, usage, state=_state_as_of(store, session_id, index - 1) if index else None, diff=d,
            previous=prev_p,
            cache_reason=row["cache_reason"], cache_detail=detail, at=at,
            previous_at=prev["sent_at"].astimezone(UTC) if prev else None, events=events,
            transport=transport,
        )
        return d, obs
    marks = store.usage_marks(session_id, index)
    touch = marks.touch_at if marks is not None else None
    cache_read, previous, broke = row["cache_read_input_tokens"], row["previous_cache_read"], row["broke"]
    openclaw_broke = row["openclaw_broke"]
    complete_miss = bool(openclaw_broke) and cache_read == 0 and previous is not None and not is_meaningful_drop(
        previous, cache_read)
    obs = Observation(
        snapshot=snapshot(cur_p, transport=transport),
        changes=tuple(Change(c["code"], c["detail"]) for c in json.loads(row["changes"])),
        broke=broke, previous_cache_read=previous, cache_read=cache_read, complete_miss=complete_miss,
        explanation=row["explanation"], cache_reason=row["cache_reason"], cache_detail=detail, usage=usage, at=at,
        last_cache_touch_at=touch.astimezone(UTC) if touch else None, diff=d, openclaw_broke=openclaw_broke,
        lost_tokens=int(detail.get("lost_tokens") or 0) if broke else 0,
    )
    return d, obs


_USAGE_COLUMNS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                  "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens", "output_tokens", "usage_source")
_OBSERVED_COLUMNS = ("sent_at", *_USAGE_COLUMNS, "cache_reason", "cache_detail", "events", "broke", "openclaw_broke",
                     "previous_cache_read", "changes", "explanation", "transport")
