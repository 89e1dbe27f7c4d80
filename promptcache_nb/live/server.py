"""A Messages- and OpenAI-compatible endpoint that answers from a cache model: the live code path, offline.

``SimulatorServer`` speaks enough of ``POST /v1/messages`` for the official ``anthropic`` SDK (sync,
async, ``stream=True`` and ``messages.stream``), and of ``POST /v1/chat/completions`` and ``POST /v1/responses``
for the official ``openai`` SDK (sync and streamed), to run unchanged against it, so the notebooks exercise
exactly the code they would use against the real APIs. Each request body goes through the same
:func:`~promptcache_nb.request.prepare` and cache model as the in-process
:class:`~promptcache_nb.live.DirectSimulator`, so the usage it reports is identical.

What it reproduces (docs/provider_cache_rules.md#anthropic-breakpoints onwards,
docs/provider_cache_rules.md#openai-automatic-caching onwards; "§1.9" below is the notes section each one names):

* caches isolated per workspace (§1.9): one cache model per API key — the key is reduced to a digest on
  arrival and never stored, logged or echoed; within a workspace entries are keyed by model (§1.2). Messages
  calls use the ``cache`` model, OpenAI calls the ``openai_cache`` model (one each per key);
* the ``usage`` object with the 5m/1h ``cache_creation`` split (§1.8), in the JSON response and in the
  SSE ``message_start`` / ``message_delta`` events; OpenAI's ``prompt_tokens_details.cached_tokens`` (Chat,
  in the last chunk when ``stream_options.include_usage``) and ``input_tokens_details.cached_tokens``
  (Responses, in ``response.completed``);
* the APIs' error shapes — Anthropic's ``{"type": "error", "error": {"type", "message"}, "request_id"}``,
  OpenAI's ``{"error": {"message", "type", "param", "code"}}`` — with a ``request-id`` (and, for OpenAI paths,
  ``x-request-id``) header: 401 for a missing or refused key, 400 for a body off the API's documented shape
  (the first problem :func:`~promptcache_nb.request.validate_request` finds — the check ``Session.record`` makes)
  or with the cache model's text (e.g. five breakpoints), 404 for an unknown model or path, 405 for a wrong
  method, 413 for a body over the size limit, 408 for a body that does not arrive in time, and injected 429
  (with ``retry-after``) / 529 for tests.

Serving: uvicorn on a daemon thread (:mod:`promptcache_nb.live._asgi`); requests are answered on worker threads,
and only requests of one workspace wait for each other, so a slow request never stalls other clients.

Cache diagnostics (docs/provider_cache_rules.md#anthropic-cache-diagnostics): a Messages request that carries a
``diagnostics`` object has its prepared request kept under its response's ``id`` (per workspace, the last
:data:`MAX_FINGERPRINTS`); one that names ``diagnostics.previous_message_id`` gets the response's ``diagnostics``:
null when nothing diverged, else ``cache_miss_reason`` from comparing the two requests in the prefix order
(:func:`diagnose`). A request without ``diagnostics`` is answered exactly as before.

Time: a cache replays a *scenario's* clock, not the wall clock, so a request may carry
``x-promptcache-at: <ISO-8601 UTC>`` (sent by :class:`~promptcache_nb.live.AnthropicBackend` only to
loopback endpoints); without it the wall clock is used.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._redact import redact_url
from .._util import digest
from ..cache import CacheModel, cache_model_names, get_cache_model
from ..dialects import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, Dialect
from ..dialects.anthropic import ERROR_TYPES
from ..errors import InvalidRequestError, UnknownModelError
from ..request import PreparedRequest, SegmentMemo, compute_diff, prepare
from ..request.validate import MAX_DEPTH, validate_request
from ..tokens import DEFAULT_TOKENIZER, Tokenizer, segment_tokens
from ..usage import Usage
from ._base import AT_HEADER, SIMULATED_REPLY, SIMULATOR_HEADER
from ._serving import LoopbackServer

if TYPE_CHECKING:
    from ._asgi import Answer

log = logging.getLogger("promptcache_nb.server")

_DEFAULT_MESSAGES = {
    400: "invalid request (injected by the simulator)",
    401: "invalid x-api-key",
    403: "Your API key does not have permission to use the specified resource.",
    404: "Not found",
    405: "Method not allowed",
    408: "Request timed out",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: "This request would exceed your organization's rate limit (injected by the simulator).",
    500: "Internal server error",
    529: "Overloaded",
}
MESSAGES, COUNT_TOKENS = "/v1/messages", "/v1/messages/count_tokens"
CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
_PATHS = (MESSAGES, COUNT_TOKENS, CHAT, RESPONSES)
_OPENAI_PATHS = (CHAT, RESPONSES)
#: The wire format each path speaks (its validation, error body and stream).
_FORMATS: dict[str, Dialect] = {MESSAGES: ANTHROPIC, COUNT_TOKENS: ANTHROPIC, CHAT: OPENAI_CHAT,
                                RESPONSES: OPENAI_RESPONSES}
#: How many answered requests :attr:`SimulatorServer.requests` keeps (oldest dropped first).
MAX_SERVED = 100_000
#: How many opted-in requests the server remembers for cache diagnostics (oldest forgotten first: a later request
#: naming one gets ``previous_message_not_found``, as from the API once its fingerprint expired).
MAX_FINGERPRINTS = 10_000
#: Top-level fields that change the prompt beyond model, system, tools and messages: a difference in one of them
#: alone is diagnosed ``unavailable`` (the API's documented case: ``thinking``, ``tool_choice``).
_OTHER_PROMPT_FIELDS = ("tool_choice", "thinking", "output_config")

Reply = str | Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class ServedRequest:
    """One request the server answered (for tests and notebooks). Holds no key and no body.

    ``workspace`` is ``ws1``, ``ws2``... in order of each key's first request.
    """

    request_id: str
    status: int
    path: str
    stream: bool
    workspace: str | None
    at: datetime | None


class _Reject(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class _Injected:
    status: int
    times: int
    message: str
    retry_after: float | None


#: What :meth:`SimulatorServer._respond` produces: status, headers, and the body — bytes, or for a streamed
#: response the list of SSE events in order (the HTTP layer sends them one by one).


class SimulatorServer(LoopbackServer):
    """A local ``/v1/messages``, ``/v1/chat/completions`` and ``/v1/responses`` endpoint backed by cache models.

    Args:
        cache: cache model name (``pc.CACHE_MODELS``) for Messages calls; one instance per workspace (API key).
        host: interface to bind; keep the loopback default unless you mean to serve a network (the server
            accepts any key; binding anything else logs a warning).
        port: 0 picks a free port (read :attr:`base_url` after :meth:`start`).
        cache_params: keyword arguments for the cache model (as ``lab.session(cache_params=...)``).
        tokenizer: token estimator; must match the Lab's for usage identical to the direct simulator.
        api_keys: when given, only these keys are accepted (401 otherwise); they are kept as digests.
            The key ``"bad"`` is always refused, so a test can provoke a 401 without configuration.
        reply: the assistant text, or ``fn(body) -> str``; the default matches the session's own
            simulated reply, so sessions through this server and in-process store the same rows.
        openai_cache: cache model for the OpenAI paths (``openai`` by default; ``deepseek`` and ``vllm`` work
            too); None answers them 404.
        openai_cache_params: keyword arguments for ``openai_cache``.
        stream_delay: seconds to wait between two streamed events, to watch (or test) a stream arrive.
        max_body_bytes: larger request bodies get 413 without being read.
        request_timeout: seconds a client has to send the request headers, and then the body (408).
        max_workspaces: caches kept for at most this many API keys; the least recently used is forgotten.

    Example:
        >>> import anthropic
        >>> with SimulatorServer() as server:
        ...     client = anthropic.Anthropic(base_url=server.base_url, api_key="sk-ant-local", max_retries=0)
        ...     msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=64,
        ...                                  messages=[{"role": "user", "content": "hi"}])
        ...     client.close()
        >>> msg.content[0].text
        '(simulated reply)'
    """

    def __init__(
        self,
        cache: str = "anthropic",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        cache_params: dict[str, Any] | None = None,
        tokenizer: Tokenizer | None = None,
        api_keys: Iterable[str] | None = None,
        reply: Reply = SIMULATED_REPLY,
        openai_cache: str | None = "openai",
        openai_cache_params: dict[str, Any] | None = None,
        stream_delay: float = 0.0,
        max_body_bytes: int = 32 * 1024 * 1024,
        request_timeout: float = 30.0,
        max_workspaces: int = 1024,
    ) -> None:
        get_cache_model(cache, **(cache_params or {}))  # fail now on a bad name or parameter
        if openai_cache is not None:
            get_cache_model(openai_cache, **(openai_cache_params or {}))
        self.cache = cache
        self.openai_cache = openai_cache
        self.host = host
        self.port = port
        self.stream_delay = stream_delay
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self.max_workspaces = max_workspaces
        self._params = {cache: dict(cache_params or {})}
        if openai_cache is not None and openai_cache != cache:
            self._params[openai_cache] = dict(openai_cache_params or {})
        elif openai_cache_params:
            raise ValueError("openai_cache_params needs an openai_cache different from cache; use cache_params")
        self._memo = SegmentMemo(tokenizer or DEFAULT_TOKENIZER)
        self._accepted = None if api_keys is None else frozenset(_key_digest(k) for k in api_keys)
        self._reply = reply
        # Guards the bookkeeping below, held for microseconds; a cache model has a lock of its own, so only
        # requests to one workspace's cache wait for each other.
        self._lock = threading.RLock()
        self.reset()

    # -- lifecycle (start, close, stop, with: live/_serving.py); cache state is kept until reset() ----------
    _thread_name = "promptcache-sim"
    _network_warning = ("the simulator listens on %s and accepts any API key; bind 127.0.0.1 unless you mean to "
                        "serve a network")

    def _serve_app(self) -> Any:
        from ._asgi import responder_app  # starlette and uvicorn load when a server starts, not with the package

        return responder_app(self._respond, self)

    @property
    def base_url(self) -> str:
        """``http://host:port`` — pass it as ``anthropic.Anthropic(base_url=...)`` (``openai.OpenAI``: add ``/v1``)."""
        return self._url("simulator")

    def __repr__(self) -> str:
        where = self.base_url if self.running else "stopped"
        return f"SimulatorServer(cache={self.cache!r}, {where}, workspaces={self.workspaces})"

    # -- state --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every workspace's cache, the served-request log and any pending injected errors."""
        with self._lock:
            self._caches: OrderedDict[tuple[str, str], tuple[CacheModel, threading.Lock]] = OrderedDict()
            self._workspace_names: dict[str, str] = {}
            self._served: deque[ServedRequest] = deque(maxlen=MAX_SERVED)
            self._injected: deque[_Injected] = deque()
            self._seq = 0
            # opted-in requests by (workspace, response id), for cache diagnostics
            self._fingerprints: OrderedDict[tuple[str, str], PreparedRequest] = OrderedDict()

    @property
    def requests(self) -> list[ServedRequest]:
        """Every request answered so far (the last 100,000), oldest first (retries included)."""
        with self._lock:
            return list(self._served)

    @property
    def workspaces(self) -> int:
        """How many distinct API keys (workspaces) have a cache."""
        with self._lock:
            return len({ws for ws, _ in self._caches})

    def inject_error(self, status: int, *, times: int = 1, message: str | None = None,
                     retry_after: float | None = None) -> None:
        """Answer the next ``times`` authenticated requests with an error instead of processing them.

        Args:
            status: 429 (rate_limit_error), 529 (overloaded_error), 500, 400...
            message: the error text (a default per status otherwise).
            retry_after: seconds for the ``retry-after`` header (the SDK waits this long before retrying).
        """
        if status not in ERROR_TYPES:
            raise ValueError(f"cannot inject HTTP {status}; choose one of {sorted(ERROR_TYPES)}")
        with self._lock:
            self._injected.append(_Injected(status, times, message or _DEFAULT_MESSAGES[status], retry_after))

    # -- the endpoint -------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, str], bytes]:
        """Answer one HTTP request: (status, headers, payload). Header names must be lower-case."""
        status, out_headers, payload = self._respond(method, path, headers, body)
        return status, out_headers, payload if isinstance(payload, bytes) else b"".join(payload)

    def _respond(self, method: str, path: str, headers: dict[str, str], body: bytes,
                 refused: tuple[int, str] | None = None) -> Answer:
        with self._lock:
            self._seq += 1
            seq = self._seq
        request_id = f"req_sim_{seq:06d}"
        # as every text, record and 404 body shows it: a key in a client's base_url path must not come back
        path = redact_url(path.split("?", 1)[0]).rstrip("/")
        openai = path in _OPENAI_PATHS
        fmt = _FORMATS.get(path, ANTHROPIC)  # an unknown path is answered in the Messages shape
        workspace = at = None
        stream = False
        payload: bytes | list[bytes]
        try:
            if refused is not None:
                raise _Reject(*refused)
            if path not in _PATHS:
                raise _Reject(404, f"{method} {path}: not found (served: POST {', '.join(_PATHS)})")
            if method != "POST":
                raise _Reject(405, f"{method} {path}: method not allowed; use POST", {"allow": "POST"})
            if openai and self.openai_cache is None:
                raise _Reject(404, f"{path}: not served (SimulatorServer(openai_cache=None))")
            workspace = self._authenticate(headers, openai=openai)
            self._maybe_injected()
            body_json = self._json(body)
            _validate(body_json, path)
            stream = body_json.pop("stream", False)
            at = self._request_time(headers)
            if path == COUNT_TOKENS:
                status, out_headers, payload = self._count_tokens(body_json)
            elif path == MESSAGES:
                status, out_headers, payload = self._create(body_json, workspace, at, seq, stream)
            else:
                status, out_headers, payload = self._openai(path, body_json, workspace, at, seq, stream)
        except _Reject as rej:
            status = rej.status
            out_headers = {"content-type": "application/json", **rej.headers}
            payload = fmt.error_body(status, rej.message, request_id)
        except Exception:  # a simulator bug must still answer in the API's shape
            log.exception("simulator failed on %s %s (%s)", method, path, request_id)
            status = 500
            out_headers = {"content-type": "application/json"}
            payload = fmt.error_body(500, "internal simulator error (see the promptcache_nb.server log)", request_id)
        out_headers = {**out_headers, "request-id": request_id, SIMULATOR_HEADER: self.cache}
        if openai:
            out_headers["x-request-id"] = request_id
            out_headers[SIMULATOR_HEADER] = self.openai_cache or self.cache
        with self._lock:
            name = self._workspace_names.get(workspace) if workspace else None
            self._served.append(ServedRequest(request_id, status, path, stream, name, at))
        log.debug("%s %s -> %d %s", method, path, status, request_id)
        return status, out_headers, payload

    def _authenticate(self, headers: dict[str, str], *, openai: bool = False) -> str:
        key = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        if not key:
            raise _Reject(401, "You didn't provide an API key (Authorization: Bearer header)" if openai
                          else "x-api-key header is required")
        ws = _key_digest(key)
        if key == "bad" or (self._accepted is not None and ws not in self._accepted):
            raise _Reject(401, "Incorrect API key provided" if openai else "invalid x-api-key")
        return ws

    def _maybe_injected(self) -> None:
        with self._lock:
            if not self._injected:
                return
            inj = self._injected[0]
            inj.times -= 1
            if inj.times <= 0:
                self._injected.popleft()
        headers = {}
        if inj.retry_after is not None:
            headers["retry-after"] = f"{inj.retry_after:g}"
        raise _Reject(inj.status, inj.message, headers)

    @staticmethod
    def _json(body: bytes) -> Any:
        try:
            return json.loads(body or b"null", parse_constant=_not_json)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _Reject(400, f"request body is not valid JSON: {exc}") from None
        except RecursionError:  # far deeper than validate_request's limit: the parser gives up first
            raise _Reject(400, f"request body is nested deeper than {MAX_DEPTH} levels") from None

    @staticmethod
    def _request_time(headers: dict[str, str]) -> datetime:
        value = headers.get(AT_HEADER)
        if value is None:
            return datetime.now(UTC)
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            at = None
        if at is None or at.tzinfo is None:
            raise _Reject(400, f"{AT_HEADER}: expected an ISO-8601 time with a UTC offset, got {value!r}")
        return at.astimezone(UTC)

    def _prepare(self, payload: dict[str, Any], dialect: str = ANTHROPIC.name) -> PreparedRequest:
        """Segment a body :func:`_validate` accepted. No lock: the memo's dictionaries are only ever filled with
        the same value for a key."""
        try:
            return prepare(payload, memo=self._memo, dialect=dialect)
        except ValueError as exc:  # a shape prepare refuses and the validator let through: still the API's 400
            raise _Reject(400, str(exc)) from None

    def _cache_for(self, workspace: str, name: str) -> tuple[CacheModel, threading.Lock]:
        with self._lock:
            key = (workspace, name)
            entry = self._caches.get(key)
            if entry is None:
                entry = self._caches[key] = (get_cache_model(name, **self._params[name]), threading.Lock())
                if workspace not in self._workspace_names:
                    self._workspace_names[workspace] = f"ws{len(self._workspace_names) + 1}"
                while len({ws for ws, _ in self._caches}) > self.max_workspaces:
                    (old, _), _ = self._caches.popitem(last=False)
                    for other in [k for k in self._caches if k[0] == old]:
                        del self._caches[other]
            self._caches.move_to_end(key)
            return entry

    def _process(self, prepared: PreparedRequest, workspace: str, name: str, at: datetime) -> Usage:
        cache, lock = self._cache_for(workspace, name)
        with lock:
            try:
                cache.validate_model(prepared.model)
            except UnknownModelError:
                raise _Reject(404, f"model: {prepared.model}") from None
            try:
                return cache.process(prepared, at).usage
            except InvalidRequestError as exc:
                raise _Reject(400, exc.api_message) from None

    def _text(self, payload: dict[str, Any]) -> str:
        return self._reply(payload) if callable(self._reply) else self._reply

    def _output_tokens(self, text: str) -> int:
        return segment_tokens("msg", {"type": "text", "text": text}, self._memo.tokenizer) if text else 0

    def _count_tokens(self, payload: dict[str, Any]) -> Answer:
        prepared = self._prepare(payload)
        out = json.dumps({"input_tokens": prepared.total_tokens}).encode()
        return 200, {"content-type": "application/json"}, out

    def _create(self, payload: dict[str, Any], workspace: str, at: datetime, seq: int, stream: bool) -> Answer:
        prepared = self._prepare(payload)
        usage = self._process(prepared, workspace, self.cache, at).to_anthropic()
        if payload["max_tokens"] == 0:  # pre-warming: prefill only, no output (§1.6)
            content: list[dict[str, Any]] = []
            stop_reason = "max_tokens"
        else:
            content = [{"type": "text", "text": self._text(payload)}]
            stop_reason = "end_turn"
        tokenizer = self._memo.tokenizer
        usage["output_tokens"] = sum(segment_tokens("msg", block, tokenizer) for block in content)
        message_id = f"msg_sim_{seq:06d}"
        message = {
            "id": message_id, "type": "message", "role": "assistant", "model": prepared.model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": None, "usage": usage,
        }
        asked = payload.get("diagnostics")
        if isinstance(asked, dict):
            message["diagnostics"] = self._diagnostics(asked, prepared, workspace, message_id)
        if stream:
            return 200, _SSE_HEADERS, ANTHROPIC.sse_write(message)
        return 200, {"content-type": "application/json"}, json.dumps(message).encode()

    def _diagnostics(self, asked: dict[str, Any], prepared: PreparedRequest, workspace: str, message_id: str
                     ) -> dict[str, Any] | None:
        """The response's ``diagnostics`` for a request that opted in, after remembering it under ``message_id``."""
        previous_id = asked.get("previous_message_id")
        with self._lock:
            previous = None if not isinstance(previous_id, str) else self._fingerprints.get((workspace, previous_id))
            self._fingerprints[(workspace, message_id)] = prepared
            while len(self._fingerprints) > MAX_FINGERPRINTS:
                self._fingerprints.popitem(last=False)
        if not isinstance(previous_id, str):
            return None  # a first request: opted in, nothing to compare
        if previous is None:
            return {"cache_miss_reason": {"type": "previous_message_not_found"}}
        reason = diagnose(previous, prepared)
        return None if reason is None else {"cache_miss_reason": reason}

    # -- OpenAI -------------------------------------------------------------------------------
    def _openai(self, path: str, payload: dict[str, Any], workspace: str, at: datetime, seq: int,
                stream: bool) -> Answer:
        chat = path == CHAT
        prepared = self._prepare(payload, _FORMATS[path].name)
        assert self.openai_cache is not None
        usage = self._process(prepared, workspace, self.openai_cache, at)
        text = self._text(payload)
        output = self._output_tokens(text)
        prompt = usage.total_input_tokens or 0
        cached = usage.cache_read_input_tokens or 0
        created = int(at.timestamp())
        if chat:
            native = {
                "prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output,
                "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
            }
            completion = {
                "id": f"chatcmpl-sim{seq:06d}", "object": "chat.completion", "created": created,
                "model": prepared.model, "system_fingerprint": None,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": native,
            }
            if stream:
                options = payload.get("stream_options") or {}
                return 200, _SSE_HEADERS, OPENAI_CHAT.sse_write(completion,
                                                                include_usage=bool(options.get("include_usage")))
            return 200, {"content-type": "application/json"}, json.dumps(completion).encode()
        native = {
            "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output,
        }
        item = {"id": f"msg_sim{seq:06d}", "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
        response = {
            "id": f"resp_sim{seq:06d}", "object": "response", "created_at": created, "status": "completed",
            "background": False, "error": None, "incomplete_details": None,
            "instructions": payload.get("instructions"), "max_output_tokens": payload.get("max_output_tokens"),
            "model": prepared.model, "output": [item], "parallel_tool_calls": True,
            "previous_response_id": payload.get("previous_response_id"),
            "prompt_cache_key": payload.get("prompt_cache_key"), "reasoning": {"effort": None, "summary": None},
            "store": payload.get("store", True), "temperature": 1.0, "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": payload.get("tools", []), "top_p": 1.0, "truncation": "disabled",
            "usage": native, "user": None, "metadata": payload.get("metadata") or {},
        }
        if stream:
            return 200, _SSE_HEADERS, OPENAI_RESPONSES.sse_write(response)
        return 200, {"content-type": "application/json"}, json.dumps(response).encode()


_SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}


def diagnose(previous: PreparedRequest, current: PreparedRequest) -> dict[str, Any] | None:
    """Anthropic's ``cache_miss_reason`` for ``current`` against ``previous``, or None when nothing diverged.

    The first divergence in the prefix order (docs/provider_cache_rules.md#anthropic-cache-diagnostics): the model
    (or ``speed``), then the tools, the system prompt, the messages (an earlier entry differs, rather than entries
    only being appended); with all of those equal, another prompt field (``tool_choice``, ``thinking``,
    ``output_config``) is ``unavailable``. ``cache_missed_input_tokens``: the previous request's estimated tokens
    after the prefix the two share.
    """
    def level(r: PreparedRequest, name: str) -> list[str]:
        return [s.block_hash for s in r.segments if s.level == name]

    kind: str | None = None
    if previous.model != current.model or previous.rest.get("speed") != current.rest.get("speed"):
        kind = "model_changed"
    elif level(previous, "tools") != level(current, "tools"):
        kind = "tools_changed"
    elif level(previous, "system") != level(current, "system"):
        kind = "system_changed"
    else:
        before, now = level(previous, "messages"), level(current, "messages")
        if now[:len(before)] != before:
            kind = "messages_changed"
        elif any(previous.rest.get(k) != current.rest.get(k) for k in _OTHER_PROMPT_FIELDS):
            return {"type": "unavailable"}
    if kind is None:
        return None
    shared = 0 if kind == "model_changed" else compute_diff(previous, current).shared_prefix_tokens
    return {"type": kind, "cache_missed_input_tokens": max(previous.total_tokens - shared, 0)}


def _validate(payload: Any, path: str) -> None:
    """Refuse what the API refuses before any cache model sees it: the first problem the one validator
    (:func:`~promptcache_nb.request.validate_request`, shared with ``Session.record``) finds, in the API's dotted
    notation (``messages.0.role: ...``)."""
    problems = validate_request(payload, _FORMATS[path].name, count_tokens=path == COUNT_TOKENS)
    if problems:
        raise _Reject(400, problems[0].api_line)


def _not_json(constant: str) -> Any:
    """``NaN``, ``Infinity``, ``-Infinity``: Python's parser takes them, JSON (and the API) do not."""
    raise json.JSONDecodeError(f"{constant} is not a JSON value", constant, 0)


def _key_digest(key: str) -> str:
    return digest(key.encode("utf-8"), tag="workspace")


# -- CLI ----------------------------------------------------------------------------------------
def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``promptcache-nb serve`` options, for the CLI's subparser."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8765, help="TCP port (0: any free port; default 8765)")
    parser.add_argument("--cache", default="anthropic",
                        help=f"cache model: {', '.join(cache_model_names())} (default: anthropic)")
    parser.add_argument("--ttft", type=float, default=None, metavar="SECONDS",
                        help="delay before a written entry becomes readable (anthropic cache; default 0.5)")
    return parser


def run_serve(args: argparse.Namespace, *, ready: Callable[[SimulatorServer], None] | None = None) -> int:
    """Serve until interrupted (Ctrl-C). ``ready`` is called once listening (tests stop the server there)."""
    params = {} if args.ttft is None else {"ttft_seconds": args.ttft}
    server = SimulatorServer(args.cache, host=args.host, port=args.port, cache_params=params)
    server.start()
    print(f"promptcache-nb simulator ({args.cache} cache) listening on {server.base_url}", flush=True)
    print(f"  export ANTHROPIC_BASE_URL={server.base_url}   # any API key works; caches are per key", flush=True)
    print(f"  export OPENAI_BASE_URL={server.base_url}/v1", flush=True)
    try:
        if ready is not None:
            ready(server)
        while server.running:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def serve_main(argv: list[str] | None = None, *,
               ready: Callable[[SimulatorServer], None] | None = None) -> int:
    """``promptcache-nb serve [--host H] [--port N] [--cache anthropic] [--ttft S]``."""
    parser = argparse.ArgumentParser(
        prog="promptcache-nb serve", description="Run a Messages endpoint that answers from a cache model.")
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv), ready=ready)
