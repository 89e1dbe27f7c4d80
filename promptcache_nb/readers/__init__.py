"""Imported logs → requests: one reader per agent-log format (the ingest that stores them as sessions: ``ingest/``).

Formats: ``claude-code``, ``codex``, ``vcr``, ``har``, ``exchanges`` (the recording proxy's log), ``otlp``,
``pi`` (pi and oh-my-pi), ``openclaw``, ``gemini-cli``, ``opencode`` and ``cline`` (Cline and Roo Code).
:func:`agent_log_places` says where each agent writes them.
"""

from __future__ import annotations

from ._locations import agent_log_places
from ._registry import READERS, detect
from ._types import ImportedRequest, Reader, ReadProgress, SkippedLine

__all__ = ["READERS", "ImportedRequest", "ReadProgress", "Reader", "SkippedLine", "agent_log_places", "detect"]
