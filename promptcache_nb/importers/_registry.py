"""The reader registry: format name → :class:`Reader`, and detection by content.

Each reader says whether it handles a file from the file's first 64 KiB (:meth:`Reader.sniff`); the file
name is never consulted, so a cassette saved as ``.txt`` or a proxy log named ``.log`` is still recognised.
Built-in readers are registered below in the order :func:`detect` asks them; a third-party reader calls
:func:`register`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ImportFormatError
from ._types import Reader
from .claude_code import ClaudeCodeReader
from .codex import CodexReader
from .exchanges import ExchangesReader
from .har import HarReader
from .otlp import OtlpReader
from .vcr import VcrReader

HEAD_BYTES = 64 * 1024

READERS: dict[str, Reader] = {}


def register(reader: Reader) -> Reader:
    """Add ``reader`` under ``reader.name`` (replacing a reader of that name) and return it."""
    READERS[reader.name] = reader
    return reader


def read_head(path: Path, size: int = HEAD_BYTES) -> str:
    """The first ``size`` bytes of ``path`` decoded as UTF-8 (errors replaced, BOM dropped)."""
    with open(path, "rb") as fh:
        data = fh.read(size)
    return data.decode("utf-8", errors="replace").removeprefix("\ufeff")


def detect(path: str | Path) -> Reader:
    """The reader whose ``sniff`` accepts the file's first 64 KiB.

    Raises:
        ImportFormatError: no reader accepts it (one line naming the file and the formats tried).
    """
    p = Path(path)
    try:
        head = read_head(p)
    except OSError as exc:
        raise ImportFormatError(str(p), f"cannot read ({exc.strerror or exc})") from None
    for reader in READERS.values():
        if reader.sniff(p, head):
            return reader
    raise ImportFormatError(str(p), "not a known log format", tried=list(READERS))


for _reader in (ClaudeCodeReader(), CodexReader(), ExchangesReader(), HarReader(), VcrReader(), OtlpReader()):
    register(_reader)
del _reader
