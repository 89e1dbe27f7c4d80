"""File groups: the unit an import reads, stores and (``pc.fleet``, ``workers=``) hands to another process.

A group is the files under one top-level entry of a folder you pass (for ``~/.claude/projects`` one project
folder; a session file ``<id>.jsonl`` and its ``<id>/`` folder of sub-agents are one group), or one file you name.
Sessions never span Claude Code project folders, and a session's sub-agents sit beside it, so a group holds whole
sessions in the common layouts; callers that need every session whole check (a session id in two groups).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import digest


@dataclass(frozen=True)
class FileGroup:
    """Files imported by one task. ``key`` names it (a path: the folder or file it came from); ``id`` is the
    stable name of its Parquet files."""

    key: str
    files: tuple[str, ...]
    members: tuple[str, ...] = ()  # the groups merged into this one (one account, or a session spanned them)
    #: the provider account its sessions were served under (``pc.fleet.import_logs(account=...)``); "" not said
    account: str = ""
    #: a merged group's groups, in the order one import of their folders stores them (empty: itself alone)
    parts: tuple[FileGroup, ...] = ()

    @property
    def project(self) -> str:
        """The project its sessions are stored under unless one is given: the folder (or file) name."""
        return Path(self.key.split(" + ")[0]).name

    @property
    def id(self) -> str:
        return "g" + digest(self.key.encode(), tag="fleet-group")[:12]


def plan_groups(paths: str | Path | Iterable[str | Path]) -> tuple[list[FileGroup], list[dict[str, Any]]]:
    """The file groups of ``paths``, and the files a walk passed over (with why), as ``Lab.import_log`` walks."""
    from ._import import expand_paths

    items = [paths] if isinstance(paths, str | Path) else list(paths)
    roots = [Path(p).expanduser().resolve() for p in items if Path(p).expanduser().is_dir()]
    files, passed = expand_paths(items)
    groups: dict[str, list[str]] = {}
    for log in files:
        groups.setdefault(_group_key(log.path, roots), []).append(str(log.path))
    return [FileGroup(k, tuple(sorted(v))) for k, v in sorted(groups.items())], passed


def _group_key(path: Path, roots: Sequence[Path]) -> str:
    for root in sorted(roots, key=lambda r: -len(r.parts)):
        if path.is_relative_to(root) and path != root:
            parts = path.relative_to(root).parts
            # a folder keeps its whole name ("alice.smith/" and "alice.jones/" are two groups); a file its name
            # without its log suffixes, so "<id>.jsonl" and "<id>/..." (a session and its sub-agents) are one
            return str(root / (parts[0] if len(parts) > 1 else _without_log_suffixes(parts[0])))
    return str(path.with_name(_without_log_suffixes(path.name)))


def _without_log_suffixes(name: str) -> str:
    """``name`` without the suffixes that make it a log (``.jsonl``, ``.json.gz``...): ``s.messages.json`` ->
    ``s.messages``, ``v1.2.jsonl`` -> ``v1.2``."""
    from ..importers._jsonl import COMPRESSED_SUFFIXES
    from ._import import LOG_SUFFIXES

    stem = name
    for suffixes in (COMPRESSED_SUFFIXES, LOG_SUFFIXES):
        for suffix in suffixes:
            if stem.lower().endswith(suffix) and len(stem) > len(suffix):
                stem = stem[:-len(suffix)]
                break
    return stem


