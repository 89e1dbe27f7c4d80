"""A class on a projector (issue 40): money renders as money, a closed Lab is one line inside the widget, no
widget handler swallows an error, and the committed notebooks' outputs hold no ``$…$`` a math renderer would
typeset."""

from __future__ import annotations

import re
import shutil
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pandas as pd
import pytest

import promptcache_nb as pc
from promptcache_nb._util import NO_MATH_CLASSES, escape_dollars
from promptcache_nb.widgets._views import LAB_CLOSED

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
# tags a math renderer reads through (MathJax 3's includeHtmlTags); every other element ends a text run
_INLINE = {"br", "wbr"}
_VOID = {"br", "wbr", "img", "input", "hr", "meta", "link", "col", "area", "base", "source", "track", "embed"}


class _MathRuns(HTMLParser):
    """The text runs MathJax would search for ``$…$``: text outside elements of the no-math classes, cut at
    every element boundary, skipping ``<script>``, ``<style>``, ``<code>``, ``<pre>``, ``<textarea>``."""

    SKIP = {"script", "style", "code", "pre", "textarea"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[bool] = []  # per open element: is its content skipped
        self.runs: list[str] = [""]

    def _skipped(self) -> bool:
        return any(self.stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _INLINE:
            return
        classes = set((dict(attrs).get("class") or "").split())
        skip = tag in self.SKIP or bool(classes & set(NO_MATH_CLASSES.split()))
        self.runs.append("")
        if tag not in _VOID:
            self.stack.append(skip)

    def handle_endtag(self, tag: str) -> None:
        if tag in _INLINE or tag in _VOID:
            return
        if self.stack:
            self.stack.pop()
        self.runs.append("")

    def handle_data(self, data: str) -> None:
        if not self._skipped():
            self.runs[-1] += data


def math_pairs(markup: str, *, markdown: bool = False) -> list[str]:
    """The ``$…$`` spans a math renderer would typeset in ``markup`` (HTML, or Markdown with inline HTML)."""
    if markdown:  # code spans and fenced code are shown verbatim; everything else is text or inline HTML
        markup = re.sub(r"```.*?```|`[^`\n]*`", " ", markup, flags=re.S)
    parser = _MathRuns()
    parser.feed(markup)
    parser.close()
    return [m for run in parser.runs for m in re.findall(r"\$[^$]+\$", run)]


def test_escaped_money_has_no_math_and_keeps_tags_and_code():
    text = 'saves **$0.19** of $0.30 <b title="$1 $2">($0.17 to $0.20)</b> and `$HOME $PATH`'
    assert math_pairs(text, markdown=True)  # the checker sees what MathJax would typeset
    md = escape_dollars(text, markdown=True)
    assert math_pairs(md, markdown=True) == []
    assert 'title="$1 $2"' in md and "`$HOME $PATH`" in md  # attributes and code spans are left alone
    html = escape_dollars("<td>$0.19</td><td>$0.30 of $1</td>")
    assert math_pairs(html) == [] and html.count("&#36;") == 3
    assert escape_dollars("no money here") == "no money here"


def test_markdown_and_table_helpers_render_money_as_money():
    md = pc.widgets.markdown("measured $5.32, all-5m $4.38, all-1h $4.62")
    assert math_pairs(md.data, markdown=True) == [] and md.data.count("&#36;") == 3
    df = pd.DataFrame({"session": ["a", "b"], "cache_read_input_tokens": [12345, 6789], "cost_usd": [0.2995, 1.5],
                       "cache_read_pct": [64.4, 95.0], "pct_of_cost": [0.622409, 0.1]})
    t = pc.widgets.table(df, fractions=["pct_of_cost"])
    assert t.headers == ("session", "cache read input tokens", "cost $", "cache read %", "% of cost")
    assert t.rows[0] == ("a", "12,345", "$0.2995", "64.4 %", "62.2 %")
    assert math_pairs(t._repr_html_()) == [] and "0.622409" not in repr(t)
    assert "cache read input tokens" in repr(t).splitlines()[0]


def _session(lab: pc.Lab) -> pc.Session:
    s = lab.session(project="projector")
    msgs: list[dict] = []
    for i in range(3):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"question {i} " + "context " * 400}]})
        s.record({"model": "claude-sonnet-4-5", "max_tokens": 256, "cache_control": {"type": "ephemeral"},
                  "system": "You are a billing agent. Current time: 09:0" + str(i), "messages": list(msgs)},
                 at=T0 + timedelta(seconds=30 * i))
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]})
    return s


def test_a_closed_lab_is_one_line_inside_the_widget_never_a_traceback(tmp_path):
    lab = pc.Lab(tmp_path / "closed.duckdb", progress=False)
    whatif = pc.widgets.WhatIf(_session(lab))
    assert math_pairs(whatif._header.value) == []  # the measured / simulated / counterfactual costs
    lab.close()  # what notebook 07's last cell did before a student clicked "Rank every fix"
    whatif._rank.click()  # a browser click: nothing may raise out of it
    shown = whatif._error.value
    assert LAB_CLOSED in shown and "Traceback" not in shown and str(tmp_path) not in shown
    assert whatif._error.layout.display is None and LAB_CLOSED in whatif._status.value
    with pytest.raises(pc.PromptCacheError):  # a kernel-side call still raises into its cell
        whatif.rank()


def test_every_widget_handler_shows_an_error_it_did_not_cause_to_be_shown(tmp_path):
    with pc.Lab(progress=False) as lab:
        s = _session(lab)
        st = pc.widgets.Stepper(s)

        def fails() -> None:
            raise RuntimeError("broke after the action")

        st._guarded(fails)  # an error no _action showed: the widget shows it
        assert "RuntimeError" in st._error.value and "broke after the action" in st._error.value
        st._slider.value = 1  # a handler that works: the error box empties
        assert st._error.value == "" and st.request == 1
        lab.close()
        st._slider.value = 0  # the slider's handler on a closed Lab: shown in one line, nothing raised
        assert LAB_CLOSED in st._error.value and LAB_CLOSED in st._status.value


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_outputs_have_no_math_in_money(path):
    nb = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            if "text/markdown" in data:
                found += [(i, "text/markdown", m) for m in math_pairs(data["text/markdown"], markdown=True)]
            elif "text/html" in data:
                found += [(i, "text/html", m) for m in math_pairs(data["text/html"])]
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    for model in state.values():
        value = model.get("state", {}).get("value")
        if model.get("model_name") == "HTMLModel" and isinstance(value, str):
            found += [("widget", "HTMLModel", m) for m in math_pairs(value)]
    assert not found, f"{path.name}: outputs a math renderer would typeset: {found[:5]}"


def test_the_stepper_editor_shows_five_entries_and_clears_its_status_once_the_edit_applies():
    from promptcache_nb.widgets._views import KNOWLEDGE_ROWS_SHOWN

    scenario = pc.load_scenario(ROOT / "data" / "scenarios" / "knowledge_churn.yaml")
    with pc.Lab(progress=False) as lab:
        stepper = pc.widgets.Stepper(lab.replay(scenario, stop_after=0), scenario)
        editor = stepper.editor()
        assert KNOWLEDGE_ROWS_SHOWN >= 5 and editor._list.layout.max_height == f"{KNOWLEDGE_ROWS_SHOWN * 24 + 44}px"
        entry = str(stepper.session.knowledge.df().key.iloc[0])
        editor.edit(entry, content="a changed note for the next request")
        assert "updated" in editor._status.value  # said while the edit waits for the next request
        stepper.next()
        assert "updated" not in editor._status.value and editor.controller.status == ""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_code_lines_fit_a_notebook_beside_the_file_browser(path):
    """846 px of notebook at 1280×720 with the file browser open hold 88 characters of code."""
    nb = nbformat.read(path, as_version=4)
    long = [(n, line) for n, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for line in cell.source.split("\n") if len(line) > 88]
    assert long == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_checks_are_cell_tags_and_hidden_cells_never_comments_in_view(path):
    nb = nbformat.read(path, as_version=4)
    for n, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert "NBVAL_" not in cell.source, f"cell {n}: an nbval marker as a comment (use the cell's tags)"
        asserts = [line for line in cell.source.split("\n") if line.lstrip().startswith("assert ")]
        if asserts:
            assert cell.metadata.get("jupyter", {}).get("source_hidden"), f"cell {n}: assertions in view"
            assert "hide-input" in cell.metadata.get("tags", [])


# -- long diffs: the changed region, the rest behind "show all" -------------------------------------
def _conversation(n: int, *, system: str) -> dict:
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"message {i}: " + "the partner_sync job loaded the manifest twice. " * 6}
                for i in range(n)]
    return {"model": "claude-sonnet-4-5", "system": [{"type": "text", "text": system}], "messages": messages}


def _outside_details(html: str) -> str:
    """The markup a reader sees before opening any ``<details>`` (a fold's summary line stays)."""
    out, depth, i = [], 0, 0
    for m in re.finditer(r"<details\b[^>]*>|</details>|<summary\b[^>]*>.*?</summary>", html, re.S):
        if depth == 0:
            out.append(html[i:m.start()])
        if m.group().startswith("<details"):
            depth += 1
        elif m.group() == "</details>":
            depth -= 1
        elif depth == 1:
            out.append(m.group())  # the summary of an outer fold is on screen
        i = m.end()
    out.append(html[i:])
    return "".join(out)


def test_a_long_diff_shows_the_changed_region_and_folds_the_rest_under_show_all():
    from promptcache_nb.widgets import _html

    clock = "You are a coding agent.\n\n## Current Time\n{}\n\n## Knowledge\n" + "* a note\n" * 30
    prev = pc.request.prepare(_conversation(40, system=clock.format("2026-11-02 13:00")))
    cur = pc.request.prepare(_conversation(42, system=clock.format("2026-11-02 13:01")))
    html = _html.side_by_side_html(prev, cur, diff=pc.diff(prev, cur))
    seen = _outside_details(html)
    # the divergence, marked, with a few lines of context: not the 30 knowledge lines after it
    assert 'data-role="divergence"' in seen and re.search(r"13:0<mark[^>]*>1", seen)
    assert seen.count("* a note") <= 2 * _html.CONTEXT_LINES_AFTER  # each side
    # the 40 unchanged messages are one line; the two new ones are shown
    assert "▸ 40 unchanged segments (messages[0].content … messages[39].content)" in seen
    assert "messages[40].content ·" in seen and "messages[41].content ·" in seen
    assert "messages[5].content ·" not in seen
    # "show all" (HTML only, no script) lists every one of the 42 segments after the divergence
    fold = re.search(r'<details class="pcnb-diff-all"[^>]*><summary[^>]*>show all 42 segments after the '
                     r"divergence</summary>(.*?)</details>", html, re.S)
    assert fold is not None and "<script" not in html
    assert all(f"messages[{i}].content ·" in fold.group(1) for i in range(42))
    assert len(seen) < len(html) / 3


def test_a_diff_with_nothing_to_fold_has_no_show_all_and_a_huge_one_stays_bounded():
    from promptcache_nb.widgets import _html

    prev = pc.request.prepare(_conversation(4, system="pinned"))
    cur = pc.request.prepare(_conversation(6, system="pinned"))  # a pure append of two messages
    small = _html.side_by_side_html(prev, cur, diff=pc.diff(prev, cur))
    assert "pure append" in small and "show all" not in small and "unchanged segment" not in small
    # an insertion at the top shifts every later message: the first MAX_ROWS changed rows, then a count
    prev = pc.request.prepare(_conversation(600, system="pinned"))
    body = _conversation(600, system="pinned")
    body["messages"].insert(0, {"role": "user", "content": "inserted"})
    cur = pc.request.prepare(body)
    html = _html.side_by_side_html(prev, cur, diff=pc.diff(prev, cur))
    seen = _outside_details(html)
    assert seen.count("<tr><td") <= _html.MAX_ROWS + 2
    assert re.search(r"… \d+ more changed segments \(show all, below\)", seen)
    assert f"show all {600:,} segments after the divergence" in html
    assert html.count("<tr><td") <= _html.MAX_ALL_ROWS + _html.MAX_ROWS + 4  # bounded however long
    assert "more segments (pc.diff(previous, current) lists every path)" in html


def test_prefix_diff_html_folds_long_path_lists_under_show_all():
    prev = pc.request.prepare(_conversation(2, system="pinned"))
    cur = pc.request.prepare(_conversation(40, system="pinned"))
    d = pc.diff(prev, cur)
    html = d._repr_html_()
    assert "added (38): " in html and "<details><summary" in html and "show all 38</summary>" in html
    seen = _outside_details(html)
    assert "messages[11].content" in seen and "messages[39].content" not in seen
    assert "messages[39].content" in html


def test_an_import_summary_shows_no_local_absolute_path(tmp_path):
    """A notebook's outputs are shared: the import table's cells and hover titles name a file by the folder that
    was passed and the path inside it, never /tmp/... or /home/<user>/...."""
    logs = tmp_path / "logs"
    shutil.copytree(pc.data_path("logs") / "claude_code" / "-home-dev-billing-service",
                    logs / "-home-dev-billing-service")
    (logs / "notes.txt").write_text("not a log")
    with pc.Lab(tmp_path / "x.duckdb", progress=False) as lab:
        res = lab.import_log(logs)
        html = res._repr_html_()
    titles = re.findall(r'title="([^"]*)"', html)
    assert titles and all(t.startswith("claude-code:logs/-home-dev-billing-service/") for t in titles), titles
    assert str(tmp_path) not in html and "/home/" not in html.replace("-home-", "")
    assert res._shown_source(str(Path.home() / "x" / "s.jsonl")) == "~/x/s.jsonl"
    assert res._shown_source("/srv/elsewhere/s.jsonl") == "s.jsonl"
