"""The strategy-equivalence table (issue 36): six scenarios users really run, each replayed under a source
strategy, logged as the recording proxy logs it, imported, and counterfactually fixed as each target strategy;
the counterfactual's cost lands within ±10 % of the target strategy's own replay of the same scenario. One of them,
``subagents``, is a parent and two sub-agents sharing its system prompt and tools in one account's cache.

``benchmarks/equivalence_table.py`` prints the table (docs/howto/advice.md); this module holds every
cell to the bound. One Lab and one set of replays per scenario for the whole module.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import _benchmarks
import pytest

import promptcache_nb as pc

ROOT = Path(__file__).resolve().parent.parent

#: counterfactual cost vs the strategy's own replay, relative (as tests/test_advice.py)
EQUIVALENCE_BOUND = 0.10


def _table() -> ModuleType:
    return _benchmarks.load("equivalence_table")


TABLE = _table()


@pytest.fixture(scope="module")
def lab() -> Iterator[pc.Lab]:
    with pc.Lab(progress=False) as lab:
        yield lab


@pytest.fixture(scope="module")
def rows(lab: pc.Lab, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], object]:
    """Every (scenario, source, target) cell, computed once."""
    workdir = tmp_path_factory.mktemp("equivalence")
    out: dict[tuple[str, str, str], object] = {}
    for scenario in TABLE.SCENARIOS:
        replays = TABLE.replay_all(lab, scenario)
        for source in TABLE.SOURCES:
            for row in TABLE.rows_for(lab, scenario, replays, source, workdir):
                out[(row.scenario, row.source, row.target)] = row
    return out


def test_the_new_scenarios_hold_what_they_teach() -> None:
    for name in ("git_status", "tool_reorder", "idle_gaps"):
        scenario = pc.load_scenario(TABLE.scenario_path(name))
        assert len(scenario.turns) >= 40, name
    edits = [t for t in pc.load_scenario(TABLE.scenario_path("git_status")).turns
             if any(e.code == "host_prompt_edit" for e in t.events)]
    assert len(edits) >= 20  # the workspace snapshot changes on most turns
    gaps = sorted(t.after.total_seconds() / 60 for t in pc.load_scenario(TABLE.scenario_path("idle_gaps")).turns)
    assert gaps[-3:] == [3, 8, 70]
    parent, *subs = (pc.load_scenario(TABLE.scenario_path(n)) for n in TABLE.FAMILIES["subagents"])
    assert len(subs) == 2 and sum(1 + len(t.tool_calls) for t in parent.turns) >= 20
    starts = [c for t in parent.turns for c in t.tool_calls if c.name == "task"]
    assert len(starts) == len(subs)  # the parent starts each sub-agent with its task tool
    for sub in subs:
        # a sub-agent's prefix is its parent's: the same system prompt and tools, sent while the parent works
        assert (sub.host_prompt, sub.tools, sub.model) == (parent.host_prompt, parent.tools, parent.model)
        assert parent.start < sub.start < parent.start + timedelta(minutes=10)
        assert sub.turns[0].user in {c.input["prompt"] for c in starts}  # its conversation holds only the task


def test_sub_agents_read_their_parents_prefix_only_where_the_strategy_keeps_it_stable(lab: pc.Lab) -> None:
    """What the scenario teaches: a sub-agent's first request reads the system prompt and tools its parent wrote
    when the strategy keeps them byte-identical and marked (clock at the tail), and writes its own when the system
    prompt carries the clock and a list re-ranked for each conversation (naive)."""
    first_reads = {}
    for strategy in ("naive", "clock_at_tail"):
        parent, *subs = TABLE.replay_family(lab, TABLE.FAMILIES["subagents"], strategy)
        prefix = parent.turns().total_tokens.iloc[0] - 100  # the system prompt and tools: all but the first message
        first_reads[strategy] = [int(s.turns().cache_read_input_tokens.iloc[0]) for s in subs], prefix
    (naive, _), (fixed, prefix) = first_reads["naive"], first_reads["clock_at_tail"]
    assert naive == [0, 0]
    assert all(r >= prefix * 0.9 for r in fixed), (fixed, prefix)


@pytest.mark.parametrize("target", TABLE.TARGETS)
@pytest.mark.parametrize("source", TABLE.SOURCES)
@pytest.mark.parametrize("scenario", TABLE.SCENARIOS)
def test_counterfactual_lands_within_the_bound_of_the_strategy(rows, scenario, source, target) -> None:
    row = rows[(scenario, source, target)]
    assert row.requests > 0 and row.replay_usd > 0
    assert abs(row.gap) < EQUIVALENCE_BOUND, (scenario, source, target, f"{row.gap:+.1%}")
    # the advice's predicted saving (anchored on the log's measured cost) holds the real one in its interval
    assert row.inside, (scenario, source, target, row.saved_low_usd, row.real_saved_usd, row.saved_high_usd)


def test_the_table_prints_every_cell(rows) -> None:
    text = TABLE.markdown(list(rows.values()))
    lines = text.strip().split("\n")
    assert len(lines) == 2 + len(TABLE.SCENARIOS) * len(TABLE.SOURCES) * len(TABLE.TARGETS)
    assert lines[0].startswith("| scenario | from | fixed as |") and lines[0].endswith("| inside |")
    assert all(" % | " in ln and ln.endswith(("| yes |", "| no |")) for ln in lines[2:])
