"""The scenario file's schema: pydantic models with ``extra="forbid"``, so a misspelt key fails naming the valid ones.

Validation only. The loader builds the frozen scenario values from the YAML itself (key order kept, so replays
stay byte-identical) and maps each problem onto ``file:line: field: problem`` with the YAML node marks.
Strict types: ``is_error: "no"`` is a string, not a boolean; ``category: null`` is not a category.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
    model_validator,
)

from .._util import parse_duration

MAX_GAP = timedelta(days=3650)
EVENT_KINDS = ("knowledge_add", "knowledge_update", "knowledge_remove", "tools", "model_switch",
               "host_prompt_edit", "compaction", "restart")


def duration(value: Any) -> timedelta:
    """A gap (``45s``, ``7m``, seconds): finite, not negative, at most ``MAX_GAP``; else ValueError."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"not a duration: {value!r} (use e.g. 45s, 7m, 1h)")
    if not isinstance(value, str | int | float | timedelta):
        raise ValueError(f"not a duration: {value!r} (use e.g. 45s, 7m, 1h)")
    try:
        d = parse_duration(value)
    except OverflowError:
        raise ValueError(f"{value!r} is too long (at most {MAX_GAP.days} days)") from None
    if d < timedelta(0):
        raise ValueError("must not be negative")
    if d > MAX_GAP:
        raise ValueError(f"{value!r} is too long (at most {MAX_GAP.days} days)")
    return d


def _non_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


Duration = Annotated[timedelta, BeforeValidator(duration)]
Text = Annotated[StrictStr, AfterValidator(_non_blank)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ToolM(BaseModel):
    """An Anthropic tool definition. Other fields pass through (server tools, ``cache_control``...)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: Text
    description: StrictStr = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)


class KnowledgeM(_Strict):
    key: Text
    title: Text
    content: Text
    category: Text = "note"


class KnowledgeUpdateM(_Strict):
    key: Text
    title: Text | None = None
    content: Text | None = None
    category: Text | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> KnowledgeUpdateM:
        if self.title is None and self.content is None and self.category is None:
            raise ValueError("give at least one of title, content, category")
        return self


class KnowledgeRemoveM(_Strict):
    key: Text


class ToolsEventM(_Strict):
    add: list[ToolM] = Field(default_factory=list)
    remove: list[Text] = Field(default_factory=list)
    replace: list[ToolM] | None = None


class HostPromptEditM(_Strict):
    text: StrictStr | None = None
    append: StrictStr | None = None

    @model_validator(mode="after")
    def _text_or_append(self) -> HostPromptEditM:
        if self.text is None and self.append is None:
            raise ValueError("give text (new prompt) or append")
        return self


class CompactionM(_Strict):
    summary: Text


class RestartM(_Strict):
    pass


class EventM(_Strict):
    """One event: a one-key mapping naming its kind."""

    knowledge_add: KnowledgeM | None = None
    knowledge_update: KnowledgeUpdateM | None = None
    knowledge_remove: KnowledgeRemoveM | None = None
    tools: ToolsEventM | None = None
    model_switch: Text | None = None
    host_prompt_edit: HostPromptEditM | None = None
    compaction: CompactionM | None = None
    restart: RestartM | None = None

    @field_validator("compaction", mode="before")
    @classmethod
    def _summary_only(cls, value: Any) -> Any:
        return {"summary": value} if isinstance(value, str) else value

    @field_validator("restart", mode="before")
    @classmethod
    def _bare_restart(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _one_kind(self) -> EventM:
        if len(self.model_fields_set) != 1:
            raise ValueError(f"each event is a one-key mapping: one of {', '.join(EVENT_KINDS)}")
        return self


class ToolCallM(_Strict):
    name: Text
    input: dict[str, Any] = Field(default_factory=dict)
    result: Text
    is_error: StrictBool = False
    after: Duration = timedelta(seconds=4)


class TurnM(_Strict):
    user: Text
    reply: Text
    after: Duration = timedelta(seconds=45)
    events: list[EventM] = Field(default_factory=list)
    tool_calls: list[ToolCallM] = Field(default_factory=list)


class ScenarioM(_Strict):
    """The top level. ``host_prompt`` xor ``host_prompt_file``, ``tools`` xor ``tools_file``: checked by the loader,
    which reads the files."""

    name: Text = None  # type: ignore[assignment]  # absent: the file's stem; present: a non-empty string
    description: StrictStr = ""
    model: Text
    start: Any = None
    project: Text = "default"
    host_prompt: Text = None  # type: ignore[assignment]
    host_prompt_file: Text = None  # type: ignore[assignment]
    tools: list[ToolM] = None  # type: ignore[assignment]
    tools_file: Text = None  # type: ignore[assignment]
    knowledge: list[KnowledgeM] = Field(default_factory=list)
    turns: list[TurnM] = Field(min_length=1)
    extra: dict[str, Any] = Field(default_factory=dict)
