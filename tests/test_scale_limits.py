"""Scale limits (issue 15 item 12): a knowledge book of 100,000 entries renders one bounded page, and a
request or a scenario's host prompt past the model's context window gets one ContextWindowWarning."""

from __future__ import annotations

import json
import warnings
from datetime import UTC, datetime

import pytest

import promptcache_nb as pc
from promptcache_nb._types import KnowledgeEntry
from promptcache_nb.analysis.limits import (
    check_context_window,
    check_request,
    context_window,
    estimated_tokens,
    prompt_past_context_window,
)
from promptcache_nb.errors import ContextWindowWarning, PromptCacheWarning
from promptcache_nb.request import prepare
from promptcache_nb.scenario import _loader
from promptcache_nb.widgets import KnowledgeController, _html

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
N = 100_000
MAX_HTML = 200_000  # bytes: a page of entries, never the book


def _rows(n: int = N) -> list[dict]:
    return [{"id": f"{i:08d}-entry", "short_id": f"{i:08d}", "key": f"k{i}", "title": f"Entry {i}",
             "category": "fact" if i % 2 else "note", "version": 1,
             "content": f"Content of entry {i}: " + "lorem ipsum dolor sit amet " * 8} for i in range(n)]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return _rows()


def _titles(page: _html.KnowledgePage) -> list[str]:
    return [r["title"] for r in page.rows]


# -- the page logic (no kernel) ----------------------------------------------------------------------------
def test_pages_of_100k_entries(rows):
    first = _html.knowledge_page(rows)
    assert first.label == "entries 1–50 of 100,000" and first.pages == 2_000
    assert _titles(first) == [f"Entry {i}" for i in range(50)]
    assert not first.has_previous and first.has_next
    second = _html.knowledge_page(rows, page=1)
    assert second.label == "entries 51–100 of 100,000" and _titles(second)[0] == "Entry 50"
    last = _html.knowledge_page(rows, page=1_999)
    assert last.label == "entries 99,951–100,000 of 100,000" and last.has_previous and not last.has_next
    assert _html.knowledge_page(rows, page=10**9).page == 1_999  # clamped
    assert _html.knowledge_page(rows, page=-3).page == 0
    holding = _html.knowledge_page(rows, containing="00074321-entry")
    assert holding.page == 1_486 and "Entry 74321" in _titles(holding)


def test_filter_matches_title_category_content_id_and_key(rows):
    hits = _html.knowledge_page(rows, query="  ENTRY 7432 ")  # trimmed, case-insensitive
    assert hits.matching == 11 and hits.label == "entries 1–11 of 11 matching “ENTRY 7432” (100,000 in all)"
    assert _html.knowledge_page(rows, query="00099999").matching == 1  # a short id
    assert _html.knowledge_page(rows, query="k99998").matching == 1  # a scenario key
    assert _html.knowledge_page(rows, query="fact").matching == N // 2  # a category
    none = _html.knowledge_page(rows, query="no such text")
    assert none.rows == () and none.label == "no entries match “no such text” (100,000 in all)"
    # containing: the page of the entry among the matches; an entry the filter hides leaves the page as asked
    assert _html.knowledge_page(rows, query="fact", containing="00000301-entry").page == 3
    assert _html.knowledge_page(rows, query="fact", page=2, containing="00000300-entry").page == 2
    with pytest.raises(ValueError, match="page_size"):
        _html.knowledge_page(rows, page_size=0)


def test_the_html_of_100k_entries_is_one_page(rows):
    html = _html.knowledge_table_html(rows, pending=[f"knowledge_add:{i:08d}" for i in range(N)])
    assert len(html.encode()) < MAX_HTML, len(html)
    assert "entries 1–50 of 100,000" in html and "Entry 49<" in html and "Entry 50<" not in html
    assert html.count("<tr data-id=") == 50
    assert "knowledge_add:00000019" in html and "knowledge_add:00000020" not in html
    assert "… and 99,980 more" in html
    page = _html.knowledge_table_html(_html.knowledge_page(rows, page=1_000))
    assert "entries 50,001–50,050 of 100,000" in page and "Entry 50000<" in page and "Entry 49999<" not in page


def test_a_small_book_renders_as_before():
    """One page without a filter: every entry, no page label (so existing notebook outputs stay the same)."""
    html = _html.knowledge_table_html(_rows(5))
    assert "(5 entries)<table" in html and html.count("<tr data-id=") == 5 and "data-field" not in html
    assert "(0 entries)" in _html.knowledge_table_html([]) and "no knowledge entries" in _html.knowledge_table_html([])


def test_hostile_content_on_a_page_is_escaped():
    evil = "<img src=x onerror=alert(1)>\u202e"
    rows = [{**r, "title": evil, "content": evil} for r in _rows(120)]
    html = _html.knowledge_table_html(_html.knowledge_page(rows, page=1, query=evil))
    assert "<img" not in html and "\u202e" not in html and "⟨RLO⟩" in html
    assert "entries 51–100 of 120 matching" in html


def test_the_stepper_header_and_observation_list_a_bounded_number_of_events():
    codes = [f"knowledge_add:{i:08d}" for i in range(N)]
    header = _html.header_html(index=3, n_requests=5, events=codes, pending=codes)
    assert len(header) < 10_000 and header.count("… and 99,980 more") == 2
    obs = _html.observation_html(row={"broke": True, "changes": json.dumps([{"code": c} for c in codes])})
    assert len(obs) < 10_000 and "… and 99,980 more" in obs


# -- the editor widget over 100k entries --------------------------------------------------------------------
@pytest.fixture
def lab():
    with pc.Lab(progress=False) as lab:
        yield lab


def _entries(n: int) -> list[KnowledgeEntry]:
    return [KnowledgeEntry(f"{i:08d}-entry", "p", 1, f"Entry {i}", f"Content of entry {i}.",
                           "fact" if i % 2 else "note", False, T0, f"k{i}") for i in range(n)]


def test_the_editor_over_100k_entries_shows_pages(lab, monkeypatch):
    entries = _entries(N)
    # the book itself: what KnowledgeController lists (adding 100k entries through the store is another item)
    monkeypatch.setattr(KnowledgeController, "entries", lambda self: entries)
    ed = pc.widgets.KnowledgeEditor(lab.session(system="You are terse."))
    snapshot = ed._repr_mimebundle_()["text/html"]
    assert len(snapshot.encode()) < MAX_HTML, len(snapshot)
    assert "entries 1–50 of 100,000" in snapshot and ed.entries == N and ed.page == 0
    assert len(ed._pick.options) == 51  # "(new entry)" and the page's entries, never 100,001 options
    assert ed._pager in ed.children and ed._previous_btn.disabled and not ed._next_page_btn.disabled
    assert repr(ed).endswith("entries=100000, page='1 of 2000')")

    ed._next_page_btn.click()
    assert ed.page == 1 and "entries 51–100 of 100,000" in ed._table.value and "Entry 50<" in ed._table.value
    ed.show_page(1_999)
    assert "entries 99,951–100,000 of 100,000" in ed._table.value and ed._next_page_btn.disabled
    ed.previous_page()
    assert ed.page == 1_998

    ed.select("k74321")  # a key: the list turns to its page, the form holds it
    assert ed.page == 1_486 and ed._title.value == "Entry 74321" and ed.selected == "00074321-entry"
    ed.next_page()  # the picked entry stays picked (and listed in the picker) on another page
    assert ed.page == 1_487 and ed._pick.value == "00074321-entry" and ed._title.value == "Entry 74321"
    assert len(ed._pick.options) == 52

    page = ed.search("entry 9999")
    assert ed.query == "entry 9999" and page.matching == 11 and "of 11 matching" in ed._table.value
    ed.select("00000005")  # hidden by the filter: the filter is cleared to show it
    assert ed.query == "" and ed._filter.value == "" and ed.page == 0 and ed._title.value == "Entry 5"
    assert len(ed._repr_mimebundle_()["text/html"].encode()) < MAX_HTML


def test_the_editor_pages_a_real_book(lab):
    s = lab.session(system="You are terse.")
    for i in range(60):
        s.knowledge.add(f"Note {i:02d}", f"Body {i}.", category="note")
    ed = pc.widgets.KnowledgeEditor(s)
    assert ed.entries == 60 and ed._pager in ed.children and "entries 1–50 of 60" in ed._table.value
    new = ed.add("Zeta", "The newest entry.", category="fact")
    assert ed.entries == 61 and ed._pick.value == new and ed._title.value == "Zeta"
    assert any(r["id"] == new for r in ed._last_page.rows)  # the list turned to the new entry's page
    ed.show_page(0)
    ed.edit(new, content="Edited from another page.")
    assert s.knowledge.get(new).content == "Edited from another page." and ed._pick.value == new
    ed.remove(new)
    assert ed.entries == 60 and ed._pick.value == ""
    for e in s.knowledge.list()[:15]:
        s.knowledge.remove(e.id)
    ed._on_change("knowledge")
    assert ed.entries == 45 and ed._pager not in ed.children  # one page again: no pager


# -- the context window --------------------------------------------------------------------------------------
def test_context_windows_come_from_genai_prices():
    assert context_window("claude-sonnet-4-5") == 200_000
    assert context_window("claude-sonnet-4-5-20250929") == 200_000  # a dated snapshot resolves exactly
    assert context_window("gpt-4o") == 128_000
    assert context_window("claude-opus-4-9") is None  # unknown: never another model's window
    assert context_window("no-such-model") is None


def _caught(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [w for w in caught if issubclass(w.category, ContextWindowWarning)]


def test_one_warning_past_the_window_naming_request_model_tokens_and_window():
    warned, caught = _caught(check_context_window, "claude-sonnet-4-5", 3_500_000, where="request 7")
    assert warned and len(caught) == 1
    w = caught[0].message
    assert isinstance(w, UserWarning) and isinstance(w, PromptCacheWarning)
    assert (w.where, w.model, w.tokens, w.window, w.measured) == ("request 7", "claude-sonnet-4-5", 3_500_000,
                                                                    200_000, False)
    assert str(w).startswith("request 7: 3,500,000 estimated input tokens exceed the 200,000-token context "
                             "window of model 'claude-sonnet-4-5'")
    assert caught[0].filename == __file__  # points at the caller
    for model, tokens in (("claude-sonnet-4-5", 200_000), ("no-such-model", 10**9), ("claude-sonnet-4-5", None)):
        assert _caught(check_context_window, model, tokens, where="r") == (False, [])


def test_a_prepared_request_is_checked_on_its_estimate_or_its_measured_usage():
    big = {"model": "claude-sonnet-4-5", "max_tokens": 5,
           "system": "You are a careful support agent for a billing platform. " * 25_000,
           "messages": [{"role": "user", "content": "hi"}]}
    prepared = prepare(big)
    assert prepared.total_tokens > 200_000
    warned, caught = _caught(check_request, prepared, where="request 0")
    assert warned and caught[0].message.tokens == prepared.total_tokens
    small = prepare({**big, "system": "Be brief."})
    assert _caught(check_request, small, where="request 1") == (False, [])
    measured = pc.Usage(5, 250_000, 0, 0, 0, 1, "imported")
    warned, caught = _caught(check_request, small, where="request 1", usage=measured)
    assert warned and caught[0].message.measured and caught[0].message.tokens == 250_005


def test_estimated_tokens_stop_counting_past_a_limit():
    text = "You are a careful support agent for a billing platform. " * 25_000  # 1.4 MB: two chunks
    full = estimated_tokens(text, "claude-sonnet-4-5")
    early = estimated_tokens(text, "claude-sonnet-4-5", stop_past=100_000)
    assert abs(early - full) <= full * 0.001
    assert estimated_tokens("short", "gpt-4o", stop_past=1) == estimated_tokens("short", "gpt-4o")


SCENARIO = """name: big
model: {model}
start: 2026-11-02T09:00:00Z
host_prompt_file: host.txt
turns:
  - user: hi
    reply: ok
"""


@pytest.fixture
def prompt_check():
    """The loader's context-window check as the Lab installs it (restored afterwards)."""
    before = list(_loader._PROMPT_CHECK)
    _loader.set_prompt_check(prompt_past_context_window)
    yield
    _loader._PROMPT_CHECK[:] = before


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "claude-opus-4-6"])  # 200k and 1M windows
def test_a_scenario_whose_host_prompt_exceeds_the_window_loads_with_one_warning(tmp_path, model, prompt_check):
    (tmp_path / "host.txt").write_text("You are a careful support agent for a billing platform. " * 250_000,
                                       encoding="utf-8")  # 14 MB
    (tmp_path / "big.yaml").write_text(SCENARIO.format(model=model), encoding="utf-8")
    sc, caught = _caught(pc.load_scenario, tmp_path / "big.yaml")
    assert len(sc.host_prompt) == 14_000_000 and len(caught) == 1
    w = caught[0].message
    assert w.where == f"{tmp_path / 'big.yaml'}: host prompt and tools (sent with every request)"
    assert w.model == model and w.window == context_window(model) and w.tokens > 2_500_000
    assert caught[0].filename == __file__


def test_a_normal_scenario_loads_without_a_warning(tmp_path, prompt_check):
    (tmp_path / "host.txt").write_text("You are a careful support agent.", encoding="utf-8")
    (tmp_path / "ok.yaml").write_text(SCENARIO.format(model="claude-sonnet-4-5"), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pc.load_scenario(tmp_path / "ok.yaml")


def test_the_lab_installs_the_scenario_prompt_check():
    assert _loader._PROMPT_CHECK == [prompt_past_context_window]


def test_a_session_request_past_the_window_warns_once_per_session(lab):
    """Step and record check each stored request (estimated tokens, or measured usage when the request has it);
    the first past the window warns, naming the session and the request; later ones of the object do not."""
    huge = "You are a careful support agent for a billing platform. " * 25_000  # ~275k estimated tokens
    s = lab.session(system="You are terse.")
    _, caught = _caught(s.step, "hi", reply="ok")
    assert caught == []
    body = {"model": "claude-sonnet-4-5", "max_tokens": 5, "system": huge,
            "messages": [{"role": "user", "content": "hi"}]}
    t, caught = _caught(s.record, body)
    assert len(caught) == 1 and caught[0].filename == __file__  # points at record()'s caller
    w = caught[0].message
    assert w.where == f"session {s.id!r}: request 1" and not w.measured and w.tokens == t.total_tokens > 200_000
    assert t.index == 1 and s.n_turns == 2  # a warning: stored as given
    assert _caught(s.record, body)[1] == []  # once per session object
    imported = lab.session()
    small = {**body, "system": "Be brief."}
    _, caught = _caught(imported.record, small, usage={"input_tokens": 5, "cache_read_input_tokens": 250_000,
                                                       "cache_creation_input_tokens": 0, "output_tokens": 1})
    assert len(caught) == 1 and caught[0].message.measured and caught[0].message.tokens == 250_005
    big = lab.session(system=huge)
    _, caught = _caught(big.step, "hi", reply="ok")
    assert len(caught) == 1 and caught[0].message.where == f"session {big.id!r}: request 0"
    assert caught[0].filename == __file__


def test_a_failed_resolve_names_ten_entries_not_the_book(lab, monkeypatch):
    entries = _entries(N)
    monkeypatch.setattr(KnowledgeController, "entries", lambda self: entries)
    k = KnowledgeController(lab.session(system="You are terse."))
    with pytest.raises(pc.errors.KnowledgeError) as info:
        k.resolve("Entyr 5")
    msg = str(info.value)
    assert msg.startswith("no single knowledge entry matches 'Entyr 5'; current entries: 00000000 (Entry 0), ")
    assert msg.endswith("00000009 (Entry 9), … (100,000 in all)") and len(msg) < 400
    entries[1:3] = [KnowledgeEntry(f"{i:08d}-twin", "p", 1, "Entry 5", "twin", "note", False, T0) for i in (1, 2)]
    with pytest.raises(pc.errors.KnowledgeError, match=r"; entries matching it: 00000001 \(Entry 5\), 00000002 \(Entry 5\), "
                                                r"00000005 \(Entry 5\)$"):
        k.resolve("Entry 5")  # three entries share the title: those are named
