"""Every notebook on a classroom projector: JupyterLab at 1280×720 with the file browser open (issue 40).

One JupyterLab on loopback serves copies of notebooks/0*.ipynb (outputs stripped); Debian's chromium opens each
one, runs all cells, saves it, and checks what a class would see:

- no error output (read from the saved notebook: an ``error`` output of any cell);
- no horizontal scroll in a code editor or an output area (the notebook is 846 px wide beside the file browser);
- no money typeset as math (no MathJax element in any output);
- every figure shown at least at the scale that keeps its smallest text legible.

A screenshot of each notebook after Run All is written to ``build/browser/`` (kept as a CI artifact). Every
non-loopback request is aborted. Needs /usr/bin/chromium; without it the test fails, it never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import matplotlib
import nbformat
import pytest
from matplotlib.font_manager import FontProperties
from test_browser import CHROMIUM, CHROMIUM_ARGS, LOOPBACK, TOKEN, _free_port, _get, _tail, _wait_kernel_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
SHOTS = ROOT / "build" / "browser"
VIEWPORT = {"width": 1280, "height": 720}
#: The smallest text our figures draw ("x-small", promptcache_nb.plots), matplotlib's default dots per inch (the
#: inline backend's), and the smallest text in screen pixels a projected figure may show: together the least a
#: figure may be scaled down to fit the notebook.
SMALLEST_FIGURE_TEXT_PT = FontProperties(size="x-small").get_size_in_points()
INLINE_DPI = matplotlib.rcParamsDefault["figure.dpi"]
LEGIBLE_PX = 8
MIN_FIGURE_SCALE = LEGIBLE_PX / (SMALLEST_FIGURE_TEXT_PT * INLINE_DPI / 72)

# the page's code editors and output areas that scroll sideways (their content is wider than they are)
_OVERFLOW_JS = """() => {
  const wide = [];
  const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')];
  cells.forEach((cell, n) => {
    const areas = [...cell.querySelectorAll('.cm-scroller, .jp-OutputArea-output, .jp-OutputArea-output *')];
    for (const el of areas) {
      const style = getComputedStyle(el);
      const scrolls = ['auto', 'scroll'].includes(style.overflowX) || el.classList.contains('cm-scroller');
      if (scrolls && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
        const what = el.classList.contains('cm-scroller') ? 'code' : 'output';
        const text = (el.innerText || '').split('\\n').find(l => l.length > 0) || '';
        const where = [...el.classList].join('.') || el.tagName.toLowerCase();
        wide.push(`cell ${n} ${what} (${where}): ${el.scrollWidth} px in ${el.clientWidth} px: ${text.slice(0, 60)}`);
        break;
      }
    }
  });
  return wide;
}"""
_MATH_JS = """() => [...document.querySelectorAll(
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output mjx-container, ' +
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output .MathJax')].map(e =>
  (e.closest('.jp-OutputArea-output').innerText || '').slice(0, 100))"""
_FIGURES_JS = """() => [...document.querySelectorAll(
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img')].filter(i => i.naturalWidth > 0)
  .map(i => ({src: i.src.slice(0, 40), shown: i.getBoundingClientRect().width, natural: i.naturalWidth}))"""


@pytest.fixture
def lab_root(tmp_path):
    """A root holding stripped copies of every notebook, beside the data folder they read."""
    root = tmp_path / "root"
    (root / "notebooks").mkdir(parents=True)
    (root / "data").symlink_to(ROOT / "data")
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, root / "notebooks" / path.name)
    shutil.copy(ROOT / "notebooks" / "sanitize.cfg", root / "notebooks")
    return root


@pytest.fixture
def lab_url(lab_root, tmp_path):
    home = tmp_path / "jhome"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
               PYTHONHASHSEED="0", JUPYTER_PLATFORM_DIRS="1")
    env.pop("MPLBACKEND", None)
    settings = home / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port = _free_port()
    log_path = tmp_path / "lab.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", "--ip=127.0.0.1",
             f"--port={port}", f"--ServerApp.root_dir={lab_root}", f"--IdentityProvider.token={TOKEN}",
             "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly", f"--LabApp.workspaces_dir={home / 'workspaces'}",
             "--ServerApp.open_browser=False"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=lab_root, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"jupyter lab exited early ({proc.returncode}):\n{_tail(log_path)}")
                try:
                    _get(f"{base}/api/status")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"jupyter lab did not answer in 60 s:\n{_tail(log_path)}")
                    time.sleep(0.25)
            yield base
        finally:
            if proc.poll() is None:  # stop the server (and its kernels) by its PID
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=5)


def _run_all(page, base: str, name: str) -> None:
    page.goto(f"{base}/lab/tree/notebooks/{name}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    _wait_kernel_idle(page, base, name)  # before Run All, or the command is lost
    if not page.locator("#filebrowser:visible").count():  # the file browser open, as Lab starts
        page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id='filebrowser']").click()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    deadline = time.monotonic() + 600
    page.wait_for_timeout(1000)
    while time.monotonic() < deadline:  # every cell has run: no "[*]" prompt left, the kernel idle
        busy = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPrompt", has_text="[*]").count()
        if not busy:
            break
        page.wait_for_timeout(500)
    _wait_kernel_idle(page, base, name, timeout=600, settle=1.0)
    page.keyboard.press("Control+s")
    page.wait_for_timeout(1500)


def test_every_notebook_runs_clean_and_fits_a_projector(lab_url, lab_root):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`make chromium`); the browser test "
                    "never downloads a browser")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    blocked: list[str] = []

    def guard(route) -> None:
        if (urlparse(route.request.url).hostname or "") in LOOPBACK:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    problems: dict[str, list[str]] = {}
    timings: dict[str, float] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=VIEWPORT)
            context.route("**/*", guard)
            page = context.new_page()
            page.on("dialog", lambda d: d.dismiss())
            for path in NOTEBOOKS:
                t0 = time.monotonic()
                _run_all(page, lab_url, path.name)
                found: list[str] = []
                if not page.locator("#filebrowser:visible").count():
                    found.append("the file browser is closed: the page is not the width a class sees")
                found += page.evaluate(_OVERFLOW_JS)
                found += [f"math in an output: {t!r}" for t in page.evaluate(_MATH_JS)]
                for fig in page.evaluate(_FIGURES_JS):
                    scale = fig["shown"] / fig["natural"]
                    if scale < MIN_FIGURE_SCALE:
                        found.append(f"figure shown at {scale:.2f} of its size (text below {LEGIBLE_PX} px)")
                saved = nbformat.read(lab_root / "notebooks" / path.name, as_version=4)
                found += [f"cell {n}: {out.get('ename')}: {out.get('evalue', '')[:120]}"
                          for n, cell in enumerate(saved.cells) for out in cell.get("outputs", [])
                          if out.get("output_type") == "error"]
                page.screenshot(path=str(SHOTS / f"{path.stem}.png"))
                page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
                page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Shut Down All Kernels")).click()
                dialog_ok = page.locator(".jp-Dialog-button.jp-mod-accept")
                if dialog_ok.count():
                    dialog_ok.click()
                if found:
                    problems[path.name] = found
                timings[path.name] = round(time.monotonic() - t0, 1)
        finally:
            browser.close()
    (SHOTS / "timings.json").write_text(json.dumps(timings, indent=1))
    (SHOTS / "problems.json").write_text(json.dumps(problems, indent=1))
    assert problems == {}, json.dumps(problems, indent=1)
