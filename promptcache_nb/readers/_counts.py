"""Token counts as agent logs write them → :class:`Usage`, with the one-line problem naming the logged field.

Shared by the readers of agents that log usage as bare counts (Gemini CLI, OpenCode, Cline and Roo Code): each
reader does its own arithmetic (inclusive or uncached input), then builds the record here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..usage import MAX_TOKENS, TTL_SPLIT_UNKNOWN_NOTE, Usage

__all__ = ["as_object", "count_problem", "imported_usage"]


def count_problem(raw: Mapping[str, Any], fields: tuple[str, ...], where: str) -> str | None:
    """Why one of ``fields`` of ``raw`` is not a storable count (``where.field: ...``), or None.

    Absent (or null) fields pass: the caller decides what an absent count means."""
    for key in fields:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{where}.{key}: must be a non-negative int, got {value!r:.40}"
        if value > MAX_TOKENS:
            return f"{where}.{key}: {value} tokens in one request is not plausible (limit {MAX_TOKENS})"
    return None


def imported_usage(*, uncached: int, read: int, write: int, output: int | None, raw: dict[str, Any],
                   reasoning: int | None = None, notes: tuple[str, ...] = ()) -> Usage:
    """A measured (``imported``) usage from already converted counts.

    A cache write logged as one figure has no 5m/1h split: the split is unknown (priced at the 5-minute rate,
    with the note saying so), never silently called 5m; no write is a 0/0 split."""
    if write:
        w5, w1, notes = None, None, (*notes, TTL_SPLIT_UNKNOWN_NOTE)
    else:
        w5 = w1 = 0
    return Usage(input_tokens=uncached, cache_read_input_tokens=read, cache_creation_input_tokens=write,
                 cache_creation_5m_input_tokens=w5, cache_creation_1h_input_tokens=w1, output_tokens=output,
                 source="imported", raw=raw, reasoning_tokens=reasoning, notes=notes).check()


def as_object(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (a field a log may omit or spell as null)."""
    return value if isinstance(value, dict) else {}
