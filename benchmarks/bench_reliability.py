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
- **load**: the simulator endpoint and the recording proxy (in front of one), each with 8 threads ×
  ``--requests`` (default 200) mixed requests (SDK calls and streams, malformed JSON, wrong methods and paths,
  bodies over the limit) while 4 clients hold requests that never finish; then a 50 MB body to each at its
  default limit, with the process's peak RSS growth.

"lost" counts committed requests (a lower bound the child reported before the signal) that were not in the
store after reopening. Prints the figures; exit status 1 when a trial did not survive or a request was
answered wrongly.

    .venv/bin/python benchmarks/bench_reliability.py [--trials 20] [--requests 200] [--seed 14]
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reliability"))
import _harness as h  # noqa: E402 - the reliability suite's trial and load machinery

import promptcache_nb as pc  # noqa: E402

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
    return ok


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20, help="kill trials each for replay and for import")
    ap.add_argument("--requests", type=int, default=200, help="requests per thread in the load runs")
    ap.add_argument("--seed", type=int, default=14)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="The model .* is deprecated", category=DeprecationWarning)
    work = Path(tempfile.mkdtemp(prefix="pcnb-reliability-"))
    try:
        ok = kill_trials(args.trials, args.seed, work)
        ok = load(args.requests, args.seed, work) and ok
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
