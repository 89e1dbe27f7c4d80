"""The CLI's tables (issue #37 items 3 and 4): ``sessions``, ``requests`` and ``report`` on a real store imported
from the shipped logs, their ``--json`` / ``--csv``, the store as the first argument (``--db`` its alias),
wrapping instead of cutting, and ``report`` with no store (the agents' usual places into the default store).
Measured columns only: nothing here needs a request's body."""

from __future__ import annotations

import csv
import io
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.rollups import billing_windows
from promptcache_nb.cli import HOME_ENV, TABLE_WIDTH, default_store_path, main

LOGS = pc.data_path("logs")
#: The environment variables that move an agent's usual log place (cleared: the fake home decides).
AGENT_ENV = ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "PI_CODING_AGENT_DIR", "OMP_CODING_AGENT_DIR", "OPENCLAW_STATE_DIR",
             "CLINE_DIR", "OPENCODE_DB", "XDG_DATA_HOME", "XDG_CONFIG_HOME")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(capsys, *argv: str) -> list[dict]:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The shipped logs imported by the CLI, the store named first."""
    db = tmp_path_factory.mktemp("tables") / "logs.duckdb"
    assert main(["import", str(db), str(LOGS), "--quiet"]) == 0
    return db


@pytest.fixture(scope="module")
def flat(store):
    with pc.Lab(store, progress=False, read_only=True) as lab:
        return lab.summary()


def test_sessions_are_sorted_by_cost_and_sub_agents_rolled_up(store, flat, capsys):
    rolled = as_json(capsys, "sessions", store)
    each = as_json(capsys, "sessions", store, "--flat")
    costs = [r["cost_usd"] for r in rolled]
    assert costs == sorted(costs, reverse=True) and all(c is not None for c in costs)
    assert [r["cost_usd"] for r in each] == sorted((r["cost_usd"] for r in each), reverse=True)
    assert len(each) == len(flat) and {r["session"] for r in each} == set(flat.session)
    children = flat[flat.parent != ""]
    assert len(children) >= 3  # the shipped logs hold sub-agents (Claude Code, pi, OpenCode, Gemini CLI, Cline)
    assert len(rolled) == len(flat) - len(children)
    assert {r["session"] for r in rolled} == set(flat.session[flat.parent == ""])
    by_id = {r["session"]: r for r in each}
    for row in rolled:
        family = [row["session"], *children.session[children.parent == row["session"]]]
        assert row["subagents"] == len(family) - 1
        assert row["requests"] == sum(by_id[s]["requests"] for s in family)
        assert row["cost_usd"] == pytest.approx(sum(by_id[s]["cost_usd"] for s in family), abs=1e-3)
        models = {m for s in family for m in by_id[s]["models"].split(", ")}
        assert set(row["models"].split(", ")) == models
    parent = next(r for r in rolled if r["subagents"] >= 2)
    assert parent["cost_usd"] > by_id[parent["session"]]["cost_usd"]  # the sub-agents' cost is in its row
    # the figures the summary vocabulary gives, cost without cache and saved among them
    want = flat.set_index("session")
    for r in each:
        expected = want.loc[r["session"], "cost_no_cache_usd"]
        assert r["cost_no_cache_usd"] == (None if expected != expected else pytest.approx(expected))
        if r["saved_usd"] is not None:
            assert r["saved_usd"] == pytest.approx(r["cost_no_cache_usd"] - r["cost_usd"], abs=2e-4)


def test_the_sessions_table_shows_the_json_figures_in_cost_order(store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    rows = as_json(capsys, "sessions", store)
    code, out, _ = run(capsys, "sessions", store)
    assert code == 0 and "…" not in out
    lines = out.splitlines()
    starts = [next(i for i, line in enumerate(lines) if line.startswith(r["session"] + " ")) for r in rows]
    assert starts == sorted(starts)  # costliest first, as in the JSON
    for r, i in zip(rows, starts, strict=True):
        assert f"{r['cost_usd']:.4f}" in lines[i] and f"{r['requests']:,}" in lines[i]
        for model in r["models"].split(", "):  # full model names, never cut
            assert model in out
    assert "claude-haiku-4-5-20251001" in out and "claude-sonnet-4-5-20250929" in out


def test_requests_running_cost_is_the_cumulative_cost(store, flat, capsys):
    sid = flat.sort_values("requests").session.iloc[-1]
    rows = as_json(capsys, "requests", store, sid[:8])  # a unique prefix names it
    assert len(rows) == int(flat.set_index("session").loc[sid, "requests"])
    assert [r["idx"] for r in rows] == list(range(len(rows)))
    running = 0.0
    for r in rows:
        running += r["cost_usd"]
        assert r["running_cost_usd"] == pytest.approx(running, abs=1e-9)
    assert rows[-1]["running_cost_usd"] == pytest.approx(flat.set_index("session").loc[sid, "cost_usd"], abs=1e-3)
    with pc.Lab(store, progress=False, read_only=True) as lab:
        stored = lab.sql("SELECT cache_read_input_tokens AS r, cache_creation_input_tokens AS w, input_tokens AS u "
                         "FROM turns WHERE session_id = ? ORDER BY idx", [sid])
    assert [(r["cache_read"], r["cache_write"], r["uncached"]) for r in rows] == list(stored.itertuples(index=False,
                                                                                                       name=None))


def test_requests_needs_one_session(store, capsys):
    code, _, err = run(capsys, "requests", store, "cc-")
    assert code == 2 and "names" in err and "give more of it" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "requests", store, "nope")
    assert code == 2 and "no session 'nope'" in err
    code, _, err = run(capsys, "requests", store)
    assert code == 2 and "SESSION missing" in err


@pytest.mark.parametrize("by", ["day", "hour", "model", "project", "window"])
def test_report_groups_add_up_to_the_measured_requests(store, flat, capsys, by):
    rows = as_json(capsys, "report", store, "--by", by)
    measured = flat[flat.usage == "measured"]
    assert len(rows) > 1 and len({r[by] for r in rows}) == len(rows)
    assert sum(r["requests"] for r in rows) == measured.requests.sum()
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(measured.cost_usd.sum(), abs=1e-3)
    for r in rows:
        if r["cost_no_cache_usd"] is not None:
            assert r["saved_usd"] == pytest.approx(r["cost_no_cache_usd"] - r["cost_usd"], abs=2e-4)
        assert 0 <= r["measured_cache_read_pct"] <= 100
    keys = [r[by] for r in rows]
    if by in ("day", "hour", "window"):
        assert keys == sorted(keys)  # time order
    else:
        costs = [r["cost_usd"] for r in rows]
        assert costs == sorted(costs, reverse=True)  # costliest first
    code, out, _ = run(capsys, "report", store, "--by", by)
    assert code == 0 and f"\ntotal: {measured.requests.sum():,} requests, read share" in out


def test_report_by_day_is_the_default_and_matches_lab_summary(store, capsys):
    rows = as_json(capsys, "report", store)
    with pc.Lab(store, progress=False, read_only=True) as lab:
        days = lab.summary(by="day")
    assert [r["day"] for r in rows] == [d.isoformat() for d in days.day]
    assert [r["cost_usd"] for r in rows] == pytest.approx(list(days.cost_usd))


def _body(n: int) -> dict:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(2 * n - 1)]
    return {"model": "claude-sonnet-4-5", "max_tokens": 256, "system": "You answer billing questions. " * 60,
            "messages": msgs}


def test_billing_windows_open_at_the_first_request_after_the_last_one_closed(tmp_path, capsys):
    t0 = datetime(2026, 11, 2, 9, 17, 5, tzinfo=UTC)
    # window 1: 09:17 - 14:17 (three requests, the last one second before it closes); window 2 opens at 14:17:05
    # exactly (a window is 5 hours: the request at its end opens the next) and runs to 19:17; 20:17 opens window 3
    offsets = [timedelta(0), timedelta(hours=1), timedelta(hours=4, minutes=59, seconds=59), timedelta(hours=5),
               timedelta(hours=6), timedelta(hours=11)]
    times = [t0 + o for o in offsets]
    assert billing_windows(times) == [times[0], times[3], times[5]]
    db = tmp_path / "windows.duckdb"
    with pc.Lab(db, progress=False) as lab:
        first, second = lab.session(project="a"), lab.session(project="b")
        for k, at in enumerate(times):
            s = first if k % 2 == 0 else second  # two sessions share the account's windows
            s.record(_body(k + 1), at=at, usage={"input_tokens": 10, "cache_read_input_tokens": 100 * k,
                                                 "cache_creation_input_tokens": 50, "output_tokens": 5})
    rows = as_json(capsys, "report", db, "--by", "window")
    assert [datetime.fromisoformat(r["window"]) for r in rows] == [times[0], times[3], times[5]]
    assert [datetime.fromisoformat(r["window_end"]) for r in rows] == [times[0] + timedelta(hours=5),
                                                                       times[3] + timedelta(hours=5),
                                                                       times[5] + timedelta(hours=5)]
    assert [r["requests"] for r in rows] == [3, 2, 1] and [r["sessions"] for r in rows] == [2, 2, 1]
    hours = as_json(capsys, "report", db, "--by", "hour")
    assert [r["requests"] for r in hours] == [1, 1, 2, 1, 1]  # 14:17:04 and 14:17:05 share an hour, not a window
    assert hours[2]["hour"] == "2026-11-02T14:00:00"  # UTC, floored to the hour


def test_csv_parses_and_holds_the_json_rows(store, capsys):
    for argv in (["sessions", store], ["requests", store, "pi-40"], ["report", store, "--by", "model"],
                 ["sql", store, "SELECT session_id, count(*) AS n FROM turns GROUP BY 1 ORDER BY 1"]):
        rows = as_json(capsys, *argv)
        code, out, _ = run(capsys, *argv, "--csv")
        assert code == 0
        parsed = list(csv.DictReader(io.StringIO(out)))
        assert len(parsed) == len(rows) and list(parsed[0]) == list(rows[0])
        for got, want in zip(parsed, rows, strict=True):
            for k, v in want.items():
                assert got[k] == ("" if v is None else str(v)), (argv[0], k)


def test_the_store_comes_first_or_with_db(store, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))  # no default store there
    for argv in (["sessions"], ["report", "--by", "model"], ["requests", "pi-40"],
                 ["sql", "SELECT count(*) AS n FROM turns"]):
        first = run(capsys, argv[0], store, *argv[1:], "--json")
        alias = run(capsys, argv[0], *argv[1:], "--db", store, "--json")
        assert first[0] == alias[0] == 0 and first[1] == alias[1] and json.loads(first[1])
    code, _, err = run(capsys, "requests", store, "pi-40", "--db", store)
    assert code == 2 and "given twice" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "sessions")
    assert code == 2 and err.startswith("promptcache-nb: error: sessions: name the store first (sessions STORE), "
                                        "or give --db STORE (no default store at ")
    assert len(err.strip().splitlines()) == 1
    first, alias = run(capsys, "doctor", store), run(capsys, "doctor", "--db", store)
    assert first == alias and "migrations applied" in first[1]  # the same check of the same store


def test_import_takes_the_store_first(tmp_path, capsys):
    db = tmp_path / "first.duckdb"
    code, out, _ = run(capsys, "import", db, LOGS / "codex", "--quiet")
    assert code == 0 and out.startswith("ImportResult(2 sessions")
    code, out, _ = run(capsys, "import", LOGS / "codex", "--db", db, "--quiet")
    assert code == 0 and "0 new requests" in out.splitlines()[0]
    code, _, err = run(capsys, "import", tmp_path / "other.duckdb", LOGS / "codex", "--db", db)
    assert code == 2 and "store given twice" in err


def test_import_lists_sessions_costliest_first_and_what_the_cache_saved(tmp_path, capsys):
    db = tmp_path / "few.duckdb"
    code, out, _ = run(capsys, "import", db, LOGS / "claude_code", "--quiet")  # fewer sessions than the top ten
    with pc.Lab(db, progress=False, read_only=True) as lab:
        summary = lab.summary()
    assert code == 0 and len(summary) <= 10
    ids = set(summary.session)
    rows = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in ids]
    assert rows == list(summary.sort_values(["cost_usd", "session"], ascending=[False, True]).session)
    no_cache, cost = summary.cost_no_cache_usd.sum(), summary.cost_usd.sum()
    assert (f"without the cache these requests would have cost ${no_cache:,.2f}: it saved ${no_cache - cost:,.2f}"
            in " ".join(out.split()))


def test_the_import_line_fits_120_columns_with_a_long_store_path(tmp_path, capsys):
    db = tmp_path.joinpath(*(["a-rather-long-folder-name"] * 5)) / "store.duckdb"
    db.parent.mkdir(parents=True)
    code, out, _ = run(capsys, "import", db, LOGS, "--quiet")
    line = out.splitlines()[0]
    assert code == 0 and len(line) <= TABLE_WIDTH and line.startswith("ImportResult(")
    assert "store.duckdb" in line and "…" in line  # cut in the middle, the file's name kept


def test_a_long_explanation_wraps_and_is_never_cut(store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    rows = as_json(capsys, "requests", store, "pi-40")
    longest = max((r["cause"] or "" for r in rows), key=len)
    assert len(longest) > 200  # an explanation in full, far wider than the terminal
    code, out, _ = run(capsys, "requests", store, "pi-40")
    assert code == 0 and "…" not in out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("idx "))
    at = lines[head].index("cause")
    column = "".join(line[at:] for line in lines[head + 1:]).replace(" ", "")
    for r in rows:
        assert (r["cause"] or "").replace(" ", "") in column  # every character, in order
    assert max(len(line) for line in lines) < len(longest)
    cell = max(len(line) for line in lines[head:]) - at
    narrow = [line for line in lines[head + 1:] if line[:at].strip() == ""]
    assert cell < len(longest) and len(narrow) >= len(longest) // cell  # continued on lines of its own cell


def _fake_home(home: Path) -> None:
    """The shipped logs where the agents keep them (each agent's own layout under a home folder)."""
    shutil.copytree(LOGS / "claude_code" / "-home-dev-billing-service",
                    home / ".claude" / "projects" / "-home-dev-billing-service")
    shutil.copytree(LOGS / "codex", home / ".codex" / "sessions")
    shutil.copytree(LOGS / "pi" / "--home-ann-ledger-api--", home / ".pi" / "agent" / "sessions" /
                    "--home-ann-ledger-api--")
    shutil.copytree(LOGS / "gemini_cli" / "chats", home / ".gemini" / "tmp" / "3f0c6a41" / "chats")


def test_report_without_a_store_imports_the_agents_logs_once(tmp_path, capsys, monkeypatch):
    home, data = tmp_path / "home", tmp_path / "data"
    _fake_home(home)
    for name in AGENT_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(HOME_ENV, str(data))
    assert default_store_path() == data / "history.duckdb"
    code, out, err = run(capsys, "report", "--quiet")
    assert code == 0, err
    first = " ".join(out.split("\nmeasured requests by")[0].split())  # the import's line, wrapped to the terminal
    assert first.startswith(f"{data / 'history.duckdb'}: ") and "0 already stored" in first
    assert "claude-code" in first and "codex" in first and "pi" in first and "gemini-cli" in first
    with pc.Lab(data / "history.duckdb", progress=False, read_only=True) as lab:
        n = int(lab.sql("SELECT count(*) AS n FROM turns").n[0])
        days = lab.summary(by="day")
    assert n > 20 and f"{n:,} new requests" in first
    assert f"\ntotal: {n:,} requests" in out
    code, out, _ = run(capsys, "report", "--quiet", "--by", "window")
    assert code == 0 and " ".join(out.split()).startswith(f"{data / 'history.duckdb'}: 0 new requests, {n:,} already")
    rows = as_json(capsys, "report", "--quiet")  # the import's line goes to stderr: stdout is the JSON alone
    assert [r["requests"] for r in rows] == list(days.requests)
    sessions = as_json(capsys, "sessions")  # the default store, when no store is named
    assert sum(r["requests"] for r in sessions) == n
    requests = as_json(capsys, "requests", sessions[0]["session"])  # SESSION alone: in the default store
    assert [r["idx"] for r in requests][:3] == [0, 1, 2] and requests[-1]["running_cost_usd"] == pytest.approx(
        sum(r["cost_usd"] for r in requests))


def test_the_default_store_lives_in_the_user_data_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    path = default_store_path()
    assert path.name == "history.duckdb" and path.parent.name == "promptcache-nb"
    assert path.is_relative_to(tmp_path)  # the user's own data folder, under their home


def test_advise_takes_the_store_first_and_prints_json(tmp_path, capsys):
    db = tmp_path / "replay.duckdb"
    assert main(["replay", str(db), "tiny", "--quiet"]) == 0
    capsys.readouterr()
    first = as_json(capsys, "advise", db)
    alias = as_json(capsys, "advise", "--db", db)
    assert first == alias and {r["fix"] for r in first} >= {"all"}
    assert all(r["label"] == "simulated (counterfactual)" for r in first)
    code, out, _ = run(capsys, "advise", db, "--csv")
    parsed = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["fix"] for r in parsed] == [r["fix"] for r in first]
    assert json.loads(parsed[0]["requests"]) == first[0]["requests"]  # a list cell is written as its JSON


def test_report_without_logs_or_store_says_where_it_looked(tmp_path, capsys, monkeypatch):
    for name in AGENT_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "data"))
    code, out, err = run(capsys, "report")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "no agent logs in their usual places" in err and "name one (report STORE)" in err
    assert not (tmp_path / "data").exists()  # nothing created when there is nothing to read


def test_a_query_naming_the_old_time_column_says_its_new_name(store, capsys):
    code, _, err = run(capsys, "sql", store, "select session_id, idx, at from turns")
    assert code == 2 and "sent_at" in err and len(err.strip().splitlines()) == 1
