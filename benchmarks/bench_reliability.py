"""Reliability under faults (issue 14, item 4): the reliability suite's trials at full count.

- **replay**: ``--trials`` kill trials (default 20) at seeded random points of the suite's scenario
  (``tests/reliability/data/kill_scenario.yaml``: 10 scenario turns with every kind of event, 19 requests),
  spread over the seven strategies and over three chunkings of the replay (its default, one and three scenario
  turns per transaction); mostly SIGKILL, with SIGTERM and SIGINT (Ctrl-C) mixed in. A point is a random call of
  a hook (a request sent, a scenario turn stepped, a COMMIT returned) and, for half the trials, a random delay
  after it (the parent sends the signal). After each trial the store is reopened, every stored
  request must rebuild byte for byte, none may be half-written, and continuing the scenario from the stored
  position to its end must send exactly the uninterrupted run's requests.
- **import**: as many trials of ``lab.import_log`` on 4 generated exchanges logs (``bench_import``'s generator,
  10 requests each, ~20k-token bodies): every stored request must equal the logged body, every session be
  whole or absent, and importing again must give exactly an uninterrupted import's rows.
- **fleet import**: as many trials of ``promptcache-nb import DIRS --out OUT`` (4 folders of generated logs, one
  file group each) killed at a random moment (SIGKILL mostly, SIGTERM and SIGINT mixed in), then run again to its
  end: the dataset must hold exactly an uninterrupted run's ``turns`` and ``sessions`` rows, ``doctor OUT`` find it
  sound, and no ``pcnb-fleet-*`` temporary folder be left.
- **load**: the simulator endpoint and the recording proxy (in front of one), each with 8 threads ×
  ``--requests`` (default 200) mixed requests (SDK calls and streams, malformed JSON, wrong methods and paths,
  bodies over the limit) while 4 clients hold requests that never finish; then a 50 MB body to each at its
  default limit, with the process's peak RSS growth.

- **hardening** (issue 27): store paths that are not regular files (FIFO, devices, a socket) through ``pc.Lab``,
  ``read_only=True``, ``sql`` and ``import``; ``--trials`` Ctrl-Cs at random moments of a deliberately slow
  migration and of a long ``sql`` query (exit 130, no traceback, the migration rolled back, the store reopens);
  ``--trials`` Ctrl-Cs each at random moments of a long ``promptcache-nb import`` (8 logs of 60 requests) and a long
  ``demo`` (3 strategies), timed from the signal to the process gone (exit 130, one line, ``doctor`` clean, sessions
  whole up to a commit, the same command run again stores the uninterrupted run's tables);
  tampered stores (each refused in one line naming the table, column or hash, on open or at first use, and
  flagged by ``doctor``); keys of every documented kind in every URL position through the proxy (and in bodies
  with ``redact_bodies``); bad ``Usage`` numbers, output limits and NUL bytes in scenarios; ``visible()``
  over every code point; and each way a fleet dataset is damaged (``FLEET_DAMAGE`` in the harness: a Parquet file
  deleted, truncated or corrupted, a manifest digest that differs, requests whose session is gone, a prefix cycle,
  a body not JSON): named by ``doctor DIR`` in one line, repaired by the next import; ``doctor DIR`` and a re-import
  with nothing to do timed.

"lost" counts committed requests (a lower bound the child reported before the signal) that were not in the
store after reopening. Prints the figures; exit status 1 when a trial did not survive or a request was
answered wrongly.

    .venv/bin/python benchmarks/bench_reliability.py [--trials 20] [--requests 200] [--seed 14] [--only hardening]
"""

from __future__ import annotations

import argparse
import math
import random
import resource
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reliability"))
import _harness as h  # noqa: E402 - the reliability suite's trial and load machinery

import promptcache_nb as pc  # noqa: E402
from promptcache_nb.fleet._import import _load_manifest  # noqa: E402

LIMIT = 64 * 1024
TIMEOUT = 1.0
MB50 = 50 * 1024 * 1024


def _summary(name: str, trials: list[h.Trial]) -> bool:
    interrupted = [t for t in trials if t.interrupted]
    survived = sum(t.survived for t in trials)
    lost = sum(t.lost for t in trials)
    stored = sorted(t.stored for t in interrupted)
    signals = Counter(t.kill.sig for t in trials)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(signals.items()))
    print(f"{name}: {len(trials)} trials ({kinds}; {len(interrupted)} interrupted before the end), {survived} "
          f"survived, {lost} committed requests lost; requests stored at the signal: {stored}")
    for t in trials:
        if not t.survived:
            print(f"   FAILED {t}")
    return survived == len(trials) and lost == 0


def kill_trials(n: int, seed: int, work: Path) -> bool:
    rng = random.Random(seed)
    signals = ("SIGKILL",) * 6 + ("SIGTERM", "SIGINT")
    t0 = time.perf_counter()
    expected = {name: h.reference_bodies(name) for name in pc.STRATEGIES}
    chunkings = (None, 1, 3)  # Lab.replay's default, and smaller chunks: more commits to land at
    points = {c: h.replay_points(chunk_turns=c) for c in chunkings}
    replay = []
    for i in range(n):
        strategy, chunk = pc.STRATEGIES[i % len(pc.STRATEGIES)], chunkings[i % len(chunkings)]
        kill = h.random_kills(rng, 1, points=points[chunk], signals=signals)[0]
        replay.append(h.replay_trial(work / f"replay-{i}", kill, expected[strategy], strategy=strategy,
                                     chunk_turns=chunk))
    ok = _summary("replay kill trials", replay)
    print(f"   ({time.perf_counter() - t0:.0f} s)")

    t0 = time.perf_counter()
    logs = work / "logs"
    sources = h.write_logs(logs, sessions=4, requests=10)
    reference = h.reference_import(logs, work / "reference.duckdb")
    imports = [h.import_trial(work / f"import-{i}", kill, logs, sources, reference)
               for i, kill in enumerate(h.random_kills(rng, n, points={"record": 40, "commit": 4},
                                                       signals=signals))]
    ok = _summary("import kill trials", imports) and ok
    print(f"   ({time.perf_counter() - t0:.0f} s)")
    return fleet_kill_trials(n, rng, work) and ok


def fleet_kill_trials(n: int, rng: random.Random, work: Path) -> bool:
    """``promptcache-nb import DIRS --out OUT`` (4 folders, one file group each) killed at a random moment (SIGKILL
    mostly, SIGTERM and SIGINT mixed in), then run again: the dataset must equal an uninterrupted run's, ``doctor``
    find it sound, and no temporary folder be left."""
    t0 = time.perf_counter()
    dirs = h.fleet_logs(work / "fleet-logs", folders=4, sessions=2, requests=10)
    reference, span = h.fleet_reference(work / "fleet-reference", dirs)
    signals = ("SIGKILL",) * 6 + ("SIGTERM", "SIGINT")
    # from the first file group's start to the run's end (the span the uninterrupted run took)
    trials = [h.fleet_kill_trial(work / f"fleet-{i}", dirs, reference, sig=rng.choice(signals),
                                 delay=rng.uniform(0.0, span)) for i in range(n)]
    interrupted = [t for t in trials if t.interrupted]
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(Counter(t.sig for t in trials).items()))
    exits = sorted(round(t.to_exit * 1000) for t in interrupted if t.sig != "SIGKILL" and t.to_exit is not None)
    survived = sum(t.survived for t in trials)
    print(f"fleet import kill trials: {len(trials)} trials ({kinds}; {len(interrupted)} interrupted before the end), "
          f"{survived} survived; temporary folders left by the killed run: {sum(t.left_behind for t in trials)} "
          f"(all removed by the next run: {all(t.survived for t in trials)}); file groups recorded before the "
          f"kill: {sorted(t.groups_kept for t in interrupted)} of 4; SIGTERM/SIGINT to exit (ms): {exits}; the "
          f"uninterrupted run's work span {span:.1f} s")
    for t in trials:
        if not t.survived:
            print(f"   FAILED {t}")
    print(f"   ({time.perf_counter() - t0:.0f} s)")
    return survived == len(trials)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _big_body(url: str) -> int:
    """POST a 50 MB body (declared length, sent in 1 MB chunks of one buffer): the status."""
    import httpx

    chunk = b"x" * (1024 * 1024)
    with httpx.Client(timeout=60) as http:
        r = http.post(url + "/v1/messages", content=(chunk for _ in range(50)),
                      headers={"x-api-key": h.FAKE_KEY, "content-length": str(MB50)})
    return r.status_code


def load(requests: int, seed: int, work: Path) -> bool:
    ok = True
    for name in ("server", "proxy"):
        with pc.SimulatorServer(max_body_bytes=LIMIT, request_timeout=TIMEOUT) as server:
            if name == "server":
                report = h.run_load(server.base_url, threads=8, per_thread=requests, max_body_bytes=LIMIT,
                                    request_timeout=TIMEOUT, seed=seed)
            else:
                with pc.RecordingProxy(server.base_url, work / "proxy.jsonl", max_body_bytes=LIMIT,
                                       request_timeout=TIMEOUT) as proxy:
                    report = h.run_load(proxy.url, threads=8, per_thread=requests, max_body_bytes=LIMIT,
                                        request_timeout=TIMEOUT, seed=seed)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(report.sent.items()))
        slow = sum(a.startswith(b"HTTP/1.1 408") for a in report.slow_answers)
        print(f"load on the {name}: 8 threads x {requests} = {report.total} requests ({kinds}) in "
              f"{report.seconds:.1f} s; {len(report.errors)} answered wrongly; p50 {report.percentile(0.5):.0f} ms, "
              f"p99 {report.percentile(0.99):.0f} ms; {len(report.slow_answers)} slow clients: {slow} got 408, "
              f"{len(report.slow_answers) - slow} closed without a request")
        for e in report.errors[:10]:
            print(f"   {e}")
        ok = ok and not report.errors
    before = _peak_rss_mb()
    with pc.SimulatorServer() as server, pc.RecordingProxy(server.base_url, work / "big.jsonl") as proxy:
        statuses = [_big_body(server.base_url), _big_body(proxy.url)]
    grew = _peak_rss_mb() - before
    print(f"a 50 MB body at the default limits: server {statuses[0]}, proxy {statuses[1]}; "
          f"peak RSS of this process (client and both servers) grew {grew:.1f} MB")
    return ok and statuses == [413, 413]


# -- issue 27 --------------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
SLOW_MIGRATION = """
import sys
from promptcache_nb.store._migrations import migration

@migration
def m999_slow_for_bench(con):
    con.execute("CREATE TABLE half_written AS SELECT 1 AS x")
    print("slow", flush=True)
    con.execute("CREATE TABLE slow AS SELECT sum(i) AS s FROM range(100000000000::BIGINT) t(i)")
"""


def _in_thread(fn: object, timeout: float = 20) -> tuple[str, float]:
    """("ok" | "hang" | the exception's class and one-line message, seconds)."""
    import threading

    box: dict[str, str] = {}

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
            box["r"] = "accepted"
        except Exception as exc:  # noqa: BLE001 - reported
            box["r"] = f"{type(exc).__name__}: {exc}"

    t0 = time.perf_counter()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return box.get("r", "hang"), time.perf_counter() - t0


def _odd_paths(work: Path) -> bool:
    import os
    import socket
    import subprocess

    fifo = work / "fifo.duckdb"
    os.mkfifo(fifo)
    sock_path = work / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    paths = [str(fifo), "/dev/zero", "/dev/null", str(sock_path)]
    results = []
    for path in paths:
        for how in ("Lab", "Lab(read_only)", "cli sql", "cli import"):
            if how.startswith("Lab"):
                ro = how.endswith("only)")
                r, secs = _in_thread(lambda p=path, ro=ro: pc.Lab(p, progress=False, read_only=ro))
                good = r.startswith("StoreError") and "not a regular file" in r and "\n" not in r
            else:
                args = (["sql", path, "select 1"] if how == "cli sql"
                        else ["import", path, "--db", str(work / "odd.duckdb"), "--quiet"])
                t0 = time.perf_counter()
                try:
                    res = subprocess.run([sys.executable, "-m", "promptcache_nb.cli", *args], capture_output=True,
                                         text=True, timeout=30, cwd=ROOT)
                    r = res.stderr
                    good = res.returncode == 2 and r.count("\n") == 1 and "not a regular file" in r
                except subprocess.TimeoutExpired:
                    r, good = "hang", False
                secs = time.perf_counter() - t0
            results.append(good)
            if not good:
                print(f"   FAILED {how} {path}: {r.strip()[:200]} ({secs:.1f} s)")
    sock.close()
    print(f"odd store paths (FIFO, /dev/zero, /dev/null, a socket) x (Lab, read_only, sql, import): "
          f"{sum(results)} of {len(results)} refused in one line naming what the path is, none hung")
    return all(results)


def _ctrl_c(n: int, rng: random.Random, work: Path) -> bool:
    import signal
    import subprocess

    import duckdb

    ok_count, latencies = 0, []
    for i in range(n):
        sql = i % 4 == 3  # one in four: a long `sql` query instead of a migration
        db = work / f"ctrl-c-{i}.duckdb"
        pc.Lab(db, progress=False).close()  # an existing store: the slow migration (or the query) is what runs
        if sql:
            code = ("import sys, threading\nfrom promptcache_nb.cli import main\n"
                    "threading.Timer(1.5, lambda: print('slow', flush=True)).start()\n"
                    f"sys.exit(main(['sql', {str(db)!r}, 'SELECT sum(i) FROM range(100000000000::BIGINT) t(i)']))\n")
        else:
            code = SLOW_MIGRATION + ("from promptcache_nb.cli import main\n"
                                     f"sys.exit(main(['replay', 'tiny', '--db', {str(db)!r}, '--quiet']))\n")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT)
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(rng.uniform(0.0, 0.8))
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            print(f"   FAILED trial {i}: the interrupt was ignored for 30 s")
            continue
        latencies.append((time.perf_counter() - t0) * 1000)
        good = proc.returncode == 130 and "Traceback" not in err
        if not sql:
            con = duckdb.connect(str(db), read_only=True)
            names = [r[0] for r in con.execute("SELECT name FROM _migrations").fetchall()]
            tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
            con.close()
            good = good and "m999_slow_for_bench" not in names and "half_written" not in tables
        try:
            pc.Lab(db, progress=False).close() if sql else None
        except pc.errors.PromptCacheError:
            good = False
        ok_count += good
        if not good:
            print(f"   FAILED trial {i}: exit {proc.returncode}: {err.strip()[-300:]}")
    latencies.sort()
    print(f"Ctrl-C during a slow migration ({n - n // 4}) or a long sql query ({n // 4}): {ok_count} of {n} exited "
          f"130 without a traceback, migration rolled back, store reopens; SIGINT to exit p50 "
          f"{latencies[len(latencies) // 2]:.0f} ms, max {latencies[-1]:.0f} ms")
    return ok_count == n


TAMPERS = [
    ("drop column turns.cache_reason", ["ALTER TABLE turns DROP COLUMN cache_reason"]),
    ("drop column sessions.config", ["ALTER TABLE sessions DROP COLUMN config"]),
    ("drop table session_state", ["DROP TABLE session_state"]),
    ("drop table blocks", ["DROP TABLE blocks"]),
    ("empty _migrations", ["DELETE FROM _migrations"]),
    ("drop _migrations", ["DROP TABLE _migrations"]),
    ("NULL block body", ["CREATE TABLE b2 AS SELECT * FROM blocks", "DROP TABLE blocks",
                         "ALTER TABLE b2 RENAME TO blocks", "UPDATE blocks SET body = NULL"]),
    ("delete every block", ["DELETE FROM blocks"]),
    ("delete the first message block", ["DELETE FROM blocks WHERE hash IN (SELECT coalesce(json_extract_string("
                                        "message, '$.str'), json_extract_string(message, '$.blocks[0]')) FROM "
                                        "session_messages)"]),
    ("delete the root prefix nodes", ["DELETE FROM prefix_nodes WHERE parent IS NULL"]),
    ("delete every prefix node", ["DELETE FROM prefix_nodes"]),
    ("sessions.config a JSON array", ["UPDATE sessions SET config = '[1, 2]'"]),
    ("sessions.config a JSON string", ["UPDATE sessions SET config = '\"x\"'"]),
    ("sessions.config a number", ["UPDATE sessions SET config = '3'"]),
]


def _read_everything(path: Path) -> None:
    with pc.Lab(path, progress=False) as lab:
        for sid in lab.store.session_ids():
            s = lab.session(id=sid)
            _ = s.messages
            for idx in range(s.n_turns):
                lab.store.turn_body(sid, idx)


def _tampered(work: Path) -> bool:
    import duckdb

    from promptcache_nb.store import check_store

    sound = work / "sound.duckdb"
    with pc.Lab(sound, progress=False) as lab:
        lab.replay(pc.load_scenario(pc.data_path("scenarios") / "tiny.yaml"), strategy="naive")
    _read_everything(sound)
    good = 0
    for name, statements in TAMPERS:
        path = work / f"tampered-{name.replace(' ', '_')}.duckdb"
        shutil.copy(sound, path)
        con = duckdb.connect(str(path))
        for sql in statements:
            con.execute(sql)
        con.close()
        try:
            _read_everything(path)
            said, kind = "opened and read without a word", None
        except Exception as exc:  # noqa: BLE001 - reported
            said, kind = str(exc), type(exc).__name__
        one_line = kind == "StoreError" and "\n" not in said and f"promptcache-nb doctor {path}" in said
        flagged = not check_store(str(path)).ok
        good += one_line and flagged
        if not (one_line and flagged):
            print(f"   FAILED {name}: {kind}: {said[:200]} (doctor flags it: {flagged})")
    print(f"tampered stores: {good} of {len(TAMPERS)} refused in one line naming the table, column or hash "
          "(on open or at first use) and flagged by `promptcache-nb doctor`")
    return good == len(TAMPERS)


def _redaction(work: Path) -> bool:
    import json
    import socket

    import anthropic

    keys = {kind: k for kind, k in h.fake_keys("SECRET").items() if kind != "bearer"}
    places = ["/v1/models?beta=true;key={k}", "/v1/models?{k}", "/v1/models?beta=true?x={k}",
              "/v1/models?beta=true#{k}", "/v1/{k}/models", "/v1/models?api_key={k}&beta=true",
              "/v1/models?q={k}", "/v1/models;{k}", "/v1/models?a,{k}", "/v1/models?h=Bearer%20{k}"]
    targets = [p.format(k=k) for k in keys.values() for p in places]
    targets += ["/v1/models?k=" + "".join(f"%{b:02X}" for b in k.encode()) for k in keys.values()]
    log_path = work / "redaction.jsonl"
    with pc.SimulatorServer() as api, pc.RecordingProxy(api.base_url, log_path) as proxy:
        host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
        for target in targets:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                while s.recv(65536):
                    pass
    lines = log_path.read_text().splitlines()
    leaked = sum("SECRET" in line for line in lines)
    body_log = work / "bodies.jsonl"
    with pc.SimulatorServer() as api, pc.RecordingProxy(api.base_url, body_log, redact_bodies=True) as proxy, \
            anthropic.Anthropic(base_url=proxy.url, api_key="local", max_retries=0) as client:
        for k in keys.values():
            client.messages.create(model="claude-sonnet-4-5", max_tokens=8, metadata={"user_id": k},
                                   messages=[{"role": "user", "content": f"key {k} and Bearer {k}"}])
    body_leaks = sum("SECRET" in line for line in body_log.read_text().splitlines())
    usable = all(json.loads(line)["usage"] for line in body_log.read_text().splitlines())
    print(f"proxy redaction: {len(targets)} URLs ({len(keys)} key kinds x {len(places) + 1} positions, incl. every "
          f"byte percent-encoded): {len(lines)} lines, {leaked} with a key; {len(keys)} calls with keys in "
          f"metadata and text under --redact-bodies: {body_leaks} with a key, usage kept: {usable}")
    return leaked == 0 and body_leaks == 0 and len(lines) == len(targets) and usable


def _numbers(work: Path) -> bool:
    from promptcache_nb.request.validate import validate_request

    usage_cases = [{"input_tokens": -5}, {"input_tokens": "7"}, {"output_tokens": 1.5}, {"output_tokens": float("nan")},
                   {"cache_read_input_tokens": True}, {"output_tokens": 10**13},
                   {"cache_creation_input_tokens": 5, "cache_creation_5m_input_tokens": 4,
                    "cache_creation_1h_input_tokens": 3}]
    refused = 0
    for kwargs in usage_cases:
        try:
            pc.Usage(**kwargs)
        except pc.errors.UsageError as exc:
            refused += next(iter(kwargs)).split("_5m")[0] in str(exc) or "cache_creation" in str(exc)
    body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}
    limits = [2**70, 2**63, 10**7 + 1]
    limited = sum(len(validate_request({**body, "max_tokens": n})) == 1 for n in limits)
    nul = work / "nul.yaml"
    head, turns = b"name: t\nmodel: claude-sonnet-4-5\n", b"\nturns:\n  - user: hi\n    reply: yo\n"
    nul_cases = [head + b'host_prompt_file: "p\\0.md"' + turns, head + b"host_prompt: s\x00" + turns]
    nul_ok = 0
    for raw in nul_cases:
        nul.write_bytes(raw)
        try:
            pc.load_scenario(nul)
        except pc.errors.ScenarioError as exc:
            nul_ok += str(exc).startswith(f"{nul}:3:")
    print(f"numbers: {refused} of {len(usage_cases)} bad pc.Usage(...) refused as UsageError naming the field; "
          f"{limited} of {len(limits)} output limits beyond any model refused; {nul_ok} of {len(nul_cases)} NUL "
          "bytes in a scenario a file:line error")
    return refused == len(usage_cases) and limited == len(limits) and nul_ok == len(nul_cases)


def _visible() -> bool:
    import unicodedata

    from promptcache_nb.request import diff

    diff._fillers.cache_clear()
    t0 = time.perf_counter()
    fillers = diff._fillers()
    first = time.perf_counter() - t0  # what a process's first non-ASCII text pays
    t0 = time.perf_counter()
    derived = diff._derive_fillers()
    derive = time.perf_counter() - t0
    t0 = time.perf_counter()
    marked = sum(diff.visible(chr(cp)) != chr(cp) for cp in range(0x110000))
    sweep = time.perf_counter() - t0
    listed = [0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x034F, 0x17B4]
    shown = sum(chr(cp) not in diff.visible(f"a{chr(cp)}b") for cp in listed)
    source = "table" if unicodedata.unidata_version in diff._FILLER_RANGES_UNICODE else "derived"
    print(f"visible(): {marked:,} of 1,114,112 code points marked ({len(fillers)} printable fillers and variation "
          f"selectors for unicodedata {unicodedata.unidata_version}, {source}, in {first * 1000:.1f} ms, once; "
          f"deriving them: {derive:.2f} s, {'the same set' if derived == fillers else 'A DIFFERENT SET'}); the "
          f"issue's {len(listed)} fillers: {shown} shown as markers; sweep {sweep:.1f} s")
    return shown == len(listed) and derived == fillers


def _ctrl_c_cli(n: int, rng: random.Random, work: Path) -> bool:
    """Ctrl-C at random moments of a long ``import`` and a long ``demo``: SIGINT to exit, and what is left."""
    logs = work / "cli-logs"
    h.write_logs(logs, sessions=8, requests=60)
    ok = True
    for name in ("import", "demo"):
        def args(i: int, name: str = name) -> tuple[list[str], Path]:
            if name == "import":
                db = work / f"cli-import-{i}.duckdb"
                return ["import", str(logs), "--db", str(db), "--quiet"], db
            out = work / f"cli-demo-{i}"
            return ["demo", "--out", str(out), "--strategies", "naive,durable_delta,volatile_delta", "--quiet"], \
                out / "demo.duckdb"

        ref_args, ref_db = args(-1)
        reference = h.cli_ctrl_c(ref_args, ref_db, delay=math.inf)
        if reference.exitcode != 0:
            print(f"   FAILED: the uninterrupted {name} failed")
            ok = False
            continue
        whole = reference.seconds
        want, want_turns = h.table_digests(ref_db, work), h.stored_turns(ref_db)
        runs, good = [], 0
        for i in range(n):
            cmd, db = args(i)
            run = h.cli_ctrl_c(cmd, db, delay=rng.uniform(0, 0.8 * reference.working))
            runs.append(run)
            problems = h.interrupted_run_problems(run) + h.doctor_problems(db)
            problems += h.partial_problems(db, want_turns, whole=name == "import")
            again = h.cli(cmd)
            if again.returncode != 0 or h.table_digests(db, work) != want:
                problems.append("running it again did not store what an uninterrupted run stores")
            good += not problems
            for p in problems:
                print(f"   FAILED {name} trial {i}: {p}")
        times = sorted(r.to_exit * 1000 for r in runs if r.to_exit is not None)
        shown = f"p50 {times[len(times) // 2]:.0f} ms, max {times[-1]:.0f} ms" if times else "(none interrupted)"
        print(f"Ctrl-C during `{name}` (uninterrupted: {whole:.1f} s): {len(times)} of {n} runs interrupted, "
              f"{good} of {n} exited 130 with one line (or finished), doctor clean, sessions whole up to a commit, "
              f"run again = the uninterrupted tables; SIGINT to exit {shown}")
        ok = ok and good == n
    return ok


def _fleet_damage(work: Path) -> bool:
    """Each way of :data:`h.FLEET_DAMAGE` on a dataset of 8 file groups: ``doctor DIR`` must name it in one line, and
    ``import --out`` run again re-import that group alone and store the undamaged dataset's rows. Also timed, on the
    sound dataset: ``doctor DIR``, a re-import that finds nothing to do, and the same over a manifest that recorded
    no digests (the first reads the rows and records the digests; the next must cost what a re-import does)."""
    dirs = h.fleet_logs(work / "damage-logs", folders=8, sessions=3, requests=10)
    sound = work / "damage-sound"
    pc.fleet.import_logs(dirs, out=sound, progress=False)
    reference = h.fleet_rows(sound)
    ok, found, repaired = True, [], 0
    for how in sorted(h.FLEET_DAMAGE):
        out = work / f"damage-{how}"
        shutil.copytree(sound, out)
        h.damage_dataset(out, how)
        problems = pc.fleet.check_dataset(out).problems
        named = [p for p in problems if h.FLEET_DAMAGE[how] in p]
        found.append(len(problems))
        again = pc.fleet.import_logs(dirs, out=out, progress=False)
        fixed = (sorted(again.groups["status"]) == ["imported"] + ["unchanged"] * 7 and h.fleet_rows(out) == reference
                 and pc.fleet.check_dataset(out).ok)
        repaired += fixed
        if len(named) != 1 or not fixed:
            ok = False
            print(f"   FAILED {how}: doctor said {problems}; repaired: {fixed}")
    print(f"fleet dataset damage: {len(h.FLEET_DAMAGE)} kinds ({', '.join(sorted(h.FLEET_DAMAGE))}); "
          f"{sum(1 for n in found if n)} named by doctor DIR ({min(found)}–{max(found)} lines each), {repaired} "
          "repaired by the next import (that group alone re-imported, the rows the undamaged dataset's)")

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    files = len(list(sound.rglob("*.parquet")))
    doctor = best(lambda: pc.fleet.check_dataset(sound))
    unchanged = best(lambda: pc.fleet.import_logs(dirs, out=sound, progress=False))
    h.without_outputs(sound)  # as a version before digests wrote it: the first import reads the rows
    t0 = time.perf_counter()
    pc.fleet.import_logs(dirs, out=sound, progress=False)
    first = time.perf_counter() - t0
    digests = all(rec.get("outputs") for rec in _load_manifest(str(sound))["groups"].values())
    after = best(lambda: pc.fleet.import_logs(dirs, out=sound, progress=False))
    print(f"   on the sound dataset (8 groups, {len(reference)} rows, {files} Parquet files), best of 3: doctor DIR "
          f"{doctor * 1000:.0f} ms; an import with nothing to do {unchanged * 1000:.0f} ms; over a manifest without "
          f"digests the first {first * 1000:.0f} ms (it reads the rows, then records the digests: {digests}), the "
          f"next {after * 1000:.0f} ms")
    return ok and digests


def hardening(trials: int, seed: int, work: Path) -> bool:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    ok = _odd_paths(work)
    ok = _ctrl_c(trials, rng, work) and ok
    ok = _ctrl_c_cli(trials, rng, work) and ok
    ok = _tampered(work) and ok
    ok = _redaction(work) and ok
    ok = _numbers(work) and ok
    ok = _visible() and ok
    ok = _fleet_damage(work) and ok
    print(f"   ({time.perf_counter() - t0:.0f} s)")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20, help="kill trials each for replay and for import")
    ap.add_argument("--requests", type=int, default=200, help="requests per thread in the load runs")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--only", choices=("kill", "load", "hardening"), help="run one part")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="The model .* is deprecated", category=DeprecationWarning)
    work = Path(tempfile.mkdtemp(prefix="pcnb-reliability-"))
    try:
        ok = True
        if args.only in (None, "kill"):
            ok = kill_trials(args.trials, args.seed, work) and ok
        if args.only in (None, "load"):
            ok = load(args.requests, args.seed, work) and ok
        if args.only in (None, "hardening"):
            ok = hardening(args.trials, args.seed, work) and ok
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
