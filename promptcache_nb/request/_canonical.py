"""Canonical JSON and request segments.

A request is the exact JSON body of an Anthropic Messages API call. Wherever bytes are compared or
hashed we use one canonical serialization: ``json.dumps(sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` encoded as UTF-8.

A request splits into *segments*, in cache-prefix order tools → system → messages
(provider_cache_rules.md §1.2): each tool, each system block (or the system string), each message
content block (or a message's string content). Each segment has a path (``tools[3]``, ``system[2]``,
``messages[5].content[0]``), a content hash that ignores ``cache_control`` (markers never change what
matches) and a storage hash over its exact bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import accumulate
from operator import attrgetter
from typing import Any

from .._util import digest
from ..tokens import DEFAULT_TOKENIZER, Tokenizer, segment_tokens

TOP_LEVEL_SEGMENTED = ("tools", "system", "messages")
_TOKENS = attrgetter("tokens")
_NBYTES = attrgetter("nbytes")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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

    ``kind`` is ``tool``, ``system``, ``msg-start`` (first block of a message), ``msg`` (a later block),
    ``msg-str`` (a message whose content is a string) or ``msg-empty``; ``role`` is set for messages.
    """

    path: str
    kind: str
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
        """tools, system or messages: the level of the Anthropic invalidation table."""
        return "tools" if self.kind == "tool" else "system" if self.kind == "system" else "messages"


    @property
    def message_index(self) -> int | None:
        if not self.path.startswith("messages["):
            return None
        return int(self.path[9 : self.path.index("]")])


class SegmentMemo:
    """Memoises per-segment hashing and token counting so each distinct segment is done once.

    Elements passed with ``trusted=True`` are keyed by identity (strategies rebuild bodies from the
    same history objects every turn and never mutate them); everything else by content hash.
    """

    def __init__(self, tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> None:
        self.tokenizer = tokenizer
        self._by_id: dict[int, tuple[Any, str, str, dict | None, int]] = {}
        self._tokens: dict[tuple[str, str], int] = {}
        self._segments: dict[int, Segment] = {}  # trusted elements: the Segment last built for them

    def hashes(self, element: Any, *, trusted: bool) -> tuple[str, str, dict | None, int]:
        """(content hash, storage hash, cache_control, canonical byte length) of one segment."""
        if trusted and not isinstance(element, str):
            hit = self._by_id.get(id(element))
            if hit is not None and hit[0] is element:
                return hit[1], hit[2], hit[3], hit[4]
        cc = element.get("cache_control") if isinstance(element, dict) else None
        exact = canonical_bytes(element)
        if cc is None:
            chash = bhash = digest(exact, tag="seg")
        else:
            chash, bhash = content_hash(element), digest(exact, tag="seg")
        if trusted and not isinstance(element, str):
            self._by_id[id(element)] = (element, chash, bhash, cc, len(exact))
        return chash, bhash, cc, len(exact)

    def tokens(self, kind: str, chash: str, element: Any) -> int:
        frame_class = "msg-start" if kind in ("msg-start", "msg-str") else kind
        key = (frame_class, chash)
        n = self._tokens.get(key)
        if n is None:
            n = segment_tokens(frame_class if kind != "msg-str" else "msg-str", element, self.tokenizer)
            self._tokens[key] = n
        return n


@dataclass(frozen=True)
class PreparedRequest:
    """A request body with its segments, token counts and shape; the unit every later stage uses."""

    body: dict[str, Any] = field(repr=False)
    segments: tuple[Segment, ...]
    shape: dict[str, str]
    rest: dict[str, Any]
    total_tokens: int

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def canonical(self) -> bytes:
        return canonical_bytes(self.body)

    def cumulative_tokens(self) -> list[int]:
        """Tokens through each segment (computed once per request; treat as read-only)."""
        cum = self.__dict__.get("_cum")
        if cum is None:
            cum = list(accumulate(map(_TOKENS, self.segments)))
            object.__setattr__(self, "_cum", cum)
        return cum

    @property
    def segment_bytes(self) -> int:
        """Bytes of the segments' canonical JSON (envelopes not counted)."""
        n = self.__dict__.get("_nbytes")
        if n is None:
            n = sum(map(_NBYTES, self.segments))
            object.__setattr__(self, "_nbytes", n)
        return n

    def tokens_before_messages(self) -> int:
        return sum(s.tokens for s in self.segments if s.kind in ("tool", "system"))


def _check_body(body: dict[str, Any]) -> None:
    """Reject shapes the Messages API rejects (and that could not round-trip byte for byte)."""
    if not isinstance(body, dict):
        raise TypeError(f"request body must be a dict, got {type(body).__name__}")
    if "tools" in body and not isinstance(body["tools"], list):
        raise ValueError("tools: must be a list of tool definitions (omit the key for none)")
    if "system" in body and not isinstance(body["system"], str | list):
        raise ValueError("system: must be a string or a list of text blocks (omit the key for none)")
    for i, block in enumerate(body.get("system") if isinstance(body.get("system"), list) else ()):
        if not isinstance(block, dict):
            raise ValueError(f"system[{i}]: must be a content block object")
    messages = body.get("messages", [])
    if not isinstance(messages, list):
        raise ValueError("messages: must be a list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}]: each message needs 'role' and 'content'")
        extra = set(m) - {"role", "content"}
        if extra:
            raise ValueError(f"messages[{i}]: unsupported keys {sorted(extra)}")
        content = m["content"]
        if not isinstance(content, str | list):
            raise ValueError(f"messages[{i}].content: must be a string or a list of content blocks")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(block, dict):
                raise ValueError(f"messages[{i}].content[{j}]: must be a content block object")


def prepare(
    body: dict[str, Any], *, memo: SegmentMemo | None = None, trusted: bool = False,
    previous: PreparedRequest | None = None,
) -> PreparedRequest:
    """Split a Messages body into segments (hashes and estimated tokens).

    With ``trusted=True`` (bodies built by our strategies from immutable history objects) and the
    ``previous`` request, messages that are the very same objects at the same index reuse the previous
    request's segments wholesale, so a turn costs O(messages), not O(blocks), in Python.
    """
    if not trusted:
        _check_body(body)
    memo = memo or SegmentMemo()
    segs: list[Segment] = []
    shape: dict[str, str] = {}

    cached = memo._segments if trusted else None

    def add(path: str, kind: str, role: str | None, element: Any) -> None:
        if cached is not None:
            # the same history object at the same position: reuse its Segment (the common case)
            seg = cached.get(id(element))
            if (seg is not None and seg.element is element and seg.path == path and seg.kind == kind
                    and seg.role == role):
                segs.append(seg)
                return
        chash, bhash, cc, nbytes = memo.hashes(element, trusted=trusted)
        seg = Segment(path, kind, role, chash, bhash, memo.tokens(kind, chash, element), cc, element, nbytes)
        if cached is not None and not isinstance(element, str):
            cached[id(element)] = seg
        segs.append(seg)

    tools = body.get("tools")
    if tools is None:
        shape["tools"] = "absent"
    else:
        shape["tools"] = "list"
        for i, tool in enumerate(tools):
            add(f"tools[{i}]", "tool", None, tool)
    system = body.get("system")
    if system is None:
        shape["system"] = "absent"
    elif isinstance(system, str):
        shape["system"] = "str"
        add("system", "system", None, system)
    else:
        shape["system"] = "list"
        for i, block in enumerate(system):
            add(f"system[{i}]", "system", None, block)
    messages = body.get("messages")
    shape["messages"] = "absent" if messages is None else "list"
    prev_msgs: list = []
    prev_spans: list[tuple[int, int]] = []
    if trusted and previous is not None:
        prev_msgs = previous.body.get("messages") or []
        prev_spans = previous.__dict__.get("_msg_spans") or []
    spans: list[tuple[int, int]] = []
    for i, msg in enumerate(messages or ()):
        start = len(segs)
        if i < len(prev_spans) and msg is prev_msgs[i]:
            a, b = prev_spans[i]
            segs.extend(previous.segments[a:b])
            spans.append((start, len(segs)))
            continue
        role, content = msg["role"], msg["content"]
        if isinstance(content, str):
            add(f"messages[{i}].content", "msg-str", role, content)
        elif not content:
            add(f"messages[{i}].content", "msg-empty", role, content)
        else:
            for j, block in enumerate(content):
                add(f"messages[{i}].content[{j}]", "msg-start" if j == 0 else "msg", role, block)
        spans.append((start, len(segs)))
    rest = {k: v for k, v in body.items() if k not in TOP_LEVEL_SEGMENTED}
    req = PreparedRequest(body, tuple(segs), shape, rest, sum(map(_TOKENS, segs)))
    object.__setattr__(req, "_msg_spans", spans)
    return req


def rebuild_body(shape: dict[str, str], rest: dict[str, Any], chain: list[tuple[str, str | None, Any]]) -> dict:
    """Inverse of :func:`prepare`: a body from its shape, other fields and (kind, role, element) list."""
    body: dict[str, Any] = dict(rest)
    if shape.get("tools") == "list":
        body["tools"] = []
    if shape.get("system") == "list":
        body["system"] = []
    if shape.get("messages") == "list":
        body["messages"] = []
    for kind, role, element in chain:
        if kind == "tool":
            body["tools"].append(element)
        elif kind == "system":
            if shape.get("system") == "str":
                body["system"] = element
            else:
                body["system"].append(element)
        elif kind in ("msg-str", "msg-empty"):
            body["messages"].append({"role": role, "content": element})
        elif kind == "msg-start":
            body["messages"].append({"role": role, "content": [element]})
        elif kind == "msg":
            body["messages"][-1]["content"].append(element)
        else:
            raise ValueError(f"unknown segment kind {kind!r}")
    return body
