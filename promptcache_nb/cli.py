"""The ``promptcache-nb`` command: demo, replay, sql, import, advise, proxy, otel (an OpenTelemetry receiver), and
serve (a local Messages-compatible endpoint)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import os
import re
import shutil
import signal
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

import promptcache_nb as pc

from . import fleet, live
from ._data import data_path
from ._lazy import pandas as pd
from .analysis.frames import derived_totals
from .analysis.rollups import (
    BILLING_WINDOW,
    SESSION_SUMMARY_COLUMNS,
    group_summary,
    request_table,
    roll_up_subagents,
    session_summary,
)
from .cache import cache_model_names
from .errors import ImportFormatError, PromptCacheError, PromptCacheWarning, ScenarioError
from .fleet._import import MANIFEST, check_dataset
from .ingest._groups import expand_paths
from .ingest._import import BREAKS_VS_REBUILDS, UNCACHED_NOTE, ImportResult
from .live.server import add_serve_arguments, run_serve
from .readers import READERS
from .readers._locations import AGENTS, agent_log_files
from .report import write_report
from .store import caused_by_ctrl_c, check_store
from .strategies import strategy_names

if TYPE_CHECKING:  # pragma: no cover

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
    created = [p for p in (path, Path(str(path) + ".wal")) if not (p.exists() or p.is_symlink())]  # a link: theirs
    try:
        yield
    except Exception as exc:
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
        bundled = ", ".join(sorted(p.stem for p in SCENARIOS.glob("*.yaml")))
        raise ScenarioError(name, None, "scenario", f"no such file and no bundled scenario of that name; "
                                                    f"bundled: {bundled}")
    return path


def cmd_demo(args: argparse.Namespace) -> int:
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
    _resolve_store(args, "replay", rest=("scenario",))
    # everything is checked before the store exists: a bad option leaves no empty .duckdb behind
    scenario = pc.load_scenario(_scenario_path(args.scenario))
    pc.strategies.get_strategy(args.strategy)
    pc.cache.get_cache_model(args.cache)
    with _new_store_or_none(args.store), pc.Lab(args.store, progress=not args.quiet) as lab:
        s = lab.replay(scenario, strategy=args.strategy, cache=args.cache)
        summary = pc.compare_df([s])
    print(f"session {s.id} in {args.store}")
    print(summary[DISPLAY_COLUMNS].to_string(index=False))
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    _resolve_store(args, "sql", rest=("query",))
    # read-only: never creates, migrates or changes the file (a typo'd path, another application's database)
    with _read_only_lab(args.store, progress=False) as lab:
        try:
            df = lab.sql(args.query)
        except PromptCacheError as exc:
            # stores before migration m011 called the request's time `at`, an SQL keyword: say its name now
            if "syntax error" in str(exc) and re.search(r"\bat\b", args.query, re.IGNORECASE):
                raise PromptCacheError(f"{exc} (a request's time is the column sent_at; `at` is an SQL "
                                       "keyword)") from None
            raise
    if args.json or args.csv:
        _print_machine(df, args)
        return 0
    if len(df) <= SQL_ROWS:
        print(render_table(df, headers={}))  # the query's own column names; long text wraps, never cut
        return 0
    # a long result: pandas' first and last rows (text whole, never cut), --csv or --json for every row
    with pd.option_context("display.width", 200, "display.max_columns", 50, "display.max_rows", SQL_ROWS,
                           "display.max_colwidth", None):
        print(df.to_string(index=False))
    return 0


#: The rows ``sql`` prints as a wrapped table; a longer result prints its first and last rows.
SQL_ROWS = 500


def cmd_doctor(args: argparse.Namespace) -> int:
    _resolve_store(args, "doctor")
    fleet_dataset = os.path.isdir(args.store) and os.path.exists(os.path.join(args.store, MANIFEST))
    report = check_dataset(args.store) if fleet_dataset else check_store(args.store)
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def cmd_import(args: argparse.Namespace) -> int:
    paths = _import_store(args)
    if args.agent and not paths:
        # a one-line error naming where it looked when there is none
        paths = [str(f) for f in agent_log_files(args.agent)]
    elif not paths:
        raise PromptCacheError("import: name files, directories or globs, or --agent NAME for an agent's usual "
                               "log location")
    # a missing path fails here, before the store exists: a failed command leaves no empty .duckdb behind
    expand_paths(paths)
    if args.scheduler and args.out is None:
        raise PromptCacheError("import: --scheduler needs --out DIR (the workers write the Parquet files there)")
    if args.out is not None:
        return _import_fleet(args, paths)
    with _new_store_or_none(args.store), pc.Lab(args.store, progress=not args.quiet) as lab:
        res = lab.import_log(paths, format=args.format, project=args.project, workers=args.workers,
                             account=args.account, deep=args.deep)
        ids = res.sessions.ids
        # every figure below from two queries over the imported sessions (analysis.rollups), never a loop
        full = pc.analysis.session_summary(lab, ids) if ids else None
        summary = res.summary(full_paths=args.full_paths)
        rebuilds = pc.rebuilds(lab) if args.details and ids else None
    if args.json or args.csv:  # the imported sessions' table alone, every column, costliest first
        table = full if full is not None else pd.DataFrame(columns=SESSION_SUMMARY_COLUMNS)
        _print_machine(table.sort_values(["cost_usd", "session"], ascending=[False, True], kind="stable",
                                         na_position="last"), args)
        return 0
    print(_import_line(repr(res), args.store))
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 200):
        if full is not None and len(full):
            print(_totals_line(full))
            top = summary.assign(_cost=full["cost_usd"].astype(float).fillna(-1.0).to_numpy()).sort_values(
                ["_cost", "session"], ascending=[False, True], kind="stable").drop(columns="_cost")
            if args.details or len(summary) <= TOP_SESSIONS:
                print(_fit(top))  # every session, costliest first
            else:
                print(f"the {TOP_SESSIONS} costliest of {len(summary)} sessions (all of them: --details)")
                print(_fit(top.head(TOP_SESSIONS)))
            saved = _savings_line(full)
            if saved:
                print(saved)
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


def _import_store(args: argparse.Namespace) -> list[str]:
    """Set ``args.store`` for ``import`` and return the paths to read: ``import STORE PATH...``, ``import PATH...
    --db STORE`` or ``import PATH... --out DIR`` (a fleet's dataset: ``args.store`` None)."""
    given = ([args.store] if args.store is not None else []) + list(args.paths)
    if args.db is not None and args.out is not None:
        raise PromptCacheError("import: give --db FILE (a DuckDB store) or --out DIR (a fleet's Parquet dataset), "
                               "not both")
    if args.db is not None or args.out is not None:
        if args.db is not None and given and given[0].endswith(".duckdb") and _may_be_store(given[0]):
            raise PromptCacheError(f"import: the store given twice ({given[0]} and --db {args.db}): name it once, "
                                   "first or with --db")
        args.store = args.db
        return given
    if not given or not _may_be_store(given[0]):
        what = f"{given[0]} is no DuckDB store" if given else "no store named"
        raise PromptCacheError(f"import: {what}; name the store first (import STORE PATH...), or give --db FILE "
                               "(a DuckDB store) or --out DIR (a fleet's Parquet dataset)")
    args.store = given[0]
    return given[1:]


def _may_be_store(path: str) -> bool:
    """A path ``import`` may write into: a new file, or an existing DuckDB file (never a log given by mistake)."""
    p = Path(path).expanduser()
    if not p.exists():
        return True
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(12)[8:12] == b"DUCK"  # DuckDB's magic bytes, after the header's checksum


def _import_line(result: str, store: str, *, width: int | None = None) -> str:
    """The import's one-line summary, no wider than ``width``: the store's path shortened as a table's paths are
    (``~`` for the home folder, then cut in the middle) to fit."""
    width = TABLE_WIDTH if width is None else width
    where = _home_short(store)
    # the longest note that leaves the path whole (or 24 characters of it); else none, and the path cut to fit
    for note in (" — token figures are measured (usage reported by the endpoint)", " — measured usage", ""):
        room = width - len(result) - len(" into ") - len(note)
        if room >= min(len(where), 24) or not note:
            break
    if len(where) > room:
        where = _cut_path(where, max(room, 16))
    return f"{result} into {where}{note}"


def _home_short(path: str) -> str:
    """``path`` with the home folder spelled ``~``."""
    home = str(Path.home())
    full = str(Path(path).expanduser().absolute()) if "://" not in path else path
    return "~" + full[len(home):] if home not in ("", "/") and (full == home or full.startswith(home + os.sep)) \
        else path


def _import_fleet(args: argparse.Namespace, paths: list[str]) -> int:
    """``import PATH --out DIR``: file groups imported on --workers processes or a Dask --scheduler."""
    if args.format != "auto":
        raise PromptCacheError("import --out: formats are detected per file (drop --format)")
    client: Any = None
    executor: Executor | None = None
    if args.scheduler:
        try:
            from distributed import Client  # optional (the dask extra), and heavy
        except ImportError:
            raise PromptCacheError("import --scheduler: needs Dask (pip install 'promptcache_nb[dask]')") from None
        client = Client(args.scheduler)  # type: ignore[no-untyped-call]  # distributed ships partial types
        executor = client.get_executor()
    elif args.workers is not None and args.workers > 1:
        executor = ProcessPoolExecutor(args.workers)
    args.interrupted = ("each file group written whole is recorded in the dataset's manifest; run the same command "
                        "again to import the rest")
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
    sums = {k: full[k].sum() for k in ("requests", "cache_read", "cache_write", "uncached", "cost_usd",
                                       "cost_no_cache_usd")}
    totals = derived_totals(sums)
    cost = "unknown" if full["cost_usd"].isna().all() else f"${totals['cost_usd']:,.2f}"
    lost = full["rebuild_lost_usd"]
    lost_text = "" if lost.isna().all() else f" (${lost.sum():,.2f} lost)"
    return _wrap(f"totals: {totals['requests']:,} requests, {len(full)} sessions, measured cache read "
                 f"{totals['cache_read_pct']:.1f} %, cost {cost}, {int(full['rebuilds'].sum())} rebuilds{lost_text}, "
                 f"{int(full['openclaw_breaks'].sum())} openclaw breaks")


def _savings_line(full: pd.DataFrame) -> str:
    """What the cache saved over a :func:`~promptcache_nb.analysis.session_summary` frame's sessions priced both
    ways (measured usage at their prices, and the same tokens all uncached); "" when none is."""
    both = full[full["cost_usd"].notna() & full["cost_no_cache_usd"].notna()]
    if not len(both):
        return ""
    cost, no_cache = float(both["cost_usd"].sum()), float(both["cost_no_cache_usd"].sum())
    some = "" if len(both) == len(full) else f" ({len(both)} of {len(full)} sessions priced both ways)"
    return _wrap(f"without the cache these requests would have cost ${no_cache:,.2f}: it saved "
                 f"${no_cache - cost:,.2f} of ${no_cache:,.2f}{some}")


#: The store's tables, named in ``sql --help`` (a test keeps the list equal to a migrated store's).
STORE_TABLES = ("turns", "sessions", "knowledge", "projects", "blocks", "prefix_nodes", "session_messages",
                "session_prompt_deltas", "session_pending_events", "session_state", "calibrations",
                "unanalysed_sessions")
#: Columns of prose and paths: in a narrow table they wrap first.
CUT_FIRST = ("source", "source_path", "file", "reason", "note", "cause", "problem", "path")
#: Of those, the columns that hold paths: cut in the middle, not at the end.
PATH_COLUMNS = frozenset({"source", "source_path", "file"})
#: The width of the CLI's tables when stdout is not a terminal (piped output, a log).
TABLE_WIDTH = 120


def _fit(df: pd.DataFrame, *, width: int | None = None, max_rows: int | None = None) -> str:
    """``df`` through :func:`render_table` (text wraps inside its cells, nothing is cut: a model id or a session id
    cut short is useless), its first ``max_rows`` rows and a line saying how many more there are."""
    more = 0 if max_rows is None else max(0, len(df) - max_rows)
    out = render_table(df.head(max_rows) if more else df, width=width)
    return out + (f"\n… {more} more rows" if more else "")


def _cut_path(text: str, keep: int) -> str:
    """A path cut in the middle: its head (the format, the folder passed) and its tail (the file's name) are what
    tell one session's log from another's; the middle is the same folder again and again."""
    head = keep // 4
    return text[:head] + "…" + text[len(text) - (keep - head - 1):]


def _wrap(text: str, *, width: int = TABLE_WIDTH) -> str:
    # never inside a word at its hyphens: paths and model ids (claude-opus-4-5) stay whole on their line
    return textwrap.fill(text, width=width, break_on_hyphens=False, break_long_words=False)


def cmd_advise(args: argparse.Namespace) -> int:
    # read-only: advice replays what is stored and writes nothing (apply() in Python stores a counterfactual),
    # unless a usage-first import left sessions to analyse: their analysis is stored first (what advice reads);
    # every session of a heavy user's store takes minutes: a bar on a terminal (stderr), none in a pipe or log
    _resolve_store(args, "advise")
    with _read_only_lab(args.store, progress=True) as lab:
        waiting = bool(lab.store.unanalysed_ids())
    if waiting:
        with pc.Lab(args.store, progress=True) as lab:
            lab.analyze()
    with _read_only_lab(args.store, progress=True) as lab:
        advice = pc.advise(lab.session(id=args.session) if args.session else lab)
        if args.json or args.csv:
            _print_machine(advice.findings, args)
        else:
            print(advice.text(width=120))
    return 0


def _read_only_lab(path: str, *, progress: bool) -> Lab:
    """A store file opened read-only, or a fleet dataset (a directory ``import --out`` wrote) as its read-only Lab."""
    if "://" in path or os.path.isdir(path) and os.path.exists(os.path.join(path, MANIFEST)):
        return pc.fleet.open(path, progress=progress)
    return pc.Lab(path, progress=progress, read_only=True)


# -- the store as the first argument ------------------------------------------------------------------------------

def _resolve_store(args: argparse.Namespace, command: str, *, rest: tuple[str, ...] = (),
                   required: bool = True) -> None:
    """Set ``args.store`` from the first positional argument or ``--db`` (its alias), and the positionals after it
    (``rest``): with ``--db`` every positional is one of ``rest``. One line of error when the store is given twice,
    or not at all where it is ``required``."""
    values = [args.store, *(getattr(args, name) for name in rest)]
    usage = " ".join([command, "STORE", *(name.upper() for name in rest)])
    if args.db is not None:
        if values[-1] is not None:
            raise PromptCacheError(f"{command}: the store given twice ({values[0]} and --db {args.db}): name it once "
                                   f"({usage}, or --db STORE)")
        for name, value in zip(rest, values[:-1], strict=True):
            setattr(args, name, value)
        args.store = args.db
    if args.store is None and required:
        raise PromptCacheError(f"{command}: name the store first ({usage}), or give --db STORE")
    missing = [name.upper() for name in rest if getattr(args, name) is None]
    if missing:
        raise PromptCacheError(f"{command}: {', '.join(missing)} missing after the store ({usage})")


def _add_store(parser: argparse.ArgumentParser, help: str, *, optional: str = "") -> None:  # noqa: A002 - argparse's name
    """The store as the first positional argument, and ``--db`` as its alias."""
    parser.add_argument("store", nargs="?", metavar="STORE", help=help + optional)
    parser.add_argument("--db", default=None, metavar="STORE", help="the store, as an option (instead of STORE)")


def _add_formats(parser: argparse.ArgumentParser) -> None:
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="print the table as JSON (an array of objects, full values) instead, nothing else")
    out.add_argument("--csv", action="store_true", help="print the table as CSV (a header row, full values) instead")


# -- tables: text that wraps in its cells, or JSON / CSV ------------------------------------------------------------

#: The headers the text tables show for the analysis' columns (JSON and CSV keep the column names); a header wraps at
#: its spaces when its column is narrower.
HEADERS = {
    "cache_read_pct": "read %", "measured_cache_read_pct": "read %", "cost_usd": "cost", "cost_no_cache_usd":
    "no cache", "saved_usd": "saved", "running_cost_usd": "running cost", "cache_read": "read",
    "cache_write": "write", "subagents": "sub agents", "models": "model(s)", "window_end": "until", "sent_at": "time",
    "openclaw_breaks": "openclaw breaks", "gap_seconds": "gap (s)", "lost_tokens": "lost tokens",
}
#: Columns shown with four decimals (dollars) or one (percentages).
MONEY = frozenset({"cost_usd", "cost_no_cache_usd", "saved_usd", "running_cost_usd", "rebuild_lost_usd"})
PERCENT = frozenset({"cache_read_pct", "measured_cache_read_pct"})
#: Text columns kept on one line (an id): the others wrap inside their cell when the table is too wide.
NO_WRAP = frozenset({"session", "parent"})
#: The narrowest a wrapped path or prose column gets (a word longer than its cell continues on the next line);
#: other text columns keep their longest word whole (a model name, a date).
MIN_PATH = 18
MIN_PROSE = 20
#: ... and how narrow they get when the table would not fit otherwise.
MIN_SQUEEZED = 10
#: Where a cell's text may break: after a space or a slash (paths).
_BREAK_AFTER = re.compile(r"(?<=[ /])")


def _terminal_width() -> int:
    """The terminal's width (``COLUMNS`` when set), :data:`TABLE_WIDTH` when there is none (piped output)."""
    return max(40, shutil.get_terminal_size((TABLE_WIDTH, 24)).columns)


def _text(value: Any, column: str) -> str:
    if value is None or (not isinstance(value, str) and pd.api.types.is_scalar(value) and pd.isna(value)):
        return ""
    if column in MONEY:
        return f"{float(value):,.4f}"
    if column in PERCENT:
        return f"{float(value):.1f}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dt.datetime):  # pandas' Timestamp is one: UTC, to the second
        t = pd.Timestamp(value)
        return str((t.tz_convert("UTC") if t.tzinfo is not None else t).strftime("%Y-%m-%d %H:%M:%S"))
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, int) or (hasattr(value, "dtype") and pd.api.types.is_integer_dtype(value.dtype)):
        return f"{int(value):,}"
    if isinstance(value, float) or hasattr(value, "dtype"):
        return f"{float(value):,.4f}"
    return " ".join(str(value).split())  # one paragraph: its line breaks are the table's to make


def _pieces(text: str) -> list[str]:
    """``text`` split where a line may break (:data:`_BREAK_AFTER`), each piece keeping its delimiter."""
    return [p for p in _BREAK_AFTER.split(text) if p]


def _wrap_cell(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``, broken after spaces and slashes; a piece longer than a line
    continues on the next. Nothing is cut: the lines joined (with the spaces they broke at) give ``text`` back."""
    if len(text) <= width:
        return [text]
    lines: list[str] = []
    line = ""
    for piece in _pieces(text):
        if len(line) + len(piece.rstrip()) <= width:
            line += piece
            continue
        if line.strip():
            lines.append(line.rstrip())
        line = piece
        while len(line.rstrip()) > width:
            lines.append(line[:width])
            line = line[width:]
    if line.strip():
        lines.append(line.rstrip())
    return lines or [""]


def render_table(df: pd.DataFrame, *, width: int | None = None, headers: Mapping[str, str] | None = None) -> str:
    """``df`` as a text table no wider than ``width`` (default: the terminal's, ``COLUMNS`` when set) where it can
    be: text columns (not :data:`NO_WRAP`) wrap inside their cells, the widest first, down to their longest word
    (a model name stays whole) or :data:`MIN_PATH` / :data:`MIN_PROSE` characters for paths and prose; headers wrap
    at their spaces. Nothing is ever cut. Numbers are right aligned; missing values print empty. ``headers``: what
    each column is called (default :data:`HEADERS`, else its name)."""
    width = _terminal_width() if width is None else width
    columns = list(df.columns)
    cells = [[_text(v, c) for v, c in zip(row, columns, strict=True)] for row in df.itertuples(index=False)]
    heads = [str((HEADERS if headers is None else headers).get(c, c)) for c in columns]
    numeric = [str(df[c].dtype).lower().startswith(("int", "float", "uint")) or c in MONEY or c in PERCENT
               for c in columns]
    n = len(columns)
    head_word = [max(len(w) for w in h.split()) for h in heads]
    data = [max([0, *(len(row[i]) for row in cells)]) for i in range(n)]
    wraps = [c not in NO_WRAP and not numeric[i] for i, c in enumerate(columns)]
    widths = [max(data[i], len(heads[i])) for i in range(n)]

    def floor(i: int) -> int:
        if numeric[i]:
            return max(data[i], head_word[i])  # its header may wrap
        if not wraps[i]:
            return widths[i]
        if columns[i] in PATH_COLUMNS:
            return min(widths[i], MIN_PATH)
        if columns[i] in CUT_FIRST or any(len(_pieces(row[i])) > 4 for row in cells):  # prose
            return min(widths[i], max(head_word[i], MIN_PROSE))
        word = max([head_word[i], *(len(p.rstrip(" ,")) for row in cells for p in _pieces(row[i]))])
        return min(widths[i], word)  # a model name, a time's date: whole on its line

    floors = [floor(i) for i in range(n)]
    if sum(floors) + n - 1 > width:  # still too wide: paths and prose wrap narrower before the table overflows
        squeeze = [wraps[i] and (columns[i] in CUT_FIRST or columns[i] in PATH_COLUMNS) for i in range(n)]
        floors = [min(f, max(MIN_SQUEEZED, head_word[i])) if squeeze[i] else f for i, f in enumerate(floors)]
    gap = 2 if sum(floors) + 2 * (n - 1) <= width else 1  # a narrow terminal gets one space between columns
    while sum(widths) + gap * (n - 1) > width:
        shrinkable = [i for i in range(n) if widths[i] > floors[i]]
        if not shrinkable:
            break  # as narrow as it goes: the terminal wraps the rest
        i = max(shrinkable, key=lambda k: widths[k] - floors[k])
        widths[i] -= 1

    def lines(text: str, i: int, head: bool) -> list[str]:
        if head:
            return _wrap_cell(text, widths[i]) if len(text) > widths[i] else [text]
        return _wrap_cell(text, widths[i]) if wraps[i] else [text]

    out = []
    for k, row in enumerate([heads, *cells]):
        parts = [lines(text, i, k == 0) for i, text in enumerate(row)]
        for j in range(max(len(p) for p in parts)):
            fields = []
            for i, p in enumerate(parts):
                piece = p[j] if j < len(p) else ""
                fields.append(piece.rjust(widths[i]) if numeric[i] else piece.ljust(widths[i]))
            out.append((" " * gap).join(fields).rstrip())
    return "\n".join(out)


def _machine_value(value: Any) -> Any:
    """A cell as JSON holds it: times in ISO 8601, numpy numbers as Python's, missing as None."""
    if value is None or (not isinstance(value, str) and pd.api.types.is_scalar(value) and pd.isna(value)):
        return None
    if isinstance(value, dt.date):  # datetimes and pandas' Timestamps too
        return value.isoformat()
    if hasattr(value, "tolist"):  # a numpy number, or an array of them
        return value.tolist()
    return value


def _print_machine(df: pd.DataFrame, args: argparse.Namespace) -> None:
    """``df`` to stdout as JSON (``--json``: one array of objects) or CSV (``--csv``), with nothing around it."""
    rows = [{c: _machine_value(v) for c, v in zip(df.columns, row, strict=True)}
            for row in df.itertuples(index=False)]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, default=str))
        return
    writer = csv.DictWriter(sys.stdout, fieldnames=[str(c) for c in df.columns], lineterminator="\n")
    writer.writeheader()
    # a list or a mapping in a cell (advice's request numbers) is written as its JSON
    writer.writerows({k: json.dumps(v, ensure_ascii=False, default=str) if isinstance(v, list | dict) else v
                      for k, v in row.items()} for row in rows)


def _print_table(df: pd.DataFrame, args: argparse.Namespace, *, head: Sequence[str] = (),
                 tail: Sequence[str] = ()) -> None:
    """A table as the command was asked for: JSON or CSV alone, else ``head`` lines, the text table, ``tail``."""
    if args.json or args.csv:
        _print_machine(df, args)
        return
    width = _terminal_width()
    for line in head:
        print(_wrap(line, width=width))
    print(render_table(df, width=width))
    for line in tail:
        print(_wrap(line, width=width))


def _sources(sources: list[str]) -> tuple[list[str], str]:
    """Sessions' sources (``format:path``) shortened as the import shortens them (relative to the folder they share,
    a single file's name) and that folder (``~`` for the home folder; "" when nothing is shared)."""
    paths = [s.partition(":")[2] if ":" in s and len(s.partition(":")[0]) > 1 else s for s in sources]
    paths = [p for p in paths if p]
    if not paths:
        return sources, ""
    root = Path(os.path.commonpath(paths)) if len({os.path.isabs(p) for p in paths}) == 1 else None
    if root is None or str(root) in ("", os.sep):
        return sources, ""
    if len(paths) == 1 or any(Path(p) == root for p in paths):
        root = root.parent  # a file, or a folder that is itself a source: show its name
    shortener = ImportResult(roots=[root])
    return [shortener.relative_source(s) for s in sources], _home_short(str(root))


# -- sessions, requests, report ----------------------------------------------------------------------------------

#: ``sessions``' columns (``subagents`` when rolled up; ``usage`` when a session's figures are not all measured).
SESSIONS_COLUMNS = ["session", "started", "requests", "models", "cache_read_pct", "cost_usd", "cost_no_cache_usd",
                    "saved_usd", "source"]
#: ``requests``' columns.
REQUESTS_COLUMNS = ["idx", "sent_at", "model", "cache_read", "cache_write", "uncached", "output", "cost_usd",
                    "running_cost_usd", "cause"]
#: ``report``'s columns after the group's own.
REPORT_COLUMNS = ["sessions", "requests", "measured_cache_read_pct", "cost_usd", "cost_no_cache_usd", "saved_usd"]
#: What ``report --by`` may group by, in time order rather than by cost.
TIME_GROUPS = ("day", "hour", "window")
MEASURED_NOTE = "token figures measured (usage the endpoint reported); costs in USD"
MIXED_NOTE = "token figures measured or simulated, as the usage column says; costs in USD"


def _by_cost(df: pd.DataFrame, *, key: str) -> pd.DataFrame:
    """Costliest first, unpriced last, ties by ``key``."""
    return df.assign(_cost=df["cost_usd"].astype(float).fillna(-1.0)).sort_values(
        ["_cost", key], ascending=[False, True], kind="stable").drop(columns="_cost").reset_index(drop=True)


def cmd_sessions(args: argparse.Namespace) -> int:
    _resolve_store(args, "sessions", required=False)
    args.store = args.store or _existing_default_store("sessions")
    with _read_only_lab(args.store, progress=False) as lab:
        summary = session_summary(lab, rebuilds=False)  # measured sums only: one query, no body read
    columns = list(SESSIONS_COLUMNS)
    if not args.flat:
        summary = roll_up_subagents(summary)
        columns.insert(3, "subagents")
    else:
        columns.insert(1, "parent")
    mixed = bool((summary["usage"] != "measured").any())
    if mixed:
        columns.insert(columns.index("cache_read_pct"), "usage")
    table = _by_cost(summary[columns], key="session")
    if args.json or args.csv:
        _print_machine(table, args)
        return 0
    short, root = _sources([str(s) for s in table["source"]])
    note = MIXED_NOTE if mixed else MEASURED_NOTE
    head = [f"{len(table)} session{'s' * (len(table) != 1)}"
            + ("" if args.flat else f" ({int(table['subagents'].sum())} sub-agent sessions rolled up into their "
                                    "parent's row; --flat lists them)") + f", costliest first; {note}"]
    if root:
        head.append(f"sources under {root}")
    _print_table(table.assign(source=short), args, head=head)
    return 0


def _session_id(lab: Lab, given: str, store: str) -> str:
    """The session ``given`` names: its id, or a prefix of exactly one id."""
    ids = lab.store.session_ids()
    if given in ids:
        return given
    matches = [i for i in ids if i.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise PromptCacheError(f"requests: {given!r} names {len(matches)} sessions in {store} "
                               f"({', '.join(matches[:5])}{', ...' if len(matches) > 5 else ''}): give more of it")
    raise PromptCacheError(f"requests: no session {given!r} in {store} (promptcache-nb sessions {store} lists them)")


def cmd_requests(args: argparse.Namespace) -> int:
    if args.db is None and args.session is None and args.store is not None and not os.path.exists(args.store):
        args.store, args.session = _existing_default_store("requests"), args.store  # `requests SESSION`
    _resolve_store(args, "requests", rest=("session",))
    with _read_only_lab(args.store, progress=False) as lab:
        sid = _session_id(lab, args.session, args.store)
        df = request_table(lab, sid)
    columns = list(REQUESTS_COLUMNS)
    if (df["usage"] != "measured").any():
        columns.insert(columns.index("cost_usd"), "usage")
    table = df[columns].assign(cause=df["cause"].fillna(""))
    measured = "measured" if (df["usage"] == "measured").all() else "measured or simulated, as the usage column says"
    total = df["running_cost_usd"].iloc[-1] if len(df) else None
    cost = "unknown" if total is None or total != total else f"${total:,.4f}"
    _print_table(table, args, head=[f"session {sid}: {len(df)} requests, cost {cost}; token figures {measured}; "
                                    "cause: why the cache read what it did (empty: not analysed yet)"])
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    _resolve_store(args, "report", required=False)
    if args.store is None:
        lab_cm, imported = _default_store_with_logs(args)
    else:
        lab_cm, imported = _read_only_lab(args.store, progress=False), None
    with lab_cm as lab:
        groups = group_summary(lab, args.by, rebuilds=False)  # measured columns only
    table = groups[[args.by, *REPORT_COLUMNS]]
    if args.by == "window":
        table.insert(1, "window_end", table["window"] + BILLING_WINDOW)
    if args.by not in TIME_GROUPS:
        table = _by_cost(table, key=args.by)
    if args.json or args.csv:
        if imported:
            print(imported, file=sys.stderr)
        _print_machine(table, args)
        return 0
    head = [imported] if imported else []
    grouped = {"window": "5-hour billing window (opened by the first request after the last one closed; UTC)",
               "day": "UTC day", "hour": "UTC hour"}.get(args.by, args.by)
    head.append(f"measured requests by {grouped}" + ("" if args.by in TIME_GROUPS else ", costliest first")
                + f"; {MEASURED_NOTE}")
    if not len(groups):
        print("\n".join([*head[:-1], "no measured requests in this store (live or imported usage)"]))
        return 0
    _print_table(table, args, head=head, tail=[_report_totals(groups)])
    return 0


def _report_totals(groups: pd.DataFrame) -> str:
    """One line: the report's totals (its groups add up to every measured request)."""
    sums = {k: groups[k].sum() for k in ("requests", "cache_read", "cache_write", "uncached")}
    t = derived_totals({**sums, "cost_usd": None, "cost_no_cache_usd": None})
    line = f"total: {t['requests']:,} requests, read share {t['cache_read_pct']:.1f} %, "
    if groups["cost_usd"].isna().all():
        return line + "cost unknown"
    line += f"cost ${groups['cost_usd'].sum():,.4f}"
    both = groups[groups["cost_usd"].notna() & groups["cost_no_cache_usd"].notna()]
    if len(both):
        line += (f", without cache ${both['cost_no_cache_usd'].sum():,.4f}, saved ${both['saved_usd'].sum():,.4f}"
                 + ("" if len(both) == groups["cost_usd"].notna().sum() else
                    f" (of the groups priced both ways: ${both['cost_usd'].sum():,.4f} of the cost)"))
    return line


# -- zero set-up: the default store, fed from the agents' usual places ---------------------------------------------

#: The environment variable that moves the default store's folder (tests point it at a temporary one).
HOME_ENV = "PROMPTCACHE_NB_HOME"
#: The default store's file name, in :func:`default_store_path`'s folder.
DEFAULT_STORE_NAME = "history.duckdb"


def default_store_path() -> Path:
    """Where ``report`` without a store keeps its store: ``$PROMPTCACHE_NB_HOME/history.duckdb``, else
    ``history.duckdb`` in the user's data folder (platformdirs: ``~/.local/share/promptcache-nb`` on Linux,
    ``~/Library/Application Support/promptcache-nb`` on macOS, ``%LOCALAPPDATA%\\promptcache-nb`` on Windows)."""
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home).expanduser() / DEFAULT_STORE_NAME
    return platformdirs.user_data_path("promptcache-nb") / DEFAULT_STORE_NAME


def _existing_default_store(command: str) -> str:
    """The default store (``report`` without a store fills it), for a command given no store; an error if none."""
    path = default_store_path()
    if not path.exists():
        raise PromptCacheError(f"{command}: name the store first ({command} STORE), or give --db STORE (no default "
                               f"store at {_home_short(str(path))} yet: `promptcache-nb report` makes it)")
    return str(path)


def _default_store_with_logs(args: argparse.Namespace) -> tuple[Lab, str]:
    """The default store, with whatever the agents wrote in their usual places since the last run imported into it
    (the import stores only requests it does not hold), and one line saying what was added."""
    found: dict[str, list[Path]] = {}
    for agent in AGENTS:
        try:
            found[agent] = agent_log_files(agent)
        except ImportFormatError:
            continue  # this agent left no log here
    path = default_store_path()
    if not found and not path.exists():
        raise PromptCacheError(f"report: no agent logs in their usual places ({', '.join(AGENTS)}; "
                               "`promptcache-nb import --help` lists where), and no store: name one (report STORE)")
    path.parent.mkdir(parents=True, exist_ok=True)
    lab = pc.Lab(path, progress=not args.quiet)
    try:
        files = [f for paths in found.values() for f in paths]
        res = lab.import_log(files) if files else None
    except BaseException:
        lab.close()
        raise
    where = _home_short(str(path))
    if res is None:
        return lab, f"{where}: nothing new (no agent's logs in their usual places)"
    return lab, (f"{where}: {res.requests:,} new requests, {res.already_stored:,} already stored "
                 f"({', '.join(found)}, from {len(files)} files in their usual places)")


def cmd_proxy(args: argparse.Namespace) -> int:
    if hasattr(signal, "SIGTERM"):  # `kill PID` closes the proxy like Ctrl-C does (lines are flushed either way)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    with live.RecordingProxy(args.upstream, args.log, host=args.host, port=args.port,
                        redact_bodies=args.redact_bodies, diagnostics=args.diagnostics) as proxy:
        openai_suffix = "" if proxy.upstream.endswith("/v1") else "/v1"
        print(f"promptcache-nb proxy listening on {proxy.url} -> {proxy.upstream}, appending to {args.log}",
              flush=True)
        print(f"  export ANTHROPIC_BASE_URL={proxy.url}", flush=True)
        print(f"  export OPENAI_BASE_URL={proxy.url}{openai_suffix}", flush=True)
        while True:
            time.sleep(3600)  # until Ctrl-C / SIGTERM


def cmd_otel(args: argparse.Namespace) -> int:
    if hasattr(signal, "SIGTERM"):  # `kill PID` stops the receiver like Ctrl-C does (each export is committed whole)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    with _new_store_or_none(args.store), pc.Lab(args.store, progress=False) as lab, \
            live.OtlpReceiver(lab, host=args.host, port=args.port) as otel:
        otel.subscribe(lambda batch: print(batch.line(), flush=True))
        print(f"promptcache-nb otel receiving OTLP/HTTP (json, protobuf) on {otel.url}, storing into {args.store}",
              flush=True)
        print("  Claude Code:", " ".join(f"{k}={v}" for k, v in otel.env["claude"].items()), flush=True)
        print("  Gemini CLI: ", " ".join(f"{k}={v}" for k, v in otel.env["gemini"].items()), flush=True)
        print(f'  Codex (~/.codex/config.toml): [otel] exporter = {{ otlp-http = {{ endpoint = "{otel.url}/v1/logs", '
              'protocol = "json" }}', flush=True)
        print(f'  watch it from a notebook: pc.widgets.Monitor("{otel.url}")', flush=True)
        while True:
            time.sleep(3600)  # until Ctrl-C / SIGTERM


def build_parser() -> argparse.ArgumentParser:
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
    _add_store(r, "the store (created if missing)")
    r.add_argument("scenario", nargs="?", metavar="FILE_OR_NAME",
                   help=f"a scenario YAML file, or a bundled one: {bundled}")
    r.add_argument("--strategy", default="naive", metavar="STRATEGY",
                   help=f"one of: {', '.join(strategies)} (default: %(default)s)")
    r.add_argument("--cache", default="anthropic", metavar="CACHE",
                   help=f"provider cache model: {', '.join(caches)} (default: %(default)s)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.set_defaults(fn=cmd_replay, interrupted="the scenario turns being written were rolled back: the session keeps "
                                              "the whole turns stored before them (replaying again starts a new "
                                              "session)")
    q = sub.add_parser("sql", help="run SQL against a promptcache_nb DuckDB file",
                       description="Run one SQL query against a store opened read-only (a missing file is an "
                                   "error, never created) and print the result as a table. Tables: "
                                   f"{', '.join(STORE_TABLES)} (one row per request in turns, keyed by "
                                   "session_id and idx).")
    _add_store(q, "an existing store, or a fleet dataset's directory (import --out)")
    q.add_argument("query", nargs="?",
                   help='e.g. "select session_id, idx, cache_reason, cache_read_input_tokens from turns"')
    _add_formats(q)
    q.set_defaults(fn=cmd_sql)
    dr = sub.add_parser("doctor", help="check a store: schema, migrations, NULLs and references; report problems",
                        description="Check a store without changing it (read-only): every table and column this "
                                    "version expects, applied migrations, NULLs where a value is required, and "
                                    "every block, prefix node and session a row refers to, prefix chains without "
                                    "cycles, block bodies that parse. A fleet dataset's directory (import --out): "
                                    "its manifest against its Parquet files, and each file group's rows as a store's "
                                    "(import --out again re-imports a damaged group). Exit 0 when sound, 1 when "
                                    "problems are listed, 2 when the file cannot be opened.")
    _add_store(dr, "an existing store, or a fleet dataset's directory (import --out)")
    dr.set_defaults(fn=cmd_doctor)
    i = sub.add_parser("import", help="import agent logs (Claude Code, Codex, pi, OpenClaw, Gemini CLI, OpenCode, "
                                      "Cline/Roo Code, vcr, HAR, proxy exchanges, OTLP JSON)",
                       description="Import agent logs (files, folders walked whole, globs) into a store: one session "
                                   "per conversation, measured usage, why each request hit or missed the cache. "
                                   "Re-importing a growing log adds only the new requests. Prints the totals and "
                                   "the costliest sessions (sources relative to the paths given); --details prints "
                                   "every session, its rebuilds, and what was skipped, and why.")
    i.add_argument("store", nargs="?", metavar="STORE",
                   help="the DuckDB store to import into (created if missing); or give it with --db")
    i.add_argument("paths", nargs="*", help="files, directories (walked) or globs (default with --agent: the "
                                            "agent's usual log location)")
    i.add_argument("--agent", default=None, choices=AGENTS, metavar="AGENT",
                   help=f"read this agent's logs where it keeps them: {', '.join(AGENTS)}")
    i.add_argument("--db", default=None, metavar="STORE",
                   help="the store, as an option (instead of STORE; every positional is then a path)")
    i.add_argument("--out", default=None, metavar="DIR",
                   help="instead of --db: a fleet's Parquet dataset (pc.fleet; run again to add new or grown files)")
    i.add_argument("--workers", type=int, default=None, metavar="N",
                   help="import file groups in N processes (default: one per idle core for a first "
                        "usage-first import of 64 MB of logs or more, else 1)")
    _add_formats(i)
    i.add_argument("--deep", action="store_true",
                   help="analyse every body as it is stored (segments, token estimates, the simulated cache, "
                        "prefix diffs); by default the import stores measured usage first and analyses a "
                        "session's bodies when something first needs them")
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
    _add_store(a, "an existing store, or a fleet dataset's directory (import --out)")
    a.add_argument("--session", default=None, metavar="ID", help="one session (default: every session, and a "
                                                                  "fleet roll-up)")
    _add_formats(a)
    a.set_defaults(fn=cmd_advise)
    se = sub.add_parser("sessions", help="what a store holds: one row per session, costliest first",
                        description="One row per session, costliest first: when it started, its requests, every "
                                    "model it used, the measured cache read share, its cost, what it would have "
                                    "cost without the cache and what the cache saved, and its log. Sub-agent "
                                    "sessions are added into their parent's row (--flat lists each alone). The "
                                    "store is opened read-only; only measured columns are read.")
    _add_store(se, "an existing store, or a fleet dataset's directory (import --out)",
               optional="; default: the one `report` without a store fills")
    se.add_argument("--flat", action="store_true", help="one row per session, sub-agents included, each alone")
    _add_formats(se)
    se.set_defaults(fn=cmd_sessions)
    rq = sub.add_parser("requests", help="one session's requests: usage, cost, running cost and cause",
                        description="One row per request of a session: its time (UTC), model, cache read / write "
                                    "/ uncached input, output, cost, the running cost and the cause (why the cache "
                                    "read what it did, in full; empty when not analysed yet). The store is opened "
                                    "read-only.")
    _add_store(rq, "an existing store, or a fleet dataset's directory (import --out)",
               optional="; default (with SESSION alone): the one `report` without a store fills")
    rq.add_argument("session", nargs="?", metavar="SESSION", help="a session id, or a prefix of exactly one")
    _add_formats(rq)
    rq.set_defaults(fn=cmd_requests)
    rp = sub.add_parser("report", help="cost, cost without cache, saved and read share per day, hour, model, "
                                       "project or 5-hour billing window",
                        description="The measured requests (live or imported usage) per group: sessions, "
                                    "requests, read share, cost, cost without the cache and what the cache saved, "
                                    "then the totals. Without STORE: imports what the agents wrote in their usual "
                                    f"places (only what is new) into {DEFAULT_STORE_NAME} in your data folder "
                                    f"(${HOME_ENV} moves it) and reports on it.")
    _add_store(rp, "an existing store, or a fleet dataset's directory (import --out)",
               optional=f"; default: {DEFAULT_STORE_NAME} in your data folder, fed from the agents' logs")
    rp.add_argument("--by", default="day", choices=("day", "hour", "model", "project", "window"),
                    help="group by UTC day (default), UTC hour, model, project, or 5-hour billing window: a window "
                         "opens at the first request after the previous window closed and lasts 5 hours, as "
                         "Claude's usage limits count them (every measured request of the store counts, whichever "
                         "agent sent it)")
    rp.add_argument("--quiet", action="store_true", help="no progress bars (when importing into the default store)")
    _add_formats(rp)
    rp.set_defaults(fn=cmd_report, interrupted="the default store keeps the sessions imported whole before the "
                                               "interrupt: run report again to import the rest")
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
    x.add_argument("--diagnostics", action="store_true",
                   help="ask Anthropic why each Messages request missed its cache: add diagnostics."
                        "previous_message_id (the conversation's previous response) and the beta header; the "
                        "import stores the answer as turns.provider_cache_miss_reason")
    x.set_defaults(fn=cmd_proxy)
    o = sub.add_parser("otel", help="receive agents' OpenTelemetry exports (OTLP/HTTP) and store their API calls "
                                    "into STORE as they happen",
                       description="An OTLP/HTTP receiver on loopback (/v1/logs, /v1/traces, /v1/metrics; JSON or "
                                   "protobuf, gzip or not): Claude Code, Codex and Gemini CLI events and GenAI spans "
                                   "become requests with measured usage in STORE, one transaction per export. "
                                   "Prints the environment that points each agent at it, then one line per export; "
                                   "Ctrl-C stops it. See docs/otel.md.")
    o.add_argument("store", metavar="STORE", help="the DuckDB store to write (created if missing)")
    o.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    o.add_argument("--port", type=int, default=4318, help="TCP port (0: any free port; default 4318, OTLP/HTTP's)")
    o.set_defaults(fn=cmd_otel, interrupted="every export received was stored whole before the interrupt")

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
