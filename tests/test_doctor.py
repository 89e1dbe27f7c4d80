"""Tampered stores: refused on open, or at first use, with one line naming the table, column or hash and the
``promptcache-nb doctor FILE`` command, which checks a store in full and lists what is wrong."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

import promptcache_nb as pc
from promptcache_nb.cli import main
from promptcache_nb.errors import StoreError
from promptcache_nb.store import check_store

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "promptcache_nb" / "data" / "scenarios" / "tiny.yaml"


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("doctor") / "sound.duckdb"
    with pc.Lab(path, progress=False) as lab:
        lab.replay(pc.load_scenario(TINY), strategy="naive")
    return path


@pytest.fixture
def store(sound, tmp_path) -> Path:
    path = tmp_path / "store.duckdb"
    shutil.copy(sound, path)
    return path


def tamper(path: Path, *statements: str) -> None:
    con = duckdb.connect(str(path))
    for sql in statements:
        con.execute(sql)
    con.close()


def session_id(path: Path) -> str:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT id FROM sessions LIMIT 1").fetchall()[0][0]
    finally:
        con.close()


def one_line_naming(exc: pytest.ExceptionInfo, *words: str) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    assert f"promptcache-nb doctor {exc.value.args[0].split(chr(39))[1]}" in text, text
    for word in words:
        assert word in text, (word, text)
    return text


def test_doctor_says_a_sound_store_is_sound(store, capsys):
    report = check_store(str(store))
    assert report.ok and report.problems == []
    assert report.counts["sessions"] == 1 and report.counts["turns"] > 0
    assert main(["doctor", str(store)]) == 0
    out = capsys.readouterr().out
    assert "ok: no problem found" in out and "1 sessions" in out


@pytest.mark.parametrize(("statements", "words"), [
    (["ALTER TABLE turns DROP COLUMN cache_reason"], ["turns.cache_reason", "missing"]),
    (["DROP TABLE session_state"], ["'session_state'", "missing"]),
    (["DELETE FROM _migrations"], ["_migrations", "m001_initial"]),
])
def test_a_store_missing_what_the_code_relies_on_is_refused_on_open(store, statements, words):
    tamper(store, *statements)
    for read_only in (False, True):
        with pytest.raises(StoreError) as exc:
            pc.Lab(store, progress=False, read_only=read_only)
        one_line_naming(exc, *words)
        assert "another application" not in str(exc.value)
    assert not check_store(str(store)).ok


def test_an_emptied_migrations_table_is_not_called_another_application(store):
    tamper(store, "DELETE FROM _migrations")
    with pytest.raises(StoreError) as exc:
        pc.Lab(store, progress=False)
    assert "damaged" in str(exc.value) and "another application" not in str(exc.value)
    # and nothing was migrated on top of it
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT count(*) FROM _migrations").fetchall() == [(0,)]
    con.close()


def _null_message_block(store: Path) -> str:
    con = duckdb.connect(str(store))
    ref = con.execute("SELECT message FROM session_messages ORDER BY seq LIMIT 1").fetchall()[0][0]
    con.close()
    import json

    ref = json.loads(ref)
    return ref["str"] if "str" in ref else ref["blocks"][0]


def test_a_null_block_body_is_a_store_error_naming_the_hash(store):
    h = _null_message_block(store)
    tamper(store, "CREATE TABLE b2 AS SELECT * FROM blocks", "DROP TABLE blocks",
           "ALTER TABLE b2 RENAME TO blocks", f"UPDATE blocks SET body = NULL WHERE hash = '{h}'")
    sid = session_id(store)
    with pc.Lab(store, progress=False) as lab:
        with pytest.raises(StoreError) as exc:
            lab.session(id=sid).messages  # noqa: B018 - the read is the test
        one_line_naming(exc, h, "NULL body")
    problems = check_store(str(store)).problems
    assert any("blocks.body holds 1 NULL" in p for p in problems), problems


def test_a_deleted_block_is_a_store_error_naming_the_hash(store):
    h = _null_message_block(store)
    tamper(store, f"DELETE FROM blocks WHERE hash = '{h}'")
    sid = session_id(store)
    with pc.Lab(store, progress=False) as lab:
        with pytest.raises(StoreError) as exc:
            lab.session(id=sid).messages  # noqa: B018
        one_line_naming(exc, h, "missing from table blocks")
    problems = check_store(str(store)).problems
    assert any("session_messages block not in blocks" in p and h in p for p in problems), problems


def test_a_deleted_prefix_block_is_a_store_error_when_a_body_is_rebuilt(store):
    con = duckdb.connect(str(store))
    h = con.execute("SELECT block_hash FROM prefix_nodes ORDER BY depth LIMIT 1").fetchall()[0][0]
    con.execute("DELETE FROM blocks WHERE hash = ?", [h])
    con.close()
    sid = session_id(store)
    with pc.Lab(store, progress=False, read_only=True) as lab, pytest.raises(StoreError) as exc:
        lab.store.turn_body(sid, 0)
    one_line_naming(exc, h, "prefix_nodes.block_hash")


@pytest.mark.parametrize("config", ["[1, 2]", '"text"', "3"])
def test_a_session_config_that_is_not_an_object_is_a_store_error(store, config):
    tamper(store, f"UPDATE sessions SET config = '{config}'")
    sid = session_id(store)
    with pc.Lab(store, progress=False) as lab:
        with pytest.raises(StoreError) as exc:
            lab.session(id=sid)
        one_line_naming(exc, "sessions.config", sid, "not a JSON object")
    assert any("sessions.config not a JSON object" in p for p in check_store(str(store)).problems)


def test_doctor_cli_lists_every_problem_and_exits_1(store, capsys):
    h = _null_message_block(store)
    tamper(store, f"DELETE FROM blocks WHERE hash = '{h}'", "UPDATE sessions SET config = '[]'",
           "ALTER TABLE turns DROP COLUMN notes")
    assert main(["doctor", str(store)]) == 1
    out = capsys.readouterr().out
    assert "turns.notes is missing" in out and h in out and "sessions.config" in out
    assert "4 problems found" in out  # the deleted block was a prefix node's too


def test_doctor_never_changes_the_file_and_refuses_non_stores_in_one_line(store, tmp_path, capsys):
    before = store.read_bytes()
    check_store(str(store))
    assert store.read_bytes() == before
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert main(["doctor", str(text)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a DuckDB database" in err


def test_doctor_is_a_documented_cli_command():
    out = subprocess.run([sys.executable, "-m", "promptcache_nb.cli", "doctor", "--help"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert "read-only" in out


@pytest.mark.parametrize("where", ["parent IS NULL", "true"])
def test_deleted_prefix_nodes_are_a_store_error_when_a_session_resumes(store, where):
    tamper(store, f"DELETE FROM prefix_nodes WHERE {where}")
    sid = session_id(store)
    with pc.Lab(store, progress=False) as lab, pytest.raises(StoreError) as exc:
        lab.session(id=sid)
    one_line_naming(exc, "prefix node", "missing from prefix_nodes")
    assert any("prefix_nodes" in p for p in check_store(str(store)).problems)


def test_a_deleted_rest_block_is_a_store_error_when_a_session_resumes(store):
    con = duckdb.connect(str(store))
    h = con.execute("SELECT rest_hash FROM turns ORDER BY idx LIMIT 1").fetchall()[0][0]
    con.execute("DELETE FROM blocks WHERE hash = ?", [h])
    con.close()
    sid = session_id(store)
    with pc.Lab(store, progress=False) as lab, pytest.raises(StoreError) as exc:
        lab.session(id=sid)
    one_line_naming(exc, h, "turns.rest_hash")
