"""``naive``: everything re-rendered into the system prompt every turn.

The design the seed systems replaced (OpenClaw #54256/#26750, picoclaw #607, Lore before pinning): the
host prompt, the current clock and every knowledge entry — ranked by relevance to the latest user
message — are concatenated into one system text each turn, with top-level automatic caching. Any
clock tick, knowledge edit or re-ranking changes ``system`` and so invalidates everything after it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ._base import (
    DEFAULT_MAX_TOKENS,
    EPHEMERAL,
    Strategy,
    StrategyContext,
    clock_text,
    format_knowledge,
    rank_by_relevance,
    runtime_text,
    text_block,
)


class Naive(Strategy):
    """Host prompt, clock and ranked knowledge concatenated into one system text every turn."""

    name: ClassVar[str] = "naive"
    title: ClassVar[str] = "clock + all knowledge re-rendered in the system prompt"
    source: ClassVar[str] = "the baseline the seeds replaced (OpenClaw #54256, picoclaw #607)"

    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        ranked = rank_by_relevance(ctx.knowledge, ctx.latest_user_text)
        system = "\n\n".join(
            [
                ctx.host_prompt,
                f"## Current Time\n{clock_text(ctx.now)}\n\n## Runtime\n{runtime_text()}",
                format_knowledge(ranked),
            ]
        )
        return {
            "model": ctx.model,
            "max_tokens": DEFAULT_MAX_TOKENS,
            "cache_control": dict(EPHEMERAL),
            "system": [text_block(system)],
            "tools": list(ctx.tools),
            "messages": list(ctx.messages),
        }
