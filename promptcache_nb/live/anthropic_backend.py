"""Send a session's requests through the official ``anthropic`` SDK: the real API or a simulator endpoint.

One code path for both: the body a strategy built goes unchanged to ``client.messages.create``; the
response's ``usage`` is what the store keeps (measured, ``source="live"``), with its ``request-id`` and
the assistant's content blocks. The session's local cache model runs beside it as a *prediction*, so a
notebook can put predicted and measured figures side by side (``cache_detail.predicted_usage``).

Keys never pass through promptcache_nb: the SDK reads ``ANTHROPIC_API_KEY`` (or the client was built
with one); the session stores nothing of the client; ``repr`` shows only the endpoint.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import replace
from datetime import datetime
from typing import Any

import anthropic

from .._redact import redact_url, scrub, url_secrets
from .._util import is_loopback
from ..cache import CacheModel, CacheResult
from ..dialects import usage_from_anthropic
from ..dialects.anthropic import read_diagnosis
from ..errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    InvalidRequestError,
    OverloadedError,
    RateLimitError,
)
from ..request import PreparedRequest
from ._base import AT_HEADER, SIMULATOR_HEADER, Backend, BackendResponse
from ._diagnostics import DiagnosticsChain, with_beta

#: Messages fields that shape the output, not the input: left out of a ``count_tokens`` call.
_NOT_INPUT = frozenset({"max_tokens", "stream", "temperature", "top_p", "top_k", "stop_sequences", "metadata",
                        "service_tier", "inference_geo", "diagnostics"})

PREDICTED_FIELDS = (
    "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens",
)


class AnthropicBackend(Backend):
    """A backend that calls a Messages endpoint with the ``anthropic`` SDK's synchronous client.

    Args:
        client: an ``anthropic.Anthropic``; default ``anthropic.Anthropic()``, which reads
            ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``. Retries follow the client's
            ``max_retries``; a retried request is stored once, after it succeeds.
        predict: keep the session's cache model's figures for each request as the turn's
            ``cache_result`` (reason, segment states, ``cache_detail.predicted_usage``). The stored usage is
            always the endpoint's.
        stream: use ``client.messages.stream`` (SSE) instead of one JSON response — needed for very
            large ``max_tokens``; usage and content are the same.
        virtual_clock: send the scenario's time in the ``x-promptcache-at`` header so a
            :class:`~promptcache_nb.live.SimulatorServer` reproduces TTLs. Default: only when the client's
            ``base_url`` is a loopback address (the real API has no use for it).
        diagnostics: ask the endpoint why each request missed its cache: every request carries
            ``diagnostics.previous_message_id`` (the previous response's id; null on the first) and the
            ``cache-diagnosis-2026-04-07`` beta header, and the answer is stored as
            ``turns.provider_cache_miss_reason`` (docs/provider_cache_rules.md#anthropic-cache-diagnostics). The
            stored body stays the one the strategy built. One backend per session: its requests are one
            conversation.

    Example:
        >>> import anthropic, promptcache_nb as pc
        >>> with pc.SimulatorServer() as server, pc.Lab() as lab:
        ...     client = anthropic.Anthropic(base_url=server.base_url, api_key="sk-ant-local")
        ...     s = lab.session(backend=pc.AnthropicBackend(client))
        ...     t = s.step("hello", reply="hi")
        ...     client.close()
        >>> t.request_id
        'req_sim_000001'
    """

    name = "anthropic"
    measured = True

    def __init__(
        self,
        client: anthropic.Anthropic | None = None,
        *,
        predict: bool = True,
        stream: bool = False,
        virtual_clock: bool | None = None,
        diagnostics: bool = False,
    ) -> None:
        if isinstance(client, anthropic.AsyncAnthropic):
            raise TypeError(
                "AnthropicBackend needs the synchronous client: pass anthropic.Anthropic(...), not "
                "AsyncAnthropic (sessions send one request at a time)"
            )
        self._owns_client = client is None
        self._client = client if client is not None else anthropic.Anthropic()
        self.predict = predict
        self.stream = stream
        if virtual_clock is None:
            virtual_clock = is_loopback(self._client.base_url.host)
        self.virtual_clock = virtual_clock
        self.diagnostics = diagnostics
        self._chain = DiagnosticsChain() if diagnostics else None
        self._known = frozenset(inspect.signature(self._client.messages.create).parameters) - {"stream"}

    @property
    def base_url(self) -> str:
        """The endpoint as shown: no credentials, a key in its path or query redacted."""
        return redact_url(str(self._client.base_url)).rstrip("/")

    def __repr__(self) -> str:
        more = ", diagnostics=True" if self.diagnostics else ""
        return f"AnthropicBackend(base_url={self.base_url!r}, predict={self.predict}, stream={self.stream}{more})"

    def close(self) -> None:
        """Close the HTTP client if this backend created it (a client you passed stays yours)."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> AnthropicBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sending ------------------------------------------------------------------------------
    def send(self, request: PreparedRequest, *, at: datetime, cache: CacheModel) -> BackendResponse:
        body = request.body if self._chain is None else self._chain.ask(request.body)
        kwargs = {k: v for k, v in body.items() if k in self._known}
        extra = {k: v for k, v in body.items() if k not in self._known and k != "stream"}
        if extra:
            kwargs["extra_body"] = extra
        headers_out: dict[str, str] = {}
        if self.virtual_clock:
            headers_out[AT_HEADER] = at.isoformat()
        if self._chain is not None:
            given = self._client.default_headers.get("anthropic-beta")
            headers_out["anthropic-beta"] = with_beta(given if isinstance(given, str) else None)
        if headers_out:
            kwargs["extra_headers"] = headers_out
        try:
            message, headers = self._call(kwargs)
        except anthropic.APIStatusError as exc:
            raise self._status_error(exc) from None
        except anthropic.APIConnectionError as exc:
            raise APIConnectionError(f"{self.base_url}: {self._redact(str(exc))}") from None
        except anthropic.AnthropicError as exc:  # e.g. no key configured
            raise APIError(self._redact(str(exc)), error_type="client_error") from None
        except TypeError as exc:
            # the SDK raises a bare multi-line TypeError when it finds no credentials: say it in one line
            if "authentication method" not in str(exc):
                raise
            raise AuthenticationError(
                "no API key: ANTHROPIC_API_KEY is not set and the client was given no api_key") from None
        simulated = headers.get(SIMULATOR_HEADER) is not None
        usage = usage_from_anthropic(message.usage, source="simulated" if simulated else "live")
        content = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
        diagnosis = None
        if self._chain is not None:
            self._chain.answered(body, message.id)
            found: Any = getattr(message, "diagnostics", None)  # an SDK older than 2.14 keeps it as an extra field
            if hasattr(found, "model_dump"):
                found = found.model_dump(mode="json")
            diagnosis = read_diagnosis(body, found)
        # Predict only after the endpoint accepted the request: the local cache model then holds exactly
        # the requests the store holds, even when a send fails.
        prediction = self._predict(request, at, cache)
        return BackendResponse(
            usage=usage, content=content, request_id=headers.get("request-id") or message._request_id,
            cache_result=prediction if self.predict else None, stop_reason=message.stop_reason,
            provider_diagnosis=diagnosis,
        )

    def _call(self, kwargs: dict[str, Any]) -> tuple[Any, Any]:
        if self.virtual_clock:
            # A local endpoint (the simulator, `promptcache-nb serve`) replays a scenario's model on purpose:
            # the SDK's "model is deprecated" warning on every call says nothing about it.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r"The model '.*' is deprecated",
                                        category=DeprecationWarning)
                return self._send(kwargs)
        return self._send(kwargs)

    def _send(self, kwargs: dict[str, Any]) -> tuple[Any, Any]:
        messages = self._client.messages
        if self.stream:
            with messages.stream(**kwargs) as stream:
                message = stream.get_final_message()
                return message, stream.response.headers
        raw = messages.with_raw_response.create(**kwargs)
        return raw.parse(), raw.headers

    def count_tokens(self, body: dict[str, Any]) -> tuple[int, bool]:
        """``POST /v1/messages/count_tokens`` for a Messages ``body`` (free, with its own rate limit):
        ``(input tokens, answered by a simulator endpoint)``. Fields that do not change the input
        (``max_tokens``, sampling, ``stream``...) are left out; fields the SDK does not know go in ``extra_body``.
        """
        messages = self._client.messages
        accepted = frozenset(inspect.signature(messages.count_tokens).parameters)
        kwargs: dict[str, Any] = {k: v for k, v in body.items() if k in accepted}
        extra = {k: v for k, v in body.items()
                 if k not in accepted and k not in self._known and k not in _NOT_INPUT}
        if extra:
            kwargs["extra_body"] = extra
        try:
            with warnings.catch_warnings():
                if self.virtual_clock:  # a local endpoint replays old models on purpose (see _call)
                    warnings.filterwarnings("ignore", message=r"The model '.*' is deprecated",
                                            category=DeprecationWarning)
                raw = messages.with_raw_response.count_tokens(**kwargs)
        except anthropic.APIStatusError as exc:
            raise self._status_error(exc) from None
        except anthropic.APIConnectionError as exc:
            raise APIConnectionError(f"{self.base_url}: {self._redact(str(exc))}") from None
        except anthropic.AnthropicError as exc:  # e.g. no key configured
            raise APIError(self._redact(str(exc)), error_type="client_error") from None
        return int(raw.parse().input_tokens), raw.headers.get(SIMULATOR_HEADER) is not None

    @staticmethod
    def _predict(request: PreparedRequest, at: datetime, cache: CacheModel) -> CacheResult | None:
        try:
            result = cache.process(request, at)
        except InvalidRequestError:
            return None  # the endpoint accepted what the model would refuse; nothing to predict
        predicted = {f: getattr(result.usage, f) for f in PREDICTED_FIELDS}
        return replace(result, detail={**result.detail, "predicted_usage": predicted})

    def _status_error(self, exc: anthropic.APIStatusError) -> APIError:
        message = self._redact(exc.api_message or exc.message)
        rid = exc.request_id
        status = exc.status_code
        if status == 400:
            return InvalidRequestError(message, request_id=rid)
        if status == 401:
            return AuthenticationError(message, request_id=rid)
        if status == 429:
            return RateLimitError(message, retry_after=_retry_after(exc.response.headers), request_id=rid)
        if status == 529 or exc.type == "overloaded_error":
            return OverloadedError(message, request_id=rid)
        return APIError(message, status_code=status, error_type=exc.type or "api_error", request_id=rid)

    def _redact(self, text: str) -> str:
        # Endpoints do not echo keys, but a proxy or a misconfigured base_url might: never pass one on.
        secrets = [s for s in (getattr(self._client, "api_key", None), getattr(self._client, "auth_token", None))
                   if s]
        return scrub(text, [*secrets, *url_secrets(str(self._client.base_url))])


def _retry_after(headers: Any) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) * scale
            except ValueError:
                continue
    return None


