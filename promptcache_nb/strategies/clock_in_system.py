"""``clock_in_system``: picoclaw's cached static system prompt, as merged in PR #617 (issue #607).

picoclaw splits its one system message into parts (docs/seed_designs.md#picoclaw-cached-system-prompt):

* ``system[0]`` — the *static* part: identity and bootstrap files, skills and memory joined by
  ``"\\n\\n---\\n\\n"``; here the host prompt and the long-term knowledge (id order, as a memory file
  has no per-query ranking). Built by ``BuildSystemPromptWithCache`` only when a tracked source
  changed, and sent with ``cache_control``.
* ``system[1]`` — ``buildDynamicContext``: ``## Current Time`` at minute resolution and ``## Runtime``,
  with no ``cache_control``.

Tools go out sorted by name (``ToolRegistry.sortedToolNames``). Top-level automatic caching marks the
last message block, so the reviewer's caveat shows: the static block is read every turn, but the
history after ``system[1]`` is re-processed whenever the minute changes.

picoclaw tracks file mtimes; a session here has no files, so the static text is cached in
``extra["static_prompt"]`` keyed by a fingerprint of its sources (host prompt and knowledge entries).
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
    knowledge_by_id,
    runtime_text,
    sorted_tools,
    text_block,
)

STATIC_SEPARATOR = "\n\n---\n\n"


def dynamic_context(ctx: StrategyContext) -> str:
    """picoclaw's ``buildDynamicContext``: the minute clock and the runtime line."""
    return f"## Current Time\n{clock_text(ctx.now)}\n\n## Runtime\n{runtime_text()}"


def static_prompt(ctx: StrategyContext) -> str:
    """The static text, rebuilt only when its sources' fingerprint changes (picoclaw's
    ``BuildSystemPromptWithCache``)."""
    entries = knowledge_by_id(ctx.knowledge)
    sources = fingerprint(
        {"host": ctx.host_prompt, "knowledge": [[e.id, e.category, e.pin_key] for e in entries]}
    )
    cached = ctx.extra.get("static_prompt")
    if isinstance(cached, dict) and cached.get("fingerprint") == sources:
        return str(cached["text"])
    text = STATIC_SEPARATOR.join(p for p in (ctx.host_prompt, format_knowledge(entries)) if p)
    ctx.extra["static_prompt"] = {"fingerprint": sources, "text": text}
    return text


class ClockInSystem(Strategy):
    """picoclaw #617: static system block cached, minute clock in a second, uncached system block."""

    name: ClassVar[str] = "clock_in_system"
    title: ClassVar[str] = "static system cached, minute clock in system[1]"
    source: ClassVar[str] = "picoclaw PR #617 as merged (sipeed/picoclaw, fixes #607)"

    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        return {
            "model": ctx.model,
            "max_tokens": DEFAULT_MAX_TOKENS,
            "cache_control": dict(EPHEMERAL),
            "system": [text_block(static_prompt(ctx), EPHEMERAL), text_block(dynamic_context(ctx))],
            "tools": sorted_tools(ctx.tools),
            "messages": list(ctx.messages),
        }
