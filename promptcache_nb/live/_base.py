"""Where a request goes: the in-process simulator (default) or a Messages endpoint."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..cache import CacheModel, CacheResult
from ..dialects.anthropic import ProviderDiagnosis
from ..request import PreparedRequest
from ..usage import Usage

#: The assistant text when nothing else supplies one (the session's fallback and the simulator endpoint's
#: default reply), so a session through :class:`SimulatorServer` stores the same rows as in-process.
SIMULATED_REPLY = "(simulated reply)"
#: Request header carrying the scenario's clock (ISO-8601 UTC) to a loopback simulator endpoint.
AT_HEADER = "x-promptcache-at"
#: Response header by which a simulator endpoint says its usage is simulated, not measured.
from .._util import SIMULATOR_HEADER as SIMULATOR_HEADER  # noqa: E402 - re-exported: the server sets it, backends read it


@dataclass(frozen=True)
class BackendResponse:
    """What came back for one request.

    ``content`` is the assistant's content blocks when the endpoint produced them (live API), else None
    and the session uses the scripted reply. ``cache_result`` is set when a local cache model decided.
    ``provider_diagnosis`` is the endpoint's own diagnosis of the request's cache prefix, when it was asked for
    and answered (``AnthropicBackend(diagnostics=True)``).
    """

    usage: Usage
    content: list[dict[str, Any]] | None = None
    request_id: str | None = None
    cache_result: CacheResult | None = None
    stop_reason: str | None = None
    provider_diagnosis: ProviderDiagnosis | None = None


class Backend(ABC):
    """Sends a prepared request and reports usage."""

    name: str = "backend"
    #: True when usage comes from an endpoint (``live``), False for simulation.
    measured: bool = False

    @abstractmethod
    def send(self, request: PreparedRequest, *, at: datetime, cache: CacheModel) -> BackendResponse: ...

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections (a no-op for in-process backends)."""


class DirectSimulator(Backend):
    """The default: apply the session's cache model in-process, no HTTP. Fast, for bulk replays."""

    name = "direct"

    def send(self, request: PreparedRequest, *, at: datetime, cache: CacheModel) -> BackendResponse:
        result = cache.process(request, at)
        return BackendResponse(usage=result.usage, cache_result=result)

    def __repr__(self) -> str:
        return "DirectSimulator()"
