"""pc.fleet: file groups imported anywhere into a Parquet dataset, read back as a read-only Lab.

The reference everywhere is the single-process store: each path passed imported with one ``import_log`` into one
DuckDB file, as its own account (the fleet's default), each file group under its project. The dataset must equal it table by table.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import promptcache_nb as pc
from promptcache_nb import fleet
from promptcache_nb.analysis.calibrate import calibrate_families
from promptcache_nb.errors import PromptCacheError, StoreError
from promptcache_nb.ingest import import_log

#: Columns holding the wall clock of the run (when a calibration was fitted), not what was stored.
WALL_CLOCK = {"calibrations": {"fitted_at"}}


def _tables(lab: pc.Lab) -> dict[str, list[str]]:
    """Every store table's rows, canonically ordered (views over Parquet and DuckDB tables alike)."""
    names = [r[0] for r in pc.Lab().store.rows(
        "SELECT table_name FROM duckdb_tables() WHERE table_name != '_migrations'")]
    out = {}
    for table in names:
        df = lab.sql(f'SELECT * FROM "{table}"')
        df = df.drop(columns=[c for c in WALL_CLOCK.get(table, ()) if c in df.columns])
        out[table] = sorted("\x1f".join(map(repr, row)) for row in df.itertuples(index=False))
    return out


def _single_process(tmp: Path, paths: list[Path]) -> pc.Lab:
    lab = pc.Lab(tmp / "single.duckdb", progress=False)
    for path in paths:
        # one import of each path passed: its own account (the fleet's default), each group under its project
        groups, _ = fleet.plan_groups([path])
        import_log(lab, path, account=str(path.resolve()), progress=False, deep=True,
                   projects={f: g.project for g in groups for f in g.files})
    # one import of everything fits the calibrations once, at its end, over every measured request (each call
    # above fitted over what was stored so far): so does the fleet
    lab.store.con.execute("DELETE FROM calibrations")
    calibrate_families(lab, lab.store.measured_models())
    return lab


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = fleet.example_fleet(tmp_path_factory.mktemp("fleet") / "logs", developers=2, projects=2, days=4)
    return [root / "claude-code", root / "proxy"]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", pc.errors.ContextWindowWarning)


# The logs' dataset and single-process store, made once per worker: the tests below only read them, and each
# took a test a second or two to make again.
@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, logs: list[Path]) -> tuple[Path, fleet.FleetImport]:
    """The logs imported in this process into a dataset: its folder and the import's result."""
    out = tmp_path_factory.mktemp("dataset") / "out"
    with warnings.catch_warnings():  # a module fixture is made before _quiet runs
        warnings.simplefilter("ignore", pc.errors.ContextWindowWarning)
        return out, fleet.import_logs(logs, out=out, progress=False)


@pytest.fixture(scope="module")
def single_tables(tmp_path_factory: pytest.TempPathFactory, logs: list[Path]) -> dict[str, list[str]]:
    """Every table of the logs' single-process store: the reference a dataset must equal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pc.errors.ContextWindowWarning)
        lab = _single_process(tmp_path_factory.mktemp("single"), logs)
    try:
        return _tables(lab)
    finally:
        lab.close()


def test_example_fleet_copies_the_shipped_logs_with_fresh_ids_and_shifted_times(tmp_path: Path) -> None:
    a = fleet.example_fleet(tmp_path / "a", developers=2, projects=2, days=4, seed=1)
    b = fleet.example_fleet(tmp_path / "b", developers=2, projects=2, days=4, seed=1)
    files_a = sorted(p.relative_to(a) for p in a.rglob("*.jsonl"))
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*.jsonl"))  # deterministic for a seed
    main = [p for p in a.rglob("*.jsonl") if "subagents" not in p.parts and "claude-code" in p.parts]
    assert len(main) >= 4 and len({p.name for p in main}) == len(main)  # fresh session ids
    ids = [json.loads(line)["sessionId"] for p in main for line in p.read_text().splitlines()[1:2]]
    assert len(set(ids)) == len(ids)
    proxy = sorted((a / "proxy").glob("*.jsonl"))
    assert len(proxy) == 4
    lab = pc.Lab(progress=False)
    res = lab.import_log([a / "claude-code", a / "proxy"], progress=False, deep=True)
    assert len(res.sessions) == len(lab.store.session_ids()) > len(main)
    assert res.requests > 0


def test_dataset_equals_the_single_process_store_table_by_table(dataset: tuple[Path, fleet.FleetImport],
                                                                 single_tables: dict[str, list[str]]) -> None:
    out, r = dataset
    assert (r.groups["status"] == "imported").all() and r.requests > 0
    ds = fleet.open(out)
    got, want = _tables(ds), single_tables
    assert set(got) == set(want)
    for table in want:
        assert got[table] == want[table], f"table {table} differs from the single-process store"
    assert want["turns"] and want["sessions"] and want["blocks"]
    # Hive partitions: turns by project and day, sessions by project
    parts = {p.parent.relative_to(out).parts[:3] for p in (out / "turns").rglob("*.parquet")}
    assert all(x[1].startswith("project=") and x[2].startswith("day=") for x in parts)


def test_the_dataset_reads_as_plain_parquet_with_duckdb_pandas_and_dask(
        dataset: tuple[Path, fleet.FleetImport]) -> None:
    import dask.dataframe as dd
    import duckdb
    import pandas as pd

    out, r = dataset
    n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/turns/**/*.parquet', hive_partitioning=true)"
                   ).fetchall()[0][0]
    assert n == r.requests
    df = pd.read_parquet(out / "turns")
    assert len(df) == r.requests and {"project", "day", "session_id", "cache_read_input_tokens"} <= set(df.columns)
    with warnings.catch_warnings():  # dask's own use of pandas APIs pandas 3.1 deprecates: not ours to fix
        warnings.simplefilter("ignore")
        assert len(dd.read_parquet(str(out / "turns")).compute()) == r.requests


def test_a_read_only_lab_answers_every_read_and_refuses_writes(tmp_path: Path,
                                                               dataset: tuple[Path, fleet.FleetImport]) -> None:
    lab = fleet.open(dataset[0])
    assert lab.read_only
    ids = lab.store.session_ids()
    proxy = next(i for i in ids if i.startswith("proxy"))
    s = lab.open_session(proxy)
    assert len(s.turns()) >= 2
    assert isinstance(pc.rebuilds(s), type(s.turns()))
    assert pc.diff(s.turn(0), s.turn(1)).shared_prefix_tokens > 0
    assert "simulated (counterfactual)" in str(pc.advise(s))
    with pytest.raises(StoreError, match="read-only"):
        lab.new_session(system="x", project="p")
    with pytest.raises(StoreError, match="no fleet dataset"):
        fleet.open(tmp_path / "missing")


def test_running_again_imports_only_new_or_changed_groups(tmp_path: Path, logs: list[Path]) -> None:
    src = tmp_path / "logs"
    shutil.copytree(logs[0].parent, src)
    paths = [src / "claude-code", src / "proxy"]
    out = tmp_path / "out"
    first = fleet.import_logs(paths, out=out, progress=False)
    again = fleet.import_logs(paths, out=out, progress=False)
    assert (again.groups["status"] == "unchanged").all() and again.requests == 0
    # grow one proxy log by its own first line with a fresh id and a later time: that group only
    grown = sorted((src / "proxy").glob("*.jsonl"))[0]
    lines = grown.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["at"] = "2027-01-01T00:00:00.000Z"
    rec["request_id"] = "req_grown_once"
    grown.write_text("\n".join([*lines, json.dumps(rec)]) + "\n")
    # one task per account (each path passed): the proxy's only
    third = fleet.import_logs(paths, out=out, progress=False)
    assert sorted(third.groups["status"]) == ["imported", "unchanged"] and len(third.groups) == len(first.groups)
    # and remove one Claude Code project folder: its rows leave the dataset
    gone = sorted((src / "claude-code").iterdir())[0]
    shutil.rmtree(gone)
    fourth = fleet.import_logs(paths, out=out, progress=False)
    assert sorted(fourth.groups["status"]) == ["imported", "unchanged"]
    assert fourth.groups["files"].sum() < first.groups["files"].sum()
    got = _tables(fleet.open(out))
    want = _tables(_single_process(tmp_path, paths))
    assert got == want


def test_a_session_in_two_groups_is_imported_whole_by_one_task(tmp_path: Path, logs: list[Path]) -> None:
    src = tmp_path / "logs"
    shutil.copytree(logs[0], src / "cc")
    folders = sorted(p for p in (src / "cc").iterdir())
    session = next(p for p in folders[0].glob("*.jsonl"))
    # the same session (same sessionId) continued in another folder: its lines after the 20th
    lines = session.read_text().splitlines()
    session.write_text("\n".join(lines[:20]) + "\n")
    (folders[1] / session.name).write_text("\n".join(lines[20:]) + "\n")
    out = tmp_path / "out"
    # each folder passed on its own: its own account, so its own task until the shared session merges two
    r = fleet.import_logs(folders, out=out, progress=False)
    merged = r.groups[r.groups["status"] == "merged"]
    assert len(merged) == 1 and merged["files"].iloc[0] > 1
    lab = fleet.open(out)
    sessions = lab.sql("SELECT id, count(*) AS n FROM sessions GROUP BY id HAVING n > 1")
    assert sessions.empty  # one row per session
    single = pc.Lab(tmp_path / "single.duckdb", progress=False)
    single.import_log([src / "cc"], progress=False, deep=True)
    turns = "SELECT session_id, idx, cache_read_input_tokens, cost_usd FROM turns ORDER BY ALL"
    assert lab.sql(turns).equals(single.sql(turns))
    again = fleet.import_logs(folders, out=out, progress=False)  # stays merged, nothing to do
    assert (again.groups["status"] == "unchanged").all()


def test_a_process_pool_writes_the_same_dataset(tmp_path: Path, logs: list[Path],
                                                dataset: tuple[Path, fleet.FleetImport]) -> None:
    with ProcessPoolExecutor(2) as ex:
        fleet.import_logs(logs, out=tmp_path / "two", executor=ex, progress=False)
    assert _tables(fleet.open(tmp_path / "two")) == _tables(fleet.open(dataset[0]))  # the one made in-process


@pytest.mark.slow
def test_a_dask_local_cluster_writes_the_single_process_store(tmp_path: Path, logs: list[Path],
                                                              single_tables: dict[str, list[str]]) -> None:
    distributed = pytest.importorskip("distributed", reason="the [dask] extra is not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        r = fleet.import_logs(logs, out=tmp_path / "out", executor=client.get_executor(), progress=False)
    assert r.requests > 0
    assert _tables(fleet.open(tmp_path / "out")) == single_tables


def test_bad_dataset_inputs_say_what_is_wrong(tmp_path: Path, logs: list[Path]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "_fleet.json").write_text("{not json")
    with pytest.raises(PromptCacheError, match="_fleet.json: not a fleet manifest"):
        fleet.import_logs(logs, out=out, progress=False)
    assert not any(out.rglob("*.parquet"))  # nothing written
    with pytest.raises(PromptCacheError, match="no such file"):
        fleet.import_logs([tmp_path / "nope"], out=tmp_path / "out2", progress=False)
    assert os.listdir(tmp_path / "out2") == []


def test_import_log_with_two_workers_stores_what_one_process_stores(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(pc.data_path("logs"), logs)
    one = pc.Lab(tmp_path / "one.duckdb", progress=False)
    r1 = one.import_log(logs, deep=True)
    two = pc.Lab(tmp_path / "two.duckdb", progress=False)
    r2 = two.import_log(logs, workers=2, deep=True)
    assert (r2.requests, len(r2.sessions), len(r2.skipped)) == (r1.requests, len(r1.sessions), len(r1.skipped))
    assert _tables(two) == _tables(one)
    # again: every group now holds stored sessions, so they go through the single-process path: nothing new
    again = two.import_log(logs, workers=2, deep=True)
    assert again.requests == 0 and again.already_stored == r1.requests
    with pytest.raises(PromptCacheError, match="workers"):
        two.import_log(logs, workers=0, deep=True)


def test_cli_imports_a_fleet_on_worker_processes(tmp_path: Path, logs: list[Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from promptcache_nb.cli import main

    out = tmp_path / "out"
    assert main(["import", *map(str, logs), "--out", str(out), "--workers", "2", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "FleetImport(" in printed and "pc.fleet.open(" in printed
    assert max(len(line) for line in printed.splitlines()[1:]) <= 120  # the tables (line 1 names the folder)
    assert fleet.open(out).store.session_count() > 0
    assert main(["import", str(logs[0]), "--quiet"]) == 2  # neither --db nor --out
    assert "give --db FILE" in capsys.readouterr().err


def test_a_dataset_at_an_fsspec_url(logs: list[Path], single_tables: dict[str, list[str]],
                                    dataset: tuple[Path, fleet.FleetImport]) -> None:
    # fsspec's in-memory filesystem stands in for an object store (s3://... is the same code, not tested here)
    fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed")
    url = f"memory://fleet-{os.getpid()}"
    try:
        r = fleet.import_logs(logs, out=url, progress=False)
        assert r.requests > 0 and fsspec.filesystem("memory").exists(f"{url[9:]}/_fleet.json")
        assert _tables(fleet.open(url)) == single_tables
        # a session's bodies come from its file group's files there too
        lab, local = fleet.open(url), fleet.open(dataset[0])
        sid = str(lab.sql("SELECT session_id FROM turns GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1").session_id[0])
        assert lab.store._dataset_groups(sid) == local.store._dataset_groups(sid) != []
        assert lab.open_session(sid).turn(1).request == local.open_session(sid).turn(1).request
        assert (fleet.import_logs(logs, out=url, progress=False).groups["status"] == "unchanged").all()
    finally:
        fsspec.filesystem("memory").rm(url[9:], recursive=True)
    with pytest.raises(StoreError, match="no fleet dataset"):
        fleet.open("memory://nothing-here")


def test_a_group_merged_before_a_later_one_shows_a_shared_session_is_stored_serially(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # groups are merged while the workers still run: "a" is merged before "b" (finished later, as forced here)
    # turns out to hold the same session, so "a"'s merge is taken back and both go through the serial path
    from promptcache_nb.ingest import _parallel

    codex = next((pc.data_path("logs") / "codex").rglob("rollout-2026-03-03T14*.jsonl"))
    logs = tmp_path / "logs"
    for name in ("a", "b"):
        (logs / name).mkdir(parents=True)
        shutil.copy(codex, logs / name / codex.name)
    shutil.copytree(pc.data_path("logs") / "exchanges", logs / "c")
    taken_back: list[str] = []

    def in_key_order(futures: dict[Future[Any], int]) -> list[Future[Any]]:
        order = sorted(futures, key=futures.__getitem__)
        for f in order:
            f.result()
        return order

    monkeypatch.setattr(_parallel, "as_completed", in_key_order)
    one = pc.Lab(tmp_path / "one.duckdb", progress=False)
    r1 = one.import_log(logs, deep=True)
    two = pc.Lab(tmp_path / "two.duckdb", progress=False)
    delete = two.store.delete_sessions
    monkeypatch.setattr(two.store, "delete_sessions", lambda sids: (taken_back.extend(sids), delete(sids))[1])
    r2 = two.import_log(logs, workers=2, deep=True)
    assert taken_back  # the late path ran
    assert (r2.requests, sorted(r2.sessions.ids)) == (r1.requests, sorted(r1.sessions.ids))
    assert _tables(two) == _tables(one)


def test_a_sessions_reads_look_in_its_groups_files_first_then_everywhere(
        tmp_path: Path, dataset: tuple[Path, fleet.FleetImport]) -> None:
    """A session's bodies are read from the files of the file group that wrote it (the whole dataset's files cost
    a pass over every group's blocks per lookup); what is not there (another group stored it) is found in the
    rest. Here half of the group's blocks and prefix nodes are moved into another group's files: every body
    still comes back byte for byte, through the chain cut where the group's files end."""
    import duckdb

    out = tmp_path / "out"
    shutil.copytree(dataset[0], out)  # its files are changed below: a copy of the shared dataset
    lab = fleet.open(out)
    sid = next(i for i in lab.store.session_ids() if i.startswith("cc-") and lab.open_session(i).n_turns > 3)
    from promptcache_nb.analysis import load_turns

    before = [json.dumps(t.request.body) for t in load_turns(lab, sid)]  # every body, rebuilt in bulk
    last = lab.open_session(sid).turn(len(before) - 1).request  # one turn, read on its own
    (group,) = lab.store._dataset_groups(sid)
    lab.close()
    for table, key in (("blocks", "hash"), ("prefix_nodes", "id")):
        own, moved = out / table / f"{group}.parquet", out / table / "gmoved0000000.parquet"
        con = duckdb.connect()
        con.execute(f"COPY (SELECT * FROM read_parquet('{own}') WHERE hash({key}) % 2 = 0) TO '{moved}' (FORMAT parquet)")
        con.execute(f"COPY (SELECT * FROM read_parquet('{own}') WHERE hash({key}) % 2 = 1) TO '{own}.tmp' (FORMAT parquet)")
        os.replace(f"{own}.tmp", own)
        assert con.execute(f"SELECT count(*) FROM read_parquet('{moved}')").fetchone()[0] > 0
    lab = fleet.open(out)
    assert [json.dumps(t.request.body) for t in load_turns(lab, sid)] == before
    assert lab.open_session(sid).turn(len(before) - 1).request == last
    assert json.dumps(lab.session(id=sid).turn(len(before) - 1).request) == json.dumps(last)
