"""Serve an ASGI app with uvicorn on a daemon thread: the one HTTP stack of the simulator and the proxy.

What it adds to uvicorn, and why:

* the socket is bound in :meth:`ServerThread.start` (the caller's thread), so a port in use raises
  ``OSError`` there instead of ``SystemExit`` inside the server thread, and ``port=0`` is known at once;
* a deadline on request headers (uvicorn's h11 protocol has none: a client that opens a connection and
  trickles a header line every few seconds would hold it forever). The body has its own deadline in
  :func:`read_body`, which also enforces the size limit while reading, never after;
* uvicorn's own logging, access log, signal handlers and ``server``/``date`` headers are off: the apps
  log what they choose (never headers, which carry keys), and a proxy relays the upstream's headers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount
from uvicorn.protocols.http.h11_impl import H11Protocol

from .._redact import redact_url_logs
from .._util import is_loopback as is_loopback  # re-exported for the server and the proxy

log = logging.getLogger("promptcache_nb.http")

#: Default request body limit of the simulator and the proxy (requests above it get 413).
MAX_BODY_BYTES = 32 * 1024 * 1024
#: Default seconds a client has to send a request's headers, and, separately, its body.
REQUEST_TIMEOUT = 30.0
#: How far past the limit a declared body is still read (and dropped) so its client gets a clean 413; a bigger
#: one is refused at once and its connection closed.
DRAIN_BYTES = 64 * 1024 * 1024


class BodyError(Exception):
    """A request body that cannot be read: too large (413), too slow (408), or the client left (499)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_body(request: Request, *, limit: int, timeout: float) -> bytes:
    """The whole request body, refusing more than ``limit`` bytes (declared or sent) and slow senders."""
    declared = request.headers.get("content-length")
    # h11 has already refused a Content-Length that is not a non-negative integer (400)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        if int(declared) <= limit + DRAIN_BYTES:
            # Read a modestly oversized body to its end, discarding it, before the 413: answering mid-upload
            # and closing makes the client's kernel reset the connection, so it sees a reset, not the 413.
            await _discard(request, timeout)
        raise BodyError(413, f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BodyError(413, f"request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyError(408, f"request body not received within {timeout:g} s") from None
    except ClientDisconnect:
        raise BodyError(499, "client closed the connection while sending the body") from None
    return b"".join(chunks)


#: What a responder answers: status, headers, and a body (bytes) or a stream's events, in order.
Answer = tuple[int, dict[str, str], bytes | list[bytes]]


class ResponderLimits(Protocol):
    """The limits of a server that answers through :func:`responder_app`, read at each request (they may change
    while it serves)."""

    max_body_bytes: int
    request_timeout: float
    stream_delay: float  # seconds between two streamed events


def responder_app(respond: Callable[[str, str, dict[str, str], bytes, tuple[int, str] | None], Answer],
                  limits: ResponderLimits) -> Starlette:
    """An ASGI app that reads each request's body within ``limits`` and answers with ``respond(method, path,
    headers, body, refused)`` run on a worker thread (so the event loop keeps serving), where ``refused`` is the
    (status, message) of a body that could not be read; a list body is streamed, one event at a time."""

    async def drip(events: list[bytes]) -> Any:
        for i, event in enumerate(events):
            if i and limits.stream_delay:
                await anyio.sleep(limits.stream_delay)
            yield event

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        path = scope.get("raw_path", b"").decode("latin-1") or request.url.path
        headers = dict(request.headers.items())
        refused = None
        try:
            body = await read_body(request, limit=limits.max_body_bytes, timeout=limits.request_timeout)
        except BodyError as exc:
            if exc.status == 499:
                return  # the client left; nobody to answer
            body, refused = b"", (exc.status, exc.message)
        status, out_headers, payload = await anyio.to_thread.run_sync(
            respond, request.method, path, headers, body, refused)
        if refused is not None:
            out_headers["connection"] = "close"  # the unread rest of the body is still on the wire
        response: Response
        if isinstance(payload, list):
            response = StreamingResponse(drip(payload), status_code=status, headers=out_headers)
        else:
            response = Response(payload, status_code=status, headers=out_headers)
        await response(scope, receive, send)

    return Starlette(routes=[Mount("/", app=endpoint)])


async def _discard(request: Request, timeout: float) -> None:
    """Read and drop a body (bounded by the caller's size check and ``timeout``); errors just end it."""
    try:
        with anyio.fail_after(timeout):
            async for _ in request.stream():
                pass
    except (TimeoutError, ClientDisconnect):
        pass




def url_host(host: str) -> str:
    """A host as it appears in a URL (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _protocol_with_header_deadline(seconds: float) -> type[H11Protocol]:
    class _Protocol(H11Protocol):
        # Close a connection whose next request's headers have not fully arrived `seconds` after it opened or
        # after its previous response completed (the keep-alive timer stops at the first byte of a request).
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(seconds, self._expire, self.cycle)

        def _expire(self, cycle: Any) -> None:
            waiting = self.cycle is cycle and (cycle is None or cycle.response_complete)
            if waiting and not self.transport.is_closing():
                log.debug("closing a connection whose request headers did not arrive within %g s", seconds)
                self.transport.close()

    return _Protocol


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ServerThread:
    """One uvicorn server for ``app`` on a daemon thread. Not reusable after :meth:`stop`."""

    def __init__(self, app: Any, *, host: str, port: int, name: str,
                 header_timeout: float = REQUEST_TIMEOUT, graceful_seconds: int = 2) -> None:
        self._sock = _bind(host, port)
        redact_url_logs("uvicorn.access", "uvicorn.error")  # they name request paths: a key in one stays there
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app, http=_protocol_with_header_deadline(header_timeout), lifespan="on", log_config=None,
            access_log=False, server_header=False, date_header=False, proxy_headers=False,
            timeout_graceful_shutdown=graceful_seconds, ws="none",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._failure: BaseException | None = None

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported to start(); a daemon thread has no caller
            self._failure = exc

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                self._sock.close()
                raise RuntimeError(f"the HTTP server did not start: {self._failure!r}")
            time.sleep(0.005)

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout=timeout)
        self._sock.close()
