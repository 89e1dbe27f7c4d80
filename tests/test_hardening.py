"""Issue 15 regressions: hard links, one transaction per event, Ctrl-C around COMMIT, foreign and read-only stores,
scenario files that escape their directory, lone surrogates, and `del lab` releasing the file."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import duckdb
import pytest

import promptcache_nb as pc
from promptcache_nb.cli import main
from promptcache_nb.store import _migrations

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SURROGATE = "caf\udce9"  # what bytes(b"caf\xe9").decode("utf-8", "surrogateescape") gives


def _turns(lab: pc.Lab, session_id: str) -> int:
    return lab.store.one("SELECT count(*) FROM turns WHERE session_id = ?", [session_id])[0]


def _pending(lab: pc.Lab, session_id: str) -> list[str]:
    return [r[0] for r in lab.store.rows(
        "SELECT code FROM session_pending_events WHERE session_id = ? ORDER BY seq", [session_id])]


# -- 1. hard links ---------------------------------------------------------------------------------------
def test_a_hard_link_is_the_same_store(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    lab = pc.Lab(a, progress=False)  # the file did not exist: the guard re-keys on its inode once created
    s = lab.session(system="sys")
    s.step("hi", reply="yo", at=T0)
    os.link(a, b)
    with pytest.raises(pc.StoreLockedError, match="another pc.Lab in this process"):
        pc.Lab(b, progress=False)
    lab.close()
    with pc.Lab(b, progress=False) as lab2:  # closed: the other name opens the same turns
        assert lab2.sql("SELECT count(*) AS n FROM turns").n[0] == 1


def test_a_symlink_is_the_same_store(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    with pc.Lab(a, progress=False):
        os.symlink(a, b)
        with pytest.raises(pc.StoreLockedError):
            pc.Lab(b, progress=False)


# -- 2. an event and its change: one transaction -----------------------------------------------------------
def _fail_on_last_write(monkeypatch, store, edit):
    def boom(*args, **kwargs):
        raise RuntimeError("killed between the change and its event")

    # the last write of the edit's transaction fails, after the others went through: the state row for an edit
    # of the state (its pending event is written before it), else the pending event (the change is written before)
    monkeypatch.setattr(store, "write_state" if edit in ("tools", "model", "prompt") else "add_pending_events", boom)


@pytest.mark.parametrize("edit", ["add", "update", "remove", "compact", "tools", "model", "prompt"])
def test_a_failed_event_leaves_neither_change_nor_event(monkeypatch, edit):
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host", tools=[{"name": "a", "description": "A", "input_schema": {}}])
        kid = s.knowledge.add("T", "C")
        s.step("hi", reply="yo", at=T0)
        before = (lab.sql("SELECT * FROM knowledge ORDER BY id, version").to_dict("records"),
                  lab.sql("SELECT seq, compacted FROM session_messages ORDER BY seq").to_dict("records"),
                  _pending(lab, s.id), s.pending_events, s.messages, s.host_prompt, s.tools, s.model)
        _fail_on_last_write(monkeypatch, lab.store, edit)
        act = {
            "add": lambda: s.knowledge.add("T2", "C2"),
            "update": lambda: s.knowledge.update(kid, content="new"),
            "remove": lambda: s.knowledge.remove(kid),
            "compact": lambda: s.compact("we talked"),
            "tools": lambda: s.set_tools([]),
            "model": lambda: s.switch_model("claude-haiku-4-5"),
            "prompt": lambda: s.edit_host_prompt(append=" more"),
        }[edit]
        with pytest.raises(RuntimeError):
            act()
        monkeypatch.undo()
        after = (lab.sql("SELECT * FROM knowledge ORDER BY id, version").to_dict("records"),
                 lab.sql("SELECT seq, compacted FROM session_messages ORDER BY seq").to_dict("records"),
                 _pending(lab, s.id), s.pending_events, s.messages, s.host_prompt, s.tools, s.model)
        assert after == before
        assert len(s.knowledge) == 1
        act()  # and it works once the store does
        t = s.step("again", reply="ok")
        assert t.events and _turns(lab, s.id) == 2


def test_a_knowledge_edit_and_its_event_survive_a_restart_together(tmp_path):
    path = tmp_path / "k.duckdb"
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(system="host")
        s.step("hi", reply="yo", at=T0)
        s.knowledge.add("T", "C")
        sid = s.id
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(id=sid)
        assert len(s.knowledge) == 1 and s.pending_events[0].startswith("knowledge_add:")


# -- 3. Ctrl-C around COMMIT -------------------------------------------------------------------------------
class _InterruptingCommit:
    """The connection, except that one COMMIT is followed (or preceded) by a KeyboardInterrupt."""

    def __init__(self, con, *, before: bool = False, error: BaseException | None = None) -> None:
        self._con, self._before, self._error, self.armed = con, before, error, True

    def commit(self):
        if self.armed:
            self.armed = False
            if self._error is not None:
                raise self._error
            if self._before:
                raise KeyboardInterrupt
            self._con.commit()
            raise KeyboardInterrupt  # as if the signal landed the moment COMMIT returned
        return self._con.commit()

    def __getattr__(self, name):
        return getattr(self._con, name)


def _arm(lab, **kw):
    real = lab.store.con
    lab.store.con = _InterruptingCommit(real, **kw)
    return real


@pytest.mark.parametrize("how", ["step", "tool_loop", "record", "knowledge", "compact"])
def test_ctrl_c_right_after_commit_keeps_kernel_and_store_in_step(how):
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host " * 50)
        s.step("first", reply="one", at=T0)
        _arm(lab)
        with pytest.raises(KeyboardInterrupt):
            if how == "step":
                s.step("second", reply="two")
            elif how == "tool_loop":
                s.step("second", reply="two", tool_calls=[{"name": "t", "input": {}, "result": "r"}])
            elif how == "record":
                s.record(s.last_turn.request)
            elif how == "knowledge":
                s.knowledge.add("T", "C")
            else:
                s.compact("summary")
        assert s.n_turns == _turns(lab, s.id)
        if how == "knowledge":
            assert len(s.knowledge) == 1 and s.pending_events[0].startswith("knowledge_add")
        if how == "compact":
            assert s.pending_events == ("compaction",) and len(s.messages) == 2
        t = s.step("next", reply="fine")  # no duplicate key, no stale dedup set
        assert t.index == s.n_turns - 1 == _turns(lab, s.id) - 1
        assert lab.sql("SELECT count(*) AS n FROM blocks").n[0] == lab.sql(
            "SELECT count(DISTINCT hash) AS n FROM blocks").n[0]
        s.restart().step("after a restart", reply="still fine")


@pytest.mark.parametrize("how", ["interrupt", "error"])
def test_an_interrupt_or_error_before_commit_rolls_back(how):
    error = duckdb.TransactionException("commit failed") if how == "error" else None
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host")
        s.step("first", reply="one", at=T0)
        _arm(lab, before=True, error=error)
        raised = KeyboardInterrupt if error is None else pc.errors.StoreError
        with pytest.raises(raised):
            s.step("second", reply="two")
        assert s.n_turns == _turns(lab, s.id) == 1
        assert s.step("second", reply="two").index == 1


# -- 7. foreign, read-only and half-migrated stores --------------------------------------------------------
def test_a_failed_first_migration_leaves_nothing(tmp_path, monkeypatch):
    def m001_broken(con):
        con.execute("CREATE TABLE half_done (x INT)")
        raise duckdb.CatalogException("boom")

    monkeypatch.setattr(_migrations, "MIGRATIONS", [m001_broken])
    path = tmp_path / "m.duckdb"
    with pytest.raises(pc.errors.StoreError, match="could not be migrated: .*boom"):
        pc.Lab(path, progress=False)
    con = duckdb.connect(str(path))
    assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == []  # not even _migrations
    con.close()


def test_read_only_lab_reads_and_refuses_writes(tmp_path):
    path = tmp_path / "r.duckdb"
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(system="host")
        s.step("hi", reply="yo", at=T0)
        sid = s.id
    data = path.read_bytes()
    with pc.Lab(path, progress=False, read_only=True) as lab:
        assert lab.read_only
        s = lab.session(id=sid)
        assert s.turn(0).request["messages"][0]["content"][0]["text"] == "hi"
        with pytest.raises(pc.errors.StoreError, match="read-only"):
            s.step("more", reply="no")
        with pytest.raises(pc.errors.StoreError, match="read-only"):
            lab.session(system="new")
        with pytest.raises(pc.errors.StoreError, match="read-only"):
            lab.sql("DELETE FROM turns")
        assert s.n_turns == 1
    assert path.read_bytes() == data


def test_read_only_never_creates_or_migrates(tmp_path):
    missing = tmp_path / "missing.duckdb"
    with pytest.raises(pc.errors.StoreError, match="does not exist"):
        pc.Lab(missing, read_only=True)
    assert not missing.exists()
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    data = empty.read_bytes()
    with pc.Lab(empty, read_only=True) as lab:
        assert lab.store.migrations() == []
    assert empty.read_bytes() == data


def test_cli_sql_is_read_only(tmp_path, capsys):
    missing = tmp_path / "nope.duckdb"
    assert main(["sql", str(missing), "select 1"]) == 2
    assert not missing.exists()
    assert "does not exist" in capsys.readouterr().err
    db = tmp_path / "s.duckdb"
    with pc.Lab(db, progress=False) as lab:
        lab.session(system="host").step("hi", reply="yo", at=T0)
    data = db.read_bytes()
    assert main(["sql", str(db), "select count(*) as n from turns"]) == 0
    assert main(["sql", str(db), "delete from turns"]) == 2
    assert "read-only" in capsys.readouterr().err
    assert db.read_bytes() == data


# -- 6. scenario files stay in their directory -------------------------------------------------------------
def test_allow_outside_opts_in(tmp_path):
    outside = tmp_path / "prompt.md"
    outside.write_text("You help.\n")
    (tmp_path / "sc").mkdir()
    sc = tmp_path / "sc" / "s.yaml"
    sc.write_text("model: claude-sonnet-4-5\nhost_prompt_file: ../prompt.md\nturns:\n  - {user: hi, reply: yo}\n")
    with pytest.raises(pc.errors.ScenarioError, match=r"s\.yaml:2: host_prompt_file: '\.\./prompt\.md' resolves outside"):
        pc.load_scenario(sc)
    assert pc.load_scenario(sc, allow_outside=True).host_prompt == "You help.\n"


# -- 10. lone surrogates -----------------------------------------------------------------------------------
def test_lone_surrogates_are_refused_at_the_boundary():
    with pc.Lab(progress=False) as lab:
        with pytest.raises(pc.errors.SessionError, match="lab.session: system contains a lone surrogate"):
            lab.session(system=SURROGATE)
        s = lab.session(system="host")
        s.step("hi", reply="yo", at=T0)
        for call, match in [
            (lambda: s.step(SURROGATE, reply="yo"), "turn 1: user contains a lone surrogate"),
            (lambda: s.step("hi", reply=SURROGATE), "turn 1: reply"),
            (lambda: s.step("hi", reply="yo", tool_calls=[{"name": "t", "input": {"q": SURROGATE}, "result": "r"}]),
             "turn 1: tool_calls"),
            (lambda: s.edit_host_prompt(SURROGATE), "edit_host_prompt: text"),
            (lambda: s.edit_host_prompt(append=SURROGATE), "edit_host_prompt: append"),
            (lambda: s.set_tools([{"name": SURROGATE}]), "set_tools: tools"),
            (lambda: s.compact(SURROGATE), "compact: summary"),
        ]:
            with pytest.raises(pc.errors.SessionError, match=match) as info:
                call()
            assert "\n" not in str(info.value)
        for call in (lambda: s.knowledge.add(SURROGATE, "c"), lambda: s.knowledge.add("t", "c", category=SURROGATE)):
            with pytest.raises(pc.errors.KnowledgeError, match="knowledge.add: .* lone surrogate"):
                call()
        kid = s.knowledge.add("t", "c")
        with pytest.raises(pc.errors.KnowledgeError, match="knowledge.update: content contains a lone surrogate"):
            s.knowledge.update(kid, content=SURROGATE)
        # nothing changed: the prompt, the events, the store; the next step works
        assert s.host_prompt == "host" and s.pending_events[-1].startswith("knowledge_add")
        assert s.step("next", reply="fine").index == 1


# -- 13. `del lab` releases the file -----------------------------------------------------------------------
def test_del_lab_releases_the_file_without_gc(tmp_path):
    path = tmp_path / "d.duckdb"
    gc.collect()
    gc.disable()
    try:
        lab = pc.Lab(path, progress=False)
        s = lab.session(system="host")
        s.knowledge.add("T", "C")
        s.step("hi", reply="yo", at=T0)
        s = s.restart()
        s.step("again", reply="ok")
        del s, lab
        probe = textwrap.dedent(f"""
            import duckdb
            duckdb.connect({str(path)!r}).close()
        """)
        # another process can take the file's lock: nothing in this one still holds it
        subprocess.run([sys.executable, "-c", probe], check=True, timeout=60, capture_output=True)
        with pc.Lab(path, progress=False) as lab:
            assert lab.sql("SELECT count(*) AS n FROM turns").n[0] == 2
    finally:
        gc.enable()


def test_a_session_keeps_its_lab_alive():
    s = pc.Lab(progress=False).session(system="host")
    gc.collect()
    assert s.step("hi", reply="yo", at=T0 + timedelta(seconds=1)).index == 0
