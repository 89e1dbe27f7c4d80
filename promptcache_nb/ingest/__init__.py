"""Logs and calls → stored sessions: the writers above the Lab.

:func:`import_log` reads logs with the readers (``importers/``) and stores them as sessions of a Lab, serially or
in worker processes (``_parallel.py``, by file groups: ``_groups.py``), calibrating the tokenizer at import;
:func:`analyze` analyses the bodies of usage-first sessions; :func:`capture` stores what an SDK client sends.
"""

from __future__ import annotations

from ._analyze import analyze
from ._import import ImportResult, SessionList, import_log
from .capture import capture

__all__ = ["ImportResult", "SessionList", "analyze", "capture", "import_log"]
