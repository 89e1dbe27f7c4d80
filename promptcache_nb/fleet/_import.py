"""Import many logs on many processes or machines into a Parquet dataset: ``pc.fleet.import_logs``.

The unit of work is a **file group**: the files under one top-level entry of a folder you pass (for
``~/.claude/projects`` one project folder; a session file ``<id>.jsonl`` and its ``<id>/`` folder of sub-agents are
one group), or one file you name. A task imports its group into a private DuckDB store with the one import
pipeline (``Lab.import_log``: the same rows a single-process import stores) and writes that store's tables as
Parquet files named after the group (``store/_parquet.py``). Any ``concurrent.futures.Executor`` runs the tasks:
none (this process), a ``ProcessPoolExecutor``, or a ``dask.distributed`` Client's ``get_executor()``.

A session found in two groups (a resumed session whose files sit in two folders) is imported again with both
groups' files as one group, so every session is stored whole by one task. A manifest (``OUT/_fleet.json``)
records each group's log files (size and modification time) and the Parquet files it wrote (size and sha256), as
soon as the group is written: running again imports only groups with a new, grown or changed log file, or whose
Parquet files were deleted, truncated or changed since (a group recorded before digests were: whose files cannot be
read or whose rows are not sound, by :func:`check_dataset`'s row checks). An import appends: it removes a group
only when that group's own log files are all gone (or this run imported them under another group), never because
it was not asked to import it — importing ``logs/pi`` into the dataset of ``logs/exchanges`` adds to it. Writers
into one dataset at once (processes or machines sharing the folder) merge their manifest entries under a lock
(``OUT/_fleet.lock``, ``flock``); an object-store URL has no lock, nor has a platform or filesystem without
``flock`` (the import warns once): one writer at a time there. A killed import leaves its temporary folder
(``<tmp>/pcnb-fleet-<pid>-…``); the next import on that machine removes it. ``promptcache-nb doctor OUT`` checks a
dataset against its manifest, and each group's rows as ``doctor`` checks a store's.

The sessions of one provider account share one simulated cache (``account=``: by default one account per path you
pass), so the file groups of one account are imported by one task, in the order one ``lab.import_log`` of their
folder stores them: the dataset's simulated columns equal that import's, for the same files and accounts.
"""

from __future__ import annotations

import errno
import functools
import glob
import json
import os
import resource
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .._lazy import pandas as pd
from .._util import not_a_regular_file, progress_bar
from ..analysis.calibrate import calibrate_families
from ..errors import PromptCacheError, PromptCacheWarning
from ..ingest import import_log
from ..ingest._groups import FileGroup, expand_paths, plan_groups
from ..lab import Lab
from ..store import DoctorReport, Store, caused_by_ctrl_c
from ..store._doctor import check_dataset_rows
from ..store._parquet import TEMP_PREFIX, dataset_fs, group_of_file, group_outputs, remove_group, unreadable_parquet

try:
    import fcntl
except ImportError:  # Windows: no flock (see _flock)
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:

    from ..store import DoctorReport

MANIFEST = "_fleet.json"
MANIFEST_VERSION = 1
#: Held (``flock``) while a writer reads, changes and rewrites the manifest: two imports into one dataset at once
#: merge their records instead of the last one's replacing the other's.
MANIFEST_LOCK = "_fleet.lock"
#: How ``import_logs`` maps the paths you pass to provider accounts: a function of the path (resolved), or a
#: mapping from the paths (as passed or resolved) to account names.
AccountMap = Callable[[Path], str] | Mapping[str | Path, str]
GROUP_COLUMNS = ["group", "key", "files", "requests", "sessions", "status", "cpu_s", "wall_s", "peak_rss_mb"]


@dataclass
class GroupReport:
    """What one task did (plain values: it comes back from another process or machine)."""

    group: str
    key: str
    files: list[tuple[str, int, int]]  # (path, size, mtime_ns) as read
    requests: int
    sessions: list[str]
    skipped: list[dict[str, Any]]
    cpu_s: float
    wall_s: float
    peak_rss_mb: float
    warnings: int = 0
    members: list[str] = field(default_factory=list)
    #: [path in the dataset, size, sha256] of each Parquet file it wrote
    outputs: list[list[Any]] = field(default_factory=list)


def _stat(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns)


def import_group(group: FileGroup, out: str, project: str | None = None) -> GroupReport:
    """Import ``group`` into a private store and write it as Parquet under ``out`` (runs in a worker). A merged
    group's parts are stored in their order, each under its own project and account."""
    cpu, wall = time.process_time(), time.perf_counter()
    stats = [_stat(f) for f in group.files]
    clean_stale_temp()  # on a worker machine too
    tmp = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lab = Lab(os.path.join(tmp, "group.duckdb"), progress=False)
            try:
                parts = group.parts or (group,)
                result = import_log(
                    lab, [f for p in parts for f in p.files], project=project or group.project, progress=False,
                    accounts={f: p.account for p in parts if p.account for f in p.files},
                    projects={f: project or p.project for p in parts for f in p.files},
                    groups=[p.files for p in parts], deep=True)  # a fleet dataset is analysed as it is written
                lab.store.export_parquet(out, group.id)
                sessions = lab.store.session_ids()
                outputs = group_outputs(out, group.id)
            finally:
                lab.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return GroupReport(
        group=group.id, key=group.key, files=stats, requests=result.requests, sessions=sessions,
        skipped=result.skipped.to_dict("records"), cpu_s=time.process_time() - cpu,
        wall_s=time.perf_counter() - wall,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, warnings=len(caught),
        members=list(group.members), outputs=outputs)


def clean_stale_temp() -> list[str]:
    """Remove the temporary folders (``<tmp>/pcnb-fleet-<pid>-…``) of fleet imports whose process is gone — a
    ``kill -9`` leaves its folder behind; returns the folders removed."""
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), TEMP_PREFIX + "*")):
        pid = os.path.basename(path)[len(TEMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


@dataclass
class FleetImport:
    """What :func:`import_logs` did. ``groups``: one row per task (the file groups of one account; ``status``
    imported, unchanged, or merged when a session spanned two accounts' groups); ``requests`` stored now;
    ``skipped``: lines and files not imported, with why."""

    out: str
    groups: pd.DataFrame
    requests: int
    sessions: int
    skipped: pd.DataFrame
    wall_s: float

    def __repr__(self) -> str:
        imported = int((self.groups["status"] != "unchanged").sum()) if len(self.groups) else 0
        return (f"FleetImport({self.out!r}: {len(self.groups)} file groups, {imported} imported now, "
                f"{self.requests} requests, {self.sessions} sessions, {len(self.skipped)} skipped, "
                f"{self.wall_s:.1f} s)")


def _load_manifest(out: str) -> dict[str, Any]:
    fs, root = dataset_fs(out)
    path = out.rstrip("/") + "/" + MANIFEST
    if not (os.path.exists(path) if fs is None else fs.exists(f"{root}/{MANIFEST}")):
        return {"version": MANIFEST_VERSION, "groups": {}}
    try:
        with (open(path, encoding="utf-8") if fs is None else fs.open(f"{root}/{MANIFEST}", "r")) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise PromptCacheError(f"{path}: not a fleet manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION or not isinstance(
            data.get("groups"), dict):
        raise PromptCacheError(f"{path}: not a version-{MANIFEST_VERSION} fleet manifest")
    return data


@contextmanager
def _manifest_locked(out: str) -> Iterator[None]:
    """Hold :data:`MANIFEST_LOCK` (a local dataset; an object store has no lock: one writer at a time there). Where
    the platform or the filesystem has no ``flock`` this goes on unlocked (:func:`_warn_without_lock` said so once)."""
    fs, _ = dataset_fs(out)
    if fs is not None:
        yield
        return
    with open(os.path.join(out, MANIFEST_LOCK), "a+b") as fh:
        _flock(fh)  # released when the file closes, a killed holder's too
        yield


#: What ``flock`` raises on a filesystem without locks (NFS without a lock daemon, some FUSE and SMB mounts).
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}


def _flock(fh: BinaryIO) -> str | None:
    """Take :data:`MANIFEST_LOCK` on the open file ``fh``; why it cannot be taken (None once held)."""
    if fcntl is None:
        return "this platform has no flock"
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            raise
        return f"its filesystem refuses flock ({exc.strerror or errno.errorcode.get(exc.errno or 0, exc)})"
    return None


def _warn_without_lock(out: str) -> None:
    """One warning when the dataset ``out`` (local) cannot be locked: an import still works, but two at once may
    lose each other's manifest entries."""
    with open(os.path.join(out, MANIFEST_LOCK), "a+b") as fh:
        why = _flock(fh)
    if why is not None:
        warnings.warn(f"{out}: no lock for {MANIFEST_LOCK} ({why}): run one import into this dataset at a time "
                      "(two at once may lose each other's manifest entries; `promptcache-nb doctor` finds that, and "
                      "the next import repairs it)", PromptCacheWarning, stacklevel=4)


def check_dataset(out: str | Path) -> DoctorReport:
    """Check a fleet dataset without changing it (``promptcache-nb doctor OUT``): its manifest, each file group's
    Parquet files against what the manifest recorded (present, same size and sha256), files no recorded group
    wrote (an import killed before it recorded them, or one still running), every Parquet file readable, and the
    rows of the recorded groups' files as ``doctor FILE`` checks a store's (each group's references within it, such
    as requests whose session is missing; prefix chains that end; block bodies that parse). One line a problem.

    A damaged group is repaired by running the same import again: it imports that group anew.
    """
    path = os.fspath(out)
    report = DoctorReport(path)
    if not os.path.exists(os.path.join(path, MANIFEST)):
        report.problems.append(f"no {MANIFEST}: not a fleet dataset (made by `promptcache-nb import PATH --out DIR`)")
        return report
    try:
        manifest = _load_manifest(path)
    except PromptCacheError as exc:
        report.problems.append(str(exc))
        return report
    groups: dict[str, Any] = manifest["groups"]
    rerun = "run the import again to re-import it"
    files = _parquet_files(path)
    unreadable = unreadable_parquet(files)
    readable = [f for f in files if f not in unreadable]
    for gid, rec in sorted(groups.items()):
        outputs = rec.get("outputs")
        if outputs is None:
            continue  # recorded before outputs were
        have = {o[0]: o for o in group_outputs(path, gid)}
        name = _group_name(gid, rec)
        for rel, size, sha in outputs:
            got = have.get(rel)
            why = unreadable.pop(os.path.join(path, rel), None)
            also = f", not readable as Parquet ({why})" if why else ""
            if got is None:
                report.problems.append(f"{name}: {rel} is missing; {rerun}")
            elif got[1] != size:
                report.problems.append(f"{name}: {rel} holds {got[1]} bytes, {size} when written (truncated or "
                                       f"rewritten){also}; {rerun}")
            elif got[2] != sha:
                report.problems.append(f"{name}: {rel} changed since it was written (its sha256 differs from the "
                                       f"manifest's){also}; {rerun}")
        for rel in sorted(set(have) - {o[0] for o in outputs}):
            report.problems.append(f"{name}: {rel} is not in the manifest; {rerun}")
    orphans: dict[str, int] = {}
    for f in files:
        gid = group_of_file(f)
        if gid not in groups and gid != "dataset":
            orphans[gid] = orphans.get(gid, 0) + 1
    report.problems.extend(f"group {gid}: {n} Parquet file{'s' if n != 1 else ''} no manifest entry records (an "
                           "import killed before it recorded them, or one still running); run the import again"
                           for gid, n in sorted(orphans.items()))
    report.problems.extend(f"{os.path.relpath(f, path)}: not readable as Parquet ({why})"
                           for f, why in unreadable.items())
    for problem in check_dataset_rows(_tables_of(path, readable, groups)):
        named = ", ".join(_group_name(g, groups.get(g, {})) for g in problem.groups)
        report.problems.append(f"{problem.line()} in {named}; {rerun}")
    report.counts = {"file groups": len(groups), "Parquet files": len(files),
                     "requests": sum(int(r.get("requests", 0)) for r in groups.values())}
    report.head = f"{path}: a fleet dataset; " + ", ".join(f"{n} {what}" for what, n in report.counts.items())
    return report


def _group_name(gid: str, rec: Mapping[str, Any]) -> str:
    return f"group {gid} ({Path(str(rec.get('key', ''))).name})"


def _parquet_files(out: str) -> list[str]:
    return sorted(glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True))


def _tables_of(out: str, files: Sequence[str], groups: Mapping[str, Any]) -> dict[str, list[str]]:
    """table -> the files of ``files`` a recorded group wrote (another's may be half written: a run still going)."""
    tables: dict[str, list[str]] = {}
    for f in files:
        if group_of_file(f) in groups:
            tables.setdefault(Path(os.path.relpath(f, out)).parts[0], []).append(f)
    return tables


def _damaged_groups(out: str, manifest: Mapping[str, Any]) -> set[str]:
    """The recorded groups of a local dataset whose manifest entry holds no digests of their files (written by a
    version before outputs were recorded) and whose files cannot be read or hold rows that are not sound (as
    :func:`check_dataset` finds them, block bodies left out): imported again. A group with digests is checked by
    them (:func:`_unchanged`): its files are byte for byte what a sound import wrote."""
    unverified = {gid: rec for gid, rec in manifest["groups"].items() if rec.get("outputs") is None}
    if not unverified or dataset_fs(out)[0] is not None:
        return set()
    files = [f for f in _parquet_files(out) if group_of_file(f) in unverified]
    unreadable = unreadable_parquet(files)
    damaged = {group_of_file(f) for f in unreadable}
    readable = [f for f in files if f not in unreadable]
    damaged.update(g for p in check_dataset_rows(_tables_of(out, readable, unverified), deep=False) for g in p.groups)
    return damaged


def _update_manifest(out: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read the manifest as it is on disk now, ``change`` it, write it back, under the lock; returns it."""
    with _manifest_locked(out):
        manifest = _load_manifest(out)
        change(manifest)
        _save_manifest(out, manifest)
    return manifest


def _save_manifest(out: str, manifest: dict[str, Any]) -> None:
    fs, root = dataset_fs(out)
    text = json.dumps(manifest, indent=1, sort_keys=True)
    if fs is not None:  # object stores replace a whole object at once
        with fs.open(f"{root}/{MANIFEST}", "w") as fh:
            fh.write(text)
        return
    path = os.path.join(out, MANIFEST)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def _apply_merges(groups: list[FileGroup], manifest: dict[str, Any], walk: Mapping[str, int]) -> list[FileGroup]:
    """Groups an earlier run merged (a session spanned them) stay merged."""
    by_id = {g.id: g for g in groups}
    out: list[FileGroup] = []
    used: set[str] = set()
    for rec in manifest["groups"].values():
        members = [m for m in rec.get("members", []) if m in by_id and m not in used]
        if len(members) > 1:
            out.append(_merged([by_id[m] for m in members], walk))
            used.update(members)
    out.extend(g for g in groups if g.id not in used)
    return sorted(out, key=lambda g: g.key)


def _merged(groups: Sequence[FileGroup], walk: Mapping[str, int]) -> FileGroup:
    """One group of ``groups``: its parts in the order one import of their folders stores them (the walk's)."""
    parts = sorted({p.id: p for g in groups for p in (g.parts or (g,))}.values(), key=lambda p: walk[p.files[0]])
    members = sorted(p.id for p in parts)
    files = sorted({f for p in parts for f in p.files})
    return FileGroup(" + ".join(sorted(p.key for p in parts)), tuple(files), tuple(members), parts=tuple(parts))


def _by_account(groups: Sequence[FileGroup], walk: Mapping[str, int]) -> list[FileGroup]:
    """``groups`` with the groups of one account merged into one (their sessions share one simulated cache, so one
    task stores them)."""
    owner: dict[str, int] = {}  # account -> the bucket holding its groups
    buckets: dict[int, list[FileGroup]] = {}
    for n, g in enumerate(groups):
        joined = sorted({owner[p.account] for p in (g.parts or (g,)) if p.account in owner})
        bucket = [x for i in joined for x in buckets.pop(i)] + [g]
        buckets[n] = bucket
        for x in bucket:
            for p in x.parts or (x,):
                owner[p.account] = n
    return sorted((b[0] if len(b) == 1 else _merged(b, walk) for b in buckets.values()), key=lambda g: g.key)


def _accounts_record(group: FileGroup) -> list[list[str]]:
    """What the manifest keeps of a group's accounts: a changed mapping imports it again."""
    return sorted([p.key, p.account] for p in group.parts or (group,))


def _with_accounts(groups: Sequence[FileGroup], paths: str | Path | Iterable[str | Path],
                   account: AccountMap | None) -> list[FileGroup]:
    """``groups`` with the account of the path you passed that holds them (``account``; default: that path)."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    given: dict[str, str] = {}
    if account is not None and not callable(account):
        for k, v in account.items():
            given[_spelled(k)] = v
    tops: list[tuple[str, set[str] | None, str]] = []  # (the path resolved, a glob's files, its account)
    for item in items:
        spelled = _spelled(item)
        if callable(account):
            name = account(Path(spelled))
        elif account is not None:
            name = given.get(spelled) or given.get(os.fspath(item), "")
        else:
            name = spelled
        if not isinstance(name, str) or not name.strip():
            raise PromptCacheError(f"import_logs(account=...): no account for {os.fspath(item)!r} (an account name "
                                   f"for each path you pass; got {name!r})")
        matched = ({str(Path(m).resolve()) for m in glob.glob(os.path.expanduser(os.fspath(item)), recursive=True)}
                   if any(ch in os.fspath(item) for ch in "*?[") else None)
        tops.append((spelled, matched, name))
    tops.sort(key=lambda t: -len(t[0]))  # the innermost path you passed wins

    def account_of(file: str) -> str:
        for top, matched, name in tops:
            if file in matched if matched is not None else (file == top or Path(file).is_relative_to(top)):
                return name
        raise PromptCacheError(f"import_logs: {file} is under none of the paths passed")  # pragma: no cover

    return [replace(g, account=account_of(g.files[0])) for g in groups]


def _spelled(path: str | Path) -> str:
    """A path you passed as one spelling: resolved (a glob kept as written)."""
    text = os.fspath(path)
    return text if any(ch in text for ch in "*?[") else str(Path(text).expanduser().resolve())


def _unchanged(group: FileGroup, manifest: dict[str, Any], out: str) -> bool:
    """The group's logs are as the manifest recorded them, and so are the Parquet files it wrote (a file deleted,
    truncated or rewritten since makes the group import again)."""
    rec = manifest["groups"].get(group.id)
    if rec is None or sorted(rec["files"]) != sorted(list(_stat(f)) for f in group.files):
        return False
    if rec.get("accounts") != _accounts_record(group):
        return False
    outputs = rec.get("outputs")  # None: a manifest written before outputs were recorded
    return outputs is None or group_outputs(out, group.id) == outputs


def _drop_groups(ids: Sequence[str], manifest: dict[str, Any]) -> None:
    for gid in ids:
        manifest["groups"].pop(gid, None)


def _record(rep: GroupReport, group: FileGroup) -> dict[str, Any]:
    """A group's manifest entry."""
    return {"key": rep.key, "files": [list(f) for f in rep.files], "sessions": rep.sessions,
            "requests": rep.requests, "members": rep.members, "accounts": _accounts_record(group),
            "outputs": rep.outputs}


def import_logs(paths: str | Path | Iterable[str | Path], *, out: str | Path,
                executor: Executor | None = None, project: str | None = None,
                progress: bool = True, account: AccountMap | None = None) -> FleetImport:
    """Import agent logs into a Parquet dataset at ``out``, one task per file group, on ``executor``.

    ``executor``: None runs the tasks in this process; any ``concurrent.futures.Executor`` runs them there
    (``ProcessPoolExecutor(2)``, or ``distributed.Client(...).get_executor()`` for a Dask cluster: the workers
    must see the log files and ``out`` at the same paths). Running again imports only groups with a new or
    changed file. Read the result with :func:`promptcache_nb.fleet.open`.

    ``project``: the project every session is stored under; by default each group's own (its folder's or file's
    name; for Claude Code the project folder read as a name, ``-home-dev-billing-service`` → ``billing-service``,
    so every developer's copy of a project is one project), so a fleet can be read by project.

    ``account``: which provider account (organisation / workspace) each path you pass was served under: a
    function of the path (resolved) or a mapping from the paths to names; by default each path is its own
    account. An account's sessions share one simulated cache, as the provider's are shared, so its file groups
    are one task; a log that names its account (a response header) keeps its own.

    Example:
        >>> pc.fleet.import_logs(["logs/alice", "logs/bob"], out="fleet/",  # doctest: +SKIP
        ...                      account={"logs/alice": "org-a", "logs/bob": "org-a"})
    """
    start = time.perf_counter()
    out = os.fspath(out)
    fs, root = dataset_fs(out)
    if fs is None:
        out = os.path.abspath(out)
        if os.path.lexists(out) and not os.path.isdir(out):  # a file, a FIFO, a symlink loop: one line, not makedirs'
            raise PromptCacheError(f"import_logs(out={out!r}): it is {not_a_regular_file(out) or 'a file'}, not a "
                                   "folder; pass the dataset's folder (created when missing)")
        os.makedirs(out, exist_ok=True)
    else:
        fs.makedirs(root, exist_ok=True)
    clean_stale_temp()
    try:
        return _import_logs(paths, out, executor, project, progress, account, start)
    except Exception as exc:
        if caused_by_ctrl_c(exc):  # DuckDB's "Query interrupted" (or what a worker made of it) is the Ctrl-C
            raise KeyboardInterrupt from None
        raise


def _import_logs(paths: str | Path | Iterable[str | Path], out: str, executor: Executor | None,
                 project: str | None, progress: bool, account: AccountMap | None, start: float) -> FleetImport:
    manifest = _load_manifest(out)
    planned, passed = plan_groups(paths)
    if dataset_fs(out)[0] is None:  # the paths are sound: the dataset is about to be written
        _warn_without_lock(out)
    walk = {str(log.path): i for i, log in enumerate(expand_paths(paths)[0])}  # the order an import stores them
    planned = [replace(g, files=tuple(sorted(g.files, key=walk.__getitem__)))
               for g in _with_accounts(planned, paths, account)]
    groups = _by_account(_apply_merges(planned, manifest, walk), walk)
    damaged = _damaged_groups(out, manifest)
    todo = [g for g in groups if g.id in damaged or not _unchanged(g, manifest, out)]
    reports: dict[str, GroupReport] = {}
    by_gid = {g.id: g for g in groups}

    def done(report: GroupReport) -> None:
        # recorded as soon as its files are written: a run killed later keeps it, and writers at once merge
        reports[report.group] = report
        _update_manifest(out, lambda m: m["groups"].__setitem__(report.group, _record(report, by_gid[report.group])))

    bar = progress_bar(total=len(todo), desc="importing file groups", enabled=progress, unit="group")
    try:
        for report in _run(todo, out, project, executor, bar):
            done(report)
        # a session in two groups: import those groups again as one, until every session has one group
        while True:
            owner: dict[str, list[str]] = {}
            for g in groups:
                rec = reports.get(g.id) or manifest["groups"].get(g.id)
                for sid in (asdict(rec)["sessions"] if isinstance(rec, GroupReport) else rec["sessions"]):
                    owner.setdefault(sid, []).append(g.id)
            split = {tuple(sorted(ids)) for ids in owner.values() if len(ids) > 1}
            if not split:
                break
            merged_ids = sorted({i for ids in split for i in ids})
            merged = _merged([by_gid[i] for i in merged_ids], walk)
            by_gid[merged.id] = merged
            for gid in merged_ids:
                remove_group(out, gid)
                reports.pop(gid, None)
                manifest["groups"].pop(gid, None)
            _update_manifest(out, functools.partial(_drop_groups, merged_ids))
            groups = sorted([g for g in groups if g.id not in merged_ids] + [merged], key=lambda g: g.key)
            for report in _run([merged], out, project, None, bar):
                done(report)
    finally:
        bar.close()
    live = {g.id for g in groups}
    planned_files = {f for g in groups for f in g.files}

    def prune(m: dict[str, Any]) -> None:
        # Only groups whose own files vanished, or whose files this run imported under another group (the same
        # folder passed another way): a group this run did not plan — another folder imported before, another
        # writer's — stays.
        for gid, rec in list(m["groups"].items()):
            files = [f[0] for f in rec["files"]]
            if gid not in live and (any(f in planned_files for f in files) or not any(map(os.path.exists, files))):
                remove_group(out, gid)
                del m["groups"][gid]

    # groups recorded without digests whose files and rows were found sound: recorded with them now, so the rows
    # are read once, not on every import
    verified = [g.id for g in groups if g.id not in reports and g.id not in damaged and
                manifest["groups"].get(g.id, {"outputs": True}).get("outputs") is None]

    with _manifest_locked(out):
        final = _load_manifest(out)
        prune(final)
        for gid in verified:
            if gid in final["groups"] and final["groups"][gid].get("outputs") is None:
                final["groups"][gid]["outputs"] = group_outputs(out, gid)
        _save_manifest(out, final)
        if reports:
            _fit_calibrations(out)  # over every group in the dataset, writers at once taking turns
    return _result(out, groups, reports, final, passed, time.perf_counter() - start)


def _run(todo: Sequence[FileGroup], out: str, project: str | None, executor: Executor | None,
         bar: Any) -> Iterable[GroupReport]:
    if executor is None:
        for g in todo:
            yield import_group(g, out, project)
            bar.update(1)
        return
    futures: list[Future[GroupReport]] = [executor.submit(import_group, g, out, project) for g in todo]
    for fut in as_completed(futures):
        yield fut.result()
        bar.update(1)


def _fit_calibrations(out: str) -> None:
    """One calibration per tokenizer family over the whole dataset's measured requests, as a single-process
    import fits over its store (never per group)."""
    store = Store.open_dataset(out, writable_dataset_tables=True)
    try:
        store.clear_calibrations()
        lab = Lab.over_store(store, progress=False)
        calibrate_families(lab, store.measured_models())
        store.export_dataset_tables(out)
    finally:
        store.close()


def _result(out: str, groups: Sequence[FileGroup], reports: dict[str, GroupReport], manifest: dict[str, Any],
            passed: list[dict[str, Any]], wall: float) -> FleetImport:
    rows, skipped = [], list(passed)
    for g in groups:
        rep = reports.get(g.id)
        rec = manifest["groups"].get(g.id, {})
        # merged: a session spanned the groups of two accounts (one account's groups are one task anyway)
        accounts = {p.account for p in g.parts or (g,)}
        status = "unchanged" if rep is None else ("merged" if len(accounts) > 1 else "imported")
        rows.append({"group": g.id, "key": g.key, "files": len(g.files),
                     "requests": rep.requests if rep else rec.get("requests", 0),
                     "sessions": len(rep.sessions) if rep else len(rec.get("sessions", [])), "status": status,
                     "cpu_s": rep.cpu_s if rep else None, "wall_s": rep.wall_s if rep else None,
                     "peak_rss_mb": rep.peak_rss_mb if rep else None})
        if rep:
            skipped.extend(rep.skipped)
    frame = pd.DataFrame(rows, columns=GROUP_COLUMNS)
    requests = sum(r.requests for r in reports.values())
    sessions = int(frame["sessions"].sum()) if len(frame) else 0
    return FleetImport(out, frame, requests, sessions,
                       pd.DataFrame(skipped, columns=["file", "line", "reason"]), wall)
