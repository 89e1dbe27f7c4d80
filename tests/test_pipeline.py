"""One request pipeline (issue 12): typed records, a pure pipeline, and a session state that is one immutable
value, swapped only once the store has the change."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

import promptcache_nb as pc
from promptcache_nb import pipeline
from promptcache_nb.live import BackendResponse, DirectSimulator
from promptcache_nb.pipeline import SessionState

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOST = "You are the billing support assistant. Answer precisely and cite the ticket. " * 60


def test_a_request_record_mirrors_the_turns_table() -> None:
    with pc.Lab(progress=False) as lab:
        assert list(pc.pipeline.RequestRecord.columns()) == lab.store._table_columns("turns")
        s = lab.session("durable_delta", system=HOST, start=T0)
        s.knowledge.add("Refund window", "Refunds are automatic within 30 days.", category="gotcha", at=T0)
        s.step("first", reply="one")
        t = s.step("second", reply="two", tool_calls=[{"name": "lookup", "input": {"id": 7}, "result": "ok"}])
        rec = lab.store.read_request(s.id, t.index)
        assert isinstance(rec, pc.pipeline.RequestRecord) and (rec.session_id, rec.idx) == (s.id, 2)
        assert rec.usage == t.usage and rec.segment_states == t.segment_states and rec.sent_at == t.at
        assert (rec.ideal_cache_read, rec.cost_usd, rec.cache_reason) == (t.ideal_cache_read, t.cost_usd,
                                                                           t.cache_reason)
        assert rec.event_codes == [] and rec.detail == t.cache_detail
        assert lab.store.read_request(s.id, 0).event_codes == ["knowledge_add:" + s.knowledge.list()[0].short_id]
        assert lab.store.read_request(s.id, 99) is None
        with pytest.raises(dataclasses.FrozenInstanceError):
            rec.idx = 5  # type: ignore[misc]


def test_the_pipeline_is_pure() -> None:
    """The same inputs give the same record, and the state it started from is left as it was."""
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, start=T0)
        s.step("first", reply="one")
        state = s._state
        snapshot = dataclasses.asdict(dataclasses.replace(state, previous=None, observation=None))
        built = s._build(state, [{"role": "user", "content": [{"type": "text", "text": "next"}]}], at=T0)
        outcome = pipeline.Outcome(pc.Usage(10, 20, 30, 30, 0, 5), None, None, [{"type": "text", "text": "x"}],
                                   [{"type": "text", "text": "x"}])
        kwargs = dict(session_id=s.id, project_id=s.project, prepared=built.prepared, at=T0, events=[],
                      outcome=outcome, built=built, user_text="next", prices=s.prices, retention_points=None,
                      minimum=0, transport="direct")
        a, b = pipeline.advance(state, **kwargs), pipeline.advance(state, **kwargs)
        assert a.record == b.record and a.record.idx == 1 and a.state.next_index == 2
        assert a.state.messages[-2:] == [*built.new_messages, {"role": "assistant", "content": outcome.reply}]
        assert s._state is state  # nothing stored, nothing swapped
        assert dataclasses.asdict(dataclasses.replace(state, previous=None, observation=None)) == snapshot
        assert s.turns().shape[0] == 1


class _FailingOn:
    """The simulator, except that the ``n``-th request (0-based) raises."""

    def __init__(self, n: int) -> None:
        self.inner, self.n, self.calls = DirectSimulator(), n, 0

    def send(self, prepared, *, at, cache) -> BackendResponse:
        self.calls += 1
        if self.calls - 1 == self.n:
            raise pc.errors.APIConnectionError("connection reset (simulated)")
        return self.inner.send(prepared, at=at, cache=cache)


def test_a_failed_tool_loop_changes_nothing_in_memory() -> None:
    """The second request of a tool loop fails: the first one's state was never swapped in, so the session
    object is exactly the value it was (no snapshot to restore), and the store has neither request."""
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, start=T0)
        s.step("first", reply="one")
        before = s._state
        assert isinstance(before, SessionState)
        s.backend = _FailingOn(1)  # type: ignore[assignment]
        with pytest.raises(pc.errors.APIConnectionError):
            s.step("look it up", reply="done", tool_calls=[{"name": "lookup", "input": {}, "result": "42"}])
        assert s._state is before and s.n_turns == 1 and len(s.turns()) == 1
        s.backend = DirectSimulator()
        t = s.step("look it up", reply="done", tool_calls=[{"name": "lookup", "input": {}, "result": "42"}])
        assert t.index == 2 and s._state is not before
        with pytest.raises(dataclasses.FrozenInstanceError):
            s._state.next_index = 0  # type: ignore[misc]


def test_lab_batch_rolls_back_and_reloads_open_sessions() -> None:
    """Imports write through ``Lab.batch``: a failure stores nothing and the open session objects go back to
    what the store has (not ahead of it)."""
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, start=T0)
        s.step("first", reply="one")
        body = s.turn(0).request
        with pytest.raises(RuntimeError), lab.batch():
            s.record(body, usage={"input_tokens": 5, "cache_read_input_tokens": 0,
                                  "cache_creation_input_tokens": 0, "output_tokens": 1})
            assert s.n_turns == 2  # written in the block (deferred): the object follows it
            raise RuntimeError("failed later in the batch")
        assert s.n_turns == 1 and len(s.turns()) == 1 and not s.closed
        assert s.record(body).index == 1


def test_replay_and_import_go_through_the_pipeline(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen: list[int] = []
    advance = pipeline.advance

    def counting(*args, **kwargs):
        out = advance(*args, **kwargs)
        seen.append(out.record.idx)
        return out

    monkeypatch.setattr(pipeline, "advance", counting)
    with pc.Lab(progress=False) as lab:
        sc = pc.load_scenario(pc.data_path("scenarios/support_agent.yaml"))
        s = lab.replay(sc, strategy="append_only", stop_after=3)
        assert seen == list(range(s.n_turns))
        seen.clear()
        r = lab.session(project="rec", system="sys", start=T0)
        r.record({"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
        assert seen == [0]
