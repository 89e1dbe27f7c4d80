"""Lab and Session, untangled (issue 25): new_session / open_session / create_session, the ``lab.session`` alias
that refuses contradicting arguments, SessionConfig stored byte-identically, typed analysis entry points."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime

import pytest

import promptcache_nb as pc
from promptcache_nb._config import SessionConfig
from promptcache_nb._protocols import StoredSession, resolve_session
from promptcache_nb.cache import Reason
from promptcache_nb.errors import SessionError

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

# What the store held before SessionConfig existed (written by the dict-building code): the column must not move.
STORED_PROJECT_SCOPED = ('{"cache_params":{"client_ttls":["1h","5m"]},"cache_scope":"project","calibration":null,'
                         '"prices":null,"start":"2026-03-01T09:00:00+00:00","step_seconds":45.0,"strategy_params":{}}')
STORED_PRICED = ('{"cache_params":{},"cache_scope":"session","calibration":null,"prices":{"cache_read":0.1,'
                 '"cache_write_1h":2.0,"cache_write_5m":1.25,"input":1.0,"output":2.0,"source":"mine"},'
                 '"start":"2026-03-01T09:00:00+00:00","step_seconds":30.0,"strategy_params":{}}')


def _config_column(lab: pc.Lab, sid: str) -> str:
    return lab.sql("SELECT config FROM sessions WHERE id = $id", {"id": sid}).config[0]


def test_the_stored_config_column_is_unchanged():
    with pc.Lab(progress=False) as lab:
        a = lab.new_session("durable_delta", project="p", start=T0, step="45s",
                            cache_params={"client_ttls": ["1h", "5m"]}, cache_scope="project")
        prices = pc.analysis.Prices(input=1.0, output=2.0, cache_read=0.1, cache_write_5m=1.25, cache_write_1h=2.0,
                           source="mine")
        b = lab.session(start=T0, prices=prices)
        assert _config_column(lab, a.id) == STORED_PROJECT_SCOPED
        assert _config_column(lab, b.id) == STORED_PRICED
        assert a.session_config.step_seconds == 45.0 and a.session_config.cache_scope == "project"
        assert b.config["prices"]["source"] == "mine"  # the dict view is kept


@pytest.mark.parametrize("stored", [
    {"start": "2026-03-01T09:00:00+00:00", "step_seconds": 30, "cache_params": {}, "strategy_params": {},
     "prices": None, "calibration": None, "format": "claude_code", "session_key": "k", "session_kind": "main",
     "unlogged_prefix_tokens": None, "cache_scope": "project"},
    {"start": "2026-03-01T09:00:00.123456+00:00", "step_seconds": 12.5, "cache_params": {"idle_ttl": "10m"},
     "strategy_params": {"x": 1}, "prices": None, "calibration": {"model": "m", "ratio": 1.1, "overhead": -2.0},
     "cache_scope": "lab", "unlogged_prefix_tokens": 812},
    {"start": "2026-03-01T09:00:00+00:00", "step_seconds": 30.0, "cache_params": {}, "strategy_params": {},
     "prices": None, "calibration": None, "cache_scope": "session", "a_later_key": [1, 2]},
])
def test_a_config_reads_and_writes_back_key_for_key(stored):
    cfg = SessionConfig.from_stored(stored)
    assert cfg.to_stored() == stored
    assert type(cfg.to_stored()["step_seconds"]) is type(stored["step_seconds"])  # 30 stays 30, 30.0 stays 30.0


def test_session_with_id_refuses_contradicting_arguments_and_keeps_the_object():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="You are terse.", start=T0)
        s.step("hi", reply="hello")
        with pytest.raises(SessionError, match=r"strategy='durable_delta', cache='openai'.*keeps its own settings"):
            lab.session(id=s.id, strategy="durable_delta", cache="openai")
        assert not s.closed  # the object the notebook holds still works
        assert lab.session(id=s.id) is s and lab.open_session(s.id) is s
        assert lab.session(id=s.id, strategy="naive", cache="anthropic", project="default") is s  # agreeing: fine
        with pytest.raises(SessionError, match="system="):
            lab.session(id=s.id, system="Another prompt.")
        s.step("again", reply="ok")
        assert s.n_turns == 2


def test_open_session_with_a_backend_gives_the_open_object_that_backend_and_restart_gives_a_new_one():
    with pc.Lab(progress=False) as lab:
        s = lab.new_session(start=T0)
        backend = pc.live.DirectSimulator()
        assert lab.open_session(s.id, backend=backend) is s and s.backend is backend
        s2 = s.restart()
        assert s2 is not s and s.closed and s2.backend is backend and lab.active_session(s.id) is s2
        with pytest.raises(SessionError, match="no session 'nope'"):
            lab.open_session("nope")


def test_create_session_stores_a_session_as_given():
    with pc.Lab(progress=False) as lab:
        cfg = SessionConfig(start=T0, step_seconds=30, format="mine", session_key="abc", session_kind="main",
                            cache_scope="project")
        s = lab.create_session(cfg, session_id="imp-1", project="imported/mine", model="claude-sonnet-4-5",
                               source="mine:log.jsonl")
        assert (s.strategy, s.source, s.cache_scope, s.session_config) == (None, "mine:log.jsonl", "project", cfg)
        assert lab.active_session("imp-1") is s
        with pytest.raises(SessionError, match="already exists"):
            lab.create_session(cfg, session_id="imp-1", project="p", model="m")
        s.note_unlogged_prefix(120)
        assert SessionConfig.from_stored(lab.store.session_row("imp-1")["config"]).unlogged_prefix_tokens == 120


def test_a_rollback_closes_a_session_created_inside_it_and_reloads_the_others():
    with pc.Lab(progress=False) as lab:
        s = lab.new_session(start=T0)
        with pytest.raises(RuntimeError), lab.atomic():
            s.step("hi", reply="hello")
            created = lab.new_session(start=T0)
            raise RuntimeError("undo")
        assert created.closed and not s.closed and s.n_turns == 0


def test_analysis_takes_a_session_or_a_lab_and_an_id():
    with pc.Lab(progress=False) as lab:
        s = lab.new_session(start=T0)
        s.step("hi", reply="hello")
        assert isinstance(s, StoredSession) and not isinstance(lab, StoredSession)
        assert resolve_session(s, None) == (lab, s.id) and resolve_session(lab, s.id) == (lab, s.id)
        with pytest.raises(TypeError, match="pass a Session, or a Lab and a session_id"):
            pc.ttl_whatif(lab)
        assert list(pc.rebuilds(lab).columns)[0] == "session"  # a Lab alone: every session's rebuilds
        assert list(pc.rebuilds(lab)["session"]) == list(pc.rebuilds(s).assign(session=s.id)["session"])
        assert len(pc.ttl_whatif(s)) == len(pc.ttl_whatif(lab, s.id)) == 2
        assert isinstance(s.last_turn.cache_reason, str)
        result = s.turn(0).cache_result
        assert result is None or isinstance(result.reason, Reason)


def test_a_cache_result_reason_is_a_reason():
    with pc.Lab(progress=False) as lab:
        t = lab.new_session(start=T0).step("hi", reply="hello")
        assert t.cache_result is not None and t.cache_result.reason is Reason.COLD


def test_the_old_home_of_lab_still_works_with_one_warning():
    import promptcache_nb.session as session_module

    session_module._WARNED.discard("Lab")
    with pytest.warns(DeprecationWarning, match="use promptcache_nb.Lab"):
        assert session_module.Lab is pc.Lab
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert session_module.Lab is pc.Lab  # once
    assert session_module.cache_scope_of({"config": {}, "strategy": None}) == "project"
