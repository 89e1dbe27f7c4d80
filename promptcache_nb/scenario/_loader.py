"""Load scenarios from YAML. Every problem is one line: ``file:line: field: what is wrong``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from .._util import parse_duration
from ..errors import ScenarioError
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

DEFAULT_START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


class _Map(dict):
    """A mapping that remembers the line of each key (1-based) and its own."""

    line: int = 0
    key_lines: dict[str, int]


class _List(list):
    line: int = 0


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    out = _Map()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[str(key)] = key_node.start_mark.line + 1
    return out


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> _List:
    out = _List(loader.construct_object(n, deep=True) for n in node.value)
    out.line = node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)

_TOP_KEYS = {
    "name", "description", "model", "start", "project", "host_prompt", "host_prompt_file",
    "tools", "tools_file", "knowledge", "turns", "extra",
}
_TURN_KEYS = {"user", "reply", "after", "events", "tool_calls"}


def _plain(value: Any) -> Any:
    """Strip line bookkeeping so tool JSON is ordinary dicts and lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _Ctx:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: Any, field: str, problem: str, key: str | None = None) -> ScenarioError:
        line = None
        if isinstance(node, _Map) and key is not None:
            line = node.key_lines.get(key, node.line)
        elif isinstance(node, _Map | _List):
            line = node.line
        return ScenarioError(self.path, line, field, problem)

    def text(self, node: _Map, key: str, field: str, *, required: bool = True, default: str = "") -> str:
        if key not in node:
            if required:
                raise self.fail(node, field, "is required")
            return default
        value = node[key]
        if not isinstance(value, str) or (required and not value.strip()):
            raise self.fail(node, field, "must be a non-empty string", key)
        return value

    def duration(self, node: _Map, key: str, field: str, default: timedelta) -> timedelta:
        if key not in node:
            return default
        try:
            d = parse_duration(node[key])
        except ValueError as exc:
            raise self.fail(node, field, str(exc), key) from None
        if d.total_seconds() < 0:
            raise self.fail(node, field, "must not be negative", key)
        return d


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario YAML file (see ``data/scenarios/`` and the README for the format).

    Example:
        >>> sc = load_scenario("data/scenarios/support_agent.yaml")  # doctest: +SKIP
    """
    p = Path(path)
    ctx = _Ctx(str(path))
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(str(path), None, "file", "not found") from None
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(str(path), mark.line + 1 if mark else None, "yaml", problem) from None
    if not isinstance(doc, _Map):
        raise ScenarioError(str(path), 1, "scenario", "the top level must be a mapping")
    unknown = sorted(set(map(str, doc)) - _TOP_KEYS)
    if unknown:
        raise ctx.fail(doc, unknown[0], f"unknown key (expected one of {', '.join(sorted(_TOP_KEYS))})", unknown[0])
    name = ctx.text(doc, "name", "name", required=False, default=p.stem)
    model = ctx.text(doc, "model", "model")
    start = _parse_start(ctx, doc)
    host_prompt = _host_prompt(ctx, doc, p)
    tools = _tools(ctx, doc, p)
    knowledge = _knowledge(ctx, doc)
    keys = {k.key for k in knowledge}
    turns_node = doc.get("turns")
    if not isinstance(turns_node, _List) or not turns_node:
        raise ctx.fail(doc, "turns", "must be a non-empty list", "turns")
    turns = tuple(_turn(ctx, node, i, keys) for i, node in enumerate(turns_node))
    return Scenario(
        name=name,
        model=model,
        start=start,
        host_prompt=host_prompt,
        tools=tuple(tools),
        knowledge=tuple(knowledge),
        turns=turns,
        description=str(doc.get("description", "")),
        project=str(doc.get("project", "default")),
        path=str(path),
        extra=_plain(doc.get("extra", {})),
    )


def _parse_start(ctx: _Ctx, doc: _Map) -> datetime:
    raw = doc.get("start")
    if raw is None:
        return DEFAULT_START
    if isinstance(raw, datetime):
        value = raw
    else:
        try:
            value = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError:
            raise ctx.fail(doc, "start", f"not an ISO timestamp: {raw!r}", "start") from None
    if value.tzinfo is None:
        raise ctx.fail(doc, "start", "needs a timezone (e.g. 2026-11-02T09:00:00Z)", "start")
    return value.astimezone(UTC)


def _host_prompt(ctx: _Ctx, doc: _Map, p: Path) -> str:
    if "host_prompt_file" in doc:
        rel = ctx.text(doc, "host_prompt_file", "host_prompt_file")
        try:
            return (p.parent / rel).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ctx.fail(doc, "host_prompt_file", f"{rel} not found next to the scenario",
                           "host_prompt_file") from None
    return ctx.text(doc, "host_prompt", "host_prompt")


def _tools(ctx: _Ctx, doc: _Map, p: Path) -> list[dict]:
    node: Any = doc.get("tools", _List())
    if "tools_file" in doc:
        rel = ctx.text(doc, "tools_file", "tools_file")
        try:
            raw = (p.parent / rel).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ctx.fail(doc, "tools_file", f"{rel} not found next to the scenario", "tools_file") from None
        node = json.loads(raw) if rel.endswith(".json") else yaml.load(raw, Loader=_Loader)  # noqa: S506
    if not isinstance(node, list):
        raise ctx.fail(doc, "tools", "must be a list of Anthropic tool definitions", "tools")
    return [_tool(ctx, t, f"tools[{i}]") for i, t in enumerate(node)]


def _tool(ctx: _Ctx, t: Any, field: str) -> dict:
    if not isinstance(t, dict) or "name" not in t:
        raise ctx.fail(t, field, "each tool needs at least a name (and description, input_schema)")
    if "input_schema" in t and not isinstance(t["input_schema"], dict):
        raise ctx.fail(t, f"{field}.input_schema", "must be a JSON-schema mapping", "input_schema")
    return _plain(t)


def _knowledge(ctx: _Ctx, doc: _Map) -> list[KnowledgeSpec]:
    node = doc.get("knowledge", _List())
    if not isinstance(node, list):
        raise ctx.fail(doc, "knowledge", "must be a list", "knowledge")
    out, seen = [], set()
    for i, k in enumerate(node):
        f = f"knowledge[{i}]"
        if not isinstance(k, _Map):
            raise ctx.fail(node, f, "must be a mapping with key, title, content")
        key = ctx.text(k, "key", f"{f}.key")
        if key in seen:
            raise ctx.fail(k, f"{f}.key", f"duplicate key {key!r}", "key")
        seen.add(key)
        out.append(KnowledgeSpec(key, ctx.text(k, "title", f"{f}.title"), ctx.text(k, "content", f"{f}.content"),
                                 str(k.get("category", "note"))))
    return out


def _turn(ctx: _Ctx, node: Any, i: int, keys: set[str]) -> ScenarioTurn:
    f = f"turns[{i}]"
    if not isinstance(node, _Map):
        raise ctx.fail(node, f, "must be a mapping with user and reply")
    unknown = sorted(set(map(str, node)) - _TURN_KEYS)
    if unknown:
        raise ctx.fail(node, f"{f}.{unknown[0]}", f"unknown key (expected {', '.join(sorted(_TURN_KEYS))})", unknown[0])
    events = tuple(_event(ctx, e, f"{f}.events[{j}]", keys) for j, e in enumerate(node.get("events") or ()))
    calls_node = node.get("tool_calls") or ()
    calls = []
    for j, c in enumerate(calls_node):
        cf = f"{f}.tool_calls[{j}]"
        if not isinstance(c, _Map):
            raise ctx.fail(calls_node, cf, "must be a mapping with name, input, result")
        inp = c.get("input", {})
        if not isinstance(inp, dict):
            raise ctx.fail(c, f"{cf}.input", "must be a mapping", "input")
        calls.append(ToolCall(
            ctx.text(c, "name", f"{cf}.name"), _plain(inp), ctx.text(c, "result", f"{cf}.result"),
            bool(c.get("is_error", False)), ctx.duration(c, "after", f"{cf}.after", timedelta(seconds=4)),
        ))
    return ScenarioTurn(
        user=ctx.text(node, "user", f"{f}.user"),
        reply=ctx.text(node, "reply", f"{f}.reply"),
        after=ctx.duration(node, "after", f"{f}.after", timedelta(seconds=45)),
        events=events,
        tool_calls=tuple(calls),
        line=node.line,
    )


_EVENT_KINDS = ("knowledge_add", "knowledge_update", "knowledge_remove", "tools", "model_switch",
                "host_prompt_edit", "compaction", "restart")


def _event(ctx: _Ctx, e: Any, f: str, keys: set[str]) -> Event:
    if not isinstance(e, _Map) or len(e) != 1:
        raise ctx.fail(e, f, f"each event is a one-key mapping: one of {', '.join(_EVENT_KINDS)}")
    kind, body = next(iter(e.items()))
    line_holder = e
    if kind == "restart":
        return Restart()
    if kind == "model_switch":
        if not isinstance(body, str) or not body:
            raise ctx.fail(line_holder, f"{f}.model_switch", "must name the new model", kind)
        return ModelSwitch(body)
    if kind == "compaction":
        summary = body.get("summary") if isinstance(body, dict) else body
        if not isinstance(summary, str) or not summary.strip():
            raise ctx.fail(line_holder, f"{f}.compaction.summary", "must be a non-empty string", kind)
        return Compaction(summary)
    if not isinstance(body, _Map):
        if kind in _EVENT_KINDS:
            raise ctx.fail(line_holder, f"{f}.{kind}", "must be a mapping", kind)
        raise ctx.fail(line_holder, f"{f}.{kind}", f"unknown event (expected one of {', '.join(_EVENT_KINDS)})", kind)
    if kind == "knowledge_add":
        key = ctx.text(body, "key", f"{f}.knowledge_add.key")
        if key in keys:
            raise ctx.fail(body, f"{f}.knowledge_add.key", f"{key!r} already exists", "key")
        keys.add(key)
        return KnowledgeAdd(key, ctx.text(body, "title", f"{f}.knowledge_add.title"),
                            ctx.text(body, "content", f"{f}.knowledge_add.content"), str(body.get("category", "note")))
    if kind in ("knowledge_update", "knowledge_remove"):
        key = ctx.text(body, "key", f"{f}.{kind}.key")
        if key not in keys:
            raise ctx.fail(body, f"{f}.{kind}.key", f"unknown knowledge key {key!r}", "key")
        if kind == "knowledge_remove":
            keys.discard(key)
            return KnowledgeRemove(key)
        upd = {k: body.get(k) for k in ("title", "content", "category")}
        if all(v is None for v in upd.values()):
            raise ctx.fail(body, f"{f}.knowledge_update", "give at least one of title, content, category")
        return KnowledgeUpdate(key, **upd)
    if kind == "tools":
        replace = body.get("replace")
        return ToolsChange(
            add=tuple(_tool(ctx, t, f"{f}.tools.add[{i}]") for i, t in enumerate(body.get("add") or ())),
            remove=tuple(str(n) for n in body.get("remove") or ()),
            replace=None if replace is None
            else tuple(_tool(ctx, t, f"{f}.tools.replace[{i}]") for i, t in enumerate(replace)),
        )
    if kind == "host_prompt_edit":
        if "text" not in body and "append" not in body:
            raise ctx.fail(body, f"{f}.host_prompt_edit", "give text (new prompt) or append")
        return HostPromptEdit(text=body.get("text"), append=body.get("append"))
    raise ctx.fail(line_holder, f"{f}.{kind}", f"unknown event (expected one of {', '.join(_EVENT_KINDS)})", kind)
