"""The quickstart in a real browser: JupyterLab on loopback, driven by Debian's chromium via Playwright.

Runs a *copy* of notebooks/01_quickstart.ipynb (outputs stripped, in a temporary root, plus one cell that
shows a Compare widget), then drives the widgets as a student would:

1. "Next turn" three times, an edit through the editor's form, "Next turn" (the diff shows the edit);
2. the jam scenario of issue 13: remove an entry a later scenario event updates, then "Next turn" until
   the scenario ends: the event is skipped with a notice, nothing fails;
3. a hostile knowledge entry (bidi override, zero-width space, an ``<img onerror>``): no dialog, no
   injected element, the override shown as ``⟨RLO⟩`` in the table, the picker and the diff;
4. "Restart": the status line says the next request is byte-identical; at the end "Next turn" is disabled
   and says "scenario finished — type a message to continue";
4b. the teaching controls at 1280×720: the diff and the embedded editor in one viewport, the strategy
   selector (naive breaks on an edit, live), the side-by-side naive vs durable_delta mode;
5. Compare "Run to end": buttons disabled and a progress bar while it works, then the finished table;
6. the *committed* notebooks rendered without a kernel (nbconvert, as GitHub or nbviewer would): the
   widgets' static HTML snapshots are there.

Every non-loopback request is aborted, so the test never leaves the machine. Screenshots go to
``test-output/browser/``; with ``UPDATE_DOCS_SCREENSHOT=1`` the stepper screenshot becomes ``docs/stepper.png``.

Needs /usr/bin/chromium (``make test`` installs it with apt); without it the test fails, it never skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import pytest
from nbconvert import HTMLExporter

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "01_quickstart.ipynb"
CHROMIUM = Path("/usr/bin/chromium")
OUT = ROOT / "test-output" / "browser"
DOCS_SHOT = ROOT / "docs" / "stepper.png"
TOKEN = "pcnb-browser-test"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
EDIT_MARKER = "retries are now five with a ten-minute delay (browser edit)"
HOSTILE_TITLE = "evil\u202eexe.txt <img src=x onerror=alert(1)>"
HOSTILE_CONTENT = "zero\u200bwidth <script>alert(2)</script>"
COMPARE_CELL = "compare = pc.widgets.Compare(scenario)  # every strategy, a private in-memory Lab\ncompare"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:]


def _get(url: str) -> object:
    req = urllib.request.Request(url, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 - loopback only
        return json.loads(r.read())


@pytest.fixture
def lab_server(tmp_path):
    """A JupyterLab server on 127.0.0.1 with every Jupyter dir isolated under tmp_path."""
    root = tmp_path / "root"
    (root / "notebooks").mkdir(parents=True)
    (root / "data").symlink_to(ROOT / "data")  # the notebook reads ../data/scenarios
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:  # a clean copy: no stale outputs or saved widget views to match by mistake
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nb.cells.append(nbformat.v4.new_code_cell(COMPARE_CELL))
    nbformat.write(nb, root / "notebooks" / NOTEBOOK.name)

    home = tmp_path / "jhome"
    env = jupyter_env(home)
    with jupyter_lab(root, home, env, tmp_path / "lab.log") as base:
        yield base


def jupyter_env(home: Path) -> dict[str, str]:
    """The environment of a JupyterLab whose every Jupyter and IPython folder is under ``home``, with its news and
    update checks off (``test_browser_notebooks`` adds its own settings there)."""
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
               PYTHONHASHSEED="0", JUPYTER_PLATFORM_DIRS="1")
    env.pop("MPLBACKEND", None)
    settings = home / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return env


@contextlib.contextmanager
def jupyter_lab(root: Path, home: Path, env: dict[str, str], log_path: Path) -> Iterator[str]:
    """A JupyterLab server on 127.0.0.1 serving ``root``, its output in ``log_path``: its base URL once it answers;
    stopped (with the kernels it started) by its process group afterwards."""
    port = _free_port()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", "--ip=127.0.0.1",
             f"--port={port}", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={TOKEN}",
             "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly", f"--LabApp.workspaces_dir={home / 'workspaces'}",
             "--ServerApp.open_browser=False"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
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
            if proc.poll() is None:  # SIGTERM to its group lets it shut its kernels down
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=5)


def _wait_kernel_idle(page, base: str, path: str, *, timeout: float = 60, settle: float = 0.0) -> None:
    """Poll /api/sessions until the notebook's kernel is connected and idle (for ``settle`` seconds).

    Waits with ``page.wait_for_timeout``, never ``time.sleep``: the sync Playwright API runs the route
    guard only while the test thread is inside a Playwright call, so sleeping stalls every request.
    """
    deadline = time.monotonic() + timeout
    idle_since = None
    while time.monotonic() < deadline:
        sessions = [s for s in _get(f"{base}/api/sessions") if s.get("path", "").endswith(path)]
        k = sessions[0]["kernel"] if sessions else {}
        if k.get("execution_state") == "idle" and k.get("connections", 0) >= 1:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= settle:
                return
        else:
            idle_since = None
        page.wait_for_timeout(200)
    raise AssertionError(f"kernel for {path} not idle after {timeout} s: {sessions}")


def _request_number(page) -> int:
    text = page.locator(".pcnb-stepper .pcnb-header [data-field=request]").inner_text()
    m = re.fullmatch(r"Request (\d+)", text.strip())
    assert m, f"unexpected stepper header {text!r}"
    return int(m.group(1))


def _played(page) -> str:
    return page.locator(".pcnb-stepper .pcnb-header [data-field=played]").inner_text().strip()


def _next(page, stepper, next_btn) -> None:
    """Click "Next turn" and wait until the click is done (the status line is no longer busy; at the end of
    the scenario the button then stays disabled)."""
    before = _request_number(page)
    next_btn.click()
    from playwright.sync_api import expect

    expect(stepper.locator(".pcnb-header [data-field=request]")).not_to_have_text(f"Request {before}",
                                                                                   timeout=60_000)
    expect(stepper.locator(".pcnb-stepper-status .pcnb-status[data-kind=busy]")).to_have_count(0, timeout=60_000)
    expect(stepper.locator("input[placeholder^='user message']")).to_be_enabled(timeout=60_000)


def _in_viewport(locator, width: int, height: int) -> dict:
    box = locator.bounding_box()
    assert box is not None, f"{locator} is not rendered"
    assert box["x"] >= 0 and box["y"] >= 0, box
    assert box["x"] + box["width"] <= width + 1 and box["y"] + box["height"] <= height + 1, box
    return box


def _read_and_ideal(usage_text: str) -> tuple[int, int]:
    read = re.search(r"cache read\s+([\d,]+)", usage_text)
    ideal = re.search(r"ideal[^\d]*([\d,]+)", usage_text)
    assert read and ideal, usage_text
    return int(read.group(1).replace(",", "")), int(ideal.group(1).replace(",", ""))


def _edit_and_send(page, stepper, editor, next_btn, content: str) -> None:
    """Edit "Airflow retries" in the embedded editor, then send a typed message."""
    from playwright.sync_api import expect

    _pick(editor, "Airflow retries")
    expect(editor.locator(".widget-text input").first).to_have_value("Airflow retries")
    editor.locator("textarea").fill(content)
    editor.get_by_role("button", name="Save changes").click()
    expect(editor).to_contain_text("updated")
    stepper.locator("input[placeholder^='user message']").fill("What changed in the notes?")
    expect(next_btn).to_be_enabled()
    _next(page, stepper, next_btn)


def _pick(editor, label_part: str) -> None:
    select = editor.locator("select")
    labels = [t.replace("\xa0", " ") for t in select.locator("option").all_text_contents()]
    target = next((i for i, label in enumerate(labels) if label_part in label), None)
    assert target is not None, f"no {label_part!r} entry in the editor's list: {labels}"
    select.select_option(index=target)


def test_quickstart_widgets_in_chromium(lab_server):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`make chromium`, or "
                    "`apt-get install -y chromium`); the browser test never downloads a browser")
    from playwright.sync_api import expect, sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    blocked: list[str] = []
    console_errors: list[str] = []
    dialogs: list[str] = []
    t0 = time.monotonic()

    def guard(route) -> None:
        host = urlparse(route.request.url).hostname or ""
        if host in LOOPBACK:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    def on_dialog(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.route("**/*", guard)
            page = context.new_page()
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("dialog", on_dialog)
            page.goto(f"{lab_server}/lab/tree/notebooks/{NOTEBOOK.name}?reset&token={TOKEN}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            _wait_kernel_idle(page, lab_server, NOTEBOOK.name)  # before Run All, or the command is lost

            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
            stepper = page.locator(".pcnb-stepper")
            expect(stepper).to_be_visible(timeout=60_000)
            compare = page.locator(".pcnb-compare-widget")
            expect(compare).to_be_visible(timeout=120_000)  # the last cell
            _wait_kernel_idle(page, lab_server, NOTEBOOK.name, settle=0.5)
            expect(page.locator(".pcnb-error:visible")).to_have_count(0)
            # an empty Compare shows no picture yet, and so no broken-image icon
            expect(compare.locator("img")).to_be_hidden()
            stepper.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "1_after_run_all.png"))

            # -- 1. three scenario turns, then an edit through the editor's form ----------------------
            next_btn = stepper.get_by_role("button", name="Next turn")
            start = _request_number(page)
            for _ in range(3):
                _next(page, stepper, next_btn)
            assert _request_number(page) > start
            expect(stepper.locator(".pcnb-usage")).to_contain_text("cache read")
            expect(stepper.locator(".pcnb-stepper-status")).to_contain_text("scenario turn 8 of 12")
            stepper.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "2_after_three_clicks.png"))

            editor = page.locator(".pcnb-knowledge-editor")
            editor.scroll_into_view_if_needed()
            _wait_kernel_idle(page, lab_server, NOTEBOOK.name, settle=0.3)
            _pick(editor, "Airflow retries")
            title = editor.locator(".widget-text input").first
            expect(title).to_have_value("Airflow retries")  # the kernel filled the form
            editor.locator("textarea").fill(f"Airflow {EDIT_MARKER}; every task must be idempotent.")
            editor.get_by_role("button", name="Save changes").click()
            # the kernel applies the edit, then re-renders the stepper: seconds on a loaded machine
            expect(editor).to_contain_text("updated", timeout=30_000)
            expect(stepper.locator(".pcnb-header")).to_contain_text("pending for the next request", timeout=30_000)
            page.screenshot(path=str(OUT / "3_after_edit.png"))

            _next(page, stepper, next_btn)
            expect(stepper.locator(".pcnb-header")).to_contain_text("knowledge_update:")
            expect(stepper.locator(".pcnb-diff")).to_contain_text(EDIT_MARKER)
            usage = stepper.locator(".pcnb-usage")
            expect(usage).to_contain_text("simulated (estimated tokens)")
            assert re.search(r"cache read\s+[\d,]+", usage.inner_text())
            expect(page.locator(".pcnb-error:visible")).to_have_count(0)
            stepper.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "4_after_edit_and_next.png"))
            # -- 1b. a teacher's 1280×720 screen: Next turn, the diff and the editor in one viewport ---
            page.set_viewport_size({"width": 1280, "height": 720})
            current_tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
            if current_tab.count():
                current_tab.first.click()  # hide the file browser, as a teacher would
            page.wait_for_timeout(500)
            stepper.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(300)
            page.screenshot(path=str(OUT / "4b_1280x720.png"))
            _in_viewport(next_btn, 1280, 720)
            diff_box = _in_viewport(stepper.locator(".pcnb-stepper-diff"), 1280, 720)
            editor_box = _in_viewport(stepper.locator(".pcnb-stepper-editor"), 1280, 720)
            _in_viewport(editor.get_by_role("button", name="Save changes"), 1280, 720)
            assert diff_box["height"] > 150 and editor_box["x"] > diff_box["x"]  # side by side, not stacked
            # A viewport tall enough for the whole stepper (Lab clips what is outside its panel).
            page.set_viewport_size({"width": 1200, "height": 2600})
            page.wait_for_timeout(300)
            stepper.scroll_into_view_if_needed()
            shot = OUT / "stepper.png"
            stepper.screenshot(path=str(shot))
            page.set_viewport_size({"width": 1400, "height": 1000})

            # -- 2. the jam: remove the entry scenario turn 10 updates, then play to the end ----------
            assert _played(page) == "9 of 12"
            editor.scroll_into_view_if_needed()
            _pick(editor, "Airflow retries")
            expect(title).to_have_value("Airflow retries")
            editor.get_by_role("button", name="Remove entry").click()
            expect(editor.locator(".pcnb-status").first).to_contain_text("removed")
            _next(page, stepper, next_btn)
            status = stepper.locator(".pcnb-stepper-status")
            expect(status).to_contain_text("scenario turn 10 of 12")
            expect(status).to_contain_text("skipped scenario event knowledge_update:")
            expect(status).to_contain_text("(fact-airflow-retries) — you removed that entry")
            stepper.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "5_jam_skipped.png"))
            while _played(page) != "12 of 12":
                _next(page, stepper, next_btn)
            expect(page.locator(".pcnb-error:visible")).to_have_count(0)
            expect(stepper.get_by_role("button", name="Run to end")).to_be_disabled()  # nothing left to run
            expect(next_btn).to_be_disabled()  # the end state: only a typed message has something to send
            expect(status).to_contain_text("scenario finished — type a message to continue")

            # -- 3. a hostile knowledge entry, then a typed message that carries it --------------------
            editor.scroll_into_view_if_needed()
            _pick(editor, "(new entry)")
            inputs = editor.locator(".widget-text input")
            inputs.nth(0).fill(HOSTILE_TITLE)
            inputs.nth(1).fill("note")
            editor.locator("textarea").fill(HOSTILE_CONTENT)
            editor.get_by_role("button", name="Add entry").click()
            expect(editor.locator(".pcnb-status[data-kind=info]")).to_contain_text("added")
            # the edit fields hold the raw text (a bidi override reverses it there): the editor says so
            expect(editor.locator(".pcnb-status[data-kind=warn]")).to_contain_text(
                "contain invisible characters")
            expect(editor.locator(".pcnb-knowledge")).to_contain_text("evil⟨RLO⟩exe.txt <img src=x onerror=alert(1)>")
            expect(editor.locator(".pcnb-knowledge")).to_contain_text("zero⟨ZWSP⟩width <script>alert(2)</script>")
            labels = editor.locator("select option").all_text_contents()
            assert any("evil⟨RLO⟩exe.txt" in label for label in labels), labels
            assert not any("\u202e" in label for label in labels), labels
            stepper.locator("input[placeholder^='user message']").fill("Anything new in the notes?")
            expect(next_btn).to_be_enabled()  # typing enables it again
            _next(page, stepper, next_btn)
            expect(status).to_contain_text("your message")
            expect(stepper.locator(".pcnb-diff")).to_contain_text("evil⟨RLO⟩exe.txt")
            shown = page.locator(".pcnb-stepper, .pcnb-knowledge-editor").all_inner_texts()
            assert shown and not any("\u202e" in text for text in shown)  # never a raw override in the DOM
            expect(page.locator("img[src='x']")).to_have_count(0)
            page.wait_for_timeout(300)
            assert dialogs == [], f"a dialog opened: {dialogs}"
            editor.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "6_hostile_entry.png"))

            # -- 4. Restart: the status line checks the claim ------------------------------------------
            stepper.scroll_into_view_if_needed()
            stepper.get_by_role("button", name="Restart").click()
            expect(status).to_contain_text(
                "restarted from the store: next request is byte-identical", timeout=60_000)
            expect(next_btn).to_be_disabled()  # restarted at the end of the scenario: type to continue
            page.screenshot(path=str(OUT / "7_restart.png"))

            # -- 4b. strategy selector: naive breaks on an edit, live; then side by side ---------------
            strategy = stepper.locator(".widget-dropdown", has_text="strategy").locator("select")
            strategy.select_option("naive")
            expect(status).to_contain_text("switched durable_delta → naive", timeout=120_000)
            expect(strategy).to_be_enabled(timeout=60_000)
            _edit_and_send(page, stepper, editor, next_btn, "Airflow retries are four (live break).")
            usage = stepper.locator(".pcnb-usage")
            read, ideal = _read_and_ideal(usage.inner_text())
            assert read < ideal, usage.inner_text()  # the break, live
            pair = stepper.get_by_role("button", name="side by side: naive vs durable_delta")
            pair.click()
            expect(status).to_contain_text("side by side: naive (left) and durable_delta (right)", timeout=120_000)
            partner = stepper.locator(".pcnb-stepper-partner")
            expect(partner).to_be_visible()
            expect(strategy).to_be_disabled()
            _edit_and_send(page, stepper, editor, next_btn, "Airflow retries are six (side by side).")
            expect(stepper.locator(".pcnb-column[data-broke=true]")).to_contain_text("naive")
            expect(partner.locator(".pcnb-column[data-broke=false]")).to_contain_text("durable_delta")
            expect(page.locator(".pcnb-error:visible")).to_have_count(0)
            stepper.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(OUT / "7b_side_by_side.png"))

            # -- 5. Compare "Run to end": busy, a progress bar, then the finished table ----------------
            compare.scroll_into_view_if_needed()
            run_btn = compare.get_by_role("button", name="Run to end")
            expect(run_btn).to_be_enabled()
            run_btn.click()
            progress = compare.locator(".pcnb-progress")
            expect(progress).to_be_visible(timeout=30_000)
            expect(run_btn).to_be_disabled()
            expect(compare.get_by_role("button", name="Next turn (all)")).to_be_disabled()
            expect(compare.locator(".pcnb-status[data-kind=busy]")).to_be_visible()
            page.screenshot(path=str(OUT / "8_compare_running.png"))
            expect(compare.locator("[data-field=played]")).to_have_text("12 of 12", timeout=180_000)
            expect(progress).to_be_hidden(timeout=30_000)
            expect(compare).to_contain_text("finished: every strategy played the whole scenario")
            expect(compare.locator(".pcnb-status")).to_contain_text("played scenario turns 1–12 of 12")
            expect(run_btn).to_be_disabled()  # finished: nothing to run, and no "type a user message"
            assert "type a user message" not in compare.inner_text()
            expect(compare.locator("img")).to_be_visible()
            assert compare.locator("img").evaluate("img => img.naturalWidth") > 0
            expect(page.locator(".pcnb-error:visible")).to_have_count(0)
            compare.scroll_into_view_if_needed()
            page.screenshot(path=str(OUT / "9_compare_finished.png"))

            # -- 6. the committed notebooks without a kernel: static snapshots ------------------------
            static = context.new_page()
            static.on("dialog", on_dialog)
            exporter = HTMLExporter()
            for name, kind, text in (("02_seven_strategies.ipynb", "Compare", "12 of 12"),
                                     ("01_quickstart.ipynb", "Stepper", "3 of 12")):
                html, _ = exporter.from_notebook_node(nbformat.read(ROOT / "notebooks" / name, as_version=4))
                static.set_content(html, wait_until="domcontentloaded")
                snap = static.locator(f".pcnb-snapshot-{kind}").first
                expect(snap).to_be_visible()
                expect(snap).to_contain_text(text)
                expect(static.get_by_text("Error displaying widget")).to_have_count(0)
                if kind == "Compare":
                    assert snap.locator("img").evaluate("img => img.naturalWidth") > 0
                else:  # after a few scenario turns: a diff to look at, never an empty stepper
                    expect(snap.locator(".pcnb-diff").first).to_be_visible()
                    expect(snap).not_to_contain_text("no requests yet")
                    # left-aligned as the live widget, not right-aligned by nbconvert's table CSS
                    cell = snap.locator(".pcnb-knowledge td").first
                    assert cell.evaluate("e => getComputedStyle(e).textAlign") in ("left", "start")
                snap.scroll_into_view_if_needed()
                static.screenshot(path=str(OUT / f"10_unrun_{name.split('_')[0]}_static.png"))
            assert dialogs == [], f"a dialog opened: {dialogs}"
        except BaseException:
            page.screenshot(path=str(OUT / "failure.png"))
            print("console errors:", *console_errors[-20:], sep="\n  ")
            print("blocked:", *blocked[:20], sep="\n  ")
            raise
        finally:
            browser.close()

    # The README's screenshot (docs/stepper.png) is refreshed only on request (UPDATE_DOCS_SCREENSHOT=1), so a test run leaves
    # the work tree clean; the run's own copy is always in test-output/browser/.
    small = OUT / "stepper_small.png"
    _save_small_png(shot, small, max_bytes=300_000)
    assert small.stat().st_size < 300_000
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        DOCS_SHOT.parent.mkdir(exist_ok=True)
        DOCS_SHOT.write_bytes(small.read_bytes())
    elapsed = time.monotonic() - t0
    report = [f"browser test {elapsed:.1f} s; blocked non-loopback requests: {len(blocked)}", *blocked]
    (OUT / "timing.txt").write_text("\n".join(report) + "\n")


def _save_small_png(src: Path, dest: Path, *, max_bytes: int) -> None:
    """Copy ``src`` to ``dest``, re-encoding as a palette PNG (and shrinking) until it fits ``max_bytes``."""
    if src.stat().st_size <= max_bytes:
        shutil.copyfile(src, dest)
        return
    from PIL import Image

    img = Image.open(src).convert("RGB")
    scale = 1.0
    while True:
        w, h = int(img.width * scale), int(img.height * scale)
        small = img.resize((w, h), Image.LANCZOS) if scale < 1 else img
        small.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(dest, optimize=True)
        if dest.stat().st_size <= max_bytes or scale < 0.4:
            return
        scale *= 0.85
