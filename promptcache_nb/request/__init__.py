"""Request model: canonical JSON, segments and content hashes (and, in diff.py, the prefix diff)."""

from __future__ import annotations

from ._canonical import (
    DIALECTS,
    UNLOGGED_PATH,
    LoggedBody,
    PreparedRequest,
    Segment,
    SegmentMemo,
    canonical_bytes,
    canonical_json,
    content_hash,
    detect_dialect,
    prepare,
    rebuild_body,
    shared_prefix_of,
    unlogged_segment,
)
from .diff import (  # the function diff() is re-exported at the top level: here it would shadow the module
    Excerpt,
    FieldChange,
    HistoryRewrite,
    PrefixDiff,
    compute_diff,
    sections,
    segment_offset,
    visible,
)

__all__ = [
    "DIALECTS",
    "Excerpt",
    "FieldChange",
    "HistoryRewrite",
    "LoggedBody",
    "PrefixDiff",
    "PreparedRequest",
    "Segment",
    "SegmentMemo",
    "UNLOGGED_PATH",
    "canonical_bytes",
    "canonical_json",
    "compute_diff",
    "content_hash",
    "detect_dialect",
    "prepare",
    "rebuild_body",
    "sections",
    "segment_offset",
    "shared_prefix_of",
    "unlogged_segment",
    "visible",
]
