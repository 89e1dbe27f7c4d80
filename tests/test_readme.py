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
