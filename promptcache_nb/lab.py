"""Lab: the workspace of sessions (``workspace.py``) with the writers that import into it (``ingest/``).

:meth:`Lab.import_log`, :meth:`Lab.analyze` and :meth:`Lab.capture` hand the Lab to the ingest, which works on the
:class:`~promptcache_nb.workspace.Workspace` below; a usage-first session is analysed when first opened.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from .ingest import ImportResult, StoredRecords, analyze, import_log, store_records
from .ingest.capture import Capture, capture
from .live import Backend
from .readers import ImportedRequest
from .session import Session
from .workspace import Workspace

__all__ = ["Lab"]


class Lab(Workspace):
    """A DuckDB-backed workspace of sessions. ``pc.Lab()`` (or ``pc.Lab(None)``) is in-memory;
    ``pc.Lab("runs.duckdb")`` a file.

    One Lab per file per process (hard and symbolic links included). A file that is not a promptcache_nb store
    (another application's DuckDB database, SQLite, text) is refused unchanged. ``read_only=True`` opens an
    existing store to read: it never creates or migrates the file, and every write raises StoreError.
    ``trace`` (e.g. ``print``) is called as ``trace(sql, params)`` before each SQL statement the store runs.

    Example:
        >>> import promptcache_nb as pc
        >>> with pc.Lab() as lab:
        ...     s = lab.session(system="You are terse.", project="demo")
        ...     t = s.step("hello", reply="hi")
        >>> t.index
        0
    """

    @staticmethod
    def of(session: Session) -> Lab:
        """The Lab that opened ``session`` (``session.lab``, which a Session knows only as its
        :class:`~promptcache_nb.session.SessionHost`: only a Lab opens sessions)."""
        lab = session.lab
        if not isinstance(lab, Lab):
            raise TypeError(f"session {session.id!r} was opened by {type(lab).__name__}, not a Lab")
        return lab

    def open_session(self, session_id: str, *, backend: Backend | None = None) -> Session:
        """A stored session, to continue it (:meth:`Workspace.open_session
        <promptcache_nb.workspace.Workspace.open_session>`); a usage-first import's session has its bodies analysed
        first (:meth:`analyze`)."""
        if (self.active_session(session_id) is None and self.store.session_row(session_id) is not None
                and session_id in self.store.unanalysed_ids()):  # session_row: a closed store says so
            self.analyze([session_id], progress=False)
        return super().open_session(session_id, backend=backend)

    def import_log(self, paths: str | Path | Sequence[str | Path], *, format: str = "auto",  # noqa: A002
                   project: str | None = None, progress: bool | None = None, workers: int | None = None,
                   account: str | None = None, deep: bool = False) -> ImportResult:
        """Import agent logs (Claude Code, Codex, vcr cassettes, HAR, the proxy's exchanges, OTLP JSON).

        ``paths`` is a file, a directory (walked), a glob or a list. Each session's new requests are stored in
        one transaction with their **measured** usage; importing the same file again adds only what is new.
        Returns a :class:`~promptcache_nb.ImportResult` (``.sessions``, ``.requests``, ``.skipped``).

        **Usage first.** By default each request is stored with what its log says beside its body — ids, times,
        model, measured usage and cost, and the cause of a rebuild when usage alone shows it (a model switch, a
        compaction, an idle gap longer than any entry lives; else ``not_analysed``) — which is all summaries,
        ``pc.rebuilds``, time views and the CLI report need. Bodies, segments, token estimates, the simulated
        cache and prefix diffs are computed for a session the first time something needs them (opening it:
        ``s.turn(k).diff``, the Stepper, ``pc.advise``), or for all at once with :meth:`analyze`. ``deep=True``
        analyses every body as it is stored (the tables are the same as after :meth:`analyze`).

        ``workers=N`` reads and stores file groups (a Claude Code project folder, a session with its sub-agents,
        one file) in N processes, and this process merges them (``ingest/_parallel.py``): the same stored
        result as ``workers=1``, in less wall time when there are several groups. Not given, a usage-first
        import of 64 MB of logs or more in several groups into a store without sessions runs on every idle
        core (one process per core the load average leaves free); a smaller or a deep one, or one into a store
        holding sessions, in this process.

        ``account``: the provider account (organisation / workspace) the logs were served under. The imported
        sessions of one account share one simulated provider cache (per cache model and parameters), as the
        provider's cache is shared: a session can read what another wrote (``pc.rebuilds``' ``read_from_session``).
        A log that names its account (an ``anthropic-organization-id`` response header) keeps its own; otherwise
        ``account``, else one account (``"local"``) for everything you import.

        Example:
            >>> res = lab.import_log("~/.claude/projects/-home-me-billing")  # doctest: +SKIP
            >>> res.summary()  # doctest: +SKIP
        """
        show = self.progress if progress is None else progress
        return import_log(self, paths, format=format, project=project, progress=show, workers=workers,
                          account=account, deep=deep)

    def analyze(self, sessions: Iterable[str] | None = None, *, workers: int = 1,
                progress: bool | None = None) -> int:
        """Analyse the bodies of usage-first imported sessions (all awaiting analysis, or the ids in ``sessions``
        and those that share their log files): the stored tables become exactly what ``import_log(deep=True)``
        of the same files stores. Each session is replaced in one transaction (a kill leaves it usage-first or
        analysed, never half). ``workers=N`` analyses file groups in N processes (as ``import_log(workers=N)``:
        sessions of different groups then do not see each other's simulated cache entries). Returns the number
        of sessions analysed; a progress bar shows the file groups.

        Example:
            >>> lab.import_log("~/.claude/projects")  # doctest: +SKIP
            >>> lab.analyze(workers=2)  # doctest: +SKIP
        """
        show = self.progress if progress is None else progress
        return analyze(self, None if sessions is None else list(sessions), workers=workers, progress=show)

    def store_records(self, records: Sequence[ImportedRequest], *, format: str, file: str  # noqa: A002
                      ) -> StoredRecords:
        """Store requests a reader produced from ``file``, as a usage-first import of that file does, in one
        transaction (``pc.live.OtlpReceiver`` stores each export this way: ``ingest.store_records``)."""
        return store_records(self, records, format=format, file=file)

    def capture(self, client: Any, *, session: Session | None = None, project: str | None = None,
                cache: str | None = None, diagnostics: bool = False) -> AbstractContextManager[Capture]:
        """Store every call ``client`` completes in the ``with`` block (``pc.capture``; docs/howto/ci-gate.md);
        ``diagnostics=True`` asks the provider why each request missed its cache."""
        return capture(client, lab=self, session=session, project=project, cache=cache, diagnostics=diagnostics)
