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
* ``broke`` / ``previous_cache_read`` / ``changes`` / ``explanation`` — the
  :class:`~promptcache_nb.Observation` (``changes`` is a canonical JSON list of ``{code, detail}``).

Per-turn cost is a few C-speed passes over the segment list (hash keys, common prefix, cumulative
tokens) plus byte work inside the one divergent segment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..cache import CacheResult
from ..request import PreparedRequest, SegmentMemo, canonical_json, prepare
from ..request.diff import PrefixDiff, compute_diff
from ..usage import Usage
from .observe import (
    Change,
    Observation,
    ObservationState,
    default_transport,
    is_meaningful_drop,
    observe,
    snapshot,
)

OBSERVATION_COLUMNS = (
    "diverge_path", "diverge_byte", "diverge_token", "shared_prefix_tokens", "pure_append",
    "broke", "previous_cache_read", "changes", "explanation",
)


@dataclass
class TurnAnalysis:
    columns: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(OBSERVATION_COLUMNS))
    diff: PrefixDiff | None = None
    observation: Observation | None = None
    state: ObservationState | None = None
    prompt_cache_info: dict[str, Any] | None = None


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
) -> TurnAnalysis:
    """Diff ``current`` against ``previous`` and observe it; ``state`` feeds the next call."""
    d = compute_diff(previous, current) if previous is not None else None
    obs, state = observe(
        current, usage, state=previous_state if isinstance(previous_state, ObservationState) else None,
        diff=d, previous=previous, cache_reason=cache_result.reason if cache_result else None,
        cache_detail=cache_result.detail if cache_result else None, at=at, previous_at=previous_at,
        events=events, transport=transport or default_transport(usage),
    )
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
    }
    return TurnAnalysis(columns, d, obs, state, obs.prompt_cache_info())


# -- rebuilding from the store ------------------------------------------------------------------

def _snapshot_at(store: Any, session_id: str, idx: int, source: tuple | None) -> Any:
    """``source`` is the row's (usage_source, transport); rows from before m004 have no transport."""
    body = store.turn_body(session_id, idx)
    usage_source, transport = source or (None, None)
    return snapshot(prepare(body), transport=transport or ("http" if usage_source == "live" else "direct"))


def _state_as_of(store: Any, session_id: str, upto: int | None) -> ObservationState | None:
    where, params = "session_id = ?", [session_id]
    if upto is not None:
        where += " AND idx <= ?"
        params.append(upto)
    row = store.one(
        f"""SELECT max(idx),
                   max(idx) FILTER (WHERE cache_read_input_tokens IS NOT NULL),
                   max("at") FILTER (WHERE cache_read_input_tokens IS NOT NULL
                                     OR cache_creation_input_tokens IS NOT NULL)
            FROM turns WHERE {where}""",
        params,
    )
    if row is None or row[0] is None:
        return None
    last_idx, read_idx, touch_at = row
    sources = {r[0]: (r[1], r[2]) for r in store.rows(
        "SELECT idx, usage_source, transport FROM turns WHERE session_id = ? AND idx IN (?, ?)",
        [session_id, last_idx, last_idx if read_idx is None else read_idx],
    )}
    snap = _snapshot_at(store, session_id, last_idx, sources.get(last_idx))
    prompt_total = store.one(
        """SELECT input_tokens + cache_read_input_tokens + cache_creation_input_tokens
           FROM turns WHERE session_id = ? AND idx = ?""",
        [session_id, last_idx],
    )[0]
    last_read = read_snap = None
    if read_idx is not None:
        last_read = store.one(
            "SELECT cache_read_input_tokens FROM turns WHERE session_id = ? AND idx = ?",
            [session_id, read_idx],
        )[0]
        read_snap = snap if read_idx == last_idx else _snapshot_at(store, session_id, read_idx,
                                                                   sources.get(read_idx))
    return ObservationState(snap, last_read, read_snap, touch_at.astimezone(UTC) if touch_at else None,
                            prompt_total)


def observation_state_from_store(store: Any, session_id: str) -> ObservationState | None:
    """Rebuild the state ``analyse_turn`` needs after a restart (from stored usage and bodies)."""
    return _state_as_of(store, session_id, None)


def stored_diff_and_observation(
    store: Any, session_id: str, index: int, prev_body: dict | None, body: dict, *, memo: SegmentMemo | None = None
) -> tuple[PrefixDiff | None, Observation]:
    """Diff and observation of a stored turn (``Lab._turn_from_store``); ``prev_body`` None for turn 0.

    The observation is rebuilt from the stored columns (so it matches what was written, whatever
    tokenizer the Lab used); turns stored without them are observed again.
    """
    memo = memo or SegmentMemo()  # the session's memo: its tokenizer (and calibration) for the figures
    cur_p = prepare(body, memo=memo)
    prev_p = None if prev_body is None else prepare(prev_body, memo=memo)
    d = None if prev_p is None else compute_diff(prev_p, cur_p)
    row = store.one(
        """SELECT "at", input_tokens, cache_read_input_tokens, cache_creation_input_tokens,
                  cache_creation_5m_input_tokens, cache_creation_1h_input_tokens, output_tokens, usage_source,
                  cache_reason, cache_detail, events, broke, previous_cache_read, changes, explanation,
                  transport
           FROM turns WHERE session_id = ? AND idx = ?""",
        [session_id, index],
    )
    if row is None:
        raise LookupError(f"session {session_id!r} has no turn {index}")
    at = row[0].astimezone(UTC)
    usage = Usage(row[1], row[2], row[3], row[4], row[5], row[6], row[7])
    detail = json.loads(row[9]) if row[9] else {}
    events = json.loads(row[10]) if row[10] else []
    transport = row[15] or default_transport(usage)
    if row[13] is None or row[14] is None:
        prev_at_row = store.one('SELECT "at" FROM turns WHERE session_id = ? AND idx = ?',
                                [session_id, index - 1])
        obs, _ = observe(
            cur_p, usage, state=_state_as_of(store, session_id, index - 1) if index else None, diff=d,
            previous=prev_p,
            cache_reason=row[8], cache_detail=detail, at=at,
            previous_at=prev_at_row[0].astimezone(UTC) if prev_at_row else None, events=events,
            transport=transport,
        )
        return d, obs
    touch = store.one(
        """SELECT max("at") FILTER (WHERE cache_read_input_tokens IS NOT NULL
                                    OR cache_creation_input_tokens IS NOT NULL)
           FROM turns WHERE session_id = ? AND idx <= ?""",
        [session_id, index],
    )[0]
    cache_read, previous, broke = row[2], row[12], row[11]
    complete_miss = bool(broke) and cache_read == 0 and previous is not None and not is_meaningful_drop(
        previous, cache_read)
    obs = Observation(
        snapshot=snapshot(cur_p, transport=transport),
        changes=tuple(Change(c["code"], c["detail"]) for c in json.loads(row[13])),
        broke=broke, previous_cache_read=previous, cache_read=cache_read, complete_miss=complete_miss,
        explanation=row[14], cache_reason=row[8], cache_detail=detail, usage=usage, at=at,
        last_cache_touch_at=touch.astimezone(UTC) if touch else None, diff=d,
    )
    return d, obs
