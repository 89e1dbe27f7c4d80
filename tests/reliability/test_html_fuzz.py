"""Hostile content through every HTML renderer: the prefix diff, the observation, every widget's static HTML and
the pure renderers behind them, the import result and the HTML report.

Each output is parsed (``html.parser``) and must hold only the tags and attributes the renderers themselves emit
(no ``on*`` handler, no ``href``, images only as inline PNG, no comment or processing instruction), no raw bidi
control, zero-width character, NUL or other control character (they are shown as markers), and no lone
surrogate (the output must encode as UTF-8, or Jupyter cannot send it). Where content reaches a renderer
directly, the output's markup — every start tag and its attribute names, in order — must equal the markup for
the same content with ``< > & " '`` swapped for look-alikes: content changes text, never structure. Lone
surrogates and 1 MB lines are rendered without a crash (or, for request bodies, refused with one line).
"""

from __future__ import annotations

import inspect
import json
import re
import warnings
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import promptcache_nb as pc
from promptcache_nb.ingest import ImportResult
from promptcache_nb.report import write_report
from promptcache_nb.request import prepare
from promptcache_nb.scenario import KnowledgeSpec, KnowledgeUpdate, Scenario, ScenarioTurn, ToolCall
from promptcache_nb.widgets import _html

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
MODEL = "claude-sonnet-4-5"
HOST = "You are a careful support agent for a billing platform. " * 90  # over the 1,024-token minimum
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")

#: Everything the renderers emit themselves: a tag or attribute outside these came from content.
TAGS = {"b", "body", "code", "col", "colgroup", "details", "div", "h1", "h2", "head", "html", "i", "img", "li",
        "mark", "meta", "p", "pre", "span", "style", "summary", "table", "tbody", "td", "th", "thead", "title",
        "tr", "ul"}
ATTRS = {"alt", "border", "charset", "class", "colspan", "data-field", "data-id", "data-kind", "data-role",
         "data-state", "src", "style", "title"}
#: Must never appear raw: bidi controls, zero-width characters, C0 controls but tab/newline/CR, DEL, C1
#: controls, soft hyphen, lone surrogates.
INVISIBLE = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u200b-\u200d\u2060\ufeff\u00ad"
                       "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")

FRAGMENTS = ("<script>alert(1)</script>", "<img src=x onerror=alert(1)>", '"><svg/onload=alert(1)>',
             "' onmouseover='alert(1)' x='", "<x-evil data-evil=1>", "</td></tr></table></div></details>",
             "<!-- c -->", "<![CDATA[x]]>", "<?pi x?>", "<!DOCTYPE x>", "&amp;&lt;&#x3c;&#60", "<b>bold</b>",
             "<a href='javascript:alert(1)'>x</a>", "<style>*{display:none}</style>", "<iframe src=//x>",
             "\u202e", "\u2066", "\u2069", "\u200b", "\u200d", "\ufeff", "\x00", "\x07", "\x1b[31m", "\u00ad",
             "\u00a0", "\u0085", "$frac{$", "{{7*7}}", "\r\n", "\t", "  \n")
SURROGATES = ("\ud800", "\udce9", "\udfff")
#: Look-alikes for the markup characters: printable (shown as themselves, never as markers) and as long as the
#: original both as text and inside JSON (a quote and a backslash are both escaped there, to two characters).
TWIN = str.maketrans({"<": "\u2039", ">": "\u203a", "&": "\uff06", '"': "\\", "'": "\uff07"})
_NO_TWIN_CHARS = str.maketrans(dict.fromkeys("\u2039\u203a\uff06\\\uff07"))
#: Every fragment at once (lone surrogates aside: a session refuses them at the boundary, tests/test_hardening.py).
ALL = "".join(FRAGMENTS).translate(_NO_TWIN_CHARS)


def hostile(*, surrogates: bool) -> st.SearchStrategy[str]:
    parts = st.sampled_from(FRAGMENTS + (SURROGATES if surrogates else ())) | st.text(max_size=6)
    return st.lists(parts, min_size=1, max_size=6).map("".join).map(lambda s: s.translate(_NO_TWIN_CHARS))


def twin(value):
    """``value`` (a string, or strings inside lists and dicts) with its markup characters swapped for look-alikes."""
    if isinstance(value, str):
        return value.translate(TWIN)
    if isinstance(value, list | tuple):
        return type(value)(twin(v) for v in value)
    if isinstance(value, dict):
        return {twin(k): twin(v) for k, v in value.items()}
    return value


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.starts: list[tuple[str, tuple[str, ...]]] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        names = tuple(name for name, _ in attrs)
        self.starts.append((tag, names))
        if tag not in TAGS:
            self.problems.append(f"tag <{tag}>")
        for name, value in attrs:
            if name not in ATTRS:
                self.problems.append(f"attribute {name}= on <{tag}>")
            if name == "src" and not (value or "").startswith("data:image/png;base64,"):
                self.problems.append(f"src={value[:40]!r}")
        if len(set(names)) != len(names):
            self.problems.append(f"duplicate attribute on <{tag}>: {names}")

    handle_startendtag = handle_starttag

    def handle_comment(self, data):
        self.problems.append(f"comment {data[:40]!r}")

    def handle_pi(self, data):
        self.problems.append(f"processing instruction {data[:40]!r}")

    def handle_decl(self, decl):
        if decl.lower() != "doctype html":
            self.problems.append(f"declaration {decl[:40]!r}")

    def unknown_decl(self, data):
        self.problems.append(f"declaration {data[:40]!r}")


def markup(html: str) -> list[tuple[str, tuple[str, ...]]]:
    """The output's start tags with their attribute names, after checking it is safe to show."""
    html.encode("utf-8")  # a lone surrogate here is an output Jupyter cannot send
    bad = INVISIBLE.search(html)
    assert bad is None, f"raw U+{ord(bad.group()):04X} in the output: {html[max(0, bad.start() - 80):bad.end() + 40]!r}"
    parser = _Markup()
    parser.feed(html)
    parser.close()
    assert not parser.problems, parser.problems[:5]
    return parser.starts


def check(render, *content):
    """``render(*content)`` is safe, and its markup is the same for ``content``'s look-alike twin."""
    got = markup(render(*content))
    assert got == markup(render(*twin(content))), "content changed the markup"


# -- request bodies: the prefix diff and the side-by-side view ------------------------------------------------
def _bodies(x: str, y: str) -> tuple[dict, dict]:
    tool = {"name": "lookup", "description": f"Find {x}", "input_schema": {"type": "object"}}
    a = {"model": MODEL, "tools": [tool], "system": [{"type": "text", "text": HOST + x}],
         "messages": [{"role": "user", "content": f"Where is {x}?"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup",
                                                         "input": {"q": x}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                    "content": x}]}]}
    b = json.loads(json.dumps(a))
    b["system"][0]["text"] = HOST + y
    b["tools"][0]["description"] = f"Find {y}"
    b["messages"].append({"role": "assistant", "content": y or "ok"})
    b["metadata"] = {"user_id": y}
    return a, b


def _diff_html(x: str, y: str) -> str:
    return pc.diff(*_bodies(x, y))._repr_html_()


def _side_by_side(x: str, y: str) -> str:
    a, b = (prepare(body) for body in _bodies(x, y))
    states = ("read",) * (len(b.segments) - 1) + ("write",)
    return _html.side_by_side_html(a, b, diff=pc.diff(a, b)) + _html.segment_map_html(b.segments, states)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile(surrogates=True), hostile(surrogates=True))
def test_prefix_diff_and_side_by_side(x, y):
    try:
        check(_diff_html, x, y)
    except ValueError as exc:  # a lone surrogate: prepare refuses the body (it could be neither hashed nor sent)
        assert any(s in x + y for s in SURROGATES) and "\n" not in str(exc)
        return
    check(_side_by_side, x, y)


# -- the pure renderers behind the widgets ---------------------------------------------------------------------
#: Every renderer of widgets/_html.py, each fed content where it takes any.
PURE = {
    "text_html": lambda x: _html.text_html(x),
    "header_html": lambda x: _html.header_html(index=3, n_requests=5, at=T0, events=[x, "tools"], user_text=x,
                                               scenario=x, position=1, n_scenario=3, pending=[x], batch=(3, 4)),
    "status_html": lambda x: _html.status_html(x, kind=x) + _html.status_html(x, kind="warn"),
    "error_html": lambda x: _html.error_html(ValueError(x)) + _html.error_html(pc.errors.SessionError(x)),
    "snapshot_html": lambda x: _html.snapshot_html(x, _html.text_html(x)),
    "png_html": lambda x: _html.png_html(PNG, alt=x),
    "knowledge_table_html": lambda x: _html.knowledge_table_html(
        [{"short_id": x[:8], "title": x, "category": x, "version": 2, "content": x}], pending=[x]),
    # a page of a book of several pages, filtered by the content itself, with more pending events than listed
    "knowledge_table_html (a page)": lambda x: _html.knowledge_table_html(
        _html.knowledge_page(_book(x), page=1, query=x, page_size=BOOK_PAGE),
        pending=[x] * (_html.MAX_LISTED_EVENTS + 5)),
    "summary_table_html": lambda x: _html.summary_table_html(
        [{"strategy": x, "requests": 3, "cache_read_pct": 50.0, "efficiency": 0.5, "cache_write": 10,
          "uncached": 2, "breaks": 1, "cost_usd": 0.12, "saved_usd": 0.3, "last_reason": x}]),
    "observation_html": lambda x: (
        _html.observation_html(row={"broke": True, "previous_cache_read": 2048, "explanation": x,
                                    "changes": json.dumps([{"code": x, "detail": x}, x])})
        + _html.observation_html(cache_reason=x, cache_detail={"divergence_path": x})),
    "usage_html": lambda x: _html.usage_html(pc.Usage(3, 2048, 100, 100, 0, 50, "simulated"), ideal_cache_read=9,
                                             cost_usd=0.1, cost_no_cache_usd=0.2, cache_reason=x),
    "side_by_side_html": lambda x: _side_by_side(x, x + "!"),
    "segment_map_html": lambda x: _side_by_side(x, "?" + x),
    # object columns: with pyarrow installed, pandas' default string dtype cannot hold a lone surrogate at all
    "import_result": lambda x: ImportResult(
        skipped=pd.DataFrame([{"file": x, "line": 3, "reason": f"malformed JSON line: {x}"}], dtype=object),
        # a body problem names a field of the logged body and quotes its value: both are data
        flagged=pd.DataFrame([{"file": x, "line": 4, "path": f"messages[0].content[{x}]",
                               "problem": f"unknown content block type '{x}'"}], dtype=object),
        unknown_models=[x], files=[(x, "exchanges")])._repr_html_(),
}


#: Rows per page of the book above: a small page (the editor's is KNOWLEDGE_PAGE_SIZE, 50) renders the same
#: markup per row, and a middle page still has pages on both sides, at a tenth of the rows to filter and render.
BOOK_PAGE = 5


def _book(x: str) -> list[dict]:
    """Knowledge rows full of ``x``, more than two pages of them."""
    return [{"id": f"{i:08d}{x}", "short_id": f"{i:08d}", "key": x, "title": f"{x} {i}", "category": x,
             "version": 1, "content": x} for i in range(2 * BOOK_PAGE + 2)]


def test_the_paged_knowledge_table_is_a_middle_page():
    """What the fuzzed "(a page)" renderer shows: a full page with pages on both sides, its label filtered."""
    html = PURE["knowledge_table_html (a page)"]("x")
    assert html.count("<tr data-id=") == BOOK_PAGE
    assert f"entries {BOOK_PAGE + 1}–{2 * BOOK_PAGE} of {2 * BOOK_PAGE + 2} matching" in html


def test_every_renderer_is_fuzzed():
    """A renderer added to widgets/_html.py must be added to PURE (or this suite misses it)."""
    renderers = {name for name, fn in inspect.getmembers(_html, inspect.isfunction)
                 if name.endswith("_html") and fn.__module__ == _html.__name__}
    assert renderers - {"visible_html"} <= set(PURE), sorted(renderers - set(PURE))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile(surrogates=True))
@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_renderers(name, x):
    render = PURE[name]
    try:
        check(render, x)
    except ValueError as exc:
        # only request bodies may be refused (prepare: a lone surrogate can be neither hashed nor sent)
        assert name in ("side_by_side_html", "segment_map_html") and any(s in x for s in SURROGATES), exc


# -- the report ----------------------------------------------------------------------------------------------
def _report(tmp_path, x: str, y: str) -> str:
    summary = pd.DataFrame([{"strategy": name, "cache": "anthropic", "requests": 4, "cache_read_pct": 40.0,
                             "efficiency": 0.5, "cache_read": 400, "cache_write": 300, "uncached": 300,
                             "breaks": 1, "cost_usd": 0.01, "cost_no_cache_usd": 0.02, "saved_usd": 0.01}
                            for name in (x, y + " ")], dtype=object)  # (pyarrow strings hold no lone surrogate)
    frames = {name: pd.DataFrame({"idx": [0, 1], "cost_usd": [0.004, 0.006]}) for name in summary.strategy}
    path = write_report(tmp_path / "report.html", summary, frames, title=x, notes=[x, f"scenario: {y}"])
    return path.read_text(encoding="utf-8")


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                               HealthCheck.function_scoped_fixture])
@given(hostile(surrogates=True), hostile(surrogates=True))
@example(ALL + SURROGATES[0], ALL[::-1])
# a name hundreds of characters long leaves the chart no room: matplotlib says so, and draws it anyway
@pytest.mark.filterwarnings("ignore:constrained_layout not applied:UserWarning")
def test_report(tmp_path, x, y):
    check(lambda a, b: _report(tmp_path, a, b), x, y)


# -- sessions and widgets ---------------------------------------------------------------------------------------
def _nz(text: str, default: str) -> str:
    """``text``, or ``default`` where a blank value would be refused (titles, contents, replies)."""
    return text if text.strip() else default


def _scenario(x: str, y: str, big: str | None = None) -> Scenario:
    tool = {"name": "lookup", "description": f"Find {x}",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string", "description": y}}}}
    turns = (
        ScenarioTurn(user=f"Where is {x}?", reply=_nz(y, "ok"), after=timedelta(seconds=20),
                     tool_calls=(ToolCall("lookup", {"q": x}, _nz(y, "none")),)),
        ScenarioTurn(user=big or _nz(y, "and?"), reply=_nz(x, "so"), after=timedelta(seconds=30),
                     events=(KnowledgeUpdate("k1", title=_nz(y, "t"), content=f"{x} changed"),)),
    )
    return Scenario(name=f"fuzz {x}"[:60], model=MODEL, start=T0, host_prompt=HOST + x, tools=(tool,),
                    knowledge=(KnowledgeSpec("k1", _nz(x, "title"), f"about {y}", "note"),
                               KnowledgeSpec("k2", _nz(y, "title"), _nz(x, "content"), _nz(x, "note"))),
                    turns=turns, project="fuzz")


def _widget_htmls(x: str, y: str, *, big: str | None = None, compare: bool = False) -> dict[str, str]:
    """Every widget's static HTML, and the observation's and the prefix diff's, for a session full of ``x`` and
    ``y`` (a knowledge edit through the editor, a tool loop, a scenario knowledge update; ``big`` as the second
    user message)."""
    sc = _scenario(x, y, big)
    out = {}
    with pc.Lab(progress=False) as lab:
        stepper = pc.widgets.Stepper(lab.replay(sc, stop_after=0), sc)
        stepper.next()
        editor = stepper.editor()
        editor.add(_nz(x, "t"), _nz(y, "c"), category="note")
        stepper.next()
        s = stepper.session
        widgets = {"Stepper": stepper, "KnowledgeEditor": editor, "SavingsChart": stepper.chart,
                   "DiffView": pc.widgets.DiffView.for_turns(s.turn(2), previous=s.turn(1))}
        if compare:
            widgets["Compare"] = pc.widgets.Compare(sc, strategies=["naive"], lab=lab)
            widgets["Compare"].run()
        for name, w in widgets.items():
            out[name] = w._repr_mimebundle_()["text/html"]
        last = s.turn(s.n_turns - 1)
        out["Observation"] = last.observation._repr_html_()
        out["PrefixDiff"] = last.diff._repr_html_()
        for name in ("Turn", "Session", "Lab", "KnowledgeBook"):  # none renders HTML today; if one does, check it
            obj = {"Turn": last, "Session": s, "Lab": lab, "KnowledgeBook": s.knowledge}[name]
            if hasattr(obj, "_repr_html_"):
                out[name] = obj._repr_html_()
    return out


def _check_all(htmls: dict[str, str]) -> None:
    for name, html in htmls.items():
        try:
            markup(html)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


def test_every_widget_with_every_fragment():
    htmls = _widget_htmls(ALL, ALL[::-1], compare=True)
    assert set(htmls) >= {"Stepper", "KnowledgeEditor", "SavingsChart", "DiffView", "Compare", "Observation",
                          "PrefixDiff"}
    _check_all(htmls)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile(surrogates=False), hostile(surrogates=False))
def test_widgets_observation_and_diff_of_hostile_sessions(x, y):
    _check_all(_widget_htmls(x, y))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile(surrogates=False))
@example(ALL)
def test_a_paged_and_filtered_knowledge_editor(x):
    """A book of more than one page (the pager shows), turned and filtered by hostile text: the list, the page
    label and the picker's labels stay escaped."""
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST)
        for i in range(_html.KNOWLEDGE_PAGE_SIZE + 5):
            s.knowledge.add(f"{_nz(x, 't')} {i}", _nz(x, "c"), category=_nz(x, "note"))
        editor = pc.widgets.KnowledgeEditor(s)
        htmls = {"first page": editor._repr_mimebundle_()["text/html"]}
        editor.next_page()
        htmls["second page"] = editor._repr_mimebundle_()["text/html"]
        editor.search(x)
        htmls["filtered"] = editor._repr_mimebundle_()["text/html"]
        assert editor._pager in editor.children
        _check_all(htmls)
        for label, _ in editor._pick.options:  # plain text in the browser: no raw invisible character
            assert INVISIBLE.search(label) is None, label


def _exchange(body: dict, *, model: str, at: str) -> str:
    return json.dumps({"v": 1, "at": at, "method": "POST", "url": "https://api.anthropic.com/v1/messages",
                       "path": "/v1/messages", "status": 200, "request": {**body, "model": model},
                       "response": None, "usage": {"input_tokens": 5, "cache_read_input_tokens": 0,
                                                   "cache_creation_input_tokens": 1500, "output_tokens": 3},
                       "request_id": None, "latency_ms": 5})


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                               HealthCheck.function_scoped_fixture])
@given(hostile(surrogates=False))
def test_an_imported_hostile_log(tmp_path_factory, x):
    """A log whose file name, model names and bodies are hostile: the import result and the session's widgets."""
    folder = tmp_path_factory.mktemp("log")
    name = re.sub(r"[/\x00]", "_", x)[:40].encode("utf-8", "replace")[:80].decode("utf-8", "ignore")
    path = folder / f"log {name}.jsonl"
    a, b = _bodies(x, x + "!")
    path.write_text("\n".join([_exchange(a, model=MODEL, at="2026-11-02T09:00:00Z"),
                               _exchange(b, model=f"claude-{x}", at="2026-11-02T09:01:00Z"),
                               x.replace("\n", " ") + " {", _exchange(b, model=MODEL, at=x)]) + "\n", encoding="utf-8")
    with pc.Lab(progress=False) as lab, warnings.catch_warnings():
        warnings.simplefilter("ignore", pc.errors.UnpricedModelWarning)  # the hostile model names have no price
        res = lab.import_log(path, format="exchanges")
        markup(res._repr_html_())
        s = res.sessions[0]
        markup(pc.widgets.Stepper(s)._repr_mimebundle_()["text/html"])
        markup(s.turn(s.n_turns - 1).observation._repr_html_())


# -- 1 MB lines ----------------------------------------------------------------------------------------------
BIG = "<script>" + "x" * 1_000_000 + "</script>"


@pytest.mark.parametrize("name", sorted(PURE))
def test_a_1_mb_line_through_each_pure_renderer(name):
    markup(PURE[name](BIG))


def test_invisible_characters_and_a_lone_surrogate_in_a_1_mb_line():
    line = "\u202e" + BIG + "\u200b\udce9"
    html = _html.text_html(line)
    markup(html)
    assert "⟨RLO⟩" in html and "⟨ZWSP⟩" in html and "⟨U+DCE9⟩" in html
    with pytest.raises(ValueError) as info:  # a request body: refused, it can be neither hashed nor sent
        _diff_html(line, "y")
    assert "\n" not in str(info.value)


# ~222k estimated tokens: past claude-sonnet-4-5's 200k window, which sessions may warn about (not checked here)
@pytest.mark.filterwarnings("ignore::promptcache_nb.errors.ContextWindowWarning")
def test_a_1_mb_line_through_a_session_its_widgets_and_the_diff():
    htmls = _widget_htmls("<b>x</b>\u202e", "y", big=BIG)
    _check_all(htmls)
    # the views show an excerpt of a huge segment, not the segment
    assert max(len(h) for h in htmls.values()) < 300_000, {k: len(v) for k, v in htmls.items()}
