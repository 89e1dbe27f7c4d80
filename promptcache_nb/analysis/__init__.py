"""Analysis over stored turns: ideal reads, efficiency, comparisons, prices, per-turn diff/observation."""

from __future__ import annotations

from ._turn import (
    OBSERVATION_COLUMNS,
    TurnAnalysis,
    analyse_turn,
    observation_state_from_store,
    stored_diff_and_observation,
)
from .frames import compare_df, efficiency, summarize
from .prices import Prices, prices_for

__all__ = [
    "OBSERVATION_COLUMNS", "Prices", "TurnAnalysis", "analyse_turn", "compare_df", "efficiency",
    "observation_state_from_store", "prices_for", "stored_diff_and_observation", "summarize",
]
