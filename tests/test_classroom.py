"""The Stepper as a teacher uses it (#26 item 2): a break shown live, the editor beside the diff, honest end
states, feedback on every editor click, categories checked. Controllers and views without a kernel."""

from __future__ import annotations

import pytest

import promptcache_nb as pc
from promptcache_nb.errors import KnowledgeError, SessionError
from promptcache_nb.widgets import KnowledgeController, StepperController
from promptcache_nb.widgets._controllers import FINISHED

CHURN = pc.data_path("scenarios") / "knowledge_churn.yaml"
EDIT = "moto is gone: the S3 tests now run against the local minio container."


@pytest.fixture
def lab():
    with pc.Lab(progress=False) as lab:
        yield lab


@pytest.fixture
def scenario():
    return pc.load_scenario(CHURN)


def _stepper(lab, scenario, strategy="durable_delta"):
    return pc.widgets.Stepper(lab.replay(scenario, strategy=strategy, stop_after=0), scenario)


def test_next_is_disabled_at_the_end_and_typing_enables_it(lab, scenario):
    st = _stepper(lab, scenario)
    st.run()
    assert st.controller.finished and st._next_btn.disabled and st._run_btn.disabled
    assert st.status.endswith(FINISHED) and "scenario finished — type a message to continue" in st._status.value
    st._user.value = "one more question"  # typing (continuous_update) enables Next turn
    assert not st._next_btn.disabled
    st._next_btn.click()
    assert st.controller.view().user_text == "one more question" and st._next_btn.disabled
    with pytest.raises(SessionError, match=FINISHED):
        st.controller.next()
    assert st.controller.status == FINISHED
    # a stepper over a finished session says so from the start
    again = pc.widgets.Stepper(st.session, scenario)
    assert again._next_btn.disabled and FINISHED in again._status.value


def test_status_line_updates_before_the_buttons_re_enable(lab, scenario):
    st = _stepper(lab, scenario)
    log: list[str] = []
    st._status.observe(lambda c: log.append("status:" + ("busy" if 'data-kind="busy"' in c["new"] else "done")),
                       names=["value"])
    st._run_btn.observe(lambda c: log.append(f"run_disabled:{c['new']}"), names=["disabled"])
    st._next_btn.observe(lambda c: log.append(f"next_disabled:{c['new']}"), names=["disabled"])
    st.run(3)
    assert log[:2] == ["run_disabled:True", "next_disabled:True"] or "status:busy" in log[:3]
    done = log.index("status:done")
    enabled = [i for i, e in enumerate(log) if e.endswith("disabled:False")]
    assert enabled and done < min(enabled), log


def test_strategy_selector_makes_the_break_happen_live(lab, scenario):
    st = _stepper(lab, scenario)
    for _ in range(3):
        st.next()
    st._strategy.value = "naive"  # the selector: a new naive session replayed to the same scenario turn
    assert st.controller.strategy == "naive" and st.session.strategy == "naive"
    assert st.controller.position == 3 and st.n_requests == st.controller.n_requests
    assert "switched durable_delta → naive" in st.status and "scenario turn 3 of 12" in st.status
    st.knowledge.edit("gotcha-moto-clock", content=EDIT)
    st.next()
    v = st.controller.view()
    assert v.usage.cache_read < v.ideal_cache_read  # the naive agent broke its cache on the edit
    assert st.diff_view.path == "system[0]"  # where the re-rendered knowledge changed the request
    with pytest.raises(pc.errors.UnknownStrategyError):
        st.controller.switch_strategy("nope")


def test_side_by_side_naive_vs_durable_delta(lab, scenario):
    st = _stepper(lab, scenario)
    st.next()
    st._pair_btn.value = True
    c = st.controller
    assert c.strategy == "naive" and c.partner is not None and c.partner.strategy == "durable_delta"
    assert c.partner.position == c.position == 1 and st._strategy.disabled
    assert st._partner_box.layout.display is None
    st.knowledge.edit("gotcha-moto-clock", content=EDIT)  # goes to both books
    assert any(r["content"] == EDIT for r in KnowledgeController(c.partner.session).rows())
    st.next()
    left, right = c.view(), c.partner.view()
    assert left.usage.cache_read < left.ideal_cache_read
    assert right.usage.cache_read == right.ideal_cache_read > 0
    assert 'data-broke="true"' in st._left_label.value and "naive" in st._left_label.value
    assert 'data-broke="false"' in st._partner_usage.value and "durable_delta" in st._partner_usage.value
    assert st.diff_view.path == "system[0]" and st.partner_diff.path is None  # a break; a pure append
    # the two columns share one row at any width (bases 40 % each), the editor wraps below (100 %), and the
    # narrow-window line is on (its container query hides it where the row is wide)
    assert st._left.layout.flex == st._partner_box.layout.flex == "1 1 40%"
    assert st._editor_panel.layout.flex == "1 1 100%" and st._pair_hint.layout.display is None
    assert "collapse the file browser (Ctrl+B)" in st._pair_hint.value
    st._user.value = "typed while side by side"  # typing enables Next turn in the pair mode too
    assert not st._next_btn.disabled
    st._user.value = ""
    st._pair_btn.value = False
    assert c.partner is None and st._partner_box.layout.display == "none" and not st._strategy.disabled
    assert st._pair_hint.layout.display == "none" and st._editor_panel.layout.flex == "0 1 430px"


def test_editor_is_embedded_beside_the_diff(lab, scenario):
    st = _stepper(lab, scenario)
    assert st.editor() is st.knowledge
    row = next(c for c in st.children if st._editor_panel in getattr(c, "children", ()))
    assert st.knowledge in st._editor_panel.children
    left = row.children[0]
    assert st._header in left.children and st.diff_view in left.children[2].children  # left of the editor


def test_every_editor_click_gives_feedback_with_new_entry_selected(lab, scenario):
    st = _stepper(lab, scenario)
    ed = st.knowledge
    before = ed.entries
    assert ed._pick.value == ""  # "(new entry)"
    ed._save_btn.click()
    assert "(new entry) is selected: pick the entry to change" in ed._status.value
    ed._remove_btn.click()
    assert "(new entry) is selected: pick the entry to remove" in ed._status.value
    ed._add_btn.click()  # empty fields
    assert "type its title and content" in ed._status.value
    ed._title.value, ed._content.value, ed._category.value = "Deploy freeze", "No deploys on Friday.", "fact"
    ed._add_btn.click()
    assert "added" in ed._status.value and ed.entries == before + 1


def test_category_typo_is_refused_naming_the_valid_ones(lab, scenario):
    k = KnowledgeController(lab.replay(scenario, stop_after=0))
    n = len(k.entries())
    with pytest.raises(KnowledgeError, match=r"unknown category 'preferance' \(did you mean 'preference'\?\); "
                                             r"valid categories: fact, gotcha, incident, note, preference"):
        k.add("Tabs", "Marco wants tabs.", category="preferance")
    with pytest.raises(KnowledgeError, match="unknown category 'procdure'"):
        k.edit("gotcha-moto-clock", category="procdure")
    assert len(k.entries()) == n
    k.add("Tabs", "Marco wants tabs.", category="preference")
    # a category the book already has (a scenario's own label) is valid
    k.session.knowledge.add("Refunds", "Five days.", category="policy")
    assert "policy" in k.categories()
    k.add("Refund SLA", "Two days.", category="policy")


def test_switch_needs_a_scenario(lab):
    c = StepperController(lab.session(system="You are terse."))
    with pytest.raises(SessionError, match="needs a scenario"):
        c.switch_strategy("naive")


# -- readable by default (#26 item 3) ----------------------------------------------------------------------------

LOGS = pc.data_path("logs")
KEY_COLUMNS = ["session", "requests", "cache_read_pct", "openclaw_breaks", "rebuilds", "cost_usd"]
#: Those columns as the CLI table heads them, first line of the header (a header may wrap: "openclaw / breaks")
KEY_HEADERS = ["session", "requests", "read", "openclaw", "rebuilds", "cost"]


def heads(header_line: str) -> list[str]:
    """The words of a table's first header line that name :data:`KEY_HEADERS`, in their order."""
    return [w for w in header_line.split() if w in KEY_HEADERS]


def test_import_summary_key_columns_first_relative_sources_no_nan(lab):
    res = lab.import_log(LOGS / "claude_code", progress=False)
    df = res.summary()
    assert list(df.columns[:6]) == KEY_COLUMNS and "source_path" not in df
    assert df["parent"].notna().all() and "" in set(df["parent"])  # "no parent" is empty, never NaN
    root = str(LOGS.resolve())
    assert not any(root in s for s in df["source"]) and all(s.startswith("claude-code:") for s in df["source"])
    full = res.summary(full_paths=True)
    assert all(root in s for s in full["source_path"])
    html = res._repr_html_()
    # on hover: the folder passed and the path inside it, never the absolute path (outputs are shared)
    assert "NaN" not in html and 'title="claude-code:claude_code/-home-dev-billing-service/' in html
    assert root not in html
    assert "uncached input (input_tokens)" in html and "it misses an agent that never reads its cache" in html
    one = lab.import_log(next((LOGS / "codex").rglob("*.jsonl")), progress=False)  # a single file: its name
    assert all(s.endswith(".jsonl") and "/" not in s.split(":", 1)[1] for s in one.summary()["source"])


def test_cli_import_tables_fit_120_columns(tmp_path, capsys):
    from promptcache_nb.cli import main

    assert main(["import", str(LOGS), "--db", str(tmp_path / "x.duckdb"), "--quiet"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    table = lines[1:lines.index("")] if "" in lines else lines[1:]
    assert max(len(line) for line in table) <= 120, max(table, key=len)
    assert all(len(line) <= 120 for line in lines[1:]), max(lines[1:], key=len)
    assert "NaN" not in out and "None" not in out and str(LOGS.resolve()) not in out
    assert lines[1].startswith("totals: ") and heads(lines[3]) == KEY_HEADERS  # after the totals, the top ten
    assert not any("…" in line for line in table[1:])  # long text cells wrap, never cut
    assert main(["import", str(LOGS / "har"), "--db", str(tmp_path / "y.duckdb"), "--quiet", "--full-paths"]) == 0
    assert "source_path" in capsys.readouterr().out
    assert main(["import", str(LOGS), "--db", str(tmp_path / "z.duckdb"), "--quiet", "--details"]) == 0
    details = capsys.readouterr().out.splitlines()
    assert heads(details[2]) == KEY_HEADERS and all(len(line) <= 120 for line in details[1:])


# -- first contact (#26 item 5, the small ones) ------------------------------------------------------------------


def test_readme_offline_blocks_run_from_any_folder(tmp_path, monkeypatch, capsys):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    monkeypatch.chdir(tmp_path)  # not the repository: bundled files come from pc.data_path
    scope: dict = {}
    for block in blocks[:2]:  # the ten-line notebook and the comparison (the others need a key or a log)
        exec(compile(block, "README.md", "exec"), scope)
    assert "Usage(" in capsys.readouterr().out and len(scope["sessions"]) == len(pc.STRATEGIES)
    scope["lab"].close()
    guide = (Path(__file__).resolve().parent.parent / "docs" / "command-line.md").read_text(encoding="utf-8")
    assert "session_id" in guide.split("promptcache-nb sql runs.duckdb", 1)[1].splitlines()[0]


def test_demo_unknown_scenario_lists_the_bundled_names(tmp_path, capsys):
    from promptcache_nb.cli import main

    assert main(["demo", "--scenario", "nope", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "bundled: " in err and "support_agent" in err and "knowledge_churn" in err
    assert not (tmp_path / "out").exists()


def test_failed_import_leaves_no_store(tmp_path, capsys):
    from promptcache_nb.cli import main

    db = tmp_path / "x.duckdb"
    assert main(["import", str(tmp_path / "nonexistent"), "--db", str(db)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert not db.exists() and list(tmp_path.iterdir()) == []


def test_every_subcommand_has_a_description():
    from promptcache_nb.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    missing = [name for name, parser in sub.choices.items() if not parser.description]
    assert missing == []


def test_committed_notebook_outputs_hold_no_local_path():
    import json
    import re
    from pathlib import Path

    # (a path that starts a component: "~/.gemini/tmp/" is where an agent keeps its logs, not a local path)
    local = re.compile(r"(?<![\w.])(/work/|/home/[a-z]|/Users/|/tmp/|/root/)|site-packages|[A-Z]:\\\\Users")
    found = []
    for nb in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        for n, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            text = json.dumps(cell.get("outputs", []))
            found += [f"{nb.name} cell {n}: {m.group(0)}" for m in local.finditer(text)]
    assert found == []


# -- DiffView states the right reason when segment states are missing (#26 item 4) -------------------------------


def test_diffview_names_the_right_reason_for_missing_segment_states(lab, scenario):
    s = lab.replay(scenario, strategy="durable_delta", stop_after=2)
    t1, t2 = s.turn(1), s.turn(2)
    bare = pc.widgets.DiffView(t2.diff)  # simulated, but no states passed
    assert "no segment states were passed" in bare.html and "measured usage" not in bare.html
    full = pc.widgets.DiffView.for_turns(t2, previous=t1)
    assert "pcnb-segmap-missing" not in full.html
    imported = lab.import_log(pc.data_path("logs", "claude_code_gaps"), progress=False).sessions[0]
    st = StepperController(imported)
    st._states.update({i: () for i in range(imported.n_turns)})  # measured: the store holds no segment states
    v = st.show(1)
    assert "measured usage: the API reports totals" in v.segment_map_html()
    sim = StepperController(s)
    sim._states[2] = ()
    assert "the cache model reported no state per segment" in sim.view(2).segment_map_html()


def test_sql_help_lists_the_store_tables(lab):
    from promptcache_nb.cli import STORE_TABLES, build_parser

    tables = set(lab.sql("select table_name from information_schema.tables where table_schema = 'main'").table_name)
    assert set(STORE_TABLES) == tables - {"_migrations"}
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = sub.choices["sql"].format_help()
    assert "see README" not in text and all(t in " ".join(text.split()) for t in STORE_TABLES)


def test_compare_labels_its_figures_and_uses_one_efficiency_unit(scenario):
    import re

    cmp = pc.widgets.Compare(scenario, strategies=["naive", "durable_delta"])
    try:
        cmp.run(3)
        table = cmp.controller.table_html()
        summary = cmp.summary()
        assert "efficiency (0–1)" in table
        for eff in summary["efficiency"]:
            assert f">{eff:.3f}<" in table  # the ratio, as the CLI and the report print it
        assert not re.search(r">\d+\.\d%<", table.split("efficiency")[1].split("cache write")[0])
        assert 'data-field="usage-label">simulated (estimated tokens)' in cmp._header.value
        fig = cmp.figure()
        fig.canvas.draw()
        ax = fig.axes[0]
        assert ax.yaxis.get_offset_text().get_text() == ""  # never a "1e6" above the axis
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert any("," in t for t in labels), labels
        assert all("%" not in t.get_text() for t in ax.texts)
    finally:
        cmp.controller.close()


def test_missing_api_key_is_one_line_authentication_error(monkeypatch):
    import anthropic

    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pc.SimulatorServer() as server, pc.Lab(progress=False) as lab:
        backend = pc.AnthropicBackend(anthropic.Anthropic(base_url=server.base_url, max_retries=0))
        with pytest.raises(pc.errors.AuthenticationError) as info:
            lab.replay(pc.data_path("scenarios", "tiny.yaml"), backend=backend, stop_after=1)
        text = str(info.value)
        assert "ANTHROPIC_API_KEY" in text and "\n" not in text


def test_progress_bars_only_where_someone_watches(capsys):
    from promptcache_nb._util import _NoBar, progress_bar

    # pytest captures stderr (not a terminal) and runs no kernel: a log, not a screen
    assert isinstance(progress_bar(total=5, desc="x", enabled=True), _NoBar)
    assert isinstance(progress_bar(total=0, desc="x", enabled=True), _NoBar)
    with pc.Lab() as lab:  # progress on by default
        lab.replay(pc.data_path("scenarios", "tiny.yaml"), stop_after=0)
        lab.replay(pc.data_path("scenarios", "tiny.yaml"), stop_after=1)
    err = capsys.readouterr().err
    assert "\r" not in err and "it/s" not in err and "%|" not in err


def test_savings_charts_compared_side_by_side_share_the_dollar_axis(lab, scenario):
    frames = [lab.replay(scenario, strategy=name).turns() for name in ("naive", "durable_delta")]
    lo, hi = pc.plots.saved_limits(*frames)
    for df in frames:
        saved = (df["cost_no_cache_usd"] - df["cost_usd"]).cumsum()
        assert lo <= saved.min() and saved.max() <= hi
    a = pc.plots.plot_savings(frames[0], saved_ylim=(lo, hi))
    b = pc.plots.plot_savings(frames[1], saved_ylim=(lo, hi))
    assert a.axes[1].get_ylim() == b.axes[1].get_ylim() == (lo, hi)


def test_quickstart_static_stepper_snapshot_shows_a_diff():
    """Notebook 01 opened without a kernel (GitHub, nbconvert): the Stepper's snapshot is taken after a few
    scenario turns and shows a diff, never an empty stepper under prose that says "look at the diff"."""
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_quickstart.ipynb").read_text())
    snaps = ["".join(out["data"]["text/html"]) for cell in nb["cells"] for out in cell.get("outputs", [])
             if "pcnb-snapshot-Stepper" in "".join(out.get("data", {}).get("text/html", []))]
    assert snaps, "notebook 01 shows no Stepper snapshot"
    first = snaps[0]
    assert "no requests yet" not in first and "0 of 12" not in first
    assert 'class="pcnb-diff"' in first and "text-align:left" in first


def _notebook_cells():
    import json
    from pathlib import Path

    for nb in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        yield nb.name, json.loads(nb.read_text(encoding="utf-8"))["cells"]


def test_notebook_tables_call_input_tokens_uncached_input():
    """A displayed table never heads a column ``input_tokens`` (all 0 on a cached session, and read as "the
    input"): it says ``uncached input``. Raw API payloads printed as the API sends them are not tables."""
    found = [f"{name} cell {n}" for name, cells in _notebook_cells() for n, cell in enumerate(cells)
             for out in cell.get("outputs", []) if "<th>input_tokens</th>" in "".join(out.get("data", {})
                                                                                        .get("text/html", []))]
    assert found == []


def test_breaks_and_rebuilds_are_explained_wherever_a_notebook_shows_both():
    import json
    import re

    unexplained = []
    for name, cells in _notebook_cells():
        for n, cell in enumerate(cells):
            out = json.dumps(cell.get("outputs", []))
            if re.search(r"\bbreaks\b", out) and re.search(r"\brebuilds\b", out):
                near = out + "".join("".join(cells[k]["source"]) for k in range(max(0, n - 1), min(len(cells), n + 2)))
                if "256 tokens" not in near:  # the one-line rule: what a rebuild counts, beside the break rule
                    unexplained.append(f"{name} cell {n}")
    assert unexplained == []


def test_make_demo_installs_quietly():
    """``make demo`` on a fresh clone prints one line for the install, then the demo: every install command is
    silent (``@``) and runs pip with ``-qq`` (warnings off — setuptools' "Editable installation" banner is one,
    forwarded under a single ``-q`` — errors still shown and still fatal)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "Makefile").read_text(encoding="utf-8")
    quiet = re.search(r"^PIP_QUIET := (.*)$", text, re.M)
    assert quiet and "-qq" in quiet.group(1).split()
    for stamp in ("$(BASE_STAMP)", "$(DEV_STAMP)"):
        rule = re.search(rf"^{re.escape(stamp)}:.*\n((?:\t.*\n)+)", text, re.M)
        assert rule, stamp
        commands = rule.group(1).splitlines()
        assert all(c.startswith("\t@") for c in commands), commands
        installs = [c for c in commands if "pip" in c.lower() and " install " in c]
        assert installs and all("$(PIP_QUIET)" in c for c in installs), installs
        assert sum("echo" in c for c in commands) == 1  # the one line that says what happens


def test_import_of_an_unknown_format_leaves_no_store_and_keeps_an_existing_one(tmp_path, capsys):
    from promptcache_nb.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "a log"}\n', encoding="utf-8")
    db = tmp_path / "x.duckdb"
    assert main(["import", str(bad), "--db", str(db)]) == 2
    assert "not a known log format" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]  # no new 77 KB empty store
    with pc.Lab(db, progress=False) as lab:  # an existing store survives a failed import untouched
        lab.replay(pc.data_path("scenarios", "tiny.yaml"), stop_after=1)
    assert main(["import", str(bad), "--db", str(db)]) == 2
    with pc.Lab(db, progress=False, read_only=True) as lab:
        assert len(lab.sessions()) == 1


def test_an_error_made_of_a_ctrl_c_is_a_ctrl_c_keeping_the_new_store(tmp_path, capsys, monkeypatch):
    """A wrapper that turns DuckDB's "Query interrupted" into its own error must not make the CLI delete what the
    interrupted import committed, nor exit 2: it is the user's Ctrl-C (exit 130)."""
    from promptcache_nb.cli import main
    from promptcache_nb.errors import ImportFormatError
    from promptcache_nb.store import caused_by_ctrl_c

    def interrupted_import(self, *args, **kwargs):
        self.replay(pc.data_path("scenarios", "tiny.yaml"), stop_after=1)  # something committed before the Ctrl-C
        try:
            raise RuntimeError("Query interrupted")
        except RuntimeError as exc:
            raise ImportFormatError("x.jsonl", "reading failed") from exc

    monkeypatch.setattr(pc.Lab, "import_log", interrupted_import)
    db = tmp_path / "x.duckdb"
    assert main(["import", str(tmp_path), "--db", str(db)]) == 130
    assert "interrupted" in capsys.readouterr().err
    with pc.Lab(db, progress=False, read_only=True) as lab:
        assert len(lab.sessions()) == 1
    plain = ImportFormatError("x.jsonl", "reading failed")
    assert not caused_by_ctrl_c(plain) and caused_by_ctrl_c(KeyboardInterrupt())
