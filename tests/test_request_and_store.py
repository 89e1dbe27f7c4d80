"""Request segments, canonical bytes, and byte-for-byte reconstruction from the store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import promptcache_nb as pc
from promptcache_nb.request import canonical_bytes, content_hash, prepare
from promptcache_nb.store import MIGRATIONS, Store, migrate

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def test_canonical_bytes_sorted_compact_utf8():
    assert canonical_bytes({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()


def test_segments_paths_and_order():
    body = {
        "model": "claude-sonnet-4-5",
        "tools": [{"name": "a"}, {"name": "b"}],
        "system": [{"type": "text", "text": "s0"}, {"type": "text", "text": "s1"}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        ],
    }
    paths = [s.path for s in prepare(body).segments]
    assert paths == ["tools[0]", "tools[1]", "system[0]", "system[1]", "messages[0].content",
                     "messages[1].content[0]", "messages[1].content[1]"]


def test_content_hash_ignores_cache_control_only():
    a = {"type": "text", "text": "x"}
    assert content_hash(a) == content_hash({**a, "cache_control": {"type": "ephemeral"}})
    assert content_hash(a) != content_hash({"type": "text", "text": "x "})


def test_each_distinct_segment_is_tokenised_once():
    calls = []

    class Counting:
        name = "counting"

        def count(self, text):
            calls.append(text)
            return len(text.split())

    memo = pc.request.SegmentMemo(Counting())
    block = {"type": "text", "text": "the same words"}
    for _ in range(5):
        prepare({"model": "m", "messages": [{"role": "user", "content": [block]}]}, memo=memo, trusted=True)
    assert calls.count("the same words") == 1


BODIES = [
    {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "plain string"}]},
    {"model": "claude-sonnet-4-5", "max_tokens": 0, "system": "a string system", "tools": [],
     "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": []}]},
    {"model": "claude-sonnet-4-5", "max_tokens": 10, "cache_control": {"type": "ephemeral"}, "metadata": {"user_id": "u"},
     "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
     "tools": [{"name": "t", "description": "d", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}],
     "messages": [
         {"role": "user", "content": [{"type": "text", "text": "héllo \u202e bidi \u200b zw"}]},
         {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {"q": "x", "a": [1, 2]}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok", "is_error": True}]},
         {"role": "assistant", "content": []},
     ]},
    # mid-conversation system messages (docs/provider_cache_rules.md#anthropic-mid-conversation-system-messages)
    {"model": "claude-opus-4-8", "max_tokens": 10, "system": "top",
     "messages": [
         {"role": "user", "content": "hi"},
         {"role": "system", "content": "Reply in French."},
         {"role": "assistant", "content": [{"type": "text", "text": "Salut"}]},
         {"role": "user", "content": [{"type": "text", "text": "more"}]},
         {"role": "system", "content": [{"type": "text", "text": "a"},
                                        {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]},
     ]},
]


@pytest.mark.parametrize("body", BODIES)
def test_body_round_trips_byte_for_byte(tmp_path, body):
    with pc.Lab(tmp_path / "rt.duckdb", progress=False) as lab:
        s = lab.session(project="rt")
        t = s.record(body, at=T0)
        sent = t.body
    with pc.Lab(tmp_path / "rt.duckdb", progress=False) as lab:
        rebuilt = lab.session(id=t.session_id).turn(0)
        assert rebuilt.body == sent == canonical_bytes(body)


json_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


def test_round_trip_property():
    """Any body of text messages is rebuilt from the store as it was recorded. One Lab for every example (a
    Lab's setup costs more than the example), each body in a session of its own, so each is rebuilt from its
    own turn 0 while the store also holds, and shares blocks with, every body before it."""
    with pc.Lab(progress=False) as lab:

        @settings(max_examples=40, deadline=None)
        @given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), json_text), min_size=1, max_size=6),
               json_text)
        def round_trips(msgs, system):
            body = {"model": "claude-sonnet-4-5", "max_tokens": 8,
                    "system": [{"type": "text", "text": system or "s"}],
                    "messages": [{"role": "user" if i == 0 else r, "content": [{"type": "text", "text": t}]}
                                 for i, (r, t) in enumerate(msgs)]}
            t = lab.session().record(body, at=T0)
            assert t.index == 0
            assert lab.store.turn_body(t.session_id, 0) == body

        round_trips()


def test_blocks_are_stored_once_across_turns():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host " * 400, project="p")
        for i in range(6):
            s.step(f"q{i}", reply=f"a{i}", at=T0 + timedelta(seconds=10 * i))
        n_blocks = lab.sql("select count(*) n from blocks where kind <> 'rest'").n[0]
        # tools(0) + 12 messages + system blocks (one per distinct minute of the naive clock)
        distinct = lab.sql("select count(distinct hash) n from blocks").n[0]
        assert n_blocks <= 12 + 2
        assert distinct == lab.sql("select count(*) n from blocks").n[0]


def test_migrations_blank_double_and_recorded(tmp_path):
    path = tmp_path / "m.duckdb"
    st1 = Store(path)
    names = [fn.__name__ for fn in MIGRATIONS]
    assert st1.migrations() == names
    assert migrate(st1.con) == []  # idempotent
    st1.close()
    st2 = Store(path)
    assert st2.migrations_applied_now == [] and st2.migrations() == names
    st2.close()


def test_failed_migration_rolls_back(tmp_path):
    import duckdb

    con = duckdb.connect(str(tmp_path / "x.duckdb"))
    migrate(con)  # an existing store: each new migration is its own transaction

    def m999_broken(c):
        c.execute("CREATE TABLE half_done (x INT)")
        raise RuntimeError("boom")

    MIGRATIONS.append(m999_broken)
    try:
        with pytest.raises(RuntimeError):
            migrate(con)
        assert con.execute("select count(*) from information_schema.tables where table_name='half_done'").fetchall()[0][0] == 0
        assert "m999_broken" not in [r[0] for r in con.execute("select name from _migrations").fetchall()]
    finally:
        MIGRATIONS.remove(m999_broken)
        con.close()


def test_an_interrupted_creation_leaves_a_blank_file_that_opens(tmp_path, monkeypatch):
    """A new store gets its migrations in one transaction: a Ctrl-C while it is created (here in its 8th migration)
    leaves no table at all, never a store some migrations short; doctor calls the blank file sound, and it opens."""
    from promptcache_nb.store import _migrations, check_store

    def m008_interrupted(con):
        raise KeyboardInterrupt

    broken = [m008_interrupted if fn.__name__.startswith("m008") else fn for fn in MIGRATIONS]
    monkeypatch.setattr(_migrations, "MIGRATIONS", broken)
    path = tmp_path / "new.duckdb"
    with pytest.raises(KeyboardInterrupt):
        Store(path)
    report = check_store(str(path))
    assert report.ok and report.blank and "blank" in report.lines()[0]
    monkeypatch.setattr(_migrations, "MIGRATIONS", MIGRATIONS)
    st = Store(path)
    assert st.migrations() == [fn.__name__ for fn in MIGRATIONS]
    st.close()
    assert check_store(str(path)).ok and not check_store(str(path)).blank


def test_store_locked_by_another_process(tmp_path):
    path = tmp_path / "locked.duckdb"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import duckdb, sys, time
            con = duckdb.connect({str(path)!r})
            print("ready", flush=True)
            sys.stdin.readline()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(pc.StoreLockedError) as info:
            pc.Lab(path)
        assert str(path) in str(info.value) and "PID" in str(info.value)
        assert "\n" not in str(info.value)
    finally:
        holder.communicate("\n", timeout=10)


def test_failed_step_writes_nothing():
    with pc.Lab(progress=False) as lab:
        s = lab.session(project="p")
        s.record({"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "ok"}]}, at=T0)
        before = {t: lab.sql(f"select count(*) n from {t}").n[0] for t in ("turns", "blocks", "prefix_nodes")}
        bad = {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "text", "text": f"b{i}", "cache_control": {"type": "ephemeral"}} for i in range(5)]}]}
        with pytest.raises(pc.errors.InvalidRequestError) as info:
            s.record(bad, at=T0 + timedelta(seconds=5))
        assert info.value.turn == 1 and "Found 5" in str(info.value)
        after = {t: lab.sql(f"select count(*) n from {t}").n[0] for t in ("turns", "blocks", "prefix_nodes")}
        assert before == after
        # the session goes on
        assert s.record({"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "next"}]},
                        at=T0 + timedelta(seconds=9)).index == 1


def test_turn_rows_are_typed(tmp_path):
    with pc.Lab(tmp_path / "t.duckdb", progress=False) as lab:
        s = lab.session(system="x " * 1200)
        s.step("hi", reply="hello", at=T0)
        cols = dict(lab.sql("select column_name, data_type from information_schema.columns where table_name='turns'")
                    .itertuples(index=False, name=None))
        assert cols["sent_at"] == "TIMESTAMP WITH TIME ZONE"
        assert cols["cache_read_input_tokens"] == "BIGINT"  # m009: a count >= 2**31 stores
        assert cols["usage_source"] == "VARCHAR"
        row = lab.sql("select usage_source, events from turns").iloc[0]
        assert row.usage_source == "simulated" and json.loads(row.events) == []
