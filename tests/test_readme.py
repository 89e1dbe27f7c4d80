"""The README is the short tour: its examples run from any folder, the ten-line notebook is ten lines, and it
stays short. The manual it points to (``docs/``) documents every command, strategy, cache model and table."""

from __future__ import annotations

import re
from pathlib import Path

import promptcache_nb as pc
from promptcache_nb.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ROOT / "docs"


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_two_setup_commands():
    assert "make demo" in README and "make test" in README and "make lab" in README


def test_readme_is_short():
    """Issue 39: a README a newcomer finishes; the manual lives in docs/."""
    assert len(README.splitlines()) <= 250


def test_the_ten_line_notebook_is_ten_lines_and_runs_from_any_folder(tmp_path, monkeypatch, capsys):
    section = README.split("## A notebook in ten lines", 1)[1].split("\n## ", 1)[0]
    block = python_blocks(section)[0]
    assert len(block.strip("\n").splitlines()) <= 10, block
    monkeypatch.chdir(tmp_path)  # not the repository: the scenario comes from pc.data_path
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Usage(" in out and "PrefixDiff" in out and "Observation(" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # an in-memory Lab: nothing written where it ran


def test_readme_links_point_at_pages_that_exist():
    links = re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)(?:#[^)]*)?\)", README)
    assert len(links) >= 15
    missing = [link for link in links if not (ROOT / link).exists()]
    assert missing == []


def test_every_strategy_cache_model_and_command_is_documented():
    strategies, providers, guide = page("strategies.md"), page("providers.md"), page("command-line.md")
    for name in pc.STRATEGIES:
        assert f"`{name}`" in strategies, name
        assert f"`{name}`" in README, name
    for name in pc.CACHE_MODELS:
        assert name in providers, name
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for cmd in sub.choices:
        assert f"promptcache-nb {cmd}" in guide, f"docs/command-line.md: add a line for `promptcache-nb {cmd}`"


def test_schema_tables_are_documented():
    schema = page("schema.md")
    for table in ("projects", "sessions", "blocks", "prefix_nodes", "turns", "knowledge", "session_state",
                  "session_messages", "session_prompt_deltas", "calibrations"):
        assert f"`{table}`" in schema, table


def test_ttl_what_if_figures_are_the_output(reference_scenario, stored_session):
    """The manual's TTL what-if sentence is what ``ttl_whatif`` / ``keep_warm`` print (issue 13: they drifted).
    The replay is conftest's, made once per test run (the reference scenario under ``durable_delta``, alone in a
    fresh Lab, as this test replayed it before), opened from this test's own copy of the stored file."""
    s = stored_session("durable_delta", reference_scenario)
    totals = pc.ttl_whatif(s, ttls=("5m", "1h")).groupby("ttl")[["cache_read_input_tokens", "cost_usd"]].sum()
    warm = pc.keep_warm(s, every="4m")
    read, cost = totals["cache_read_input_tokens"], totals["cost_usd"]
    sentence = " ".join(page("providers.md").split())
    assert (f"all-1h reads more ({int(read['1h']):,} vs {int(read['5m']):,} tokens) but costs more "
            f"(${cost['1h']:.3f} vs ${cost['5m']:.3f}") in sentence
    assert (f"a ping every 4 minutes costs ${warm.ping_cost_usd:.3f} and avoids the one rebuild" in sentence
            and warm.rebuilds_without == 1)
    assert warm.rebuilds_avoided == warm.rebuilds_without
    assert f"saving ${warm.net_saving_usd:.3f}." in sentence


def test_the_quickstart_first_session_runs(tmp_path, monkeypatch, capsys):
    """The quickstart's longer first session runs as written, from any folder (its comparison is the README's,
    run by ``test_classroom.test_readme_offline_blocks_run_from_any_folder``)."""
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(python_blocks(page("quickstart.md"))[0], "docs/quickstart.md", "exec"), scope)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Usage(") and out[1].startswith("PrefixDiff")
    assert 0 < float(out[-1]) <= 1  # the session's efficiency against a perfectly stable design
    scope["lab"].close()


def test_the_notebook_count_is_the_folders():
    words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    n = len(list((ROOT / "notebooks").glob("*.ipynb")))
    assert f"| notebooks | {words.get(n, str(n))}, each runs offline" in README
