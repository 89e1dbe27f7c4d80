"""Prefix diff: where the cache prefix of one request stops matching the request before it.

Anthropic's cache matches exact prefixes in the order tools → system → messages
(docs/provider_cache_rules.md#anthropic-prefix-order), so the question for two consecutive requests is
"where is the first position the cache can no longer match?". :func:`diff` answers it at three levels:

* **segment path** — ``system[2]``, ``messages[7].content[0]``, ``tools[4]`` (or a top-level field such as
  ``model`` or ``tool_choice`` when that field invalidates the cache before any segment differs);
* **byte offset** — see :attr:`PrefixDiff.byte_offset`;
* **token offset** — estimated: tokens of the whole segments before the divergence plus the share of the
  divergent segment that still matches.

Segments are compared by content hash first (one comparison per segment, at C speed), bytes only
inside the one segment that differs, so two 1 MB prepared requests diff in about a millisecond.

Two raw bodies are not prepared whole: their units (tools, system blocks, messages, input items) are
compared as Python objects at C speed up to the first unit that differs, and only that unit is hashed
(``BodyPlan``, request/_canonical.py). What the offsets and the excerpt need — the segments up to the
divergence, with their token estimates — is prepared on first access; what needs whole bodies
(``previous``, ``current``, the added/removed lists, ``ignored_changes``' breakpoints) too. A raw body is
checked as far as it is read: a malformed part after the divergence raises when the whole request is
needed. Do not mutate the bodies while you use their diff.

Volatile fields never change what the cache matches and are ignored for the divergence, but listed in
:attr:`PrefixDiff.ignored_changes`: ``cache_control`` markers (and their moves), ``max_tokens``,
``stream``, ``metadata``, and the sampling parameters ``temperature``, ``top_p``, ``top_k``,
``stop_sequences``.

OpenAI Chat Completions and Responses bodies diff the same way over their own segments (tools → schema
→ system/instructions → messages/input, docs/provider_cache_rules.md#openai-prefix-order); their
volatile fields are :data:`OPENAI_VOLATILE_FIELDS` and only ``model`` is a cache-relevant field (the
effect of the others on OpenAI's prefix is not documented: they are listed as ``other_changes``).

A partial body's unlogged prefix (docs/provider_cache_rules.md#unlogged-prefix) is one segment whose only
content is its measured size. When the first divergence is there, :attr:`PrefixDiff.unlogged` is true and the
diff says so plainly: the change lies outside the logged content and cannot be located (no byte or token
offset, no excerpt).
"""

from __future__ import annotations

import dataclasses
import functools
import html
import io
import json
import pickle
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, count
from operator import attrgetter, is_not, itemgetter, ne
from typing import Any

from .._util import common_prefix_length, escape_dollars
from ..dialects._openai import FIELD_LEVELS as OPENAI_FIELD_LEVELS  # noqa: F401  (their old home)
from ..dialects._openai import VOLATILE_FIELDS as OPENAI_VOLATILE_FIELDS  # noqa: F401
from ..dialects.anthropic import FIELD_LEVELS as FIELD_LEVELS
from ..dialects.anthropic import VOLATILE_FIELDS as VOLATILE_FIELDS
from ._canonical import (
    BodyPlan,
    PreparedRequest,
    Segment,
    SegmentMemo,
    canonical_bytes,
    canonical_json,
    prepare,
    shared_prefix_of,
)

# The volatile and cache-relevant top-level fields of each format (``Dialect.volatile_fields``, ``field_levels``);
# the names below are their old home.
_WHOLE_KINDS = ("msg-whole", "item")
_EXCERPT_BEFORE = 40
_EXCERPT_AFTER = 40


# -- small helpers ------------------------------------------------------------------------------



def _short(value: Any, limit: int = 60) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = canonical_json(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_ABSENT = object()


@dataclass(frozen=True)
class FieldChange:
    """A top-level field (or the set of ``cache_control`` breakpoints) that differs between two requests.

    ``before`` and ``after`` are short canonical JSON renderings (``(absent)`` when missing).
    """

    path: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.path}: {self.before} -> {self.after}"


@dataclass(frozen=True)
class HistoryRewrite:
    """The first place where the previous request's messages are not a prefix of the current ones."""

    message_index: int
    role: str | None
    what: str

    def __str__(self) -> str:
        return f"message {self.message_index} ({self.role or 'unknown'}) differs: {self.what}"


@dataclass(frozen=True)
class Excerpt:
    """Text around a divergence, invisible characters made visible (see :func:`visible`).

    ``context`` is what both sides share just before the divergence; ``previous`` and ``current`` are
    how each side continues. ``source`` says what the text is: ``text`` (the block's text as the model
    sees it) or ``json`` (the segment's canonical JSON, ``cache_control`` removed).
    """

    context: str
    previous: str
    current: str
    source: str
    context_truncated: bool = False
    # raw text (context, previous, current) and whether each side reaches the end of its text
    raw: tuple[str, str, str, bool, bool] = dataclasses.field(
        default=("", "", "", True, True), repr=False, compare=False)

    def html_sides(self) -> tuple[str, str]:
        """(previous, current) as escaped HTML, invisible characters highlighted, divergence marked."""
        ctx, a, b, a_end, b_end = self.raw
        lead = "…" if self.context_truncated else ""
        head = lead + visible_html(ctx)
        end = '<i style="color:#6b7280">(end)</i>'

        def side(text: str, at_end: bool, colour: str) -> str:
            body = visible_html(text, ends_line=at_end) or end
            return f'{head}<mark style="background:{colour}">{body}</mark>{"" if at_end else "…"}'

        return side(a, a_end, "#fecaca"), side(b, b_end, "#bbf7d0")

    def __str__(self) -> str:
        lead = "…" if self.context_truncated else ""
        return f"{lead}{self.context}⟪ {self.previous or '(end)'} ⟫ → ⟪ {self.current or '(end)'} ⟫"


# -- invisible characters ----------------------------------------------------------------------

_C0 = (
    "NUL SOH STX ETX EOT ENQ ACK BEL BS TAB LF VT FF CR SO SI DLE DC1 DC2 DC3 DC4 NAK SYN ETB CAN EM SUB "
    "ESC FS GS RS US"
).split()
_NAMED = {i: name for i, name in enumerate(_C0)}
_NAMED.update({
    0x7F: "DEL", 0xAD: "SHY", 0x61C: "ALM", 0x180E: "MVS", 0x200B: "ZWSP", 0x200C: "ZWNJ", 0x200D: "ZWJ",
    0x200E: "LRM", 0x200F: "RLM", 0x2028: "LSEP", 0x2029: "PSEP", 0x202A: "LRE", 0x202B: "RLE",
    0x202C: "PDF", 0x202D: "LRO", 0x202E: "RLO", 0x2060: "WJ", 0x2061: "FA", 0x2062: "IT", 0x2063: "IS",
    0x2064: "IP", 0x2066: "LRI", 0x2067: "RLI", 0x2068: "FSI", 0x2069: "PDI", 0xFEFF: "BOM",
    0xA0: "NBSP", 0x202F: "NNBSP", 0x3000: "IDSP",
})
_NAMED.update({c: f"U+{c:04X}" for c in range(0x80, 0xA0)})  # C1 controls
_NAMED.update({0x34F: "CGJ", 0x115F: "HCF", 0x1160: "HJF", 0x3164: "HF", 0xFFA0: "HWHF"})
_SHORT = {0x0A: "↵", 0x09: "⇥"}  # frequent in prompts: a compact glyph instead of ⟨LF⟩

#: Names of the code points Python calls printable that show nothing: Unicode's default-ignorable code points
#: that are not format characters (UAX #44: Variation_Selector and Other_Default_Ignorable_Code_Point — the
#: combining grapheme joiner, Khmer inherent vowels, Hangul and other fillers) and blank fillers such as
#: U+2800 BRAILLE PATTERN BLANK.
_FILLER_NAME = re.compile(r"VARIATION SELECTOR|\bFILLER\b|COMBINING GRAPHEME JOINER|BRAILLE PATTERN BLANK|"
                          r"KHMER VOWEL INHERENT")
#: The fillers the issue that asked for this found shown raw (kept even if a Unicode version renamed one).
_KNOWN_FILLERS = (0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x034F, 0x17B4)


#: What ``_derive_fillers`` gives under the Unicode versions of Python 3.11-3.13 (14.0.0, 15.0.0, 15.1.0), as
#: ranges of code points: deriving costs a process 0.2-0.6 s at its first non-ASCII text. Any other version derives;
#: tests/reliability/test_hardening2.py checks the ranges against the derivation.
_FILLER_RANGES = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180D), (0x180F, 0x180F),
                  (0x2800, 0x2800), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0x16FE4, 0x16FE4),
                  (0xE0100, 0xE01EF))
_FILLER_RANGES_UNICODE = ("14.0.0", "15.0.0", "15.1.0")


@functools.cache
def _fillers() -> frozenset[str]:
    """The printable-but-invisible characters (``_derive_fillers``), from the table when it holds this Unicode
    version."""
    if unicodedata.unidata_version in _FILLER_RANGES_UNICODE:
        return frozenset(chr(cp) for first, last in _FILLER_RANGES for cp in range(first, last + 1))
    return _derive_fillers()


def _derive_fillers() -> frozenset[str]:
    """The printable-but-invisible characters, derived from ``unicodedata`` (0.2-0.6 s): every
    assigned code point ``str.isprintable`` accepts whose name marks it a filler or a variation selector and
    whose category is a mark, letter or symbol (the "GAP FILLER" punctuation of Indic scripts has a glyph).
    Everything else invisible — format (Cf: bidi controls, zero-width characters, tags, the rest of
    Default_Ignorable_Code_Point), controls, unassigned, separators — is what ``str.isprintable`` already
    refuses."""
    found = {ch for cp in range(0x110000)
             if (ch := chr(cp)).isprintable() and _FILLER_NAME.search(unicodedata.name(ch, ""))
             and unicodedata.category(ch) in ("Mn", "Lo", "So")}
    found.update(map(chr, _KNOWN_FILLERS))
    return frozenset(found)


def _is_invisible(ch: str) -> bool:
    # str.isprintable() is False exactly for the Other (C*) and Separator (Z*) categories, bar " "
    return not ch.isprintable() or ord(ch) in _NAMED or (not ch.isascii() and ch in _fillers())


def _pieces(text: str, *, ends_line: bool) -> list[tuple[bool, str, str]]:
    """Split text into (invisible?, shown, title) pieces; trailing spaces before a newline count."""
    if (text.isprintable() and not (ends_line and text.endswith(" "))
            and (text.isascii() or _fillers().isdisjoint(text))):
        return [(False, text, "")] if text else []  # the common case, at C speed
    out: list[tuple[bool, str, str]] = []
    run: list[str] = []
    n = len(text)
    i = 0
    while i < n:
        ch = text[i]
        if ch == " ":
            j = i
            while j < n and text[j] == " ":
                j += 1
            trailing = (j < n and text[j] in "\r\n") or (j == n and ends_line)
            if trailing:
                if run:
                    out.append((False, "".join(run), ""))
                    run = []
                out.append((True, "·" * (j - i), f"{j - i} trailing space(s)"))
            else:
                run.append(text[i:j])
            i = j
            continue
        if _is_invisible(ch):
            if run:
                out.append((False, "".join(run), ""))
                run = []
            cp = ord(ch)
            name = _NAMED.get(cp) or f"U+{cp:04X}"
            shown = _SHORT.get(cp, f"⟨{name}⟩")
            try:
                long_name = unicodedata.name(ch)
            except ValueError:
                long_name = name
            out.append((True, shown, f"U+{cp:04X} {long_name}"))
        else:
            run.append(ch)
        i += 1
    if run:
        out.append((False, "".join(run), ""))
    return out


def visible(text: str, *, ends_line: bool = False) -> str:
    """``text`` with invisible characters shown: ``⟨RLO⟩``, ``⟨ZWSP⟩``, ``⟨NUL⟩``, ``↵`` (newline),
    ``⇥`` (tab), ``·`` (a trailing space before a newline, or at the end when ``ends_line``).

    Covers bidi controls (U+202A–202E, U+2066–2069, U+200E/F, U+061C), zero-width characters
    (U+200B–200D, U+2060, U+FEFF), C0/C1 controls, soft hyphens, spaces other than U+0020 (``⟨NBSP⟩``),
    every other character Python does not call printable (format, private-use, unassigned), and the
    printable ones that show nothing: Unicode's other default-ignorable code points (variation selectors,
    U+034F COMBINING GRAPHEME JOINER ``⟨CGJ⟩``, U+17B4/17B5 Khmer inherent vowels, the Hangul fillers
    U+115F, U+1160, U+3164 ``⟨HF⟩``, U+FFA0) and blank fillers (U+2800 BRAILLE PATTERN BLANK), derived from
    ``unicodedata``.

    Example:
        >>> visible("a\u3164b\u200bc\n")
        'a⟨HF⟩b⟨ZWSP⟩c↵'
    """
    return "".join(shown for _, shown, _ in _pieces(text, ends_line=ends_line))


_INV_STYLE = "background:#fde68a;color:#92400e;border-radius:2px;padding:0 1px"


def visible_html(text: str, *, ends_line: bool = False) -> str:
    """Like :func:`visible`, HTML-escaped, with the markers highlighted (titles name the code point)."""
    parts = []
    for invisible, shown, title in _pieces(text, ends_line=ends_line):
        if invisible:
            title = html.escape(title)
            parts.append(f'<span style="{_INV_STYLE}" title="{title}">{html.escape(shown)}</span>')
        else:
            parts.append(html.escape(shown))
    return "".join(parts)


# -- per-request facts, memoised by identity ----------------------------------------------------

class _Info:
    """Per-request facts for diffing: what the cache matches per segment, as parallel lists (three C-speed
    ``map`` passes, no per-segment tuples), plus section starts and the breakpoints."""

    __slots__ = ("_keys", "hashes", "kinds", "mark_at", "marks", "msg_start", "roles", "sys_start", "tool_start")

    def __init__(self, segs: Any, bounds: tuple[int, int, int], mark_at: tuple[tuple[int, str], ...],
                 like: tuple[_Info, int] | None = None) -> None:
        if like is None:
            self.hashes: list[str] = list(map(_HASH, segs))
            self.kinds: list[str] = list(map(_KIND, segs))
            self.roles: list[str | None] = list(map(_ROLE_ATTR, segs))
        else:  # the first k segments are another request's very objects: copy its lists (memcpy speed)
            other, k = like
            tail = segs[k:]
            self.hashes = other.hashes[:k] + list(map(_HASH, tail))
            self.kinds = other.kinds[:k] + list(map(_KIND, tail))
            self.roles = other.roles[:k] + list(map(_ROLE_ATTR, tail))
        self.tool_start, self.sys_start, self.msg_start = bounds
        self.mark_at = mark_at  # (segment index, "path (ttl)") of each cache_control marker
        self.marks = tuple(m for _, m in mark_at)
        self._keys: list[tuple[str, str | None, str]] | None = None

    @property
    def keys(self) -> list[tuple[str, str | None, str]]:
        """(kind, role, content hash) per segment, built on first use (display paths only)."""
        if self._keys is None:
            self._keys = list(zip(self.kinds, self.roles, self.hashes, strict=True))
        return self._keys

    def __len__(self) -> int:
        return len(self.hashes)


def _common_run(a: _Info, b: _Info, a0: int = 0, b0: int = 0) -> int:
    """Length of the common run of segment keys of ``a`` from ``a0`` and ``b`` from ``b0``."""
    def cut(xs: list[Any], start: int) -> list[Any]:
        return xs if start == 0 else xs[start:]

    return min(
        common_prefix_length(cut(a.hashes, a0), cut(b.hashes, b0)),
        common_prefix_length(cut(a.kinds, a0), cut(b.kinds, b0)),
        common_prefix_length(cut(a.roles, a0), cut(b.roles, b0)),
    )


_HASH = attrgetter("content_hash")
_ROLE_ATTR = attrgetter("role")
_TOKENS: Callable[[Segment], int] = attrgetter("tokens")
_CACHE_CONTROL = attrgetter("cache_control")
_NBYTES: Callable[[Segment], int] = attrgetter("nbytes")
_KIND = attrgetter("kind")
_ROLE = itemgetter("role")


def sections(p: PreparedRequest | BodyPlan) -> tuple[int, int, int]:
    """Where the tools, system and messages levels start in ``p.segments`` (any dialect; the unlogged
    prefix, when present, is segment 0, before the tools). The system level holds Anthropic system blocks,
    and OpenAI's structured-output schema and Responses ``instructions``."""
    shape, body, rest = p.shape, p.body, p.rest
    t0 = 0 if shape.get("unlogged") is None else 1
    n_tools = len(body["tools"]) if shape.get("tools") == "list" else 0
    n_sys = p.wire.system_count(body, shape, rest)
    return t0, t0 + n_tools, t0 + n_tools + n_sys


def _info(p: PreparedRequest, like: PreparedRequest | None = None) -> _Info:
    # A session diffs request k against k-1, then k+1 against k: kept with the request (its derived data),
    # each request's O(segments) pass happens once.
    hit = p.derived.diff_info
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    segs = p.segments
    reuse = None
    k = shared_prefix_of(p, like) if like is not None else 0
    other = like.derived.diff_info if k and like is not None else None
    start, mark_at = 0, []
    if other is not None:
        reuse = (other, k)  # the leading segments are like's very objects: copy its lists
        start, mark_at = k, [m for m in other.mark_at if m[0] < k]  # ... and its markers among them
    # C-speed passes (map/attrgetter/compress) over the segments after the shared run only
    tail = segs[start:] if start else segs
    for i, s in zip(compress(range(start, len(segs)), map(_CACHE_CONTROL, tail)),
                    compress(tail, map(_CACHE_CONTROL, tail)), strict=True):  # a marker is a non-empty dict
        cc = s.cache_control
        mark_at.append((i, f"{s.path} ({cc.get('ttl', '5m') if isinstance(cc, dict) else '?'})"))
    info = _Info(segs, sections(p), tuple(mark_at), reuse)
    p.derived.diff_info = info
    return info


def marker_indices(p: PreparedRequest) -> list[int]:
    """Indices of the segments that carry a ``cache_control`` marker (memoised per request, extended from
    the request it was prepared after: O(new segments))."""
    return [i for i, _ in _info(p).mark_at]


# -- canonical byte layout ----------------------------------------------------------------------
# canonical_json sorts keys, so a body serialises as {"cache_control":…,"max_tokens":…,"messages":[…],
# "model":…,"system":[…],"tools":[…]}. Offsets are computed from each segment's memoised byte length
# (Segment.nbytes) instead of serialising the body again.

_CONTENT_OPEN = len(b'{"content":')
_ROLE_OPEN = len(b',"role":')


def _list_size(segs: Any, a: int, b: int) -> int:
    n = b - a
    return 2 + sum(map(_NBYTES, segs[a:b])) + max(0, n - 1)


def _role_bytes(messages: list[dict[str, Any]]) -> int:
    counts = Counter(map(_ROLE, messages))
    return sum(len(canonical_bytes(role)) * k for role, k in counts.items())


def _messages_bytes(p: PreparedRequest, info: _Info, upto_seg: int, upto_msg: int) -> int:
    """Bytes of the complete messages ``[0, upto_msg)`` whose segments are ``[msg_start, upto_seg)``,
    each with its trailing comma."""
    segs = p.segments[info.msg_start:upto_seg]
    kinds = list(map(_KIND, segs))
    n_lists = kinds.count("msg-start")
    n_later_blocks = kinds.count("msg")
    return (
        sum(map(_NBYTES, segs))
        + upto_msg * (_CONTENT_OPEN + _ROLE_OPEN + 1 + 1)  # envelope, closing brace, comma
        + _role_bytes(p.body["messages"][:upto_msg])
        + 2 * n_lists + n_later_blocks  # [ ] of list contents, commas between blocks
    )


def _value_size(p: PreparedRequest, info: _Info, key: str) -> int:
    body = p.body
    value = body[key]
    segs = p.segments
    if value is None or key in p.rest or p.derived.partial:
        # a prefix (BodyPlan.prefix) has no segments past the divergence to add up: measure the value
        return len(canonical_bytes(value))
    if key == "tools":
        return _list_size(segs, info.tool_start, info.sys_start)
    if p.wire.whole_units:
        if isinstance(value, list):  # messages / input: one segment per element
            return _list_size(segs, info.msg_start, len(segs))
        return segs[_scalar_index(info, key)].nbytes
    if key == "system":
        if isinstance(value, str):
            return segs[info.sys_start].nbytes
        return _list_size(segs, info.sys_start, info.msg_start)
    n_msgs = len(value)
    if n_msgs == 0:
        return 2
    return 1 + _messages_bytes(p, info, len(segs), n_msgs)  # '[' + messages with commas (last → ']')


def _key_offset(p: PreparedRequest, info: _Info, key: str) -> int:
    """Offset of ``key``'s value in the canonical bytes (or, when absent, of where its entry would go)."""
    off = 1
    for k in sorted(p.body):
        if k == key:
            return off + len(canonical_bytes(k)) + 1
        if k > key:
            return off
        off += len(canonical_bytes(k)) + 1 + _value_size(p, info, k) + 1
    return max(1, off - 1)


def _scalar_index(info: _Info, key: str) -> int:
    """The segment of an OpenAI field that is one segment: the schema comes first after the tools,
    ``instructions`` last before the input, a string ``input`` first of the messages level."""
    if key in ("response_format", "text"):
        return info.sys_start
    return info.msg_start - 1 if key == "instructions" else info.msg_start


def segment_offset(p: PreparedRequest, index: int) -> int:
    """Offset of segment ``index`` in ``canonical_bytes(p.body)``, from segment sizes alone.

    ``canonical_bytes(p.body)[off : off + seg.nbytes] == canonical_bytes(seg.element)``. The unlogged
    prefix is not in the body: its offset is 0 (and its size 0).
    """
    info = _info(p)
    segs = p.segments
    seg = segs[index]
    kind = seg.kind
    if kind == "unlogged":
        return 0
    if kind == "tool":
        t0 = info.tool_start
        return _key_offset(p, info, "tools") + 1 + sum(map(_NBYTES, segs[t0:index])) + index - t0
    fmt = p.wire
    if fmt.whole_units:
        key = fmt.scalar_keys.get(kind)
        if key is not None:  # a one-segment section (schema, instructions, an input string)
            return _key_offset(p, info, key)
        m0 = info.msg_start
        return _key_offset(p, info, fmt.list_key) + 1 + sum(map(_NBYTES, segs[m0:index])) + index - m0
    if seg.kind == "system":
        base = _key_offset(p, info, "system")
        if isinstance(p.body.get("system"), str):
            return base
        k = index - info.sys_start
        return base + 1 + sum(map(_NBYTES, segs[info.sys_start:index])) + k
    start = index
    while segs[start].kind == "msg":
        start -= 1
    mi = seg.message_index or 0
    off = _key_offset(p, info, "messages") + 1 + _messages_bytes(p, info, start, mi)
    off += _CONTENT_OPEN
    if seg.kind in ("msg-start", "msg"):
        off += 1 + sum(map(_NBYTES, segs[start:index])) + (index - start)
    return off


def _stripped(element: Any) -> tuple[bytes, int, int]:
    """(canonical bytes without ``cache_control``, where the marker sits in the exact bytes, its length)."""
    if not (isinstance(element, dict) and "cache_control" in element):
        return canonical_bytes(element), 0, 0
    plain = canonical_bytes({k: v for k, v in element.items() if k != "cache_control"})
    exact_len = len(canonical_bytes(element))
    before = {k: v for k, v in element.items() if k < "cache_control"}
    at = 1 if not before else len(canonical_bytes(before)) - 1
    return plain, at, exact_len - len(plain)


def _text_of(element: Any) -> str | None:
    if isinstance(element, str):
        return element
    if isinstance(element, dict):
        t = element.get("type")
        if t == "text" and isinstance(text := element.get("text"), str):
            return text
        if t == "tool_result" and isinstance(content := element.get("content"), str):
            return content
        if (t is None or t == "message") and "role" in element and isinstance(content := element.get("content"), str):
            return content  # an OpenAI message (chat, or a Responses message item)
        if t in ("function_call_output", "custom_tool_call_output") and isinstance(out := element.get("output"), str):
            return out
    return None


#: Paths listed per kind (added, removed, changed) in a diff's HTML, and under its "show all" (bounded however
#: long the session).
_PATHS_SHOWN = 12
_PATHS_LISTED = 500

# -- the diff ------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False, repr=False)
class PrefixDiff:
    """How ``current`` differs from ``previous`` as a prompt cache sees it. Build with :func:`diff`.

    Attributes:
        previous: the earlier request. current: the later one (both :class:`PreparedRequest`; raw bodies are
            prepared on first access).
        index: position (segment index in ``current``) where the cache prefix stops matching; ``None``
            when ``previous`` is a prefix of ``current`` (a pure append, or identical).
        path: that position's path — a segment path, or the top-level field (``model``, ``speed``,
            ``tool_choice``, ``thinking``, ``output_config``) that invalidates the cache from there;
            for a truncated request, the path of the first segment that disappeared.
        field: the top-level field behind the divergence, else None.
        shared_prefix_tokens: estimated tokens of the whole segments both requests share before the
            divergence (the most any cache could read).
        pure_append: ``previous`` is a prefix of ``current`` with no cache-relevant field change.
        field_changes: cache-relevant top-level changes (see ``FIELD_LEVELS``).
        other_changes: other top-level changes whose cache effect is not modelled.
        ignored_changes: volatile changes (``VOLATILE_FIELDS``, moved ``cache_control`` markers as
            ``breakpoints``) that never affect matching.

    ``shared_prefix_tokens``, the offsets, the excerpt and the lists are computed on first access.
    """

    index: int | None
    path: str | None
    field: str | None
    pure_append: bool
    field_changes: tuple[FieldChange, ...]
    other_changes: tuple[FieldChange, ...]
    # (previous, current): PreparedRequest, or the BodyPlan of a raw body (prepared as far as a property needs)
    _sources: tuple[Any, Any] = dataclasses.field(repr=False)
    _shared_at: int = 0  # segments shared before the divergence
    _common: int = 0  # length of the common run of segment keys

    # -- the requests, as far as each property reads them ---------------------------------------
    @cached_property
    def previous(self) -> PreparedRequest:
        return _whole(self._sources[0])

    @cached_property
    def current(self) -> PreparedRequest:
        return _whole(self._sources[1])

    @cached_property
    def _upto(self) -> tuple[PreparedRequest, PreparedRequest]:
        """(previous, current) through the divergent segment: all the offsets, the excerpt and the shared
        tokens read (for raw bodies, only that prefix is prepared)."""
        n = self._shared_at if self.index is None else self.index + 1
        return _through(self._sources[0], n), _through(self._sources[1], n)

    # -- derived, computed on first access ------------------------------------------------------
    @cached_property
    def shared_prefix_tokens(self) -> int:
        """Estimated tokens of the whole segments both requests share before the divergence (the most any
        cache could read)."""
        n = self._shared_at
        if not n:
            return 0
        # a divergence: the prefix the offsets read anyway; a pure append: the current request through n
        current = self._upto[1] if self.index is not None else _through(self._sources[1], n)
        return current.cumulative_tokens()[n - 1]

    @cached_property
    def ignored_changes(self) -> tuple[FieldChange, ...]:
        """Volatile changes (``VOLATILE_FIELDS``, moved ``cache_control`` markers as ``breakpoints``) that
        never affect matching. The breakpoints read both whole requests."""
        prev, cur = self._sources
        volatile = cur.wire.volatile_fields
        ignored = _field_changes(prev.rest, cur.rest, volatile)
        pm, cm = _info(self.previous).marks, _info(self.current).marks
        if pm != cm:
            ignored.append(FieldChange("breakpoints", ", ".join(pm) or "(none)", ", ".join(cm) or "(none)"))
        return tuple(ignored)

    @property
    def identical(self) -> bool:
        """Same segments and no cache-relevant change (volatile fields may still differ)."""
        return self.pure_append and _length(self._sources[0]) == _length(self._sources[1])

    @cached_property
    def unlogged(self) -> bool:
        """The first divergence is the unlogged prefix of a partial body: the measured size of what the log
        did not record changed (or appeared), so the change lies outside the logged content and cannot be
        located — no byte or token offset, no excerpt."""
        i = self.index
        if i is None or self.field is not None:
            return False
        return any(i < len(r.segments) and r.segments[i].kind == "unlogged" for r in self._upto)

    def _unlogged_sizes(self) -> str:
        def size(r: PreparedRequest) -> str:
            n = r.unlogged_prefix_tokens
            return "none" if n is None else f"{n:,}"
        return f"{size(self.previous)} -> {size(self.current)} tokens, measured"

    @property
    def appended(self) -> int:
        """Segments added at the end (pure append only; 0 otherwise)."""
        return _length(self._sources[1]) - _length(self._sources[0]) if self.pure_append else 0

    @cached_property
    def _within(self) -> tuple[int | None, int | None, int]:
        """(first differing byte in the current segment's stripped bytes, mapped exact offset, stripped
        length) for a segment divergence; Nones otherwise."""
        i = self.index
        if i is None or self.field is not None or self.unlogged:
            return None, None, 0
        previous, current = self._upto
        if i >= len(current.segments):
            return None, None, 0
        cur = current.segments[i]
        cur_plain, at, ins = _stripped(cur.element)
        if i >= len(previous.segments):
            return 0, 0, len(cur_plain)
        prev_plain, _, _ = _stripped(previous.segments[i].element)
        d = common_prefix_length(prev_plain, cur_plain)
        if d == len(prev_plain) == len(cur_plain):
            return 0, 0, len(cur_plain)  # same bytes: the envelope differs (message boundary or role)
        exact = d if (ins == 0 or d < at) else d + ins
        return d, exact, len(cur_plain)

    @cached_property
    def byte_offset(self) -> int | None:
        """Where the divergence sits in ``canonical_bytes(current.body)``.

        For a segment divergence: the offset of the first byte of the divergent segment that differs
        from the previous request's segment at the same position, both compared without
        ``cache_control`` (the offset is mapped back into the exact bytes, marker included); the
        segment's first byte when only its envelope (role, message boundary) differs. For a truncated
        request: the offset right after the last shared segment. For a field divergence: the first
        differing byte inside that field's value. ``None`` for a pure append.

        This is *not* the first differing byte of the two whole serialisations: canonical JSON sorts
        keys, so ``messages`` precedes ``system`` and ``tools`` and appended turns would always win;
        that literal offset is :attr:`raw_byte_offset`.
        """
        if self.index is None or self.unlogged:
            return None
        prev, cur = self._upto
        info = _info(cur)
        if self.field is not None:
            base = _key_offset(cur, info, self.field)
            old, new = prev.body.get(self.field, _ABSENT), cur.body.get(self.field, _ABSENT)
            if old is _ABSENT or new is _ABSENT:
                return base
            return base + common_prefix_length(canonical_bytes(old), canonical_bytes(new))
        i = self.index
        if i >= len(cur.segments):
            if not cur.segments:
                return None
            last = len(cur.segments) - 1
            return segment_offset(cur, last) + cur.segments[last].nbytes
        _, exact, _ = self._within
        return segment_offset(cur, i) + (exact or 0)

    @cached_property
    def token_offset(self) -> int | None:
        """Estimated tokens before the divergence: whole segments before it, plus the divergent
        segment's tokens in proportion to its matching bytes. ``None`` for a pure append, and for a change
        in the unlogged prefix (it cannot be located)."""
        if self.index is None or self.unlogged:
            return None
        current = self._upto[1]
        if self.field is not None or self.index >= len(current.segments):
            return self.shared_prefix_tokens
        d, _, size = self._within
        seg = current.segments[self.index]
        within = (seg.tokens * d) // size if (d and size) else 0
        return self.shared_prefix_tokens + min(within, max(0, seg.tokens - 1))

    @cached_property
    def raw_byte_offset(self) -> int | None:
        """The first differing byte of the two whole canonical serialisations (volatile fields and key
        order included), or None when they are equal. Serialises both bodies: O(body size)."""
        a, b = canonical_bytes(self._sources[0].body), canonical_bytes(self._sources[1].body)
        if a == b:
            return None
        return common_prefix_length(a, b)

    @cached_property
    def excerpt(self) -> Excerpt | None:
        """Both sides around the divergence, invisible characters made visible; None for a pure append and
        for a change in the unlogged prefix (there is no logged text to show)."""
        if self.index is None or self.unlogged:
            return None
        prev, cur = self._sources
        if self.field is not None:
            old = prev.body.get(self.field, _ABSENT)
            new = cur.body.get(self.field, _ABSENT)
            a = "(absent)" if old is _ABSENT else canonical_json(old)
            b = "(absent)" if new is _ABSENT else canonical_json(new)
            return _excerpt(a, b, "json")
        i = self.index
        prev_segs, cur_segs = self._upto[0].segments, self._upto[1].segments
        if i >= len(cur_segs):
            el = prev_segs[i].element
            text = _text_of(el)
            return _excerpt(text if text is not None else _stripped(el)[0].decode(), "",
                            "text" if text is not None else "json")
        a_el = prev_segs[i].element if i < len(prev_segs) else None
        b_el = cur_segs[i].element
        ta, tb = _text_of(a_el) if a_el is not None else None, _text_of(b_el)
        if ta is not None and tb is not None:
            return _excerpt(ta, tb, "text")
        a = "" if a_el is None else _stripped(a_el)[0].decode()
        return _excerpt(a, _stripped(b_el)[0].decode(), "json")

    @cached_property
    def _regions(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], int]:
        prev, cur = self.previous, self.current
        pk, ck = _info(prev).keys, _info(cur).keys
        n = self._common
        if self.pure_append:
            return tuple(s.path for s in cur.segments[n:]), (), (), 0
        # align the tails too, so an insertion does not read as everything after it changing
        rp, rc = pk[n:][::-1], ck[n:][::-1]
        m = common_prefix_length(rp, rc)
        p_end, c_end = len(pk) - m, len(ck) - m
        p_items = [(pk[j], prev.segments[j].path) for j in range(n, p_end)]
        c_items = [(ck[j], cur.segments[j].path) for j in range(n, c_end)]
        same = set(p_items) & set(c_items)  # same content at the same path
        left: dict[tuple[Any, ...], list[str]] = {}
        for key, path in p_items:
            if (key, path) not in same:
                left.setdefault(key, []).append(path)
        new_paths, moved = [], 0
        for key, path in c_items:
            if (key, path) in same:
                continue
            if left.get(key):  # content the previous request had elsewhere (one occurrence each)
                left[key].pop(0)
                moved += 1
            else:
                new_paths.append(path)
        gone = {path for paths in left.values() for path in paths}
        changed = [path for path in new_paths if path in gone]
        added = [path for path in new_paths if path not in gone]
        removed = [path for _, path in p_items if path in gone and path not in set(changed)]
        # the aligned tail is unchanged content, shifted when something was inserted or removed
        moved += sum(prev.segments[p_end + j].path != cur.segments[c_end + j].path for j in range(m))
        return tuple(added), tuple(removed), tuple(changed), moved

    @property
    def added(self) -> tuple[str, ...]:
        """Paths (in ``current``) of segments whose content the previous request did not have there."""
        return self._regions[0]

    @property
    def removed(self) -> tuple[str, ...]:
        """Paths (in ``previous``) of segments that are gone."""
        return self._regions[1]

    @property
    def changed(self) -> tuple[str, ...]:
        """Paths present on both sides whose content differs."""
        return self._regions[2]

    @property
    def moved(self) -> int:
        """Segments whose content is still there, at another path (e.g. after an insertion)."""
        return self._regions[3]

    @cached_property
    def history_rewrite(self) -> HistoryRewrite | None:
        """The first message where the previous history is not a prefix of the current one, or None."""
        prev, cur = self.previous, self.current
        pi, ci = _info(prev), _info(cur)
        if pi.msg_start == ci.msg_start and self._common >= pi.msg_start:
            j = self._common - pi.msg_start  # the common run of keys from the start already ends there
        else:
            j = _common_run(pi, ci, pi.msg_start, ci.msg_start)
        if j >= len(pi) - pi.msg_start:
            return None  # the previous messages are a prefix of the current ones
        p_seg = prev.segments[pi.msg_start + j]
        k = p_seg.message_index or 0
        if j >= len(ci) - ci.msg_start:
            n_prev, n_cur = _history_length(prev), _history_length(cur)
            what = f"history shrank from {n_prev} to {n_cur} messages" if n_cur < n_prev else (
                f"{_within_message(p_seg)} removed")
            return HistoryRewrite(k, p_seg.role, what)
        c_seg = cur.segments[ci.msg_start + j]
        if c_seg.message_index != k or (c_seg.kind == "msg") != (p_seg.kind == "msg"):
            what = "message boundaries changed"
        elif c_seg.role != p_seg.role:
            what = f"role {p_seg.role} -> {c_seg.role}"
        else:
            where = _within_message(p_seg)
            t_old, t_new = _block_type(p_seg.element), _block_type(c_seg.element)
            what = f"{where} {t_old} changed" if t_old == t_new else f"{where} {t_old} -> {t_new}"
        return HistoryRewrite(k, p_seg.role, what)

    @property
    def tools_reordered(self) -> bool:
        """The tool definitions are the same set in another order (OpenClaw's sorted digest misses it)."""
        pi, ci = _info(self.previous), _info(self.current)
        a, b = pi.hashes[: pi.sys_start], ci.hashes[: ci.sys_start]
        return a != b and sorted(a) == sorted(b)

    # -- display --------------------------------------------------------------------------------
    def summary(self) -> str:
        """One plain-words line."""
        if self.index is None:
            head = ("identical prefix" if self.identical
                    else f"pure append: +{self.appended} segment{'s' if self.appended != 1 else ''}")
            return f"{head}; shared prefix ~{self.shared_prefix_tokens:,} tokens"
        if self.unlogged:
            return (f"diverges in the unlogged prefix ({self._unlogged_sizes()}): the change lies outside the "
                    "logged content and cannot be located")
        b, t = self.byte_offset, self.token_offset
        where = f"diverges at {self.path}"
        if b is not None:
            where += f" (byte {b:,}, ~token {t:,})"
        return f"{where}; shared prefix ~{self.shared_prefix_tokens:,} tokens"

    def __repr__(self) -> str:
        if self.index is None:
            return (f"PrefixDiff(pure_append=True, appended={self.appended}, "
                    f"shared_prefix_tokens={self.shared_prefix_tokens})")
        if self.unlogged:
            return f"PrefixDiff(path={self.path!r}, unlogged=True, pure_append=False)"
        return (f"PrefixDiff(path={self.path!r}, byte_offset={self.byte_offset}, token_offset={self.token_offset}, "
                f"shared_prefix_tokens={self.shared_prefix_tokens}, pure_append=False)")

    def _repr_html_(self) -> str:
        return escape_dollars(self._html())

    def _html(self) -> str:
        esc = html.escape
        rows = [
            ("path", esc(self.path or "—")),
            ("byte offset", "—" if self.byte_offset is None else f"{self.byte_offset:,}"),
            ("token offset (est.)", "—" if self.token_offset is None else f"~{self.token_offset:,}"),
            ("shared prefix (est.)", f"~{self.shared_prefix_tokens:,} tokens"),
            ("pure append", "yes" if self.pure_append else "no"),
        ]
        meta = "".join(
            f'<tr><th style="text-align:left;padding:1px 8px">{k}</th>'
            f'<td style="padding:1px 8px">{v}</td></tr>'
            for k, v in rows
        )
        ex = self.excerpt
        side = ""
        if ex is not None:
            cell = ('<td style="vertical-align:top;padding:4px 8px;max-width:40em"><pre style="white-space:'
                    'pre-wrap;word-break:break-all;margin:0">{}</pre></td>')
            html_prev, html_cur = ex.html_sides()
            left, right = cell.format(html_prev), cell.format(html_cur)
            side = (
                '<table style="border-collapse:collapse;margin-top:6px"><tr>'
                f'<th style="text-align:left;padding:1px 8px">previous ({esc(ex.source)})</th>'
                f'<th style="text-align:left;padding:1px 8px">current ({esc(ex.source)})</th></tr>'
                f"<tr>{left}{right}</tr></table>"
            )
        items = []
        for label, paths in (("added", self.added), ("removed", self.removed), ("changed", self.changed)):
            if paths:
                shown = ", ".join(esc(p) for p in paths[:_PATHS_SHOWN])
                if len(paths) > _PATHS_SHOWN:  # the rest behind a click: HTML only, no script
                    listed = ", ".join(esc(p) for p in paths[:_PATHS_LISTED])
                    cut = f" … and {len(paths) - _PATHS_LISTED:,} more" if len(paths) > _PATHS_LISTED else ""
                    shown += (f' …<details><summary style="cursor:pointer;color:#1f3b73">show all '
                              f"{len(paths):,}</summary>{listed}{cut}</details>")
                items.append(f"<li>{label} ({len(paths):,}): {shown}</li>")
        if self.moved:
            items.append(f"<li>moved: {self.moved} segment(s) now at another path</li>")
        for label, changes in (("cache-relevant field", self.field_changes),
                               ("other field", self.other_changes),
                               ("ignored (never affects caching)", self.ignored_changes)):
            for c in changes:
                items.append(f"<li>{label}: <code>{visible_html(str(c))}</code></li>")
        lst = f'<ul style="margin:6px 0">{"".join(items)}</ul>' if items else ""
        return (
            '<div style="font-family:ui-monospace,monospace;font-size:12px">'
            f"<div><b>PrefixDiff</b> — {esc(self.summary())}</div>"
            f'<table style="border-collapse:collapse">{meta}</table>{side}{lst}</div>'
        )


def _block_type(element: Any) -> str:
    if isinstance(element, str):
        return "text"
    if isinstance(element, dict):
        t = element.get("type")
        if t is None:
            return "message" if "role" in element else "item_reference" if set(element) == {"id"} else "block"
        return str(t)
    return "content"


def _within_message(seg: Any) -> str:
    """What part of its message a segment is: ``content[1]``, ``content``, or the whole ``message`` (OpenAI)."""
    if "." in seg.path:
        return str(seg.path).split(".", 1)[1]
    return "message" if seg.kind in _WHOLE_KINDS else "content"


def _history_length(p: PreparedRequest) -> int:
    value = p.body.get(p.wire.list_key)
    return len(value) if isinstance(value, list) else int(value is not None)


def _excerpt(a: str, b: str, source: str) -> Excerpt:
    k = common_prefix_length(a, b)
    start = max(0, k - _EXCERPT_BEFORE)
    context = a[start:k]
    pa, pb = a[k : k + _EXCERPT_AFTER], b[k : k + _EXCERPT_AFTER]

    a_end, b_end = k + len(pa) >= len(a), k + len(pb) >= len(b)

    def side(text: str, at_end: bool) -> str:
        return visible(text, ends_line=at_end) + ("" if at_end else "…")

    return Excerpt(visible(context), side(pa, a_end), side(pb, b_end), source, start > 0,
                   raw=(context, pa, pb, a_end, b_end))


def _field_changes(prev: dict[str, Any], cur: dict[str, Any], names: Any) -> list[FieldChange]:
    out = []
    for k in names:
        old, new = prev.get(k, _ABSENT), cur.get(k, _ABSENT)
        if old is _ABSENT and new is _ABSENT:
            continue
        if old is _ABSENT or new is _ABSENT or canonical_json(old) != canonical_json(new):
            out.append(FieldChange(k, _short(old), _short(new)))
    return out


def compute_diff(previous: PreparedRequest, current: PreparedRequest) -> PrefixDiff:
    """The diff of two prepared requests (the session's hot path: O(segments) at C speed, bytes lazily)."""
    pi = _info(previous)
    ci = _info(current, like=previous)
    # segments prepare() reused from the previous request are equal by construction: compare after them
    k = shared_prefix_of(current, previous)
    n = k + _common_run(pi, ci, k, k)
    at = current.segments[n] if n < len(ci) else previous.segments[n] if n < len(pi) else None
    return _diff_at(previous, current, n, n == len(pi), None if at is None else at.path, ci.sys_start, ci.msg_start)


def _diff_at(previous: Any, current: Any, n: int, prefix_ok: bool, path_at: str | None,
             sys_start: int, msg_start: int) -> PrefixDiff:
    """The diff of two requests (prepared, or raw bodies' plans) whose first ``n`` segments match.

    ``prefix_ok``: the previous request has no more segments; ``path_at``: the path of segment ``n`` in the
    current request (in the previous one when the current one has no segment ``n``); ``sys_start`` and
    ``msg_start``: where the current request's system and messages levels start.
    """
    prest, crest = previous.rest, current.rest
    fmt = current.wire
    levels, volatile = fmt.field_levels, fmt.volatile_fields
    field_changes = _field_changes(prest, crest, sorted(levels))
    known = set(volatile) | set(levels)
    other = _field_changes(prest, crest, sorted((set(prest) | set(crest)) - known))

    # the earliest position any cache-relevant field invalidates
    field, field_at = None, None
    for fc in field_changes:
        level = levels[fc.path]
        at = 0 if level == "tools" else sys_start if level == "system" else msg_start
        if field_at is None or at < field_at:
            field, field_at = fc.path, at

    index: int | None
    path: str | None
    if field_at is not None and (prefix_ok or field_at <= n):
        index, path, shared_at = field_at, field, field_at
    elif not prefix_ok:
        index, field, path, shared_at = n, None, path_at, n
    else:
        index = path = field = None
        shared_at = n
    return PrefixDiff(
        index=index, path=path, field=field, pure_append=index is None, field_changes=tuple(field_changes),
        other_changes=tuple(other), _sources=(previous, current), _shared_at=shared_at, _common=n,
    )


def _whole(source: Any) -> PreparedRequest:
    return source if isinstance(source, PreparedRequest) else source.prepared()


def _through(source: Any, n: int) -> PreparedRequest:
    """The request through (at least) its first ``n`` segments."""
    return source if isinstance(source, PreparedRequest) else source.prefix(n)


def _length(source: Any) -> int:
    return len(source.segments) if isinstance(source, PreparedRequest) else source.n_segments


# -- raw bodies: compare units as objects, segment only where they differ --------------------------------

def _pickled(value: Any) -> Any:
    """Bytes that are equal only for equal values of equal types (``1``, ``1.0`` and ``True`` differ, floats
    bit for bit) in equal key order. The pickler's memo is off, so object sharing does not change them."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, pickle.HIGHEST_PROTOCOL)
    pickler.fast = True
    try:
        pickler.dump(value)
    except Exception:  # not picklable (prepare rejects it or hashes it): compare as "different"
        return object()
    return out.getvalue()


def _first_inexact(xs: list[Any], ys: list[Any], lo: int, hi: int) -> int:
    """The first index in ``[lo, hi)`` whose units are not known to have equal canonical JSON (``hi`` if
    none): at C speed, the same object, or ``==`` and pickled alike (``==`` alone says ``1 == 1.0 == True``,
    whose canonical JSON differs)."""
    xa, ya = xs[lo:hi], ys[lo:hi]
    f = next(compress(count(), map(ne, xa, ya)), hi - lo)
    xa, ya = xa[:f], ya[:f]
    distinct = list(compress(count(), map(is_not, xa, ya)))  # equal, not the same objects
    if distinct:
        pick = itemgetter(*distinct)
        # (all of them, when the bodies share no object: the slices themselves)
        sa, sb = (xa, ya) if len(distinct) == f else (pick(xa), pick(ya))
        if _pickled(sa) != _pickled(sb):  # rare: find the unit
            f = next(j for j in distinct if _pickled(xa[j]) != _pickled(ya[j]))
    return lo + f


_UNIT_KEY = itemgetter(0, 1, 2)  # (content hash, kind, role) of BodyPlan.unit_keys: what compute_diff compares


def _keys_from(plan: BodyPlan, section: int, index: int) -> Iterator[tuple[str, str, str | None, str]]:
    """Segment keys of ``plan`` from unit ``index`` of ``section`` on."""
    for s in range(section, len(plan.sections)):
        for i in range(index if s == section else 0, len(plan.sections[s][1])):
            yield from plan.unit_keys(s, i)


def _common_keys(a: BodyPlan, b: BodyPlan) -> tuple[int, str | None, str | None]:
    """(n, path of ``a``'s segment n, path of ``b``'s) for the common run of segment keys of two raw
    bodies, as :func:`compute_diff` counts it (a path is None past a body's end).

    Equal units are skipped unit by unit at C speed; the first units that differ are segmented (a moved
    ``cache_control`` marker leaves their keys equal and the scan goes on)."""
    n = 0
    for s in range(min(len(a.sections), len(b.sections))):
        (key_a, ua), (key_b, ub) = a.sections[s], b.sections[s]
        if key_a != key_b:
            return _run_from(a, b, s, 0, n)
        m = min(len(ua), len(ub))
        i = 0
        while i < m:
            f = _first_inexact(ua, ub, i, m)
            n += b.width(s, i, f)
            if f == m:
                break
            ka, kb = a.unit_keys(s, f), b.unit_keys(s, f)
            if list(map(_UNIT_KEY, ka)) != list(map(_UNIT_KEY, kb)):
                return _run_from(a, b, s, f, n)
            n += len(kb)
            i = f + 1
        if len(ua) != len(ub):
            return _run_from(a, b, s, m, n)
    return _run_from(a, b, min(len(a.sections), len(b.sections)), 0, n)


def _run_from(a: BodyPlan, b: BodyPlan, section: int, index: int, n: int) -> tuple[int, str | None, str | None]:
    """The common run from one position on, segment by segment (in practice it ends at once: two sides whose
    units no longer line up differ in kind at the next segment)."""
    ka, kb = _keys_from(a, section, index), _keys_from(b, section, index)
    while True:
        x, y = next(ka, None), next(kb, None)
        if x is None or y is None or _UNIT_KEY(x) != _UNIT_KEY(y):
            return n, None if x is None else x[3], None if y is None else y[3]
        n += 1


def _diff_raw(previous: dict[str, Any], current: dict[str, Any], memo: SegmentMemo) -> PrefixDiff | None:
    """The diff of two raw bodies, read up to their first divergence; None when :func:`compute_diff` of the
    prepared bodies must answer: different dialects, or a body ``prepare`` rejects (it raises the error)."""
    try:
        a, b = BodyPlan(previous, memo=memo), BodyPlan(current, memo=memo)
        if a.wire is not b.wire:
            return None
        n, path_a, path_b = _common_keys(a, b)
        _, sys_start, msg_start = sections(b)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError):
        return None
    return _diff_at(a, b, n, path_a is None, path_b if path_b is not None else path_a, sys_start, msg_start)


def _as_input(x: Any) -> PreparedRequest | dict[str, Any]:
    if isinstance(x, PreparedRequest):
        return x
    prepared = getattr(x, "prepared", None)  # a session Turn
    if isinstance(prepared, PreparedRequest):
        return prepared
    if isinstance(x, bytes | bytearray | memoryview | str):  # a body as sent or stored (``Turn.body``)
        try:
            x = json.loads(bytes(x) if not isinstance(x, str) else x)
        except ValueError as exc:
            # the wrong kind of argument, like any other non-body: a TypeError that says what is taken
            raise TypeError(f"diff() takes request bodies (dict, or JSON bytes/str such as Turn.body), "
                            f"PreparedRequest or Turn; got {type(x).__name__} that is not JSON: {exc}") from None
    if isinstance(x, dict):
        return x
    raise TypeError(f"diff() takes request bodies (dict, or JSON bytes/str such as Turn.body), PreparedRequest or "
                    f"Turn, got {type(x).__name__}")


def diff(previous: Any, current: Any) -> PrefixDiff:
    """Where ``current``'s cache prefix stops matching ``previous``.

    Args:
        previous: the earlier request — a request body (Messages, Chat Completions or Responses; a dict, or
            its JSON as bytes/str, e.g. ``Turn.body``), a :class:`PreparedRequest` or a Turn.
        current: the later request, same choices.

    Two raw bodies are read only up to their first divergence (no token is estimated): the offsets and the
    shared tokens prepare the segments before it on first access, the lists and ``previous``/``current``
    the whole requests (see the module docstring).

    Example:
        >>> import promptcache_nb as pc
        >>> a = {"model": "claude-sonnet-4-5", "system": "Be terse.", "messages": [
        ...     {"role": "user", "content": "hi"}]}
        >>> b = {**a, "system": "Be brief.", "max_tokens": 10}
        >>> d = pc.diff(a, b)
        >>> d.path, d.byte_offset, [str(c) for c in d.ignored_changes]
        ('system', 102, ['max_tokens: (absent) -> 10'])
        >>> str(d.excerpt)
        'Be ⟪ terse. ⟫ → ⟪ brief. ⟫'
    """
    a, b = _as_input(previous), _as_input(current)
    memo = SegmentMemo()
    if isinstance(a, dict) and isinstance(b, dict):
        fast = _diff_raw(a, b, memo)
        if fast is not None:
            return fast
    return compute_diff(a if isinstance(a, PreparedRequest) else prepare(a, memo=memo),
                        b if isinstance(b, PreparedRequest) else prepare(b, memo=memo))
