"""kill -9, SIGTERM and Ctrl-C in the middle of a replay and of an import, in real child processes on real files.

After each signal the store reopens; every stored request rebuilds byte for byte (``s.turn(i).body`` equals the
request an uninterrupted run sent, ``s.turn(i).request`` equals the logged body); nothing is half-written (a
scenario turn's events and requests commit together, an imported session's requests commit together); and
continuing from what was stored — the scenario from the stored position, the import run again — sends exactly
the requests an uninterrupted run sends (here for the next two scenario turns). A replay commits a chunk of
scenario turns at a time: trials run with the default chunking and with smaller chunks (one and three turns), so
kills land inside chunks, between a turn's events and its request, and right at chunk commits. A few trials
here, at the points most likely to break and a seeded random one each; ``benchmarks/bench_reliability.py`` runs
at least 20 random ones of each, going on to the end.
"""

from __future__ import annotations

import random

import pytest
from _harness import (
    Kill,
    import_trial,
    random_kills,
    reference_bodies,
    reference_import,
    replay_points,
    replay_trial,
    write_logs,
)

SEED = 16


@pytest.fixture(scope="module")
def expected() -> list[bytes]:
    return reference_bodies()


# The scenario's hooks by chunk size (None: the default): 19 requests sent, 10 scenario turns stepped; COMMITs:
# the session with its starting knowledge (one transaction), then one per chunk. Chunks (turn ranges):
# default [0-3] [4] [5-9] (turn 4 holds a restart: a transaction of its own); 3: [0-2] [3] [4] [5-7] [8-9].
REPLAY_POINTS = {None: {"send": 19, "step": 10, "commit": 4}, 1: {"send": 19, "step": 10, "commit": 11},
                 3: {"send": 19, "step": 10, "commit": 6}}
REPLAY_KILLS = [
    # turn 4's three events (a removal, a restart, an addition) applied, its request not built yet
    (None, Kill("SIGKILL", "step", 5)),
    # turn 6's model switch applied inside the chunk of turns 5-9, whose compaction (turn 5) is not written yet
    (None, Kill("SIGKILL", "step", 7)),
    # inside turn 3's tool loop: two of its three requests went out; the whole first chunk is lost
    (None, Kill("SIGKILL", "send", 8)),
    # Ctrl-C the moment a chunk's COMMIT returns: the kernel must count what the store holds, and go on from there
    (3, Kill("SIGINT", "commit", 2)),
    (1, Kill("SIGINT", "commit", 7)),  # one turn per transaction: the Stepper's granularity
    # the replay's start: right after the session and its starting knowledge commit, before any request
    (None, Kill("SIGKILL", "commit", 1)),
    *((3, k) for k in random_kills(random.Random(SEED), 1, points=REPLAY_POINTS[3], signals=("SIGTERM",))),
]


def test_replay_points_are_the_scenarios():
    for chunk, points in REPLAY_POINTS.items():
        assert replay_points(chunk_turns=chunk) == points, chunk


@pytest.mark.parametrize(("chunk", "kill"), REPLAY_KILLS,
                         ids=[f"{k} chunks {c or 'default'}" for c, k in REPLAY_KILLS])
def test_replay_survives(chunk, kill, expected, tmp_path):
    trial = replay_trial(tmp_path, kill, expected, turns=2, chunk_turns=chunk)
    assert trial.survived, str(trial)
    if kill.delay is None:  # delivered at that very call: the child did not finish
        assert trial.interrupted, str(trial)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logs")
    sources = write_logs(folder, sessions=3, requests=6)
    reference = reference_import(folder, tmp_path_factory.mktemp("reference") / "ref.duckdb")
    return folder, sources, reference


IMPORT_POINTS = {"record": 18, "commit": 3}
IMPORT_KILLS = [
    Kill("SIGKILL", "record", 9),  # inside the second session's transaction
    Kill("SIGINT", "record", 14),  # Ctrl-C inside the third session: import again in the same kernel
    *random_kills(random.Random(SEED), 1, points=IMPORT_POINTS, signals=("SIGTERM",)),
]


@pytest.mark.parametrize("kill", IMPORT_KILLS, ids=str)
def test_import_survives(kill, logs, tmp_path):
    folder, sources, reference = logs
    trial = import_trial(tmp_path, kill, folder, sources, reference)
    assert trial.survived, str(trial)
    if kill.delay is None:
        assert trial.interrupted, str(trial)


def test_a_replay_stopped_while_seeding_leaves_no_half_seeded_session(tmp_path, monkeypatch):
    """The session row and the scenario's starting knowledge commit together: an interrupt while the knowledge
    is written leaves no session behind (before, a session with no knowledge, which resumed with other requests)."""
    from _harness import RecordingBackend, scenario

    import promptcache_nb as pc
    from promptcache_nb.widgets import StepperController

    sc = scenario()

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        with monkeypatch.context() as m:
            m.setattr(pc.session.KnowledgeBook, "add_many", interrupted)
            with pytest.raises(KeyboardInterrupt):
                lab.replay(sc, strategy="durable_delta")
        assert lab.sessions().empty  # nothing half-seeded to resume
        # going on (a re-run cell) sends what an uninterrupted replay sends
        seeded = lab.replay(sc, strategy="durable_delta", stop_after=0)
        assert len(seeded.knowledge.df()) == len(sc.knowledge)
        rec = RecordingBackend()
        s = lab.session(id=seeded.id, backend=rec)
        StepperController(s, sc).run(3)
    assert rec.bodies == reference_bodies("durable_delta")[: len(rec.bodies)]
