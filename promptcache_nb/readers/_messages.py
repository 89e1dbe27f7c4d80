"""Building Anthropic ``messages`` lists from logged turns (shared by the readers that rebuild bodies)."""

from __future__ import annotations

from typing import Any

__all__ = ["append_message"]


def append_message(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Append content blocks as a ``role`` message; consecutive same-role turns merge into one message.

    The Messages API joins consecutive same-role turns into one, so a rebuilt body is stored in that joined
    form: the segments then match what the cache saw. ``messages`` is changed in place; empty ``blocks`` add
    nothing.
    """
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": list(blocks)})


def content_blocks(content: Any) -> list[dict[str, Any]]:
    """Message content as a list of content blocks (a plain string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]
    return []
