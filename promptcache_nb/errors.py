"""The promptcache_nb exception tree. Every message says what failed and how to fix it."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any


class PromptCacheError(Exception):
    """Base class of every error promptcache_nb raises on purpose."""


class StoreLockedError(PromptCacheError):
    """The DuckDB file is held read-write by another process (another kernel, a CLI, a test)."""

    def __init__(self, path: str, holder: str, detail: str | None = None) -> None:
        self.path = path
        self.holder = holder
        #: what kind of lock it is and what that allows (a writer shuts out read-only viewers too)
        self.detail = detail
        super().__init__(
            f"store {path!r} is locked by {holder}{', ' + detail if detail else ''}; close that Lab (lab.close()) "
            "or kernel, or open a different file"
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


class InvalidOptionError(PromptCacheError, ValueError):
    """A strategy or cache-model option is unknown, or its value has the wrong type.

    The message is one line naming the valid options, e.g. ``cache model 'openai': unknown option
    'idle_tll' (did you mean 'idle_ttl'?); valid options: idle_ttl, increment, ...``.

    Attributes:
        owner: what the options belong to (``cache model 'openai'``, ``strategy 'durable_delta'``).
        options: the offending option names. problem: what is wrong with them.
        valid: the option names the owner accepts, sorted.
    """

    def __init__(self, owner: str, options: list[str] | tuple[str, ...], problem: str,
                 valid: list[str] | tuple[str, ...]) -> None:
        self.owner = owner
        self.options = tuple(options)
        self.problem = problem
        self.valid = tuple(sorted(valid))
        super().__init__(f"{owner}: {problem}; valid options: {', '.join(self.valid) or '(none)'}")


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


class APIError(PromptCacheError):
    """A Messages endpoint refused a request, or a cache model predicts it would.

    The message is one line: ``[turn N: ]<error_type> (<status>): <API message>[; how to fix]
    [ [request_id req_…]]``. The API's own text is kept in ``api_message``.

    Attributes:
        status_code: the HTTP status (None when no response came back).
        error_type: the API's ``error.type`` (``rate_limit_error``...).
        request_id: the endpoint's ``request-id`` header, for a support ticket; None when simulated.
        turn: the session's request index, when known.
    """

    status_code: int | None = None
    error_type: str = "api_error"
    hint: str = ""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        error_type: str | None = None,
        request_id: str | None = None,
        turn: int | None = None,
    ) -> None:
        self.api_message = " ".join(str(message).split())  # one line, whatever the endpoint sent
        if status_code is not None:
            self.status_code = status_code
        if error_type is not None:
            self.error_type = error_type
        self.request_id = request_id
        self.turn = turn
        super().__init__(self._format())

    def _format(self) -> str:
        prefix = f"turn {self.turn}: " if self.turn is not None else ""
        status = "no response" if self.status_code is None else str(self.status_code)
        hint = f"; {self.hint}" if self.hint else ""
        rid = f" [request_id {self.request_id}]" if self.request_id else ""
        return f"{prefix}{self.error_type} ({status}): {self.api_message}{hint}{rid}"

    def at_turn(self, turn: int) -> APIError:
        """A copy that names the session's request index (a session re-raises with it)."""
        new = copy.copy(self)
        new.turn = turn
        new.args = (new._format(),)
        return new


class InvalidRequestError(APIError):
    """HTTP 400: the provider rejects the request (or the cache model predicts it will), with its own text."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, turn: int | None = None, request_id: str | None = None) -> None:
        super().__init__(message, turn=turn, request_id=request_id)


class AuthenticationError(APIError):
    """HTTP 401: the API key is missing or wrong."""

    status_code = 401
    error_type = "authentication_error"
    hint = "set ANTHROPIC_API_KEY or pass anthropic.Anthropic(api_key=...)"

    def __init__(self, message: str, *, request_id: str | None = None, turn: int | None = None) -> None:
        super().__init__(message, request_id=request_id, turn=turn)


class RateLimitError(APIError):
    """HTTP 429: too many requests or tokens per minute. ``retry_after`` is the server's wait, in seconds."""

    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: float | None = None, request_id: str | None = None,
                 turn: int | None = None) -> None:
        self.retry_after = retry_after
        wait = f"retry after {retry_after:g}s" if retry_after is not None else "retry later"
        self.hint = f"{wait}, or raise the client's max_retries"
        super().__init__(message, request_id=request_id, turn=turn)


class OverloadedError(APIError):
    """HTTP 529: the API is temporarily overloaded (not your fault; retried by the SDK first)."""

    status_code = 529
    error_type = "overloaded_error"
    hint = "the API is overloaded; retry later or raise the client's max_retries"

    def __init__(self, message: str, *, request_id: str | None = None, turn: int | None = None) -> None:
        super().__init__(message, request_id=request_id, turn=turn)


class APIConnectionError(APIError):
    """No response: the endpoint could not be reached or timed out."""

    error_type = "connection_error"
    hint = "check the client's base_url (ANTHROPIC_BASE_URL) and the network"

    def __init__(self, message: str, *, turn: int | None = None) -> None:
        super().__init__(message, turn=turn)


class KnowledgeError(PromptCacheError, KeyError):
    """A knowledge entry id is unknown or already removed."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence
        return str(self.args[0])


class PriceError(PromptCacheError):
    """No price is known for a model; pass prices= explicitly."""


class UsageError(PromptCacheError, ValueError):
    """A usage payload or :class:`~promptcache_nb.Usage` holds a value no endpoint reports: a count that is
    negative, not an integer, non-finite or absurd, or a 5m/1h split larger than its total. The message is one line
    naming the field (``usage.input_tokens: must be a non-negative int, got -1``), so a reader can skip the line."""


class PromptCacheWarning(UserWarning):
    """Base class of every warning promptcache_nb issues (figures were stored, but something is missing)."""


class UnpricedModelWarning(PromptCacheWarning):
    """A request's model has no exact price in genai-prices: its cost is stored as NULL, never guessed (never
    another model's price). Issued once per session; the message names the model only, so Python (and the CLI)
    show it once however many sessions use that model. Pass ``prices=pc.analysis.Prices(...)`` to a session to
    price such requests.

    Attributes:
        model: the model id as the request named it.
        session_id: the session the request belongs to.
    """

    def __init__(self, model: str, session_id: str | None = None) -> None:
        self.model = model
        self.session_id = session_id
        super().__init__(f"{model}: no price in genai-prices; costs left unknown")


class CalibrationWarning(PromptCacheWarning):
    """A calibration was fitted, but its leave-one-out error is no better than the uncalibrated estimator's:
    opting in to it would not improve the estimates (the measured sizes are too noisy, too few, or the
    requests carry something the estimate does not see)."""


class PluginWarning(PromptCacheWarning):
    """An entry point (``promptcache_nb.strategies``, ``.cache_models``, ``.readers``) could not be loaded, or names
    a component already registered: that component is missing, the others still work."""


class ContextWindowWarning(PromptCacheWarning):
    """A request's input tokens exceed its model's context window (per genai-prices): the provider's API
    would reject it. The request is still accepted — simulated, recorded, loaded — as given.

    Attributes:
        where: what the request is (``request 3``, ``scenario.yaml: host_prompt``).
        model: the model id as the request named it.
        tokens: the request's input tokens (estimated unless ``measured``).
        window: the model's context window in tokens.
        measured: True when ``tokens`` come from an endpoint's usage, False for an offline estimate.
    """

    def __init__(self, where: str, model: str, tokens: int, window: int, *, measured: bool = False) -> None:
        self.where = where
        self.model = model
        self.tokens = tokens
        self.window = window
        self.measured = measured
        kind = "measured" if measured else "estimated"
        super().__init__(
            f"{where}: {tokens:,} {kind} input tokens exceed the {window:,}-token context window of model "
            f"{model!r} (genai-prices); the provider's API would reject this request, accepted here as given"
        )


class SessionError(PromptCacheError):
    """A session operation is not possible in the session's current state."""


class BodyValidationError(SessionError, ValueError):
    """A request body does not follow its API's documented shape (``promptcache_nb.request.validate_request``).

    The message is one line naming the first problem's field, e.g. ``request 3: messages[2].role: must be
    'user' or 'assistant', got 'wizard'`` (``; and 2 more problems`` when there are more). A ``SessionError``,
    so code that caught ``record()``'s errors before still does.

    Attributes:
        problems: every problem found (``BodyProblem``: ``path``, ``problem``, ``kind``).
        request: the session's request index, when known.
        source: where the body was read (``file:line``), when known.
    """

    def __init__(self, problems: Sequence[object], *, request: int | None = None, source: str | None = None) -> None:
        if not problems:
            raise ValueError("BodyValidationError needs at least one problem")
        self.problems = tuple(problems)
        self.request = request
        self.source = source
        where = "".join(f"{part}: " for part in (source, None if request is None else f"request {request}") if part)
        more = len(self.problems) - 1
        tail = f"; and {more} more problem{'s' if more > 1 else ''}" if more else ""
        super().__init__(f"{where}{self.problems[0]}{tail}")


class ImportFormatError(PromptCacheError, ValueError):
    """A log file is in no known format, or is too damaged to read. The message is one line naming the file.

    Attributes:
        path: the file.
        tried: the formats that were tried (empty when a forced format failed).
    """

    def __init__(self, path: str, problem: str, *, tried: tuple[str, ...] | list[str] = ()) -> None:
        self.path = path
        self.problem = problem
        self.tried = tuple(tried)
        formats = f" (formats tried: {', '.join(self.tried)})" if self.tried else ""
        super().__init__(f"{path}: {problem}{formats}")

    def __reduce__(self) -> tuple[Any, ...]:
        # raised in an import's worker process: it crosses back pickled (the default passes only the message)
        return _import_format_error, (self.path, self.problem, self.tried)


def _import_format_error(path: str, problem: str, tried: tuple[str, ...]) -> ImportFormatError:
    """An :class:`ImportFormatError` rebuilt from its pickle (:meth:`ImportFormatError.__reduce__`)."""
    return ImportFormatError(path, problem, tried=tried)
