"""Analysis over stored turns: ideal reads, efficiency, comparisons, prices, per-turn diff/observation."""

from __future__ import annotations

from ._turn import (
    OBSERVATION_COLUMNS,
    TurnAnalysis,
    analyse_turn,
    observation_state_from_store,
    stored_diff_and_observation,
)
from .calibrate import Calibration, calibrate, load_calibration
from .frames import compare_df, efficiency, summarize
from .observe import Change, Observation, ObservationState, Snapshot, snapshot  # observe(): from .observe
from .prices import Prices, prices_for
from .resimulate import SELF_HOSTED, compare_caches, default_prices, load_turns, resimulate
from .whatif import keep_warm, rebuilds, ttl_whatif

__all__ = [
    "default_prices",
    "Calibration", "Change", "OBSERVATION_COLUMNS", "Observation", "ObservationState", "Prices",
    "SELF_HOSTED", "Snapshot", "TurnAnalysis", "analyse_turn", "calibrate", "compare_caches", "compare_df",
    "efficiency", "keep_warm", "load_calibration", "load_turns", "observation_state_from_store", "prices_for",
    "rebuilds", "resimulate", "snapshot", "stored_diff_and_observation", "summarize", "ttl_whatif",
]
