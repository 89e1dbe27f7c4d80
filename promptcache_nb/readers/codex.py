"""Reader for Codex CLI rollouts: ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl`` (format ``codex``).

Each line is ``{"timestamp", "type", "payload"}`` with ``type`` one of ``session_meta`` (session id,
``base_instructions``, ``model_provider``...), ``turn_context`` (per turn: ``model``, ``effort``...),
``response_item`` (an OpenAI Responses API item: ``message``, ``reasoning``, ``function_call``,
``function_call_output``, ``custom_tool_call``...), ``event_msg`` (``token_count``, ``user_message``...) and
``compacted`` (the history was replaced). How requests are recovered:

* **One request per** ``event_msg`` **/** ``token_count`` **with usage.** Each is written twice: an event whose
  cumulative ``total_token_usage`` equals the previous one is the duplicate and is dropped. ``token_count``
  events with ``info: null`` (rate-limit updates) are not requests.
* **Usage** is ``last_token_usage`` (this request alone; when absent, the difference of the cumulative totals),
  converted by ``dialects.usage_from_openai``: OpenAI counts cached tokens inside ``input_tokens``, so uncached
  input = input − cached; a cache write is 0 unless the log reports one; ``reasoning_output_tokens`` (part of
  ``output_tokens``) becomes ``reasoning_tokens``; ``raw`` is Codex's payload.
* **Bodies** are Responses-shaped: ``{"model", "instructions", "input"}``. ``input`` is every response item
  logged before the request's own output items (the model-produced ``reasoning`` / assistant ``message`` /
  tool calls written after the previous request's usage), in file order. ``instructions`` is the logged
  ``base_instructions`` (a later ``turn_context`` that carries its own wins). Tool definitions are never
  logged, so bodies are ``partial``; each request's ``prefix_identity`` is the client version, model, working
  directory and session kind (``_prefixes.py`` decides from measured cache reads which sessions shared the tools).
* **Compaction.** A ``compacted`` line replaces the history with its ``replacement_history`` (or, from older
  clients that log only the summary, one user message holding it); the next request carries ``compaction``.
* The model is the latest ``turn_context``'s ``model``.
* **Session** = the first ``session_meta``'s ``id`` (a resumed rollout logs more, a forked one its parent's too),
  never the file's name (only a rollout without any ``session_meta`` falls back on the id in its name). A thread
  spawned by another agent (``source: {"subagent": {"thread_spawn": {"parent_thread_id"}}}``) is a ``subagent``
  session whose ``parent_key`` is that thread's id.
* **Bad values cost one request:** a count that is not a non-negative int, one request's count above
  ``usage.MAX_TOKENS``, or
  cached above input skips that ``token_count`` (``last_token_usage.<field>: <problem>``). A rollout with no
  ``token_count`` usage at all says so (line 0) instead of importing nothing in silence.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from ..dialects import usage_from_openai
from ..errors import PromptCacheError
from ..usage import MAX_TOKENS, Usage
from ._jsonl import iter_json_lines, json_objects_in_head, parse_timestamp
from ._stream import ParsedLines
from ._types import ImportedRequest, Record, SessionKind, SkippedLine

__all__ = ["CodexReader"]

_LINE_TYPES = frozenset({"session_meta", "turn_context", "response_item", "event_msg", "compacted"})
# Items the model produces in a response; everything else in the history is input the client sent.
_OUTPUT_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call", "local_shell_call",
                           "web_search_call", "image_generation_call", "tool_search_call"})
# Items the client keeps in its history but never sends (undo snapshots).
_NOT_SENT = frozenset({"ghost_snapshot"})
_ROLLOUT_ID = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.IGNORECASE)
_USAGE_FIELDS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens",
                 "total_tokens")
_CHECKED_FIELDS = (*_USAGE_FIELDS, "cache_write_input_tokens", "cache_creation_input_tokens")
#: Above this a token count is not one request's (the largest context windows hold a few million tokens).


class CodexReader:
    """Reads Codex CLI rollout files (``codex``); see the module docstring for the rules."""

    name = "codex"

    def sniff(self, path: Path, head: str) -> bool:
        for obj in json_objects_in_head(head):
            if obj.get("type") in _LINE_TYPES and isinstance(obj.get("payload"), dict) and "timestamp" in obj:
                return True
        return False

    def read(self, path: Path) -> Iterator[Record]:
        lines = ParsedLines(iter_json_lines(path))
        return lines.around(self._read(path, lines))

    def _read(self, path: Path, lines: ParsedLines) -> Iterator[Record]:
        file = str(path)
        match = _ROLLOUT_ID.search(path.stem)
        # the session_meta id replaces this; a rollout without one falls back on the id Codex puts in its name
        session_key = match.group(1) if match else file
        kind: SessionKind = "main"
        parent_key: str | None = None
        instructions: str | None = None
        model: str | None = None
        items: list[dict[str, Any]] = []
        outputs_from: int | None = None  # index in ``items`` where the pending response's outputs begin
        first_output_at: datetime | None = None
        last_totals: dict[str, Any] | int | None = None  # an int: the line of a total that was not readable
        last_seen: dict[str, Any] | None = None  # the previous token_count's totals (or whole info, without them)
        events: list[str] = []
        session_seen = False
        usage_seen = False
        setting: dict[str, str] = {}  # the client version and working directory, as the rollout last gave them

        for rec in lines:
            obj = rec.obj
            kind_of_line = obj.get("type")
            payload = obj.get("payload")
            if kind_of_line not in _LINE_TYPES:
                continue  # a line type from a newer client
            if not isinstance(payload, dict):
                yield SkippedLine(file, rec.line, f"{kind_of_line} line without a payload object")
                continue
            if kind_of_line == "session_meta":
                if not session_seen and isinstance(payload.get("id"), str):
                    # a resumed rollout logs more session_meta lines, a forked one its parent's too: keep the first
                    session_key = payload["id"]
                    kind, parent_key = _lineage(payload)
                session_seen = True
                instructions = _text(payload.get("base_instructions")) or instructions
                _note_setting(setting, payload)
            elif kind_of_line == "turn_context":
                if isinstance(payload.get("model"), str):
                    model = payload["model"]
                instructions = _text(payload.get("base_instructions")) or instructions
                _note_setting(setting, payload)
            elif kind_of_line == "response_item":
                item_type = payload.get("type")
                if item_type in _NOT_SENT:
                    continue
                if outputs_from is None and _is_output(payload):
                    outputs_from = len(items)
                    first_output_at = _at(obj)
                items.append(payload)
            elif kind_of_line == "compacted":
                replacement = payload.get("replacement_history")
                if isinstance(replacement, list):
                    items = [i for i in replacement if isinstance(i, dict) and i.get("type") not in _NOT_SENT]
                else:
                    # older clients log only the summary text; the client resends it as a user message
                    summary = payload.get("message") or ""
                    items = [{"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": str(summary)}]}]
                outputs_from, first_output_at = None, None
                events.append("compaction")
            elif kind_of_line == "event_msg" and payload.get("type") == "token_count":
                info = payload.get("info")
                if not isinstance(info, dict):
                    continue  # a rate-limit update, no request behind it
                usage_seen = True
                totals = info.get("total_token_usage")
                seen = totals if isinstance(totals, dict) else info
                if seen == last_seen:
                    continue  # every token_count is written twice; the cumulative totals tell the copy apart
                last_seen = seen
                previous = last_totals
                totals_problem = _counts_problem(totals, "total_token_usage") if isinstance(totals, dict) else None
                if isinstance(totals, dict):
                    last_totals = rec.line if totals_problem else totals
                usage_raw = info.get("last_token_usage")
                where = "last_token_usage"
                if not isinstance(usage_raw, dict) or "input_tokens" not in usage_raw:
                    # old clients log only the cumulative totals: this request is the difference of two
                    where = "total_token_usage (difference from the previous one)"
                    if totals_problem:
                        yield SkippedLine(file, rec.line, totals_problem)
                        continue
                    if isinstance(previous, int):
                        yield SkippedLine(file, rec.line, f"total_token_usage: the previous total (line {previous}) "
                                                          "was not readable, so this request's usage is unknown")
                        continue
                    usage_raw = _delta(totals, previous)
                if usage_raw is None:
                    yield SkippedLine(file, rec.line, "token_count without last_token_usage or total_token_usage")
                    continue
                problem = _counts_problem(usage_raw, where, per_request=True)
                if problem:
                    yield SkippedLine(file, rec.line, problem)
                    continue
                if model is None:
                    yield SkippedLine(file, rec.line, "token_count before any turn_context: the model is unknown")
                    continue
                try:
                    usage = _usage(usage_raw)
                    at = first_output_at or parse_timestamp(obj.get("timestamp"))
                except (ValueError, PromptCacheError) as exc:
                    yield SkippedLine(file, rec.line, f"token_count: {exc}")
                    continue
                cut = len(items) if outputs_from is None else outputs_from
                body: dict[str, Any] = {"model": model}
                if instructions is not None:
                    body["instructions"] = instructions
                body["input"] = items[:cut]
                yield ImportedRequest(
                    session_key=session_key,
                    dedupe_key=f"{session_key}:{rec.line}",
                    at=at,
                    body=body,
                    usage=usage,
                    model=model,
                    source_ref=f"{file}:{rec.line}",
                    dialect="openai-responses",
                    partial=True,  # tool definitions are not in rollouts (nor, in old ones, the instructions)
                    parent_key=parent_key,
                    session_kind=kind,
                    events=tuple(events),
                    reply=[i for i in items[cut:] if _is_output(i)] or None,
                    provider="openai",
                    prefix_identity={"client": self.name, "model": model, "kind": kind, **setting},
                )
                events.clear()
                outputs_from, first_output_at = None, None
        if not usage_seen:
            yield SkippedLine(file, 0, "no token_count usage in this rollout: no request to import (a session that "
                                       "sent none yet, or a client that logs no usage)")


def _note_setting(setting: dict[str, str], payload: dict[str, Any]) -> None:
    """Keep what the unlogged tool definitions are built from: the client version (``session_meta.cli_version``)
    and the working directory (``cwd``, whose project config adds tools)."""
    for key, name in (("cli_version", "version"), ("cwd", "cwd")):
        if isinstance(payload.get(key), str):
            setting[name] = payload[key]


def _lineage(meta: dict[str, Any]) -> tuple[SessionKind, str | None]:
    """(session kind, parent session id) from ``session_meta.source``: a thread spawned by another agent logs
    ``{"subagent": {"thread_spawn": {"parent_thread_id": ...}}}``; ``{"subagent": "compact"}`` is a compaction call,
    other sub-agent sources (``review``...) have no parent in the log."""
    source = meta.get("source")
    sub = source.get("subagent", source.get("sub_agent")) if isinstance(source, dict) else None
    if sub is None:
        return "main", None
    if sub == "compact":
        return "compaction", None
    spawn = sub.get("thread_spawn") if isinstance(sub, dict) else None
    parent = spawn.get("parent_thread_id") if isinstance(spawn, dict) else None
    return "subagent", parent if isinstance(parent, str) and parent else None


def _counts_problem(raw: dict[str, Any], where: str, *, per_request: bool = False) -> str | None:
    """Why a Codex ``TokenUsage`` cannot be stored, naming the field as logged; None when it can.

    Counts must be non-negative ints; one request's (not the cumulative totals, which grow without bound) at most
    ``MAX_TOKENS``, and its cached part no more than its input."""
    for key in _CHECKED_FIELDS:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{where}.{key}: must be a non-negative int, got {value!r:.40}"
        if per_request and value > MAX_TOKENS:
            return f"{where}.{key}: {value} tokens in one request is not plausible (limit {MAX_TOKENS})"
    cached, prompt = raw.get("cached_input_tokens"), raw.get("input_tokens")
    if per_request and cached is not None and prompt is not None and cached > prompt:
        return f"{where}.cached_input_tokens ({cached}) exceeds {where}.input_tokens ({prompt})"
    return None


def _is_output(item: dict[str, Any]) -> bool:
    if item.get("type") == "message":
        return item.get("role") == "assistant"
    return item.get("type") in _OUTPUT_ITEMS


def _at(obj: dict[str, Any]) -> datetime | None:
    """The line's timestamp; None when unreadable (the request then falls back to its token_count line)."""
    try:
        return parse_timestamp(obj.get("timestamp"))
    except ValueError:
        return None


def _text(value: Any) -> str | None:
    """Instructions as logged: a string, or ``{"text": ...}`` in newer clients."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(text := value.get("text"), str):
        return text
    return None


def _delta(totals: Any, previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """This request's usage from two cumulative totals (old clients log no ``last_token_usage``)."""
    if not isinstance(totals, dict) or "input_tokens" not in totals:
        return None
    prev = previous or {}
    return {k: totals[k] - (prev.get(k) or 0) for k in _USAGE_FIELDS if isinstance(totals.get(k), int)}


def _usage(raw: dict[str, Any]) -> Usage:
    """Codex's ``TokenUsage`` → :class:`Usage`, through ``dialects.usage_from_openai`` (one OpenAI arithmetic).

    Codex flattens the Responses usage (``cached_input_tokens``, ``reasoning_output_tokens``); it is put back in
    the API's shape for the conversion, and ``raw`` keeps Codex's own payload.
    """
    details: dict[str, Any] = {}
    if "cached_input_tokens" in raw:
        details["cached_tokens"] = raw["cached_input_tokens"]
    written = raw.get("cache_write_input_tokens", raw.get("cache_creation_input_tokens"))
    if written is not None:
        details["cache_write_tokens"] = written
    shaped: dict[str, Any] = {"input_tokens": raw.get("input_tokens"), "output_tokens": raw.get("output_tokens")}
    if details:
        shaped["input_tokens_details"] = details
    if "reasoning_output_tokens" in raw:
        shaped["output_tokens_details"] = {"reasoning_tokens": raw["reasoning_output_tokens"]}
    return replace(usage_from_openai(shaped, api="responses", source="imported"), raw=dict(raw))
