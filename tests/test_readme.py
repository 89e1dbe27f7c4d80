"""The README's examples run, and every CLI command and public strategy/cache name is documented."""

from __future__ import annotations

import os
import re
from pathlib import Path

import promptcache_nb as pc
from promptcache_nb.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_two_setup_commands():
    assert "make demo" in README and "make test" in README and "make lab" in README


def test_first_python_example_runs(capsys):
    block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        exec(compile(block, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "Usage(" in out and "PrefixDiff" in out


def test_every_strategy_cache_model_and_command_is_documented():
    for name in pc.STRATEGIES:
        assert f"`{name}`" in README, name
    for name in pc.CACHE_MODELS:
        assert name in README, name
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for cmd in sub.choices:
        assert f"promptcache-nb {cmd}" in README, cmd


def test_schema_tables_are_documented():
    for table in ("projects", "sessions", "blocks", "prefix_nodes", "turns", "knowledge", "session_state",
                  "session_messages", "session_prompt_deltas", "calibrations"):
        assert f"`{table}`" in README, table


def test_ttl_what_if_figures_are_the_output(reference_scenario, stored_session):
    """The README's TTL what-if sentence is what ``ttl_whatif`` / ``keep_warm`` print (issue 13: they drifted).
    The replay is conftest's, made once per test run (the reference scenario under ``durable_delta``, alone in a
    fresh Lab, as this test replayed it before), opened from this test's own copy of the stored file."""
    s = stored_session("durable_delta", reference_scenario)
    totals = pc.ttl_whatif(s, ttls=("5m", "1h")).groupby("ttl")[["cache_read_input_tokens", "cost_usd"]].sum()
    warm = pc.keep_warm(s, every="4m")
    read, cost = totals["cache_read_input_tokens"], totals["cost_usd"]
    sentence = " ".join(README.split())
    assert (f"all-1h reads more ({int(read['1h']):,} vs {int(read['5m']):,} tokens) but costs more "
            f"(${cost['1h']:.3f} vs ${cost['5m']:.3f}") in sentence
    assert (f"a ping every 4 minutes costs ${warm.ping_cost_usd:.3f} and avoids the one rebuild" in sentence
            and warm.rebuilds_avoided == warm.rebuilds_without == 1)
    assert f"saving ${warm.net_saving_usd:.3f}." in sentence

