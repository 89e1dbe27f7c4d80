"""Imported logs → requests: one reader per agent-log format, and the ingest that stores them as sessions.

Formats: ``claude-code``, ``codex``, ``vcr``, ``har``, ``exchanges`` (the recording proxy's log), ``otlp``,
``pi`` (pi and oh-my-pi), ``openclaw``, ``gemini-cli``, ``opencode`` and ``cline`` (Cline and Roo Code).
:func:`agent_log_places` says where each agent writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._locations import agent_log_places
from ._registry import READERS, detect
from ._types import ImportedRequest, Reader, ReadProgress, SkippedLine

if TYPE_CHECKING:
    from ._analyze import analyze
    from ._ingest import ImportResult, SessionList, StoredRecords, import_log, store_records


def __getattr__(name: str) -> Any:
    # The ingest stores requests through a Lab's sessions (analysis, cache models, session): it is loaded on
    # first use, so the readers — and the recording proxy, which reuses the SSE parser — stay below the store.
    if name in ("ImportResult", "SessionList", "StoredRecords", "import_log", "store_records"):
        from . import _ingest

        return getattr(_ingest, name)
    if name == "analyze":  # the deep analysis of usage-first sessions, above the ingest too
        from . import _analyze

        return _analyze.analyze
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



def __dir__() -> list[str]:
    return sorted(__all__)  # the public names, the lazily loaded ones included (Tab completion)


__all__ = ["READERS", "ImportResult", "ImportedRequest", "ReadProgress", "Reader", "SessionList", "SkippedLine",
           "StoredRecords", "agent_log_places", "analyze", "detect", "import_log", "store_records"]
