"""The reader registry: format name → :class:`Reader`, and detection by content.

Each reader says whether it handles a file from the file's first bytes (:meth:`Reader.sniff`); the file
name is never consulted (except its compression suffix, ``.gz``/``.bz2``/``.xz``/``.zst``, which is read
through), so a cassette saved as ``.txt`` or a proxy log named ``.log`` is still recognised. Detection reads
until it knows: 64 KiB first, then four times as much each time no reader accepts, up to the whole file (a
cassette whose first body is 250 KB names its ``uri`` only after it). When several readers accept a file of
JSON lines (one Claude Code line inside a proxy log), each line of the head votes for the readers that accept
it alone, and the reader with the most lines wins; the lines it cannot read are listed in ``skipped``.
Built-in readers are registered below in the order :func:`detect` asks them; a third-party reader calls
:func:`register`, or its package declares an entry point in the ``promptcache_nb.readers`` group (a reader
class or instance), asked after the built-ins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._registry import Registry
from ..errors import ImportFormatError
from ._jsonl import UnreadableLog, head_objects_memo, json_objects_in_head, read_log_bytes
from ._types import Reader
from .claude_code import ClaudeCodeReader
from .cline import ClineReader
from .codex import CodexReader
from .exchanges import ExchangesReader
from .gemini_cli import GeminiCliReader
from .har import HarReader
from .openclaw import OpenClawReader
from .opencode import OpenCodeReader
from .otlp import OtlpReader
from .pi import PiReader
from .vcr import VcrReader

HEAD_BYTES = 64 * 1024
#: Detection stops doubling the head here: a file that no reader recognises in its first 256 MiB is not a log.
MAX_HEAD_BYTES = 256 * 1024 * 1024



def _unknown_format(name: str, valid: list[str]) -> ImportFormatError:
    return ImportFormatError("--format", f"unknown format {name!r}; known: {', '.join(sorted(valid))}")


def _instance(loaded: Any) -> Reader:
    """An entry point may name a reader class or an instance."""
    reader: Reader = loaded() if isinstance(loaded, type) else loaded
    return reader


#: Readers by format name, in the order :func:`detect` asks them; plugins join from the
#: ``promptcache_nb.readers`` entry points on the first lookup.
READERS: Registry[Reader] = Registry("reader", "promptcache_nb.readers", unknown=_unknown_format, prepare=_instance)


def register(reader: Reader) -> Reader:
    """Add ``reader`` under ``reader.name`` (replacing a reader of that name) and return it."""
    return READERS.register(reader)


def read_head(path: Path, size: int = HEAD_BYTES) -> str:
    """The first ``size`` bytes of ``path`` (decompressed) decoded as UTF-8 (errors replaced, BOM dropped)."""
    return _decode(read_log_bytes(path, size))


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").removeprefix("\ufeff")


def detect(path: str | Path) -> Reader:
    """The reader that recognises the file, reading more of it until one does (see the module docstring).

    Raises:
        ImportFormatError: no reader accepts it (one line naming the file and the formats tried), or it cannot
            be read (a missing file, a corrupt archive, a ``.zst`` file without ``zstandard``).
    """
    with head_objects_memo():
        return _detect(Path(path))


def _detect(p: Path) -> Reader:
    size = HEAD_BYTES
    while True:
        try:
            data = read_log_bytes(p, size)
        except UnreadableLog as exc:
            raise ImportFormatError(str(p), f"cannot read ({str(exc).removeprefix(f'{p}: ')})") from None
        except OSError as exc:
            raise ImportFormatError(str(p), f"cannot read ({exc.strerror or exc})") from None
        head = _decode(data)
        accepting = [reader for reader in READERS.values() if reader.sniff(p, head)]
        if accepting:
            return accepting[0] if len(accepting) == 1 else _most_lines(p, head, accepting)
        if len(data) < size or size >= MAX_HEAD_BYTES:  # the whole file was read, or enough of it
            if len(data) < size and _nested_too_deep(data):  # the readers' parsers gave up: say so
                raise ImportFormatError(str(p), "JSON nested too deep to read (about 1,000 levels or more)")
            raise ImportFormatError(str(p), "not a known log format", tried=list(READERS))
        size *= 4


def _nested_too_deep(data: bytes) -> bool:
    """True when ``data`` is JSON no reader could parse for its nesting alone (the parser's recursion limit)."""
    try:
        json.loads(data)
    except RecursionError:
        return True
    except ValueError:
        return False
    return False


def _most_lines(path: Path, head: str, readers: list[Reader]) -> Reader:
    """Of several readers that accept ``head``, the one that accepts the most of its lines on their own (ties:
    registration order)."""
    lines = [line for line in head.split("\n")[:-1] if line.strip()]
    if len(json_objects_in_head(head, limit=2)) == 0 or not lines:
        return readers[0]
    votes = [sum(reader.sniff(path, line + "\n") for line in lines[:50]) for reader in readers]
    return readers[votes.index(max(votes))]


# pi and openclaw accept disjoint files (an OpenClaw entry in the head makes it openclaw's)
for _reader in (ClaudeCodeReader(), CodexReader(), ExchangesReader(), HarReader(), VcrReader(), OtlpReader(),
                OpenClawReader(), PiReader()):
    register(_reader)
register(GeminiCliReader())
register(OpenCodeReader())
register(ClineReader())
del _reader
