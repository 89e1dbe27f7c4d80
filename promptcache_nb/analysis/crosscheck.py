"""Our cache-break observation beside the one the logging agent made itself (OpenClaw's ``cache:result``).

An imported OpenClaw cache trace (or payload log beside its trace) stores OpenClaw's own observation of a run
with the run's last request (``cache_detail["agent_observation"]``, see :mod:`promptcache_nb.importers.openclaw`).
:func:`openclaw_crosscheck` puts it beside ours (``turns.broke`` / ``previous_cache_read`` / ``changes``), one
row per request.

Where the two may differ (docs/howto/own-logs.md, "OpenClaw cross-check"):

* OpenClaw observes once per *run* and, in the versions that write ``cache:result`` from the attempt runner, with
  the run's usage totals (``getUsageTotals``: the cache reads of every call of a tool loop summed); we observe
  every call with its own usage. On a run of one call the figures are the same.
* OpenClaw's complete-miss test needs uncached ``input > 0``; ours also counts cache writes as prompt sent (an
  Anthropic rebuild reports ``input_tokens`` near 0). Older OpenClaw versions have no complete-miss test at all.
* Change codes come from different snapshots: OpenClaw's from its runtime (transport, stream strategy, the
  stable part of the system prompt before its cache boundary, tool names and schemas); ours from the logged body
  (a cache trace logs no tools, so ``tools`` changes are OpenClaw's alone).
* OpenClaw keys its trackers by session key (at most 512, the oldest evicted) and keeps them in memory: a
  restarted gateway starts without a baseline, where the log still has one for us.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._protocols import LabLike, StoredSession, resolve_session

if TYPE_CHECKING:
    import pandas as pd

CROSSCHECK_COLUMNS = ["idx", "sent_at", "cache_read", "broke", "previous_cache_read", "changes", "openclaw_broke",
                      "openclaw_previous_cache_read", "openclaw_cache_read", "openclaw_changes", "openclaw_note",
                      "agree"]
_COLUMNS = ("idx", "sent_at", "cache_read_input_tokens", "broke", "previous_cache_read", "changes", "cache_detail")


def openclaw_crosscheck(session: StoredSession | LabLike, *, session_id: str | None = None) -> pd.DataFrame:
    """Per request: our observation, OpenClaw's own (where its log has one), and whether they agree.

    Args:
        session: an imported OpenClaw session (or a Lab, with ``session_id``).

    Returns:
        One row per request: ``idx, sent_at, cache_read``; ours: ``broke, previous_cache_read, changes`` (codes);
        OpenClaw's: ``openclaw_broke, openclaw_previous_cache_read, openclaw_cache_read, openclaw_changes``,
        ``openclaw_note``; ``agree`` (``broke == openclaw_broke``, None where OpenClaw observed nothing).

    Example:
        >>> pc.analysis.openclaw_crosscheck(s).query("agree == False")      # doctest: +SKIP
    """
    import pandas as pd

    lab, sid = resolve_session(session, session_id)
    df = lab.store.turns_frame(sid, _COLUMNS)
    rows: list[dict[str, Any]] = []
    for r in df.itertuples(index=False):
        detail = json.loads(r.cache_detail) if isinstance(r.cache_detail, str) else {}
        theirs = detail.get("agent_observation") if isinstance(detail, dict) else None
        ours_broke = None if _missing(r.broke) else bool(r.broke)
        row = {
            "idx": int(r.idx), "sent_at": r.sent_at, "cache_read": _int(r.cache_read_input_tokens), "broke": ours_broke,
            "previous_cache_read": _int(r.previous_cache_read),
            "changes": [c["code"] for c in json.loads(r.changes)] if isinstance(r.changes, str) else [],
            "openclaw_broke": None, "openclaw_previous_cache_read": None, "openclaw_cache_read": None,
            "openclaw_changes": None, "openclaw_note": None, "agree": None,
        }
        if isinstance(theirs, dict):
            row.update({
                "openclaw_broke": bool(theirs.get("broke")),
                "openclaw_previous_cache_read": theirs.get("previous_cache_read"),
                "openclaw_cache_read": theirs.get("cache_read"),
                "openclaw_changes": [c.get("code") for c in theirs.get("changes") or [] if isinstance(c, dict)],
                "openclaw_note": theirs.get("note"),
                "agree": None if ours_broke is None else ours_broke == bool(theirs.get("broke")),
            })
        rows.append(row)
    return pd.DataFrame(rows, columns=CROSSCHECK_COLUMNS)


def _missing(value: Any) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


def _int(value: Any) -> int | None:
    return None if _missing(value) else int(value)
