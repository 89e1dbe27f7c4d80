"""Charts that tell the truth (#26 item 4): room above the tallest bar, no legend over data, no "1e6" offset,
every chart saying what its figures are, and a SavingsChart that follows its session. Matplotlib figures are
inspected after drawing; widgets without a kernel."""

from __future__ import annotations

import pandas as pd
import pytest

import promptcache_nb as pc
from promptcache_nb.widgets import StepperController

CHURN = pc.data_path("scenarios") / "knowledge_churn.yaml"
SIMULATED = "simulated (estimated tokens)"


@pytest.fixture
def lab():
    with pc.Lab(progress=False) as lab:
        yield lab


@pytest.fixture
def scenario():
    return pc.load_scenario(CHURN)


def assert_truthful(fig, label: str) -> None:
    """Every axes with bars: the tallest ends below the top with room; no legend box over a bar; no offset or
    scientific notation on any y axis; the figures' kind named on some axes' y label."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.patches import Rectangle

    canvas = FigureCanvasAgg(fig)  # a Figure() made without pyplot has no drawing canvas of its own
    canvas.draw()
    renderer = canvas.get_renderer()
    bars = [p for ax in fig.axes for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]
    for ax in fig.axes:
        own = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]
        if own:
            top = max(p.get_y() + p.get_height() for p in own)
            assert top <= ax.get_ylim()[1] * 0.95, (ax.get_title(), top, ax.get_ylim())
        assert ax.yaxis.get_offset_text().get_text() == "", ax.get_title()
        legend = ax.get_legend()
        if legend is not None:
            box = legend.get_window_extent(renderer)
            covered = [p for p in bars if p.get_window_extent(renderer).overlaps(box)]
            assert covered == [], f"the legend of {ax.get_title()!r} covers {len(covered)} bars"
    assert any(label in ax.get_ylabel() for ax in fig.axes), [ax.get_ylabel() for ax in fig.axes]


# -- the library's charts ---------------------------------------------------------------------------------------


def test_savings_chart_has_headroom_and_says_simulated(lab, scenario):
    df = lab.replay(scenario, strategy="naive").turns()
    assert_truthful(pc.plots.plot_savings(df), SIMULATED)
    assert_truthful(pc.plots.plot_savings(df, highlight=5), SIMULATED)
    fig = pc.plots.plot_savings(df, label="simulated (counterfactual)")
    assert_truthful(fig, "simulated (counterfactual)")
    right = fig.axes[1]  # the $ axis: plain dollars, the curve inside it
    saved = (df["cost_no_cache_usd"] - df["cost_usd"]).cumsum()
    assert right.get_ylim()[0] < saved.min() and saved.max() < right.get_ylim()[1]


def test_savings_chart_of_measured_usage_says_measured(lab):
    session = lab.import_log(pc.data_path("logs", "claude_code_gaps"), progress=False).sessions[0]
    fig = pc.plots.plot_savings(session.turns())
    assert_truthful(fig, "measured")
    assert "simulated" not in fig.axes[0].get_ylabel()


def test_compare_and_cumulative_cost_charts(lab, scenario):
    sessions = [lab.replay(scenario, strategy=name) for name in ("naive", "rewrite_knowledge", "durable_delta")]
    assert_truthful(pc.plots.plot_compare(pc.compare_df(sessions)), SIMULATED)
    fig = pc.plots.plot_cumulative_cost({s.strategy: s.turns() for s in sessions})
    assert_truthful(fig, SIMULATED)
    assert fig.axes[0].get_ylim()[0] == 0


def test_cache_compare_legend_sits_outside_the_bars(lab):
    clock = pc.data_path("scenarios") / "clock_tick.yaml"
    sessions = {name: lab.replay(clock, strategy=name) for name in ("naive", "clock_at_tail")}
    compared = pd.concat({name: pc.compare_caches(s).set_index("cache") for name, s in sessions.items()},
                         names=["layout"])
    read_pct = compared["cache_read_pct"].unstack("cache")
    fig = pc.plots.plot_cache_compare(read_pct)
    assert_truthful(fig, SIMULATED)
    ax = fig.axes[0]
    assert len([p for p in ax.patches if p.get_height() > 0]) == read_pct.size - int((read_pct == 0).sum().sum())
    assert [t.get_text() for t in ax.get_xticklabels()] == list(read_pct.columns)


def test_the_old_savings_chart_would_fail_the_check(lab, scenario):
    """The check itself bites: a chart whose axis ends at its tallest bar, without a label, is refused."""
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    ax.bar([0, 1], [10, 20])
    ax.set_ylim(0, 20)
    with pytest.raises(AssertionError):
        assert_truthful(fig, SIMULATED)
    ax.set_ylim(0, 30)
    ax.legend(["x"], loc="upper right")
    ax.bar([0.5], [29])
    with pytest.raises(AssertionError):
        assert_truthful(fig, SIMULATED)


def test_sources_label_never_calls_a_mix_one_kind():
    from promptcache_nb.usage import sources_label

    assert sources_label(["simulated"]) == SIMULATED
    assert sources_label(["imported", "live"]) == "measured"
    assert sources_label(["simulated", "imported"]) == "measured and simulated"
    assert sources_label([]) == SIMULATED


# -- SavingsChart follows its session ---------------------------------------------------------------------------


def test_savings_chart_follows_its_session_when_a_stepper_steps(lab, scenario):
    s = lab.replay(scenario, strategy="durable_delta", stop_after=0)
    chart = pc.widgets.SavingsChart(s)
    assert chart.requests == 0 and chart.png == b""
    stepper = StepperController(s, scenario)
    stepper.next()
    assert chart.requests == stepper.n_requests > 0 and chart.png.startswith(b"\x89PNG")
    assert "simulated (estimated tokens)" in chart.snapshot_html()
    before = chart.png
    stepper.next()
    stepper.next()
    assert chart.requests == stepper.n_requests and chart.png != before
    chart.close()  # unsubscribed: another step leaves it alone
    n = chart.requests
    stepper.next()
    assert chart.requests == n < stepper.n_requests


def test_savings_chart_follows_a_plain_step_and_a_failed_turn_is_never_announced(lab):
    s = lab.session(project="p")
    chart = pc.widgets.SavingsChart(s)
    s.step("hello", reply="hi")
    assert chart.requests == 1
    with pytest.raises(RuntimeError, match="boom"), lab.atomic():
        s.step("again", reply="ok")
        raise RuntimeError("boom")
    assert chart.requests == 1 and s.n_turns == 1
    seen = []
    unsubscribe = pc.turn.on_record(s, seen.append)
    with lab.atomic():
        s.step("a tool loop", reply="done",
               tool_calls=[{"name": "search", "input": {"q": "x"}, "result": "y"}])
        assert seen == []  # inside the block nothing is stored yet
    unsubscribe()
    assert [t.index for t in seen] == [1, 2] and chart.requests == 3
    chart.close()


def test_store_on_commit_runs_after_the_outermost_commit_only(lab):
    store = lab.store
    ran = []
    store.on_commit(lambda: ran.append("now"))  # no transaction: at once
    with store.transaction():
        with store.transaction():
            store.on_commit(lambda: ran.append("outer"))
        assert ran == ["now"]
    assert ran == ["now", "outer"]
    with pytest.raises(ValueError), store.transaction():
        store.on_commit(lambda: ran.append("rolled back"))
        raise ValueError
    with store.transaction():
        store.on_commit(lambda: 1 / 0)  # logged, never raised into the write
        store.on_commit(lambda: ran.append("after a failing one"))
    assert ran == ["now", "outer", "after a failing one"]


# -- DiffView's reason for a missing segment map -----------------------------------------------------------------


def test_diffview_for_a_simulated_turn_without_states_never_blames_measured_usage(lab, scenario):
    s = lab.replay(scenario, strategy="durable_delta", stop_after=2)
    t1, t2 = s.turn(1), s.turn(2)
    t2.cache_result, t2._segment_states = None, ()  # a simulated request whose cache model gave no states
    html = pc.widgets.DiffView.for_turns(t2, previous=t1).html
    assert "the cache model reported no state per segment" in html and "measured usage" not in html
    imported = lab.import_log(pc.data_path("logs", "claude_code_gaps"), progress=False).sessions[0]
    m1, m2 = imported.turn(0), imported.turn(1)
    m2.cache_result, m2._segment_states = None, ()
    assert "measured usage: the API reports totals" in pc.widgets.DiffView.for_turns(m2, previous=m1).html


def test_savings_charts_on_a_shared_token_axis_cut_neither(lab, scenario):
    from matplotlib.figure import Figure

    frames = [lab.replay(scenario, strategy=name).turns() for name in ("durable_delta", "naive")]
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    shared = pc.plots.saved_limits(*frames)
    for ax, df in zip(axes, frames, strict=True):
        pc.plots.plot_savings(df, ax=ax, saved_ylim=shared)
    assert_truthful(fig, SIMULATED)  # the taller chart drawn second did not leave the first one's limit
