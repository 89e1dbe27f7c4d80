"""``rewrite_knowledge``: Lore before issue #740 — pinned knowledge, re-rendered in place on a change.

BYK/loreai ``packages/gateway`` before the durable-delta PR #747 (docs/seed_designs.md#lore-request-layout,
docs/seed_designs.md#lore-turn-algorithm step 2):

* ``system[0]`` host prompt; ``system[1]`` the ``preference`` entries with a 1 h breakpoint;
  ``system[2]`` the other entries, ranked by relevance and pinned by their entry-key set;
* while the key set is unchanged (``sameEntryKeys``, order-free) the pinned bytes are reused, so a
  re-ranking changes nothing;
* when a pinned entry materially changes (edited, added or removed) the block is re-rendered in
  place. That is the cost #740 set out to remove: a ``system[2]`` rewrite re-processes everything after
  it, the whole conversation included. ``system[1]`` is re-rendered the same way when a preference
  changes.

``system[2]`` rides the conversation cache (no breakpoint of its own); top-level automatic caching
marks the last block.
"""

from __future__ import annotations

from typing import Any, ClassVar

from . import _lore
from ._base import DEFAULT_MAX_TOKENS, EPHEMERAL, Strategy, StrategyContext, split_preferences


class RewriteKnowledge(Strategy):
    """Lore before #740: system[2] pinned by its key set and rewritten on any material change."""

    name: ClassVar[str] = "rewrite_knowledge"
    title: ClassVar[str] = "pinned knowledge in system[1]/[2], re-rendered on change"
    source: ClassVar[str] = "Lore gateway before #740 (BYK/loreai, packages/gateway)"

    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        prefs, context = split_preferences(ctx.knowledge)
        stable_keys = _lore.keys_of(prefs)
        if ctx.state.get("stable_ltm_text") is None or ctx.extra.get("stable_ltm_keys") != stable_keys:
            ctx.state["stable_ltm_text"] = _lore.render_stable(prefs)
            ctx.extra["stable_ltm_keys"] = stable_keys
        keys = _lore.keys_of(context)
        if not _lore.pin_context(ctx, context) and sorted(ctx.state["ltm_pin_keys"]) != keys:
            ctx.state["ltm_pin_text"] = _lore.render_context(ctx, context)
            ctx.state["ltm_pin_keys"] = keys
        ctx.state["ltm_cache_text"] = ctx.state["ltm_pin_text"]
        return {
            "model": ctx.model,
            "max_tokens": DEFAULT_MAX_TOKENS,
            "cache_control": dict(EPHEMERAL),
            "system": _lore.system_blocks(ctx),
            "tools": list(ctx.tools),
            "messages": list(ctx.messages),
        }
