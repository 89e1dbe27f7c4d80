"""The ``promptcache-nb`` command: demo, replay, sql, import, advise, proxy, and serve (a local Messages-compatible
endpoint)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ._data import data_path
from .errors import PromptCacheError, PromptCacheWarning

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .lab import Lab

# Scenarios ship inside the package (read through importlib.resources), so a plain `pip install` can run `demo`.
SCENARIOS = data_path("scenarios")
DEFAULT_SCENARIO = SCENARIOS / "support_agent.yaml"

DISPLAY_COLUMNS = ["strategy", "requests", "cache_read_pct", "efficiency", "cache_write", "breaks",
                   "cost_usd", "cost_no_cache_usd", "saved_usd"]


def _fresh_db(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, Path(str(path) + ".wal")):
        if p.exists():
            p.unlink()
    return path


@contextmanager
def _new_store_or_none(db: str | Path) -> Iterator[None]:
    """A store this command creates is removed again when the command fails with an error (an unknown log
    format, a failed replay): a failed command never leaves a new, empty or half-written ``.duckdb`` behind. An
    existing store is left as the failure left it (each change is its own transaction), and so is one a Ctrl-C
    stopped (it holds what committed before the interrupt, as the user asked)."""
    path = Path(db).expanduser()
    created = [p for p in (path, Path(str(path) + ".wal")) if not p.exists()]
    try:
        yield
    except Exception as exc:
        from .store import caused_by_ctrl_c

        if path in created and not caused_by_ctrl_c(exc):  # an error made of a Ctrl-C is the Ctrl-C (main)
            for p in created:
                p.unlink(missing_ok=True)
        raise


def _scenario_path(name: str) -> Path:
    """A scenario file, or the name of one shipped with the package (``tiny``, ``support_agent``...)."""
    path = Path(name).expanduser()
    if not path.exists() and (SCENARIOS / f"{name}.yaml").exists():
        return SCENARIOS / f"{name}.yaml"
    if not path.exists():
        from .errors import ScenarioError

        bundled = ", ".join(sorted(p.stem for p in SCENARIOS.glob("*.yaml")))
        raise ScenarioError(name, None, "scenario", f"no such file and no bundled scenario of that name; "
                                                    f"bundled: {bundled}")
    return path


def cmd_demo(args: argparse.Namespace) -> int:
    import pandas as pd

    import promptcache_nb as pc

    from .report import write_report

    scenario = pc.load_scenario(_scenario_path(args.scenario))
    strategies = [n.strip() for n in args.strategies.split(",") if n.strip()] or list(pc.STRATEGIES)
    for name in strategies:  # before the old demo store is deleted: a typo must not cost it
        pc.strategies.get_strategy(name)
    pc.cache.get_cache_model(args.cache)
    prices = pc.analysis.default_prices(args.cache, scenario.model)
    priced = (f"costs priced as {prices.model_ref} ({prices.source})" if prices.model_ref
              else f"costs: {prices.source}")
    if prices.model_ref and prices.model_ref != scenario.model:
        priced += f", {args.cache}'s stand-in for {scenario.model}"
    out = Path(args.out)
    db = _fresh_db(out / "demo.duckdb")
    started = time.perf_counter()
    with pc.Lab(db, progress=not args.quiet) as lab:
        sessions = [lab.replay(scenario, strategy=name, cache=args.cache) for name in strategies]
        summary = pc.compare_df(sessions)
        frames = {s.strategy: s.turns() for s in sessions}
    elapsed = time.perf_counter() - started
    report = write_report(
        out / "report.html", summary, frames,
        title=f"promptcache_nb demo — {scenario.name} ({scenario.n_requests} requests) under {args.cache}",
        notes=[f"scenario: {scenario.path}", f"model: {scenario.model}", f"cache model: {args.cache}; {priced}",
               f"store: {db}"],
    )
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(f"\n{scenario.name}: {len(scenario.turns)} scenario turns, {scenario.n_requests} requests, "
              f"model {scenario.model}, cache model {args.cache}; {priced}")
        print("token figures: simulated (estimated tokens); efficiency = Σ cache_read / Σ ideal_cache_read\n")
        print(summary[DISPLAY_COLUMNS].to_string(index=False))
    print(f"\nwrote {db} and {report} in {elapsed:.1f} s")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    import promptcache_nb as pc

    # everything is checked before the store exists: a bad option leaves no empty .duckdb behind
    scenario = pc.load_scenario(_scenario_path(args.scenario))
    pc.strategies.get_strategy(args.strategy)
    pc.cache.get_cache_model(args.cache)
    with _new_store_or_none(args.db), pc.Lab(args.db, progress=not args.quiet) as lab:
        s = lab.replay(scenario, strategy=args.strategy, cache=args.cache)
        summary = pc.compare_df([s])
    print(f"session {s.id} in {args.db}")
    print(summary[DISPLAY_COLUMNS].to_string(index=False))
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    import pandas as pd


    # read-only: never creates, migrates or changes the file (a typo'd path, another application's database)
    with _read_only_lab(args.db, progress=False) as lab:
        df = lab.sql(args.query)
    with pd.option_context("display.width", 200, "display.max_columns", 50, "display.max_rows", 500):
        print(df.to_string(index=False))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .store import check_store

    report = check_store(args.db)
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def cmd_import(args: argparse.Namespace) -> int:
    import pandas as pd

    import promptcache_nb as pc

    from .importers._ingest import BREAKS_VS_REBUILDS, UNCACHED_NOTE, expand_paths

    paths = args.paths
    if args.agent and not paths:
        from .importers._locations import agent_log_files

        paths = agent_log_files(args.agent)  # one-line error naming where it looked when there is none
    elif not paths:
        raise PromptCacheError("import: name files, directories or globs, or --agent NAME for an agent's usual "
                               "log location")
    # a missing path fails here, before the store exists: a failed command leaves no empty .duckdb behind
    expand_paths(paths)
    if (args.db is None) == (args.out is None):
        raise PromptCacheError("import: give --db FILE (a DuckDB store) or --out DIR (a fleet's Parquet dataset)")
    if args.scheduler and args.out is None:
        raise PromptCacheError("import: --scheduler needs --out DIR (the workers write the Parquet files there)")
    if args.out is not None:
        return _import_fleet(args, paths)
    with _new_store_or_none(args.db), pc.Lab(args.db, progress=not args.quiet) as lab:
        res = lab.import_log(paths, format=args.format, project=args.project, workers=args.workers,
                             account=args.account)
        ids = res.sessions.ids
        # every figure below from two queries over the imported sessions (analysis.rollups), never a loop
        full = pc.analysis.session_summary(lab, ids) if ids else None
        summary = res.summary(full_paths=args.full_paths)
        rebuilds = pc.rebuilds(lab) if args.details and ids else None
    print(f"{res!r} into {args.db} — token figures are measured (usage reported by the endpoint)")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 200):
        if full is not None and len(full):
            print(_totals_line(full))
            if args.details or len(summary) <= TOP_SESSIONS:
                print(_fit(summary))
            else:
                top = summary.assign(_cost=full["cost_usd"].fillna(-1.0).to_numpy()).sort_values(
                    ["_cost", "session"], ascending=[False, True], kind="stable").drop(columns="_cost")
                print(f"the {TOP_SESSIONS} costliest of {len(summary)} sessions (all of them: --details)")
                print(_fit(top.head(TOP_SESSIONS)))
            print(_wrap(BREAKS_VS_REBUILDS + " " + UNCACHED_NOTE))
        if rebuilds is not None:
            per_session = dict(tuple(rebuilds.groupby("session", sort=False)))
            for sid in dict.fromkeys(ids):  # import order
                rb = per_session.get(sid)
                if rb is None:
                    continue
                # the evidence dict and the long explanation are in pc.rebuilds(s); here, one line each
                print(f"\n{sid}: {len(rb)} rebuilds (requests that sent again > 256 tokens the cache held)")
                print(_fit(rb[["idx", "sent_at", "gap_seconds", "lost_tokens", "cause"]], max_rows=20))
        if res.unknown_models:
            print("\nmodels without a price (cost left empty): " + ", ".join(res.unknown_models))
        tables = [(f"{len(res.notes)} requests priced with an assumption", res.notes),
                  (f"{len(res.skipped)} skipped", res.skipped)]
        if args.details:
            for title, df in tables:
                if len(df):
                    print(f"\n{title}:")
                    print(_fit(res._relative_files(df), max_rows=20))
        else:
            listed = [title for title, df in tables if len(df)]
            if listed:
                print("\n" + "; ".join(listed) + " (--details lists them, with each session's rebuilds)")
            elif full is not None and int(full["rebuilds"].sum()):
                print("\neach session's rebuilds: --details")
    return 0


def _import_fleet(args: argparse.Namespace, paths: list[str]) -> int:
    """``import PATH --out DIR``: file groups imported on --workers processes or a Dask --scheduler."""
    from concurrent.futures import Executor, ProcessPoolExecutor

    from . import fleet

    if args.format != "auto":
        raise PromptCacheError("import --out: formats are detected per file (drop --format)")
    client: Any = None
    executor: Executor | None = None
    if args.scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise PromptCacheError("import --scheduler: needs Dask (pip install 'promptcache_nb[dask]')") from None
        client = Client(args.scheduler)  # type: ignore[no-untyped-call]  # distributed ships partial types
        executor = client.get_executor()
    elif args.workers > 1:
        executor = ProcessPoolExecutor(args.workers)
    try:
        res = fleet.import_logs(paths, out=args.out, executor=executor, project=args.project,
                                progress=not args.quiet,
                                account=None if args.account is None else dict.fromkeys(paths, args.account))
    finally:
        if isinstance(executor, ProcessPoolExecutor):
            executor.shutdown()
        if client is not None:
            client.close()
    print(repr(res))
    print("token figures are measured (usage reported by the endpoint); read it with pc.fleet.open(OUT)")
    shown = res.groups[["key", "files", "requests", "sessions", "status"]]
    print(_fit(shown.assign(key=shown["key"].map(lambda k: Path(k).name)), max_rows=30))
    if len(res.skipped):
        print(f"\n{len(res.skipped)} skipped (first 20):")
        print(_fit(res.skipped, max_rows=20))
    return 0


#: Sessions the import prints by default (the costliest; ``--details`` prints them all).
TOP_SESSIONS = 10


def _totals_line(full: pd.DataFrame) -> str:
    """One line of totals over a :func:`~promptcache_nb.analysis.session_summary` frame."""
    from .analysis.frames import derived_totals

    sums = {k: full[k].sum() for k in ("requests", "cache_read", "cache_write", "uncached", "cost_usd",
                                       "cost_no_cache_usd")}
    totals = derived_totals(sums)
    cost = "unknown" if full["cost_usd"].isna().all() else f"${totals['cost_usd']:,.2f}"
    lost = full["rebuild_lost_usd"]
    lost_text = "" if lost.isna().all() else f" (${lost.sum():,.2f} lost)"
    return _wrap(f"totals: {totals['requests']:,} requests, {len(full)} sessions, measured cache read "
                 f"{totals['cache_read_pct']:.1f} %, cost {cost}, {int(full['rebuilds'].sum())} rebuilds{lost_text}, "
                 f"{int(full['openclaw_breaks'].sum())} openclaw breaks")


#: The store's tables, named in ``sql --help`` (a test keeps the list equal to a migrated store's).
STORE_TABLES = ("turns", "sessions", "knowledge", "projects", "blocks", "prefix_nodes", "session_messages",
                "session_prompt_deltas", "session_pending_events", "session_state", "calibrations")
#: Columns the CLI cuts first when a table is too wide.
CUT_FIRST = ("source", "source_path", "file", "reason", "note", "cause", "problem", "path")
#: Of those, the columns that hold paths: cut in the middle, not at the end.
PATH_COLUMNS = frozenset({"source", "source_path", "file"})
#: The width the CLI's import tables fit (longer text cells end in "…"; ``--full-paths`` for whole paths).
TABLE_WIDTH = 120


def _fit(df: pd.DataFrame, *, width: int | None = None, max_rows: int | None = None) -> str:
    """``df.to_string`` no wider than ``width`` (default: the terminal's width, at least :data:`TABLE_WIDTH`; piped
    output gets that): the widest text column is cut (ending in "…"; a path in the middle) until it fits; missing
    values print empty, never ``NaN``/``None``."""
    if width is None:
        import shutil

        width = max(TABLE_WIDTH, shutil.get_terminal_size((TABLE_WIDTH, 24)).columns)
    df = df.astype(object).where(df.notna(), "")
    df = df.map(lambda v: " ".join(v.split()) if isinstance(v, str) else v)  # one line per row

    def text() -> str:
        return cast("str", df.to_string(index=False, max_rows=max_rows))

    out = text()
    while max(map(len, out.splitlines() or [""])) > width:
        lengths = {c: df[c].map(lambda v: len(v) if isinstance(v, str) else 0).max() for c in df.columns}
        # cut paths and prose before identifiers (a session id or a model id cut short is useless)
        cuttable = [c for c in CUT_FIRST if c in lengths and lengths[c] > 12] or [
            c for c in lengths if lengths[c] > 8]
        if not cuttable:
            break  # nothing left to cut: numbers only
        col = max(cuttable, key=lambda c: lengths[c])
        longest = lengths[col]
        over = max(map(len, out.splitlines())) - width
        keep = max(12 if col in CUT_FIRST else 8, longest - over - 1)
        cut = _cut_path if col in PATH_COLUMNS else _cut_end
        df[col] = df[col].map(lambda v, k=keep, c=cut: v if not isinstance(v, str) or len(v) <= k else c(v, k))
        out = text()
    return out


def _cut_end(text: str, keep: int) -> str:
    return text[:keep - 1] + "…"


def _cut_path(text: str, keep: int) -> str:
    """A path cut in the middle: its head (the format, the folder passed) and its tail (the file's name) are what
    tell one session's log from another's; the middle is the same folder again and again."""
    head = keep // 4
    return text[:head] + "…" + text[len(text) - (keep - head - 1):]


def _wrap(text: str, *, width: int = TABLE_WIDTH) -> str:
    import textwrap

    return textwrap.fill(text, width=width)


def cmd_advise(args: argparse.Namespace) -> int:
    import promptcache_nb as pc

    # read-only: advice replays what is stored and writes nothing (apply() in Python stores a counterfactual);
    # every session of a heavy user's store takes minutes: a bar on a terminal (stderr), none in a pipe or log
    with _read_only_lab(args.db, progress=True) as lab:
        advice = pc.advise(lab.session(id=args.session) if args.session else lab)
        print(advice.text(width=120))
    return 0


def _read_only_lab(path: str, *, progress: bool) -> Lab:
    """A store file opened read-only, or a fleet dataset (a directory ``import --out`` wrote) as its read-only Lab."""
    import promptcache_nb as pc
    from promptcache_nb.fleet._import import MANIFEST

    if "://" in path or os.path.isdir(path) and os.path.exists(os.path.join(path, MANIFEST)):
        return pc.fleet.open(path, progress=progress)
    return pc.Lab(path, progress=progress, read_only=True)


def cmd_proxy(args: argparse.Namespace) -> int:
    import signal

    from .live.proxy import RecordingProxy

    if hasattr(signal, "SIGTERM"):  # `kill PID` closes the proxy like Ctrl-C does (lines are flushed either way)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    with RecordingProxy(args.upstream, args.log, host=args.host, port=args.port,
                        redact_bodies=args.redact_bodies) as proxy:
        openai_suffix = "" if proxy.upstream.endswith("/v1") else "/v1"
        print(f"promptcache-nb proxy listening on {proxy.url} -> {proxy.upstream}, appending to {args.log}",
              flush=True)
        print(f"  export ANTHROPIC_BASE_URL={proxy.url}", flush=True)
        print(f"  export OPENAI_BASE_URL={proxy.url}{openai_suffix}", flush=True)
        while True:
            time.sleep(3600)  # until Ctrl-C / SIGTERM


def build_parser() -> argparse.ArgumentParser:
    from .cache import cache_model_names
    from .importers import READERS
    from .importers._locations import AGENTS
    from .strategies import strategy_names

    # the registries list the plugins installed (entry points) as well as the built-ins
    strategies, caches, formats = strategy_names(), cache_model_names(), tuple(READERS)
    bundled = ", ".join(sorted(p.stem for p in SCENARIOS.glob("*.yaml")))
    p = argparse.ArgumentParser(
        prog="promptcache-nb",
        description="Why an LLM agent's prompt cache hits or misses, and what it costs: replay scenarios "
                    "under context strategies and provider cache models, query the DuckDB store, serve a "
                    "local Messages-compatible endpoint, record and import real traffic.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="replay the reference scenario under every strategy; table + HTML report",
                       description="Replay a scenario under several strategies (offline, no API key) into "
                                   "OUT/demo.duckdb (replaced), print the comparison and write OUT/report.html.")
    d.add_argument("--scenario", default="support_agent", metavar="FILE_OR_NAME",
                   help=f"a scenario YAML file, or a bundled one: {bundled} (default: %(default)s)")
    d.add_argument("--cache", default="anthropic", metavar="CACHE",
                   help=f"provider cache model: {', '.join(caches)} (default: %(default)s); the output says "
                        "which model's prices it uses")
    d.add_argument("--strategies", default="", metavar="A,B,...",
                   help=f"comma-separated subset of: {', '.join(strategies)} (default: all)")
    d.add_argument("--out", default="build/demo", metavar="DIR", help="output directory (default: %(default)s)")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(fn=cmd_demo, interrupted="the scenario turns being written were rolled back (what was stored "
                                           "before them is whole): run demo again, it starts the store afresh")
    r = sub.add_parser("replay", help="replay one scenario under one strategy into a DuckDB file",
                       description="Replay a scenario under one strategy and cache model, appending a session to "
                                   "the store (created if missing; nothing is created when an option is wrong).")
    r.add_argument("scenario", metavar="FILE_OR_NAME", help=f"a scenario YAML file, or a bundled one: {bundled}")
    r.add_argument("--strategy", default="naive", metavar="STRATEGY",
                   help=f"one of: {', '.join(strategies)} (default: %(default)s)")
    r.add_argument("--cache", default="anthropic", metavar="CACHE",
                   help=f"provider cache model: {', '.join(caches)} (default: %(default)s)")
    r.add_argument("--db", required=True, metavar="FILE.duckdb", help="the store (required; created if missing)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.set_defaults(fn=cmd_replay, interrupted="the scenario turns being written were rolled back: the session keeps "
                                              "the whole turns stored before them (replaying again starts a new "
                                              "session)")
    q = sub.add_parser("sql", help="run SQL against a promptcache_nb DuckDB file",
                       description="Run one SQL query against a store opened read-only (a missing file is an "
                                   "error, never created) and print the result as a table. Tables: "
                                   f"{', '.join(STORE_TABLES)} (one row per request in turns, keyed by "
                                   "session_id and idx).")
    q.add_argument("db", metavar="FILE.duckdb", help="an existing store, or a fleet dataset's directory (import --out)")
    q.add_argument("query", help='e.g. "select session_id, idx, cache_reason, cache_read_input_tokens from turns"')
    q.set_defaults(fn=cmd_sql)
    dr = sub.add_parser("doctor", help="check a store: schema, migrations, NULLs and references; report problems",
                        description="Check a store without changing it (read-only): every table and column this "
                                    "version expects, applied migrations, NULLs where a value is required, and "
                                    "every block, prefix node and session a row refers to. Exit 0 when sound, 1 "
                                    "when problems are listed, 2 when the file cannot be opened.")
    dr.add_argument("db", metavar="FILE.duckdb", help="an existing store")
    dr.set_defaults(fn=cmd_doctor)
    i = sub.add_parser("import", help="import agent logs (Claude Code, Codex, pi, OpenClaw, Gemini CLI, OpenCode, "
                                      "Cline/Roo Code, vcr, HAR, proxy exchanges, OTLP JSON)",
                       description="Import agent logs (files, folders walked whole, globs) into a store: one session "
                                   "per conversation, measured usage, why each request hit or missed the cache. "
                                   "Re-importing a growing log adds only the new requests. Prints the totals and "
                                   "the costliest sessions (sources relative to the paths given); --details prints "
                                   "every session, its rebuilds, and what was skipped, and why.")
    i.add_argument("paths", nargs="*", help="files, directories (walked) or globs (default with --agent: the "
                                            "agent's usual log location)")
    i.add_argument("--agent", default=None, choices=AGENTS, metavar="AGENT",
                   help=f"read this agent's logs where it keeps them: {', '.join(AGENTS)}")
    i.add_argument("--db", default=None, help="the DuckDB store to import into (created if missing)")
    i.add_argument("--out", default=None, metavar="DIR",
                   help="instead of --db: a fleet's Parquet dataset (pc.fleet; run again to add new or grown files)")
    i.add_argument("--workers", type=int, default=1, metavar="N",
                   help="import file groups in N processes (default 1)")
    i.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                   help="with --out: run the file groups on this Dask scheduler's workers")
    i.add_argument("--format", default="auto",
                   help=f"force a format: {', '.join(formats)} (default: detect by content)")
    i.add_argument("--project", default=None, help="knowledge project for the imported sessions "
                                                   "(default: imported/<format>)")
    i.add_argument("--account", default=None, metavar="NAME",
                   help="the provider account (organisation / workspace) the logs were served under: its sessions "
                        "share one simulated cache, as the provider's. Default: the account a log names, else one "
                        "account for everything imported into --db, one per path given with --out")
    i.add_argument("--quiet", action="store_true", help="no progress bars")
    i.add_argument("--details", action="store_true",
                   help=f"print every session (default: totals and the {TOP_SESSIONS} costliest), each session's "
                        "rebuilds, and the skipped lines and pricing assumptions")
    i.add_argument("--full-paths", action="store_true",
                   help="add a source_path column with each session's full log path (default: sources relative "
                        "to the paths given)")
    i.set_defaults(fn=cmd_import, interrupted="nothing of the session being stored was kept; the sessions stored "
                                              "before it are whole: run the same import again to store the rest")
    a = sub.add_parser("advise", help="what to change, and what it would have saved: every fix replayed on the "
                                      "stored traffic, ranked by dollars (simulated counterfactual)",
                       description="Replay each stored session (or --session) with each fix applied (tail_volatile, "
                                   "durable_deltas, frozen_prefix, breakpoints, ttl, keep_warm) and print the "
                                   "findings ranked by dollars saved. The store is opened read-only.")
    a.add_argument("--db", required=True, metavar="FILE.duckdb",
                   help="an existing store, or a fleet dataset's directory (import --out)")
    a.add_argument("--session", default=None, metavar="ID", help="one session (default: every session, and a "
                                                                  "fleet roll-up)")
    a.set_defaults(fn=cmd_advise)
    x = sub.add_parser("proxy", help="record an agent's API calls: forward to --upstream, append one line per "
                                     "call to --log (the `exchanges` format `import` reads)",
                       description="A recording proxy: point the agent's base URL at it; every call is forwarded "
                                   "to --upstream unchanged and appended to --log (API keys are never written), "
                                   "ready for `promptcache-nb import`.")
    x.add_argument("--upstream", required=True, help="the API origin, e.g. https://api.anthropic.com")
    x.add_argument("--log", required=True, metavar="FILE.jsonl", help="JSON Lines file to append to")
    x.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    x.add_argument("--port", type=int, default=8787, help="TCP port (0: any free port; default 8787)")
    x.add_argument("--redact-bodies", action="store_true",
                   help="also replace API-key-like strings (sk-ant-..., sk-..., AIza..., Bearer ...) inside the "
                        "logged bodies; they are always removed from the logged URL")
    x.set_defaults(fn=cmd_proxy)
    from .live.server import add_serve_arguments, run_serve

    v = sub.add_parser("serve", help="run a local Messages-compatible endpoint backed by a cache model",
                       description="Serve POST /v1/messages on loopback: answers come from a cache model "
                                   "(simulated usage: cache read / write per request), so the anthropic SDK or an "
                                   "agent can run offline, with no API key.")
    add_serve_arguments(v)  # --host (127.0.0.1) --port (8765; 0 = any) --cache (anthropic) --ttft SECONDS
    v.set_defaults(fn=run_serve)
    return p


#: The exit status when the output's reader went away (128 + SIGPIPE, what a shell reports for such a process).
SIGPIPE_STATUS = 141


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (None: the command line); returns the exit status (130 after Ctrl-C)."""
    args = build_parser().parse_args(argv)
    try:
        with _one_line_warnings():
            code: int = args.fn(args)
        if argv is None:
            # the command line: leave now, as after a Ctrl-C (below); a Ctrl-C in the interpreter's teardown would
            # otherwise kill the process by the signal (exit -2) after the work was done and stored
            _exit_now(code)
        return code
    except BrokenPipeError:
        # whoever read the output left (`| head`): stop quietly, as other command-line tools do (what the command
        # stored is stored: its store closed as the error left its `with` block)
        if argv is None:
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush into the pipe
            os._exit(SIGPIPE_STATUS)
        return SIGPIPE_STATUS
    except Exception as exc:
        from .store import caused_by_ctrl_c

        if not caused_by_ctrl_c(exc):
            if isinstance(exc, PromptCacheError):
                print(f"promptcache-nb: error: {exc}", file=sys.stderr)
                return 2
            raise
        return _interrupted(args, argv)  # an error made of a Ctrl-C (DuckDB's, wrapped by a caller) is the Ctrl-C
    except KeyboardInterrupt:
        return _interrupted(args, argv)


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Our warnings (:class:`~promptcache_nb.errors.PromptCacheWarning`) shown as one line,
    ``UnpricedModelWarning: <message>``: a terminal user reads what happened, not our source path and a line of our
    code. Other warnings look as Python shows them; a recording ``catch_warnings`` records them all unchanged."""
    python_format = warnings.formatwarning

    def one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 line: str | None = None) -> str:
        if issubclass(category, PromptCacheWarning):
            return f"{category.__name__}: {message}\n"
        return python_format(message, category, filename, lineno, line)

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = python_format


def _interrupted(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Say what a Ctrl-C kept, in one line; exit 130 (leave at once from the command line)."""
    # the store is closed by now (its `with` block ended), its unfinished transaction rolled back
    note = getattr(args, "interrupted", None)
    print("promptcache-nb: interrupted" + (f"; {note}" if note else ""), file=sys.stderr)
    if argv is None:
        _exit_now(130)
    return 130


def _exit_now(code: int) -> None:
    """Leave at once, skipping the interpreter's teardown: after a Ctrl-C, with the store closed, nothing is left
    to finish, and freeing pandas, DuckDB and every module took 0.2-0.8 s measured (longer than stopping the work).
    Only for the command line (``main()`` without ``argv``): a caller in the same process gets the status back."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
