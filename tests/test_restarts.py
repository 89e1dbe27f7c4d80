"""Durability (seed_designs.md §5.3): for every strategy, the request after a restart — in-process with
``s.restart()``, or after closing a file-backed Lab and reopening it in a new process — is byte-identical
to the uninterrupted session's request. Restart points cover a plain turn boundary, right after a
knowledge change (before and after the request that surfaces it) and inside tool loops (a crash at the
network seam between two requests of one turn)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb._util import digest
from promptcache_nb.live import Backend, DirectSimulator
from promptcache_nb.request import canonical_bytes

TESTS = Path(__file__).resolve().parent
REFERENCE = TESTS.parent / "data" / "scenarios" / "support_agent.yaml"
STOP = 16  # turns 0-15: three knowledge changes and tool loops of 2-6 calls
# turn 4 adds knowledge (5 is the turn after its delta); 6 is a 4-call loop; 15 adds knowledge and runs a
# 2-call loop, so its restarts fall right after the change and right after the request that surfaced it
PLAN = {"before": {3, 5}, "after_events": {4, 15}, "in_loop": {6: 2, 15: 1}}


class SimulatedCrash(RuntimeError):
    pass


class Recorder(Backend):
    """The in-process simulator, recording the bytes of every request it sends; can crash once."""

    name = "recorder"

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.crash_at: int | None = None
        self._inner = DirectSimulator()

    def send(self, request, *, at, cache):
        if self.crash_at == len(self.bodies):
            self.crash_at = None
            raise SimulatedCrash(f"the agent process died before request {len(self.bodies)}")
        response = self._inner.send(request, at=at, cache=cache)
        self.bodies.append(canonical_bytes(request.body))
        return response


def resume_turn(s: pc.Session, turn, done: int, at: datetime) -> pc.Turn:
    """Finish a turn whose first ``done`` requests were sent before the process died.

    Mirrors ``Session.step``: the stored history ends with the assistant's ``tool_use`` for call
    ``done - 1``; each remaining request sends the previous call's result.
    """
    calls = turn.tool_calls
    for call in calls[:done]:
        at = at + call.after
    tool_id = s.messages[-1]["content"][-1]["id"]
    for c in range(done, len(calls) + 1):
        result = {"type": "tool_result", "tool_use_id": tool_id, "content": calls[c - 1].result}
        if calls[c - 1].is_error:
            result["is_error"] = True
        new_msgs = [{"role": "user", "content": [result]}]
        if c == len(calls):
            final = {"role": "assistant", "content": [{"type": "text", "text": turn.reply}]}
            return s._request(new_msgs, final, at=at, user_text=None)
        tool_id = "toolu_" + digest(f"{s.id}/{s.n_turns}".encode(), tag="tool")[:24]
        use = {"role": "assistant", "content": [
            {"type": "tool_use", "id": tool_id, "name": calls[c].name, "input": calls[c].input}]}
        s._request(new_msgs, use, at=at, user_text=None)
        at = at + calls[c].after
    raise AssertionError("unreachable")


def continue_replay(s, sc, backend, *, start, stop, at, plan, events_done=False):
    """``Lab.replay``'s loop from turn ``start``, restarting where ``plan`` says."""
    for i in range(start, stop):
        turn = sc.turns[i]
        if i > 0:
            at = at + turn.after
        if i in plan.get("before", ()):
            s = s.restart()
        if not (events_done and i == start):
            for event in turn.events:
                s = s.apply(event, at=at)
        if i in plan.get("after_events", ()):
            s = s.restart()
        crash = plan.get("in_loop", {}).get(i)
        if crash is None:
            t = s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
        else:
            backend.crash_at = len(backend.bodies) + crash
            with pytest.raises(SimulatedCrash):
                s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
            s = s.restart()
            t = resume_turn(s, turn, crash, at)
        at = t.at
    return s, at


@pytest.fixture(scope="module")
def scenario():
    return pc.load_scenario(REFERENCE)


@pytest.fixture(scope="module")
def reference(scenario):
    """Uninterrupted bodies per strategy; one fresh Lab each, so session ids and entry ids match."""
    out = {}
    for name in pc.STRATEGIES:
        rec = Recorder()
        with pc.Lab(progress=False) as lab:
            s = lab.replay(scenario, strategy=name, stop_after=STOP, backend=rec)
            out[name] = (s.id, rec.bodies)
    return out


@pytest.mark.parametrize("name", pc.STRATEGIES)
def test_restart_in_process_is_byte_identical(name, scenario, reference):
    sid, expected = reference[name]
    rec = Recorder()
    with pc.Lab(progress=False) as lab:
        s = lab.replay(scenario, strategy=name, stop_after=0, backend=rec)
        assert s.id == sid
        s, _ = continue_replay(s, scenario, rec, start=0, stop=STOP, at=scenario.start, plan=PLAN)
        assert len(rec.bodies) == len(expected)
        for i, (got, want) in enumerate(zip(rec.bodies, expected, strict=True)):
            assert got == want, f"{name}: request {i} differs from the uninterrupted session's"
        # and the store kept what was sent: the first request after each restart, rebuilt from the store
        for i in _first_after_restarts(scenario):
            assert s.turn(i).body == expected[i], f"{name}: stored request {i}"


def _starts(scenario) -> list[int]:
    """Index of each turn's first request."""
    starts = [0]
    for turn in scenario.turns:
        starts.append(starts[-1] + 1 + len(turn.tool_calls))
    return starts


def _first_after_restarts(scenario) -> list[int]:
    starts = _starts(scenario)
    at_turns = [starts[i] for i in sorted(PLAN["before"] | PLAN["after_events"])]
    return sorted(at_turns + [starts[i] + r for i, r in PLAN["in_loop"].items()])


def _points(scenario):
    """(label, stop_after, kind, crash, first reference request, last turn) for the new-process test."""
    starts = _starts(scenario)
    return [
        ("after_knowledge_add", 4, "events", None, starts[4], 7),  # then a 4-call loop
        ("inside_tool_loop", 6, "crash", 2, starts[6] + 2, 8),  # the turn-4 delta is in the store
    ]


def child_main(jobs: list[dict]) -> None:
    """Run in a fresh interpreter: reopen each Lab file, continue, print request digests as JSON."""
    sc = pc.load_scenario(REFERENCE)
    out = []
    for job in jobs:
        rec = Recorder()
        with pc.Lab(job["db"], progress=False) as lab:
            s = lab.session(id=job["sid"], backend=rec)
            at = datetime.fromisoformat(job["at"])
            i = job["turn"]
            if job["kind"] == "crash":
                t = resume_turn(s, sc.turns[i], job["crash"], at)
                continue_replay(s, sc, rec, start=i + 1, stop=job["stop"], at=t.at, plan={})
            else:  # the turn's events were applied before the Lab was closed
                back = at - sc.turns[i].after
                continue_replay(s, sc, rec, start=i, stop=job["stop"], at=back, plan={}, events_done=True)
        out.append([hashlib.sha256(b).hexdigest() for b in rec.bodies])
    sys.stdout.write(json.dumps(out))


def test_reopen_in_a_new_process_is_byte_identical(tmp_path, scenario, reference):
    jobs, wanted = [], []
    for name in pc.STRATEGIES:
        sid, expected = reference[name]
        for label, stop_after, kind, crash, first, last_turn in _points(scenario):
            db = tmp_path / f"{name}-{label}.duckdb"
            rec = Recorder()
            with pc.Lab(db, progress=False) as lab:
                s = lab.replay(scenario, strategy=name, stop_after=stop_after, backend=rec)
                turn = scenario.turns[stop_after]
                at = s.last_turn.at + turn.after
                if kind == "events":
                    for event in turn.events:
                        s = s.apply(event, at=at)
                else:
                    rec.crash_at = len(rec.bodies) + crash
                    with pytest.raises(SimulatedCrash):
                        s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
            jobs.append({"db": str(db), "sid": sid, "kind": kind, "crash": crash, "turn": stop_after,
                         "at": at.isoformat(), "stop": last_turn})
            end = sum(1 + len(t.tool_calls) for t in scenario.turns[:last_turn])
            wanted.append((name, label, [hashlib.sha256(b).hexdigest() for b in expected[first:end]]))
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_restarts as t; "
            "t.child_main(json.loads(sys.argv[2]))")
    proc = subprocess.run([sys.executable, "-c", code, str(TESTS), json.dumps(jobs)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    for (name, label, want), have in zip(wanted, got, strict=True):
        assert have == want, f"{name} / {label}: the reopened session sent different bytes"
