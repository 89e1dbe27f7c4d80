"""The files to read (:func:`expand_paths`) and their file groups: the unit an import reads, stores and
(``pc.fleet``, ``workers=``) hands to another process.

A group is the files under one top-level entry of a folder you pass (for ``~/.claude/projects`` one project
folder; a session file ``<id>.jsonl`` and its ``<id>/`` folder of sub-agents are one group), or one file you name.
Sessions never span Claude Code project folders, and a session's sub-agents sit beside it, so a group holds whole
sessions in the common layouts; callers that need every session whole check (a session id in two groups).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import digest, kernel_root, not_a_regular_file
from ..errors import ImportFormatError
from ..readers._jsonl import COMPRESSED_SUFFIXES

LOG_SUFFIXES = (".jsonl", ".json", ".yaml", ".yml", ".har", ".ndjson", ".sqlite")


@dataclass(frozen=True)
class LogFile:
    """One file to read: its resolved path (one source however it was spelled: relative, ``..``, a symlink),
    and whether the user named it (a named file must be a known format)."""

    path: Path
    named: bool


def expand_paths(paths: str | Path | Iterable[str | Path]) -> tuple[list[LogFile], list[dict[str, Any]]]:
    """The files to read, and the files a directory walk passed over with why (``file``, ``line`` 0, ``reason``).

    A directory is walked whole: a file with a log suffix (``.jsonl``, ``.json``, ``.yaml``…, optionally
    compressed: ``.jsonl.gz``) is read; any other file, and anything hidden (a name starting with ``.``), is
    listed as skipped, never passed over in silence. Paths resolve (symlinks, ``..``), and a file reached twice
    (two spellings, a hard link: same device and inode) is read once.
    """
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[LogFile] = []
    passed: list[dict[str, Any]] = []
    for item in items:
        p = Path(item).expanduser()
        root = kernel_root(p)
        if root is not None:  # /proc/<pid>/...: refused, file or folder, named or through a link
            why = not_a_regular_file(p) or f"under {root} (a kernel file)"
            raise ImportFormatError(display_path(p), f"{why}, not a regular file: copy it elsewhere to import it")
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_dir():
                    if f.is_symlink():  # rglob does not follow it (a link up the tree would loop): say so
                        passed.append(_passed(f, "a link to a folder, not followed: name the folder to import it"))
                    continue
                special = not_a_regular_file(f)
                if special is not None:  # never opened: a FIFO blocks, a device or a kernel file never ends
                    passed.append(_passed(f, f"{special}: not read"))
                    continue
                rel = f.relative_to(p).parts
                if any(part.startswith(".") for part in rel):
                    passed.append(_passed(f, "hidden file (name or folder starts with '.'): name it to import it"))
                elif _log_suffix(f) is None:
                    passed.append(_passed(f, f"not a log file name (suffix {f.suffix or 'none'!r}; logs end "
                                             f"in {', '.join(LOG_SUFFIXES)}, optionally compressed): name it to "
                                             "import it"))
                else:
                    out.append(LogFile(f, False))
        elif p.is_file():
            out.append(LogFile(p, True))
        elif any(ch in str(item) for ch in "*?[") and not p.exists():
            for m in sorted(Path(m) for m in glob.glob(os.path.expanduser(str(item)), recursive=True)):
                special = None if m.is_dir() else not_a_regular_file(m)
                if special is not None:
                    passed.append(_passed(m, f"{special}: not read"))
                elif not m.is_dir():
                    out.append(LogFile(m, False))
        else:
            special = not_a_regular_file(p) or "no such file or directory"
            raise ImportFormatError(display_path(p), special if special.startswith("no such") else
                                    f"{special}, not a regular file")
    seen: set[tuple[int, int]] = set()
    unique: list[LogFile] = []
    for log in out:
        st = log.path.stat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            unique.append(LogFile(log.path.resolve(), log.named))
    return unique, passed


def _log_suffix(path: Path) -> str | None:
    """The log suffix of ``path`` (``.jsonl`` for ``x.jsonl`` and ``x.jsonl.gz``), else None."""
    suffixes = [x.lower() for x in path.suffixes]
    if ".jsonl" in suffixes and suffixes[-1] not in COMPRESSED_SUFFIXES and re.search(
            r"\.jsonl\.(reset|deleted)\.", path.name):
        return ".jsonl"  # OpenClaw's rotated transcripts: <id>.jsonl.reset.<ISO>, earlier windows of a session
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes.pop()
    return suffixes[-1] if suffixes and suffixes[-1] in LOG_SUFFIXES else None


def _passed(path: Path, reason: str) -> dict[str, Any]:
    return {"file": display_path(path), "line": 0, "reason": reason}


def display_path(path: Path | str) -> str:
    """``path`` as text that can be stored and printed: bytes of a file name that are not UTF-8 become
    ``\\xNN`` escapes (the name itself is still used to open the file)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a surrogate that did not come from a file name's bytes
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


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
        """The project its sessions are stored under unless one is given: the folder (or file) name, and for a
        Claude Code session the project folder it sits in, read back as a name (:func:`readable_project`):
        ``-home-dev-billing-service/<session id>`` is ``billing-service``, never the session id."""
        key = Path(self.key.split(" + ")[0])
        if _CLAUDE_PROJECT.match(key.name):  # the whole project folder was one group
            return readable_project(key.name)
        if _CLAUDE_PROJECT.match(key.parent.name):  # one session (and its sub-agents) of a project folder
            return readable_project(key.parent.name)
        return key.name

    @property
    def id(self) -> str:
        return "g" + digest(self.key.encode(), tag="fleet-group")[:12]


#: A Claude Code project folder: the session's working directory with every character but letters and digits
#: replaced by "-" (``/home/dev/billing-service`` → ``-home-dev-billing-service``; agent_log_formats.md).
_CLAUDE_PROJECT = re.compile(r"^(?:-|[A-Za-z]--)[A-Za-z0-9-]*$")
#: The home folders that lead such a name (Linux, macOS, Windows' C:\Users, root's): the user's name follows.
_HOME = re.compile(r"^(?:-home-|-Users-|[A-Za-z]--Users-)[^-]+-(?=.)|^-root-(?=.)")


def readable_project(folder: str) -> str:
    """A Claude Code project folder's name as a project: the working directory past the home folder and the
    user's name (``-home-dev-billing-service`` → ``billing-service``; ``-Users-ana-src-api`` → ``src-api``), so
    every developer's copy of a project is one project; a folder outside a home keeps its path
    (``-srv-agents-ci`` → ``srv-agents-ci``). The encoding is lossy ("/", "." and "-" all became "-"), so a user
    name with a "-" in it leaves its tail in front."""
    return _HOME.sub("", folder).lstrip("-") or folder


def plan_groups(paths: str | Path | Iterable[str | Path]) -> tuple[list[FileGroup], list[dict[str, Any]]]:
    """The file groups of ``paths``, and the files a walk passed over (with why), as ``Lab.import_log`` walks."""
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
    stem = name
    for suffixes in (COMPRESSED_SUFFIXES, LOG_SUFFIXES):
        for suffix in suffixes:
            if stem.lower().endswith(suffix) and len(stem) > len(suffix):
                stem = stem[:-len(suffix)]
                break
    return stem


