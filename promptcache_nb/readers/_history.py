"""Parsing logged request bodies that repeat the previous body's conversation history.

A log of an agent holds one whole request body per call, and each body repeats the history of the one before
with a few items appended: parsing every line whole costs the full history each time, and the fresh objects it
makes must then be compared in depth (``marshal``) to find the shared prefix. Equal JSON text parses to equal
values, type for type (``1`` and ``1.0`` are different texts), so a history item whose text equals the previous
body's item at the same index *is* that item: :class:`HistoryDecoder` hands back the previous parse's object
instead of parsing it again, and the segmenter then recognises the shared prefix by identity.

Only the path to the body and its history arrays (``messages``, ``input``; or the body itself when it *is* the
history: Gemini CLI's telemetry logs each request's ``contents`` list as its ``request_text``) are walked here,
with the standard library's C scanner parsing every other value; anything the walk does not expect falls back to
``json.loads`` (whose result, or error, is then the answer). A property test checks the result equals
``json.loads``.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._util import common_prefix_length

__all__ = ["HistoryDecoder"]

_WS = re.compile(r"[ \t\n\r]*")
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # (text, index) -> (value, end): the C scanner json.loads uses
_DELIMITED_END = frozenset('}]"')  # a value ending in one of these ends there, whatever follows
_HEAD = 256  # characters of the first item compared to pick the previous history of the same conversation
_RECENT = 8  # histories remembered: interleaved conversations in one log each find their own previous body
_BODY = ""  # the key a history that is the body itself is remembered under (a body's own keys are never "")


@dataclass(frozen=True)
class _History:
    """One body's history array: the text from its first item's start to its last item's end, and per item the
    end offset in that text and the parsed value."""

    key: str
    text: str
    ends: list[int]
    items: list[Any]

    @property
    def head(self) -> str:
        return self.text[:_HEAD]


class _Fallback(Exception):
    """The walk met something it does not handle: parse with ``json.loads`` instead."""


class HistoryDecoder:
    """``loads`` for a sequence of JSON documents holding request bodies; see the module docstring.

    Args:
        body_path: keys leading from the document to the request body (``("request",)`` for the proxy's exchange
            lines; ``()`` when the document is the body).
        keys: the body's history arrays.
        array_body: the body may itself be the history array (a list of turns, as Gemini's ``contents``).
    """

    def __init__(self, body_path: Sequence[str] = (), keys: Sequence[str] = ("messages", "input"), *,
                 array_body: bool = False) -> None:
        self.body_path = tuple(body_path)
        self.keys = frozenset(keys)
        self.array_body = array_body
        self._recent: list[_History] = []
        self._found: list[_History] = []
        self.reused = 0  # history items handed back from a previous body (for tests and benchmarks)
        self._openers = b"{[" if array_body else b"{"
        # what a key on the body path may open to be walked: an object, or at its end an array body
        self._descend = ("{", "{[" if array_body else "{")

    def loads(self, data: str | bytes) -> Any:
        """The document ``data`` (a line, with or without its newline) parsed; equal to ``json.loads(data)``."""
        if isinstance(data, bytes):
            # json.loads(bytes) detects UTF-16/32 from NUL bytes: only plain UTF-8 text is walked here
            if len(data) < 2 or data[0] not in self._openers or data[1] == 0:
                return json.loads(data)
            try:
                text = data.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                return json.loads(data)  # its error
        else:
            text = data
        self._found = []
        try:
            value, end = self._value(text, _WS.match(text, 0).end(), self.body_path)  # type: ignore[union-attr]
            if _WS.match(text, end).end() != len(text):  # type: ignore[union-attr]
                raise _Fallback
        except (_Fallback, ValueError, StopIteration, IndexError, RecursionError):
            return json.loads(text)
        for found in self._found:  # the bodies' histories, most recent first
            self._recent = [found, *(h for h in self._recent if h.key != found.key or h.head != found.head)]
            del self._recent[_RECENT:]
        return value

    # -- the walk --------------------------------------------------------------------------------------------
    def _value(self, text: str, i: int, path: tuple[str, ...]) -> tuple[Any, int]:
        if not path and self.array_body and text[i] == "[":
            return self._history(text, i, _BODY)
        if text[i] != "{":
            if path:
                raise _Fallback  # not the shape expected: the body is not where the path says
            value, end = _SCAN(text, i)
            return value, int(end)
        return self._object(text, i, path)

    def _object(self, text: str, i: int, path: tuple[str, ...]) -> tuple[dict[str, Any], int]:
        """The object at ``text[i] == "{"``, descending along ``path``; at the body (``path`` empty) its history
        arrays are read by :meth:`_history`. Later duplicate keys win, as in ``json.loads``."""
        obj: dict[str, Any] = {}
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
        if text[i] == "}":
            return obj, i + 1
        while True:
            if text[i] != '"':
                raise _Fallback
            key, i = _SCAN(text, i)
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i] != ":":
                raise _Fallback
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            if path and key == path[0] and text[i] in self._descend[len(path) == 1]:
                obj[key], i = self._value(text, i, path[1:])
            elif not path and key in self.keys and text[i] == "[":
                obj[key], i = self._history(text, i, key)
            else:
                obj[key], i = _SCAN(text, i)
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if text[i] == ",":
                i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            elif text[i] == "}":
                return obj, i + 1
            else:
                raise _Fallback

    def _history(self, text: str, i: int, key: str) -> tuple[list[Any], int]:
        """The array at ``text[i] == "["``: the leading items whose text repeats a recent body's are that body's
        objects; the rest are parsed."""
        start = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
        if text[start] == "]":
            return [], start + 1
        items: list[Any] = []
        ends: list[int] = []
        prev = next((h for h in self._recent if h.key == key and text.startswith(h.head, start)), None)
        if prev is not None:
            if text.startswith(prev.text, start):
                shared = len(prev.text)
            else:
                shared = common_prefix_length(text[start:start + len(prev.text)], prev.text)
            n = bisect_right(prev.ends, shared)
            if n and prev.ends[n - 1] == shared and prev.text[shared - 1] not in _DELIMITED_END:
                n -= 1  # a number or literal that may continue in this text ("12" then "123")
            if n:
                items, ends = prev.items[:n], prev.ends[:n]
                self.reused += n
        if ends:  # after the reused items: a separator, or the end of the array
            i = _WS.match(text, start + ends[-1]).end()  # type: ignore[union-attr]
            if text[i] == "]":
                return self._done(key, text, start, ends, items), i + 1
            if text[i] != ",":
                raise _Fallback
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
        else:
            i = start
        while True:
            value, end = _SCAN(text, i)
            items.append(value)
            ends.append(end - start)
            i = _WS.match(text, end).end()  # type: ignore[union-attr]
            if text[i] == ",":
                i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            elif text[i] == "]":
                return self._done(key, text, start, ends, items), i + 1
            else:
                raise _Fallback

    def _done(self, key: str, text: str, start: int, ends: list[int], items: list[Any]) -> list[Any]:
        self._found.insert(0, _History(key, text[start:start + ends[-1]], ends, items))
        return list(items)
