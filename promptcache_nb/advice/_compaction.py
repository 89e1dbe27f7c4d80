"""When did each compaction happen, as the cache saw it: on a warm cache it threw away, or after an idle gap that
had expired it anyway?

A compaction (the ``compaction`` event the importer or the scenario recorded on the request after it) replaces the
history by a summary: the request after it writes the summary and everything after it again. Timed right after an
idle gap longer than the conversation's cache TTL, that rewrite costs no warm cache (the gap had expired it);
timed on a warm cache, it discards what the requests before it had cached. This reads the figures the data holds:
the stored usage (measured for imported and live sessions, else simulated — each row says which), the gaps, and the
conversation breakpoint's TTL (a partial log's assumed ``client_ttls``, else the last ``cache_control`` marker's).

What it does not do: simulate the saving of compacting at another time. That would need the summary the client
would have written then, and every body between the two moments would change (what Claude Code, Codex and pi keep
after a summary differs); the log holds neither, so the figure would be invented. ``NOT_SIMULATED`` says so
wherever the result is shown.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._lazy import pandas as pd
from ..usage import Usage
from ._anchor import MEASURED, _int
from ._counterfactual import Original, _fixes_ttls

if TYPE_CHECKING:  # pragma: no cover

    from ..session import Session

COMPACTION_COLUMNS = [
    "session", "idx", "sent_at", "gap_seconds", "ttl_seconds", "warm", "discarded_tokens", "rewrite_tokens",
    "rewrite_usd", "cold_gap_before", "cold_gap_seconds", "verdict", "source",
]

#: Why the timing what-if carries no simulated saving (shown with every compaction row).
NOT_SIMULATED = ("the saving of compacting at another moment is not simulated: the log holds no summary written "
                 "then, and every body between the two moments would change")

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


def _tail_ttl(orig: Original, body: dict[str, Any]) -> float:
    """How long the conversation's cache entry lives: the last marker's TTL, else (a partial body) the assumed
    conversation breakpoint's, else 5 minutes."""
    marks = _fixes_ttls(body)
    if marks:
        return TTL_SECONDS.get(marks[-1], 300.0)
    if orig.partial is not None:
        ttls = list(orig.cache_params.get("client_ttls") or ["5m", "5m"])
        return TTL_SECONDS.get(str(ttls[-1]), 300.0)
    return 300.0


def _events(raw: Any) -> list[str]:
    if isinstance(raw, str):
        raw = json.loads(raw)
    return [str(e) for e in raw or []]


def compaction_rows(orig: Original) -> list[dict[str, Any]]:
    """One row per compaction of ``orig`` (see :func:`compaction_timing`)."""
    sid = orig.row["id"]
    events = {r["idx"]: _events(r["events"]) for r in orig.lab.store.turn_rows(sid, ("idx", "events"))}
    turns = orig.turns
    rows: list[dict[str, Any]] = []
    last_compaction = 0
    for k, t in enumerate(turns):
        if "compaction" not in events.get(t.idx, []):
            continue
        source = "measured" if t.stored.get("usage_source") in MEASURED else "simulated"
        row: dict[str, Any] = {"session": sid, "idx": t.idx, "sent_at": t.at, "source": source}
        if k == 0:
            rows.append({**row, "verdict": "the first request: nothing before it to time it against"})
            continue
        prev = turns[k - 1]
        gap = (t.at - prev.at).total_seconds()
        ttl = _tail_ttl(orig, prev.request.body)
        warm = gap <= ttl
        cached_before = _int(prev.stored.get("cache_read_input_tokens")) + _int(
            prev.stored.get("cache_creation_input_tokens"))
        read = _int(t.stored.get("cache_read_input_tokens"))
        write = _int(t.stored.get("cache_creation_input_tokens"))
        w1h = _int(t.stored.get("cache_creation_1h_input_tokens"))
        prices = orig.prices(t.model)
        usd = None if prices is None else prices.cost(Usage(0, 0, write, write - w1h, w1h, 0), t.at)
        cold = None
        for j in range(k - 1, last_compaction, -1):  # the latest idle gap since the previous compaction
            g = (turns[j].at - turns[j - 1].at).total_seconds()
            if g > _tail_ttl(orig, turns[j - 1].request.body):
                cold = (turns[j].idx, g)
                break
        discarded = max(0, cached_before - read) if warm else 0
        if not warm:
            verdict = (f"well timed: after a {gap / 60:.0f} min gap the cache had expired (TTL "
                       f"{ttl / 60:.0f} min); the rewrite discarded nothing warm")
        elif cold is not None:
            verdict = (f"discarded a warm cache ({discarded:,} tokens); the {cold[1] / 60:.0f} min gap before request "
                       f"{cold[0]} had expired it {t.idx - cold[0]} requests earlier: compacting there rebuilds once, "
                       "not twice")
        else:
            since = "previous compaction" if last_compaction else "first request"
            verdict = (f"discarded a warm cache ({discarded:,} tokens); no idle gap since the {since}: no cheaper "
                       "moment in this log")
        rows.append({**row, "gap_seconds": gap, "ttl_seconds": ttl, "warm": warm, "discarded_tokens": discarded,
                     "rewrite_tokens": write, "rewrite_usd": usd, "cold_gap_before": None if cold is None else cold[0],
                     "cold_gap_seconds": None if cold is None else cold[1], "verdict": verdict})
        last_compaction = k
    return rows


def compaction_timing(session: Session) -> pd.DataFrame:
    """Each compaction of ``session``, as the cache saw it: warm or expired, what it discarded and rewrote.

    Args:
        session: a stored session (a partial log's too: Claude Code, Codex, pi).

    Returns:
        One row per request carrying a ``compaction`` event: ``session, idx, sent_at, gap_seconds`` (before it),
        ``ttl_seconds`` (the conversation entry's), ``warm`` (the gap was shorter), ``discarded_tokens`` (what
        the request before it left cached and it did not read; 0 after an expiring gap), ``rewrite_tokens`` and
        ``rewrite_usd`` (its cache write), ``cold_gap_before`` / ``cold_gap_seconds`` (the latest idle gap since
        the previous compaction that expired the cache anyway: where compacting rebuilds once, not twice),
        ``verdict`` and ``source`` (``measured`` or ``simulated`` usage). ``attrs["not_simulated"]`` says why no
        saving of another timing is given (:data:`NOT_SIMULATED`).

    Example:
        >>> pc.advice.compaction_timing(s)  # doctest: +SKIP
    """
    orig = Original.load(session)
    df = pd.DataFrame(compaction_rows(orig), columns=COMPACTION_COLUMNS)
    df.attrs["not_simulated"] = NOT_SIMULATED
    return df
