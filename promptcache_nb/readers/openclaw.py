"""Reader for OpenClaw's logs (format ``openclaw``): transcripts, the cache trace and the Anthropic payload log.

* **Transcripts** (``~/.openclaw/agents/<agent>/sessions/<sessionId>.jsonl``, and rotated ``.reset.*`` files) are
  pi session files (:mod:`.pi`'s rules) plus OpenClaw's entries: ``delivery-mirror`` assistant entries
  (provider ``openclaw``, zero usage) mirror a message delivered to a chat channel and are no API call;
  ``openclaw.*`` / ``model-snapshot`` custom entries are bookkeeping. ``responseId`` is not unique, so a request
  is identified by its session and its request time (``<sessionId>@<message.timestamp>``): the same key the cache
  trace gives the same request, so importing both stores it once.
* **The cache trace** (``logs/cache-trace.jsonl``, ``OPENCLAW_CACHE_TRACE=1``; ``agent_log_formats.md`` §2.3):
  one ``stream:context`` event per provider call holds the system prompt and the pi-format messages sent (no
  tools: bodies are ``partial``); the run's ``session:after`` event holds the messages after the run, whose last
  assistant messages carry each call's usage, paired with the run's calls in order. OpenClaw's own cache-break
  observation (``cache:result``, once per run) is kept with the run's last call: ``agent_observation`` in the
  request's stored ``cache_detail`` (see :func:`~promptcache_nb.analysis.openclaw_crosscheck`). The trace's
  ``options`` (which held an ``apiKey`` in older versions) are never read.
* **The Anthropic payload log** (``logs/anthropic-payload.jsonl``, ``OPENCLAW_ANTHROPIC_PAYLOAD_LOG=1``, §2.4):
  ``request`` records hold the exact Messages body of every call; the ``usage`` record is written once per run
  (the run's last call). Each call's usage comes from the cache trace beside it (``cache-trace.jsonl`` in the same
  folder), else from the session's transcript (``../agents/*/sessions/<sessionId>.jsonl``: the assistant message
  whose request time is within 5 s of the record's), so the call keeps the transcript's key and is stored once;
  otherwise only the run's last call has usage and the others are skipped with the reason. The run's ``usage``
  record is never counted a second time.

* **The SQLite era** (``openclaw-agent.sqlite`` ``transcript_events``, ``openclaw.sqlite`` ``diagnostic_events``,
  §2.2): the same JSON in rows, read through the stdlib ``sqlite3`` opened read-only (``mode=ro``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import PromptCacheError
from ._history import HistoryDecoder
from ._jsonl import JsonLine, iter_json_lines, json_objects_in_head, parse_timestamp
from ._messages import append_message
from ._stream import ParsedLines
from ._types import ImportedRequest, ReadProgress, Record, SkippedLine
from .pi import is_openclaw, pi_blocks, pi_messages_to_anthropic, pi_usage, provider_of, read_transcript, sniff_pi

__all__ = ["OpenClawReader"]

TRACE_STAGES = frozenset({"session:loaded", "session:sanitized", "session:limited", "prompt:before", "prompt:images",
                          "stream:context", "session:after", "cache:state", "cache:result", "session:raw-model-run",
                          "sol:turn-probe"})
PAYLOAD_STAGES = frozenset({"request", "usage"})
TRACE_FILE = "cache-trace.jsonl"
SQLITE_MAGIC = "SQLite format 3\x00"
#: the DB era's tables (agent_log_formats.md §2.2): transcripts per agent, diagnostics in the global database
SQLITE_TABLES = ("transcript_events", "diagnostic_events")


def _kind(obj: dict[str, Any]) -> str | None:
    """``trace`` or ``payload`` for a line of OpenClaw's diagnostics, else None."""
    if not isinstance(obj.get("ts"), str):
        return None
    stage = obj.get("stage")
    if stage in TRACE_STAGES and "seq" in obj:
        return "trace"
    if stage in PAYLOAD_STAGES and ("payload" in obj or "usage" in obj) and "runId" in obj:
        return "payload"
    return None


class OpenClawReader:
    """Reads OpenClaw transcripts, cache traces and Anthropic payload logs (``openclaw``)."""

    name = "openclaw"

    def sniff(self, path: Path, head: str) -> bool:
        if head.startswith(SQLITE_MAGIC):
            return any(t in head for t in SQLITE_TABLES)
        if any(_kind(o) for o in json_objects_in_head(head)):
            return True
        return sniff_pi(head) and is_openclaw(head)

    def read(self, path: Path) -> Iterator[Record]:
        if _is_sqlite(path):
            yield from _read_sqlite(path)
            return
        first = next((r for r in iter_json_lines(path) if isinstance(r, JsonLine)), None)
        kind = _kind(first.obj) if first is not None else None
        if kind == "trace":
            yield from _read_trace(path)
        elif kind == "payload":
            yield from _read_payload(path)
        else:
            yield from read_transcript(path, dedupe=_transcript_key)


def _transcript_key(session: str, entry_id: str, message: dict[str, Any]) -> str:
    ms = message.get("timestamp")
    return f"{session}@{ms}" if isinstance(ms, int) and not isinstance(ms, bool) else f"{session}:{entry_id}"


# -- the cache trace -----------------------------------------------------------------------------------------
@dataclass
class _Run:
    run_id: str
    session: str
    calls: list[JsonLine] = field(default_factory=list)
    after: JsonLine | None = None
    result: JsonLine | None = None
    requests: list[JsonLine] = field(default_factory=list)  # payload log
    usage: JsonLine | None = None  # payload log


def _runs(path: Path, kind: str, records: Iterable[JsonLine | SkippedLine | ReadProgress] | None = None
          ) -> Iterator[_Run | SkippedLine | ReadProgress]:
    """The runs of a diagnostics file, in order of their first line (yielded at the end), and bad lines."""
    if records is None:
        # each event repeats the run's history: the items equal to the previous event's are not parsed again
        decoder = HistoryDecoder(("payload",) if kind == "payload" else (), keys=("messages",))
        records = iter_json_lines(path, decoder.loads)
    lines = ParsedLines(records)
    return lines.around(_runs_of(path, kind, lines))


def _runs_of(path: Path, kind: str, lines: ParsedLines) -> Iterator[_Run | SkippedLine]:
    file = str(path)
    runs: dict[str, _Run] = {}
    for rec in lines:
        obj = rec.obj
        if _kind(obj) != kind:
            yield SkippedLine(file, rec.line, f"not an OpenClaw {'cache trace' if kind == 'trace' else 'payload log'} "
                                              f"event (stage {obj.get('stage')!r:.40})")
            continue
        run_id = obj.get("runId")
        session = obj.get("sessionId") or obj.get("sessionKey")
        if not isinstance(run_id, str) or not isinstance(session, str):
            yield SkippedLine(file, rec.line, "event without runId or sessionId: cannot be paired with its run")
            continue
        run = runs.setdefault(run_id, _Run(run_id, session))
        stage = obj["stage"]
        if stage == "stream:context":
            run.calls.append(rec)
        elif stage == "session:after":
            run.after = rec
        elif stage == "cache:result":
            run.result = rec
        elif stage == "request":
            run.requests.append(rec)
        elif stage == "usage":
            run.usage = rec
    yield from runs.values()


def _answers(after: JsonLine | None, n: int) -> list[dict[str, Any]] | None:
    """The last ``n`` assistant messages of a run's ``session:after`` (one per call, in order), or None."""
    if after is None or not isinstance(after.obj.get("messages"), list):
        return None
    found = [m for m in after.obj["messages"] if isinstance(m, dict) and m.get("role") == "assistant"
             and m.get("provider") != "openclaw"]
    return found[-n:] if len(found) >= n else None


def _observation(result: JsonLine | None, file: str) -> dict[str, Any] | None:
    """OpenClaw's ``cache:result`` as stored beside our observation."""
    if result is None:
        return None
    raw_opts = result.obj.get("options")
    opts: dict[str, Any] = raw_opts if isinstance(raw_opts, dict) else {}
    raw_changes = opts.get("changes")
    changes: list[Any] = raw_changes if isinstance(raw_changes, list) else []
    prev = opts.get("previousCacheRead")
    return {
        "source": "openclaw cache:result", "ref": f"{file}:{result.line}",
        "broke": isinstance(prev, int | float) and not isinstance(prev, bool),
        "previous_cache_read": prev if isinstance(prev, int | float) else None,
        "cache_read": opts.get("cacheRead") if isinstance(opts.get("cacheRead"), int | float) else None,
        "changes": [{"code": str(c.get("code")), "detail": str(c.get("detail", ""))}
                    for c in changes if isinstance(c, dict)],
        "note": result.obj.get("note") if isinstance(result.obj.get("note"), str) else None,
    }


def _read_trace(path: Path, records: Iterable[JsonLine | SkippedLine | ReadProgress] | None = None
                ) -> Iterator[Record]:
    file = str(path)
    memo: dict[int, tuple[Any, list[dict[str, Any]]]] = {}
    for run in _runs(path, "trace", records):
        if not isinstance(run, _Run):
            yield run
            continue
        answers = _answers(run.after, len(run.calls))
        observation = _observation(run.result, file)
        for k, call in enumerate(run.calls):
            if answers is None:
                yield SkippedLine(file, call.line, f"run {run.run_id}: no usage for this call (its session:after "
                                                   "stage is missing or holds no messages)")
                continue
            obs = observation if k == len(run.calls) - 1 else None
            yield _call(file, run, call.line, call.obj, _trace_body(call.obj, memo), answers[k], k, partial=True,
                        observation=obs)


def _trace_body(event: dict[str, Any], memo: dict[int, tuple[Any, list[dict[str, Any]]]]) -> dict[str, Any]:
    """The Anthropic body of a ``stream:context`` event; ``memo`` holds each pi message converted once (by
    identity: the history decoder hands back the previous event's objects)."""
    raw_model = event.get("model")
    model: dict[str, Any] = raw_model if isinstance(raw_model, dict) else {}
    body: dict[str, Any] = {"model": str(model.get("id") or event.get("modelId") or "")}
    system = event.get("system")
    if isinstance(system, str) and system:
        body["system"] = [{"type": "text", "text": system}]
    elif isinstance(system, list):
        body["system"] = pi_blocks(system)
    messages: list[dict[str, Any]] = []
    raw = event.get("messages")
    for m in raw if isinstance(raw, list) else []:
        held = memo.get(id(m))
        if held is None or held[0] is not m:
            held = memo[id(m)] = (m, pi_messages_to_anthropic([m]))
        for turn in held[1]:
            append_message(messages, turn["role"], turn["content"])
    body["messages"] = messages
    return body


def _call(file: str, run: _Run, line: int, event: dict[str, Any], body: dict[str, Any], answer: dict[str, Any],
          k: int, *, partial: bool, observation: dict[str, Any] | None) -> ImportedRequest | SkippedLine:
    """One provider call of a run, with the usage of the assistant message that answered it."""
    stop = answer.get("stopReason")
    usage_raw = answer.get("usage")
    if stop in ("error", "aborted") and not (isinstance(usage_raw, dict) and any(
            isinstance(usage_raw.get(x), int) and usage_raw.get(x) for x in ("input", "output", "cacheRead",
                                                                            "cacheWrite"))):
        return SkippedLine(file, line, f"stopReason {stop!r} with zero usage: not a billed request")
    model = body.get("model") or answer.get("model")
    if not isinstance(model, str) or not model:
        return SkippedLine(file, line, f"run {run.run_id}: call without a model id")
    ms = answer.get("timestamp")
    try:
        if isinstance(ms, int | float) and not isinstance(ms, bool) and 0 < ms < 1e14:
            at = datetime.fromtimestamp(ms / 1000, UTC)
        else:
            at = parse_timestamp(event.get("ts"))
        api = answer.get("api") or event.get("modelApi")
        usage = pi_usage(usage_raw, api=api if isinstance(api, str) else None, at=at, where="usage")
    except (ValueError, PromptCacheError) as exc:
        return SkippedLine(file, line, str(exc))
    timed = isinstance(ms, int) and not isinstance(ms, bool)
    key = f"{run.session}@{ms}" if timed else f"{run.session}@{run.run_id}#{k}"
    return ImportedRequest(
        session_key=run.session, dedupe_key=key, at=at, body={**body, "model": model}, usage=usage, model=model,
        source_ref=f"{file}:{line}", dialect="anthropic", partial=partial,
        reply=pi_blocks(answer.get("content")), provider=provider_of(answer.get("api") or event.get("modelApi"),
                                                                     answer.get("provider") or event.get("provider")),
        agent_observation=observation,
    )


# -- the payload log -------------------------------------------------------------------------------------------
def _trace_answers(trace: Path, records: Iterable[JsonLine | SkippedLine | ReadProgress] | None = None
                   ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """From the cache trace beside a payload log: per run, the assistant messages of its calls and OpenClaw's
    observation."""
    answers: dict[str, list[dict[str, Any]]] = {}
    observations: dict[str, dict[str, Any]] = {}
    if records is None and not trace.is_file():
        return answers, observations
    for run in _runs(trace, "trace", records):
        if isinstance(run, _Run):
            found = _answers(run.after, len(run.calls))
            if found is not None:
                answers[run.run_id] = found
            obs = _observation(run.result, str(trace))
            if obs is not None:
                observations[run.run_id] = obs
    return answers, observations


def _read_payload(path: Path, records: Iterable[JsonLine | SkippedLine | ReadProgress] | None = None,
                  trace: Iterable[JsonLine | SkippedLine | ReadProgress] | None = None) -> Iterator[Record]:
    file = str(path)
    answers, observations = _trace_answers(path if trace is not None else path.parent / TRACE_FILE, trace)
    transcripts: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for run in _runs(path, "payload", records):
        if not isinstance(run, _Run):
            yield run
            continue
        n = len(run.requests)
        paired = answers.get(run.run_id)
        if paired is None or len(paired) != n:
            paired = _from_transcript(path, run, transcripts)
        if paired is None:
            # the run's one usage record is its last call's
            last = run.usage.obj.get("usage") if run.usage is not None else None
            paired = [{} for _ in range(n - 1)] + ([{"usage": last}] if isinstance(last, dict) else [{}])
        for k, rec in enumerate(run.requests):
            answer = paired[k]
            if not answer.get("usage"):
                yield SkippedLine(file, rec.line, f"run {run.run_id}: the payload log writes usage once per run (for "
                                                  "its last call); import it beside its cache-trace.jsonl, or the "
                                                  "transcript, for this call's usage")
                continue
            payload = rec.obj.get("payload")
            if not isinstance(payload, dict):
                yield SkippedLine(file, rec.line, "request record without a payload object")
                continue
            answer = {"api": rec.obj.get("modelApi"), "provider": rec.obj.get("provider"), **answer}
            obs = observations.get(run.run_id) if k == n - 1 else None
            yield _call(file, run, rec.line, rec.obj, dict(payload), answer, k, partial=False, observation=obs)


#: a payload record and the transcript's assistant message of the same call are both stamped just before the HTTP
#: call: this far apart at most (ms)
PAIRING_MS = 5_000


def _from_transcript(path: Path, run: _Run, cache: dict[str, list[tuple[int, dict[str, Any]]]]
                     ) -> list[dict[str, Any]] | None:
    """Each call's assistant message from the session's transcript (``<state>/agents/*/sessions/<sessionId>.jsonl``
    beside ``<state>/logs/``), matched by request time; None unless every call of the run finds one."""
    if run.session not in cache:
        found: list[tuple[int, dict[str, Any]]] = []
        state = path.parent.parent
        for f in sorted(state.glob(f"agents/*/sessions/{run.session}.jsonl*")) if "/" not in run.session else []:
            for rec in iter_json_lines(f):
                m = rec.obj.get("message") if isinstance(rec, JsonLine) else None
                if (isinstance(m, dict) and m.get("role") == "assistant" and m.get("provider") != "openclaw"
                        and isinstance(m.get("timestamp"), int)):
                    found.append((m["timestamp"], m))
        cache[run.session] = sorted(found, key=lambda x: x[0])
    messages = cache[run.session]
    out: list[dict[str, Any]] = []
    for rec in run.requests:
        try:
            at = int(parse_timestamp(rec.obj.get("ts")).timestamp() * 1000)
        except ValueError:
            return None
        near = min(messages, key=lambda x: abs(x[0] - at), default=None)
        if near is None or abs(near[0] - at) > PAIRING_MS or any(o is near[1] for o in out):
            return None
        out.append(near[1])
    return out


# -- the SQLite era --------------------------------------------------------------------------------------------
def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == SQLITE_MAGIC.encode()
    except OSError:
        return False


def _read_sqlite(path: Path) -> Iterator[Record]:
    """OpenClaw's databases: ``transcript_events`` rows hold transcript entries, ``diagnostic_events`` rows the
    cache trace (scope ``diagnostics.cache_trace``) and payload log (``diagnostics.anthropic_payload``) events,
    each the same JSON as a line of the file era. The database is opened read-only; a row's ``rowid`` is its
    line in ``source_ref``."""
    file = str(path)
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        yield SkippedLine(file, 0, f"cannot open the SQLite database read-only ({exc})")
        return
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "transcript_events" in tables:
            sessions: dict[str, list[JsonLine | SkippedLine | ReadProgress]] = {}
            for rowid, session, text in con.execute(
                    "SELECT rowid, session_id, event_json FROM transcript_events ORDER BY session_id, seq"):
                sessions.setdefault(str(session), []).append(_row(file, rowid, text))
            for rows in sessions.values():
                yield from read_transcript(path, dedupe=_transcript_key, records=[*rows, ReadProgress(file, 0)])
        if "diagnostic_events" in tables:
            by_scope: dict[str, list[JsonLine | SkippedLine | ReadProgress]] = {}
            for rowid, scope, text in con.execute(
                    "SELECT rowid, scope, payload_json FROM diagnostic_events WHERE scope IN "
                    "('diagnostics.cache_trace', 'diagnostics.anthropic_payload') ORDER BY created_at, rowid"):
                by_scope.setdefault(str(scope), []).append(_row(file, rowid, text))
            trace = by_scope.get("diagnostics.cache_trace", [])
            payload = by_scope.get("diagnostics.anthropic_payload", [])
            if payload:  # a call in both is stored once, with the payload's whole body (the ingest's dedupe)
                yield from _read_payload(path, payload, trace)
            if trace:
                yield from _read_trace(path, trace)
    except sqlite3.Error as exc:
        yield SkippedLine(file, 0, f"not readable as OpenClaw's database ({exc})")
    finally:
        con.close()


def _row(file: str, rowid: int, text: Any) -> JsonLine | SkippedLine:
    try:
        obj = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        return SkippedLine(file, rowid, f"row {rowid}: not valid JSON ({str(exc)[:80]})")
    if not isinstance(obj, dict):
        return SkippedLine(file, rowid, f"row {rowid}: a JSON {type(obj).__name__}, not an object")
    return JsonLine(rowid, obj)
