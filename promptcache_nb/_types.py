"""Domain values every stage shares: knowledge entries, prompt-delta rows and stored requests (frozen, no DB
handles).

A leaf: strategies read them, the store writes and reads them, analysis and widgets show them, so they
live below all of those (the store re-exports them, where they were first defined).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

from .usage import Usage, UsageSource


@lru_cache(maxsize=8192)  # a project's entries are keyed again each time its knowledge is reloaded
def fnv1a(text: str) -> str:
    """32-bit FNV-1a hex, as Lore keys pinned entries (``id:fnv1a(title + "\\x1f" + content)``)."""
    h = 0x811C9DC5
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


@dataclass(frozen=True)
class KnowledgeEntry:
    """One version of a long-term knowledge entry (project-scoped)."""

    id: str
    project_id: str
    version: int
    title: str
    content: str
    category: str
    deleted: bool
    updated_at: datetime
    key: str | None = None

    @property
    def short_id(self) -> str:
        return self.id[:8]

    @cached_property
    def pin_key(self) -> str:
        """``id:hash(title, content)``: changes only when the entry materially changes."""
        return f"{self.id}:{fnv1a(self.title + chr(0x1F) + self.content)}"


@dataclass(frozen=True)
class Delta:
    """A ``session_prompt_deltas`` row."""

    seq: int
    selector: dict[str, Any]
    content: dict[str, Any]


# -- one stored request ------------------------------------------------------------------------------------

_STATE_CODES = {"read": "r", "write": "w", "uncached": "u"}
_CODE_STATES = {v: k for k, v in _STATE_CODES.items()}


def encode_segment_map(states: tuple[str, ...]) -> str | None:
    """Run-length encode per-segment cache states: ("read",)*3 + ("write",) -> "r3w1".

    Each run's end is found with C-speed ``tuple.index`` scans, so the usual three runs (read, write,
    uncached) cost no per-segment Python work."""
    if not states:
        return None
    out, i, n = [], 0, len(states)
    while i < n:
        st = states[i]
        end = n
        for other in _STATE_CODES:
            if other != st:
                try:
                    end = min(end, states.index(other, i, end))
                except ValueError:
                    pass
        out.append(f"{_STATE_CODES[st]}{end - i}")
        i = end
    return "".join(out)


def decode_segment_map(text: str | None) -> tuple[str, ...]:
    """The per-segment cache states of a ``segment_map`` value (() when none was stored)."""
    if not text:
        return ()
    out: list[str] = []
    for code, n in re.findall(r"([rwu])(\d+)", text):
        out.extend([_CODE_STATES[code]] * int(n))
    return tuple(out)


#: Event code of a request whose conversation history its log lacks (a compaction call re-sends its parent's
#: conversation; only the parent's log holds it): its simulated replay rests on a rebuilt history, or none, so no
#: saving may be claimed on it (:func:`~promptcache_nb.analysis.resimulate.history_missing`).
HISTORY_MISSING = "history_missing"
#: Event code stored beside :data:`HISTORY_MISSING` when the import rebuilt that history from the parent session's
#: log (its last request before the call, and that request's reply): the body stored is the rebuilt one.
HISTORY_FROM_PARENT = "history_from_parent"


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """One stored request: a ``turns`` row, field for field (docs/schema.md).

    The request pipeline (:mod:`promptcache_nb.pipeline`) makes one per request; the store writes it
    (``Store.write_request``) and reads it back (``Store.read_request``). JSON columns hold canonical JSON
    text, as stored; ``usage``, ``event_codes`` and ``segment_states`` decode them.
    """

    session_id: str
    idx: int  #: 0-based request index in the session
    sent_at: datetime  #: when it was sent (UTC)
    model: str
    tail_node: str | None  #: the last prefix node of its segment chain (None: no segment)
    #: the block holding the body's shape and top-level fields (None: a usage-first import's request, whose
    #: body is not analysed yet; so for every body-derived column)
    rest_hash: str | None
    n_segments: int | None
    total_tokens: int | None  #: estimated prompt tokens (the session's tokenizer)
    body_bytes: int | None  #: bytes of the segments' canonical JSON
    input_tokens: int | None
    cache_read_input_tokens: int | None
    cache_creation_input_tokens: int | None
    cache_creation_5m_input_tokens: int | None
    cache_creation_1h_input_tokens: int | None
    output_tokens: int | None
    usage_source: UsageSource  #: simulated, live or imported
    usage_raw: str | None  #: the provider's usage payload (JSON)
    ideal_cache_read: int | None
    cost_usd: float | None
    cost_no_cache_usd: float | None
    cache_reason: str | None
    cache_detail: str | None  #: JSON
    events: str  #: JSON list of event codes
    request_id: str | None
    user_text: str | None  #: a label (the full text is in the body)
    reply: str | None  #: the reply as block references (JSON)
    diverge_path: str | None
    diverge_byte: int | None
    diverge_token: int | None
    shared_prefix_tokens: int | None
    pure_append: bool | None
    broke: bool | None
    previous_cache_read: int | None
    changes: str | None  #: JSON list of {code, detail}
    explanation: str | None
    segment_map: str | None  #: run-length per-segment cache states (:func:`encode_segment_map`)
    transport: str | None
    source_ref: str | None  #: file:line of an imported request
    dedupe_key: str | None  #: an import's key (re-importing skips it)
    n_messages: int | None  #: length of the history a strategy built it from
    #: what the API would refuse in the body, stored as the log held it (a lenient import): a JSON list of
    #: ``{path, problem}`` (:class:`~promptcache_nb.request.BodyProblem`); None when the body was clean or checked
    #: strictly
    body_problems: str | None = None
    #: what a figure assumed, one sentence per line (``Usage.notes``: a write without its 5m/1h split is priced
    #: at the 5-minute rate); None when nothing was assumed
    notes: str | None = None
    #: where ``cost_usd`` came from: a :class:`~promptcache_nb.Prices` source (``genai-prices anthropic/...``,
    #: ``user``) or ``reported by provider`` (the response's own ``usage.cost``); None when unpriced
    cost_source: str | None = None
    #: milliseconds from sending the request to its response's last byte, when a live call was timed (the
    #: capture, the recording proxy's log); None otherwise
    latency_ms: float | None = None
    #: the part of ``output_tokens`` spent reasoning (``Usage.reasoning_tokens``: Gemini's thoughts, OpenAI's
    #: reasoning tokens), as reported; None when the provider did not report it
    reasoning_tokens: int | None = None
    #: where an imported request's bytes live: the byte offset and length of the log line that opened it (in the
    #: decompressed file) and a digest of those bytes; None when the reader does not say
    source_offset: int | None = None
    source_length: int | None = None
    source_digest: str | None = None
    #: OpenClaw's read-drop verdict, kept beside ``broke`` (the rebuild rule, the verdict) as a cross-check
    openclaw_broke: bool | None = None
    #: the provider's own diagnosis of this request's cache prefix (Anthropic's ``cache_miss_reason.type``:
    #: ``model_changed``, ``system_changed``, ``tools_changed``, ``messages_changed``,
    #: ``previous_message_not_found``, ``unavailable``; ``none`` when the request named a previous message and
    #: nothing diverged; ``pending`` when the diagnosis had not finished); None when nobody asked
    provider_cache_miss_reason: str | None = None
    #: the provider's estimate of the input tokens after the divergence (``cache_missed_input_tokens``)
    provider_cache_missed_tokens: int | None = None

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The ``turns`` columns, in field order."""
        return _RECORD_COLUMNS

    @property
    def usage(self) -> Usage:
        return Usage(self.input_tokens, self.cache_read_input_tokens, self.cache_creation_input_tokens,
                     self.cache_creation_5m_input_tokens, self.cache_creation_1h_input_tokens, self.output_tokens,
                     self.usage_source, json.loads(self.usage_raw) if self.usage_raw else None,
                     reasoning_tokens=self.reasoning_tokens, notes=tuple(self.notes.split("\n")) if self.notes else ())

    @property
    def event_codes(self) -> list[str]:
        return json.loads(self.events) if self.events else []

    @property
    def detail(self) -> dict[str, Any] | None:
        """The cache model's ``cache_detail`` (None when it did not decide this request)."""
        return json.loads(self.cache_detail) if self.cache_detail else None

    @property
    def segment_states(self) -> tuple[str, ...]:
        return decode_segment_map(self.segment_map)

    @property
    def problems(self) -> list[dict[str, str]]:
        """The stored ``body_problems`` (``[]`` when none): ``{"path": ..., "problem": ...}`` each."""
        return json.loads(self.body_problems) if self.body_problems else []


_RECORD_COLUMNS = tuple(f.name for f in fields(RequestRecord))


#: A prompt-delta change a strategy made: ("upsert", seq, selector, content) or ("delete", seq, None, None).
DeltaOp = tuple[str, int, "dict[str, Any] | None", "dict[str, Any] | None"]
#: A content block of a message, as the pipeline encodes it: (hash, kind, canonical JSON, the element).
MessageBlock = tuple[str, str, str, Any]
