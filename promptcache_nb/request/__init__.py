"""Request model: canonical JSON, segments and content hashes (in diff.py, the prefix diff; in validate.py, whether a
body follows its API's documented shape)."""

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
from .validate import BodyProblem, check_request, validate_request

__all__ = [
    "BodyProblem",
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
    "check_request",
    "compute_diff",
    "content_hash",
    "detect_dialect",
    "prepare",
    "rebuild_body",
    "sections",
    "segment_offset",
    "shared_prefix_of",
    "unlogged_segment",
    "validate_request",
    "visible",
]
