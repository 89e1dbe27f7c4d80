"""The promptcache-nb command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from promptcache_nb.cli import main

SCENARIOS = Path(__file__).resolve().parent.parent / "data" / "scenarios"


def small_scenario() -> Path:
    for name in ("tiny.yaml", "clock_tick.yaml", "support_agent.yaml"):
        if (SCENARIOS / name).exists():
            return SCENARIOS / name
    pytest.fail("no scenario shipped in data/scenarios")


def test_demo_writes_table_db_and_report(tmp_path, capsys):
    rc = main(["demo", "--scenario", str(small_scenario()), "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "efficiency" in out and "naive" in out and "simulated (estimated tokens)" in out
    assert (tmp_path / "demo.duckdb").stat().st_size > 0
    html = (tmp_path / "report.html").read_text()
    assert "<table" in html and "data:image/png;base64," in html


def test_replay_then_sql(tmp_path, capsys):
    db = tmp_path / "r.duckdb"
    assert main(["replay", str(small_scenario()), "--strategy", "naive", "--db", str(db), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["sql", str(db), "select count(*) as n_sessions from sessions"]) == 0
    out = capsys.readouterr().out
    assert "n_sessions" in out and "1" in out


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "missing.yaml"), "--db", str(tmp_path / "x.duckdb")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("promptcache-nb: error:") and err.count("\n") == 1
    assert main(["replay", str(small_scenario()), "--strategy", "bogus", "--db", str(tmp_path / "y.duckdb")]) == 2
    assert "valid:" in capsys.readouterr().err
    assert not (tmp_path / "y.duckdb").exists()  # checked before the store was created


def test_console_script_installed():
    exe = Path(sys.executable).parent / "promptcache-nb"
    assert exe.exists()
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    for cmd in ("demo", "replay", "sql", "serve"):
        assert cmd in out


def test_demo_names_the_model_that_prices_it_and_keeps_small_costs(tmp_path, capsys):
    out_dir = tmp_path / "demo"
    assert main(["demo", "--scenario", "tiny", "--cache", "openai", "--strategies", "naive,durable_delta",
                 "--out", str(out_dir), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "costs priced as gpt-5 (genai-prices openai/gpt-5), openai's stand-in for claude-sonnet-4-5" in out
    html = (out_dir / "report.html").read_text()
    assert "costs priced as gpt-5" in html and "<td>0.0073</td>" in html  # four decimals, not 0.01
    # a typo in --strategies fails before the old demo store is replaced
    before = (out_dir / "demo.duckdb").stat().st_mtime_ns
    assert main(["demo", "--scenario", "tiny", "--strategies", "naive,bogus", "--out", str(out_dir)]) == 2
    assert (out_dir / "demo.duckdb").stat().st_mtime_ns == before


def test_help_lists_defaults_and_valid_names_without_markup():
    from promptcache_nb.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    texts = [parser.format_help()] + [p.format_help() for p in sub.choices.values()]
    assert not any("``" in t for t in texts)  # no RST markup
    replay = " ".join(sub.choices["replay"].format_help().split())
    assert "durable_delta (default: naive)" in replay and "anthropic, bedrock, deepseek, gemini, openai, vllm (default: anthropic)" in replay
    assert "(default: build/demo)" in " ".join(sub.choices["demo"].format_help().split())



def test_import_tables_fit_the_terminal_and_wrap_never_cut(monkeypatch):
    import pandas as pd

    from promptcache_nb.cli import _fit

    source = "claude-code:-home-dev-service03/ea757365-3aed-6996-72b5-cdc37855eb56.jsonl"
    df = pd.DataFrame([{"session": "cc-fdeb9832ff", "model": "claude-sonnet-4-5-20250929",
                        "note": "a note that says why in a few words " * 2, "source": source}])
    narrow = _fit(df, width=80).splitlines()
    assert max(map(len, narrow)) <= 80 and len(narrow) > 2  # the prose and the path wrapped onto more lines
    text = "".join(narrow)
    assert "…" not in text  # nothing cut
    # identifiers whole on their line; the path's pieces all there, in order
    assert "claude-sonnet-4-5-20250929" in narrow[1] and "cc-fdeb9832ff" in narrow[1]
    squeezed = "".join(line[line.index(narrow[1].split()[-1][:6]) if narrow[1].split()[-1][:6] in line else 0:]
                       for line in narrow[1:])
    assert all(part in squeezed for part in ("claude-code:", "ea757365"))
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal shows each row on one line
    assert source in _fit(df) and len(_fit(df).splitlines()) == 2
    many = pd.DataFrame({"idx": range(25), "cause": ["ttl"] * 25})
    shown = _fit(many, max_rows=20).splitlines()
    assert len(shown) == 22 and shown[-1] == "… 5 more rows"


def test_output_into_a_closed_pipe_stops_quietly(tmp_path):
    """`promptcache-nb sql ... | head -1`: the reader leaves early; no traceback, the shell's status for it."""
    import promptcache_nb as pc

    db = tmp_path / "s.duckdb"
    pc.Lab(db, progress=False).close()
    exe = Path(sys.executable).parent / "promptcache-nb"
    proc = subprocess.Popen([str(exe), "sql", str(db), "SELECT * FROM range(300000)"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == b"range"
    proc.stdout.close()  # as `head -1` does once it has its line
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err and err == ""


def test_read_commands_take_a_fleet_dataset(tmp_path, capsys):
    from promptcache_nb import data_path, fleet

    out = tmp_path / "fleet"
    fleet.import_logs([data_path("logs") / "claude_code"], out=out, progress=False)
    assert main(["sql", str(out), "SELECT count(DISTINCT session_id) AS n FROM turns"]) == 0
    n = int(capsys.readouterr().out.split()[-1])
    assert n >= 2
    assert main(["advise", "--db", str(out)]) == 0
    assert "(counterfactual)" in capsys.readouterr().out
    assert main(["sql", str(tmp_path), "SELECT 1"]) == 2  # a directory that is no dataset: the store's one-line error
    assert "is a directory" in capsys.readouterr().err
