"""``promptcache-nb doctor FILE``: checks all that a store must hold for the code to read it (``_schema.py``).

Opening a store checks tables and columns (one catalog query, :func:`~._schema.schema_problems`); the row-level
checks (a NULL where the code expects a value, a block or prefix node referenced but gone, a ``prefix_nodes`` chain
that runs in a cycle, a block body that is not JSON, a session config that is not a JSON object) run here in full,
and the readers that would trip over them raise a one-line :class:`~promptcache_nb.errors.StoreError` at first use.
The same row checks run over a fleet dataset's Parquet files, group by group (:func:`check_dataset_rows`, for
``doctor DIR``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from ..errors import StoreError
from ._connection import _check_file, _one_line, _resolved, _sql_text
from ._db import Store
from ._migrations import MIGRATIONS, migrate
from ._parquet import GROUP_FILE_PATTERN
from ._schema import CORE_TABLES, expected_schema, node_on_cycle, schema_of, schema_problems

__all__ = ["DoctorReport", "RowProblem", "check_dataset_rows", "check_store"]

@dataclass
class DoctorReport:
    """What :func:`check_store` found. ``problems`` is empty for a sound store."""

    path: str
    problems: list[str] = field(default_factory=list)
    #: row counts of the main tables (those that could be read)
    counts: dict[str, int] = field(default_factory=dict)
    migrations: list[str] = field(default_factory=list)
    #: a DuckDB file with no table or view at all: what ``pc.Lab(path)`` starts from (a store whose creation was
    #: interrupted is left so); opening it read-write creates the tables
    blank: bool = False
    #: the first line, when not a store's (a fleet dataset's: ``pc.fleet.check_dataset``)
    head: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        counts = ", ".join(f"{n} {t}" for t, n in self.counts.items())
        head = self.head or (f"{self.path}: {len(self.migrations)} migrations applied"
                             + (f"; {counts}" if counts else ""))
        if self.blank:
            return [f"{self.path}: a blank DuckDB file (no tables yet: opening it read-write creates them)",
                    "ok: no problem found"]
        if self.ok:
            return [head, "ok: no problem found"]
        return [head, *(f"problem: {p}" for p in self.problems),
                f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''} found"]


def _references(per_group: bool = False) -> list[tuple[str, str, str, str]]:
    """(what, SQL counting offending rows, SQL of an example, the alias of the row that refers) for each reference
    the readers follow. ``per_group``: over a fleet dataset's files (:func:`check_dataset_rows`), where each file
    group's files must hold a sound store on their own, so a row's reference is looked up within its group."""

    def same(inner: str, outer: str) -> str:
        return f" AND {inner}._group = {outer}._group" if per_group else ""

    carry = "_group, " if per_group else ""
    return [
        ("turns.rest_hash not in blocks",
         # a usage-first request has no body analysed yet (rest_hash NULL): nothing to find
         "FROM turns t WHERE t.rest_hash IS NOT NULL AND NOT EXISTS "
         f"(SELECT 1 FROM blocks b WHERE b.hash = t.rest_hash{same('b', 't')})", "t.rest_hash", "t"),
        ("turns.tail_node not in prefix_nodes",
         "FROM turns t WHERE t.tail_node IS NOT NULL AND NOT EXISTS "
         f"(SELECT 1 FROM prefix_nodes p WHERE p.id = t.tail_node{same('p', 't')})", "t.tail_node", "t"),
        ("prefix_nodes.block_hash not in blocks",
         f"FROM prefix_nodes p WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.hash = p.block_hash{same('b', 'p')})",
         "p.block_hash", "p"),
        ("prefix_nodes.parent not in prefix_nodes",
         "FROM prefix_nodes p WHERE p.parent IS NOT NULL AND NOT EXISTS "
         f"(SELECT 1 FROM prefix_nodes q WHERE q.id = p.parent{same('q', 'p')})", "p.parent", "p"),
        ("turns.session_id not in sessions",
         f"FROM turns t WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.session_id{same('s', 't')})",
         "t.session_id", "t"),
        ("session_messages block not in blocks",
         f"FROM (SELECT {carry}unnest(CASE WHEN json_exists(message, '$.str') "
         "THEN [json_extract_string(message, '$.str')] "
         "ELSE json_extract_string(message, '$.blocks[*]') END) AS h FROM session_messages) m "
         f"WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.hash = m.h{same('b', 'm')})", "m.h", "m"),
        ("turns without an analysed body outside a session awaiting analysis",
         "FROM turns t WHERE t.rest_hash IS NULL AND NOT EXISTS "
         f"(SELECT 1 FROM unanalysed_sessions u WHERE u.session_id = t.session_id{same('u', 't')})",
         "t.session_id || ':' || t.idx", "t"),
        ("session awaiting analysis that holds analysed requests (half analysed)",
         "FROM unanalysed_sessions u WHERE EXISTS "
         f"(SELECT 1 FROM turns t WHERE t.session_id = u.session_id AND t.rest_hash IS NOT NULL{same('t', 'u')})",
         "u.session_id", "u"),
        ("sessions.config not a JSON object",
         "FROM sessions s WHERE json_type(s.config) IS DISTINCT FROM 'OBJECT'", "s.id", "s"),
        ("session without a session_state row",
         "FROM sessions s WHERE s.source IS NULL AND NOT EXISTS "
         f"(SELECT 1 FROM session_state st WHERE st.session_id = s.id{same('st', 's')})", "s.id", "s"),
    ]


def check_store(path: str) -> DoctorReport:
    """Check a store file without changing it: schema, migrations, NOT NULL columns and the references the
    readers follow. Raises :class:`~promptcache_nb.errors.StoreError` only when the file cannot be opened at
    all (not a regular file, not DuckDB, locked by a writer)."""
    # Store's own file checks (FIFO, device, foreign header) and lock messages; it refuses a damaged store,
    # so the rows are read over a plain read-only connection after those checks
    _resolved(path)  # a symlink loop: Store's one line
    _check_file(path, read_only=True)
    report = DoctorReport(path)
    try:
        con = duckdb.connect(path, read_only=True)
    except duckdb.Error as exc:
        try:  # the lock message names the holder: reuse Store's wording
            Store(path, read_only=True).close()
        except StoreError:
            raise
        raise StoreError(f"cannot open store {path!r}: {_one_line(exc)}") from None
    try:
        _check(con, report)
    finally:
        con.close()
    return report


def _check(con: duckdb.DuckDBPyConnection, report: DoctorReport) -> None:
    have = schema_of(con)
    if not have and not con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchall()[0][0]:
        report.blank = True
        return
    if "_migrations" not in have:
        report.problems.append("table '_migrations' is missing" + (
            " (the other tables are promptcache_nb's)" if CORE_TABLES <= set(have) else
            " (not a promptcache_nb store?)"))
    else:
        report.migrations = [r[0] for r in con.execute(
            "SELECT name FROM _migrations ORDER BY applied_order").fetchall()]
        known = {fn.__name__ for fn in MIGRATIONS}
        missing = [fn.__name__ for fn in MIGRATIONS if fn.__name__ not in report.migrations]
        newer = [m for m in report.migrations if m not in known]
        if missing and CORE_TABLES <= set(have) and "m001_initial" in missing:
            report.problems.append("table '_migrations' has lost its rows (m001_initial missing) though the "
                                   "tables exist")
        elif missing:
            report.problems.append(f"migrations not applied: {', '.join(missing)} (open the store read-write "
                                   "once to apply them)")
        if newer:
            report.problems.append(f"migrations from a newer promptcache_nb: {', '.join(newer)} (upgrade)")
    report.problems.extend(schema_problems(con))
    for table in ("sessions", "turns", "blocks", "prefix_nodes", "session_messages", "knowledge"):
        if table in have:
            report.counts[table] = con.execute(f'SELECT count(*) FROM "{table}"').fetchall()[0][0]
    for table, columns in expected_schema().items():
        for column, not_null in columns.items():
            if not not_null or column not in have.get(table, {}):
                continue
            n = con.execute(f'SELECT count(*) FROM "{table}" WHERE "{column}" IS NULL').fetchall()[0][0]
            if n:
                report.problems.append(f"column {table}.{column} holds {n} NULL{'s' if n != 1 else ''} "
                                       "(the code expects a value)")
    for what, where, shown, _ in _references():
        try:
            n = con.execute(f"SELECT count(*) {where}").fetchall()[0][0]
            if n:
                examples = [r[0] for r in con.execute(f"SELECT DISTINCT {shown} {where} ORDER BY 1 LIMIT 3")
                            .fetchall()]
                report.problems.append(_rows_line(what, n, examples))
        except duckdb.Error:
            continue  # a table or column the schema check already reported missing
    if {"id", "parent"} <= set(have.get("prefix_nodes", {})):
        parents = dict(con.execute("SELECT id, parent FROM prefix_nodes").fetchall())
        looping = node_on_cycle({node: (parent,) for node, parent in parents.items()})
        if looping is not None:
            report.problems.append(f"prefix_nodes.parent runs in a cycle (e.g. row {looping!r}): the requests "
                                   "through it cannot be rebuilt")
    if {"hash", "body"} <= set(have.get("blocks", {})):
        bad = _unparsable_blocks(con)
        if bad:
            report.problems.append(_rows_line("blocks.body not JSON", len(bad), sorted(h for h, _ in bad)[:3]))


def _rows_line(what: str, n: int, examples: Sequence[object]) -> str:
    return f"{what}: {n} row{'s' if n != 1 else ''} (e.g. {', '.join(repr(e) for e in examples)})"


def _unparsable_blocks(con: duckdb.DuckDBPyConnection, batch: int = 4096, *,
                       group: str = "NULL") -> list[tuple[str, str | None]]:
    """``(hash, group)`` of the blocks whose body Python's ``json`` cannot parse (DuckDB's ``json_valid`` differs: it
    refuses the lone-surrogate escapes a stored message may hold), read a batch at a time; ``group``: the column
    naming a dataset file's group."""
    bad: list[tuple[str, str | None]] = []
    cur = con.execute(f"SELECT hash, body, {group} FROM blocks WHERE body IS NOT NULL")
    while rows := cur.fetchmany(batch):
        for block_hash, body, gid in rows:
            try:
                json.loads(body)
            except (ValueError, RecursionError):
                bad.append((block_hash, gid))
    return bad


@dataclass(frozen=True)
class RowProblem:
    """What :func:`check_dataset_rows` found: one kind of bad row in a fleet dataset's Parquet files."""

    what: str
    rows: int
    examples: tuple[str, ...]
    #: the file groups whose files hold those rows (importing them again repairs it)
    groups: tuple[str, ...]

    def line(self) -> str:
        return _rows_line(self.what, self.rows, self.examples)


def check_dataset_rows(files: Mapping[str, Sequence[str]], *, deep: bool = True) -> list[RowProblem]:
    """Check the rows of a fleet dataset's Parquet files (``files``: table -> its readable files) the way
    :func:`check_store` checks a store's: each file group's files must hold a sound store on their own (a task
    writes one group's whole private store), so every reference the readers follow is looked up within the row's
    group, and each group's prefix chains must end. ``deep`` also parses every block body (reads them all).
    """
    con = duckdb.connect(":memory:")
    try:
        migrate(con)  # the tables a group may have written no file of, empty
        tables = [t for t in schema_of(con) if t != "_migrations"]
        con.execute("CREATE SCHEMA checked")
        for table in tables:
            paths = files.get(table)
            source = (f"(SELECT *, regexp_extract(filename, {_sql_text(GROUP_FILE_PATTERN)}, 1) AS _group FROM "
                      f"read_parquet([{', '.join(_sql_text(p) for p in paths)}], hive_partitioning = true, "
                      "union_by_name = true, filename = true))" if paths else
                      f'(SELECT *, CAST(NULL AS VARCHAR) AS _group FROM main."{table}")')
            con.execute(f'CREATE VIEW checked."{table}" AS SELECT * FROM {source}')
        con.execute("USE memory.checked")
        found: list[RowProblem] = []
        for what, where, shown, referrer in _references(per_group=True):
            try:
                rows = con.execute(f"SELECT {referrer}._group, count(*), list(DISTINCT CAST({shown} AS VARCHAR) "
                                   f"ORDER BY CAST({shown} AS VARCHAR)) {where} GROUP BY 1 ORDER BY 1").fetchall()
            except duckdb.Error:
                continue  # files of an older version without that column
            if rows:
                examples = sorted({e for _, _, some in rows for e in some})[:3]
                found.append(RowProblem(what, sum(n for _, n, _ in rows), tuple(examples),
                                        tuple(g for g, _, _ in rows)))
        chains: dict[str, dict[str, tuple[Any]]] = {}
        for gid, node, parent in con.execute("SELECT _group, id, parent FROM prefix_nodes").fetchall():
            chains.setdefault(gid, {})[node] = (parent,)
        looping = {gid: node for gid, nodes in sorted(chains.items()) if (node := node_on_cycle(nodes)) is not None}
        if looping:
            found.append(RowProblem("prefix_nodes.parent runs in a cycle", len(looping),
                                    tuple(sorted(looping.values())[:3]), tuple(looping)))
        if deep:
            bad = _unparsable_blocks(con, group="_group")
            if bad:
                found.append(RowProblem("blocks.body not JSON", len(bad), tuple(sorted(h for h, _ in bad)[:3]),
                                        tuple(sorted({str(g) for _, g in bad}))))
        return found
    finally:
        con.close()
