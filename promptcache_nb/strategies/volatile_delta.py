"""``volatile_delta``: the knowledge-delta channel as issue #740 proposed it (BYK/loreai), before #747.

Like ``durable_delta``, the pinned ``system[2]`` bytes never change and a material knowledge change
becomes a user message at the tail (before the current message, never right after a ``tool_use``).
But the delta is *volatile*: a pending queue (Lore's old ``ltm_delta_json`` path) consumed by the next
request. The surfaced key set advances (``extra["seen_keys"]``), nothing is persisted, and the request
after it no longer carries the message. Its disappearance changes the history the previous request
cached, so that request re-processes everything from the delta's position on — the reason PR #747
made deltas durable ("the agent is stateless, so once those bytes disappear they are as if they never
existed").

Same breakpoints as ``durable_delta``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from . import _lore
from ._base import (
    DEFAULT_MAX_TOKENS,
    Strategy,
    StrategyContext,
    rank_by_relevance,
    safe_insert_index,
    split_preferences,
)
from .durable_delta import CONTEXT_TTL


class VolatileDelta(Strategy):
    """#740 proposal: pinned system[2] plus a one-request knowledge delta at the tail."""

    name: ClassVar[str] = "volatile_delta"
    title: ClassVar[str] = "pinned knowledge + one-turn delta message"
    source: ClassVar[str] = "Lore issue #740 proposal (BYK/loreai), before PR #747"

    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        prefs, context = split_preferences(ctx.knowledge)
        _lore.freeze_stable(ctx, prefs)
        if _lore.pin_context(ctx, context):
            ctx.extra["seen_keys"] = None
        last = ctx.extra.get("seen_keys")
        seen = _lore.baseline_keys(ctx) if last is None else _lore.key_map(last)
        current = prefs + context
        next_keys = _lore.keys_of(current)
        rewritten = _lore.history_rewritten(ctx)
        previous_count = None if rewritten else ctx.extra.get("last_message_count")

        inserts = []
        if sorted(seen.values()) != next_keys:
            text = _lore.delta_text(
                _lore.VOLATILE_BANNER,
                rank_by_relevance(_lore.changed_entries(current, seen), ctx.latest_user_text),
                _lore.removed_ids(current, seen), budget_tokens=_lore.budget_tokens(ctx),
            )
            ctx.extra["seen_keys"] = next_keys
            if text is not None:
                at = safe_insert_index(ctx.messages, len(ctx.messages) - 1)
                inserts.append((at, 0, _lore.delta_message(text)))
        ctx.state["ltm_cache_text"] = _lore.render_context(ctx, context)
        messages, positions = _lore.splice(ctx.messages, inserts)
        _lore.mark_tail(messages, positions, previous_count)
        ctx.extra["last_message_count"] = len(ctx.messages)
        return {
            "model": ctx.model,
            "max_tokens": DEFAULT_MAX_TOKENS,
            "system": _lore.system_blocks(ctx, context_ttl=CONTEXT_TTL),
            "tools": list(ctx.tools),
            "messages": messages,
        }
