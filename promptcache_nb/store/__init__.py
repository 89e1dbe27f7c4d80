"""DuckDB store: connection, named migrations, and the typed rows read back from it."""

from __future__ import annotations

from .._types import Delta, KnowledgeEntry, fnv1a
from ._db import Store, StoredNode, Tracer, UsageMarks, caused_by_ctrl_c, sigint_deferred
from ._doctor import DoctorReport, check_store
from ._migrations import MIGRATIONS, migrate

__all__ = ["MIGRATIONS", "Delta", "DoctorReport", "KnowledgeEntry", "Store", "StoredNode", "Tracer", "UsageMarks",
           "caused_by_ctrl_c", "check_store", "fnv1a", "migrate", "sigint_deferred"]
