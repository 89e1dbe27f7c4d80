"""Scenario values: frozen, hashable-enough records of what happens to an agent, turn by turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class KnowledgeAdd:
    key: str
    title: str
    content: str
    category: str = "note"
    code = "knowledge_add"


@dataclass(frozen=True)
class KnowledgeUpdate:
    key: str
    title: str | None = None
    content: str | None = None
    category: str | None = None
    code = "knowledge_update"


@dataclass(frozen=True)
class KnowledgeRemove:
    key: str
    code = "knowledge_remove"


@dataclass(frozen=True)
class ToolsChange:
    """The tool set changed (an MCP server reconnected): ``tools`` is the complete new list."""

    add: tuple[Any, ...] = ()
    remove: tuple[str, ...] = ()
    replace: tuple[Any, ...] | None = None
    code = "tools"


@dataclass(frozen=True)
class ModelSwitch:
    model: str
    code = "model_switch"


@dataclass(frozen=True)
class HostPromptEdit:
    """The host prompt file was edited: either a full new ``text`` or an ``append``."""

    text: str | None = None
    append: str | None = None
    code = "host_prompt_edit"


@dataclass(frozen=True)
class Compaction:
    """History replaced by a summary (the agent's context compaction)."""

    summary: str
    code = "compaction"


@dataclass(frozen=True)
class Restart:
    """Drop every in-memory object and resume the session from the store alone."""

    code = "restart"


Event = (
    KnowledgeAdd | KnowledgeUpdate | KnowledgeRemove | ToolsChange | ModelSwitch | HostPromptEdit | Compaction | Restart
)


@dataclass(frozen=True)
class ToolCall:
    """One tool-use round: the assistant calls ``name`` with ``input``; the user side returns ``result``."""

    name: str
    input: dict[str, Any]
    result: str
    is_error: bool = False
    after: timedelta = timedelta(seconds=4)


@dataclass(frozen=True)
class ScenarioTurn:
    user: str
    reply: str
    after: timedelta = timedelta(seconds=45)
    events: tuple[Event, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    line: int | None = None


@dataclass(frozen=True)
class KnowledgeSpec:
    key: str
    title: str
    content: str
    category: str = "note"


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    start: datetime
    host_prompt: str
    tools: tuple[Any, ...]
    knowledge: tuple[KnowledgeSpec, ...]
    turns: tuple[ScenarioTurn, ...]
    description: str = ""
    project: str = "default"
    path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def n_requests(self) -> int:
        """How many API requests a replay sends (one per turn plus one per tool call)."""
        return sum(1 + len(t.tool_calls) for t in self.turns)

    def __repr__(self) -> str:
        return f"Scenario({self.name!r}, turns={len(self.turns)}, requests={self.n_requests}, model={self.model!r})"
