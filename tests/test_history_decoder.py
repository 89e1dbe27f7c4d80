"""HistoryDecoder: a body's repeated history is the previous parse's objects, and the result is always exactly
``json.loads``'s (type for type: compared through marshal, which tells ``1`` from ``1.0`` and ``True``)."""

from __future__ import annotations

import json
import marshal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptcache_nb.readers._history import HistoryDecoder

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False), st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=8)
ITEMS = st.one_of(  # history items: mostly messages, sometimes a bare number or literal (it must still be exact)
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": VALUES}),
    st.integers(0, 200), st.sampled_from(["true", "1", "1.0", "null"]).map(json.loads), VALUES)


def same(a: Any, b: Any) -> bool:
    return marshal.dumps(a, 2) == marshal.dumps(b, 2)


def line(body: dict, *, at: int, indent: int | None = None, separators: tuple[str, str] | None = None) -> str:
    return json.dumps({"v": 1, "at": f"2026-11-02T09:00:{at:02d}Z", "request": body, "usage": {"x": at}},
                      indent=indent, separators=separators, ensure_ascii=at % 2 == 0)


@pytest.mark.parametrize("array_body", [False, True])
@settings(max_examples=120, deadline=None)
@given(history=st.lists(ITEMS, min_size=1, max_size=12), edits=st.lists(
    st.tuples(st.sampled_from(["append", "edit", "drop", "retype", "space"]), st.integers(0, 11), ITEMS),
    min_size=1, max_size=8))
def test_every_line_parses_exactly_as_json_loads_does(array_body: bool, history: list, edits: list) -> None:
    # array_body: each document is the history itself (Gemini CLI's request_text, a JSON list of contents)
    decoder = HistoryDecoder(array_body=True) if array_body else HistoryDecoder(("request",))
    bodies = []
    items = list(history)
    for step, (kind, where, item) in enumerate(edits):
        if kind == "append":
            items = [*items, item]
        elif kind == "edit" and items:
            items = [*items[:where % len(items)], item, *items[where % len(items) + 1:]]
        elif kind == "drop" and items:
            items = items[1:]
        elif kind == "retype" and items:  # the same value as a float: equal under ==, not the same JSON
            items = [1.0 if x == 1 and not isinstance(x, bool) else x for x in items] + [1]
        indent = 1 if kind == "space" else None
        bodies.append(json.dumps(items, indent=indent, ensure_ascii=step % 2 == 0) if array_body
                      else line({"model": "m", "system": "s", "messages": items}, at=step, indent=indent))
    for text in bodies:
        for data in (text, text.encode("utf-8") + b"\n"):
            got, want = decoder.loads(data), json.loads(data)
            assert same(got, want)


def test_a_body_that_is_the_history_array_is_reused_by_identity() -> None:
    decoder = HistoryDecoder(array_body=True)
    contents: list[dict] = []
    parsed = []
    for i in range(5):
        contents = [*contents, {"role": "user", "parts": [{"text": f"q{i}"}]}]
        parsed.append(decoder.loads(json.dumps(contents)))
        assert parsed[-1] == contents
        contents = [*contents, {"role": "model", "parts": [{"text": f"a{i}"}]}]
    assert all(x is y for x, y in zip(parsed[-1], parsed[-2], strict=False))
    assert decoder.reused == sum(2 * i - 1 for i in range(1, 5))
    # a document that is no array, or an array where an object body is expected, is json.loads's
    assert decoder.loads('{"messages": [1]}') == {"messages": [1]}
    assert HistoryDecoder().loads("[1, 2]") == [1, 2]


def test_a_growing_history_is_reused_by_identity_and_interleaved_conversations_find_their_own() -> None:
    decoder = HistoryDecoder(("request",))
    convs: dict[str, list[dict]] = {"a": [], "b": []}
    parsed: dict[str, list[dict]] = {"a": [], "b": []}
    for i in range(6):
        for name in ("a", "b"):
            convs[name] = [*convs[name], {"role": "user", "content": f"{name} question {i}"}]
            got = decoder.loads(line({"model": "m", "messages": convs[name]}, at=i))
            assert got == json.loads(line({"model": "m", "messages": convs[name]}, at=i))
            parsed[name].append(got)
            convs[name] = [*convs[name], {"role": "assistant", "content": f"{name} answer {i}"}]
    for name in ("a", "b"):
        last, before = parsed[name][-1]["request"]["messages"], parsed[name][-2]["request"]["messages"]
        assert all(x is y for x, y in zip(last, before, strict=False))  # the history: the very same objects
        assert last is not before  # a list of its own
    # each body repeats all of the one before it (the reply it got is new): 2i - 1 items at step i
    assert decoder.reused == 2 * sum(2 * i - 1 for i in range(1, 6))


def test_a_number_that_continues_is_not_taken_for_the_previous_one() -> None:
    decoder = HistoryDecoder()
    assert decoder.loads('{"messages": [1, 12]}')["messages"] == [1, 12]
    got = decoder.loads('{"messages": [1, 123]}')
    assert got["messages"] == [1, 123]
    assert same(decoder.loads('{"messages": [1, 1.0]}'), {"messages": [1, 1.0]})


@pytest.mark.parametrize("bad", ['{"request": {"messages": [1, 2}', '{"request": {"messages": [1,]}}',
                                 '{"request": 1} x', '\ufeff{"request": {}}', '{"request": {"messages": [NaN]}}',
                                 '[1, 2]', '{"a": "\\ud800"}', b'\xff{"a": 1}', b'{"a": "\xff"}',
                                 '{"request": {"messages": [{"a": 1}, {"a": "\x01"}]}}'])
def test_bad_text_fails_or_parses_exactly_as_json_loads(bad: str | bytes) -> None:
    decoder = HistoryDecoder(("request",))
    decoder.loads('{"request": {"messages": [1, 2]}}')
    try:
        want: Any = json.loads(bad)
    except ValueError as exc:
        with pytest.raises(type(exc)) as got:
            decoder.loads(bad)
        assert str(got.value) == str(exc)
    else:
        assert same(decoder.loads(bad), want)


def test_utf16_and_bom_bytes_fall_back_to_json_loads() -> None:
    for data in ('{"messages": [1]}'.encode("utf-16"), b'\xef\xbb\xbf{"messages": [1]}'):
        assert HistoryDecoder().loads(data) == {"messages": [1]}
