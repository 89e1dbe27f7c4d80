"""The usage-first import (issue 37): measured columns at once, bodies analysed when first needed or in bulk, and
after analysis every table exactly what a deep import stores.

Stores are compared table by table with SQL (``EXCEPT ALL`` both ways over every column), on the shipped example
logs (every format) and on a generated Claude Code history (two projects, sub-agent-free sessions with idle gaps
and compactions).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import _benchmarks
import duckdb
import pytest

import promptcache_nb as pc

#: body-derived ``turns`` columns: NULL until a session is analysed
BODY_COLUMNS = ("tail_node", "rest_hash", "n_segments", "total_tokens", "ideal_cache_read")
MEASURED = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
            "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens", "output_tokens", "cost_usd",
            "cost_no_cache_usd", "usage_source", "model", "events", "request_id", "dedupe_key", "source_ref")


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", pc.errors.ContextWindowWarning)
    warnings.simplefilter("ignore", pc.errors.UnpricedModelWarning)


def table_differences(a: Path, b: Path) -> dict[str, tuple[int, int]]:
    """Per table, (rows only in ``a``, rows only in ``b``) over every column; tables that agree are left out.
    The wall clock of a calibration's fit and of a migration is no stored content."""
    con = duckdb.connect()
    con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
    out = {}
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = 'a' ORDER BY 1").fetchall()]
    for t in tables:
        if t == "_migrations":
            continue
        cols = [r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = 'a' AND table_name = ? "
            "ORDER BY column_index", [t]).fetchall() if r[0] != "fitted_at"]
        sel = ", ".join(f'"{c}"' for c in cols)
        only_a = con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM a.{t} EXCEPT ALL SELECT {sel} FROM b.{t})"
                             ).fetchone()[0]
        only_b = con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM b.{t} EXCEPT ALL SELECT {sel} FROM a.{t})"
                             ).fetchone()[0]
        if only_a or only_b:
            out[t] = (only_a, only_b)
    con.close()
    return out


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shipped logs (copied: the store keeps their paths) and a deep import of them."""
    tmp = tmp_path_factory.mktemp("shipped")
    logs = tmp / "logs"
    shutil.copytree(pc.data_path("logs"), logs)
    with pc.Lab(tmp / "deep.duckdb", progress=False) as lab:
        lab.import_log(logs, deep=True)
    return logs, tmp / "deep.duckdb"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A generated two-project Claude Code history and a deep import of it."""
    tmp = tmp_path_factory.mktemp("history")
    logs = tmp / "projects"
    _benchmarks.load("_claude_code_history").write_history(logs, projects=2, sessions=3, requests=40)
    with pc.Lab(tmp / "deep.duckdb", progress=False) as lab:
        lab.import_log(logs, deep=True)
    return logs, tmp / "deep.duckdb"


def _measured(path: Path) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(f"SELECT session_id, idx, {', '.join(MEASURED)} FROM turns ORDER BY 1, 2").fetchall()


@pytest.mark.parametrize("source", ["shipped", "history"])
def test_usage_first_import_stores_the_measured_columns_of_a_deep_import(source: str, request: pytest.FixtureRequest,
                                                                          tmp_path: Path) -> None:
    logs, deep = request.getfixturevalue(source)
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        res = lab.import_log(logs)
        assert res.requests == len(_measured(deep))
        body = lab.sql(f"SELECT count(*) AS n FROM turns WHERE {' OR '.join(f'{c} IS NOT NULL' for c in BODY_COLUMNS)}")
        assert body.n[0] == 0  # nothing derived from a body yet
        waiting = lab.sql("SELECT count(*) AS n FROM unanalysed_sessions").n[0]
        assert waiting == lab.sql("SELECT count(*) AS n FROM sessions").n[0]
    assert _measured(tmp_path / "u.duckdb") == _measured(deep)  # every measured figure and cost, exactly


@pytest.mark.parametrize("source", ["shipped", "history"])
def test_analyze_makes_every_table_the_deep_imports(source: str, request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    logs, deep = request.getfixturevalue(source)
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        lab.import_log(logs)
        analysed = lab.analyze()
        assert analysed == lab.sql("SELECT count(*) AS n FROM sessions").n[0]
        assert lab.analyze() == 0  # nothing left
    assert table_differences(tmp_path / "u.duckdb", deep) == {}


@pytest.mark.parametrize("source", ["shipped", "history"])
def test_rebuilds_are_found_straight_after_a_usage_first_import(source: str, request: pytest.FixtureRequest,
                                                                tmp_path: Path) -> None:
    logs, deep = request.getfixturevalue(source)
    with pc.Lab(deep, progress=False, read_only=True) as lab:
        want = pc.rebuilds(lab)
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        lab.import_log(logs)
        got = pc.rebuilds(lab)
        summary = lab.summary()
    assert len(want) > 0
    # the same requests, the same measured loss: which requests are rebuilds needs no body
    assert list(zip(got.session, got.idx, got.lost_tokens, strict=True)) == \
        list(zip(want.session, want.idx, want.lost_tokens, strict=True))
    # a cause that needs no body is the deep one; the others wait for the bodies, and say so
    for g, w in zip(got.itertuples(), want.itertuples(), strict=True):
        assert g.reason in (w.reason, "not_analysed")
        if g.reason == "not_analysed":
            assert "analysed on first use" in g.explanation
    assert set(got.reason) & {"ttl_expired", "compaction"}
    assert (got.reason != "not_analysed").sum() >= len(got) / 2  # most causes need no body
    assert summary.rebuilds.sum() == len(want)
    with pc.Lab(deep, progress=False, read_only=True) as lab:
        deep_summary = lab.summary()
    # OpenClaw's cross-check from usage alone: its drop clause is the deep import's verdict on every request
    # whose baseline is 1,000 tokens or more (all of these logs' breaks)
    assert summary.openclaw_breaks.sum() == deep_summary.openclaw_breaks.sum() > 0


def test_opening_a_session_analyses_it_on_first_use(history: tuple[Path, Path], tmp_path: Path) -> None:
    logs, deep = history
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        res = lab.import_log(logs)
        order = lab.sql("SELECT session_id FROM unanalysed_sessions ORDER BY import_seq").session_id.tolist()
        first, last = order[0], order[-1]
        s = lab.open_session(first)  # the first session of the account: nothing before it to wait for
        assert s.turn(3).diff is not None and s.turn(3).prepared.total_tokens > 0
        waiting = set(lab.sql("SELECT session_id FROM unanalysed_sessions").session_id)
        assert first not in waiting and last in waiting
        assert len(waiting) == len(order) - 1  # one session analysed, not the history
        # the analysed session's rows are the deep import's (no earlier session of its account)
        with duckdb.connect(str(deep), read_only=True) as con:
            want = con.execute("SELECT * EXCLUDE (dedupe_key) FROM turns WHERE session_id = ? ORDER BY idx",
                               [first]).fetchall()
        got = lab.store.rows("SELECT * EXCLUDE (dedupe_key) FROM turns WHERE session_id = ? ORDER BY idx", [first])
        assert got == want
        # a later session is analysed after the sessions of its account imported before it (its simulated cache
        # holds what they wrote): here, every one
        t = res.sessions[res.sessions.ids.index(last)]
        assert t.turns().total_tokens.notna().all()
        assert lab.store.unanalysed_ids() == set()
        assert lab.analyze() == 0
    assert table_differences(tmp_path / "u.duckdb", deep) == {}


def test_advice_and_resimulate_analyse_what_they_read(history: tuple[Path, Path], tmp_path: Path) -> None:
    logs, _ = history
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        lab.import_log(logs)
        sid = lab.sql("SELECT session_id FROM unanalysed_sessions ORDER BY import_seq").session_id[0]
        df = lab.resimulate(sid, "openai")
        assert len(df) and sid not in lab.store.unanalysed_ids()
        advice = pc.advise(lab)
        assert len(advice.findings) > 0
        assert lab.store.unanalysed_ids() == set()
    with pc.Lab(tmp_path / "f.duckdb", progress=False) as lab:
        lab.import_log(logs)
        fidelity = pc.fidelity(lab)  # replays every original: each is analysed first
        assert len(fidelity) > 0 and lab.store.unanalysed_ids() == set()
    with pc.Lab(tmp_path / "w.duckdb", progress=False) as lab:
        res = lab.import_log(logs)
        stepper = pc.widgets.Stepper(res.sessions[0])  # a widget over an imported session: analysed when opened
        assert stepper is not None and res.sessions.ids[0] not in lab.store.unanalysed_ids()


def test_analyze_on_two_workers_is_the_parallel_deep_import(history: tuple[Path, Path], tmp_path: Path) -> None:
    logs, _ = history
    with pc.Lab(tmp_path / "p.duckdb", progress=False) as lab:
        lab.import_log(logs, deep=True, workers=2)
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        lab.import_log(logs)
        assert lab.analyze(workers=2) == 6
        assert lab.store.unanalysed_ids() == set()
    assert table_differences(tmp_path / "u.duckdb", tmp_path / "p.duckdb") == {}


def _analyze_then_die(path: str, after: int) -> None:
    """Analyse ``path`` and end the process without any clean-up (``os._exit``) in the middle of the
    ``after``-th request's recording: a kill, as the store sees it."""
    import promptcache_nb as pc

    original, calls = pc.Session.record, {"n": 0}

    def record(self: pc.Session, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == after:
            os._exit(9)
        return original(self, *args, **kwargs)

    pc.Session.record = record  # type: ignore[method-assign]
    with pc.Lab(path, progress=False) as lab:
        lab.analyze()


def test_a_kill_during_analyze_leaves_each_session_usage_first_or_analysed(history: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    logs, deep = history
    path = tmp_path / "u.duckdb"
    with pc.Lab(path, progress=False) as lab:
        lab.import_log(logs)
    child = multiprocessing.get_context("spawn").Process(target=_analyze_then_die, args=(str(path), 210))
    child.start()
    child.join(120)
    assert child.exitcode == 9
    assert _measured(path) == _measured(deep)  # every request is still there, its figures untouched
    with pc.Lab(path, progress=False) as lab:
        waiting = lab.store.unanalysed_ids()
        assert 0 < len(waiting) < 6  # the kill came after some sessions were analysed
        half = lab.sql("""SELECT count(*) AS n FROM turns WHERE
                           (session_id IN (SELECT unnest(?)) AND tail_node IS NOT NULL)
                           OR (session_id NOT IN (SELECT unnest(?)) AND tail_node IS NULL)""",
                       [sorted(waiting), sorted(waiting)]).n[0]
        assert half == 0  # no session half analysed
        lab.analyze()
    assert table_differences(path, deep) == {}


def test_a_grown_log_adds_only_its_new_requests(tmp_path: Path) -> None:
    logs = tmp_path / "projects"
    _benchmarks.load("_claude_code_history").write_history(logs, projects=1, sessions=2, requests=20)
    files = sorted(logs.rglob("*.jsonl"))
    lines = files[0].read_text(encoding="utf-8").splitlines(keepends=True)
    cut = len(lines) // 2
    files[0].write_text("".join(lines[:cut]), encoding="utf-8")
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        first = lab.import_log(logs).requests
        files[0].write_text("".join(lines), encoding="utf-8")
        grown = lab.import_log(logs)
        assert grown.already_stored == first and grown.requests > 0
        lab.analyze()
    with pc.Lab(tmp_path / "deep.duckdb", progress=False) as lab:
        lab.import_log(logs, deep=True)
    assert _measured(tmp_path / "u.duckdb") == _measured(tmp_path / "deep.duckdb")


def test_analyze_says_when_a_log_is_gone(tmp_path: Path) -> None:
    logs = tmp_path / "projects"
    _benchmarks.load("_claude_code_history").write_history(logs, projects=1, sessions=1, requests=5)
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        lab.import_log(logs)
        shutil.rmtree(logs)
        with pytest.raises(pc.errors.PromptCacheError, match=r"log file is gone .*measured figures stay"):
            lab.analyze()
        assert lab.sql("SELECT count(*) AS n FROM turns").n[0] == 5


def test_cli_imports_usage_first_and_deep_on_demand(shipped: tuple[Path, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from promptcache_nb.cli import main

    logs, deep = shipped
    assert main(["import", str(tmp_path / "u.duckdb"), str(logs), "--quiet"]) == 0
    assert main(["import", str(tmp_path / "d.duckdb"), str(logs), "--quiet", "--deep"]) == 0
    capsys.readouterr()
    with pc.Lab(tmp_path / "u.duckdb", progress=False, read_only=True) as lab:
        assert len(lab.store.unanalysed_ids()) == lab.sql("SELECT count(*) AS n FROM sessions").n[0]
    assert table_differences(tmp_path / "d.duckdb", deep) == {}
    assert main(["doctor", str(tmp_path / "u.duckdb")]) == 0  # a usage-first store is a sound store


def test_the_sessions_table_says_which_sessions_are_analysed(history: tuple[Path, Path], tmp_path: Path) -> None:
    logs, _ = history
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        lab.import_log(logs)
        assert not lab.sessions().analysed.any()
        first = lab.sql("SELECT session_id FROM unanalysed_sessions ORDER BY import_seq").session_id[0]
        lab.open_session(first)
        df = lab.sessions().set_index("id")
        assert df.analysed[first] and df.analysed.sum() == 1


def test_cli_import_prints_its_sessions_as_json_or_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io
    import json

    from promptcache_nb.cli import main

    logs = pc.data_path("logs") / "claude_code"
    assert main(["import", str(tmp_path / "a.duckdb"), str(logs), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert main(["import", str(tmp_path / "b.duckdb"), str(logs), "--csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["session"] for r in rows] == [r["session"] for r in table] and len(rows) >= 2
    costs = [r["cost_usd"] for r in rows]
    assert costs == sorted(costs, reverse=True)  # costliest first
    with pc.Lab(tmp_path / "a.duckdb", progress=False, read_only=True) as lab:
        assert sum(costs) == pytest.approx(float(lab.sql("SELECT sum(cost_usd) AS c FROM turns").c[0]), abs=1e-3)


def test_a_read_only_lab_says_what_analysis_needs(tmp_path: Path) -> None:
    logs = tmp_path / "projects"
    _benchmarks.load("_claude_code_history").write_history(logs, projects=1, sessions=1, requests=5)
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        sid = lab.import_log(logs).sessions.ids[0]
    with pc.Lab(tmp_path / "u.duckdb", progress=False, read_only=True) as lab:
        assert len(pc.rebuilds(lab)) >= 0 and lab.summary().requests.sum() == 5  # reads need no analysis
        with pytest.raises(pc.errors.PromptCacheError, match=r"await the analysis .* deep=True"):
            lab.open_session(sid)


def test_analyze_refuses_a_log_rewritten_since_its_import(tmp_path: Path) -> None:
    logs = tmp_path / "projects"
    _benchmarks.load("_claude_code_history").write_history(logs, projects=1, sessions=1, requests=5)
    (log,) = sorted(logs.rglob("*.jsonl"))
    with pc.Lab(tmp_path / "u.duckdb", progress=False) as lab:
        lab.import_log(logs)
        spans = lab.sql("SELECT count(*) AS n FROM turns WHERE source_digest IS NOT NULL").n[0]
        assert spans == 5  # every request says where its line is
        text = log.read_text(encoding="utf-8")
        log.write_text(text.replace('"cwd": "', '"cwd": "X', 1), encoding="utf-8")  # one byte moved
        with pytest.raises(pc.errors.PromptCacheError, match=r"changed since it was imported"):
            lab.analyze()
        assert lab.sql("SELECT count(*) AS n FROM turns").n[0] == 5  # nothing lost
        log.write_text(text + "\n", encoding="utf-8")  # grown only: analysed
        assert lab.analyze() == 1
