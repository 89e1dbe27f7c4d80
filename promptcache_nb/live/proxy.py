"""A recording proxy: put it between an agent and its API, get one ``exchanges`` JSON line per call.

An agent that reads ``ANTHROPIC_BASE_URL`` (Claude Code, the anthropic SDKs) or ``OPENAI_BASE_URL`` (the openai
SDKs, many CLIs) is pointed at :attr:`RecordingProxy.url` and works as before::

    promptcache-nb proxy --upstream https://api.anthropic.com --log calls.jsonl
    ANTHROPIC_BASE_URL=http://127.0.0.1:8787 claude

and later ``lab.import_log("calls.jsonl")`` picks up what is new. It writes JSON Lines, not DuckDB, on purpose:
it runs for days beside a notebook that holds the store open.

What is forwarded: every request — method, path, query string, headers (minus hop-by-hop headers, ``Host`` and
``Content-Length``, which the upstream connection sets) and body, byte for byte — and every response: status,
headers (minus hop-by-hop) and body, relayed chunk by chunk as the upstream sends it (a streamed response is
never buffered whole). One exception: ``Accept-Encoding`` is narrowed to the encodings this process can decode
(gzip, deflate, and br / zstd when ``brotli`` / ``zstandard`` are installed), so the log can always read the
usage; the client still receives the upstream's bytes and ``Content-Encoding`` unchanged.

What is written (the ``exchanges`` format, version 1, defined in :mod:`promptcache_nb.readers.exchanges`):
one line per completed call, appended with a single unbuffered ``write`` under a lock (the file is opened per
line, so a rotated log is recreated) — a crash loses at most the calls in flight, and a reader leaves a
half-written last line for the next import. The line is written before the client sees the response end.
Keys in this order::

    {"v": 1, "at": "2026-03-02T09:14:07.512Z", "method": "POST",
     "url": "https://api.anthropic.com/v1/messages?beta=true", "path": "/v1/messages", "status": 200,
     "request": {...body...}, "response": {...JSON body, or null when streamed...},
     "sse": [{"event": "message_start", "data": {...}}, ...],          # streamed responses only
     "usage": {...native usage...}, "request_id": "req_011C...", "latency_ms": 1834.2,
     "provider": "anthropic",                                           # when the path says it
     "error": "..."}                                                    # only when no complete response

``path`` excludes the query string (Claude Code calls ``/v1/messages?beta=true``); ``url`` keeps it. Both pass
through :func:`promptcache_nb._redact.redact_url`: a parameter whose name looks like a credential (``key``,
``token``, ``secret``...) is dropped from the query and the fragment whatever separates the parameters (``&``,
``;``, a repeated ``?``, ``#``) and blanked in the path (``;key=…``); a value that is a key (:data:`KEY_PATTERNS`:
Anthropic ``sk-ant-…``, OpenAI ``sk-…`` / ``sk-proj-…``, Google ``AIza…``, ``Bearer …`` tokens and JSON Web
Tokens, percent-encoded or not) is replaced by ``[redacted]`` wherever it appears — a path segment, a bare query
component, a fragment, the upstream's own path prefix (a gateway URL ``https://gw/sk-ant-…``: :attr:`upstream`
and ``repr`` show it redacted), and the answer or error text that echoes the URL. Bodies are logged as sent: a
key inside a request body (``metadata.user_id``) is kept unless the proxy runs with ``redact_bodies=True``
(``--redact-bodies``), which replaces every key-pattern match in every string (and object key) of the logged
request, response and events — opt-in, because it changes the logged prompt: an imported request whose text held
such a string no longer hashes as the one sent. Calls to other paths (model lists, token counting) are forwarded
and logged too; importers skip them by path. A call the proxy itself refused or could not forward has
``"status": null`` and an ``error``: the upstream unreachable (the client got 502), timed out (504), a body over
the size limit (413) or too slow (408).

Cache diagnostics (``diagnostics=True``, ``--diagnostics``; off by default): the one change the proxy then makes.
Each ``POST …/v1/messages`` JSON body without a ``diagnostics`` object gets one naming the previous response of
its conversation (null on the first; a conversation is what the import makes a session: the request's
``metadata.user_id``), and the ``anthropic-beta`` header gains ``cache-diagnosis-2026-04-07``
(docs/provider_cache_rules.md#anthropic-cache-diagnostics). The line logs the body as forwarded, so the import
reads what was asked beside the response's answer (``turns.provider_cache_miss_reason``).

Keys: request headers are forwarded and never written — the format has no header field — and are never logged
by this module; credentials in the upstream URL (``https://user:pass@host``) are sent as HTTP Basic auth when
the client sent no ``Authorization`` of its own, and shown nowhere (``repr``, log lines, error bodies). httpx
logs each upstream URL at INFO: a filter on the ``httpx`` logger redacts the URL there as in ``url``.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount

from .._redact import (
    KEY_PATTERNS,
    SECRET_NAME,
    redact_json,
    redact_keys,
    redact_url,
    redact_url_logs,
    scrub,
    url_secrets,
)
from .._util import SIMULATOR_HEADER
from ..readers._http import session_key_for
from ..readers._sse import SseEvent, SseParser, usage_from_sse
from ..readers.exchanges import EXCHANGES_FORMAT_VERSION
from ._asgi import MAX_BODY_BYTES, REQUEST_TIMEOUT, BodyError, read_body
from ._diagnostics import DiagnosticsChain, with_beta
from ._serving import LoopbackServer

#: coding -> a new decompressor, for each optional coding whose package is installed (the others are kept out of
#: the Accept-Encoding the proxy forwards: ``DECODABLE``)
_OPTIONAL: dict[str, Callable[[], Any]] = {}
try:
    import brotli  # type: ignore[import-not-found]
except ImportError:  # only a brotli-encoded reply needs it
    pass
else:
    _OPTIONAL["br"] = lambda: brotli.Decompressor()
try:
    import zstandard
except ImportError:  # only a zstd-encoded reply needs it
    pass
else:
    _OPTIONAL["zstd"] = lambda: zstandard.ZstdDecompressor().decompressobj()

log = logging.getLogger("promptcache_nb.proxy")

__all__ = ["KEY_PATTERNS", "RecordingProxy", "redact_json", "redact_keys", "redact_url"]

#: RFC 9110 §7.6.1 connection-specific headers, plus the de-facto ``proxy-connection``: never forwarded.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade",
})
#: Upstream timeouts: a model can think for minutes between two streamed events.
UPSTREAM_TIMEOUT = httpx.Timeout(connect=30.0, read=900.0, write=120.0, pool=60.0)


class RecordingProxy(LoopbackServer):
    """Forward an agent's API calls to ``upstream`` and append one ``exchanges`` line per call to ``log``.

    Args:
        upstream: the API's origin, e.g. ``https://api.anthropic.com`` or ``https://api.openai.com`` (a path
            prefix is kept: the client's path is appended to it; a query string or fragment is ignored).
        log: the JSON Lines file to append to (created with its parent directory).
        host: interface to bind; the loopback default keeps the proxy (which forwards any key it is given)
            off the network. Binding anything else logs a warning.
        port: TCP port; 0 picks a free one (read :attr:`url`).
        max_body_bytes: larger request bodies get 413 without being forwarded.
        request_timeout: seconds a client has to send the request headers, and then the body (408).
        redact_bodies: replace every :data:`KEY_PATTERNS` match inside the logged request, response and events
            by ``[redacted]`` (off by default: it changes the logged prompt, see the module docstring).
        diagnostics: ask Anthropic why each Messages request missed its cache (see the module docstring).

    Example:
        >>> import anthropic, promptcache_nb as pc
        >>> with pc.SimulatorServer() as api, pc.RecordingProxy(api.base_url, "calls.jsonl") as proxy:
        ...     client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-local", max_retries=0)
        ...     msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=64,
        ...                                  messages=[{"role": "user", "content": "hi"}])
        ...     client.close()
        >>> proxy.recorded
        1
    """

    def __init__(
        self,
        upstream: str,
        log: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = MAX_BODY_BYTES,
        request_timeout: float = REQUEST_TIMEOUT,
        redact_bodies: bool = False,
        diagnostics: bool = False,
    ) -> None:
        url = httpx.URL(upstream)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"upstream must be an http(s) URL such as https://api.anthropic.com, got "
                             f"{_without_credentials(url)!r}")
        self._basic_auth: bytes | None = None
        if url.userinfo:
            pair = f"{url.username}:{url.password or ''}".encode()
            self._basic_auth = b"Basic " + base64.b64encode(pair)
        self._upstream = url.copy_with(username=None, password=None, query=None, fragment=None)
        #: The upstream origin (and path prefix) as shown: without credentials, a key in its path redacted
        #: (a gateway that takes the key in the path, ``https://gw/sk-ant-…``, still receives it).
        self.upstream: str = redact_url(str(self._upstream).rstrip("/"))
        self.log_path = Path(log)
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self.redact_bodies = redact_bodies
        self.diagnostics = diagnostics
        # the import's session of a request is its conversation: the previous response it names is the one our
        # analysis compares it with
        self._chain = DiagnosticsChain(lambda body: session_key_for("", "anthropic", body)) if diagnostics else None
        #: Lines written since :meth:`start`.
        self.recorded = 0
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None

    # -- lifecycle (start, close, stop, with: live/_serving.py) -----------------------------------
    _thread_name = "promptcache-proxy"
    _network_warning = ("the recording proxy listens on %s: anyone who can reach it can use the API keys sent "
                        "through it; bind 127.0.0.1 unless you mean it")

    def _serve_app(self) -> Any:
        """Create the log (and its directory) before serving: fail at start, not at the first call, when it cannot
        be written."""
        redact_url_logs("httpx")  # httpx logs each upstream URL at INFO
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        return Starlette(routes=[Mount("/", app=self._asgi)], lifespan=self._lifespan)

    @property
    def url(self) -> str:
        """``http://host:port``: set ``ANTHROPIC_BASE_URL`` to it (``OPENAI_BASE_URL`` to it plus ``/v1``)."""
        return self._url("proxy")

    def __repr__(self) -> str:
        where = self.url if self.running else "stopped"
        return (f"RecordingProxy(upstream={self.upstream!r}, log={str(self.log_path)!r}, {where}, "
                f"recorded={self.recorded})")

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # trust_env=False: no proxy variables, and above all no ~/.netrc credentials added behind our back
        async with httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT, follow_redirects=False, trust_env=False) as client:
            self._client = client
            yield
        self._client = None

    # -- one call -----------------------------------------------------------------------------
    async def _asgi(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        # every method and path is forwarded: the upstream decides what exists
        response = await self._endpoint(Request(scope, receive))
        await response(scope, receive, send)

    async def _endpoint(self, request: Request) -> Response | _Exchange:
        call = _Exchange(self, request)
        try:
            body = await read_body(request, limit=self.max_body_bytes, timeout=self.request_timeout)
        except BodyError as exc:
            if exc.status != 499:  # a client that left sees nothing; the others get the error
                call.finish(error=f"refused by the proxy: {exc.message}")
            return _error_response(exc.status, exc.message)
        call.body = body
        if self._chain is not None and request.method == "POST" and call.raw_path.rstrip("/").endswith("/v1/messages"):
            asked = _json_or_none(body)
            if isinstance(asked, dict) and "diagnostics" not in asked:
                call.asked = self._chain.ask(asked)
                call.body = json.dumps(call.asked, ensure_ascii=False).encode("utf-8")
        return call

    def _write(self, entry: dict[str, Any]) -> None:
        try:
            text = json.dumps(entry, ensure_ascii=False, separators=(", ", ": "))
            line = (text + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate decoded from a \\ud8xx escape: keep it escaped
            line = (json.dumps(entry, separators=(", ", ": ")) + "\n").encode("ascii")
        # Opened per line: a log rotated or removed while the proxy runs (for days) is recreated, and nothing
        # waits in a buffer. The cost (~20 us) is nothing beside an LLM call.
        with self._lock:
            try:
                with self.log_path.open("ab", buffering=0) as fh:  # one write(2) per line, O_APPEND
                    fh.write(line)
            except OSError as exc:
                log.error("could not append the call to %s to %s: %s", entry["path"], self.log_path, exc)
                return
            self.recorded += 1


class _Exchange:
    """One proxied call. An ASGI response: it sends the request upstream, relays the answer, writes the line."""

    def __init__(self, proxy: RecordingProxy, request: Request) -> None:
        self.proxy = proxy
        self.request = request
        self.at = datetime.now(UTC)
        self.t0 = time.perf_counter()
        self.body = b""
        self.status: int | None = None
        self.headers: httpx.Headers | None = None
        self.recorder: _Recorder | None = None
        self.error: str | None = None
        #: the body as forwarded when the proxy asked for the provider's cache diagnosis, else None
        self.asked: dict[str, Any] | None = None
        self.done = False
        self._finished = False
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        self.raw_path = raw_path.decode("latin-1")
        self.query = request.scope.get("query_string", b"").decode("latin-1")
        # what the upstream URL of this call holds (in the upstream's path prefix, the client's path, the query):
        # the upstream may echo it (a 404 naming the path), and nothing we write or raise may keep it
        self.url_secrets = url_secrets(self._upstream_url())

    def _upstream_url(self) -> str:
        base = str(self.proxy._upstream).rstrip("/") + self.raw_path
        return f"{base}?{self.query}" if self.query else base

    # the ASGI interface: Starlette awaits the endpoint's return value with these arguments
    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                # The body is read; the next message is the client hanging up. Stop the upstream call then:
                # a model generating for nobody still costs tokens.
                while (await receive())["type"] != "http.disconnect":
                    pass
                if not self.done:
                    self.error = "the client closed the connection before the response was complete"
                    tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                await self._relay(send)
            finally:
                tg.cancel_scope.cancel()

    async def _relay(self, send: Any) -> None:
        proxy = self.proxy
        assert proxy._client is not None
        try:
            request = httpx.Request(self.request.method, self._upstream_url(), headers=self._forward_headers(),
                                    content=self.body)
            try:
                response = await proxy._client.send(request, stream=True)
            except (httpx.ReadError, httpx.RemoteProtocolError):
                # Almost always a pooled keep-alive connection the upstream had just closed: it fails before any
                # response byte arrives. One retry on a fresh connection, as urllib3 and browsers do for idle
                # connections; a second failure is reported as 502.
                response = await proxy._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            await self._fail(send, 504, f"upstream {proxy.upstream} timed out ({type(exc).__name__})")
            return
        except (httpx.HTTPError, OSError, ValueError) as exc:
            await self._fail(send, 502, f"upstream {proxy.upstream} unreachable ({type(exc).__name__}: "
                                        f"{self._scrub(str(exc))})")
            return
        self.status = response.status_code
        self.headers = response.headers
        self.recorder = _Recorder(response.headers, limit=proxy.max_body_bytes)
        out_headers = [(k, v) for k, v in response.headers.raw if k.lower().decode("latin-1") not in HOP_BY_HOP]
        # The line is written before the client can see the response end, so a caller that reads the log right
        # after its call returned finds the call there. A stream is relayed event by event (nothing held back); a
        # plain body holds back its latest chunk until the next arrives, to send it after the line.
        streamed = self.recorder.streamed
        held = b""
        try:
            await send({"type": "http.response.start", "status": response.status_code, "headers": out_headers})
            try:
                async for chunk in response.aiter_raw():
                    self.recorder.feed(chunk)
                    if not streamed:
                        chunk, held = held, chunk
                    if chunk:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError as exc:
                self.error = f"the upstream broke off the response ({type(exc).__name__})"
                if "content-length" in response.headers:
                    raise  # the client must see a short body as a broken connection, not as complete
            self.done = self.error is None
            self.finish()
            await send({"type": "http.response.body", "body": held, "more_body": False})
        finally:
            if not self.done and self.error is None:  # cancelled (the proxy is shutting down) or a bug
                self.error = "the proxy stopped before the response was complete"
            self.finish()
            with anyio.CancelScope(shield=True):
                await response.aclose()

    async def _fail(self, send: Any, status: int, message: str) -> None:
        log.warning("%s %s: %s", self.request.method, redact_url(self.raw_path), message)
        self.finish(error=message)
        await _error_response(status, message)(self.request.scope, _no_receive, send)

    def _forward_headers(self) -> list[tuple[bytes, bytes]]:
        raw: list[tuple[bytes, bytes]] = self.request.scope["headers"]
        named_in_connection = set()
        for name, value in raw:
            if name.lower() == b"connection":
                named_in_connection |= {t.strip().lower() for t in value.decode("latin-1").split(",")}
        out: list[tuple[bytes, bytes]] = []
        has_auth = False
        for name, value in raw:
            lname = name.lower().decode("latin-1")
            if lname in HOP_BY_HOP or lname in named_in_connection or lname in ("host", "content-length"):
                continue
            if lname == "accept-encoding":
                value = _decodable_encodings(value)
            if lname == "anthropic-beta" and self.asked is not None:
                continue  # sent once below, naming the diagnostics beta too
            has_auth = has_auth or lname == "authorization"
            out.append((name, value))
        if self.proxy._basic_auth is not None and not has_auth:
            out.append((b"authorization", self.proxy._basic_auth))
        if self.asked is not None:
            given = ",".join(v.decode("latin-1") for k, v in raw if k.lower() == b"anthropic-beta")
            out.append((b"anthropic-beta", with_beta(given).encode("latin-1")))
        return out

    def _scrub(self, text: str) -> str:
        """``text`` without any credential this call carries (header values, the upstream's password)."""
        secrets = [v.decode("latin-1") for k, v in self.request.scope["headers"]
                   if SECRET_NAME.search(k.decode("latin-1"))]
        if self.proxy._basic_auth:
            secrets.append(base64.b64decode(self.proxy._basic_auth[6:]).decode().partition(":")[2])
        parts = [p for s in secrets for p in (s, *s.split()) if len(p) >= 6]  # "Bearer sk-..." and "sk-..."
        return scrub(text, [*parts, *self.url_secrets])

    def finish(self, *, error: str | None = None) -> None:
        """Write this call's line (once)."""
        if self._finished:
            return
        self._finished = True
        error = error or self.error
        latency = round((time.perf_counter() - self.t0) * 1000, 1)
        path = redact_url(self.raw_path)  # as the client sent it (percent-encoding kept), without the query string
        entry: dict[str, Any] = {
            "v": EXCHANGES_FORMAT_VERSION,
            "at": self.at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "method": self.request.method,
            "url": self._logged_url(),
            "path": path,
            "status": self.status,
            "request": _json_or_none(self.body),
            "response": None,
        }
        provider = _provider(path)
        usage = response_id = None
        rec = self.recorder
        if rec is not None:
            rec.close()
            if rec.streamed:
                entry["sse"] = [{"event": e.event, "data": _json_or_text(e.data)} for e in rec.events]
                if rec.events:
                    summary = usage_from_sse(rec.events, provider or "auto")
                    usage, response_id = summary.usage, summary.response_id
            else:
                entry["response"] = response = rec.json()
                if isinstance(response, dict):
                    usage = response.get("usage") if isinstance(response.get("usage"), dict) else None
                    response_id = response.get("id") if isinstance(response.get("id"), str) else None
        headers: Mapping[str, str] = self.headers or {}
        entry["usage"] = usage
        entry["request_id"] = headers.get("request-id") or headers.get("x-request-id") or response_id
        if self.asked is not None and self.proxy._chain is not None and self.status == 200:
            self.proxy._chain.answered(self.asked, response_id)
        entry["latency_ms"] = latency
        if provider:
            entry["provider"] = provider
        if headers.get(SIMULATOR_HEADER) is not None:
            entry["simulated"] = True  # our own simulator answered: its usage is an estimate, never measured
        if error:
            entry["error"] = self._scrub(error)
        secrets = self.url_secrets
        for name in ("request", "response", "sse", "error"):
            if entry.get(name) is None:
                continue
            if secrets:  # the URL's keys, wherever the upstream echoed them
                entry[name] = redact_json(entry[name], lambda text: scrub(text, secrets))
            if self.proxy.redact_bodies:
                entry[name] = redact_json(entry[name])
        log.debug("%s %s -> %s in %.0f ms", entry["method"], path, self.status, latency)
        self.proxy._write(entry)

    def _logged_url(self) -> str:
        return redact_url(self._upstream_url())


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def _error_response(status: int, message: str) -> JSONResponse:
    # The shape both SDKs read: Anthropic's {"type": "error", "error": {...}}; OpenAI reads error.message too.
    kind = {408: "timeout_error", 413: "request_too_large", 502: "api_error", 504: "timeout_error"}
    error = {"type": kind.get(status, "api_error"), "message": f"promptcache-nb proxy: {message}"}
    return JSONResponse({"type": "error", "error": error}, status_code=status)


def _provider(path: str) -> str | None:
    path = path.rstrip("/")
    if path.endswith(("/messages", "/messages/count_tokens", "/messages/batches")):
        return "anthropic"
    if path.endswith(("/chat/completions", "/responses", "/completions", "/embeddings")):
        return "openai"
    return None


def _json_or_none(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _json_or_text(data: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return data


def _without_credentials(url: httpx.URL) -> str:
    return str(url.copy_with(username=None, password=None))


# -- content encodings: relay the bytes as sent, decode a copy for the log -----------------------------
DECODABLE = frozenset({"gzip", "x-gzip", "deflate", "identity", *_OPTIONAL})


def _decodable_encodings(value: bytes) -> bytes:
    """An ``Accept-Encoding`` value keeping only the codings this process can decode."""
    kept = []
    for part in value.decode("latin-1").split(","):
        coding = part.split(";", 1)[0].strip().lower()
        if coding in DECODABLE:
            kept.append(part.strip())
    return ", ".join(kept).encode("latin-1") if kept else b"identity"


class _Decoder:
    def __init__(self, coding: str) -> None:
        self.coding = coding
        if coding in ("gzip", "x-gzip", "deflate"):
            self._obj: Any = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, auto-detected
        else:
            self._obj = _OPTIONAL[coding]()
        self._first = True

    def decode(self, data: bytes) -> bytes:
        if self._first and self.coding == "deflate" and data:
            self._first = False
            try:
                return bytes(self._obj.decompress(data))
            except zlib.error:  # "deflate" sent as a raw stream without the zlib header (RFC 9110 allows neither)
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
        if self.coding == "br":
            return bytes(self._obj.process(data))
        return bytes(self._obj.decompress(data))

    def flush(self) -> bytes:
        return self._obj.flush() if hasattr(self._obj, "flush") and self.coding != "br" else b""


class _Recorder:
    """A decoded copy of one response for the log: SSE events as they arrive, or the JSON body (bounded)."""

    def __init__(self, headers: httpx.Headers, *, limit: int) -> None:
        self.streamed = headers.get("content-type", "").lower().startswith("text/event-stream")
        codings = [c.strip().lower() for c in headers.get("content-encoding", "").split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        self._decoder: _Decoder | None = None
        self._readable = len(codings) <= 1 and all(c in DECODABLE for c in codings)
        if codings and self._readable:
            self._decoder = _Decoder(codings[0])
        self._parser = SseParser() if self.streamed else None
        self.events: list[SseEvent] = []
        self._buf = bytearray()
        self._limit = limit

    def feed(self, chunk: bytes) -> None:
        if not self._readable:
            return
        try:
            data = self._decoder.decode(chunk) if self._decoder is not None else chunk
        except Exception:  # noqa: BLE001 - a corrupt copy (zlib.error, brotli.error...) must never break the relay
            self._readable = False
            return
        self._take(data)

    def _take(self, data: bytes) -> None:
        if self._parser is not None:
            self.events.extend(self._parser.feed(data))
        elif len(self._buf) + len(data) <= self._limit:
            self._buf += data
        else:
            self._readable = False  # too large to keep for the log; usage then stays unknown
            self._buf = bytearray()

    def close(self) -> None:
        if self._readable and self._decoder is not None:
            try:
                self._take(self._decoder.flush())
            except Exception:  # noqa: BLE001
                self._readable = False
        if self._parser is not None:
            self.events.extend(self._parser.close())
            self._parser = None

    def json(self) -> Any:
        return _json_or_none(bytes(self._buf)) if self._readable else None
