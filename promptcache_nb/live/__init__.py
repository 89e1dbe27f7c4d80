"""Backends: the in-process simulator, the live Anthropic API, and a Messages-compatible simulator endpoint."""

from __future__ import annotations

from ._base import Backend, BackendResponse, DirectSimulator

__all__ = ["Backend", "BackendResponse", "DirectSimulator"]
