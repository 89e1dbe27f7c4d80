"""Reader for OpenCode sessions: ``~/.local/share/opencode/opencode.db`` and the earlier ``storage/`` JSON tree
(format ``opencode``; ``../shared/reference/agent_log_formats.md`` §6, from ``session/message-v2.ts`` and
``session/processor.ts``).

Three containers, one model (a session: its messages in id order, each with its parts in id order):

* **The SQLite database** (2026 on): tables ``session`` (``id``, ``parent_id``...), ``message`` and ``part``
  (``id``, ``message_id``, ``session_id``, ``time_created``, ``time_updated``, ``data`` JSON). It is opened
  read-only (``mode=ro``): the user's database is never written.
* **The JSON tree** (2025 to early 2026): ``storage/session/<project>/<ses>.json`` (read as the session),
  ``storage/message/<ses>/<msg>.json`` and ``storage/part/<msg>/<prt>.json``. A session file pulls in its
  messages and parts; message and part files are read through their session (a walk of the tree imports each
  session once) and say so when their session file is missing.
* **``opencode export <session>``** output: ``{info, messages: [{info, parts}]}``.

What becomes a request:

* **One request per ``step-finish`` part** (one API call is one step). ``message.tokens`` is overwritten by the
  last step and is never read.
* **Usage**: ``tokens.input`` is already the uncached remainder (``input − cache.read − cache.write`` under AI
  SDK v6; Anthropic's uncached figure under v5), ``tokens.cache.read`` / ``.write`` as logged (a write has no
  5m/1h split: priced at the 5-minute rate, with a note). Reasoning: when ``tokens.total`` shows it is counted
  apart from ``output`` (newer builds), output = ``output + reasoning``; otherwise ``output`` already holds it.
* **Time**: the step's ``step-start`` part (``time_created`` in SQLite, ≈ the request start); in the JSON tree,
  parts carry no time, so it is decoded from the ascending ``prt_`` id (milliseconds × 4096 + a counter, modulo
  2^48) next to the message's ``time.created``.
* **Bodies are Anthropic-shaped and ``partial``** (OpenCode never stores the system prompt or tools): the session's
  earlier messages (user text and files; each assistant step as one assistant message with its text and
  ``tool_use`` blocks, followed by a user message of its ``tool_result`` blocks), then this message's earlier
  steps. Reasoning parts are not sent back. After a compaction (a user message with a ``compaction`` part, then
  a ``summary: true`` assistant message, which is itself a request), the history restarts from that user
  message, and the next request carries ``compaction``.
* **Sessions**: the session id (``ses_…``); a child session (the task tool's sub-agents, ``parent_id``) is a
  ``subagent`` session of its parent. Dedupe key: ``<session id>/<step-finish part id>``.
* **Provider** from ``providerID`` (``anthropic``, ``openai``, ``google`` → ``gemini``, ``amazon-bedrock`` →
  ``bedrock``...), else from the model id; it picks the cache model.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import PromptCacheError
from ._counts import as_object, count_problem, imported_usage
from ._jsonl import json_objects_in_head, read_log_bytes
from ._messages import append_message
from ._types import ImportedRequest, Record, SessionKind, SkippedLine

__all__ = ["OpenCodeReader", "provider_of"]

_SQLITE_MAGIC = "SQLite format 3"
_PROVIDERS = {"anthropic": "anthropic", "openai": "openai", "google": "gemini", "google-vertex": "gemini",
              "deepseek": "deepseek", "amazon-bedrock": "bedrock", "bedrock": "bedrock"}


@dataclass
class _Message:
    id: str
    info: dict[str, Any]
    created_ms: int | None
    parts: list[tuple[str, int | None, dict[str, Any]]] = field(default_factory=list)  # (id, time ms, data)


@dataclass
class _Session:
    id: str
    parent: str | None
    ref: str  # where it was read: file (JSON) or file#session (SQLite)
    messages: list[_Message] = field(default_factory=list)


class OpenCodeReader:
    """Reads OpenCode's database, its JSON storage tree and ``opencode export`` output (``opencode``)."""

    name = "opencode"

    def sniff(self, path: Path, head: str) -> bool:
        if head.startswith(_SQLITE_MAGIC):
            return _has_tables(path)
        objs = json_objects_in_head(head, limit=1)
        obj: Any = objs[0] if objs else None
        if obj is None and len(head) < 64 * 1024:  # a whole pretty-printed file (the JSON tree's files)
            try:
                obj = json.loads(head)
            except (ValueError, RecursionError):
                obj = None
        if not isinstance(obj, dict):
            return '"info"' in head[:2048] and '"ses_' in head[:4096] and '"messages"' in head
        if isinstance(obj.get("info"), dict) and isinstance(obj.get("messages"), list):
            return str(obj["info"].get("id", "")).startswith("ses_")
        oid = str(obj.get("id", ""))
        return (oid.startswith("ses_") and "time" in obj) or (oid.startswith("msg_") and "sessionID" in obj) or (
            oid.startswith("prt_") and "messageID" in obj)

    def read(self, path: Path) -> Iterator[Record]:
        file = str(path)
        if read_log_bytes(path, 16).startswith(_SQLITE_MAGIC.encode()):
            try:
                sessions = _from_db(path)
            except sqlite3.Error as exc:
                yield SkippedLine(file, 0, f"not a readable OpenCode database ({exc})")
                return
        else:
            try:
                doc = json.loads(read_log_bytes(path))
            except (ValueError, RecursionError) as exc:
                yield SkippedLine(file, 0, f"not valid JSON ({str(exc)[:120]})")
                return
            if not isinstance(doc, dict):
                yield SkippedLine(file, 0, "not an OpenCode record (not a JSON object)")
                return
            if isinstance(doc.get("info"), dict) and isinstance(doc.get("messages"), list):
                sessions = [_from_export(doc, file)]
            elif str(doc.get("id", "")).startswith("ses_"):
                sessions = [_from_tree(path, doc)]
            else:
                yield from _through_session(path, doc)
                return
        for s in sessions:
            yield from _requests(s)


def provider_of(provider_id: str | None, model: str) -> str:
    """The cache-model provider of an OpenCode/Cline ``providerID`` and model id."""
    if provider_id and provider_id.lower() in _PROVIDERS:
        return _PROVIDERS[provider_id.lower()]
    m = model.lower().rsplit("/", 1)[-1]
    if "claude" in m:
        return "anthropic"
    if m.startswith("gemini"):
        return "gemini"
    if m.startswith("deepseek"):
        return "deepseek"
    if m.startswith(("gpt", "o1", "o3", "o4", "codex")):
        return "openai"
    return "anthropic" if "anthropic" in model.lower() else "openai"


# --- the three containers -------------------------------------------------------------------------------------


def _connect(path: Path) -> sqlite3.Connection:
    # read-only: the user's database is never written (not even a journal)
    return sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)


def _has_tables(path: Path) -> bool:
    try:
        con = _connect(path)
        try:
            names = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return {"session", "message", "part"} <= names


def _loads(text: Any) -> dict[str, Any]:
    try:
        obj = json.loads(text) if isinstance(text, str | bytes) else None
    except (ValueError, RecursionError):
        obj = None
    return obj if isinstance(obj, dict) else {}


def _from_db(path: Path) -> list[_Session]:
    file = str(path)
    con = _connect(path)
    try:
        cols = {r[1] for r in con.execute("pragma table_info(session)")}
        parent_col = "parent_id" if "parent_id" in cols else "null"
        sessions = {sid: _Session(sid, parent, f"{file}#{sid}")
                    for sid, parent in con.execute(f"select id, {parent_col} from session order by id")}  # noqa: S608
        messages: dict[str, _Message] = {}
        for mid, sid, created, data in con.execute(
                "select id, session_id, time_created, data from message order by session_id, id"):
            s = sessions.setdefault(sid, _Session(sid, None, f"{file}#{sid}"))
            m = _Message(mid, _loads(data), created)
            s.messages.append(m)
            messages[mid] = m
        for pid, mid, created, data in con.execute(
                "select id, message_id, time_created, data from part order by message_id, id"):
            if mid in messages:
                messages[mid].parts.append((pid, created, _loads(data)))
    finally:
        con.close()
    return list(sessions.values())


def _from_export(doc: dict[str, Any], file: str) -> _Session:
    info = doc["info"]
    s = _Session(str(info.get("id")), info.get("parentID"), file)
    for entry in doc["messages"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("info"), dict):
            continue
        mi = entry["info"]
        m = _Message(str(mi.get("id")), mi, _created(mi))
        m.parts = [(str(p.get("id")), None, p) for p in entry.get("parts") or [] if isinstance(p, dict)]
        m.parts.sort(key=lambda p: p[0])
        s.messages.append(m)
    s.messages.sort(key=lambda m: m.id)
    return s


def _storage_root(path: Path, depth: int) -> Path:
    return path.parents[depth]


def _from_tree(path: Path, info: dict[str, Any]) -> _Session:
    """A JSON-era session file (``storage/session/<project>/<ses>.json``) with its messages and parts."""
    root = _storage_root(path, 2)
    s = _Session(str(info["id"]), info.get("parentID"), str(path))
    for mf in sorted((root / "message" / s.id).glob("*.json")):
        mi = _loads(mf.read_text(encoding="utf-8", errors="replace"))
        if not mi:
            continue
        m = _Message(str(mi.get("id", mf.stem)), mi, _created(mi))
        for pf in sorted((root / "part" / m.id).glob("*.json")):
            p = _loads(pf.read_text(encoding="utf-8", errors="replace"))
            if p:
                m.parts.append((str(p.get("id", pf.stem)), None, p))
        s.messages.append(m)
    s.messages.sort(key=lambda m: m.id)
    return s


def _through_session(path: Path, doc: dict[str, Any]) -> Iterator[SkippedLine]:
    """A message or part file: read with its session file; say so when that file is not there."""
    oid = str(doc.get("id", ""))
    sid = doc.get("sessionID")
    depth = 2
    root = _storage_root(path, depth) if len(path.parents) > depth else path.parent
    if isinstance(sid, str) and list((root / "session").glob(f"*/{sid}.json")):
        return  # its session file reads it
    what = "message" if oid.startswith("msg_") else "part"
    yield SkippedLine(str(path), 0, f"an OpenCode {what} file: its session {sid!r} is read from "
                                    f"{root / 'session' / '<project>' / f'{sid}.json'}, which is missing")


def _created(info: dict[str, Any]) -> int | None:
    t = info.get("time")
    c = t.get("created") if isinstance(t, dict) else None
    return c if isinstance(c, int) and not isinstance(c, bool) else None


def _id_ms(part_id: str, near_ms: int | None) -> int | None:
    """The creation time (ms) in an ascending OpenCode id, resolved next to ``near_ms`` (the id keeps the time
    modulo 2^36 ms, about 795 days)."""
    if near_ms is None:
        return None
    try:
        value = int(part_id.split("_", 1)[1][:12], 16)
    except (IndexError, ValueError):
        return None
    low, span = value >> 12, 1 << 36
    ms = near_ms - (near_ms % span) + low
    return min((ms - span, ms, ms + span), key=lambda x: abs(x - near_ms))


# --- requests -------------------------------------------------------------------------------------------------


def _requests(s: _Session) -> Iterator[ImportedRequest | SkippedLine]:
    kind: SessionKind = "subagent" if s.parent else "main"
    history: list[dict[str, Any]] = []
    events: list[str] = []
    cut: int | None = None  # where the compaction's user message sits in the history
    for m in s.messages:
        info = m.info
        if info.get("role") == "user":
            if any(p.get("type") == "compaction" for _, _, p in m.parts):
                # the summary call still sees the whole history; the requests after it start here
                cut = len(history) - 1 if history and history[-1]["role"] == "user" else len(history)
            _append(history, "user", _user_blocks(m))
            continue
        if info.get("role") != "assistant":
            continue
        model = str(info.get("modelID") or "")
        provider = provider_of(info.get("providerID") if isinstance(info.get("providerID"), str) else None, model)
        step_blocks: list[dict[str, Any]] = []
        step_results: list[dict[str, Any]] = []
        step_start: int | None = None
        own: list[dict[str, Any]] = []  # this message's earlier steps, as messages
        for pid, t, p in m.parts:
            kind_of = p.get("type")
            if kind_of == "step-start":
                step_start = t if t is not None else _id_ms(pid, m.created_ms)
                step_blocks, step_results = [], []
            elif kind_of == "text" and isinstance(p.get("text"), str) and not p.get("synthetic"):
                step_blocks.append({"type": "text", "text": p["text"]})
            elif kind_of == "tool":
                block, result = _tool_blocks(p)
                step_blocks.append(block)
                if result is not None:
                    step_results.append(result)
            elif kind_of == "step-finish":
                body_msgs = [_copy(x) for x in history] + [_copy(x) for x in own]
                at_ms = step_start if step_start is not None else (
                    t if t is not None else _id_ms(pid, m.created_ms) or m.created_ms)
                yield _request(s, kind, m, pid, p, model, provider, body_msgs, at_ms, tuple(events),
                               step_blocks)
                events.clear()
                _append(own, "assistant", step_blocks)
                _append(own, "user", step_results)
                step_start = None
                step_blocks, step_results = [], []
        for x in own:
            _append(history, x["role"], x["content"])
        if info.get("summary") is True and cut is not None:
            history[:] = history[cut:]
            cut = None
            events.append("compaction")


def _request(s: _Session, kind: SessionKind, m: _Message, pid: str, p: dict[str, Any], model: str, provider: str,
             body_msgs: list[dict[str, Any]], at_ms: int | None, events: tuple[str, ...],
             reply: list[dict[str, Any]]) -> ImportedRequest | SkippedLine:
    ref = f"{s.ref}/{m.id}/{pid}" if "#" in s.ref else f"{s.ref}#{m.id}/{pid}"
    file = s.ref.split("#", 1)[0]
    tokens = p.get("tokens")
    if not isinstance(tokens, dict):
        return SkippedLine(file, 0, f"{m.id}/{pid}: step-finish without tokens")
    cache = as_object(tokens.get("cache"))
    flat = {"input": tokens.get("input"), "output": tokens.get("output"), "reasoning": tokens.get("reasoning"),
            "total": tokens.get("total"), "cache.read": cache.get("read"), "cache.write": cache.get("write")}
    problem = count_problem(flat, tuple(flat), f"{m.id}/{pid}: tokens")
    if problem is None and not isinstance(flat["input"], int):
        problem = f"{m.id}/{pid}: tokens.input: missing"
    if problem is None and not model:
        problem = f"{m.id}/{pid}: the assistant message has no modelID"
    if problem is None and at_ms is None:
        problem = f"{m.id}/{pid}: no time for this step (no part time, message time.created missing)"
    if problem:
        return SkippedLine(file, 0, problem)
    uncached = flat["input"]
    assert at_ms is not None and isinstance(uncached, int)
    read, write = flat["cache.read"] or 0, flat["cache.write"] or 0
    output, reasoning, total = flat["output"], flat["reasoning"] or 0, flat["total"]
    if output is not None and total is not None and total == uncached + output + reasoning + read + write:
        output += reasoning  # newer builds count reasoning apart from output
    try:
        usage = imported_usage(uncached=uncached, read=read, write=write, output=output,
                               reasoning=flat["reasoning"], raw={**tokens, "cost": p.get("cost")}
                               if isinstance(p.get("cost"), int | float) else dict(tokens))
    except (ValueError, PromptCacheError) as exc:
        return SkippedLine(file, 0, f"{m.id}/{pid}: {exc}")
    return ImportedRequest(
        session_key=s.id, dedupe_key=f"{s.id}/{pid}", at=datetime.fromtimestamp(at_ms / 1000, UTC),
        body={"model": model, "messages": body_msgs}, usage=usage, model=model, source_ref=ref,
        dialect="anthropic", partial=True, parent_key=s.parent, session_kind=kind, events=events,
        reply=reply or None, provider=provider)


def _copy(message: dict[str, Any]) -> dict[str, Any]:
    return {"role": message["role"], "content": list(message["content"])}


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    append_message(messages, role, blocks)


def _user_blocks(m: _Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _, _, p in m.parts:
        kind = p.get("type")
        if kind == "text" and isinstance(p.get("text"), str) and p["text"]:
            out.append({"type": "text", "text": p["text"]})
        elif kind == "file":
            out.append({"type": "text", "text": f"[file {p.get('filename') or p.get('url')} ({p.get('mime')})]"})
        elif kind == "compaction":
            out.append({"type": "text", "text": "What did we do so far?"})  # the prompt OpenCode sends for it
    return out


def _tool_blocks(p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    state = as_object(p.get("state"))
    call_id = str(p.get("callID", ""))
    use: dict[str, Any] = {"type": "tool_use", "id": call_id, "name": str(p.get("tool", "")),
           "input": state.get("input") if isinstance(state.get("input"), dict) else {}}
    status = state.get("status")
    if status == "completed":
        return use, {"type": "tool_result", "tool_use_id": call_id, "content": str(state.get("output", ""))}
    if status == "error":
        return use, {"type": "tool_result", "tool_use_id": call_id, "content": str(state.get("error", "")),
                     "is_error": True}
    return use, None
