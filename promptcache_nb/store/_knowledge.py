"""Knowledge entries: every version stored, the latest one read."""

from __future__ import annotations

from collections.abc import Sequence

from .._types import KnowledgeEntry
from ._connection import _Connection


class _KnowledgeMixin(_Connection):
    """A project's knowledge entries (:class:`~promptcache_nb.store.Store`)."""

    # -- knowledge ----------------------------------------------------------------------------
    def knowledge(self, project_id: str, *, include_deleted: bool = False) -> list[KnowledgeEntry]:
        """The latest version of each entry of a project, ordered by id."""
        rows = self.rows(
            """SELECT id, project_id, version, title, content, category, deleted, updated_at, key
               FROM knowledge WHERE project_id = ?
               QUALIFY row_number() OVER (PARTITION BY id ORDER BY version DESC) = 1
               ORDER BY id""",
            [project_id],
        )
        entries = [KnowledgeEntry(*r) for r in rows]
        return entries if include_deleted else [e for e in entries if not e.deleted]

    def knowledge_entry(self, entry_id: str) -> KnowledgeEntry | None:
        row = self.one(
            """SELECT id, project_id, version, title, content, category, deleted, updated_at, key
               FROM knowledge WHERE id = ? ORDER BY version DESC LIMIT 1""",
            [entry_id],
        )
        return KnowledgeEntry(*row) if row else None

    def knowledge_count(self, project_id: str) -> int:
        """How many entries a project ever had (removed ones included): a scan, read once per project (entry
        ids number them)."""
        return int(self.scalar("SELECT count(DISTINCT id) FROM knowledge WHERE project_id = ?", [project_id]))

    def write_knowledge(self, entries: Sequence[KnowledgeEntry]) -> None:
        """Insert entry versions (inside the caller's transaction; in bulk through the appender when many).
        Written at once, also inside :meth:`batch`: the session reads an entry back before its next request."""
        self._insert_now("knowledge", [(e.id, e.project_id, e.version, e.key, e.title, e.content, e.category,
                                        e.deleted, e.updated_at) for e in entries])
