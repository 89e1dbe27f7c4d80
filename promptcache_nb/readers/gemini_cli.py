"""Reader for Gemini CLI chats: ``~/.gemini/tmp/<project>/chats/session-<time>-<id8>.jsonl`` (format ``gemini-cli``).

Two eras (docs: ``../shared/reference/agent_log_formats.md`` §5, from ``chatRecordingService.ts``):

* **JSONL mutation log** (April 2026 on). Line 1 is the metadata ``{sessionId, projectHash, startTime, kind?}``;
  then message records ``{id, timestamp, type, content, toolCalls?, tokens?, model?}``, ``{"$set": {...}}`` and
  ``{"$rewindTo": id}``. The client re-appends a whole message each time it changes (tokens added, tool calls
  merged): **the last record of an id wins and keeps the place of its first**. ``$rewindTo`` drops that message
  and everything after it (an unknown id drops all); ``$set`` with ``messages`` replaces the whole list (written
  after ``/compress`` and when the history is masked). The log is replayed in that order.
* **Legacy JSON** (August 2025 to April 2026): one pretty-printed ``ConversationRecord`` rewritten whole. Its
  usage was attached to "the last gemini message without tokens", so some calls were merged or lost theirs: the
  requests found are a lower bound. A resumed legacy file is converted to ``.jsonl`` beside it; both carry the
  same session and message ids, so importing both stores each request once.

What becomes a request:

* **One request per ``gemini`` message with ``tokens``** (only the successful attempt's usage is logged). A
  message rewound later still counts: it was billed. A ``gemini`` message that never got ``tokens`` is listed in
  ``skipped``.
* **Usage is inclusive**: ``tokens.input`` (``promptTokenCount``) holds the cached tokens, so uncached input =
  ``input − cached``; implicit caching bills no write (0); output = ``output + thoughts`` (thinking is billed as
  output; ``thoughts`` is also ``reasoning_tokens``, stored in ``turns.reasoning_tokens``: a split of the output,
  never added twice). ``cached`` above ``input`` skips that request.
* **Time** is the message's ``timestamp``: the end of the response (the log has no request start), so gaps are
  measured end to end.
* **Bodies are OpenAI-Chat-shaped** (``dialect="openai-chat"``): there is no Gemini wire format in ``dialects/``,
  and Chat is the closest one. Gemini's ``contents`` are a list of whole turns, as Chat's ``messages`` are (one
  segment each); a ``functionCall`` / ``functionResponse`` pair is an assistant ``tool_calls`` entry and its
  ``tool`` message; and Gemini's implicit caching is automatic prefix caching with no writes and an inclusive
  prompt count, as OpenAI's is, so the fallback cache model (``openai``) is the closest until a ``gemini`` one
  exists. The body of a request is every message before it when it was first written: user text, each earlier
  answer with its tool calls, and their results (from ``toolCalls[].result``, or from the synthetic ``user``
  messages newer clients write, never both). The system instruction and tool declarations are not logged:
  bodies are ``partial``. ``info`` / ``error`` / ``warning`` messages are never sent and are left out.
* **Events**: the request after a ``$set`` that shortened the list carries ``compaction``; after a
  ``$rewindTo``, ``rewind``.
* **The telemetry outfile** (``telemetry.outfile`` / ``GEMINI_TELEMETRY_OUTFILE``, documented as
  ``.gemini/telemetry.log``; §5.5): when a ``telemetry.log`` sits in the chats folder's parent or one of its two
  parents (``~/.gemini/tmp/<project>/``, ``~/.gemini/tmp/``, ``~/.gemini/``), its ``gemini_cli.api_request``
  records give the requests their bodies as sent: ``request_text`` is the JSON of the ``contents`` (with the
  environment-context turn and anything else the chat file never records). Each ``api_request`` is answered by
  the next ``api_response`` or ``api_error`` of its ``prompt_id`` (a retried call logs both attempts); a chat
  request takes the ``api_response`` of its session (``session.id``) with the same ``input`` / ``cached`` /
  ``output`` counts whose ``event.timestamp`` (the response end, as the chat's) is nearest, within 2 minutes,
  each used once. Usage stays the chat's (the same measured counts). The system instruction is not in
  ``request_text``: it comes from the ``gen_ai.client.inference.operation.details`` record Gemini CLI writes
  beside each ``api_response`` (``toSemanticLogRecord``: same ``session.id`` and ``event.timestamp``), whose
  ``gen_ai.system_instructions`` is always logged, as a list of OTel parts; it becomes the body's first
  (``system``) message. Gemini CLI cuts those parts to 160 KiB in all (``limitTotalLength``): one that long may
  be cut, so it is left out. Tool declarations are never logged, so bodies stay ``partial``. The file is
  pretty-printed JSON
  records back to back (not JSON Lines); read on its own it holds no request the chats do not: it is listed
  in ``skipped`` with that reason.
* **Sessions** are the metadata's ``sessionId`` (never the file name). A sub-agent chat (``kind: "subagent"``)
  lives in ``chats/<parent session id>/``: that folder name is its ``parent_key``. Dedupe key:
  ``<sessionId>/<message id>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

from .._util import identity_prefix
from ..errors import PromptCacheError
from ._counts import count_problem, imported_usage
from ._history import HistoryDecoder
from ._jsonl import iter_json_lines, json_objects_in_head, parse_timestamp, read_log_bytes
from ._stream import ParsedLines
from ._types import ImportedRequest, Record, SessionKind, SkippedLine

__all__ = ["GeminiCliReader"]

_TOKEN_FIELDS = ("input", "output", "cached", "thoughts", "tool", "total")
_MESSAGE_TYPES = frozenset({"user", "gemini", "info", "error", "warning"})
_LEGACY_HEAD = re.compile(r'^\s*\{\s*"(sessionId|projectHash)"\s*:')
TELEMETRY_FILE = "telemetry.log"
#: a telemetry response is the chat request's when their response ends are this close
_PAIR_WINDOW = timedelta(minutes=2)
_OPERATION_DETAILS = "gen_ai.client.inference.operation.details"
#: Gemini CLI's GLOBAL_TEXT_LIMIT (telemetry/semantic.ts): string content of a record is cut to 160 KiB in all
_SYSTEM_TEXT_LIMIT = 160 * 1024
_TELEMETRY_HEAD = re.compile(r'"event\.name"\s*:\s*"(gemini_cli\.|gen_ai\.client\.inference)')


@dataclass
class _Pending:
    """A ``gemini`` message seen in the log: the body sent for it, and its latest record."""

    line: int
    body_messages: list[dict[str, Any]]
    events: tuple[str, ...]
    record: dict[str, Any]
    token_line: int | None = None


@dataclass
class _Joined:
    """The Chat messages of the replay's first records, kept between requests: each request's body is the one
    before it with the records since appended, so only those (and any record re-written since) are converted and
    joined, not the whole conversation again."""

    valid: int = 0  # leading records of the replay's order whose messages below are current
    messages: list[dict[str, Any]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # per record: the end of its messages
    added: list[list[str]] = field(default_factory=list)  # per record: the tool call ids it answered first
    answered: set[str] = field(default_factory=set)

    def keep(self, n: int) -> None:
        """Forget all but the first ``n`` records' messages."""
        if n >= len(self.ends):
            return
        for ids in self.added[n:]:
            self.answered.difference_update(ids)
        del self.messages[self.ends[n - 1] if n else 0:]
        del self.ends[n:], self.added[n:]


@dataclass
class _Replay:
    """The conversation as the client holds it while its log is replayed."""

    order: list[str] = field(default_factory=list)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)  # message id -> its index in order
    pending: dict[str, _Pending] = field(default_factory=dict)  # gemini messages by id, in first-seen order
    events: list[str] = field(default_factory=list)
    # message id -> (the record converted, its Chat messages): each record is converted once, not once per request
    converted: dict[str, tuple[dict[str, Any], list[tuple[dict[str, Any], str | None]]]] = field(
        default_factory=dict)
    joined: _Joined = field(default_factory=_Joined)

    def messages(self) -> list[dict[str, Any]]:
        """The Chat messages of the records in order (see :func:`_join`), a list of the caller's own."""
        joined = self.joined
        joined.keep(joined.valid)
        for mid in self.order[len(joined.ends):]:
            rec = self.records[mid]
            done = self.converted.get(mid)
            if done is None or done[0] is not rec:
                done = self.converted[mid] = (rec, _pieces(rec))
            joined.added.append(_join_into(joined.messages, joined.answered, done[1]))
            joined.ends.append(len(joined.messages))
        joined.valid = len(self.order)
        return list(joined.messages)

    def put(self, record: dict[str, Any], line: int, *, checkpoint: bool = False) -> None:
        mid = record["id"]
        if mid not in self.records:
            # a gemini turn first seen inside a checkpoint is one the client made up (the "Got it" after a summary)
            if record.get("type") == "gemini" and mid not in self.pending and not checkpoint:
                self.pending[mid] = _Pending(line, self.messages(), tuple(self.events), record)
                self.events.clear()
            self.position[mid] = len(self.order)
            self.order.append(mid)
        else:
            self.joined.valid = min(self.joined.valid, self.position[mid])  # re-written: its messages may change
        self.records[mid] = record
        self._note(record, line)

    def _note(self, record: dict[str, Any], line: int) -> None:
        p = self.pending.get(record["id"])
        if p is not None and record.get("type") == "gemini":
            if isinstance(record.get("tokens"), dict) or not isinstance(p.record.get("tokens"), dict):
                p.record = record  # a checkpoint copy without tokens never erases the usage already read
            if isinstance(record.get("tokens"), dict) and p.token_line is None:
                p.token_line = line

    def rewind(self, to: str) -> None:
        cut = self.position.get(to, 0)
        for mid in self.order[cut:]:
            del self.records[mid], self.position[mid]
        del self.order[cut:]
        self.joined.valid = min(self.joined.valid, cut)
        self.events.append("rewind")

    def replace(self, messages: list[Any], line: int) -> None:
        before = len(self.order)
        self.order, self.records, self.position = [], {}, {}
        self.joined.valid = 0
        for m in messages:
            if isinstance(m, dict) and isinstance(m.get("id"), str):
                self.put(m, line, checkpoint=True)
        if len(self.order) < before:
            self.events.append("compaction")


class GeminiCliReader:
    """Reads Gemini CLI chat files (``gemini-cli``); see the module docstring for the rules."""

    name = "gemini-cli"

    def sniff(self, path: Path, head: str) -> bool:
        if head.lstrip().startswith("{") and _TELEMETRY_HEAD.search(head):
            return True
        objs = json_objects_in_head(head, limit=3)
        if objs:
            first = objs[0]
            return isinstance(first.get("sessionId"), str) and isinstance(first.get("projectHash"), str)
        return bool(_LEGACY_HEAD.match(head)) and '"projectHash"' in head and '"sessionId"' in head

    def read(self, path: Path) -> Iterator[Record]:
        head = read_log_bytes(path, 4096).decode("utf-8", errors="replace").lstrip("\ufeff")
        first_line = head.split("\n", 1)[0].strip()
        if _TELEMETRY_HEAD.search(head) and '"projectHash"' not in head:
            calls = _telemetry_calls(path)
            yield SkippedLine(str(path), 0, f"Gemini CLI telemetry outfile ({len(calls)} API calls): its request "
                                            "text gives the bodies of the chats beside it; import the chats")
        elif first_line in ("{", "{\r") or not json_objects_in_head(head, limit=1):
            yield from self._read_legacy(path)
        else:
            lines = ParsedLines(iter_json_lines(path))
            yield from lines.around(self._read_jsonl(path, lines))

    def _read_jsonl(self, path: Path, lines: ParsedLines) -> Iterator[Record]:
        file = str(path)
        meta: dict[str, Any] = {}
        replay = _Replay()
        for rec in lines:
            obj = rec.obj
            if isinstance(obj.get("$rewindTo"), str):
                replay.rewind(obj["$rewindTo"])
            elif isinstance(obj.get("$set"), dict):
                update = obj["$set"]
                if isinstance(update.get("messages"), list):
                    replay.replace(update["messages"], rec.line)
                for key in ("kind",):
                    if key in update:
                        meta[key] = update[key]
            elif isinstance(obj.get("id"), str):
                if obj.get("type") not in _MESSAGE_TYPES:
                    yield SkippedLine(file, rec.line, f"message {obj['id'][:40]!r}: unknown type "
                                                      f"{obj.get('type')!r:.40}")
                    continue
                replay.put(obj, rec.line)
            elif isinstance(obj.get("sessionId"), str):
                if "sessionId" not in meta:  # the first metadata line names the session; later ones repeat it
                    meta.update(obj)
            else:
                keys = ", ".join(sorted(str(k)[:40] for k in obj)[:6])
                yield SkippedLine(file, rec.line, f"not a Gemini CLI chat record (keys: {keys})")
        yield from self._requests(path, meta, replay, legacy=False)

    def _read_legacy(self, path: Path) -> Iterator[Record]:
        file = str(path)
        try:
            doc = json.loads(read_log_bytes(path))
        except (ValueError, RecursionError) as exc:
            yield SkippedLine(file, 0, f"not a Gemini CLI chat: not valid JSON ({str(exc)[:120]})")
            return
        if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
            yield SkippedLine(file, 0, "not a Gemini CLI chat: no messages list")
            return
        replay = _Replay()
        for i, m in enumerate(doc["messages"]):
            if not isinstance(m, dict) or not isinstance(m.get("id"), str):
                yield SkippedLine(file, i + 1, f"messages[{i}]: not a message record (no id)")
                continue
            replay.put(m, i)  # the "line" of a legacy message is its index: references read file#messages[i]
        yield from self._requests(path, doc, replay, legacy=True)

    def _requests(self, path: Path, meta: dict[str, Any], replay: _Replay, *, legacy: bool
                  ) -> Iterator[ImportedRequest | SkippedLine]:
        file = str(path)
        session = str(meta["sessionId"]) if isinstance(meta.get("sessionId"), str) else file
        kind: SessionKind = "subagent" if meta.get("kind") == "subagent" else "main"
        parent = path.parent.name if kind == "subagent" and path.parent.name != "chats" else None
        last_model: str | None = None
        telemetry = _TelemetryIndex(_telemetry_near(path))
        for mid, p in replay.pending.items():
            rec = p.record
            ref = f"{file}#messages[{p.line}]" if legacy else f"{file}:{p.token_line or p.line}"
            line = p.line + 1 if legacy else (p.token_line or p.line)
            model = rec.get("model") if isinstance(rec.get("model"), str) and rec.get("model") else last_model
            if model is not None:
                last_model = model
            tokens = rec.get("tokens")
            if not isinstance(tokens, dict):
                yield SkippedLine(file, line, f"gemini message {mid[:40]!r} has no token usage"
                                  + (" (the legacy format merged some calls' usage into others)" if legacy else ""))
                continue
            problem = count_problem(tokens, _TOKEN_FIELDS, "tokens")
            if problem is None and not isinstance(tokens.get("input"), int):
                problem = "tokens.input: missing"
            if problem is None and (tokens.get("cached") or 0) > tokens["input"]:
                problem = f"tokens.cached ({tokens['cached']}) exceeds tokens.input ({tokens['input']})"
            if problem is None and model is None:
                problem = "gemini message without a model (and none before it): the model is unknown"
            if problem:
                yield SkippedLine(file, line, problem)
                continue
            try:
                at = parse_timestamp(rec.get("timestamp"))
                cached = tokens.get("cached") or 0
                thoughts = tokens.get("thoughts") or 0
                output = tokens.get("output")
                usage = imported_usage(uncached=tokens["input"] - cached, read=cached, write=0,
                                       output=None if output is None else output + thoughts,
                                       reasoning=thoughts if "thoughts" in tokens else None, raw=dict(tokens))
            except (ValueError, PromptCacheError) as exc:
                yield SkippedLine(file, line, f"gemini message {mid[:40]!r}: {exc}")
                continue
            assert model is not None
            sent = telemetry.take(session, tokens, at)
            yield ImportedRequest(
                session_key=session, dedupe_key=f"{session}/{mid}", at=at,
                body={"model": model, "messages": p.body_messages if sent is None else sent},
                usage=usage, model=model, source_ref=ref,
                dialect="openai-chat", partial=True, parent_key=parent, session_kind=kind, events=p.events,
                reply=_reply(rec), provider="gemini")


# -- the telemetry outfile ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TelemetryCall:
    """One ``gemini_cli.api_response`` of a telemetry outfile, with the ``request_text`` of its request."""

    session: str
    end: datetime
    timestamp: str  # ``event.timestamp`` as written: the operation.details record of the response repeats it
    counts: tuple[int, int, int]  # input (inclusive), cached, output: as the chat's tokens
    request_text: str | None  # the JSON of the Gemini ``contents`` sent, when logPrompts kept them (parsed on use)
    system_instructions: str | None = None  # the JSON of the OTel parts of the system instruction sent


def _telemetry_near(chat: Path) -> Path | None:
    """The ``telemetry.log`` beside a chat's project folder (see the module docstring), or None."""
    chats = next((p for p in chat.parents if p.name == "chats"), None)
    if chats is None:
        return None
    for folder in list(chats.parents)[:3]:
        candidate = folder / TELEMETRY_FILE
        try:
            if candidate.is_file():
                return candidate
        except OSError:
            return None
    return None


def _telemetry_calls(path: Path) -> tuple[TelemetryCall, ...]:
    try:
        st = path.stat()
    except OSError:
        return ()
    return _read_telemetry(str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=2)  # every chat of a folder consults the same file: parsed once per (path, version)
def _read_telemetry(path: str, _mtime_ns: int, _size: int) -> tuple[TelemetryCall, ...]:
    text = read_log_bytes(Path(path)).decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    pending: dict[str, list[Any]] = {}  # prompt_id -> request_text of calls not yet answered, oldest first
    calls: list[TelemetryCall] = []
    # (session, event.timestamp) -> gen_ai.system_instructions of the operation.details record written with a
    # response (it carries the response's usage; the request-side one does not)
    systems: dict[tuple[str, str], str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            nxt = text.find("\n{", i + 1)  # a torn record: resume at the next one that starts a line
            if nxt < 0:
                break
            i = nxt + 1
            continue
        attrs = _attributes(obj)
        name = attrs.get("event.name")
        pid = str(attrs.get("prompt_id") or "")
        if name == "gemini_cli.api_request":
            pending.setdefault(pid, []).append(attrs.get("request_text"))
        elif name in ("gemini_cli.api_response", "gemini_cli.api_error"):
            queue = pending.get(pid)
            request_text = queue.pop(0) if queue else None
            if name == "gemini_cli.api_error":
                continue
            call = _telemetry_call(attrs, pid, request_text)
            if call is not None:
                calls.append(call)
        elif (name == _OPERATION_DETAILS and "gen_ai.usage.input_tokens" in attrs
              and isinstance(attrs.get("gen_ai.system_instructions"), str)):
            systems[(str(attrs.get("session.id")), str(attrs.get("event.timestamp")))] = \
                attrs["gen_ai.system_instructions"]
    if systems:
        calls = [replace(c, system_instructions=systems.get((c.session, c.timestamp))) for c in calls]
    return tuple(calls)


def _attributes(obj: Any) -> dict[str, Any]:
    """A record's attributes: an object (the SDK's file exporter) or OTLP's ``[{key, value: {xValue}}]``."""
    attrs = obj.get("attributes") if isinstance(obj, dict) else None
    if isinstance(attrs, dict):
        return attrs
    out: dict[str, Any] = {}
    for kv in attrs if isinstance(attrs, list) else []:
        if isinstance(kv, dict) and isinstance(kv.get("value"), dict) and kv["value"]:
            value = next(iter(kv["value"].values()))
            out[str(kv.get("key"))] = int(value) if "intValue" in kv["value"] and str(value).isdigit() else value
    return out


def _telemetry_call(attrs: dict[str, Any], pid: str, request_text: Any) -> TelemetryCall | None:
    counts = [attrs.get(k) for k in ("input_token_count", "cached_content_token_count", "output_token_count")]
    ints = [c for c in counts if isinstance(c, int) and not isinstance(c, bool)]
    if len(ints) != 3:
        return None
    sid = attrs.get("session.id")
    session = sid if isinstance(sid, str) else pid.split("########")[0]  # prompt ids are <session>########<n>
    try:
        end = parse_timestamp(attrs.get("event.timestamp"))
    except ValueError:
        return None
    text = request_text if isinstance(request_text, str) else None
    return TelemetryCall(session, end, str(attrs.get("event.timestamp")), (ints[0], ints[1], ints[2]), text)


class _TelemetryIndex:
    """A telemetry file's calls by (session, counts), each handed to one chat request at most."""

    def __init__(self, path: Path | None) -> None:
        # each request_text repeats the contents of the call before it: the decoder hands those items back as the
        # previous parse's objects, and the Chat messages already converted from them are reused, so a call costs
        # its new turns (and one C-speed comparison of the text), not its whole history
        self.decoder = HistoryDecoder(array_body=True)
        self._contents: list[Any] = []  # the last contents converted
        self._ends: list[int] = []  # per item of them: the end of its Chat messages in _messages
        self._messages: list[dict[str, Any]] = []
        self._system: tuple[str | None, dict[str, Any] | None] = (None, None)  # the last instructions, converted
        self._by: dict[tuple[str, tuple[int, int, int]], list[TelemetryCall]] = {}
        for call in _telemetry_calls(path) if path is not None else ():
            self._by.setdefault((call.session, call.counts), []).append(call)

    def take(self, session: str, tokens: dict[str, Any], at: datetime) -> list[dict[str, Any]] | None:
        """The Chat messages the telemetry says were sent for this chat request, or None."""
        if not self._by:
            return None
        key = (session, (tokens.get("input") or 0, tokens.get("cached") or 0, tokens.get("output") or 0))
        candidates = [c for c in self._by.get(key, ()) if abs(c.end - at) <= _PAIR_WINDOW]
        if not candidates:
            return None
        best = min(candidates, key=lambda c: abs(c.end - at))
        self._by[key].remove(best)
        try:
            contents = self.decoder.loads(best.request_text) if best.request_text is not None else None
        except (ValueError, RecursionError):
            contents = None
        if not isinstance(contents, list):
            return None
        before = self._contents
        k = identity_prefix(contents, before)
        while k < len(before) and k < len(contents) and contents[k] == before[k]:
            k += 1  # equal but parsed anew (another conversation came between): converted all the same
        messages = self._messages[:self._ends[k - 1]] if k else []
        ends = self._ends[:k]
        for content in contents[k:]:
            messages += _content_messages(content)
            ends.append(len(messages))
        self._contents, self._ends, self._messages = contents, ends, messages
        if best.system_instructions != self._system[0]:
            self._system = (best.system_instructions, _system_message(best.system_instructions))
        # the same system message object as the call before: the body's whole shared prefix is told by identity
        system = self._system[1]
        return [system, *messages] if system is not None else list(messages)


def _system_message(parts_json: str | None) -> dict[str, Any] | None:
    """The Chat ``system`` message of a logged ``gen_ai.system_instructions`` (OTel parts ``{type: "text",
    content}``), or None: none logged, not text, or long enough that Gemini CLI may have cut it."""
    try:
        parts = json.loads(parts_json) if parts_json is not None else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(parts, list) or not parts:
        return None
    texts = [p["content"] for p in parts
             if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)]
    if len(texts) != len(parts):
        return None
    if sum(len(t) for t in texts) >= _SYSTEM_TEXT_LIMIT:
        return None
    content: Any = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    return {"role": "system", "content": content}


def _content_messages(content: Any) -> list[dict[str, Any]]:
    """One Gemini API ``Content`` (``{role: user|model, parts}``) as Chat messages, by the rules the chat records
    follow (see "Bodies" in the module docstring): a model turn is one assistant message (its function calls as
    ``tool_calls``); a user turn is its function responses as tool messages, then its text."""
    out: list[dict[str, Any]] = []
    if isinstance(content, dict):
        parts = _parts(content.get("parts"))
        if content.get("role") == "model":
            answer: dict[str, Any] = {"role": "assistant", "content": "".join(t["text"] for t in _text_of(parts))}
            calls = [p["functionCall"] for p in parts
                     if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)]
            if calls:
                answer["tool_calls"] = [{"id": str(c.get("id") or c.get("name", "")), "type": "function",
                                         "function": {"name": str(c.get("name", "")),
                                                      "arguments": _dumps(c.get("args") or {})}} for c in calls]
            return [answer]
        for p in parts:
            fr = p.get("functionResponse") if isinstance(p, dict) else None
            if isinstance(fr, dict):
                out.append(_tool_message(fr, str(fr.get("name", ""))))
        text = _text_of(parts)
        if text:
            out.append({"role": "user", "content": text})
    return out


def _parts(content: Any) -> list[Any]:
    """A ``PartListUnion`` as a list of parts (a string is one text part)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if isinstance(content, list):
        return [{"text": p} if isinstance(p, str) else p for p in content]
    return [content]


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _text_of(parts: list[Any]) -> list[dict[str, Any]]:
    """Chat content parts of the parts that are neither calls nor responses (thoughts are never sent back)."""
    out = []
    for p in parts:
        if not isinstance(p, dict):
            continue
        if "functionCall" in p or "functionResponse" in p or p.get("thought") is True:
            continue
        text = p.get("text") if isinstance(p.get("text"), str) else _dumps(p)  # inline data: stands for itself
        out.append({"type": "text", "text": text})
    return out


def _tool_message(response: dict[str, Any], fallback_id: str) -> dict[str, Any]:
    inner = response.get("response")
    output = inner.get("output") if isinstance(inner, dict) else None
    content = output if isinstance(output, str) else _dumps(inner if inner is not None else response)
    call_id = response.get("id") if isinstance(response.get("id"), str) else fallback_id
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _pieces(rec: dict[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """The Chat messages one Gemini CLI record stands for, each tool message with the call id it answers."""
    out: list[tuple[dict[str, Any], str | None]] = []
    kind = rec.get("type")
    parts = _parts(rec.get("content"))
    if kind == "user":
        for p in parts:
            fr = p.get("functionResponse") if isinstance(p, dict) else None
            if isinstance(fr, dict):
                msg = _tool_message(fr, str(fr.get("name", "")))
                out.append((msg, msg["tool_call_id"]))
        text = _text_of(parts)
        if text:
            out.append(({"role": "user", "content": text}, None))
    elif kind == "gemini":
        answer: dict[str, Any] = {"role": "assistant", "content": "".join(t["text"] for t in _text_of(parts))}
        calls = [c for c in rec.get("toolCalls") or [] if isinstance(c, dict)]
        if calls:
            answer["tool_calls"] = [{"id": str(c.get("id", "")), "type": "function",
                                     "function": {"name": str(c.get("name", "")),
                                                  "arguments": _dumps(c.get("args") or {})}} for c in calls]
        out.append((answer, None))
        for c in calls:
            for p in _parts(c.get("result")):
                fr = p.get("functionResponse") if isinstance(p, dict) else None
                if isinstance(fr, dict):
                    tool = _tool_message(fr, str(c.get("id", "")))
                    out.append((tool, tool["tool_call_id"]))
    return out


def _join(pieces: list[list[tuple[dict[str, Any], str | None]]]) -> list[dict[str, Any]]:
    """The records' Chat messages in order, each tool result once (newer clients log it twice: in the call's
    ``result`` and as a synthetic user message)."""
    out: list[dict[str, Any]] = []
    answered: set[str] = set()
    for record in pieces:
        _join_into(out, answered, record)
    return out


def _join_into(out: list[dict[str, Any]], answered: set[str], record: list[tuple[dict[str, Any], str | None]]
               ) -> list[str]:
    """Append one record's messages to ``out``, leaving out the tool results ``answered`` already; return the call
    ids it answered (now in ``answered``)."""
    added: list[str] = []
    for msg, call_id in record:
        if call_id is not None:
            if call_id in answered:
                continue
            answered.add(call_id)
            added.append(call_id)
        out.append(msg)
    return added


def _chat_messages(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Gemini CLI message records → Chat Completions messages (see "Bodies" in the module docstring)."""
    return _join([_pieces(rec) for rec in records])


def _reply(rec: dict[str, Any]) -> list[dict[str, Any]] | None:
    msgs = _chat_messages([{**rec, "toolCalls": [{k: v for k, v in c.items() if k != "result"}
                                                 for c in rec.get("toolCalls") or [] if isinstance(c, dict)]}])
    return msgs or None
