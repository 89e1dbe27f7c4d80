"""Notebook 06 is a template (#26 items 1 and 6): run on a second log set of another shape — one Claude Code
session with no sub-agents and no compaction, a model switch and a two-hour idle gap — every cell runs, and the
sections the logs have nothing for say so in a sentence."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "06_your_own_agent.ipynb"
SESSION = "5e0c1f2a-7b3d-4c6e-9a8f-1d2e3f4a5b6c"
T0 = datetime(2026, 4, 7, 8, 0, tzinfo=UTC)
# (minutes after T0, model, cache read, cache write): a growing prefix; the switch to haiku reads nothing;
# after a 2-hour pause the 5-minute entries are gone
TURNS = [
    (0, "claude-sonnet-4-5-20250929", 0, 14_000),
    (1, "claude-sonnet-4-5-20250929", 14_000, 420),
    (2, "claude-sonnet-4-5-20250929", 14_420, 380),
    (3, "claude-haiku-4-5-20251001", 0, 14_850),
    (4, "claude-haiku-4-5-20251001", 14_850, 300),
    (125, "claude-haiku-4-5-20251001", 0, 15_400),
    (126, "claude-haiku-4-5-20251001", 15_400, 260),
]


def _write_log(folder: Path) -> Path:
    """One Claude Code transcript (the fields the reader uses, as Claude Code writes them)."""
    path = folder / "-home-me-ledger" / f"{SESSION}.jsonl"
    path.parent.mkdir(parents=True)
    lines, parent = [], None
    for n, (minutes, model, read, write) in enumerate(TURNS):
        at = T0 + timedelta(minutes=minutes)
        common = {"isSidechain": False, "userType": "external", "cwd": "/home/me/ledger", "sessionId": SESSION,
                  "version": "2.0.31", "gitBranch": "main"}
        user_id = f"00000000-0000-4000-8000-{n:012d}"
        lines.append({**common, "parentUuid": parent, "type": "user", "uuid": user_id,
                      "message": {"role": "user", "content": f"Question {n} about the ledger export?"},
                      "timestamp": at.isoformat().replace("+00:00", "Z")})
        reply_id = f"00000000-0000-4000-9000-{n:012d}"
        lines.append({**common, "parentUuid": user_id, "type": "assistant", "uuid": reply_id,
                      "requestId": f"req_011Ledger{n:04d}",
                      "message": {"id": f"msg_01Ledger{n:04d}", "type": "message", "role": "assistant",
                                  "model": model, "content": [{"type": "text", "text": f"Answer {n}: checked."}],
                                  "stop_reason": "end_turn", "stop_sequence": None,
                                  "usage": {"input_tokens": 4, "cache_read_input_tokens": read,
                                            "cache_creation_input_tokens": write,
                                            "cache_creation": {"ephemeral_5m_input_tokens": write,
                                                               "ephemeral_1h_input_tokens": 0},
                                            "output_tokens": 40, "service_tier": "standard"}},
                      "timestamp": (at + timedelta(seconds=5)).isoformat().replace("+00:00", "Z")})
        parent = reply_id
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("as_string", [True, False])
def test_notebook_06_runs_on_a_second_log_set(tmp_path, monkeypatch, as_string):
    logs = tmp_path / "my logs"
    _write_log(logs)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert "LOGS = " in first.source  # the template's one place to edit
    value = repr(str(logs)) if as_string else f"__import__('pathlib').Path({str(logs)!r})"
    first.source = f"import promptcache_nb as pc\n\nLOGS = {value}"
    for name, value in (("PYTHONPATH", str(ROOT)), ("PYTHONHASHSEED", "0"), ("MPLBACKEND", "Agg")):
        monkeypatch.setenv(name, value)  # the kernel inherits them: this worktree's code, deterministic
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the cell on any failure
    text = "\n".join(
        out.get("text", "") + json.dumps(out.get("data", {}))
        for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    assert "1 sessions, 7 requests" in text
    assert "no compaction" in text and "has no sub-agent or compaction sessions" in text
    assert "no Codex rollout" in text
    # the prose is computed from these logs: two rebuilds, the first the model switch
    assert "2 rebuilds; the first, request 3" in text and "model switch from claude-sonnet-4-5" in text
    assert "14,210" not in text and "6-minute" not in text  # nothing of the shipped example's prose
    assert "Error" not in "".join(o.get("ename", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
