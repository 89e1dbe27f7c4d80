"""The store as a Parquet dataset (``pc.fleet``): each file group's tables written as Parquet files, and a store
whose tables are DuckDB views over them.

Layout of a dataset directory (DuckDB, pandas/pyarrow, Dask and Spark read it as it is)::

    OUT/turns/project=<project>/day=<YYYY-MM-DD>/<group>_0.parquet   (Hive partitions, values %-escaped)
    OUT/sessions/project=<project>/<group>_0.parquet
    OUT/<table>/<group>.parquet                                       (every other table)

Every file holds exactly the store's columns (the partition columns come from the directory names), written by
one file group: re-importing a group replaces its files and nothing else. Content-addressed tables (``blocks``,
``prefix_nodes``, ``projects``) may hold the same row in several groups' files; their views keep one.

``OUT`` may be an fsspec URL (``s3://bucket/fleet``, ``memory://fleet``) where fsspec and that protocol's package
are installed: files are written locally, then put there, and DuckDB reads them through the fsspec filesystem.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from ..errors import StoreError

if TYPE_CHECKING:
    import duckdb

#: Tables written per group, and their Hive partitioning (turns by project and day, sessions by project).
PARTITIONS: dict[str, tuple[str, ...]] = {"turns": ("project", "day"), "sessions": ("project",)}
#: Tables whose rows are keyed by content: several groups may write the same row.
CONTENT_KEYS = {"blocks": "hash", "prefix_nodes": "id", "projects": "id"}
#: Fitted once over the whole dataset (``pc.fleet.import_logs``), never per group.
DATASET_TABLES = ("calibrations",)
#: Columns a migration renamed: table -> {name now: name in files written before}. A dataset grown across
#: versions holds both (``union_by_name``); its views read either.
RENAMED_COLUMNS: dict[str, dict[str, str]] = {"turns": {"sent_at": "at"}}  # m011_sent_at
_SKIP = {"_migrations", *DATASET_TABLES}
#: Temporary folders of a fleet import are named ``<prefix><pid>-…``: a later import removes those whose process
#: is gone (``kill -9`` leaves them behind).
TEMP_PREFIX = "pcnb-fleet-"


def dataset_fs(out: str) -> tuple[Any, str]:
    """``(fsspec filesystem, path in it)`` for a URL ``out`` (``s3://...``), or ``(None, out)`` for a local folder."""
    if "://" not in out or out.startswith("file://"):
        return None, out.removeprefix("file://")
    try:
        import fsspec  # type: ignore[import-untyped]  # optional, ~0.2 s to load: only a dataset URL needs it
    except ImportError:
        raise StoreError(f"{out!r}: a URL needs fsspec (pip install fsspec and the protocol's package)") from None
    try:
        fs, path = fsspec.core.url_to_fs(out)
    except (ImportError, ValueError) as exc:
        raise StoreError(f"{out!r}: {exc}") from None
    return fs, path


@contextmanager
def _local(out: str) -> Iterator[str]:
    """A local folder to write ``out``'s files in: ``out`` itself, or a temporary one put to the URL at the end."""
    fs, root = dataset_fs(out)
    if fs is None:
        yield out
        return
    tmp = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
    try:
        yield tmp
        for dirpath, _, names in os.walk(tmp):
            for name in names:
                local = os.path.join(dirpath, name)
                fs.put(local, root + "/" + os.path.relpath(local, tmp).replace(os.sep, "/"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                       "AND NOT temporary ORDER BY table_name").fetchall()
    return [r[0] for r in rows if r[0] not in _SKIP]


def _quote(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"


def group_files(out: str, group: str, tables: Sequence[str] | None = None) -> list[str]:
    """The files ``group`` wrote under ``out`` (of ``tables``, default all), as paths in its filesystem, sorted."""
    fs, root = dataset_fs(out)
    found: set[str] = set()
    for pattern in ([f"{t}/**/{group}_*.parquet" for t in tables] + [f"{t}/{group}.parquet" for t in tables]
                    if tables else [f"**/{group}_*.parquet", f"**/{group}.parquet"]):
        found.update(glob.glob(os.path.join(out, pattern), recursive=True) if fs is None
                     else fs.glob(root + "/" + pattern))
    return sorted(found)


def remove_group(out: str, group: str, tables: Sequence[str] | None = None) -> int:
    """Delete the files ``group`` wrote under ``out`` (of ``tables``, default all); returns how many."""
    fs, _ = dataset_fs(out)
    found = group_files(out, group, tables)
    for f in found:
        os.remove(f) if fs is None else fs.rm(f)
    return len(found)


def group_outputs(out: str, group: str) -> list[list[Any]]:
    """``[path relative to out, size, sha256]`` of each file ``group`` wrote: what a fleet manifest records, and
    checks before it calls a group unchanged (a file deleted, truncated or rewritten since is imported again)."""
    fs, root = dataset_fs(out)
    base = (out if fs is None else root).rstrip("/")
    return [[f[len(base) + 1:].replace(os.sep, "/"), *file_digest(f, fs)] for f in group_files(out, group)]


def unreadable_parquet(paths: Sequence[str]) -> dict[str, str]:
    """path -> DuckDB's first error line, for each local file of ``paths`` that cannot be read as Parquet."""
    bad: dict[str, str] = {}
    con = duckdb.connect()
    try:
        for path in paths:
            try:
                con.execute("SELECT count(*) FROM read_parquet(?)", [path]).fetchall()
            except duckdb.Error as exc:
                bad[path] = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    finally:
        con.close()
    return bad


def file_digest(path: str, fs: Any = None) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read a megabyte at a time (``fs``: its fsspec filesystem, None: local)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") if fs is None else fs.open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def export_group(con: duckdb.DuckDBPyConnection, out: str, group: str) -> None:
    """Write every table of a store's connection ``con`` (one file group's import) as Parquet files named after
    ``group``, replacing the files that group wrote before."""
    remove_group(out, group)
    with _local(out) as local:
        _export_group(con, local, group)


def _export_group(con: duckdb.DuckDBPyConnection, out: str, group: str) -> None:
    for table in _tables(con):
        target = os.path.join(out, table)
        os.makedirs(target, exist_ok=True)
        parts = PARTITIONS.get(table)
        if table == "turns":
            query = ("SELECT t.*, s.project_id AS project, CAST(timezone('UTC', t.sent_at) AS DATE) AS day "
                     "FROM turns t JOIN sessions s ON s.id = t.session_id")
        elif table == "sessions":
            query = "SELECT *, project_id AS project FROM sessions"
        else:
            query = f"SELECT * FROM {table}"
        if parts:
            if not con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]:  # type: ignore[index]
                continue  # a partitioned COPY of no rows writes nothing either
            con.execute(f"COPY ({query}) TO {_quote(target)} (FORMAT parquet, COMPRESSION zstd, "
                        f"PARTITION_BY ({', '.join(parts)}), FILENAME_PATTERN {_quote(group + '_{i}')}, "
                        "OVERWRITE_OR_IGNORE true)")
        else:
            con.execute(f"COPY ({query}) TO {_quote(os.path.join(target, group + '.parquet'))} "
                        "(FORMAT parquet, COMPRESSION zstd)")


def export_dataset_tables(con: duckdb.DuckDBPyConnection, out: str) -> None:
    """Write the tables fitted over the whole dataset (:data:`DATASET_TABLES`) as ``OUT/<table>/dataset.parquet``."""
    with _local(out) as local:
        for table in DATASET_TABLES:
            target = os.path.join(local, table)
            os.makedirs(target, exist_ok=True)
            tmp = os.path.join(target, "dataset.parquet.tmp")
            con.execute(f"COPY (SELECT * FROM {table}) TO {_quote(tmp)} (FORMAT parquet)")
            os.replace(tmp, os.path.join(target, "dataset.parquet"))


def parquet_files(out: str, table: str, group: str | None = None) -> str:
    """The glob of one table's files: every file, or the one ``group`` wrote (an unpartitioned table's)."""
    return out.rstrip("/") + (f"/{table}/{group}.parquet" if group is not None else f"/{table}/**/*.parquet")


def parquet_source(out: str, table: str, group: str | None = None, *, filename: bool = False) -> str:
    """A ``read_parquet`` of :func:`parquet_files` (a content-addressed table's rows as written: the same row may
    come from several groups)."""
    return (f"read_parquet({_quote(parquet_files(out, table, group))}, hive_partitioning = true, union_by_name = true"
            f"{', filename = true' if filename else ''})")


def _column(name: str, old: str | None, wrote: set[str]) -> str:
    """The expression reading column ``name`` of a dataset whose files hold the columns ``wrote``: NULL for a
    column added by a migration after every file was written (m012's ``reasoning_tokens``)."""
    if old is not None and old in wrote:
        return f'coalesce("{name}", "{old}")' if name in wrote else f'"{old}"'
    return f'"{name}"' if name in wrote else "NULL"


#: The file group that wrote a file, from its path: ``.../<group>.parquet`` or ``.../<group>_<i>.parquet`` (a regular
#: expression both Python and DuckDB's ``regexp_extract`` read).
GROUP_FILE_PATTERN = r"([^/\\]+?)(?:_[0-9]+)?\.parquet$"


def group_of_file(path: str) -> str:
    """The file group that wrote ``path`` (:data:`GROUP_FILE_PATTERN`)."""
    found = re.search(GROUP_FILE_PATTERN, path)
    return found.group(1) if found else path.replace("\\", "/").rsplit("/", 1)[-1]


def attach_dataset(con: duckdb.DuckDBPyConnection, out: str) -> list[str]:
    """Turn the tables of an (empty, migrated, in-memory) store's connection ``con`` into views over the dataset at
    ``out``; the dataset tables (:data:`DATASET_TABLES`) are loaded as tables. Returns the tables that have files."""
    fs, root = dataset_fs(out)
    if fs is None and not Path(out).is_dir() or fs is not None and not fs.isdir(root):
        raise StoreError(f"no fleet dataset at {out!r}: the directory does not exist")
    if fs is not None:
        con.register_filesystem(fs)
    # every query of a view opens each of its files: keep their footers (a third of a session read's time)
    con.execute("SET parquet_metadata_cache = true")
    found = []
    for table in _tables(con):
        files = parquet_files(out, table)
        if not (glob.glob(files, recursive=True) if fs is None else fs.glob(f"{root}/{table}/**/*.parquet")):
            continue
        found.append(table)
        columns = con.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
            "ORDER BY ordinal_position", [table]).fetchall()
        source = parquet_source(out, table)
        wrote = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        renamed = RENAMED_COLUMNS.get(table, {})
        select = ", ".join(f'CAST({_column(c, renamed.get(c), wrote)} AS {t}) AS "{c}"' for c, t in columns)
        key = CONTENT_KEYS.get(table)
        if table == "projects":  # several groups' sessions in one project: created at the earliest start
            source = f"(SELECT id, min(created_at) AS created_at FROM {source} GROUP BY id)"
        elif key:  # the same content row from several groups: keep one
            source = f"(SELECT DISTINCT ON ({key}) * FROM {source})"
        con.execute(f"DROP TABLE {table}")
        con.execute(f"CREATE VIEW {table} AS SELECT {select} FROM {source}")
    for table in DATASET_TABLES:
        path = out.rstrip("/") + f"/{table}/dataset.parquet"
        if os.path.exists(path) if fs is None else fs.exists(f"{root}/{table}/dataset.parquet"):
            con.execute(f"INSERT INTO {table} SELECT * FROM read_parquet({_quote(path)})")
            found.append(table)
    return found
