"""Problems of a request body, as the validator and every dialect's checks report them.

One line each, naming the field (``messages[2].role: must be ...``); :class:`BodyProblem` is re-exported by
:mod:`promptcache_nb.request.validate`, whose :func:`~promptcache_nb.request.validate_request` walks the JSON
document and hands the API-specific checks to the body's dialect.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

#: At most this many problems are listed per body (a log with a million NaNs is one report, not a million).
MAX_PROBLEMS = 50

ProblemKind = Literal["json", "api"]
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


class Problems:
    """The problems found so far (at most :data:`MAX_PROBLEMS`)."""

    def __init__(self) -> None:
        self.items: list[BodyProblem] = []

    def add(self, path: str, problem: str, kind: ProblemKind = "api") -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(BodyProblem(path, problem, kind))

    @property
    def full(self) -> bool:
        return len(self.items) >= MAX_PROBLEMS


class _Muted(Problems):
    """Where the repeated messages a check replays for its state report: nowhere (reported with the previous
    body)."""

    def add(self, path: str, problem: str, kind: ProblemKind = "api") -> None:
        pass


MUTED = _Muted()

_JSON_NAMES = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "list",
               dict: "object"}


def type_name(value: Any) -> str:
    """What a value is, in JSON's words where it is a JSON value (``null``, ``object``), else its Python type."""
    return _JSON_NAMES.get(type(value)) or type(value).__name__


def is_count(value: Any) -> bool:
    """A non-negative integer (``True`` is an int to Python, not to JSON)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def structure(check: Callable[..., None], *args: Any) -> str | None:
    """Run one of prepare's structure checks; its one-line ValueError as text (None: the shape is fine)."""
    try:
        check(*args)
    except ValueError as exc:
        return str(exc)
    return None


def well_formed(elements: list[Any], start: int, skip: int, out: Problems, check: Callable[..., None]
                ) -> Iterator[tuple[int, Any, Problems]]:
    """``(index, element, where its problems go)`` from ``start`` while ``out`` has room; a structurally broken
    element is reported and given as ``None``. Elements before ``skip`` were checked with the previous body:
    they are walked only for the state they carry (open tool calls), their problems muted."""
    for i in range(start, len(elements)):
        if out.full:
            return
        o = out if i >= skip else MUTED
        broken = structure(check, i, elements[i])
        if broken is not None:
            add_line(o, broken)
            yield i, None, o
        else:
            yield i, elements[i], o


def add_line(out: Problems, line: str) -> None:
    path, sep, problem = line.partition(": ")
    out.add(path, problem) if sep else out.add("", line)
