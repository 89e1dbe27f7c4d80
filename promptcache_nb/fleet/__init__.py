"""A team's fleet: import many logs on many processes or machines into a Parquet dataset, and read it back as a Lab.

    >>> import promptcache_nb as pc                                  # doctest: +SKIP
    >>> from concurrent.futures import ProcessPoolExecutor
    >>> with ProcessPoolExecutor(2) as ex:
    ...     pc.fleet.import_logs("~/.claude/projects", out="fleet/", executor=ex)
    >>> lab = pc.fleet.open("fleet/")                                # read-only: sql, summary, rebuilds, advice
    >>> lab.sql("SELECT count(*) FROM turns")

On a Dask cluster: ``executor=distributed.Client("tcp://scheduler:8786").get_executor()`` (``pip install
'promptcache_nb[dask]'``). The dataset is plain Parquet (``store/_parquet.py`` has the layout): DuckDB, pandas,
Dask and Spark read it as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..ingest._groups import FileGroup, plan_groups
from ..lab import Lab
from ..store import Store
from ._example import example_fleet
from ._import import FleetImport, GroupReport, check_dataset, import_group, import_logs

__all__ = ["FileGroup", "FleetImport", "GroupReport", "check_dataset", "example_fleet", "import_group",
           "import_logs", "open", "plan_groups"]


def open(out: str | Path, *, progress: bool = True) -> Lab:  # noqa: A001 - pc.fleet.open mirrors the builtin's role
    """A read-only Lab over the Parquet dataset ``out`` wrote by :func:`import_logs`: its tables are DuckDB views
    over the files, so every read API works (``lab.sql``, sessions, turns, ``pc.rebuilds``, ``pc.advise``...)
    and every write raises StoreError."""

    path = os.fspath(out)
    return Lab.over_store(Store.open_dataset(path if "://" in path else os.path.abspath(path)), progress=progress)
