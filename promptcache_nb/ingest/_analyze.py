"""Deep analysis of usage-first imported sessions: ``lab.analyze()``, and a session's first use.

A usage-first import (``lab.import_log``) stores each request's measured figures and remembers, per session, its
place in the import's order, its file group and the files it was read from (``unanalysed_sessions``). Analysing
sessions reads those files again with the bodies rebuilt and stores the sessions as a deep import
(``import_log(deep=True)``) of the same files would have: the same file groups, in the same order, with the same
account and project — so every table is the deep import's. Each session's usage-first rows are replaced in the
transaction that stores its analysed ones: a kill leaves every session either as it was or analysed.

Sessions of one account share a simulated provider cache (and agree on the size of an unlogged prefix), so a
session's simulated columns depend on the sessions of its account stored before it: analysing a session analyses
first every session of its account imported before it that still awaits analysis (a progress bar shows them), and
``lab.analyze()`` analyses everything awaiting analysis in import order — what a deep import does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._config import DEFAULT_ACCOUNT
from .._util import digest, gc_paused, progress_bar
from ..analysis.calibrate import calibrate_families
from ..errors import PromptCacheError
from ..readers._jsonl import open_log
from ..workspace import Workspace
from ._import import _import, _Owners, _split_ref

__all__ = ["AnalysisPlan", "analyze", "plan_analysis"]


@dataclass
class AnalysisPlan:
    """What one analysis stores again: the usage-first sessions it replaces, and the file groups to read (each
    a list of files, in the import's order), with each file's account and project."""

    sessions: list[dict[str, Any]]  #: ``Store.unanalysed`` rows, in import order
    groups: list[list[str]] = field(default_factory=list)
    accounts: dict[str, str] = field(default_factory=dict)
    projects: dict[str, str] = field(default_factory=dict)
    format: str = "auto"

    @property
    def ids(self) -> set[str]:
        return {r["session_id"] for r in self.sessions}


def plan_analysis(lab: Workspace, session_ids: Iterable[str] | None = None) -> AnalysisPlan:
    """The analysis of ``session_ids`` (None: every session awaiting analysis). A session is analysed with the
    sessions it cannot be told apart from — those sharing one of its files, its parent and sub-agents (a
    compaction call's history is rebuilt from its parent's log) — and after the sessions of its account imported
    before it that await analysis too (whose entries its simulated cache would have held)."""
    store = lab.store
    waiting = store.unanalysed()
    if session_ids is None:
        chosen = waiting
    else:
        wanted = set(session_ids)
        by_file: dict[str, list[dict[str, Any]]] = {}
        for r in waiting:
            for f in r["files"]:
                by_file.setdefault(f, []).append(r)
        by_id = {r["session_id"]: r for r in waiting}
        todo = [r for r in waiting if r["session_id"] in wanted]
        seen = {r["session_id"] for r in todo}
        while todo:  # the closure over shared files, parent links and earlier sessions of the account
            r = todo.pop()
            account = r["account"] or DEFAULT_ACCOUNT
            related = [q for f in r["files"] for q in by_file.get(f, [])]
            related += [by_id[p] for p in (r["parent_id"],) if p in by_id]
            related += [q for q in waiting if q["parent_id"] == r["session_id"]
                        or ((q["account"] or DEFAULT_ACCOUNT) == account and q["import_seq"] < r["import_seq"])]
            for q in related:
                if q["session_id"] not in seen:
                    seen.add(q["session_id"])
                    todo.append(q)
        chosen = [r for r in waiting if r["session_id"] in seen]  # in import order
    plan = AnalysisPlan(chosen)
    if not chosen:
        return plan
    groups: dict[str, list[str]] = {}
    for r in chosen:  # groups in the order their first session was stored; files in walk order
        files = groups.setdefault(r["file_group"], [])
        files.extend(f for f in r["files"] if f not in files)
    plan.groups = [sorted(files) for files in groups.values()]
    rows = {r["id"]: r for r in store.session_rows()}
    formats = set()
    for r in chosen:
        row = rows[r["session_id"]]
        formats.add(row["config"].get("format") or "auto")
        for f in r["files"]:
            plan.accounts.setdefault(f, r["account"] or DEFAULT_ACCOUNT)
            plan.projects.setdefault(f, row["project_id"])
    plan.format = formats.pop() if len(formats) == 1 else "auto"
    return plan


def analyze(lab: Workspace, session_ids: Iterable[str] | None = None, *, workers: int = 1,
            progress: bool = True) -> int:
    """Analyse usage-first sessions (see the module docstring); returns how many sessions were analysed."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise PromptCacheError(f"analyze(workers=...): a number of processes >= 1, got {workers!r}")
    plan = plan_analysis(lab, session_ids)
    if not plan.sessions:
        return 0
    if lab.store.read_only:
        first = plan.sessions[0]["session_id"]
        raise PromptCacheError(f"session {first!r} (and {len(plan.sessions) - 1} more) await the analysis of their "
                               f"bodies, which writes to the store, opened read-only ({lab.store.read_only_why}): "
                               "run lab.analyze() on a writable Lab, or import with deep=True (--deep)")
    missing = sorted({f for group in plan.groups for f in group if not os.path.exists(f)})
    if missing:
        raise PromptCacheError(f"cannot analyse {len(plan.sessions)} session(s): their log "
                               f"{'file is' if len(missing) == 1 else 'files are'} gone ({missing[0]}"
                               f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}); their measured "
                               "figures stay as imported")
    _check_unchanged(lab, plan)
    if workers > 1 and len(plan.groups) > 1:
        _analyze_parallel(lab, plan, workers=workers, progress=progress)
    else:
        with gc_paused():
            _import(lab, [f for g in plan.groups for f in g], plan.format, None, progress, True,
                    _Owners(DEFAULT_ACCOUNT, plan.accounts, plan.projects), plan.groups, deep=True,
                    replace=plan.ids)
    return len(plan.sessions)


def _check_unchanged(lab: Workspace, plan: AnalysisPlan) -> None:
    """Refuse to analyse from log files that changed since they were imported: each request's line (where the
    reader located it: ``turns.source_offset`` / ``source_length`` / ``source_digest``) must still hold the same
    bytes. A file that only grew passes (its new lines are imported as new requests)."""
    spans = lab.store.source_spans(sorted(plan.ids))
    by_file: dict[str, list[tuple[str, int, int, str]]] = {}
    for sid, ref, offset, length, want in spans:
        by_file.setdefault(_split_ref(ref)[0], []).append((sid, int(offset), int(length), want))
    for file, lines in by_file.items():
        try:
            with open_log(Path(file)) as fh:
                for sid, offset, length, want in lines:
                    fh.seek(offset)
                    got = fh.read(length)
                    if digest(got, tag="line") != want:
                        raise PromptCacheError(
                            f"{file}: changed since it was imported (the line at byte {offset:,} is not the one "
                            f"session {sid!r} was read from): its measured figures stay as imported; to analyse "
                            "it, lab.forget_session(...) and import the file again")
        except OSError as exc:
            raise PromptCacheError(f"{file}: cannot be read again to analyse it ({exc})") from None


def _merged_groups(plan: AnalysisPlan) -> list[list[str]]:
    """The plan's groups, those sharing a session's files merged (each worker stores whole sessions)."""
    owner: dict[str, int] = {}
    merged: list[list[str]] = []
    for group in plan.groups:
        hits = sorted({owner[f] for f in group if f in owner})
        target = hits[0] if hits else len(merged)
        if not hits:
            merged.append([])
        for other in hits[1:]:
            merged[target].extend(merged[other])
            merged[other] = []
        merged[target].extend(group)
        for f in merged[target]:
            owner[f] = target
    for r in plan.sessions:  # a session read from files of two groups
        hits = sorted({owner[f] for f in r["files"] if f in owner})
        for other in hits[1:]:
            merged[hits[0]].extend(merged[other])
            merged[other] = []
            for f in merged[hits[0]]:
                owner[f] = hits[0]
    return [sorted(dict.fromkeys(g)) for g in merged if g]


def _analyze_group(files: Sequence[str], folder: str, index: int, fmt: str, accounts: dict[str, str],
                   projects: dict[str, str]) -> tuple[int, str, list[tuple[str, type[Warning]]], list[str]]:
    """Analyse one group into a new store file under ``folder`` (runs in a worker process); returns the sessions
    it stored with it (the writer would otherwise open the file once more to list them)."""

    path = os.path.join(folder, f"a{index}.duckdb")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lab = Workspace(path, progress=False)
        try:
            lab.store.set_threads(1)
            with gc_paused():
                _import(lab, list(files), fmt, None, False, False, _Owners(DEFAULT_ACCOUNT, accounts, projects),
                        [list(files)], deep=True)
            analysed = lab.store.session_ids()
        finally:
            lab.close()
    return index, path, [(str(w.message), w.category) for w in caught], analysed


def _analyze_parallel(lab: Workspace, plan: AnalysisPlan, *, workers: int, progress: bool) -> None:
    """Each group analysed in a worker's own store, merged here in group order: a group's usage-first sessions
    are deleted in the transaction that copies its analysed ones in. Sessions of different groups do not see each
    other's simulated cache entries (as ``import_log(workers=N)``)."""
    groups = _merged_groups(plan)
    folder = tempfile.mkdtemp(prefix="pcnb-analyze-")
    bar = progress_bar(total=len(groups), desc="analysing sessions", enabled=progress, unit="group")
    threads = lab.store.set_threads(1)
    by_file = {f: r["session_id"] for r in plan.sessions for f in r["files"]}
    done: dict[int, tuple[str, list[tuple[str, type[Warning]]], list[str]]] = {}
    serial: list[list[str]] = []
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_analyze_group, g, folder, i, plan.format, plan.accounts, plan.projects)
                       for i, g in enumerate(groups)]
            nxt = 0
            for fut in as_completed(futures):
                i, path, caught, analysed = fut.result()
                done[i] = (path, caught, analysed)
                bar.update(1)
                while nxt in done:  # merged in group order, while the other workers run
                    if not _merge_group(lab, done[nxt][0], {by_file[f] for f in groups[nxt] if f in by_file},
                                        plan.ids, done[nxt][2]):
                        serial.append(groups[nxt])
                    nxt += 1
    finally:
        bar.close()
        if not lab.store.closed:
            lab.store.set_threads(threads)
        shutil.rmtree(folder, ignore_errors=True)
    lab.caches.drop_all()  # the simulated caches did not see the merged requests: rebuilt when next used
    if serial:
        _import(lab, [f for g in serial for f in g], plan.format, None, progress, False,
                _Owners(DEFAULT_ACCOUNT, plan.accounts, plan.projects), serial, deep=True, replace=plan.ids)
    for _, caught, _ in done.values():
        for message, category in caught:
            warnings.warn(message, category, stacklevel=3)
    models = set(lab.store.models_of(sorted(plan.ids)))
    if models:
        calibrate_families(lab, models)


def _merge_group(lab: Workspace, path: str, group_sessions: set[str], replacing: set[str],
                 analysed: list[str]) -> bool:
    """Replace a group's usage-first sessions by a worker's analysed store (holding the sessions ``analysed``),
    in one transaction. False (nothing done) when the worker also stored a session that is stored analysed
    already (a log file holding both): that group is analysed here instead, which adds only what is new."""
    store = lab.store
    if set(store.existing_sessions(analysed)) - replacing:
        return False
    with store.transaction():
        store.delete_sessions(sorted((group_sessions | set(analysed)) & replacing))
        store.merge_from(path)
    return True
