"""ipywidgets 8 views over the controllers in :mod:`._controllers`.

Each view builds stock widgets (no JavaScript of our own), forwards clicks to a kernel-side method with
the same effect (``stepper.next()``, ``editor.edit(...)``), renders HTML produced by :mod:`._html`, and
batches each refresh with ``hold_sync()``. While a click works, the view's buttons are disabled, a
progress bar moves for multi-request work, and a one-line status says what the click did. A failing
click shows the error in the widget itself (an ``HTML`` box rather than an ``Output`` widget: output
captured in an ``Output`` leaks into the cell's stdout under nbval and nbclient).

Every view also has a static HTML snapshot (``text/html`` beside the widget view in its output), so a
notebook opened without a kernel — on GitHub, nbviewer or through nbconvert — shows the state the widget
had when its cell ran.
"""

from __future__ import annotations

import io
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import ipywidgets as W
import traitlets as T
from IPython import get_ipython  # loaded with ipywidgets, which depends on it
from IPython.display import HTML, display

from .._lazy import pandas as pd
from .._util import escape_dollars
from ..plots import plot_compare, plot_savings
from ..scenario import Scenario
from ..strategies import strategy_names
from ..turn import on_record
from ..usage import sources_label
from . import _html
from ._controllers import (
    PAIR,
    CompareController,
    KnowledgeController,
    MonitorController,
    StepperController,
    TurnView,
    live_session,
)
from ._whatif import WhatIfController

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ..lab import Lab
    from ..live.otel import OtlpFollower, OtlpReceiver
    from ..request import PreparedRequest
    from ..session import Session
    from ..turn import Turn

PNG_DPI = 90
# full button labels: as wide as their text and never shrunk by a crowded row (descriptions truncate otherwise)
_AUTO = W.Layout(width="max-content", flex="0 0 auto")


#: Knowledge entries the stepper's compact editor shows without scrolling.
KNOWLEDGE_ROWS_SHOWN = 6
#: What a widget says when its Lab was closed under it (``lab.close()`` ran after the cell that made it).
LAB_CLOSED = "the Lab of this widget is closed (lab.close() ran): run the notebook again to use it"


class _HTML(W.HTML):  # type: ignore[misc]  # ipywidgets ships no type information
    """An HTML widget whose dollar signs show as money: ipywidgets typesets an HTML value's ``$…$`` as math."""

    @T.validate("value")
    def _dollars_as_text(self, proposal: dict[str, Any]) -> str:
        return escape_dollars(proposal["value"])


@contextmanager
def _batch(*widgets: W.Widget) -> Iterator[None]:
    """Hold every widget's state messages and send one update per widget on exit."""
    with ExitStack() as stack:
        for w in widgets:
            stack.enter_context(w.hold_sync())
        yield


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():  # a name in a script the font lacks is drawn as boxes, not an error
        warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
        fig.savefig(buf, format="png", dpi=PNG_DPI)
    return buf.getvalue()


def _image() -> W.Image:
    # hidden until it has a picture: an empty Image renders as a broken-image icon
    return W.Image(format="png", layout=W.Layout(max_width="100%", display="none"))


def _set_image(image: W.Image, png: bytes) -> None:
    image.value = png
    image.layout.display = None if png else "none"


class _View:
    """Mixin: the error box, busy state (controls disabled, progress bar), the status line, the snapshot."""

    _error: W.HTML
    _status: W.HTML
    _progress: W.IntProgress
    controller: Any
    _busy = False  # a click is working (its controls are disabled)
    _shown_error: BaseException | None = None  # the last error the error box shows

    def _controls(self) -> list[W.Widget]:
        """Widgets to disable while a click works."""
        return []

    def _sync_controls(self) -> None:
        """Enable the controls that make sense in the current state (after a click finished)."""
        for w in self._controls():
            w.disabled = False

    def _show_status(self, text: str, *, kind: str = "info") -> None:
        self._status.value = _html.status_html(text, kind=kind)

    def _status_kind(self) -> str:
        return "info"

    def _show_final_status(self) -> None:
        """The status line after a click succeeded (sent before the buttons re-enable)."""
        text = getattr(self.controller, "status", "")
        if text:
            self._show_status(text, kind=self._status_kind())

    @contextmanager
    def _working(self, what: str, *, total: int | None = None) -> Iterator[Callable[[int, int], None]]:
        """Disable the controls, say ``what`` is happening, show a progress bar when ``total`` is given.

        Yields ``progress(done, total)`` for the controller. State messages are sent at once (no
        ``hold_sync`` here), so the browser shows the busy state while the kernel works.
        """
        for w in self._controls():
            w.disabled = True
        self._busy = True
        self._show_status(what + "…", kind="busy")
        bar = self._progress
        if total:
            bar.max, bar.value, bar.description = total, 0, "working"
            bar.layout.display = None

        def progress(done: int, n: int) -> None:
            if bar.max != n:
                bar.max = n
            bar.value = done
            bar.layout.display = None

        failed = False
        try:
            yield progress
        except BaseException:
            failed = True  # _action already showed the failure in the status line and the error box
            raise
        finally:
            bar.layout.display = "none"
            self._busy = False
            if not failed:
                # the status line first: a re-enabled button must never sit under a "working…" line
                self._show_final_status()
            self._sync_controls()

    def _action(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a controller method; show its exception in the error box (and re-raise it)."""
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self._show_error(exc)
            raise
        if self._error.value:
            self._error.value = ""
            self._error.layout.display = "none"
        return result

    def _lab_closed(self) -> bool:
        session = getattr(self.controller, "session", None)
        return session is not None and session.lab.store.closed

    def _show_error(self, exc: BaseException) -> None:
        """Show ``exc`` in the error box and the status line: a closed Lab in one line, anything else by name."""
        if self._lab_closed():
            self._error.value = _html.status_html(LAB_CLOSED, kind="warn")
            self._show_status(LAB_CLOSED, kind="warn")
        else:
            self._error.value = _html.error_html(exc)
            status = getattr(self.controller, "status", "")
            self._show_status(status or f"failed: {type(exc).__name__}", kind="warn")
        self._error.layout.display = None
        self._shown_error = exc

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run what a click or a changed control does. A browser event has no cell to raise into, so an error
        is shown in the widget: ``_action`` has shown most already; any other (a refresh after it) is shown
        here."""
        try:
            fn(*args)
        except Exception as exc:
            if exc is not self._shown_error:
                self._show_error(exc)

    def _clicked(self, method: Callable[[], Any]) -> Callable[[Any], None]:
        def handler(_button: Any) -> None:
            self._guarded(method)

        return handler

    # -- the static snapshot ------------------------------------------------------------------
    def snapshot_html(self) -> str:
        """The widget's current state as static HTML (what an unrun notebook shows)."""
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        bundle = W.Widget._repr_mimebundle_(self, **kwargs)
        if bundle is not None:
            bundle["text/html"] = self.snapshot_html()
        return cast("dict[str, Any] | None", bundle)


@contextmanager
def _cell_progress(progress: Callable[[int, int], None], *, enabled: bool, total: int, desc: str
                   ) -> Iterator[Callable[[int, int], None]]:
    """``progress`` plus, when ``enabled`` in a kernel, a progress bar in the cell's output: for a call made
    before the widget is on screen (``cmp.run(progress=True); cmp``), where the widget's own bar is not seen.

    When the work ends the bar is replaced (same display id) by one line saying what was done, so a saved
    notebook shows "84 of 84 done", never a bar frozen at 0 %.
    """
    if not enabled or total <= 0 or get_ipython() is None:
        yield progress
        return
    bar = W.IntProgress(value=0, min=0, max=total, description=desc, bar_style="info",
                        style={"description_width": "initial"}, layout=W.Layout(width="640px"))
    handle = display(bar, display_id=True)  # type: ignore[no-untyped-call]  # IPython is untyped here

    def both(done: int, n: int) -> None:
        progress(done, n)
        bar.max, bar.value = n, done

    try:
        yield both
    finally:
        line = f"{desc}: {bar.value} of {bar.max} done"
        if handle is not None:
            done = HTML(  # type: ignore[no-untyped-call]  # IPython is untyped here
                f'<div class="pcnb-progress-done" style="font-size:12px;color:#555">{_html.esc(line)}</div>')
            handle.update(done)
        bar.close()


def _error_widget() -> W.HTML:
    return _HTML("", layout=W.Layout(display="none"))


def _progress_widget() -> W.IntProgress:
    bar = W.IntProgress(value=0, min=0, max=1, bar_style="info", layout=W.Layout(display="none", width="420px"))
    bar.add_class("pcnb-progress")
    return bar


class DiffView(W.VBox):  # type: ignore[misc]  # ipywidgets ships no type information
    """The escaped side-by-side prefix diff of two requests, and the segment map of the second.

    Args:
        diff: a :class:`~promptcache_nb.PrefixDiff` (``turn.diff``) or None; its path, offsets and
            shared-prefix figures head the view when present.
        previous: the earlier :class:`~promptcache_nb.PreparedRequest` (``turn.prepared``).
        current: the later one, whose segment map is shown.
        states: ``turn.segment_states`` (read / write / uncached per segment of ``current``).
        why: the segment map's line when ``states`` are missing (``for_turns`` picks it from the turn's usage).

    Example:
        >>> pc.widgets.DiffView.for_turns(s.turn(2), previous=s.turn(1))  # doctest: +SKIP
    """

    path = T.Unicode(None, allow_none=True,
                     help="where the requests first differ (None: pure append or no diff)")

    def __init__(self, diff: Any = None, *, previous: PreparedRequest | None = None,
                 current: PreparedRequest | None = None, states: tuple[str, ...] | list[str] = (),
                 why: str | None = None) -> None:
        self._map = _HTML()
        self._diff = _HTML()
        super().__init__([self._map, self._diff])
        self.add_class("pcnb-diffview")
        self.update(diff, previous=previous, current=current, states=states, why=why)

    @classmethod
    def for_turns(cls, turn: Turn, *, previous: Turn | None = None) -> DiffView:
        """The view of ``turn`` against ``previous`` (both from ``session.turn(i)`` or ``step()``)."""
        # without states the map says why: the usage is measured, or the cache model gave none
        why = _html.no_states_reason(turn.usage.measured)
        return cls(turn.diff, previous=None if previous is None else previous.prepared, current=turn.prepared,
                   states=turn.segment_states, why=why)

    def update(self, diff: Any = None, *, previous: PreparedRequest | None = None,
               current: PreparedRequest | None = None, states: tuple[str, ...] | list[str] = (),
               why: str | None = None) -> None:
        previous = previous if previous is not None else getattr(diff, "previous", None)
        current = current if current is not None else getattr(diff, "current", None)
        if current is None and diff is not None and hasattr(diff, "_repr_html_"):
            body = diff._repr_html_()  # our own PrefixDiff renders escaped HTML
            seg_map = ""
        else:
            body = _html.side_by_side_html(previous, current, diff=diff)
            seg_map = (_html.segment_map_html(current.segments, tuple(states), why=why)
                       if current is not None else "")
        path = getattr(diff, "path", None)
        if path is None and diff is None and previous is not None and current is not None:
            k = _html.shared_segments(previous, current)
            if k < len(previous.segments) and k < len(current.segments):
                path = current.segments[k].path
        with _batch(self, self._map, self._diff):
            self._map.value = seg_map
            self._diff.value = body
            self.path = path

    def show_view(self, view: TurnView | None) -> None:
        """Show a stepper :class:`TurnView`."""
        if view is None:
            self.update()
        else:
            self.update(view.diff, previous=view.previous, current=view.current, states=view.segment_states,
                        why=view.no_states_reason)

    @property
    def html(self) -> str:
        """The rendered segment map and diff (what the browser shows)."""
        return cast("str", self._map.value + self._diff.value)

    def snapshot_html(self) -> str:
        return _html.snapshot_html("DiffView", self.html)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        return _View._repr_mimebundle_(self, **kwargs)

    def __repr__(self) -> str:
        return f"DiffView(path={self.path!r})"


class SavingsChart(W.VBox):  # type: ignore[misc]  # ipywidgets ships no type information
    """Per-request stacked bars of cache read / write / uncached, the ideal line and cumulative $ saved.

    Args:
        source: a :class:`~promptcache_nb.Session` or a ``turns()`` frame. A chart of a session subscribes to
            it: every request stored into the session (a step, a Stepper click, a capture) redraws it, so it
            follows a Stepper stepping that session. :meth:`close` unsubscribes.
        highlight: mark this request (the Stepper passes the one its slider shows).

    The chart itself is :func:`promptcache_nb.plots.plot_savings`; :meth:`figure` returns it for saving.
    """

    requests = T.Int(0, help="rows in the frame on show")
    highlight = T.Int(None, allow_none=True, help="the request marked on the chart (None: none)")

    def __init__(self, source: Session | pd.DataFrame, *, highlight: int | None = None) -> None:

        self._source = source
        self._image = _image()
        self._caption = _HTML()
        super().__init__([self._image, self._caption])
        self.add_class("pcnb-savings")
        self._df = pd.DataFrame()
        self._unsubscribe: Callable[[], None] | None = None
        self._follow(source)
        self.refresh(highlight=highlight)

    def _follow(self, source: Session | pd.DataFrame) -> None:
        """Subscribe to ``source`` when it is a session (a frame does not change)."""



        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if isinstance(source, pd.DataFrame):
            return
        me = weakref.ref(self)  # the session's listeners never keep a chart alive

        def heard(turn: Turn) -> None:
            chart = me()
            if chart is not None:
                chart._heard(turn)

        self._unsubscribe = on_record(source, heard)

    def _heard(self, turn: Turn) -> None:
        # a tool loop announces several requests at once: the first redraw already shows them all
        if turn.index >= self.requests:
            self.refresh(highlight=self.highlight)

    def close(self) -> None:
        """Stop following the session and close the widget."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        super().close()

    @property
    def df(self) -> pd.DataFrame:
        return self._df

    @property
    def png(self) -> bytes:
        """The chart on show as PNG bytes (empty before the first request)."""
        return bytes(self._image.value or b"")

    def _frame(self) -> pd.DataFrame:

        src = self._source
        if isinstance(src, pd.DataFrame):
            return src

        self._source = live_session(src)
        return self._source.turns()

    def refresh(self, source: Session | pd.DataFrame | None = None, *, highlight: int | None = None) -> None:
        """Redraw from ``source`` (or the session / frame given at construction), marking ``highlight``."""
        if source is not None:
            self._source = source
            self._follow(source)
        df = self._frame()
        self._df = df
        if df.empty:
            with _batch(self, self._image, self._caption):
                _set_image(self._image, b"")
                self._caption.value = '<div style="font-size:12px;color:#777">savings chart: no requests yet</div>'
                self.requests = 0
                self.highlight = None
            return
        self.highlight = highlight
        png = _png(self.figure())
        saved = float((df["cost_no_cache_usd"] - df["cost_usd"]).sum())
        with _batch(self, self._image, self._caption):
            _set_image(self._image, png)
            self._caption.value = (
                f'<div style="font-size:12px">{len(df)} requests · saved vs no caching: '
                f'<b data-field="saved">{_html.fmt_usd(saved)}</b> · token figures '
                f'<span data-field="usage-label">{_html.esc(self.label)}</span></div>'
            )
            self.requests = len(df)

    @property
    def label(self) -> str:
        """What the chart's figures are: ``simulated (estimated tokens)``, ``measured`` (or both)."""

        df = self._df
        return sources_label(df["usage_source"].dropna().unique() if "usage_source" in df else ())

    def figure(self) -> Figure:
        """The chart as a matplotlib Figure (``plot_savings(df, highlight=...)``)."""
        return plot_savings(self._df, highlight=self.highlight, label=self.label)

    def snapshot_html(self) -> str:
        return _html.snapshot_html("SavingsChart", _html.png_html(self.png, alt="savings chart")
                                   + self._caption.value)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        return _View._repr_mimebundle_(self, **kwargs)

    def __repr__(self) -> str:
        return f"SavingsChart(requests={self.requests})"


class Stepper(_View, W.VBox):  # type: ignore[misc]  # ipywidgets ships no type information
    """Step a session one scenario turn at a time and see what each request did to the cache.

    Buttons and their kernel-side twins: "Next turn" → :meth:`next` (the next scenario turn, or the
    typed user text and reply), "Run to end" → :meth:`run`, "Restart" → :meth:`restart` (drop in-memory
    state, resume from the store, check the next request is byte-identical), the request slider →
    :meth:`show`. A failed scenario turn changes nothing; a scenario event that conflicts with your own
    knowledge edit is skipped, and the status line says so. Once the scenario is finished "Next turn" is
    disabled until you type a message.

    For a class: the **strategy** selector → :meth:`switch_strategy` (a new session under that strategy,
    replayed to the same scenario turn) and the **side by side: naive vs durable_delta** toggle →
    :meth:`side_by_side` (both play every turn; knowledge edits go to both) make a cache break happen live.
    The knowledge editor is a panel beside the diff (:attr:`knowledge`; ``stepper.editor()`` returns it), so
    an edit, "Next turn" and the diff it causes fit one 1280×720 screen.

    Args:
        session: a :class:`~promptcache_nb.Session`.
        scenario: continue this scenario (object or YAML path) from the session's position.

    Example:
        >>> s = lab.replay("data/scenarios/tiny.yaml", stop_after=0)  # doctest: +SKIP
        >>> stepper = pc.widgets.Stepper(s, "data/scenarios/tiny.yaml")  # doctest: +SKIP
        >>> stepper.next()  # doctest: +SKIP
    """

    request = T.Int(-1, help="index of the request on show (-1: none yet)")
    n_requests = T.Int(0, help="requests stored in the session")

    def __init__(self, session: Session, scenario: Scenario | str | Path | None = None) -> None:
        self.controller = StepperController(session, scenario)
        self._next_btn = W.Button(description="Next turn", button_style="primary", icon="step-forward",
                                  layout=_AUTO,
                                  tooltip="play the next scenario turn, or send the typed message")
        self._run_btn = W.Button(description="Run to end", icon="fast-forward", layout=_AUTO,
                                 tooltip="play every remaining scenario turn")
        self._restart_btn = W.Button(description="Restart", icon="refresh", layout=_AUTO,
                                     tooltip="drop in-memory state and resume the session from the store")
        # the text boxes give way when the row is narrow; the buttons never do
        self._user = W.Text(placeholder="user message (empty: next scenario turn)",
                            layout=W.Layout(width="320px", flex="0 1 auto", min_width="140px"))
        self._reply = W.Text(placeholder="assistant reply (optional)",
                             layout=W.Layout(width="220px", flex="0 1 auto", min_width="110px"))
        self._slider = W.IntSlider(value=0, min=0, max=0, description="request", continuous_update=False,
                                   disabled=True, layout=W.Layout(width="320px", flex="0 1 auto"))
        self._status = _HTML()
        self._progress = _progress_widget()
        self._header = _HTML()
        self._error = _error_widget()
        self._usage = _HTML(layout=W.Layout(width="38%"))
        self._observation = _HTML(layout=W.Layout(width="62%"))
        self.diff_view = DiffView()
        self.chart = SavingsChart(self.controller.turns())
        self._syncing = False

        names = list(strategy_names())
        current = self.controller.strategy
        self._strategy = W.Dropdown(options=names if current in names or current is None else [current, *names],
                                    value=current if current is not None else None, description="strategy",
                                    disabled=current is None or self.controller.scenario is None,
                                    style={"description_width": "initial"},
                                    layout=W.Layout(width="230px", flex="0 0 auto"))
        self._pair_btn = W.ToggleButton(value=False, description=f"side by side: {PAIR[0]} vs {PAIR[1]}",
                                        icon="columns", layout=_AUTO, disabled=self.controller.scenario is None,
                                        tooltip="play both strategies in lockstep; edits go to both")
        self._status.add_class("pcnb-stepper-status")
        # the diff scrolls inside its box, so the editor beside it stays on screen
        diff_box = W.Box([self.diff_view], layout=W.Layout(min_width="0", max_height="360px", overflow="auto"))
        diff_box.add_class("pcnb-stepper-diff")
        # the side-by-side partner: its usage line and diff (hidden until the mode is on)
        self._partner_usage = _HTML()
        self.partner_diff = DiffView()
        self._partner_box = W.VBox([self._partner_usage, W.Box([self.partner_diff], layout=W.Layout(
            max_height="400px", overflow="auto"))], layout=W.Layout(flex=_PAIR_COLUMN, min_width="0", display="none"))
        self._partner_box.add_class("pcnb-stepper-partner")
        self._left_label = _HTML()
        # the header sits over the diff, so the editor beside them starts right under the status line
        self._left = W.VBox([self._left_label, self._header, diff_box],
                            layout=W.Layout(flex=_ONE_COLUMN, min_width="0"))
        self._left.add_class("pcnb-stepper-main")
        #: over the two columns in the side-by-side mode, said only where they are narrow (a CSS container query:
        #: no script, and it follows the sidebar being opened or closed)
        self._pair_hint = _HTML(_html.PAIR_HINT_HTML, layout=W.Layout(display="none"))  # the row's width
        self._pair_hint.add_class("pcnb-pair-hint-box")
        #: the embedded knowledge editor (``stepper.editor()`` returns it)
        self.knowledge = KnowledgeEditor(self, compact=True)
        self._editor_panel = W.Accordion(children=[self.knowledge], titles=("knowledge editor",), selected_index=0,
                                         layout=W.Layout(flex=_EDITOR_BESIDE, min_width="320px"))
        self._editor_panel.add_class("pcnb-stepper-editor")
        super().__init__([
            W.HBox([self._next_btn, self._run_btn, self._restart_btn, self._strategy, self._pair_btn],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self._user, self._reply, self._slider], layout=W.Layout(flex_flow="row wrap")),
            self._status, self._progress, self._error, self._pair_hint,
            W.HBox([self._left, self._partner_box, self._editor_panel],
                   layout=W.Layout(flex_flow="row wrap", align_items="flex-start", width="100%")),
            W.HBox([self._usage, self._observation]),
            self.chart,
        ])
        self.add_class("pcnb-stepper")
        self._next_btn.on_click(self._clicked(self.next))
        self._run_btn.on_click(self._clicked(self.run))
        self._restart_btn.on_click(self._clicked(self.restart))
        self._slider.observe(self._on_slider, names=["value"])
        self._user.observe(self._on_typing, names=["value"])
        self._strategy.observe(self._on_strategy, names=["value"])
        self._pair_btn.observe(self._on_pair, names=["value"])
        self.controller.subscribe(self._on_change)
        self._render()
        self._sync_controls()
        if self.controller.status:
            self._show_status(self.controller.status)

    @property
    def session(self) -> Session:
        """The live session (a new object after :meth:`restart`)."""
        return cast("Session", self.controller.session)

    @property
    def status(self) -> str:
        """What the last click did (one line)."""
        return cast("str", self.controller.status)

    def _controls(self) -> list[W.Widget]:
        return [self._next_btn, self._run_btn, self._restart_btn, self._user, self._reply, self._slider,
                self._strategy, self._pair_btn]

    def _status_kind(self) -> str:
        return "warn" if self.controller.last_skipped else "info"

    def _sync_controls(self) -> None:
        c = self.controller
        with _batch(self._next_btn, self._run_btn, self._restart_btn, self._user, self._reply, self._slider,
                    self._strategy, self._pair_btn):
            # at the end of the scenario only a typed message gives "Next turn" something to do
            self._next_btn.disabled = not c.can_next(self._user.value)
            self._run_btn.disabled = c.remaining <= 0
            self._restart_btn.disabled = c.partner is not None  # restart follows one session, not a pair
            self._user.disabled = self._reply.disabled = False
            self._slider.disabled = c.n_requests <= 1
            self._strategy.disabled = c.scenario is None or c.strategy is None or c.partner is not None
            self._pair_btn.disabled = c.scenario is None or c.strategy is None

    def _on_typing(self, change: dict[str, Any]) -> None:
        enabled = self.controller.can_next(change["new"] or "")
        if self._next_btn.disabled == enabled and not self._busy:  # never while a click works
            self._next_btn.disabled = not enabled

    def _on_strategy(self, change: dict[str, Any]) -> None:
        if self._syncing or change["new"] is None or change["new"] == self.controller.strategy:
            return
        self._guarded(self.switch_strategy, change["new"])

    def _on_pair(self, change: dict[str, Any]) -> None:
        if self._syncing or bool(change["new"]) == (self.controller.partner is not None):
            return
        self._guarded(self.side_by_side, bool(change["new"]))

    # -- the buttons' kernel-side twins ----------------------------------------------------
    def next(self, user: str | None = None, reply: str | None = None) -> Turn:
        """Click "Next turn": ``user`` (default: the text box) or else the next scenario turn."""
        if user is None and self._user.value.strip():
            user, reply = self._user.value, (reply if reply is not None else (self._reply.value or None))
        with self._working("sending the next request" if user else "playing the next scenario turn"):
            t = self._action(self.controller.next, user, reply)
            with _batch(self._user, self._reply):
                self._user.value = ""
                self._reply.value = ""
            self._render()
        return cast("Turn", t)

    def switch_strategy(self, strategy: str) -> Session:
        """Pick ``strategy`` in the selector: a new session under it, replayed to the same scenario turn."""
        with self._working(f"replaying the scenario under {strategy}"):
            s = self._action(self.controller.switch_strategy, strategy)
            self._render()
        return cast("Session", s)

    def side_by_side(self, on: bool = True) -> None:
        """Toggle "side by side: naive vs durable_delta": both strategies play every turn, edits go to both."""
        with self._working(f"replaying the scenario under {PAIR[0]} and {PAIR[1]}" if on else "one strategy again"):
            self._action(self.controller.side_by_side, on)
            self._render()

    def run(self, turns: int | None = None, *, progress: bool = False) -> Turn | None:
        """Click "Run to end": play every remaining scenario turn (or ``turns`` more), with a progress bar.

        ``progress=True`` also shows a progress bar in the cell (for a call made before the widget is
        displayed).
        """
        c = self.controller
        n = c.remaining if turns is None else max(0, min(turns, c.remaining))
        try:
            with (self._working(f"playing {n} scenario turns", total=n) as bar,
                  _cell_progress(bar, enabled=progress, total=n, desc="scenario turns") as both):
                t = self._action(c.run, turns, progress=both)
        finally:
            self._render()
            self._sync_controls()
        self._show_status(c.status, kind="warn" if c.last_skipped else "info")
        return cast("Turn | None", t)

    def restart(self) -> Session:
        """Click "Restart": resume from the store alone; returns the new session object."""
        with self._working("restarting from the store", total=3) as progress:
            s = self._action(self.controller.restart, progress=progress)
            self._render()
        self._show_status(self.controller.status)
        return cast("Session", s)

    def show(self, index: int) -> TurnView:
        """Move the slider to stored request ``index``."""
        v = self._action(self.controller.show, index)
        self._render()
        return cast("TurnView", v)

    def editor(self) -> KnowledgeEditor:
        """The :class:`KnowledgeEditor` embedded in this stepper (its "knowledge editor" panel)."""
        return self.knowledge

    # -- rendering ---------------------------------------------------------------------------
    def _on_slider(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        self._guarded(self.show, int(change["new"]))

    def _on_change(self, what: str) -> None:
        if what == "knowledge":  # an editor changed knowledge: show it as pending for the next request
            self._header.value = self.controller.header_html()
        elif what == "restart":  # another session on show (a strategy switch, the side-by-side mode)
            self._render()

    def _render(self) -> None:
        c = self.controller
        v = c.view()
        n = c.n_requests
        with _batch(self, self._slider, self._header, self._usage, self._observation):
            self._syncing = True
            try:
                self._slider.max = max(n - 1, 0)
                self._slider.value = v.index if v is not None else 0
                self._slider.disabled = n <= 1
            finally:
                self._syncing = False
            self._header.value = c.header_html()
            self._usage.value = v.usage_html() if v is not None else ""
            self._observation.value = v.observation_html() if v is not None else ""
            self.request = -1 if v is None else v.index
            self.n_requests = n
            self._syncing = True
            try:
                if c.strategy is not None and self._strategy.value != c.strategy:
                    self._strategy.value = c.strategy
                self._pair_btn.value = c.partner is not None
            finally:
                self._syncing = False
        self._render_partner()
        self.diff_view.show_view(v)
        if self.chart.requests != n or self.chart.highlight != (None if v is None else v.index):
            self.chart.refresh(c.turns(), highlight=None if v is None else v.index)

    def _render_partner(self) -> None:
        c = self.controller
        p = c.partner
        pv = p.view() if p is not None else None
        with _batch(self._partner_box, self._partner_usage, self._left_label):
            # two equal columns that always share a row (never stacked), the editor on the row below
            self._left.layout.flex = _ONE_COLUMN if p is None else _PAIR_COLUMN
            self._editor_panel.layout.flex = _EDITOR_BESIDE if p is None else _EDITOR_BELOW
            self._pair_hint.layout.display = "none" if p is None else None
            if p is None:
                self._partner_box.layout.display = "none"
                self._left_label.value = ""
                return
            self._partner_box.layout.display = None
            self._left_label.value = _column_label(c.strategy, c.view())
            self._partner_usage.value = _column_label(p.strategy, pv)
        self.partner_diff.show_view(pv)

    def snapshot_html(self) -> str:
        parts = [self._status.value, self._header.value]
        if self.request >= 0:
            parts.append('<div style="display:flex;gap:6px"><div style="width:38%">'
                         f'{self._usage.value}</div><div style="width:62%">{self._observation.value}</div></div>')
        parts.append(self.diff_view.html)
        parts.append(self.knowledge._table.value)  # the embedded editor's list
        parts.append(_html.png_html(self.chart.png, alt="savings chart") + self.chart._caption.value)
        return _html.snapshot_html("Stepper", "".join(parts))

    def __repr__(self) -> str:
        sc = self.controller.scenario
        tail = "" if sc is None else f", scenario={sc.name!r}, played='{self.controller.position} of {len(sc.turns)}'"
        return (f"Stepper(session={self.controller.session.id!r}, request={self.request}, "
                f"requests={self.n_requests}{tail})")


# The stepper's row of panels (flex: grow, shrink, basis). Alone, the diff column and the editor share the row when
# it is wide enough. Side by side, the two columns' bases (40 % each) fit one row and the editor's 100 % does not, so
# it wraps below and the columns grow to half the row each: side by side at any width, never stacked.
_ONE_COLUMN = "1 1 520px"
_PAIR_COLUMN = "1 1 40%"
_EDITOR_BESIDE = "0 1 430px"
_EDITOR_BELOW = "1 1 100%"


def _column_label(strategy: str | None, view: TurnView | None) -> str:
    """One line over a side-by-side column: the strategy, and what its request on show read and wrote."""
    if view is None:
        return (f'<div class="pcnb-column" style="font-size:13px"><b>{_html.esc(strategy or "")}</b>: '
                "no request yet</div>")
    u = view.usage
    read, wrote = u.cache_read or 0, u.cache_write or 0
    broke = bool(view.broke)  # the one verdict: the observation under the column says the same
    lost = f", sent again {view.lost_tokens:,}" if view.lost_tokens else ""
    verdict = (f'<span style="color:#b35900"><b>cache break</b>: read {read:,}{lost}</span>' if broke
               else f"read {read:,} · no break")
    return (f'<div class="pcnb-column" data-broke="{str(broke).lower()}" style="font-size:13px"><b>'
            f"{_html.esc(strategy or '')}</b>, request {view.index}: {verdict} · wrote {wrote:,}</div>")


class KnowledgeEditor(_View, W.VBox):  # type: ignore[misc]  # ipywidgets ships no type information
    """List, add, edit and remove knowledge entries; each change applies before the next request.

    Buttons and their kernel-side twins: "Add entry" → :meth:`add`, "Save changes" → :meth:`edit`,
    "Remove entry" → :meth:`remove`; picking an entry → :meth:`select`. The list and the picker show
    invisible characters (bidi controls, zero-width…) as markers; the edit fields hold the raw text.

    The list shows one page of :data:`~promptcache_nb.widgets._html.KNOWLEDGE_PAGE_SIZE` entries ("entries
    1–50 of 100,000"), so a large knowledge book never becomes megabytes of HTML; past one page, "Previous
    page" / "Next page" → :meth:`previous_page` / :meth:`next_page` (or :meth:`show_page`) and a filter box
    → :meth:`search` appear. The picker lists the page's entries (and the picked one).

    Args:
        source: a :class:`~promptcache_nb.Session`, or a :class:`Stepper` — then the stepper shows the
            change as pending and, after "Next turn", what the strategy did with it.
    """

    entries = T.Int(0, help="current (not removed) entries")
    selected = T.Unicode("", help="id of the entry in the edit fields ('' = a new entry)")
    page = T.Int(0, help="page of the list on show (from 0)")
    query = T.Unicode("", help="the filter: entries whose title, category, content or id contain it")

    def __init__(self, source: Session | Stepper | StepperController, *, compact: bool = False) -> None:
        self.controller = KnowledgeController(source)
        self._table = _HTML()
        # compact: the stepper's panel (fields as wide as the panel, the list scrolls in a short box)
        # (less each widget's 2 px margins: a field as wide as the panel would push it 4 px sideways)
        field, wide = ("calc(100% - 6px)", "calc(100% - 6px)") if compact else ("480px", "640px")
        self._pick = W.Dropdown(description="entry", options=[("(new entry)", "")], value="",
                                layout=W.Layout(width=field))
        self._title = W.Text(description="title", layout=W.Layout(width=field))
        self._category = W.Combobox(description="category", value="note", options=self.controller.categories(),
                                    ensure_option=False, layout=W.Layout(width=field))
        self._content = W.Textarea(description="content",
                                   layout=W.Layout(width=wide, height="70px" if compact else "90px"))
        self._add_btn = W.Button(description="Add entry", icon="plus", layout=_AUTO)
        self._save_btn = W.Button(description="Save changes", icon="save", button_style="primary",
                                  layout=_AUTO)
        self._remove_btn = W.Button(description="Remove entry", icon="trash", button_style="danger",
                                    layout=_AUTO)
        self._status = _HTML()
        self._progress = _progress_widget()
        self._error = _error_widget()
        # the pager: part of the editor only once there is more than one page (or a filter is set)
        self._previous_btn = W.Button(description="Previous page", icon="chevron-left", layout=_AUTO)
        self._next_page_btn = W.Button(description="Next page", icon="chevron-right", layout=_AUTO)
        self._filter = W.Text(placeholder="filter: title, category, content or id", continuous_update=False,
                              layout=W.Layout(width="300px", flex="0 1 auto", min_width="140px"))
        self._pager = W.HBox([self._previous_btn, self._next_page_btn, self._filter])
        self._pager.add_class("pcnb-knowledge-pager")
        self._form = [self._pick, self._title, self._category, self._content,
                      W.HBox([self._add_btn, self._save_btn, self._remove_btn]), self._status, self._error]
        self._shown: dict[str, dict[str, Any]] = {}  # rows in the picker, by id
        self._last_page = _html.knowledge_page([])
        self._syncing = False
        # compact: five or more entries in view (a row is ~24 px), the rest scroll
        # (scrolled up and down only: the table wraps to the panel's width)
        self._list: W.Widget = (W.Box([self._table], layout=W.Layout(max_height=f"{KNOWLEDGE_ROWS_SHOWN * 24 + 44}px",
                                                                    overflow="hidden auto"))
                                if compact else self._table)
        super().__init__([self._list, *self._form])
        self.add_class("pcnb-knowledge-editor")
        self._add_btn.on_click(self._clicked(self.add))
        self._save_btn.on_click(self._clicked(self.edit))
        self._remove_btn.on_click(self._clicked(self.remove))
        self._previous_btn.on_click(self._clicked(self.previous_page))
        self._next_page_btn.on_click(self._clicked(self.next_page))
        self._pick.observe(self._on_pick, names=["value"])
        self._filter.observe(self._on_filter, names=["value"])
        self.controller.subscribe(self._on_change)
        self._refresh()

    @property
    def session(self) -> Session:
        return cast("Session", self.controller.session)

    def _controls(self) -> list[W.Widget]:
        return [self._add_btn, self._save_btn, self._remove_btn, self._pick, self._previous_btn,
                self._next_page_btn, self._filter]

    def _sync_controls(self) -> None:
        super()._sync_controls()
        self._previous_btn.disabled = not self._last_page.has_previous
        self._next_page_btn.disabled = not self._last_page.has_next

    # -- the buttons' kernel-side twins ----------------------------------------------------
    def select(self, entry: str) -> None:
        """Pick an entry (id, short id, key or title) into the edit fields, turning the list to its page;
        ``""`` for a new one."""
        if not entry:
            self._pick.value = ""
            return
        self._refresh(select=self._action(self.controller.resolve, entry))

    def show_page(self, page: int) -> _html.KnowledgePage:
        """Turn the list to ``page`` (from 0; clamped to the pages there are). The picked entry stays picked."""
        return cast("_html.KnowledgePage", self._action(self._refresh, page=page))

    def next_page(self) -> _html.KnowledgePage:
        """Click "Next page"."""
        return self.show_page(self.page + 1)

    def previous_page(self) -> _html.KnowledgePage:
        """Click "Previous page"."""
        return self.show_page(self.page - 1)

    def search(self, text: str) -> _html.KnowledgePage:
        """Type ``text`` in the filter box: list the entries whose title, category, content, short id or key
        contain it (case-insensitive), from their first page; ``""`` lists every entry again."""
        self._filter.value = text  # _on_filter refreshes the list
        return self._last_page

    def add(self, title: str | None = None, content: str | None = None, *,
            category: str | None = None) -> str:
        """Click "Add entry" (default: the title, category and content fields)."""
        with self._working("adding the entry"):
            entry_id = self._action(
                self.controller.add, self._title.value if title is None else title,
                self._content.value if content is None else content,
                category=self._category.value if category is None else category,
            )
        self._refresh(select=entry_id)
        return cast("str", entry_id)

    def edit(self, entry: str | None = None, *, title: str | None = None, content: str | None = None,
             category: str | None = None) -> bool:
        """Click "Save changes": write the fields (or the given values) as a new version of ``entry``.

        ``entry`` defaults to the picked one. With explicit values, fields left ``None`` keep their
        current value; from the form, all three fields are saved.
        """
        if entry is None:
            entry = self._pick.value
            if not entry:  # "(new entry)" is picked: the status line says what to do
                self._action(self.controller.edit, "")
            if title is None and content is None and category is None:
                title, content, category = self._title.value, self._content.value, self._category.value
        with self._working("saving the entry"):
            changed = self._action(self.controller.edit, entry, title=title, content=content,
                                   category=category)
        self._refresh(select=self.controller.resolve(entry))
        return cast("bool", changed)

    def remove(self, entry: str | None = None) -> None:
        """Click "Remove entry" (default: the picked one)."""
        if entry is None:
            entry = self._pick.value
            if not entry:  # "(new entry)" is picked: the status line says what to do
                self._action(self.controller.remove, "")
        with self._working("removing the entry"):
            self._action(self.controller.remove, entry)
        self._refresh(select="")

    # -- rendering ---------------------------------------------------------------------------
    def _on_pick(self, change: dict[str, Any]) -> None:
        entry_id = change["new"]
        row = self._shown.get(entry_id) if entry_id else None
        with _batch(self, self._title, self._category, self._content, self._status):
            self.selected = entry_id or ""
            if row is None:
                self._title.value, self._category.value, self._content.value = "", "note", ""
            else:
                self._title.value, self._category.value, self._content.value = (
                    row["title"], row["category"], row["content"])
            self._status.value = _html.status_html(self.controller.status)
            hidden = [] if row is None else [name for name in ("title", "category", "content")
                                             if _hides_characters(row[name])]
            if row is not None and hidden:  # the fields hold the raw text: a bidi override shows reversed there
                self._status.value += _html.status_html(
                    f"{row['short_id']}: its {' and '.join(hidden)} contain invisible characters (bidi "
                    "controls, zero-width, control characters), shown as markers in the list above; the fields "
                    f"hold the raw text. Title: {_html.visible(row['title'])}", kind="warn")

    def _on_change(self, what: str) -> None:
        if what != "knowledge" and not self.controller.pending:
            self.controller.status = ""  # the edit it reported has applied: "updated …" would now mislead
        self._refresh()  # the same page, the same entry picked (unless it was removed)

    def _on_filter(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        self._guarded(lambda: self._action(self._refresh, page=0))

    def _refresh(self, *, select: str | None = None, page: int | None = None) -> _html.KnowledgePage:
        """Show a page of the list: ``page``, or with ``select`` (an entry id) the page holding that entry
        (the filter is cleared when it hides the entry), else the page on show."""
        rows = self.controller.rows()
        target = select if select is not None else self._pick.value
        if target and not any(r["id"] == target for r in rows):
            target = ""  # removed meanwhile (a scenario event, another editor)
        query = self._filter.value
        view = _html.knowledge_page(rows, page=self.page if page is None else page, query=query,
                                    containing=target if select else None)
        if select and target and query and not any(r["id"] == target for r in view.rows):
            query = ""  # the filter hides the entry asked for: show it anyway
            view = _html.knowledge_page(rows, query=query, containing=target)
        shown = {r["id"]: r for r in view.rows}
        picked = next((r for r in rows if r["id"] == target), None) if target and target not in shown else None
        options = [("(new entry)", "")] + [
            (f"{r['short_id']} · {_html.visible(r['title'])} (v{r['version']})", r["id"])
            for r in ([picked] if picked is not None else []) + list(view.rows)]
        self._shown = {**({picked["id"]: picked} if picked is not None else {}), **shown}
        paged = view.total > view.page_size or bool(view.query)
        with _batch(self, self._table, self._pick, self._status, self._previous_btn, self._next_page_btn,
                    self._filter):
            self._table.value = _html.knowledge_table_html(view, pending=self.controller.pending)
            categories = self.controller.categories()
            if tuple(self._category.options) != categories:
                self._category.options = categories
            if list(self._pick.options) != options:
                self._pick.options = options
            self._status.value = _html.status_html(self.controller.status)
            self._previous_btn.disabled = not view.has_previous
            self._next_page_btn.disabled = not view.has_next
            if self._filter.value != query:
                self._syncing = True
                try:
                    self._filter.value = query
                finally:
                    self._syncing = False
            self.entries = view.total
            self.page = view.page
            self.query = view.query
            parts: tuple[W.Widget, ...] = ((self._list, self._pager, *self._form) if paged
                                           else (self._list, *self._form))
            if tuple(self.children) != parts:  # type: ignore[has-type]  # ipywidgets' trait, untyped
                self.children = parts
        self._last_page = view
        if self._pick.value != target:
            self._pick.value = target
        else:
            self._on_pick({"new": target})
        return view

    def snapshot_html(self) -> str:
        return _html.snapshot_html("KnowledgeEditor", self._table.value + self._status.value)

    def __repr__(self) -> str:
        tail = f", page='{self.page + 1} of {self._last_page.pages}'" if self._last_page.pages > 1 else ""
        return f"KnowledgeEditor(session={self.controller.session.id!r}, entries={self.entries}{tail})"


def _hides_characters(text: str) -> bool:
    """True when ``text`` has characters a text field shows misleadingly or not at all (bidi controls,
    zero-width, control characters; newlines and tabs are fine)."""
    return not text.isprintable() and any(not ch.isprintable() and ch not in "\n\t" for ch in text)


class Compare(_View, W.VBox):  # type: ignore[misc]  # ipywidgets ships no type information
    """One scenario under several strategies in lockstep: a table and a chart of all strategies.

    Buttons and their kernel-side twins: "Next turn (all)" → :meth:`next`, "Run to end" → :meth:`run`
    (with a progress bar). Once the scenario is finished both buttons are disabled.

    Args:
        scenario: a :class:`~promptcache_nb.Scenario` or YAML path.
        strategies: names (default ``pc.STRATEGIES``). cache: the cache model for every session.
        lab: where sessions are stored (default: a private in-memory Lab).
    """

    played = T.Int(0, help="scenario turns every strategy has played")

    def __init__(self, scenario: Scenario | str | Path, *,
                 strategies: list[str] | tuple[str, ...] | None = None, cache: str = "anthropic",
                 lab: Lab | None = None) -> None:
        self.controller = CompareController(scenario, strategies=strategies, cache=cache, lab=lab)
        self._next_btn = W.Button(description="Next turn (all)", button_style="primary", icon="step-forward",
                                  layout=_AUTO)
        self._run_btn = W.Button(description="Run to end", icon="fast-forward", layout=_AUTO)
        self._status = _HTML()
        self._progress = _progress_widget()
        self._header = _HTML()
        self._error = _error_widget()
        self._table = _HTML()
        self._image = _image()
        super().__init__([W.HBox([self._next_btn, self._run_btn]), self._status, self._progress, self._header,
                          self._error, self._table, self._image])
        self.add_class("pcnb-compare-widget")
        self._next_btn.on_click(self._clicked(self.next))
        self._run_btn.on_click(self._clicked(self.run))
        self._render()
        self._sync_controls()

    @property
    def status(self) -> str:
        """What the last click did (one line)."""
        return cast("str", self.controller.status)

    def _controls(self) -> list[W.Widget]:
        return [self._next_btn, self._run_btn]

    def _sync_controls(self) -> None:
        done = self.controller.finished
        with _batch(self._next_btn, self._run_btn):
            self._next_btn.disabled = done
            self._run_btn.disabled = done

    def next(self) -> dict[str, Turn]:
        """Click "Next turn (all)"."""
        with self._working(f"playing the next scenario turn under {len(self.controller.strategies)} strategies"):
            out = self._action(self.controller.next)
            self._render()
        self._show_status(self.controller.status)
        return cast("dict[str, Turn]", out)

    def run(self, turns: int | None = None, *, progress: bool = False) -> pd.DataFrame:
        """Click "Run to end" (or play ``turns`` more), with a progress bar; returns :meth:`summary`.

        ``progress=True`` also shows a progress bar in the cell (for a call made before the widget is
        displayed, as in ``cmp.run(progress=True); cmp``).
        """
        c = self.controller
        n = c.remaining if turns is None else max(0, min(turns, c.remaining))
        total = n * len(c.strategies)
        with (self._working(f"playing {n} scenario turns under {len(c.strategies)} strategies",
                            total=max(1, total)) as bar,
              _cell_progress(bar, enabled=progress, total=total,
                             desc=f"{c.scenario.name}: scenario turns × {len(c.strategies)} strategies") as both):
            df = self._action(c.run, turns, progress=both)
            self._render()
        self._show_status(c.status)
        return df

    def summary(self) -> pd.DataFrame:
        """compare_df of the sessions (efficiency, writes, cost per strategy)."""
        return self.controller.summary()

    def figure(self) -> Figure:
        """The chart as a matplotlib Figure (``plot_compare(summary)``)."""
        return plot_compare(self.summary(), label=_compare_label(self.controller))

    def _render(self) -> None:
        c = self.controller
        sc = c.scenario
        played = c.position
        summary = c.summary()
        state = ("finished: every strategy played the whole scenario" if c.finished
                 else "press Next turn (all) or Run to end")
        header = (f'<div style="font-size:13px"><b>{_html.esc(sc.name)}</b> '
                  f'under {len(c.strategies)} strategies '
                  f'(cache model <code>{_html.esc(c.cache)}</code>): <span data-field="played">{played} of '
                  f"{len(sc.turns)}</span> scenario turns played · {state} · token figures "
                  f'<span data-field="usage-label">{_html.esc(_compare_label(c))}</span></div>')
        png = _png(plot_compare(summary, label=_compare_label(c))) if played else b""
        with _batch(self, self._header, self._table, self._image):
            self._header.value = header
            self._table.value = _html.summary_table_html(summary.to_dict("records"))
            _set_image(self._image, png)
            self.played = played

    def snapshot_html(self) -> str:
        return _html.snapshot_html("Compare", self._status.value + self._header.value + self._table.value
                                   + _html.png_html(bytes(self._image.value or b""), alt="tokens per strategy"))

    def __repr__(self) -> str:
        c = self.controller
        return (f"Compare(scenario={c.scenario.name!r}, strategies={len(c.strategies)}, cache={c.cache!r}, "
                f"played='{self.played} of {len(c.scenario.turns)}')")


def _compare_label(c: CompareController) -> str:
    """simulated (estimated tokens) or measured: what the Compare's figures are."""
    for s in c.sessions:
        last = s.last_turn
        if last is not None:
            return last.usage.label
    return "simulated (estimated tokens)"  # Compare replays through the simulator unless a lab says otherwise


class Monitor(W.VBox):  # type: ignore[misc]  # ipywidgets ships no type information
    """A session's requests as they arrive: rows, running read %, $ saved, the latest request's diff and
    observation. Fed by the capture (``lab.capture(client, session=s)`` or the session a capture made): each
    stored call updates it from the thread that finished the call, so the browser never polls the store. Given an
    :class:`~promptcache_nb.live.OtlpReceiver`, it follows every request the receiver stores, in any session
    (measured usage only: agents' telemetry carries no body to diff); given the URL of a receiver running in another
    process (``promptcache-nb otel STORE`` prints it), it follows that one.

    Example:
        >>> with lab.capture(client) as cap:  # doctest: +SKIP
        ...     monitor = pc.widgets.Monitor(cap.session); display(monitor)
        ...     client.messages.create(...)
    """

    requests = T.Int(0, help="requests shown so far").tag(sync=True)

    def __init__(self, source: Session | OtlpReceiver | OtlpFollower | str, *, follow: bool = True) -> None:
        self.controller = MonitorController(source, follow=follow)
        self._html = _HTML(self.controller.html())
        super().__init__([self._html])
        self.add_class("pcnb-monitor")
        self.requests = self.controller.n_requests
        self.controller.subscribe(self._on_change)

    @property
    def session(self) -> Session | None:
        """The session it follows (None when it follows an OTLP receiver)."""
        return self.controller.session

    def _on_change(self, what: str) -> None:
        html = self.controller.html()
        with _batch(self, self._html):
            self._html.value = html
            self.requests = self.controller.n_requests

    def close(self) -> None:
        """Stop following the session and close the widget."""
        self.controller.close()
        super().close()

    def snapshot_html(self) -> str:
        return _html.snapshot_html("Monitor", self._html.value)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        bundle = W.Widget._repr_mimebundle_(self, **kwargs)
        if bundle is not None:
            bundle["text/html"] = self.snapshot_html()
        return cast("dict[str, Any] | None", bundle)

    def __repr__(self) -> str:
        return f"Monitor({self.controller.followed_repr}, requests={self.requests})"


class WhatIf(_View, W.VBox):  # type: ignore[misc]  # ipywidgets ships no type information
    """Tick fixes and see what they would have changed on a session's own requests.

    One checkbox per fix the session's data supports (the others are listed with why not); the header shows
    the measured cost, the simulated original and the counterfactual (``simulated (counterfactual)``), then the
    per-request costs and read %, the first changed request's body diff (original against counterfactual,
    side by side), and on "Rank every fix" the findings of :func:`promptcache_nb.advise`. Kernel-side twins:
    ``whatif.tick(fix)``, ``whatif.untick(fix)``, ``whatif.rank()``; the controller is ``whatif.controller``.

    Example:
        >>> pc.widgets.WhatIf(s)  # doctest: +SKIP
    """

    fixes = T.List(T.Unicode(), help="the fixes ticked now")

    def __init__(self, session: Session) -> None:

        self.controller = WhatIfController(session)
        c = self.controller
        self._boxes = {f: W.Checkbox(value=False, description=f, indent=False, layout=_AUTO) for f in c.available}
        self._rank = W.Button(description="Rank every fix", layout=_AUTO)
        self._header, self._table, self._diff, self._findings = _HTML(), _HTML(), _HTML(), _HTML()
        self._missing = _HTML(_html.text_html("; ".join(f"{f}: not possible ({why})"
                                                         for f, why in c.not_possible.items())))
        self._error, self._status, self._progress = _error_widget(), _HTML(), _progress_widget()
        table = W.Box([self._table], layout=W.Layout(max_height="320px", overflow="auto"))
        super().__init__([self._header, W.HBox([*self._boxes.values(), self._rank]), self._missing, self._status,
                          self._progress, self._error, table, self._diff, self._findings])
        self.add_class("pcnb-whatif")
        for fix, box in self._boxes.items():
            box.observe(self._on_box(fix), names=["value"])
        self._rank.on_click(self._clicked(self.rank))
        self._refresh()

    def _controls(self) -> list[W.Widget]:
        return [*self._boxes.values(), self._rank]

    def _on_box(self, fix: str) -> Callable[[dict[str, Any]], None]:
        def handler(change: dict[str, Any]) -> None:
            if change["new"] != (fix in self.controller.fixes):
                self._guarded(self._set, fix, bool(change["new"]))

        return handler

    def tick(self, fix: str) -> None:
        """What ticking ``fix``'s box does."""
        self._set(fix, True)

    def untick(self, fix: str) -> None:
        """What unticking ``fix``'s box does."""
        self._set(fix, False)

    def _set(self, fix: str, on: bool) -> None:
        if fix not in self._boxes:
            why = self.controller.not_possible.get(fix, f"unknown fix; known: {', '.join(self._boxes)}")
            raise ValueError(f"{fix}: {why}")
        try:
            with self._working(f"replaying with {fix} {'on' if on else 'off'}"):
                self._action(self.controller.toggle, fix, on)
        finally:
            if not self._lab_closed():
                self._refresh()  # the boxes show the fixes in effect, also after a failed toggle

    def rank(self) -> None:
        """What "Rank every fix" does: the findings of ``pc.advise(session)``."""
        with self._working("ranking every fix"):
            self._action(self.controller.findings)
        self._findings.value = "<div><b>every fix, ranked</b></div>" + self.controller.findings_html()

    def _refresh(self) -> None:
        c = self.controller
        with _batch(self, self._header, self._table, self._diff, *self._boxes.values()):
            for fix, box in self._boxes.items():
                box.value = fix in c.fixes
            self._header.value = c.header_html()
            self._table.value = c.table_html()
            self._diff.value = c.diff_html()
            self.fixes = list(c.fixes)
        self._show_status(c.status)

    def snapshot_html(self) -> str:
        return _html.snapshot_html("WhatIf", self._header.value + self._status.value + self._table.value
                                   + self._diff.value + self._findings.value)

    def __repr__(self) -> str:
        return f"WhatIf(session={self.controller.session.id!r}, fixes={list(self.controller.fixes)})"
