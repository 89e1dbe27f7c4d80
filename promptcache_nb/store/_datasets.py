"""Stores as parts of a whole: merging another process's store, the Parquet dataset (pc.fleet) and its reads,
and the calibrations fitted over every measured request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import duckdb

from ..errors import StoreError
from ._connection import _Connection, _one_line, _sql_text
from ._parquet import (
    CONTENT_KEYS,
    DATASET_TABLES,
    attach_dataset,
    export_dataset_tables,
    export_group,
    group_of_file,
    parquet_source,
)


class _DatasetsMixin(_Connection):
    """Merges, Parquet datasets and calibrations (:class:`~promptcache_nb.store.Store`)."""

    def merge_from(self, path: str) -> list[str]:
        """Copy every row of the store file ``path`` (another process's import of other sessions) into this one,
        in one transaction: content-addressed rows (blocks, prefix nodes, projects) only when new, calibrations
        never (they are fitted over the whole store afterwards). Returns the session ids copied. The caller
        makes sure none of them is stored here already."""
        con = self._live()
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary "
            "ORDER BY table_name").fetchall() if r[0] != "_migrations" and r[0] not in DATASET_TABLES]
        con.execute(f"ATTACH {_sql_text(path)} AS merged_src (READ_ONLY)")
        try:
            sessions = [r[0] for r in con.execute("SELECT id FROM merged_src.sessions ORDER BY id").fetchall()]
            with self.transaction():
                for table in tables:
                    key = CONTENT_KEYS.get(table)
                    if table == "projects":  # as ensure_project: created at its earliest session's start
                        con.execute("INSERT INTO main.projects SELECT * FROM merged_src.projects ON CONFLICT DO "
                                    "UPDATE SET created_at = least(projects.created_at, excluded.created_at)")
                        continue
                    if table == "unanalysed_sessions":  # after every session awaiting analysis here, in order
                        con.execute("INSERT INTO main.unanalysed_sessions SELECT session_id, import_seq + "
                                    "(SELECT coalesce(max(import_seq) + 1, 0) FROM main.unanalysed_sessions), "
                                    "file_group, files FROM merged_src.unanalysed_sessions")
                        continue
                    where = (f" WHERE {key} NOT IN (SELECT {key} FROM main.{table})" if key else "")
                    con.execute(f"INSERT INTO main.{table} SELECT * FROM merged_src.{table}{where}")
                self._pending_known.update(
                    (r[0], ()) for r in con.execute("SELECT hash FROM merged_src.blocks").fetchall())
                self._pending_nodes.update(r[0] for r in con.execute("SELECT id FROM merged_src.prefix_nodes"
                                                                     ).fetchall())
        finally:
            con.execute("DETACH merged_src")
        return sessions

    # -- the store as a Parquet dataset (pc.fleet; store/_parquet.py) ---------------------------------
    def export_parquet(self, out: str, group: str) -> None:
        """Write every table as Parquet files of file group ``group`` under the dataset directory ``out``,
        replacing that group's earlier files (:mod:`._parquet`)."""
        export_group(self._live(), out, group)

    def export_dataset_tables(self, out: str) -> None:
        """Write the tables fitted over a whole dataset (calibrations) under ``out``."""
        export_dataset_tables(self._live(), out)

    @classmethod
    def open_dataset(cls, out: str, *, writable_dataset_tables: bool = False) -> Self:
        """A store whose tables are views over the Parquet dataset at ``out``: every read works, every write
        raises StoreError (``writable_dataset_tables``: the calibrations table, an in-memory copy, may be
        written, so a calibration can be fitted over the whole dataset)."""
        store = cls(":memory:")
        try:
            attach_dataset(store._live(), out)
        except duckdb.Error as exc:
            store.close()
            raise StoreError(f"cannot read fleet dataset {out!r}: {_one_line(exc)}") from None
        except BaseException:
            store.close()
            raise
        store.path = out
        store._views = True
        store.read_only = not writable_dataset_tables
        store.read_only_why = ("a fleet dataset: Parquet files read through views; add logs with "
                               "pc.fleet.import_logs(paths, out=...)")
        return store

    # -- a fleet dataset's reads: by where the rows were written ------------------------------------------
    def _dataset_sources(self, table: str, session_id: str | None) -> list[str]:
        """Where to look up a content-addressed table's rows for ``session_id``, in order: the files of the file
        group that wrote the session (it wrote every row the session uses, unless another group stored part of
        it), then every file. Never the table's view: it keeps one row per key across all the files (``DISTINCT
        ON``), a pass over all of them per lookup (7 s for 1,500 blocks of a 200-session dataset, 0.1 s in the
        session's group's file)."""
        groups = self._dataset_groups(session_id) if session_id is not None else []
        return [*(parquet_source(self.path, table, g) for g in groups), parquet_source(self.path, table)]

    def _dataset_groups(self, session_id: str) -> list[str]:
        """The file groups whose ``sessions`` files hold ``session_id`` (usually one)."""
        got = self._session_groups.get(session_id)
        if got is None:
            files = self.rows(f"SELECT DISTINCT filename FROM {parquet_source(self.path, 'sessions', filename=True)} "
                              "WHERE id = $1", [session_id])
            got = self._session_groups[session_id] = sorted({group_of_file(f) for (f,) in files})
        return got

    def _dataset_rows(self, table: str, query: str, keys: list[str], session_id: str | None) -> dict[str, Any]:
        """key -> value of ``query`` (``{source}`` a table's files, ``$1`` the keys) over
        :meth:`_dataset_sources`: each source asked only for the keys the ones before it lacked."""
        found: dict[str, Any] = {}
        todo = keys
        for source in self._dataset_sources(table, session_id):
            found.update(self.rows(query.format(source=source), [todo]))
            todo = [k for k in todo if k not in found]
            if not todo:
                break
        return found

    def _chains_up(self, nodes: Sequence[str], session_id: str) -> dict[str, tuple[Any, ...]]:
        """The ``prefix_nodes`` rows from ``nodes`` up to their roots (id -> parent, kind, role, block_hash), in
        one recursive query (a fleet dataset's views have no row ids: :meth:`_dataset_rows`); a node not stored
        is left out."""
        found: dict[str, tuple[Any, ...]] = {}
        for source in self._dataset_sources("prefix_nodes", session_id):
            # a chain cut where this file group's files end comes back to the caller's loop as a missing parent
            starts = [n for n in nodes if n not in found]
            if not starts:
                break
            found.update((r[0], r[1:]) for r in self.rows(
                f"""WITH RECURSIVE chain(id) USING KEY (id) AS (
                       SELECT unnest($1)
                       UNION
                       SELECT p.parent FROM {source} p JOIN chain c ON p.id = c.id WHERE p.parent IS NOT NULL)
                   SELECT n.id, n.parent, n.kind, n.role, n.block_hash FROM chain c JOIN {source} n ON n.id = c.id""",
                [starts]))
        return found

    # -- calibrations ---------------------------------------------------------------------------------------
    def measured_totals(self, *, session_id: str | None = None,
                        models: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every request with complete measured usage (live or imported), in session order: ``session_id``,
        ``model``, ``estimated`` (the stored estimate ``total_tokens``), ``measured`` (input + cache read +
        write), ``partial`` (a partial body: its unlogged prefix was sized from measured usage), ``unlogged``
        (that prefix's tokens, 0 for a full body) and ``calibrated`` (its session opted in to a calibration, so
        its estimate is already scaled). Only one session's, or only those of ``models``, when given."""
        where, params = "", list[Any]()
        if session_id is not None:
            where, params = where + " AND session_id = ?", [*params, session_id]
        if models is not None:
            where, params = where + " AND model IN (SELECT unnest(?))", [*params, list(models)]
        return self.query(
            f"""WITH m AS (SELECT session_id, idx, model, total_tokens, rest_hash,
                                  input_tokens + cache_read_input_tokens + cache_creation_input_tokens AS measured
                           FROM turns
                           -- a usage-first request has no estimate to compare yet (NULL until analysed)
                           WHERE usage_source IN ('live', 'imported') AND input_tokens IS NOT NULL
                                 AND total_tokens IS NOT NULL
                                 AND cache_read_input_tokens IS NOT NULL AND cache_creation_input_tokens IS NOT NULL
                                 {where})
               SELECT m.session_id, m.model, m.total_tokens AS estimated, m.measured,
                      coalesce(b.partial, false) AS partial, coalesce(b.unlogged, 0) AS unlogged,
                      coalesce(json_type(s.config, '$.calibration'), 'NULL') <> 'NULL' AS calibrated
               FROM m JOIN sessions s ON s.id = m.session_id
               -- only the rest blocks of these turns (a turn's rest_hash is one): the filter on kind is pushed into
               -- the scan, so the segment bodies (nearly all of the store) are never read
               LEFT JOIN (SELECT hash, json_extract(body, '$.shape.unlogged') IS NOT NULL AS partial,
                                 coalesce(try_cast(json_extract(body, '$.shape.unlogged') AS BIGINT), 0) AS unlogged
                          FROM blocks WHERE kind = 'rest' AND hash IN (SELECT rest_hash FROM m)) b
                         ON b.hash = m.rest_hash
               ORDER BY m.session_id, m.idx""", params)

    def measured_models(self) -> list[str]:
        """The models of the requests whose usage was measured (live or imported), sorted."""
        return [r["model"] for r in self.query(
            "SELECT DISTINCT model FROM turns WHERE usage_source IN ('live', 'imported') ORDER BY model")]

    def clear_calibrations(self) -> None:
        """Forget every saved calibration (a fleet dataset's are fitted again over the whole dataset)."""
        self._live().execute("DELETE FROM calibrations")

    def models_of(self, session_ids: Sequence[str]) -> list[str]:
        """The models the requests of ``session_ids`` used, sorted."""
        if not session_ids:
            return []
        return [r[0] for r in self._live().execute(
            "SELECT DISTINCT model FROM turns WHERE session_id IN (SELECT unnest(?)) AND model IS NOT NULL "
            "ORDER BY model", [list(session_ids)]).fetchall()]

    CALIBRATION_COLUMNS = ("model", "tokenizer", "ratio", "overhead", "n", "mean_abs_error_pct", "max_abs_error_pct",
                           "raw_mean_abs_error_pct", "loo_mean_abs_error_pct", "fitted_at")

    def save_calibration(self, values: dict[str, Any]) -> None:
        """Insert (or replace) a ``calibrations`` row, in one transaction; ``values`` keyed by column."""
        cols = self.CALIBRATION_COLUMNS
        with self.transaction():  # rolls back on failure, never after a COMMIT that went through
            self.con.execute(
                f"INSERT OR REPLACE INTO calibrations ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [values[c] for c in cols],
            ).fetchall()

    def latest_calibration(self, model: str, tokenizer: str) -> dict[str, Any] | None:
        """The newest ``calibrations`` row of ``(model, tokenizer)`` as a dict, or None."""
        rows = self.query(
            f"""SELECT {', '.join(self.CALIBRATION_COLUMNS)} FROM calibrations WHERE model = ? AND tokenizer = ?
                ORDER BY fitted_at DESC LIMIT 1""",
            [model, tokenizer],
        )
        return rows[0] if rows else None

    def saved_calibrations(self) -> list[tuple[str, str]]:
        """The ``(model, tokenizer)`` pairs with a saved calibration, sorted."""
        return [(r["model"], r["tokenizer"]) for r in self.query(
            "SELECT DISTINCT model, tokenizer FROM calibrations ORDER BY model, tokenizer")]
