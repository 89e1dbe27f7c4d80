"""Projects and sessions: their rows, state, pending events, and the usage-first imports awaiting analysis."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from .._types import RequestRecord
from ..errors import StoreError
from ..request import canonical_json
from ._codecs import _RECORD_SELECT, state_columns
from ._connection import _append, _Connection
from ._schema import damaged

if TYPE_CHECKING:  # pandas loads on the first DataFrame (duckdb's .df() imports it): not with the package
    import pandas as pd


class _SessionsMixin(_Connection):
    """Projects, sessions and each session's state and pending events (:class:`~promptcache_nb.store.Store`)."""

    # -- projects and sessions ----------------------------------------------------------------
    def ensure_project(self, project_id: str, at: datetime) -> None:
        """The project exists; its ``created_at`` is its earliest session's start, whatever order sessions are
        stored in (an import stores sessions by key, a parallel one by file group)."""
        held = self._tx_projects.get(project_id)
        if held is not None and held <= at:
            return  # ensured already in this transaction, with this time or an earlier one: nothing to change
        if self._buffer is not None:
            # inside batch(): one upsert per project when it ends, with the earliest time (an import's sessions
            # are stored by key, not by time: most would move created_at back once more)
            self._tx_projects[project_id] = at
            self._buffer_projects.add(project_id)
            return
        self._upsert_project(project_id, at)
        if self._tx_depth:
            self._tx_projects[project_id] = at

    _SESSION_COLUMNS = ("id", "project_id", "strategy", "cache_model", "model", "created_at", "config", "source",
                        "parent_id")

    def session_row(self, session_id: str) -> dict[str, Any] | None:
        new = self._new_sessions.get(session_id)
        row = (tuple(new[0]) if new is not None else
               self.one(f"SELECT {', '.join(self._SESSION_COLUMNS)} FROM sessions WHERE id = ?", [session_id]))
        if row is None:
            return None
        out = dict(zip(self._SESSION_COLUMNS, row, strict=True))
        out["config"] = self._config(out)
        return out

    def _config(self, row: dict[str, Any]) -> dict[str, Any]:
        config = json.loads(row["config"]) if row["config"] is not None else None
        if not isinstance(config, dict):
            what = "NULL" if config is None else f"a JSON {type(config).__name__}"
            raise StoreError(damaged(self.path, f"sessions.config of session {row['id']!r} is {what}, not a "
                                                "JSON object"))
        return config

    def create_session(self, row: dict[str, Any], state: dict[str, Any]) -> None:
        """Insert a session row (``config`` a dict) and its first state row (inside the caller's transaction;
        inside :meth:`batch`, at its end)."""
        values = {**row, "config": canonical_json(row["config"])}
        if self._buffer is not None:
            if row["id"] in self._new_sessions:
                raise StoreError(f"store {self.path!r}: session {row['id']!r} is created twice in one batch")
            self._new_sessions[row["id"]] = ([values.get(c) for c in self._SESSION_COLUMNS],
                                             [row["id"], *state_columns(state).values(), row["created_at"]])
            return
        cols = [c for c in self._SESSION_COLUMNS if c in values]
        self.con.execute(
            f"INSERT INTO sessions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            [values[c] for c in cols],
        ).fetchall()
        self.write_state(row["id"], state, row["created_at"])

    def update_session_config(self, session_id: str, config: dict[str, Any]) -> None:
        new = self._new_sessions.get(session_id)
        if new is not None:
            new[0][self._SESSION_COLUMNS.index("config")] = canonical_json(config)
            return
        self.con.execute("UPDATE sessions SET config = ? WHERE id = ?", [canonical_json(config), session_id]).fetchall()

    def project_exists(self, project_id: str) -> bool:
        if project_id in self._buffer_projects:
            return True
        return self.one("SELECT 1 FROM projects WHERE id = ?", [project_id]) is not None

    def sessions_frame(self) -> pd.DataFrame:
        """Every session (id, project, strategy, cache model, model, creation time, and ``analysed``: False while
        a usage-first import's session awaits the analysis of its bodies), oldest first."""
        self._write_new_sessions()
        waiting = ("s.id NOT IN (SELECT session_id FROM unanalysed_sessions)" if self._has_unanalysed
                   else "true")
        return self.sql(
            f"SELECT id, project_id, strategy, cache_model, model, created_at, {waiting} AS analysed "
            "FROM sessions s ORDER BY created_at, id")

    def move_sessions(self, from_project: str, to_project: str) -> int:
        """Move every session of ``from_project`` (and its prompt-delta rows) to ``to_project``, in one
        transaction; returns how many moved. ``to_project`` is created with the moved sessions' first time."""
        with self.transaction():
            self._write_new_sessions()
            n, first = self.one("SELECT count(*), min(created_at) FROM sessions WHERE project_id = ?",
                                [from_project]) or (0, None)  # an aggregate: always one row
            if n == 0:
                return 0
            self.ensure_project(to_project, first)  # the sessions' own clock, never the wall clock
            self.con.execute("UPDATE sessions SET project_id = ? WHERE project_id = ?",
                             [to_project, from_project]).fetchall()
            self.con.execute(
                "UPDATE session_prompt_deltas SET project_id = ? WHERE session_id IN "
                "(SELECT id FROM sessions WHERE project_id = ?) AND project_id = ?",
                [to_project, to_project, from_project],
            ).fetchall()
        return int(n)

    def existing_sessions(self, session_ids: Sequence[str]) -> set[str]:
        """Which of ``session_ids`` are stored (one query for an import's many sessions)."""
        if not session_ids:
            return set()
        new = {sid for sid in session_ids if sid in self._new_sessions}
        return new | {r[0] for r in self.rows("SELECT id FROM sessions WHERE id IN (SELECT unnest(?))",
                                              [list(session_ids)])}

    def session_ids(self) -> list[str]:
        self._write_new_sessions()
        return [r[0] for r in self.rows("SELECT id FROM sessions ORDER BY id")]

    def session_rows(self, cache_model: str | None = None) -> list[dict[str, Any]]:
        """Every session's row (``config`` a dict), by id; only those simulated with ``cache_model`` when given."""
        self._write_new_sessions()
        where, params = ("WHERE cache_model = ?", [cache_model]) if cache_model is not None else ("", [])
        rows = self.query(f"SELECT {', '.join(self._SESSION_COLUMNS)} FROM sessions {where} ORDER BY id", params)
        for r in rows:
            r["config"] = self._config(r)
        return rows

    def unlogged_prefix_sessions(self, account: str, identity: str, *, default_account: str) -> list[dict[str, Any]]:
        """``id`` and ``config`` (a dict) of the sessions of ``account`` (a config without one is
        ``default_account``'s) whose unlogged prefix is a variant of ``identity`` (``config.unlogged_prefix_of`` =
        ``<identity>.<n>``), by id."""
        self._write_new_sessions()
        rows = self.query(
            f"""SELECT {', '.join(self._SESSION_COLUMNS)} FROM sessions
                WHERE coalesce(json_extract_string(config, '$.account'), ?) = ?
                AND starts_with(coalesce(json_extract_string(config, '$.unlogged_prefix_of'), ''), ?)
                ORDER BY id""", [default_account, account, f"{identity}."])
        for r in rows:
            r["config"] = self._config(r)
        return rows

    def original_sessions(self) -> list[dict[str, Any]]:
        """``id`` and ``requests`` (its stored request count) of every session that is not a counterfactual of
        another, by id: what advice over a whole Lab reads, one session at a time."""
        self._write_new_sessions()
        return self.query(
            """SELECT s.id, count(t.idx) AS requests FROM sessions s LEFT JOIN turns t ON t.session_id = s.id
               WHERE coalesce(json_extract_string(s.config, '$.counterfactual_of'), '') = ''
               GROUP BY s.id ORDER BY s.id""")

    def last_request_at(self, session_ids: Sequence[str]) -> datetime | None:
        """When the last request of any of ``session_ids`` was sent (None before any)."""
        last: datetime | None = self.scalar('SELECT max(sent_at) FROM turns WHERE session_id IN (SELECT unnest(?))',
                                            [list(session_ids)])
        return last

    def sessions_sending_between(self, session_ids: Sequence[str], start: datetime | None, end: datetime
                                 ) -> list[str]:
        """Which of ``session_ids`` sent a request at or after ``start`` (None: any time) and at or before ``end``,
        in the order given."""
        if not session_ids:
            return []
        found = {r[0] for r in self.rows(
            'SELECT DISTINCT session_id FROM turns WHERE session_id IN (SELECT unnest($1)) AND sent_at <= $3 '
            'AND ($2::TIMESTAMPTZ IS NULL OR sent_at >= $2)', [list(session_ids), start, end])}
        return [sid for sid in session_ids if sid in found]

    def after_last_pause(self, session_ids: Sequence[str], seconds: float) -> datetime | None:
        """When the first request after the last pause of at least ``seconds`` between two consecutive requests
        of ``session_ids`` was sent (None: no such pause)."""
        found: datetime | None = self.scalar(
            """SELECT max(sent_at) FROM (
                   SELECT sent_at, epoch(sent_at) - lag(epoch(sent_at)) OVER (ORDER BY sent_at, session_id, idx) AS gap
                   FROM turns WHERE session_id IN (SELECT unnest(?)))
               WHERE gap >= ?""", [list(session_ids), seconds])
        return found

    def session_count(self) -> int:
        self._write_new_sessions()
        return int(self.scalar("SELECT count(*) FROM sessions"))

    #: Every table that holds rows of one session (blocks and prefix nodes are shared, content-addressed).
    _SESSION_TABLES = (("turns", "session_id"), ("session_messages", "session_id"),
                       ("session_pending_events", "session_id"), ("session_prompt_deltas", "session_id"),
                       ("session_state", "session_id"), ("unanalysed_sessions", "session_id"), ("sessions", "id"))

    def delete_session(self, session_id: str) -> None:
        """Delete a session and every row stored for it (inside the caller's transaction): an import re-stores
        a session whole when a request that started earlier than the stored ones arrives late."""
        self.delete_sessions([session_id])

    def delete_sessions(self, session_ids: Sequence[str]) -> None:
        """:meth:`delete_session` for many sessions, one statement per table (an analysis replaces a file group's
        sessions at once: a statement per session and table scanned ``turns`` thousands of times)."""
        if not session_ids:
            return
        for sid in session_ids:
            self._new_sessions.pop(sid, None)
        ids = list(session_ids)
        for table, column in self._SESSION_TABLES:
            self.con.execute(f"DELETE FROM {table} WHERE {column} IN (SELECT unnest(?))", [ids]).fetchall()

    # -- usage-first imports: sessions whose bodies are not analysed yet --------------------------
    def write_usage_records(self, records: Sequence[RequestRecord]) -> None:
        """Append a usage-first import's ``turns`` rows (measured columns only; inside the caller's transaction,
        or deferred to the end of a :meth:`batch`)."""
        if self._buffer is not None:
            self._buffer.setdefault("turns", []).extend(records)
            return
        with self.transaction():
            values = attrgetter(*self._table_columns("turns"))
            _append(self._live(), "turns", [values(rec) for rec in records])

    def mark_unanalysed(self, session_id: str, *, import_seq: int, file_group: str, files: Sequence[str],
                        new: bool = False) -> None:
        """Record that ``session_id`` awaits analysis: its place in the import's order, its file group and the
        files its requests were read from (``new``: the session was created now, so no row is replaced)."""
        if not new:
            self.con.execute("DELETE FROM unanalysed_sessions WHERE session_id = ?", [session_id]).fetchall()
        self._insert("unanalysed_sessions", [(session_id, import_seq, file_group, json.dumps(list(files)))])

    def next_import_seq(self) -> int:
        """The import order number the next session awaiting analysis takes (after every one recorded)."""
        return int(self.scalar("SELECT coalesce(max(import_seq) + 1, 0) FROM unanalysed_sessions"))

    def unanalysed(self, session_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The sessions awaiting analysis (all, or those of ``session_ids``), in import order: ``session_id,
        import_seq, file_group, files`` (a list), with the session's ``account`` (from its config) and
        ``parent_id``."""
        if not self._has_unanalysed:
            return []
        self._write_new_sessions()
        where, params = ("WHERE u.session_id IN (SELECT unnest(?))", [list(session_ids)]) \
            if session_ids is not None else ("", [])
        rows = self.query(
            f"""SELECT u.session_id, u.import_seq, u.file_group, u.files,
                       json_extract_string(s.config, '$.account') AS account, s.parent_id
                FROM unanalysed_sessions u JOIN sessions s ON s.id = u.session_id {where}
                ORDER BY u.import_seq""", params)
        for r in rows:
            r["files"] = json.loads(r["files"])
        return rows

    @property
    def _has_unanalysed(self) -> bool:
        # a store opened read-only before the usage-first migration has no such table (nothing awaits analysis)
        if not getattr(self, "_unanalysed_table", False):
            self._unanalysed_table = self._has_table("unanalysed_sessions")
        return self._unanalysed_table

    def source_spans(self, session_ids: Sequence[str]) -> list[tuple[str, str, int, int, str]]:
        """``(session_id, source_ref, offset, length, digest)`` of every request of ``session_ids`` whose log line
        was located at import, by file position: what an analysis checks before it reads the files again."""
        return [tuple(r) for r in self.rows(
            """SELECT session_id, source_ref, source_offset, source_length, source_digest FROM turns
               WHERE session_id IN (SELECT unnest(?)) AND source_offset IS NOT NULL
               ORDER BY source_ref, source_offset""", [list(session_ids)])]

    def unanalysed_ids(self) -> set[str]:
        """The usage-first sessions: their requests have no bodies to simulate or diff yet."""
        if not self._has_unanalysed:
            return set()
        self._write_new_sessions()
        return {r[0] for r in self.rows("SELECT session_id FROM unanalysed_sessions")}

    def last_sent_request(self, session_id: str) -> tuple[int, RequestRecord | None]:
        """(the session's next request index, its last request that reached the API — a prompt total above 0 —
        or None): where a usage-first import of a grown log goes on from."""
        n = int(self.scalar("SELECT count(*) FROM turns WHERE session_id = ?", [session_id]))
        found = self.query(
            f"""SELECT {_RECORD_SELECT} FROM turns WHERE session_id = ?
                AND input_tokens + cache_read_input_tokens + cache_creation_input_tokens > 0
                ORDER BY idx DESC LIMIT 1""", [session_id])
        return n, RequestRecord(**found[0]) if found else None

    def stored_usage(self, session_id: str) -> dict[str, tuple[int | None, ...]]:
        """Each stored request's import key → its measured (input, cache read, cache write, output) tokens."""
        rows = self.rows("SELECT dedupe_key, input_tokens, cache_read_input_tokens, cache_creation_input_tokens, "
                         "output_tokens FROM turns WHERE session_id = ? AND dedupe_key IS NOT NULL", [session_id])
        return {r[0]: tuple(r[1:]) for r in rows}

    def dedupe_keys(self, session_id: str) -> set[str]:
        """The import keys of a session's stored requests (re-importing a file skips these)."""
        rows = self.rows("SELECT dedupe_key FROM turns WHERE session_id = ? AND dedupe_key IS NOT NULL", [session_id])
        return {r[0] for r in rows}

    def last_turn(self, session_id: str) -> dict[str, Any] | None:
        """``idx``, ``sent_at`` and ``events`` of a session's last stored request."""
        row = self.one('SELECT idx, sent_at, events FROM turns WHERE session_id = ? ORDER BY idx DESC LIMIT 1',
                       [session_id])
        return None if row is None else {"idx": row[0], "sent_at": row[1], "events": row[2]}

    def state_row(self, session_id: str) -> dict[str, Any]:
        new = self._new_sessions.get(session_id)
        if new is not None:
            return self.state_from_row(new[1][1:-1])
        row = self.one(
            "SELECT ltm_pin_text, ltm_pin_keys, ltm_cache_text, stable_ltm_text, host_prompt, tools, model, extra "
            "FROM session_state WHERE session_id = ?",
            [session_id],
        )
        if row is None:
            raise StoreError(f"session {session_id!r} has no session_state row; the store is inconsistent")
        return self.state_from_row(row)

    @staticmethod
    def state_from_row(row: Sequence[Any]) -> dict[str, Any]:
        """A ``session_state`` row's columns (in :func:`state_columns` order) as the state dict sessions use."""
        pin_keys = None
        if row[1] is not None:
            try:
                pin_keys = json.loads(row[1])
            except ValueError:
                pin_keys = None  # corrupt pin keys cause exactly one re-pin (Lore's rule)
        return {
            "ltm_pin_text": row[0], "ltm_pin_keys": pin_keys, "ltm_cache_text": row[2],
            "stable_ltm_text": row[3], "host_prompt": row[4], "tools": json.loads(row[5]),
            "model": row[6], "extra": json.loads(row[7]),
        }

    state_columns = staticmethod(state_columns)

    def write_state(self, session_id: str, state: dict[str, Any], at: datetime,
                    previous: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the state row; with ``previous`` (the last written columns) only changed columns are
        updated — the host prompt and tools are large and rarely change. Returns the columns written."""
        cols = state_columns(state)
        new = self._new_sessions.get(session_id)
        if new is not None:  # created in this batch: its row is written at the end (batch)
            changed = list(cols) if previous is None else [k for k, v in cols.items() if previous.get(k) != v]
            if changed:
                for i, k in enumerate(cols, start=1):
                    if k in changed:
                        new[1][i] = cols[k]
                new[1][-1] = at
            return cols
        if previous is None:
            self.con.execute(
                "INSERT OR REPLACE INTO session_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [session_id, *cols.values(), at],
            ).fetchall()
            return cols
        changed = [k for k, v in cols.items() if previous.get(k) != v]
        if changed:
            sets = ", ".join(f"{k} = ?" for k in changed)
            self.con.execute(
                f"UPDATE session_state SET {sets}, updated_at = ? WHERE session_id = ?",
                [*(cols[k] for k in changed), at, session_id],
            ).fetchall()
        return cols

    # -- pending events: recorded between requests, consumed by the next one ---------------------------------
    def pending_events(self, session_id: str) -> list[str]:
        """The event codes recorded since a session's last request, in order."""
        return [r[0] for r in self.rows(
            "SELECT code FROM session_pending_events WHERE session_id = ? ORDER BY seq", [session_id])]

    def add_pending_events(self, session_id: str, first_seq: int, codes: Sequence[str]) -> None:
        """Record events numbered from ``first_seq`` (inside the caller's transaction). Written at once, also
        inside :meth:`batch`, so the DELETE of the request that consumes them always sees them."""
        self._insert_now("session_pending_events",
                         [(session_id, first_seq + i, code) for i, code in enumerate(codes)])

    def clear_pending_events(self, session_id: str) -> None:
        """Forget a session's pending events (inside the caller's transaction)."""
        self.con.execute("DELETE FROM session_pending_events WHERE session_id = ?", [session_id]).fetchall()
