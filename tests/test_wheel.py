"""The package installs whole: a built wheel, in a fresh virtualenv, runs the demo from an empty directory."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel, makes a virtualenv, runs the demo in it

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, text=True)
    (whl,) = out.glob("promptcache_nb-*.whl")
    return whl


def test_wheel_ships_the_scenarios(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for scenario in ("support_agent.yaml", "tiny.yaml", "prompts/support_agent_host.md", "tools/support_tools.yaml"):
        assert f"promptcache_nb/data/scenarios/{scenario}" in names
    assert "promptcache_nb/py.typed" in names


def test_installed_wheel_runs_demo_from_an_empty_directory(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The wheel itself is unpacked into the fresh environment; its dependencies come from the test's environment
    # (appended to sys.path after it, without processing that environment's .pth files, so the editable
    # install of this checkout stays invisible).
    zipfile.ZipFile(wheel).extractall(site)
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run([str(py), "-c", "import promptcache_nb, sys; print(promptcache_nb.__file__)"],
                           cwd=empty, check=True, capture_output=True, text=True).stdout.strip()
    assert where.startswith(str(site)), where
    run = subprocess.run(
        [str(py), "-c", "import sys; from promptcache_nb.cli import main; sys.exit(main())", "demo", "--quiet",
         "--strategies", "durable_delta", "--scenario", "tiny", "--out", "out"],
        cwd=empty, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "durable_delta" in run.stdout
    assert (empty / "out" / "demo.duckdb").exists()
