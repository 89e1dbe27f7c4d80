"""Lore's long-term-memory layout, shared by ``rewrite_knowledge``, ``volatile_delta`` and ``durable_delta``.

Upstream request layout (BYK/loreai ``packages/gateway``; docs/seed_designs.md#lore-request-layout):

* ``system[0]`` — the host prompt, passed through (left out when the host sends none);
* ``system[1]`` — stable LTM: the ``preference`` entries, ``cache_control`` with a 1 h TTL;
* ``system[2]`` — context LTM: every other entry ranked by relevance to the latest user message,
  pinned by its entry-key set (``id:fnv1a(title + "\\x1f" + content)``, :attr:`KnowledgeEntry.pin_key`),
  so re-ranking alone never changes its bytes.

Lore defers ``system[2]`` to turn 2 because its retriever needs a conversation; our ranking only needs
the first user message, so it is pinned on the first request and the prefix never grows mid-session.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, overload

from pydantic import Field

from .._types import Delta, KnowledgeEntry
from ._base import (
    DEFAULT_MAX_TOKENS,
    EPHEMERAL,
    EPHEMERAL_1H,
    Strategy,
    StrategyContext,
    fingerprint,
    format_entry,
    format_knowledge,
    has_tool_use,
    last_markable_index,
    mark_message,
    rank_by_relevance,
    split_preferences,
    text_block,
)

STABLE_HEADING = "## Stable Long-term Knowledge"
CONTEXT_HEADING = "## Long-term Knowledge"

DURABLE_BANNER = (
    "[Lore knowledge update: durable prompt delta. This message is inserted by Lore and replayed "
    "byte-identically on later turns until an intentional cache reset.]\n\n"
)
VOLATILE_BANNER = (
    "[Lore knowledge update: one-turn prompt delta. This message is sent once and is not repeated on "
    "later turns.]\n\n"
)
#: Lore's ``KNOWLEDGE_DELTA_TOKEN_BUDGET`` (400 tokens), at ~4 characters per token.
DELTA_BUDGET_TOKENS = 400
CHARS_PER_TOKEN = 4


# -- keys ----------------------------------------------------------------------------------------

def keys_of(entries: list[KnowledgeEntry]) -> list[str]:
    """Sorted pin keys: a set, stored as a JSON array (Lore's ``ltm_pin_keys``)."""
    return sorted(e.pin_key for e in entries)


def key_map(keys: list[str] | None) -> dict[str, str]:
    """``{entry id: pin key}`` of a key list."""
    return {k.rsplit(":", 1)[0]: k for k in keys or ()}


def baseline_keys(ctx: StrategyContext) -> dict[str, str]:
    """The keys system[1] and system[2] were rendered from: what the pinned bytes tell the model."""
    return {**key_map(ctx.extra.get("stable_ltm_keys")), **key_map(ctx.state.get("ltm_pin_keys"))}


# -- system[1] and system[2] ---------------------------------------------------------------------

def render_stable(prefs: list[KnowledgeEntry]) -> str:
    return format_knowledge(prefs, STABLE_HEADING)


def render_context(ctx: StrategyContext, entries: list[KnowledgeEntry]) -> str:
    return format_knowledge(rank_by_relevance(entries, ctx.latest_user_text), CONTEXT_HEADING)


def freeze_stable(ctx: StrategyContext, prefs: list[KnowledgeEntry]) -> None:
    """Compute system[1] once per session and freeze it, even when empty (Lore v45)."""
    if ctx.state.get("stable_ltm_text") is None:
        ctx.state["stable_ltm_text"] = render_stable(prefs)
        ctx.extra["stable_ltm_keys"] = keys_of(prefs)


def pin_context(ctx: StrategyContext, entries: list[KnowledgeEntry]) -> bool:
    """Pin system[2] when there is no pin yet, or when the pin keys are unreadable (one re-pin).

    Returns True when it (re)pinned.
    """
    keys = ctx.state.get("ltm_pin_keys")
    readable = isinstance(keys, list) and all(isinstance(k, str) and ":" in k for k in keys)
    if ctx.state.get("ltm_pin_text") is not None and readable:
        return False
    ctx.state["ltm_pin_text"] = render_context(ctx, entries)
    ctx.state["ltm_pin_keys"] = keys_of(entries)
    return True


def system_blocks(ctx: StrategyContext, *, context_ttl: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """[host prompt], stable LTM (1 h breakpoint), pinned context LTM (optional breakpoint)."""
    blocks = [text_block(ctx.host_prompt)] if ctx.host_prompt else []
    blocks.append(text_block(ctx.state["stable_ltm_text"], EPHEMERAL_1H))
    blocks.append(text_block(ctx.state["ltm_pin_text"], context_ttl))
    return blocks


# -- deltas --------------------------------------------------------------------------------------

def changed_entries(current: list[KnowledgeEntry], *baselines: dict[str, str]) -> list[KnowledgeEntry]:
    """Entries whose key differs from their key in any of ``baselines`` (absent counts as differing)."""
    return [e for e in current if any(b.get(e.id) != e.pin_key for b in baselines)]


def removed_ids(current: list[KnowledgeEntry], *baselines: dict[str, str]) -> list[str]:
    ids = {e.id for e in current}
    return sorted({i for b in baselines for i in b} - ids)


def delta_text(
    banner: str,
    changed: list[KnowledgeEntry],
    removed: list[str],
    *,
    budget_tokens: int = DELTA_BUDGET_TOKENS,
) -> str | None:
    """Lore's ``buildKnowledgeDeltaMessage`` text (#747/#917 era, without the #917 overflow ToC).

    ``changed`` is in priority order; entries that do not fit the budget are listed, not dropped.
    """
    if not changed and not removed:
        return None
    budget = budget_tokens * CHARS_PER_TOKEN
    fitted: list[KnowledgeEntry] = []
    used = 0
    for e in changed:
        cost = len(format_entry(e)) + 1
        if used + cost <= budget:
            fitted.append(e)
            used += cost
    if fitted:
        rendered = format_knowledge(fitted, CONTEXT_HEADING)
    elif changed:
        first = changed[0]
        content = first.content[:900] + "…" if len(first.content) > 900 else first.content
        rendered = f"{CONTEXT_HEADING}\n\n" + format_entry(_with_content(first, content))
        fitted = [first]
    else:
        rendered = ""
    shown = {e.id for e in fitted}
    skipped = sorted((e for e in changed if e.id not in shown), key=lambda e: e.id)
    skipped_text = ""
    if skipped:
        lines = []
        for e in skipped[:3]:
            content = e.content[:500] + "..." if len(e.content) > 500 else e.content
            lines.append(f"* **[{e.short_id}]{e.title}**: {content}")
        more = len(skipped) - 3
        if more > 0:
            lines.append(f"* {more} more changed entr{'y' if more == 1 else 'ies'} omitted; older pinned "
                         "system[2] entries for those IDs are stale.")
        skipped_text = "\n\n## Additional Changed Knowledge (truncated)\n\n" + "\n".join(lines)
    removals = ""
    if removed:
        removals = (
            "\n\n## Superseded Long-term Knowledge\n\nIgnore any older pinned system[2] entries with these "
            "IDs; they are no longer in the current selected knowledge set:\n"
            + "\n".join(f"* [{i[:8]}]" for i in removed)
        )
    return banner + rendered + skipped_text + removals


def _with_content(e: KnowledgeEntry, content: str) -> KnowledgeEntry:
    return dataclasses.replace(e, content=content)


def delta_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


class DeltaOptions(Strategy.Options):
    """Options of the delta strategies (``volatile_delta``, ``durable_delta``)."""

    delta_budget_tokens: int = Field(DELTA_BUDGET_TOKENS, ge=1, description="estimated-token budget of one "
                                     "knowledge delta message; changed entries beyond it are listed by id only")


Insert = tuple[int, int, dict[str, Any]]  # (insertAt, seq, message)


class Positions(Sequence[int]):
    """The new index of every original message after :func:`splice` (original ``j`` moves past the rows
    inserted at or before it): computed on access by bisection, never built as an O(history) list."""

    def __init__(self, n: int, shifts: list[int]) -> None:
        self._n, self._shifts = n, shifts  # shifts: each inserted row's index among the originals, sorted

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, j: int) -> int: ...
    @overload
    def __getitem__(self, j: slice) -> list[int]: ...

    def __getitem__(self, j: int | slice) -> int | list[int]:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(self._n))]
        if j < 0:
            j += self._n
        if not 0 <= j < self._n:
            raise IndexError(j)
        return j + bisect_right(self._shifts, j)


def splice(messages: list[dict[str, Any]], inserts: list[Insert]) -> tuple[list[dict[str, Any]], Positions]:
    """Lore's ``applySessionPromptDeltas``: insert ``(insertAt, seq, message)`` rows into ``messages``.

    Each row goes to ``safe_insert_index(messages, min(insertAt, len))``; rows landing on the same
    index keep (insertAt, seq) order. Returns the new list and the new index of every original message.
    """
    n = len(messages)
    placed: list[tuple[int, int, int, dict[str, Any]]] = []  # (index, insertAt, seq, message)
    for insert_at, seq, msg in inserts:
        at = insert_at if insert_at < n else n
        # safe_insert_index, with each message's tool_use test remembered: every turn replays every row
        while at > 0 and _ends_tool_use(messages[at - 1]):
            at -= 1
        placed.append((at, insert_at, seq, msg))
    placed.sort(key=_PLACE_ORDER)  # by index, then (insertAt, seq): usually already in order
    out: list[dict[str, Any]] = []
    shifts = [p[0] for p in placed]
    prev = 0
    # runs of original messages are copied with slices (C speed): history grows every turn
    for at, _insert_at, _seq, msg in placed:
        if at > prev:
            out.extend(messages[prev:at])
            prev = at
        out.append(msg)
    out.extend(messages[prev:])
    return out, Positions(n, shifts)


_PLACE_ORDER = itemgetter(0, 1, 2)
_TOOL_USE: dict[int, tuple[dict[str, Any], bool]] = {}


def _ends_tool_use(message: dict[str, Any]) -> bool:
    """:func:`has_tool_use`, remembered per message object (history messages are never mutated)."""
    hit = _TOOL_USE.get(id(message))
    if hit is not None and hit[0] is message:
        return hit[1]
    if len(_TOOL_USE) >= 65_536:
        _TOOL_USE.clear()
    got = _TOOL_USE[id(message)] = (message, has_tool_use(message))
    return got[1]


def rows_as_inserts(rows: list[Delta]) -> list[Insert]:
    out = []
    for d in rows:
        got = _INSERTS.get(id(d))
        if got is None or got[0] is not d:
            sel = d.selector
            ok = isinstance(sel, dict) and sel.get("target") == "messages" and isinstance(sel.get("insertAt"), int)
            if len(_INSERTS) >= 65_536:
                _INSERTS.clear()
            got = _INSERTS[id(d)] = (d, (sel["insertAt"], d.seq, d.content) if ok else None)
        if got[1] is not None:
            out.append(got[1])
    return out


_INSERTS: dict[int, tuple[Delta, Insert | None]] = {}  # rows are immutable: read each one once


def history_rewritten(ctx: StrategyContext) -> bool:
    """True when the history is not an extension of what the last request saw (compaction).

    Compares the message count (Lore's ``last_known_message_count``) and the first message's digest with the
    history the previous request was built from (``ctx.previous_messages``), which the session keeps: the
    state row is not rewritten every turn to hold them. Sessions stored before that kept both in
    ``extra``; they are read from there when the session cannot tell (and dropped once it can).
    """
    prev = ctx.previous_messages
    count: int | None
    if prev is not None:
        count, first_before = len(prev), (fingerprint(prev[0]) if prev else None)
        ctx.extra.pop("last_message_count", None)
        ctx.extra.pop("first_message", None)
    else:
        count, first_before = ctx.extra.get("last_message_count"), ctx.extra.get("first_message")
    if ctx.messages and prev and ctx.messages[0] is prev[0]:
        first = first_before  # the very same (immutable) history object: digested once
    else:
        first = fingerprint(ctx.messages[0]) if ctx.messages else None
    return count is not None and (len(ctx.messages) < count or first_before != first)


def previous_count(ctx: StrategyContext) -> int | None:
    """How many history messages the previous request was built from (None: no previous request)."""
    prev = ctx.previous_messages
    return len(prev) if prev is not None else ctx.extra.get("last_message_count")


def mark_tail(
    out: list[dict[str, Any]], positions: Sequence[int], previous_count: int | None
) -> None:
    """Breakpoints on the last block and on the previous request's last block.

    The second keeps the previous request's entry directly addressable, so a turn that adds more
    than 20 blocks (a long tool loop, a delta) never falls outside the lookback window.
    """
    last = last_markable_index(out)
    if last is None:
        return
    if previous_count is not None and 0 < previous_count <= len(positions):
        prev = last_markable_index(out, positions[previous_count - 1] + 1)
        if prev is not None and prev != last:
            mark_message(out, prev, EPHEMERAL)
    mark_message(out, last, EPHEMERAL)


# -- the two delta strategies' shared turn -------------------------------------------------------

@dataclasses.dataclass
class PinView:
    """What a delta strategy knows at the start of a turn, after pinning.

    ``covered`` is the key set the model has already been told about (the baseline, or what the last
    delta announced, stored under ``covered_key``); ``previous_count`` is the message count of the
    previous request, None after a history rewrite.
    """

    prefs: list[KnowledgeEntry]
    context: list[KnowledgeEntry]
    baseline: dict[str, str]
    covered: dict[str, str]
    current: list[KnowledgeEntry]
    next_keys: list[str]
    rewritten: bool
    previous_count: int | None

    @property
    def changed_since_covered(self) -> bool:
        return sorted(self.covered.values()) != self.next_keys


def begin_turn(ctx: StrategyContext, covered_key: str) -> PinView:
    """Freeze the stable block, pin system[2] (a (re)pin resets what the deltas covered), and read state."""
    prefs, context = split_preferences(ctx.knowledge)
    freeze_stable(ctx, prefs)
    if pin_context(ctx, context):
        ctx.extra[covered_key] = None  # a (re)pin is a new baseline
    baseline = baseline_keys(ctx)
    last = ctx.extra.get(covered_key)
    current = prefs + context
    rewritten = history_rewritten(ctx)
    return PinView(prefs, context, baseline, baseline if last is None else key_map(last), current,
                   keys_of(current), rewritten, None if rewritten else previous_count(ctx))


def finish_turn(ctx: StrategyContext, view: PinView, inserts: list[Insert], *,
                context_ttl: dict[str, Any] | None) -> dict[str, Any]:
    """Splice the deltas into the history, place the tail breakpoints, and assemble the body."""
    messages, positions = splice(ctx.messages, inserts)
    mark_tail(messages, positions, view.previous_count)
    return {
        "model": ctx.model,
        "max_tokens": DEFAULT_MAX_TOKENS,
        "system": system_blocks(ctx, context_ttl=context_ttl),
        "tools": list(ctx.tools),
        "messages": messages,
    }
