"""An import reads and stores one file group at a time (``_ingest._import``): the stored result is the one reading
every file first gives, table by table, also when a session was resumed in another project folder."""

from __future__ import annotations

import json
import random
import shutil
import weakref
from datetime import UTC, datetime, timedelta
from pathlib import Path

import _benchmarks
import pytest
from test_golden_tables import table_digests

import promptcache_nb as pc
from promptcache_nb.errors import SessionError
from promptcache_nb.ingest import _groups
from promptcache_nb.ingest import _import as _ingest
from promptcache_nb.ingest._groups import plan_groups

ROOT = Path(__file__).resolve().parent.parent


def _history_module():
    return _benchmarks.load("_claude_code_history")


def _resumed(src: Path, dst: Path, session_id: str, shift: timedelta) -> None:
    """``src``'s lines as the session ``session_id`` continued in another folder, ``shift`` later."""
    out = []
    for line in src.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if "sessionId" in obj:
            obj["sessionId"] = session_id
        if "timestamp" in obj:
            at = datetime.fromisoformat(obj["timestamp"].replace("Z", "+00:00")) + shift
            obj["timestamp"] = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        out.append(json.dumps(obj))
    dst.write_text("\n".join(out) + "\n", encoding="utf-8")


def _history(root: Path) -> Path:
    """Three project folders of Claude Code transcripts; two sessions of the first are resumed in the others, one
    after its last request, one with requests before it (the session is stored again in time order)."""
    hist = _history_module()
    rng = random.Random(5)
    start = datetime(2026, 9, 1, 9, 0, tzinfo=UTC)
    folders = [root / f"-home-dev-p{i}" for i in range(3)]
    files: list[Path] = []
    for i, folder in enumerate(folders):
        folder.mkdir(parents=True)
        for k in range(3):
            path = folder / f"{i}{k}-{rng.randrange(10**6):06d}.jsonl"
            hist.write_session(path, project_dir=folder.name, rng=rng, requests=3 + k, tool_result_lines=8,
                               start=start + timedelta(hours=i * 3 + k))
            files.append(path)
    first = json.loads(files[0].read_text(encoding="utf-8").splitlines()[1])["sessionId"]
    second = json.loads(files[1].read_text(encoding="utf-8").splitlines()[1])["sessionId"]
    _resumed(files[4], folders[1] / "resumed-later.jsonl", first, timedelta(days=2))
    _resumed(files[7], folders[2] / "resumed-between.jsonl", second, timedelta(hours=-5, minutes=-40))
    return root


def _all_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file in one group: what the import did before it streamed groups (read all, then store)."""
    monkeypatch.setattr(_ingest, "_file_groups", lambda paths, files: [list(range(len(files)))])


def _digests(db: Path, root: Path, paths: list[Path] | Path) -> dict[str, str]:
    with pc.Lab(db, progress=False) as lab:
        lab.import_log(paths, deep=True)
        return table_digests(lab, root)


def test_a_history_with_resumed_sessions_stores_as_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = _history(tmp_path / "projects")
    assert len(plan_groups(logs)[0]) == 3
    with pc.Lab(tmp_path / "streamed.duckdb", progress=False) as lab:
        res = lab.import_log(logs, deep=True)
        streamed = table_digests(lab, tmp_path)
        sessions = res.summary()
    with monkeypatch.context() as m:
        _all_at_once(m)
        with pc.Lab(tmp_path / "whole.duckdb", progress=False) as lab:
            whole_res = lab.import_log(logs, deep=True)
            whole = table_digests(lab, tmp_path)
            assert res.requests == whole_res.requests == lab.store.scalar("SELECT count(*) FROM turns")
            assert whole_res.already_stored == res.already_stored == 0
            assert whole_res.summary().equals(sessions)
    assert len(sessions) == 9  # 11 files, two of them resumed sessions
    differ = sorted(t for t in whole if whole[t] != streamed[t])
    assert not differ, f"tables that differ from reading every file first: {differ}"


def test_shipped_logs_streamed_grouped_and_whole_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(pc.data_path("logs"), logs)
    groups = plan_groups(logs)[0]
    assert len(groups) > 5
    streamed = _digests(tmp_path / "streamed.duckdb", tmp_path, logs)
    with pc.Lab(tmp_path / "grouped.duckdb", progress=False) as lab:
        for g in groups:  # one import per group, as pc.fleet imports them
            lab.import_log([Path(f) for f in g.files], deep=True)
        grouped = table_digests(lab, tmp_path)
    with monkeypatch.context() as m:
        _all_at_once(m)
        whole = _digests(tmp_path / "whole.duckdb", tmp_path, logs)
    assert sorted(t for t in whole if whole[t] != streamed[t]) == []
    # calibrations are fitted at the end of each import (once per group there), but the shipped logs hold too few
    # measured requests per family for any to be saved (analysis/calibrate.py MIN_REQUESTS): every table agrees
    assert sorted(t for t in whole if whole[t] != grouped[t]) == []


def test_many_small_sessions_share_a_transaction_and_a_failure_keeps_the_ones_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.jsonl"
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    lines = []
    for i in range(6):
        body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "metadata": {"user_id": f"u{i}"},
                "messages": [{"role": "user", "content": [{"type": "text", "text": f"question {i}"}]}]}
        lines.append(json.dumps({"v": 1, "at": (t0 + timedelta(seconds=i)).isoformat(), "method": "POST",
                                 "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages",
                                 "status": 200, "request": body, "response": None, "request_id": f"req_{i}",
                                 "usage": {"input_tokens": 20, "cache_read_input_tokens": 0,
                                           "cache_creation_input_tokens": 0, "output_tokens": 5},
                                 "provider": "anthropic"}))
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pc.Lab(tmp_path / "a.duckdb", progress=False) as lab:
        commits = lab.store.commit_count
        res = lab.import_log(log, deep=True)
        assert len(res.sessions) == 6
        assert lab.store.commit_count - commits <= 2  # one for the six sessions (and the calibration)
    # the fourth session (in key order) fails: the three before it are stored whole, nothing of the rest
    real = _ingest._store_session

    def failing(lab, key, *args, **kwargs):  # noqa: ANN001, ANN202
        if key.endswith("|u3"):
            raise SessionError("boom")
        return real(lab, key, *args, **kwargs)

    monkeypatch.setattr(_ingest, "_store_session", failing)
    with pc.Lab(tmp_path / "b.duckdb", progress=False) as lab:
        with pytest.raises(SessionError, match="boom"):
            lab.import_log(log, deep=True)
        assert lab.sql("SELECT count(*) AS n FROM turns").n[0] == 3
        assert lab.sql("SELECT count(*) AS n FROM sessions").n[0] == 3


def test_stored_sessions_are_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory follows the largest session, not the folder: once a session's transaction is committed, the import
    keeps none of its parsed requests, neither while the rest of its group is stored nor while the next group is
    read (a heavy history is hundreds of MB of JSON)."""
    hist = _history_module()
    root = tmp_path / "h"
    hist.write_history(root, projects=2, sessions=3, requests=4, tool_result_lines=4)
    monkeypatch.setattr(_ingest, "BATCH_REQUESTS", 1)  # one session per transaction
    parsed: dict[str, list[weakref.ref[object]]] = {}  # session key -> its parsed requests
    committed: list[str] = []
    held: list[tuple[str, str]] = []  # (when, session key) of a committed session with live requests
    checks = []

    def check(when: str) -> None:
        checks.append(when)
        held.extend((when, key) for key in committed if any(ref() is not None for ref in parsed[key]))

    real_read, real_store, real_batch = _ingest._read, _ingest._store_session, _ingest._store_batch

    def read(log, *args, **kwargs):  # noqa: ANN001, ANN202
        check(f"read {log.path.name}")
        got = real_read(log, *args, **kwargs)
        for rec in got[1] if got is not None else []:
            parsed.setdefault(rec.session_key, []).append(weakref.ref(rec))
        return got

    def store(lab, key, *args, **kwargs):  # noqa: ANN001, ANN202
        check(f"store {key}")
        return real_store(lab, key, *args, **kwargs)

    def batch(run, pending, **kwargs):  # noqa: ANN001, ANN202
        out = real_batch(run, pending, **kwargs)
        committed.extend(p.key for p in pending)
        return out

    monkeypatch.setattr(_ingest, "_read", read)
    monkeypatch.setattr(_ingest, "_store_session", store)
    monkeypatch.setattr(_ingest, "_store_batch", batch)
    with pc.Lab(tmp_path / "a.duckdb", progress=False) as lab:
        res = lab.import_log(root, deep=True)
    assert len(res.sessions) == 6 and len(committed) == 6
    assert len(checks) == 12  # six files read, six sessions stored
    assert held == []


def test_a_claude_code_group_is_stored_under_its_project_never_a_session_id(tmp_path: Path) -> None:
    """A project folder passed (its sessions are groups) or the projects folder passed (each project folder is a
    group): either way the project is the folder read as a name, the same for every developer's copy."""
    src = pc.data_path("logs") / "claude_code" / "-home-dev-billing-service"
    projects = tmp_path / "projects"
    for dev in ("ana", "ben"):
        shutil.copytree(src, projects / f"-home-{dev}-billing-service")
    proxy = tmp_path / "proxy"
    proxy.mkdir()
    (proxy / "ana-billing.jsonl").write_text("")
    one_folder, _ = plan_groups(projects / "-home-ana-billing-service")
    per_project, _ = plan_groups(projects)
    named, _ = plan_groups([proxy / "ana-billing.jsonl"])
    assert one_folder and {g.project for g in one_folder} == {"billing-service"}  # a session: not its id
    assert [g.project for g in per_project] == ["billing-service", "billing-service"]
    assert [g.project for g in named] == ["ana-billing"]  # not Claude Code's layout: the file's name
    assert [_groups.readable_project(f) for f in ("-Users-ana-src-api", "-srv-agents-ci", "C--Users-bo-x",
                                                  "-home-dev--config-app")] == ["src-api", "srv-agents-ci", "x",
                                                                                 "config-app"]
