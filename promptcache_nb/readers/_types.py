"""What an importer yields: typed records of requests read from an agent's log, with measured usage.

Readers are pure: they parse files and yield :class:`ImportedRequest` / :class:`SkippedLine` values; they never
touch the store. ``Lab.import_log`` groups requests into sessions and writes them (see ``_ingest.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from orjson import dumps as _orjson_dumps

from ..dialects import DialectName as Dialect  # one vocabulary: the wire formats' names
from ..dialects.anthropic import ProviderDiagnosis
from ..usage import Usage

SessionKind = Literal["main", "subagent", "compaction"]


@dataclass(frozen=True)
class ImportedRequest:
    """One API request read from a log, with the usage the endpoint reported (**measured**).

    Attributes:
        session_key: groups requests into one session (unique within the whole import, e.g. the Claude Code
            session uuid, the Codex rollout id, ``gen_ai.conversation.id``, or ``<file>`` for HTTP recordings).
        dedupe_key: stable id of this request for idempotent re-import (request id, or ``file:line``).
        at: when the request was sent (UTC, timezone-aware).
        body: the request body as logged, in its own ``dialect`` (Anthropic Messages, OpenAI Chat
            Completions or OpenAI Responses). For partial logs it holds only what the log has.
        usage: measured usage converted to :class:`~promptcache_nb.Usage` (``source="imported"``).
        model: the model id the request was sent to (from the body, else the response).
        source_ref: ``file:line`` (or ``file#entry`` for JSON documents) where the request was read.
        partial: True when the log lacks parts of the body (system prompt, tools): the unlogged prefix is
            then sized from measured usage at ingest.
        parent_key: session_key of the parent session (sub-agents, compaction calls).
        session_kind: ``main``, ``subagent`` or ``compaction``.
        events: event codes that happened before this request (``compaction``...).
        request_id: the provider's request id when logged.
        reply: the response content blocks when logged (not used for cache analysis).
        provider: ``anthropic``, ``openai``, ``deepseek``, ``gemini`` or ``bedrock`` (decides the default cache
            model; a Bedrock model id is ``bedrock`` whatever the provider says).
        account: the organisation / workspace the log says the provider served the request under (a response
            header such as ``anthropic-organization-id``), else None: the import decides (``account=``).
        agent_observation: the agent's own cache observation of this request when its log has one (OpenClaw's
            ``cache:result``), stored in ``cache_detail["agent_observation"]`` beside ours.
        prefix_identity: for a partial body, what the log says about the prefix it lacks (client, client version,
            model, working directory, session kind: what the client builds its system prompt and tools from).
            Sessions of one identity whose measured cache reads show they shared it share one unlogged prefix
            (``_prefixes.py``); None: each session's prefix is its own.
        history_missing: the log lacks this request's conversation history, not just its system prompt and
            tools (a compaction call re-sends its parent's conversation, which only the parent's log holds).
            Stored as the event :data:`promptcache_nb._types.HISTORY_MISSING`.
        source_span: (byte offset, length, digest) of the log line that opened the request, when the reader
            tracks them (``turns.source_offset`` / ``source_length`` / ``source_digest``).
        provider_diagnosis: the provider's own cache diagnosis of this request when the log holds the response's
            ``diagnostics`` (``turns.provider_cache_miss_reason`` / ``provider_cache_missed_tokens``).
        response_id: the response's own id (``msg_…``) when logged: what a next request names as its previous
            message for the provider's diagnosis.
    """

    session_key: str
    dedupe_key: str
    at: datetime
    body: dict[str, Any]
    usage: Usage
    model: str
    source_ref: str
    dialect: Dialect = "anthropic"
    partial: bool = False
    parent_key: str | None = None
    session_kind: SessionKind = "main"
    events: tuple[str, ...] = ()
    request_id: str | None = None
    reply: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    provider: str = "anthropic"
    agent_observation: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    #: how long the call took (milliseconds), when the log timed it (the recording proxy's ``latency_ms``)
    latency_ms: float | None = field(default=None, compare=False)
    account: str | None = None
    prefix_identity: dict[str, str] | None = field(default=None, compare=False)
    history_missing: bool = False
    #: where the request's bytes live in ``source_ref``'s file: (byte offset, length, digest) of the line that
    #: opened it, in the decompressed file; None when the reader does not say
    source_span: tuple[int, int, str] | None = field(default=None, compare=False)
    provider_diagnosis: ProviderDiagnosis | None = field(default=None, compare=False)
    response_id: str | None = field(default=None, compare=False)

    def unstorable_keys(self) -> str | None:
        """Why a key this record is grouped into a session by cannot be stored (a lone surrogate, e.g. a
        ``"\\ud800"`` JSON escape in a log's session id, is not UTF-8), naming the field; or None. Checked as the
        record is read: sessions are formed from these before anything is stored."""
        return _lone_surrogate((("session_key", self.session_key), ("parent_key", self.parent_key),
                                ("account", self.account)))

    def unstorable_text(self) -> str | None:
        """Why a string this record holds outside its body cannot be stored (DuckDB refuses a lone surrogate and
        would abort the whole import), naming the field; or None. The body is checked on its own
        (``check_request``)."""
        return self.unstorable_keys() or _lone_surrogate((
            ("model", self.model), ("request_id", self.request_id), ("dedupe_key", self.dedupe_key),
            ("events", self.events), ("usage", self.usage.raw), ("usage notes", self.usage.notes),
            ("reply", self.reply), ("agent_observation", self.agent_observation),
            ("prefix_identity", self.prefix_identity)))


def _lone_surrogate(fields: tuple[tuple[str, Any], ...]) -> str | None:
    """``name: holds a lone surrogate ...`` for the first of ``fields`` whose text (a JSON value's, for a
    structure) is not UTF-8; None when all are."""
    for name, value in fields:
        if value is None or value == ():
            continue
        if not isinstance(value, str):
            try:  # orjson encodes in C and refuses a lone surrogate: a clean structure is done here (nearly all)
                _orjson_dumps(value)
                continue
            except TypeError:  # a surrogate, or a value only json.dumps' default=str writes: decided below
                pass
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{name}: holds a lone surrogate {text[exc.start]!r} (not Unicode text)"
    return None


@dataclass(frozen=True)
class SkippedLine:
    """A line (or entry) an importer did not turn into a request, and why (shown in ``ImportResult.skipped``)."""

    file: str
    line: int
    reason: str

    def __post_init__(self) -> None:
        # a reason quotes the log (a path, a name): a lone surrogate there is shown escaped ("\\ud800"), as
        # text the skipped-lines table (pandas' Arrow strings) and the store can hold
        object.__setattr__(self, "reason", self.reason.encode("utf-8", "backslashreplace").decode("utf-8"))


@dataclass(frozen=True)
class ReadProgress:
    """Emitted by readers after the last complete line they consumed, so a growing file re-imports from here.

    ``complete_through`` is the number of complete lines (JSON Lines formats) read; a truncated last line is
    *not* counted: it is left for the next import.
    """

    file: str
    complete_through: int


Record = ImportedRequest | SkippedLine | ReadProgress


class Reader(Protocol):
    """An importer for one log format: says whether it handles a file (by content), then reads it."""

    name: str

    def sniff(self, path: Path, head: str) -> bool:
        """True when ``head`` (the first ~64 KiB of the file, decoded UTF-8 with errors replaced) is this format."""
        ...

    def read(self, path: Path) -> Iterator[Record]:
        """Yield every request (and skipped line) of ``path`` in file order."""
        ...
