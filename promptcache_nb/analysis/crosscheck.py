"""OpenClaw's read-drop rule as we compute it beside the observation the logging agent made itself (OpenClaw's
``cache:result``), and both beside our verdict.

An imported OpenClaw cache trace (or payload log beside its trace) stores OpenClaw's own observation of a run
with the run's last request (``cache_detail["agent_observation"]``, see :mod:`promptcache_nb.importers.openclaw`).
:func:`openclaw_crosscheck` puts it beside ours, one row per request: our verdict (``turns.broke``, the rebuild
rule), our computation of OpenClaw's rule (``turns.openclaw_broke`` / ``previous_cache_read`` / ``changes``) and
the agent's own (``agent_*``); ``agree`` compares the two computations of OpenClaw's rule.

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

CROSSCHECK_COLUMNS = ["idx", "sent_at", "cache_read", "broke", "openclaw_broke", "previous_cache_read", "changes",
                      "agent_broke", "agent_previous_cache_read", "agent_cache_read", "agent_changes", "agent_note",
                      "agree"]
_COLUMNS = ("idx", "sent_at", "cache_read_input_tokens", "broke", "openclaw_broke", "previous_cache_read", "changes",
            "cache_detail")


def openclaw_crosscheck(session: StoredSession | LabLike, *, session_id: str | None = None) -> pd.DataFrame:
    """Per request: our verdict, OpenClaw's rule as we compute it, OpenClaw's own observation (where its log has
    one), and whether the two computations of OpenClaw's rule agree.

    Args:
        session: an imported OpenClaw session (or a Lab, with ``session_id``).

    Returns:
        One row per request: ``idx, sent_at, cache_read``; ``broke`` (our verdict: the rebuild rule);
        ``openclaw_broke, previous_cache_read, changes`` (codes): OpenClaw's rule as we compute it; the agent's own:
        ``agent_broke, agent_previous_cache_read, agent_cache_read, agent_changes, agent_note``; ``agree``
        (``openclaw_broke == agent_broke``, None where OpenClaw observed nothing).

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
        ours = None if _missing(r.openclaw_broke) else bool(r.openclaw_broke)
        row = {
            "idx": int(r.idx), "sent_at": r.sent_at, "cache_read": _int(r.cache_read_input_tokens),
            "broke": None if _missing(r.broke) else bool(r.broke), "openclaw_broke": ours,
            "previous_cache_read": _int(r.previous_cache_read),
            "changes": [c["code"] for c in json.loads(r.changes)] if isinstance(r.changes, str) else [],
            "agent_broke": None, "agent_previous_cache_read": None, "agent_cache_read": None,
            "agent_changes": None, "agent_note": None, "agree": None,
        }
        if isinstance(theirs, dict):
            row.update({
                "agent_broke": bool(theirs.get("broke")),
                "agent_previous_cache_read": theirs.get("previous_cache_read"),
                "agent_cache_read": theirs.get("cache_read"),
                "agent_changes": [c.get("code") for c in theirs.get("changes") or [] if isinstance(c, dict)],
                "agent_note": theirs.get("note"),
                "agree": None if ours is None else ours == bool(theirs.get("broke")),
            })
        rows.append(row)
    return pd.DataFrame(rows, columns=CROSSCHECK_COLUMNS)


def _missing(value: Any) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


def _int(value: Any) -> int | None:
    return None if _missing(value) else int(value)
