"""``promptcache-nb doctor FILE``: checks all that a store must hold for the code to read it (``_schema.py``).

Opening a store checks tables and columns (one catalog query, :func:`~._schema.schema_problems`); the row-level
checks (a NULL where the code expects a value, a block or prefix node referenced but gone, a ``prefix_nodes`` chain
that runs in a cycle, a block body that is not JSON, a session config that is not a JSON object) run here in full,
and the readers that would trip over them raise a one-line :class:`~promptcache_nb.errors.StoreError` at first use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import duckdb

from ..errors import StoreError
from ._connection import _check_file, _one_line
from ._db import Store
from ._migrations import MIGRATIONS
from ._schema import CORE_TABLES, expected_schema, node_on_cycle, schema_of, schema_problems

__all__ = ["DoctorReport", "check_store"]

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


# (what, SQL counting offending rows, SQL listing up to 3 examples) for references the readers follow
_REFERENCES = [
    ("turns.rest_hash not in blocks",
     # a usage-first request has no body analysed yet (rest_hash NULL): nothing to find
     "FROM turns t WHERE t.rest_hash IS NOT NULL AND NOT EXISTS (SELECT 1 FROM blocks b WHERE b.hash = t.rest_hash)",
     "t.rest_hash"),
    ("turns.tail_node not in prefix_nodes",
     "FROM turns t WHERE t.tail_node IS NOT NULL AND NOT EXISTS "
     "(SELECT 1 FROM prefix_nodes p WHERE p.id = t.tail_node)",
     "t.tail_node"),
    ("prefix_nodes.block_hash not in blocks",
     "FROM prefix_nodes p WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.hash = p.block_hash)", "p.block_hash"),
    ("prefix_nodes.parent not in prefix_nodes",
     "FROM prefix_nodes p WHERE p.parent IS NOT NULL AND NOT EXISTS "
     "(SELECT 1 FROM prefix_nodes q WHERE q.id = p.parent)", "p.parent"),
    ("turns.session_id not in sessions",
     "FROM turns t WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.session_id)", "t.session_id"),
    ("session_messages block not in blocks",
     "FROM (SELECT unnest(CASE WHEN json_exists(message, '$.str') THEN [json_extract_string(message, '$.str')] "
     "ELSE json_extract_string(message, '$.blocks[*]') END) AS h FROM session_messages) m "
     "WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.hash = m.h)", "m.h"),
    ("turns without an analysed body outside a session awaiting analysis",
     "FROM turns t WHERE t.rest_hash IS NULL AND NOT EXISTS "
     "(SELECT 1 FROM unanalysed_sessions u WHERE u.session_id = t.session_id)", "t.session_id || ':' || t.idx"),
    ("session awaiting analysis that holds analysed requests (half analysed)",
     "FROM unanalysed_sessions u WHERE EXISTS "
     "(SELECT 1 FROM turns t WHERE t.session_id = u.session_id AND t.rest_hash IS NOT NULL)", "u.session_id"),
    ("sessions.config not a JSON object",
     "FROM sessions s WHERE json_type(s.config) IS DISTINCT FROM 'OBJECT'", "s.id"),
    ("session without a session_state row",
     "FROM sessions s WHERE s.source IS NULL AND NOT EXISTS "
     "(SELECT 1 FROM session_state st WHERE st.session_id = s.id)", "s.id"),
]


def check_store(path: str) -> DoctorReport:
    """Check a store file without changing it: schema, migrations, NOT NULL columns and the references the
    readers follow. Raises :class:`~promptcache_nb.errors.StoreError` only when the file cannot be opened at
    all (not a regular file, not DuckDB, locked by a writer)."""
    # Store's own file checks (FIFO, device, foreign header) and lock messages; it refuses a damaged store,
    # so the rows are read over a plain read-only connection after those checks
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
    for what, where, shown in _REFERENCES:
        try:
            n = con.execute(f"SELECT count(*) {where}").fetchall()[0][0]
            if n:
                examples = [r[0] for r in con.execute(f"SELECT DISTINCT {shown} {where} ORDER BY 1 LIMIT 3")
                            .fetchall()]
                report.problems.append(f"{what}: {n} row{'s' if n != 1 else ''} (e.g. "
                                       f"{', '.join(repr(e) for e in examples)})")
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
            report.problems.append(f"blocks.body not JSON: {len(bad)} row{'s' if len(bad) != 1 else ''} (e.g. "
                                   f"{', '.join(repr(h) for h in sorted(bad)[:3])})")


def _unparsable_blocks(con: duckdb.DuckDBPyConnection, batch: int = 4096) -> list[str]:
    """The hashes of the blocks whose body Python's ``json`` cannot parse (DuckDB's ``json_valid`` differs: it
    refuses the lone-surrogate escapes a stored message may hold), read a batch at a time."""
    bad: list[str] = []
    cur = con.execute("SELECT hash, body FROM blocks WHERE body IS NOT NULL")
    while rows := cur.fetchmany(batch):
        for block_hash, body in rows:
            try:
                json.loads(body)
            except (ValueError, RecursionError):
                bad.append(block_hash)
    return bad
