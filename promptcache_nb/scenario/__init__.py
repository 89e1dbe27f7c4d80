"""Scenarios: what happens to an agent turn by turn (events as frozen values, YAML loading)."""

from __future__ import annotations

from ._loader import DEFAULT_START, load_scenario, set_model_check, set_prompt_check
from ._model import (
    Compaction,
    Event,
    HostPromptEdit,
    KnowledgeAdd,
    KnowledgeRemove,
    KnowledgeSpec,
    KnowledgeUpdate,
    ModelSwitch,
    Restart,
    Scenario,
    ScenarioTurn,
    ToolCall,
    ToolsChange,
)

__all__ = [
    "DEFAULT_START", "Compaction", "Event", "HostPromptEdit", "KnowledgeAdd", "KnowledgeRemove",
    "KnowledgeSpec", "KnowledgeUpdate", "ModelSwitch", "Restart", "Scenario", "ScenarioTurn",
    "ToolCall", "ToolsChange", "load_scenario", "set_model_check", "set_prompt_check",
]
