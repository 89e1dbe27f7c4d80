"""Reads for analysis: a session's ``turns`` rows as dicts or a DataFrame, and the rollups over every session
(their SQL in ``_rollups.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import StoreError
from . import _rollups
from ._connection import _Connection

if TYPE_CHECKING:  # pandas loads on the first DataFrame (duckdb's .df() imports it): not with the package
    import pandas as pd


def _since(session_id: str, since: datetime | None) -> tuple[str, list[Any]]:
    """A ``turns`` filter: one session's requests, sent at or after ``since`` when given."""
    if since is None:
        return "session_id = ?", [session_id]
    return 'session_id = ? AND sent_at >= ?', [session_id, since]


class UsageMarks(NamedTuple):
    """Where a session's usage stands after a request (:meth:`Store.usage_marks`)."""

    last_idx: int  #: the last request
    read_idx: int | None  #: the last request whose cache read is known (not NULL)
    touch_at: datetime | None  #: when a request last read or wrote the cache (its usage says so)


class _QueriesMixin(_Connection):
    """Stored requests as dict rows and DataFrames; sums over sessions (:class:`~promptcache_nb.store.Store`)."""

    def _turn_columns(self, columns: Sequence[str] | None) -> str:
        known = self._table_columns("turns")
        if columns is None:
            columns = known
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise StoreError(f"turns has no column {', '.join(map(repr, unknown))}; columns: {', '.join(known)}")
        return ", ".join('"' + c + '"' for c in columns)

    def turn_row(self, session_id: str, idx: int, columns: Sequence[str] | None = None) -> dict[str, Any] | None:
        """One stored request's ``turns`` columns (all, or ``columns``) as a dict; None when it does not exist.
        JSON columns (``cache_detail``, ``events``, ``changes``...) are returned as stored text."""
        rows = self.query(f"SELECT {self._turn_columns(columns)} FROM turns WHERE session_id = ? AND idx = ?",
                          [session_id, idx])
        return rows[0] if rows else None

    def turn_rows(self, session_id: str, columns: Sequence[str] | None = None, *,
                  since: datetime | None = None) -> list[dict[str, Any]]:
        """A session's stored requests in order, as dicts of their ``turns`` columns (all, or ``columns``);
        with ``since``, only those sent at or after it."""
        where, params = _since(session_id, since)
        return self.query(f"SELECT {self._turn_columns(columns)} FROM turns WHERE {where} ORDER BY idx", params)

    def turns_frame(self, session_id: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """:meth:`turn_rows` as a DataFrame, with DuckDB's own column types (NULL integers as NaN)."""
        return self.sql(f"SELECT {self._turn_columns(columns)} FROM turns WHERE session_id = ? ORDER BY idx",
                        [session_id])

    def provider_diagnosed_turns(self, columns: Sequence[str], session_id: str | None = None) -> pd.DataFrame:
        """``columns`` (and ``session_id``) of the requests the provider diagnosed (``provider_cache_miss_reason``
        not NULL), of one session or of all, by session and index."""
        where, params = ("AND session_id = ?", [session_id]) if session_id is not None else ("", [])
        cols = self._turn_columns(["session_id", *(c for c in columns if c != "session_id")])
        return self.sql(f"SELECT {cols} FROM turns WHERE provider_cache_miss_reason IS NOT NULL {where} "
                        "ORDER BY session_id, idx", params)

    def usage_marks(self, session_id: str, upto: int | None = None) -> UsageMarks | None:
        """Where a session's usage stands after request ``upto`` (default: the last): see :class:`UsageMarks`.
        None when it has no request yet."""
        where = "session_id = ?" if upto is None else "session_id = ? AND idx <= ?"
        params: list[Any] = [session_id] if upto is None else [session_id, upto]
        rows = self.query(
            f"""SELECT max(idx) AS last_idx,
                       max(idx) FILTER (WHERE cache_read_input_tokens IS NOT NULL) AS read_idx,
                       max(sent_at) FILTER (WHERE cache_read_input_tokens IS NOT NULL
                                         OR cache_creation_input_tokens IS NOT NULL) AS touch_at
                FROM turns WHERE {where}""",
            params,
        )
        if not rows or rows[0]["last_idx"] is None:
            return None
        return UsageMarks(**rows[0])

    # -- every session at once (store/_rollups.py: the rebuild rule and the totals in SQL) -------------------
    def rebuild_rows(self, session_ids: Sequence[str] | None = None, *, noise_floor: int,
                     not_rebuild: Sequence[str]) -> list[dict[str, Any]]:
        """The rebuilds of every session (or of ``session_ids``), ordered by session and index, with what a
        rebuild row needs (usage, totals, the gap, the stored cause); a legacy session (a cause never stored)
        gives its first row only, ``legacy`` true. The rule: ``store/_rollups.py``. Dict rows, NULL as None: a
        DataFrame of them cost a third of one session's call."""
        where, ids = _rollups.where_sessions(None if session_ids is None else list(session_ids), "$3")
        return self.query(_rollups.REBUILD_ROWS.format(where=where), [list(not_rebuild), noise_floor, ids])

    def session_totals(self, session_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """One row per session (every session, or ``session_ids``), oldest first: its identity (project, strategy,
        cache model, model, parent, source) and the sums of its requests (dict rows, NULL as None)."""
        ids = None if session_ids is None else list(session_ids)
        where, value = _rollups.where_sessions(ids, "$1")
        where_s = _rollups.where_sessions(ids, "$1", "s.id")[0]
        return self.query(_rollups.SESSION_TOTALS.format(where=where, where_s=where_s), [value])

    def first_reads(self, default_account: str) -> list[dict[str, Any]]:
        """Each account-scope session's first request, with the likely writer of what it read
        (``store/_rollups.py``: ``FIRST_READS``), oldest first (dict rows, NULL as None)."""
        return self.query(_rollups.FIRST_READS, [default_account])

    def group_totals(self, by: str, *, window_starts: Sequence[Any] = ()) -> pd.DataFrame:
        """The measured requests' sums per ``by`` (``project``, ``model``, ``day`` or ``hour``, UTC, or ``window``:
        the latest of ``window_starts`` at or before each request), one row per group."""
        key = _rollups.GROUP_KEYS.get(by)
        if key is None:
            raise ValueError(f"cannot group by {by!r}; choose one of: {', '.join(_rollups.GROUP_KEYS)}")
        if by == "window":
            return self.sql(_rollups.GROUP_TOTALS.format(key=key, windows=_rollups.WINDOW_JOIN),
                            [list(window_starts)])
        return self.sql(_rollups.GROUP_TOTALS.format(key=key, windows=""))

    def measured_times(self) -> list[Any]:
        """The time of every measured request (live or imported usage), oldest first."""
        return [r[0] for r in self.rows(_rollups.MEASURED_TIMES)]

    def session_requests(self, session_id: str) -> list[dict[str, Any]]:
        """One session's requests in order: ``idx, at, model, cache_read, cache_write, uncached, output, cost_usd,
        cost_no_cache_usd, usage`` (``measured`` / ``simulated``) and ``cause`` (the stored explanation, else the
        reason code, else None: not analysed yet). Dict rows, NULL as None."""
        return self.query(_rollups.SESSION_REQUESTS, [session_id])
