"""Backends: the in-process simulator, the live Anthropic API, a Messages-compatible simulator endpoint."""

from __future__ import annotations

from ._base import Backend, BackendResponse, DirectSimulator
from .anthropic_backend import AnthropicBackend
from .server import ServedRequest, SimulatorServer

__all__ = [
    "AnthropicBackend", "Backend", "BackendResponse", "DirectSimulator", "ServedRequest", "SimulatorServer",
]
