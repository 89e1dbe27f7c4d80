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
from .diff import (  # the function diff() is re-exported at the top level: here it would shadow the module
    Excerpt,
    FieldChange,
    HistoryRewrite,
    PrefixDiff,
    compute_diff,
    segment_offset,
    visible,
)

__all__ = [
    "Excerpt",
    "FieldChange",
    "HistoryRewrite",
    "PreparedRequest",
    "PrefixDiff",
    "Segment",
    "SegmentMemo",
    "canonical_bytes",
    "canonical_json",
    "compute_diff",
    "content_hash",
    "prepare",
    "rebuild_body",
    "segment_offset",
    "visible",
]
