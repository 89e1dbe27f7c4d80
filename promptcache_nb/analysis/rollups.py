"""Every session at once: one row per session (:func:`session_summary`, ``Lab.summary()``; sub-agents added into
their parent's row by :func:`roll_up_subagents`), one session's requests with a running cost
(:func:`request_table`), and the measured traffic per project, model, day, hour or 5-hour billing window
(:func:`group_summary`, ``Lab.summary(by=...)``); each account's first requests and who wrote what they read
(:func:`shared_reads`).

The sums come from one SQL query over ``turns`` (``store/_rollups.py``); the rebuilds from the rows
:func:`~promptcache_nb.rebuilds` lists for the whole Lab (also one query), so a session's ``rebuilds`` is
``len(pc.rebuilds(session))``. The derived figures (cache read %, efficiency, saved) are computed by
:func:`~promptcache_nb.analysis.frames.derived_totals`, as every summary computes them.

**Dollars lost to rebuilds** (``rebuild_lost_usd``): what each rebuild cost more than it would have had the
tokens it sent again been read from the cache — the request priced as measured, minus the same request with its
``lost_tokens`` moved from the cache write (then, on a provider that caches implicitly, from the uncached input)
to the cache read, at the request's own prices (its session's explicit prices, else its model's). Requests
without a price add nothing (the column is None when no rebuild could be priced).
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from .._config import DEFAULT_ACCOUNT
from .._lazy import pandas as pd
from .._protocols import LabLike
from ..usage import Usage
from .frames import derived_totals
from .prices import Prices
from .resimulate import request_prices
from .whatif import rebuild_rows

#: ``Lab.summary()``'s columns, the key ones first (``ImportResult.summary`` shows the first nine).
SESSION_SUMMARY_COLUMNS = [
    "session", "requests", "cache_read_pct", "openclaw_breaks", "rebuilds", "cost_usd", "model", "parent", "source",
    "project", "strategy", "cache", "usage", "total_input", "cache_read", "cache_write", "uncached",
    "ideal_cache_read", "efficiency", "cost_no_cache_usd", "saved_usd", "rebuild_lost_usd", "started", "models",
]

#: ``Lab.summary(by=...)``'s columns after the group's own (``project``, ``model`` or ``day``).
GROUP_SUMMARY_COLUMNS = [
    "sessions", "requests", "measured_cache_read_pct", "total_input", "cache_read", "cache_write", "uncached",
    "cost_usd", "rebuilds", "rebuild_lost_usd", "cost_no_cache_usd", "saved_usd",
]

#: What ``Lab.summary(by=...)`` groups by.
GROUP_BY = ("project", "model", "day", "hour", "window")

#: How long a billing window lasts (Claude's usage limits count 5-hour windows).
BILLING_WINDOW = timedelta(hours=5)

#: :func:`request_table`'s columns.
REQUEST_COLUMNS = ["idx", "sent_at", "model", "cache_read", "cache_write", "uncached", "output", "cost_usd",
                   "running_cost_usd", "cost_no_cache_usd", "usage", "cause"]


def session_summary(lab: LabLike, session_ids: Iterable[str] | None = None, *,
                    rebuilds: bool = True) -> pd.DataFrame:
    """One row per session (every session of ``lab``, or ``session_ids`` in that order), oldest first.

    Columns, key ones first: ``session, requests, cache_read_pct, openclaw_breaks, rebuilds, cost_usd, model,
    parent`` ("" when none), ``source`` (the log it came from; "" for a replay), then ``project, strategy, cache,
    usage`` (``measured``, ``simulated`` or ``mixed``: what the token figures are), ``total_input, cache_read,
    cache_write, uncached, ideal_cache_read, efficiency, cost_no_cache_usd, saved_usd, rebuild_lost_usd``,
    ``started`` (its first request's time) and ``models`` (every model its requests named, comma-separated).

    ``rebuilds=False`` reads the measured sums only (one query): ``rebuilds`` and ``rebuild_lost_usd`` are then
    None, as a command that shows neither needs.

    ``rebuilds`` counts the requests that broke the cache (the verdict, ``turns.broke``: the requests
    :func:`~promptcache_nb.rebuilds` lists, which sent again more than 256 tokens of what the previous request
    held); ``openclaw_breaks`` counts OpenClaw's read-drop rule, kept as a cross-check (``turns.openclaw_broke``:
    the cache read fell at least 5 % and 1,000 tokens below the previous read, or to 0 with nothing changed).
    ``cache_read_pct`` and ``cost_usd`` are None when nothing is known (no request, no price).

    Example:
        >>> lab.summary().head()                                   # doctest: +SKIP
    """
    ids = None if session_ids is None else list(session_ids)
    sums = lab.store.session_totals(ids)
    if ids is not None:  # the caller's order (an import's order), not the store's
        by_id = {r["session"]: r for r in sums}
        sums = [by_id[sid] for sid in ids]
    found = rebuild_rows(lab, ids, explain=False) if rebuilds else []
    lost = _lost_usd(found)
    count: dict[str, int] = {}
    dollars: dict[str, float] = {}
    for row, usd in zip(found, lost, strict=True):
        count[row["session"]] = count.get(row["session"], 0) + 1
        if usd is not None:
            dollars[row["session"]] = dollars.get(row["session"], 0.0) + usd
    rows = []
    for r in sums:
        d = derived_totals(r)
        sid = r["session"]
        measured = r["measured_requests"]
        rows.append({
            **r, **d, "openclaw_breaks": int(r["openclaw_breaks"]), "rebuilds": count.get(sid, 0) if rebuilds else None,
            "ideal_cache_read": float(r["ideal_cache_read"]),  # the column's dtype as ever (a DataFrame of SQL's sum)
            "cache_read_pct": d["cache_read_pct"] if d["total_input"] else None,
            "usage": "measured" if measured == r["requests"] and measured else
                     "simulated" if not measured else "mixed",
            "cost_usd": d["cost_usd"] if r["priced_requests"] else None,
            "cost_no_cache_usd": d["cost_no_cache_usd"] if r["priced_requests"] else None,
            "saved_usd": d["saved_usd"] if r["priced_requests"] else None,
            "rebuild_lost_usd": round(dollars[sid], 4) if sid in dollars else None,
        })
    return pd.DataFrame(rows, columns=SESSION_SUMMARY_COLUMNS)


def group_summary(lab: LabLike, by: str, *, rebuilds: bool = True) -> pd.DataFrame:
    """The measured requests (live or imported) of every session, one row per ``by`` — ``project`` (the session's),
    ``model`` (the request's own), ``day`` or ``hour`` (UTC), or ``window`` (the 5-hour billing window, named by
    its first request's time: :func:`billing_windows`) — sorted by it: ``sessions, requests,
    measured_cache_read_pct, total_input, cache_read, cache_write, uncached, cost_usd, rebuilds,
    rebuild_lost_usd, cost_no_cache_usd, saved_usd``. Simulated requests are left out (their figures are
    estimates). The groups' sums add up to the totals of every measured request. ``rebuilds=False`` reads the
    measured sums only (``rebuilds`` and ``rebuild_lost_usd`` None).

    Example:
        >>> lab.summary(by="day")[["day", "requests", "measured_cache_read_pct", "rebuild_lost_usd"]]  # doctest: +SKIP
    """
    if by not in GROUP_BY:
        raise ValueError(f"cannot summarise by {by!r}; choose one of: {', '.join(GROUP_BY)} (or nothing: per session)")
    starts = billing_windows(lab.store.measured_times()) if by == "window" else []
    sums = lab.store.group_totals(by, window_starts=starts)
    found = [r for r in rebuild_rows(lab, explain=False) if r["usage_source"] in ("live", "imported")] \
        if rebuilds else []
    lost = _lost_usd(found)
    project = {r["id"]: r["project_id"] for r in lab.store.session_rows()} if by == "project" and found else {}

    def key(row: dict[str, Any]) -> Any:
        if by == "project":
            return project[row["session"]]
        if by == "model":
            return row["model"]
        if by == "window":
            return _utc(starts[bisect_right(starts, row["sent_at"]) - 1])
        return _hour(row["sent_at"]) if by == "hour" else _day(row["sent_at"])

    count: dict[Any, int] = {}
    dollars: dict[Any, float] = {}
    for row, usd in zip(found, lost, strict=True):
        k = key(row)
        count[k] = count.get(k, 0) + 1
        if usd is not None:
            dollars[k] = dollars.get(k, 0.0) + usd
    rows = []
    for r in sums.to_dict("records"):
        g = r.pop("group")
        g = _day(g) if by == "day" else _hour(g) if by == "hour" else _utc(g) if by == "window" else g
        d = derived_totals(r)
        priced = r["priced_requests"]
        rows.append({
            by: g, **r, **d, "measured_cache_read_pct": d["cache_read_pct"] if d["total_input"] else None,
            "cost_usd": d["cost_usd"] if priced else None, "rebuilds": count.get(g, 0) if rebuilds else None,
            "rebuild_lost_usd": round(dollars[g], 4) if g in dollars else None,
            "cost_no_cache_usd": d["cost_no_cache_usd"] if priced else None,
            "saved_usd": d["saved_usd"] if priced else None,
        })
    return pd.DataFrame(rows, columns=[by, *GROUP_SUMMARY_COLUMNS])


def billing_windows(times: Iterable[datetime]) -> list[datetime]:
    """The starts of the 5-hour billing windows ``times`` (oldest first) fall in, as Claude's usage limits count
    them: a window opens at the first request and lasts :data:`BILLING_WINDOW`; the first request after it ends
    opens the next (an idle stretch opens no window).

    Example:
        >>> t = datetime(2026, 11, 2, 9, 0)
        >>> [s.hour for s in billing_windows([t, t + timedelta(hours=4), t + timedelta(hours=5),
        ...                                   t + timedelta(hours=11)])]
        [9, 14, 20]
    """
    starts: list[datetime] = []
    for t in times:
        if not starts or t >= starts[-1] + BILLING_WINDOW:
            starts.append(t)
    return starts


def roll_up_subagents(summary: pd.DataFrame) -> pd.DataFrame:
    """A :func:`session_summary` frame with each sub-agent session (``parent`` set) added into its top-level
    session's row (a parent not in ``summary`` leaves its sub-agents as rows of their own): the sums and the
    costs are the family's, ``cache_read_pct`` and ``saved_usd`` computed from them, ``started`` the earliest,
    ``models`` every model named; ``subagents`` counts the sessions added in. Costs stay None only when no
    session of the family is priced.

    Example:
        >>> roll_up_subagents(lab.summary())[["session", "subagents", "cost_usd"]]  # doctest: +SKIP
    """
    present = set(summary["session"])
    parent_of = {s: p for s, p in zip(summary["session"], summary["parent"], strict=True) if p and p in present}

    def top(sid: str) -> str:
        seen = {sid}
        while sid in parent_of and parent_of[sid] not in seen:  # a loop of parents stops where it closes
            sid = parent_of[sid]
            seen.add(sid)
        return sid

    rows: dict[str, dict[str, Any]] = {}
    for r in summary.to_dict("records"):
        head = top(r["session"])
        if head not in rows:
            rows[head] = {"members": []}
        rows[head]["members"].append(r)
    out = []
    for head, group in rows.items():
        members = group["members"]
        own = next(m for m in members if m["session"] == head)
        sums = {k: sum(m[k] for m in members) for k in ("requests", "cache_read", "cache_write", "uncached")}
        costs = {k: [m[k] for m in members if m[k] is not None and not pd.isna(m[k])]
                 for k in ("cost_usd", "cost_no_cache_usd")}
        d = derived_totals({**sums, **{k: sum(v) if v else None for k, v in costs.items()}})
        started = [m["started"] for m in members if m["started"] is not None and not pd.isna(m["started"])]
        models = sorted({m_ for m in members for m_ in str(m["models"] or "").split(", ") if m_})
        out.append({**own, **{k: d[k] for k in ("requests", "total_input", "cache_read", "cache_write", "uncached")},
                    "cache_read_pct": d["cache_read_pct"] if d["total_input"] else None,
                    "cost_usd": d["cost_usd"] if costs["cost_usd"] else None,
                    "cost_no_cache_usd": d["cost_no_cache_usd"] if costs["cost_no_cache_usd"] else None,
                    "saved_usd": d["saved_usd"] if costs["cost_usd"] and costs["cost_no_cache_usd"] else None,
                    "started": min(started) if started else None, "models": ", ".join(models),
                    "subagents": len(members) - 1})
    return pd.DataFrame(out, columns=[*summary.columns, "subagents"])


def request_table(lab: LabLike, session_id: str) -> pd.DataFrame:
    """One session's requests in order (:data:`REQUEST_COLUMNS`): time, model, cache read / write / uncached
    input, output, ``cost_usd`` and ``running_cost_usd`` (the cost so far; an unpriced request adds nothing),
    ``usage`` (``measured`` or ``simulated``: what the figures are) and ``cause`` (the stored explanation, else
    the reason code; None for a request not analysed yet). Measured columns only: no body is read.

    Example:
        >>> request_table(lab, "s001-naive")[["idx", "cost_usd", "running_cost_usd"]]  # doctest: +SKIP
    """
    rows = lab.store.session_requests(session_id)
    df = pd.DataFrame(rows, columns=[c for c in REQUEST_COLUMNS if c != "running_cost_usd"])
    cost = pd.to_numeric(df["cost_usd"], errors="coerce")
    running = cost.fillna(0.0).cumsum().where(cost.notna().cumsum() > 0)  # None until a request is priced
    df.insert(REQUEST_COLUMNS.index("running_cost_usd"), "running_cost_usd", running)
    return df


def _hour(at: Any) -> Any:
    """The UTC hour (a naive UTC timestamp at the hour) of a time."""
    t = pd.Timestamp(at)
    return (t.tz_convert("UTC").tz_localize(None) if t.tzinfo is not None else t).floor("h")


def _utc(at: Any) -> Any:
    """A time as a UTC pandas timestamp (window starts as one key, whichever way they were read)."""
    t = pd.Timestamp(at)
    return t.tz_convert("UTC") if t.tzinfo is not None else t.tz_localize("UTC")


def _day(at: Any) -> Any:
    """The UTC day of a time (a stored timestamp, or SQL's DATE as pandas reads it)."""
    t = pd.Timestamp(at)
    return (t.tz_convert("UTC") if t.tzinfo is not None else t).date()


def _lost_usd(rows: list[dict[str, Any]]) -> list[float | None]:
    """Each rebuild row's dollars lost (see the module docstring), None when its request has no price."""
    pricers: dict[tuple[str, str | None], Callable[[str, bool], Prices | None]] = {}
    out: list[float | None] = []
    for r in rows:
        parts = [None if pd.isna(r[k]) else int(r[k]) for k in ("input_tokens", "cache_read_input_tokens",
                                                                 "cache_creation_input_tokens")]
        uncached, read, write = parts
        key = (str(r["cache_model"]), r["session_prices"])
        pricer = pricers.get(key)
        if pricer is None:
            pricer = pricers[key] = _pricer(*key)
        prices = pricer(r["model"], r["usage_source"] in ("live", "imported"))
        if prices is None or uncached is None or read is None or write is None:
            out.append(None)
            continue
        w1h = 0 if pd.isna(r["cache_creation_1h_input_tokens"]) else int(r["cache_creation_1h_input_tokens"])
        at = pd.Timestamp(r["sent_at"]).to_pydatetime()
        lost = int(r["lost_tokens"])
        from_write = min(lost, write)
        from_uncached = min(lost - from_write, uncached)
        w1h_kept = w1h - (from_write * w1h // write if write else 0)
        source = r["usage_source"]
        sent = Usage(uncached, read, write, None, w1h, 0, source)
        ideal = Usage(uncached - from_uncached, read + from_write + from_uncached, write - from_write, None,
                      w1h_kept, 0, source)
        cost, cost_ideal = prices.cost(sent, at), prices.cost(ideal, at)
        out.append(None if cost is None or cost_ideal is None else cost - cost_ideal)
    return out


def _pricer(cache_model: str, session_prices: str | None) -> Callable[[str, bool], Prices | None]:
    """A stored session's request prices, as the session priced them (``Session._request_prices``): its explicit
    prices (``sessions.config`` ``prices``, JSON), else the request's own model's."""
    own = json.loads(session_prices) if session_prices else None
    if own:
        fixed = Prices(**own)
        return lambda _model, _measured: fixed
    return lambda model, measured: request_prices(cache_model, model, measured=measured)


__all__ = ["BILLING_WINDOW", "GROUP_BY", "GROUP_SUMMARY_COLUMNS", "REQUEST_COLUMNS", "SESSION_SUMMARY_COLUMNS",
           "billing_windows", "group_summary", "request_table", "roll_up_subagents", "session_summary"]


#: :func:`shared_reads`' columns.
SHARED_READS_COLUMNS = ["session", "account", "sent_at", "usage", "read", "simulated_read", "read_from_session",
                        "likely_writer", "explained_by"]


def shared_reads(lab: LabLike) -> pd.DataFrame:
    """Each session of an account scope (every imported one) by its first request: what it read, and which other
    session of the account wrote it. A first request has nothing of its own cached, so any read is another
    session's (or a session the store does not hold).

    Columns: ``session, account, sent_at``, ``usage`` (``measured`` or ``simulated``: what ``read`` is),
    ``read`` (its cache read), ``simulated_read`` (what the account's simulated cache read: a measured
    request's prediction), ``read_from_session`` (the session whose simulated entry it read, else None),
    ``likely_writer`` (inferred from the measured figures: the latest request of another session of the account,
    same cache model, within an hour before, that left at least ``read`` tokens cached; else None) and
    ``explained_by``: ``simulation`` (``read_from_session`` names the writer), ``size and time`` (only
    ``likely_writer`` does), ``nothing stored`` (a read no stored session explains) or ``no read``.

    Example:
        >>> pc.analysis.shared_reads(lab)[["session", "read", "explained_by"]]  # doctest: +SKIP
    """
    rows = []
    for r in lab.store.first_reads(DEFAULT_ACCOUNT):
        detail = json.loads(r["cache_detail"]) if isinstance(r["cache_detail"], str) else {}
        measured = r["usage_source"] in ("live", "imported")
        simulated = (detail.get("predicted_usage") or {}).get("cache_read_input_tokens") if measured else r["read"]
        writer = detail.get("read_from_session")
        read = r["read"]
        explained = ("no read" if not read else "simulation" if writer else
                     "size and time" if r["likely_writer"] else "nothing stored")
        rows.append({"session": r["session_id"], "account": r["account"], "sent_at": r["sent_at"],
                     "usage": "measured" if measured else "simulated", "read": read, "simulated_read": simulated,
                     "read_from_session": writer, "likely_writer": r["likely_writer"], "explained_by": explained})
    return pd.DataFrame(rows, columns=SHARED_READS_COLUMNS)
