"""Request model: canonical JSON, segments and content hashes (and, in diff.py, the prefix diff)."""

from __future__ import annotations

from ._canonical import (
    PreparedRequest,
    Segment,
    SegmentMemo,
    canonical_bytes,
    canonical_json,
    content_hash,
    prepare,
    rebuild_body,
)

__all__ = [
    "PreparedRequest",
    "Segment",
    "SegmentMemo",
    "canonical_bytes",
    "canonical_json",
    "content_hash",
    "prepare",
    "rebuild_body",
]
