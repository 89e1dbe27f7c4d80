"""Issue 41: a walk lists every special file it passes over under its own path and never opens it (a FIFO, a
socket, a symlink loop, a broken link, a link to a device or into /proc, a link to a folder); a path under
/proc — named, or a link into it — is refused in one line. Before: each was passed over in silence, and an
unreadable file was listed under ``/proc/<pid>/mem`` instead of its own path."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb import fleet
from promptcache_nb.errors import ImportFormatError

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs"


@pytest.fixture
def odd_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder with one real log and one of every special file; the reason each is expected to be listed with."""
    logs = tmp_path / "logs"
    (logs / "team").mkdir(parents=True)
    shutil.copy(LOGS / "exchanges" / "review_bot.jsonl", logs / "team" / "review_bot.jsonl")
    os.mkfifo(logs / "team" / "pipe.jsonl")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(logs / "team" / "agent.sock"))
    (logs / "team" / "loop_a.jsonl").symlink_to(logs / "team" / "loop_b.jsonl")
    (logs / "team" / "loop_b.jsonl").symlink_to(logs / "team" / "loop_a.jsonl")
    (logs / "team" / "zero.jsonl").symlink_to("/dev/zero")
    (logs / "team" / "mem.jsonl").symlink_to(f"/proc/{os.getpid()}/mem")
    (logs / "team" / "gone.jsonl").symlink_to(logs / "team" / "deleted.jsonl")
    (logs / "team" / "up").symlink_to(logs)
    expected = {
        "pipe.jsonl": "a FIFO (named pipe): not read",
        "agent.sock": "a socket: not read",
        "loop_a.jsonl": "a symlink loop (a link that leads back to itself): not read",
        "loop_b.jsonl": "a symlink loop (a link that leads back to itself): not read",
        "zero.jsonl": "a link to /dev/zero (under /dev: a kernel file): not read",
        "mem.jsonl": f"a link to /proc/{os.getpid()}/mem (under /proc: a kernel file): not read",
        "gone.jsonl": f"a broken link (its target {str(logs / 'team' / 'deleted.jsonl')!r} does not exist): not read",
        "up": "a link to a folder, not followed: name the folder to import it",
    }
    yield logs, expected
    sock.close()


def _listed(skipped: list[dict], logs: Path) -> dict[str, str]:
    """What the walk listed in the folder (the real log's own skipped lines left out)."""
    return {Path(r["file"]).name: r["reason"] for r in skipped
            if Path(r["file"]).parent == logs / "team" and Path(r["file"]).name != "review_bot.jsonl"}


def test_a_walk_lists_every_special_file_under_its_own_path(odd_folder, tmp_path: Path) -> None:
    logs, expected = odd_folder
    with pc.Lab(tmp_path / "r.duckdb", progress=False) as lab:
        result = lab.import_log(logs)
        stored = int(lab.sql("SELECT count(*) AS n FROM turns").n[0])
    assert stored > 0  # the log beside them is imported
    skipped = result.skipped.to_dict("records")
    assert _listed(skipped, logs) == expected
    assert all(r["line"] == 0 for r in skipped if Path(r["file"]).name in expected)
    assert not any(r["file"].startswith(("/proc", "/dev")) for r in skipped)


def test_a_fleet_import_lists_them_too(odd_folder, tmp_path: Path) -> None:
    logs, expected = odd_folder
    result = fleet.import_logs(logs, out=tmp_path / "fleet", progress=False)
    assert result.requests > 0
    assert _listed(result.skipped.to_dict("records"), logs) == expected


def test_cli_import_with_a_fifo_in_the_folder_finishes_and_lists_it(odd_folder, tmp_path: Path) -> None:
    logs, _ = odd_folder
    done = subprocess.run([sys.executable, "-m", "promptcache_nb.cli", "import", str(tmp_path / "r.duckdb"),
                           str(logs), "--details"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "pipe.jsonl" in done.stdout and "a FIFO (named pipe): not read" in done.stdout


@pytest.mark.parametrize("spelled", ["/proc/self/status", "/proc/self", "link"])
def test_a_path_under_proc_is_refused_in_one_line(spelled: str, tmp_path: Path) -> None:
    if spelled == "link":
        (tmp_path / "status.jsonl").symlink_to("/proc/self/status")
        spelled = str(tmp_path / "status.jsonl")
    with pc.Lab(None, progress=False) as lab, pytest.raises(ImportFormatError) as exc:
        lab.import_log(spelled)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(spelled)
    assert "under /proc" in text and "a kernel file" in text and "copy it elsewhere" in text


def test_cli_refuses_a_proc_path_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "promptcache_nb.cli", "import", str(tmp_path / "r.duckdb"),
                           "/proc/self/environ"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "/proc/self/environ: under /proc (a kernel file)" in done.stderr
    assert not (tmp_path / "r.duckdb").exists() or "turns" not in done.stdout


@pytest.mark.parametrize(("make", "words"), [("fifo", "a FIFO (named pipe), not a regular file"),
                                              ("loop", "a symlink loop")])
def test_a_named_special_file_is_refused_naming_what_it_is(make: str, words: str, tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    if make == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(path)
    with pc.Lab(None, progress=False) as lab, pytest.raises(ImportFormatError, match=re.escape(words)):
        lab.import_log(path)
