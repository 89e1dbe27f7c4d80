"""Backends: the in-process simulator, the live Anthropic API, a simulator endpoint, a recording proxy, and an
OpenTelemetry receiver."""

from __future__ import annotations

from ._base import Backend, BackendResponse, DirectSimulator
from ._count import TokenCount, count_tokens
from .server import ServedRequest, SimulatorServer


def __getattr__(name: str) -> object:
    # The anthropic SDK takes ~1.5 s to import: load it only when a live backend is asked for.
    if name == "AnthropicBackend":
        from .anthropic_backend import AnthropicBackend

        return AnthropicBackend
    if name == "RecordingProxy":  # imports starlette, uvicorn and httpx: only when a proxy is asked for
        from .proxy import RecordingProxy

        return RecordingProxy
    if name in ("OtlpBatch", "OtlpReceiver"):  # starlette, uvicorn and the ingest: only when a receiver is asked for
        from . import otel

        return getattr(otel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



def __dir__() -> list[str]:
    return sorted(__all__)  # the public names, the lazily loaded ones included (Tab completion)


__all__ = [
    "AnthropicBackend", "Backend", "BackendResponse", "DirectSimulator", "OtlpBatch", "OtlpReceiver", "RecordingProxy",
    "ServedRequest",
    "SimulatorServer", "TokenCount", "count_tokens",
]
