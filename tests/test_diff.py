"""PrefixDiff: the three divergence levels, volatile fields, excerpts, escaping, the session columns."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import promptcache_nb as pc
from promptcache_nb._util import NO_MATH_CLASSES
from promptcache_nb.request import canonical_bytes, prepare
from promptcache_nb.request.diff import (
    VOLATILE_FIELDS,
    common_prefix_length,
    segment_offset,
    visible,
    visible_html,
)

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
MODEL = "claude-sonnet-4-5"


def text_block(text: str, **extra) -> dict:
    return {"type": "text", "text": text, **extra}


def base_body() -> dict:
    return {
        "model": MODEL,
        "max_tokens": 1024,
        "tools": [
            {"name": "read_file", "description": "Read a file from the workspace.",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
            {"name": "grep", "description": "Search files for a pattern.",
             "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}}},
        ],
        "system": [text_block("You are a careful agent. " * 20), text_block("Project rules: be terse. " * 10),
                   text_block("Memory: nothing yet.")],
        "messages": [
            {"role": "user", "content": [text_block("Find the bug in parser.py please.")]},
            {"role": "assistant", "content": [
                text_block("Looking."),
                {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"pattern": "def parse"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "parser.py:12"}]},
            {"role": "assistant", "content": "It is on line 12."},
        ],
    }


def edited(body: dict, fn) -> dict:
    out = copy.deepcopy(body)
    fn(out)
    return out


def check_byte_offset(d: pc.PrefixDiff) -> None:
    """The documented meaning of byte_offset, verified against a full serialisation."""
    cur_bytes = canonical_bytes(d.current.body)
    seg = d.current.segments[d.index]
    start = segment_offset(d.current, d.index)
    assert cur_bytes[start:start + seg.nbytes] == canonical_bytes(seg.element)
    prev_seg = canonical_bytes(d.previous.segments[d.index].element)
    within = d.byte_offset - start
    assert 0 <= within < seg.nbytes
    assert cur_bytes[start:d.byte_offset] == prev_seg[:within]
    assert cur_bytes[d.byte_offset] != prev_seg[within]


# -- divergence at each level ---------------------------------------------------------------------

def test_system_block_divergence_at_all_three_levels():
    a = base_body()
    b = edited(a, lambda x: x["system"][2].update(text="Memory: the user prefers tabs."))
    d = pc.diff(a, b)
    assert (d.path, d.index, d.field, d.pure_append) == ("system[2]", 4, None, False)
    check_byte_offset(d)
    assert canonical_bytes(b)[d.byte_offset:d.byte_offset + 3] == b"the"
    cum = prepare(b).cumulative_tokens()
    assert d.shared_prefix_tokens == cum[3]
    assert cum[3] <= d.token_offset < cum[4]  # whole segments before + part of the divergent block
    assert d.changed == ("system[2]",) and d.removed == ()


def test_tool_divergence():
    a = base_body()
    b = edited(a, lambda x: x["tools"][1].update(description="Search files for a regex."))
    d = pc.diff(a, b)
    assert d.path == "tools[1]" and d.shared_prefix_tokens == prepare(a).segments[0].tokens
    check_byte_offset(d)
    assert canonical_bytes(b)[d.byte_offset:d.byte_offset + 5] == b"regex"


def test_message_block_and_string_content_divergence():
    a = base_body()
    b = edited(a, lambda x: x["messages"][2]["content"][0].update(content="parser.py:13"))
    d = pc.diff(a, b)
    assert d.path == "messages[2].content[0]"
    check_byte_offset(d)
    c = edited(a, lambda x: x["messages"][3].update(content="It is on line 13."))
    d = pc.diff(a, c)
    assert d.path == "messages[3].content"
    check_byte_offset(d)
    assert canonical_bytes(c)[d.byte_offset:d.byte_offset + 2] == b"3."


def test_change_at_first_byte_of_text_adds_no_partial_tokens():
    a = base_body()
    b = edited(a, lambda x: x["system"][1].update(text="Xroject rules"))
    d = pc.diff(a, b)
    text_start = segment_offset(d.current, 4 - 1) + len(b'{"text":"')
    assert d.byte_offset == text_start
    assert d.token_offset - d.shared_prefix_tokens <= 1


def test_pure_append_identical_and_truncation():
    a = base_body()
    b = edited(a, lambda x: x["messages"].append({"role": "user", "content": [text_block("thanks")]}))
    d = pc.diff(a, b)
    assert d.pure_append and d.path is None and d.byte_offset is None and d.token_offset is None
    assert d.appended == 1 and d.added == ("messages[4].content[0]",)
    assert d.shared_prefix_tokens == prepare(a).total_tokens
    same = pc.diff(a, copy.deepcopy(a))
    assert same.identical and same.pure_append and same.appended == 0
    back = pc.diff(b, a)  # the last message disappeared
    assert not back.pure_append and back.path == "messages[4].content[0]"
    assert back.removed == ("messages[4].content[0]",)
    # right after the last shared segment (messages sort before model/system/tools in canonical JSON)
    assert canonical_bytes(a)[: back.byte_offset].endswith(b'"It is on line 12."')
    assert canonical_bytes(a)[back.byte_offset:].startswith(b',"role":"assistant"}]')
    assert back.token_offset == back.shared_prefix_tokens == prepare(a).total_tokens


def test_message_boundary_and_role_changes():
    a = {"model": MODEL, "messages": [{"role": "user", "content": [text_block("one"), text_block("two")]}]}
    b = {"model": MODEL, "messages": [{"role": "user", "content": [text_block("one")]},
                                      {"role": "user", "content": [text_block("two")]}]}
    d = pc.diff(a, b)
    assert d.path == "messages[1].content[0]" and not d.pure_append
    assert d.byte_offset == segment_offset(d.current, 1)  # same bytes, new envelope: the segment start
    assert str(d.history_rewrite) == "message 0 (user) differs: message boundaries changed"
    c = {"model": MODEL,
         "messages": [{"role": "assistant", "content": [text_block("one"), text_block("two")]}]}
    assert pc.diff(a, c).path == "messages[0].content[0]"
    assert "role user -> assistant" in str(pc.diff(a, c).history_rewrite)


def test_top_level_fields_set_the_divergence_at_their_level():
    a = base_body()
    m = pc.diff(a, {**a, "model": "claude-haiku-4-5"})
    assert (m.path, m.field, m.index, m.shared_prefix_tokens, m.token_offset) == ("model", "model", 0, 0, 0)
    assert canonical_bytes(m.current.body)[m.byte_offset:m.byte_offset + 5] == b"haiku"
    tc = pc.diff(a, {**a, "tool_choice": {"type": "any"}})
    n_before_messages = 2 + 3
    assert (tc.path, tc.index) == ("tool_choice", n_before_messages)
    assert tc.shared_prefix_tokens == prepare(a).cumulative_tokens()[n_before_messages - 1]
    sp = pc.diff(a, {**a, "speed": "fast"})
    assert (sp.path, sp.index) == ("speed", 2)
    # a segment that differs earlier than the field's level wins
    both = edited(a, lambda x: x["tools"][0].update(description="Read any file."))
    both["tool_choice"] = {"type": "any"}
    assert pc.diff(a, both).path == "tools[0]"
    # unknown top-level fields are listed, not used
    other = pc.diff(a, {**a, "service_tier": "priority"})
    assert other.pure_append and [c.path for c in other.other_changes] == ["service_tier"]


# -- volatile fields ----------------------------------------------------------------------------

def test_volatile_fields_are_ignored_but_listed():
    a = base_body()
    b = {**copy.deepcopy(a), "max_tokens": 8192, "stream": True, "metadata": {"user_id": "u1"},
         "temperature": 0.2, "top_p": 0.9, "top_k": 5, "stop_sequences": ["END"],
         "cache_control": {"type": "ephemeral"}, "diagnostics": {"previous_message_id": "msg_01"}}
    d = pc.diff(a, b)
    assert d.identical and d.path is None
    assert sorted(c.path for c in d.ignored_changes) == sorted(VOLATILE_FIELDS)
    assert "max_tokens: 1024 -> 8192" in [str(c) for c in d.ignored_changes]
    assert d.raw_byte_offset is not None  # the literal byte compare does see them


def test_moved_cache_control_marker_is_no_divergence():
    marked = {"type": "ephemeral"}
    a = edited(base_body(), lambda x: x["messages"][1]["content"][1].update(cache_control=marked))
    b = base_body()  # the marker left messages[1] for the new last block
    b["messages"].append({"role": "user", "content": [text_block("fix it", cache_control=marked)]})
    d = pc.diff(a, b)
    assert d.pure_append and d.path is None and d.byte_offset is None
    (bp,) = [c for c in d.ignored_changes if c.path == "breakpoints"]
    assert bp.before == "messages[1].content[1] (5m)" and bp.after == "messages[4].content[0] (5m)"


def test_marker_on_the_divergent_block_is_skipped_in_the_byte_offset():
    a = base_body()
    b = edited(a, lambda x: x["system"][2].update(text="Memory: tabs.", cache_control={"type": "ephemeral"}))
    d = pc.diff(a, b)
    assert d.path == "system[2]"
    assert canonical_bytes(b)[d.byte_offset:d.byte_offset + 4] == b"tabs"
    # and with a key sorted before cache_control
    a2 = {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "abc"}]}]}
    b2 = edited(a2, lambda x: x["messages"][0]["content"][0].update(content="abd",
                                                                    cache_control={"type": "ephemeral"}))
    d2 = pc.diff(a2, b2)
    assert canonical_bytes(b2)[d2.byte_offset:d2.byte_offset + 1] == b"d"


# -- byte layout, property-tested ----------------------------------------------------------------

texts = st.text(max_size=30)
blocks = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda t: {"type": "tool_result", "tool_use_id": "x", "content": t}, texts),
    st.builds(lambda t: {"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}, texts),
)
messages = st.lists(
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "assistant", "ü\"ser"]),
              st.one_of(texts, st.lists(blocks, max_size=3))),
    max_size=5,
)
bodies = st.builds(
    lambda tools, system, msgs, extra: {"model": MODEL, **extra, **tools, **system, "messages": msgs},
    st.one_of(st.just({}), st.builds(lambda ns: {"tools": [{"name": n, "input_schema": {"type": "object"}}
                                                          for n in ns]}, st.lists(texts, max_size=3))),
    st.one_of(st.just({}), st.builds(lambda t: {"system": t}, texts),
              st.builds(lambda bs: {"system": bs}, st.lists(blocks, max_size=3))),
    messages,
    st.dictionaries(st.sampled_from(["max_tokens", "metadata", "a_field", "zz", "tool_choice"]),
                    st.integers(), max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_segment_offsets_match_the_serialisation(body):
    p = prepare(body)
    whole = canonical_bytes(body)
    for i, seg in enumerate(p.segments):
        off = segment_offset(p, i)
        assert whole[off:off + seg.nbytes] == canonical_bytes(seg.element), seg.path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies, st.data())
def test_divergence_byte_points_at_the_first_difference(body, data):
    p = prepare(body)
    editable = [i for i, s in enumerate(p.segments) if isinstance(s.element, str) or "text" in s.element
                or "content" in s.element]
    if not editable:
        return
    i = data.draw(st.sampled_from(editable))
    suffix = data.draw(st.text(min_size=1, max_size=5))
    b = copy.deepcopy(body)
    seg = prepare(b).segments[i]
    el = seg.element
    if isinstance(el, str):
        parent = b["system"] if seg.kind == "system" else b["messages"][seg.message_index]
        key = "system" if seg.kind == "system" else "content"
        (b if seg.kind == "system" else parent)[key] = el + suffix
    else:
        field = "text" if "text" in el else "content"
        el[field] = el[field] + suffix
    d = pc.diff(body, b)
    assert d.index == i and d.path == seg.path
    check_byte_offset(d)


# -- excerpts and invisible characters ------------------------------------------------------------

@pytest.mark.parametrize(("inserted", "shown"), [
    ("\u202e", "⟨RLO⟩"), ("\u2066", "⟨LRI⟩"), ("\u200f", "⟨RLM⟩"), ("\u200b", "⟨ZWSP⟩"), ("\u200d", "⟨ZWJ⟩"),
    ("\ufeff", "⟨BOM⟩"), ("\u2060", "⟨WJ⟩"), ("\x00", "⟨NUL⟩"), ("\x1b", "⟨ESC⟩"), ("\u00a0", "⟨NBSP⟩"),
])
def test_excerpt_makes_invisible_characters_visible(inserted, shown):
    a = base_body()
    b = edited(a, lambda x: x["system"][2].update(text="Memory: nothing" + inserted + " yet."))
    ex = pc.diff(a, b).excerpt
    assert ex.source == "text"
    assert ex.context.endswith("Memory: nothing")
    assert ex.current.startswith(shown) and inserted not in ex.current
    assert ex.previous.startswith(" yet.")


def test_trailing_spaces_and_newlines_are_visible():
    assert visible("a  \nb") == "a··↵b"
    assert visible("tab\there") == "tab⇥here"
    assert visible("end  ", ends_line=True) == "end··" and visible("mid  x") == "mid  x"
    a = {"model": MODEL, "system": "rule one\nrule two", "messages": []}
    b = {"model": MODEL, "system": "rule one  \nrule two", "messages": []}
    assert pc.diff(a, b).excerpt.current.startswith("··↵rule two")


def test_excerpt_for_json_segments_and_repr_is_short_and_deterministic():
    a = base_body()
    b = edited(a, lambda x: x["messages"][1]["content"][1]["input"].update(pattern="def parse_file"))
    d = pc.diff(a, b)
    assert d.excerpt.source == "json" and "_file" in d.excerpt.current
    r = repr(d)
    assert r == repr(pc.diff(a, b)) and "0x" not in r and len(r) < 150
    assert r.startswith("PrefixDiff(path='messages[1].content[1]', byte_offset=")  # the attribute names
    assert f"token_offset={d.token_offset}," in r


# -- HTML ----------------------------------------------------------------------------------------

ALLOWED_TAGS = {"div", "b", "i", "table", "tr", "th", "td", "pre", "mark", "span", "ul", "li", "code"}
_TAG = re.compile(r"</?(?:" + "|".join(sorted(ALLOWED_TAGS)) + r")(?:\s+[a-z-]+=\"[^\"<>]*\")*\s*>")


class _Checker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.bad: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in ALLOWED_TAGS:
            self.bad.append(tag)
        for name, value in attrs:
            if name == "class" and tag == "span" and value == NO_MATH_CLASSES:
                continue  # our own money escape (escape_dollars): a `$` of the content shown as money
            if name not in ("style", "title"):
                self.bad.append(f"{tag}@{name}")
        self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.bad.append(f"/{tag}")


def assert_safe_html(markup: str) -> None:
    stripped = _TAG.sub("", markup)
    assert "<" not in stripped and ">" not in stripped, stripped[:200]
    checker = _Checker()
    checker.feed(markup)
    checker.close()
    assert not checker.bad and not checker.stack, (checker.bad, checker.stack)


HOSTILE = ["<script>alert(1)</script>", '<img src=x onerror="alert(1)">', "</style><b>bold</b>",
           "</pre></td></tr></table><h1>x", "\"' onmouseover=alert(1) x='", "&amp;&lt;"]


@pytest.mark.parametrize("payload", HOSTILE)
def test_html_escapes_hostile_content(payload):
    a = base_body()
    b = edited(a, lambda x: x["system"][2].update(text="Memory: " + payload))
    b["metadata"] = {"user_id": payload}
    b["tools"][0]["name"] = payload
    d = pc.diff(a, b)
    markup = d._repr_html_()
    assert payload not in markup
    assert_safe_html(markup)
    assert "&lt;" in markup or "&quot;" in markup or "&#x27;" in markup or "&amp;" in markup


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(), st.text(), st.text(max_size=20))
def test_html_is_safe_for_arbitrary_unicode(old, new, name):
    a = {"model": MODEL, "tools": [{"name": "t", "input_schema": {}}], "system": [text_block(old)],
         "messages": [{"role": "user", "content": old}]}
    b = {"model": MODEL, "tools": [{"name": name, "input_schema": {}}], "system": [text_block(new)],
         "messages": [{"role": "user", "content": new}], "metadata": {"k": name}}
    markup = pc.diff(a, b)._repr_html_()
    assert_safe_html(markup)
    for ch in "\u202e\u2066\u200b\ufeff\x00":
        assert ch not in markup
    assert_safe_html(visible_html(old + new))


# -- inputs and helpers ---------------------------------------------------------------------------

def test_diff_accepts_bodies_prepared_requests_and_turns():
    a, b = base_body(), edited(base_body(), lambda x: x["system"][0].update(text="Other."))
    assert pc.diff(prepare(a), prepare(b)).path == pc.diff(a, b).path == "system[0]"
    with pytest.raises(TypeError, match="request bodies"):
        pc.diff("a", "b")
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="You are terse.", start=T0)
        t0, t1 = s.step("hi", reply="yo"), s.step("again", reply="yo")
        assert pc.diff(t0, t1).pure_append


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_common_prefix_length(a, b):
    n = common_prefix_length(a, b)
    assert a[:n] == b[:n] and (n == min(len(a), len(b)) or a[n] != b[n])


# -- through a session ----------------------------------------------------------------------------

HOST = "You are a careful support agent for a billing platform. " * 120


def test_session_stores_the_diff_columns():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, start=T0)
        s.step("hello", reply="hi", at=T0)
        t1 = s.step("next", reply="ok", at=T0 + timedelta(seconds=10))
        s.edit_host_prompt(append=" ZEBRA rule.")
        t2 = s.step("again", reply="ok", at=T0 + timedelta(seconds=20))
        df = s.turns()
        assert df.diverge_path.isna().tolist() == [True, True, False]
        assert df.pure_append.isna()[0] and bool(df.pure_append[1]) and not bool(df.pure_append[2])
        assert t1.diff.pure_append and t1.diff.appended == 2
        row = df.iloc[2]
        assert row.diverge_path == "system[0]" and row.diverge_byte == t2.diff.byte_offset
        assert canonical_bytes(t2.request)[row.diverge_byte:row.diverge_byte + 6] == b" ZEBRA"
        assert row.diverge_token == t2.diff.token_offset and row.shared_prefix_tokens == 0
        assert not row.pure_append
        stored = s.turn(2)
        assert (stored.diff.path, stored.diff.byte_offset) == ("system[0]", t2.diff.byte_offset)
        assert repr(stored.diff) == repr(t2.diff)


def test_insertion_reads_as_one_added_segment_and_shifted_ones():
    a = base_body()
    b = edited(a, lambda x: x["messages"].insert(1, {"role": "user", "content": [text_block("(note)")]}))
    d = pc.diff(a, b)
    assert d.path == "messages[1].content[0]"
    assert d.added == ("messages[1].content[0]",) and d.removed == () and d.changed == ()
    assert d.moved == 4  # the four blocks after the insertion, one message further on
    # repeated content is matched once per occurrence, not reported as moved
    c = edited(a, lambda x: x["system"].__setitem__(0, text_block("New head.")))
    c["messages"] += [{"role": "assistant", "content": [text_block("Looking.")]}]  # same as messages[1]
    d = pc.diff(a, c)
    assert d.changed == ("system[0]",) and d.added == ("messages[4].content[0]",) and d.moved == 0
