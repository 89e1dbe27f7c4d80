"""Small leaf helpers: durations, UTC timestamps, digests."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta

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
