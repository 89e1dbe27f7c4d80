"""``knowledge.add`` at scale (issue 15 item 12): pending events are rows (``session_pending_events``, m008), entry
ids come from a per-project counter, the Lab's knowledge list follows each change instead of being read again,
and ``knowledge.add_many`` writes a batch in one transaction."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

import promptcache_nb as pc
from promptcache_nb._util import digest
from promptcache_nb.request import canonical_json
from promptcache_nb.scenario import KnowledgeSpec
from promptcache_nb.store import MIGRATIONS, KnowledgeEntry

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
ENTRIES = [{"title": f"Entry {i}", "content": f"Content {i}", "category": "fact" if i % 2 else "note",
            "key": f"k{i}"} for i in range(30)]


def _rows(lab: pc.Lab) -> list[dict]:
    return lab.sql("SELECT * FROM knowledge ORDER BY id, version").to_dict("records")


def _pending_rows(lab: pc.Lab, session_id: str) -> list[str]:
    return [r[0] for r in lab.store.rows(
        "SELECT code FROM session_pending_events WHERE session_id = ? ORDER BY seq", [session_id])]


def _expected_id(project: str, number: int, title: str) -> str:
    return digest(f"{project}\x1f{number}\x1f{title}".encode(), tag="ltm")[:26]


# -- add_many ---------------------------------------------------------------------------------------------
def test_add_many_is_add_for_each_in_one_transaction():
    with pc.Lab(progress=False) as one, pc.Lab(progress=False) as many:
        a = one.session(system="host", project="p")
        b = many.session(system="host", project="p")
        ids = [a.knowledge.add(**e, at=T0) for e in ENTRIES]
        commits = many.store.commit_count
        assert b.knowledge.add_many(ENTRIES, at=T0) == ids
        assert many.store.commit_count == commits + 1
        assert _rows(one) == _rows(many)
        assert a.pending_events == b.pending_events == tuple(f"knowledge_add:{i[:8]}" for i in ids)
        assert _pending_rows(many, b.id) == list(b.pending_events)
        assert b.knowledge.list() == many.store.knowledge("p") == a.knowledge.list()
        # the next request sees the same book and the same events
        assert a.step("hi", reply="yo").body == b.step("hi", reply="yo").body
        assert b.knowledge.add_many([]) == [] and b.pending_events == ()


def test_add_many_takes_dicts_entries_and_specs():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host")
        entry = KnowledgeEntry("x", "elsewhere", 3, "From an entry", "its content", "gotcha", False, T0, "ek")
        ids = s.knowledge.add_many([{"title": "From a dict", "content": "c"}, entry,
                                    KnowledgeSpec(key="sk", title="From a spec", content="spec content")])
        got = {e.id: e for e in s.knowledge}
        assert [(got[i].title, got[i].category, got[i].key, got[i].version, got[i].project_id) for i in ids] == [
            ("From a dict", "note", None, 1, "default"), ("From an entry", "gotcha", "ek", 1, "default"),
            ("From a spec", "note", "sk", 1, "default")]
        assert s.knowledge.id_for("sk") == ids[2]


@pytest.mark.parametrize(("bad", "message"), [
    ({"title": "T", "content": "C", "categroy": "fact"}, r"entries\[2\]: unknown field 'categroy'"),
    ({"title": "T"}, r"entries\[2\]: content is required"),
    ({"title": " ", "content": "C"}, r"entries\[2\]: knowledge entries need a non-empty title and content"),
    ({"title": "caf\udce9", "content": "C"}, r"entries\[2\]: title contains a lone surrogate"),
    ({"title": "T", "content": 5}, r"entries\[2\]: content must be a string, not int"),
])
def test_an_invalid_entry_adds_none(bad, message):
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host")
        s.knowledge.add("First", "kept")
        before = (_rows(lab), _pending_rows(lab, s.id), s.pending_events, s.knowledge.list())
        with pytest.raises(pc.errors.KnowledgeError, match=message):
            s.knowledge.add_many([ENTRIES[0], ENTRIES[1], bad, ENTRIES[3]])
        assert (_rows(lab), _pending_rows(lab, s.id), s.pending_events, s.knowledge.list()) == before


def test_add_many_of_ten_thousand():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host")
        ids = s.knowledge.add_many({"title": f"T{i}", "content": f"C{i}"} for i in range(10_000))
        assert len(set(ids)) == 10_000 == len(s.knowledge) == len(s.pending_events)
        assert lab.store.knowledge_count("default") == 10_000
        assert s.knowledge.list() == lab.store.knowledge("default")
        t = s.step("hi", reply="yo")
        assert len(t.events) == 10_000 and _pending_rows(lab, s.id) == [] and s.pending_events == ()


# -- ids without a scan, and the Lab's list kept up to date --------------------------------------------------
def test_ids_number_every_entry_ever_added():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host", project="p")
        first = [s.knowledge.add(f"T{i}", "C") for i in range(3)]
        s.knowledge.remove(first[1])
        later = s.knowledge.add("T3", "C")
        assert first + [later] == [_expected_id("p", n, f"T{n}") for n in range(4)]
        other = lab.session(system="host", project="p")  # a second session of the project shares the numbering
        assert other.knowledge.add("T4", "C") == _expected_id("p", 4, "T4")


def test_an_add_runs_the_same_statements_however_big_the_book():
    statements: list[str] = []
    with pc.Lab(progress=False, trace=lambda sql, params: statements.append(" ".join(sql.split()))) as lab:
        s = lab.session(system="host")
        s.knowledge.add_many({"title": f"T{i}", "content": "C"} for i in range(2_000))
        s.knowledge.add("small", "C")
        len(s.knowledge)  # read once

        def one_add(title: str) -> list[str]:
            statements.clear()
            s.knowledge.add(title, "C")
            assert len(s.knowledge) == lab.store.knowledge_count("default")
            return statements[:-1]  # the count above

        at_2k = one_add("at 2k")
        s.knowledge.add_many({"title": f"U{i}", "content": "C"} for i in range(3_000))
        at_5k = one_add("at 5k")
    assert at_2k == at_5k
    assert not any("count(" in q or "session_state" in q or "FROM knowledge" in q for q in at_5k), at_5k


def test_the_labs_list_follows_each_change_without_a_reload(monkeypatch):
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host", project="p")
        ids = s.knowledge.add_many(ENTRIES)
        held = s.knowledge.list()
        snapshot = list(held)

        def no_reload(*args, **kwargs):
            raise AssertionError("the whole book was read again")

        monkeypatch.setattr(lab.store, "knowledge", no_reload)
        new = s.knowledge.add("Zeta", "new entry")
        s.knowledge.update(ids[3], content="changed")
        s.knowledge.remove(ids[5])
        s.knowledge.add_many([{"title": f"More {i}", "content": "C"} for i in range(12)])  # the bulk path
        s.step("hi", reply="yo")
        current = s.knowledge.list()
        assert held == snapshot  # a list handed out before never changes under its holder
        monkeypatch.undo()
        assert current == lab.store.knowledge("p")  # same entries, same order (by id)
        assert new in {e.id for e in current} and ids[5] not in {e.id for e in current}
        assert s.knowledge.get(ids[3]).content == "changed" and len(current) == len(ENTRIES) + 12


# -- rollbacks and restarts ----------------------------------------------------------------------------------
def _observed(lab: pc.Lab, s: pc.Session) -> tuple:
    return (_rows(lab), _pending_rows(lab, s.id), s.pending_events, s.knowledge.list(), len(s.knowledge))


@pytest.mark.parametrize("how", ["add", "add_many"])
def test_a_rolled_back_add_leaves_neither_row_nor_event_nor_cache(how):
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host", project="p")
        s.knowledge.add("First", "C")
        before = _observed(lab, s)
        with pytest.raises(RuntimeError, match="the turn failed"), lab.atomic():
            if how == "add":
                s.knowledge.add("Second", "C")
            else:
                s.knowledge.add_many(ENTRIES)
            assert len(s.knowledge) > 1 and s.pending_events[-1].startswith("knowledge_add:")  # seen inside
            raise RuntimeError("the turn failed")
        assert _observed(lab, s) == before
        # the numbering went back too: the entry is added again under the id it had
        assert s.knowledge.add("Second", "C") == _expected_id("p", 1, "Second")


def test_a_failed_add_changes_nothing_in_memory(monkeypatch):
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host", project="p")
        s.knowledge.add("First", "C")
        held = s.knowledge.list()
        before = _observed(lab, s)

        def boom(*args, **kwargs):
            raise RuntimeError("killed between the entry and its event")

        monkeypatch.setattr(lab.store, "add_pending_events", boom)
        with pytest.raises(RuntimeError):
            s.knowledge.add("Second", "C")
        with pytest.raises(RuntimeError):
            s.knowledge.add_many(ENTRIES)
        monkeypatch.undo()
        assert _observed(lab, s) == before and s.knowledge.list() is held
        assert s.knowledge.add("Second", "C") == _expected_id("p", 1, "Second")


def test_entries_and_events_survive_a_reopen_and_the_request_consumes_them(tmp_path):
    path = tmp_path / "k.duckdb"
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(system="host", project="p")
        s.step("hi", reply="yo", at=T0)
        s.knowledge.add("One", "C")
        s.knowledge.add_many(ENTRIES[:3])
        s.set_tools([{"name": "t", "description": "T", "input_schema": {"type": "object"}}])
        pending, sid = s.pending_events, s.id
    assert len(pending) == 5 and pending[-1] == "tools"
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(id=sid)
        assert s.pending_events == pending and len(s.knowledge) == 4
        assert s.knowledge.add("Five", "C") == _expected_id("p", 4, "Five")  # counted from the store
        t = s.step("next", reply="ok")
        assert t.events[:5] == list(pending) and t.events[5].startswith("knowledge_add:")
        assert _pending_rows(lab, sid) == [] and s.pending_events == ()
        assert lab.active_session(sid) is s and s.restart().pending_events == ()


def test_a_batch_consumes_the_events_it_recorded():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="host")
        first = s.step("hi", reply="yo", at=T0)
        with lab.batch():  # inserts deferred to the end of the block: the events' rows are not
            s.knowledge.add("T", "C")
            t = s.record(first.request)
        assert t.events[0].startswith("knowledge_add:") and _pending_rows(lab, s.id) == []
        assert s.restart().pending_events == ()


# -- m008: stores written by the previous version -------------------------------------------------------------
def test_migrations_apply_in_name_order():
    names = [fn.__name__ for fn in MIGRATIONS]
    assert names == sorted(names) and "m008_pending_events" in names


def _as_previous_version(path, pending: dict[str, list[str]]) -> None:
    """Rewrite a store into the shape the code before m008 wrote: pending events in session_state.extra."""
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("DROP TABLE session_pending_events")
    con.execute("DELETE FROM _migrations WHERE name = 'm008_pending_events'")
    for sid, codes in pending.items():
        extra = json.loads(con.execute("SELECT extra FROM session_state WHERE session_id = ?", [sid]).fetchone()[0])
        con.execute("UPDATE session_state SET extra = ? WHERE session_id = ?",
                    [canonical_json({**extra, "_pending_events": codes}), sid])
    con.close()


def _play(lab: pc.Lab, strategy: str) -> tuple[pc.Session, pc.Session]:
    s = lab.session(strategy, system="host", project="p")
    s.step("hi", reply="yo", at=T0)
    idle = lab.session(strategy, system="host", project="q")
    s.knowledge.add("Refunds", "Automatic within 30 days.", key="refunds")
    s.knowledge.update(s.knowledge.id_for("refunds"), content="Automatic within 14 days.")
    s.edit_host_prompt(append=" More.")
    return s, idle


@pytest.mark.parametrize("strategy", ["durable_delta", "naive"])
def test_a_store_of_the_previous_version_keeps_its_pending_events(tmp_path, strategy):
    path = tmp_path / "old.duckdb"
    with pc.Lab(path, progress=False) as lab:
        s, idle = _play(lab, strategy)
        sid, pending = s.id, list(s.pending_events)
        # the events are rows: session_state's extra never holds them
        assert _pending_rows(lab, sid) == pending
        assert "_pending_events" not in lab.store.one("SELECT extra FROM session_state WHERE session_id = ?", [sid])[0]
    _as_previous_version(path, {sid: pending, idle.id: []})
    with pc.Lab(path, progress=False) as lab:
        assert "m008_pending_events" in lab.store.migrations_applied_now
        assert _pending_rows(lab, sid) == pending and _pending_rows(lab, idle.id) == []
        extras = [json.loads(r[0]) for r in lab.store.rows("SELECT extra FROM session_state")]
        assert extras and not any("_pending_events" in e for e in extras)
        s = lab.session(id=sid)
        assert list(s.pending_events) == pending
        migrated = s.step("next", reply="ok")
        assert _pending_rows(lab, sid) == []
    with pc.Lab(progress=False) as lab:  # the same edits, never migrated
        s, _ = _play(lab, strategy)
        fresh = s.step("next", reply="ok")
    assert migrated.body == fresh.body and migrated.events == fresh.events == pending
