"""The store owns its SQL: callers get dict rows or typed records, an optional tracer sees every statement,
and no SQL text lives outside ``promptcache_nb/store``."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.errors import StoreError
from promptcache_nb.store import StoredNode, UsageMarks

PACKAGE = Path(__file__).resolve().parent.parent / "promptcache_nb"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOST = "You are the billing support assistant. Answer precisely and cite the ticket. " * 150
SQL = re.compile(r"^\s*(?:WITH\s+RECURSIVE|SELECT\s|INSERT\s+(?:OR\s+REPLACE\s+)?INTO\s|UPDATE\s+\w+\s+SET\s|"
                 r"DELETE\s+FROM\s|CREATE\s+TABLE\s)")  # upper case, as the package writes SQL
#: Modules that still hold SQL outside the store, each with the reason. Shrinks, never grows.
SQL_PENDING: dict[str, str] = {}
#: Readers of another application's own SQLite file (a log format, opened read-only): their SQL reads that
#: application's tables, never our store.
FOREIGN_SQL: dict[str, str] = {
    "readers/openclaw.py": "OpenClaw's state database (transcript_events, diagnostic_events)",
    "readers/opencode.py": "OpenCode's opencode.db (session, message, part)",
}


def sql_literals(path: Path) -> list[int]:
    """Lines of string literals (f-strings included) that start like an SQL statement."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for n in ast.walk(tree):
        text = None
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            text = n.value
        elif isinstance(n, ast.JoinedStr):
            text = "".join(v.value for v in n.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        if text and SQL.match(text):
            lines.append(n.lineno)
    return lines


def test_no_sql_outside_the_store() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("store/") or rel in SQL_PENDING or rel in FOREIGN_SQL:
            continue
        if lines := sql_literals(path):
            offenders[rel] = lines
    assert offenders == {}


def test_the_checker_sees_sql() -> None:
    for part in ("_connection.py", "_sessions.py", "_requests.py", "_knowledge.py", "_queries.py", "_datasets.py"):
        assert sql_literals(PACKAGE / "store" / part), part  # each part of the Store runs its own SQL
    assert SQL.match("SELECT idx FROM turns") and SQL.match("\n  WITH RECURSIVE chain(id) AS (")
    assert not SQL.match("select the strategy") and not SQL.match("Select a cache model")  # prose


@pytest.fixture
def recorded():
    statements: list[tuple[str, object]] = []
    lab = pc.Lab(progress=False, trace=lambda sql, params: statements.append((sql, params)))
    s = lab.session("durable_delta", system=HOST, start=T0)
    s.knowledge.add("Refund window", "Refunds are automatic within 30 days.", category="gotcha", at=T0)
    for i in range(3):
        s.step(f"question {i}", reply=f"answer {i}")
    yield lab, s, statements
    lab.close()


def test_tracer_sees_every_statement_of_a_turn(recorded) -> None:
    lab, s, statements = recorded
    before = len(statements)
    s.step("one more", reply="ok")
    turn = [sql for sql, _ in statements[before:]]
    assert turn[0] == "BEGIN" and turn[-1] == "COMMIT"
    assert any(sql.startswith('INSERT INTO turns ("session_id"') for sql in turn)
    assert len(turn) <= 12  # how many statements one turn costs: visible, and kept small
    params = [p for sql, p in statements[before:] if sql.startswith("INSERT INTO turns")][0]
    assert s.id in params  # bind parameters are traced with their statement


def test_untraced_store_has_no_tracer() -> None:
    with pc.Lab(progress=False) as lab:
        assert lab.store.trace is None
        assert type(lab.store.con).__name__ == "DuckDBPyConnection"


def test_dict_rows_and_typed_records(recorded) -> None:
    lab, s, _ = recorded
    store = lab.store
    row = store.turn_row(s.id, 1, ["idx", "cache_read_input_tokens", "usage_source"])
    assert row == {"idx": 1, "cache_read_input_tokens": row["cache_read_input_tokens"], "usage_source": "simulated"}
    assert set(store.turn_row(s.id, 0)) >= {"session_id", "idx", "sent_at", "segment_map", "explanation"}
    assert store.turn_row(s.id, 99) is None
    assert [r["idx"] for r in store.turn_rows(s.id, ["idx"])] == [0, 1, 2]
    assert list(store.turns_frame(s.id, ["idx", "model"]).columns) == ["idx", "model"]
    with pytest.raises(StoreError, match="turns has no column 'row18'"):
        store.turn_rows(s.id, ["idx", "row18"])  # never positional, never injected
    marks = store.usage_marks(s.id)
    assert isinstance(marks, UsageMarks) and (marks.last_idx, marks.read_idx) == (2, 2)
    assert store.usage_marks(s.id, upto=0).last_idx == 0
    assert store.usage_marks("nope") is None
    nodes = store.session_nodes(s.id)
    assert nodes and all(isinstance(n, StoredNode) for n in nodes.values())
    assert all(n.parent is None or n.parent in nodes for n in nodes.values())
    assert store.query("SELECT 1 AS one") == [{"one": 1}]


def test_analysis_reads_through_the_store(recorded) -> None:
    """What analysis shows is what the store holds: re-read diff/observation, resimulation, rebuilds."""
    lab, s, _ = recorded
    s = lab.session(id=s.id)  # resumed: re-read from the store
    t = s.turn(2)
    assert t.observation is not None and t.observation.cache_read == t.usage.cache_read_input_tokens
    df = pc.resimulate(s, cache="anthropic")
    assert list(df.cache_read_input_tokens) == list(s.turns().cache_read_input_tokens)
    assert pc.rebuilds(s).empty


def test_calibrations_round_trip_through_the_store(tmp_path: Path) -> None:
    with pc.Lab(tmp_path / "cal.duckdb", progress=False) as lab:
        cal = pc.analysis.Calibration("claude-sonnet-4-5", 1.1, 12.0, 5, 1.0, 2.0, 8.0, 1.5,
                             tokenizer=lab.tokenizer.name, fitted_at=T0)
        cal.save(lab, force=True)  # a hand-built calibration of 5 requests: refused unless forced
        assert lab.store.saved_calibrations() == [("claude-sonnet-4-5", lab.tokenizer.name)]
        assert pc.analysis.load_calibration(lab, "claude-sonnet-4-5") == cal
        assert lab.store.measured_models() == [] and lab.store.measured_totals() == []
