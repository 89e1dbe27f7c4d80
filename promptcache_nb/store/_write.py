"""What one request writes to the store: the typed value ``Store.write_request`` takes (built by ``pipeline.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._types import DeltaOp, MessageBlock, RequestRecord
from ..request import PreparedRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestWrite:
    """Everything one request adds to the store, written in one transaction (``Store.write_request``).

    Content-addressed rows (segment blocks, prefix nodes, reply blocks) are given whole; the store keeps only
    those it does not hold yet, starting after the ``shared`` leading segments the request has in common with
    the session's previous stored request (their rows were written with it).
    """

    record: RequestRecord
    prepared: PreparedRequest  #: its segments: the blocks and prefix nodes
    nodes: list[str]  #: the prefix node id of each segment
    shared: int  #: leading segments (and nodes) shared with the session's previous stored request
    rest_body: str  #: the body's shape and top-level fields (canonical JSON; ``record.rest_hash`` is its hash)
    reply_blocks: list[MessageBlock]  #: the reply's content blocks (``record.reply`` references them)
    messages: list[tuple[int, dict[str, Any]]]  #: history messages appended, with their seq
    state: dict[str, Any] | None  #: the session_state row to write (None: unchanged)
    state_previous: dict[str, Any] | None  #: its columns as last written (only changed columns are updated)
    delta_ops: list[DeltaOp]
    project_id: str
    #: the session's pending events are this request's (``record.events``): their rows are deleted with it
    consumes_pending_events: bool = False
