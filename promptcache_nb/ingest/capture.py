"""Capture a notebook's own SDK client: ``with lab.capture(client) as cap: ...`` stores every call it makes.

The capture wraps the transport under the client's httpx client (``client._client`` in the ``anthropic`` and
``openai`` SDKs, or an ``httpx.Client`` / ``httpx.AsyncClient`` given directly) and restores it on exit. The
wrapper only watches: the request goes to the original transport unchanged, the response comes back as it
came (its bytes are copied as the SDK reads them), so the SDK's retries, streaming, timeouts and errors behave
exactly as without it.

What is stored, and when:

- A call is stored when its response has been read to its end (a stream's last event, a JSON body's last byte),
  in that moment, through :meth:`Session.record` with the endpoint's usage: ``usage_source`` ``live``, or
  ``simulated`` when the answer came from our simulator endpoint (its ``x-promptcache-simulator`` header), its
  request id (the ``request-id`` / ``x-request-id`` header, else the response's id) and its start time.
- A retried call is one request: each attempt that failed (a 429, a 529, a connection error) is not stored, the
  attempt that succeeded is.
- **A failed call is not stored at all**, never half: an error status, a transport error or timeout, a stream
  the caller closed before its end, a stream that reported an error, a response without usage. Each of those is
  listed in :attr:`Capture.calls` with why.
- Only the Messages, Chat Completions and Responses endpoints are analysed (as the importers read them);
  other calls (``count_tokens``, models, files) are listed as not analysed.
- The request and response bodies are converted by the importers' one implementation
  (:func:`promptcache_nb.readers._http.convert_exchange`, SSE through ``dialects/``); headers are
  never stored, so keys never reach the store. Latency (start to the last byte) is kept per call in
  :attr:`Capture.calls`, not in the store.

Cache diagnostics (``diagnostics=True``, off by default): the one change the capture then makes to a call. Each
Messages request gets a ``diagnostics`` object naming the previous stored response's id (null on the first) and the
``cache-diagnosis-2026-04-07`` beta header (docs/provider_cache_rules.md#anthropic-cache-diagnostics); the body is
otherwise sent, and stored, as the SDK built it. The provider's answer is stored as
``turns.provider_cache_miss_reason``. A request that carries its own ``diagnostics`` is left as it is.

A body the endpoint accepted but our validator would refuse is stored as sent and flagged
(``turns.body_problems``), as an import stores it: the call happened.

Listeners (:func:`on_record`, the session's own: every stored request is announced, a captured one too) are called
after each stored request with its :class:`~promptcache_nb.Turn`; the live monitor widget subscribes there, so it
updates without polling the store.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .._config import SessionConfig
from .._lazy import pandas as pd
from .._redact import redact_url, redact_url_logs
from .._util import SIMULATOR_HEADER
from ..cache import get_cache_model
from ..dialects import get as get_format
from ..dialects import parse_sse, usage_from_sse
from ..errors import PromptCacheError
from ..live._diagnostics import DiagnosticsChain, with_beta
from ..readers._http import HttpExchange, convert_exchange, endpoint_dialect
from ..readers._types import SkippedLine
from ..request import check_request
from ..turn import on_record  # noqa: F401 - re-exported: where a capture's listeners subscribe
from ..usage import UsageSource

if TYPE_CHECKING:  # pragma: no cover

    from promptcache_nb.session import Session
    from promptcache_nb.turn import Turn

    # annotations only (absolute: the runtime import graph has no live -> session edge)
    from promptcache_nb.workspace import Workspace

log = logging.getLogger(__name__)

# One writer at a time: an SDK client used from several threads (or several captures on one Lab) finishes
# calls concurrently, and one session's requests are stored in order.
_RECORD_LOCK = threading.RLock()
# Response headers the converter reads; nothing else of a call's headers is kept anywhere.
_KEPT_RESPONSE_HEADERS = ("content-type", "request-id", "x-request-id", "date", SIMULATOR_HEADER)


@dataclass(frozen=True)
class CapturedCall:
    """One HTTP attempt the capture saw.

    Attributes:
        method: ``POST``. path: the URL path (no query string, no host).
        status: the HTTP status, or None when no response came back (a connection error, a timeout).
        streamed: the response was a server-sent event stream.
        latency_ms: from sending the request to the response's last byte (or to the failure).
        request_id: the endpoint's request id, when it gave one.
        request_index: the stored request's index in :attr:`Capture.session`, or None when not stored.
        reason: why it was not stored (None when it was).
    """

    method: str
    path: str
    status: int | None
    streamed: bool
    latency_ms: float
    request_id: str | None
    request_index: int | None
    reason: str | None

    @property
    def stored(self) -> bool:
        return self.request_index is not None


class Capture:
    """What ``lab.capture(client)`` yields: the session the calls go to, and every attempt seen.

    Attributes:
        session: the :class:`~promptcache_nb.Session` each completed call is recorded into.
        calls: every HTTP attempt seen, stored or not (:class:`CapturedCall`), in the order they finished.
    """

    def __init__(self, session: Session, *, diagnostics: bool = False) -> None:
        self.session = session
        self.calls: list[CapturedCall] = []
        #: asks the provider for its cache diagnosis (``capture(diagnostics=True)``), else None
        self.diagnostics = DiagnosticsChain() if diagnostics else None
        last = session.last_turn
        self._last_at: datetime | None = None if last is None else last.at

    @property
    def stored(self) -> int:
        """How many calls were stored."""
        return sum(c.stored for c in self.calls)

    def df(self) -> pd.DataFrame:
        """One row per attempt seen: method, path, status, streamed, latency_ms, request_id, request_index,
        reason."""
        cols = ["method", "path", "status", "streamed", "latency_ms", "request_id", "request_index", "reason"]
        df = pd.DataFrame([[getattr(c, k) for k in cols] for c in self.calls], columns=cols)
        return df.astype({"status": "Int64", "request_index": "Int64"})  # None stays <NA>, never a float

    def __repr__(self) -> str:
        return f"Capture(session={self.session.id!r}, calls={len(self.calls)}, stored={self.stored})"

    # -- called by the transport wrappers -----------------------------------------------------------------
    def _finished(self, attempt: _Attempt, *, status: int | None, headers: Any, body: bytes | None,
                  error: str | None) -> None:
        latency_ms = (time.perf_counter() - attempt.t0) * 1000.0
        kept = {} if headers is None else {k: v for k in _KEPT_RESPONSE_HEADERS if (v := headers.get(k)) is not None}
        streamed = "text/event-stream" in kept.get("content-type", "")
        request_id = kept.get("request-id") or kept.get("x-request-id")
        index: int | None = None
        reason = error
        turn: Turn | None = None
        if reason is None:
            try:
                turn = self._record(attempt, status, kept, body, round(latency_ms, 1))
                index, request_id = turn.index, turn.request_id
            except _NotStored as exc:
                reason = str(exc)
            except PromptCacheError as exc:  # never raised into the SDK call: listed instead
                reason = f"not stored: {exc}"
                log.warning("capture: %s %s: %s", attempt.method, attempt.path, reason)
            except Exception as exc:  # a bug of ours must not become the user's failed API call either
                reason = f"not stored: {type(exc).__name__}: {exc}"
                log.exception("capture: %s %s: not stored", attempt.method, attempt.path)
        call = CapturedCall(attempt.method, attempt.path, status, streamed, round(latency_ms, 1), request_id,
                            index, reason)
        with _RECORD_LOCK:
            self.calls.append(call)

    def _record(self, attempt: _Attempt, status: int | None, headers: dict[str, str], body: bytes | None,
                latency_ms: float) -> Turn:

        ex = HttpExchange(method=attempt.method, url=attempt.path, status=status, request_body=attempt.body,
                          response_body=body, request_headers={"content-type": "application/json"},
                          response_headers=headers, started_at=attempt.at)
        converted = convert_exchange(ex, file="capture", line=0, source_ref="capture", fallback_at=attempt.at)
        if isinstance(converted, SkippedLine):
            raise _NotStored(converted.reason)
        source: UsageSource = "simulated" if converted.usage.source == "simulated" else "live"
        with _RECORD_LOCK:
            s = self.session
            prev = s.previous_request
            try:
                # lenient, as an import: the endpoint accepted this body, so it is stored as sent and what our
                # validator would refuse is flagged with it
                problems = check_request(converted.body, converted.dialect, lenient=True,
                                         previous=None if prev is None else prev.body)
                prepared = s.prepare(converted.body, previous=prev, dialect=converted.dialect)
            except (ValueError, TypeError, RecursionError) as exc:
                raise _NotStored(f"body not understood: {exc}") from None
            # time only moves forward in a session: a call that started before the last stored one finished
            # (a concurrent call) is stored at that time
            at = attempt.at if self._last_at is None else max(attempt.at, self._last_at)
            turn = s.record(converted.body, at=at, usage=converted.usage, request_id=converted.request_id,
                            reply=converted.reply, prepared=prepared, usage_source=source,
                            body_problems=problems, latency_ms=latency_ms,
                            provider_diagnosis=converted.provider_diagnosis)
            self._last_at = at
            if self.diagnostics is not None and get_format(converted.dialect).cache_diagnostics:
                self.diagnostics.answered(converted.body, converted.response_id)
        return turn


class _NotStored(Exception):
    """Internal: the call completed but is not a request we store; ``args[0]`` says why."""


@dataclass
class _Attempt:
    method: str
    path: str
    body: bytes | None
    at: datetime
    t0: float


def _asking(request: Any, capture: Capture, module: ModuleType) -> Any:
    """``request`` asking for the provider's cache diagnosis when the capture does and it is a Messages call whose
    JSON body does not ask already; else ``request`` itself."""
    chain = capture.diagnostics
    if chain is None:
        return request
    dialect = endpoint_dialect(str(request.method), str(request.url))
    if dialect is None or not get_format(dialect).cache_diagnostics:
        return request
    try:
        body = json.loads(bytes(request.content))
    except Exception:  # a streamed upload, or not JSON: not ours to change
        return request
    if not isinstance(body, dict) or "diagnostics" in body:
        return request
    content = json.dumps(chain.ask(body)).encode()
    headers = module.Headers(request.headers)
    headers["content-length"] = str(len(content))
    headers["anthropic-beta"] = with_beta(headers.get("anthropic-beta"))
    return module.Request(request.method, request.url, headers=headers, content=content,
                          extensions=request.extensions)


def _attempt(request: Any) -> _Attempt | None:
    """What the capture needs of a request, or None for a request it does not look at (its body is a stream)."""
    try:
        body = bytes(request.content)
    except Exception:  # a streamed upload (RequestNotRead): not one of the analysed JSON calls
        body = None
    # the path as shown (calls, df, log records): a key in the client's base_url path is redacted
    return _Attempt(str(request.method), redact_url(str(request.url.path)), body,
                    datetime.now(UTC), time.perf_counter())


#: ``request.extensions`` key of the capture wrapper that records a request
_CLAIM = "promptcache_nb.capture"


def _claimed_by_another(request: Any, wrapper: Any) -> bool:
    """True when another capture's wrapper records ``request``: captures nested on one client wrap each other,
    and the innermost (the first to see the request) claims it, so each call is stored once. A retry that
    re-sends the same request object reaches its claimer again, which records it."""
    return bool(request.extensions.setdefault(_CLAIM, id(wrapper)) != id(wrapper))


# -- transport and stream wrappers, built once per httpx-like module (httpx, or the SDKs' httpx2) ------------
class _TeeMixin:
    """Copies a response stream's bytes as the SDK reads them; reports once, at the end or at close."""

    def _setup(self, inner: Any, capture: Capture, attempt: _Attempt, response: Any, module: ModuleType) -> None:
        self._inner = inner
        self._capture = capture
        self._attempt = attempt
        self._status = response.status_code
        self._headers = response.headers
        self._module = module
        self._chunks: list[bytes] = []
        self._done = False

    def _report(self, *, complete: bool, error: str | None = None) -> None:
        if self._done:
            return
        self._done = True
        raw, self._chunks = b"".join(self._chunks), []
        body = None
        if not 200 <= self._status < 300:
            error = f"HTTP {self._status}"  # an error answer (the SDK may retry it): never a stored request
        elif error is None:
            try:
                # decoded by the same library that negotiated the encoding (gzip, br, zstd...)
                body = self._module.Response(self._status, headers=self._headers, content=raw).content
            except Exception as exc:
                error = f"response body not decoded: {type(exc).__name__}"
            # the OpenAI SDK stops reading a stream at its `[DONE]` event and closes it: complete all the same
            if error is None and not complete and not _stream_complete(self._headers, body):
                error = "response closed before its end"
        headers = self._module.Headers({k: v for k, v in self._headers.items() if k.lower() != "content-encoding"})
        self._capture._finished(self._attempt, status=self._status, headers=headers,
                                body=None if error else body, error=error)


def _stream_complete(headers: Any, body: bytes | None) -> bool:
    """True when an event stream closed early by its reader had already sent its final usage event."""
    if body is None or "text/event-stream" not in headers.get("content-type", ""):
        return False

    return usage_from_sse(parse_sse(body)).complete


class _SyncTee(_TeeMixin):
    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._inner:
                self._chunks.append(chunk)
                yield chunk
        except Exception as exc:
            self._report(complete=False, error=f"{type(exc).__name__} while reading the response")
            raise
        self._report(complete=True)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._report(complete=False)


class _AsyncTee(_TeeMixin):
    async def __aiter__(self) -> Any:
        try:
            async for chunk in self._inner:
                self._chunks.append(chunk)
                yield chunk
        except Exception as exc:
            self._report(complete=False, error=f"{type(exc).__name__} while reading the response")
            raise
        self._report(complete=True)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._report(complete=False)


class _SyncTransport:
    def __init__(self, inner: Any, capture: Capture, module: ModuleType, tee: type) -> None:
        self.inner, self._capture, self._module, self._tee = inner, capture, module, tee

    def handle_request(self, request: Any) -> Any:
        if _claimed_by_another(request, self):
            return self.inner.handle_request(request)
        request = _asking(request, self._capture, self._module)
        attempt = _attempt(request)
        try:
            response = self.inner.handle_request(request)
        except BaseException as exc:
            if attempt is not None:
                self._capture._finished(attempt, status=None, headers=None, body=None, error=type(exc).__name__)
            raise
        return response if attempt is None else _teed(response, attempt, self._capture, self._module, self._tee)

    def close(self) -> None:
        self.inner.close()


class _AsyncTransport:
    def __init__(self, inner: Any, capture: Capture, module: ModuleType, tee: type) -> None:
        self.inner, self._capture, self._module, self._tee = inner, capture, module, tee

    async def handle_async_request(self, request: Any) -> Any:
        if _claimed_by_another(request, self):
            return await self.inner.handle_async_request(request)
        request = _asking(request, self._capture, self._module)
        attempt = _attempt(request)
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException as exc:
            if attempt is not None:
                self._capture._finished(attempt, status=None, headers=None, body=None, error=type(exc).__name__)
            raise
        return response if attempt is None else _teed(response, attempt, self._capture, self._module, self._tee)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _teed(response: Any, attempt: _Attempt, capture: Capture, module: ModuleType, tee_cls: type) -> Any:
    """``response`` with its body copied as the SDK reads it, reported to ``capture`` when it ends (sync and
    async transports alike)."""
    tee = tee_cls()
    tee._setup(response.stream, capture, attempt, response, module)
    if isinstance(response.stream, module.ByteStream):  # all in memory already (a mock transport)
        tee._chunks.append(b"".join(response.stream))
        tee._report(complete=True)
        return response
    response.stream = tee
    return response


_CLASSES: dict[str, tuple[type, type, type, type]] = {}


def _classes(module: ModuleType) -> tuple[type, type, type, type]:
    """The wrapper classes as subclasses of ``module``'s own base classes (the client asserts them)."""
    found = _CLASSES.get(module.__name__)
    if found is None:
        found = _CLASSES[module.__name__] = (
            type("CaptureTransport", (_SyncTransport, module.BaseTransport), {}),
            type("AsyncCaptureTransport", (_AsyncTransport, module.AsyncBaseTransport), {}),
            type("CaptureStream", (_SyncTee, module.SyncByteStream), {}),
            type("AsyncCaptureStream", (_AsyncTee, module.AsyncByteStream), {}),
        )
    return found


def _http_client(client: Any) -> tuple[Any, ModuleType, bool]:
    """(the httpx-like client under ``client``, its module, is it async)."""
    for candidate in (client, getattr(client, "_client", None)):
        if candidate is None:
            continue
        for cls in type(candidate).__mro__:
            if cls.__name__ not in ("Client", "AsyncClient"):
                continue
            module = sys.modules.get(cls.__module__.split(".")[0])
            if module is not None and all(hasattr(module, n) for n in ("BaseTransport", "SyncByteStream")):
                return candidate, module, cls.__name__ == "AsyncClient"
    raise TypeError(f"capture(client): {type(client).__name__} is not an httpx-based client; pass an "
                    f"anthropic.Anthropic / AsyncAnthropic, openai.OpenAI / AsyncOpenAI, or an httpx Client")


def _default_cache(client: Any) -> tuple[str, str]:
    """(cache model, nominal session model) for a client: OpenAI's SDK gets the openai cache model."""
    if type(client).__module__.split(".")[0] == "openai":
        return "openai", "gpt-5"
    return "anthropic", "claude-sonnet-4-5"


def _new_session(lab: Workspace, *, project: str | None, cache: str, model: str, client: Any) -> Session:
    """A session for captured traffic: no strategy (the user's own code built the requests), like an import."""
    get_cache_model(cache)  # a misspelt name fails here, naming the valid ones
    n = lab.store.session_count() + 1
    while lab.store.session_row(sid := f"capture-{n:03d}") is not None:
        n += 1
    return lab.create_session(SessionConfig(start=datetime.now(UTC), cache_scope="session"), session_id=sid,
                              project=project or "capture", model=model, strategy=None, cache=cache,
                              source=f"capture:{type(client).__module__.split('.')[0]}")


@contextmanager
def capture(client: Any, *, lab: Workspace, session: Session | None = None, project: str | None = None,
            cache: str | None = None, diagnostics: bool = False) -> Iterator[Capture]:
    """Store every call ``client`` completes inside the ``with`` block into a session of ``lab``.

    Args:
        client: an ``anthropic.Anthropic`` / ``AsyncAnthropic``, ``openai.OpenAI`` / ``AsyncOpenAI``, or an
            ``httpx`` ``Client`` / ``AsyncClient`` (created before or inside the block; it is unwrapped on exit).
        lab: where the calls are stored.
        session: record into this session (e.g. one a monitor already shows); default: a new session
            ``capture-NNN`` with no strategy.
        project: the new session's project (default ``capture``).
        cache: the new session's cache model, which predicts each measured request (default: ``openai`` for the
            OpenAI SDK, else ``anthropic``).
        diagnostics: ask the provider why each Messages request missed its cache (``diagnostics`` naming the
            previous response, and the beta header); stored as ``turns.provider_cache_miss_reason``. Off by default:
            the capture then changes nothing it forwards.

    Example:
        >>> import anthropic, promptcache_nb as pc
        >>> with pc.Lab() as lab, pc.SimulatorServer() as server:
        ...     client = anthropic.Anthropic(base_url=server.base_url, api_key="sk-ant-local")
        ...     with lab.capture(client) as cap:
        ...         msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=64,
        ...                                      messages=[{"role": "user", "content": "hi"}])
        ...     print(cap.stored, cap.session.turns().usage_source[0])
        1 simulated
    """
    http, module, is_async = _http_client(client)
    if session is None:
        default_cache, model = _default_cache(client)
        session = _new_session(lab, project=project, cache=cache or default_cache, model=model, client=client)
    elif session.lab is not lab:
        raise ValueError(f"capture(session={session.id!r}): that session belongs to another Lab")
    cap = Capture(session, diagnostics=diagnostics)
    # the SDK and its httpx log each request's URL: a key in the client's base_url path is shown redacted there
    redact_url_logs(module.__name__, f"{type(client).__module__.split('.')[0]}._base_client")
    sync_cls, async_cls, sync_tee, async_tee = _classes(module)
    wrapper, tee = (async_cls, async_tee) if is_async else (sync_cls, sync_tee)
    original = http._transport
    mounts = dict(http._mounts)  # a proxy from the environment routes calls through a mounted transport
    http._transport = wrapper(original, cap, module, tee)
    http._mounts = {k: (None if t is None else wrapper(t, cap, module, tee)) for k, t in mounts.items()}
    try:
        yield cap
    finally:
        http._transport = original
        http._mounts = mounts
