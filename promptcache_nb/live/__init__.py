"""Backends: the in-process simulator, the live Anthropic API, a simulator endpoint, a recording proxy, and an
OpenTelemetry receiver."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._base import Backend, BackendResponse, DirectSimulator
from ._count import TokenCount, count_tokens
from .server import ServedRequest, SimulatorServer

if TYPE_CHECKING:  # the names loaded on first use (__getattr__), as type checkers see them
    from .anthropic_backend import AnthropicBackend
    from .otel import OtlpBatch, OtlpReceiver
    from .proxy import RecordingProxy


def __getattr__(name: str) -> object:
    # Loaded when first asked for, not with the package (the module's own imports are heavy):
    if name == "AnthropicBackend":
        from .anthropic_backend import AnthropicBackend  # the anthropic SDK: ~1.5 s

        return AnthropicBackend
    if name == "RecordingProxy":
        from .proxy import RecordingProxy  # starlette, uvicorn and httpx

        return RecordingProxy
    if name in ("OtlpBatch", "OtlpFollower", "OtlpReceiver"):
        from . import otel  # starlette, uvicorn and the ingest

        return getattr(otel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



def __dir__() -> list[str]:
    return sorted(__all__)  # the public names, the lazily loaded ones included (Tab completion)


__all__ = [
    "AnthropicBackend", "Backend", "BackendResponse", "DirectSimulator", "OtlpBatch", "OtlpFollower", "OtlpReceiver",
    "RecordingProxy",
    "ServedRequest",
    "SimulatorServer", "TokenCount", "count_tokens",
]
