"""Scenario YAML: every shipped file loads; malformed files fail with one line naming file, line, field."""

from __future__ import annotations

from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.scenario import Compaction, KnowledgeUpdate, Restart
from promptcache_nb.tokens import DEFAULT_TOKENIZER, segment_tokens

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "data" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenarios_load(path):
    sc = pc.load_scenario(path)
    assert sc.turns and sc.model and sc.host_prompt
    assert sc.start.tzinfo is not None


def test_reference_scenario_meets_the_brief(reference_scenario):
    sc = pc.load_scenario(reference_scenario)
    assert len(sc.turns) >= 40
    static = DEFAULT_TOKENIZER.count(sc.host_prompt) + sum(segment_tokens("tool", t) for t in sc.tools)
    assert static >= 6000
    knowledge_turns = [i for i, t in enumerate(sc.turns) if any(e.code.startswith("knowledge") for e in t.events)]
    assert len(knowledge_turns) >= len(sc.turns) // 6
    assert max(b - a for a, b in zip(knowledge_turns, knowledge_turns[1:], strict=False)) <= 10
    assert any(len(t.tool_calls) >= 2 for t in sc.turns)
    assert any(t.after.total_seconds() > 300 for t in sc.turns)
    assert any(isinstance(e, Restart) for t in sc.turns for e in t.events)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(text, encoding="utf-8")
    return p


GOOD_HEAD = "model: claude-sonnet-4-5\nhost_prompt: You help.\n"


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("model: claude-sonnet-4-5\nturns:\n  - user: hi\n    reply: yo\n", None, "host_prompt"),
        (GOOD_HEAD + "turns:\n  - user: hi\n", 4, "turns[0].reply"),
        (GOOD_HEAD + "turns:\n  - user: hi\n    reply: yo\n    after: soon\n", 6, "turns[0].after"),
        (GOOD_HEAD + "turns:\n  - user: hi\n    reply: yo\n    events:\n      - knowledge_remove: {key: nope}\n",
         7, "turns[0].events[0].knowledge_remove.key"),
        (GOOD_HEAD + "turns:\n  - user: hi\n    reply: yo\n    events:\n      - teleport: {}\n", 7,
         "turns[0].events[0].teleport"),
        (GOOD_HEAD + "turns:\n  - user: hi\n    reply: yo\n    colour: red\n", 6, "turns[0].colour"),
        (GOOD_HEAD + "start: 2026-11-02T09:00:00\nturns:\n  - user: hi\n    reply: yo\n", 3, "start"),
        (GOOD_HEAD + "turns: [\n", None, "yaml"),
        (GOOD_HEAD + "knowledge:\n  - key: a\n    title: T\nturns:\n  - {user: hi, reply: yo}\n", 4, "knowledge[0].content"),
    ],
)
def test_bad_scenarios_one_line_errors(tmp_path, text, line, field):
    path = write(tmp_path, text)
    with pytest.raises(pc.errors.ScenarioError) as info:
        pc.load_scenario(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(path))
    assert info.value.field == field
    if line is not None:
        assert info.value.line == line, msg


def test_missing_file():
    with pytest.raises(pc.errors.ScenarioError, match="not found"):
        pc.load_scenario("/nonexistent/x.yaml")


def test_events_parse_to_values(tmp_path):
    path = write(tmp_path, GOOD_HEAD + """knowledge:
  - {key: a, title: A, content: first}
turns:
  - user: hi
    reply: yo
  - user: again
    reply: sure
    after: 7m
    events:
      - knowledge_update: {key: a, content: second}
      - compaction: {summary: we talked}
      - restart: {}
    tool_calls:
      - {name: search, input: {q: x}, result: found, after: 2s}
""")
    sc = pc.load_scenario(path)
    t = sc.turns[1]
    assert t.after.total_seconds() == 420
    assert t.events == (KnowledgeUpdate("a", content="second"), Compaction("we talked"), Restart())
    assert t.tool_calls[0].after.total_seconds() == 2
    assert sc.n_requests == 3
