from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import signal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import promptcache_nb as pc
from promptcache_nb.request import canonical_bytes

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "data" / "scenarios"
REFERENCE = SCENARIOS / "support_agent.yaml"

# A run started in the background of a non-interactive shell (`make test &`, `(cmd &)`) inherits SIGINT ignored,
# and so would every process a test starts: the Ctrl-C tests would then see runs that never stop and fail for a
# reason outside the code. The tests send Ctrl-C as a terminal would, to a process that has the default handling.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- the offline endpoint, one per test module ---------------------------------------------------------------
@pytest.fixture(scope="module")
def _module_simulator() -> Iterator[pc.SimulatorServer]:
    with pc.SimulatorServer() as server:
        yield server


@pytest.fixture
def simulator(_module_simulator: pc.SimulatorServer) -> pc.SimulatorServer:
    """The module's simulator endpoint, handed to each test as a fresh one would be: ``reset()`` forgets every
    cache, the served requests and any injected error. One uvicorn server per module: stopping one costs ~0.15 s
    of its shutdown polls, and no test stops the shared one (a test needing other settings starts its own)."""
    _module_simulator.reset()
    return _module_simulator


@pytest.fixture
def scenarios_dir() -> Path:
    return SCENARIOS


@pytest.fixture
def reference_scenario() -> Path:
    return REFERENCE


# -- replays shared by the whole run -------------------------------------------------------------------
# Many tests only read what a replay stored. Each (scenario, strategy, cache) they need is replayed once per
# test run (the first worker to ask replays it, under a file lock; the others wait for it and reuse the
# file), each in its own fresh file-backed Lab: session ids, and so tool_use ids and bytes, depend on what
# else a Lab holds. A test opens its own copy (`stored_session`), so nothing it writes reaches another test.
# Tests that check what a replay *sends* (byte identity, restarts) still replay themselves, and compare
# with these stored runs.


@dataclass(frozen=True)
class StoredReplay:
    path: Path  # the shared file: only ever copied, never opened
    session_id: str
    sent: tuple[bytes, ...]  # every request body the replay sent (canonical bytes), in order


class _Recording(pc.live.DirectSimulator):
    """The default backend (the in-process simulator), keeping the bytes of every request it sends."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, request, *, at, cache):
        response = super().send(request, at=at, cache=cache)
        self.sent.append(canonical_bytes(request.body))
        return response


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # one directory for all the workers of this run (pytest-xdist's recipe)
    out = base / "replays"
    out.mkdir(exist_ok=True)
    return out


class StoredReplays:
    """``stored_replay(strategy, scenario=..., cache=...)``: the file holding that replay, made once per run;
    ``stored_replay.many(strategies, ...)``: several, the ones no other worker is making first."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[tuple[str, str, str], StoredReplay] = {}

    def __call__(self, strategy: str, scenario: str | Path = REFERENCE, cache: str = "anthropic") -> StoredReplay:
        got = self._get(strategy, Path(scenario), cache, wait=True)
        assert got is not None
        return got

    def many(self, strategies: Iterable[str], scenario: str | Path = REFERENCE,
             cache: str = "anthropic") -> dict[str, StoredReplay]:
        names = list(strategies)
        # first the ones no other worker is replaying now, then wait for the rest
        out = {n: got for n in names if (got := self._get(n, Path(scenario), cache, wait=False)) is not None}
        return {n: out[n] if n in out else self(n, scenario, cache) for n in names}

    def _get(self, strategy: str, path: Path, cache: str, *, wait: bool) -> StoredReplay | None:
        key = (str(path), strategy, cache)
        if key not in self.made:
            db = self.root / f"{path.stem}-{strategy}-{cache}.duckdb"
            done = db.with_suffix(".session")
            with open(db.with_suffix(".lock"), "w") as lock:
                try:  # released when the file closes
                    fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return None
                sent = db.with_suffix(".sent")
                if not done.exists():
                    for leftover in (db, db.with_name(db.name + ".wal")):  # from an interrupted attempt
                        leftover.unlink(missing_ok=True)
                    backend = _Recording()
                    with pc.Lab(db, progress=False) as lab:
                        sid = lab.replay(path, strategy=strategy, cache=cache, backend=backend).id
                    sent.write_bytes(pickle.dumps(backend.sent))
                    done.write_text(sid)
            self.made[key] = StoredReplay(db, done.read_text(), tuple(pickle.loads(sent.read_bytes())))
        return self.made[key]


@pytest.fixture(scope="session")
def stored_replay(tmp_path_factory: pytest.TempPathFactory) -> StoredReplays:
    return StoredReplays(_shared_dir(tmp_path_factory))


@pytest.fixture
def stored_session(stored_replay: StoredReplays,
                   tmp_path: Path) -> Iterator[Callable[..., pc.Session]]:
    """``stored_session(strategy, scenario=..., cache=...)``: that replay's session, in a Lab on this test's own
    copy of the stored file (``session._lab``; closed when the test ends)."""
    labs: list[pc.Lab] = []

    def open_copy(strategy: str, scenario: str | Path = REFERENCE, cache: str = "anthropic") -> pc.Session:
        stored = stored_replay(strategy, scenario, cache)
        copy = tmp_path / f"replayed{len(labs)}-{stored.path.name}"
        shutil.copyfile(stored.path, copy)
        wal = stored.path.with_name(stored.path.name + ".wal")
        if wal.exists():
            shutil.copyfile(wal, copy.with_name(copy.name + ".wal"))
        lab = pc.Lab(copy, progress=False)
        labs.append(lab)
        return lab.session(id=stored.session_id)

    yield open_copy
    for lab in labs:
        lab.close()


# -- slow tests first ----------------------------------------------------------------------------------
# `slow` (pyproject): cross-process, subprocess, wheel and browser tests. They run in `make test`;
# `make test-fast` is the quick loop. Tests marked here rather than in their modules (each kills a child process
# at chosen points, or starts worker processes):
SLOW_TESTS = {("test_kill.py", "test_replay_survives"), ("test_kill.py", "test_import_survives"),
              # worker processes (a pool of 2 starting interpreters): 5-12 s each
              ("test_fleet.py", "test_a_process_pool_writes_the_same_dataset"),
              ("test_fleet.py", "test_import_log_with_two_workers_stores_what_one_process_stores"),
              ("test_fleet.py", "test_cli_imports_a_fleet_on_worker_processes")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (item.path.name, getattr(item, "originalname", item.name)) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
        if item.path.parent.name == "reliability":  # trials of kills, locks, load and fuzzing: `make test-fast` skips
            item.add_marker(pytest.mark.reliability)
    # The slowest tests start first (the browser test, up to a minute or more, before all), so none of them is
    # left running alone on one worker at the end. A stable sort: the order is otherwise unchanged.
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.get_closest_marker("browser") is None))


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; no error when xdist is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n 2`` (``make test``) balances by work stealing rather than pytest-xdist's default ``--dist load``.

    ``load`` sends each worker a first batch of a quarter of its share of consecutive tests (some 135 here) and
    never takes back what it sent: every ``slow`` test above, the browser's minute included, lands in the first
    worker's first batch, which stays balanced only while that batch is under half the run. ``worksteal``
    splits the list in two halves, and a worker that runs out takes the second half of the other's queue, so
    the two finish together however long the slow tests get (measured: within 0.5 s, as against 2 s with
    ``load``). Scheduling only: the same tests run. Any other ``--dist`` (``loadgroup``, ``each``, ...) is
    left alone."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)
