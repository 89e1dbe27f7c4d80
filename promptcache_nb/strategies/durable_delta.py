"""``durable_delta``: Lore's durable prompt deltas (BYK/loreai PR #747, closing issue #740).

The pinned ``system[2]`` bytes never change after the first request. A *material* knowledge change —
an entry whose ``id:fnv1a(title, content)`` key differs, a new entry, or a removed one; a re-ranking is
not one — becomes a user message spliced into the history and persisted as a
``session_prompt_deltas`` row (selector ``{"target": "messages", "insertAt": N}``, content the exact
message JSON). Every later request replays it byte-identically at the same position, so the prefix the
previous request cached stays a prefix (docs/seed_designs.md#lore-data-model to docs/seed_designs.md#lore-edge-cases):

* pin keys stay frozen at the baseline (``ltm_pin_keys``, plus ``extra["stable_ltm_keys"]`` for the
  frozen ``system[1]``), so each delta is cumulative: everything that changed since the pin. A new row
  is appended at the then-current tail only when the key set differs from what the last row covered
  (``extra["delta_keys"]``); rows are immutable once written (the later append-only redesign);
* the row goes to ``safeDeltaInsertIndex(messages, len - 1)``: before the current message, walking
  back so it never lands right after an assistant ``tool_use``;
* the text is ``buildKnowledgeDeltaMessage``'s: the banner, ``## Long-term Knowledge`` within a
  400-token budget (newest changes first), ``## Additional Changed Knowledge (truncated)`` for what
  did not fit, ``## Superseded Long-term Knowledge`` with short ids for removals;
* after a compaction (the history is no longer an extension of the last request's) the rows are
  re-anchored: deleted, and one cumulative row is written at the new tail (Lore's re-anchor on
  compression).

Breakpoints (at most 4, 1 h before 5 m): ``system[1]`` and ``system[2]`` (1 h: the session prefix
survives idle gaps and compactions), the previous request's last block and the last block (5 m).
"""

from __future__ import annotations

from typing import Any, ClassVar

from .._types import KnowledgeEntry
from . import _lore
from ._base import (
    EPHEMERAL_1H,
    Strategy,
    StrategyContext,
    rank_by_relevance,
    safe_insert_index,
)

CONTEXT_TTL = EPHEMERAL_1H


def prioritized(changed: list[KnowledgeEntry], fresh_ids: set[str], query: str) -> list[KnowledgeEntry]:
    """Changes not yet surfaced first (so the newest change always fits the budget), each group ranked."""
    ranked = rank_by_relevance(changed, query)
    return [e for e in ranked if e.id in fresh_ids] + [e for e in ranked if e.id not in fresh_ids]


class DurableDelta(Strategy):
    """Lore #747: pinned system[2] plus cumulative knowledge deltas replayed at fixed positions."""

    name: ClassVar[str] = "durable_delta"
    title: ClassVar[str] = "pinned knowledge + durable, replayed prompt deltas"
    source: ClassVar[str] = "Lore PR #747 (BYK/loreai, closes #740)"

    class Options(_lore.DeltaOptions):
        """Parameters of the delta strategy."""

    options: Options

    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        view = _lore.begin_turn(ctx, "delta_keys")
        current, baseline, covered = view.current, view.baseline, view.covered
        text = None
        if view.rewritten:
            for row in ctx.deltas.list():
                ctx.deltas.delete(row.seq)
            changed = _lore.changed_entries(current, baseline)
            text = _lore.delta_text(
                _lore.DURABLE_BANNER, prioritized(changed, set(), ctx.latest_user_text),
                _lore.removed_ids(current, baseline), budget_tokens=self.options.delta_budget_tokens,
            )
        elif view.changed_since_covered:
            changed = _lore.changed_entries(current, baseline, covered)
            fresh = {e.id for e in _lore.changed_entries(current, covered)}
            text = _lore.delta_text(
                _lore.DURABLE_BANNER, prioritized(changed, fresh, ctx.latest_user_text),
                _lore.removed_ids(current, baseline, covered), budget_tokens=self.options.delta_budget_tokens,
            )
        if view.rewritten or view.changed_since_covered:
            ctx.extra["delta_keys"] = view.next_keys
        if text is not None:
            insert_at = safe_insert_index(ctx.messages, len(ctx.messages) - 1)
            ctx.deltas.append({"target": "messages", "insertAt": insert_at}, _lore.delta_message(text))

        pending = sorted(baseline.values()) != view.next_keys
        ctx.state["ltm_cache_text"] = (
            ctx.state["ltm_pin_text"] if pending else _lore.render_context(ctx, view.context)
        )
        return _lore.finish_turn(ctx, view, _lore.rows_as_inserts(ctx.deltas.list()), context_ttl=CONTEXT_TTL)
