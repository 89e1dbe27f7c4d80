"""``lab.import_log(paths, workers=N)``: file groups parsed and stored in N processes, merged by one writer.

Each worker imports one file group (``_groups.py``) into a private store file with the one import pipeline; this
process copies each private store into the Lab's in one transaction (``Store.merge_from``), in the groups' key
order, while the workers still run: a group is merged once it and every group before it are done and no group
done so far shares one of its sessions (a group finishing later that does share one has the merged group's
sessions deleted again). What cannot be merged blind goes through the single-process path here, after the
merges: a group holding a session the Lab already stores (a growing log imported again: only its new requests
are added), and groups that share a session. Calibrations are fitted once at the end over the whole store, as a
single-process import does (the workers fit none). Every DuckDB connection runs on one thread meanwhile: the
processes already fill the cores.

A usage-first import (no simulated cache) hands out runs of consecutive groups instead, one per process
(:func:`runs_of_groups`; into a store without sessions this process imports the first run itself), each merged
only when it begins where ``workers=1`` begins a batch of groups (:func:`_in_step`), else the import is done again
in this process: its stored rows are ``workers=1``'s, session order included. ``workers`` not given:
:func:`auto_workers`.

The stored rows equal ``workers=1``'s whenever sessions in different groups do not share a simulated cache entry
(the provider cache an account's sessions share is simulated per group here; measured figures never depend on it;
``pc.fleet`` imports an account's groups in one task instead, as ``workers=1`` does):
the tests compare every table on the shipped logs and on a generated Claude Code history.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from .._lazy import pandas as pd
from .._util import gc_paused, progress_bar
from ..analysis.calibrate import calibrate_families, needs_calibration
from ..workspace import Workspace
from ._groups import FileGroup, LogFile, expand_paths, plan_groups
from ._import import ImportOptions, ImportResult, SessionList, _file_groups, import_serial


@dataclass
class _Done:
    group: FileGroup
    path: str
    sessions: list[str]
    result: ImportResult
    warnings: list[tuple[str, type[Warning]]]


def _import_group_file(group: FileGroup, folder: str, options: ImportOptions) -> _Done:
    """Import ``group`` (a run of file groups when it has ``parts``: each stored as its own group, in order)
    into a new store file under ``folder`` (runs in a worker process)."""
    path = os.path.join(folder, group.id + ".duckdb")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lab = Workspace(path, progress=False)
        try:
            lab.store.set_threads(1)  # one core per worker: the other workers and the merges have the rest
            # no calibration: the writer fits them once over the whole store (a group's are never merged)
            result = import_serial(lab, list(group.files), replace(
                options, progress=False, calibrate=False, groups=[p.files for p in group.parts or (group,)]))
            sessions = lab.store.session_ids()
            result.sessions = SessionList()  # the writer opens its own, when read
        finally:
            lab.close()
    return _Done(group, path, sessions, result, [(str(w.message), w.category) for w in caught])


def import_parallel(lab: Workspace, paths: str | Path | Sequence[str | Path], options: ImportOptions, *, workers: int
                    ) -> ImportResult:
    """Import ``paths`` into ``lab`` on ``workers`` processes, each storing its runs of file groups into a store of
    its own, merged here in the order one process stores them (``ingest.import_log`` chooses this or
    ``_import.import_serial``)."""
    deep, progress = options.deep, options.progress
    files, passed = expand_paths(paths)
    walked = frozenset(str(f.path) for f in files if not f.named)
    if deep:  # by group, in key order (merges follow it)
        groups, _ = plan_groups(paths)
    else:  # runs of the groups workers=1 reads, in its order
        groups = runs_of_groups(walk_groups(paths, files), workers)
    folder = tempfile.mkdtemp(prefix="pcnb-import-")
    found: dict[int, _Done] = {}
    owners: Counter[str] = Counter()
    stored = set(lab.store.session_ids())
    merged_at: set[int] = set()
    # A usage-first import into a store without sessions imports its first run here, straight into the store,
    # beside the workers (one private store and one merge fewer); what it stored is taken out again like a
    # merged run's when the runs cannot stand (below)
    here = not deep and not stored and len(groups) > 1
    bar = progress_bar(total=len(groups), desc="importing file groups", enabled=progress, unit="group")
    threads = lab.store.set_threads(1)  # the workers have the cores while the merges run beside them
    try:
        with gc_paused():
            with ProcessPoolExecutor(max_workers=workers - here) as pool, _threads_after(lab, threads):
                futures = {pool.submit(_import_group_file, g, folder,
                                       replace(options, walked=walked.intersection(g.files))): i
                           for i, g in enumerate(groups) if i or not here}
                nxt = 0
                if here:
                    first = groups[0]
                    res = import_serial(lab, list(first.files), replace(
                        options, progress=False, calibrate=False, deep=False,
                        groups=[p.files for p in first.parts or (first,)], walked=walked))
                    found[0] = _Done(first, "", lab.store.session_ids(), res, [])
                    res.sessions = SessionList()  # opened from the ids below, when read
                    owners.update(found[0].sessions)
                    merged_at.add(0)
                    bar.update(1)
                    nxt = 1
                for fut in as_completed(futures):
                    d = found[futures[fut]] = fut.result()
                    owners.update(d.sessions)
                    bar.update(1)
                    # Merged while the workers run, in key order: a group whose sessions no group finished so
                    # far holds. A group finishing later may still share one; it is then taken back out below.
                    while nxt in found and _in_step(found, nxt, deep):
                        if not _shared(found[nxt], owners, stored):
                            lab.store.merge_from(found[nxt].path)
                            merged_at.add(nxt)
                        nxt += 1
            bar.close()
            done = [found[i] for i in range(len(groups))]
            if not all(_in_step(found, i, deep) for i in range(len(groups))):
                # a run began inside one of workers=1's batches: its sessions' order is that import's only when
                # read in one process (rare: small file groups on both sides of the cut)
                with lab.store.transaction():
                    lab.store.delete_sessions([sid for i in sorted(merged_at) for sid in done[i].sessions])
                return import_serial(lab, paths, options)

            late = [i for i in sorted(merged_at) if _shared(done[i], owners, stored)]
            if late:  # a session spans a merged group and one that finished after it: stored serially instead
                with lab.store.transaction():
                    lab.store.delete_sessions([sid for i in late for sid in done[i].sessions])
                merged_at.difference_update(late)
            merged: list[_Done] = []
            serial: list[FileGroup] = []
            for i, d in enumerate(done):
                if _shared(d, owners, stored):
                    serial.append(d.group)  # shares a session with another group, or grows a stored one
                else:
                    if i not in merged_at:
                        lab.store.merge_from(d.path)
                    merged.append(d)
        result = ImportResult()
        lab.caches.drop_all()  # the simulated caches did not see the merged requests: rebuilt when next used
        for d in done:
            for message, category in d.warnings:
                warnings.warn(message, category, stacklevel=3)
        parts = [d.result for d in merged]
        if serial:
            parts.append(import_serial(lab, [f for g in serial for f in g.files], replace(
                options, calibrate=False, groups=[p.files for g in serial for p in g.parts or (g,)],
                walked=walked)))
    finally:
        bar.close()
        shutil.rmtree(folder, ignore_errors=True)
    # opened when read: opening every merged session here would read each back from the store for nothing
    result.sessions = SessionList(lab, [sid for d in merged for sid in d.sessions]
                                  + (parts[-1].sessions.ids if serial else []))
    result.requests = sum(p.requests for p in parts)
    result.already_stored = sum(p.already_stored for p in parts)
    result.files = [f for p in parts for f in p.files]
    result.unknown_models = sorted({m for p in parts for m in p.unknown_models})
    result.skipped = _concat([pd.DataFrame(passed, columns=result.skipped.columns),
                              *(p.skipped for p in parts)], result.skipped)
    result.flagged = _concat([p.flagged for p in parts], result.flagged)
    result.notes = _concat([p.notes for p in parts], result.notes)
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    result.roots = [Path(item).expanduser().resolve() for item in items if not any(ch in str(item) for ch in "*?[")]
    models = set(lab.store.models_of(result.sessions.ids))
    if deep and (result.requests or (models and needs_calibration(lab, models))):  # as one process decides
        result.calibrations = calibrate_families(lab, models)
    return result


#: A usage-first import of at least this many bytes of logs, in two or more file groups, runs on every core
#: when ``workers`` is not given (:func:`auto_workers`): below it, starting the processes and merging their stores
#: costs more than they save (about a tenth of a second per worker against ~10 ms of CPU per MB read).
PARALLEL_BYTES = 64 << 20


def auto_workers(paths: str | Path | Sequence[str | Path]) -> int:
    """The processes a usage-first import of ``paths`` runs on when none is said: one per idle core (at most one
    per file group) for :data:`PARALLEL_BYTES` or more of logs, else 1. A core is idle when the load average
    leaves it free: on a machine whose cores are busy already, processes only share them (each runs slower, and
    the merges are extra work), and one process is measured faster (``benchmarks/bench_fleet.py``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cores = min(cores, int(cores - busy + 0.5))
    if cores < 2:
        return 1
    groups, _ = plan_groups(paths)
    if len(groups) < 2 or sum(_size(f) for g in groups for f in g.files) < PARALLEL_BYTES:
        return 1
    return min(cores, len(groups))


def walk_groups(paths: str | Path | Sequence[str | Path], files: Sequence[LogFile] | None = None
                ) -> list[FileGroup]:
    """The file groups ``workers=1`` reads ``paths`` in (``_import._file_groups``: the files you name are one),
    in its order, each file in walk order (``files``: ``expand_paths(paths)``'s, when already made)."""
    files = expand_paths(paths)[0] if files is None else files
    return [FileGroup(str(files[g[0]].path), tuple(str(files[i].path) for i in g))
            for g in _file_groups(paths, list(files))]


def runs_of_groups(groups: Sequence[FileGroup], workers: int) -> list[FileGroup]:
    """``groups`` cut into ``workers`` runs of consecutive groups of about equal size in bytes, each run one
    task (a :class:`FileGroup` whose ``parts`` are its groups, stored in order as one import stores them).

    A usage-first import simulates no cache, so where the cuts fall changes no stored row; what it saves is a
    private store and a merge per group (a few tenths of a second each: more than a project folder's import).
    Runs are cut in key order, so merging them in order numbers the sessions as ``workers=1`` does."""
    if len(groups) <= 1 or workers <= 1:
        return list(groups)
    sizes = [sum(_size(f) for f in g.files) for g in groups]
    total = sum(sizes) or 1
    runs: list[list[FileGroup]] = [[]]
    done = 0
    for g, size in zip(groups, sizes, strict=True):
        # a new run when this group's middle falls past the runs' share so far (and a run is left to start)
        if runs[-1] and done + size / 2 > total * len(runs) / workers and len(runs) < workers:
            runs.append([])
        runs[-1].append(g)
        done += size
    return [run[0] if len(run) == 1 else
            FileGroup(" + ".join(g.key for g in run), tuple(f for g in run for f in g.files), parts=tuple(run))
            for run in runs]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:  # gone since the walk: its group's import says so
        return 0


def _in_step(done: dict[int, _Done], i: int, deep: bool) -> bool:
    """Whether run ``i`` of a usage-first import stores its sessions in workers=1's order: workers=1 reads file
    groups ahead until a batch is full and stores each batch's sessions in rank order, so a run must begin where
    one of its batches begins — where the run before it ended on a full batch. (A deep import's groups are each
    an import of their own, as ``workers=N`` always stored them.)"""
    return deep or i == 0 or done[i - 1].result.ended_full_batch


@contextmanager
def _threads_after(lab: Workspace, threads: int) -> Iterator[None]:
    """The writer's DuckDB threads put back to ``threads`` when the workers are done (or failed)."""
    try:
        yield
    finally:
        if not lab.store.closed:
            lab.store.set_threads(threads)


def _shared(d: _Done, owners: Counter[str], stored: set[str]) -> bool:
    """``d`` holds a session another group holds too, or one the Lab stored before this import."""
    return any(owners[sid] > 1 or sid in stored for sid in d.sessions)


def _concat(frames: list[pd.DataFrame], empty: pd.DataFrame) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else empty
