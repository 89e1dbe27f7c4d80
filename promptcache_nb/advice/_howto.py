"""Placeholder until the client how-to table lands (replaced by the howto branch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HowTo:
    text: str
    switch: str | None = None
    source: str | None = None


def how_to_apply(client: str, fix: str, *, detail: Mapping[str, Any] | None = None) -> HowTo:
    return HowTo("")
