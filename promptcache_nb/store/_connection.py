"""The store's connection: opening a file (refusing what is not a store, migrating), transactions and
batches, the statement tracer, and the plain reads every part of :class:`~promptcache_nb.store.Store` runs through."""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import duckdb

from .._lazy import numpy as np
from .._util import file_kind
from ..errors import StoreError, StoreLockedError
from ._interrupts import _interrupted, interruptible, sigint_deferred
from ._migrations import MIGRATIONS, applied, migrate, rollback_if_active
from ._schema import CORE_TABLES, damaged, schema_problems

if TYPE_CHECKING:  # pandas loads on the first DataFrame (duckdb's .df() imports it): not with the package
    import pandas as pd


BLOCK_SIZE = 16_384
# the holder ("/usr/bin/python3 (PID 123)"), without DuckDB's advice for its own CLI that may follow it
_LOCK = re.compile(r"Conflicting lock is held in (.+?)(?:\.\s*(?:However|See also)|$)", re.S)


# Stores open in this process, by file identity. DuckDB lets one process open a file twice, but two Stores
# would each keep their own dedup sets (and two hard-linked names get two WAL files: one overwrites the
# other's turns); the second open is refused like another process's lock. Keys: ("inode", st_dev, st_ino)
# once the file exists, and ("path", resolved path) (a file not created yet, or recreated under the same name).
_OPEN: weakref.WeakValueDictionary[tuple[Any, ...], _Connection] = weakref.WeakValueDictionary()


def _file_keys(path: str) -> list[tuple[Any, ...]]:
    keys: list[tuple[Any, ...]] = [("path", _resolved(path))]
    try:
        st = os.stat(path)
    except OSError:
        return keys
    return [("inode", st.st_dev, st.st_ino), *keys]


def _resolved(path: str) -> str:
    """``path`` made absolute with its links followed; a symlink loop refused in one line naming it (pathlib
    raises RuntimeError for one before Python 3.13, OSError ELOOP after)."""
    try:
        return str(Path(path).resolve())
    except (RuntimeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise StoreError(f"cannot open store {path!r}: {exc.strerror or exc}") from None
        raise StoreError(f"cannot open store {path!r}: it is a symlink loop (a link that leads back to itself); "
                         "point it at a .duckdb file or remove it") from None


def _sql_text(text: str) -> str:
    """``text`` as an SQL string literal (for statements that take no bind parameters: ATTACH, COPY)."""
    return "'" + text.replace("'", "''") + "'"


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


#: Rows per ``append_rows`` call. DuckDB's appender neither checks for Ctrl-C nor honours ``con.interrupt()``;
#: between calls Python runs, so a Ctrl-C during a long bulk write stops it within one slice (a few ms).
APPEND_SLICE = 1024
#: From this many rows an append is one INSERT over the rows' columns (:func:`_insert_columns`): DuckDB converts a
#: column of Python values about three times faster than its appender converts them row by row (a usage-first
#: import writes ~30,000 rows of ``turns``' 50 columns at once); fewer rows do not pay for loading numpy.
COLUMNS_FROM = 4096


def _append(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Append ``rows`` (tuples in the table's column order) to ``table``: through DuckDB's appender, a slice at a
    time (:data:`APPEND_SLICE`), or by columns from :data:`COLUMNS_FROM` rows."""
    if len(rows) >= COLUMNS_FROM:
        _insert_columns(con, table, rows)
        return
    with con.appender(table) as ap:
        for i in range(0, len(rows), APPEND_SLICE):
            ap.append_rows(rows[i:i + APPEND_SLICE])


def _insert_columns(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """One ``INSERT`` of ``rows`` from a numpy array of Python objects per column: each value is converted to
    its column's type as the appender would (a test compares every column of both ways); an INSERT, unlike the
    appender, stops on Ctrl-C."""
    n = len(rows)
    # object arrays hold the values themselves (np.array would turn equal-length tuples into a 2-D array)
    columns = {f"c{i}": np.fromiter(col, dtype=object, count=n) for i, col in enumerate(zip(*rows, strict=True))}
    name = "_pcnb_rows"
    con.register(name, columns)
    try:
        con.execute(f'INSERT INTO "{table}" SELECT * FROM {name}').fetchall()
    finally:
        con.unregister(name)


def _describe_header(head: bytes) -> str:
    if head.startswith(b"SQLite format 3\x00"):
        return "an SQLite database"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "a binary file of another kind"
    return "a text file"


def _check_file(path: str, *, read_only: bool) -> None:
    """Refuse what is not a DuckDB file before DuckDB sees it: DuckDB would try to load an extension for an
    SQLite file (a download), and its own errors are several lines long."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if read_only:
            raise StoreError(f"no store at {path!r}: the file does not exist (a read-only open never creates "
                             "one); check the path") from None
        return
    except OSError as exc:
        raise StoreError(f"cannot open store {path!r}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise StoreError(f"cannot open store {path!r}: it is a directory; pass a file path such as runs.duckdb")
    if not stat.S_ISREG(st.st_mode):  # opening a FIFO blocks until a writer comes; a device reads forever
        raise StoreError(f"cannot open store {path!r}: it is {file_kind(st.st_mode)}, not a regular file; "
                         "pass the path of a .duckdb file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise StoreError(f"cannot open store {path!r}: {exc.strerror}") from None
    if not head:
        raise StoreError(f"store {path!r} is an empty file, not a DuckDB database; delete it or choose another path")
    if head[8:12] != b"DUCK":  # DuckDB's main header: an 8-byte checksum, then the magic bytes
        raise StoreError(f"store {path!r} is not a DuckDB database (it looks like {_describe_header(head)}); "
                         "nothing was changed: choose another path")


def _foreign_objects(con: duckdb.DuckDBPyConnection, path: str) -> list[str] | None:
    """None when the database is a promptcache_nb store or empty; else the names of what it holds."""
    tables = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND NOT temporary ORDER BY ALL").fetchall()
    views = con.execute(
        "SELECT schema_name, view_name FROM duckdb_views() WHERE database_name = current_database() "
        "AND NOT internal AND NOT temporary ORDER BY ALL").fetchall()
    names = [n if s == "main" else f"{s}.{n}" for s, n in tables + views]
    if "_migrations" in names:
        ours = con.execute("SELECT count(*) FROM _migrations WHERE name = 'm001_initial'").fetchall()[0][0]
        if ours:
            return None
    if CORE_TABLES <= set(names):  # our tables with their record of migrations gone: tampered, not foreign
        raise StoreError(damaged(path, "table _migrations has lost its m001_initial row (or is gone) "
                                                "though the store's tables exist"))
    others = sorted(n for n in names if n != "_migrations")
    return others or None


#: A statement tracer: called with each statement's SQL and its bind parameters (None when it has none).
Tracer = Callable[[str, Any], None]


class _TracedConnection:
    """A DuckDB connection that reports every statement to ``trace(sql, params)`` before running it — the
    one place a Store's statements pass through, so ``pc.Lab(path, trace=print)`` shows them all (migrations,
    reads, writes; ``BEGIN``/``COMMIT``/``ROLLBACK``; an appender as ``APPEND <table>``), as sqlite-utils'
    ``Database(tracer=print)`` does."""

    def __init__(self, con: duckdb.DuckDBPyConnection, trace: Tracer) -> None:
        self._con = con
        self._trace = trace

    def execute(self, query: str, parameters: Any = None) -> duckdb.DuckDBPyConnection:
        self._trace(query, parameters)
        return self._con.execute(query, parameters)

    def appender(self, table: str) -> Any:
        self._trace(f"APPEND {table}", None)
        return self._con.appender(table)

    def begin(self) -> duckdb.DuckDBPyConnection:
        self._trace("BEGIN", None)
        return self._con.begin()

    def commit(self) -> duckdb.DuckDBPyConnection:
        self._trace("COMMIT", None)
        return self._con.commit()

    def rollback(self) -> duckdb.DuckDBPyConnection:
        self._trace("ROLLBACK", None)
        return self._con.rollback()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


class _Connection:
    """The connection a :class:`~promptcache_nb.store.Store` is built on: open, migrate, transactions, batches,
    and the reads (``rows``, ``one``, ``scalar``, ``query``, ``sql``) the parts of the store run their SQL
    through."""

    def __init__(self, path: str | Path = ":memory:", *, read_only: bool = False,
                 trace: Tracer | None = None) -> None:
        self.path = str(path)
        self.read_only = read_only
        #: why writes are refused, and what to do instead (said by every refused write)
        self.read_only_why = "read_only=True; open it again without read_only to change it"
        self.trace = trace
        # None once closed (``closed``); public methods reach it through _live(), which says so
        self.con: duckdb.DuckDBPyConnection = None  # type: ignore[assignment]
        self.commit_count = 0  # outermost transactions committed: callers tell "stored" from "rolled back"
        #: The number of the current (or last) outermost transaction: an object that moved ahead of the file
        #: inside one notes it, so a rollback reloads only those (``Lab._all_or_nothing``).
        self.tx_serial = 0
        memory = self.path.startswith(":memory:")
        if memory and read_only:
            raise StoreError("an in-memory store cannot be opened read-only; pass the path of a store file")
        if not memory:
            for key in _file_keys(self.path):
                other = _OPEN.get(key)
                if other is not None and not other.closed:
                    raise StoreLockedError(self.path, "another pc.Lab in this process (close it first: lab.close())")
            _check_file(self.path, read_only=read_only)
        try:
            # 16 KiB blocks (DuckDB's default is 256 KiB): a store of a few MB is otherwise mostly the
            # per-table block granularity. Applies to new files only; existing files keep theirs.
            # zstd for the string columns at checkpoint: request bodies are repetitive JSON (a debug-level
            # DuckDB setting, but a documented one; reading is unaffected).
            # No vacuum at checkpoint: it merges a table's row groups back up to 122,880 rows, rewriting them
            # whole, and a blocks row group that size holds hundreds of MB of request bodies: an import of a big
            # history paid a rewrite of most of the store (CPU, and a peak of memory that grew with the store) at
            # every few checkpoints. Rows stay as appended; deleted rows are still deleted.
            # The allocator gives memory back once a task's peak passed 16 MB, not 128 MB (DuckDB's default): an
            # import runs thousands of small writes and a few large checkpoints, and the freed memory kept after
            # each added ~25 MB to the peak RSS of a big import (benchmarks/bench_fleet.py), for no CPU measured.
            config: dict[str, str | bool | int | float | list[str]] = {
                "default_block_size": str(BLOCK_SIZE), "force_compression": "zstd", "max_vacuum_tasks": 0,
                "allocator_flush_threshold": "16MB"}
            self.con = duckdb.connect(self.path, read_only=read_only, config=config)
            if trace is not None:
                self.con = cast(duckdb.DuckDBPyConnection, _TracedConnection(self.con, trace))
        except duckdb.IOException as exc:
            m = _LOCK.search(str(exc))
            if m or "lock" in str(exc).lower():
                holder = m.group(1).strip() if m else "another process"
                if "read-only mode" in str(exc):  # DuckDB says so when the holder only reads
                    detail = "a read-only viewer (pc.Lab(path, read_only=True) can open it beside that one)"
                elif read_only:
                    detail = ("which has it open for writing: while a writer holds the file no other process "
                              "can open it, read_only=True included")
                else:
                    detail = None
                raise StoreLockedError(self.path, holder, detail) from None
            raise StoreError(f"cannot open store {self.path!r}: {_one_line(exc)}") from None
        except duckdb.Error as exc:
            raise StoreError(f"cannot open store {self.path!r}: {_one_line(exc)}") from None
        except RuntimeError as exc:
            if _interrupted(exc):
                raise KeyboardInterrupt from None
            raise
        try:
            with interruptible(self.con):
                self._open_checks(read_only)
        except BaseException as exc:
            self.con.close()
            self.con = None  # type: ignore[assignment]  # closed: `closed` and _live() check for None
            if _interrupted(exc):  # Ctrl-C during a migration (rolled back) or the first reads
                raise KeyboardInterrupt from None
            if isinstance(exc, duckdb.Error):
                raise StoreError(f"cannot read store {self.path!r}: {_one_line(exc)}") from None
            raise
        if not memory:
            for key in _file_keys(self.path):  # again: a new file has an inode only now
                _OPEN[key] = self
        self._pending_known: dict[str, tuple[Any, ...]] = {}
        self._pending_nodes: set[str] = set()
        self._after_commit: list[Callable[[], None]] = []  # run once the outermost transaction commits
        #: projects ensured in the open transaction, with the earliest time given (an import's many sessions)
        self._tx_projects: dict[str, datetime] = {}
        self._tx_depth = 0
        self._buffer: dict[str, list[Any]] | None = None  # rows deferred by batch()
        #: sessions created inside batch(), by id: their ``sessions`` and ``session_state`` rows (table column
        #: order), held until the batch ends; later changes to them within the batch edit these lists
        self._new_sessions: dict[str, tuple[list[Any], list[Any]]] = {}
        self._buffer_projects: set[str] = set()  # projects ensured inside batch(), written when it ends
        self._columns_cache: dict[str, list[str]] = {}
        self._views = False  # tables are views over a Parquet dataset (open_dataset): no row ids
        self._session_groups: dict[str, list[str]] = {}  # a dataset's sessions: the file groups that wrote them

    def _open_checks(self, read_only: bool) -> None:
        """Refuse a foreign or damaged database, migrate, and load the dedup sets."""
        foreign = _foreign_objects(self.con, self.path)
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise StoreError(
                f"store {self.path!r} is a DuckDB database of another application ({len(foreign)} "
                f"{'table' if len(foreign) == 1 else 'tables'} not made by promptcache_nb: {shown}); "
                "nothing was changed: open a new file instead")
        if read_only:
            self.migrations_applied_now: list[str] = []
            if foreign is None and self._has_table("_migrations"):
                # an older store lacks columns the readers name (m011 renamed turns."at"): say so, not "damaged"
                done = set(applied(self.con))
                pending = [fn.__name__ for fn in MIGRATIONS if fn.__name__ not in done]
                if pending:
                    raise StoreError(
                        f"store {self.path!r} was written by an older promptcache_nb (not yet migrated: "
                        f"{', '.join(pending)}); open it once without read_only (pc.Lab(path)) to migrate it")
        else:
            try:
                self.migrations_applied_now = migrate(self.con)
            except duckdb.Error as exc:
                if _interrupted(exc):
                    raise
                raise StoreError(f"store {self.path!r} could not be migrated: {_one_line(exc)}") from None
        if foreign is None and (not read_only or self._has_table("_migrations")):
            missing = schema_problems(self.con)
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise StoreError(damaged(self.path, missing[0] + more))
        migrated = foreign is None and not (read_only and not self._has_table("blocks"))
        self._known_blocks: set[str] = (
            {r[0] for r in self.con.execute("SELECT hash FROM blocks").fetchall()} if migrated else set())
        self._known_nodes: set[str] = (
            {r[0] for r in self.con.execute("SELECT id FROM prefix_nodes").fetchall()} if migrated else set())

    def _has_table(self, name: str) -> bool:
        return bool(self.con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND table_name = ?",
            [name]).fetchall()[0][0])

    # -- plumbing -----------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One DuckDB transaction; nested uses join the outer one (a tool loop's requests commit together).

        Content-addressed rows written inside become "known" only when the outermost transaction commits,
        so a rollback never leaves the in-memory dedup sets ahead of the file. An interrupt (Ctrl-C) that
        lands once COMMIT has finished is re-raised as itself and rolls nothing back: the data is stored,
        ``commit_count`` says so, and callers advance their in-memory state accordingly.
        """
        con = self._live()
        if self.read_only:
            raise StoreError(f"store {self.path!r} is open read-only ({self.read_only_why})")
        if self._tx_depth:
            self._tx_depth += 1
            try:
                yield
            finally:
                self._tx_depth -= 1
            return
        con.begin()
        self._tx_depth = 1
        self.tx_serial += 1
        self._pending_known = {}
        self._pending_nodes = set()
        self._after_commit = []
        self._tx_projects = {}
        committed = False
        try:
            try:
                yield
            except BaseException as exc:
                with sigint_deferred():
                    rollback_if_active(con)
                if _interrupted(exc):
                    raise KeyboardInterrupt from None
                raise
            try:
                con.commit()
            except duckdb.Error as exc:
                if not _interrupted(exc):
                    with sigint_deferred():
                        rollback_if_active(con)  # a failed COMMIT stored nothing
                    raise
                with sigint_deferred():
                    committed = not rollback_if_active(con)  # interrupted (interruptible): as below
                raise KeyboardInterrupt from None
            except BaseException as exc:
                # an interrupt around COMMIT: stored iff no transaction is left to roll back
                with sigint_deferred():
                    committed = not rollback_if_active(con)
                if _interrupted(exc):
                    raise KeyboardInterrupt from None
                raise
            committed = True
        except duckdb.Error as exc:
            raise StoreError(f"store {self.path!r}: {_one_line(exc)}") from None
        finally:
            self._tx_depth = 0
            if committed:
                self.commit_count += 1
                self._known_blocks.update(self._pending_known)
                self._known_nodes.update(self._pending_nodes)
            self._pending_known, self._pending_nodes = {}, set()
            self._tx_projects = {}
            callbacks, self._after_commit = (self._after_commit if committed else []), []
        for fn in callbacks:
            _run_callback(fn)

    def on_commit(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once what the current transaction wrote is stored: when the outermost transaction
        commits (never if it rolls back), or at once outside a transaction. Listeners hear of a request only
        when it is in the file (a Stepper's turn inside ``Lab.atomic`` that fails is never announced); an
        exception in ``fn`` is logged, never raised into the write that stored the data."""
        if self._tx_depth:
            self._after_commit.append(fn)
        else:
            _run_callback(fn)

    def ensure_rolled_back(self) -> None:
        """After an outermost transaction ended by an exception: roll back what DuckDB may still hold open (a
        second Ctrl-C can land in the few bytecodes before :meth:`transaction`'s rollback starts), so that what
        is read next is what the file holds. Does nothing inside a transaction or when none is open."""
        if self.con is not None and not self._tx_depth and not self.read_only:
            with sigint_deferred():
                rollback_if_active(self.con)

    @property
    def in_transaction(self) -> bool:
        """True inside :meth:`transaction` (or :meth:`batch`): what is written now may still be rolled back."""
        return self._tx_depth > 0

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction whose inserts (blocks, prefix nodes, messages, requests) are deferred and written in
        bulk through DuckDB's appender when the block ends: imports and replays write a chunk of requests at
        the cost of a few statements instead of several per request. Nothing is written on failure.

        Sessions created inside are deferred too (two statements each cost more than the rest of a one-request
        session): the store's own session reads (:meth:`session_row`, :meth:`state_row`,
        :meth:`existing_sessions`) and writes (config, state, delete) see and edit them; the listings
        (:meth:`session_ids`, ...) write them first. Other reads inside the block do not see the deferred rows
        (callers keep what they need in memory).
        """
        if self._buffer is not None:
            yield
            return
        with self.transaction():
            self._buffer = {}
            try:
                yield
                buffered, self._buffer = self._buffer, None
                self._flush(buffered)
            finally:
                self._buffer = None
                self._new_sessions = {}
                self._buffer_projects = set()

    def _flush(self, buffered: dict[str, list[Any]]) -> None:
        con = self._live()
        self._write_new_sessions()
        for table in ("blocks", "prefix_nodes", "session_messages"):
            rows = buffered.pop(table, None)
            if rows:
                _append(con, table, rows)
        turns = buffered.pop("turns", None)
        if turns:
            values = attrgetter(*self._table_columns("turns"))  # the table's column order
            _append(con, "turns", [values(rec) for rec in turns])
        for table, rows in buffered.items():  # anything else _insert deferred
            _append(con, table, rows)

    def _write_new_sessions(self) -> None:
        """Append the sessions deferred by :meth:`batch` (one statement per table, whatever their number), after
        their projects."""
        con = self._live()
        projects, self._buffer_projects = self._buffer_projects, set()
        for project_id in sorted(projects):
            self._upsert_project(project_id, self._tx_projects[project_id])
        new, self._new_sessions = self._new_sessions, {}
        if not new:
            return
        # as write_state's INSERT OR REPLACE: a state row left without its session is replaced
        con.execute("DELETE FROM session_state WHERE session_id IN (SELECT unnest(?))", [list(new)]).fetchall()
        _append(con, "sessions", [tuple(row) for row, _ in new.values()])
        _append(con, "session_state", [tuple(state) for _, state in new.values()])

    def _table_columns(self, table: str) -> list[str]:
        cols = self._columns_cache.get(table)
        if cols is None:
            rows = self._live().execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
                [table]).fetchall()
            cols = [r[0] for r in rows]
            self._columns_cache[table] = cols
        return cols

    def set_threads(self, n: int) -> int:
        """Let DuckDB run this connection's queries on ``n`` threads; returns the previous setting. A worker of a
        parallel import runs on one core beside the others: DuckDB's default (one thread per core) made each
        process's queries contend with the other processes for the same cores, for more CPU and no wall time."""
        con = self._live()
        row = con.execute("SELECT current_setting('threads')").fetchone()
        con.execute(f"SET threads = {int(n)}")
        return int(row[0]) if row else n

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None  # type: ignore[assignment]  # closed: `closed` and _live() check for None

    @property
    def closed(self) -> bool:
        return self.con is None

    def migrations(self) -> list[str]:
        con = self._live()
        if not self._has_table("_migrations"):
            return []
        return applied(con)

    def sql(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> pd.DataFrame:
        self._live()
        with warnings.catch_warnings():
            # duckdb 2.0's DataFrame conversion trips a pandas 3 deprecation; not the user's concern
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*inplace keyword.*")
            with self._one_line_errors(), interruptible(self.con):  # `promptcache-nb sql`: Ctrl-C stops a query
                return self.con.execute(query, params or []).df()

    def _live(self) -> duckdb.DuckDBPyConnection:
        if self.con is None:
            raise StoreError(f"the Lab on {self.path!r} is closed; open it again with pc.Lab(path)")
        return self.con

    def rows(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """All rows of a query; a DuckDB error (a corrupt block, a read-only store) is a one-line StoreError."""
        con = self._live()
        with self._one_line_errors():
            return con.execute(query, params or []).fetchall()

    @contextmanager
    def _one_line_errors(self) -> Iterator[None]:
        """A DuckDB error as one :class:`StoreError` line naming the store; an interrupted query as Ctrl-C."""
        try:
            yield
        except (duckdb.Error, RuntimeError) as exc:
            if _interrupted(exc):
                raise KeyboardInterrupt from None
            if isinstance(exc, duckdb.Error):
                raise StoreError(f"store {self.path!r}: {_one_line(exc)}") from None
            raise

    def one(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> tuple[Any, ...] | None:
        rows = self.rows(query, params)
        return rows[0] if rows else None

    def scalar(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> Any:
        """The first column of the first row (None when there is no row): an aggregate's value."""
        row = self.one(query, params)
        return None if row is None else row[0]

    # -- dict rows: callers never read a position -------------------------------------------------------------
    def query(self, sql: str, params: list[Any] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """All rows of a query as dicts keyed by column name (sqlite-utils' ``db.query``)."""
        con = self._live()
        try:
            cur = con.execute(sql, params or [])
            names = [d[0] for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        except duckdb.Error as exc:
            raise StoreError(f"store {self.path!r}: {_one_line(exc)}") from None

    def _upsert_project(self, project_id: str, at: datetime) -> None:
        self._live().execute("INSERT INTO projects VALUES (?, ?) ON CONFLICT DO UPDATE SET created_at = "
                             "least(projects.created_at, excluded.created_at)", [project_id, at]).fetchall()

    def _insert(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        """Insert rows, deferred to the end of a :meth:`batch` block inside one."""
        if rows and self._buffer is not None:
            self._buffer.setdefault(table, []).extend(rows)
            return
        self._insert_now(table, rows)

    def _insert_now(self, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
        # A few rows: one VALUES statement (~0.5 ms); many (a rewritten prefix): the appender.
        if not rows:
            return
        if len(rows) <= 8:
            marks = "(" + ", ".join("?" * len(rows[0])) + ")"
            self.con.execute(f"INSERT INTO {table} VALUES " + ", ".join([marks] * len(rows)),
                             [v for r in rows for v in r]).fetchall()
        else:
            _append(self.con, table, rows)


def _run_callback(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # a listener's bug must not turn a stored write into a failed one
        logging.getLogger(__name__).exception("store: an after-commit listener failed")
