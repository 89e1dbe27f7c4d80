"""Reader for Claude Code transcripts: ``~/.claude/projects/<project>/<session>.jsonl`` (format ``claude-code``).

A transcript is JSON Lines, one entry per line (``user``, ``assistant``, ``system``, ``summary``,
``file-history-snapshot``, ``queue-operation``, ``progress``...; unknown types are ignored). What it takes to
turn one into API requests:

* **One request per response.** A streamed response is written one line per content block (thinking, text,
  each ``tool_use``), every line repeating the response's ``message.id``, ``requestId`` and ``usage``. One
  unique ``(message.id, requestId)`` is one request; its blocks merge into one assistant message.
* **Usage** is the Messages API ``usage`` object (with the 5m/1h ``cache_creation`` split). ``output_tokens`` on
  the early lines of a stream is a placeholder, so the largest figure over the response's lines is kept.
* **Bodies are rebuilt** from the conversation before each response: user lines (text, and ``tool_result``
  blocks) and earlier responses, consecutive same-role lines merged into one message as the API requires. Tool
  results written while a response was still streaming stay after that response, in file order. The system
  prompt and tool definitions are not logged, so every body is ``partial``.
* **Compaction.** A ``system`` line with ``subtype: "compact_boundary"`` restarts the history; the next user
  line (``isCompactSummary``) holds the summary, and the next request carries the ``compaction`` event.
* **Sessions.** The file ``<session>.jsonl`` is one session keyed by its name. Sub-agents write
  ``<session>/subagents/agent-<id>.jsonl`` (their own session, ``parent_key`` = the parent session id) and
  automatic compaction calls ``agent-acompact-<id>.jsonl`` (``session_kind="compaction"``).
* Entries whose model is ``<synthetic>`` (messages the client made up: errors, interruptions) or not a model id
  at all are skipped with a reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..usage import Usage
from ._jsonl import JsonLine, iter_json_lines, json_objects_in_head, parse_timestamp
from ._messages import append_message
from ._types import ImportedRequest, ReadProgress, Record, SessionKind, SkippedLine

__all__ = ["ClaudeCodeReader"]

# A model id as providers spell them: lowercase letters, digits and . - _ : / @ (Bedrock and Vertex ids
# included). "<synthetic>" and other placeholders fail it.
_MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._:/@-]*$", re.IGNORECASE)
_ENTRY_TYPES = frozenset({"user", "assistant", "system", "progress", "queue-operation"})


@dataclass
class _Response:
    """One API response being assembled from its streamed lines."""

    line: int
    at: datetime
    model: str
    message_id: str
    request_id: str | None
    body: dict[str, Any]
    events: tuple[str, ...]
    target: dict[str, Any]  # the history message its blocks go into
    usage: dict[str, Any]
    reply: list[dict[str, Any]] = field(default_factory=list)
    emitted: bool = False


class ClaudeCodeReader:
    """Reads Claude Code transcripts (``claude-code``); see the module docstring for the rules."""

    name = "claude-code"

    def sniff(self, path: Path, head: str) -> bool:
        objs = json_objects_in_head(head)
        for obj in objs:
            if "payload" in obj:  # Codex rollouts: {timestamp, type, payload}
                return False
            kind = obj.get("type")
            if kind in _ENTRY_TYPES and "sessionId" in obj:
                return True
            if kind == "summary" and "leafUuid" in obj:
                return True
            if kind == "file-history-snapshot" and "snapshot" in obj:
                return True
        if not objs:  # a first line longer than the head (a big file-history snapshot)
            start = head.lstrip()[:40]
            return start.startswith(('{"type":"file-history-snapshot"', '{"parentUuid":'))
        return False

    def read(self, path: Path) -> Iterator[Record]:
        file = str(path)
        kind, parent = _role_of(path)
        if kind == "main":
            session_key: str | None = path.stem
        else:
            session_key = f"{parent}/{path.stem}" if parent else None  # else from the lines' sessionId
        history: list[dict[str, Any]] = []
        responses: dict[tuple[str, str], _Response] = {}
        open_key: tuple[str, str] | None = None
        pending_events: list[str] = []
        seen_uuids: set[str] = set()

        def close() -> Iterator[ImportedRequest]:
            nonlocal open_key
            if open_key is not None:
                resp = responses[open_key]
                open_key = None
                resp.emitted = True
                yield self._request(resp, file, session_key or path.stem, kind, parent)

        for rec in iter_json_lines(path):
            if isinstance(rec, ReadProgress):
                yield from close()
                yield rec
                continue
            if isinstance(rec, SkippedLine):
                yield rec
                continue
            obj = rec.obj
            uuid = obj.get("uuid")
            if isinstance(uuid, str):
                if uuid in seen_uuids:
                    continue  # the same entry written twice (resumed sessions copy lines)
                seen_uuids.add(uuid)
            if session_key is None and isinstance(obj.get("sessionId"), str):
                parent = obj["sessionId"]
                session_key = f"{parent}/{path.stem}"
            entry = obj.get("type")
            if entry == "assistant":
                problem = _assistant_problem(obj)
                if problem:
                    yield SkippedLine(file, rec.line, problem)
                    continue
                message = obj["message"]
                key = (message["id"], str(obj.get("requestId") or ""))
                blocks = _blocks(message.get("content"))
                resp = responses.get(key)
                if resp is None:
                    try:
                        # ``at`` is the timestamp of the response's first line. It lags the send by the time
                        # to the first complete block (seconds; more with long thinking), but it is the one
                        # instant every request has that belongs to it alone: the line before it is not always
                        # what triggered the call (a result written mid-stream, a queued message).
                        at = parse_timestamp(obj.get("timestamp"))
                    except ValueError as exc:
                        yield SkippedLine(file, rec.line, f"assistant line: {exc}")
                        continue
                    yield from close()
                    resp = self._open(rec, message, key, at, history, tuple(pending_events))
                    pending_events.clear()
                    responses[key] = resp
                    open_key = key
                elif not resp.emitted:
                    usage = message["usage"]
                    if (usage.get("output_tokens") or 0) > (resp.usage.get("output_tokens") or 0):
                        resp.usage = usage
                # a block of an already emitted response (out of order) still belongs in the history
                resp.target["content"].extend(blocks)
                if not resp.emitted:
                    resp.reply.extend(blocks)
            elif entry == "user":
                message = obj.get("message")
                if not isinstance(message, dict):
                    yield SkippedLine(file, rec.line, "user line without a message object")
                    continue
                append_message(history, "user", _blocks(message.get("content")))
            elif entry == "system" and obj.get("subtype") == "compact_boundary":
                yield from close()
                history = []
                pending_events.append("compaction")
            # other entry types (summary, progress, file-history-snapshot, queue-operation, new ones) hold no
            # API traffic

    def _open(self, rec: JsonLine, message: dict[str, Any], key: tuple[str, str], at: datetime,
              history: list[dict[str, Any]], events: tuple[str, ...]) -> _Response:
        """Start a response: snapshot the body sent for it, then give it its place in the history."""
        body = {"model": message["model"],
                "messages": [{"role": m["role"], "content": list(m["content"])} for m in history]}
        if history and history[-1]["role"] == "assistant":
            target = history[-1]  # two responses in a row (e.g. after an interrupted one) form one message
        else:
            target = {"role": "assistant", "content": []}
            history.append(target)
        return _Response(line=rec.line, at=at, model=message["model"], message_id=key[0],
                         request_id=key[1] or None, body=body, events=events, target=target,
                         usage=message["usage"])

    def _request(self, resp: _Response, file: str, session_key: str, kind: SessionKind,
                 parent: str | None) -> ImportedRequest:
        return ImportedRequest(
            session_key=session_key,
            dedupe_key=f"{resp.message_id}/{resp.request_id or ''}",
            at=resp.at,
            body=resp.body,
            usage=Usage.from_anthropic(resp.usage, source="imported"),
            model=resp.model,
            source_ref=f"{file}:{resp.line}",
            dialect="anthropic",
            partial=True,
            parent_key=parent if kind != "main" else None,
            session_kind=kind,
            events=resp.events,
            request_id=resp.request_id,
            reply=resp.reply,
            provider="anthropic",
        )


def _role_of(path: Path) -> tuple[SessionKind, str | None]:
    """(session kind, parent session id when the directory layout tells it) from the file's name and place."""
    stem = path.stem
    if stem.startswith("agent-acompact-"):
        kind: SessionKind = "compaction"
    elif stem.startswith("agent-"):
        kind = "subagent"
    else:
        return "main", None
    # <session>/subagents/agent-<id>.jsonl; older clients wrote agent-<id>.jsonl beside the session file, and
    # then the lines' sessionId names the parent
    parent = path.parent.parent.name if path.parent.name == "subagents" else None
    return kind, parent or None


def _assistant_problem(obj: dict[str, Any]) -> str | None:
    """Why an assistant line is not part of an API response, or None when it is."""
    message = obj.get("message")
    if not isinstance(message, dict):
        return "assistant line without a message object"
    model = message.get("model")
    if model == "<synthetic>":
        return "synthetic message (model '<synthetic>'): made up by the client, not an API response"
    if not isinstance(model, str) or not _MODEL_ID.match(model):
        return f"model {model!r} is not a model id: not an API response"
    if not isinstance(message.get("id"), str) or not message["id"]:
        return "assistant line without message.id"
    if not isinstance(message.get("usage"), dict):
        return "assistant line without usage"
    return None


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Message content as a list of content blocks (a plain string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]
    return []

