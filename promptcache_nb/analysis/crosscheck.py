"""OpenClaw's read-drop rule as we compute it beside the observation the logging agent made itself (OpenClaw's
``cache:result``), both beside our verdict; and our diagnosis beside the provider's own (Anthropic's cache
diagnostics, :func:`provider_crosscheck`).

An imported OpenClaw cache trace (or payload log beside its trace) stores OpenClaw's own observation of a run
with the run's last request (``cache_detail["agent_observation"]``, see :mod:`promptcache_nb.readers.openclaw`).
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
from collections.abc import Mapping
from typing import Any

from .._lazy import pandas as pd
from .._protocols import LabLike, StoredSession, ensure_analysed, resolve_session

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
    return value is None or bool(pd.isna(value))


def _int(value: Any) -> int | None:
    return None if _missing(value) else int(value)


# -- the provider's word: Anthropic's cache diagnostics beside our diagnosis -----------------------------------------

PROVIDER_CROSSCHECK_COLUMNS = ["session_id", "idx", "sent_at", "cache_read", "cache_reason", "broke", "diverge_path",
                               "our_divergence", "provider_cache_miss_reason", "provider_cache_missed_tokens",
                               "agrees"]
_PROVIDER_COLUMNS = ("idx", "sent_at", "cache_read_input_tokens", "cache_reason", "broke", "diverge_path",
                     "pure_append", "provider_cache_miss_reason", "provider_cache_missed_tokens")
#: The provider's reason -> where our diff must locate the change for the two to agree.
PROVIDER_LEVELS = {"model_changed": "model", "tools_changed": "tools", "system_changed": "system",
                   "messages_changed": "messages", "none": "none", "unavailable": "other"}
#: Top-level fields the provider counts as the model (``CacheMissModelChanged``: "model or speed").
_MODEL_FIELDS = ("model", "speed")
_PROVIDER_TEXT = {
    "model_changed": "the model (or speed) changed", "tools_changed": "the tools changed",
    "system_changed": "the system prompt changed", "messages_changed": "an earlier message changed",
}


def our_divergence(turn: Mapping[str, Any]) -> str | None:
    """Where our prefix diff located a request's first change from the previous request, in the provider's terms:
    ``model``, ``tools``, ``system``, ``messages``, ``other`` (another top-level field: ``tool_choice``,
    ``thinking``...) or ``none`` (the request only appended to the previous one); None when we have no diff (a
    session's first request, a body not analysed).

    Args:
        turn: a ``turns`` row (``diverge_path``, ``pure_append``).
    """
    path, append = turn.get("diverge_path"), turn.get("pure_append")
    if isinstance(path, str) and path:
        head = path.split("[", 1)[0].split(".", 1)[0]
        if head in _MODEL_FIELDS:
            return "model"
        return head if head in ("tools", "system", "messages") else "other"
    if append is not None and not _missing(append) and bool(append):
        return "none"
    return None


def provider_agrees(turn: Mapping[str, Any]) -> bool | None:
    """Whether the provider's reason (``turns.provider_cache_miss_reason``) and our diff (:func:`our_divergence`)
    name the same place. The mapping: ``model_changed`` = our ``model`` / ``speed`` field (our ``model_switch``);
    ``tools_changed`` / ``system_changed`` / ``messages_changed`` = our first divergent segment in ``tools[…]`` /
    ``system…`` / ``messages[…]`` (our ``prefix_changed`` located there, or ``no_breakpoint`` /
    ``not_written`` ... with that divergence); ``none`` (nothing diverged) = our pure append, whatever then
    explained a lost read (``ttl_expired``, ``lookback_exceeded``, ``evicted``: the provider compares structure,
    not the cache); ``unavailable`` = a change of another prompt field (``thinking``, ``tool_choice``), else no
    verdict. None when either side has nothing to compare (``previous_message_not_found``, ``pending``, no diff).
    """
    theirs = turn.get("provider_cache_miss_reason")
    level = PROVIDER_LEVELS.get(theirs) if isinstance(theirs, str) else None
    ours = our_divergence(turn)
    if level is None or ours is None:
        return None
    if theirs == "unavailable" and ours != "other":
        return None  # the provider gave no diagnosis: nothing to disagree with
    return ours == level


def provider_note(turn: Mapping[str, Any]) -> str | None:
    """One sentence with the provider's own diagnosis of a request (for the gate's message, the observation and
    the what-if), or None when the provider was not asked or did not answer.

    Args:
        turn: a ``turns`` row (``provider_cache_miss_reason``, ``provider_cache_missed_tokens``; with
            ``diverge_path`` / ``pure_append`` it also says whether our diagnosis agrees).

    Example:
        >>> note = provider_note({"provider_cache_miss_reason": "system_changed", "provider_cache_missed_tokens": 4521})
        >>> note.split(": ", 1)[1]
        'the system prompt changed, ~4,521 input tokens after the divergence.'
    """
    reason = turn.get("provider_cache_miss_reason")
    if not isinstance(reason, str) or not reason:
        return None
    head = "The provider's cache diagnostics (measured): "
    if reason in _PROVIDER_TEXT:
        missed = turn.get("provider_cache_missed_tokens")
        tokens = "" if missed is None or _missing(missed) else \
            f", ~{int(missed):,} input tokens after the divergence"
        text = f"{head}{_PROVIDER_TEXT[reason]}{tokens}."
    elif reason == "none":
        text = f"{head}nothing changed from the previous message's request."
    elif reason == "previous_message_not_found":
        text = f"{head}no record of the previous message (expired, another workspace, or it did not opt in)."
    elif reason == "pending":
        text = f"{head}not finished when the response was sent."
    elif reason == "unavailable":
        text = f"{head}no diagnosis (unavailable)."
    else:
        text = f"{head}{reason}."
    agrees = provider_agrees(turn)
    if agrees is not None:
        text += " Ours agrees." if agrees else f" Ours differs (our diff: {our_divergence(turn)})."
    return text


def provider_crosscheck(session: StoredSession | LabLike, *, session_id: str | None = None) -> pd.DataFrame:
    """Per request the provider diagnosed: our diagnosis beside the provider's, and whether they agree.

    The provider's reason is measured (Anthropic's response ``diagnostics``, asked for with ``diagnostics=True``
    on ``pc.capture``, the recording proxy or ``AnthropicBackend``; read by every HTTP-recording import); ours is our
    prefix diff against the session's previous request and the cache model's cause. See :func:`provider_agrees`
    for the mapping and docs/provider_cache_rules.md#anthropic-cache-diagnostics for their vocabulary.

    Args:
        session: a Session, or a Lab (every session's diagnosed requests; ``session_id`` for one of them).

    Returns:
        One row per diagnosed request: ``session_id, idx, sent_at, cache_read`` (measured); ours:
        ``cache_reason, broke, diverge_path, our_divergence``; theirs: ``provider_cache_miss_reason,
        provider_cache_missed_tokens``; ``agrees`` (True / False, None where there is nothing to compare).

    Example:
        >>> pc.provider_crosscheck(lab).query("agrees == False")      # doctest: +SKIP
    """
    if isinstance(session, StoredSession) or session_id is not None:
        lab, sid = resolve_session(session, session_id)
        ensure_analysed(lab, sid)
        df = lab.store.provider_diagnosed_turns(_PROVIDER_COLUMNS, sid)
    else:
        lab = session
        df = lab.store.provider_diagnosed_turns(["idx"])
        for sid in sorted(set(df.session_id)):
            ensure_analysed(lab, sid)
        df = lab.store.provider_diagnosed_turns(_PROVIDER_COLUMNS)
    rows: list[dict[str, Any]] = []
    for r in df.to_dict("records"):
        rows.append({
            "session_id": r["session_id"], "idx": int(r["idx"]), "sent_at": r["sent_at"],
            "cache_read": _int(r["cache_read_input_tokens"]), "cache_reason": r["cache_reason"],
            "broke": None if _missing(r["broke"]) else bool(r["broke"]),
            "diverge_path": None if _missing(r["diverge_path"]) else r["diverge_path"],
            "our_divergence": our_divergence(r), "provider_cache_miss_reason": r["provider_cache_miss_reason"],
            "provider_cache_missed_tokens": _int(r["provider_cache_missed_tokens"]), "agrees": provider_agrees(r),
        })
    out = pd.DataFrame(rows, columns=PROVIDER_CROSSCHECK_COLUMNS)
    return out.astype({"cache_read": "Int64", "provider_cache_missed_tokens": "Int64"})
