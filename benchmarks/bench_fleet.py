"""A heavy user's history and a team's fleet (issue 23): import vs the json.loads floor, per-file overhead, peak
memory, workers=1 vs 2, Dask vs one process, and a projection to 1 TB.

Generates a Claude Code history (``_claude_code_history.py``: ``--projects`` x ``--sessions`` transcripts of ~145
requests, ~2.8 MB each; the issue's heavy user is 20 x 10, ~560 MB) and 1,000 one-request transcripts, then
measures each import in a fresh child process (so peak RSS is that import's alone):

- **floor**: ``json.loads`` of every line, CPU;
- ``lab.import_log(folder)`` with ``workers=1`` and ``workers=2`` (CPU of the process and its workers, wall, peak RSS);
- ``pc.fleet.import_logs`` on a ``ProcessPoolExecutor(2)`` and on a Dask ``LocalCluster`` (2 workers): same
  request count and cost as one process;
- analysis over every session: ``pc.rebuilds`` of each session, and SQL over the ``turns`` table;
- **claude-cache-audit** on the same files, when importable (a side directory, as ``bench_peers`` explains:
  ``pip download --no-deps claude-cache-audit`` and unzip it; ``PCNB_CCA=DIR`` names that directory);
- a **projection** (not a measurement) of 1 TB of such logs on 1, 10 and 100 workers from the measured CPU per
  MB and per file, assuming perfect scaling and no I/O limit.

CPU is ``resource`` user+system time of the child and its children, which a shared machine disturbs less than
wall time. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_fleet.py [--projects 20] [--sessions 10] [--small-files 1000] [--dask]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _claude_code_history import write_history, write_session  # noqa: E402


def _usage() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, max(me.ru_maxrss, kids.ru_maxrss) / 1024


def child(job: dict) -> dict:
    """Run one measured job in this (fresh) process; returns its figures."""
    import warnings

    warnings.simplefilter("ignore")
    import promptcache_nb as pc

    cpu0, wall0 = _usage()[0], time.perf_counter()
    out: dict = {}
    if job["kind"] == "floor":
        n = 0
        for f in sorted(Path(job["path"]).rglob("*.jsonl")):
            with f.open("rb") as fh:
                for line in fh:
                    json.loads(line)
                    n += 1
        out["lines"] = n
    elif job["kind"] == "import":
        with pc.Lab(job["db"], progress=False) as lab:
            r = lab.import_log(job["path"], workers=job["workers"])
            out.update(requests=r.requests, cost=float(lab.sql("SELECT sum(cost_usd) AS c FROM turns").c[0] or 0))
    elif job["kind"] == "fleet":
        executor, cluster, client = None, None, None
        if job["engine"] == "process":
            from concurrent.futures import ProcessPoolExecutor

            executor = ProcessPoolExecutor(2)
        elif job["engine"] == "dask":
            from distributed import Client, LocalCluster

            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                   silence_logs=40)
            client = Client(cluster)
            executor = client.get_executor()
        try:
            r = pc.fleet.import_logs(job["path"], out=job["out"], executor=executor, project="bench",
                                     progress=False)
        finally:
            if client is not None:
                client.close()
                cluster.close()
            elif executor is not None:
                executor.shutdown()
        lab = pc.fleet.open(job["out"])
        out.update(requests=r.requests, cost=float(lab.sql("SELECT sum(cost_usd) AS c FROM turns").c[0] or 0))
    elif job["kind"] == "analysis":
        with pc.Lab(job["db"], read_only=True, progress=False) as lab:
            t = time.perf_counter()
            lab.sql("SELECT session_id, count(*), sum(cache_read_input_tokens) / sum(cache_read_input_tokens + "
                    "cache_creation_input_tokens + input_tokens) AS read_pct, sum(cost_usd) FROM turns GROUP BY 1")
            out["sql_s"] = time.perf_counter() - t
            t = time.perf_counter()
            ids = lab.store.session_ids()
            n = sum(len(pc.rebuilds(lab.open_session(i))) for i in ids)
            out.update(rebuilds_s=time.perf_counter() - t, rebuilds=n, sessions=len(ids))
    elif job["kind"] == "cca":
        subprocess.run([sys.executable, "-m", "claude_cache_audit", "--config-dir", job["path"], "--all",
                        "--json"], check=True, stdout=subprocess.DEVNULL, env={**os.environ,
                                                                            "PYTHONPATH": job["cca"]})
    cpu1, rss = _usage()
    out.update(cpu_s=cpu1 - cpu0, wall_s=time.perf_counter() - wall0, peak_rss_mb=rss)
    return out


def run(job: dict) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True,
                         check=False)
    if res.returncode:
        raise SystemExit(f"{job['kind']} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--projects", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--small-files", type=int, default=1000)
    ap.add_argument("--dask", action="store_true", help="also import through a Dask LocalCluster")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    tmp = Path(tempfile.mkdtemp(prefix="pcnb-bench-fleet-"))
    history = tmp / "claude" / "projects"
    files, requests = write_history(history, projects=args.projects, sessions=args.sessions)
    size_mb = sum(f.stat().st_size for f in history.rglob("*.jsonl")) / 1e6
    print(f"history: {files} transcripts in {args.projects} project folders, {requests:,} requests, {size_mb:.0f} MB")
    floor = run({"kind": "floor", "path": str(history)})
    print(f"  floor (json.loads every line): {floor['cpu_s']:.2f} s CPU")
    one = run({"kind": "import", "path": str(history), "db": str(tmp / "w1.duckdb"), "workers": 1})
    print(f"  import workers=1: {one['cpu_s']:.1f} s CPU = {one['cpu_s'] / floor['cpu_s']:.1f}x the floor, "
          f"{one['wall_s']:.1f} s wall, peak RSS {one['peak_rss_mb']:.0f} MB")
    two = run({"kind": "import", "path": str(history), "db": str(tmp / "w2.duckdb"), "workers": 2})
    print(f"  import workers=2: {two['cpu_s']:.1f} s CPU, {two['wall_s']:.1f} s wall = "
          f"{two['wall_s'] / one['wall_s']:.2f}x workers=1's wall, peak RSS {two['peak_rss_mb']:.0f} MB; "
          f"same requests {two['requests'] == one['requests']}, same cost {abs(two['cost'] - one['cost']) < 1e-9}")
    an = run({"kind": "analysis", "db": str(tmp / "w1.duckdb")})
    print(f"  analysis over {an['sessions']} sessions: pc.rebuilds per session {an['rebuilds_s']:.2f} s "
          f"({an['rebuilds']} rebuilds); SQL summary over turns {an['sql_s'] * 1000:.0f} ms")
    cca = os.environ.get("PCNB_CCA")
    if cca:
        peer = run({"kind": "cca", "path": str(history.parent), "cca": cca})
        print(f"  claude-cache-audit 0.1.0 --all --json, same files: {peer['cpu_s']:.1f} s CPU, "
              f"{peer['wall_s']:.1f} s wall, peak RSS {peer['peak_rss_mb']:.0f} MB")
    else:
        print("  claude-cache-audit: not measured (set PCNB_CCA to an unzipped claude-cache-audit wheel)")
    for engine in ("process", *(("dask",) if args.dask else ())):
        fl = run({"kind": "fleet", "engine": engine, "path": str(history), "out": str(tmp / f"fleet-{engine}")})
        print(f"  pc.fleet on {engine} (2 workers): {fl['wall_s']:.1f} s wall, {fl['cpu_s']:.1f} s CPU; "
              f"same requests {fl['requests'] == one['requests']}, same cost {abs(fl['cost'] - one['cost']) < 1e-6}")

    import random
    from datetime import UTC, datetime

    small = tmp / "small" / "projects" / "-home-dev-many"
    small.mkdir(parents=True)
    rng = random.Random(3)
    for i in range(args.small_files):
        write_session(small / f"s{i:05d}.jsonl", project_dir="-home-dev-many", rng=rng, requests=1,
                      start=datetime(2026, 9, 1, tzinfo=UTC), tool_result_lines=20)
    sfloor = run({"kind": "floor", "path": str(small)})
    simp = run({"kind": "import", "path": str(small), "db": str(tmp / "small.duckdb"), "workers": 1})
    per_file_ms = (simp["cpu_s"] - sfloor["cpu_s"]) / args.small_files * 1000
    print(f"{args.small_files} one-request transcripts: import {simp['cpu_s']:.1f} s CPU, floor "
          f"{sfloor['cpu_s']:.2f} s: {per_file_ms:.1f} ms CPU per file above the floor")

    cpu_per_mb = (one["cpu_s"] - per_file_ms / 1000 * files) / size_mb
    print("projection (computed from the figures above, not measured): 1 TB of such transcripts "
          f"(~{1e6 / size_mb * files:,.0f} files at {size_mb / files:.1f} MB each)")
    tb_files = 1e6 / size_mb * files
    total_cpu = 1e6 * cpu_per_mb + tb_files * per_file_ms / 1000
    for workers in (1, 10, 100):
        print(f"  {workers:>3} workers: {total_cpu / workers / 3600:,.1f} h (perfect scaling, no I/O limit)")


if __name__ == "__main__":
    main()
