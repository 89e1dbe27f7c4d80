"""The fixes a counterfactual applies: pure transforms over the sequence of a session's request bodies.

Each fix takes the bodies in order (and their times, for the timing fixes) and returns new bodies, one per
original request at the original time, plus where it first bites (its evidence) and which requests it
changed. Inputs are never mutated; an unchanged part is the very same object (so consecutive bodies keep
sharing what they shared, and segmenting them stays linear).

* ``frozen_prefix`` — tools in a stable order (by name); system + tools re-sent as first sent while their
  content (markers aside) is unchanged; an earlier message re-rendered later is re-sent as first sent, unless
  the history shrank (a compaction). From oh-my-pi's append-only context (#3406) and picoclaw's sorted tools
  (#617): docs/seed_designs.md#oh-my-pi-append-only-context.
* ``tail_volatile`` — system lines that keep changing between requests (clocks, counters, runtime info) leave
  the system prompt and ride on the newest user message when they changed, kept there in history; a re-ranked
  list keeps the order its lines first appeared in. From picoclaw #3321 and OpenClaw #77521:
  docs/seed_designs.md#picoclaw-follow-ups.
* ``durable_deltas`` — the memory sections of the system prompt (the whole prompt when it has none) are pinned at
  their first bytes; each later change becomes a delta (changed lines, superseded lines) on the newest user
  message, kept in history; the host's own prompt goes as sent, as Lore leaves it. From Lore #747:
  docs/seed_designs.md#lore-turn-algorithm.
* ``breakpoints`` — markers on the last system block and the last block of the newest message instead of what
  the client placed, as pi-ai (oh-my-pi) places them; no marker on the tools, as neither oh-my-pi nor Lore puts
  one there (docs/provider_cache_rules.md: 4 markers, 20-block lookback).
* ``ttl`` — per breakpoint, 5m or 1h: 1h on the markers up to a cut (tools, system, messages — on partial bodies
  the client's assumed prefix and conversation breakpoints), 5m after it, so every 1h breakpoint comes before
  every 5m one; the counterfactual replays each cut and keeps the cheapest, naming the gaps that drove it
  (Anthropic's 1h cache writes cost 2× base input, 5m 1.25×; claude-cache-audit's break-even verdict).
* ``stagger`` — a request sent before an earlier request of its cache scope (its own session's, or a sub-agent's
  beside it) could have written its entry (an entry is readable once the writing response has begun) waits until
  ``pause`` after that request, so it reads instead of writing the same prefix again (anthropic-sdk-python #1451:
  identical requests sent back to back miss; a short pause removes it).
* ``keep_warm`` — a ping (the previous body, ``max_tokens: 0``) every TTL − 1 min through an idle gap that
  would expire the cache, where the pings cost less than the rebuild (Anthropic pre-warming; as
  :func:`promptcache_nb.keep_warm` pings).

Partial bodies (Claude Code, Codex and pi logs hold no system prompt or tools) and the OpenAI dialects get
only ``ttl`` and ``keep_warm`` (with the Anthropic cache model): :func:`plan` says why the others are not
possible.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..request.diff import visible

#: The fixes in the order they are applied (a layout first, markers and timing last).
FIX_NAMES: tuple[str, ...] = ("frozen_prefix", "tail_volatile", "durable_deltas", "breakpoints", "ttl", "keep_warm",
                               "stagger")

#: What each fix comes from (shown in the findings).
FIX_SOURCES: dict[str, str] = {
    "frozen_prefix": "oh-my-pi append-only context; picoclaw sorted tools",
    "tail_volatile": "picoclaw #3321 / OpenClaw #77521: the clock at the tail",
    "durable_deltas": "Lore #747: durable prompt deltas",
    "breakpoints": "Anthropic: up to 4 cache_control markers, 20-block lookback",
    "ttl": "Anthropic 5m / 1h cache TTLs per breakpoint (1h writes cost 2×, 5m 1.25×)",
    "keep_warm": "Anthropic pre-warming pings",
    "stagger": "anthropic-sdk-python #1451: same-prefix requests sent before the first has written miss",
}

#: The fix set each strategy amounts to, applied to another agent's bodies (``strategy=`` shorthand).
STRATEGY_FIXES: dict[str, tuple[str, ...]] = {
    "naive": (),
    # the strategy marks system[0] as well as the last block: what a sub-agent reads of its parent's prefix
    "clock_at_tail": ("frozen_prefix", "tail_volatile", "breakpoints"),
    "append_only": ("frozen_prefix", "tail_volatile", "breakpoints"),
    "durable_delta": ("frozen_prefix", "tail_volatile", "durable_deltas", "breakpoints"),
}

#: The fixes that need the whole body (system prompt and tools): not possible on a partial log.
BODY_FIXES = frozenset({"frozen_prefix", "tail_volatile", "durable_deltas", "breakpoints"})

#: A system line whose digits-free shape changed this many times between consecutive requests is volatile.
MIN_CHANGES = 3

#: How many system blocks the breakpoints fix tries its system marker on.
MAX_SYSTEM_CANDIDATES = 4

#: The shortest cache lifetime (Anthropic's 5 minutes): no gap shorter than it needs a ping.
MIN_TTL_SECONDS = 300.0

_THINKING = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True)
class Request:
    """One request of a counterfactual: its time, its body, and the original request it stands for (a
    keep-warm ping stands after request ``origin``)."""

    at: datetime
    body: dict[str, Any]
    origin: int
    ping: bool = False


@dataclass
class Applied:
    """What one fix did: the requests after it, the original requests whose body it changed, and where it
    first bites (one line, as in a diff)."""

    requests: list[Request]
    changed: list[int] = field(default_factory=list)
    evidence: str = ""
    #: what a client needs to apply it (the ttl fix's ``through``: the last breakpoint at 1h, None for none)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """The requests of a counterfactual and what each fix did or why it could not.

    Attributes:
        requests: one per original request at its original time (the bodies transformed), plus keep-warm
            pings (``ping=True``) after the request they keep warm.
        cache_params: the cache model's parameters for it (a partial log's assumed breakpoint TTLs).
        applied: fix -> what it did. not_possible: fix -> why the data does not support it.
    """

    requests: list[Request]
    cache_params: dict[str, Any]
    applied: dict[str, Applied] = field(default_factory=dict)
    not_possible: dict[str, str] = field(default_factory=dict)


def _n(count: int, word: str) -> str:
    """``1 ping``, ``3 pings``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def check_fixes(fixes: Sequence[str]) -> tuple[str, ...]:
    """``fixes`` in application order; an unknown name fails naming the known ones."""
    unknown = [f for f in fixes if f not in FIX_NAMES]
    if unknown:
        raise ValueError(f"unknown fix {unknown[0]!r}; known: {', '.join(FIX_NAMES)}")
    return tuple(f for f in FIX_NAMES if f in fixes)


def strategy_fixes(strategy: str) -> tuple[str, ...]:
    """The fix set a strategy amounts to (:data:`STRATEGY_FIXES`)."""
    try:
        return STRATEGY_FIXES[strategy]
    except KeyError:
        raise ValueError(f"strategy={strategy!r} is no fix set; use one of {', '.join(STRATEGY_FIXES)}, "
                         "or name the fixes") from None


# -- small body helpers ------------------------------------------------------------------------
def _system_texts(body: dict[str, Any]) -> list[str] | None:
    """The system prompt as texts (one per block), or None when a block is not text."""
    system = body.get("system")
    if system is None:
        return []
    if isinstance(system, str):
        return [system]
    if isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in system):
        return [b.get("text", "") for b in system]
    return None


def _with_system_texts(body: dict[str, Any], texts: list[str]) -> dict[str, Any]:
    """``body`` with its system blocks' texts replaced (same block structure and markers)."""
    system = body.get("system")
    if isinstance(system, str):
        return {**body, "system": texts[0]}
    blocks = [b if b.get("text") == t else {**b, "text": t} for b, t in zip(system or [], texts, strict=True)]
    return {**body, "system": blocks}


def _system_path(body: dict[str, Any], i: int) -> str:
    return "system" if isinstance(body.get("system"), str) else f"system[{i}]"


def _without_cc(value: Any) -> Any:
    """``value`` with every ``cache_control`` removed (markers never change what is cached)."""
    if isinstance(value, dict):
        return {k: _without_cc(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_cc(v) for v in value]
    return value


def _quote(text: str, width: int = 60) -> str:
    shown = visible(text)
    return "`" + (shown if len(shown) <= width else shown[: width - 1] + "…") + "`"


def _with_text(message: dict[str, Any], text: str) -> dict[str, Any]:
    """``message`` with a text block appended (after any tool_result: those must come first)."""
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    return {**message, "content": [*blocks, {"type": "text", "text": text}]}


class _Carrier:
    """Text carried on the newest user message and kept there in history, message by message.

    ``placed`` maps a message index to (the original message object, the state it carries, the message as
    sent). A placement survives while the original history still holds that very message at that index; a
    history that was rewritten (a compaction) drops it, and the state it carried with it.
    """

    def __init__(self, initial: Any) -> None:
        self.initial = initial
        self.placed: dict[int, tuple[Any, Any, dict[str, Any]]] = {}

    def carried(self, messages: list[Any]) -> Any:
        """The state the history carries now (the newest surviving placement's, else the initial one)."""
        for j in [j for j, (orig, _, _) in self.placed.items() if j >= len(messages) or messages[j] is not orig
                  and messages[j] != orig]:
            del self.placed[j]
        return self.placed[max(self.placed)][1] if self.placed else self.initial

    def place(self, messages: list[Any], state: Any, text: str) -> bool:
        """Carry ``text`` (for ``state``) on the newest message when it is a user message not yet carrying."""
        j = len(messages) - 1
        if j < 0 or j in self.placed or not isinstance(messages[j], dict) or messages[j].get("role") != "user":
            return False
        self.placed[j] = (messages[j], state, _with_text(messages[j], text))
        return True

    def messages(self, messages: list[Any]) -> list[Any]:
        if not self.placed:
            return messages
        out = list(messages)
        for j, (_, _, sent) in self.placed.items():
            out[j] = sent
        return out


# -- frozen_prefix -----------------------------------------------------------------------------
def _sorted_tools(tools: list[Any]) -> list[Any]:
    """Tools by name (picoclaw #617), the client's tools marker moved to the last one."""
    if not all(isinstance(t, dict) for t in tools):
        return tools
    ordered = sorted(tools, key=lambda t: str(t.get("name", "")))
    marker = next((t["cache_control"] for t in reversed(tools) if "cache_control" in t), None)
    if ordered == tools:
        return tools
    if marker is not None:
        ordered = [{k: v for k, v in t.items() if k != "cache_control"} if "cache_control" in t else t
                   for t in ordered]
        ordered[-1] = {**ordered[-1], "cache_control": marker}
    return ordered


def frozen_prefix(requests: Sequence[Request]) -> Applied:
    """oh-my-pi's stable prefix and append-only log, with picoclaw's sorted tools.

    Tools go in name order. The system prompt and tools are frozen behind a fingerprint of their content
    (markers aside): while it is unchanged, the first-sent bytes are re-sent. A message the client re-rendered
    later (the same index, other content, while the history did not shrink) is re-sent as first sent
    (without its old marker); a history that shrank (a compaction) starts the log anew.
    """
    out: list[Request] = []
    changed: list[int] = []
    first: str | None = None
    reorders = refreezes = rewrites = 0
    frozen_key: Any = None
    frozen: tuple[Any, Any] = (None, None)
    prev_orig: list[Any] = []
    prev_sent: list[Any] = []
    for r in requests:
        body = r.body
        tools = body.get("tools")
        new_tools = _sorted_tools(tools) if isinstance(tools, list) else tools
        if isinstance(tools, list) and isinstance(new_tools, list) and new_tools is not tools:
            reorders += 1
            if first is None:
                was, now = (", ".join(str(t.get("name")) for t in ts[:3]) for ts in (tools, new_tools))
                first = f"request {r.origin}: tools not in name order (`{was}…` → `{now}…`)"
        system = body.get("system")
        if frozen[0] == system and frozen[1] == new_tools:
            pass  # the same bytes: nothing to freeze (and the body's own objects stay)
        elif (key := (_without_cc(system), _without_cc(new_tools))) == frozen_key:
            refreezes += 1  # only markers moved: re-send the frozen bytes
            if first is None:
                first = f"request {r.origin}: system/tools markers moved, content unchanged"
            system, new_tools = frozen
        else:
            frozen_key, frozen = key, (system, new_tools)
        messages = body.get("messages")
        sent = messages
        if isinstance(messages, list) and len(messages) >= len(prev_orig):
            keep = []
            for j, m in enumerate(messages):
                if j >= len(prev_orig):
                    keep.append(m)
                elif m == prev_orig[j] or _without_cc(m) == _without_cc(prev_orig[j]):
                    # unchanged since the last request: what was sent for it then (the first-sent version, when
                    # an earlier rewrite was undone)
                    keep.append(m if prev_sent[j] is prev_orig[j] else prev_sent[j])
                else:
                    keep.append(_without_cc(prev_sent[j]))
                    rewrites += 1
                    if first is None:
                        first = f"request {r.origin}: messages[{j}] re-rendered (history rewritten)"
            if any(a is not b for a, b in zip(keep, messages, strict=True)):
                sent = keep
        new = dict(body)
        for name, value in (("system", system), ("tools", new_tools), ("messages", sent)):
            if name in body:
                new[name] = value
        if any(new.get(k) is not body.get(k) for k in ("system", "tools", "messages")):
            changed.append(r.origin)
            out.append(Request(r.at, new, r.origin, r.ping))
        else:
            out.append(r)
        prev_orig = messages if isinstance(messages, list) else []
        prev_sent = sent if isinstance(sent, list) else []
    counts = ((reorders, "requests with tools sorted"), (refreezes, "marker-only prefix changes"),
              (rewrites, "re-rendered messages"))
    parts = [f"{n} {what}" for n, what in counts if n]
    evidence = (f"{first}; {', '.join(parts)}" if first else
                "nothing to freeze: tools in order, system and tools re-sent as sent, history append-only")
    return Applied(out, changed, evidence)


# -- tail_volatile -----------------------------------------------------------------------------
_DIGITS = re.compile(r"\d+")


@functools.lru_cache(maxsize=1 << 16)
def _shape(line: str) -> str:
    """The line with its digits blanked (a clock's shape stays while its value moves)."""
    return _DIGITS.sub("#", line)


def _volatile_shapes(texts: list[list[str] | None], min_changes: int
                     ) -> tuple[list[set[str]], list[bool], dict[str, Any] | None]:
    """Per system block: the line shapes (digits blanked) whose text changed between consecutive requests
    at least ``min_changes`` times; whether the block's lines were re-ordered; the first volatile change."""
    width = max((len(t) for t in texts if t is not None), default=0)
    counts: list[dict[str, int]] = [{} for _ in range(width)]
    moved = [False] * width
    first_change: list[dict[str, Any] | None] = [None] * width
    prev: list[str] | None = None
    for k, blocks in enumerate(texts):
        if blocks is None:
            prev = None
            continue
        if prev is not None:
            for i, (a, b) in enumerate(zip(prev, blocks, strict=False)):
                if a == b:
                    continue
                la, lb = a.split("\n"), b.split("\n")
                sm = difflib.SequenceMatcher(None, la, lb, autojunk=False)
                gone, came = [], []
                for op, a0, a1, b0, b1 in sm.get_opcodes():
                    if op == "equal":
                        continue
                    gone += la[a0:a1]
                    came += lb[b0:b1]
                    if op == "replace":
                        for x, y in zip(la[a0:a1], lb[b0:b1], strict=False):
                            if x != y and _shape(x) == _shape(y):
                                s = _shape(x)
                                counts[i][s] = counts[i].get(s, 0) + 1
                                if first_change[i] is None:
                                    first_change[i] = {"request": k, "block": i, "old": x, "new": y,
                                                       "byte": len("\n".join(la[:a0]).encode()) + (1 if a0 else 0)}
                if {x for x in gone if x.strip()} & set(came):  # a line that only moved: a re-ranked list
                    moved[i] = True
        prev = blocks
    shapes = [{s for s, n in c.items() if n >= min_changes} for c in counts]
    firsts = [f for f, s in zip(first_change, shapes, strict=True) if f is not None and _shape(f["old"]) in s]
    return shapes, moved, (min(firsts, key=lambda f: (f["request"], f["block"])) if firsts else None)


def _keyed_lines(lines: list[str]) -> list[tuple[tuple[str, int], str]]:
    """Each line keyed by (text, its occurrence number): a repeated line keeps its own place."""
    seen: dict[str, int] = {}
    keyed = []
    for ln in lines:
        n = seen[ln] = seen.get(ln, 0) + 1
        keyed.append(((ln, n), ln))
    return keyed


def tail_volatile(requests: Sequence[Request], *, min_changes: int = MIN_CHANGES,
                  family: Sequence[Sequence[Request]] = ()) -> Applied:
    """Move what keeps changing out of the system prompt (picoclaw #3321, OpenClaw #77521).

    Volatile lines are found from the bodies themselves: a system line whose text changes between
    consecutive requests while its shape (digits blanked: ``Current time: 13:00`` → ``Current time: ##:##``)
    stays, at least ``min_changes`` times in the session. They leave the system prompt and ride, as one text
    block, on the newest user message whenever they differ from what the history last carried; that message
    keeps them in history. A block whose lines were re-ordered (a re-ranked list) keeps its lines in the order
    they first appeared (a line first seen later joins at the block's end). The rest of the body is untouched.

    ``family``: the other conversations the same client sent in the same cache (a parent and its sub-agents, each
    in time order). The fix is the client's, so what it learns is the family's: a line volatile in any of them is
    volatile in all, and a re-ranked list keeps the order its lines first appeared in across the family — a
    sub-agent of a dozen requests then sends its parent's system prompt, as the fixed client would.
    """
    texts = [_system_texts(r.body) for r in requests]
    shapes, moved, first = _volatile_shapes(texts, min_changes)
    start = requests[0].at if requests else None
    earlier: list[Request] = []
    for conv in family:
        more, also, _ = _volatile_shapes([_system_texts(r.body) for r in conv], min_changes)
        shapes = [(shapes[i] if i < len(shapes) else set()) | (more[i] if i < len(more) else set())
                  for i in range(max(len(shapes), len(more)))]
        moved = [(i < len(moved) and moved[i]) or (i < len(also) and also[i]) for i in range(len(shapes))]
        earlier += [r for r in conv if start is not None and r.at < start]
    rank: list[dict[tuple[str, int], int]] = [{} for _ in shapes]
    for r in sorted(earlier, key=lambda r: r.at):  # the family's first-seen order comes first
        for i, text in enumerate(_system_texts(r.body) or []):
            if i < len(moved) and moved[i]:
                vol = shapes[i]
                for key, _ in _keyed_lines([ln for ln in text.split("\n") if _shape(ln) not in vol]):
                    rank[i].setdefault(key, len(rank[i]))
    carrier = _Carrier(None)
    out: list[Request] = []
    changed: list[int] = []
    moves = 0
    prev_tail: str | None = None
    for r, blocks in zip(requests, texts, strict=True):
        messages = r.body.get("messages")
        if blocks is None or not isinstance(messages, list) or not any(shapes) and not any(moved):
            out.append(r)
            continue
        new_blocks: list[str] = []
        tail: list[str] = []
        for i, text in enumerate(blocks):
            lines = text.split("\n")
            vol = shapes[i] if i < len(shapes) else set()
            keep = [ln for ln in lines if _shape(ln) not in vol] if vol else lines
            tail += [ln for ln in lines if ln.strip() and _shape(ln) in vol] if vol else []
            if i < len(moved) and moved[i]:
                keyed = _keyed_lines(keep)
                for key, _ in keyed:
                    rank[i].setdefault(key, len(rank[i]))
                keep = [ln for _, ln in sorted(keyed, key=lambda kl: rank[i][kl[0]])]
            new_blocks.append("\n".join(keep))
        tail_text = "\n".join(tail) if tail else None
        if prev_tail is not None and tail_text != prev_tail:
            moves += 1
        prev_tail = tail_text
        if tail_text is not None and carrier.carried(messages) != tail_text:
            carrier.place(messages, tail_text, tail_text)
        else:
            carrier.carried(messages)  # drops what a rewritten history no longer holds
        body = r.body
        if new_blocks != blocks:
            body = _with_system_texts(body, new_blocks)
        sent = carrier.messages(messages)
        if sent is not messages:
            body = {**body, "messages": sent}
        if body is not r.body:
            changed.append(r.origin)
            out.append(Request(r.at, body, r.origin, r.ping))
        else:
            out.append(r)
    if first is not None:
        body = requests[first["request"]].body
        evidence = (f"{_system_path(body, first['block'])} byte {first['byte']:,}: {_quote(first['old'])} → "
                    f"{_quote(first['new'])}, changes on {moves} of {len(requests)} requests")
    elif any(moved):
        evidence = f"a re-ranked list in the system prompt: its lines change order on {len(changed)} requests"
    else:
        evidence = "no volatile system lines: nothing in the system prompt keeps changing"
    return Applied(out, changed, evidence)


# -- durable_deltas ----------------------------------------------------------------------------
def _delta_text(old: str, new: str) -> str:
    """Lore's durable delta: the lines that changed, and the ones they supersede."""
    la, lb = old.split("\n"), new.split("\n")
    added: list[str] = []
    gone: list[str] = []
    for op, a0, a1, b0, b1 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes():
        if op != "equal":
            gone += [ln for ln in la[a0:a1] if ln.strip()]
            added += [ln for ln in lb[b0:b1] if ln.strip()]
    parts = ["System prompt update (this replaces what the system prompt above says):"]
    if added:
        parts += ["Changed or new lines:", *added]
    if gone:
        parts += ["Superseded lines (ignore them above):", *gone]
    return "\n".join(parts)


#: A heading that opens a memory section (``## Long-term Knowledge``, ``# Memory``): what Lore manages.
_MEMORY_HEADING = re.compile(r"^(#{1,6})\s.*\b(memory|knowledge)\b", re.IGNORECASE)
_HEADING = re.compile(r"^(#{1,6})\s")


@functools.lru_cache(maxsize=64)
def _memory_sections(text: str) -> tuple[tuple[int, int], ...]:
    """The line spans ``[start, end)`` of ``text``'s memory sections: a memory heading to the next heading of its
    level or above (or the end). Remembered: consecutive requests mostly carry the same system text."""
    lines = text.split("\n")
    spans: list[tuple[int, int]] = []
    j = 0
    while j < len(lines):
        opened = _MEMORY_HEADING.match(lines[j])
        if opened is None:
            j += 1
            continue
        level = len(opened.group(1))
        end = next((k for k in range(j + 1, len(lines))
                    if (h := _HEADING.match(lines[k])) and len(h.group(1)) <= level), len(lines))
        spans.append((j, end))
        j = end
    return tuple(spans)


def _memory(texts: list[str]) -> dict[tuple[int, str], str]:
    """(block, heading) -> the memory section's text, over a system prompt's blocks."""
    out: dict[tuple[int, str], str] = {}
    for i, text in enumerate(texts):
        lines = text.split("\n")
        for a, b in _memory_sections(text):
            out.setdefault((i, lines[a]), "\n".join(lines[a:b]))
    return out


def _with_memory(texts: list[str], pinned: dict[tuple[int, str], str]) -> list[str]:
    """``texts`` with each memory section that ``pinned`` knows (by block and heading) re-sent as pinned."""
    out = []
    for i, text in enumerate(texts):
        lines = text.split("\n")
        spans = [(a, b) for a, b in _memory_sections(text) if (i, lines[a]) in pinned]
        if not spans:
            out.append(text)
            continue
        parts: list[str] = []
        at = 0
        for a, b in spans:
            parts += lines[at:a] + [pinned[(i, lines[a])]]
            at = b
        out.append("\n".join(parts + lines[at:]))
    return out


def durable_deltas(requests: Sequence[Request]) -> Applied:
    """Lore #747: the memory in the system prompt is pinned at its first bytes; each later change becomes a
    durable delta.

    Lore pins the memory it manages and leaves the host's own prompt untouched (``system[0]``,
    docs/seed_designs.md#lore-request-layout). So the memory sections of the first request's system prompt (a
    heading naming memory or knowledge, to the next heading of its level) are re-sent as first sent on every
    request, and the rest of the system prompt goes as the request has it: state the host re-renders into its
    own prompt (a ``git status``, a clock) still re-writes what follows it, as under Lore. A system prompt with no
    memory section is pinned whole. When the memory differs from what the history last carried (the pinned
    memory plus the deltas in it), a delta — the changed or new lines, then the superseded ones — rides as a
    text block on the newest user message and stays in history. A history that dropped a delta (a compaction)
    gets a new one against what it still carries.
    """
    out: list[Request] = []
    changed: list[int] = []
    if not requests:
        return Applied(out, changed, "no requests")
    first_texts = _system_texts(requests[0].body) or []
    pinned = requests[0].body.get("system")
    memory = _memory(first_texts)  # empty: the whole prompt is pinned
    carrier = _Carrier("\n\n".join(memory.values()) if memory else "\n\n".join(first_texts))
    first: str | None = None
    deltas = passed = 0
    last: tuple[list[str], Any] = (first_texts, pinned)  # the texts sent last and their system object
    for r in requests:
        body = r.body
        messages = body.get("messages")
        texts = _system_texts(body)
        if texts is None or not isinstance(messages, list):
            out.append(r)
            continue
        system = pinned
        if memory:
            now_memory = _memory(texts)
            now = "\n\n".join(now_memory.get(k, "") for k in memory)
            sent = _with_memory(texts, memory)
            if sent != last[0]:
                last = (sent, _with_system_texts(body, sent)["system"])
            system = last[1]
            if sent != first_texts:
                passed += 1
        else:
            now = "\n\n".join(texts)
        known = carrier.carried(messages)
        if now != known and carrier.place(messages, now, _delta_text(known, now)):
            deltas += 1
            if first is None:
                la, lb = known.split("\n"), now.split("\n")
                j = next((j for j, (a, b) in enumerate(zip(la, lb, strict=False)) if a != b), min(len(la), len(lb)))
                old = la[j] if j < len(la) else ""
                first = (f"{'memory' if memory else 'system'} line {j + 1} at request {r.origin}: {_quote(old)} → "
                         f"{_quote(lb[j] if j < len(lb) else '')}")
        new = dict(body)
        if "system" in body or system is not None:
            new["system"] = system
            if system is None:
                del new["system"]
        new["messages"] = carrier.messages(messages)
        if new.get("system") is not body.get("system") or new["messages"] is not messages:
            changed.append(r.origin)
            out.append(Request(r.at, new, r.origin, r.ping))
        else:
            out.append(r)
    kept = (f"; the rest of the system prompt (the host's own) sent as it was on {_n(passed, 'request')} where it "
            "changed" if passed else "")
    evidence = (f"{first}; {_n(deltas, 'delta')} in {_n(len(requests), 'request')}{kept}" if first else
                ("the memory never changed: nothing to pin" if memory else
                 "the system prompt never changed: nothing to pin") + kept)
    return Applied(out, changed, evidence)


# -- breakpoints -------------------------------------------------------------------------------
def _marker_count(body: dict[str, Any]) -> int:
    n = 0
    for key in ("tools", "system"):
        part = body.get(key)
        if isinstance(part, list):
            n += sum(1 for b in part if isinstance(b, dict) and "cache_control" in b)
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            n += sum(1 for b in content if isinstance(b, dict) and "cache_control" in b)
    return n


def system_blocks(requests: Sequence[Request]) -> int:
    """The most system blocks any request has (a string system prompt is one)."""
    return max((1 if isinstance(r.body.get("system"), str) else len(r.body.get("system") or [])
                for r in requests), default=0)


def _strip(items: list[Any]) -> list[Any]:
    return [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) and "cache_control" in b
            else b for b in items]


def breakpoints(requests: Sequence[Request], *, marker: dict[str, Any] | None = None,
                system_block: int | None = None) -> Applied:
    """Place 2 of Anthropic's 4 ``cache_control`` markers where this traffic's prefixes end, as pi-ai does.

    Every marker the client placed (and the automatic top-level one) is replaced by: one on a system block —
    ``system_block`` (the counterfactual tries each and keeps the cheapest: the end of the longest prefix that
    stays), by default the last — and one on the last block of the newest message (the next request reads it:
    it starts within the 20-block lookback of a request that adds fewer than 20 blocks). A string system prompt or
    message becomes one text block (in every request alike, so bytes stay stable). ``marker`` defaults to the
    client's first (TTL included), else ``{"type": "ephemeral"}``. The tools get no marker: the strategies this fix
    stands for (oh-my-pi's append-only context, Lore) place none there, so a system prompt change re-writes the
    tools under them too, and a counterfactual that kept the tools cached would promise a saving they do not make.
    """
    out: list[Request] = []
    changed: list[int] = []
    before: list[int] = []
    converted: dict[int, tuple[Any, Any]] = {}  # id(message) -> (message, as sent: list content, no markers)
    stripped: dict[int, tuple[Any, Any]] = {}  # id(block) -> (block, without its marker)
    # the previous request's (source, marker, result) for tools and system: an unchanged part stays one object
    reused: dict[str, tuple[Any, Any, Any]] = {}
    for r in requests:
        body = r.body
        mark = marker or _first_marker(body) or {"type": "ephemeral"}
        before.append(_marker_count(body) + (1 if "cache_control" in body else 0))
        new = {k: v for k, v in body.items() if k != "cache_control"}
        for key in ("tools", "system"):
            part = body.get(key)
            if not part or not isinstance(part, list | str):
                continue
            seen = reused.get(key)
            if seen is not None and seen[0] is part and seen[1] == mark:
                new[key] = seen[2]
                continue
            if key == "tools":
                new[key] = _strip(part) if isinstance(part, list) else part
            elif isinstance(part, str):
                new[key] = [{"type": "text", "text": part, "cache_control": mark}]
            else:
                at = len(part) - 1 if system_block is None else min(system_block, len(part) - 1)
                blocks = _strip(part)
                blocks[at] = {**blocks[at], "cache_control": mark}
                new[key] = blocks
            reused[key] = (part, mark, new[key])
        messages = body.get("messages")
        if isinstance(messages, list):
            sent = []
            for m in messages:
                got = converted.get(id(m))
                if got is None or got[0] is not m:
                    content = m.get("content")
                    if isinstance(content, str):
                        blocks = [{"type": "text", "text": content}]
                    else:  # the blocks are shared by consecutive bodies even where their message dicts are not
                        blocks = []
                        for b in content:
                            done = stripped.get(id(b))
                            if done is None or done[0] is not b:
                                done = stripped[id(b)] = (b, _strip([b])[0])
                            blocks.append(done[1])
                    got = converted[id(m)] = (m, {**m, "content": blocks})
                sent.append(got[1])
            if sent:
                last = sent[-1]
                content = list(last["content"])
                where = next((i for i in range(len(content) - 1, -1, -1)
                              if isinstance(content[i], dict) and content[i].get("type") not in _THINKING
                              and (content[i].get("type") != "text" or content[i].get("text"))), None)
                if where is not None:
                    content[where] = {**content[where], "cache_control": mark}
                    sent[-1] = {**last, "content": content}
            new["messages"] = sent
        changed.append(r.origin)
        out.append(Request(r.at, new, r.origin, r.ping))
    shown = f"{min(before)}–{max(before)}" if before and min(before) != max(before) else str(before[0] if before else 0)
    placed = "last system block" if system_block is None else f"system[{system_block}]"
    evidence = (f"{shown} marker{'' if shown == '1' else 's'} per request before; after: {placed}, "
                "newest message's last block")
    return Applied(out, changed, evidence)


def _first_marker(body: dict[str, Any]) -> dict[str, Any] | None:
    for key in ("tools", "system"):
        part = body.get(key)
        if isinstance(part, list):
            for b in part:
                if isinstance(b, dict) and "cache_control" in b:
                    return dict(b["cache_control"])
    cc = body.get("cache_control")
    return dict(cc) if isinstance(cc, dict) else None


# -- ttl ---------------------------------------------------------------------------------------
#: The places a marker can sit, in prefix order: a 1h breakpoint must come before every 5m one
#: (docs/provider_cache_rules.md#anthropic-usage, "Mixing TTLs"), so a TTL choice is where the 1h run ends.
TTL_ROLES: tuple[str, ...] = ("tools", "system", "messages")

#: The same on a partial body: the client's assumed breakpoints (the unlogged prefix, the conversation).
PARTIAL_TTL_ROLES: tuple[str, ...] = ("prefix", "conversation")


def _ttl_block(block: Any, ttl: str) -> Any:
    """A block (tool, system block, message content block) with its marker's TTL set (itself when unmarked or
    already that TTL; a marker naming no TTL is 5m)."""
    if isinstance(block, dict) and isinstance(block.get("cache_control"), dict) \
            and block["cache_control"].get("ttl", "5m") != ttl:
        return {**block, "cache_control": {**block["cache_control"], "ttl": ttl}}
    return block


def _ttl_list(items: Any, ttl: str) -> Any:
    if not isinstance(items, list):
        return items
    out = [_ttl_block(b, ttl) for b in items]
    return items if all(a is b for a, b in zip(out, items, strict=True)) else out


def _ttl_marks(body: dict[str, Any], ttls: dict[str, str], memo: dict[int, tuple[Any, Any]]) -> dict[str, Any]:
    """``body`` with each ``cache_control`` given its role's TTL (``ttls``: role -> TTL; the top-level automatic
    marker lands on the last block: ``messages``); unchanged parts stay the same objects. ``memo``:
    id(message) -> (message, result), for messages shared by requests."""
    new = dict(body)
    auto = body.get("cache_control")
    if isinstance(auto, dict) and auto.get("ttl", "5m") != ttls["messages"]:
        new["cache_control"] = {**auto, "ttl": ttls["messages"]}
    for key in ("tools", "system"):
        if key in body:
            new[key] = _ttl_list(body[key], ttls[key])
    messages = body.get("messages")
    if isinstance(messages, list):
        sent = []
        for m in messages:
            got = memo.get(id(m))
            if got is None or got[0] is not m:
                content = m.get("content") if isinstance(m, dict) else None
                marked = _ttl_list(content, ttls["messages"])
                got = memo[id(m)] = (m, m if marked is content else {**m, "content": marked})
            sent.append(got[1])
        new["messages"] = messages if all(a is b for a, b in zip(sent, messages, strict=True)) else sent
    return body if all(new[k] is body.get(k) for k in new) else new


def ttl_roles(through: str | None, roles: Sequence[str] = TTL_ROLES) -> dict[str, str]:
    """role -> TTL: 1h on every role up to and including ``through`` (None: none), 5m after it."""
    if through is not None and through not in roles:
        raise ValueError(f"through={through!r}: use one of {', '.join(roles)}, or None")
    cut = -1 if through is None else roles.index(through)
    return {r: "1h" if k <= cut else "5m" for k, r in enumerate(roles)}


def ttl_label(through: str | None, roles: Sequence[str] = TTL_ROLES) -> str:
    """``1h on tools, system; 5m on messages``."""
    ttls = ttl_roles(through, roles)
    hour = [r for r in roles if ttls[r] == "1h"]
    five = [r for r in roles if ttls[r] == "5m"]
    return "; ".join(p for p in (f"1h on {', '.join(hour)}" if hour else "",
                                 f"5m on {', '.join(five)}" if five else "") if p)


def ttl(requests: Sequence[Request], *, through: str | None = "messages") -> Applied:
    """Each ``cache_control`` marker (and the automatic top-level one) with the TTL of where it sits: 1h on the
    roles (:data:`TTL_ROLES`: tools, system, messages) up to and including ``through``, 5m after it (None: 5m
    everywhere). One cut keeps every 1h breakpoint before every 5m one, as the API requires.

    A 1h entry costs 2× base input to write (5m: 1.25×) and survives idle gaps up to an hour: it pays where gaps
    between 5 and 60 minutes made the cache rebuild. Which cut pays is a replay question (the counterfactual
    tries each: :meth:`~promptcache_nb.advice._counterfactual.Original.plan`). Bodies without markers are
    unchanged (a partial log's assumed breakpoints are the cache model's: ``client_ttls``).
    """
    ttls = ttl_roles(through)
    out: list[Request] = []
    changed: list[int] = []
    memo: dict[int, tuple[Any, Any]] = {}
    for r in requests:
        new = _ttl_marks(r.body, ttls, memo)
        if new is not r.body:
            changed.append(r.origin)
            out.append(Request(r.at, new, r.origin, r.ping))
        else:
            out.append(r)
    return Applied(out, changed, ttl_label(through))


def marked_roles(requests: Sequence[Request]) -> list[str]:
    """The roles (:data:`TTL_ROLES`) that carry a marker in some request, in prefix order."""
    found: set[str] = set()
    for r in requests:
        body = r.body
        if isinstance(body.get("cache_control"), dict):
            found.add("messages")
        for key in ("tools", "system"):
            part = body.get(key)
            if isinstance(part, list) and any(isinstance(b, dict) and "cache_control" in b for b in part):
                found.add(key)
        if "messages" not in found:
            for m in body.get("messages") or []:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list) and any(isinstance(b, dict) and "cache_control" in b for b in content):
                    found.add("messages")
                    break
        if len(found) == len(TTL_ROLES):
            break
    return [r for r in TTL_ROLES if r in found]


# -- keep_warm ---------------------------------------------------------------------------------
def ping_body(body: dict[str, Any]) -> dict[str, Any]:
    """A keep-warm ping: the request re-sent with ``max_tokens: 0`` (reads, and so refreshes, its prefix)."""
    return {**body, "max_tokens": 0}


def keep_warm(requests: Sequence[Request], *, ttl_seconds: Callable[[dict[str, Any]], float],
              worth: Callable[[int, int], bool]) -> Applied:
    """Pings through the idle gaps that would expire the cache, where they cost less than the rebuild.

    After a request whose shortest entry lives ``ttl_seconds(body)``, a gap longer than that gets a ping every
    ``ttl − 60 s`` (the previous body, ``max_tokens: 0``: it reads, and so refreshes, the prefix) when
    ``worth(i, n)`` says ``n`` pings before ``requests[i]`` cost less than the rebuild they avoid (the counterfactual
    prices both from a replay of the requests).
    """
    out: list[Request] = []
    pinged: list[int] = []
    first: str | None = None
    prev: Request | None = None
    for i, r in enumerate(requests):
        gap = 0.0 if prev is None else (r.at - prev.at).total_seconds()
        if prev is not None and not r.ping and gap > MIN_TTL_SECONDS:
            life = ttl_seconds(prev.body)
            every = max(60.0, life - 60.0)
            n = int(gap // every) - (1 if gap % every == 0 else 0)
            if gap > life and n > 0 and worth(i, n):
                pinged.append(r.origin)
                if first is None:
                    first = f"{gap / 60:.0f} min gap before request {r.origin}: {_n(n, 'ping')}"
                body = ping_body(prev.body)
                out += [Request(prev.at + timedelta(seconds=every * m), body, prev.origin, True)
                        for m in range(1, n + 1)]
        out.append(r)
        if not r.ping:
            prev = r
    pings = sum(1 for r in out if r.ping) - sum(1 for r in requests if r.ping)
    evidence = (f"{first}; {_n(pings, 'ping')} keep {_n(len(pinged), 'gap')} warm" if first else
                "no idle gap where pings cost less than the rebuild")
    return Applied(out, pinged, evidence)


#: How long a staggered request waits after the request it would have raced (well above the cache model's
#: ``ttft_seconds``, the time before a written entry is readable).
STAGGER_SECONDS = 2.0


def stagger(requests: Sequence[Request], *, others: Sequence[datetime],
            pause_seconds: float = STAGGER_SECONDS) -> Applied:
    """Each request sent less than ``pause_seconds`` after another request of its scope (an earlier one of
    ``requests``, or one of ``others``: the sessions replayed beside it) is sent ``pause_seconds`` after that one
    instead; a request never moves before the one before it."""
    times = sorted([*others, *(r.at for r in requests if not r.ping)])
    out: list[Request] = []
    moved: list[int] = []
    last: datetime | None = None
    pause = timedelta(seconds=pause_seconds)
    for r in requests:
        at = r.at
        raced = [t for t in times if at - pause < t < at]
        if raced and not r.ping:
            at = max(raced) + pause
        if last is not None and at < last:
            at = last
        if at != r.at:
            moved.append(r.origin)
            out.append(Request(at, r.body, r.origin, r.ping))
        else:
            out.append(r)
        last = at
    evidence = (f"{_n(len(moved), 'request')} sent within {pause_seconds:g} s of another request of the scope "
                f"(first: request {moved[0]}): each waits {pause_seconds:g} s after it" if moved else
                f"no request sent within {pause_seconds:g} s of another request of its scope")
    return Applied(out, moved, evidence)
