"""Reader for pi and oh-my-pi session files (format ``pi``).

pi (badlogic/pi-mono, ``~/.pi/agent/sessions/--<cwd>--/<ISO>_<uuid>.jsonl``) and its fork oh-my-pi
(``~/.omp/agent/sessions/...``) write one JSON entry per line: a ``session`` header, then entries with an
``id`` and a ``parentId`` (versions 2 and 3; version 1 has neither and chains entries in file order). The rules
(``agent_log_formats.md`` §1, §1b):

* **One request per assistant** ``message`` **entry** (pi writes one per response, never streaming partials),
  and per oh-my-pi ``model_usage`` entry (calls outside the transcript: auto-thinking, background, roll-ups
  whose ``purpose`` names a sub-agent are counted in the sub-agent's own file and skipped here). Identity: the
  session header's ``id`` and the entry's ``id`` (never the file name). Entries with ``stopReason`` ``error`` or
  ``aborted`` and all-zero usage were not billed: skipped with a reason; an aborted entry with usage is billed
  and imported.
* **The body** is the context pi sent: the path from the entry's parent up to the root (``parentId``), not "all
  earlier lines", so a request on an abandoned branch gets its own branch's history (and abandoned branches, which
  were billed, are imported too). After a ``compaction`` entry on the path the context is its summary (a user
  message) followed by the entries from ``firstKeptEntryId`` on; the next request carries the ``compaction``
  event. Messages are rebuilt as Anthropic content blocks (``toolCall`` → ``tool_use``, ``toolResult`` → a user
  ``tool_result``); the system prompt and tools are not logged, so bodies are ``partial`` (their
  ``prefix_identity``: the working directory, model and session kind; ``_prefixes.py``).
* **Usage**: ``input`` is uncached, ``cacheRead`` / ``cacheWrite`` as named; oh-my-pi's ``cttl`` gives the 5m/1h
  split of the write. Two eras count ``input`` *with* the cached tokens and are converted (with a note):
  the ``google-generative-ai`` / ``google-vertex`` apis, and OpenAI apis before pi-ai 0.12.10 (entries before
  2025-12-04).
* **Reasoning on** ``openai-completions``: pi-ai adds ``reasoning_tokens`` to ``completion_tokens``, which already
  holds them, so ``output`` counts reasoning twice on a reasoning model (``agent_log_formats.md`` §1.3). When
  ``totalTokens`` falls short of the four counts' sum (the provider's total, reasoning counted once), the
  excess is taken off output; otherwise (pi computes ``totalTokens`` itself, so the count is lost) output is
  kept as logged, an upper bound, and a note says so. oh-my-pi logs ``reasoningTokens`` (a part of output,
  counted once): it becomes ``reasoning_tokens`` and output is left alone.
* ``model_change`` and ``thinking_level_change`` entries become ``model_switch`` / ``thinking_level_change``
  events of the next billed request (an unbilled stub in between passes them on); the request's own
  ``provider`` / ``model`` are what it was sent to. A thinking change loses Anthropic's message cache: the
  measured cause ``thinking_changed`` reads the event.
* **Forks** (``parentSession`` in the header) copy the parent's path into a new file: when the parent file is
  still there, the copied requests (same entry id and request time) are skipped as counted in the parent.
* **oh-my-pi sub-agents**: the task tool writes the child's session to ``<parent file without .jsonl>/<agentId>
  .jsonl``; that folder names the parent (its file's header ``id``, else the id in the folder name), which
  becomes the child's ``parent_key`` (a ``subagent`` session). The child's ``session_init`` entry holds its
  system prompt exactly as sent: its requests' bodies carry it (tools are only named: still ``partial``).
* Files are only read: pi rewrites a file when it migrates it, we never do. OpenClaw's own entries (a
  ``delivery-mirror`` "assistant" with provider ``openclaw``) are not API calls and are skipped here too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import PromptCacheError
from ..usage import MAX_TOKENS, TTL_SPLIT_UNKNOWN_NOTE, Usage
from ._jsonl import JsonLine, iter_json_lines, json_objects_in_head, parse_timestamp
from ._messages import append_message
from ._stream import ParsedLines
from ._types import ImportedRequest, ReadProgress, Record, SkippedLine

__all__ = ["PiReader", "pi_blocks", "pi_messages_to_anthropic", "pi_usage"]

#: an oh-my-pi / pi session file's name without ``.jsonl``: ``<ISO with : and . as ->_<session id>``
_SESSION_STEM = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(?:-\d{3})?Z_([A-Za-z0-9-]+)$")
_FILE_ID = re.compile(r"_([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.IGNORECASE)
_ENTRY_TYPES = frozenset({"message", "thinking_level_change", "model_change", "compaction", "branch_summary",
                          "custom", "custom_message", "label", "session_info", "model_usage", "session_init",
                          "service_tier_change", "ttsr_injection", "mode_change", "credential_pin",
                          "reset_boundary", "archive", "title_change"})
#: apis whose ``input`` counts the cached tokens too (pi-ai google.ts / google-vertex.ts)
_INCLUSIVE_APIS = frozenset({"google-generative-ai", "google-vertex"})
#: pi-ai 0.12.10 made OpenAI ``input`` exclude cached tokens; entries before this instant count them in
OPENAI_EXCLUSIVE_SINCE = datetime(2025, 12, 4, tzinfo=UTC)
#: OpenClaw markers: a transcript with any of them is read by the ``openclaw`` reader
OPENCLAW_MARKERS = ('"customType":"openclaw', '"customType":"model-snapshot"', '"provider":"openclaw"',
                    '"model":"delivery-mirror"')


def is_openclaw(head: str) -> bool:
    """True when ``head`` holds an entry only OpenClaw writes (its custom entries, delivery mirrors)."""
    compact = head.replace('": "', '":"')
    return any(m in compact for m in OPENCLAW_MARKERS)


def sniff_pi(head: str) -> bool:
    """True when ``head`` is a pi-family session file (a ``session`` header, or pi entries)."""
    for obj in json_objects_in_head(head):
        kind = obj.get("type")
        if kind == "session" and isinstance(obj.get("id"), str) and ("cwd" in obj or "version" in obj):
            return True
        if kind == "title" and obj.get("v") == 1 and "pad" in obj:  # oh-my-pi's rewritable title slot
            continue
        if kind in _ENTRY_TYPES and "parentId" in obj and isinstance(obj.get("id"), str):
            return True
        if kind == "message" and isinstance(obj.get("message"), dict) and "role" in obj["message"]:
            return True
    return False


class PiReader:
    """Reads pi and oh-my-pi session files (``pi``); see the module docstring for the rules."""

    name = "pi"

    def sniff(self, path: Path, head: str) -> bool:
        return sniff_pi(head) and not is_openclaw(head)

    def read(self, path: Path) -> Iterator[Record]:
        return read_transcript(path)


# -- the transcript ----------------------------------------------------------------------------------------
@dataclass
class _Entry:
    id: str
    parent: str | None
    obj: dict[str, Any]
    line: int
    turns: list[dict[str, Any]] | None = None  # the entry as Anthropic messages, once converted


@dataclass
class _State:
    file: str
    session: str | None = None
    parent_session: str | None = None
    version: int = 1
    entries: dict[str, _Entry] = field(default_factory=dict)
    last_id: str | None = None  # v1: entries chain in file order
    copied: set[tuple[Any, Any]] = field(default_factory=set)
    subagent_of: str | None = None  # oh-my-pi: the session that spawned this one (from the file's folder)
    system: list[dict[str, Any]] | None = None  # oh-my-pi sub-agents: the system prompt as sent (session_init)
    cwd: str | None = None  # the header's working directory (the system prompt names it and reads its AGENTS.md)


def read_transcript(path: Path, *, dedupe: Callable[[str, str, dict[str, Any]], str] | None = None,
                    records: Iterable[JsonLine | SkippedLine | ReadProgress] | None = None) -> Iterator[Record]:
    """The requests of one pi-format transcript (pi, oh-my-pi, OpenClaw); ``dedupe(session, entry id,
    message)`` makes the dedupe key (default ``<session>:<entry id>``); ``records``: its entries read elsewhere
    (OpenClaw's SQLite rows) instead of the file's lines."""
    lines = ParsedLines(iter_json_lines(path) if records is None else records)
    return lines.around(_transcript(path, lines, dedupe, from_file=records is None))


def _transcript(path: Path, lines: ParsedLines, dedupe: Callable[[str, str, dict[str, Any]], str] | None, *,
                from_file: bool) -> Iterator[ImportedRequest | SkippedLine]:
    file = str(path)
    st = _State(file)
    match = _FILE_ID.search(path.name.split(".jsonl")[0])
    fallback = match.group(1) if match else file
    requests = 0
    st.subagent_of = _spawning_session(path) if from_file else None
    for rec in lines:
        obj = rec.obj
        kind = obj.get("type")
        if kind == "title":
            continue  # oh-my-pi's title slot, rewritten in place
        if kind == "session":
            if st.session is None:
                st.session = obj["id"] if isinstance(obj.get("id"), str) else fallback
                st.version = obj["version"] if isinstance(obj.get("version"), int) else 1
                st.cwd = obj["cwd"] if isinstance(obj.get("cwd"), str) else None
                parent = obj.get("parentSession") or obj.get("branchedFrom")
                if isinstance(parent, str) and parent:
                    st.parent_session = parent
                    st.copied = _copied_from(Path(parent).expanduser())
            continue
        if kind not in _ENTRY_TYPES:
            yield SkippedLine(file, rec.line, f"not a pi session entry (type {kind!r:.40})")
            continue
        if st.session is None:
            st.session = fallback
        entry = _add_entry(st, obj, rec.line)
        if kind == "message":
            message = obj.get("message")
            if not isinstance(message, dict):
                yield SkippedLine(file, rec.line, "message entry without a message object")
                continue
            if message.get("role") != "assistant":
                continue
            out = _request(st, entry, message, dedupe)
            if isinstance(out, ImportedRequest):
                requests += 1
            yield out
        elif kind == "session_init":
            st.system = _system_blocks(obj.get("systemPrompt"))
        elif kind == "model_usage":
            out = _model_usage(st, entry)
            if isinstance(out, ImportedRequest):
                requests += 1
            yield out
    if requests == 0:
        yield SkippedLine(file, 0, "no assistant message with usage in this session file: no request to import")


def _spawning_session(path: Path) -> str | None:
    """The session id of the oh-my-pi session whose task tool wrote ``path``, or None.

    oh-my-pi writes a sub-agent's session to ``<parent file without .jsonl>/<agentId>.jsonl`` (the parent's
    artifacts folder; ``agent_log_formats.md`` §1b.1): the parent's id is its file's header ``id``, else the
    ``<ISO>_<id>`` folder name's id."""
    match = _SESSION_STEM.match(path.parent.name)
    if match is None:
        return None
    parent_file = path.parent.with_name(path.parent.name + ".jsonl")
    try:
        if parent_file.is_file():
            for rec in iter_json_lines(parent_file):
                if isinstance(rec, JsonLine) and rec.obj.get("type") == "session":
                    return rec.obj["id"] if isinstance(rec.obj.get("id"), str) and rec.obj["id"] else match.group(1)
                if isinstance(rec, JsonLine) and rec.obj.get("type") != "title":
                    break  # the header is the first entry (after oh-my-pi's title slot)
    except OSError:
        pass
    return match.group(1)


def _system_blocks(prompt: Any) -> list[dict[str, Any]] | None:
    """``session_init.systemPrompt`` (a string or a list of strings) as Anthropic system blocks."""
    parts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    blocks = [{"type": "text", "text": p} for p in parts if isinstance(p, str) and p]
    return blocks or None


def _add_entry(st: _State, obj: dict[str, Any], line: int) -> _Entry:
    eid = obj.get("id")
    if not isinstance(eid, str) or not eid:
        eid = f"line{line}"
        parent = st.last_id  # v1: no ids, the previous entry is the parent
    else:
        raw_parent = obj.get("parentId", st.last_id if "parentId" not in obj else None)
        parent = raw_parent if isinstance(raw_parent, str) else None
    entry = _Entry(eid, parent, obj, line)
    st.entries[eid] = entry
    st.last_id = eid
    return entry


def _copied_from(parent: Path) -> set[tuple[Any, Any]]:
    """(entry id, request time) of the assistant entries of a fork's parent file, when it can be read."""
    found: set[tuple[Any, Any]] = set()
    try:
        if not parent.is_file():
            return found
    except OSError:
        return found
    for rec in iter_json_lines(parent):
        if hasattr(rec, "obj"):
            obj = rec.obj
            message = obj.get("message")
            if obj.get("type") == "message" and isinstance(message, dict) and message.get("role") == "assistant":
                found.add((obj.get("id"), message.get("timestamp")))
    return found


def _path(st: _State, entry: _Entry) -> list[_Entry]:
    """The entries from the root to ``entry``'s parent (what pi sent with the request ``entry`` answers)."""
    out: list[_Entry] = []
    seen: set[str] = set()
    cur = st.entries.get(entry.parent) if entry.parent else None
    while cur is not None and cur.id not in seen:
        seen.add(cur.id)
        out.append(cur)
        cur = st.entries.get(cur.parent) if cur.parent else None
    out.reverse()
    return out


def _context(path: list[_Entry]) -> tuple[list[dict[str, Any]], list[str]]:
    """The Anthropic messages pi builds from a path (``buildSessionContext``), and the events since the last
    request on it (model and thinking-level changes, a compaction)."""
    last_compaction = max((i for i, e in enumerate(path) if e.obj.get("type") == "compaction"), default=None)
    messages: list[dict[str, Any]] = []
    if last_compaction is not None:
        comp = path[last_compaction].obj
        messages.append({"role": "user", "content": [{"type": "text", "text": _summary_text(comp.get("summary"))}]})
        kept = comp.get("firstKeptEntryId")
        start = next((i for i, e in enumerate(path[:last_compaction]) if e.id == kept), last_compaction)
        chosen = path[start:last_compaction] + path[last_compaction + 1:]
    else:
        chosen = path
    for e in chosen:
        if e.turns is None:  # converted once: every later request shares the same block objects
            e.turns = []
            _append_entry(e.turns, e.obj)
        for turn in e.turns:
            append_message(messages, turn["role"], turn["content"])
    events: list[str] = []
    for e in reversed(path):
        kind = e.obj.get("type")
        message = e.obj.get("message")
        # the previous request is the last billed one: an unbilled stub (aborted, zero usage) or an OpenClaw
        # mirror imports nothing, so the events before it belong to this request
        if (kind == "message" and isinstance(message, dict) and message.get("role") == "assistant"
                and _zero_stub(message) is None and message.get("provider") != "openclaw"
                and message.get("model") != "delivery-mirror"):
            break
        if kind == "compaction":
            events.append("compaction")
        elif kind == "model_change":
            events.append("model_switch")
        elif kind == "thinking_level_change":
            events.append("thinking_level_change")
    events.reverse()
    return messages, events


def _summary_text(summary: Any) -> str:
    return summary if isinstance(summary, str) else json.dumps(summary, sort_keys=True)


def _append_entry(messages: list[dict[str, Any]], obj: dict[str, Any]) -> None:
    kind = obj.get("type")
    if kind == "message" and isinstance(obj.get("message"), dict):
        pi_messages_to_anthropic([obj["message"]], into=messages)
    elif kind == "branch_summary":
        append_message(messages, "user", [{"type": "text", "text": _summary_text(obj.get("summary"))}])
    elif kind == "custom_message":
        append_message(messages, "user", pi_blocks(obj.get("content")))


def pi_messages_to_anthropic(pi_messages: list[Any], *, into: list[dict[str, Any]] | None = None
                             ) -> list[dict[str, Any]]:
    """pi ``AgentMessage`` values as Anthropic messages (consecutive same-role turns merged); OpenClaw's
    delivery mirrors are left out (never sent)."""
    messages = [] if into is None else into
    for m in pi_messages:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role == "assistant":
            if m.get("provider") == "openclaw":
                continue
            append_message(messages, "assistant", pi_blocks(m.get("content")))
        elif role == "toolResult":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": str(m.get("toolCallId") or ""),
                                     "content": pi_blocks(m.get("content"))}
            if m.get("isError"):
                block["is_error"] = True
            append_message(messages, "user", [block])
        elif role in ("user", "custom", "bashExecution", "branchSummary", "compactionSummary", "hookMessage"):
            content = m.get("content")
            if role == "bashExecution":
                content = f"$ {m.get('command', '')}\n{m.get('output', '')}"
            elif role in ("branchSummary", "compactionSummary"):
                content = _summary_text(m.get("summary", content))
            append_message(messages, "user", pi_blocks(content))
    return messages


def pi_blocks(content: Any) -> list[dict[str, Any]]:
    """pi content (a string or a list of blocks) as Anthropic content blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict[str, Any]] = []
    for b in content if isinstance(content, list) else []:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "text":
            out.append({"type": "text", "text": str(b.get("text", ""))})
        elif kind == "thinking":
            block = {"type": "thinking", "thinking": str(b.get("thinking", ""))}
            if isinstance(b.get("thinkingSignature"), str):
                block["signature"] = b["thinkingSignature"]
            out.append(block)
        elif kind == "toolCall":
            args = b.get("arguments")
            out.append({"type": "tool_use", "id": str(b.get("id", "")), "name": str(b.get("name", "")),
                        "input": args if isinstance(args, dict) else {}})
        elif kind == "image":
            out.append({"type": "image", "source": {"type": "base64", "media_type": str(b.get("mimeType", "")),
                                                    "data": str(b.get("data", ""))}})
        else:
            out.append({"type": "text", "text": json.dumps(b, sort_keys=True)})
    return out


def _request_time(message: dict[str, Any], entry: dict[str, Any]) -> datetime:
    """The request start (``message.timestamp``, epoch ms), else the entry's persist time."""
    ms = message.get("timestamp")
    if isinstance(ms, int | float) and not isinstance(ms, bool) and 0 < ms < 1e14:
        return datetime.fromtimestamp(ms / 1000, UTC)
    return parse_timestamp(entry.get("timestamp"))


def pi_usage(raw: Any, *, api: str | None, at: datetime, where: str = "usage") -> Usage:
    """A pi ``Usage`` object as :class:`Usage` (see "Usage" in the module docstring).

    Raises:
        ValueError: a count that is not an int in ``0..MAX_TOKENS`` (naming ``where.<field>``), or no usage.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: missing or not an object")
    counts: dict[str, int] = {}
    for key in ("input", "output", "cacheRead", "cacheWrite"):
        value = raw.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
            raise ValueError(f"{where}.{key}: must be an int in 0..{MAX_TOKENS}, got {value!r:.40}")
        counts[key] = value
    notes: list[str] = []
    uncached = counts["input"]
    api_name = api or ""
    inclusive = api_name in _INCLUSIVE_APIS or (api_name.startswith("openai") and at < OPENAI_EXCLUSIVE_SINCE)
    if inclusive and counts["cacheRead"]:
        if counts["cacheRead"] > uncached:
            raise ValueError(f"{where}.cacheRead ({counts['cacheRead']}) exceeds {where}.input ({uncached}), which "
                             f"counts cached tokens on the {api_name} api")
        uncached -= counts["cacheRead"]
        notes.append(f"usage.input counts cached tokens on the {api_name} api (pi-ai rule): uncached input = "
                     "input - cacheRead")
    output, reasoning = counts["output"], raw.get("reasoningTokens")
    if isinstance(reasoning, bool) or not isinstance(reasoning, int) or not 0 <= reasoning <= output:
        reasoning = None  # oh-my-pi's count, a part of output; absent (or implausible) elsewhere
    if api_name == "openai-completions" and reasoning is None and output:
        output, note = _completions_output(uncached, counts, raw.get("totalTokens"))
        notes.append(note)
    five = one = None
    cttl = raw.get("cttl")
    if isinstance(cttl, dict):
        five, one = cttl.get("ephemeral5m", 0), cttl.get("ephemeral1h", 0)
        for name, value in (("ephemeral5m", five), ("ephemeral1h", one)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{where}.cttl.{name}: must be a non-negative int, got {value!r:.40}")
    elif counts["cacheWrite"] and api_name.startswith("anthropic"):
        notes.append(TTL_SPLIT_UNKNOWN_NOTE.replace("no usage.cache_creation", "pi's usage has no cttl split"))
    return Usage(input_tokens=uncached, cache_read_input_tokens=counts["cacheRead"],
                 cache_creation_input_tokens=counts["cacheWrite"], cache_creation_5m_input_tokens=five,
                 cache_creation_1h_input_tokens=one, output_tokens=output, source="imported",
                 raw=dict(raw), reasoning_tokens=reasoning, notes=tuple(notes))


def _completions_output(uncached: int, counts: dict[str, int], total: Any) -> tuple[int, str]:
    """pi-ai's ``openai-completions`` output, and the note saying what was assumed.

    pi-ai stores ``output = completion_tokens + reasoning_tokens``, but ``completion_tokens`` already holds the
    reasoning: on a reasoning model the reasoning is counted twice. Current pi-ai computes ``totalTokens`` from
    that output, so the reasoning count is lost and output is kept as an upper bound; a ``totalTokens`` short of
    the four counts' sum is the provider's own total (which counts reasoning once), and the difference is the
    reasoning counted twice, taken off output."""
    excess = uncached + counts["cacheRead"] + counts["cacheWrite"] + counts["output"] - total \
        if isinstance(total, int) and not isinstance(total, bool) else 0
    if 0 < excess <= counts["output"]:
        return counts["output"] - excess, (
            f"pi-ai's openai-completions usage counts reasoning twice (output = completion_tokens + "
            f"reasoning_tokens): output = output - {excess}, the excess over usage.totalTokens")
    return counts["output"], ("pi-ai's openai-completions usage may count reasoning twice (output = "
                              "completion_tokens + reasoning_tokens, the count not logged): output is an upper bound")


def provider_of(api: str | None, provider: str | None) -> str:
    """The cache family of a pi request: its api's vendor (OpenRouter's Anthropic route is Anthropic's cache)."""
    api = api or ""
    if api.startswith("anthropic"):
        return "anthropic"
    if api.startswith("openai") or api.startswith("azure"):
        return "openai"
    if api.startswith("google"):
        return "google"
    return (provider or "unknown").lower()


def _zero_stub(message: dict[str, Any]) -> str | None:
    """Why an error/aborted entry is no billed request (all-zero usage), or None."""
    stop = message.get("stopReason")
    usage = message.get("usage")
    if stop in ("error", "aborted") and (not isinstance(usage, dict) or not any(
            isinstance(usage.get(k), int) and usage.get(k) for k in ("input", "output", "cacheRead", "cacheWrite"))):
        return f"stopReason {stop!r} with zero usage: not a billed request"
    return None


def _request(st: _State, entry: _Entry, message: dict[str, Any],
             dedupe: Callable[[str, str, dict[str, Any]], str] | None) -> ImportedRequest | SkippedLine:
    file, line = st.file, entry.line
    if message.get("provider") == "openclaw" or message.get("model") == "delivery-mirror":
        return SkippedLine(file, line, "OpenClaw delivery mirror (provider 'openclaw'): a message delivered to a "
                                       "chat channel, not an API call")
    stub = _zero_stub(message)
    if stub:
        return SkippedLine(file, line, stub)
    if (entry.id, message.get("timestamp")) in st.copied:
        return SkippedLine(file, line, f"copied from the parent session {st.parent_session} (a fork): counted "
                                       "there")
    model = message.get("model")
    if not isinstance(model, str) or not model:
        return SkippedLine(file, line, "assistant message without a model")
    try:
        at = _request_time(message, entry.obj)
        usage = pi_usage(message.get("usage"), api=message.get("api"), at=at, where="message.usage")
    except (ValueError, PromptCacheError) as exc:
        return SkippedLine(file, line, str(exc))
    messages, events = _context(_path(st, entry))
    session = st.session or file
    key = dedupe(session, entry.id, message) if dedupe else f"{session}:{entry.id}"
    rid = message.get("responseId")
    body: dict[str, Any] = {"model": model, "messages": messages}
    if st.system is not None:
        body["system"] = st.system
    return ImportedRequest(
        session_key=session, dedupe_key=key, at=at, body=body, usage=usage,
        model=model, source_ref=f"{file}:{line}", dialect="anthropic", partial=True, events=tuple(events),
        request_id=rid if isinstance(rid, str) else None, reply=pi_blocks(message.get("content")),
        provider=provider_of(message.get("api"), message.get("provider")),
        parent_key=st.subagent_of, session_kind="subagent" if st.subagent_of else "main",
        prefix_identity=_prefix_identity(st, model),
    )


def _prefix_identity(st: _State, model: str) -> dict[str, str]:
    """What the unlogged system prompt and tools are built from, as the transcript says it: the working directory
    and the model (pi logs no client version; "pi-format": pi, oh-my-pi and OpenClaw write it); a sub-agent's
    differs from its parent's."""
    identity = {"client": "pi-format", "model": model, "kind": "subagent" if st.subagent_of else "main"}
    if st.cwd is not None:
        identity["cwd"] = st.cwd
    return identity


def _model_usage(st: _State, entry: _Entry) -> ImportedRequest | SkippedLine:
    """An oh-my-pi ``model_usage`` entry: an LLM call outside the transcript (its prompt is not logged)."""
    obj, file, line = entry.obj, st.file, entry.line
    purpose = str(obj.get("purpose") or "")
    if "subagent" in purpose or purpose == "task":
        return SkippedLine(file, line, f"model_usage roll-up of a sub-agent (purpose {purpose!r}): counted in the "
                                       "sub-agent's own session file")
    stub = _zero_stub(obj)
    if stub:
        return SkippedLine(file, line, stub)
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        return SkippedLine(file, line, "model_usage entry without a model")
    try:
        at = parse_timestamp(obj.get("timestamp"))
        usage = pi_usage(obj.get("usage"), api=obj.get("api"), at=at, where="model_usage.usage")
    except (ValueError, PromptCacheError) as exc:
        return SkippedLine(file, line, str(exc))
    session = st.session or file
    return ImportedRequest(
        session_key=f"{session}/{purpose or 'model_usage'}", dedupe_key=f"{session}:{entry.id}", at=at,
        body={"model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": f"(prompt not logged: oh-my-pi {purpose or 'model_usage'} call)"}]}]},
        usage=usage, model=model, source_ref=f"{file}:{line}",
        dialect="anthropic", partial=True, parent_key=session, session_kind="subagent",
        provider=provider_of(obj.get("api"), obj.get("provider")),
    )
