"""``Lab.replay`` writes in chunks (``chunk_turns``): one transaction and bulk inserts per chunk of scenario turns.

For every strategy, on scenarios holding every kind of event (the reliability suite's scenario: knowledge
additions, updates and a removal, tool changes both ways, a host-prompt edit, a compaction, a model switch and
back, a restart between two events of one turn, tool loops; and ``compaction.yaml``, whose compaction lands in
the middle of a chunk), a chunked replay stores exactly the rows a turn-by-turn run stores (the Stepper's path:
one ``Lab.atomic`` per scenario turn). A failure in the middle of a chunk leaves the chunks before it stored and
nothing of its own; the session objects agree with the store, and going on from there gives the uninterrupted
run's rows.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

import promptcache_nb as pc
from promptcache_nb.live import DirectSimulator
from promptcache_nb.request import canonical_bytes
from promptcache_nb.widgets import StepperController
from promptcache_nb.workspace import _replay_chunks

TESTS = Path(__file__).resolve().parent
SCENARIOS = {
    "every_event": TESTS / "reliability" / "data" / "kill_scenario.yaml",
    "compaction": TESTS.parent / "data" / "scenarios" / "compaction.yaml",
}
CHUNKS = (1, 3, 100)


@cache
def scenario(name: str) -> pc.Scenario:
    """The scenario, parsed once per worker (a Scenario is a frozen value; parsing it is a tenth of a test)."""
    return pc.load_scenario(SCENARIOS[name])


def stored(lab: pc.Lab) -> dict[str, list[str]]:
    """Every row of every table (but the migrations log, which holds wall-clock times), in a fixed order: the
    rows as DuckDB returns them (a third of the time of a DataFrame each, and no NULL turned into NaN)."""
    con = lab.store.con
    tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = "
                                        "current_database() AND table_name <> '_migrations' ORDER BY 1").fetchall()]
    return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in tables}


def turn_by_turn(sc: pc.Scenario, strategy: str, lab: pc.Lab, backend: Any = None) -> None:
    """The scenario through the Stepper: its knowledge set up by ``replay``, then one transaction per turn."""
    s = lab.replay(sc, strategy=strategy, stop_after=0, backend=backend)
    StepperController(s, sc).run()


_REFERENCE: dict[tuple[str, str], dict[str, list[str]]] = {}


def reference(name: str, strategy: str) -> dict[str, list[str]]:
    key = (name, strategy)
    if key not in _REFERENCE:
        with pc.Lab(progress=False) as lab:
            turn_by_turn(scenario(name), strategy, lab)
            _REFERENCE[key] = stored(lab)
    return _REFERENCE[key]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("strategy", pc.STRATEGIES)
def test_chunked_replay_stores_what_turn_by_turn_stores(name, strategy):
    want = reference(name, strategy)
    sc = scenario(name)
    for chunk in CHUNKS:
        with pc.Lab(progress=False) as lab:
            lab.replay(sc, strategy=strategy, chunk_turns=chunk)
            got = stored(lab)
        assert got.keys() == want.keys()
        for table in want:
            assert got[table] == want[table], f"chunk_turns={chunk}: table {table} differs"


def test_chunks_never_split_a_turn_and_a_restart_commits_alone():
    sc = scenario("every_event")
    restart = [i for i, t in enumerate(sc.turns) if any(isinstance(e, pc.scenario.Restart) for e in t.events)]
    assert restart, "the scenario must hold a restart"
    for size in (1, 2, 3, 100):
        chunks = list(_replay_chunks(sc.turns, size))
        assert [i for a, b in chunks for i in range(a, b)] == list(range(len(sc.turns)))
        assert all(0 < b - a <= size for a, b in chunks)
        assert all((r, r + 1) in chunks for r in restart)
    with pc.Lab(progress=False) as lab, pytest.raises(ValueError, match="chunk_turns"):
        lab.replay(sc, chunk_turns=0)


class FailingBackend(DirectSimulator):
    """The in-process simulator, raising at its ``fail_at``-th request (0-based); records what it sent."""

    def __init__(self, fail_at: int | None = None, error: type[BaseException] = RuntimeError) -> None:
        self.fail_at, self.error, self.bodies = fail_at, error, []

    def send(self, request: Any, *, at: Any, cache: Any) -> Any:
        if len(self.bodies) == self.fail_at:
            raise self.error("the endpoint went away")
        self.bodies.append(canonical_bytes(request.body))
        return super().send(request, at=at, cache=cache)


def turn_starts(sc: pc.Scenario) -> list[int]:
    starts = [0]
    for turn in sc.turns:
        starts.append(starts[-1] + 1 + len(turn.tool_calls))
    return starts


def committed_before(sc: pc.Scenario, chunk: int, request: int) -> int:
    """Requests stored when request ``request`` fails: those of the chunks before the one it belongs to."""
    starts = turn_starts(sc)
    turn = max(i for i in range(len(sc.turns)) if starts[i] <= request)
    first = next(a for a, b in _replay_chunks(sc.turns, chunk) if a <= turn < b)
    return starts[first]


def snapshot(s: pc.Session) -> dict[str, Any]:
    """What a session object says it holds, and the next request it would build."""
    return {"n": s.n_turns, "pending": list(s.pending_events),
            "knowledge": [(e.id, e.version) for e in s.knowledge.list()],
            "next": canonical_bytes(s.preview("And now?").body)}


@pytest.mark.parametrize("strategy", pc.STRATEGIES)
@pytest.mark.parametrize(("chunk", "fail_at", "error"), [
    # (requests per turn: 3 1 1 3 | 1 (the restart's turn) | 2 1 4 1 1)
    (3, 5, RuntimeError),  # turn 2, last of the first chunk: turns 0 and 1 go with it, nothing is stored
    (3, 15, KeyboardInterrupt),  # a Ctrl-C inside turn 7's tool loop, in the chunk of turns 5-7
    (100, 9, RuntimeError),  # the restart's own turn: the 9 requests before it stay
    (100, 12, RuntimeError),  # the default chunking: turn 6 fails, the compaction turn 5 before it is undone
])
def test_a_failure_mid_chunk_keeps_the_committed_chunks(strategy, chunk, fail_at, error, tmp_path, monkeypatch):
    sc = scenario("every_event")
    want_n = committed_before(sc, chunk, fail_at)
    db = tmp_path / "lab.duckdb"
    held: list[pc.Session] = []  # the session objects the replay used, kept as a caller holding one would
    step = pc.Session.step
    monkeypatch.setattr(pc.Session, "step", lambda self, *a, **k: (held.append(self), step(self, *a, **k))[1])
    with pc.Lab(db, progress=False) as lab:
        with pytest.raises(error):
            lab.replay(sc, strategy=strategy, chunk_turns=chunk, backend=FailingBackend(fail_at, error))
        s = held[-1]
        assert not s.closed and lab.active_session(s.id) is s
        in_memory = snapshot(s)
        sid = s.id
    assert in_memory["n"] == want_n
    with pc.Lab(db, progress=False) as lab:
        s = lab.session(id=sid)
        assert snapshot(s) == in_memory  # the objects agreed with the store
        StepperController(s, sc).run()  # going on from the stored position
        got = stored(lab)
    assert got == reference("every_event", strategy)
