"""DuckDB store: connection, named migrations, and the typed rows read back from it."""

from __future__ import annotations

from ._db import Delta, KnowledgeEntry, Store, fnv1a
from ._migrations import MIGRATIONS, migrate

__all__ = ["MIGRATIONS", "Delta", "KnowledgeEntry", "Store", "fnv1a", "migrate"]
