"""One writer per store file across processes: a second process gets ``pc.StoreLockedError`` naming the file and
the holder, a read-only viewer (``pc.Lab(path, read_only=True)``) works whenever no writer holds the file, beside
other viewers, and the error says why when a writer does."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from _harness import held

import promptcache_nb as pc
from promptcache_nb.cli import main

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "runs.duckdb"
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(system="You are terse.")
        s.step("hello", reply="hi", at=T0)
        s.step("again", reply="yes")
    return path


def _refused(path, **kw) -> pc.StoreLockedError:
    with pytest.raises(pc.StoreLockedError) as info:
        pc.Lab(path, progress=False, **kw)
    err = info.value
    assert err.path == str(path) and repr(str(path)) in str(err) and "\n" not in str(err)
    return err


def test_a_writer_shuts_out_other_writers_and_viewers_and_says_so(store, capsys):
    data = store.read_bytes()
    with held(store, read_only=False) as (pid, seen):
        assert seen == 2
        err = _refused(store)
        assert f"(PID {pid})" in err.holder and "close that Lab" in str(err)
        err = _refused(store, read_only=True)
        assert f"(PID {pid})" in err.holder
        assert "open for writing" in str(err) and "read_only=True included" in str(err)
        assert main(["sql", str(store), "select count(*) from turns"]) == 2  # the CLI's read-only open
        assert f"PID {pid}" in capsys.readouterr().err
    with pc.Lab(store, progress=False, read_only=True) as lab:  # the writer is gone: viewing works
        assert lab.sql("SELECT count(*) AS n FROM turns").n[0] == 2
    assert store.read_bytes() == data


def test_read_only_viewers_open_side_by_side_and_hold_off_a_writer(store):
    with held(store, read_only=True) as (pid, seen):
        assert seen == 2
        with pc.Lab(store, progress=False, read_only=True) as lab:  # a second viewer, in another process
            s = lab.session(id=lab.sessions().id[0])
            assert [s.turn(i).request["messages"][-1]["content"][0]["text"] for i in range(2)] == ["hello", "again"]
        err = _refused(store)  # a writer waits for the viewers
        assert f"(PID {pid})" in err.holder and "-readonly" not in str(err)  # not DuckDB's CLI advice
        assert "a read-only viewer" in str(err) and "read_only=True" in str(err)
    with pc.Lab(store, progress=False) as lab:  # every viewer closed: writing works again
        s = lab.session(id=lab.sessions().id[0])
        assert s.step("third", reply="ok").index == 2
