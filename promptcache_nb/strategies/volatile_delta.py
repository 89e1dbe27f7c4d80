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
    Strategy,
    StrategyContext,
    rank_by_relevance,
    safe_insert_index,
)
from .durable_delta import CONTEXT_TTL


class VolatileDelta(Strategy):
    """#740 proposal: pinned system[2] plus a one-request knowledge delta at the tail."""

    name: ClassVar[str] = "volatile_delta"
    title: ClassVar[str] = "pinned knowledge + one-turn delta message"
    source: ClassVar[str] = "Lore issue #740 proposal (BYK/loreai), before PR #747"

    class Options(_lore.DeltaOptions):
        """Parameters of the delta strategy."""

    options: Options

    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        view = _lore.begin_turn(ctx, "seen_keys")
        inserts = []
        if view.changed_since_covered:
            text = _lore.delta_text(
                _lore.VOLATILE_BANNER,
                rank_by_relevance(_lore.changed_entries(view.current, view.covered), ctx.latest_user_text),
                _lore.removed_ids(view.current, view.covered), budget_tokens=self.options.delta_budget_tokens,
            )
            ctx.extra["seen_keys"] = view.next_keys
            if text is not None:
                at = safe_insert_index(ctx.messages, len(ctx.messages) - 1)
                inserts.append((at, 0, _lore.delta_message(text)))
        ctx.state["ltm_cache_text"] = _lore.render_context(ctx, view.context)
        return _lore.finish_turn(ctx, view, inserts, context_ttl=CONTEXT_TTL)
