"""Imported logs → requests: one reader per agent-log format, and the ingest that stores them as sessions.

Formats: ``claude-code``, ``codex``, ``vcr``, ``har``, ``exchanges`` (the recording proxy's log) and ``otlp``.
"""

from __future__ import annotations

from ._ingest import ImportResult, import_log
from ._registry import READERS, detect
from ._types import ImportedRequest, Reader, ReadProgress, SkippedLine

__all__ = ["READERS", "ImportResult", "ImportedRequest", "ReadProgress", "Reader", "SkippedLine", "detect",
           "import_log"]
