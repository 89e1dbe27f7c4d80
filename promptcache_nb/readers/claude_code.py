"""Reader for Claude Code transcripts: ``~/.claude/projects/<project>/<session>.jsonl`` (format ``claude-code``).

A transcript is JSON Lines, one entry per line (``user``, ``assistant``, ``system``, ``summary``,
``file-history-snapshot``, ``queue-operation``, ``progress``...). What it takes to
turn one into API requests:

* **One request per response.** A streamed response is written one line per content block (thinking, text,
  each ``tool_use``), every line repeating the response's ``message.id``, ``requestId`` and ``usage``. One
  unique ``(message.id, requestId)`` is one request; its blocks merge into one assistant message.
* **Usage** is the Messages API ``usage`` object (with the 5m/1h ``cache_creation`` split). ``output_tokens`` on
  the early lines of a stream is a placeholder, so the largest figure over the response's lines is kept.
* **Bodies are rebuilt** from the conversation before each response: user lines (text, and ``tool_result``
  blocks) and earlier responses, consecutive same-role lines merged into one message as the API requires. Tool
  results written while a response was still streaming stay after that response, in file order. The system
  prompt and tool definitions are not logged, so every body is ``partial``. What the client builds them from
  and the log does say — the client ``version``, the model, the working directory (``cwd``) and whether the chain
  is a main conversation or a sub-agent — is each request's ``prefix_identity`` (``_prefixes.py`` decides from
  the measured cache reads which sessions shared it).
* **Compaction.** A ``system`` line with ``subtype: "compact_boundary"`` restarts the history; the next user
  line (``isCompactSummary``) holds the summary, and the next request carries the ``compaction`` event. The
  compaction call itself (an ``acompact-`` agent) re-sends the parent's whole conversation, which its own log
  does not hold: its requests are ``history_missing`` (the import rebuilds that history from the parent's log).
* **Sessions come from the lines' own ids, never the file's name** (files get copied, renamed, or share a name
  like ``turn-2.jsonl``). A line without ``isSidechain`` belongs to its ``sessionId``'s main session; one with
  an ``agentId`` to the sub-agent session ``<sessionId>/agent-<agentId>`` (``parent_key`` = ``sessionId``;
  ``session_kind="compaction"`` for the ``acompact-`` agents of automatic compaction). That covers every layout:
  2.1.x ``<session>/subagents/agent-<id>.jsonl``, 2.0.x ``agent-<id>.jsonl`` beside the session file, and one
  file holding several sessions. Claude Code 1.0.x wrote sub-agents *inline* in the main file
  (``isSidechain: true``, no ``agentId``) with parallel agents interleaved: each chain is found by walking
  ``parentUuid`` to its root (the agent's prompt, ``parentUuid: null``) and becomes the sub-agent session
  ``<sessionId>/sidechain-<root uuid>``. Bodies are rebuilt per chain, so no chain's turns enter another's
  body. A main line hanging from another session's chain (a resumed session) continues that conversation. A
  line with no ``sessionId`` takes the last one seen (else the file's path).
* ``progress`` lines, including ``agent_progress`` copies of a sub-agent's messages, are never requests. A line
  that is not a Claude Code entry at all (a proxy record, some other JSON) is skipped with a reason; entry kinds
  the client writes without a request (``summary``, ``file-history-snapshot``, newer ones carrying the
  transcript's ids) are passed over silently.
* **Bad values cost one request:** usage that ``dialects.usage_from_anthropic`` refuses (not a non-negative int, above
  ``usage.MAX_TOKENS``, a 5m/1h split larger than its write) skips that response (``usage.<field>: <problem>``);
  the response stays in the history.
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

from ..dialects import usage_from_anthropic
from ..errors import PromptCacheError
from ._jsonl import JsonLine, iter_json_lines, json_objects_in_head, parse_timestamp
from ._messages import append_message, content_blocks
from ._stream import ParsedLines
from ._types import ImportedRequest, Record, SessionKind, SkippedLine

__all__ = ["ClaudeCodeReader"]

# A model id as providers spell them: lowercase letters, digits and . - _ : / @ (Bedrock and Vertex ids
# included). "<synthetic>" and other placeholders fail it.
_MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._:/@-]*$", re.IGNORECASE)
_MODEL_IDS: set[str] = set()  # the model strings _MODEL_ID accepted (a few per history)
_ENTRY_TYPES = frozenset({"user", "assistant", "system", "progress", "queue-operation"})
# Entry kinds the client writes; a line of any other kind that carries no transcript id is not an entry at all.
_KNOWN_TYPES = _ENTRY_TYPES | {"summary", "file-history-snapshot", "custom-title", "attachment", "tag"}
# Kinds that take part in a conversation (and so belong to a chain) even without a uuid.
_CHAINED = frozenset({"user", "assistant", "system"})
#: Above this a token count is not one request's (the largest context windows hold a few million tokens).


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
    span: tuple[int, int, str] | None = None  # where the line that opened it lives
    emitted: bool = False
    identity: dict[str, str] = field(default_factory=dict)  # what the unlogged prefix is built from


@dataclass
class _Chain:
    """One conversation in a transcript (a session's main chain, or one sub-agent's): bodies rebuild per chain."""

    key: str
    kind: SessionKind
    parent: str | None
    history: list[dict[str, Any]] = field(default_factory=list)
    responses: dict[tuple[str, str], _Response] = field(default_factory=dict)
    open: _Response | None = None  # the response still streaming (its usage may grow)
    pending_events: list[str] = field(default_factory=list)
    # per history index: (the message, its length then, the copy the last body sent); see ``_sent_messages``
    sent: list[tuple[dict[str, Any], int, dict[str, Any]]] = field(default_factory=list)


class ClaudeCodeReader:
    """Reads Claude Code transcripts (``claude-code``); see the module docstring for the rules."""

    name = "claude-code"
    usage_only = True  #: ``read(path, bodies=False)`` skips rebuilding the conversation (a usage-first import)

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

    def read(self, path: Path, *, bodies: bool = True) -> Iterator[Record]:
        """The requests of one transcript. ``bodies=False`` (a usage-first import): the conversation is not
        rebuilt, so every request's ``body`` is empty and its ``reply`` None; ids, times, usage, events, the
        session structure and each request's line span are the same."""
        lines = ParsedLines(iter_json_lines(path))
        return lines.around(self._read(path, lines, bodies))

    def _read(self, path: Path, lines: ParsedLines, bodies: bool) -> Iterator[ImportedRequest | SkippedLine]:
        file = str(path)
        chains: dict[str, _Chain] = {}
        owner: dict[str, _Chain] = {}  # entry uuid -> its chain (also how an entry written twice is recognised)
        session: str | None = None  # the last sessionId seen, for a line that lacks its own

        def close(chain: _Chain) -> Iterator[ImportedRequest | SkippedLine]:
            resp = chain.open
            if resp is not None:
                chain.open = None
                resp.emitted = True
                yield self._request(resp, file, chain)

        for rec in lines:
            obj = rec.obj
            problem = None if obj.get("type") in _KNOWN_TYPES else _not_an_entry(obj)
            if problem:
                yield SkippedLine(file, rec.line, problem)
                continue
            uuid = obj.get("uuid")
            if isinstance(uuid, str) and uuid in owner:
                continue  # the same entry written twice (resumed sessions copy lines)
            entry = obj.get("type")
            if entry not in _CHAINED and not isinstance(uuid, str):
                continue  # bookkeeping outside any conversation (snapshots, queue operations, titles, summaries)
            if isinstance(obj.get("sessionId"), str):
                session = obj["sessionId"]
            chain = _chain_of(obj, session or file, chains, owner)
            if isinstance(uuid, str):
                owner[uuid] = chain
            if entry == "assistant":
                problem = _assistant_problem(obj)
                if problem:
                    yield SkippedLine(file, rec.line, problem)
                    continue
                message = obj["message"]
                key = (message["id"], str(obj.get("requestId") or ""))
                resp = chain.responses.get(key)
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
                    yield from close(chain)
                    resp = self._open(rec, message, key, at, chain, tuple(chain.pending_events), bodies)
                    chain.pending_events.clear()
                    chain.responses[key] = resp
                    chain.open = resp
                elif not resp.emitted:
                    usage = message["usage"]
                    if _output_of(usage) > _output_of(resp.usage):
                        resp.usage = usage
                if not bodies:
                    continue
                blocks = content_blocks(message.get("content"))
                # a block of an already emitted response (out of order) still belongs in the history
                resp.target["content"].extend(blocks)
                if not resp.emitted:
                    resp.reply.extend(blocks)
            elif entry == "user" and not bodies:
                continue
            elif entry == "user":
                message = obj.get("message")
                if not isinstance(message, dict):
                    yield SkippedLine(file, rec.line, "user line without a message object")
                    continue
                append_message(chain.history, "user", content_blocks(message.get("content")))
            elif entry == "system" and obj.get("subtype") == "compact_boundary":
                yield from close(chain)
                chain.history = []
                chain.pending_events.append("compaction")
            # other entry types (progress, including ``agent_progress`` copies of a sub-agent's messages, and
            # new ones) hold no API traffic of their own
        for chain in chains.values():  # the file's end: a response still open has all its lines
            yield from close(chain)

    def _open(self, rec: JsonLine, message: dict[str, Any], key: tuple[str, str], at: datetime,
              chain: _Chain, events: tuple[str, ...], bodies: bool = True) -> _Response:
        """Start a response: snapshot the body sent for it, then give it its place in the history."""
        history = chain.history
        body = {"model": message["model"], "messages": _sent_messages(chain) if bodies else []}
        if not bodies:
            target: dict[str, Any] = {"role": "assistant", "content": []}  # no history is kept
        elif history and history[-1]["role"] == "assistant":
            target = history[-1]  # two responses in a row (e.g. after an interrupted one) form one message
        else:
            target = {"role": "assistant", "content": []}
            history.append(target)
        obj = rec.obj
        identity = {"client": self.name, "model": message["model"], "kind": chain.kind}
        for name in ("version", "cwd"):  # the client's version and working directory, when the line has them
            if isinstance(obj.get(name), str):
                identity[name] = obj[name]
        return _Response(line=rec.line, at=at, model=message["model"], message_id=key[0],
                         request_id=key[1] or None, body=body, events=events, target=target,
                         usage=message["usage"], identity=identity, span=rec.span())

    def _request(self, resp: _Response, file: str, chain: _Chain) -> ImportedRequest | SkippedLine:
        """The finished response as a request, or the line that opened it when its usage cannot be stored."""
        try:
            usage = usage_from_anthropic(resp.usage, source="imported")
        except (ValueError, PromptCacheError) as exc:
            return SkippedLine(file, resp.line, str(exc))
        return ImportedRequest(
            session_key=chain.key,
            dedupe_key=f"{resp.message_id}/{resp.request_id or ''}",
            at=resp.at,
            body=resp.body,
            usage=usage,
            model=resp.model,
            source_ref=f"{file}:{resp.line}",
            dialect="anthropic",
            partial=True,
            parent_key=chain.parent,
            session_kind=chain.kind,
            events=resp.events,
            request_id=resp.request_id,
            reply=resp.reply,
            provider="anthropic",
            prefix_identity=resp.identity,
            history_missing=chain.kind == "compaction",
            source_span=resp.span,
        )


def _sent_messages(chain: _Chain) -> list[dict[str, Any]]:
    """Copies of the history's messages as sent now; a message unchanged since the last body is that body's copy.

    History messages only grow (blocks are appended), so a copy stays true while its message's length does. Equal
    leading messages that are the very same objects are the shared prefix the checker and the segmenter
    recognise by identity, instead of marshalling the whole history again for every request (issue 23).
    """
    sent = chain.sent
    out = []
    for i, m in enumerate(chain.history):
        n = len(m["content"])
        if i < len(sent) and sent[i][0] is m and sent[i][1] == n:
            out.append(sent[i][2])
            continue
        copy = {"role": m["role"], "content": list(m["content"])}
        if i < len(sent):
            sent[i] = (m, n, copy)
        else:
            sent.append((m, n, copy))
        out.append(copy)
    return out


def _chain_of(obj: dict[str, Any], session: str, chains: dict[str, _Chain], owner: dict[str, _Chain]) -> _Chain:
    """The conversation an entry belongs to, from the entry's own ids (see "Sessions" in the module docstring)."""
    agent = obj.get("agentId")
    if not agent and obj.get("isSidechain") is not True:
        found = chains.get(session)  # a main line of a conversation already open: most lines
        if found is not None:
            return found
    parent_uuid = obj.get("parentUuid")
    parent_chain = owner.get(parent_uuid) if isinstance(parent_uuid, str) else None
    kind: SessionKind
    if isinstance(agent, str) and agent:
        kind = "compaction" if agent.startswith("acompact") else "subagent"
        key, parent = f"{session}/agent-{agent}", session
    elif obj.get("isSidechain") is True:
        if parent_chain is not None and parent_chain.kind != "main":
            return parent_chain  # a step of an inline sidechain: the chain its parent is in
        # the root of an inline sidechain (1.0.x): parallel sub-agents interleave, so each root starts a chain
        root = obj.get("uuid") if isinstance(obj.get("uuid"), str) else f"{len(chains)}"
        key, kind, parent = f"{session}/sidechain-{root}", "subagent", session
    else:
        key, kind, parent = session, "main", None
    chain = chains.get(key)
    if chain is None:
        chain = chains[key] = _Chain(key, kind, parent)
        if kind == "main" and parent_chain is not None and parent_chain.kind == "main":
            # a resumed session continues the conversation its first line hangs from
            chain.history = [{"role": m["role"], "content": list(m["content"])} for m in parent_chain.history]
    return chain


def _not_an_entry(obj: dict[str, Any]) -> str | None:
    """Why a JSON object on a transcript line is not a Claude Code entry at all, or None when it is one."""
    kind = obj.get("type")
    if isinstance(kind, str) and (kind in _KNOWN_TYPES or any(k in obj for k in ("sessionId", "uuid", "leafUuid"))):
        return None  # a known entry, or a newer kind that carries the transcript's ids
    if "request" in obj and "response" in obj:
        return ("a recording-proxy record (request/response), not a Claude Code transcript entry: "
                "import the proxy log as its own file")
    keys = ", ".join(sorted(str(k)[:40] for k in obj)[:6])
    what = f"type {kind!r:.40}" if kind is not None else "no type"
    return f"not a Claude Code transcript entry ({what}; keys: {keys})"


def _output_of(usage: dict[str, Any]) -> int:
    """``output_tokens`` of a streamed line when it is a count, else -1 (a bad value never wins the comparison)."""
    value = usage.get("output_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _assistant_problem(obj: dict[str, Any]) -> str | None:
    """Why an assistant line is not part of an API response, or None when it is."""
    message = obj.get("message")
    if not isinstance(message, dict):
        return "assistant line without a message object"
    model = message.get("model")
    if model == "<synthetic>":
        return "synthetic message (model '<synthetic>'): made up by the client, not an API response"
    if not isinstance(model, str):
        return f"model {model!r} is not a model id: not an API response"
    if model not in _MODEL_IDS:  # (a set lookup: every streamed line of a response names its model)
        if not _MODEL_ID.match(model):
            return f"model {model!r} is not a model id: not an API response"
        if len(_MODEL_IDS) >= 1024:
            _MODEL_IDS.clear()
        _MODEL_IDS.add(model)
    if not isinstance(message.get("id"), str) or not message["id"]:
        return "assistant line without message.id"
    if not isinstance(message.get("usage"), dict):
        return "assistant line without usage"
    return None



