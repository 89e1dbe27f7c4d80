"""Analysis over stored turns: ideal reads, efficiency, comparisons, prices, per-turn diff/observation."""

from __future__ import annotations

from ._ideal import IdealRead, carried_over, ideal_read, rebuilt_tokens
from ._turn import (
    OBSERVATION_COLUMNS,
    TurnAnalysis,
    analyse_turn,
    observation_state_from_store,
    stored_diff_and_observation,
)
from .calibrate import (
    Calibration,
    CalibrationChoice,
    CalibrationFit,
    calibrate,
    calibration_for,
    fit_family,
    load_calibration,
)
from .crosscheck import openclaw_crosscheck, provider_agrees, provider_crosscheck, provider_note
from .frames import compare_df, efficiency, summarize
from .observe import Change, Observation, ObservationState, Snapshot, snapshot  # observe(): from .observe
from .prices import CostTotal, Prices, cost_total, price_model_id, prices_for
from .resimulate import (
    SELF_HOSTED,
    compare_caches,
    default_prices,
    history_missing,
    load_turns,
    request_prices,
    resimulate,
    simulate,
)
from .rollups import billing_windows, group_summary, request_table, roll_up_subagents, session_summary, shared_reads
from .whatif import KeepWarm, keep_warm, rebuilds, ttl_whatif

__all__ = [
    "default_prices",
    "Calibration", "CalibrationChoice", "CalibrationFit", "Change", "CostTotal", "IdealRead", "KeepWarm",
    "OBSERVATION_COLUMNS", "Observation", "ObservationState",
    "Prices",
    "SELF_HOSTED", "Snapshot", "TurnAnalysis", "analyse_turn", "billing_windows", "calibrate", "calibration_for",
    "carried_over",
    "compare_caches", "compare_df", "cost_total", "efficiency", "fit_family", "group_summary", "history_missing",
    "ideal_read", "keep_warm", "load_calibration", "load_turns",
    "observation_state_from_store", "openclaw_crosscheck", "price_model_id", "prices_for", "provider_agrees",
    "provider_crosscheck", "provider_note", "rebuilds", "rebuilt_tokens",
    "request_prices", "request_table", "resimulate", "roll_up_subagents", "session_summary", "shared_reads",
    "simulate", "snapshot",
    "stored_diff_and_observation", "summarize",
    "ttl_whatif",
]
