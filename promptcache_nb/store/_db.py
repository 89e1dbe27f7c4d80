"""The DuckDB store: one connection per Lab, bind parameters, one transaction per turn."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import stat
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, cast

import duckdb

from .._types import (  # noqa: F401 - fnv1a re-exported (store.fnv1a)
    Delta,
    KnowledgeEntry,
    MessageBlock,
    RequestRecord,
    fnv1a,
)
from .._util import common_prefix_length, digest, file_kind
from ..errors import StoreError, StoreLockedError
from ..request import PreparedRequest, canonical_json, rebuild_body
from ..request._canonical import SegmentMemo, prefix_record
from ..tokens import DEFAULT_TOKENIZER, Tokenizer, segment_tokens
from . import _rollups
from ._migrations import MIGRATIONS, applied, migrate, rollback_if_active
from ._parquet import (
    CONTENT_KEYS,
    DATASET_TABLES,
    attach_dataset,
    export_dataset_tables,
    export_group,
    group_of_file,
    parquet_source,
)
from ._schema import CORE_TABLES, damaged, node_on_cycle, schema_problems
from ._write import RequestWrite

if TYPE_CHECKING:  # pandas loads on the first DataFrame (duckdb's .df() imports it): not with the package
    import pandas as pd

BLOCK_SIZE = 16_384
# the holder ("/usr/bin/python3 (PID 123)"), without DuckDB's advice for its own CLI that may follow it
_LOCK = re.compile(r"Conflicting lock is held in (.+?)(?:\.\s*(?:However|See also)|$)", re.S)


_CHAIN_KEY = attrgetter("chain_key")
_TOOLS_JSON: list[Any] = [None, None]  # (tools list object, its canonical JSON): tools rarely change


def _tools_json(tools: list[Any]) -> str:
    if _TOOLS_JSON[0] is not tools:
        _TOOLS_JSON[0], _TOOLS_JSON[1] = tools, canonical_json(tools)
    return str(_TOOLS_JSON[1])


# -- how rows encode content (pure: the request pipeline computes them, the store writes them) -------------

def prefix_chain(req: PreparedRequest, prev_keys: list[str], prev_nodes: list[str]) -> tuple[list[str], list[str], int]:
    """The ``prefix_nodes`` id of each segment (a node is the hash of its parent's id and its segment's key, so
    equal prefixes share nodes), extending the previous request's chain.

    Returns (keys, node_ids, shared): ``prev_keys`` / ``prev_nodes`` are the previous request's; the leading
    segments ``req`` shares with it as the same objects keep their keys, and its first ``shared`` nodes are
    reused, so a request costs O(new segments).
    """
    k = prefix_record(req)[1]
    if k and len(prev_keys) >= k:
        keys = prev_keys[:k] + list(map(_CHAIN_KEY, req.segments[k:]))
    else:
        keys = list(map(_CHAIN_KEY, req.segments))
    shared = common_prefix_length(keys, prev_keys, k if k and len(prev_keys) >= k else 0)
    nodes = prev_nodes[:shared]
    parent = nodes[-1] if nodes else None
    for key in keys[shared:]:
        parent = digest(((parent or "") + "/" + key).encode(), tag="node")
        nodes.append(parent)
    return keys, nodes, shared


def encode_message(message: dict[str, Any]) -> tuple[str, list[MessageBlock]]:
    """A message as block references (``{"role", "blocks": [hash...]}`` or ``{"role", "str": hash}``, canonical
    JSON) and its content blocks: each body is stored once in ``blocks``, however many messages use it."""
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        body = canonical_json(content)
        h = digest(body.encode(), tag="seg")
        return canonical_json({"role": role, "str": h}), [(h, "msg-str", body, content)]
    blocks: list[MessageBlock] = []
    for i, element in enumerate(content):
        body = canonical_json(element)
        blocks.append((digest(body.encode(), tag="seg"), "msg-start" if i == 0 else "msg", body, element))
    return canonical_json({"role": role, "blocks": [b[0] for b in blocks]}), blocks


def state_columns(state: dict[str, Any]) -> dict[str, Any]:
    """A session's state dict as ``session_state`` column values (JSON columns canonicalised)."""
    return {
        "ltm_pin_text": state.get("ltm_pin_text"),
        "ltm_pin_keys": None if state.get("ltm_pin_keys") is None else json.dumps(state["ltm_pin_keys"]),
        "ltm_cache_text": state.get("ltm_cache_text"),
        "stable_ltm_text": state.get("stable_ltm_text"),
        "host_prompt": state["host_prompt"],
        "tools": _tools_json(state["tools"]),
        "model": state["model"],
        "extra": canonical_json(state.get("extra", {})),
    }


# Stores open in this process, by file identity. DuckDB lets one process open a file twice, but two Stores
# would each keep their own dedup sets (and two hard-linked names get two WAL files: one overwrites the
# other's turns); the second open is refused like another process's lock. Keys: ("inode", st_dev, st_ino)
# once the file exists, and ("path", resolved path) (a file not created yet, or recreated under the same name).
_OPEN: weakref.WeakValueDictionary[tuple[Any, ...], Store] = weakref.WeakValueDictionary()


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


def caused_by_ctrl_c(exc: BaseException) -> bool:
    """``exc`` is a Ctrl-C, DuckDB's error for one, or an error raised while handling either (a wrapper that
    turned the interrupt into its own error must not make a Ctrl-C look like a failure)."""
    seen: BaseException | None = exc
    for _ in range(32):  # a chain is short; a cycle would be a bug elsewhere, not a reason to hang
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt) or _interrupted(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C that landed while DuckDB ran a statement: its Python client stops the query and raises
    ``RuntimeError("Query interrupted")`` (or, for a statement :func:`interruptible` stopped,
    ``duckdb.InterruptException``) in place of the KeyboardInterrupt, which we raise again as itself."""
    return (type(exc) is RuntimeError and str(exc) == "Query interrupted") or isinstance(exc, duckdb.InterruptException)


@contextmanager
def interruptible(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Let Ctrl-C stop the DuckDB statement running inside the block (opening and migrating a store, a long
    ``sql`` query): the block ends with exactly one KeyboardInterrupt. For blocks that are mostly statements.

    DuckDB runs a statement without returning to the interpreter, so Python's SIGINT handler waits for its end
    (measured: a Ctrl-C during a slow statement was never seen; DuckDB's client may even run the handler itself
    and drop its KeyboardInterrupt). The C-level handler still writes the signal number to
    ``signal.set_wakeup_fd`` at once: a watcher thread reading it calls ``con.interrupt()``, and the statement
    ends with DuckDB's interrupt error. Inside the block SIGINT only records the Ctrl-C — a KeyboardInterrupt
    raised in the middle of the rollback that error starts would leave the transaction open — and the block
    raises KeyboardInterrupt in place of whatever the interrupt ended with, or at its end when the statement
    finished first: a Ctrl-C is never swallowed. The wakeup fd is process-wide (asyncio uses it): the previous
    one is restored on exit and gets every byte meanwhile. Outside the main thread (where signals are not
    delivered), or when SIGINT has a handler other than Python's default, this does nothing.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    r, w = socket.socketpair()
    w.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    except ValueError:  # a main thread of an embedded interpreter without signal support
        r.close()
        w.close()
        yield
        return
    pressed: list[int] = []

    def on_sigint(signum: int, frame: Any) -> None:
        pressed.append(signum)

    def watch() -> None:
        # until the NUL byte the block's exit sends, after every signal byte that came before it
        while data := r.recv(64):
            signals = data.replace(b"\0", b"")
            if signals and previous != -1:
                with suppress(OSError):
                    os.write(previous, signals)
            if b"\0" in data:
                return
            if signal.SIGINT in signals:
                con.interrupt()

    watcher = threading.Thread(target=watch, name="promptcache-interrupt", daemon=True)
    signal.signal(signal.SIGINT, on_sigint)
    watcher.start()
    try:
        yield
    except BaseException as exc:
        if (pressed or _interrupted(exc)) and not isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt from None  # DuckDB's interrupt error, or what a caller made of it
        raise
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(previous)
        w.send(b"\0")  # signal numbers start at 1: this one tells the watcher to forward what is left and leave
        watcher.join()
        r.close()
        w.close()
    if pressed:  # the statement finished before the interrupt reached it, or Python code ran
        raise KeyboardInterrupt


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """A Ctrl-C that arrives inside the block waits for its end, then raises KeyboardInterrupt: a rollback, and
    the reads that bring objects back to what the store holds after it, run whole even when Ctrl-C is pressed
    again (a KeyboardInterrupt in the middle of a rollback would leave the transaction open). Only in the main
    thread with Python's default SIGINT handler (as :func:`interruptible`, which already only records one)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    pressed: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pressed:
        raise KeyboardInterrupt


#: Rows per ``append_rows`` call. DuckDB's appender neither checks for Ctrl-C nor honours ``con.interrupt()``;
#: between calls Python runs, so a Ctrl-C during a long bulk write stops it within one slice (a few ms).
APPEND_SLICE = 1024


def _append(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Append ``rows`` to ``table`` through DuckDB's appender, a slice at a time (:data:`APPEND_SLICE`)."""
    with con.appender(table) as ap:
        for i in range(0, len(rows), APPEND_SLICE):
            ap.append_rows(rows[i:i + APPEND_SLICE])


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


class Store:
    """A DuckDB file (or ``:memory:``) holding projects, sessions, turns, blocks and knowledge.

    ``read_only=True`` opens an existing store for reading only: no migration, no write (a transaction
    raises :class:`StoreError`), and a missing file is an error rather than a new store. ``trace`` (e.g.
    ``print``) is called as ``trace(sql, params)`` before each statement the store runs.

    Every SQL statement of the package lives in this class; callers get dict rows or typed records.
    """

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

    def merge_from(self, path: str) -> list[str]:
        """Copy every row of the store file ``path`` (another process's import of other sessions) into this one,
        in one transaction: content-addressed rows (blocks, prefix nodes, projects) only when new, calibrations
        never (they are fitted over the whole store afterwards). Returns the session ids copied. The caller
        makes sure none of them is stored here already."""
        con = self._live()
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary "
            "ORDER BY table_name").fetchall() if r[0] != "_migrations" and r[0] not in DATASET_TABLES]
        con.execute(f"ATTACH {_sql_text(path)} AS merged_src (READ_ONLY)")
        try:
            sessions = [r[0] for r in con.execute("SELECT id FROM merged_src.sessions ORDER BY id").fetchall()]
            with self.transaction():
                for table in tables:
                    key = CONTENT_KEYS.get(table)
                    if table == "projects":  # as ensure_project: created at its earliest session's start
                        con.execute("INSERT INTO main.projects SELECT * FROM merged_src.projects ON CONFLICT DO "
                                    "UPDATE SET created_at = least(projects.created_at, excluded.created_at)")
                        continue
                    if table == "unanalysed_sessions":  # after every session awaiting analysis here, in order
                        con.execute("INSERT INTO main.unanalysed_sessions SELECT session_id, import_seq + "
                                    "(SELECT coalesce(max(import_seq) + 1, 0) FROM main.unanalysed_sessions), "
                                    "file_group, files FROM merged_src.unanalysed_sessions")
                        continue
                    where = (f" WHERE {key} NOT IN (SELECT {key} FROM main.{table})" if key else "")
                    con.execute(f"INSERT INTO main.{table} SELECT * FROM merged_src.{table}{where}")
                self._pending_known.update(
                    (r[0], ()) for r in con.execute("SELECT hash FROM merged_src.blocks").fetchall())
                self._pending_nodes.update(r[0] for r in con.execute("SELECT id FROM merged_src.prefix_nodes"
                                                                     ).fetchall())
        finally:
            con.execute("DETACH merged_src")
        return sessions

    # -- the store as a Parquet dataset (pc.fleet; store/_parquet.py) ---------------------------------
    def export_parquet(self, out: str, group: str) -> None:
        """Write every table as Parquet files of file group ``group`` under the dataset directory ``out``,
        replacing that group's earlier files (:mod:`._parquet`)."""
        export_group(self._live(), out, group)

    def export_dataset_tables(self, out: str) -> None:
        """Write the tables fitted over a whole dataset (calibrations) under ``out``."""
        export_dataset_tables(self._live(), out)

    @classmethod
    def open_dataset(cls, out: str, *, writable_dataset_tables: bool = False) -> Store:
        """A store whose tables are views over the Parquet dataset at ``out``: every read works, every write
        raises StoreError (``writable_dataset_tables``: the calibrations table, an in-memory copy, may be
        written, so a calibration can be fitted over the whole dataset)."""
        store = cls(":memory:")
        try:
            attach_dataset(store._live(), out)
        except duckdb.Error as exc:
            store.close()
            raise StoreError(f"cannot read fleet dataset {out!r}: {_one_line(exc)}") from None
        except BaseException:
            store.close()
            raise
        store.path = out
        store._views = True
        store.read_only = not writable_dataset_tables
        store.read_only_why = ("a fleet dataset: Parquet files read through views; add logs with "
                               "pc.fleet.import_logs(paths, out=...)")
        return store

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
            try:
                with interruptible(self.con):  # `promptcache-nb sql` on a long query: Ctrl-C stops it
                    return self.con.execute(query, params or []).df()
            except (duckdb.Error, RuntimeError) as exc:
                if _interrupted(exc):
                    raise KeyboardInterrupt from None
                if isinstance(exc, duckdb.Error):
                    raise StoreError(f"store {self.path!r}: {_one_line(exc)}") from None
                raise

    def _live(self) -> duckdb.DuckDBPyConnection:
        if self.con is None:
            raise StoreError(f"the Lab on {self.path!r} is closed; open it again with pc.Lab(path)")
        return self.con

    def rows(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """All rows of a query; a DuckDB error (a corrupt block, a read-only store) is a one-line StoreError."""
        con = self._live()
        try:
            return con.execute(query, params or []).fetchall()
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

    # -- projects and sessions ----------------------------------------------------------------
    def ensure_project(self, project_id: str, at: datetime) -> None:
        """The project exists; its ``created_at`` is its earliest session's start, whatever order sessions are
        stored in (an import stores sessions by key, a parallel one by file group)."""
        held = self._tx_projects.get(project_id)
        if held is not None and held <= at:
            return  # ensured already in this transaction, with this time or an earlier one: nothing to change
        if self._buffer is not None:
            # inside batch(): one upsert per project when it ends, with the earliest time (an import's sessions
            # are stored by key, not by time: most would move created_at back once more)
            self._tx_projects[project_id] = at
            self._buffer_projects.add(project_id)
            return
        self._upsert_project(project_id, at)
        if self._tx_depth:
            self._tx_projects[project_id] = at

    def _upsert_project(self, project_id: str, at: datetime) -> None:
        self._live().execute("INSERT INTO projects VALUES (?, ?) ON CONFLICT DO UPDATE SET created_at = "
                             "least(projects.created_at, excluded.created_at)", [project_id, at]).fetchall()

    _SESSION_COLUMNS = ("id", "project_id", "strategy", "cache_model", "model", "created_at", "config", "source",
                        "parent_id")

    def session_row(self, session_id: str) -> dict[str, Any] | None:
        new = self._new_sessions.get(session_id)
        row = (tuple(new[0]) if new is not None else
               self.one(f"SELECT {', '.join(self._SESSION_COLUMNS)} FROM sessions WHERE id = ?", [session_id]))
        if row is None:
            return None
        out = dict(zip(self._SESSION_COLUMNS, row, strict=True))
        out["config"] = self._config(out)
        return out

    def _config(self, row: dict[str, Any]) -> dict[str, Any]:
        config = json.loads(row["config"]) if row["config"] is not None else None
        if not isinstance(config, dict):
            what = "NULL" if config is None else f"a JSON {type(config).__name__}"
            raise StoreError(damaged(self.path, f"sessions.config of session {row['id']!r} is {what}, not a "
                                                "JSON object"))
        return config

    def create_session(self, row: dict[str, Any], state: dict[str, Any]) -> None:
        """Insert a session row (``config`` a dict) and its first state row (inside the caller's transaction;
        inside :meth:`batch`, at its end)."""
        values = {**row, "config": canonical_json(row["config"])}
        if self._buffer is not None:
            if row["id"] in self._new_sessions:
                raise StoreError(f"store {self.path!r}: session {row['id']!r} is created twice in one batch")
            self._new_sessions[row["id"]] = ([values.get(c) for c in self._SESSION_COLUMNS],
                                             [row["id"], *state_columns(state).values(), row["created_at"]])
            return
        cols = [c for c in self._SESSION_COLUMNS if c in values]
        self.con.execute(
            f"INSERT INTO sessions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            [values[c] for c in cols],
        ).fetchall()
        self.write_state(row["id"], state, row["created_at"])

    def update_session_config(self, session_id: str, config: dict[str, Any]) -> None:
        new = self._new_sessions.get(session_id)
        if new is not None:
            new[0][self._SESSION_COLUMNS.index("config")] = canonical_json(config)
            return
        self.con.execute("UPDATE sessions SET config = ? WHERE id = ?", [canonical_json(config), session_id]).fetchall()

    def project_exists(self, project_id: str) -> bool:
        if project_id in self._buffer_projects:
            return True
        return self.one("SELECT 1 FROM projects WHERE id = ?", [project_id]) is not None

    def sessions_frame(self) -> pd.DataFrame:
        """Every session (id, project, strategy, cache model, model, creation time, and ``analysed``: False while
        a usage-first import's session awaits the analysis of its bodies), oldest first."""
        self._write_new_sessions()
        waiting = ("s.id NOT IN (SELECT session_id FROM unanalysed_sessions)" if self._has_unanalysed
                   else "true")
        return self.sql(
            f"SELECT id, project_id, strategy, cache_model, model, created_at, {waiting} AS analysed "
            "FROM sessions s ORDER BY created_at, id")

    def move_sessions(self, from_project: str, to_project: str) -> int:
        """Move every session of ``from_project`` (and its prompt-delta rows) to ``to_project``, in one
        transaction; returns how many moved. ``to_project`` is created with the moved sessions' first time."""
        with self.transaction():
            self._write_new_sessions()
            n, first = self.one("SELECT count(*), min(created_at) FROM sessions WHERE project_id = ?",
                                [from_project]) or (0, None)  # an aggregate: always one row
            if n == 0:
                return 0
            self.ensure_project(to_project, first)  # the sessions' own clock, never the wall clock
            self.con.execute("UPDATE sessions SET project_id = ? WHERE project_id = ?",
                             [to_project, from_project]).fetchall()
            self.con.execute(
                "UPDATE session_prompt_deltas SET project_id = ? WHERE session_id IN "
                "(SELECT id FROM sessions WHERE project_id = ?) AND project_id = ?",
                [to_project, to_project, from_project],
            ).fetchall()
        return int(n)

    def existing_sessions(self, session_ids: Sequence[str]) -> set[str]:
        """Which of ``session_ids`` are stored (one query for an import's many sessions)."""
        if not session_ids:
            return set()
        new = {sid for sid in session_ids if sid in self._new_sessions}
        return new | {r[0] for r in self.rows("SELECT id FROM sessions WHERE id IN (SELECT unnest(?))",
                                              [list(session_ids)])}

    def session_ids(self) -> list[str]:
        self._write_new_sessions()
        return [r[0] for r in self.rows("SELECT id FROM sessions ORDER BY id")]

    def session_rows(self, cache_model: str | None = None) -> list[dict[str, Any]]:
        """Every session's row (``config`` a dict), by id; only those simulated with ``cache_model`` when given."""
        self._write_new_sessions()
        where, params = ("WHERE cache_model = ?", [cache_model]) if cache_model is not None else ("", [])
        rows = self.query(f"SELECT {', '.join(self._SESSION_COLUMNS)} FROM sessions {where} ORDER BY id", params)
        for r in rows:
            r["config"] = self._config(r)
        return rows

    def unlogged_prefix_sessions(self, account: str, identity: str, *, default_account: str) -> list[dict[str, Any]]:
        """``id`` and ``config`` (a dict) of the sessions of ``account`` (a config without one is
        ``default_account``'s) whose unlogged prefix is a variant of ``identity`` (``config.unlogged_prefix_of`` =
        ``<identity>.<n>``), by id."""
        self._write_new_sessions()
        rows = self.query(
            f"""SELECT {', '.join(self._SESSION_COLUMNS)} FROM sessions
                WHERE coalesce(json_extract_string(config, '$.account'), ?) = ?
                AND starts_with(coalesce(json_extract_string(config, '$.unlogged_prefix_of'), ''), ?)
                ORDER BY id""", [default_account, account, f"{identity}."])
        for r in rows:
            r["config"] = self._config(r)
        return rows

    def original_sessions(self) -> list[dict[str, Any]]:
        """``id`` and ``requests`` (its stored request count) of every session that is not a counterfactual of
        another, by id: what advice over a whole Lab reads, one session at a time."""
        self._write_new_sessions()
        return self.query(
            """SELECT s.id, count(t.idx) AS requests FROM sessions s LEFT JOIN turns t ON t.session_id = s.id
               WHERE coalesce(json_extract_string(s.config, '$.counterfactual_of'), '') = ''
               GROUP BY s.id ORDER BY s.id""")

    def last_request_at(self, session_ids: Sequence[str]) -> datetime | None:
        """When the last request of any of ``session_ids`` was sent (None before any)."""
        last: datetime | None = self.scalar('SELECT max(sent_at) FROM turns WHERE session_id IN (SELECT unnest(?))',
                                            [list(session_ids)])
        return last

    def sessions_sending_between(self, session_ids: Sequence[str], start: datetime | None, end: datetime
                                 ) -> list[str]:
        """Which of ``session_ids`` sent a request at or after ``start`` (None: any time) and at or before ``end``,
        in the order given."""
        if not session_ids:
            return []
        found = {r[0] for r in self.rows(
            'SELECT DISTINCT session_id FROM turns WHERE session_id IN (SELECT unnest($1)) AND sent_at <= $3 '
            'AND ($2::TIMESTAMPTZ IS NULL OR sent_at >= $2)', [list(session_ids), start, end])}
        return [sid for sid in session_ids if sid in found]

    def after_last_pause(self, session_ids: Sequence[str], seconds: float) -> datetime | None:
        """When the first request after the last pause of at least ``seconds`` between two consecutive requests
        of ``session_ids`` was sent (None: no such pause)."""
        found: datetime | None = self.scalar(
            """SELECT max(sent_at) FROM (
                   SELECT sent_at, epoch(sent_at) - lag(epoch(sent_at)) OVER (ORDER BY sent_at, session_id, idx) AS gap
                   FROM turns WHERE session_id IN (SELECT unnest(?)))
               WHERE gap >= ?""", [list(session_ids), seconds])
        return found

    def session_count(self) -> int:
        self._write_new_sessions()
        return int(self.scalar("SELECT count(*) FROM sessions"))

    #: Every table that holds rows of one session (blocks and prefix nodes are shared, content-addressed).
    _SESSION_TABLES = (("turns", "session_id"), ("session_messages", "session_id"),
                       ("session_pending_events", "session_id"), ("session_prompt_deltas", "session_id"),
                       ("session_state", "session_id"), ("unanalysed_sessions", "session_id"), ("sessions", "id"))

    def delete_session(self, session_id: str) -> None:
        """Delete a session and every row stored for it (inside the caller's transaction): an import re-stores
        a session whole when a request that started earlier than the stored ones arrives late."""
        self._new_sessions.pop(session_id, None)
        for table, column in self._SESSION_TABLES:
            self.con.execute(f"DELETE FROM {table} WHERE {column} = ?", [session_id]).fetchall()

    # -- usage-first imports: sessions whose bodies are not analysed yet --------------------------
    def write_usage_records(self, records: Sequence[RequestRecord]) -> None:
        """Append a usage-first import's ``turns`` rows (measured columns only; inside the caller's transaction,
        or deferred to the end of a :meth:`batch`)."""
        if self._buffer is not None:
            self._buffer.setdefault("turns", []).extend(records)
            return
        with self.transaction():
            values = attrgetter(*self._table_columns("turns"))
            _append(self._live(), "turns", [values(rec) for rec in records])

    def mark_unanalysed(self, session_id: str, *, import_seq: int, file_group: str, files: Sequence[str],
                        new: bool = False) -> None:
        """Record that ``session_id`` awaits analysis: its place in the import's order, its file group and the
        files its requests were read from (``new``: the session was created now, so no row is replaced)."""
        if not new:
            self.con.execute("DELETE FROM unanalysed_sessions WHERE session_id = ?", [session_id]).fetchall()
        self._insert("unanalysed_sessions", [(session_id, import_seq, file_group, json.dumps(list(files)))])

    def next_import_seq(self) -> int:
        """The import order number the next session awaiting analysis takes (after every one recorded)."""
        return int(self.scalar("SELECT coalesce(max(import_seq) + 1, 0) FROM unanalysed_sessions"))

    def unanalysed(self, session_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The sessions awaiting analysis (all, or those of ``session_ids``), in import order: ``session_id,
        import_seq, file_group, files`` (a list), with the session's ``account`` (from its config) and
        ``parent_id``."""
        if not self._has_unanalysed:
            return []
        self._write_new_sessions()
        where, params = ("WHERE u.session_id IN (SELECT unnest(?))", [list(session_ids)]) \
            if session_ids is not None else ("", [])
        rows = self.query(
            f"""SELECT u.session_id, u.import_seq, u.file_group, u.files,
                       json_extract_string(s.config, '$.account') AS account, s.parent_id
                FROM unanalysed_sessions u JOIN sessions s ON s.id = u.session_id {where}
                ORDER BY u.import_seq""", params)
        for r in rows:
            r["files"] = json.loads(r["files"])
        return rows

    @property
    def _has_unanalysed(self) -> bool:
        # a store opened read-only before the usage-first migration has no such table (nothing awaits analysis)
        if not getattr(self, "_unanalysed_table", False):
            self._unanalysed_table = self._has_table("unanalysed_sessions")
        return self._unanalysed_table

    def source_spans(self, session_ids: Sequence[str]) -> list[tuple[str, str, int, int, str]]:
        """``(session_id, source_ref, offset, length, digest)`` of every request of ``session_ids`` whose log line
        was located at import, by file position: what an analysis checks before it reads the files again."""
        return [tuple(r) for r in self.rows(
            """SELECT session_id, source_ref, source_offset, source_length, source_digest FROM turns
               WHERE session_id IN (SELECT unnest(?)) AND source_offset IS NOT NULL
               ORDER BY source_ref, source_offset""", [list(session_ids)])]

    def unanalysed_ids(self) -> set[str]:
        """The usage-first sessions: their requests have no bodies to simulate or diff yet."""
        if not self._has_unanalysed:
            return set()
        self._write_new_sessions()
        return {r[0] for r in self.rows("SELECT session_id FROM unanalysed_sessions")}

    def last_sent_request(self, session_id: str) -> tuple[int, RequestRecord | None]:
        """(the session's next request index, its last request that reached the API — a prompt total above 0 —
        or None): where a usage-first import of a grown log goes on from."""
        n = int(self.scalar("SELECT count(*) FROM turns WHERE session_id = ?", [session_id]))
        found = self.query(
            f"""SELECT {_RECORD_SELECT} FROM turns WHERE session_id = ?
                AND input_tokens + cache_read_input_tokens + cache_creation_input_tokens > 0
                ORDER BY idx DESC LIMIT 1""", [session_id])
        return n, RequestRecord(**found[0]) if found else None

    def stored_usage(self, session_id: str) -> dict[str, tuple[int | None, ...]]:
        """Each stored request's import key → its measured (input, cache read, cache write, output) tokens."""
        rows = self.rows("SELECT dedupe_key, input_tokens, cache_read_input_tokens, cache_creation_input_tokens, "
                         "output_tokens FROM turns WHERE session_id = ? AND dedupe_key IS NOT NULL", [session_id])
        return {r[0]: tuple(r[1:]) for r in rows}

    def dedupe_keys(self, session_id: str) -> set[str]:
        """The import keys of a session's stored requests (re-importing a file skips these)."""
        rows = self.rows("SELECT dedupe_key FROM turns WHERE session_id = ? AND dedupe_key IS NOT NULL", [session_id])
        return {r[0] for r in rows}

    def last_turn(self, session_id: str) -> dict[str, Any] | None:
        """``idx``, ``sent_at`` and ``events`` of a session's last stored request."""
        row = self.one('SELECT idx, sent_at, events FROM turns WHERE session_id = ? ORDER BY idx DESC LIMIT 1',
                       [session_id])
        return None if row is None else {"idx": row[0], "sent_at": row[1], "events": row[2]}

    def state_row(self, session_id: str) -> dict[str, Any]:
        new = self._new_sessions.get(session_id)
        if new is not None:
            return self.state_from_row(new[1][1:-1])
        row = self.one(
            "SELECT ltm_pin_text, ltm_pin_keys, ltm_cache_text, stable_ltm_text, host_prompt, tools, model, extra "
            "FROM session_state WHERE session_id = ?",
            [session_id],
        )
        if row is None:
            raise StoreError(f"session {session_id!r} has no session_state row; the store is inconsistent")
        return self.state_from_row(row)

    @staticmethod
    def state_from_row(row: Sequence[Any]) -> dict[str, Any]:
        """A ``session_state`` row's columns (in :func:`state_columns` order) as the state dict sessions use."""
        pin_keys = None
        if row[1] is not None:
            try:
                pin_keys = json.loads(row[1])
            except ValueError:
                pin_keys = None  # corrupt pin keys cause exactly one re-pin (Lore's rule)
        return {
            "ltm_pin_text": row[0], "ltm_pin_keys": pin_keys, "ltm_cache_text": row[2],
            "stable_ltm_text": row[3], "host_prompt": row[4], "tools": json.loads(row[5]),
            "model": row[6], "extra": json.loads(row[7]),
        }

    state_columns = staticmethod(state_columns)

    def write_state(self, session_id: str, state: dict[str, Any], at: datetime,
                    previous: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the state row; with ``previous`` (the last written columns) only changed columns are
        updated — the host prompt and tools are large and rarely change. Returns the columns written."""
        cols = state_columns(state)
        new = self._new_sessions.get(session_id)
        if new is not None:  # created in this batch: its row is written at the end (batch)
            changed = list(cols) if previous is None else [k for k, v in cols.items() if previous.get(k) != v]
            if changed:
                for i, k in enumerate(cols, start=1):
                    if k in changed:
                        new[1][i] = cols[k]
                new[1][-1] = at
            return cols
        if previous is None:
            self.con.execute(
                "INSERT OR REPLACE INTO session_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [session_id, *cols.values(), at],
            ).fetchall()
            return cols
        changed = [k for k, v in cols.items() if previous.get(k) != v]
        if changed:
            sets = ", ".join(f"{k} = ?" for k in changed)
            self.con.execute(
                f"UPDATE session_state SET {sets}, updated_at = ? WHERE session_id = ?",
                [*(cols[k] for k in changed), at, session_id],
            ).fetchall()
        return cols

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

    # -- pending events: recorded between requests, consumed by the next one ---------------------------------
    def pending_events(self, session_id: str) -> list[str]:
        """The event codes recorded since a session's last request, in order."""
        return [r[0] for r in self.rows(
            "SELECT code FROM session_pending_events WHERE session_id = ? ORDER BY seq", [session_id])]

    def add_pending_events(self, session_id: str, first_seq: int, codes: Sequence[str]) -> None:
        """Record events numbered from ``first_seq`` (inside the caller's transaction). Written at once, also
        inside :meth:`batch`, so the DELETE of the request that consumes them always sees them."""
        self._insert_now("session_pending_events",
                         [(session_id, first_seq + i, code) for i, code in enumerate(codes)])

    def clear_pending_events(self, session_id: str) -> None:
        """Forget a session's pending events (inside the caller's transaction)."""
        self.con.execute("DELETE FROM session_pending_events WHERE session_id = ?", [session_id]).fetchall()

    # -- messages and deltas ------------------------------------------------------------------
    def message_ref(self, message: dict[str, Any], pending: dict[str, tuple[Any, ...]],
                    tokenizer: Tokenizer | SegmentMemo | None = None) -> str:
        """A message as block references (:func:`encode_message`); bodies not yet stored are added to
        ``pending`` (hash -> blocks row). Content is stored once."""
        ref, blocks = encode_message(message)
        self._add_blocks(blocks, pending, tokenizer)
        return ref

    def _add_blocks(self, blocks: Sequence[MessageBlock], pending: dict[str, tuple[Any, ...]],
                    tokenizer: Tokenizer | SegmentMemo | None) -> None:
        """The ``blocks`` rows of message blocks not stored (nor pending) yet, into ``pending``; their tokens are
        counted only then. ``tokenizer``: a Tokenizer, or a session's SegmentMemo (its counts are reused: a
        reply's blocks are the next request's history)."""
        memo: SegmentMemo | None = None
        if isinstance(tokenizer, SegmentMemo):
            memo, tok = tokenizer, tokenizer.tokenizer
        else:
            tok = tokenizer if tokenizer is not None else DEFAULT_TOKENIZER
        for h, kind, body, element in blocks:
            if h not in self._known_blocks and h not in pending and h not in self._pending_known:
                if memo is not None and not (isinstance(element, dict) and "cache_control" in element):
                    tokens = memo.tokens(kind, h, element)  # h is the content hash: no marker
                else:
                    tokens = segment_tokens(kind, element, tok)
                pending[h] = (h, kind, body, tokens, len(body.encode()))

    def resolve_refs(self, refs: list[dict[str, Any]], *, session_id: str | None = None) -> list[dict[str, Any]]:
        """Messages back from their block references (one query for all bodies; ``session_id``: theirs)."""
        hashes = sorted({h for r in refs for h in ([r["str"]] if "str" in r else r["blocks"])})
        bodies = self.block_bodies({"session_messages": hashes}, session_id=session_id)
        out = []
        for r in refs:
            if "str" in r:
                out.append({"role": r["role"], "content": self.parse_block(r["str"], bodies[r["str"]],
                                                                           "session_messages")})
            else:
                out.append({"role": r["role"], "content": [self.parse_block(h, bodies[h], "session_messages")
                                                           for h in r["blocks"]]})
        return out

    def parse_block(self, block_hash: str, body: str, used_by: str) -> Any:
        """A block's body (from :meth:`block_bodies`) parsed; a body that is not JSON (a tampered or damaged store)
        raises a one-line :class:`StoreError` naming the block and ``used_by``, the column that references it."""
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise StoreError(damaged(self.path, f"block {block_hash!r} (referenced by {used_by}) is not JSON "
                                                f"(blocks.body: {_one_line(exc)})")) from None

    def block_bodies(self, uses: dict[str, Sequence[str]], *, session_id: str | None = None) -> dict[str, str]:
        """hash -> body of the ``blocks`` rows named, in one query: ``uses`` maps the column that references them
        (named by the error a missing or NULL body raises) to their hashes; ``session_id``, the session they
        rebuild (a fleet dataset reads its file group's files first).

        Only those rows' bodies are read. Joined on the hash, DuckDB decompresses the body column (zstd, whole
        vectors of 2,048 rows: about 1 s on a 500 MB store) to keep a few; looking up their row ids on the hash
        column alone first makes it read only the vectors that hold them (a fleet dataset's views have no row
        ids: :meth:`_dataset_rows`).
        """
        hashes = sorted({h for hs in uses.values() for h in hs})
        if not hashes:
            return {}
        if self._views:
            bodies = self._dataset_rows("blocks", "SELECT hash, body FROM {source} WHERE hash IN (SELECT unnest($1))",
                                        hashes, session_id)
        else:
            bodies = dict(self.rows("SELECT hash, body FROM blocks WHERE rowid IN "
                                    "(SELECT rowid FROM blocks WHERE hash IN (SELECT unnest($1)))", [hashes]))
        for used_by, hs in uses.items():
            for h in hs:
                if bodies.get(h) is None:
                    self._missing_block(h, used_by, h in bodies)
        return bodies

    def _missing_block(self, block_hash: str, used_by: str, present: bool) -> NoReturn:
        what = "has a NULL body (blocks.body)" if present else "is missing from table blocks"
        raise StoreError(damaged(self.path, f"block {block_hash!r} (referenced by {used_by}) {what}"))

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        rows = self.rows(
            "SELECT message FROM session_messages WHERE session_id = ? AND NOT compacted ORDER BY seq",
            [session_id],
        )
        return self.resolve_refs([json.loads(r[0]) for r in rows], session_id=session_id)

    def built_from(self, session_id: str) -> tuple[int, int, bool] | None:
        """(index, history length, messages stored after it?) of the session's last request a strategy built
        from its history (``turns.n_messages``); None when there is none (or it predates m006)."""
        row = self.one("SELECT idx, n_messages FROM turns WHERE session_id = ? AND n_messages IS NOT NULL "
                       "ORDER BY idx DESC LIMIT 1", [session_id])
        if row is None:
            return None
        later = self.scalar("SELECT count(*) FROM session_messages WHERE session_id = ? AND turn_idx > ?",
                            [session_id, row[0]])
        return row[0], row[1], bool(later)

    def history_of(self, session_id: str, idx: int, n_messages: int) -> list[dict[str, Any]]:
        """The ``n_messages`` history messages request ``idx`` was built from: the request's own rows are the
        last of its epoch (its new messages and its reply, which is left out), so they are the ``n + 1``
        latest rows up to its index, compacted since or not."""
        rows = self.rows("SELECT message FROM session_messages WHERE session_id = ? AND turn_idx <= ? "
                         "ORDER BY seq DESC LIMIT ?", [session_id, idx, n_messages + 1])
        refs = [json.loads(r[0]) for r in reversed(rows)]
        return self.resolve_refs(refs[:n_messages], session_id=session_id)

    def write_messages(self, session_id: str, turn_idx: int, messages: list[tuple[int, dict[str, Any]]],
                       extra_blocks: Sequence[tuple[Any, ...]] = (),
                       tokenizer: Tokenizer | SegmentMemo | None = None) -> None:
        """Append conversation messages (inside the caller's transaction), with their new blocks."""
        pending: dict[str, tuple[Any, ...]] = {r[0]: r for r in extra_blocks if r[0] not in self._pending_known}
        rows = [(session_id, seq, turn_idx, self.message_ref(m, pending, tokenizer), False) for seq, m in messages]
        self._insert("blocks", list(pending.values()))
        self._pending_known.update(pending)
        self._insert("session_messages", rows)

    def compact_messages(self, session_id: str) -> None:
        """Mark a session's history compacted (inside the caller's transaction): replaced by what follows."""
        self.con.execute("UPDATE session_messages SET compacted = true WHERE session_id = ?", [session_id]).fetchall()
        deferred = self._buffer.get("session_messages") if self._buffer is not None else None
        if deferred:  # rows a batch() has not written yet are part of that history too
            self._buffer["session_messages"] = [  # type: ignore[index]
                (*r[:4], True) if r[0] == session_id else r for r in deferred]

    def message_count(self, session_id: str) -> int:
        return int(self.scalar("SELECT count(*) FROM session_messages WHERE session_id = ?", [session_id]))

    def deltas(self, session_id: str) -> list[Delta]:
        out = []
        for seq, sel, content in self.rows(
            "SELECT seq, selector, content FROM session_prompt_deltas WHERE session_id = ? ORDER BY seq",
            [session_id],
        ):
            try:
                out.append(Delta(seq, json.loads(sel), json.loads(content)))
            except ValueError:
                continue  # a corrupt row is skipped, as Lore's replay does
        return out

    def deltas_frame(self, session_id: str) -> pd.DataFrame:
        """A session's ``session_prompt_deltas`` rows as stored (JSON columns as text), by seq."""
        return self.sql("SELECT seq, project_id, selector, content FROM session_prompt_deltas WHERE session_id = ? "
                        "ORDER BY seq", [session_id])

    # -- requests -----------------------------------------------------------------------------
    def new_blocks(self, req: PreparedRequest, rest_body: str, rest_hash: str, *, shared: int = 0
                   ) -> list[tuple[Any, ...]]:
        """``blocks`` rows for the request's segments not stored yet, and its ``rest`` row.

        ``shared``: how many leading segments the request shares with the session's previous stored request
        (the common run of chain keys, whose block hashes are in them): their blocks were written with that
        request, so the walk starts after them — O(new segments) per turn instead of O(segments). A block written
        earlier in the open transaction is left out too. The canonical JSON ``prepare(keep_texts=True)`` kept is
        used (and dropped), not serialised again.
        """
        rows: list[tuple[str, str, str, int | None, int]] = []  # (hash, kind, body, tokens, bytes)
        seen: set[str] = set()
        known, pending = self._known_blocks, self._pending_known
        texts = req.derived.texts or {}
        req.derived.texts = None
        for s in req.segments[shared:] if shared else req.segments:
            h = s.block_hash
            if h in known or h in seen or h in pending:
                continue
            got = texts.get(h)
            if got is None:
                body = canonical_json(s.element)
                got = body, len(body.encode())
            rows.append((h, s.kind, got[0], s.tokens, got[1]))
            seen.add(h)
        if rest_hash not in self._known_blocks and rest_hash not in seen:
            rows.append((rest_hash, "rest", rest_body, None, len(rest_body.encode())))
        return rows

    def write_request(self, write: RequestWrite, *, tokenizer: Tokenizer | SegmentMemo | None = None) -> None:
        """Write one request and everything it changed (:class:`~promptcache_nb.RequestWrite`) in one
        transaction, joined to the caller's; nothing on failure. ``tokenizer`` counts new message blocks."""
        rec = write.record
        sid = rec.session_id
        with self.transaction():
            assert rec.rest_hash is not None  # the pipeline's record of an analysed body
            block_rows = self.new_blocks(write.prepared, write.rest_body, rec.rest_hash, shared=write.shared)
            if write.reply_blocks:
                # the reply's content blocks are stored once, in blocks (shared with the history row)
                pending = {r[0]: r for r in block_rows}
                self._add_blocks(write.reply_blocks, pending, tokenizer)
                block_rows = list(pending.values())
            # request blocks and the messages' new blocks go in one insert
            self.write_messages(sid, rec.idx, write.messages, block_rows, tokenizer)
            node_rows = self._new_nodes(write.prepared, write.nodes, write.shared)
            self._insert("prefix_nodes", node_rows)
            self._pending_nodes.update(r[0] for r in node_rows)
            con = self.con
            for op, seq, selector, content in write.delta_ops:
                if op == "delete":
                    con.execute("DELETE FROM session_prompt_deltas WHERE session_id = ? AND seq = ?",
                                [sid, seq]).fetchall()
                else:
                    con.execute("INSERT OR REPLACE INTO session_prompt_deltas VALUES (?, ?, ?, ?, ?)",
                                [sid, seq, write.project_id, canonical_json(selector),
                                 canonical_json(content)]).fetchall()
            if write.state is not None:
                self.write_state(sid, write.state, rec.sent_at, previous=write.state_previous)
            if write.consumes_pending_events:
                self.clear_pending_events(sid)
            if self._buffer is not None:
                self._buffer.setdefault("turns", []).append(rec)
                return
            con.execute(_INSERT_REQUEST, _RECORD_VALUES(rec)).fetchall()

    def _new_nodes(self, req: PreparedRequest, nodes: list[str], shared: int) -> list[tuple[Any, ...]]:
        """``prefix_nodes`` rows for the nodes after the ``shared`` ones that are not stored (nor pending) yet."""
        rows = []
        for i in range(shared, len(nodes)):
            node = nodes[i]
            if node not in self._known_nodes and node not in self._pending_nodes:
                seg = req.segments[i]
                rows.append((node, nodes[i - 1] if i else None, i, seg.kind, seg.role, seg.block_hash))
        return rows

    def read_request(self, session_id: str, idx: int) -> RequestRecord | None:
        """A stored request's :class:`~promptcache_nb.RequestRecord` (None when it does not exist)."""
        rows = self.query(f"SELECT {_RECORD_SELECT} FROM turns WHERE session_id = ? AND idx = ?", [session_id, idx])
        if not rows:
            return None
        row = rows[0]
        row["sent_at"] = row["sent_at"].astimezone(UTC)
        return RequestRecord(**row)

    def turn_body(self, session_id: str, idx: int) -> dict[str, Any]:
        """Rebuild a turn's exact request body from ``blocks`` + ``prefix_nodes`` + ``turns`` (for OpenAI
        dialects and partial bodies a ``LoggedBody`` that ``prepare`` turns back into the same segments)."""
        return self.turn_bodies(session_id, [idx])[idx]

    def turn_bodies(self, session_id: str, indexes: Sequence[int]) -> dict[int, dict[str, Any]]:
        """:meth:`turn_body` of several turns of one session (a turn and the one before it), their prefix nodes
        read together where they were written (:meth:`_session_chain`), never by a walk up the whole table."""
        wanted = sorted(set(indexes))
        found = {r[0]: (r[1], r[2]) for r in self.rows(
            "SELECT idx, tail_node, rest_hash FROM turns WHERE session_id = ? AND idx IN (SELECT unnest(?))",
            [session_id, wanted])}
        for idx in wanted:
            if idx not in found:
                raise StoreError(f"session {session_id!r} has no turn {idx}")
        nodes = self._session_chain(session_id, "session_id = ? AND idx IN (SELECT unnest(?))",
                                    [session_id, wanted], whole_session=False)
        bodies = self.block_bodies({"turns.rest_hash": [rest for _, rest in found.values()],
                                    "prefix_nodes.block_hash": [n[3] for n in nodes.values()]}, session_id=session_id)
        out: dict[int, dict[str, Any]] = {}
        for idx in wanted:
            tail, rest_hash = found[idx]
            chain: list[tuple[Any, Any, Any]] = []
            node = tail
            while node is not None:
                parent, kind, role, block_hash = nodes[node]
                # parsed per body: never shared
                chain.append((kind, role, self.parse_block(block_hash, bodies[block_hash], "prefix_nodes.block_hash")))
                node = parent
            rest = self.parse_block(rest_hash, bodies[rest_hash], "turns.rest_hash")
            out[idx] = rebuild_body(rest["shape"], rest["rest"], chain[::-1])
        return out

    # -- reads for analysis: dict rows and typed records, never positions -----------------------------------
    def query(self, sql: str, params: list[Any] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """All rows of a query as dicts keyed by column name (sqlite-utils' ``db.query``)."""
        con = self._live()
        try:
            cur = con.execute(sql, params or [])
            names = [d[0] for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        except duckdb.Error as exc:
            raise StoreError(f"store {self.path!r}: {_one_line(exc)}") from None

    def _turn_columns(self, columns: Sequence[str] | None) -> str:
        known = self._table_columns("turns")
        if columns is None:
            columns = known
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise StoreError(f"turns has no column {', '.join(map(repr, unknown))}; columns: {', '.join(known)}")
        return ", ".join('"' + c + '"' for c in columns)

    def turn_row(self, session_id: str, idx: int, columns: Sequence[str] | None = None) -> dict[str, Any] | None:
        """One stored request's ``turns`` columns (all, or ``columns``) as a dict; None when it does not exist.
        JSON columns (``cache_detail``, ``events``, ``changes``...) are returned as stored text."""
        rows = self.query(f"SELECT {self._turn_columns(columns)} FROM turns WHERE session_id = ? AND idx = ?",
                          [session_id, idx])
        return rows[0] if rows else None

    def turn_rows(self, session_id: str, columns: Sequence[str] | None = None, *,
                  since: datetime | None = None) -> list[dict[str, Any]]:
        """A session's stored requests in order, as dicts of their ``turns`` columns (all, or ``columns``);
        with ``since``, only those sent at or after it."""
        where, params = _since(session_id, since)
        return self.query(f"SELECT {self._turn_columns(columns)} FROM turns WHERE {where} ORDER BY idx", params)

    def turns_frame(self, session_id: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """:meth:`turn_rows` as a DataFrame, with DuckDB's own column types (NULL integers as NaN)."""
        return self.sql(f"SELECT {self._turn_columns(columns)} FROM turns WHERE session_id = ? ORDER BY idx",
                        [session_id])

    def provider_diagnosed_turns(self, columns: Sequence[str], session_id: str | None = None) -> pd.DataFrame:
        """``columns`` (and ``session_id``) of the requests the provider diagnosed (``provider_cache_miss_reason``
        not NULL), of one session or of all, by session and index."""
        where, params = ("AND session_id = ?", [session_id]) if session_id is not None else ("", [])
        cols = self._turn_columns(["session_id", *(c for c in columns if c != "session_id")])
        return self.sql(f"SELECT {cols} FROM turns WHERE provider_cache_miss_reason IS NOT NULL {where} "
                        "ORDER BY session_id, idx", params)

    def usage_marks(self, session_id: str, upto: int | None = None) -> UsageMarks | None:
        """Where a session's usage stands after request ``upto`` (default: the last): see :class:`UsageMarks`.
        None when it has no request yet."""
        where = "session_id = ?" if upto is None else "session_id = ? AND idx <= ?"
        params: list[Any] = [session_id] if upto is None else [session_id, upto]
        rows = self.query(
            f"""SELECT max(idx) AS last_idx,
                       max(idx) FILTER (WHERE cache_read_input_tokens IS NOT NULL) AS read_idx,
                       max(sent_at) FILTER (WHERE cache_read_input_tokens IS NOT NULL
                                         OR cache_creation_input_tokens IS NOT NULL) AS touch_at
                FROM turns WHERE {where}""",
            params,
        )
        if not rows or rows[0]["last_idx"] is None:
            return None
        return UsageMarks(**rows[0])

    def rest_bodies(self, session_id: str, *, since: datetime | None = None) -> dict[str, str]:
        """The ``rest`` blocks (a body's shape and its top-level fields) of a session's requests (``since``: sent
        at or after it): hash -> JSON."""
        return self.session_blocks(session_id, since=since, nodes=False)[0]

    def session_nodes(self, session_id: str, *, since: datetime | None = None) -> dict[str, StoredNode]:
        """Every prefix node a session's requests (``since``: sent at or after it) run through (node id ->
        :class:`StoredNode`): :meth:`session_blocks`."""
        return self.session_blocks(session_id, since=since, rests=False)[1]

    def session_blocks(self, session_id: str, *, since: datetime | None = None, rests: bool = True,
                       nodes: bool = True) -> tuple[dict[str, str], dict[str, StoredNode]]:
        """What rebuilds a session's request bodies (``since``: those sent at or after it): their ``rest`` blocks
        (:meth:`rest_bodies`) and every prefix node they run through (:meth:`session_nodes`), with the bodies
        read in one query (``rests`` / ``nodes`` False: leave those out).

        Read by where the nodes were written, never by scanning the whole table once per level: a request's new
        nodes are appended just before its tail node, so the nodes on its chain that it wrote lie within
        ``depth`` rows before that tail. The session's rows are read in one query and its chains walked here;
        a node another session wrote (a shared system prompt, a forked history) is looked up by id and the rows
        before it read the same way. (A recursive walk scanned ``prefix_nodes`` at every level: depth x store
        size, and with the bodies joined about 1 s per session of a heavy user's 29,000-request store.)
        """
        where, params = _since(session_id, since)
        rest_hashes = [r[0] for r in self.rows(
            f"SELECT DISTINCT rest_hash FROM turns WHERE {where} ORDER BY 1", params)] if rests else []
        chain = self._session_chain(session_id, where, params) if nodes else {}
        bodies = self.block_bodies({"turns.rest_hash": rest_hashes,
                                    "prefix_nodes.block_hash": [r[3] for r in chain.values()]}, session_id=session_id)
        return ({h: bodies[h] for h in rest_hashes},
                {node: StoredNode(parent, kind, role, h, bodies[h]) for node, (parent, kind, role, h) in chain.items()})

    def _session_chain(self, session_id: str, where: str, params: list[Any], *, whole_session: bool = True
                       ) -> dict[str, tuple[Any, ...]]:
        """:meth:`session_blocks`' nodes, without their bodies: id -> parent, kind, role, block_hash, for the
        requests ``where`` selects. ``whole_session``: first read around every request's tail (most chains of the
        session run through those rows), else around the selected requests' tails only (a turn or two)."""
        tails = [r[0] for r in self.rows(
            f"SELECT DISTINCT tail_node FROM turns WHERE {where} AND tail_node IS NOT NULL ORDER BY 1", params)]
        rows: dict[str, tuple[Any, ...]] = {}
        out: dict[str, tuple[Any, ...]] = {}
        todo = tails
        lookup: tuple[str, list[Any]] = (
            ("SELECT tail_node FROM turns WHERE session_id = $1", [session_id]) if whole_session
            else ("SELECT unnest($1)", [tails]))
        while todo:
            rows.update(self._chains_up(todo, session_id) if self._views else self._nodes_before(*lookup))
            missing = []
            for node in todo:
                if node not in rows:  # a node gone would surface as a KeyError in whoever walks the chain
                    raise StoreError(damaged(self.path, f"prefix node {node!r} (on a request of session "
                                                        f"{session_id!r}) is missing from prefix_nodes"))
                cur: str | None = node
                while cur is not None and cur not in out:
                    if cur not in rows:
                        missing.append(cur)
                        break
                    out[cur] = rows[cur]
                    cur = rows[cur][0]
            todo = missing
            lookup = ("SELECT unnest($1)", [missing])
        looping = node_on_cycle(out)
        if looping is not None:  # a walk up the chain would never reach a root
            raise StoreError(damaged(self.path, f"prefix_nodes row {looping!r} (on a request of session "
                                                f"{session_id!r}) is its own ancestor: prefix_nodes.parent "
                                                "runs in a cycle"))
        return out

    def _nodes_before(self, ids_sql: str, params: list[Any]) -> dict[str, tuple[Any, ...]]:
        """The ``prefix_nodes`` rows (id -> parent, kind, role, block_hash) of the nodes ``ids_sql`` selects and
        of the ``depth`` rows before each: what the requests that wrote them wrote (other rows in between too)."""
        ranges: list[list[int]] = []
        for rowid, depth in self.rows(f"SELECT rowid, depth FROM prefix_nodes WHERE id IN ({ids_sql}) ORDER BY rowid",
                                      params):
            if ranges and rowid - depth <= ranges[-1][1] + 1:
                ranges[-1][1] = rowid
            else:
                ranges.append([rowid - depth, rowid])
        if not ranges:
            return {}
        where = " OR ".join("rowid BETWEEN ? AND ?" for _ in ranges)
        found = self.rows(f"SELECT id, parent, kind, role, block_hash FROM prefix_nodes WHERE {where}",
                          [x for r in ranges for x in r])
        return {r[0]: r[1:] for r in found}

    def _chains_up(self, nodes: Sequence[str], session_id: str) -> dict[str, tuple[Any, ...]]:
        """The ``prefix_nodes`` rows from ``nodes`` up to their roots (id -> parent, kind, role, block_hash), in
        one recursive query (a fleet dataset's views have no row ids: :meth:`_dataset_rows`); a node not stored
        is left out."""
        found: dict[str, tuple[Any, ...]] = {}
        for source in self._dataset_sources("prefix_nodes", session_id):
            # a chain cut where this file group's files end comes back to the caller's loop as a missing parent
            starts = [n for n in nodes if n not in found]
            if not starts:
                break
            found.update((r[0], r[1:]) for r in self.rows(
                f"""WITH RECURSIVE chain(id) USING KEY (id) AS (
                       SELECT unnest($1)
                       UNION
                       SELECT p.parent FROM {source} p JOIN chain c ON p.id = c.id WHERE p.parent IS NOT NULL)
                   SELECT n.id, n.parent, n.kind, n.role, n.block_hash FROM chain c JOIN {source} n ON n.id = c.id""",
                [starts]))
        return found

    # -- a fleet dataset's reads: by where the rows were written ------------------------------------------
    def _dataset_sources(self, table: str, session_id: str | None) -> list[str]:
        """Where to look up a content-addressed table's rows for ``session_id``, in order: the files of the file
        group that wrote the session (it wrote every row the session uses, unless another group stored part of
        it), then every file. Never the table's view: it keeps one row per key across all the files (``DISTINCT
        ON``), a pass over all of them per lookup (7 s for 1,500 blocks of a 200-session dataset, 0.1 s in the
        session's group's file)."""
        groups = self._dataset_groups(session_id) if session_id is not None else []
        return [*(parquet_source(self.path, table, g) for g in groups), parquet_source(self.path, table)]

    def _dataset_groups(self, session_id: str) -> list[str]:
        """The file groups whose ``sessions`` files hold ``session_id`` (usually one)."""
        got = self._session_groups.get(session_id)
        if got is None:
            files = self.rows(f"SELECT DISTINCT filename FROM {parquet_source(self.path, 'sessions', filename=True)} "
                              "WHERE id = $1", [session_id])
            got = self._session_groups[session_id] = sorted({group_of_file(f) for (f,) in files})
        return got

    def _dataset_rows(self, table: str, query: str, keys: list[str], session_id: str | None) -> dict[str, Any]:
        """key -> value of ``query`` (``{source}`` a table's files, ``$1`` the keys) over
        :meth:`_dataset_sources`: each source asked only for the keys the ones before it lacked."""
        found: dict[str, Any] = {}
        todo = keys
        for source in self._dataset_sources(table, session_id):
            found.update(self.rows(query.format(source=source), [todo]))
            todo = [k for k in todo if k not in found]
            if not todo:
                break
        return found

    # -- every session at once (store/_rollups.py: the rebuild rule and the totals in SQL) -------------------
    def rebuild_rows(self, session_ids: Sequence[str] | None = None, *, noise_floor: int,
                     not_rebuild: Sequence[str]) -> list[dict[str, Any]]:
        """The rebuilds of every session (or of ``session_ids``), ordered by session and index, with what a
        rebuild row needs (usage, totals, the gap, the stored cause); a legacy session (a cause never stored)
        gives its first row only, ``legacy`` true. The rule: ``store/_rollups.py``. Dict rows, NULL as None: a
        DataFrame of them cost a third of one session's call."""
        where, ids = _rollups.where_sessions(None if session_ids is None else list(session_ids), "$3")
        return self.query(_rollups.REBUILD_ROWS.format(where=where), [list(not_rebuild), noise_floor, ids])

    def session_totals(self, session_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """One row per session (every session, or ``session_ids``), oldest first: its identity (project, strategy,
        cache model, model, parent, source) and the sums of its requests (dict rows, NULL as None)."""
        ids = None if session_ids is None else list(session_ids)
        where, value = _rollups.where_sessions(ids, "$1")
        where_s = _rollups.where_sessions(ids, "$1", "s.id")[0]
        return self.query(_rollups.SESSION_TOTALS.format(where=where, where_s=where_s), [value])

    def first_reads(self, default_account: str) -> list[dict[str, Any]]:
        """Each account-scope session's first request, with the likely writer of what it read
        (``store/_rollups.py``: ``FIRST_READS``), oldest first (dict rows, NULL as None)."""
        return self.query(_rollups.FIRST_READS, [default_account])

    def group_totals(self, by: str, *, window_starts: Sequence[Any] = ()) -> pd.DataFrame:
        """The measured requests' sums per ``by`` (``project``, ``model``, ``day`` or ``hour``, UTC, or ``window``:
        the latest of ``window_starts`` at or before each request), one row per group."""
        key = _rollups.GROUP_KEYS.get(by)
        if key is None:
            raise ValueError(f"cannot group by {by!r}; choose one of: {', '.join(_rollups.GROUP_KEYS)}")
        if by == "window":
            return self.sql(_rollups.GROUP_TOTALS.format(key=key, windows=_rollups.WINDOW_JOIN),
                            [list(window_starts)])
        return self.sql(_rollups.GROUP_TOTALS.format(key=key, windows=""))

    def measured_times(self) -> list[Any]:
        """The time of every measured request (live or imported usage), oldest first."""
        return [r[0] for r in self.rows(_rollups.MEASURED_TIMES)]

    def session_requests(self, session_id: str) -> list[dict[str, Any]]:
        """One session's requests in order: ``idx, at, model, cache_read, cache_write, uncached, output, cost_usd,
        cost_no_cache_usd, usage`` (``measured`` / ``simulated``) and ``cause`` (the stored explanation, else the
        reason code, else None: not analysed yet). Dict rows, NULL as None."""
        return self.query(_rollups.SESSION_REQUESTS, [session_id])

    # -- calibrations ---------------------------------------------------------------------------------------
    def measured_totals(self, *, session_id: str | None = None,
                        models: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every request with complete measured usage (live or imported), in session order: ``session_id``,
        ``model``, ``estimated`` (the stored estimate ``total_tokens``), ``measured`` (input + cache read +
        write), ``partial`` (a partial body: its unlogged prefix was sized from measured usage), ``unlogged``
        (that prefix's tokens, 0 for a full body) and ``calibrated`` (its session opted in to a calibration, so
        its estimate is already scaled). Only one session's, or only those of ``models``, when given."""
        where, params = "", list[Any]()
        if session_id is not None:
            where, params = where + " AND session_id = ?", [*params, session_id]
        if models is not None:
            where, params = where + " AND model IN (SELECT unnest(?))", [*params, list(models)]
        return self.query(
            f"""WITH m AS (SELECT session_id, idx, model, total_tokens, rest_hash,
                                  input_tokens + cache_read_input_tokens + cache_creation_input_tokens AS measured
                           FROM turns
                           -- a usage-first request has no estimate to compare yet (NULL until analysed)
                           WHERE usage_source IN ('live', 'imported') AND input_tokens IS NOT NULL
                                 AND total_tokens IS NOT NULL
                                 AND cache_read_input_tokens IS NOT NULL AND cache_creation_input_tokens IS NOT NULL
                                 {where})
               SELECT m.session_id, m.model, m.total_tokens AS estimated, m.measured,
                      coalesce(b.partial, false) AS partial, coalesce(b.unlogged, 0) AS unlogged,
                      coalesce(json_type(s.config, '$.calibration'), 'NULL') <> 'NULL' AS calibrated
               FROM m JOIN sessions s ON s.id = m.session_id
               -- only the rest blocks of these turns (a turn's rest_hash is one): the filter on kind is pushed into
               -- the scan, so the segment bodies (nearly all of the store) are never read
               LEFT JOIN (SELECT hash, json_extract(body, '$.shape.unlogged') IS NOT NULL AS partial,
                                 coalesce(try_cast(json_extract(body, '$.shape.unlogged') AS BIGINT), 0) AS unlogged
                          FROM blocks WHERE kind = 'rest' AND hash IN (SELECT rest_hash FROM m)) b
                         ON b.hash = m.rest_hash
               ORDER BY m.session_id, m.idx""", params)

    def measured_models(self) -> list[str]:
        """The models of the requests whose usage was measured (live or imported), sorted."""
        return [r["model"] for r in self.query(
            "SELECT DISTINCT model FROM turns WHERE usage_source IN ('live', 'imported') ORDER BY model")]

    def clear_calibrations(self) -> None:
        """Forget every saved calibration (a fleet dataset's are fitted again over the whole dataset)."""
        self._live().execute("DELETE FROM calibrations")

    def models_of(self, session_ids: Sequence[str]) -> list[str]:
        """The models the requests of ``session_ids`` used, sorted."""
        if not session_ids:
            return []
        return [r[0] for r in self._live().execute(
            "SELECT DISTINCT model FROM turns WHERE session_id IN (SELECT unnest(?)) AND model IS NOT NULL "
            "ORDER BY model", [list(session_ids)]).fetchall()]

    CALIBRATION_COLUMNS = ("model", "tokenizer", "ratio", "overhead", "n", "mean_abs_error_pct", "max_abs_error_pct",
                           "raw_mean_abs_error_pct", "loo_mean_abs_error_pct", "fitted_at")

    def save_calibration(self, values: dict[str, Any]) -> None:
        """Insert (or replace) a ``calibrations`` row, in one transaction; ``values`` keyed by column."""
        cols = self.CALIBRATION_COLUMNS
        with self.transaction():  # rolls back on failure, never after a COMMIT that went through
            self.con.execute(
                f"INSERT OR REPLACE INTO calibrations ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [values[c] for c in cols],
            ).fetchall()

    def latest_calibration(self, model: str, tokenizer: str) -> dict[str, Any] | None:
        """The newest ``calibrations`` row of ``(model, tokenizer)`` as a dict, or None."""
        rows = self.query(
            f"""SELECT {', '.join(self.CALIBRATION_COLUMNS)} FROM calibrations WHERE model = ? AND tokenizer = ?
                ORDER BY fitted_at DESC LIMIT 1""",
            [model, tokenizer],
        )
        return rows[0] if rows else None

    def saved_calibrations(self) -> list[tuple[str, str]]:
        """The ``(model, tokenizer)`` pairs with a saved calibration, sorted."""
        return [(r["model"], r["tokenizer"]) for r in self.query(
            "SELECT DISTINCT model, tokenizer FROM calibrations ORDER BY model, tokenizer")]


_RECORD_COLUMNS = RequestRecord.columns()
_RECORD_SELECT = ", ".join('"' + c + '"' for c in _RECORD_COLUMNS)
_RECORD_VALUES = attrgetter(*_RECORD_COLUMNS)
_INSERT_REQUEST = f"INSERT INTO turns ({_RECORD_SELECT}) VALUES ({', '.join('?' * len(_RECORD_COLUMNS))})"


def _since(session_id: str, since: datetime | None) -> tuple[str, list[Any]]:
    """A ``turns`` filter: one session's requests, sent at or after ``since`` when given."""
    if since is None:
        return "session_id = ?", [session_id]
    return 'session_id = ? AND sent_at >= ?', [session_id, since]


class UsageMarks(NamedTuple):
    """Where a session's usage stands after a request (:meth:`Store.usage_marks`)."""

    last_idx: int  #: the last request
    read_idx: int | None  #: the last request whose cache read is known (not NULL)
    touch_at: datetime | None  #: when a request last read or wrote the cache (its usage says so)


class StoredNode(NamedTuple):
    """One ``prefix_nodes`` row with its block's body (:meth:`Store.session_nodes`)."""

    parent: str | None
    kind: str
    role: str | None
    block_hash: str
    body: str  #: the segment's canonical JSON


def _run_callback(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # a listener's bug must not turn a stored write into a failed one
        import logging

        logging.getLogger(__name__).exception("store: an after-commit listener failed")
