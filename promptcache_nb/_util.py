"""Small leaf helpers: durations, UTC timestamps, digests."""

from __future__ import annotations

import errno
import gc
import hashlib
import ipaddress
import os
import re
import stat
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from itertools import compress, count
from operator import is_not
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """'7m', '90s', '1.5h', 30 (seconds) or a timedelta -> timedelta. Raises ValueError."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return timedelta(seconds=float(value))
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"not a duration: {value!r} (use e.g. 45s, 7m, 1h)")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def utc(dt: datetime) -> datetime:
    """Return dt as an aware UTC datetime; naive datetimes are rejected to keep runs reproducible."""
    if dt.tzinfo is None:
        raise ValueError(f"timestamp {dt.isoformat()} has no timezone; pass tzinfo=timezone.utc")
    return dt.astimezone(UTC)


def digest(data: bytes, *, tag: str = "") -> str:
    """A tagged, truncated sha256 hex digest (128 bits: collisions are not a practical concern)."""
    h = hashlib.sha256()
    if tag:
        h.update(tag.encode() + b"\x00")
    h.update(data)
    return h.hexdigest()[:32]


def short_id(entry_id: str) -> str:
    return entry_id[:8]


def fmt_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a bulk load of parsed JSON, then restore it as it was.

    An import holds every parsed body of a log until its sessions are stored (they are grouped and ordered by
    time first); each full collection then walks all of them, which costs more than the JSON parse itself on a
    long log. Parsed JSON and the records built from it hold no reference cycles, so nothing leaks: the
    memory is freed by reference counting as usual.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def identity_prefix(a: Any, b: Any) -> int:
    """How many leading items of ``a`` and ``b`` are the very same objects (C-speed, stops at the first
    difference; equal but distinct objects do not count)."""
    n = min(len(a), len(b))
    return next(compress(count(), map(is_not, a[:n] if len(a) > n else a, b[:n] if len(b) > n else b)), n)


def common_prefix_length(a: Sequence[Any], b: Sequence[Any], start: int = 0) -> int:
    """Length of the common prefix of two sequences (bytes, str, list), using C-level slice compares.

    One forward pass in growing chunks, then a bisection inside the first unequal chunk: O(prefix)
    element comparisons, with no per-element Python loop. ``start``: a length the caller knows the two
    share already (e.g. extended from the previous request's): only what follows is compared.
    """
    if start:
        start = min(start, len(a), len(b))
        return start + common_prefix_length(a[start:], b[start:])
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, step = 0, 64
    while True:  # find a chunk [lo, hi) that differs; a[:lo] == b[:lo] holds throughout
        hi = min(n, lo + step)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, step = hi, step * 4
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


_SNAPSHOT_SUFFIX = re.compile(r"(?:-\d{8}|@\d{8}|-\d{4}-\d{2}-\d{2}|-latest)$")
_PLATFORM_WRAP = re.compile(r"^(?:[a-z]{2,4}\.)?anthropic\.|-v\d+(?::\d+)?$")


def model_base_id(model: str) -> str:
    """A model id without its snapshot date or ``-latest`` alias, lower-cased; Bedrock's
    ``[region.]anthropic.`` prefix and ``-v1:0`` suffix removed. Nothing else is stripped, so distinct
    models never collapse: ``claude-opus-4-9`` stays itself (it is not ``claude-opus-4``).

    Example:
        >>> model_base_id("claude-sonnet-4-5-20250929"), model_base_id("gpt-5-2025-08-07")
        ('claude-sonnet-4-5', 'gpt-5')
    """
    base = _PLATFORM_WRAP.sub("", model.strip().lower())
    while (shorter := _SNAPSHOT_SUFFIX.sub("", base)) != base:
        base = shorter
    return base


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is (``os.stat``'s ``st_mode``), as a phrase: "a FIFO (named pipe)"."""
    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a regular file"


#: Kernel file systems: their files describe processes and devices (``/proc/<pid>/mem``), they are no logs, and
#: reading one can block or never end.
KERNEL_ROOTS = ("/proc", "/sys", "/dev")


def kernel_root(path: str | os.PathLike[str]) -> str | None:
    """The :data:`KERNEL_ROOTS` entry ``path`` lies under once its links are followed, else None."""
    target = os.path.realpath(path)
    return next((r for r in KERNEL_ROOTS if target == r or target.startswith(r + os.sep)), None)


def not_a_regular_file(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be read as a file (None when it is a regular file, through its links): a symlink loop,
    a broken link, a FIFO, a socket, a device, a folder, a file of the kernel's (:data:`KERNEL_ROOTS`: spelled under
    one, or reached through a link). A link is named as one ("a link to a character device"). Nothing is opened."""
    link = os.path.islink(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop (a link that leads back to itself)"
        if link:
            return f"a broken link (its target {os.readlink(path)!r} does not exist)"
        return "no such file or directory" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
    # only a link, an odd file or a path spelled under a root can lead there (a walk's folders are not followed)
    spelled = os.fspath(path)
    root = kernel_root(path) if link or not stat.S_ISREG(st.st_mode) or spelled.startswith(KERNEL_ROOTS) else None
    if root is not None:
        target = os.path.realpath(path)
        return f"a link to {target} (under {root}: a kernel file)" if link else f"under {root} (a kernel file)"
    if stat.S_ISREG(st.st_mode):
        return None
    return f"a link to {file_kind(st.st_mode)}" if link else file_kind(st.st_mode)


# Response header our simulator endpoint sets: usage behind it is simulated (estimated tokens), never measured.
SIMULATOR_HEADER = "x-promptcache-simulator"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.1``, ``::1``, ``[::1]``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(*, total: int, desc: str, enabled: bool, unit: str = "it") -> Any:
    """A tqdm.auto bar (a widget in Jupyter) for work of ``total`` steps, or a no-op when disabled, when there
    is nothing to do (``total`` 0), or when no one watches: stderr is not a terminal and no notebook kernel runs
    (a CI log or a redirected file would get a bar's carriage returns as one long line)."""
    if not enabled or total <= 0 or not _watched():
        return _NoBar()
    from tqdm.auto import tqdm  # picks the notebook bar through ipywidgets: loaded when a bar is drawn

    return tqdm(total=total, desc=desc, unit=unit, leave=False)


def _watched() -> bool:
    """True in a terminal or a Jupyter kernel: where a progress bar is seen rather than logged."""
    stream = sys.stderr
    if stream is not None and hasattr(stream, "isatty") and stream.isatty():
        return True
    try:
        from IPython import get_ipython  # heavy, and absent outside notebooks
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` for a :func:`warnings.warn` made by this function's caller that names the first frame
    outside promptcache_nb: a warning points at the user's own line (a notebook cell, a script) however deep in the
    package it was raised (what Python 3.12's ``skip_file_prefixes`` does; we support 3.11)."""
    frame = sys._getframe(1)  # the caller: stacklevel 1
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


#: Elements of these classes are never typeset as math: ``tex2jax_ignore`` by MathJax 2 (nbconvert's HTML, classic
#: Notebook), ``mathjax_ignore`` by MathJax 3 (JupyterLab 4, Notebook 7).
NO_MATH_CLASSES = "tex2jax_ignore mathjax_ignore"
_DOLLAR_AS_TEXT = f'<span class="{NO_MATH_CLASSES}">&#36;</span>'
# a tag (its attributes keep their text) or, in Markdown, a code span (shown verbatim); else one dollar sign
_TAG_OR_DOLLAR = re.compile(r"(<[^<>]*>)|\$")
_TAG_CODE_OR_DOLLAR = re.compile(r"(<[^<>]*>|`[^`\n]*`)|\$")


def escape_dollars(markup: str, *, markdown: bool = False) -> str:
    """Markdown or HTML whose dollar signs render as dollar signs, never as math.

    Two ``$`` in one output ("saves $0.19 of $0.30") are a TeX formula to MathJax (JupyterLab, Notebook 7,
    nbconvert) and KaTeX (VS Code), and a backslash escape does not survive JupyterLab's Markdown renderer.
    Each ``$`` outside tags (and, with ``markdown``, outside code spans) becomes an HTML entity inside an
    element the math renderers skip, which every renderer shows as a plain ``$``.

    Example:
        >>> escape_dollars("$0.19").replace(NO_MATH_CLASSES, "…")
        '<span class="…">&#36;</span>0.19'
    """
    if "$" not in markup:
        return markup
    pattern = _TAG_CODE_OR_DOLLAR if markdown else _TAG_OR_DOLLAR
    return pattern.sub(lambda m: m.group(1) or _DOLLAR_AS_TEXT, markup)
