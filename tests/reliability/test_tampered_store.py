"""Issue 41: reads that follow stored links stop at a tampered store with one line. A ``prefix_nodes`` chain
that runs in a cycle (it looped until MemoryError) and a block body that is not JSON (a JSONDecodeError
traceback) are a :class:`StoreError` naming the table and row, and ``promptcache-nb doctor`` reports both (it
said "ok")."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

import promptcache_nb as pc
from promptcache_nb.cli import main
from promptcache_nb.errors import StoreError
from promptcache_nb.store import check_store
from promptcache_nb.store._doctor import node_on_cycle

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "promptcache_nb" / "data" / "scenarios" / "tiny.yaml"


@pytest.fixture(scope="module")
def sound(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tampered") / "sound.duckdb"
    with pc.Lab(path, progress=False) as lab:
        lab.replay(pc.load_scenario(TINY), strategy="naive")
    return path


@pytest.fixture
def store(sound: Path, tmp_path: Path) -> Path:
    path = tmp_path / "store.duckdb"
    shutil.copy(sound, path)
    return path


def _tamper(path: Path, table: str, update: str) -> None:
    """``UPDATE table SET update``, on a copy of the table without its index (as a hand edit would leave it)."""
    con = duckdb.connect(str(path))
    try:
        con.execute(f"CREATE TABLE t2 AS SELECT * FROM {table}")
        con.execute(f"DROP TABLE {table}")
        con.execute(f"ALTER TABLE t2 RENAME TO {table}")
        con.execute(f"UPDATE {table} SET {update}")
    finally:
        con.close()


def _one(path: Path, sql: str) -> tuple:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()[0]
    finally:
        con.close()


def _one_line(exc: pytest.ExceptionInfo[StoreError], *words: str) -> None:
    text = str(exc.value)
    assert "\n" not in text and "promptcache-nb doctor" in text, text
    for word in words:
        assert word in text, (word, text)


def test_a_cycle_in_prefix_nodes_is_one_store_error_and_doctor_reports_it(store: Path, capsys) -> None:
    sid, last, tail = _one(store, "SELECT session_id, idx, tail_node FROM turns ORDER BY idx DESC LIMIT 1")
    (root,) = _one(store, f"WITH RECURSIVE up(id, parent) AS (SELECT id, parent FROM prefix_nodes WHERE id = '{tail}' "
                          "UNION ALL SELECT p.id, p.parent FROM prefix_nodes p JOIN up ON p.id = up.parent) "
                          "SELECT id FROM up WHERE parent IS NULL")
    assert root != tail
    assert check_store(str(store)).ok
    _tamper(store, "prefix_nodes", f"parent = '{tail}' WHERE id = '{root}'")  # the root's parent: the last tail
    with pc.Lab(store, progress=False, read_only=True) as lab:
        with pytest.raises(StoreError) as exc:
            lab.store.turn_body(sid, last)  # looped until MemoryError before the fix
        _one_line(exc, "prefix_nodes", "cycle", sid)
        with pytest.raises(StoreError) as exc:
            pc.resimulate(lab, sid, cache="anthropic")
        _one_line(exc, "prefix_nodes", "cycle")
    problems = check_store(str(store)).problems
    assert [p for p in problems if "cycle" in p] == [
        p for p in problems if p.startswith("prefix_nodes.parent runs in a cycle (e.g. row ")]
    assert len([p for p in problems if "cycle" in p]) == 1
    assert main(["doctor", str(store)]) == 1
    assert "prefix_nodes.parent runs in a cycle" in capsys.readouterr().out


@pytest.mark.parametrize("which", ["prefix_nodes.block_hash", "turns.rest_hash", "session_messages"])
def test_a_block_body_that_is_not_json_is_one_store_error_and_doctor_reports_it(store: Path, which: str) -> None:
    sid, last = _one(store, "SELECT session_id, max(idx) FROM turns GROUP BY ALL")
    query = {"prefix_nodes.block_hash": "SELECT block_hash FROM prefix_nodes ORDER BY depth DESC LIMIT 1",
             "turns.rest_hash": f"SELECT rest_hash FROM turns WHERE idx = {last}",
             "session_messages": "SELECT coalesce(json_extract_string(message, '$.str'), "
                                 "json_extract_string(message, '$.blocks[0]')) FROM session_messages "
                                 "ORDER BY seq LIMIT 1"}[which]
    (block,) = _one(store, query)
    _tamper(store, "blocks", f"body = '{{not json' WHERE hash = '{block}'")
    with pc.Lab(store, progress=False, read_only=True) as lab, pytest.raises(StoreError) as exc:
        if which == "session_messages":
            lab.session(id=sid).messages  # noqa: B018 - the read is the test
        else:
            lab.store.turn_body(sid, last)  # JSONDecodeError before the fix
    _one_line(exc, block, which, "not JSON")
    problems = check_store(str(store)).problems
    assert f"blocks.body not JSON: 1 row (e.g. {block!r})" in problems


def test_a_resimulation_over_a_body_that_is_not_json_is_one_store_error(store: Path) -> None:
    (sid,) = _one(store, "SELECT id FROM sessions")
    (block,) = _one(store, "SELECT block_hash FROM prefix_nodes ORDER BY depth LIMIT 1")
    _tamper(store, "blocks", f"body = '{{not json' WHERE hash = '{block}'")
    with pc.Lab(store, progress=False, read_only=True) as lab, pytest.raises(StoreError) as exc:
        pc.resimulate(lab, sid, cache="anthropic")
    _one_line(exc, block, "not JSON")


def test_a_lone_surrogate_escape_in_a_body_is_not_called_damaged(store: Path) -> None:
    """Python's JSON reads ``"\\ud800"`` (a message may hold it); DuckDB's json_valid would not."""
    (block,) = _one(store, "SELECT block_hash FROM prefix_nodes ORDER BY depth DESC LIMIT 1")
    _tamper(store, "blocks", f"body = '\"\\ud800\"' WHERE hash = '{block}'")
    assert not [p for p in check_store(str(store)).problems if "not JSON" in p]


def test_node_on_cycle_finds_loops_of_any_length_and_only_them() -> None:
    chain = {"a": (None,), "b": ("a",), "c": ("b",), "d": ("c",), "x": ("gone",)}
    assert node_on_cycle(chain) is None
    assert node_on_cycle({**chain, "a": ("d",)}) in {"a", "b", "c", "d"}
    assert node_on_cycle({"s": ("s",)}) == "s"
    assert node_on_cycle({**chain, "e": ("f",), "f": ("e",)}) in {"e", "f"}
