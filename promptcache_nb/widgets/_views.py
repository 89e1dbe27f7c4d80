"""ipywidgets 8 views over the controllers in :mod:`._controllers`.

Each view builds stock widgets (no JavaScript of our own), forwards clicks to a kernel-side method with
the same effect (``stepper.next()``, ``editor.edit(...)``), renders HTML produced by :mod:`._html`, and
batches each refresh with ``hold_sync()``. A failing click shows the error in the widget itself (an
``HTML`` box rather than an ``Output`` widget: output captured in an ``Output`` leaks into the cell's
stdout under nbval and nbclient, see notebook_practice.md §1.6).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import pandas as pd
import traitlets as T

from ..plots import plot_compare, plot_savings
from ..scenario import Scenario
from . import _html
from ._controllers import CompareController, KnowledgeController, StepperController, TurnView

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ..request import PreparedRequest
    from ..session import Lab, Session, Turn

PNG_DPI = 90
_AUTO = W.Layout(width="max-content")  # full button labels (descriptions truncate otherwise)


@contextmanager
def _batch(*widgets: W.Widget) -> Iterator[None]:
    """Hold every widget's state messages and send one update per widget on exit."""
    with ExitStack() as stack:
        for w in widgets:
            stack.enter_context(w.hold_sync())
        yield


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PNG_DPI)
    return buf.getvalue()


class _ErrorBox:
    """Mixin: run an action, show its exception in ``self._error`` and re-raise it."""

    _error: W.HTML

    def _action(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self._error.value = _html.error_html(exc)
            self._error.layout.display = None
            raise
        if self._error.value:
            self._error.value = ""
            self._error.layout.display = "none"
        return result

    def _clicked(self, method: Callable[[], Any]) -> Callable[[Any], None]:
        def handler(_button: Any) -> None:
            try:
                method()
            except Exception:  # noqa: BLE001 - already shown in the widget's error box by _action
                pass

        return handler


def _error_widget() -> W.HTML:
    return W.HTML("", layout=W.Layout(display="none"))


class DiffView(W.VBox):
    """The escaped side-by-side prefix diff of two requests, and the segment map of the second.

    Args:
        diff: a :class:`~promptcache_nb.PrefixDiff` (``turn.diff``) or None; its path, offsets and
            shared-prefix figures head the view when present.
        previous, current: the two :class:`~promptcache_nb.PreparedRequest` values (``turn.prepared``).
        states: ``turn.segment_states`` (read / write / uncached per segment of ``current``).

    Example:
        >>> pc.widgets.DiffView.for_turns(s.turn(2), previous=s.turn(1))  # doctest: +SKIP
    """

    path = T.Unicode(None, allow_none=True,
                     help="where the requests first differ (None: pure append or no diff)")

    def __init__(self, diff: Any = None, *, previous: PreparedRequest | None = None,
                 current: PreparedRequest | None = None, states: tuple[str, ...] | list[str] = ()) -> None:
        self._map = W.HTML()
        self._diff = W.HTML()
        super().__init__([self._map, self._diff])
        self.update(diff, previous=previous, current=current, states=states)

    @classmethod
    def for_turns(cls, turn: Turn, *, previous: Turn | None = None) -> DiffView:
        """The view of ``turn`` against ``previous`` (both from ``session.turn(i)`` or ``step()``)."""
        return cls(turn.diff, previous=None if previous is None else previous.prepared, current=turn.prepared,
                   states=turn.segment_states)

    def update(self, diff: Any = None, *, previous: PreparedRequest | None = None,
               current: PreparedRequest | None = None, states: tuple[str, ...] | list[str] = ()) -> None:
        previous = previous if previous is not None else getattr(diff, "previous", None)
        current = current if current is not None else getattr(diff, "current", None)
        if current is None and diff is not None and hasattr(diff, "_repr_html_"):
            body = diff._repr_html_()  # our own PrefixDiff renders escaped HTML
            seg_map = ""
        else:
            body = _html.side_by_side_html(previous, current, diff=diff)
            seg_map = _html.segment_map_html(current.segments, tuple(states)) if current is not None else ""
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
            self.update(view.diff, previous=view.previous, current=view.current, states=view.segment_states)

    @property
    def html(self) -> str:
        """The rendered segment map and diff (what the browser shows)."""
        return self._map.value + self._diff.value

    def __repr__(self) -> str:
        return f"DiffView(path={self.path!r})"


class SavingsChart(W.VBox):
    """Per-request stacked bars of cache read / write / uncached, the ideal line and cumulative $ saved.

    Args:
        source: a :class:`~promptcache_nb.Session` (re-read on :meth:`refresh`) or a ``turns()`` frame.

    The chart itself is :func:`promptcache_nb.plots.plot_savings`; :meth:`figure` returns it for saving.
    """

    requests = T.Int(0, help="rows in the frame on show")

    def __init__(self, source: Session | pd.DataFrame) -> None:
        self._source = source
        self._image = W.Image(format="png", layout=W.Layout(max_width="100%"))
        self._caption = W.HTML()
        super().__init__([self._image, self._caption])
        self._df = pd.DataFrame()
        self.refresh()

    @property
    def df(self) -> pd.DataFrame:
        return self._df

    def _frame(self) -> pd.DataFrame:
        src = self._source
        if isinstance(src, pd.DataFrame):
            return src
        from ._controllers import live_session

        self._source = live_session(src)
        return self._source.turns()

    def refresh(self, source: Session | pd.DataFrame | None = None) -> None:
        """Redraw from ``source`` (or the session / frame given at construction)."""
        if source is not None:
            self._source = source
        df = self._frame()
        self._df = df
        if df.empty:
            with _batch(self, self._image, self._caption):
                self._image.value = b""
                self._caption.value = "<i>no requests yet</i>"
                self.requests = 0
            return
        png = _png(self.figure())
        saved = float((df["cost_no_cache_usd"] - df["cost_usd"]).sum())
        with _batch(self, self._image, self._caption):
            self._image.value = png
            self._caption.value = (
                f'<div style="font-size:12px">{len(df)} requests · saved vs no caching: '
                f'<b data-field="saved">{_html.fmt_usd(saved)}</b> · tokens '
                f"{_html.esc(df['usage_source'].iloc[-1] if 'usage_source' in df else '')}</div>"
            )
            self.requests = len(df)

    def figure(self) -> Figure:
        """The chart as a matplotlib Figure (``plot_savings(df)``)."""
        return plot_savings(self._df)

    def __repr__(self) -> str:
        return f"SavingsChart(requests={self.requests})"


class Stepper(_ErrorBox, W.VBox):
    """Step a session turn by turn and see what each request did to the cache.

    Buttons and their kernel-side twins: "Next turn" → :meth:`next` (the next scenario turn, or the
    typed user text and reply), "Restart" → :meth:`restart` (drop in-memory state, resume from the
    store), the turn slider → :meth:`show`.

    Args:
        session: a :class:`~promptcache_nb.Session`.
        scenario: continue this scenario (object or YAML path) from the session's position.

    Example:
        >>> s = lab.replay("data/scenarios/tiny.yaml", stop_after=0)  # doctest: +SKIP
        >>> stepper = pc.widgets.Stepper(s, "data/scenarios/tiny.yaml")  # doctest: +SKIP
        >>> stepper.next()  # doctest: +SKIP
    """

    turn = T.Int(-1, help="index of the request on show (-1: none yet)")
    n_turns = T.Int(0, help="requests stored in the session")

    def __init__(self, session: Session, scenario: Scenario | str | Path | None = None) -> None:
        self.controller = StepperController(session, scenario)
        self._next_btn = W.Button(description="Next turn", button_style="primary", icon="step-forward",
                                  layout=_AUTO,
                                  tooltip="play the next scenario turn, or send the typed message")
        self._restart_btn = W.Button(description="Restart", icon="refresh", layout=_AUTO,
                                     tooltip="drop in-memory state and resume the session from the store")
        self._user = W.Text(placeholder="user message (empty: next scenario turn)",
                            layout=W.Layout(width="320px"))
        self._reply = W.Text(placeholder="assistant reply (optional)", layout=W.Layout(width="220px"))
        self._slider = W.IntSlider(value=0, min=0, max=0, description="look back", continuous_update=False,
                                   disabled=True)
        self._header = W.HTML()
        self._error = _error_widget()
        self._usage = W.HTML(layout=W.Layout(width="38%"))
        self._observation = W.HTML(layout=W.Layout(width="62%"))
        self.diff_view = DiffView()
        self.chart = SavingsChart(self.controller.turns())
        self._syncing = False
        super().__init__([
            W.HBox([self._next_btn, self._restart_btn, self._user, self._reply]),
            self._slider, self._header, self._error,
            W.HBox([self._usage, self._observation]),
            self.diff_view, self.chart,
        ])
        self.add_class("pcnb-stepper")
        self._next_btn.on_click(self._clicked(self.next))
        self._restart_btn.on_click(self._clicked(self.restart))
        self._slider.observe(self._on_slider, names=["value"])
        self.controller.subscribe(self._on_change)
        self._render(chart=False)

    @property
    def session(self) -> Session:
        """The live session (a new object after :meth:`restart`)."""
        return self.controller.session

    # -- the buttons' kernel-side twins ----------------------------------------------------
    def next(self, user: str | None = None, reply: str | None = None) -> Turn:
        """Click "Next turn": ``user`` (default: the text box) or else the next scenario turn."""
        if user is None and self._user.value.strip():
            user, reply = self._user.value, (reply if reply is not None else (self._reply.value or None))
        t = self._action(self.controller.next, user, reply)
        with _batch(self._user, self._reply):
            self._user.value = ""
            self._reply.value = ""
        self._render()
        return t

    def restart(self) -> Session:
        """Click "Restart": resume from the store alone; returns the new session object."""
        s = self._action(self.controller.restart)
        self._render()
        return s

    def show(self, index: int) -> TurnView:
        """Move the slider to stored request ``index``."""
        v = self._action(self.controller.show, index)
        self._render(chart=False)
        return v

    def editor(self) -> KnowledgeEditor:
        """A :class:`KnowledgeEditor` on this stepper's session (follows restarts)."""
        return KnowledgeEditor(self)

    # -- rendering ---------------------------------------------------------------------------
    def _on_slider(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        try:
            self.show(int(change["new"]))
        except Exception:  # noqa: BLE001 - shown in the error box by _action
            pass

    def _on_change(self, what: str) -> None:
        if what == "knowledge":  # an editor changed knowledge: show it as pending for the next turn
            self._header.value = self.controller.header_html()

    def _render(self, *, chart: bool = True) -> None:
        c = self.controller
        v = c.view()
        n = c.n_turns
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
            self.turn = -1 if v is None else v.index
            self.n_turns = n
        self.diff_view.show_view(v)
        if chart:
            self.chart.refresh(c.turns())

    def __repr__(self) -> str:
        sc = self.controller.scenario
        tail = "" if sc is None else f", scenario={sc.name!r}"
        return (f"Stepper(session={self.controller.session.id!r}, turn={self.turn}, "
                f"n_turns={self.n_turns}{tail})")


class KnowledgeEditor(_ErrorBox, W.VBox):
    """List, add, edit and remove knowledge entries; each change applies before the next turn.

    Buttons and their kernel-side twins: "Add entry" → :meth:`add`, "Save changes" → :meth:`edit`,
    "Remove entry" → :meth:`remove`; picking an entry → :meth:`select`.

    Args:
        source: a :class:`~promptcache_nb.Session`, or a :class:`Stepper` — then the stepper shows the
            change as pending and, after "Next turn", what the strategy did with it.
    """

    entries = T.Int(0, help="current (not removed) entries")
    selected = T.Unicode("", help="id of the entry in the edit fields ('' = a new entry)")

    def __init__(self, source: Session | Stepper | StepperController) -> None:
        self.controller = KnowledgeController(source)
        self._table = W.HTML()
        self._pick = W.Dropdown(description="entry", options=[("(new entry)", "")], value="",
                                layout=W.Layout(width="480px"))
        self._title = W.Text(description="title", layout=W.Layout(width="480px"))
        self._category = W.Text(description="category", value="note", layout=W.Layout(width="480px"))
        self._content = W.Textarea(description="content", layout=W.Layout(width="640px", height="90px"))
        self._add_btn = W.Button(description="Add entry", icon="plus", layout=_AUTO)
        self._save_btn = W.Button(description="Save changes", icon="save", button_style="primary",
                                  layout=_AUTO)
        self._remove_btn = W.Button(description="Remove entry", icon="trash", button_style="danger",
                                    layout=_AUTO)
        self._status = W.HTML()
        self._error = _error_widget()
        super().__init__([
            self._table, self._pick, self._title, self._category, self._content,
            W.HBox([self._add_btn, self._save_btn, self._remove_btn]), self._status, self._error,
        ])
        self.add_class("pcnb-knowledge-editor")
        self._add_btn.on_click(self._clicked(self.add))
        self._save_btn.on_click(self._clicked(self.edit))
        self._remove_btn.on_click(self._clicked(self.remove))
        self._pick.observe(self._on_pick, names=["value"])
        self.controller.subscribe(self._on_change)
        self._refresh()

    @property
    def session(self) -> Session:
        return self.controller.session

    # -- the buttons' kernel-side twins ----------------------------------------------------
    def select(self, entry: str) -> None:
        """Pick an entry (id, short id, key or title) into the edit fields; ``""`` for a new one."""
        self._pick.value = self._action(self.controller.resolve, entry) if entry else ""

    def add(self, title: str | None = None, content: str | None = None, *,
            category: str | None = None) -> str:
        """Click "Add entry" (default: the title, category and content fields)."""
        entry_id = self._action(
            self.controller.add, self._title.value if title is None else title,
            self._content.value if content is None else content,
            category=self._category.value if category is None else category,
        )
        self._refresh(select=entry_id)
        return entry_id

    def edit(self, entry: str | None = None, *, title: str | None = None, content: str | None = None,
             category: str | None = None) -> bool:
        """Click "Save changes": write the fields (or the given values) as a new version of ``entry``.

        ``entry`` defaults to the picked one. With explicit values, fields left ``None`` keep their
        current value; from the form, all three fields are saved.
        """
        if entry is None:
            if not self._pick.value:
                self._action(_fail, "pick an entry to edit first (or use Add entry for a new one)")
            entry = self._pick.value
            if title is None and content is None and category is None:
                title, content, category = self._title.value, self._content.value, self._category.value
        changed = self._action(self.controller.edit, entry, title=title, content=content, category=category)
        self._refresh(select=self.controller.resolve(entry))
        return changed

    def remove(self, entry: str | None = None) -> None:
        """Click "Remove entry" (default: the picked one)."""
        if entry is None:
            if not self._pick.value:
                self._action(_fail, "pick an entry to remove first")
            entry = self._pick.value
        self._action(self.controller.remove, entry)
        self._refresh(select="")

    # -- rendering ---------------------------------------------------------------------------
    def _on_pick(self, change: dict[str, Any]) -> None:
        entry_id = change["new"]
        row = next((r for r in self.controller.rows() if r["id"] == entry_id), None)
        with _batch(self, self._title, self._category, self._content):
            self.selected = entry_id or ""
            if row is None:
                self._title.value, self._category.value, self._content.value = "", "note", ""
            else:
                self._title.value, self._category.value, self._content.value = (
                    row["title"], row["category"], row["content"])

    def _on_change(self, what: str) -> None:
        self._refresh(select=self._pick.value)

    def _refresh(self, *, select: str | None = None) -> None:
        rows = self.controller.rows()
        options = [("(new entry)", "")] + [
            (f"{r['short_id']} · {r['title']} (v{r['version']})", r["id"]) for r in rows]
        ids = {r["id"] for r in rows}
        target = select if select is not None else self._pick.value
        target = target if target in ids else ""
        with _batch(self, self._table, self._pick, self._status):
            self._table.value = self.controller.table_html()
            if list(self._pick.options) != options:
                self._pick.options = options
            self._status.value = (f'<div style="font-size:12px">{_html.esc(self.controller.message)}</div>'
                                  if self.controller.message else "")
            self.entries = len(rows)
        if self._pick.value != target:
            self._pick.value = target
        else:
            self._on_pick({"new": target})

    def __repr__(self) -> str:
        return f"KnowledgeEditor(session={self.controller.session.id!r}, entries={self.entries})"


def _fail(message: str) -> None:
    from ..errors import KnowledgeError

    raise KnowledgeError(message)


class Compare(_ErrorBox, W.VBox):
    """One scenario under several strategies in lockstep: a table and a chart per strategy.

    Buttons and their kernel-side twins: "Next turn (all)" → :meth:`next`, "Run to end" → :meth:`run`.

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
        self._header = W.HTML()
        self._error = _error_widget()
        self._table = W.HTML()
        self._image = W.Image(format="png", layout=W.Layout(max_width="100%"))
        super().__init__([W.HBox([self._next_btn, self._run_btn]), self._header, self._error, self._table,
                          self._image])
        self.add_class("pcnb-compare")
        self._next_btn.on_click(self._clicked(self.next))
        self._run_btn.on_click(self._clicked(self.run))
        self._render()

    def next(self) -> dict[str, Turn]:
        """Click "Next turn (all)"."""
        out = self._action(self.controller.next)
        self._render()
        return out

    def run(self, turns: int | None = None) -> pd.DataFrame:
        """Click "Run to end" (or play ``turns`` more); returns :meth:`summary`."""
        df = self._action(self.controller.run, turns)
        self._render()
        return df

    def summary(self) -> pd.DataFrame:
        """compare_df of the sessions (efficiency, writes, cost per strategy)."""
        return self.controller.summary()

    def figure(self) -> Figure:
        """The chart as a matplotlib Figure (``plot_compare(summary)``)."""
        return plot_compare(self.summary())

    def _render(self) -> None:
        c = self.controller
        sc = c.scenario
        played = c.position
        summary = c.summary()
        header = (f'<div style="font-size:13px"><b>{_html.esc(sc.name)}</b> '
                  f'under {len(c.strategies)} strategies '
                  f'(cache model <code>{_html.esc(c.cache)}</code>): <span data-field="played">{played}'
                  f"/{len(sc.turns)}</span> scenario turns played</div>")
        png = _png(plot_compare(summary)) if played else b""
        with _batch(self, self._header, self._table, self._image):
            self._header.value = header
            self._table.value = _html.summary_table_html(summary.to_dict("records"))
            self._image.value = png
            self.played = played

    def __repr__(self) -> str:
        c = self.controller
        return (f"Compare(scenario={c.scenario.name!r}, strategies={len(c.strategies)}, cache={c.cache!r}, "
                f"played={self.played})")
