"""Does a request body follow its API's documented shape? One implementation for every caller.

``validate_request(body, dialect)`` lists every :class:`BodyProblem` of a body, each one line naming the field
(``messages[2].role: must be 'user', 'assistant' or 'system', got 'wizard'``). ``Session.record`` calls it through
:func:`check_request` (strict: the first problem is a :class:`~promptcache_nb.errors.BodyValidationError`;
lenient, for imports: the body is stored as the log holds it and the problems are returned to be reported),
and the simulator endpoint answers its HTTP 400s with the first problem in the API's dotted notation
(:attr:`BodyProblem.api_line`).

Two kinds of problem:

* ``json`` — the body is not a JSON document: a value JSON has no type for (a ``datetime``, bytes, a tuple),
  ``NaN`` / ``Infinity``, a non-string key, a lone surrogate, nesting deeper than :data:`MAX_DEPTH`. It
  cannot be stored or sent as given, so every mode refuses it. The walk is iterative: no ``RecursionError``.
* ``api`` — valid JSON the API answers with HTTP 400. Anthropic Messages (the ``anthropic`` SDK's
  ``MessageCreateParams``): ``model``, ``max_tokens`` and ``messages`` required; ``max_tokens`` an integer
  ≥ 0 — 0 is documented pre-warming (docs/provider_cache_rules.md#anthropic-ttl-and-refresh), so the
  simulator accepts it too — and at most :data:`MAX_OUTPUT_LIMIT` (every output limit, OpenAI's too: an API
  refuses a limit above the model's maximum output, which no model puts past its context window); roles
  ``user`` / ``assistant``, the first one ``user``, and ``system`` where the API
  places a mid-conversation system message — never first, right after a user turn (or an assistant turn ending
  in a server tool use), followed by an assistant turn or nothing, never two in a row, text blocks only
  (docs/provider_cache_rules.md#anthropic-mid-conversation-system-messages); non-empty content except a final
  assistant prefill; every content block with a known ``type``; a ``tool_result`` answers a ``tool_use`` of the
  message just before it, and a ``tool_use`` is answered in the message just after it; tools named, uniquely, and
  a custom tool with an ``input_schema``. OpenAI Chat Completions and Responses: the essentials (``model``,
  ``messages`` / ``input``, roles and content parts, a ``tool`` message answering a preceding assistant's
  ``tool_calls``, a ``function_call_output`` answering a ``function_call``).

Per-message structure (a message's keys, content types, OpenAI roles and part types) is checked by the same
functions :func:`~promptcache_nb.request.prepare` uses, so both say the same thing about the same body.
Shapes the cache model judges (more than 4 ``cache_control`` breakpoints, TTL order) are left to it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._util import common_prefix_length
from ..errors import BodyValidationError
from ._canonical import (
    _CHAT_TOOL_TYPES,
    _RESPONSES_TOOL_TYPES,
    DIALECTS,
    _check_anthropic_message,
    _check_chat_message,
    _check_item,
    _check_tool,
    _snapshots,
    detect_dialect,
    identity_prefix,
    remember_snapshots,
    remembered_snapshots,
)

#: Deepest nesting accepted (the body itself is level 1). Real bodies stay far below it (a tool's JSON
#: schema is rarely 20 deep); far deeper, Python's own JSON encoder and parser fail with RecursionError.
MAX_DEPTH = 256
#: At most this many problems are listed per body (a log with a million NaNs is one report, not a million).
MAX_PROBLEMS = 50
#: The largest ``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens`` accepted (10**7). The APIs refuse
#: a limit above the model's maximum output ("max_tokens: 100000 > 64000, which is the maximum allowed number of
#: output tokens"), which is below its context window; no model's window reaches 10**7 tokens.
MAX_OUTPUT_LIMIT = 10**7
#: Messages one Messages request may hold (the SDK's ``MessageCreateParams.messages``).
MAX_MESSAGES = 100_000

#: Content block ``type`` values of the Messages API: every ``*BlockParam`` of the anthropic SDK's
#: ``MessageContentParam`` and of its beta ``BetaContentBlockParam`` (tests/test_validate.py checks the
#: installed SDK adds none), plus ``tool_reference`` (tools loaded by tool search).
ANTHROPIC_BLOCK_TYPES = frozenset({
    "text", "image", "document", "search_result", "thinking", "redacted_thinking", "tool_use", "tool_result",
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result",
    "bash_code_execution_tool_result", "text_editor_code_execution_tool_result", "tool_search_tool_result",
    "container_upload", "mcp_tool_use", "mcp_tool_result", "mcp_tool_listing", "compaction", "fallback",
    "advisor_tool_result", "tool_addition", "tool_removal", "tool_reference",
})
#: Roles of a Messages message: ``system`` only mid-conversation (docs/provider_cache_rules.md
#: #anthropic-mid-conversation-system-messages), where the SDK's ``SystemMessageParam`` has it.
ANTHROPIC_ROLES = ("user", "assistant", "system")
#: Ids a ``tool_result`` may answer: a client tool call, or a server tool call the client runs itself.
_TOOL_CALL_BLOCKS = ("tool_use", "server_tool_use")

ProblemKind = Literal["json", "api"]
_SURROGATE = re.compile("[\ud800-\udfff]")
_INDEX = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class BodyProblem:
    """One way a request body departs from its API's documented shape.

    Attributes:
        path: the field, in Python notation (``messages[2].content[0].tool_use_id``); ``""`` for the body.
        problem: what is wrong with it, one line (``must be 'user', 'assistant' or 'system', got 'wizard'``).
        kind: ``json`` (not a JSON document: refused in every mode) or ``api`` (JSON the API refuses: a lenient
            import stores it and reports it).
    """

    path: str
    problem: str
    kind: ProblemKind = "api"

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}" if self.path else self.problem

    @property
    def api_path(self) -> str:
        """The field in the APIs' own error notation: ``messages.2.content.0.tool_use_id``."""
        return _INDEX.sub(r".\1", self.path).lstrip(".")

    @property
    def api_line(self) -> str:
        """The problem as the simulator endpoint words its HTTP 400."""
        return f"{self.api_path}: {self.problem}" if self.path else self.problem


def validate_request(body: Any, dialect: str | None = None, *, previous: Mapping[str, Any] | None = None,
                     partial: bool = False, count_tokens: bool = False) -> list[BodyProblem]:
    """Every problem of ``body`` against its API's documented shape (``[]``: none): the ``json`` ones first, then
    the ``api`` ones in body order; at most :data:`MAX_PROBLEMS`.

    Args:
        body: the request body (a ``dict`` as it would be sent).
        dialect: ``anthropic``, ``openai-chat`` or ``openai-responses``; detected like
            :func:`~promptcache_nb.request.prepare` when omitted.
        previous: the session's previous body, already validated and not mutated since: its leading
            messages (input items) that this body repeats exactly are not checked again, so a growing history
            costs only its new tail. The checks resume at the first new message with the state the repeated
            ones leave (the tool calls awaiting an answer; a final assistant message that is final no more), so
            a problem in repeated history is reported once, with the body where it first appeared.
        partial: the body comes from a log that does not record all of it (docs/provider_cache_rules.md
            #unlogged-prefix; an agent's transcript, telemetry without content): what such a log lacks is not
            required (``model``, ``max_tokens``, ``messages`` / ``input``, at least one message).
        count_tokens: the body is for ``POST /v1/messages/count_tokens``, which takes no ``max_tokens``.

    Example:
        >>> [str(p) for p in validate_request({"model": "claude-sonnet-4-5", "max_tokens": 8,
        ...                                    "messages": [{"role": "wizard", "content": "hi"}]})]
        ["messages[0].role: must be 'user', 'assistant' or 'system', got 'wizard'"]
    """
    if not isinstance(body, Mapping):
        return [BodyProblem("", f"request body must be a JSON object, got {_type_name(body)}", "json")]
    if dialect is None:
        dialect = getattr(body, "dialect", None) or detect_dialect(dict(body))
    if dialect not in DIALECTS:
        raise ValueError(f"dialect: must be one of {', '.join(DIALECTS)}, got {dialect!r}")
    out = _Problems()
    list_key = "input" if dialect == "openai-responses" else "messages"
    skip = _repeated_prefix(body.get(list_key), previous, list_key)
    _walk_json(body, out, skip=(list_key, skip))
    if not partial:
        required = ["model"]
        if dialect == "anthropic":
            required += ["messages"] if count_tokens else ["max_tokens", "messages"]
        elif dialect == "openai-chat":
            required.append("messages")
        elif not {"prompt", "conversation", "previous_response_id"} & body.keys():
            required.append("input")  # a stored prompt or conversation can stand in for it
        for name in required:
            if name not in body:
                out.add(name, "Field required")
    _check_scalars(body, out, dialect)
    # the previous body's length: its final message may be final no more
    prev_len = len(previous[list_key]) if skip and isinstance(previous, Mapping) else 0
    {"anthropic": _check_anthropic, "openai-chat": _check_chat, "openai-responses": _check_responses
     }[dialect](body, out, partial, skip, prev_len)
    return out.items


def check_request(body: Any, dialect: str | None = None, *, lenient: bool = False, request: int | None = None,
                  source: str | None = None, previous: Mapping[str, Any] | None = None, partial: bool = False
                  ) -> list[BodyProblem]:
    """:func:`validate_request`, raising what a caller must refuse; returns the problems left to report.

    Strict (the default; ``Session.record``): any problem raises :class:`BodyValidationError`, one line naming
    the first (``request 3: messages[2].role: must be 'user', 'assistant' or 'system', got 'wizard'``). Lenient
    (imports: a real log holds what was sent): only ``json`` problems raise; the ``api`` ones are returned, to be
    stored with the body and reported. ``request`` (the session's index) and ``source`` (``file:line``) prefix the
    message.
    """
    problems = validate_request(body, dialect, previous=previous, partial=partial)
    fatal = problems if not lenient else [p for p in problems if p.kind == "json"]
    if fatal:
        raise BodyValidationError(fatal, request=request, source=source)
    return problems


# -- the JSON document -----------------------------------------------------------------------------------
class _Problems:
    def __init__(self) -> None:
        self.items: list[BodyProblem] = []

    def add(self, path: str, problem: str, kind: ProblemKind = "api") -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(BodyProblem(path, problem, kind))

    @property
    def full(self) -> bool:
        return len(self.items) >= MAX_PROBLEMS


class _Muted(_Problems):
    """Where the repeated messages a check replays for its state report: nowhere (reported with the previous
    body)."""

    def add(self, path: str, problem: str, kind: ProblemKind = "api") -> None:
        pass


_MUTED = _Muted()


_ELIDED = object()


def _path(parts: list[Any], *, keep: int = 12) -> str:
    """``messages[2].content[0].tool_use_id`` from its keys and indices; a very deep one elided in the middle."""
    elided = 0
    if len(parts) > keep:  # a 5,000-deep path stays one readable line
        elided = len(parts) - keep + 1
        parts = [*parts[:keep - 2], _ELIDED, parts[-1]]
    text = ""
    for k in parts:
        if k is _ELIDED:
            text += f"…({elided} levels)…"
        elif isinstance(k, int):
            text += f"[{k}]"
        elif isinstance(k, str) and k.isidentifier():
            text += f".{k}" if text else k
        else:
            text += f"[{k!r}]"
    return text


_JSON_NAMES = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "list",
               dict: "object"}


def _type_name(value: Any) -> str:
    """What a value is, in JSON's words where it is a JSON value (``null``, ``object``), else its Python type."""
    return _JSON_NAMES.get(type(value)) or type(value).__name__


def _scalar_problem(value: Any) -> str | None:
    """What makes a non-container value not JSON (None: it is JSON)."""
    if isinstance(value, str):
        if value.isascii():
            return None
        bad = _SURROGATE.search(value)
        return None if bad is None else (
            f"contains a lone surrogate {bad.group()!r} at position {bad.start()}, which is not valid Unicode")
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        name = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
        return f"{name} is not a JSON value"
    if value is None or isinstance(value, int):  # bool is an int
        return None
    return f"{_type_name(value)} is not a JSON value (a JSON body holds strings, numbers, booleans, null, " \
           "lists and objects)"


def _walk_json(body: Mapping[str, Any], out: _Problems, *, skip: tuple[str, int]) -> None:
    """Every value JSON cannot hold, in body order. Iterative — a stack of open containers, so depth is data here,
    not Python stack. ``skip``: the first n items of one top-level list, walked already in the previous body."""
    skip_key, skip_n = skip
    # each open container: its (key, value) iterator, whether it is an object, and its key in its parent
    stack: list[tuple[Any, bool, Any]] = [(iter(body.items()), True, None)]

    def where(*key: Any) -> str:
        return _path([frame[2] for frame in stack[1:]] + list(key))

    while stack:
        items, is_object, _ = stack[-1]
        for k, v in items:
            if is_object and type(k) is not str and not isinstance(k, str):
                out.add(where(), f"object keys must be strings, got {_type_name(k)} key {k!r}", "json")
                continue
            t = type(v)
            if t is str:
                if not v.isascii() and _SURROGATE.search(v):
                    out.add(where(k), _scalar_problem(v) or "", "json")
            elif t is int or t is bool or v is None:
                pass
            elif t is dict or t is list or isinstance(v, Mapping | list):
                if len(stack) == MAX_DEPTH:  # v would be level MAX_DEPTH + 1
                    out.add(where(k), f"nested deeper than {MAX_DEPTH} levels", "json")
                elif t is dict or (t is not list and isinstance(v, Mapping)):
                    stack.append((iter(v.items()), True, k))
                    break
                else:
                    start = skip_n if len(stack) == 1 and k == skip_key else 0
                    stack.append((enumerate(v[start:] if start else v, start), False, k))
                    break
            else:
                problem = _scalar_problem(v)
                if problem is not None:
                    out.add(where(k), problem, "json")
        else:
            stack.pop()


def _repeated_prefix(items: Any, previous: Mapping[str, Any] | None, key: str) -> int:
    """How many leading ``items`` are exactly the previous body's: equal ``marshal`` bytes (format 2, prepare's
    snapshots), which tell apart what ``==`` does not (``Decimal(1) == 1``, a numpy integer, ``1`` and ``True``);
    what marshal cannot hold (a Decimal, a dict subclass) is never "the same". One marshal per item (C speed)
    and one comparison of the two byte lists. The bytes are remembered (``remember_snapshots``): the previous
    body's come from the call that validated it, and the ``prepare`` of this body that follows uses these."""
    if previous is None or not isinstance(items, list):
        return 0
    before = previous.get(key)
    if not isinstance(before, list):
        return 0
    known = remembered_snapshots(before)
    if known is None:
        known = _snapshots(before)
    # items that are the previous body's very objects (an importer's HistoryDecoder hands them back) have its bytes
    same = identity_prefix(items, before)
    snaps = remembered_snapshots(items) or remember_snapshots(items, known[:same] + _snapshots(items[same:]))
    return common_prefix_length(snaps, known)


# -- fields common to the dialects -----------------------------------------------------------------------
def _is_count(value: Any) -> bool:
    """A non-negative integer (``True`` is an int to Python, not to JSON)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_scalars(body: Mapping[str, Any], out: _Problems, dialect: str) -> None:
    model = body.get("model")
    if "model" in body and (not isinstance(model, str) or not model):
        out.add("model", f"must be a non-empty string, got {model!r}")
    limits = {"anthropic": ("max_tokens",), "openai-chat": ("max_tokens", "max_completion_tokens"),
              "openai-responses": ("max_output_tokens",)}[dialect]
    for name in limits:  # OpenAI's are Optional: null means no limit
        value = body.get(name)
        if name in body and not _is_count(value) and not (value is None and dialect != "anthropic"):
            out.add(name, f"must be a non-negative integer, got {value!r}")
        elif isinstance(value, int) and value > MAX_OUTPUT_LIMIT:
            out.add(name, f"{value:,} is above any model's maximum output (at most {MAX_OUTPUT_LIMIT:,})")
    stream = body.get("stream")
    if "stream" in body and not isinstance(stream, bool):
        out.add("stream", f"must be a boolean, got {stream!r}")


def _structure(check: Callable[..., None], *args: Any) -> str | None:
    """Run one of prepare's structure checks; its one-line ValueError as text (None: the shape is fine)."""
    try:
        check(*args)
    except ValueError as exc:
        return str(exc)
    return None


def _well_formed(elements: list[Any], start: int, skip: int, out: _Problems, check: Callable[..., None]
                 ) -> Iterator[tuple[int, Any, _Problems]]:
    """``(index, element, where its problems go)`` from ``start`` while ``out`` has room; a structurally broken
    element is reported and given as ``None``. Elements before ``skip`` were checked with the previous body:
    they are walked only for the state they carry (open tool calls), their problems muted."""
    for i in range(start, len(elements)):
        if out.full:
            return
        o = out if i >= skip else _MUTED
        broken = _structure(check, i, elements[i])
        if broken is not None:
            _add_line(o, broken)
            yield i, None, o
        else:
            yield i, elements[i], o


def _add_line(out: _Problems, line: str) -> None:
    path, sep, problem = line.partition(": ")
    out.add(path, problem) if sep else out.add("", line)


# -- Anthropic Messages ----------------------------------------------------------------------------------
def _check_anthropic(body: Mapping[str, Any], out: _Problems, partial: bool, skip: int, prev_len: int) -> None:
    # in prefix order (docs/provider_cache_rules.md#anthropic-prefix-order): the first problem is the first one
    # in the prompt. A present key must hold a value: none of the three is nullable.
    if "tools" in body:
        _anthropic_tools(body["tools"], out)
    if "system" in body:
        _anthropic_system(body["system"], out)
    if "messages" in body:
        _anthropic_messages(body["messages"], out, partial, skip, prev_len)


def _anthropic_system(system: Any, out: _Problems) -> None:
    if isinstance(system, str):
        return
    if not isinstance(system, list):
        out.add("system", "must be a string or a list of text blocks (omit the key for none), "
                          f"got {_type_name(system)}")
        return
    for i, block in enumerate(system):
        if not isinstance(block, Mapping) or block.get("type") != "text":
            got = repr(block.get("type")) if isinstance(block, Mapping) else _type_name(block)
            out.add(f"system[{i}]", f"must be a text block, got {got}")


def _anthropic_messages(messages: Any, out: _Problems, partial: bool, skip: int, prev_len: int) -> None:
    if not isinstance(messages, list):
        out.add("messages", f"must be a list of messages, got {_type_name(messages)}")
        return
    if not messages:
        if not partial:
            out.add("messages", "at least one message is required")
        return
    if len(messages) > MAX_MESSAGES:
        out.add("messages", f"at most {MAX_MESSAGES:,} messages, got {len(messages):,}")
    last = len(messages) - 1
    if 0 < skip == prev_len <= last:  # the previous body's final message is final no more
        m = messages[skip - 1]
        if isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("content") in ("", []):
            out.add(f"messages[{skip - 1}].content", _EMPTY_CONTENT)
    calls: dict[str, str] = {}  # tool call ids of the message just before -> where ("" for a server tool call)
    before: _Before = None  # the message just before: its role and whether it ends in a server tool call
    # the repeated messages were checked with the previous body: the last one is replayed, muted, for its calls
    for i, m, o in _well_formed(messages, max(0, skip - 1), skip, out, _check_anthropic_message):
        if m is None:
            calls, before = {}, None
            continue
        role, content = m["role"], m["content"]
        if role not in ANTHROPIC_ROLES:
            o.add(f"messages[{i}].role", f"must be 'user', 'assistant' or 'system', got {role!r}")
        elif role == "system":
            _system_placement(i, before, o)
        elif i == 0 and role != "user":
            o.add("messages[0].role", f"the first message must use the user role, got {role!r}")
        if role == "user" and i > 1 and before is not None and before[0] == "system":  # a first one is told
            o.add(f"messages[{i}].role", f"must be 'assistant' after the 'system' message messages[{i - 1}] (a "
                                         "system message is the last message or is followed by an assistant turn)")
        if (content == "" or content == []) and not (role == "assistant" and i == last):
            o.add(f"messages[{i}].content", _EMPTY_CONTENT)
        blocks = content if isinstance(content, list) else []
        answered: set[str] = set()
        for j, block in enumerate(blocks):
            where = f"messages[{i}].content[{j}]"
            t = block.get("type")
            if "type" not in block:
                o.add(f"{where}.type", "Field required")
            elif t not in ANTHROPIC_BLOCK_TYPES:
                o.add(f"{where}.type", f"unknown content block type {t!r}")
            elif role == "system" and t != "text":
                o.add(f"{where}.type", f"a 'system' message holds text blocks only, got {t!r}")
            elif t == "tool_result" and role == "user":
                tid = block.get("tool_use_id")
                if not isinstance(tid, str):
                    o.add(f"{where}.tool_use_id", "Field required" if tid is None else f"must be a string, got {tid!r}")
                elif tid not in calls:
                    o.add(f"{where}.tool_use_id", f"no tool_use with id {tid!r} in the previous message; each "
                                                  "tool_result answers a tool_use of the message just before it")
                else:
                    answered.add(tid)
        if role == "user":
            for tid, where in calls.items():
                if where and tid not in answered:
                    o.add(where, f"tool_use {tid!r} has no tool_result in the next message; each tool_use is "
                                 "answered by a tool_result in the message just after it")
        calls = {}
        if role == "assistant":
            for j, b in enumerate(blocks):
                if b.get("type") in _TOOL_CALL_BLOCKS and isinstance(b.get("id"), str):
                    # a server tool's result comes back in the same message; the client may still answer it
                    calls[b["id"]] = f"messages[{i}].content[{j}].id" if b["type"] == "tool_use" else ""
        before = (role, bool(blocks) and blocks[-1].get("type") == "server_tool_use")


_EMPTY_CONTENT = "all messages must have non-empty content except for the optional final assistant message"
#: The message before the one being checked: (its role, whether it ends in a server tool call); None for none or
#: a malformed one.
_Before = tuple[str, bool] | None


def _system_placement(i: int, before: _Before, out: _Problems) -> None:
    """Where a mid-conversation ``system`` message may stand (docs/provider_cache_rules.md
    #anthropic-mid-conversation-system-messages): never first, right after a user message or an assistant message
    that ends in a server tool call, never next to another system message. The message after it (an assistant
    turn, or none) is checked with that message."""
    where = f"messages[{i}].role"
    if i == 0:
        out.add(where, "a 'system' message cannot be the first message; instructions that apply from the start go "
                       "in the top-level `system` field")
    elif before is None:
        return  # the message before is malformed, reported on its own
    elif before[0] == "system":
        out.add(where, f"consecutive 'system' messages are not allowed (messages[{i - 1}] is one); merge them")
    elif before[0] == "assistant" and not before[1]:
        out.add(where, "a 'system' message must follow a user message (or an assistant message that ends in a "
                       "server tool use), got one after an assistant message")


def _anthropic_tools(tools: Any, out: _Problems) -> None:
    if not isinstance(tools, list):
        out.add("tools", f"must be a list of tool definitions (omit the key for none), got {_type_name(tools)}")
        return
    seen: dict[str, int] = {}
    for k, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            out.add(f"tools[{k}]", f"must be a tool definition object, got {_type_name(tool)}")
            continue
        name = tool.get("name")
        if "name" not in tool:
            out.add(f"tools[{k}].name", "Field required")
        elif not isinstance(name, str) or not name:
            out.add(f"tools[{k}].name", f"must be a non-empty string, got {name!r}")
        elif name in seen:
            out.add(f"tools[{k}].name", f"duplicate tool name {name!r} (also tools[{seen[name]}]); tool names "
                                        "must be unique")
        else:
            seen[name] = k
        if tool.get("type", "custom") in ("custom", None) and not isinstance(tool.get("input_schema"), Mapping):
            out.add(f"tools[{k}].input_schema", "Field required" if "input_schema" not in tool
                    else "must be a JSON schema object")


# -- OpenAI ----------------------------------------------------------------------------------------------
def _check_tools(tools: Any, allowed: frozenset[str], out: _Problems) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        out.add("tools", f"must be a list of tool definitions, got {_type_name(tools)}")
        return
    for k, tool in enumerate(tools):
        broken = _structure(_check_tool, k, tool, allowed)
        if broken is not None:
            _add_line(out, broken)


def _check_chat(body: Mapping[str, Any], out: _Problems, partial: bool, skip: int, prev_len: int) -> None:
    if "system" in body or "input" in body:
        out.add("system" if "system" in body else "input", "not a Chat Completions field")
    _check_tools(body.get("tools"), _CHAT_TOOL_TYPES, out)
    messages = body.get("messages")
    if messages is None:
        return
    if not isinstance(messages, list):
        out.add("messages", f"must be a list of messages, got {_type_name(messages)}")
        return
    if not messages:
        if not partial:
            out.add("messages", "at least one message is required")
        return
    calls: dict[str, str] = {}  # the last assistant message's tool call ids -> where they are, until answered
    # the repeated messages were checked with the previous body: those since its last assistant message are
    # replayed, muted, for the calls they leave unanswered
    start = next((i for i in range(min(skip, len(messages)) - 1, -1, -1)
                  if isinstance(messages[i], Mapping) and messages[i].get("role") == "assistant"), 0)
    for i, m, o in _well_formed(messages, start, skip, out, _check_chat_message):
        if m is None:
            calls = {}
            continue
        if m["role"] == "tool":
            tid = m.get("tool_call_id")
            if tid not in calls:
                o.add(f"messages[{i}].tool_call_id", f"no tool call {tid!r} in the preceding assistant message; a "
                                                     "'tool' message answers one of its tool_calls")
            calls.pop(tid, None)
            continue
        for tid, where in calls.items():
            o.add(where, f"tool call {tid!r} has no 'tool' message answering it before messages[{i}]")
        calls = {}
        if m["role"] == "assistant":
            calls = {c["id"]: f"messages[{i}].tool_calls[{j}].id"
                     for j, c in enumerate(m.get("tool_calls") or ()) if isinstance(c.get("id"), str)}


_CALL_OUTPUTS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}


def _check_responses(body: Mapping[str, Any], out: _Problems, partial: bool, skip: int, prev_len: int) -> None:
    if "messages" in body or "system" in body:
        out.add("messages" if "messages" in body else "system", "not a Responses field")
    _check_tools(body.get("tools"), _RESPONSES_TOOL_TYPES, out)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        out.add("instructions", f"must be a string, got {_type_name(instructions)}")
    items = body.get("input")
    if items is None or isinstance(items, str):
        return
    if not isinstance(items, list):
        out.add("input", f"must be a string or a list of input items, got {_type_name(items)}")
        return
    # with stored state (a previous response, a conversation) the call can be in an earlier response
    stored = bool(body.get("previous_response_id") or body.get("conversation"))
    # the repeated items were checked with the previous body: only the calls they hold are taken from them
    calls: set[tuple[str, Any]] = {
        (item["type"], item["call_id"]) for item in items[:skip]
        if isinstance(item, Mapping) and item.get("type") in _CALL_OUTPUTS.values()
        and isinstance(item.get("call_id"), str)}
    for i, item, _ in _well_formed(items, skip, skip, out, _check_item):
        if item is None:
            continue
        t, call_id = item.get("type"), item.get("call_id")
        if not isinstance(call_id, str):
            continue  # prepare's item check leaves ids alone; an id-less call answers nothing
        if t in _CALL_OUTPUTS.values():
            calls.add((t, call_id))
        elif t in _CALL_OUTPUTS and not stored and (_CALL_OUTPUTS[t], call_id) not in calls:
            out.add(f"input[{i}].call_id", f"no {_CALL_OUTPUTS[t]} with call_id {call_id!r} earlier in input; an "
                                           "output answers a call")


__all__ = ["ANTHROPIC_BLOCK_TYPES", "MAX_DEPTH", "BodyProblem", "check_request", "validate_request"]
