"""Typed options: the base of every strategy's and cache model's parameters, checked in one place.

A strategy or cache model declares its parameters as an :class:`Options` subclass (a pydantic model with
``extra="forbid"`` and a description per field), so a misspelt or mistyped parameter fails at the boundary
(``lab.session(...)``, ``get_cache_model(...)``) with one line naming the valid ones, instead of being
silently ignored (llm's per-model ``Options``).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError

from ._util import parse_duration
from .errors import InvalidOptionError


def _duration(value: Any) -> str | float | timedelta:
    parse_duration(value)  # raises ValueError naming the accepted forms; the value itself is kept as given
    accepted: str | float | timedelta = value  # parse_duration accepted it: a str, a number or a timedelta
    return accepted


#: A duration option: ``"5m"``, ``"1.5h"``, seconds as a number, or a ``timedelta``.
Duration = Annotated[str | float | timedelta, PlainValidator(_duration)]


class Options(BaseModel):
    """Parameters of a strategy or cache model. Subclasses add described fields with defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The valid option names, sorted."""
        return tuple(sorted(cls.model_fields))

    @classmethod
    def check(cls, params: Mapping[str, Any] | None, *, owner: str) -> Self:
        """Validate ``params``; raises :class:`~promptcache_nb.InvalidOptionError` (one line) on a bad one."""
        try:
            return cls.model_validate(dict(params or {}))
        except ValidationError as exc:
            raise _invalid(cls, exc, owner) from None

    @classmethod
    def stored(cls, params: Mapping[str, Any] | None, *, owner: str) -> Self:
        """Options read back from a stored config: names this model does not know are ignored (a session
        stored before options were checked keeps loading); the known ones are checked as :meth:`check` does."""
        return cls.check({k: v for k, v in (params or {}).items() if k in cls.model_fields}, owner=owner)

    @classmethod
    def signature(cls) -> inspect.Signature:
        """The keyword-only constructor signature these options give their owner (``help()``, IDEs)."""
        return inspect.Signature([
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=field.default,
                              annotation=field.annotation)
            for name, field in cls.model_fields.items()
        ])

    @classmethod
    def document(cls, doc: str | None) -> str | None:
        """``doc`` (a class docstring) with an ``Args:`` section listing these options from the fields'
        descriptions, before its ``Example:`` section if it has one (unchanged if it already has ``Args:``)."""
        if not doc or not cls.model_fields or "\nArgs:\n" in doc:
            return doc
        text = inspect.cleandoc(doc)
        args = "Args:\n" + "\n".join(f"    {name} (default {field.default!r}): {field.description}"
                                       for name, field in cls.model_fields.items())
        head, sep, example = text.partition("\nExample:\n")
        return f"{head.rstrip()}\n\n{args}\n" + (f"\nExample:\n{example}" if sep else "")

    def explicit(self) -> dict[str, Any]:
        """The options the caller set, with their validated values (defaults left out: stored configs stay
        small and a later default change applies to them)."""
        return {name: getattr(self, name) for name in sorted(self.model_fields_set)}


def _invalid(cls: type[Options], exc: ValidationError, owner: str) -> InvalidOptionError:
    valid = cls.names()
    errors = exc.errors()
    unknown = sorted({str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden"})
    if unknown:
        hints = [f"did you mean {close[0]!r}?" for name in unknown
                 if (close := difflib.get_close_matches(name, valid, n=1))]
        names = ", ".join(repr(n) for n in unknown)
        problem = f"unknown option{'s' if len(unknown) > 1 else ''} {names}"
        if hints:
            problem += f" ({'; '.join(hints)})"
        return InvalidOptionError(owner, unknown, problem, valid)
    # a wrong value: the first field's first error (a union type reports once per member: name the type)
    first = errors[0]
    name = str(first["loc"][0]) if first["loc"] else "?"
    field = cls.model_fields.get(name)
    per_field = [e for e in errors if e["loc"] and e["loc"][0] == name]
    if len(per_field) == 1 or field is None:
        msg = str(first["msg"]).removeprefix("Value error, ")
    else:
        msg = f"expected {_type_name(field.annotation)}"
    problem = f"option {name!r}={first.get('input')!r}: {msg}"
    return InvalidOptionError(owner, [name], problem, valid)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
