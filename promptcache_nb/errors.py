"""The promptcache_nb exception tree. Every message says what failed and how to fix it."""

from __future__ import annotations


class PromptCacheError(Exception):
    """Base class of every error promptcache_nb raises on purpose."""


class StoreLockedError(PromptCacheError):
    """The DuckDB file is held read-write by another process (another kernel, a CLI, a test)."""

    def __init__(self, path: str, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(
            f"store {path!r} is locked by {holder}; close that Lab (lab.close()) or kernel, "
            "or open a different file"
        )


class StoreError(PromptCacheError):
    """The store is unreadable or inconsistent."""


class UnknownNameError(PromptCacheError, ValueError):
    """A strategy, cache model or model name is not known."""

    def __init__(self, kind: str, name: str, valid: list[str] | tuple[str, ...]) -> None:
        self.kind = kind
        self.name = name
        self.valid = sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(self.valid)}")


class UnknownStrategyError(UnknownNameError):
    def __init__(self, name: str, valid: list[str] | tuple[str, ...]) -> None:
        super().__init__("strategy", name, valid)


class UnknownCacheModelError(UnknownNameError):
    def __init__(self, name: str, valid: list[str] | tuple[str, ...]) -> None:
        super().__init__("cache model", name, valid)


class UnknownModelError(UnknownNameError):
    def __init__(self, name: str, valid: list[str] | tuple[str, ...]) -> None:
        super().__init__("model", name, valid)


class ScenarioError(PromptCacheError):
    """A scenario file is malformed. The message is one line: file:line: field: problem."""

    def __init__(self, path: str, line: int | None, field: str, problem: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {field}: {problem}")


class InvalidRequestError(PromptCacheError):
    """The request would be rejected by the provider with HTTP 400 (the API's own message text)."""

    status_code = 400

    def __init__(self, message: str, *, turn: int | None = None) -> None:
        self.turn = turn
        self.api_message = message
        prefix = f"turn {turn}: " if turn is not None else ""
        super().__init__(f"{prefix}invalid_request_error (400): {message}")


class KnowledgeError(PromptCacheError, KeyError):
    """A knowledge entry id is unknown or already removed."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence
        return str(self.args[0])


class PriceError(PromptCacheError):
    """No price is known for a model; pass prices= explicitly."""


class SessionError(PromptCacheError):
    """A session operation is not possible in the session's current state."""
