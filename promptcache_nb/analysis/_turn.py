"""Per-turn analysis the session stores with each request: prefix diff and cache-break observation.

``analyse_turn`` is called once per request inside the session's write path; its ``columns`` land in
the ``turns`` row. The diff/observation issue fills this in; until then the columns stay NULL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..cache import CacheResult
from ..request import PreparedRequest
from ..usage import Usage

OBSERVATION_COLUMNS = (
    "diverge_path", "diverge_byte", "diverge_token", "shared_prefix_tokens", "pure_append",
    "broke", "previous_cache_read", "changes", "explanation",
)


@dataclass
class TurnAnalysis:
    columns: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(OBSERVATION_COLUMNS))
    diff: Any = None
    observation: Any = None
    state: Any = None
    prompt_cache_info: dict[str, Any] | None = None


def analyse_turn(
    *,
    previous: PreparedRequest | None,
    current: PreparedRequest,
    usage: Usage,
    cache_result: CacheResult | None,
    previous_state: Any,
    at: datetime,
    previous_at: datetime | None,
    events: list[str],
) -> TurnAnalysis:
    return TurnAnalysis()


def observation_state_from_store(store: Any, session_id: str) -> Any:
    return None


def stored_diff_and_observation(store: Any, session_id: str, index: int, prev_body: dict, body: dict) -> tuple:
    return None, None
