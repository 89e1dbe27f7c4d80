"""Issue 41: the pytest plugin validates its options and markers at start-up (one usage error, no traceback), and
writing the job summary can never fail a test. Each case runs pytest in a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import pytest

def test_no_calls(prompt_cache):
    assert prompt_cache.base_url.startswith("http://127.0.0.1:")

MARKED
'''


def _run(tmp_path: Path, *args: str, marked: str = "", env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_it.py").write_text(TESTS.replace("MARKED", marked))
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if not env or "GITHUB_STEP_SUMMARY" not in env:
        environ.pop("GITHUB_STEP_SUMMARY", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "promptcache_nb.pytest_plugin", "-p", "no:cacheprovider",
           "-p", "no:nbval", "-q", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300)


def _usage_error(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    out = res.stdout + res.stderr
    assert res.returncode == 4, out  # pytest's usage-error exit status: no test ran
    assert "Traceback" not in out and "passed" not in res.stdout, out
    line = next(x for x in out.splitlines() if x.startswith("ERROR:"))
    for needle in needles:
        assert needle in line, line
    return line


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("broken.json", b'{"test_it.py::test_no_calls": {"breaks": 0,', "not a prompt cache baseline"),
    ("list.json", b"[1, 2, 3]", "got list"),
    ("latin1.json", '{"caf\u00e9": {}}'.encode("latin-1"), "not UTF-8"),
    ("entry.json", b'{"test_it.py::test_no_calls": 3}', "entry 'test_it.py::test_no_calls' must be an object"),
    ("field.json", b'{"test_it.py::test_no_calls": {"breaks": "0"}}', "field 'breaks' must be a number"),
])
def test_a_bad_baseline_is_one_usage_error_at_start(tmp_path: Path, name: str, content: bytes, needle: str) -> None:
    baseline = tmp_path / name
    baseline.write_bytes(content)
    _usage_error(_run(tmp_path, "--prompt-cache-baseline", str(baseline)), name, needle)


def test_a_directory_as_the_baseline_is_one_usage_error(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    folder.mkdir()
    _usage_error(_run(tmp_path, "--prompt-cache-baseline", str(folder)), "a directory")
    _usage_error(_run(tmp_path, "--prompt-cache-baseline", str(folder), "--prompt-cache-update"), "a directory")


def test_update_without_a_baseline_file_is_one_usage_error(tmp_path: Path) -> None:
    _usage_error(_run(tmp_path, "--prompt-cache-update"), "--prompt-cache-baseline")


@pytest.mark.parametrize(("marker", "needle"), [
    ('@pytest.mark.prompt_cache(min_read_pct="80")', "min_read_pct must be a number"),
    ("@pytest.mark.prompt_cache(min_read_pct=180)", "from 0 to 100"),
    ("@pytest.mark.prompt_cache(max_breaks=-1)", "max_breaks must be a whole number"),
    ("@pytest.mark.prompt_cache(max_breaks=1.5)", "max_breaks must be a whole number"),
    ("@pytest.mark.prompt_cache(5)", "keyword arguments only"),
    ("@pytest.mark.prompt_cache(min_read=50)", "unknown argument min_read"),
])
def test_a_bad_marker_is_one_usage_error_before_any_test(tmp_path: Path, marker: str, needle: str) -> None:
    marked = f"{marker}\ndef test_marked(prompt_cache):\n    pass\n"
    _usage_error(_run(tmp_path, marked=marked), "test_marked", needle)


def test_a_job_summary_that_cannot_be_written_never_fails_a_test(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "folder" / "summary.md"
    res = _run(tmp_path, "-rw", env={"GITHUB_STEP_SUMMARY": str(missing)})
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "1 passed" in res.stdout, out
    assert "could not write GITHUB_STEP_SUMMARY" in out, out


def test_good_options_still_pass(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    res = _run(tmp_path, "--prompt-cache-baseline", str(baseline), "--prompt-cache-update",
               marked="@pytest.mark.prompt_cache(min_read_pct=0, max_breaks=None)\n"
                      "def test_marked(prompt_cache):\n    pass\n")
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout + res.stderr
    res = _run(tmp_path, "--prompt-cache-baseline", str(baseline))
    assert res.returncode == 0, res.stdout + res.stderr
