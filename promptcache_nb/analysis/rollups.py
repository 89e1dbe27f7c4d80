"""Every session at once: one row per session (:func:`session_summary`, ``Lab.summary()``) and the measured
traffic per project, model or day (:func:`group_summary`, ``Lab.summary(by=...)``); each account's first
requests and who wrote what they read (:func:`shared_reads`).

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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .._config import DEFAULT_ACCOUNT
from .._protocols import LabLike
from ..usage import Usage
from .frames import derived_totals
from .prices import Prices
from .resimulate import request_prices
from .whatif import rebuild_rows

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: ``Lab.summary()``'s columns, the key ones first (``ImportResult.summary`` shows the first nine).
SESSION_SUMMARY_COLUMNS = [
    "session", "requests", "cache_read_pct", "openclaw_breaks", "rebuilds", "cost_usd", "model", "parent", "source",
    "project", "strategy", "cache", "usage", "total_input", "cache_read", "cache_write", "uncached",
    "ideal_cache_read", "efficiency", "cost_no_cache_usd", "saved_usd", "rebuild_lost_usd",
]

#: ``Lab.summary(by=...)``'s columns after the group's own (``project``, ``model`` or ``day``).
GROUP_SUMMARY_COLUMNS = [
    "sessions", "requests", "measured_cache_read_pct", "total_input", "cache_read", "cache_write", "uncached",
    "cost_usd", "rebuilds", "rebuild_lost_usd",
]

#: What ``Lab.summary(by=...)`` groups by.
GROUP_BY = ("project", "model", "day")


def session_summary(lab: LabLike, session_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per session (every session of ``lab``, or ``session_ids`` in that order), oldest first.

    Columns, key ones first: ``session, requests, cache_read_pct, openclaw_breaks, rebuilds, cost_usd, model,
    parent`` ("" when none), ``source`` (the log it came from; "" for a replay), then ``project, strategy, cache,
    usage`` (``measured``, ``simulated`` or ``mixed``: what the token figures are), ``total_input, cache_read,
    cache_write, uncached, ideal_cache_read, efficiency, cost_no_cache_usd, saved_usd, rebuild_lost_usd``.

    ``openclaw_breaks`` counts OpenClaw breaks (the cache read fell at least 5 % and 1,000 tokens below the
    previous read, or to 0 with nothing changed); ``rebuilds`` counts the requests
    :func:`~promptcache_nb.rebuilds` lists (sent again more than 256 tokens of what the previous request held).
    ``cache_read_pct`` and ``cost_usd`` are None when nothing is known (no request, no price).

    Example:
        >>> lab.summary().head()                                   # doctest: +SKIP
    """
    import pandas as pd

    ids = None if session_ids is None else list(session_ids)
    sums = lab.store.session_totals(ids)
    if ids is not None:  # the caller's order (an import's order), not the store's
        by_id = {r["session"]: r for r in sums}
        sums = [by_id[sid] for sid in ids]
    found = rebuild_rows(lab, ids, explain=False)
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
            **r, **d, "openclaw_breaks": int(r["breaks"]), "rebuilds": count.get(sid, 0),
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


def group_summary(lab: LabLike, by: str) -> pd.DataFrame:
    """The measured requests (live or imported) of every session, one row per ``by`` — ``project`` (the session's),
    ``model`` (the request's own) or ``day`` (UTC) — sorted by it: ``sessions, requests,
    measured_cache_read_pct, total_input, cache_read, cache_write, uncached, cost_usd, rebuilds,
    rebuild_lost_usd``. Simulated requests are left out (their figures are estimates). The groups' sums add up
    to the totals of every measured request.

    Example:
        >>> lab.summary(by="day")[["day", "requests", "measured_cache_read_pct", "rebuild_lost_usd"]]  # doctest: +SKIP
    """
    import pandas as pd

    if by not in GROUP_BY:
        raise ValueError(f"cannot summarise by {by!r}; choose one of: {', '.join(GROUP_BY)} (or nothing: per session)")
    sums = lab.store.group_totals(by)
    found = [r for r in rebuild_rows(lab, explain=False) if r["usage_source"] in ("live", "imported")]
    lost = _lost_usd(found)
    project = {r["id"]: r["project_id"] for r in lab.store.session_rows()} if by == "project" else {}

    def key(row: dict[str, Any]) -> Any:
        if by == "project":
            return project[row["session"]]
        if by == "model":
            return row["model"]
        return _day(row["sent_at"])

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
        g = _day(g) if by == "day" else g
        d = derived_totals(r)
        rows.append({
            by: g, **r, **d, "measured_cache_read_pct": d["cache_read_pct"] if d["total_input"] else None,
            "cost_usd": d["cost_usd"] if r["priced_requests"] else None, "rebuilds": count.get(g, 0),
            "rebuild_lost_usd": round(dollars[g], 4) if g in dollars else None,
        })
    return pd.DataFrame(rows, columns=[by, *GROUP_SUMMARY_COLUMNS])


def _day(at: Any) -> Any:
    """The UTC day of a time (a stored timestamp, or SQL's DATE as pandas reads it)."""
    import pandas as pd

    t = pd.Timestamp(at)
    return (t.tz_convert("UTC") if t.tzinfo is not None else t).date()


def _lost_usd(rows: list[dict[str, Any]]) -> list[float | None]:
    """Each rebuild row's dollars lost (see the module docstring), None when its request has no price."""
    import pandas as pd

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


__all__ = ["GROUP_BY", "GROUP_SUMMARY_COLUMNS", "SESSION_SUMMARY_COLUMNS", "group_summary", "session_summary"]


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
    import pandas as pd

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
