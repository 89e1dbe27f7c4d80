"""Whatever path a usage-first import takes, the store is the same (issue 37's import at the parse floor).

The paths: one process (``workers=1``, the reference); runs of file groups on 2 and 3 worker processes, merged by
this one (``ingest/_parallel.py``); ``workers`` left to decide (every core from ``PARALLEL_BYTES`` of logs); and
the bulk write by columns instead of DuckDB's appender (``store/_connection.py``, from ``COLUMNS_FROM`` rows).
Each store is compared with the reference table by table with SQL over every column, and the lines each import
reports skipped are the same. The logs: the shipped example logs of every format, plus Claude Code transcripts
written here with the cases a shortcut would get wrong: a response streamed over three lines whose output count
grows, a user line written twice, a user line holding a 3 MB tool result, an inline sidechain of two interleaved
sub-agents, a sub-agent file, a compaction, an idle gap, a line that is not JSON, and a non-log file in the walk.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_usage_first import table_differences

import promptcache_nb as pc
from promptcache_nb import ingest
from promptcache_nb.ingest import _import, _parallel
from promptcache_nb.ingest._groups import plan_groups
from promptcache_nb.store import _connection

MODEL = "claude-sonnet-4-5-20250929"
SESSION = "5b0c1f3e-7a2d-4c61-9e84-1d2f3a4b5c6d"
OTHER = "8e1d2c3b-4a5f-4e6d-8c7b-9a0b1c2d3e4f"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", pc.errors.ContextWindowWarning)
    warnings.simplefilter("ignore", pc.errors.UnpricedModelWarning)


class _Transcript:
    """Claude Code 2.x lines, each with the envelope every line repeats."""

    def __init__(self, session: str, start: datetime) -> None:
        self.session, self.at, self.lines, self.n = session, start, [], 0

    def entry(self, parent: str | None, uuid: str | None = None, seconds: float = 2, **fields: Any) -> str:
        self.n += 1
        self.at += timedelta(seconds=seconds)
        uuid = uuid or f"{self.session[:8]}-{self.n:04d}"
        self.lines.append(json.dumps({
            "parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": "/home/dev/edge",
            "sessionId": self.session, "version": "2.0.14", "gitBranch": "main", **fields, "uuid": uuid,
            "timestamp": self.at.isoformat(timespec="milliseconds").replace("+00:00", "Z")}))
        return uuid

    def response(self, parent: str | None, msg: str, outputs: tuple[int, ...], *, read: int, write: int,
                 seconds: float = 3, **fields: Any) -> str:
        """One response streamed over ``len(outputs)`` lines (thinking, text, tool_use...), each repeating the
        message id, request id and usage; ``outputs``: each line's output count (early ones placeholders)."""
        kinds = ({"type": "thinking", "thinking": "Check the ledger first.", "signature": "c2ln"},
                 {"type": "text", "text": "Reading the ledger module."},
                 {"type": "tool_use", "id": f"toolu_{msg}", "name": "Read", "input": {"file_path": "ledger.py"}})
        for i, out in enumerate(outputs):
            usage = {"input_tokens": 3, "cache_creation_input_tokens": write, "cache_read_input_tokens": read,
                     "cache_creation": {"ephemeral_5m_input_tokens": write, "ephemeral_1h_input_tokens": 0},
                     "output_tokens": out, "service_tier": "standard"}
            parent = self.entry(parent, seconds=seconds if i == 0 else 0.4, type="assistant", requestId=f"req_{msg}",
                                message={"model": MODEL, "id": f"msg_{msg}", "type": "message", "role": "assistant",
                                         "content": [kinds[i % 3]], "stop_reason": None, "usage": usage},
                                **fields)
        return parent

    def tool_result(self, parent: str, msg: str, text: str, **fields: Any) -> str:
        return self.entry(parent, type="user", message={"role": "user", "content": [
            {"tool_use_id": f"toolu_{msg}", "type": "tool_result", "content": text}]}, **fields)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")


def _edge_history(root: Path) -> Path:
    """The shipped logs plus the edge-case transcripts (module docstring) under ``root``."""
    shutil.copytree(pc.data_path("logs"), root)
    start = datetime(2026, 9, 14, 9, 0, tzinfo=UTC)
    t = _Transcript(SESSION, start)
    t.lines.append(json.dumps({"type": "file-history-snapshot", "messageId": "m0", "isSnapshotUpdate": False,
                               "snapshot": {"messageId": "m0", "trackedFileBackups": {}, "timestamp": "x"}}))
    p = t.entry(None, type="user", message={"role": "user", "content": "Fix the proration rounding."})
    p = t.response(p, "01", (1, 1, 182), read=0, write=14_200)  # streamed: the largest output count is kept
    huge = "\n".join(f"{i:6d}\tledger_{i % 97} = round(total * rate, 2)  # cents" for i in range(60_000))
    assert len(huge) > 3_000_000
    p = t.tool_result(p, "01", huge)
    t.lines.append(t.lines[-1])  # the same user entry written twice (a resumed session copies lines)
    p = t.response(p, "02", (1, 95), read=14_200, write=600)
    # an inline sidechain (Claude Code 1.0.x): two sub-agents, interleaved, each from its own root prompt
    a = t.entry(p, type="user", isSidechain=True, message={"role": "user", "content": "Agent A: find callers."})
    b = t.entry(p, type="user", isSidechain=True, message={"role": "user", "content": "Agent B: read tests."})
    a = t.response(a, "a1", (1, 40), read=0, write=3_100, isSidechain=True)
    b = t.response(b, "b1", (1, 55), read=0, write=2_900, isSidechain=True)
    a = t.tool_result(a, "a1", "ledger.py:12 prorate()", isSidechain=True)
    t.response(a, "a2", (60,), read=3_100, write=90, isSidechain=True)
    t.response(b, "b2", (1, 70), read=2_900, write=120, isSidechain=True)
    t.lines.append('{"parentUuid": "x", "type": "user", "message": {"role": "user", "content": [')  # not JSON
    p = t.response(p, "03", (1, 1, 210), read=14_800, write=900)
    p = t.tool_result(p, "03", "tests pass")
    p = t.entry(p, type="system", subtype="compact_boundary", content="Conversation compacted", level="info",
                compactMetadata={"trigger": "auto", "preTokens": 15_700})
    p = t.entry(p, type="user", isCompactSummary=True, message={"role": "user", "content": "Summary: rounding."})
    p = t.response(p, "04", (1, 120), read=0, write=14_500)
    t.response(p, "05", (1, 80), read=0, write=14_700, seconds=11 * 60)  # idle past the 5-minute TTL
    project = root / "claude_code_edge" / "-home-dev-edge"
    t.write(project / f"{SESSION}.jsonl")
    sub = _Transcript(SESSION, start + timedelta(seconds=30))  # a sub-agent file (2.1.x layout)
    q = sub.entry(None, type="user", isSidechain=True, agentId="c7d8", message={"role": "user", "content": "Go."})
    q = sub.response(q, "s1", (1, 30), read=0, write=2_000, isSidechain=True, agentId="c7d8")
    q = sub.tool_result(q, "s1", "done", isSidechain=True, agentId="c7d8")
    sub.response(q, "s2", (44,), read=2_000, write=50, isSidechain=True, agentId="c7d8")
    sub.write(project / SESSION / "subagents" / "agent-c7d8.jsonl")
    other = _Transcript(OTHER, start + timedelta(hours=2))
    r = other.entry(None, type="user", message={"role": "user", "content": "Add a webhook retry."})
    r = other.response(r, "o1", (1, 64), read=0, write=13_000)
    r = other.tool_result(r, "o1", "ok")
    other.response(r, "o2", (1, 33), read=13_000, write=400)
    other.write(root / "claude_code_other" / "-home-dev-other" / f"{OTHER}.jsonl")
    (root / "claude_code_other" / "-home-dev-other" / "settings.json").write_text('{"theme": "dark"}\n')
    return root


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, list[tuple[str, int, str]]]]:
    """The logs, the reference store (``workers=1``) and the lines it reported skipped."""
    tmp = tmp_path_factory.mktemp("paths")
    logs = _edge_history(tmp / "logs")
    with pc.Lab(tmp / "ref.duckdb", progress=False) as lab:
        res = lab.import_log(logs, workers=1)
        skipped = _skipped(res)
    yield logs, tmp / "ref.duckdb", skipped


def _skipped(res: pc.ImportResult) -> list[tuple[str, int, str]]:
    return sorted((str(r.file), int(r.line), str(r.reason)) for r in res.skipped.itertuples())


def test_the_reference_store_holds_what_the_edge_cases_say(edge: tuple[Path, Path, list[Any]]) -> None:
    """The facts a shortcut would break, checked on the reference before comparing the other paths with it."""
    _, ref, skipped = edge
    with pc.Lab(ref, read_only=True, progress=False) as lab:
        rows = lab.store.query("SELECT request_id, session_id, output_tokens, events, cache_reason FROM turns "
                               "WHERE request_id LIKE 'req_%'")
        kinds = {r["id"]: r["kind"] for r in lab.store.query(
            "SELECT id, json_extract_string(config, '$.session_kind') AS kind, parent_id FROM sessions")}
    by_req = {r["request_id"]: r for r in rows}
    assert by_req["req_01"]["output_tokens"] == 182  # the largest count over the streamed lines
    assert by_req["req_03"]["output_tokens"] == 210
    assert "compaction" in by_req["req_04"]["events"]
    assert by_req["req_05"]["cache_reason"] not in (None, "hit")  # the idle gap rebuilt the cache
    main = by_req["req_01"]["session_id"]
    # each inline sub-agent is its own session, apart from the main chain and from each other
    assert len({by_req[k]["session_id"] for k in ("req_01", "req_a1", "req_b1", "req_s1")}) == 4
    assert by_req["req_a1"]["session_id"] == by_req["req_a2"]["session_id"] != main
    assert by_req["req_b1"]["session_id"] == by_req["req_b2"]["session_id"]
    assert by_req["req_o1"]["session_id"] == by_req["req_o2"]["session_id"]
    assert kinds[by_req["req_s1"]["session_id"]] == kinds[by_req["req_a1"]["session_id"]] == "subagent"
    assert kinds[main] == "main"
    reasons = [r for f, _, r in skipped if f.endswith(f"{SESSION}.jsonl")]
    assert any("not valid JSON" in r for r in reasons)
    assert any(f.endswith("settings.json") for f, _, _ in skipped)


@pytest.mark.parametrize("path", ["runs on 2 workers", "runs on 3 workers", "workers decided", "writes by columns"])
def test_every_path_stores_what_one_process_stores(edge: tuple[Path, Path, list[Any]], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    logs, ref, skipped = edge
    workers: int | None = {"runs on 2 workers": 2, "runs on 3 workers": 3}.get(path, 1)
    if path == "workers decided":
        monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)  # these few MB count as a big history
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # two usable cores
        monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1), raising=False)  # both idle
        assert _parallel.auto_workers(logs) == 2
        workers = None
    if path == "writes by columns":
        monkeypatch.setattr(_connection, "COLUMNS_FROM", 1)  # every bulk write by columns, however small
    with pc.Lab(tmp_path / "s.duckdb", progress=False) as lab:
        res = lab.import_log(logs, workers=workers)
        assert _skipped(res) == skipped
    assert table_differences(tmp_path / "s.duckdb", ref) == {}


def test_runs_cut_the_groups_in_order_by_size(edge: tuple[Path, Path, list[Any]]) -> None:
    logs, _, _ = edge
    groups = _parallel.walk_groups(logs)
    assert sorted(g.key for g in groups) == sorted(str(Path(g.files[0])) for g in groups)
    assert [g.files for g in groups] != [g.files for g in plan_groups(logs)[0]]  # walk order, not key order
    runs = _parallel.runs_of_groups(groups, 2)
    assert len(runs) == 2
    parts = [p for r in runs for p in (r.parts or (r,))]
    assert [p.key for p in parts] == [g.key for g in groups]  # every group once, in key order
    assert [f for r in runs for f in r.files] == [f for g in groups for f in g.files]
    # the cut is the most even one (the 3 MB transcript makes one run big whatever the cut)
    sizes = [sum(os.stat(f).st_size for f in g.files) for g in groups]
    cut = len(runs[0].parts or (runs[0],))

    def uneven(k: int) -> int:
        return abs(sum(sizes[:k]) - sum(sizes[k:]))

    assert uneven(cut) == min(uneven(k) for k in range(1, len(groups)))
    assert _parallel.runs_of_groups(groups, 1) == groups


def test_auto_workers_stays_in_this_process_for_a_small_import(edge: tuple[Path, Path, list[Any]],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    logs, _, _ = edge
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.5, 0.5), raising=False)
    assert _parallel.auto_workers(logs) == 1  # a few MB: below PARALLEL_BYTES
    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)
    assert _parallel.auto_workers(logs) == 4
    monkeypatch.setattr(os, "getloadavg", lambda: (1.6, 2.0, 2.0), raising=False)
    assert _parallel.auto_workers(logs) == 2  # two cores busy already: the two idle ones
    monkeypatch.setattr(os, "getloadavg", lambda: (2.7, 2.0, 2.0), raising=False)
    assert _parallel.auto_workers(logs) == 1  # one idle core: one process
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0), raising=False)
    assert _parallel.auto_workers(logs / "claude_code_other") == 1  # one file group: nothing to split
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert _parallel.auto_workers(logs) == 1


def test_a_named_file_of_no_known_format_fails_as_itself_on_workers(edge: tuple[Path, Path, list[Any]],
                                                                    tmp_path: Path) -> None:
    """A walked file of no known format is skipped (above); one you name is an error, raised in a worker and
    handed back whole (it pickles), not a broken process pool."""
    logs, _, _ = edge
    named = logs / "claude_code_other" / "-home-dev-other" / "settings.json"
    with pc.Lab(tmp_path / "n.duckdb", progress=False) as lab, \
            pytest.raises(pc.errors.ImportFormatError, match="settings.json: not a known log format") as err:
        lab.import_log([named, logs / "claude_code_edge"], workers=2)
    assert err.value.path.endswith("settings.json") and "claude-code" in err.value.tried


@pytest.mark.parametrize("workers", [2, 3])
def test_runs_that_begin_a_batch_are_merged_as_they_are(edge: tuple[Path, Path, list[Any]], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    """Every file group fills a batch here (one request is a full batch), so each run begins where workers=1
    begins a batch: this process imports the first run and merges the workers' stores, nothing is imported
    again, and the store is still workers=1's (imported with the same batches)."""
    logs, _, skipped = edge
    monkeypatch.setattr(_import, "BATCH_REQUESTS", 1)
    with pc.Lab(tmp_path / "one.duckdb", progress=False) as lab:
        lab.import_log(logs, workers=1)
    again: list[Any] = []
    serial = _parallel.import_serial

    def in_this_process(*args: Any, **kwargs: Any) -> Any:  # a spy: the workers' calls happen in their own copy
        again.append(args)
        return serial(*args, **kwargs)

    monkeypatch.setattr(_parallel, "import_serial", in_this_process)
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        res = lab.import_log(logs, workers=workers)
        assert _skipped(res) == skipped
    # this process imported the first run itself (its files, straight into the store) and merged the others:
    # nothing was read again here
    first = _parallel.runs_of_groups(_parallel.walk_groups(logs), workers)[0]
    assert [a[1] for a in again] == [list(first.files)]
    assert table_differences(tmp_path / "runs.duckdb", tmp_path / "one.duckdb") == {}


def test_a_run_cut_inside_a_batch_is_imported_again_in_one_process(edge: tuple[Path, Path, list[Any]],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped logs' groups are small: workers=1 reads several into one batch and stores its sessions in
    rank order across them. A run cut inside such a batch would store them in another order: the import is
    done again in this process instead, and the store is workers=1's."""
    logs, ref, _ = edge
    again: list[Any] = []
    serial = _parallel.import_serial

    def in_this_process(*args: Any, **kwargs: Any) -> Any:
        again.append(args)
        return serial(*args, **kwargs)

    monkeypatch.setattr(_parallel, "import_serial", in_this_process)
    with pc.Lab(tmp_path / "s.duckdb", progress=False) as lab:
        lab.import_log(logs, workers=2)
    assert len(again) == 2 and again[-1][1] == logs  # the first run here, then the whole import again
    assert table_differences(tmp_path / "s.duckdb", ref) == {}


def test_workers_not_given_import_again_in_this_process(edge: tuple[Path, Path, list[Any]], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every idle core for a first import into a store; an import again (the store holds sessions: it adds what
    is new) and a deep one stay in this process."""
    logs, ref, _ = edge
    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0), raising=False)
    parallel: list[int] = []
    original = ingest.import_parallel

    def counted(*args: Any, **kwargs: Any) -> Any:
        parallel.append(kwargs["workers"])
        return original(*args, **kwargs)

    monkeypatch.setattr(ingest, "import_parallel", counted)
    with pc.Lab(tmp_path / "s.duckdb", progress=False) as lab:
        lab.import_log(logs)
        assert parallel == [2]
        again = lab.import_log(logs)
        assert parallel == [2] and again.requests == 0 and again.already_stored > 0
    with pc.Lab(tmp_path / "d.duckdb", progress=False) as lab:
        lab.import_log(logs / "claude_code_other", deep=True)
        assert parallel == [2]
    assert table_differences(tmp_path / "s.duckdb", ref) == {}


def test_a_session_resumed_in_another_run_is_stored_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session whose lines are in two project folders (resumed elsewhere: the copy repeats its lines) cuts
    across the runs: the runs that share it are imported again in this process, and the store is workers=1's."""
    monkeypatch.setattr(_import, "BATCH_REQUESTS", 1)  # runs in step: only the shared session decides
    start = datetime(2026, 9, 20, 14, 0, tzinfo=UTC)
    t = _Transcript(SESSION, start)
    p = t.entry(None, type="user", message={"role": "user", "content": "Start the export."})
    p = t.response(p, "r1", (1, 50), read=0, write=12_000)
    p = t.tool_result(p, "r1", "x" * 200_000)
    t.write(tmp_path / "logs" / "-home-dev-a" / f"{SESSION}.jsonl")
    t.response(p, "r2", (1, 60), read=12_000, write=300)  # the resumed copy: the same lines, then more
    t.write(tmp_path / "logs" / "-home-dev-b" / f"{SESSION}.jsonl")
    other = _Transcript(OTHER, start)
    q = other.entry(None, type="user", message={"role": "user", "content": "Unrelated."})
    other.response(q, "u1", (1, 20), read=0, write=11_000)
    other.write(tmp_path / "logs" / "-home-dev-c" / f"{OTHER}.jsonl")
    runs = _parallel.runs_of_groups(_parallel.walk_groups(tmp_path / "logs"), 2)
    assert [[Path(f).parent.name for f in r.files] for r in runs] == [["-home-dev-a"], ["-home-dev-b", "-home-dev-c"]]
    with pc.Lab(tmp_path / "one.duckdb", progress=False) as lab:
        one = lab.import_log(tmp_path / "logs", workers=1)
    with pc.Lab(tmp_path / "two.duckdb", progress=False) as lab:
        two = lab.import_log(tmp_path / "logs", workers=2)
        assert lab.sql("SELECT count(*) AS n FROM turns WHERE request_id = 'req_r1'").n[0] == 1
    assert two.requests == one.requests == 3
    assert table_differences(tmp_path / "two.duckdb", tmp_path / "one.duckdb") == {}


def test_a_deep_import_written_by_columns_is_the_appenders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bodies, prefix nodes, messages and analysed turns (JSON, timestamps, booleans, NULLs, long texts) written
    by columns are the rows the appender writes, column for column."""
    logs = tmp_path / "logs"
    shutil.copytree(pc.data_path("logs"), logs)
    with pc.Lab(tmp_path / "appender.duckdb", progress=False) as lab:
        lab.import_log(logs, deep=True)
    monkeypatch.setattr(_connection, "COLUMNS_FROM", 1)
    with pc.Lab(tmp_path / "columns.duckdb", progress=False) as lab:
        lab.import_log(logs, deep=True)
        assert lab.sql("SELECT count(*) AS n FROM blocks").n[0] > 0
    assert table_differences(tmp_path / "columns.duckdb", tmp_path / "appender.duckdb") == {}
