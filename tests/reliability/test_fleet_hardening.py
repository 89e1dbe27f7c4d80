"""Issue 41: fleet datasets never lose a group. A second import into one dataset adds to it (it dropped every
group it did not plan); a deleted or truncated Parquet file is re-imported (the manifest said "unchanged");
two imports at once keep both manifests' groups; ``doctor DIR`` checks a dataset (it refused a directory); a
killed import's temporary folder is removed by the next; Ctrl-C is one line (no ``RuntimeError: Query
interrupted``). Real processes, real signals, real files."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _harness import FLEET_DAMAGE, REPO, cli, damage_dataset, fleet_kill_trial, fleet_logs, fleet_reference, fleet_rows

import promptcache_nb as pc
from promptcache_nb import fleet
from promptcache_nb.cli import main
from promptcache_nb.store._parquet import group_of_file

LOGS = REPO / "tests" / "fixtures" / "logs"


def _count(out: Path) -> int:
    with fleet.open(out, progress=False) as lab:
        return int(lab.sql("SELECT count(*) AS n FROM turns").n[0])


def _single(paths: list[Path], tmp: Path) -> int:
    with pc.Lab(tmp / f"single-{len(list(tmp.iterdir()))}.duckdb", progress=False) as lab:
        for p in paths:
            lab.import_log(p)
        return int(lab.sql("SELECT count(*) AS n FROM turns").n[0])


@pytest.fixture
def two_folders(tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(LOGS / "exchanges", tmp_path / "logs" / "exchanges")
    shutil.copytree(LOGS / "pi", tmp_path / "logs" / "pi")
    return tmp_path / "logs" / "exchanges", tmp_path / "logs" / "pi"


# -- append-safety ----------------------------------------------------------------------------------------------
def test_a_second_import_into_a_dataset_adds_to_it(two_folders, tmp_path: Path) -> None:
    exchanges, pi = two_folders
    out = tmp_path / "fleet"
    cli(["import", str(exchanges), "--out", str(out), "--quiet"]).check_returncode()
    first = _count(out)
    cli(["import", str(pi), "--out", str(out), "--quiet"]).check_returncode()
    both = _count(out)
    assert first == _single([exchanges], tmp_path) and first > 0
    assert both == _single([exchanges, pi], tmp_path) > first  # 21 instead of 27 before the fix
    again = fleet.import_logs(exchanges, out=out, progress=False)  # and through the API: nothing to do, nothing lost
    assert (again.groups["status"] == "unchanged").all()
    assert _count(out) == both


def test_a_group_whose_logs_are_gone_is_removed_and_only_it(two_folders, tmp_path: Path) -> None:
    exchanges, pi = two_folders
    out = tmp_path / "fleet"
    fleet.import_logs(exchanges, out=out, progress=False)
    fleet.import_logs(pi, out=out, progress=False)
    assert _count(out) == _single([exchanges, pi], tmp_path)  # through the API too (21 of 27 before)
    shutil.rmtree(pi)
    fleet.import_logs(exchanges, out=out, progress=False)  # pi's files vanished: its group leaves
    assert _count(out) == _single([exchanges], tmp_path)
    manifest = json.loads((out / "_fleet.json").read_text())
    keys = [r["key"] for r in manifest["groups"].values()]
    assert keys and all(k.startswith(str(exchanges)) for k in keys), keys


# -- a damaged dataset: doctor says so, the next import repairs it ------------------------------------------------
@pytest.mark.parametrize("how", sorted(FLEET_DAMAGE))
def test_a_damaged_dataset_is_reported_in_one_line_and_repaired(how: str, two_folders, tmp_path: Path,
                                                                capsys) -> None:
    out = tmp_path / "fleet"
    assert main(["import", *map(str, two_folders), "--out", str(out), "--quiet"]) == 0
    expected = fleet_rows(out)
    assert main(["doctor", str(out)]) == 0  # "it is a directory" before
    assert "a fleet dataset; 2 file groups" in capsys.readouterr().out
    victim = damage_dataset(out, how)
    rel, group = victim.relative_to(out).as_posix(), group_of_file(str(victim))
    assert main(["doctor", str(out)]) == 1
    problems = [x.removeprefix("problem: ") for x in capsys.readouterr().out.splitlines() if x.startswith("problem:")]
    (line,) = [p for p in problems if FLEET_DAMAGE[how] in p]  # one line for it
    assert line.endswith("run the import again to re-import it"), line
    if how in ("no_sessions", "cycle", "not_json"):  # found in the rows, named by group
        assert line.startswith(FLEET_DAMAGE[how]) and f" in group {group} (" in line, line
    else:  # found in the files, named by file (delete, truncate: the size and the Parquet footer, still one line)
        assert line.startswith(f"group {group} (") and rel in line, line
    # not_json: the file's digest differs too; no_sessions and cycle: a manifest without digests, the rows alone tell
    assert len(problems) == 1 + (how == "not_json"), problems
    assert main(["import", *map(str, two_folders), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    manifest = json.loads((out / "_fleet.json").read_text())
    # every group recorded with its files' digests: the one re-imported, and one found sound by its rows
    assert all(rec.get("outputs") for rec in manifest["groups"].values())
    assert fleet_rows(out) == expected
    assert fleet.check_dataset(out).ok


def test_a_second_run_re_imports_only_the_damaged_group(two_folders, tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    fleet.import_logs(list(two_folders), out=out, progress=False)
    damage_dataset(out, "no_sessions")
    again = fleet.import_logs(list(two_folders), out=out, progress=False)
    assert sorted(again.groups["status"]) == ["imported", "unchanged"]  # that group, only it


def test_doctor_reports_files_no_manifest_entry_records(two_folders, tmp_path: Path) -> None:
    exchanges, _ = two_folders
    out = tmp_path / "fleet"
    fleet.import_logs(exchanges, out=out, progress=False)
    stray = out / "blocks" / "gdeadbeef0000.parquet"
    shutil.copy(next((out / "blocks").glob("*.parquet")), stray)
    problems = fleet.check_dataset(out).problems
    assert problems == ["group gdeadbeef0000: 1 Parquet file no manifest entry records (an import killed before "
                        "it recorded them, or one still running); run the import again"]
    (out / "_fleet.json").write_text("{not json")
    (problem,) = fleet.check_dataset(out).problems
    assert "not a fleet manifest" in problem


# -- two writers at once -------------------------------------------------------------------------------------------
def test_two_imports_at_once_keep_both_manifests_groups(tmp_path: Path) -> None:
    dirs = fleet_logs(tmp_path / "logs", folders=4, sessions=2, requests=6)
    out = tmp_path / "fleet"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", "-m", "promptcache_nb.cli", "import", *map(str, half),
                               "--out", str(out), "--quiet"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for half in (dirs[:2], dirs[2:])]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    manifest = json.loads((out / "_fleet.json").read_text())
    assert sorted(Path(r["key"]).parent.name for r in manifest["groups"].values()) == [d.name for d in dirs]
    assert fleet.check_dataset(out).ok
    reference = tmp_path / "reference"
    fleet.import_logs(dirs, out=reference, progress=False)
    assert fleet_rows(out) == fleet_rows(reference)
    again = fleet.import_logs(dirs, out=out, progress=False)
    assert (again.groups["status"] == "unchanged").all()


# -- temporary folders of a killed import --------------------------------------------------------------------------
def test_stale_temp_folders_of_dead_processes_are_removed(tmp_path: Path, monkeypatch) -> None:
    import tempfile

    from promptcache_nb.fleet._import import clean_stale_temp

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"pcnb-fleet-{dead.pid}-abc123" / "group.duckdb").parent.mkdir()
    (tmp_path / f"pcnb-fleet-{dead.pid}-abc123" / "group.duckdb").write_bytes(b"x" * 100)
    (tmp_path / f"pcnb-fleet-{os.getpid()}-live").mkdir()  # this process's: in use
    (tmp_path / "pcnb-other").mkdir()
    assert clean_stale_temp() == [str(tmp_path / f"pcnb-fleet-{dead.pid}-abc123")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pcnb-fleet-" + f"{os.getpid()}-live", "pcnb-other"]


@pytest.mark.slow
def test_kill_9_during_a_fleet_import_leaves_nothing_the_next_run_does_not_repair(tmp_path: Path) -> None:
    dirs = fleet_logs(tmp_path / "logs", folders=4, sessions=2, requests=8)
    reference, span = fleet_reference(tmp_path / "reference", dirs)
    rng = random.Random(41)
    trials = [fleet_kill_trial(tmp_path / f"t{k}", dirs, reference, sig=sig, delay=rng.uniform(0.0, span * 0.8))
              for k, sig in enumerate(["SIGKILL", "SIGKILL", "SIGINT"])]
    assert [t.problems for t in trials] == [[], [], []]
    assert any(t.interrupted for t in trials)


# -- Ctrl-C in a notebook: a KeyboardInterrupt, never DuckDB's RuntimeError -----------------------------------------
_CHILD = """
import sys, promptcache_nb as pc
print("ready", flush=True)
try:
    pc.fleet.import_logs(sys.argv[1:-1], out=sys.argv[-1], progress=False)
    print("finished")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
except BaseException as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


@pytest.mark.slow
def test_ctrl_c_during_a_fleet_import_is_a_keyboard_interrupt(tmp_path: Path) -> None:
    dirs = fleet_logs(tmp_path / "logs", folders=3, sessions=2, requests=8)
    rng = random.Random(7)
    seen = []
    for k in range(3):
        proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", _CHILD, *map(str, dirs),
                                 str(tmp_path / f"out{k}")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.3, 2.5))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        seen.append(out.strip())
        assert "Query interrupted" not in out + err and "Traceback" not in err, (out, err)
    assert set(seen) <= {"KeyboardInterrupt", "finished"} and "KeyboardInterrupt" in seen


@pytest.mark.parametrize(("make", "words"), [("file", "it is a file, not a folder"),
                                              ("fifo", "it is a FIFO (named pipe), not a folder"),
                                              ("loop", "it is a symlink loop")])
def test_a_dataset_path_that_is_not_a_folder_is_refused_in_one_line(make: str, words: str, two_folders,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    if make == "file":
        out.write_text("notes")
    elif make == "fifo":
        os.mkfifo(out)
    else:
        out.symlink_to(out)
    done = cli(["import", str(two_folders[0]), "--out", str(out)])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr and str(out) in done.stderr


# -- a dataset where flock is not to be had ------------------------------------------------------------------------
def _no_locks(*_: object) -> None:
    raise OSError(errno.ENOLCK, "No locks available")  # what NFS without a lock daemon answers


@pytest.mark.parametrize("platform", ["no_flock", "refused"])
def test_without_flock_an_import_goes_on_after_one_warning(platform: str, two_folders, tmp_path: Path,
                                                           monkeypatch) -> None:
    from promptcache_nb.errors import PromptCacheWarning
    from promptcache_nb.fleet import _import

    if platform == "no_flock":  # Windows: no fcntl module
        monkeypatch.setattr(_import, "fcntl", None)
        why = "this platform has no flock"
    else:
        monkeypatch.setattr(fcntl, "flock", _no_locks)
        why = "its filesystem refuses flock (No locks available)"
    out = tmp_path / "fleet"
    with pytest.warns(PromptCacheWarning) as caught:
        done = fleet.import_logs(list(two_folders), out=out, progress=False)
    assert [str(w.message) for w in caught] == [
        f"{out}: no lock for _fleet.lock ({why}): run one import into this dataset at a time (two at once may lose "
        "each other's manifest entries; `promptcache-nb doctor` finds that, and the next import repairs it)"]
    assert done.requests == _single(list(two_folders), tmp_path) and fleet.check_dataset(out).ok


_REFUSING = """
import errno, fcntl, sys
def refuse(*_):
    raise OSError(errno.ENOLCK, "No locks available")
fcntl.flock = refuse
from promptcache_nb.cli import main
from promptcache_nb.store._parquet import group_of_file
sys.exit(main(sys.argv[1:]))
"""


def test_cli_import_without_flock_says_so_in_one_line(two_folders, tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    done = subprocess.run([sys.executable, "-c", _REFUSING, "import", *map(str, two_folders), "--out", str(out),
                           "--quiet"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert "no lock for _fleet.lock (its filesystem refuses flock (No locks available))" in line, line
    assert "Traceback" not in done.stderr and fleet.check_dataset(out).ok
