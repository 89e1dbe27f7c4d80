"""What a store must hold for the code to read it: the schema the migrations create, and the wording of a damaged
store's error (the store refuses one on opening; ``promptcache-nb doctor``, ``_doctor.py``, checks all of it).

The expected schema is derived, never listed by hand: the migrations are applied once to an in-memory database
and its tables, columns and NOT NULL constraints are what every store at this version must have.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb

from ._migrations import migrate

__all__ = ["CORE_TABLES", "damaged", "expected_schema", "node_on_cycle", "schema_of", "schema_problems"]

#: Our own tables: a store holding these but no ``m001_initial`` row in ``_migrations`` was tampered with, not
#: made by another application.
CORE_TABLES = frozenset({"sessions", "turns", "blocks", "prefix_nodes"})


def damaged(path: str, what: str) -> str:
    """The one-line message of a damaged store: what is wrong, and the command that checks the rest."""
    return f"store {path!r} is damaged: {what}; run `promptcache-nb doctor {path}` for a full check"


def node_on_cycle(nodes: Mapping[str, Sequence[Any]]) -> str | None:
    """A node whose parent links (``nodes``: id -> (parent, ...), a parent outside ``nodes`` ends a walk) lead back
    to itself, or None when every walk ends. Each node is walked once."""
    ends: set[str] = set()  # nodes whose walk is known to end
    for start in nodes:
        walk: list[str] = []
        on_walk: set[str] = set()
        cur: str | None = start
        while cur is not None and cur in nodes and cur not in ends:
            if cur in on_walk:
                return cur
            walk.append(cur)
            on_walk.add(cur)
            cur = nodes[cur][0]
        ends.update(walk)
    return None


@functools.cache
def expected_schema() -> dict[str, dict[str, bool]]:
    """table -> column -> NOT NULL, as the migrations of this version create them."""
    con = duckdb.connect(":memory:")
    try:
        migrate(con)
        return schema_of(con)
    finally:
        con.close()


def schema_of(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, bool]]:
    rows = con.execute(
        "SELECT table_name, column_name, is_nullable FROM duckdb_columns() "
        "WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal "
        "ORDER BY table_name, column_index").fetchall()
    out: dict[str, dict[str, bool]] = {}
    for table, column, nullable in rows:
        out.setdefault(table, {})[column] = not nullable
    return out


def schema_problems(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Tables and columns of :func:`expected_schema` the database lacks, one phrase each (empty: none)."""
    have = schema_of(con)
    problems = []
    for table, columns in expected_schema().items():
        if table not in have:
            problems.append(f"table {table!r} is missing")
            continue
        problems.extend(f"column {table}.{c} is missing" for c in columns if c not in have[table])
    return problems
