"""A heavy user's history and a team's fleet (issues 23 and 37): the usage-first import vs the json.loads floor and
claude-cache-audit, the deep pass on 1 and 2 workers, the stored tables after it vs a deep import, and the fleet.

Generates a Claude Code history (``_claude_code_history.py``: ``--projects`` x ``--sessions`` transcripts of ~145
requests, ~2.8 MB each; the issue's heavy user is 20 x 10, ~560 MB, 200 sessions) under the temporary folder (or
reuses ``--history DIR``), then measures each step in a fresh child process (so peak RSS is that step's alone):

- **floor**: ``json.loads`` of every line, CPU;
- the **usage-first import** ``lab.import_log(folder)`` as a user calls it (``workers`` not given: the build decides;
  CPU of the process and its workers, wall, peak RSS), and the same import on ``workers=1`` when that was more;
- **claude-cache-audit** (and tokenol, ccusage when given) on the same files: :func:`import_vs_peers`, shared with
  ``bench_peers.py --claude-code-history``;
- the **deep pass**: ``lab.analyze(workers=1)`` and ``lab.analyze(workers=2)``, each on its own copy of the
  usage-first store; then a **deep import** ``lab.import_log(folder, deep=True)`` and every column of ``turns``,
  ``sessions``, ``blocks`` and ``prefix_nodes`` compared with SQL between the analysed store and the deep one;
- unless ``--targets-only``: ``pc.rebuilds(lab)`` (every session) and SQL
  over ``turns`` straight after the usage-first import, on the store opened read-only; ``pc.fleet.import_logs`` on
  a ``ProcessPoolExecutor(2)`` (``--no-fleet`` skips it) and on a Dask ``LocalCluster`` (``--dask``);
  ``--small-files`` one-request transcripts and a **projection** (not a measurement) of 1 TB of such logs on 1, 10
  and 100 workers from the measured CPU per MB and per file, assuming perfect scaling and no I/O limit.

A build without ``lab.analyze`` or ``import_log(..., deep=True)`` (before issue 37's import lands) is measured as
it is: its ``import_log`` is the full import, the deep pass says it was not measured, and the tables of two full
imports are compared.

CPU is ``resource`` user+system time of the child and its children, which a shared machine disturbs less than
wall time. Wall is given twice: of the call alone, and from the child's start with the package import (what a
user waits for, less the interpreter's own start). Prints figures and, at the end, PASS / FAIL per target of
issue 37's "Done when"; asserts nothing.

    .venv/bin/python benchmarks/bench_fleet.py [--projects 20] [--sessions 10] [--history DIR] [--targets-only]
        [--no-fleet] [--dask] [--small-files 1000] [--keep]

Peers (each optional; a line says how to get a missing one): ``PCNB_CCA=DIR`` puts an unzipped claude-cache-audit
wheel (``pip download --no-deps claude-cache-audit`` and unzip it) or a side venv's site-packages on the path of
its child; ``PCNB_TOKENOL=EXE`` a ``tokenol`` executable from a side venv; ``PCNB_CCUSAGE=EXE`` a ``ccusage``
executable (``npm install ccusage@17`` in a side folder: its 20.x needs a native package per platform).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the child's start, before any import: "with package import" walls count from here

import argparse  # noqa: E402
import contextlib  # noqa: E402
import inspect  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _claude_code_history import write_history, write_session  # noqa: E402

#: Issue 37's "Done when", for the summary.
FLOOR_MULTIPLE = 2.0
PEAK_RSS_MB = 300.0
ANALYZE_WALL_RATIO = 0.6
#: The tables the golden-table test pins that the import writes, with the columns a row is known by; and the
#: sessions awaiting analysis (none after ``analyze``, none after a deep import; a build before it has no such table).
GOLDEN_TABLES = {"turns": ("session_id", "idx"), "sessions": ("id",), "blocks": ("hash",), "prefix_nodes": ("id",),
                 "unanalysed_sessions": ("session_id",)}


@dataclass(frozen=True)
class Target:
    """One target of the summary: ``passed`` is None when it was not measured."""

    name: str
    figure: str
    passed: bool | None


def _usage() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, max(me.ru_maxrss, kids.ru_maxrss) / 1024


class _Meter:
    """CPU, wall and peak RSS of this process and its children from construction to :meth:`stop`."""

    def __init__(self) -> None:
        self.cpu0, self.wall0 = _usage()[0], time.perf_counter()

    def stop(self) -> dict[str, float]:
        cpu, rss = _usage()
        now = time.perf_counter()
        return {"cpu_s": cpu - self.cpu0, "wall_s": now - self.wall0, "start_wall_s": now - STARTED,
                "peak_rss_mb": rss}


def api() -> tuple[bool, bool]:
    """(``import_log`` takes ``deep=``, ``Lab.analyze`` exists) in this build."""
    import promptcache_nb as pc

    return "deep" in inspect.signature(pc.Lab.import_log).parameters, hasattr(pc.Lab, "analyze")


def _import(job: dict[str, Any]) -> dict[str, Any]:
    import promptcache_nb as pc

    loaded_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the package alone, before any import
    # workers None: the call as a user writes it (a build that decides the processes itself decides; what it
    # decides is asked just before, as the load average stands then)
    chosen = {} if job["workers"] is None else {"workers": job["workers"]}
    try:
        from promptcache_nb.ingest._parallel import auto_workers
    except ImportError:  # a build before issue 37's runs: one process unless told
        workers = job["workers"] or 1
    else:
        workers = job["workers"] or (1 if job.get("deep") else auto_workers(job["path"]))
    meter = _Meter()
    with pc.Lab(job["db"], progress=False) as lab:
        r = lab.import_log(job["path"], **chosen, **({"deep": True} if job.get("deep") else {}))
    out: dict[str, Any] = {**meter.stop(), "workers": workers}
    with pc.Lab(job["db"], read_only=True, progress=False) as lab:
        row = lab.sql("SELECT count(DISTINCT session_id) AS s, sum(cost_usd) AS c, "
                      "sum(cache_read_input_tokens) AS r FROM turns")
    out.update(requests=r.requests, sessions=int(row.s[0]), cost=float(row.c[0] or 0), cache_read=int(row.r[0] or 0),
               loaded_mb=loaded_mb)
    return out


def _analyze(job: dict[str, Any]) -> dict[str, Any]:
    import promptcache_nb as pc

    meter = _Meter()
    with pc.Lab(job["db"], progress=False) as lab:
        analysed = lab.analyze(workers=job["workers"], progress=False)
    out: dict[str, Any] = {**meter.stop(), "analysed": analysed}
    if job.get("again"):  # nothing is left to analyse: a second call finds no session
        with pc.Lab(job["db"], progress=False) as lab:
            out["again"] = lab.analyze(workers=1, progress=False)
    return out


def _cca(job: dict[str, Any]) -> dict[str, Any]:
    if job.get("cca"):
        sys.path.insert(0, job["cca"])
    from claude_cache_audit import __version__, cli

    printed = io.StringIO()
    meter = _Meter()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        status = cli.main(["--config-dir", job["config"], "--all", "--json"])
    out: dict[str, Any] = meter.stop()
    if status:
        raise RuntimeError(f"claude-cache-audit exited {status}")
    report = json.loads(printed.getvalue())
    out.update(version=__version__, requests=report["totals"]["requests"],
               cache_read=report["usage_split"]["cache_read"]["tokens"])
    return out


def _command(job: dict[str, Any]) -> dict[str, Any]:
    """A peer's whole process: CPU, wall and peak RSS are its own (this light child imports nothing heavy)."""
    wall0 = time.perf_counter()
    res = subprocess.run(job["argv"], env={**os.environ, **job.get("env", {})}, capture_output=True, text=True,
                         check=False)
    wall = time.perf_counter() - wall0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode:
        raise RuntimeError(f"{job['argv'][0]} exited {res.returncode}: {res.stderr[-300:]}")
    return {"cpu_s": kids.ru_utime + kids.ru_stime, "wall_s": wall, "peak_rss_mb": kids.ru_maxrss / 1024,
            "stdout": res.stdout[-200_000:]}


def _floor(job: dict[str, Any]) -> dict[str, Any]:
    meter = _Meter()
    n = 0
    for f in sorted(Path(job["path"]).rglob("*.jsonl")):
        with f.open("rb") as fh:
            for line in fh:
                json.loads(line)
                n += 1
    return {**meter.stop(), "lines": n}


def compare_tables(analysed: str, deep: str, *, spill: str) -> dict[str, str]:
    """Per golden table: "identical (N rows x C columns)" or its first difference, every column compared in SQL
    (``EXCEPT ALL`` both ways: rows as a multiset, NULLs equal)."""
    import duckdb

    con = duckdb.connect(config={"memory_limit": "1GB", "threads": 2, "temp_directory": spill,
                                 "preserve_insertion_order": False})
    for name, path in (("analysed", analysed), ("deep", deep)):
        con.execute(f"ATTACH '{path.replace(chr(39), chr(39) * 2)}' AS {name} (READ_ONLY)")
    out = {}
    for table, key in GOLDEN_TABLES.items():
        cols = {db: [c for (c,) in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = ? AND table_schema = 'main' "
            "AND table_name = ? ORDER BY ordinal_position", [db, table]).fetchall()] for db in ("analysed", "deep")}
        if not cols["analysed"] and not cols["deep"]:
            out[table] = "in neither store (this build has no such table)"
            continue
        if cols["analysed"] != cols["deep"]:
            only = {db: sorted(set(cols[db]) - set(cols[other]))
                    for db, other in (("analysed", "deep"), ("deep", "analysed"))}
            out[table] = (f"columns differ: only in the analysed store {only['analysed']}, only in the deep one "
                          f"{only['deep']}" + ("" if any(only.values()) else " (the same columns, in another order)"))
            continue
        names = cols["analysed"]
        select = ", ".join(f'"{c}"' for c in names)
        rows = {db: con.execute(f"SELECT count(*) FROM {db}.main.{table}").fetchone()[0]  # type: ignore[index]
                for db in ("analysed", "deep")}
        only = {db: f"SELECT {select} FROM {db}.main.{table} EXCEPT ALL SELECT {select} FROM {other}.main.{table}"
                for db, other in (("analysed", "deep"), ("deep", "analysed"))}
        extra = {db: con.execute(f"SELECT count(*) FROM ({q})").fetchone()[0]  # type: ignore[index]
                 for db, q in only.items()}
        if not any(extra.values()):
            out[table] = f"identical ({rows['analysed']:,} rows x {len(names)} columns)"
            continue
        side, other = ("analysed", "deep") if extra["analysed"] else ("deep", "analysed")
        order = ", ".join(f'"{k}"' for k in key)
        found = con.execute(f"SELECT * FROM ({only[side]}) ORDER BY {order} LIMIT 1").fetchone()
        first = dict(zip(names, found, strict=True))  # type: ignore[arg-type]
        where = " AND ".join(f'"{k}" IS NOT DISTINCT FROM ?' for k in key)
        twin = con.execute(f"SELECT {select} FROM {other}.main.{table} WHERE {where} LIMIT 1",
                           [first[k] for k in key]).fetchone()
        at = ", ".join(f"{k}={first[k]!r}" for k in key)
        counts = (f"{extra['analysed']:,} rows only in the analysed store, {extra['deep']:,} only in the deep one; "
                  f"{rows['analysed']:,} vs {rows['deep']:,} rows")
        if twin is None:
            out[table] = f"first difference: the row {at} is only in the {side} store ({counts})"
            continue
        second = dict(zip(names, twin, strict=True))
        differ = [c for c in names if first[c] != second[c]]
        if not differ:  # the same row, more often in one store than in the other
            seen = {db: con.execute(f"SELECT count(*) FROM {db}.main.{table} WHERE {where}",  # type: ignore[index]
                                    [first[k] for k in key]).fetchone()[0] for db in ("analysed", "deep")}
            out[table] = (f"first difference: the row {at} is stored {seen['analysed']} times in the analysed store, "
                          f"{seen['deep']} in the deep one ({counts})")
            continue
        mine, theirs = (first, second) if side == "analysed" else (second, first)
        c = differ[0]
        a, b = str(mine[c]), str(theirs[c])
        i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        cut = max(0, i - 20)  # long values (a config's JSON) differ late: show where
        where_text = f" from character {cut}" if cut else ""
        out[table] = (f"first difference at {at}: column {c}{where_text}: analysed {a[cut:cut + 80]!r} vs deep "
                      f"{b[cut:cut + 80]!r}" + (f" (and {len(differ) - 1} more columns)" if differ[1:] else "")
                      + f" ({counts})")
    con.close()
    return out


def _identity(job: dict[str, Any]) -> dict[str, Any]:
    meter = _Meter()
    tables = compare_tables(job["analysed"], job["deep"], spill=job["spill"])
    return {**meter.stop(), "tables": tables}


def _rebuilds(job: dict[str, Any]) -> dict[str, Any]:
    import promptcache_nb as pc

    out: dict[str, Any] = {}
    with pc.Lab(job["db"], read_only=True, progress=False) as lab:
        t = time.perf_counter()
        lab.sql("SELECT session_id, count(*), sum(cache_read_input_tokens) / sum(cache_read_input_tokens + "
                "cache_creation_input_tokens + input_tokens) AS read_pct, sum(cost_usd) FROM turns GROUP BY 1")
        out["sql_s"] = time.perf_counter() - t
        t = time.perf_counter()  # every session in one query: opening each one would analyse it first
        table = pc.rebuilds(lab)
        out.update(rebuilds_s=time.perf_counter() - t, rebuilds=len(table), sessions=len(lab.store.session_ids()))
    return out


def _fleet(job: dict[str, Any]) -> dict[str, Any]:
    import promptcache_nb as pc

    meter = _Meter()
    executor: Any = None
    cluster: Any = None
    client: Any = None
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
        r = pc.fleet.import_logs(job["path"], out=job["out"], executor=executor, project="bench", progress=False)
    finally:
        if client is not None:
            client.close()
            cluster.close()
        elif executor is not None:
            executor.shutdown()
    out: dict[str, Any] = meter.stop()
    lab = pc.fleet.open(job["out"])
    out.update(requests=r.requests, cost=float(lab.sql("SELECT sum(cost_usd) AS c FROM turns").c[0] or 0))
    return out


JOBS = {"floor": _floor, "import": _import, "analyze": _analyze, "cca": _cca, "command": _command,
        "identity": _identity, "rebuilds": _rebuilds, "fleet": _fleet}


def child(job: dict[str, Any]) -> dict[str, Any]:
    """Run one measured job in this (fresh) process; returns its figures."""
    import warnings

    warnings.simplefilter("ignore")
    return JOBS[job["kind"]](job)


def run(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` in a fresh child process: its figures, or ``{"error": ...}`` (the run goes on without them)."""
    res = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True,
                         check=False)
    if res.returncode:
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"exit {res.returncode}", "stderr": res.stderr[-3000:]}
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _failed(what: str, res: dict[str, Any]) -> bool:
    if "error" in res:
        print(f"  {what}: not measured: {res['error']}")
        return True
    return False


def _figures(res: dict[str, Any], floor: dict[str, Any] | None = None) -> str:
    cpu = f"{res['cpu_s']:.1f} s CPU" + (f" = {res['cpu_s'] / floor['cpu_s']:.1f}x the floor" if floor else "")
    return f"{cpu}, {res['wall_s']:.1f} s wall, peak RSS {res['peak_rss_mb']:.0f} MB"


def config_dir(history: Path, work: Path) -> Path:
    """A Claude config folder whose ``projects/`` is ``history``, as the peers look for one."""
    if history.name == "projects":
        return history.parent
    link = work / "claude-config"
    link.mkdir(parents=True, exist_ok=True)
    if not (link / "projects").exists():
        (link / "projects").symlink_to(history.resolve(), target_is_directory=True)
    return link


def _peer_commands(config: Path, work: Path) -> dict[str, tuple[list[str] | None, dict[str, str], str]]:
    """name -> (argv or None, env, how to get it) for the peers run as whole processes."""
    home = work / "peer-home"  # no user's ~/.claude* in the way
    home.mkdir(exist_ok=True)
    env = {"CLAUDE_CONFIG_DIR": str(config), "HOME": str(home)}
    tokenol = os.environ.get("PCNB_TOKENOL") or shutil.which("tokenol")
    ccusage = os.environ.get("PCNB_CCUSAGE") or shutil.which("ccusage")
    return {
        "tokenol": ([tokenol, "sessions", "--since", "2000-01-01", "--top", "5"] if tokenol else None, env,
                    "python3 -m venv /tmp/pcnb-peers-cc && /tmp/pcnb-peers-cc/bin/pip install tokenol, then "
                    "PCNB_TOKENOL=/tmp/pcnb-peers-cc/bin/tokenol"),
        "ccusage": ([ccusage, "session", "--json", "--offline"] if ccusage else None, env,
                    "mkdir /tmp/ccusage-bench && cd /tmp/ccusage-bench && npm install ccusage@17, then "
                    "PCNB_CCUSAGE=/tmp/ccusage-bench/node_modules/.bin/ccusage"),
    }


def import_vs_peers(history: Path, work: Path, *, workers: int | None = None
                    ) -> tuple[dict[str, Any], list[Target]]:
    """Issue 37's import comparison on one Claude Code history, printed as it goes: the json.loads floor, the
    usage-first import (``lab.import_log(history)`` into ``work/usage.duckdb``), claude-cache-audit and, when given,
    tokenol and ccusage on the same files. Returns the import's figures (``floor`` and ``db`` added) and its
    targets. The one implementation behind ``bench_fleet.py`` and ``bench_peers.py --claude-code-history``."""
    deep_api, _ = api()
    floor = run({"kind": "floor", "path": str(history)})
    if _failed("floor", floor):
        raise SystemExit(1)
    print(f"  floor (json.loads every line, {floor['lines']:,} lines): {floor['cpu_s']:.2f} s CPU")
    db = work / "usage.duckdb"
    what = ("usage-first import lab.import_log(folder)" if deep_api else
            "lab.import_log(folder) (this build has no deep=: it is the full import, not usage-first)")
    ours = run({"kind": "import", "path": str(history), "db": str(db), "workers": workers})
    targets = []
    if _failed(what, ours):
        targets += [Target(f"import CPU <= {FLOOR_MULTIPLE:g}x the floor", "not measured", None),
                    Target(f"import peak RSS <= {PEAK_RSS_MB:.0f} MB", "not measured", None)]
        return {"floor": floor, "db": db, "error": ours["error"]}, targets
    said = "workers not given" if workers is None else f"workers={workers}"
    print(f"  {what}, {said} (so {ours['workers']} process{'es' if ours['workers'] > 1 else ''}): "
          f"{_figures(ours, floor)} ({ours['loaded_mb']:.0f} MB of it before the "
          f"import began: the package loaded); {ours['start_wall_s']:.1f} s wall with the package import; "
          f"{ours['requests']:,} requests in {ours['sessions']} sessions, ${ours['cost']:,.2f} measured cost")
    if ours["workers"] > 1:  # the same import in one process: its CPU alone, and what the workers save
        one = run({"kind": "import", "path": str(history), "db": str(work / "usage-w1.duckdb"), "workers": 1})
        if not _failed("the same import, workers=1", one):
            print(f"  the same import, workers=1: {_figures(one, floor)}; same requests "
                  f"{one['requests'] == ours['requests']}, same cost {abs(one['cost'] - ours['cost']) < 1e-9}")
    multiple = ours["cpu_s"] / floor["cpu_s"]
    targets += [Target(f"import CPU <= {FLOOR_MULTIPLE:g}x the floor",
                       f"{multiple:.1f}x ({ours['cpu_s']:.1f} s vs {floor['cpu_s']:.2f} s)",
                       multiple <= FLOOR_MULTIPLE),
                Target(f"import peak RSS <= {PEAK_RSS_MB:.0f} MB", f"{ours['peak_rss_mb']:.0f} MB",
                       ours["peak_rss_mb"] <= PEAK_RSS_MB)]
    config = config_dir(history, work)
    cca = os.environ.get("PCNB_CCA")
    import importlib.util

    if cca or importlib.util.find_spec("claude_cache_audit") is not None:
        peer = run({"kind": "cca", "config": str(config), "cca": cca})
    else:
        peer = {"error": "not importable: pip download --no-deps claude-cache-audit -d /tmp/cca && unzip the wheel "
                         "into /tmp/cca/wheel, then PCNB_CCA=/tmp/cca/wheel"}
    if not _failed("claude-cache-audit", peer):
        same = peer["requests"] == ours["requests"] and peer["cache_read"] == ours["cache_read"]
        print(f"  claude-cache-audit {peer['version']} --all --json, same files, in-process call: {_figures(peer)}; "
              f"{peer['start_wall_s']:.1f} s wall with its package import; {peer['requests']:,} requests, "
              f"same requests and cache-read tokens as ours: {same}")
        for label, key in (("the call", "wall_s"), ("with the package import", "start_wall_s")):
            targets.append(Target(f"import wall < claude-cache-audit's ({label})",
                                  f"{ours[key]:.1f} s vs {peer[key]:.1f} s = {ours[key] / peer[key]:.1f}x",
                                  ours[key] < peer[key]))
    else:
        targets.append(Target("import wall < claude-cache-audit's", "not measured", None))
    for name, (argv, env, how) in _peer_commands(config, work).items():
        if argv is None:
            print(f"  {name}: not measured (not found; {how})")
            continue
        res = run({"kind": "command", "argv": argv, "env": env})
        if _failed(name, res):
            continue
        check = ""
        if name == "ccusage":
            read = json.loads(res["stdout"]).get("totals", {}).get("cacheReadTokens")
            check = f"; same cache-read tokens as ours: {read == ours['cache_read']}"
        ratio = ours["start_wall_s"] / res["wall_s"]
        print(f"  {name} ({Path(argv[0]).name} {' '.join(argv[1:])}), whole process: {_figures(res)}; our import's "
              f"wall with the package import is {ratio:.1f}x its (below 1: ours is faster){check}")
    return {**ours, "floor": floor, "db": db}, targets


def _copy_store(src: Path, dst: Path) -> None:
    for suffix in ("", ".wal"):
        if Path(f"{src}{suffix}").exists():
            shutil.copyfile(f"{src}{suffix}", f"{dst}{suffix}")


def deep_pass(history: Path, work: Path, ours: dict[str, Any]) -> list[Target]:
    """``lab.analyze`` on 1 and 2 workers, each on a copy of the usage-first store; a deep import; the golden
    tables of each analysed store vs the deep one (workers=2's is the target; workers=1's tells a difference that
    only the split into worker groups makes from one the analysis makes). Printed as it goes; returns the
    targets."""
    deep_api, analyze_api = api()
    floor, usage_db = ours["floor"], ours["db"]
    ratio_target = f"analyze(workers=2) wall <= {ANALYZE_WALL_RATIO:g}x analyze(workers=1)'s"
    targets = []
    analysed: dict[int, Path] = {}
    if not analyze_api:
        print("  lab.analyze: not in this build (issue 37's usage-first import has not landed): deep pass not "
              "measured")
        targets.append(Target(ratio_target, "not measured (no lab.analyze)", None))
    else:
        walls = {}
        for w in (1, 2):
            db = work / f"analysed-w{w}.duckdb"
            _copy_store(usage_db, db)
            res = run({"kind": "analyze", "db": str(db), "workers": w, "again": w == 1})
            if _failed(f"lab.analyze(workers={w})", res):
                continue
            walls[w], analysed[w] = res["wall_s"], db
            again = f"; a second analyze() analysed {res['again']}" if "again" in res else ""
            print(f"  lab.analyze(workers={w}) on a copy of the usage-first store: {_figures(res)} (peak RSS: the "
                  f"largest process); {res['analysed']} sessions analysed{again}")
        if 2 in walls:
            print(f"  usage-first import + analyze(workers=2): {ours['wall_s'] + walls[2]:.1f} s wall")
        if len(walls) == 2:
            ratio = walls[2] / walls[1]
            print(f"  analyze workers=2 / workers=1 wall: {ratio:.2f}")
            targets.append(Target(ratio_target, f"{ratio:.2f} ({walls[2]:.1f} s vs {walls[1]:.1f} s)",
                                  ratio <= ANALYZE_WALL_RATIO))
        else:
            targets.append(Target(ratio_target, "not measured", None))
    deep_db = work / "deep.duckdb"
    what = "deep import lab.import_log(folder, deep=True)" if deep_api else "lab.import_log(folder) again (no deep=)"
    deep = run({"kind": "import", "path": str(history), "db": str(deep_db), "workers": 1, "deep": deep_api})
    if not _failed(what, deep):
        print(f"  {what}: {_figures(deep, floor)}; {deep['requests']:,} requests, same cost as the usage-first "
              f"import: {abs(deep['cost'] - ours.get('cost', -1)) < 1e-6}")
    golden = ("golden tables identical after import + analyze(workers=2) (turns, sessions, blocks, prefix_nodes; "
              "unanalysed_sessions)")
    if "error" in deep or (analyze_api and 2 not in analysed):
        targets.append(Target(golden, "not measured", None))
        return targets
    spill = work / "spill"
    spill.mkdir(exist_ok=True)
    stores = ({f"the analysed store (workers={w}) vs the deep import": analysed[w] for w in sorted(analysed,
                                                                                                    reverse=True)}
              if analyze_api else
              {"the import (no analyze in this build) vs a second one: a determinism check, not the target": usage_db})
    for n, (label, db) in enumerate(stores.items()):
        same = run({"kind": "identity", "analysed": str(db), "deep": str(deep_db), "spill": str(spill)})
        if _failed(f"table comparison, {label}", same):
            if n == 0:
                targets.append(Target(golden, "not measured", None))
            continue
        print(f"  every column, {label} ({same['wall_s']:.1f} s):")
        for table, verdict in same["tables"].items():
            print(f"    {table}: {verdict}")
        if n:
            continue
        differ = {t: v for t, v in same["tables"].items() if not v.startswith(("identical", "in neither"))}
        identical = not differ
        first = next((f"{t}: {v}" for t, v in differ.items()), "identical")
        targets.append(Target(golden, first if analyze_api else f"not measured (no lab.analyze); without it: {first}",
                              identical if analyze_api else None))
    return targets


def print_summary(targets: list[Target]) -> None:
    print("summary: issue 37's Done when (printed, not asserted)")
    for t in targets:
        verdict = "NOT MEASURED" if t.passed is None else ("PASS" if t.passed else "FAIL")
        print(f"  {verdict:<12} {t.name}: {t.figure}")


def history_folder(args: argparse.Namespace, work: Path) -> tuple[Path, int]:
    """The history to measure (``--history`` or generated under ``work``) and its transcript count; prints it."""
    if args.history:
        history = Path(args.history).expanduser()
        for inner in ("projects", "claude/projects"):  # a config folder, or the folder a generation wrote into
            if (history / inner).is_dir():
                history = history / inner
                break
        if not any(history.rglob("*.jsonl")):
            files, _ = write_history(history, projects=args.projects, sessions=args.sessions)
        files = sum(1 for _ in history.rglob("*.jsonl"))
    else:
        history = work / "claude" / "projects"
        files, _ = write_history(history, projects=args.projects, sessions=args.sessions)
    size_mb = sum(f.stat().st_size for f in history.rglob("*.jsonl")) / 1e6
    print(f"history: {files} transcripts in {sum(1 for p in history.iterdir() if p.is_dir())} project folders, "
          f"{size_mb:.0f} MB, {history}")
    return history, files


def add_history_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--projects", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--history", help="a generated history to reuse (its projects/ folder or the folder holding "
                                      "it); generated there first when empty. Default: a new one under the "
                                      "temporary folder")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (stores, generated history)")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_history_arguments(ap)
    ap.add_argument("--targets-only", action="store_true",
                    help="only what issue 37's targets need: floor, import, peers, deep pass, table comparison")
    ap.add_argument("--no-fleet", action="store_true", help="skip pc.fleet on a process pool")
    ap.add_argument("--dask", action="store_true", help="also import through a Dask LocalCluster")
    ap.add_argument("--small-files", type=int, default=1000, help="one-request transcripts (0: skip)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    work = Path(tempfile.mkdtemp(prefix="pcnb-bench-fleet-"))
    try:
        measure(args, work)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, work: Path) -> None:
    history, files = history_folder(args, work)
    size_mb = sum(f.stat().st_size for f in history.rglob("*.jsonl")) / 1e6
    ours, targets = import_vs_peers(history, work)
    if "error" in ours:
        print_summary(targets)
        return
    if not args.targets_only:
        an = run({"kind": "rebuilds", "db": str(ours["db"])})
        if not _failed("pc.rebuilds straight after the import", an):
            print(f"  straight after the import, over {an['sessions']} sessions: pc.rebuilds(lab) "
                  f"{an['rebuilds_s']:.2f} s ({an['rebuilds']} rebuilds); SQL summary over turns "
                  f"{an['sql_s'] * 1000:.0f} ms")
    targets += deep_pass(history, work, ours)
    if not args.targets_only:
        engines = (*(() if args.no_fleet else ("process",)), *(("dask",) if args.dask else ()))
        for engine in engines:
            fl = run({"kind": "fleet", "engine": engine, "path": str(history), "out": str(work / f"fleet-{engine}")})
            if not _failed(f"pc.fleet on {engine}", fl):
                print(f"  pc.fleet on {engine} (2 workers): {fl['wall_s']:.1f} s wall, {fl['cpu_s']:.1f} s CPU; "
                      f"same requests {fl['requests'] == ours['requests']}, same cost "
                      f"{abs(fl['cost'] - ours['cost']) < 1e-6}")
        if args.small_files:
            small_files(args.small_files, work, ours, files, size_mb)
    print_summary(targets)


def small_files(count: int, work: Path, ours: dict[str, Any], files: int, size_mb: float) -> None:
    """Per-file overhead of the import on one-request transcripts, and the 1 TB projection it gives."""
    import random
    from datetime import UTC, datetime

    small = work / "small" / "projects" / "-home-dev-many"
    small.mkdir(parents=True)
    rng = random.Random(3)
    for i in range(count):
        write_session(small / f"s{i:05d}.jsonl", project_dir="-home-dev-many", rng=rng, requests=1,
                      start=datetime(2026, 9, 1, tzinfo=UTC), tool_result_lines=20)
    sfloor = run({"kind": "floor", "path": str(small)})
    simp = run({"kind": "import", "path": str(small), "db": str(work / "small.duckdb"), "workers": 1})
    if _failed("small files", sfloor) or _failed("small files", simp):
        return
    per_file_ms = (simp["cpu_s"] - sfloor["cpu_s"]) / count * 1000
    print(f"{count} one-request transcripts: import {simp['cpu_s']:.1f} s CPU, floor "
          f"{sfloor['cpu_s']:.2f} s: {per_file_ms:.1f} ms CPU per file above the floor")
    cpu_per_mb = (ours["cpu_s"] - per_file_ms / 1000 * files) / size_mb
    tb_files = 1e6 / size_mb * files
    print("projection (computed from the figures above, not measured): 1 TB of such transcripts "
          f"(~{tb_files:,.0f} files at {size_mb / files:.1f} MB each)")
    total_cpu = 1e6 * cpu_per_mb + tb_files * per_file_ms / 1000
    for workers in (1, 10, 100):
        print(f"  {workers:>3} workers: {total_cpu / workers / 3600:,.1f} h (perfect scaling, no I/O limit)")


if __name__ == "__main__":
    main()
