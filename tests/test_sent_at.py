"""``turns.sent_at`` (m011_sent_at): no column is named after an SQL keyword, and stores written before open."""

from __future__ import annotations

import glob
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest

import promptcache_nb as pc
from promptcache_nb.store import _migrations

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _old_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store as promptcache_nb wrote it before m011: migrations up to m010, one request under ``"at"``."""
    older = [m for m in _migrations.MIGRATIONS if m.__name__ < "m011"]
    con = duckdb.connect(str(path))
    with monkeypatch.context() as m:
        m.setattr(_migrations, "MIGRATIONS", older)
        _migrations.migrate(con)
    con.execute("INSERT INTO projects VALUES ('p', ?)", [T0])
    con.execute("INSERT INTO sessions (id, project_id, strategy, cache_model, model, created_at, config) "
                "VALUES ('s1', 'p', NULL, 'anthropic', 'claude-sonnet-4-5', ?, '{}')", [T0])
    con.execute("""INSERT INTO turns (session_id, idx, "at", model, rest_hash, n_segments, total_tokens, body_bytes,
                                      input_tokens, cache_read_input_tokens, cache_creation_input_tokens,
                                      output_tokens, usage_source, ideal_cache_read, cost_usd, events)
                   VALUES ('s1', 0, ?, 'claude-sonnet-4-5', 'r', 0, 1200, 10, 12, 1000, 188, 40, 'imported', 0,
                           0.0012, '[]')""", [T0 + timedelta(seconds=5)])
    con.close()


def test_an_old_store_is_migrated_and_reads_back_sent_at(tmp_path, monkeypatch):
    path = tmp_path / "old.duckdb"
    _old_store(path, monkeypatch)
    with pc.Lab(path, progress=False) as lab:
        assert lab.store.migrations_applied_now[0] == "m011_sent_at"
        df = lab.sql("select session_id, idx, sent_at, cache_read_input_tokens from turns")
        assert df.sent_at[0].to_pydatetime() == T0 + timedelta(seconds=5)
        assert (df.session_id[0], int(df.idx[0]), int(df.cache_read_input_tokens[0])) == ("s1", 0, 1000)
        columns = set(lab.sql("select * from turns limit 0").columns)
        assert "sent_at" in columns and "at" not in columns
        assert lab.sql("select reasoning_tokens from turns").reasoning_tokens.isna().all()  # m012: not reported
    with pc.Lab(path, progress=False) as lab:  # migrated once
        assert lab.store.migrations_applied_now == []


def test_unquoted_select_of_the_time_works(tmp_path):
    with pc.Lab(tmp_path / "new.duckdb", progress=False) as lab:
        s = lab.session(system="You help.")
        s.step("hi", reply="hello", at=T0)
        s.step("again", reply="yes", at=T0 + timedelta(seconds=30))
        df = lab.sql("select session_id, idx, sent_at from turns order by idx")
        assert [t.to_pydatetime() for t in df.sent_at] == [T0, T0 + timedelta(seconds=30)]
        assert list(s.turns().columns).count("sent_at") == 1 and "at" not in s.turns().columns
        assert s.turn(1).at == T0 + timedelta(seconds=30)  # the Python attribute keeps its name


def test_a_read_only_open_of_an_old_store_says_how_to_migrate(tmp_path, monkeypatch, capsys):
    path = tmp_path / "old.duckdb"
    _old_store(path, monkeypatch)
    data = path.read_bytes()
    with pytest.raises(pc.errors.StoreError, match=r"older promptcache_nb .*m011_sent_at.*without read_only"):
        pc.Lab(path, read_only=True)
    assert path.read_bytes() == data  # nothing changed


def test_an_old_fleet_dataset_reads_its_at_column_as_sent_at(tmp_path):
    """Parquet files written before m011 hold ``at``; the dataset's ``turns`` view reads it as ``sent_at``."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "review_bot.jsonl").write_bytes((pc.data_path("logs") / "exchanges" / "review_bot.jsonl").read_bytes())
    out = tmp_path / "ds"
    pc.fleet.import_logs(logs, out=out, progress=False)
    with pc.fleet.open(out, progress=False) as lab:
        want = lab.sql("select session_id, idx, sent_at from turns order by session_id, idx")
    assert len(want) > 1
    con = duckdb.connect()
    for f in glob.glob(str(out / "turns" / "**" / "*.parquet"), recursive=True):
        # as written before m011 (the time under "at") and m012 (no reasoning_tokens)
        con.execute(f"COPY (SELECT * EXCLUDE (reasoning_tokens) RENAME (sent_at AS \"at\") FROM read_parquet('{f}')) "
                    f"TO '{f}.old' (FORMAT parquet)")
        Path(f + ".old").replace(f)
    assert "at" in {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{f}')").fetchall()}
    with pc.fleet.open(out, progress=False) as lab:
        got = lab.sql("select session_id, idx, sent_at from turns order by session_id, idx")
        assert lab.sql("select reasoning_tokens from turns").reasoning_tokens.isna().all()
    assert got.equals(want)
