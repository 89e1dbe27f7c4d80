"""Sessions created inside ``Store.batch`` are written when the batch ends (an import creates one per file): the
store's own reads and writes of them inside the batch must behave as if they were stored, and a rollback must
leave nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promptcache_nb.store import Store

T0 = datetime(2026, 9, 1, 9, 0, tzinfo=UTC)


def _row(sid: str, at: datetime, project: str = "p") -> dict[str, Any]:
    return {"id": sid, "project_id": project, "strategy": None, "cache_model": "anthropic", "model": "m",
            "created_at": at, "config": {"start": at.isoformat(), "k": 1}, "source": "test:f", "parent_id": None}


def _state(prompt: str = "sys") -> dict[str, Any]:
    return {"host_prompt": prompt, "tools": [], "model": "m", "extra": {}}


def _stored(store: Store, sid: str) -> tuple[Any, ...]:
    return (store.session_row(sid), store.state_row(sid),
            store.one("SELECT updated_at FROM session_state WHERE session_id = ?", [sid]))


def test_batch_sessions_match_sessions_written_one_by_one(tmp_path: Path) -> None:
    one, many = Store(str(tmp_path / "one.duckdb")), Store(str(tmp_path / "many.duckdb"))
    try:
        for store, batched in ((one, False), (many, True)):
            ctx = store.batch() if batched else store.transaction()
            with ctx:
                # out of time order: the project keeps its earliest session's start
                for i, sid in enumerate(("b", "a", "c")):
                    at = T0 + timedelta(minutes=(1, 0, 2)[i])
                    store.ensure_project("p", at)
                    store.create_session(_row(sid, at), _state())
                    if batched:  # seen by the store's own reads before the batch ends
                        assert store.session_row(sid) is not None
                        assert store.existing_sessions([sid, "zz"]) == {sid}
                        assert store.project_exists("p")
                store.update_session_config("a", {"start": T0.isoformat(), "k": 2})
                cols = store.write_state("a", _state("sys2"), T0 + timedelta(minutes=5))
                store.write_state("c", _state("sys3"), T0 + timedelta(minutes=6), previous=cols)
                store.write_state("b", _state(), T0 + timedelta(minutes=7), previous=cols)  # unchanged: no update
            assert store.session_ids() == ["a", "b", "c"]
        for sid in ("a", "b", "c"):
            assert _stored(many, sid) == _stored(one, sid)
        assert many.session_row("a")["config"]["k"] == 2  # type: ignore[index]
        assert many.state_row("c")["host_prompt"] == "sys3"
        assert many.rows("SELECT * FROM projects") == one.rows("SELECT * FROM projects") == [("p", T0)]
    finally:
        one.close()
        many.close()


def test_batch_rollback_leaves_no_session(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "s.duckdb"))
    try:
        with pytest.raises(RuntimeError), store.batch():
            store.ensure_project("p", T0)
            store.create_session(_row("a", T0), _state())
            raise RuntimeError("failed mid-batch")
        assert store.session_row("a") is None
        assert not store.project_exists("p")
        assert store.session_count() == 0
        with store.batch():  # the same id can be created again afterwards
            store.create_session(_row("a", T0), _state())
            store.delete_session("a")  # deleted before the batch ends: never written
            store.create_session(_row("b", T0), _state())
        assert store.session_ids() == ["b"]
    finally:
        store.close()
