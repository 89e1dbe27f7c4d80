"""DuckDB store: connection, named migrations, and the typed rows read back from it."""

from __future__ import annotations

from .._types import Delta, KnowledgeEntry, fnv1a
from ._connection import Tracer
from ._db import Store
from ._doctor import DoctorReport, check_store
from ._interrupts import caused_by_ctrl_c, sigint_deferred
from ._migrations import MIGRATIONS, migrate
from ._queries import UsageMarks
from ._requests import StoredNode

__all__ = ["MIGRATIONS", "Delta", "DoctorReport", "KnowledgeEntry", "Store", "StoredNode", "Tracer", "UsageMarks",
           "caused_by_ctrl_c", "check_store", "fnv1a", "migrate", "sigint_deferred"]
