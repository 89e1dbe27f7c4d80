"""The DuckDB store: one connection per Lab, bind parameters, one transaction per turn.

:class:`Store` is composed of one part per concern, each in its own module of ``store/``: the connection and its
transactions (``_connection.py``), sessions (``_sessions.py``), requests (``_requests.py``), knowledge
(``_knowledge.py``), reads for analysis and rollups (``_queries.py``), datasets and calibrations (``_datasets.py``).
"""

from __future__ import annotations

from ._datasets import _DatasetsMixin
from ._knowledge import _KnowledgeMixin
from ._queries import _QueriesMixin
from ._requests import _RequestsMixin
from ._sessions import _SessionsMixin


class Store(_RequestsMixin, _SessionsMixin, _KnowledgeMixin, _QueriesMixin, _DatasetsMixin):
    """A DuckDB file (or ``:memory:``) holding projects, sessions, turns, blocks and knowledge.

    ``read_only=True`` opens an existing store for reading only: no migration, no write (a transaction
    raises :class:`StoreError`), and a missing file is an error rather than a new store. ``trace`` (e.g.
    ``print``) is called as ``trace(sql, params)`` before each statement the store runs.

    Every SQL statement of the package lives in this class and its parts (``store/``); callers get dict rows or
    typed records.
    """
