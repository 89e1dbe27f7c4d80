"""``clock_at_tail``: the clock moved after the history (picoclaw PR #3321, OpenClaw #77521/#124107).

picoclaw PR #3321 (closed, not merged) and OpenClaw's fix for #77431 move Current Time and Runtime out
of the system prompt into a ``<runtime_context>`` carrier on the *current* user message
(docs/seed_designs.md#openclaw-user-reports, docs/seed_designs.md#picoclaw-follow-ups). OpenClaw #124107
anchors the carrier on the active user turn, so a tool loop (user, tool_use, tool_result, ...) never moves it.

Layout:

* ``system[0]``: host prompt and long-term knowledge (id order), static, with ``cache_control``.
  Knowledge still lives in the system prompt, so a knowledge change still breaks everything after it.
* tools sorted by name;
* each user turn typed by a person carries, as its first block, the carrier rendered at the moment it
  was the current message. The carrier is stored in ``extra["runtime_context"]`` (keyed by message
  index, checked against the message's digest) and replayed byte-identically when that message is
  history, restarts included;
* top-level automatic caching marks the last block, which is never the carrier.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ._base import (
    DEFAULT_MAX_TOKENS,
    EPHEMERAL,
    Strategy,
    StrategyContext,
    clock_text,
    fingerprint,
    format_knowledge,
    is_user_text,
    knowledge_by_id,
    runtime_text,
    sorted_tools,
    text_block,
)


def runtime_context(ctx: StrategyContext) -> str:
    """The carrier's text: picoclaw's dynamic context wrapped as PR #3321 did."""
    return (
        f"<runtime_context>\n## Current Time\n{clock_text(ctx.now)}\n\n## Runtime\n{runtime_text()}\n"
        "</runtime_context>"
    )


def carry_runtime_context(ctx: StrategyContext) -> list[dict[str, Any]]:
    """``ctx.messages`` with every user turn's carrier prepended (a new one for the active turn)."""
    messages = list(ctx.messages)
    stored: dict[str, Any] = ctx.extra.get("runtime_context") or {}
    active = next((i for i in range(len(messages) - 1, -1, -1) if is_user_text(messages[i])), None)
    kept: dict[str, Any] = {}
    # Only indices that hold a carrier are hashed; a stale one (history rewritten) is dropped.
    for key in sorted(stored, key=int):
        i = int(key)
        if i < len(messages) and stored[key].get("digest") == fingerprint(messages[i]):
            kept[key] = stored[key]
    if active is not None and str(active) not in kept:
        kept[str(active)] = {"digest": fingerprint(messages[active]), "text": runtime_context(ctx)}
    for key, carrier in kept.items():
        i = int(key)
        m = messages[i]
        content = m["content"]
        blocks = [text_block(content)] if isinstance(content, str) else list(content)
        messages[i] = {"role": m["role"], "content": [text_block(carrier["text"]), *blocks]}
    ctx.extra["runtime_context"] = kept
    return messages


class ClockAtTail(Strategy):
    """Static system prompt; the clock rides the current user message and stays there as history."""

    name: ClassVar[str] = "clock_at_tail"
    title: ClassVar[str] = "static system, clock carried on the current user message"
    source: ClassVar[str] = "picoclaw PR #3321 (closed) / OpenClaw #77521, #124107"

    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        knowledge = format_knowledge(knowledge_by_id(ctx.knowledge))
        system = "\n\n".join(p for p in (ctx.host_prompt, knowledge) if p)
        return {
            "model": ctx.model,
            "max_tokens": DEFAULT_MAX_TOKENS,
            "cache_control": dict(EPHEMERAL),
            "system": [text_block(system, EPHEMERAL)],
            "tools": sorted_tools(ctx.tools),
            "messages": carry_runtime_context(ctx),
        }
