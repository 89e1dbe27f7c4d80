"""Logs and calls → stored sessions: the writers above the workspace.

:func:`import_log` is the one entry: it reads logs with the readers (``readers/``) and stores them as sessions,
in this process (``_import.py``) or in worker processes by file group (``_parallel.py``, groups: ``_groups.py``),
calibrating the tokenizer at the end; :func:`analyze` analyses the bodies of usage-first sessions; :func:`capture`
stores what an SDK client sends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ImportFormatError, PromptCacheError
from ..readers import READERS
from ..workspace import Workspace
from ._analyze import analyze
from ._groups import expand_paths
from ._import import ImportOptions, ImportResult, SessionList, StoredRecords, import_serial, store_records
from ._parallel import auto_workers, import_parallel
from .capture import capture

__all__ = ["ImportResult", "SessionList", "StoredRecords", "analyze", "capture", "import_log", "store_records"]


def import_log(
    lab: Workspace,
    paths: str | Path | Sequence[str | Path],
    *,
    format: str = "auto",  # noqa: A002 - the public name users type
    project: str | None = None,
    progress: bool = True,
    workers: int | None = None,
    calibrate: bool = True,
    account: str | None = None,
    accounts: Mapping[str, str] | None = None,
    projects: Mapping[str, str] | None = None,
    groups: Sequence[Sequence[str]] | None = None,
    deep: bool = False,
) -> ImportResult:
    """Import agent logs into ``lab``; see :meth:`Lab.import_log <promptcache_nb.Lab.import_log>`. Checks the
    arguments, then imports in this process (``workers=1``: :func:`~._import.import_serial`) or in ``workers``
    processes (:func:`~._parallel.import_parallel`; ``None``: :func:`~._parallel.auto_workers` decides), the other
    arguments passed on as one :class:`~._import.ImportOptions`."""
    if format != "auto" and format not in READERS:
        raise ImportFormatError(str(paths), f"unknown format {format!r}; known: {', '.join(sorted(READERS))}")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise PromptCacheError(f"import_log(workers=...): a number of processes >= 1 (or None: as many as pay), "
                               f"got {workers!r}")
    if account is not None and (not isinstance(account, str) or not account.strip()):
        raise PromptCacheError(f"import_log(account=...): the provider account's name or id, got {account!r}")
    if workers is None:
        # every core for a first usage-first import into a store: not inside a caller's transaction, not the
        # simulated cache a deep import shares between groups, not the owners or groups a caller plans, and not
        # a store that holds sessions already (an import again adds what is new, in this process)
        serial = deep or accounts or projects or groups or lab.store.in_transaction or lab.store.session_ids()
        workers = 1 if serial else auto_workers(paths)
    if workers > 1:
        expand_paths(paths)  # a missing path fails here, in this process, before any worker starts
        # the workers find their own groups, accounts and projects; the writer calibrates (as one process does)
        return import_parallel(lab, paths, ImportOptions(format=format, project=project, progress=progress,
                                                         account=account, deep=deep), workers=workers)
    return import_serial(lab, paths, ImportOptions(
        format=format, project=project, progress=progress, calibrate=calibrate, account=account, accounts=accounts,
        projects=projects, groups=groups, deep=deep))
