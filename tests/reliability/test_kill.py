"""kill -9, SIGTERM and Ctrl-C in the middle of a replay and of an import, in real child processes on real files.

After each signal the store reopens; every stored request rebuilds byte for byte (``s.turn(i).body`` equals the
request an uninterrupted run sent, ``s.turn(i).request`` equals the logged body); nothing is half-written (a
scenario turn's events and requests commit together, an imported session's requests commit together); and
continuing from what was stored — the scenario from the stored position, the import run again — sends exactly
the requests an uninterrupted run sends (here for the next two scenario turns). A few trials here, at the points
most likely to break and a seeded random one each; ``benchmarks/bench_reliability.py`` runs at least 20 random
ones of each, going on to the end.
"""

from __future__ import annotations

import random

import pytest
from _harness import Kill, import_trial, random_kills, reference_bodies, reference_import, replay_trial, write_logs

SEED = 16


@pytest.fixture(scope="module")
def expected() -> list[bytes]:
    return reference_bodies()


# The scenario's hooks: 19 requests sent, 10 scenario turns stepped, 14 COMMITs (session, 2 knowledge entries,
# their pending events, then one per scenario turn).
REPLAY_POINTS = {"send": 19, "step": 10, "commit": 14}
REPLAY_KILLS = [
    # turn 4's three events (a removal, a restart, an addition) applied, its request not built yet
    Kill("SIGKILL", "step", 5),
    # inside turn 3's tool loop: two of its three requests went out, none of them is stored
    Kill("SIGKILL", "send", 8),
    # Ctrl-C the moment a COMMIT returns: the kernel must count what the store holds, and go on from there
    Kill("SIGINT", "commit", 9),
    *random_kills(random.Random(SEED), 1, points=REPLAY_POINTS, signals=("SIGTERM",)),
]


@pytest.mark.parametrize("kill", REPLAY_KILLS, ids=str)
def test_replay_survives(kill, expected, tmp_path):
    trial = replay_trial(tmp_path, kill, expected, turns=2)
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
