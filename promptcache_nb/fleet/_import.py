"""Import many logs on many processes or machines into a Parquet dataset: ``pc.fleet.import_logs``.

The unit of work is a **file group**: the files under one top-level entry of a folder you pass (for
``~/.claude/projects`` one project folder; a session file ``<id>.jsonl`` and its ``<id>/`` folder of sub-agents are
one group), or one file you name. A task imports its group into a private DuckDB store with the one import
pipeline (``Lab.import_log``: the same rows a single-process import stores) and writes that store's tables as
Parquet files named after the group (``store/_parquet.py``). Any ``concurrent.futures.Executor`` runs the tasks:
none (this process), a ``ProcessPoolExecutor``, or a ``dask.distributed`` Client's ``get_executor()``.

A session found in two groups (a resumed session whose files sit in two folders) is imported again with both
groups' files as one group, so every session is stored whole by one task. A manifest (``OUT/_fleet.json``)
records each group's files with their size and modification time: running again imports only groups with a new,
grown or changed file, and drops the groups whose files are gone.

The sessions of one provider account share one simulated cache (``account=``: by default one account per path you
pass), so the file groups of one account are imported by one task, in the order one ``lab.import_log`` of their
folder stores them: the dataset's simulated columns equal that import's, for the same files and accounts.
"""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._util import progress_bar
from ..analysis.calibrate import calibrate_families
from ..errors import PromptCacheError
from ..ingest import import_log
from ..ingest._groups import FileGroup, expand_paths, plan_groups
from ..lab import Lab
from ..store import Store
from ..store._parquet import dataset_fs, remove_group

if TYPE_CHECKING:
    import pandas as pd

MANIFEST = "_fleet.json"
MANIFEST_VERSION = 1
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


def _stat(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns)


def import_group(group: FileGroup, out: str, project: str | None = None) -> GroupReport:
    """Import ``group`` into a private store and write it as Parquet under ``out`` (runs in a worker). A merged
    group's parts are stored in their order, each under its own project and account."""
    cpu, wall = time.process_time(), time.perf_counter()
    stats = [_stat(f) for f in group.files]
    tmp = tempfile.mkdtemp(prefix="pcnb-fleet-")
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
            finally:
                lab.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return GroupReport(
        group=group.id, key=group.key, files=stats, requests=result.requests, sessions=sessions,
        skipped=result.skipped.to_dict("records"), cpu_s=time.process_time() - cpu,
        wall_s=time.perf_counter() - wall,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, warnings=len(caught),
        members=list(group.members))


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


def _unchanged(group: FileGroup, manifest: dict[str, Any]) -> bool:
    rec = manifest["groups"].get(group.id)
    if rec is None or sorted(rec["files"]) != sorted(list(_stat(f)) for f in group.files):
        return False
    return bool(rec.get("accounts") == _accounts_record(group))


def import_logs(paths: str | Path | Iterable[str | Path], *, out: str | Path,
                executor: Executor | None = None, project: str | None = None,
                progress: bool = True, account: AccountMap | None = None) -> FleetImport:
    """Import agent logs into a Parquet dataset at ``out``, one task per file group, on ``executor``.

    ``executor``: None runs the tasks in this process; any ``concurrent.futures.Executor`` runs them there
    (``ProcessPoolExecutor(2)``, or ``distributed.Client(...).get_executor()`` for a Dask cluster: the workers
    must see the log files and ``out`` at the same paths). Running again imports only groups with a new or
    changed file. Read the result with :func:`promptcache_nb.fleet.open`.

    ``project``: the project every session is stored under; by default each group's own (its folder's name,
    e.g. Claude Code's ``-home-dev-billing``), so a fleet can be read by project.

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
        os.makedirs(out, exist_ok=True)
    else:
        fs.makedirs(root, exist_ok=True)
    manifest = _load_manifest(out)
    planned, passed = plan_groups(paths)
    walk = {str(log.path): i for i, log in enumerate(expand_paths(paths)[0])}  # the order an import stores them
    planned = [replace(g, files=tuple(sorted(g.files, key=walk.__getitem__)))
               for g in _with_accounts(planned, paths, account)]
    groups = _by_account(_apply_merges(planned, manifest, walk), walk)
    todo = [g for g in groups if not _unchanged(g, manifest)]
    reports: dict[str, GroupReport] = {}
    bar = progress_bar(total=len(todo), desc="importing file groups", enabled=progress, unit="group")
    try:
        for report in _run(todo, out, project, executor, bar):
            reports[report.group] = report
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
            by_id = {g.id: g for g in groups}
            merged_ids = sorted({i for ids in split for i in ids})
            merged = _merged([by_id[i] for i in merged_ids], walk)
            for gid in merged_ids:
                remove_group(out, gid)
                reports.pop(gid, None)
                manifest["groups"].pop(gid, None)
            groups = sorted([g for g in groups if g.id not in merged_ids] + [merged], key=lambda g: g.key)
            for report in _run([merged], out, project, None, bar):
                reports[report.group] = report
    finally:
        bar.close()
    live = {g.id for g in groups}
    by_gid = {g.id: g for g in groups}
    for gid in [g for g in manifest["groups"] if g not in live]:  # files gone since the last run
        remove_group(out, gid)
        del manifest["groups"][gid]
    for gid, rep in reports.items():
        manifest["groups"][gid] = {"key": rep.key, "files": [list(f) for f in rep.files], "sessions": rep.sessions,
                                   "requests": rep.requests, "members": rep.members,
                                   "accounts": _accounts_record(by_gid[gid])}
    if reports:
        _fit_calibrations(out)
    _save_manifest(out, manifest)
    return _result(out, groups, reports, manifest, passed, time.perf_counter() - start)


def _run(todo: Sequence[FileGroup], out: str, project: str | None, executor: Executor | None,
         bar: Any) -> Iterable[GroupReport]:
    if executor is None:
        for g in todo:
            yield import_group(g, out, project)
            bar.update(1)
        return
    from concurrent.futures import as_completed

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
    import pandas as pd

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
