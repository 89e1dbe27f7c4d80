"""Durability (invariant 3 of docs/seed_designs.md#invariants): for every strategy, the request after a restart — in-process with
``s.restart()``, or after closing a file-backed Lab and reopening it in a new process — is byte-identical
to the uninterrupted session's request. Restart points cover a plain turn boundary, right after a
knowledge change (before and after the request that surfaces it) and inside tool loops (a crash at the
network seam between two requests of one turn)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb._shared import ScopeCaches
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
            # The process dies inside the tool loop, after `crash` requests went out. A user turn is one
            # transaction, so none of it is stored: the resumed session sends the whole turn again, and
            # every request of it is byte-identical to what was sent before the crash.
            before = len(backend.bodies)
            stored = s.n_turns
            backend.crash_at = before + crash
            with pytest.raises(SimulatedCrash):
                s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
            sent_before_crash = backend.bodies[before:]
            assert len(sent_before_crash) == crash
            del backend.bodies[before:]
            s = s.restart()
            assert s.n_turns == stored  # nothing of the interrupted turn was kept
            t = s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
            assert backend.bodies[before:before + crash] == sent_before_crash
        at = t.at
    return s, at


@pytest.fixture(scope="module")
def scenario():
    return pc.load_scenario(REFERENCE)


@pytest.fixture(scope="module")
def reference(scenario, stored_replay):
    """Uninterrupted bodies per strategy (the requests of turns 0 to STOP - 1): what conftest's replay of the
    whole reference scenario sent, one fresh Lab each, so session ids and entry ids match."""
    n = sum(1 + len(t.tool_calls) for t in scenario.turns[:STOP])
    return {name: (stored.session_id, list(stored.sent[:n]))
            for name, stored in stored_replay.many(pc.STRATEGIES, REFERENCE).items()}


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
        # a crash after 2 requests of turn 6's tool loop: the turn is resent whole, byte-identical
        ("inside_tool_loop", 6, "crash", 2, starts[6], 8),
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
                assert s.n_turns == job["stored"]  # the interrupted turn left nothing in the store
                turn = sc.turns[i]
                t = s.step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
                continue_replay(s, sc, rec, start=i + 1, stop=job["stop"], at=t.at, plan={})
            else:  # the turn's events were applied before the Lab was closed
                back = at - sc.turns[i].after
                continue_replay(s, sc, rec, start=i, stop=job["stop"], at=back, plan={}, events_done=True)
        out.append([hashlib.sha256(b).hexdigest() for b in rec.bodies])
    sys.stdout.write(json.dumps(out))


@pytest.mark.slow
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
                stored = s.n_turns
            jobs.append({"db": str(db), "sid": sid, "kind": kind, "crash": crash, "turn": stop_after,
                         "at": at.isoformat(), "stop": last_turn, "stored": stored})
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


# -- resuming from the cache's horizon, not from history -----------------------------------------------

RULES = "\n".join(f"Rule {i}: answer billing questions with the ledger entry id {i * 7} first." for i in range(120))
LONG_RUN = 170  # requests 30 s apart (a 400 s pause after the 100th): 1 h 27 min, past every horizon below


def _long_session(lab, cache, params):
    s = lab.session("durable_delta", cache, "claude-sonnet-4-5", system=RULES, project="long",
                    cache_params=params, start=datetime(2026, 11, 2, 9, 0, tzinfo=UTC))
    s.knowledge.add("Ledger", "Every refund has a ledger entry.", category="fact")
    return s


def _run(s, first, last):
    at = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    for i in range(first, last):
        pause = 400 if i >= 100 else 0
        s.step(f"Question {i}: why was invoice {i} charged twice?", reply=f"Answer {i}.",
               at=at + timedelta(seconds=30 * i + pause))


@pytest.mark.slow  # a 171-request session each
def _copy_as_closed(lab: pc.Lab, db: Path, closed: Path) -> None:
    """Copy the store file ``db`` to ``closed`` as closing the Lab would leave it: a CHECKPOINT (which a close
    does, and nothing else: closing writes no row), then the file and any write-ahead log left."""
    lab.store.con.execute("CHECKPOINT")
    shutil.copyfile(db, closed)
    wal = db.with_name(db.name + ".wal")
    if wal.exists():
        shutil.copyfile(wal, closed.with_name(closed.name + ".wal"))


@pytest.mark.parametrize(("cache", "params", "replayed"), [
    ("anthropic", {}, "window"),  # the last hour (its longest TTL)
    ("deepseek", {"lifetime": "20m"}, "window"),  # the last lifetime
    # since the last idle pause (max_age keeps older times in the state); a lifetime range collapsed to 5 minutes,
    # else the pause is the range's end (an hour: what a prefix may outlive, test_openai_open_retention_*)
    ("openai", {"idle_ttl_max": "5m"}, "after_pause"),
    ("openai", {}, "all"),  # the 400 s pause is inside the open range (5 min to 1 h): replayed through
    ("vllm", {"num_blocks": 450}, "all"),  # LRU, no TTL: every request (a pool the session fills)
])
def test_resume_replays_only_what_the_cache_can_still_hold(tmp_path, monkeypatch, cache, params, replayed):
    """A session longer than its cache's horizon, closed and reopened: the next request reads and writes
    exactly what the uninterrupted session's does, and the rebuild replayed only the requests it had to.

    One run of the long session: after request LONG_RUN - 1 the store file is copied as closing the Lab
    would leave it (a CHECKPOINT, which a close does, and nothing else: closing writes no row), then the
    uninterrupted session sends its next request; the copy is reopened in a new Lab and sends that request
    again."""
    db, closed = tmp_path / "long.duckdb", tmp_path / "closed.duckdb"
    with pc.Lab(db, progress=False) as lab:
        s = _long_session(lab, cache, params)
        _run(s, 0, LONG_RUN)
        sid = s.id
        _copy_as_closed(lab, db, closed)
        _run(s, LONG_RUN, LONG_RUN + 1)
        want = s.last_turn
    cls = type(pc.get_cache_model(cache))
    seen: list[datetime] = []
    process = cls.process

    def counting(self, request, at):
        seen.append(at)
        return process(self, request, at)

    monkeypatch.setattr(cls, "process", counting)
    with pc.Lab(closed, progress=False) as lab:
        s = lab.session(id=sid)
        _run(s, LONG_RUN, LONG_RUN + 1)
        got = s.last_turn
        times = lab.sql(f"SELECT sent_at FROM turns WHERE session_id = '{sid}' ORDER BY idx")["sent_at"].tolist()
    assert got.body == want.body
    assert got.usage == want.usage and got.cache_reason == want.cache_reason
    assert got.segment_states == want.segment_states
    rebuilt = seen[:-1]  # the last one is the new request itself
    stored = len(times) - 1
    if replayed == "all":
        assert len(rebuilt) == stored
    elif replayed == "after_pause":
        assert len(rebuilt) == stored - 100  # the requests since the 400 s pause (idle TTL 300 s)
    else:
        assert 0 < len(rebuilt) < stored
        horizon = pc.get_cache_model(cache, **params).state_horizon_seconds()
        assert (rebuilt[-1] - rebuilt[0]).total_seconds() <= horizon


def test_a_restart_keeps_the_labs_cache_and_a_failed_step_rebuilds_it(monkeypatch):
    """The simulated provider cache belongs to the Lab (a provider's cache does not restart with the agent):
    a restart event replays nothing; a failed step, whose requests the store dropped, rebuilds it."""
    rebuilt: list[str] = []
    rebuild = ScopeCaches._rebuild

    def counting(self, key, entry, member):
        rebuilt.append(member.session_id)
        return rebuild(self, key, entry, member)

    monkeypatch.setattr(ScopeCaches, "_rebuild", counting)
    with pc.Lab(progress=False) as lab:
        s = _long_session(lab, "anthropic", {})
        _run(s, 0, 3)
        assert rebuilt == [s.id]  # built once, empty, at the first request
        s = s.restart()
        _run(s, 3, 5)
        assert len(rebuilt) == 1
        rec = Recorder()
        s = lab.session(id=s.id, backend=rec)
        rec.crash_at = 0
        with pytest.raises(SimulatedCrash):
            s.step("Question 5", reply="Answer 5.", at=datetime(2026, 11, 2, 9, 3, tzinfo=UTC))
        _run(s, 5, 6)
        assert len(rebuilt) == 2


# -- recording into a reopened session ---------------------------------------------------------------------

LOOKUP = {"name": "lookup_invoice", "description": "Find an invoice by id.",
          "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}
RECORDED = 40  # requests stored before the Lab closes


def _logged_body(n: int) -> dict:
    """Request ``n`` of a proxy-logged agent: a tool, a system list, a history of string and block messages (a tool
    call and result every third question) that grows, and a cache marker on the newest question only, so each
    request changes the block the previous one marked."""
    messages: list[dict] = []
    for i in range(n + 1):
        question = f"Question {i}: why was invoice {i} charged twice?"
        if i < n:
            messages.append({"role": "user", "content": question})
            if i % 3 == 1:
                messages.append({"role": "assistant", "content": [
                    {"type": "text", "text": f"Looking up invoice {i}."},
                    {"type": "tool_use", "id": f"toolu_{i:03d}", "name": "lookup_invoice", "input": {"id": f"in_{i}"}}]})
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{i:03d}", "content": f"in_{i}: paid twice"}]})
            messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}: a retry."}]})
        else:
            messages.append({"role": "user", "content": [
                {"type": "text", "text": question, "cache_control": {"type": "ephemeral"}}]})
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "tools": [LOOKUP],
            "system": [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}],
            "messages": messages}


def _record(s, n: int, measured: bool) -> None:
    usage = ({"input_tokens": 3, "cache_read_input_tokens": 2_000 + n, "cache_creation_input_tokens": 40 + n,
              "output_tokens": 9} if measured else None)
    s.record(_logged_body(n), at=datetime(2026, 11, 2, 9, 0, tzinfo=UTC) + timedelta(seconds=30 * n), usage=usage)


@pytest.mark.parametrize(("measured", "calibrated"), [(True, False), (False, False), (True, True)],
                         ids=["measured", "simulated", "calibrated"])
def test_a_reopened_session_records_its_next_requests_as_the_open_one_does(tmp_path, monkeypatch, measured,
                                                                            calibrated):
    """The first requests recorded into a reopened session (its state read back from the store: the last request
    rebuilt from its blocks, the simulated cache from its window) store the same ``turns`` rows, every column, as
    the session object that never closed; and the first of them segments only the new tail of its body (the
    rebuilt last request is a ``previous`` prepare reuses), never the whole history again."""
    db, closed = tmp_path / "open.duckdb", tmp_path / "closed.duckdb"
    calibration = pc.analysis.Calibration("claude-sonnet-4-5", 1.13, 5.0, 12, 1.0, 2.0) if calibrated else None
    with pc.Lab(db, progress=False) as lab:
        s = lab.new_session("naive", project="logged", calibration=calibration,
                            start=datetime(2026, 11, 2, 9, 0, tzinfo=UTC))
        for n in range(RECORDED):
            _record(s, n, measured)
        sid = s.id
        _copy_as_closed(lab, db, closed)
        for n in range(RECORDED, RECORDED + 2):
            _record(s, n, measured)
        want = lab.sql("SELECT * FROM turns WHERE session_id = ? AND idx >= ? ORDER BY idx", [sid, RECORDED])
    hashed: list[object] = []
    hashes = pc.request.SegmentMemo.hashes

    def counting(self, element, **kw):
        hashed.append(element)
        return hashes(self, element, **kw)

    with pc.Lab(closed, progress=False) as lab:
        s = lab.open_session(sid)
        monkeypatch.setattr(pc.request.SegmentMemo, "hashes", counting)
        _record(s, RECORDED, measured)
        monkeypatch.undo()
        _record(s, RECORDED + 1, measured)
        got = lab.sql("SELECT * FROM turns WHERE session_id = ? AND idx >= ? ORDER BY idx", [sid, RECORDED])
    assert len(want) == 2 and list(got.columns) == list(want.columns)
    for column in want.columns:
        assert got[column].tolist() == want[column].tolist() or got[column].equals(want[column]), column
    # request 40 repeats 39's body bar its last question (now unmarked), an answer and a new question: the open
    # session hashes those 3 blocks. The reopened one also hashes the tool and the system block, rebuilt from
    # their stored canonical JSON with sorted keys (an order the per-unit bytes tell apart from the body's);
    # before the rebuilt request carried its units it hashed every block of the history again (~120)
    assert len(hashed) == 5, [str(x)[:80] for x in hashed]
