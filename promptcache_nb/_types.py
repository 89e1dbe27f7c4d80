"""Domain values every stage shares: knowledge entries and prompt-delta rows (frozen, no DB handles).

A leaf: strategies read them, the store writes and reads them, analysis and widgets show them, so they
live below all of those (the store re-exports them, where they were first defined).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any


@lru_cache(maxsize=8192)  # a project's entries are keyed again each time its knowledge is reloaded
def fnv1a(text: str) -> str:
    """32-bit FNV-1a hex, as Lore keys pinned entries (``id:fnv1a(title + "\\x1f" + content)``)."""
    h = 0x811C9DC5
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


@dataclass(frozen=True)
class KnowledgeEntry:
    """One version of a long-term knowledge entry (project-scoped)."""

    id: str
    project_id: str
    version: int
    title: str
    content: str
    category: str
    deleted: bool
    updated_at: datetime
    key: str | None = None

    @property
    def short_id(self) -> str:
        return self.id[:8]

    @cached_property
    def pin_key(self) -> str:
        """``id:hash(title, content)``: changes only when the entry materially changes."""
        return f"{self.id}:{fnv1a(self.title + chr(0x1F) + self.content)}"


@dataclass(frozen=True)
class Delta:
    """A ``session_prompt_deltas`` row."""

    seq: int
    selector: dict[str, Any]
    content: dict[str, Any]
