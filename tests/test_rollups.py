"""Analyses over every session at once (issue #23 item 2): ``pc.rebuilds(lab)``, ``lab.summary()`` and
``lab.summary(by=...)`` are computed in SQL over the stored ``turns`` (``store/_rollups.py``) and give what the
per-session functions give, on the shipped logs imported into one Lab plus replayed scenarios."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.frames import summarize
from promptcache_nb.analysis.rollups import GROUP_SUMMARY_COLUMNS, SESSION_SUMMARY_COLUMNS
from promptcache_nb.analysis.whatif import REBUILD_COLUMNS, _recomputed_rows

#: The first words of the CLI's headers over the key columns ("read %", "openclaw breaks" and "cost" as it heads them)
HEADED = ["session", "requests", "read", "openclaw", "rebuilds", "cost"]


def first_header_words(line: str) -> list[str]:
    """The words of a CLI table's first header line that begin the key columns' headers, in order."""
    return [w for w in line.split() if w in HEADED]


KEY_COLUMNS = ["session", "requests", "cache_read_pct", "openclaw_breaks", "rebuilds", "cost_usd", "model", "parent",
               "source"]
SUMMED = ["requests", "total_input", "cache_read", "cache_write", "uncached", "cost_usd", "rebuilds",
          "rebuild_lost_usd"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The shipped logs imported into one Lab, and two replays of the reference scenario (simulated usage)."""
    with pc.Lab(tmp_path_factory.mktemp("fleet") / "fleet.duckdb", progress=False) as lab:
        lab.import_log(pc.data_path("logs"), deep=True)
        for strategy in ("naive", "clock_in_system"):
            lab.replay(pc.load_scenario(pc.data_path("scenarios") / "support_agent.yaml"), strategy=strategy)
        yield lab


def test_lab_wide_rebuilds_are_the_per_session_rows_concatenated(fleet):
    ids = fleet.store.session_ids()
    per_session = [pc.rebuilds(fleet, session_id=sid).assign(session=sid) for sid in ids]
    rows = [r for df in per_session for r in df.to_dict("records")]  # concatenated (pd.concat would mix dtypes)
    expected = pd.DataFrame(rows, columns=["session", *REBUILD_COLUMNS])
    lab_wide = pc.rebuilds(fleet)
    assert list(lab_wide.columns) == ["session", *REBUILD_COLUMNS]
    assert list(pc.rebuilds(fleet, session_id=ids[0]).columns) == REBUILD_COLUMNS  # one session: as before
    pd.testing.assert_frame_equal(lab_wide, expected)
    # both kinds are there: measured rebuilds of imported logs and simulated ones of the replays
    assert set(lab_wide.measured) == {True, False} and lab_wide.session.nunique() >= 10


@pytest.mark.parametrize("noise_floor", [256, 0])
def test_the_sql_rule_selects_what_the_per_request_loop_finds(fleet, noise_floor):
    """The rows SQL selects equal the rows the per-request loop (the one run on stores written before causes
    were stored, from the bodies) finds, session by session: the rule has one meaning in both places."""
    for sid in fleet.store.session_ids():
        got = pc.rebuilds(fleet, session_id=sid, noise_floor=noise_floor)
        looped = pd.DataFrame(_recomputed_rows(fleet, sid, noise_floor), columns=REBUILD_COLUMNS)
        pd.testing.assert_frame_equal(got, looped, obj=sid)
    lower = pc.rebuilds(fleet, noise_floor=0)
    assert len(lower) > len(pc.rebuilds(fleet))  # the lower floor lists the small losses' causes too


def test_a_session_stored_without_causes_is_recomputed_in_the_lab_wide_call(fleet, tmp_path):
    with pc.Lab(tmp_path / "old.duckdb", progress=False) as lab:
        s = lab.replay(pc.load_scenario(pc.data_path("scenarios") / "support_agent.yaml"), strategy="naive")
        before = pc.rebuilds(lab)
        lab.store.con.execute("UPDATE turns SET cache_reason = NULL, cache_detail = NULL").fetchall()
        after = pc.rebuilds(lab)
        assert len(before) > 10 and list(after.idx) == list(before.idx) and list(after.reason) == list(before.reason)
        assert lab.summary().rebuilds.tolist() == [len(before)] and s.id in set(after.session)


def test_summary_one_row_per_session_key_columns_first(fleet):
    df = fleet.summary()
    assert list(df.columns) == SESSION_SUMMARY_COLUMNS and list(df.columns[:9]) == KEY_COLUMNS
    assert sorted(df.session) == fleet.store.session_ids()
    rebuilds = pc.rebuilds(fleet).groupby("session").size()
    for row in df.itertuples(index=False):
        s = fleet.open_session(row.session)
        turns = s.turns()
        totals = summarize(turns)  # the per-session vocabulary, from the session's own frame
        assert row.requests == totals["requests"] == len(turns)
        assert row.rebuilds == rebuilds.get(row.session, 0) == totals["rebuilds"], row.session
        assert row.rebuilds == totals["breaks"]  # one verdict: a break is a rebuild
        assert row.openclaw_breaks == int(turns.openclaw_broke.fillna(False).astype(bool).sum())
        assert (row.total_input, row.cache_read, row.cache_write, row.uncached) == (
            totals["total_input"], totals["cache_read"], totals["cache_write"], totals["uncached"])
        assert row.cache_read_pct == totals["cache_read_pct"]
        assert row.cost_usd == pytest.approx(totals["cost_usd"], abs=1e-4)
        assert row.usage == ("measured" if set(turns.usage_source) == {"imported"} else "simulated")
        assert row.parent == (s.parent_id or "") and row.model == s.model
        if row.rebuilds == 0:
            assert pd.isna(row.rebuild_lost_usd)
    assert df.rebuild_lost_usd.fillna(0).ge(0).all() and df.rebuild_lost_usd.sum() > 0


def test_an_import_summarises_its_own_sessions_in_import_order(fleet, tmp_path):
    with pc.Lab(tmp_path / "x.duckdb", progress=False) as lab:
        res = lab.import_log(pc.data_path("logs") / "claude_code", deep=True)
        df = res.summary()
        assert list(df.columns) == KEY_COLUMNS and list(df.session) == [s.id for s in res.sessions]
        lab_rows = lab.summary().set_index("session").loc[list(df.session)]
        assert list(df.rebuilds) == list(lab_rows.rebuilds) and list(df.requests) == list(lab_rows.requests)


@pytest.mark.parametrize("by", ["project", "model", "day"])
def test_groups_add_up_to_the_measured_totals(fleet, by):
    groups = fleet.summary(by=by)
    assert list(groups.columns) == [by, *GROUP_SUMMARY_COLUMNS]
    assert groups[by].is_unique and len(groups) > 1
    sessions = fleet.summary()
    measured = sessions[sessions.usage == "measured"]
    assert "simulated" in set(sessions.usage)  # the replays are in the Lab, and left out of the groups
    for column in SUMMED:
        assert groups[column].sum() == pytest.approx(measured[column].sum(), abs=1e-3), column
    assert groups.sessions.sum() >= len(measured)  # a session may span days or models
    share = groups.cache_read.sum() / groups.total_input.sum()
    assert 0 < share < 1 and groups.measured_cache_read_pct.between(0, 100).all()


def test_day_groups_are_utc_days(fleet):
    days = fleet.summary(by="day")
    stored = fleet.sql("""SELECT sent_at FROM turns WHERE usage_source = 'imported'""")["sent_at"]
    assert sorted(days.day) == sorted({t.tz_convert("UTC").date() for t in stored})


def test_an_unknown_grouping_names_the_valid_ones(fleet):
    with pytest.raises(ValueError, match="project, model, day"):
        fleet.summary(by="week")


def test_dollars_lost_to_a_rebuild_are_its_tokens_at_write_minus_read_rate(tmp_path):
    prices = pc.analysis.Prices(input=3.0, output=15.0, cache_read=0.3, cache_write_5m=3.75, cache_write_1h=6.0)
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    system = "You are the support agent for a billing product. " * 180

    def body(n: int) -> dict:
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(2 * n - 1)]
        return {"model": "claude-sonnet-4-5", "max_tokens": 256, "system": system, "messages": msgs,
                "cache_control": {"type": "ephemeral"}}

    def usage(uncached: int, read: int, write: int) -> dict:
        return {"input_tokens": uncached, "cache_read_input_tokens": read, "cache_creation_input_tokens": write,
                "output_tokens": 10}

    with pc.Lab(tmp_path / "x.duckdb", progress=False) as lab:
        s = lab.session(project="priced", prices=prices)
        s.record(body(1), at=t0, usage=usage(3, 0, 20_000))
        s.record(body(2), at=t0 + timedelta(seconds=30), usage=usage(3, 20_000, 1_500))
        s.record(body(3), at=t0 + timedelta(seconds=450), usage=usage(3, 0, 23_000))  # idle 7m: TTL expiry
        rb = pc.rebuilds(lab)
        assert list(rb.lost_tokens) == [21_503]
        row = lab.summary().iloc[0]
        assert row.rebuilds == 1
        assert row.rebuild_lost_usd == pytest.approx(round(21_503 * (3.75 - 0.3) / 1e6, 4))
        assert lab.summary(by="project").rebuild_lost_usd.tolist() == [row.rebuild_lost_usd]
        detail = json.loads(lab.sql("SELECT cache_detail FROM turns WHERE idx = 2").cache_detail[0])
        assert detail["lost_tokens"] == 21_503  # read from the stored cause, not computed again


def test_cli_import_prints_totals_and_the_costliest_sessions_by_default(tmp_path, capsys):
    from promptcache_nb.cli import TOP_SESSIONS, main

    logs = pc.data_path("logs")
    assert main(["import", str(logs), "--db", str(tmp_path / "a.duckdb"), "--quiet"]) == 0
    short = capsys.readouterr().out
    assert main(["import", str(logs), "--db", str(tmp_path / "b.duckdb"), "--quiet", "--details"]) == 0
    details = capsys.readouterr().out
    with pc.Lab(tmp_path / "b.duckdb", progress=False, read_only=True) as lab:
        summary = lab.summary()
        rebuilds = pc.rebuilds(lab)
    n = len(summary)
    assert n > TOP_SESSIONS
    for out in (short, details):
        lines = out.splitlines()
        assert all(len(line) <= 120 for line in lines[1:]), max(lines[1:], key=len)
        assert lines[1].startswith(f"totals: {summary.requests.sum():,} requests, {n} sessions, measured cache read")
        assert f"{int(summary.rebuilds.sum())} rebuilds" in lines[1]
        assert "NaN" not in out and "None" not in out
    short_lines = short.splitlines()
    assert short_lines[2] == f"the {TOP_SESSIONS} costliest of {n} sessions (all of them: --details)"
    assert first_header_words(short_lines[3]) == HEADED
    costliest = summary.sort_values(["cost_usd", "session"], ascending=[False, True]).session.head(TOP_SESSIONS)
    ids = set(summary.session)
    shown = [line.split()[0] for line in short_lines[4:] if line.split() and line.split()[0] in ids]
    assert shown == list(costliest)
    assert "rebuilds (requests that sent again" not in short and "--details lists them" in short
    # --details: every session, each session's rebuilds, the skipped lines
    detail_lines = details.splitlines()
    assert first_header_words(detail_lines[2]) == HEADED
    table = details.split("\n\n")[0].splitlines()  # the repr, the totals, the header, every row
    assert sorted(line.split()[0] for line in table if line.split() and line.split()[0] in ids) == sorted(ids)
    per_session = [line for line in detail_lines if "rebuilds (requests that sent again" in line]
    assert len(per_session) == rebuilds.session.nunique() > 0
    assert "skipped:" in details and len(details) > 2 * len(short)


def test_a_fleet_dataset_answers_as_the_store_it_equals(tmp_path):
    """``pc.fleet.open`` gives a Lab whose tables are views over Parquet: the same query answers there."""
    from promptcache_nb import fleet

    root = fleet.example_fleet(tmp_path / "logs", developers=2, projects=2, days=3)
    paths = [root / "claude-code", root / "proxy"]
    fleet.import_logs(paths, out=tmp_path / "out", progress=False)
    with pc.Lab(tmp_path / "single.duckdb", progress=False) as single:
        for g in fleet.plan_groups(paths)[0]:
            single.import_log(list(g.files), project=g.project, progress=False, deep=True)
        views = fleet.open(tmp_path / "out")
        columns = [c for c in SESSION_SUMMARY_COLUMNS if c != "source"]  # sources: where each side read the files
        mine, theirs = (lab.summary().sort_values("session", ignore_index=True)[columns] for lab in (single, views))
        pd.testing.assert_frame_equal(mine, theirs, check_dtype=False)
        assert mine.rebuilds.sum() > 0 and len(mine) > 4
        pd.testing.assert_frame_equal(single.summary(by="project"), views.summary(by="project"), check_dtype=False)
        cols = ["session", "idx", "lost_tokens", "reason", "cause"]
        pd.testing.assert_frame_equal(pc.rebuilds(single)[cols], pc.rebuilds(views)[cols], check_dtype=False)
        views.close()
