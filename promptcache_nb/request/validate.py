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
* ``api`` — valid JSON the API answers with HTTP 400: the required fields and output limits each format names
  (every output limit at most :data:`MAX_OUTPUT_LIMIT`: an API refuses a limit above the model's maximum
  output), then the format's own checks (``Dialect.validate``; the rules are listed in each module of
  :mod:`promptcache_nb.dialects`: Anthropic Messages after the ``anthropic`` SDK's ``MessageCreateParams``, OpenAI
  Chat Completions and Responses the essentials).

Per-message structure (a message's keys, content types, OpenAI roles and part types) is checked by the same
functions :func:`~promptcache_nb.request.prepare` uses, so both say the same thing about the same body.
Shapes the cache model judges (more than 4 ``cache_control`` breakpoints, TTL order) are left to it.
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Mapping
from itertools import compress
from operator import not_
from typing import Any

from .._util import common_prefix_length, identity_prefix
from ..dialects import Dialect as WireFormat
from ..dialects import detect as detect_format
from ..dialects import get as get_format
from ..dialects._problems import MAX_PROBLEMS, BodyProblem, ProblemKind, Problems, is_count, type_name
from ..dialects.anthropic import BLOCK_TYPES as ANTHROPIC_BLOCK_TYPES
from ..dialects.anthropic import MAX_MESSAGES
from ..dialects.anthropic import ROLES as ANTHROPIC_ROLES
from ..errors import BodyValidationError
from ._canonical import (
    _snapshots,
    remember_snapshots,
    remembered_plain,
    remembered_snapshots,
)

#: Deepest nesting accepted (the body itself is level 1). Real bodies stay far below it (a tool's JSON
#: schema is rarely 20 deep); far deeper, Python's own JSON encoder and parser fail with RecursionError.
MAX_DEPTH = 256
#: The largest ``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens`` accepted (10**7). The APIs refuse
#: a limit above the model's maximum output ("max_tokens: 100000 > 64000, which is the maximum allowed number of
#: output tokens"), which is below its context window; no model's window reaches 10**7 tokens.
MAX_OUTPUT_LIMIT = 10**7
_SURROGATE = re.compile("[\ud800-\udfff]")


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
        return [BodyProblem("", f"request body must be a JSON object, got {type_name(body)}", "json")]
    if dialect is None:
        dialect = getattr(body, "dialect", None)
    fmt = detect_format(dict(body)) if dialect is None else get_format(dialect)
    out = Problems()
    list_key = fmt.list_key
    skip = _repeated_prefix(body.get(list_key), previous, list_key)
    _walk_json(body, out, skip=(list_key, skip))
    if not partial:
        for name in fmt.required_fields(body, count_tokens=count_tokens):
            if name not in body:
                out.add(name, "Field required")
    _check_scalars(body, out, fmt)
    # the previous body's length: its final message may be final no more
    prev_len = len(previous[list_key]) if skip and isinstance(previous, Mapping) else 0
    fmt.validate(body, out, partial, skip, prev_len)
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
    return f"{type_name(value)} is not a JSON value (a JSON body holds strings, numbers, booleans, null, " \
           "lists and objects)"


def _walk_json(body: Mapping[str, Any], out: Problems, *, skip: tuple[str, int]) -> None:
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
                out.add(where(), f"object keys must be strings, got {type_name(k)} key {k!r}", "json")
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
    what marshal cannot hold (a Decimal, a dict subclass) is never "the same". The bytes are remembered
    (``remember_snapshots``): the previous body's come from the call that validated it, and the ``prepare`` of this
    body that follows uses these.

    A fresh body (parsed anew, none of its objects the previous body's) is compared with ``==`` at C speed, not
    marshalled whole: its history is read once, by the comparison. That is exact where the previous item is
    *plain* (only dicts, lists, strings and None, exact types: an equal value can differ from it in no byte the
    cache sees); an item holding a number or a boolean is compared on its bytes. Only the items after the
    repeated run are marshalled, so a growing history costs its new tail plus one C-speed comparison. (A value that
    is no string but claims to equal one, ``mock.ANY``, passes as that string: what is stored is the previous
    body's string.)"""
    if previous is None or not isinstance(items, list):
        return 0
    before = previous.get(key)
    if not isinstance(before, list):
        return 0
    known = remembered_snapshots(before)
    plain = remembered_plain(before) if known is not None else None
    if known is None:
        known = _snapshots(before)
    if plain is None:  # not remembered (the session's first check, or another session's came between)
        plain = _plain_flags(before, walk=False)
    # items that are the previous body's very objects (an importer's HistoryDecoder hands them back) have its bytes
    same = identity_prefix(items, before)
    snaps = remembered_snapshots(items)
    if snaps is not None:
        return common_prefix_length(snaps, known)
    k = _equal_prefix(items, before, known, plain, same)
    fresh = items[k:]
    snaps = remember_snapshots(items, known[:k] + _snapshots(fresh), plain[:k] + _plain_flags(fresh))
    return common_prefix_length(snaps, known, k)


_PLAIN_TYPES = frozenset({dict, list, str, type(None)})


def _plain_flags(units: list[Any], *, walk: bool = True) -> list[bool]:
    """Per unit: does it hold only dicts, lists, strings and None (exact types)? A list of such units is told by one
    walk of its containers level by level (``gc.get_referents``, C speed: a dict yields its values, and its keys
    unless they are all strings). Otherwise each unit is walked in Python, or, without ``walk``, none is called
    plain (it is then compared on its bytes, as before: slower, never wrong)."""
    level: list[Any] = units
    while level:
        if not _PLAIN_TYPES.issuperset(map(type, level)):
            return list(map(_is_plain, units)) if walk and len(units) > 1 else [False] * len(units)
        level = gc.get_referents(*level)
    return [True] * len(units)


def _is_plain(unit: Any) -> bool:
    stack = [unit]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            stack.extend(v)  # the keys: strings too
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
        elif t is not str and v is not None:
            return False
    return True


def _equal_prefix(items: list[Any], before: list[Any], known: list[Any], plain: list[bool], start: int) -> int:
    """How many leading ``items`` equal ``before``'s exactly, the first ``start`` being its very objects: ``==`` at C
    speed, then the bytes of each item in that run whose previous item is not plain (see ``_repeated_prefix``)."""
    try:
        k = common_prefix_length(items, before, start)
    except Exception:  # noqa: BLE001 — a value whose == raises (a numpy array): compared on bytes instead
        return start
    for i in compress(range(start, k), map(not_, plain[start:k])):
        if _snapshots([items[i]])[0] != known[i]:
            return i
    return k


# -- fields common to the dialects -----------------------------------------------------------------------
def _check_scalars(body: Mapping[str, Any], out: Problems, fmt: WireFormat) -> None:
    model = body.get("model")
    if "model" in body and (not isinstance(model, str) or not model):
        out.add("model", f"must be a non-empty string, got {model!r}")
    for name in fmt.limit_fields:  # OpenAI's are Optional: null means no limit
        value = body.get(name)
        if name in body and not is_count(value) and not (value is None and fmt.limits_nullable):
            out.add(name, f"must be a non-negative integer, got {value!r}")
        elif isinstance(value, int) and value > MAX_OUTPUT_LIMIT:
            out.add(name, f"{value:,} is above any model's maximum output (at most {MAX_OUTPUT_LIMIT:,})")
    stream = body.get("stream")
    if "stream" in body and not isinstance(stream, bool):
        out.add("stream", f"must be a boolean, got {stream!r}")



__all__ = [
    "ANTHROPIC_BLOCK_TYPES", "ANTHROPIC_ROLES", "MAX_DEPTH", "MAX_MESSAGES", "MAX_PROBLEMS", "BodyProblem",
    "ProblemKind", "check_request", "validate_request",
]
