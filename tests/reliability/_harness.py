"""What the reliability suite (``tests/reliability``) and ``benchmarks/bench_reliability.py`` share.

**Kill trials.** A replay or an import runs in a child process and a signal lands at a chosen point: the
``count``-th call of a hook (``send``: a request went out and is about to be stored; ``step``: a scenario
turn's events are applied and its requests about to be built; ``commit``: a COMMIT has just returned;
``record``: an imported request is about to be stored), sent by the child itself at that exact call, or
by the parent a random ``delay`` after it. A replay writes in chunks of scenario turns (``chunk_turns``; a
trial runs with the default or a smaller one, so that kills land at many chunk commits). Children are forked from a forkserver that has promptcache_nb
imported, so a trial costs a fork instead of an interpreter start; each is a real process with its own
DuckDB connection to a real file. Afterwards the parent reopens the store and checks that every committed
request rebuilds byte for byte, that nothing is half-written, and that the work continued from what was
stored sends exactly the requests an uninterrupted run sends. A SIGINT child (a Ctrl-C in a notebook) also
checks that its in-memory sessions agree with the store, and continues in the same process.

**Load.** Many clients at once against the simulator endpoint or the recording proxy, mixed with malformed,
oversized, misrouted and slow (never finished) requests: every answer is checked, and the slow ones must be
timed out while the others keep being answered.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

import promptcache_nb as pc
from promptcache_nb.ingest import _import as _ingest
from promptcache_nb.live import DirectSimulator
from promptcache_nb.request import canonical_bytes
from promptcache_nb.widgets import StepperController

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SCENARIO = HERE / "data" / "kill_scenario.yaml"
STRATEGY = "durable_delta"  # the strategy with the most state in the store (pins, deltas)

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_import  # noqa: E402 - the benchmarks' log generator: one exchanges log per agent session

#: A key no test anywhere else uses: grep for it in files, logs, messages and reprs.
FAKE_KEY = "fake-key-RELIABILITY-do-not-use-000"


def fake_keys(tag: str) -> dict[str, str]:
    """Values shaped like each provider's API keys (what the proxy's redaction must recognise), with ``tag`` inside
    so a test can search for them. Assembled at run time: no key-shaped literal sits in the repository for a secret
    scanner to flag. None of them is, or was, a real key."""
    body = f"{tag}key0000aaaa1111bbbb"
    return {
        "anthropic": "sk-" + "ant-api03-" + body + "_cc-DD",
        "openai": "sk-" + "proj-" + body,
        "openai legacy": "sk-" + body + "22223333",
        "google": "AI" + "zaSy" + body + "_cc",
        "bearer": f"{tag}bearer.token-0000",
        "jwt": "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiJ" + f"{tag}fQ.c2lnbmF0dXJl{tag}",
    }
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- processes ---------------------------------------------------------------------------------------------
_CTX: Any = None


def context() -> Any:
    """The multiprocessing context trials run in: forked from a server that imported this module once."""
    global _CTX
    if _CTX is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        _CTX = ctx
    return _CTX


@dataclass(frozen=True)
class Kill:
    """Where a trial's signal lands: the ``count``-th call of hook ``point``, ``delay`` seconds later (None: at
    that very call, sent by the child to itself)."""

    sig: str
    point: str
    count: int
    delay: float | None = None

    def __str__(self) -> str:
        when = "" if self.delay is None else f" +{self.delay * 1000:.0f} ms"
        return f"{self.sig} at {self.point} #{self.count}{when}"


@dataclass
class Trial:
    """One kill trial: what was stored, what a lower bound says was committed, and what went wrong."""

    kind: str
    kill: Kill
    exitcode: int | None = None
    stored: int = 0
    committed: int = 0  # requests the child saw committed before the signal (a lower bound)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def interrupted(self) -> bool:
        return self.exitcode not in (0, None)

    @property
    def lost(self) -> int:
        """Committed requests that did not come back after reopening."""
        return max(0, self.committed - self.stored)

    @property
    def survived(self) -> bool:
        return not self.problems and not self.lost

    def __str__(self) -> str:
        state = "ok" if self.survived else "; ".join(self.problems) or f"lost {self.lost}"
        return (f"{self.kind} {self.kill}: exit {self.exitcode}, {self.stored} stored "
                f"(>= {self.committed} committed), {state}")


class _Trigger:
    """Counts a hook's calls (shared with the parent) and, for a self-delivered kill, signals at the count."""

    def __init__(self, kill: Kill, progress: Any) -> None:
        self.kill, self.progress, self.calls = kill, progress, 0

    def __call__(self, point: str) -> None:
        if point != self.kill.point:
            return
        self.calls += 1
        self.progress.value = self.calls
        if self.kill.delay is None and self.calls == self.kill.count:
            os.kill(os.getpid(), SIGNALS[self.kill.sig])  # SIGINT: KeyboardInterrupt raised right here


class _CommitHook:
    """The store's connection, calling ``after()`` each time a COMMIT returns."""

    def __init__(self, con: Any, after: Any) -> None:
        self._con, self._after = con, after

    def commit(self) -> Any:
        result = self._con.commit()
        self._after("commit")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


class RecordingBackend(DirectSimulator):
    """The in-process simulator, keeping the canonical bytes of every request it was sent."""

    def __init__(self, after: Any = None) -> None:
        self.bodies: list[bytes] = []
        self._after = after

    def send(self, request: Any, *, at: Any, cache: Any) -> Any:
        response = super().send(request, at=at, cache=cache)
        self.bodies.append(canonical_bytes(request.body))
        if self._after is not None:
            self._after("send")
        return response


def _start(target: Any, *args: Any) -> tuple[Any, Any, Any]:
    ctx = context()
    progress, committed = ctx.RawValue("q", 0), ctx.RawValue("q", 0)
    proc = ctx.Process(target=target, args=(*args, progress, committed), daemon=True)
    proc.start()
    return proc, progress, committed


def _deliver(proc: Any, kill: Kill, progress: Any, *, timeout: float) -> None:
    """The parent's side of a delayed kill: wait for the hook's count, then the delay, then signal."""
    if kill.delay is None:
        return
    deadline = time.monotonic() + timeout
    while proc.is_alive() and progress.value < kill.count and time.monotonic() < deadline:
        time.sleep(0.0005)
    time.sleep(kill.delay)
    if proc.is_alive():
        with suppress(ProcessLookupError):
            os.kill(proc.pid, SIGNALS[kill.sig])


def _finish(proc: Any, trial: Trial, *, timeout: float) -> None:
    proc.join(timeout)
    if proc.is_alive():
        trial.problems.append(f"still running {timeout:.0f} s after the signal: killed")
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    trial.exitcode = proc.exitcode
    # done, killed by a signal, or exit 130 after a Ctrl-C: any other status is the child failing on its own
    # (its traceback is on stderr), which must not pass for an interrupted trial
    if trial.exitcode is not None and trial.exitcode > 0 and trial.exitcode != 130:
        trial.problems.append(f"the child failed (exit {trial.exitcode}; its traceback is above)")


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _stored_in_sync(lab: pc.Lab) -> list[str]:
    """Sessions whose open object disagrees with the store (request count, pending events)."""
    out = []
    for sid in lab.sessions().id:
        s = lab.active_session(sid)
        if s is None:
            continue
        n = lab.store.one("SELECT count(*) FROM turns WHERE session_id = ?", [sid])[0]
        pending = [r[0] for r in lab.store.rows(
            "SELECT code FROM session_pending_events WHERE session_id = ? ORDER BY seq", [sid])]
        if s.n_turns != n or list(s.pending_events) != list(pending):
            out.append(f"{sid}: object has {s.n_turns} requests {list(s.pending_events)} pending, "
                       f"store {n} {pending}")
    return out


# -- replay trials -----------------------------------------------------------------------------------------
def scenario() -> pc.Scenario:
    return pc.load_scenario(SCENARIO)


def turn_starts(sc: pc.Scenario) -> list[int]:
    """Index of each scenario turn's first request, and the total: the only request counts a store may hold."""
    starts = [0]
    for turn in sc.turns:
        starts.append(starts[-1] + 1 + len(turn.tool_calls))
    return starts


def replay_points(strategy: str = STRATEGY, chunk_turns: int | None = None) -> dict[str, int]:
    """How many times each replay hook is called in an uninterrupted replay (an in-memory Lab): the range of a
    random kill's ``count``. COMMITs: the session and its knowledge set-up, then one per chunk."""
    counts = dict.fromkeys(("send", "step", "commit"), 0)

    def count(point: str) -> None:
        counts[point] += 1

    real_step = pc.Session.step

    def step(self: pc.Session, *args: Any, **kwargs: Any) -> Any:
        count("step")
        return real_step(self, *args, **kwargs)

    pc.Session.step = step  # type: ignore[method-assign]
    try:
        with pc.Lab(progress=False) as lab:
            lab.store.con = _CommitHook(lab.store.con, count)
            lab.replay(scenario(), strategy=strategy, backend=RecordingBackend(count), **_chunking(chunk_turns))
            lab.store.con = lab.store.con._con
    finally:
        pc.Session.step = real_step  # type: ignore[method-assign]
    return counts


def _chunking(chunk_turns: int | None) -> dict[str, int]:
    """``Lab.replay``'s keyword for ``chunk_turns`` (None: its default)."""
    return {} if chunk_turns is None else {"chunk_turns": chunk_turns}


def reference_bodies(strategy: str = STRATEGY) -> list[bytes]:
    """Every request of an uninterrupted replay, in order (an in-memory Lab)."""
    rec = RecordingBackend()
    with pc.Lab(progress=False) as lab:
        lab.replay(scenario(), strategy=strategy, backend=rec)
    return rec.bodies


def continue_replay(lab: pc.Lab, strategy: str, backend: RecordingBackend, turns: int | None = None) -> int:
    """Go on with an interrupted replay from what the store holds, for ``turns`` scenario turns (None: to the
    end); returns the request it went on from.

    Nothing stored: the replay runs again (a re-run cell; it derives the same ids, so the same bytes).
    Otherwise the stored session continues the scenario from its position (``StepperController``).
    """
    sc = scenario()
    sessions = lab.sessions()
    mine = sessions[sessions.project_id == f"{sc.project}/{strategy}"]
    s = lab.session(id=str(mine.id.iloc[0]), backend=backend) if len(mine) else None
    if s is None or s.n_turns == 0:
        lab.replay(sc, strategy=strategy, backend=backend, stop_after=turns)
        return 0
    n = s.n_turns
    if n not in turn_starts(sc):
        raise AssertionError(f"half-written: {n} requests stored, inside a scenario turn")
    StepperController(s, sc).run(turns)
    return n


def _replay_child(db: str, strategy: str, kill: Kill, report: str, turns: int | None, chunk_turns: int | None,
                  progress: Any, committed: Any) -> None:
    trigger = _Trigger(kill, progress)
    rec = RecordingBackend(trigger)
    real_step, real_atomic, real_batch = pc.Session.step, pc.Lab.atomic, pc.Lab.batch

    def step(self: pc.Session, *args: Any, **kwargs: Any) -> Any:
        trigger("step")
        return real_step(self, *args, **kwargs)

    def counted(real: Any) -> Any:
        @contextmanager
        def block(self: pc.Lab) -> Any:
            with real(self):
                yield
            committed.value = len(rec.bodies)  # a chunk of scenario turns commits all it sent, or nothing
        return block

    def unpatch() -> None:
        pc.Session.step, pc.Lab.atomic, pc.Lab.batch = real_step, real_atomic, real_batch  # type: ignore[method-assign]

    pc.Session.step, pc.Lab.atomic, pc.Lab.batch = step, counted(real_atomic), counted(real_batch)  # type: ignore[method-assign]
    try:
        with pc.Lab(db, progress=False) as lab:
            lab.store.con = _CommitHook(lab.store.con, trigger)
            try:
                lab.replay(SCENARIO, strategy=strategy, backend=rec, **_chunking(chunk_turns))
            except RuntimeError as exc:  # DuckDB's stand-in for a Ctrl-C during a statement must not escape
                _write_json(report, {"interrupted": True, "raised": repr(exc)})
                raise
            except KeyboardInterrupt:
                # Ctrl-C in a notebook: the kernel lives on. Its objects must agree with the store, and going
                # on from there (in the same process) must send what an uninterrupted run sends.
                out: dict[str, Any] = {"interrupted": True, "out_of_step": _stored_in_sync(lab)}
                unpatch()
                lab.store.con = lab.store.con._con
                again = RecordingBackend()
                out["from"] = continue_replay(lab, strategy, again, turns)
                out["sent"] = [sha(b) for b in again.bodies]
                _write_json(report, out)
                raise SystemExit(130) from None
    except KeyboardInterrupt:  # landed while opening or closing the Lab
        _write_json(report, {"interrupted": True, "outside": True})
        raise SystemExit(130) from None


def replay_trial(workdir: Path, kill: Kill, expected: list[bytes], *, strategy: str = STRATEGY,
                 turns: int | None = None, chunk_turns: int | None = None, timeout: float = 120) -> Trial:
    """Replay in a child (``chunk_turns`` scenario turns per transaction; None: ``Lab.replay``'s default),
    deliver ``kill``, then reopen the store, check it and continue from it for ``turns`` scenario turns (None: to
    the end)."""
    workdir.mkdir(parents=True, exist_ok=True)
    db, report = workdir / "replay.duckdb", workdir / "report.json"
    trial = Trial(f"replay/{strategy}" + ("" if chunk_turns is None else f"/chunks of {chunk_turns}"), kill)
    t0 = time.perf_counter()
    proc, progress, committed = _start(_replay_child, str(db), strategy, kill, str(report), turns, chunk_turns)
    _deliver(proc, kill, progress, timeout=timeout)
    _finish(proc, trial, timeout=timeout)
    trial.committed = committed.value
    child = _read_json(report) or {}
    if child.get("raised"):
        trial.problems.append(f"the Ctrl-C surfaced as {child['raised']}, not as KeyboardInterrupt")
    if child.get("out_of_step"):
        trial.problems.append("after Ctrl-C the session objects disagree with the store: "
                              + "; ".join(child["out_of_step"]))
    sc = scenario()
    starts = turn_starts(sc)

    def went_on(start: int, sent: list[str], how: str) -> None:
        """``sent`` (digests) must be the uninterrupted run's requests from ``start`` on, ``turns`` turns' worth."""
        first = starts.index(start)
        end = starts[len(sc.turns) if turns is None else min(len(sc.turns), first + turns)]
        want = [sha(b) for b in expected[start:end]]
        if sent != want:
            bad = next((i for i, (a, b) in enumerate(zip(sent, want, strict=False)) if a != b), min(len(sent), len(want)))
            trial.problems.append(f"{how} from request {start}: request {start + bad} differs from the uninterrupted "
                                  f"run's ({len(sent)} sent, {len(want)} expected)")

    try:
        with pc.Lab(db, progress=False) as lab:
            sessions = lab.sessions()
            mine = sessions[sessions.project_id == f"{sc.project}/{strategy}"]
            s = lab.session(id=str(mine.id.iloc[0])) if len(mine) else None
            n = s.n_turns if s is not None else 0
            trial.stored = n
            if "sent" in child:  # it went on in the same process after Ctrl-C
                trial.stored = child["from"]
                went_on(child["from"], child["sent"], "after Ctrl-C, going on in the same process")
            if n not in starts:
                trial.problems.append(f"half-written: {n} requests stored, inside a scenario turn")
            for i in range(n):
                if s.turn(i).body != expected[i]:  # type: ignore[union-attr]
                    trial.problems.append(f"stored request {i} does not rebuild byte for byte")
                    break
            if "sent" not in child and not trial.problems:
                rec = RecordingBackend()
                start = continue_replay(lab, strategy, rec, turns)
                went_on(start, [sha(b) for b in rec.bodies], "going on after reopening")
    except pc.PromptCacheError as exc:
        trial.problems.append(f"store does not reopen: {exc}")
    trial.seconds = time.perf_counter() - t0
    return trial


# -- import trials -----------------------------------------------------------------------------------------
def write_logs(folder: Path, *, sessions: int = 4, requests: int = 8) -> dict[str, list[dict[str, Any]]]:
    """``sessions`` exchanges logs (one agent session each, ``requests`` lines); returns file -> request bodies."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for k in range(sessions):
        path = folder / f"agent-{k}.jsonl"
        bench_import.generate(path, requests)
        with path.open(encoding="utf-8") as fh:
            out[str(path)] = [json.loads(line)["request"] for line in fh]
    return out


def turns_table(lab: pc.Lab) -> Any:
    """Every stored request row, in a fixed order: what two imports of the same logs must agree on."""
    return lab.sql("SELECT * FROM turns ORDER BY session_id, idx")


def reference_import(folder: Path, db: Path) -> Any:
    # the deep import: its kill points are inside each request's recording (Session.record); the usage-first
    # import's transactions are the same batches (tests/test_usage_first.py kills an analysis midway)
    with pc.Lab(db, progress=False) as lab:
        lab.import_log(str(folder), deep=True)
        return turns_table(lab)


def _import_child(db: str, folder: str, kill: Kill, report: str, progress: Any, committed: Any) -> None:
    trigger = _Trigger(kill, progress)
    real_record, real_store = pc.Session.record, _ingest._store_batch

    def record(self: pc.Session, *args: Any, **kwargs: Any) -> Any:
        trigger("record")
        return real_record(self, *args, **kwargs)

    def store_batch(*args: Any, **kwargs: Any) -> Any:
        new = real_store(*args, **kwargs)
        committed.value += new  # a batch of sessions commits its requests together, on return
        return new

    pc.Session.record, _ingest._store_batch = record, store_batch  # type: ignore[method-assign]
    try:
        with pc.Lab(db, progress=False) as lab:
            lab.store.con = _CommitHook(lab.store.con, trigger)
            try:
                lab.import_log(folder, deep=True)
            except RuntimeError as exc:
                _write_json(report, {"interrupted": True, "raised": repr(exc)})
                raise
            except KeyboardInterrupt:
                out: dict[str, Any] = {"interrupted": True, "out_of_step": _stored_in_sync(lab),
                                       "stored": lab.store.one("SELECT count(*) FROM turns")[0]}
                pc.Session.record, _ingest._store_batch = real_record, real_store  # type: ignore[method-assign]
                lab.store.con = lab.store.con._con
                res = lab.import_log(folder, deep=True)  # the user runs the cell again in the same kernel
                out.update(again=res.requests, already=res.already_stored)
                _write_json(report, out)
                raise SystemExit(130) from None
    except KeyboardInterrupt:
        _write_json(report, {"interrupted": True, "outside": True})
        raise SystemExit(130) from None


def import_trial(workdir: Path, kill: Kill, logs: Path, sources: dict[str, list[dict[str, Any]]],
                 reference: Any, *, timeout: float = 120) -> Trial:
    """Import ``logs`` in a child, deliver ``kill``, then reopen, check every stored request and import again."""
    workdir.mkdir(parents=True, exist_ok=True)
    db, report = workdir / "import.duckdb", workdir / "report.json"
    trial = Trial("import", kill)
    t0 = time.perf_counter()
    proc, progress, committed = _start(_import_child, str(db), str(logs), kill, str(report))
    _deliver(proc, kill, progress, timeout=timeout)
    _finish(proc, trial, timeout=timeout)
    trial.committed = committed.value
    child = _read_json(report) or {}
    if child.get("raised"):
        trial.problems.append(f"the Ctrl-C surfaced as {child['raised']}, not as KeyboardInterrupt")
    if child.get("out_of_step"):
        trial.problems.append("after Ctrl-C the session objects disagree with the store: "
                              + "; ".join(child["out_of_step"]))
    total = sum(len(v) for v in sources.values())
    try:
        with pc.Lab(db, progress=False) as lab:
            stored = 0
            for sid in lab.sessions().id:
                s = lab.session(id=sid)
                want = sources[s.source.split(":", 1)[1]]
                stored += s.n_turns
                if s.n_turns != len(want):
                    trial.problems.append(f"half-written: session {sid} holds {s.n_turns} of {len(want)} requests")
                for i in range(s.n_turns):
                    if s.turn(i).request != want[i]:
                        trial.problems.append(f"{sid} request {i} does not rebuild as logged")
                        break
            if "again" in child:  # imported again in the same process after Ctrl-C
                trial.stored = child["stored"]
                if child["again"] + child["already"] != total:
                    trial.problems.append(f"importing again after Ctrl-C: {child['again']} new + "
                                          f"{child['already']} already stored != {total}")
            else:
                trial.stored = stored
                res = lab.import_log(str(logs), deep=True)
                if (res.requests, res.already_stored) != (total - stored, stored):
                    trial.problems.append(f"importing again stored {res.requests} and found {res.already_stored}; "
                                          f"expected {total - stored} and {stored}")
            final = turns_table(lab)
            if not final.equals(reference):
                trial.problems.append("after importing again the requests differ from an uninterrupted import")
    except pc.PromptCacheError as exc:
        trial.problems.append(f"store does not reopen: {exc}")
    trial.seconds = time.perf_counter() - t0
    return trial


def random_kills(rng: random.Random, n: int, *, points: dict[str, int], signals: tuple[str, ...] = ("SIGKILL",),
                 max_delay: float = 0.03) -> list[Kill]:
    """``n`` kills at random points: a random signal of ``signals``, a random hook and call (``points``: hook ->
    calls in a whole run), delivered by the parent after a random delay (about half) or by the child at that
    very call."""
    kills = []
    for _ in range(n):
        point = rng.choice(sorted(points))
        count = rng.randint(1, points[point])
        delay = round(rng.uniform(0, max_delay), 4) if rng.random() < 0.5 else None
        kills.append(Kill(rng.choice(signals), point, count, delay))
    return kills


# -- load --------------------------------------------------------------------------------------------------
MODEL = "claude-sonnet-4-5"
LONG = "You are a careful support agent for a billing platform. Answer from the ledger only. " * 120


def messages_body(text: str = "Where is invoice 42?") -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64,
            "system": [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": text}]}


def raw_http(url: str, data: bytes, *, wait: float = 5.0) -> bytes:
    """Send raw bytes to an ``http://host:port`` URL and read until the server closes (or ``wait`` passes)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@dataclass
class LoadReport:
    """What a load run sent and how each kind of request was answered."""

    sent: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    slow_answers: list[bytes] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.sent.values())

    def percentile(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


#: kind -> (weight, expected status). "messages" goes through the anthropic SDK; the rest through httpx.
MIX = {"messages": (10, 200), "stream": (2, 200), "malformed": (1, 400), "wrong_method": (1, 405),
       "wrong_path": (1, 404), "oversized": (1, 413)}


def run_load(url: str, *, threads: int = 8, per_thread: int = 25, max_body_bytes: int, slow: int = 4,
             request_timeout: float = 1.0, seed: int = 0, key: str = FAKE_KEY) -> LoadReport:
    """``threads`` clients × ``per_thread`` requests (mixed as ``MIX``) while ``slow`` clients each hold a request
    that never finishes (half of them stop inside the headers, half inside the body).

    The slow ones must be answered 408 (or closed, when not even the headers arrived) within about
    ``request_timeout``; every other request must get its expected status and, for messages, the simulated
    reply with its usage.
    """
    import anthropic
    import httpx

    report = LoadReport()
    lock = threading.Lock()
    kinds = [k for k, (w, _) in MIX.items() for _ in range(w)]

    def worker(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        with anthropic.Anthropic(base_url=url, api_key=f"{key}-{n}", max_retries=0) as client, \
                httpx.Client(base_url=url, headers={"x-api-key": f"{key}-{n}"}, timeout=30) as http:
            for i in range(per_thread):
                kind = rng.choice(kinds)
                t = time.perf_counter()
                try:
                    got, ok = _one(kind, client, http, f"worker {n} question {i}", max_body_bytes)
                except Exception as exc:  # noqa: BLE001 - every failure is counted and shown, never raised
                    got, ok = f"{type(exc).__name__}: {str(exc)[:120]}", False
                dt = time.perf_counter() - t
                with lock:
                    report.sent[kind] += 1
                    report.latencies.append(dt)
                    if not ok:
                        report.errors.append(f"{kind}: expected {MIX[kind][1]}, got {got}")

    def slow_client(i: int) -> bytes:
        head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: " + key.encode() + b"\r\n"
        if i % 2:
            head += b"Content-Length: 500\r\n\r\n{\"model\": "  # stops inside the body
        return raw_http(url, head, wait=request_timeout * 6 + 5)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, slow)) as slow_pool:
        pending = [slow_pool.submit(slow_client, i) for i in range(slow)]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(worker, range(threads)))
        for i, f in enumerate(pending):
            answer = f.result()
            report.slow_answers.append(answer)
            expected_408 = bool(i % 2)
            if expected_408 and not answer.startswith(b"HTTP/1.1 408"):
                report.errors.append(f"slow body: expected 408, got {answer[:40]!r}")
            if not expected_408 and answer and not answer.startswith((b"HTTP/1.1 408", b"HTTP/1.1 400")):
                report.errors.append(f"slow headers: expected a close or 408, got {answer[:40]!r}")
    report.seconds = time.perf_counter() - t0
    return report


def _one(kind: str, client: Any, http: Any, text: str, max_body_bytes: int) -> tuple[Any, bool]:
    expected = MIX[kind][1]
    if kind == "messages":
        msg = client.messages.create(**messages_body(text))
        u = msg.usage
        good = (msg.content[0].text == "(simulated reply)" and u.input_tokens is not None
                and (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0) + u.input_tokens > 1024)
        return (200 if good else f"bad answer {msg.content!r} {u!r}"), good
    if kind == "stream":
        with client.messages.stream(**messages_body(text)) as stream:
            reply = "".join(stream.text_stream)
            final = stream.get_final_message()
        good = reply == "(simulated reply)" and final.usage.output_tokens > 0
        return (200 if good else f"bad stream {reply!r}"), good
    # The refused requests go on a connection of their own (``connection: close``): a server may close a
    # keep-alive connection after refusing a request, and one this client reuses at that instant is reset by the
    # peer before any answer (a race of the client's pool seen about once in four loaded `make test` runs, not a
    # wrong answer); each refusal's status and error body are still checked.
    close = {"connection": "close"}
    if kind == "malformed":
        r = http.post("/v1/messages", content=b'{"model": "claude-sonnet-4-5", "messages": [', headers=close)
    elif kind == "wrong_method":
        r = http.request(random.choice(["DELETE", "PUT", "PATCH"]), "/v1/messages", headers=close)
    elif kind == "wrong_path":
        r = http.post("/v1/nothing/here", json=messages_body(text), headers=close)
    else:  # oversized
        # a server answers 413 without reading the body and closes the connection: like any HTTP client that
        # knows it is about to be refused, say so, so the closed connection is not reused for the next request
        r = http.post("/v1/messages", content=b"x" * (max_body_bytes + 1), headers={"connection": "close"})
    try:
        typed = r.json().get("error", {}).get("type") or r.json().get("error", {}).get("code")
    except ValueError:
        typed = None
    return r.status_code, r.status_code == expected and bool(typed)


# -- locks -------------------------------------------------------------------------------------------------
def _hold(db: str, read_only: bool, ready: Any, release: Any, turns: Any) -> None:
    with pc.Lab(db, progress=False, read_only=read_only) as lab:
        turns.value = int(lab.sql("SELECT count(*) AS n FROM turns").n[0])
        ready.set()
        release.wait(60)


@contextmanager
def held(db: Path, *, read_only: bool) -> Any:
    """Another process holding ``db`` open (read-write, or as a read-only viewer) until the block ends;
    yields (its pid, the number of requests it read)."""
    ctx = context()
    ready, release, turns = ctx.Event(), ctx.Event(), ctx.RawValue("q", -1)
    proc = ctx.Process(target=_hold, args=(str(db), read_only, ready, release, turns), daemon=True)
    proc.start()
    try:
        if not ready.wait(60):
            raise AssertionError(f"the holder of {db} did not open it (exit {proc.exitcode})")
        yield proc.pid, turns.value
    finally:
        release.set()
        proc.join(30)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)


# -- Ctrl-C at the command line ----------------------------------------------------------------------------
@dataclass
class CliRun:
    """One ``promptcache-nb`` run in its own process, Ctrl-C'd (SIGINT) ``delay`` seconds after its store's WAL
    appeared (the store open, its first transaction committed), unless it finished first."""

    args: list[str]
    delay: float
    exitcode: int | None = None
    stderr: str = ""
    to_exit: float | None = None  # seconds from SIGINT to the process gone; None when it ended before the signal
    seconds: float = 0.0  # start to exit
    working: float = 0.0  # from the store's WAL appearing to the signal, or to the WAL's end when no signal was sent

    @property
    def interrupted(self) -> bool:
        return self.to_exit is not None


def cli(args: list[str], *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``promptcache-nb ARGS`` as a user runs it (``python -m promptcache_nb.cli``: ``main()`` reads the command
    line), to the end."""
    return subprocess.run([sys.executable, "-W", "ignore", "-m", "promptcache_nb.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=_cli_env(), timeout=timeout)


def _cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def cli_ctrl_c(args: list[str], store: Path, *, delay: float, timeout: float = 300) -> CliRun:
    """Run ``promptcache-nb ARGS`` and press Ctrl-C ``delay`` seconds after ``store``'s WAL appears (``math.inf``:
    never; ``working`` then says how long the store was open, its WAL present: the span to draw delays from)."""
    run = CliRun(args, delay)
    wal = Path(str(store) + ".wal")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-m", "promptcache_nb.cli", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_cli_env())
    try:
        while proc.poll() is None and not wal.exists() and time.perf_counter() - t0 < timeout:
            time.sleep(0.002)
        t_wal = t_open = time.perf_counter()
        while proc.poll() is None and time.perf_counter() - t_wal < min(delay, timeout):
            if wal.exists():
                t_open = time.perf_counter()
            time.sleep(0.002)
        run.working = t_open - t_wal  # while the store was open (a demo writes its report after closing it)
        # no WAL: the store is closed, the work done and the process leaving; a signal now may reach a process
        # the kernel is already tearing down (exit 0 after the signal), which says nothing about Ctrl-C handling
        if proc.poll() is None and delay < timeout and wal.exists():
            sent = time.perf_counter()
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout)
            run.to_exit = time.perf_counter() - sent
        _, run.stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    run.exitcode = proc.returncode
    run.seconds = time.perf_counter() - t0
    return run


def interrupted_run_problems(run: CliRun) -> list[str]:
    """What is wrong with how a Ctrl-C'd run ended: it must exit 130 with one line saying what was kept (a run
    that finished before the signal must have succeeded, silently on stderr)."""
    if not run.interrupted:
        return [] if run.exitcode == 0 else [f"finished before the signal with exit {run.exitcode}: {run.stderr}"]
    problems = []
    if run.exitcode != 130:
        problems.append(f"exit {run.exitcode}, not 130")
    lines = run.stderr.strip().splitlines()
    if len(lines) != 1 or not lines[0].startswith("promptcache-nb: interrupted"):
        problems.append(f"stderr is not one 'interrupted' line: {run.stderr.strip()[-400:]!r}")
    return problems


def doctor_problems(store: Path) -> list[str]:
    """``promptcache-nb doctor STORE`` must find the store sound. Its check (``check_store``) runs here, in this
    process: the command is that check and a print (``tests/test_doctor.py`` runs the command), and a process per
    trial would add ~0.6 s of interpreter start-up each time to the Ctrl-C trials."""
    from promptcache_nb.store import check_store

    try:
        report = check_store(str(store))
    except pc.errors.PromptCacheError as exc:  # the command's exit 2: the file cannot be opened at all
        return [f"doctor: {exc}"]
    return [] if report.ok else ["doctor: " + " / ".join(report.lines())]


def table_digests(store: Path, root: Path) -> dict[str, str]:
    """The golden-table digest of every table of ``store`` (``tests/test_golden_tables.py``: one sha256 per table,
    wall-clock columns left out, ``root`` normalised)."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from test_golden_tables import table_digests as digests
    finally:
        sys.path.remove(str(REPO / "tests"))
    with pc.Lab(store, progress=False, read_only=True) as lab:
        return digests(lab, root)


def stored_turns(store: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every stored request row by session, in order."""
    with pc.Lab(store, progress=False, read_only=True) as lab:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for row in lab.store.rows("SELECT * FROM turns ORDER BY session_id, idx"):
            out.setdefault(row[0], []).append(row)
        return out


def partial_problems(store: Path, reference: dict[str, list[tuple[Any, ...]]], *, whole: bool) -> list[str]:
    """Each session ``store`` holds must be the reference run's session of the same id cut at a commit: every
    request row equal, and (``whole``) all of them (an imported session commits whole)."""
    if not store.exists():  # an interrupted run keeps its store; what happened is in the exit and stderr problems
        return [f"no store at {store.name} after the run"]
    problems = []
    for sid, rows in stored_turns(store).items():
        want = reference.get(sid)
        if want is None:
            problems.append(f"session {sid} is not in the uninterrupted run")
        elif rows != want[:len(rows)]:
            problems.append(f"session {sid}: its {len(rows)} stored requests differ from the uninterrupted run's")
        elif whole and len(rows) != len(want):
            problems.append(f"session {sid} half-written: {len(rows)} of {len(want)} requests")
    return problems


# -- fleet imports killed --------------------------------------------------------------------------------------
@dataclass
class FleetTrial:
    """One ``promptcache-nb import DIRS --out OUT`` killed (``sig``) ``delay`` seconds after it started, then run
    again to its end: the dataset must hold exactly an uninterrupted run's rows, ``doctor OUT`` find it sound,
    and no temporary folder of the killed run be left."""

    sig: str
    delay: float
    interrupted: bool = False
    left_behind: int = 0  # temporary folders the killed run left (the next run removes them)
    groups_kept: int = 0  # file groups the killed run had recorded (the next run leaves them unchanged)
    problems: list[str] = field(default_factory=list)
    to_exit: float | None = None

    @property
    def survived(self) -> bool:
        return not self.problems


def fleet_logs(folder: Path, *, folders: int = 4, sessions: int = 2, requests: int = 8) -> list[Path]:
    """``folders`` folders of generated exchanges logs (each passed on its own: one file group, one task)."""
    out = []
    for k in range(folders):
        write_logs(folder / f"dev-{k}", sessions=sessions, requests=requests)
        out.append(folder / f"dev-{k}")
    return out


def fleet_rows(out: Path) -> list[str]:
    """Every ``turns`` and ``sessions`` row of a fleet dataset, canonically ordered."""
    with pc.fleet.open(out, progress=False) as lab:
        rows = []
        for table in ("turns", "sessions"):
            df = lab.sql(f"SELECT * FROM {table}")
            rows += sorted(table + "\x1f" + "\x1f".join(map(repr, r)) for r in df.itertuples(index=False))
    return rows


def _fleet_cli(dirs: list[Path], out: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    tmp.mkdir(parents=True, exist_ok=True)
    return ([sys.executable, "-W", "ignore", "-m", "promptcache_nb.cli", "import", *map(str, dirs), "--out", str(out),
             "--quiet"], {**_cli_env(), "TMPDIR": str(tmp)})


def _wait_for_work(proc: subprocess.Popen[str], tmp: Path, timeout: float) -> float:
    """Wait until the import's first temporary folder appears (its first file group begins); that moment."""
    t0 = time.perf_counter()
    while proc.poll() is None and not any(tmp.glob("pcnb-fleet-*")) and time.perf_counter() - t0 < timeout:
        time.sleep(0.002)
    return time.perf_counter()


def fleet_reference(workdir: Path, dirs: list[Path], *, timeout: float = 300) -> tuple[list[str], float]:
    """An uninterrupted ``promptcache-nb import DIRS --out OUT``: its dataset's rows (:func:`fleet_rows`) and the
    seconds from its first file group's start to its exit (the span to draw kill delays from)."""
    args, env = _fleet_cli(dirs, workdir / "fleet", workdir / "tmp")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    began = _wait_for_work(proc, workdir / "tmp", timeout)
    _, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the reference fleet import failed: {err}")
    return fleet_rows(workdir / "fleet"), time.perf_counter() - began


def fleet_kill_trial(workdir: Path, dirs: list[Path], reference: list[str], *, sig: str, delay: float,
                     timeout: float = 300) -> FleetTrial:
    """:class:`FleetTrial`, the signal sent ``delay`` seconds after the first file group began (its temporary folder
    appeared); the killed run and the run after it share ``workdir/tmp`` as their TMPDIR."""
    trial = FleetTrial(sig, delay)
    out, tmp = workdir / "fleet", workdir / "tmp"
    args, env = _fleet_cli(dirs, out, tmp)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        began = _wait_for_work(proc, tmp, timeout)
        while proc.poll() is None and time.perf_counter() - began < delay:
            time.sleep(0.002)
        if proc.poll() is None:
            sent = time.perf_counter()
            proc.send_signal(getattr(signal, sig))
            proc.wait(timeout)
            trial.to_exit = time.perf_counter() - sent
            trial.interrupted = True
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if trial.interrupted and sig == "SIGINT":
        lines = stderr.strip().splitlines()
        if proc.returncode != 130 or len(lines) != 1 or not lines[0].startswith("promptcache-nb: interrupted"):
            trial.problems.append(f"Ctrl-C: exit {proc.returncode}, stderr {stderr.strip()[-300:]!r}")
    trial.left_behind = len(list(tmp.glob("pcnb-fleet-*")))
    manifest = _read_json(out / "_fleet.json")
    trial.groups_kept = len(manifest["groups"]) if manifest else 0
    again = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)
    if again.returncode != 0:
        trial.problems.append(f"the run after the kill failed: {again.stderr.strip()[-300:]}")
        return trial
    if list(tmp.glob("pcnb-fleet-*")):
        trial.problems.append(f"temporary folders left after the next run: {sorted(p.name for p in tmp.iterdir())}")
    report = pc.fleet.check_dataset(out)
    if not report.ok:
        trial.problems.append(f"doctor: {report.problems}")
    got = fleet_rows(out)
    if got != reference:
        trial.problems.append(f"the dataset differs from an uninterrupted run's: {len(got)} rows, "
                              f"{len(reference)} expected, {len(set(got) ^ set(reference))} differ")
    return trial


# -- a damaged fleet dataset ------------------------------------------------------------------------------------------
#: Each way :func:`damage_dataset` damages a dataset, and what ``doctor DIR`` must say of it (in one line).
FLEET_DAMAGE = {
    "delete": "is missing",  # a turns file deleted
    "truncate": "(truncated or rewritten), not readable as Parquet",  # a turns file cut in half
    "corrupt": "changed since it was written",  # a turns file, the same size, 64 bytes flipped
    "manifest": "changed since it was written",  # a turns file as written, the manifest's digest of it changed
    "no_sessions": "turns.session_id not in sessions",  # a group's sessions files deleted, a manifest without digests
    "cycle": "prefix_nodes.parent runs in a cycle",  # a group's first chain made a loop, a manifest without digests
    "not_json": "blocks.body not JSON",  # a group's block body replaced with '{not json'
}


def damage_dataset(out: Path, how: str) -> Path:
    """Damage the fleet dataset ``out`` as :data:`FLEET_DAMAGE` ``how`` says; the file damaged (or deleted)."""
    turns = sorted((out / "turns").rglob("*.parquet"))[0]
    if how == "delete":
        turns.unlink()
    elif how == "truncate":
        turns.write_bytes(turns.read_bytes()[: turns.stat().st_size // 2])
    elif how == "corrupt":
        data = bytearray(turns.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
        turns.write_bytes(bytes(data))
    elif how == "manifest":
        rel = turns.relative_to(out).as_posix()
        manifest = json.loads((out / "_fleet.json").read_text())
        for rec in manifest["groups"].values():
            rec["outputs"] = [[r, size, "0" * 64 if r == rel else sha] for r, size, sha in rec["outputs"]]
        (out / "_fleet.json").write_text(json.dumps(manifest))
    elif how == "no_sessions":
        without_outputs(out)
        sessions = sorted((out / "sessions").rglob("*.parquet"))
        group = sessions[0].name.split("_")[0]
        for f in sessions:
            if f.name.startswith(group + "_"):
                f.unlink()
        return sessions[0]
    elif how == "cycle":  # the first chain's root made the child of its own child
        without_outputs(out)
        victim = sorted((out / "prefix_nodes").glob("*.parquet"))[0]
        _rewrite_parquet(victim, "SELECT * REPLACE (CASE WHEN parent IS NULL THEN (SELECT min(id) FROM t c WHERE "
                                 "c.parent = (SELECT min(id) FROM t WHERE parent IS NULL)) ELSE parent END AS parent) "
                                 "FROM t")
        return victim
    elif how == "not_json":
        victim = sorted((out / "blocks").glob("*.parquet"))[0]
        _rewrite_parquet(victim, "SELECT * REPLACE (CASE WHEN hash = (SELECT min(hash) FROM t) THEN '{not json' "
                                 "ELSE body END AS body) FROM t")
        return victim
    else:
        raise ValueError(f"no damage {how!r}")
    return turns


def without_outputs(out: Path) -> None:
    """The manifest as a version that recorded no Parquet files wrote it (no size or digest to check against)."""
    manifest = json.loads((out / "_fleet.json").read_text())
    for rec in manifest["groups"].values():
        rec.pop("outputs", None)
    (out / "_fleet.json").write_text(json.dumps(manifest))


def _rewrite_parquet(path: Path, select: str) -> None:
    """Write ``path`` again as ``select`` makes it from its own rows (``t``)."""
    con = duckdb.connect()
    try:
        con.execute(f"CREATE TABLE t AS SELECT * FROM read_parquet('{path}')")
        con.execute(f"COPY ({select}) TO '{path}' (FORMAT parquet)")
    finally:
        con.close()
