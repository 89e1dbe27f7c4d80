"""Load scenarios from YAML. Every problem is one line: ``file:line: field: what is wrong``.

The whole file is validated before any value is built: the YAML itself (no aliases, no duplicate keys, bounded
nesting, valid Unicode), then the schema (``_schema.py``: unknown keys, types, durations), then what the schema
cannot see (files it names, knowledge keys and tool names that events refer to, the model, the clock).
"""

from __future__ import annotations

import json
import math
import stat
import types
import typing
import warnings
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .._util import user_stacklevel
from ..errors import ScenarioError, UnknownNameError
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
from ._schema import EVENT_KINDS, EventM, ScenarioM, ToolM, duration

DEFAULT_START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
MAX_DEPTH = 64  # nesting levels; a tool's JSON schema needs a handful, a hostile file thousands (RecursionError)
MAX_FILE_BYTES = 256 * 2**20  # a scenario, host prompt or tools file


class _Map(dict[str, Any]):
    """A mapping that remembers the line of each key (1-based) and its own."""

    line: int = 0
    key_lines: dict[str, int]


class _List(list[Any]):
    line: int = 0
    item_lines: list[int]


class _Problem(Exception):  # noqa: N818 - internal: becomes a ScenarioError once the file name is known
    def __init__(self, line: int | None, field: str, problem: str) -> None:
        super().__init__(problem)
        self.line, self.field, self.problem = line, field, problem


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type information
    """SafeLoader that refuses anchors and aliases (a 300-byte alias bomb expands to gigabytes), duplicate keys
    (YAML's "last one wins" hides typos), non-string keys, nesting deeper than ``MAX_DEPTH`` and lone
    surrogates (``"\\ud800"``), and records the line of every mapping key and list item."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise _Problem(event.start_mark.line + 1, "yaml",
                           f"anchors and aliases ({sign}{event.anchor}) are not allowed in scenarios; write the "
                           "value out in full")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Problem(event.start_mark.line + 1, "yaml", f"nested deeper than {MAX_DEPTH} levels")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.ScalarNode):
            bad = _surrogate(node.value)
            if bad is not None:
                raise _Problem(node.start_mark.line + 1, "yaml", bad)
        return node


def _surrogate(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"contains a lone surrogate {text[exc.start]!r} at character {exc.start}; text must be valid "
                "Unicode")
    return None


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    out = _Map()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            shown = f"; quote it: '{key_node.value}'" if isinstance(key_node, yaml.ScalarNode) else ""
            raise _Problem(line, "yaml", f"keys must be strings{shown}")
        if key in out:
            raise _Problem(line, key, f"duplicate key (first at line {out.key_lines[key]}); keep one")
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = line
    return out


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> _List:
    out = _List(loader.construct_object(n, deep=True) for n in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [n.start_mark.line + 1 for n in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


def _parse_yaml(text: str) -> Any:
    try:
        loader = _Loader(text)  # its reader refuses a NUL or another control character here, at once
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        name = "NUL" if char == "\0" else "a control character"
        raise _Problem(line, "yaml", f"{name} (U+{ord(char):04X}) is not allowed in YAML; remove it, or write it "
                                     'as an escape in a double-quoted string ("\\0")') from None
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        said = [getattr(exc, "context", None), getattr(exc, "problem", None)]
        problem = " ".join(" ".join(str(x).split()) for x in said if x) or str(exc).splitlines()[0]
        raise _Problem(mark.line + 1 if mark else None, "yaml", problem) from None
    finally:
        loader.dispose()


def _plain(value: Any) -> Any:
    """Strip line bookkeeping so tool JSON is ordinary dicts and lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_at(node: Any, loc: tuple[Any, ...] | list[Any]) -> int | None:
    """The line of the deepest node ``loc`` reaches: a key's own line, a list item's, else the enclosing one."""
    line = node.line if isinstance(node, _Map | _List) else None
    for part in loc:
        if isinstance(node, _Map) and isinstance(part, str):
            if part not in node:
                break
            line, node = node.key_lines.get(part, line), node[part]
        elif isinstance(node, _List) and isinstance(part, int) and 0 <= part < len(node):
            line, node = node.item_lines[part], node[part]
        else:
            break
    return line


class _Ctx:
    def __init__(self, path: str, doc: Any) -> None:
        self.path = path
        self.doc = doc

    def fail(self, loc: tuple[Any, ...] | list[Any], problem: str) -> ScenarioError:
        return ScenarioError(self.path, _line_at(self.doc, loc), _field(loc), problem)


def load_scenario(path: str | Path, *, allow_outside: bool = False) -> Scenario:
    """Load a scenario YAML file (see ``data/scenarios/`` and docs/scenarios.md for the format).

    The whole file is checked first; the first problem raises :class:`~promptcache_nb.ScenarioError`, one line
    ``file:line: field: problem``. ``host_prompt_file`` and ``tools_file`` must stay inside the scenario's
    directory (symbolic links included): a shared scenario must not pull ``~/.ssh/...`` into a request body.
    ``allow_outside=True`` lifts that for files you trust.

    Example:
        >>> sc = load_scenario("data/scenarios/support_agent.yaml")  # doctest: +SKIP
    """
    p = Path(path)
    where = str(path)
    text = _read_text(p, where, None, "file")
    try:
        doc = _parse_yaml(text)
    except _Problem as exc:
        raise ScenarioError(where, exc.line, exc.field, exc.problem) from None
    if not isinstance(doc, _Map):
        raise ScenarioError(where, 1, "scenario", "the top level must be a mapping of name, model, turns...")
    ctx = _Ctx(where, doc)
    _validate(ctx, ScenarioM, doc)
    _check_json(ctx, ("extra",), doc.get("extra", {}))
    model = doc["model"]
    _check_model(ctx, ("model",), model)
    start = _parse_start(ctx, doc)
    host_prompt = _host_prompt(ctx, doc, p, allow_outside)
    tools = _tools(ctx, doc, p, allow_outside)
    for check in _PROMPT_CHECK:  # a host prompt past the model's context window: loaded, with a warning
        warning = check(model, host_prompt, tools, where=f"{where}: host prompt and tools (sent with every request)")
        if warning is not None:
            warnings.warn(warning, stacklevel=user_stacklevel())
    knowledge = _knowledge(ctx, doc)
    keys = {k.key for k in knowledge}
    names = [t["name"] for t in tools]
    turns = tuple(_turn(ctx, node, i, keys, names) for i, node in enumerate(doc["turns"]))
    _check_clock(ctx, start, turns)
    return Scenario(
        name=doc.get("name") or p.stem,
        model=model,
        start=start,
        host_prompt=host_prompt,
        tools=tuple(tools),
        knowledge=tuple(knowledge),
        turns=turns,
        description=doc.get("description", ""),
        project=doc.get("project", "default"),
        path=where,
        extra=_plain(doc.get("extra", {})),
    )


def _read_text(p: Path, where: str, line: int | None, field: str, *, shown: str | None = None) -> str:
    shown = shown or ("it" if field == "file" else str(p))  # the scenario itself is already named up front
    try:
        st = p.stat()
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(st.st_mode):  # a FIFO or /dev/zero would block or never end
            raise ScenarioError(where, line, field, f"{shown} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ScenarioError(where, line, field, f"{shown} is larger than {MAX_FILE_BYTES // 2**20} MiB")
        raw = p.read_bytes()
    except FileNotFoundError:
        problem = "not found" if field == "file" else f"{shown} not found next to the scenario"
        raise ScenarioError(where, line, field, problem) from None
    except IsADirectoryError:
        raise ScenarioError(where, line, field, f"{shown} is a directory, not a file") from None
    except OSError as exc:
        raise ScenarioError(where, line, field, f"cannot read {shown}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = raw.count(b"\n", 0, exc.start) + 1
        byte = f"byte 0x{raw[exc.start]:02x}"
        if field == "file":  # the scenario itself: the line is its own
            raise ScenarioError(where, bad_line, field, f"not UTF-8 text ({byte}); save it as UTF-8") from None
        raise ScenarioError(where, line, field, f"{shown} is not UTF-8 text ({byte} on line {bad_line}); save it "
                                                "as UTF-8") from None


_MESSAGES = {
    "missing": "is required",
    "string_type": "must be a string",
    "bool_type": "must be true or false (unquoted)",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "list_type": "must be a list",
    "too_short": "must be a non-empty list",
}


def _validate(ctx: _Ctx, model: Any, value: Any, *, prefix: tuple[Any, ...] = ()) -> None:
    """Check ``value`` against a schema model; the first problem (in file order) raises ScenarioError."""
    try:
        model.model_validate(value)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        found: list[tuple[int, int, tuple[Any, ...], str, str]] = []  # (line, order, loc, problem, error type)
        for err in errors:
            loc = prefix + tuple(err["loc"])
            kind = err["type"]
            if kind == "extra_forbidden":
                owner = _model_at(model, err["loc"][:-1])
                if owner is EventM:
                    problem = f"unknown event (expected one of {', '.join(EVENT_KINDS)})"
                else:
                    valid = ", ".join(sorted(owner.model_fields)) if owner is not None else ""
                    problem = f"unknown key (expected one of {valid})" if valid else "unknown key"
            elif kind == "model_type" and _model_at(model, err["loc"]) is EventM:
                problem = f"each event is a one-key mapping: one of {', '.join(EVENT_KINDS)}"
            elif kind in _MESSAGES:
                problem = _MESSAGES[kind]
            else:
                problem = err["msg"].removeprefix("Value error, ")
            line = _line_at(ctx.doc, loc)
            found.append((line if line is not None else 0, len(found), loc, problem, kind))
        # a key reported missing beside an unknown one is most likely that key misspelt: report the typo
        typos = {f[2][:-1] for f in found if f[4] == "extra_forbidden"}
        first = [f for f in found if not (f[4] == "missing" and f[2][:-1] in typos)]
        line, _, loc, problem, _ = min(first)
        more = f" (and {len(first) - 1} more {'problem' if len(first) == 2 else 'problems'})" if len(first) > 1 else ""
        raise ctx.fail(loc, problem + more) from None


def _model_at(model: Any, loc: tuple[Any, ...] | list[Any]) -> Any:
    """The schema model that validates the value at ``loc`` (None when ``loc`` leaves the models)."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(part, int):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if typing.get_origin(tp) is not list or not args:
                return None
            tp = args[0]
        elif isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) else None


def _unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _check_json(ctx: _Ctx, loc: tuple[Any, ...], value: Any) -> None:
    """Tool definitions, tool inputs and ``extra`` must be JSON: YAML also makes dates, sets, bytes and NaN."""
    stack: list[tuple[tuple[Any, ...], Any]] = [(loc, value)]
    while stack:
        at, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((at + (k,), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((at + (i,), x) for i, x in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise ctx.fail(at, f"{json.dumps(v)} is not a JSON number")
        elif isinstance(v, datetime | date):
            raise ctx.fail(at, f"a YAML date/time is not JSON; quote it: '{v.isoformat()}'")
        elif v is not None and not isinstance(v, str | int | float | bool):
            raise ctx.fail(at, f"a {type(v).__name__} is not JSON")


_MODEL_CHECK: list[Callable[[str], object]] = []


def set_model_check(check: Callable[[str], object] | None) -> None:
    """How :func:`load_scenario` checks model names: ``check(name)`` raises ``UnknownNameError`` for an unknown
    one. The layer that composes the stages installs it (``lab.py``: the Anthropic cache model's table, the one
    ``Lab.session`` validates with), so this stage imports nothing to its right. Unset, models are not checked."""
    _MODEL_CHECK[:] = [] if check is None else [check]


#: The check of a scenario's host prompt and tools against its model's context window (see set_prompt_check).
_PROMPT_CHECK: list[Callable[..., Warning | None]] = []


def set_prompt_check(check: Callable[..., Warning | None] | None) -> None:
    """How :func:`load_scenario` checks that the host prompt and tools fit the model's context window:
    ``check(model, host_prompt, tools, where=...)`` returns the warning to issue (a ``ContextWindowWarning``)
    or None; the scenario loads either way. Installed by the layer that composes the stages, like the model
    check (``lab.py``: :func:`promptcache_nb.analysis.limits.prompt_past_context_window`), so this stage
    imports nothing to its right. Unset, nothing is checked."""
    _PROMPT_CHECK[:] = [] if check is None else [check]


def _check_model(ctx: _Ctx, loc: tuple[Any, ...], model: str) -> None:
    for check in _MODEL_CHECK:
        try:
            check(model)
        except UnknownNameError as exc:
            raise ctx.fail(loc, str(exc)) from None


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
            raise ctx.fail(("start",), f"not an ISO timestamp: {raw!r}") from None
    if value.tzinfo is None:
        raise ctx.fail(("start",), "needs a timezone (e.g. 2026-11-02T09:00:00Z)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ctx.fail(("start",), f"out of range: {raw!r}") from None


def _inside(ctx: _Ctx, doc: _Map, key: str, p: Path, allow_outside: bool) -> Path:
    """The file a ``*_file`` key names, refused when it leaves the scenario's directory."""
    rel = doc[key]
    if "\0" in rel:  # no file name holds one (the OS refuses it: "embedded null byte")
        raise ctx.fail((key,), f"{rel!r} holds a NUL byte, which no file name can hold")
    target = p.parent / str(rel)
    if allow_outside:
        return target
    base = p.parent.resolve()
    how = "pass load_scenario(path, allow_outside=True) to read files elsewhere"
    if Path(rel).is_absolute():
        raise ctx.fail((key,), f"absolute path {rel!r} refused: give a path inside the scenario's directory, or {how}")
    if not target.resolve().is_relative_to(base):
        raise ctx.fail((key,), f"{rel!r} resolves outside the scenario's directory ({base}); {how}")
    return target


def _host_prompt(ctx: _Ctx, doc: _Map, p: Path, allow_outside: bool) -> str:
    if "host_prompt_file" in doc:
        if "host_prompt" in doc:
            raise ctx.fail(("host_prompt_file",), "give host_prompt or host_prompt_file, not both")
        target = _inside(ctx, doc, "host_prompt_file", p, allow_outside)
        return _read_text(target, ctx.path, doc.key_lines["host_prompt_file"], "host_prompt_file",
                          shown=doc["host_prompt_file"])
    if "host_prompt" not in doc:
        raise ScenarioError(ctx.path, None, "host_prompt", "is required (or host_prompt_file)")
    return str(doc["host_prompt"])


def _tools(ctx: _Ctx, doc: _Map, p: Path, allow_outside: bool) -> list[dict[str, Any]]:
    if "tools_file" not in doc:
        node = doc.get("tools", _List())
        _check_tools(ctx, ("tools",), node, set())
        return [_plain(t) for t in node]
    if "tools" in doc:
        raise ctx.fail(("tools_file",), "give tools or tools_file, not both")
    rel = doc["tools_file"]
    target = _inside(ctx, doc, "tools_file", p, allow_outside)
    line = doc.key_lines["tools_file"]
    raw = _read_text(target, ctx.path, line, "tools_file", shown=rel)

    def bad(at: int | None, field: str, problem: str) -> ScenarioError:
        return ScenarioError(ctx.path, line, "tools_file", f"{rel}{f':{at}' if at else ''}: {field}: {problem}")

    if rel.endswith(".json"):
        try:
            node = json.loads(raw, object_pairs_hook=_json_object)
        except json.JSONDecodeError as exc:
            raise bad(exc.lineno, "json", exc.msg) from None
        except ValueError as exc:  # a duplicate key
            raise bad(None, "json", str(exc)) from None
        except RecursionError:
            raise bad(None, "json", "nested too deeply") from None
        if _depth(node) > MAX_DEPTH:
            raise bad(None, "json", f"nested deeper than {MAX_DEPTH} levels")
    else:
        try:
            node = _parse_yaml(raw)
        except _Problem as exc:
            raise bad(exc.line, exc.field, exc.problem) from None
    holder = _Map(tools=node)  # so fields read tools[2].name and lines are the tools file's
    holder.line, holder.key_lines = 1, {"tools": getattr(node, "line", 1)}
    sub = _Ctx(rel, holder)
    try:
        if not isinstance(node, list):
            raise sub.fail(("tools",), "must be a list of Anthropic tool definitions")
        _check_tools(sub, ("tools",), node, set())
    except ScenarioError as exc:
        raise bad(exc.line, exc.field, exc.problem) from None
    return [_plain(t) for t in node]


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def _check_tools(ctx: _Ctx, loc: tuple[Any, ...], node: Any, names: set[str]) -> None:
    """Tool definitions: the schema, JSON values, valid Unicode, and names unique (the API refuses duplicates)."""
    for i, t in enumerate(node):
        if not isinstance(t, dict):
            raise ctx.fail(loc + (i,), "each tool is a mapping with name (and description, input_schema)")
        _validate(ctx, ToolM, t, prefix=loc + (i,))
        _check_json(ctx, loc + (i,), t)
        bad = _first_surrogate(t)
        if bad is not None:
            raise ctx.fail(loc + (i,), bad)
        if t["name"] in names:
            raise ctx.fail(loc + (i, "name"), f"duplicate tool name {t['name']!r}")
        names.add(t["name"])


def _first_surrogate(value: Any) -> str | None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            bad = _surrogate(v)
            if bad is not None:
                return bad
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def _knowledge(ctx: _Ctx, doc: _Map) -> list[KnowledgeSpec]:
    out, seen = [], set()
    for i, k in enumerate(doc.get("knowledge", ())):
        if k["key"] in seen:
            raise ctx.fail(("knowledge", i, "key"), f"duplicate key {k['key']!r}")
        seen.add(k["key"])
        out.append(KnowledgeSpec(k["key"], k["title"], k["content"], k.get("category", "note")))
    return out


def _turn(ctx: _Ctx, node: _Map, i: int, keys: set[str], tools: list[str]) -> ScenarioTurn:
    f = ("turns", i)
    events = tuple(_event(ctx, e, f + ("events", j), keys, tools) for j, e in enumerate(node.get("events", ())))
    calls = []
    for j, c in enumerate(node.get("tool_calls", ())):
        inp = c.get("input", {})
        _check_json(ctx, f + ("tool_calls", j, "input"), inp)
        calls.append(ToolCall(c["name"], _plain(inp), c["result"], c.get("is_error", False),
                              _gap(c, timedelta(seconds=4))))
    return ScenarioTurn(
        user=node["user"],
        reply=node["reply"],
        after=_gap(node, timedelta(seconds=45)),
        events=events,
        tool_calls=tuple(calls),
        line=node.line,
    )


def _gap(node: _Map, default: timedelta) -> timedelta:
    return duration(node["after"]) if "after" in node else default  # the schema has checked it


def _event(ctx: _Ctx, e: _Map, loc: tuple[Any, ...], keys: set[str], tools: list[str]) -> Event:
    kind, body = next(iter(e.items()))
    at = loc + (kind,)
    if kind == "restart":
        return Restart()
    if kind == "model_switch":
        _check_model(ctx, at, body)
        return ModelSwitch(body)
    if kind == "compaction":
        return Compaction(body if isinstance(body, str) else body["summary"])
    if kind == "knowledge_add":
        if body["key"] in keys:
            raise ctx.fail(at + ("key",), f"{body['key']!r} already exists")
        keys.add(body["key"])
        return KnowledgeAdd(body["key"], body["title"], body["content"], body.get("category", "note"))
    if kind in ("knowledge_update", "knowledge_remove"):
        key = body["key"]
        if key not in keys:
            raise ctx.fail(at + ("key",), f"unknown knowledge key {key!r}")
        if kind == "knowledge_remove":
            keys.discard(key)
            return KnowledgeRemove(key)
        return KnowledgeUpdate(key, **{k: body.get(k) for k in ("title", "content", "category")})
    if kind == "tools":
        return _tools_event(ctx, body, at, tools)
    # host_prompt_edit (the schema admits no other kind)
    return HostPromptEdit(text=body.get("text"), append=body.get("append"))


def _tools_event(ctx: _Ctx, body: _Map, at: tuple[Any, ...], tools: list[str]) -> ToolsChange:
    """A tool-set change, checked against the tool names in force at that point of the scenario."""
    if "replace" in body and body["replace"] is not None:
        if body.get("add") or body.get("remove"):
            raise ctx.fail(at + ("replace",), "give replace alone, or add/remove")
        _check_tools(ctx, at + ("replace",), body["replace"], set())
        tools[:] = [t["name"] for t in body["replace"]]
    else:
        for i, name in enumerate(body.get("remove", ())):
            if name not in tools:
                raise ctx.fail(at + ("remove", i), f"no tool named {name!r} at this point; known: "
                                                   f"{', '.join(tools) or '(none)'}")
            tools.remove(name)
        _check_tools(ctx, at + ("add",), body.get("add", ()), set(tools))
        tools.extend(t["name"] for t in body.get("add", ()))
    replace = body.get("replace")
    return ToolsChange(
        add=tuple(_plain(t) for t in body.get("add", ())),
        remove=tuple(body.get("remove", ())),
        replace=None if replace is None else tuple(_plain(t) for t in replace),
    )


def _check_clock(ctx: _Ctx, start: datetime, turns: tuple[ScenarioTurn, ...]) -> None:
    """The scenario clock must stay a datetime: 500 turns a decade apart pass year 9999 (OverflowError)."""
    at = start
    for i, t in enumerate(turns):
        try:
            if i > 0:
                at = at + t.after
            for c in t.tool_calls:
                at = at + c.after
        except OverflowError:
            raise ctx.fail(("turns", i, "after"), "the scenario clock passes the year 9999; shorten the gaps") from None
