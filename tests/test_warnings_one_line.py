"""Warnings a user sees are one line: ``UnpricedModelWarning: <model>: no price in genai-prices; costs left unknown``
on the command line, never our source path or a line of our code; in Python they point at the user's own line."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import promptcache_nb as pc

UNPRICED = "claude-opus-4-9"  # simulated with the opus rule; genai-prices has no price for it
SHIPPED = ("review_bot.jsonl", "release_notes_growing.jsonl")


def _unpriced_logs(folder: Path) -> list[Path]:
    """Two shipped proxy logs (two sessions) whose requests and responses name a model without a price."""
    folder.mkdir()
    out = []
    for name in SHIPPED:
        text = (pc.data_path("logs") / "exchanges" / name).read_text(encoding="utf-8")
        for model in ("claude-haiku-4-5-20251001", "claude-sonnet-4-5-20250929"):
            text = text.replace(f'"model":"{model}"', f'"model":"{UNPRICED}"')
        assert f'"model":"{UNPRICED}"' in text
        out.append(folder / name)
        out[-1].write_text(text, encoding="utf-8")
    return out


def test_cli_import_prints_an_unpriced_model_as_one_line(tmp_path):
    logs = _unpriced_logs(tmp_path / "logs")
    env = {**os.environ, "PYTHONWARNINGS": "default"}  # as a user's shell: no -W error from the test run
    proc = subprocess.run([sys.executable, "-m", "promptcache_nb.cli", "import", *map(str, logs),
                           "--db", str(tmp_path / "s.duckdb")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [f"UnpricedModelWarning: {UNPRICED}: no price in genai-prices; costs left unknown"], proc.stderr
    assert ".py" not in proc.stderr
    assert UNPRICED in proc.stdout  # the summary names it too (models without a price)


def test_in_python_the_warning_points_at_the_callers_line(tmp_path):
    logs = _unpriced_logs(tmp_path / "logs")
    with pc.Lab(progress=False) as lab, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lab.import_log(logs[0])
    unpriced = [w for w in caught if issubclass(w.category, pc.errors.UnpricedModelWarning)]
    assert len(unpriced) == 1  # once per session
    assert unpriced[0].filename == __file__  # this line, not a module of the package
    assert str(unpriced[0].message) == f"{UNPRICED}: no price in genai-prices; costs left unknown"
    assert unpriced[0].message.model == UNPRICED and unpriced[0].message.session_id  # type: ignore[union-attr]


def test_only_our_warnings_are_reformatted(capsys):
    from promptcache_nb.cli import _one_line_warnings

    with _one_line_warnings():
        ours = warnings.formatwarning(pc.errors.CalibrationWarning("no better"), pc.errors.CalibrationWarning,
                                      "/x/calibrate.py", 3, "warnings.warn(...)")
        theirs = warnings.formatwarning("old", DeprecationWarning, "/x/y.py", 7, "f()")
    assert ours == "CalibrationWarning: no better\n"
    assert theirs.startswith("/x/y.py:7: DeprecationWarning: old")
    assert warnings.formatwarning("old", DeprecationWarning, "/x/y.py", 7, "f()") == theirs  # restored
