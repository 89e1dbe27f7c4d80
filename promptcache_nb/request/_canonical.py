"""Canonical JSON and request segments.

A request is the exact JSON body of an API call in one of three *dialects*: ``anthropic`` (Messages),
``openai-chat`` (Chat Completions) or ``openai-responses`` (Responses). Wherever bytes are compared or
hashed we use one canonical serialization: ``json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` encoded as UTF-8.

A request splits into *segments*, in the provider's cache-prefix order (docs/provider_cache_rules.md). Each
format says how, in its module of :mod:`promptcache_nb.dialects` (``Dialect.segment``): for ``anthropic`` each
tool, system block and message content block (``tools[3]``, ``system[2]``, ``messages[5].content[0]``); for
``openai-chat`` each tool, ``response_format`` and whole message (``messages[3]``); for ``openai-responses`` each
tool, ``text``, ``instructions`` and input item (``input[5]``). This module builds the segments the dialect names,
reusing the previous request's for the units both share.

Each segment has a path, a content hash that ignores ``cache_control`` (markers never change what
matches) and a storage hash over its exact bytes. A log that lacks part of the prompt (no system prompt,
no tools) can be given a measured *unlogged prefix*: one synthetic segment first (path
``(unlogged prefix)``, kind ``unlogged``) that carries the measured size and no content
(docs/provider_cache_rules.md#unlogged-prefix).

Segment kinds: :data:`~promptcache_nb.dialects.SegmentKind`.

Data derived from a request for speed (cumulative token sums, the segment spans of each unit, the link to the
previous request) lives in its declared :class:`PreparedDerived` (``PreparedRequest.derived``), never in side
attributes.
"""

from __future__ import annotations

import copy as _copy
import json
import marshal
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import attrgetter, eq
from typing import Any

from .._util import common_prefix_length, digest, identity_prefix
from ..dialects import ANTHROPIC as DEFAULT_FORMAT  # the format a shape without "dialect" names
from ..dialects import DIALECTS as DIALECTS  # re-exported: request.DIALECTS
from ..dialects import Dialect as WireFormat
from ..dialects import DialectName, SegmentKind
from ..dialects import detect as detect_format
from ..dialects import get as get_format
from ..dialects.anthropic import SEGMENTED as TOP_LEVEL_SEGMENTED
from ..dialects.anthropic import message_segments, system_segment, tool_segment
from ..dialects.openai_responses import ITEM_TYPES as RESPONSES_ITEM_TYPES  # noqa: F401  (its old home)
from ..tokens import DEFAULT_TOKENIZER, ModelTokenizer, Tokenizer, segment_tokens, segments_tokens

#: The dialect names (one vocabulary: :data:`promptcache_nb.dialects.DialectName`).
Dialect = DialectName
UNLOGGED_PATH = "(unlogged prefix)"
_TOKENS: Callable[[Segment], int] = attrgetter("tokens")
_NBYTES: Callable[[Segment], int] = attrgetter("nbytes")


# json.dumps with these options builds a JSONEncoder per call; one shared encoder gives the same text
# (its state is per call) for a fifth less CPU on the ~20 calls a stored request makes
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def canonical_json(value: Any) -> str:
    return _CANONICAL(value)


def canonical_bytes(value: Any) -> bytes:
    """The one byte serialization used for comparing and hashing request JSON."""
    return canonical_json(value).encode("utf-8")


def content_hash(element: Any) -> str:
    """Hash of a segment as the cache sees it: ``cache_control`` removed, everything else exact."""
    if isinstance(element, dict) and "cache_control" in element:
        element = {k: v for k, v in element.items() if k != "cache_control"}
    return digest(canonical_bytes(element), tag="seg")


@dataclass(frozen=True)
class Segment:
    """One cacheable position of a request.

    ``kind`` is one of the kinds listed in the module docstring; ``role`` is set for messages (and
    Responses message items).
    """

    path: str
    kind: SegmentKind
    role: str | None
    content_hash: str
    block_hash: str
    tokens: int
    cache_control: dict[str, Any] | None
    element: Any = field(repr=False, compare=False)
    nbytes: int = 0
    chain_key: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        # What the store's prefix tree records for this position (kind, role and exact bytes); a plain
        # attribute so per-turn key lists are built at C speed.
        if not self.chain_key:
            object.__setattr__(self, "chain_key", f"{self.kind}:{self.role or ''}:{self.block_hash}")

    @property
    def level(self) -> str:
        """tools, system or messages: the level of the Anthropic invalidation table.

        The unlogged prefix stands for what a partial log lacks (tools and system), so it is ``tools``;
        an OpenAI structured-output schema is "a prefix to the system message", so ``system``.
        """
        kind = self.kind
        if kind == "tool" or kind == "unlogged":
            return "tools"
        return "system" if kind == "system" or kind == "schema" else "messages"


    @property
    def message_index(self) -> int | None:
        """The index of the message (``messages[i]``) or Responses input item (``input[i]``)."""
        path = self.path
        if path.startswith("messages["):
            return int(path[9 : path.index("]")])
        if path.startswith("input["):
            return int(path[6 : path.index("]")])
        return None


class SegmentMemo:
    """Memoises per-segment hashing and token counting so each distinct segment is done once.

    Elements passed with ``trusted=True`` are keyed by identity (strategies rebuild bodies from the
    same history objects every turn and never mutate them); everything else by content hash.

    A tokenizer that picks an estimator per model (``for_model``, the default
    :class:`~promptcache_nb.tokens.ModelTokenizer`) gets one view per estimator (:meth:`for_model`): hashes
    are shared, token counts and segments are not.
    """

    def __init__(self, tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> None:
        self.tokenizer = tokenizer
        self._by_id: dict[int, tuple[Any, str, str, dict[str, Any] | None, int]] = {}
        self._tokens: dict[tuple[str, str], int] = {}
        self._segments: dict[int, Segment] = {}  # trusted elements: the Segment last built for them
        self._views: dict[int, tuple[Tokenizer, SegmentMemo]] = {}

    def for_model(self, model: Any) -> SegmentMemo:
        """The memo counting with ``model``'s estimator (itself when its tokenizer counts every model alike)."""
        pick = getattr(self.tokenizer, "for_model", None)
        if pick is None:
            return self
        tok = pick(model if isinstance(model, str) else str(model or ""))
        if tok is self.tokenizer:
            return self
        got = self._views.get(id(tok))
        if got is None:
            view = SegmentMemo(tok)
            view._by_id = self._by_id  # hashes do not depend on the tokenizer
            if type(self.tokenizer) is ModelTokenizer and tok is self.tokenizer.default:
                # ModelTokenizer.count is its default's: the same counts (a stored reply's blocks, counted with
                # this memo, are the next request's history, counted with the view)
                view._tokens = self._tokens
            got = self._views[id(tok)] = (tok, view)
        return got[1]

    def hashes(self, element: Any, *, trusted: bool, texts: dict[str, tuple[str, int]] | None = None
               ) -> tuple[str, str, dict[str, Any] | None, int]:
        """(content hash, storage hash, cache_control, canonical byte length) of one segment. ``texts``: where
        to keep the canonical JSON (and its byte length) by storage hash, when it is serialised now."""
        if trusted and not isinstance(element, str):
            hit = self._by_id.get(id(element))
            if hit is not None and hit[0] is element:
                return hit[1], hit[2], hit[3], hit[4]
        cc = element.get("cache_control") if isinstance(element, dict) else None
        text = canonical_json(element)
        exact = text.encode("utf-8")
        if cc is None:
            chash = bhash = digest(exact, tag="seg")
        else:
            chash, bhash = content_hash(element), digest(exact, tag="seg")
        if trusted and not isinstance(element, str):
            self._by_id[id(element)] = (element, chash, bhash, cc, len(exact))
        if texts is not None:
            texts[bhash] = (text, len(exact))
        return chash, bhash, cc, len(exact)

    def tokens(self, kind: str, chash: str, element: Any) -> int:
        frame_class = "msg-start" if kind in ("msg-start", "msg-str") else kind
        key = (frame_class, chash)
        n = self._tokens.get(key)
        if n is None:
            n = segment_tokens(frame_class if kind != "msg-str" else "msg-str", element, self.tokenizer)
            self._tokens[key] = n
        return n

    def count_ahead(self, items: list[tuple[str, str, Any]]) -> None:
        """Count the segments ``(kind, content hash, element)`` not counted yet, in one batch
        (:func:`~promptcache_nb.tokens.segments_tokens`): :meth:`tokens` then finds them. For many new segments at
        once (a stored request rebuilt whole); the counts are :meth:`tokens`' own."""
        todo: dict[tuple[str, str], tuple[str, Any]] = {}
        for kind, chash, element in items:
            frame_class = "msg-start" if kind in ("msg-start", "msg-str") else kind
            key = (frame_class, chash)
            if key not in self._tokens and key not in todo:
                todo[key] = (frame_class if kind != "msg-str" else "msg-str", element)
        if todo:
            self._tokens.update(zip(todo, segments_tokens(list(todo.values()), self.tokenizer), strict=True))


@dataclass(slots=True, eq=False)
class PreparedDerived:
    """What is derived from one request for speed, declared: filled by the preparer (``prepare``, the stored-request
    loader) or on first use, never compared, never copied by ``dataclasses.replace``.

    Attributes:
        cum: tokens through each segment (:meth:`PreparedRequest.cumulative_tokens`).
        nbytes: bytes of the segments' canonical JSON (:attr:`PreparedRequest.segment_bytes`).
        units: segmented key -> the (start, stop) segment span of each of its units (tools, blocks, messages).
        snaps: segmented key -> per-unit ``marshal`` bytes (to tell which units the next request repeats).
        msg_spans: the span of each message, for the trusted fast path (formats with ``fast_path``).
        prefix_of: (a weak reference to the previous request, how many leading segments the two share).
        partial: a prefix of a request (``BodyPlan.prefix``): never a ``previous`` to reuse units from.
        breakpoints: a cache model's memo of this request's breakpoints: (its layout, the breakpoints).
        explicit_marks: (index, ttl) of every segment's own ``cache_control`` (the Anthropic cache model's).
        diff_info: what the prefix diff reads of this request's segments (``request.diff``'s ``_Info``).
        texts: ``prepare(keep_texts=True)``: the canonical JSON and byte length of each segment it serialised, by
            storage hash, for the store's ``blocks`` rows (``Store.write_request`` takes them, then drops them).
    """

    cum: list[int] | None = None
    nbytes: int | None = None
    units: dict[str, list[tuple[int, int]]] | None = None
    snaps: dict[str, list[Any]] | None = None
    msg_spans: list[tuple[int, int]] | None = None
    prefix_of: tuple[weakref.ref[PreparedRequest], int] | None = None
    partial: bool = False
    breakpoints: tuple[Any, list[tuple[int, str]]] | None = None
    explicit_marks: tuple[tuple[int, str], ...] | None = None
    diff_info: Any = None
    texts: dict[str, tuple[str, int]] | None = None


@dataclass(frozen=True)
class PreparedRequest:
    """A request body with its segments, token counts and shape; the unit every later stage uses.

    ``shape`` records how the body's segmented fields looked (absent, string, list), the dialect when it
    is not ``anthropic`` and the unlogged prefix's measured size when there is one: with ``rest`` (the
    other top-level fields) and the segments it rebuilds the exact body (:func:`rebuild_body`).
    ``tokenizer`` names the estimator that counted its tokens (``o200k_base``, ``heuristic-v1``...).
    """

    body: dict[str, Any] = field(repr=False)
    segments: tuple[Segment, ...]
    shape: dict[str, Any]
    rest: dict[str, Any]
    total_tokens: int
    tokenizer: str = field(default="", compare=False)
    derived: PreparedDerived = field(default_factory=PreparedDerived, init=False, compare=False, repr=False)

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def dialect(self) -> str:
        """``anthropic``, ``openai-chat`` or ``openai-responses``."""
        name: str = self.shape.get("dialect", "anthropic")
        return name

    @property
    def wire(self) -> WireFormat:
        """The body's wire format (:mod:`promptcache_nb.dialects`): ask it, never compare :attr:`dialect`."""
        return get_format(self.shape.get("dialect", "anthropic"))

    @property
    def unlogged_prefix_tokens(self) -> int | None:
        """Measured tokens of the prompt the log did not record (None: the body is complete)."""
        return self.shape.get("unlogged")

    @property
    def unlogged_prefix_of(self) -> str | None:
        """Whose unlogged prefix it is (:func:`unlogged_segment`'s ``of``), None when the log did not say."""
        return self.shape.get("unlogged_of")

    @property
    def canonical(self) -> bytes:
        return canonical_bytes(self.body)

    def cumulative_tokens(self) -> list[int]:
        """Tokens through each segment (computed once per request, extending the previous request's sums
        over the leading segments the two share; treat as read-only)."""
        derived = self.derived
        cum = derived.cum
        if cum is None:
            prev, k = prefix_record(self)
            cum = derived.cum = extend_cumulative(self.segments, prev, k)
        return cum

    @property
    def segment_bytes(self) -> int:
        """Bytes of the segments' canonical JSON (envelopes not counted)."""
        n = self.derived.nbytes
        if n is None:
            prev, k = prefix_record(self)
            pn = prev.derived.nbytes if prev is not None else None
            segs = self.segments
            if prev is not None and pn is not None and k:  # the previous size, its tail after the shared run swapped
                n = pn - sum(map(_NBYTES, prev.segments[k:])) + sum(map(_NBYTES, segs[k:]))
            else:
                n = sum(map(_NBYTES, segs))
            self.derived.nbytes = n
        return n

    def tokens_before_messages(self) -> int:
        return sum(s.tokens for s in self.segments if s.kind in ("tool", "system", "schema", "unlogged"))


class LoggedBody(dict[str, Any]):
    """A request body rebuilt from its segments (``rebuild_body``, ``Store.turn_body``): a plain ``dict``
    equal to the body as logged, which also remembers what :func:`prepare` needs to rebuild the very same
    segments — the dialect when it is not ``anthropic`` and the unlogged prefix's measured size and identity.

    So ``prepare(store.turn_body(sid, i))`` is the stored request again, for every dialect and for partial
    bodies, without every caller having to read the shape. Explicit ``prepare`` arguments win.
    """

    dialect: str | None = None
    unlogged_prefix_tokens: int | None = None
    unlogged_prefix_of: str | None = None


# -- prepare ---------------------------------------------------------------------------------------

def detect_dialect(body: dict[str, Any]) -> str:
    """The API a request body is written for: ``anthropic``, ``openai-chat`` or ``openai-responses``
    (:func:`promptcache_nb.dialects.detect`, which documents the rule)."""
    return detect_format(body).name


def unlogged_segment(tokens: int, of: str | None = None) -> Segment:
    """The synthetic first segment of a partial body: ``tokens`` measured, no content.

    Its element is a small marker (``{"unlogged_prefix_tokens": N}``, plus ``"of": ID`` when the importer
    identified the prefix from what the log says: client, version, model, working directory), so its hashes — and
    with them the prefix chains of every cache model — are equal exactly for prefixes of the same identity and
    size. Without an identity the size alone tells them apart.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"unlogged_prefix_tokens: must be a non-negative int, got {tokens!r}")
    if of is not None and (not isinstance(of, str) or not of):
        raise ValueError(f"unlogged_prefix_of: must be a non-empty string, got {of!r}")
    marker: dict[str, Any] = {"unlogged_prefix_tokens": tokens}
    if of is not None:
        marker["of"] = of
    h = digest(canonical_bytes(marker), tag="seg")
    return Segment(UNLOGGED_PATH, "unlogged", None, h, h, tokens, None, marker, 0)


def prepare(
    body: dict[str, Any], *, memo: SegmentMemo | None = None, trusted: bool = False,
    previous: PreparedRequest | None = None, dialect: str | None = None,
    unlogged_prefix_tokens: int | None = None, copy: bool = False, keep_texts: bool = False,
    unlogged_prefix_of: str | None = None,
) -> PreparedRequest:
    """Split a request body into segments (hashes and estimated tokens), in cache-prefix order.

    Args:
        body: an Anthropic Messages, OpenAI Chat Completions or OpenAI Responses body.
        memo: per-segment hashing / token memo (the session's, so its tokenizer counts); the estimator of
            the body's ``model`` is used (:meth:`SegmentMemo.for_model`).
        trusted: the body was built by our strategies from immutable history objects: with ``previous``,
            messages that are the very same objects at the same index reuse its segments.
        previous: the request before this one. For untrusted bodies (imports, ``Session.record``) every
            tool, system block, message and input item that is *exactly* the previous body's at the same
            index reuses its segments, so only the new tail is validated, hashed and counted. "Exactly"
            is checked on ``marshal`` bytes (C speed): unlike ``==`` they tell ``1``, ``1.0`` and ``True``
            apart (whose canonical JSON differs), so a reused segment's bytes are the current body's.
            ``previous`` must not have been mutated since it was prepared. A message list
            :func:`~promptcache_nb.request.validate_request` (with a ``previous``) checked last is not marshalled
            again (``Session.record`` and imports check, then prepare): do not change it in place in between.
        dialect: ``anthropic``, ``openai-chat`` or ``openai-responses``; detected from the body when
            omitted (:func:`detect_dialect`).
        unlogged_prefix_tokens: measured tokens of a prompt prefix the log did not record (a partial
            body): one synthetic ``unlogged`` segment first (see :func:`unlogged_segment`).
        unlogged_prefix_of: the unlogged prefix's identity (:func:`unlogged_segment`'s ``of``); only with
            ``unlogged_prefix_tokens``.
        copy: the returned request owns its body: new parts are deep copies and unchanged parts are
            ``previous.body``'s (already owned) objects — a deep copy at the cost of the new tail.
        keep_texts: keep the canonical JSON of the segments serialised to hash them (``derived.texts``) until the
            store writes the request, so their ``blocks`` rows are not serialised again. For a request about to
            be stored (``Session.record``, imports): the texts hold the new tail's bytes until then.

    Raises:
        ValueError: a shape the API would reject or this model does not understand, in one line that
            names the field (``input[4].type: unknown item type 'foo'``).

    Example:
        >>> from promptcache_nb.request import prepare
        >>> p = prepare({"model": "gpt-4o", "messages": [
        ...     {"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]})
        >>> p.dialect, [s.path for s in p.segments]
        ('openai-chat', ['messages[0]', 'messages[1]'])
    """
    fmt, pinned, unlogged = _read_arguments(body, dialect, unlogged_prefix_tokens, unlogged_prefix_of)
    memo = (memo or SegmentMemo()).for_model(body.get("model"))  # the estimator of this body's model
    if trusted and fmt.fast_path and not copy and not pinned:
        return _prepare_trusted(body, memo, previous, unlogged)
    builder = _Builder(body, fmt, memo, previous, unlogged, copy, pinned)
    if keep_texts:
        builder.texts = {}
    return builder.build()


@dataclass(frozen=True)
class _Unlogged:
    """A partial body's unlogged prefix as :func:`prepare` builds it: its size and identity."""

    tokens: int
    of: str | None

    def segment(self) -> Segment:
        return unlogged_segment(self.tokens, self.of)

    def record(self, shape: dict[str, Any]) -> None:
        """Write it into a prepared request's shape (what :func:`rebuild_body` reads back)."""
        shape["unlogged"] = self.tokens
        if self.of is not None:
            shape["unlogged_of"] = self.of

    def matches(self, seg: Segment) -> bool:
        el = seg.element
        return (seg.kind == "unlogged" and seg.tokens == self.tokens and isinstance(el, dict)
                and el.get("of") == self.of)


def _read_arguments(body: Any, dialect: str | None, unlogged: int | None, of: str | None = None
                    ) -> tuple[WireFormat, bool, _Unlogged | None]:
    """How :func:`prepare` (and :class:`BodyPlan`) reads a body and its arguments: (its wire format, pinned,
    unlogged prefix) — the format resolved once per request.

    A :class:`LoggedBody` supplies what is not given; ``pinned`` is an explicit default format (the one a shape
    omits) the body alone would not tell: the shape must record it.
    """
    if dialect is None:
        dialect = getattr(body, "dialect", None)
    if unlogged is None:
        unlogged = getattr(body, "unlogged_prefix_tokens", None)
        of = of if of is not None else getattr(body, "unlogged_prefix_of", None)
    if not isinstance(body, dict):
        raise TypeError(f"request body must be a dict, got {type(body).__name__}")
    prefix = None if unlogged is None else _Unlogged(unlogged, of)
    if dialect is None:
        return detect_format(body), False, prefix
    fmt = get_format(dialect)
    return fmt, fmt is DEFAULT_FORMAT and detect_format(body) is not fmt, prefix


def _prepare_trusted(
    body: dict[str, Any], memo: SegmentMemo, previous: PreparedRequest | None, unlogged: _Unlogged | None,
) -> PreparedRequest:
    """Messages bodies our strategies built from immutable history objects (the format's ``fast_path``): messages
    that are the very same objects at the same index reuse the previous request's segments wholesale, so a turn
    costs O(messages), not O(blocks), in Python. Segments as :mod:`promptcache_nb.dialects.anthropic` names them
    (``tool_segment``, ``system_segment``, ``message_segments``: the one rule the checked path uses too)."""
    segs: list[Segment] = []
    shape: dict[str, Any] = {}

    cached = memo._segments

    def add(path: str, kind: SegmentKind, role: str | None, element: Any) -> None:
        # the same history object at the same position: reuse its Segment (the common case)
        seg = cached.get(id(element))
        if (seg is not None and seg.element is element and seg.path == path and seg.kind == kind
                and seg.role == role):
            segs.append(seg)
            return
        chash, bhash, cc, nbytes = memo.hashes(element, trusted=True)
        seg = Segment(path, kind, role, chash, bhash, memo.tokens(kind, chash, element), cc, element, nbytes)
        if not isinstance(element, str):
            cached[id(element)] = seg
        segs.append(seg)

    if unlogged is not None:
        segs.append(unlogged.segment())
    tools = body.get("tools")
    if tools is None:
        shape["tools"] = "absent"
    else:
        shape["tools"] = "list"
        for i, tool in enumerate(tools):
            add(*tool_segment(i, tool))
    system = body.get("system")
    if system is None:
        shape["system"] = "absent"
    elif isinstance(system, str):
        shape["system"] = "str"
        add(*system_segment(None, system))
    else:
        shape["system"] = "list"
        for i, block in enumerate(system):
            add(*system_segment(i, block))
    messages = body.get("messages")
    shape["messages"] = "absent" if messages is None else "list"
    if unlogged is not None:
        unlogged.record(shape)
    prev_msgs: list[Any] = []
    prev_spans: list[tuple[int, int]] = []
    prev_derived = previous.derived if previous is not None else None
    if (prev_derived is not None and prev_derived.msg_spans is not None
            and previous.tokenizer == memo.tokenizer.name):  # type: ignore[union-attr]
        prev_msgs = previous.body.get("messages") or []  # type: ignore[union-attr]
        prev_spans = prev_derived.msg_spans
    spans: list[tuple[int, int]] = []
    msgs = messages or []
    m0 = len(segs)  # where the messages start
    # the leading run of segments equal to the previous request's at the same positions (tools and system
    # blocks a strategy rebuilds each turn are equal, not the same objects: a short compare)
    run = common_prefix_length(tuple(segs), previous.segments[:m0]) if prev_spans else 0  # type: ignore[union-attr]
    k = identity_prefix(msgs, prev_msgs) if prev_spans else 0
    k = min(k, len(prev_spans))
    if k:
        # the leading messages that are the previous body's very objects: their segments and spans in one
        # slice each, so a turn's Python work is its new messages only
        a0, b0 = prev_spans[0][0], prev_spans[k - 1][1]
        segs.extend(previous.segments[a0:b0])  # type: ignore[union-attr]
        spans = prev_spans[:k] if a0 == m0 else [(a + m0 - a0, b + m0 - a0) for a, b in prev_spans[:k]]
        if run == m0 and a0 == m0:
            run = b0
    for i in range(k, len(msgs)):
        msg = msgs[i]
        start = len(segs)
        if i < len(prev_spans) and msg is prev_msgs[i]:
            a, b = prev_spans[i]
            segs.extend(previous.segments[a:b])  # type: ignore[union-attr]
            spans.append((start, len(segs)))
            continue
        for unit in message_segments(i, msg["role"], msg["content"]):
            add(*unit)
        spans.append((start, len(segs)))
    rest = {key: v for key, v in body.items() if key not in TOP_LEVEL_SEGMENTED}
    cum = extend_cumulative(segs, previous, run)
    req = PreparedRequest(body, tuple(segs), shape, rest, cum[-1] if cum else 0, memo.tokenizer.name)
    derived = req.derived
    derived.msg_spans = spans
    derived.cum = cum
    mark_prefix(req, previous, run)
    return req


_EXACT = object()  # placeholder of an element marshal cannot serialise: never equal to anything


def _snapshots(units: list[Any]) -> list[Any]:
    """Per-unit ``marshal`` (format 2) bytes: type-exact, C-speed, no object references or interning.

    Equal bytes mean equal values of equal types (``1``, ``1.0`` and ``True`` differ, floats bit for
    bit), hence equal canonical JSON. Format 2 is used because later formats add back-references that
    depend on reference counts, which would make equal bodies look different.
    """
    try:
        return list(map(marshal.dumps, units, repeat(2)))
    except ValueError:  # something JSON-encodable marshal does not know: compare it as "different"
        out: list[Any] = []
        for u in units:
            try:
                out.append(marshal.dumps(u, 2))
            except ValueError:
                out.append(object())
        return out


#: The unit list whose bytes were computed last by :func:`remember_snapshots` (``validate_request``'s message or input
#: list), those bytes, and which units are *plain* (see :func:`remember_snapshots`; None: not known). Two more uses
#: of that very list follow it in an import or ``Session.record``: the ``prepare`` of the same body, and the next
#: request's check (whose ``previous`` it is); both take the bytes from here instead of marshalling the list again.
#: One entry; like ``previous``, the list must not be changed between.
_LAST_SNAPSHOTS: list[tuple[list[Any], list[Any], list[bool] | None]] = []


def remembered_snapshots(units: list[Any]) -> list[Any] | None:
    """:func:`_snapshots` of ``units`` if they are the very list remembered last (and as long), else None."""
    last = _LAST_SNAPSHOTS[0] if _LAST_SNAPSHOTS else None
    return last[1] if last is not None and last[0] is units and len(last[1]) == len(units) else None


def remembered_plain(units: list[Any]) -> list[bool] | None:
    """The plain flags remembered with ``units``' bytes (None: not remembered, or not known)."""
    last = _LAST_SNAPSHOTS[0] if _LAST_SNAPSHOTS else None
    return last[2] if last is not None and last[0] is units and len(last[1]) == len(units) else None


def remember_snapshots(units: list[Any], snaps: list[Any] | None = None, plain: list[bool] | None = None
                       ) -> list[Any]:
    """:func:`_snapshots` of ``units`` (or ``snaps``, the caller's), remembered for the next uses of the same list.

    ``plain``: per unit, whether it holds only dicts, lists, strings and None (exact types) — for such a unit
    ``==`` is as exact as its bytes (``validate._repeated_prefix`` compares the next body's units with it so)."""
    if snaps is None:
        snaps = remembered_snapshots(units)
    if snaps is None:
        snaps = _snapshots(units)
    _LAST_SNAPSHOTS[:] = [(units, snaps, plain)]
    return snaps


def _hand_over_snapshots(logged: dict[str, Any], owned: dict[str, Any], derived: dict[str, list[Any]]) -> None:
    """``prepare(copy=True)`` stored a copy of the unit list remembered last: the next request's check compares
    against that copy (its ``previous``), so the remembered bytes (equal values, hence equal bytes) move to it —
    the prepared request's own (``derived``, when it has them), so that the next request's bytes, built on them,
    share their objects and the next ``prepare`` compares the repeated units by identity."""
    last = _LAST_SNAPSHOTS[0] if _LAST_SNAPSHOTS else None
    if last is None:
        return
    for key, units in logged.items():
        if units is last[0] and isinstance(owned.get(key), list) and len(owned[key]) == len(units):
            snaps = derived.get(key)
            _LAST_SNAPSHOTS[:] = [(owned[key], snaps if snaps is not None and len(snaps) == len(units) else last[1],
                                   last[2])]
            return


class _Builder:
    """One untrusted ``prepare``: sections in cache-prefix order, each a list of *units* (a tool, a
    system block, a message, an input item) that turn into one or more segments."""

    # BodyPlan's two partial modes (a whole prepare sets neither):
    plan: list[tuple[str, list[Any], Any]] | None = None  # planning: (key, units, emit) recorded, nothing built
    keys: list[tuple[str, str, str | None, str]] | None = None  # planning: (content hash, kind, role, path) emitted
    until: int | None = None  # a prefix: build only the units that make the first ``until`` segments
    cut = False  # ... and some units were left out
    texts: dict[str, tuple[str, int]] | None = None  # keep_texts: block hash -> (canonical JSON, bytes)

    def __init__(self, body: dict[str, Any], fmt: WireFormat, memo: SegmentMemo,
                 previous: PreparedRequest | None, unlogged: _Unlogged | None, copy_: bool, pinned: bool) -> None:
        self.body, self.fmt, self.memo, self.unlogged, self.copy = body, fmt, memo, unlogged, copy_
        usable = (previous is not None and previous.derived.units is not None
                  and previous.wire is fmt
                  and previous.tokenizer == memo.tokenizer.name)  # its segments' counts are this estimator's
        self.previous = previous if usable else None
        self.segs: list[Segment] = []
        # the stored shape names the format unless it is the default one, told by the body alone
        self.shape: dict[str, Any] = {} if fmt is DEFAULT_FORMAT and not pinned else {"dialect": fmt.name}
        self.units: dict[str, list[tuple[int, int]]] = {}
        self.snaps: dict[str, list[Any]] = {}
        self.owned: dict[str, Any] = {}  # copy=True: segmented key -> the owned value
        # the leading run of segments that are the previous request's objects at the same positions
        self.run, self.run_len = self.previous is not None, 0

    # -- helpers ----------------------------------------------------------------------------------
    def seg(self, path: str, kind: SegmentKind, role: str | None, element: Any) -> None:
        memo = self.memo
        chash, bhash, cc, nbytes = memo.hashes(element, trusted=False, texts=self.texts)
        if self.keys is not None:  # planning: what a diff compares, no token count
            self.keys.append((chash, kind, role, path))
            return
        self.segs.append(
            Segment(path, kind, role, chash, bhash, memo.tokens(kind, chash, element), cc, element, nbytes))

    def section(self, key: str, units: list[Any], emit: Any, *, scalar: bool = False) -> None:
        """Segments of one section's units; units exactly equal to the previous body's at the same index
        reuse its segments (and, with ``copy``, its objects).

        The leading run of equal units is taken in bulk (slices, at C speed); only the units after it go
        through the Python loop — usually just the new tail.
        """
        if self.plan is not None:
            self.plan.append((key, units, emit))
            return
        prev = self.previous
        segs = self.segs
        k = 0
        tail: list[bool] = []  # reuse flags for units k.. that the previous body also has
        prev_units = prev_spans = None
        if prev is not None and prev.shape.get(key) == self.shape.get(key):  # same shape: str vs list
            prev_spans = prev.derived.units.get(key)  # type: ignore[union-attr]
        if prev is not None and prev_spans:
            prev_snaps = _prev_snapshots(prev, key)
            cur = remembered_snapshots(units)  # the list validate_request just checked: its bytes are known
            if cur is None:
                cur = _snapshots(units)
            n = min(len(cur), len(prev_snaps))
            k = common_prefix_length(cur[:n], prev_snaps[:n])
            tail = list(map(eq, cur[k:n], prev_snaps[k:n]))
            # share the previous request's bytes for equal units: memory stays O(unique content)
            self.snaps[key] = (prev_snaps[:k] + [p if r else c for c, p, r in zip(cur[k:n], prev_snaps[k:n], tail,
                                                                                  strict=True)] + cur[n:])
            prev_units = _units_of(prev.body, key)
        spans: list[tuple[int, int]] = []
        owned: list[Any] = []
        if k:
            a0 = prev_spans[0][0]  # type: ignore[index]
            start = len(segs)
            segs.extend(prev.segments[a0 : prev_spans[k - 1][1]])  # type: ignore[union-attr, index]
            shift = start - a0
            spans = prev_spans[:k] if shift == 0 else [(a + shift, b + shift) for a, b in prev_spans[:k]]  # type: ignore[index]
            if self.copy:
                owned = prev_units[:k]  # type: ignore[index]
            if self.run and shift == 0:
                self.run_len = len(segs)
            else:
                self.run = False
        for i in range(k, len(units)):
            if self.until is not None and len(segs) >= self.until:
                self.cut = True
                break
            unit = units[i]
            start = len(segs)
            j = i - k
            if j < len(tail) and tail[j]:
                a, b = prev_spans[i]  # type: ignore[index]
                segs.extend(prev.segments[a:b])  # type: ignore[union-attr]
                if self.copy:
                    owned.append(prev_units[i])  # type: ignore[index]
                if self.run and a == start:
                    self.run_len = len(segs)
                else:
                    self.run = False
            else:
                self.run = False
                if self.copy:
                    unit = _copy.deepcopy(unit)
                    owned.append(unit)
                emit(i, unit)
            spans.append((start, len(segs)))
        self.units[key] = spans
        if self.copy:
            self.owned[key] = owned[0] if scalar else owned

    # -- per dialect ------------------------------------------------------------------------------
    def build(self) -> PreparedRequest:
        body, shape, prev = self.body, self.shape, self.previous
        if self.unlogged is not None:
            first = prev.segments[0] if prev is not None and prev.segments else None
            if first is not None and self.unlogged.matches(first):
                self.segs.append(first)
                self.run_len = 1
            else:
                self.segs.append(self.unlogged.segment())
                self.run = False
        segmented = self.fmt.segment(self)
        if self.unlogged is not None:
            self.unlogged.record(shape)
        rest = {k: v for k, v in body.items() if k not in segmented}
        if self.copy:
            rest = _copy.deepcopy(rest)
            owned = self.owned
            body = {k: (owned[k] if k in owned else rest[k]) for k in body}
        cum = extend_cumulative(self.segs, prev, self.run_len)
        req = PreparedRequest(body, tuple(self.segs), shape, rest, cum[-1] if cum else 0, self.memo.tokenizer.name)
        derived = req.derived
        derived.cum = cum
        if self.cut:  # a prefix (BodyPlan.prefix): never a ``previous`` to reuse units from
            derived.partial = True
            return req
        derived.units = self.units
        derived.snaps = self.snaps
        derived.texts = self.texts
        if self.copy:
            _hand_over_snapshots(self.body, body, self.snaps)
        if prev is not None:
            derived.prefix_of = (weakref.ref(prev), self.run_len)
        if self.fmt.fast_path:
            derived.msg_spans = self.units.get(self.fmt.list_key, [])
        return req


class BodyPlan:
    """A request body's segmented sections in cache-prefix order, planned without building a segment: for
    reading part of a body (:func:`~promptcache_nb.diff` of raw bodies stops at the first divergence).

    Everything it builds is what :func:`prepare` builds, by the same code and memo: :meth:`unit_keys`
    (one unit's segment keys, no token count), :meth:`prefix` (the request through its first ``n``
    segments) and :meth:`prepared` (``prepare(body)`` itself, on first call). Only the top-level shape is
    checked up front; a unit is validated when something builds it.

    ``sections`` lists the non-empty sections as (key, units); a partial body's unlogged prefix is a section
    of its own (key ``(unlogged prefix)``, one unit: (the measured size, its identity)). ``shape``, ``rest`` and
    ``dialect`` are the prepared request's.
    """

    def __init__(self, body: dict[str, Any], *, memo: SegmentMemo | None = None, dialect: str | None = None,
                 unlogged_prefix_tokens: int | None = None, unlogged_prefix_of: str | None = None) -> None:
        self.body = body
        self._arguments = (dialect, unlogged_prefix_tokens, unlogged_prefix_of)
        self.wire, self._pinned, self.unlogged = _read_arguments(body, dialect, unlogged_prefix_tokens,
                                                                 unlogged_prefix_of)
        self.dialect: str = self.wire.name
        self._memo = memo or SegmentMemo()
        self._planner = self._builder()
        planner = self._planner
        planner.plan = []
        segmented = self.wire.segment(planner)
        if self.unlogged is not None:
            self.unlogged.record(planner.shape)
        self.shape = planner.shape
        self.rest = {k: v for k, v in body.items() if k not in segmented}
        self.sections: list[tuple[str, list[Any]]] = [(key, units) for key, units, _ in planner.plan if units]
        self._emit = [emit for _, units, emit in planner.plan if units]
        if self.unlogged is not None:
            self.sections.insert(0, (UNLOGGED_PATH, [(self.unlogged.tokens, self.unlogged.of)]))
            self._emit.insert(0, None)
        self._keys: dict[tuple[int, int], list[tuple[str, str, str | None, str]]] = {}
        self._prefixes: dict[int, PreparedRequest] = {}
        self._whole: PreparedRequest | None = None
        self._n_segments: int | None = None

    def _builder(self) -> _Builder:
        memo = self._memo.for_model(self.body.get("model"))
        return _Builder(self.body, self.wire, memo, None, self.unlogged, False, self._pinned)

    def width(self, section: int, start: int, stop: int) -> int:
        """How many segments units ``[start, stop)`` of a section make."""
        key, units = self.sections[section]
        if key == self.wire.list_key:
            return self.wire.units_width(units[start:stop])
        return stop - start

    @property
    def n_segments(self) -> int:
        """``len(prepare(body).segments)``, from the units alone."""
        if self._n_segments is None:
            self._n_segments = sum(self.width(s, 0, len(units)) for s, (_, units) in enumerate(self.sections))
        return self._n_segments

    def unit_keys(self, section: int, index: int) -> list[tuple[str, str, str | None, str]]:
        """(content hash, kind, role, path) of each segment of one unit, as ``prepare`` builds them (the unit
        is validated; no token is counted)."""
        got = self._keys.get((section, index))
        if got is None:
            units = self.sections[section][1]
            emit = self._emit[section]
            if emit is None:  # the unlogged prefix
                seg = unlogged_segment(*units[0])
                got = [(seg.content_hash, seg.kind, seg.role, seg.path)]
            else:
                planner = self._planner
                planner.keys = got = []
                try:
                    emit(index, units[index])
                finally:
                    planner.keys = None
            self._keys[(section, index)] = got
        return got

    def prefix(self, n: int) -> PreparedRequest:
        """The request through (at least) its first ``n`` segments: ``prepare``'s very segments, hashes and
        token counts; the whole request when ``n`` reaches its end. A shorter one is for reading only (the
        segments after are missing)."""
        if n >= self.n_segments:
            return self.prepared()
        got = self._prefixes.get(n)
        if got is None:
            builder = self._builder()
            builder.until = n
            got = self._prefixes[n] = builder.build()
        return got

    def prepared(self) -> PreparedRequest:
        """``prepare(body)`` with this plan's memo (built on the first call)."""
        if self._whole is None:
            dialect, unlogged, of = self._arguments
            self._whole = prepare(self.body, memo=self._memo, dialect=dialect, unlogged_prefix_tokens=unlogged,
                                  unlogged_prefix_of=of)
        return self._whole


def prefix_record(p: PreparedRequest) -> tuple[PreparedRequest | None, int]:
    """(the previous request, how many leading segments ``p`` shares with it: :func:`shared_prefix_of`);
    (None, 0) when unknown."""
    rec = p.derived.prefix_of
    if rec is None:
        return None, 0
    prev = rec[0]()
    return (prev, rec[1]) if prev is not None else (None, 0)


def extend_cumulative(segments: Any, previous: PreparedRequest | None, shared: int) -> list[int]:
    """Cumulative tokens of ``segments``: ``previous``'s sums for the first ``shared`` (its very segments),
    then only the new tail is added up — O(new segments) per request, the shared run a list copy."""
    pcum = previous.derived.cum if previous is not None and shared else None
    if pcum is None or len(pcum) < shared:
        return list(accumulate(map(_TOKENS, segments)))
    cum = pcum[:shared]
    tail = accumulate(map(_TOKENS, segments[shared:]), initial=pcum[shared - 1])
    next(tail)  # the initial value itself
    cum.extend(tail)
    return cum


def mark_prefix(p: PreparedRequest, previous: PreparedRequest | None, shared: int) -> None:
    """Record that ``p``'s first ``shared`` segments equal ``previous``'s (see :func:`shared_prefix_of`):
    per-segment lists derived from ``previous`` (cumulative tokens, keys, hashes, markers) are then
    extended rather than recomputed."""
    if previous is None:
        return
    p.derived.prefix_of = (weakref.ref(previous), shared)


def _units_of(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    return value if isinstance(value, list) else [value]


def _prev_snapshots(prev: PreparedRequest, key: str) -> list[Any]:
    """The previous request's per-unit bytes (computed from its body the first time they are needed)."""
    snaps = prev.derived.snaps
    assert snaps is not None  # a previous request whose units are known has its snapshots
    got = snaps.get(key)
    if got is None:
        got = snaps[key] = _snapshots(_units_of(prev.body, key))
    return got


def shared_prefix_of(p: PreparedRequest, previous: PreparedRequest) -> int:
    """How many leading segments of ``p`` equal ``previous``'s at the same positions (mostly its very
    Segment objects; at least equal paths, kinds, roles, hashes, tokens and markers), as
    ``prepare(..., previous=previous)`` or the stored-request loader recorded it (0 when unknown).
    Everything keyed by segment content (diffs, prefix chains, stored blocks, cumulative tokens) can start
    after them."""
    rec = p.derived.prefix_of
    return rec[1] if rec is not None and rec[0]() is previous else 0


def rebuild_body(shape: dict[str, Any], rest: dict[str, Any], chain: list[tuple[str, str | None, Any]]
                 ) -> dict[str, Any]:
    """Inverse of :func:`prepare`: a body from its shape, other fields and (kind, role, element) list (the format's
    ``Dialect.rebuild`` places the segments).

    The ``unlogged`` segment is not part of the body and is skipped. When the shape names a dialect or an
    unlogged prefix the result is a :class:`LoggedBody` carrying both, so ``prepare(rebuild_body(...))``
    rebuilds the same segments.
    """
    fmt = get_format(shape.get("dialect", "anthropic"))
    unlogged = shape.get("unlogged")
    body: dict[str, Any] = dict(rest) if "dialect" not in shape and unlogged is None else LoggedBody(rest)
    if isinstance(body, LoggedBody):
        body.dialect = fmt.name
        body.unlogged_prefix_tokens = unlogged
        body.unlogged_prefix_of = shape.get("unlogged_of")
    return fmt.rebuild(body, shape, chain)
