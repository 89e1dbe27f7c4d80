"""A Messages-compatible endpoint that answers from a cache model: the live code path, offline.

``SimulatorServer`` speaks enough of ``POST /v1/messages`` for the official ``anthropic`` SDK (sync,
async, ``stream=True`` and ``messages.stream``) to run unchanged against it, so the notebooks exercise
exactly the code they would use against the real API. Each request body goes through the same
:func:`~promptcache_nb.request.prepare` and cache model as the in-process
:class:`~promptcache_nb.live.DirectSimulator`, so the usage it reports is identical.

What it reproduces (provider_cache_rules.md §1):

* caches isolated per workspace (§1.9): one cache model per API key — the key is reduced to a digest on
  arrival and never stored, logged or echoed; within a workspace entries are keyed by model (§1.2);
* the ``usage`` object with the 5m/1h ``cache_creation`` split (§1.8), in the JSON response and in the
  SSE ``message_start`` / ``message_delta`` events;
* the API's error shape ``{"type": "error", "error": {"type", "message"}, "request_id"}`` with a
  ``request-id`` header: 401 for a missing or refused key, 400 with the cache model's text (e.g. five
  breakpoints), 404 for an unknown model, and injected 429 (with ``retry-after``) / 529 for tests.

Time: a cache replays a *scenario's* clock, not the wall clock, so a request may carry
``x-promptcache-at: <ISO-8601 UTC>`` (sent by :class:`~promptcache_nb.live.AnthropicBackend` only to
loopback endpoints); without it the wall clock is used.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .._util import digest
from ..cache import CacheModel, get_cache_model
from ..errors import InvalidRequestError, UnknownModelError
from ..request import SegmentMemo, prepare
from ..tokens import DEFAULT_TOKENIZER, Tokenizer, segment_tokens
from ._base import AT_HEADER, SIMULATED_REPLY, SIMULATOR_HEADER

log = logging.getLogger("promptcache_nb.server")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_DEFAULT_MESSAGES = {
    400: "invalid request (injected by the simulator)",
    401: "invalid x-api-key",
    403: "Your API key does not have permission to use the specified resource.",
    404: "Not found",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: "This request would exceed your organization's rate limit (injected by the simulator).",
    500: "Internal server error",
    529: "Overloaded",
}
_PATHS = ("/v1/messages", "/v1/messages/count_tokens")

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


class SimulatorServer:
    """A local ``/v1/messages`` endpoint backed by a promptcache_nb cache model.

    Args:
        cache: cache model name (``pc.CACHE_MODELS``); one instance per workspace (API key).
        host: interface to bind; keep the loopback default unless you mean to serve a network.
        port: 0 picks a free port (read :attr:`base_url` after :meth:`start`).
        cache_params: keyword arguments for the cache model (as ``lab.session(cache_params=...)``).
        tokenizer: token estimator; must match the Lab's for usage identical to the direct simulator.
        api_keys: when given, only these keys are accepted (401 otherwise); they are kept as digests.
            The key ``"bad"`` is always refused, so a test can provoke a 401 without configuration.
        reply: the assistant text, or ``fn(body) -> str``; the default matches the session's own
            simulated reply, so sessions through this server and in-process store the same rows.

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
    ) -> None:
        get_cache_model(cache, **(cache_params or {}))  # fail now on a bad name or parameter
        self.cache = cache
        self.host = host
        self.port = port
        self._cache_params = dict(cache_params or {})
        self._memo = SegmentMemo(tokenizer or DEFAULT_TOKENIZER)
        self._accepted = None if api_keys is None else frozenset(_key_digest(k) for k in api_keys)
        self._reply = reply
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.reset()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> SimulatorServer:
        """Bind and serve in a daemon thread; returns self. Idempotent."""
        if self._httpd is not None:
            return self
        httpd = ThreadingHTTPServer((self.host, self.port), _Handler)
        httpd.daemon_threads = True
        httpd.simulator = self  # type: ignore[attr-defined]
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"promptcache-sim:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent; cache state is kept until :meth:`reset`."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def base_url(self) -> str:
        """``http://host:port`` — pass it as ``anthropic.Anthropic(base_url=...)``."""
        if self._httpd is None:
            raise RuntimeError("the simulator is not running; call .start() or use `with SimulatorServer()`")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __repr__(self) -> str:
        where = self.base_url if self.running else "stopped"
        return f"SimulatorServer(cache={self.cache!r}, {where}, workspaces={len(self._caches)})"

    # -- state --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every workspace's cache, the served-request log and any pending injected errors."""
        with self._lock:
            self._caches: dict[str, CacheModel] = {}
            self._workspace_names: dict[str, str] = {}
            self._served: list[ServedRequest] = []
            self._injected: deque[_Injected] = deque()
            self._seq = 0

    @property
    def requests(self) -> list[ServedRequest]:
        """Every request answered so far, oldest first (retries included)."""
        with self._lock:
            return list(self._served)

    @property
    def workspaces(self) -> int:
        """How many distinct API keys (workspaces) have a cache."""
        return len(self._caches)

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
        with self._lock:
            self._seq += 1
            seq = self._seq
        request_id = f"req_sim_{seq:06d}"
        path = path.split("?", 1)[0].rstrip("/")
        workspace = at = None
        stream = False
        try:
            if path not in _PATHS or method != "POST":
                raise _Reject(404, f"{method} {path}: not found (served: POST {', '.join(_PATHS)})")
            workspace = self._authenticate(headers)
            self._maybe_injected()
            payload = self._json(body)
            stream = bool(payload.pop("stream", False))
            at = self._request_time(headers)
            if path.endswith("count_tokens"):
                status, out_headers, out = self._count_tokens(payload)
            else:
                status, out_headers, out = self._create(payload, workspace, at, seq, stream)
        except _Reject as rej:
            status = rej.status
            out_headers = {"content-type": "application/json", **rej.headers}
            error = {"type": ERROR_TYPES.get(status, "api_error"), "message": rej.message}
            out = json.dumps({"type": "error", "error": error, "request_id": request_id}).encode()
        except Exception:  # a simulator bug must still answer in the API's shape
            log.exception("simulator failed on %s %s (%s)", method, path, request_id)
            status = 500
            out_headers = {"content-type": "application/json"}
            error = {"type": "api_error",
                     "message": "internal simulator error (see the promptcache_nb.server log)"}
            out = json.dumps({"type": "error", "error": error, "request_id": request_id}).encode()
        out_headers = {**out_headers, "request-id": request_id, SIMULATOR_HEADER: self.cache}
        with self._lock:
            name = self._workspace_names.get(workspace) if workspace else None
            self._served.append(ServedRequest(request_id, status, path, stream, name, at))
        log.debug("%s %s -> %d %s", method, path, status, request_id)
        return status, out_headers, out

    def _authenticate(self, headers: dict[str, str]) -> str:
        key = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        if not key:
            raise _Reject(401, "x-api-key header is required")
        ws = _key_digest(key)
        if key == "bad" or (self._accepted is not None and ws not in self._accepted):
            raise _Reject(401, "invalid x-api-key")
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
    def _json(body: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(body or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _Reject(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise _Reject(400, "request body must be a JSON object")
        return payload

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

    def _prepare(self, payload: dict[str, Any], *, need_max_tokens: bool):
        fields = ("model", "max_tokens", "messages") if need_max_tokens else ("model", "messages")
        for name in fields:
            if name not in payload:
                raise _Reject(400, f"{name}: Field required")
        if not isinstance(payload["model"], str):
            raise _Reject(400, "model: Input should be a valid string")
        if need_max_tokens and (not isinstance(payload["max_tokens"], int) or payload["max_tokens"] < 0):
            raise _Reject(400, "max_tokens: Input should be a non-negative integer")
        with self._lock:
            try:
                return prepare(payload, memo=self._memo)
            except (ValueError, TypeError) as exc:
                raise _Reject(400, str(exc)) from None

    def _cache_for(self, workspace: str) -> CacheModel:
        cache = self._caches.get(workspace)
        if cache is None:
            cache = self._caches[workspace] = get_cache_model(self.cache, **self._cache_params)
            self._workspace_names[workspace] = f"ws{len(self._workspace_names) + 1}"
        return cache

    def _count_tokens(self, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        prepared = self._prepare(payload, need_max_tokens=False)
        out = json.dumps({"input_tokens": prepared.total_tokens}).encode()
        return 200, {"content-type": "application/json"}, out

    def _create(self, payload: dict[str, Any], workspace: str, at: datetime, seq: int, stream: bool
                ) -> tuple[int, dict[str, str], bytes]:
        prepared = self._prepare(payload, need_max_tokens=True)
        with self._lock:
            cache = self._cache_for(workspace)
            try:
                cache.validate_model(prepared.model)
            except UnknownModelError:
                raise _Reject(404, f"model: {prepared.model}") from None
            try:
                result = cache.process(prepared, at)
            except InvalidRequestError as exc:
                raise _Reject(400, exc.api_message) from None
        if payload["max_tokens"] == 0:  # pre-warming: prefill only, no output (§1.6)
            content: list[dict[str, Any]] = []
            stop_reason = "max_tokens"
        else:
            text = self._reply(payload) if callable(self._reply) else self._reply
            content = [{"type": "text", "text": text}]
            stop_reason = "end_turn"
        tokenizer = self._memo.tokenizer
        usage = result.usage.to_anthropic()
        usage["output_tokens"] = sum(segment_tokens("msg", block, tokenizer) for block in content)
        message = {
            "id": f"msg_sim_{seq:06d}", "type": "message", "role": "assistant", "model": prepared.model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": None, "usage": usage,
        }
        if stream:
            return 200, {"content-type": "text/event-stream", "cache-control": "no-cache"}, _sse(message)
        return 200, {"content-type": "application/json"}, json.dumps(message).encode()


def _key_digest(key: str) -> str:
    return digest(key.encode("utf-8"), tag="workspace")


def _sse(message: dict[str, Any]) -> bytes:
    """The Messages streaming events for a complete message (usage in message_start and message_delta)."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**usage, "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for i, block in enumerate(message["content"]):
        text = block["text"]
        events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                               "content_block": {"type": "text", "text": ""}}))
        cut = len(text) // 2
        for piece in (text[:cut], text[cut:]):
            if piece:
                events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                       "delta": {"type": "text_delta", "text": piece}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    final_usage = {k: usage[k] for k in (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")}
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(("message_delta", {"type": "message_delta", "usage": final_usage, "delta": delta}))
    events.append(("message_stop", {"type": "message_stop"}))
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes; Nagle would stall each ~40 ms
    server_version = "promptcache-sim"
    sys_version = ""

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        sim: SimulatorServer = self.server.simulator  # type: ignore[attr-defined]
        status, out_headers, payload = sim.handle(self.command, self.path, headers, body)
        self.send_response(status)
        for name, value in out_headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_POST = _serve
    do_GET = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        # The request line and status only; never headers (they carry the API key).
        log.debug("%s - " + format, self.address_string(), *args)


# -- CLI ----------------------------------------------------------------------------------------
def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``promptcache-nb serve`` options, for the CLI's subparser."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8765, help="TCP port (0: any free port; default 8765)")
    parser.add_argument("--cache", default="anthropic", help="cache model name (default: anthropic)")
    parser.add_argument("--ttft", type=float, default=None, metavar="SECONDS",
                        help="delay before a written entry becomes readable (anthropic cache; default 0.5)")
    return parser


def run_serve(args: argparse.Namespace, *, ready: Callable[[SimulatorServer], None] | None = None) -> int:
    """Serve until interrupted (Ctrl-C). ``ready`` is called once listening (tests stop the server there)."""
    params = {} if args.ttft is None else {"ttft_seconds": args.ttft}
    server = SimulatorServer(args.cache, host=args.host, port=args.port, cache_params=params)
    server.start()
    print(f"promptcache-nb simulator ({args.cache} cache) listening on {server.base_url}")
    print(f"  export ANTHROPIC_BASE_URL={server.base_url}   # any API key works; caches are per key")
    idle = threading.Event()
    try:
        if ready is not None:
            ready(server)
        while server.running:
            idle.wait(0.2)
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
