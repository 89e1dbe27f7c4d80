"""``ImportResult.sessions``: the sessions an import stored, opened when read (an import of a whole history must
not hold every session it stored: memory would grow with the folder, not with its largest session)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.ingest import SessionList

LOGS = Path(pc.__file__).parent / "data" / "logs" / "claude_code"


@pytest.mark.parametrize("workers", [1, 2])
def test_import_keeps_no_session_open_and_opens_each_when_read(tmp_path: Path, workers: int) -> None:
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        res = lab.import_log(LOGS / "-home-dev-billing-service", workers=workers, progress=False)
        assert isinstance(res.sessions, SessionList) and len(res.sessions) >= 2
        gc.collect()
        assert [sid for sid in res.sessions.ids if lab.active_session(sid) is not None] == []
        assert sorted(res.sessions.ids) == sorted(lab.store.session_ids())
        first = res.sessions[0]
        assert first is res.sessions[0] is res.sessions[-1 - (len(res.sessions) - 1)]
        assert lab.active_session(first.id) is first  # opened through the Lab: the object a notebook would get
        assert [s.id for s in res.sessions] == res.sessions.ids
        assert [s.id for s in res.sessions[1:]] == res.sessions.ids[1:]
        assert first.turns()["cache_read_input_tokens"].notna().all()  # a working session, measured usage
        assert list(res.summary()["session"]) == res.sessions.ids
        with pytest.raises(IndexError):
            res.sessions[len(res.sessions)]
        again = lab.import_log(LOGS / "-home-dev-billing-service", workers=workers, progress=False)
        assert again.sessions == [] and again.requests == 0 and len(again.summary()) == 0
