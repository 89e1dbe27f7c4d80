"""An example fleet from the shipped example logs: many developers and projects, fresh ids, shifted times.

Each copy of a shipped log is the same traffic (bodies, usage, gaps) as another developer's session on another
day: every id the log carries (UUIDs, ``msg_``/``req_``/``toolu_`` ids) is replaced by a fresh one, every
timestamp moved by a whole number of hours, and the project folder renamed. Deterministic for a ``seed``.
"""

from __future__ import annotations

import random
import re
import uuid
from datetime import datetime, timedelta
from pathlib import Path

from .._data import data_path

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PREFIXED = re.compile(r"\b(?:msg|req|toolu|call|resp)_[A-Za-z0-9]{6,}")
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)")
PROJECTS = ("billing", "checkout", "search", "mobile-api", "data-pipeline", "auth", "notifications", "reports")
DEVELOPERS = ("ana", "ben", "chen", "dara", "eli", "fatima", "goran", "hana", "ivan", "jo", "kai", "lena")


class _Copy:
    """One copy's substitutions: the same id maps to the same fresh id throughout the copy."""

    def __init__(self, rng: random.Random, shift: timedelta, cwd_from: str, cwd_to: str) -> None:
        self.rng, self.shift = rng, shift
        self.ids: dict[str, str] = {}
        self.cwd = (cwd_from, cwd_to)

    def _fresh_uuid(self, m: re.Match[str]) -> str:
        return self.ids.setdefault(m.group(0), str(uuid.UUID(int=self.rng.getrandbits(128), version=4)))

    def _fresh_prefixed(self, m: re.Match[str]) -> str:
        old = m.group(0)
        head, _, tail = old.partition("_")
        alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789"
        return self.ids.setdefault(old, head + "_" + "".join(self.rng.choice(alphabet) for _ in tail))

    def _shifted(self, m: re.Match[str]) -> str:
        text = m.group(0)
        at = datetime.fromisoformat(text.replace("Z", "+00:00")) + self.shift
        frac = text[19:].split("Z")[0].split("+")[0]
        digits = len(frac) - 1 if frac.startswith(".") else 0
        out = at.strftime("%Y-%m-%dT%H:%M:%S") + (f".{at.microsecond:06d}"[: digits + 1] if digits else "")
        return out + ("Z" if text.endswith("Z") else at.strftime("%z")[:3] + ":" + at.strftime("%z")[3:])

    def text(self, text: str) -> str:
        text = _UUID.sub(self._fresh_uuid, text)
        text = _PREFIXED.sub(self._fresh_prefixed, text)
        text = _STAMP.sub(self._shifted, text)
        return text.replace(self.cwd[0], self.cwd[1])

    def name(self, name: str) -> str:
        return _UUID.sub(self._fresh_uuid, name)


def example_fleet(out: str | Path, *, developers: int = 6, projects: int = 4, days: int = 14,
                  seed: int = 0) -> Path:
    """Write an example fleet under ``out`` and return ``out``: ``out/claude-code/<project folder>/...`` (each
    developer's projects, Claude Code's layout with sub-agents) and ``out/proxy/<developer>-<project>.jsonl``
    (the recording proxy's logs, full bodies), copied from the shipped example logs.

    ``developers`` x ``projects`` Claude Code project folders, each holding the shipped session (with its
    sub-agents) once per day it was worked on, and one proxy log per developer and project.
    """
    out = Path(out).expanduser()
    rng = random.Random(seed)
    cc = data_path("logs") / "claude_code" / "-home-dev-billing-service"
    proxy = sorted((data_path("logs") / "exchanges").glob("*.jsonl"))
    for d in range(developers):
        dev = DEVELOPERS[d % len(DEVELOPERS)] + (str(d // len(DEVELOPERS)) if d >= len(DEVELOPERS) else "")
        for p in range(projects):
            project = PROJECTS[(d + p) % len(PROJECTS)]
            folder = out / "claude-code" / f"-home-{dev}-{project}"
            worked = sorted(rng.sample(range(days), k=max(1, min(days, rng.randint(2, 5)))))
            for day in worked:
                copy = _Copy(rng, timedelta(days=day, hours=rng.randint(-3, 6)), "/home/dev/billing-service",
                             f"/home/{dev}/{project}")
                for src in sorted(cc.rglob("*.jsonl")):
                    rel = src.relative_to(cc)
                    dest = folder / Path(*[copy.name(part) for part in rel.parts])
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_text(copy.text(src.read_text(encoding="utf-8")), encoding="utf-8")
            src = proxy[(d + p) % len(proxy)]
            copy = _Copy(rng, timedelta(days=rng.randrange(days), hours=rng.randint(0, 8)), "", "")
            dest = out / "proxy" / f"{dev}-{project}.jsonl"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(copy.text(src.read_text(encoding="utf-8")), encoding="utf-8")
    return out
