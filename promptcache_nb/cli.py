"""The ``promptcache-nb`` command: demo, replay, sql, and serve (a local Messages-compatible endpoint)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from .errors import PromptCacheError

REPO_DATA = Path(__file__).resolve().parent.parent / "data" / "scenarios"
DEFAULT_SCENARIO = REPO_DATA / "support_agent.yaml"

DISPLAY_COLUMNS = ["strategy", "requests", "cache_read_pct", "efficiency", "cache_write", "breaks",
                   "cost_usd", "cost_no_cache_usd", "saved_usd"]


def _fresh_db(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, Path(str(path) + ".wal")):
        if p.exists():
            p.unlink()
    return path


def cmd_demo(args: argparse.Namespace) -> int:
    import promptcache_nb as pc

    from .report import write_report

    scenario = pc.load_scenario(args.scenario)
    out = Path(args.out)
    db = _fresh_db(out / "demo.duckdb")
    strategies = args.strategies.split(",") if args.strategies else list(pc.STRATEGIES)
    started = time.perf_counter()
    with pc.Lab(db, progress=not args.quiet) as lab:
        sessions = [lab.replay(scenario, strategy=name, cache=args.cache) for name in strategies]
        summary = pc.compare_df(sessions)
        frames = {s.strategy: s.turns() for s in sessions}
    elapsed = time.perf_counter() - started
    report = write_report(
        out / "report.html", summary, frames,
        title=f"promptcache_nb demo — {scenario.name} ({scenario.n_requests} requests) under {args.cache}",
        notes=[f"scenario: {scenario.path}", f"model: {scenario.model}", f"store: {db}"],
    )
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(f"\n{scenario.name}: {len(scenario.turns)} turns, {scenario.n_requests} requests, "
              f"model {scenario.model}, cache model {args.cache}")
        print("token figures: simulated (estimated tokens); efficiency = Σ cache_read / Σ ideal_cache_read\n")
        print(summary[DISPLAY_COLUMNS].to_string(index=False))
    print(f"\nwrote {db} and {report} in {elapsed:.1f} s")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    import promptcache_nb as pc

    scenario = pc.load_scenario(args.scenario)
    with pc.Lab(args.db, progress=not args.quiet) as lab:
        s = lab.replay(scenario, strategy=args.strategy, cache=args.cache)
        summary = pc.compare_df([s])
    print(f"session {s.id} in {args.db}")
    print(summary[DISPLAY_COLUMNS].to_string(index=False))
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    import promptcache_nb as pc

    with pc.Lab(args.db, progress=False) as lab:
        df = lab.sql(args.query)
    with pd.option_context("display.width", 200, "display.max_columns", 50, "display.max_rows", 500):
        print(df.to_string(index=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="promptcache-nb", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="replay the reference scenario under every strategy; table + HTML report")
    d.add_argument("--scenario", default=str(DEFAULT_SCENARIO))
    d.add_argument("--cache", default="anthropic")
    d.add_argument("--strategies", default="", help="comma-separated subset (default: all)")
    d.add_argument("--out", default="build/demo")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(fn=cmd_demo)
    r = sub.add_parser("replay", help="replay one scenario under one strategy into a DuckDB file")
    r.add_argument("scenario")
    r.add_argument("--strategy", default="naive")
    r.add_argument("--cache", default="anthropic")
    r.add_argument("--db", required=True)
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(fn=cmd_replay)
    q = sub.add_parser("sql", help="run SQL against a promptcache_nb DuckDB file")
    q.add_argument("db")
    q.add_argument("query")
    q.set_defaults(fn=cmd_sql)
    from .live.server import add_serve_arguments, run_serve

    v = sub.add_parser("serve", help="run a local Messages-compatible endpoint backed by a cache model")
    add_serve_arguments(v)  # --host (127.0.0.1) --port (8765; 0 = any) --cache (anthropic) --ttft SECONDS
    v.set_defaults(fn=run_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except PromptCacheError as exc:
        print(f"promptcache-nb: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
