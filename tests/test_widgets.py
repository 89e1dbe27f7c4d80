"""Widgets: the pure controllers (no kernel), the HTML they render, and the views' button wiring."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.errors import KnowledgeError, SessionError
from promptcache_nb.plots import plot_compare, plot_savings
from promptcache_nb.scenario import (
    KnowledgeSpec,
    KnowledgeUpdate,
    Restart,
    Scenario,
    ScenarioTurn,
    ToolCall,
)
from promptcache_nb.widgets import CompareController, KnowledgeController, StepperController, _html
from promptcache_nb.widgets._controllers import scenario_position

SCENARIOS = Path(__file__).resolve().parent.parent / "data" / "scenarios"

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
EVIL = "<script>alert('x')</script> & \"quoted\""
HOST = "You are a careful support agent for a billing platform. " * 120


def _scenario() -> Scenario:
    turns = [
        ScenarioTurn(user="Where is my refund?", reply="Checking.", after=timedelta(seconds=20)),
        ScenarioTurn(user="Ticket SUP-1", reply="Found it.", after=timedelta(seconds=20),
                     tool_calls=(ToolCall("get_ticket", {"id": "SUP-1"}, "status: open"),)),
        ScenarioTurn(user="And the policy?", reply="Five days.", after=timedelta(seconds=20),
                     events=(KnowledgeUpdate("refunds", content="Refunds take three business days."),)),
        ScenarioTurn(user=f"Odd text {EVIL}", reply="Noted.", after=timedelta(seconds=20),
                     events=(Restart(),)),
        ScenarioTurn(user="Thanks", reply="Bye.", after=timedelta(seconds=20)),
    ]
    return Scenario(
        name="widget_test", model="claude-sonnet-4-5", start=T0, host_prompt=HOST,
        tools=({"name": "get_ticket", "description": "Fetch a ticket.",
                "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}},),
        knowledge=(KnowledgeSpec("refunds", "Refund policy", "Refunds take five business days. " * 20,
                                 "policy"),
                   KnowledgeSpec("tone", "Tone", f"Be brief. {EVIL}", "preference")),
        turns=tuple(turns), project="wt",
    )


@pytest.fixture
def lab():
    with pc.Lab(progress=False) as lab:
        yield lab


@pytest.fixture
def stepper(lab) -> StepperController:
    sc = _scenario()
    return StepperController(lab.replay(sc, stop_after=0), sc)


# -- StepperController -----------------------------------------------------------------------------
def test_scenario_position_counts_tool_call_requests():
    sc = _scenario()
    assert [scenario_position(sc, n) for n in range(8)] == [0, 1, 1, 2, 3, 4, 5, 5]


def test_next_plays_the_scenario_and_applies_its_events(stepper):
    t0 = stepper.next()
    assert (t0.index, stepper.position, stepper.current) == (0, 1, 0)
    t1 = stepper.next()  # one tool call: two requests
    assert (t1.index, stepper.position, stepper.n_requests) == (2, 2, 3)
    t2 = stepper.next()
    assert any(e.startswith("knowledge_update:") for e in t2.events)
    assert t2.at == T0 + timedelta(seconds=20 + 4 + 20)  # turn 0 starts the clock; tool calls take 4 s
    v = stepper.view()
    assert v.index == 3 and v.label == "simulated (estimated tokens)"
    assert "three business days" in v.diff_html()


def test_matches_a_plain_replay_byte_for_byte(stepper):
    sc = _scenario()
    while stepper.remaining:
        stepper.next()
    with pc.Lab(progress=False) as other:  # same session id, so same tool_use ids
        ref = other.replay(sc)
        _same_requests(stepper, ref, sc)


def _same_requests(stepper, ref, sc):
    a, b = stepper.session, ref
    assert a.n_turns == b.n_turns == sc.n_requests
    for i in range(a.n_turns):
        assert a.turn(i).body == b.turn(i).body
        assert a.turn(i).usage == b.turn(i).usage


def test_restart_event_and_button_follow_the_new_session(stepper):
    for _ in range(4):
        stepper.next()  # the 4th scenario turn starts with a restart event
    first = stepper.session
    s = stepper.restart()
    assert s is stepper.session and s is not first
    with pytest.raises(SessionError):
        first.turns()
    stepper.next()
    assert stepper.remaining == 0 and stepper.n_requests == 6


def test_typed_turns_do_not_advance_the_scenario(stepper):
    stepper.next()
    t = stepper.next("typed question", "typed answer")
    assert t.index == 1 and stepper.position == 1
    assert stepper.view().user_text == "typed question"


def test_finished_scenario_and_no_scenario_say_what_to_do(lab, stepper):
    while stepper.remaining:
        stepper.next()
    with pytest.raises(SessionError, match="scenario finished — type a message to continue"):
        stepper.next()
    bare = StepperController(lab.session(system=HOST))
    with pytest.raises(SessionError, match="no scenario"):
        bare.next()
    assert bare.next("hello").index == 0 and bare.view() is not None


def test_show_bounds_and_negative_index(stepper):
    assert stepper.view() is None
    stepper.next()
    stepper.next()
    assert stepper.show(-1).index == 2 and stepper.show(0).index == 0
    with pytest.raises(SessionError, match="requests 0..2"):
        stepper.show(3)


def test_segment_states_survive_a_restart(stepper):
    for _ in range(3):
        stepper.next()
    live = [stepper.segment_states(i) for i in range(stepper.n_requests)]
    assert all(live) and set().union(*live) <= {"read", "write", "uncached"}
    stepper.restart()
    fresh = StepperController(stepper.session, stepper.scenario)
    assert [fresh.segment_states(i) for i in range(fresh.n_requests)] == live


def test_repr_is_short_and_deterministic(stepper):
    stepper.next()
    r = repr(stepper)
    assert r == ("StepperController(session='s001-naive', request=0, requests=1, scenario='widget_test', "
                 "played='1 of 5')")
    assert "0x" not in r


# -- KnowledgeController --------------------------------------------------------------------------
def test_knowledge_add_edit_remove_apply_before_the_next_turn(stepper):
    k = KnowledgeController(stepper)
    stepper.next()
    rows = k.rows()
    assert [(r["title"], r["version"]) for r in rows] == [("Refund policy", 1), ("Tone", 1)] or len(rows) == 2
    new_id = k.add("Escalation", "Escalate after 3 failed refunds.", category="procedure")
    assert k.resolve("Escalation") == new_id and k.resolve(new_id[:8]) == new_id
    assert k.edit("refunds", content="Refunds take two days.") is True
    assert k.edit("refunds", content="Refunds take two days.") is False
    k.remove("tone")
    assert "pending for the next request" in stepper.header_html()
    assert len(k.pending) == 3
    stepper.next()
    kinds = sorted(e.split(":")[0] for e in stepper.view().events)
    assert kinds == ["knowledge_add", "knowledge_remove", "knowledge_update"]
    assert k.pending == ()
    assert {r["title"] for r in k.rows()} == {"Refund policy", "Escalation"}
    assert next(r for r in k.rows() if r["key"] == "refunds")["version"] == 2


def test_knowledge_errors_name_the_entries(stepper):
    k = KnowledgeController(stepper.session)
    with pytest.raises(KnowledgeError, match="no single knowledge entry matches 'nope'.*Refund policy"):
        k.edit("nope", content="x")
    with pytest.raises(KnowledgeError, match="type its title and content"):
        k.add("", "")
    with pytest.raises(KnowledgeError, match="content must not be empty"):
        k.edit("refunds", content="  ")


def test_knowledge_follows_the_stepper_across_restart(stepper):
    k = KnowledgeController(stepper)
    events = []
    k.subscribe(events.append)
    stepper.next()
    stepper.restart()
    k.edit("tone", title="Tone of voice")
    assert events == ["turn", "restart", "knowledge"]
    stepper.next()
    assert stepper.last_batch == (1, 2) and stepper.current == 1
    assert any(e.startswith("knowledge_update") for e in stepper.view().events)
    assert "requests 1–2 (a tool loop)" in stepper.header_html()


# -- CompareController ----------------------------------------------------------------------------
def test_compare_steps_strategies_in_lockstep(lab):
    names = pc.STRATEGIES[:3]
    c = CompareController(_scenario(), strategies=names, lab=lab)
    out = c.next()
    assert list(out) == list(names) and c.position == 1
    df = c.run()
    assert c.remaining == 0
    assert df["strategy"].tolist() == list(names)
    assert (df["requests"] == _scenario().n_requests).all()
    assert {"efficiency", "cache_write", "cost_usd", "last_reason"} <= set(df.columns)
    assert "<table" in c.table_html()


# -- HTML -----------------------------------------------------------------------------------------
def test_all_request_content_is_escaped(stepper):
    for _ in range(stepper.remaining):
        stepper.next()
    k = KnowledgeController(stepper)
    html_parts = [stepper.header_html(), k.table_html()]
    for i in range(stepper.n_requests):
        v = stepper.show(i)
        html_parts += [v.diff_html(), v.usage_html(), v.observation_html(), v.segment_map_html()]
    blob = "".join(html_parts)
    assert "<script>" not in blob
    assert "&lt;script&gt;" in blob


def test_side_by_side_marks_the_first_difference():
    a = pc.request.prepare({"model": "m", "system": [{"type": "text", "text": "same head, old tail"}],
                    "messages": [{"role": "user", "content": "hi"}]})
    b = pc.request.prepare({"model": "m", "system": [{"type": "text", "text": "same head, new <tail>"}],
                    "messages": [{"role": "user", "content": "hi"}]})
    out = _html.side_by_side_html(a, b)
    assert 'data-role="divergence"' in out
    assert re.search(r"same head, <mark[^>]*>new &lt;tail&gt;</mark>", out)
    assert "first difference at <code>system[0]</code>" in out
    appended = pc.request.prepare({"model": "m", "system": [{"type": "text", "text": "same head, old tail"}],
                           "messages": [{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": "yo"}]})
    assert "pure append" in _html.side_by_side_html(a, appended)
    assert "first request" in _html.side_by_side_html(None, a)


def test_segment_map_has_one_box_per_segment():
    req = pc.request.prepare({"model": "m", "system": "s " * 50, "messages": [{"role": "user", "content": "hi"}]})
    out = _html.segment_map_html(req.segments, ("read", "uncached"))
    assert out.count("data-state=") == 2 and 'data-state="read"' in out
    assert "no per-segment cache states" in _html.segment_map_html(req.segments, ())


def test_error_html_escapes():
    out = _html.error_html(ValueError("<b>bad</b>"))
    assert "&lt;b&gt;bad&lt;/b&gt;" in out and "ValueError" in out


# -- plots ----------------------------------------------------------------------------------------
def test_plots_return_fixed_size_figures_without_pyplot(stepper):
    import matplotlib.pyplot as plt

    for _ in range(3):
        stepper.next()
    before = plt.get_fignums()
    fig = plot_savings(stepper.turns())
    assert tuple(fig.get_size_inches()) == (8.0, 4.0) and len(fig.axes) == 2
    assert plt.get_fignums() == before
    fig2, ax = plt.subplots()
    assert plot_savings(stepper.turns(), ax=ax) is fig2
    plt.close(fig2)
    summary = pc.compare_df([stepper.session])
    assert tuple(plot_compare(summary).get_size_inches()) == (9.0, 3.4)


# -- the ipywidgets views (no kernel needed) -----------------------------------------------------
def test_stepper_buttons_drive_the_same_methods(lab):
    sc = _scenario()
    st = pc.widgets.Stepper(lab.replay(sc, stop_after=0), sc)
    assert repr(st) == "Stepper(session='s001-naive', request=-1, requests=0, scenario='widget_test', played='0 of 5')"
    st._next_btn.click()
    st._next_btn.click()  # a tool loop: requests 1 and 2, the view shows 1
    assert (st.request, st.n_requests) == (1, 3)
    assert "Request 1" in st._header.value and "cache read" in st._usage.value
    assert st.chart.requests == 3 and bytes(st.chart._image.value).startswith(b"\x89PNG")
    st._slider.value = 0
    assert st.request == 0 and "first request" in st.diff_view.html
    assert st.chart.highlight == 0  # the chart marks the request the slider shows
    st._user.value, st._reply.value = "typed <b>", "ok"
    st._next_btn.click()
    assert st.request == 3 and st._user.value == "" and "typed &lt;b&gt;" in st._header.value
    assert st.status == "sent request 3: your message"
    st._restart_btn.click()
    assert st.session.n_turns == 4


def test_click_errors_are_shown_not_swallowed(lab):
    st = pc.widgets.Stepper(lab.session(system=HOST))
    st._next_btn.click()  # no scenario, no text: the click must not raise, the widget must say why
    assert "SessionError" in st._error.value and "no scenario" in st._error.value
    assert st._error.layout.display is None
    with pytest.raises(SessionError):
        st.next()
    st.next("hello")
    assert st._error.value == "" and st._error.layout.display == "none"


def test_editor_form_edits_through_its_fields(lab):
    sc = _scenario()
    st = pc.widgets.Stepper(lab.replay(sc, stop_after=0), sc)
    st.next()
    ed = st.editor()
    assert repr(ed) == "KnowledgeEditor(session='s001-naive', entries=2)"
    ed.select("refunds")
    assert ed._title.value == "Refund policy" and ed.selected
    ed._content.value = "Refunds take one day (edited in the form)."
    ed._save_btn.click()
    assert "updated" in ed._status.value and "pending for the next request" in st._header.value
    st._next_btn.click()
    assert "edited in the form" in st.diff_view.html
    ed.select("")
    ed._title.value, ed._content.value, ed._category.value = "New", "Brand new entry.", "fact"
    ed._add_btn.click()
    assert ed.entries == 3 and ed._pick.value
    ed._remove_btn.click()
    assert ed.entries == 2 and ed._pick.value == ""
    ed._save_btn.click()  # nothing picked: shown in the widget
    assert "pick the entry to change" in ed._error.value


def test_compare_widget_and_diffview_reprs(lab):
    cmp = pc.widgets.Compare(_scenario(), strategies=["naive"], lab=lab)
    cmp._next_btn.click()
    assert cmp.played == 1 and "1 of 5" in cmp._header.value
    cmp._run_btn.click()
    assert repr(cmp) == "Compare(scenario='widget_test', strategies=1, cache='anthropic', played='5 of 5')"
    s = cmp.controller.sessions[0]
    dv = pc.widgets.DiffView.for_turns(s.turn(2), previous=s.turn(1))
    assert repr(dv).startswith("DiffView(path=") and "0x" not in repr(dv)
    chart = pc.widgets.SavingsChart(s.turns())
    assert repr(chart) == "SavingsChart(requests=6)"


def test_a_model_switch_shows_the_field_not_a_segment(lab):
    s = lab.session(system=HOST)
    s.step("hello", "hi")
    s.switch_model("claude-haiku-4-5")
    t = s.step("again", "ok")
    dv = pc.widgets.DiffView.for_turns(t, previous=s.turn(0))
    assert dv.path == "model"
    assert "model (top-level field)" in dv.html and "claude-haiku-4-5" in dv.html


class FailOnce(pc.live.DirectSimulator):
    """The network seam: the next send fails once when armed (an overloaded API)."""

    armed = False

    def send(self, request, *, at, cache):
        if self.armed:
            self.armed = False
            raise pc.errors.OverloadedError("Overloaded")
        return super().send(request, at=at, cache=cache)


def test_a_failed_scenario_turn_changes_nothing_and_can_be_retried(lab):
    sc = _scenario()
    backend = FailOnce()
    ctl = StepperController(lab.replay(sc, stop_after=0, backend=backend), sc)
    ctl.next()
    ctl.next()
    k = KnowledgeController(ctl)
    k.edit("tone", content="Be very brief.")  # the user's own pending edit survives the failure
    versions = ctl.session.knowledge.df().set_index("key").version.to_dict()
    backend.armed = True
    with pytest.raises(pc.errors.OverloadedError):
        ctl.next()  # scenario turn 3: its knowledge update is applied, then the request fails
    s = ctl.session
    assert s.knowledge.df().set_index("key").version.to_dict() == versions  # the update was undone
    assert s.pending_events == (f"knowledge_update:{s.knowledge.id_for('tone')[:8]}",)  # only the user's
    assert (ctl.position, ctl.n_requests) == (2, 3) and "changed nothing" in ctl.status
    t = ctl.next()  # the retry applies the scenario's update once
    assert ctl.session.knowledge.df().set_index("key").version.to_dict()["refunds"] == versions["refunds"] + 1
    assert sum(e.startswith("knowledge_update:") for e in t.events) == 2  # the user's and the scenario's
    while ctl.remaining:
        ctl.next()
    with pc.Lab(progress=False) as other:  # and the finished session equals one that never failed
        ref = StepperController(other.replay(sc, stop_after=0), sc)
        ref.next()
        ref.next()
        KnowledgeController(ref).edit("tone", content="Be very brief.")
        while ref.remaining:
            ref.next()
        for i in range(ref.n_requests):
            assert ctl.session.turn(i).body == ref.session.turn(i).body


def test_a_scenario_event_on_an_entry_you_removed_is_skipped_not_a_jam(stepper):
    """The jam from issue 13: remove an entry a later scenario event updates, then play to the end."""
    k = KnowledgeController(stepper)
    stepper.next()
    stepper.next()
    k.remove("refunds")  # scenario turn 3 updates it
    t = stepper.next()
    short = t.events[0].split(":")[1]
    assert list(t.events) == [f"knowledge_remove:{short}"]  # the user's removal; the update was skipped
    assert stepper.last_skipped == (f"knowledge_update:{short} (refunds) — you removed that entry",)
    assert stepper.status == (f"scenario turn 3 of 5: sent request 3; skipped scenario event "
                              f"knowledge_update:{short} (refunds) — you removed that entry")
    while stepper.remaining:
        stepper.next()
    assert stepper.position == 5 and len(stepper.skipped) == 1


def test_run_to_end_reports_progress_and_a_status(stepper):
    seen = []
    t = stepper.run(progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)] and t.index == 5
    assert stepper.status == "played scenario turns 1–5 of 5: requests 0–5 · scenario finished — type a message to continue"
    assert stepper.run() is None and stepper.status == "nothing to run: the scenario is finished"


def test_restart_checks_the_next_request_is_byte_identical(stepper):
    stepper.next()
    stepper.next()
    before = stepper.session.preview("And the policy?")
    steps = []
    s = stepper.restart(progress=lambda done, total: steps.append(done))
    assert steps == [1, 2, 3]
    assert s.preview("And the policy?").body == before.body
    assert stepper.status.startswith("restarted from the store: next request is byte-identical (")


def test_hostile_knowledge_is_escaped_and_its_invisible_characters_shown(lab):
    sc = _scenario()
    st = pc.widgets.Stepper(lab.replay(sc, stop_after=0), sc)
    st.next()
    ed = st.editor()
    title = "evil\u202eexe.txt <img src=x onerror=alert(1)>"
    ed.add(title, "zero\u200bwidth and a bell\x07, <script>alert(1)</script>", category="note")
    st.next()
    blobs = {"table": ed._table.value, "diff": st.diff_view.html, "snapshot": st.snapshot_html(),
             "editor snapshot": ed.snapshot_html()}
    for where, blob in blobs.items():
        assert "\u202e" not in blob and "\u200b" not in blob, where
        assert "<img src=x" not in blob and "<script>" not in blob, where
    assert "⟨RLO⟩" in ed._table.value and "⟨RLO⟩" in st.diff_view.html and "⟨ZWSP⟩" in st.diff_view.html
    labels = [label for label, _ in ed._pick.options]
    assert any("evil⟨RLO⟩exe.txt" in label for label in labels) and not any("\u202e" in x for x in labels)
    frame = st.session.knowledge.df()
    assert "evil⟨RLO⟩exe.txt <img src=x onerror=alert(1)>" in set(frame.title)
    assert ed._title.value == title  # the edit form holds the raw text, so saving it changes nothing
    assert "contain invisible characters" in ed._status.value and "evil⟨RLO⟩exe.txt" in ed._status.value
    ed.select("refunds")
    assert "invisible" not in ed._status.value


def test_text_html_keeps_lines_and_marks_trailing_spaces():
    assert _html.text_html("a \nb\u202ec <") == (
        'a<span style="background:#fde68a;color:#92400e;border-radius:2px;padding:0 1px" '
        'title="1 trailing space(s)">·</span>\nb<span style="background:#fde68a;color:#92400e;'
        'border-radius:2px;padding:0 1px" title="U+202E RIGHT-TO-LEFT OVERRIDE">⟨RLO⟩</span>c &lt;')
    assert "word-break:break-all" not in _html._CELL  # diff text wraps between words


def test_buttons_are_disabled_while_a_click_works(lab):
    sc = _scenario()
    st = pc.widgets.Stepper(lab.replay(sc, stop_after=0), sc)
    during = []
    real = st.controller.next

    def spy(*args, **kwargs):
        during.append((st._next_btn.disabled, st._run_btn.disabled, st._restart_btn.disabled,
                       st._progress.layout.display, 'data-kind="busy"' in st._status.value))
        return real(*args, **kwargs)

    st.controller.next = spy
    st._run_btn.click()
    assert during and all(d == (True, True, True, None, True) for d in during)
    # finished: Next turn waits for a typed message, Run to end has nothing left
    assert (st._next_btn.disabled, st._run_btn.disabled, st._restart_btn.disabled) == (True, True, False)
    assert st._progress.layout.display == "none" and st._progress.value == 5
    assert "played scenario turns 1–5 of 5" in st._status.value
    st._restart_btn.click()
    assert "next request is byte-identical" in st._status.value


def test_empty_widgets_show_no_broken_image_and_compare_finishes_cleanly(lab):
    sc = _scenario()
    st = pc.widgets.Stepper(lab.replay(sc, stop_after=0), sc)
    assert st.chart._image.layout.display == "none" and "<img" not in st.snapshot_html()
    cmp = pc.widgets.Compare(sc, strategies=["naive", "durable_delta"], lab=lab)
    assert cmp._image.layout.display == "none" and not cmp._next_btn.disabled
    seen = []
    real = cmp.controller.run
    cmp.controller.run = lambda turns=None, progress=None: real(
        turns, progress=lambda d, n: (seen.append((d, n, cmp._progress.layout.display)), progress(d, n)))
    cmp._run_btn.click()
    assert seen[-1] == (10, 10, None) and len(seen) == 10
    assert cmp._image.layout.display is None and cmp._next_btn.disabled and cmp._run_btn.disabled
    assert "finished" in cmp._header.value and "type a user message" not in cmp._header.value
    with pytest.raises(SessionError, match="is finished: every strategy has played all 5") as err:
        cmp.next()
    assert "type a user message" not in str(err.value)
    assert cmp.status == "played scenario turns 1–5 of 5 under 2 strategies"


def test_every_widget_has_a_static_html_snapshot(lab):
    sc = _scenario()
    st = pc.widgets.Stepper(lab.replay(sc, stop_after=0), sc)
    st.next()
    st.next()
    cmp = pc.widgets.Compare(sc, strategies=["naive"], lab=lab)
    cmp.run()
    s = st.session
    widgets = {"Stepper": st, "KnowledgeEditor": st.editor(), "Compare": cmp, "SavingsChart": st.chart,
               "DiffView": pc.widgets.DiffView.for_turns(s.turn(1), previous=s.turn(0))}
    for kind, w in widgets.items():
        bundle = w._repr_mimebundle_()
        assert set(bundle) == {"text/plain", "text/html", "application/vnd.jupyter.widget-view+json"}, kind
        html = bundle["text/html"]
        assert f"pcnb-snapshot-{kind}" in html and "static snapshot" in html, kind
        assert html == w._repr_mimebundle_()["text/html"], kind  # deterministic
    assert "Request 1" in widgets["Stepper"]._repr_mimebundle_()["text/html"]
    assert "data:image/png;base64," in widgets["Compare"]._repr_mimebundle_()["text/html"]


def test_replaying_twice_in_one_lab_gives_the_same_numbers(lab):
    sc = pc.load_scenario(SCENARIOS / "knowledge_churn.yaml")
    a = lab.replay(sc, strategy="durable_delta")
    b = lab.replay(sc, strategy="durable_delta")
    assert (a.project, b.project) == ("harbor/durable_delta", "harbor/durable_delta-2")
    assert pc.summarize(a.turns()) == pc.summarize(b.turns())
    assert [a.turn(i).body for i in range(a.n_turns)] == [b.turn(i).body for i in range(b.n_turns)]
    assert [e.short_id for e in a.knowledge] == [e.short_id for e in b.knowledge]
    assert not {e.id for e in a.knowledge} & {e.id for e in b.knowledge}  # still separate entries
    a.knowledge.update(a.knowledge.id_for("pref-test-first"), content="Only in a.")
    assert "Only in a." not in {e.content for e in b.knowledge}  # and separate knowledge
    c = lab.replay(sc, strategy="naive")  # another strategy: its own names, as before
    assert c.project == "harbor/naive"


def test_diff_accepts_stored_bodies_as_bytes(stepper):
    stepper.next()
    stepper.next()
    s = stepper.session
    d = pc.diff(s.turn(0).body, s.turn(1).body)
    assert d == pc.diff(s.turn(0).request, s.turn(1).request) or repr(d) == repr(
        pc.diff(s.turn(0).request, s.turn(1).request))
    assert repr(pc.diff(s.turn(0).body.decode(), s.turn(1).body)) == repr(d)
    with pytest.raises(TypeError, match="request bodies .*not JSON"):
        pc.diff(b"not json", s.turn(1).body)


def test_plots_mark_the_request_on_show_and_keep_labels_clear(stepper):
    for _ in range(3):
        stepper.next()
    df = stepper.turns()
    fig = plot_savings(df, highlight=2)
    ax, ax2 = fig.axes
    assert any(t.get_text() == "request 2" for t in ax.texts)
    assert any(t.get_text() == "$0" for t in ax2.texts)
    summary = pc.compare_df([stepper.session])
    cfig = plot_compare(summary)
    cfig.canvas.draw()
    cax = cfig.axes[0]
    legend = cax.get_legend().get_window_extent()
    for label in cax.texts:  # the efficiency / cost labels above the bars
        assert not legend.overlaps(label.get_window_extent())


def test_report_shows_names_as_data_and_small_costs(tmp_path):
    import pandas as pd

    from promptcache_nb.report import write_report

    name = "evil\u202e<b>x"
    summary = pd.DataFrame([{"strategy": name, "cache": "anthropic", "requests": 2, "cache_read_pct": 40.0,
                             "efficiency": 0.5, "cache_read": 400, "cache_write": 300, "uncached": 300,
                             "breaks": 1, "cost_usd": 0.004, "cost_no_cache_usd": 0.0061, "saved_usd": 0.0021}])
    frames = {name: pd.DataFrame({"idx": [0, 1], "cost_usd": [0.002, 0.002]})}
    html = write_report(tmp_path / "r.html", summary, frames, title=f"t{name}", notes=[name]).read_text()
    assert "\u202e" not in html and "<b>x" not in html
    assert "evil⟨RLO⟩&lt;b&gt;x" in html and "<td>0.0040</td>" in html and "<td>0.0021</td>" in html
