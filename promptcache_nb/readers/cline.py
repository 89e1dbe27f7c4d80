"""Reader for Cline and Roo Code tasks (format ``cline``; ``../shared/reference/agent_log_formats.md`` §7).

Two stores:

* **``ui_messages.json``** (Cline 2024 to May 2026, ``<globalStorage>/saoudrizwan.claude-dev/tasks/<taskId>/`` or
  ``~/.cline/data/tasks/<taskId>/``; Roo Code, ``<globalStorage>/rooveterinaryinc.roo-cline/tasks/<taskId>/``): a
  JSON array of UI messages. **One request per ``say: "api_req_started"``** whose ``text`` (a JSON string) holds
  ``tokensIn``, ``tokensOut``, ``cacheWrites``, ``cacheReads``, ``cost``. Its ``ts`` is taken when the placeholder
  is created, just before the call: the request start.
* **Cline's SDK sessions** (May 2026 on, ``~/.cline/data/sessions/<id>/<id>.messages.json``): ``{version,
  messages}``; one request per assistant message with ``metrics`` (``inputTokens`` inclusive of the cache
  figures). Sub-agents write ``<rootSessionId>/<agentId>.messages.json``: the folder is their parent.

**What ``tokensIn`` means** depends on who wrote it:

* Roo Code (its placeholders carry ``apiProtocol``): since 2025-10-31 (#8954) ``tokensIn`` is the total input,
  cache reads and writes included. A file is read as inclusive when every request with cache figures has
  ``tokensIn ≥ cacheReads + cacheWrites``, and as uncached (the older Anthropic-protocol files) otherwise.
* Cline: Anthropic-style handlers (``anthropic``, ``bedrock``, ``vertex``, ``openrouter``, ``cline``...) log the
  uncached input; OpenAI-compatible ones (``openai``, ``openai-native``, ``deepseek``, ``ollama``, ``lmstudio``...)
  log ``prompt_tokens``, which includes the cached tokens. Without ``modelInfo`` (older files) the same rule as
  Roo's decides.

Either way uncached input = ``tokensIn`` (uncached) or ``tokensIn − cacheReads − cacheWrites`` (inclusive); a
negative result skips that request. A write has no 5m/1h split (priced at the 5-minute rate, with a note).

**Not requests**, listed in ``skipped`` with why: placeholders without usage (failed or cancelled calls),
``subagent_usage`` (an aggregate of the sub-agents' calls: counting it as one request would count their usage
twice over, and per call it is not known), ``deleted_api_reqs`` (the aggregate of requests deleted by a
checkpoint restore) and Roo's ``condense_context`` (a condensation call's cost, without tokens).

**Bodies** (Anthropic-shaped, ``partial``: no system prompt, no tools) come from ``api_conversation_history.json``
beside ``ui_messages.json`` when it is there: the request's ``conversationHistoryIndex`` is the last history
message before the call, so the body is the history through the next (user) message, less Cline's context
truncation (``conversationHistoryDeletedRange``). Without that file the body holds no messages. **Model**:
``modelInfo.modelId``, else the latest ``task_metadata.json`` ``model_usage`` entry before the request.
**Sessions**: the task id (the task folder's name: the id Cline and Roo give the task and list in their task
history), else the first message's ``ts``. Dedupe key: ``<task>/<ts>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import PromptCacheError
from ._counts import as_object, count_problem, imported_usage
from ._jsonl import read_log_bytes
from ._messages import content_blocks
from ._types import ImportedRequest, Record, SessionKind, SkippedLine
from .opencode import provider_of

__all__ = ["ClineReader"]

_TASK_ID = re.compile(r"^(\d{10,16}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.I)
_UNCACHED_PROVIDERS = frozenset({"anthropic", "bedrock", "vertex", "openrouter", "cline", "claude-code", "requesty",
                                 "litellm", "sapaicore", "vercel-ai-gateway"})
_INCLUSIVE_PROVIDERS = frozenset({"openai", "openai-native", "deepseek", "ollama", "lmstudio", "gemini", "xai",
                                  "mistral", "qwen", "doubao", "together", "fireworks", "groq", "cerebras"})
_COMPANION_HISTORY = re.compile(r'^\[\s*\{\s*"role"\s*:\s*"(user|assistant)"')
_SDK_ID = re.compile(r"^[A-Za-z0-9_.-]{6,}$")
_CONDENSED = frozenset({"condense_context", "condense", "summarize_task"})
_COUNTS = ("tokensIn", "tokensOut", "cacheWrites", "cacheReads")
_AGGREGATES = {
    "subagent_usage": "an aggregate of the sub-agents' usage, not one request (counting it as one would count "
                      "their calls twice; per call it is not logged)",
    "deleted_api_reqs": "the aggregate of requests deleted by a checkpoint restore, not one request",
    "condense_context": "a context condensation's cost, logged without tokens",
}


class ClineReader:
    """Reads Cline's and Roo Code's ``ui_messages.json`` and Cline's SDK ``*.messages.json`` (``cline``)."""

    name = "cline"

    def sniff(self, path: Path, head: str) -> bool:
        start = head.lstrip()[:4096]
        if start.startswith("["):
            if '"say"' in start and '"ts"' in start and '"type"' in start:
                return True
            return _COMPANION_HISTORY.match(start) is not None  # api_conversation_history.json
        if start.startswith("{"):
            if '"messages"' in start and '"version"' in start and ('"metrics"' in head or '"modelInfo"' in head):
                return True
            return _companion(start) is not None
        return False

    def read(self, path: Path) -> Iterator[Record]:
        file = str(path)
        try:
            doc = json.loads(read_log_bytes(path))
        except (ValueError, RecursionError) as exc:
            yield SkippedLine(file, 0, f"not valid JSON ({str(exc)[:120]})")
            return
        if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "role" in doc[0] and "ts" not in doc[0]:
            yield from _through_ui_messages(path, "api_conversation_history.json")
        elif isinstance(doc, dict) and _companion(read_log_bytes(path, 4096).decode("utf-8", "replace")):
            yield from _through_ui_messages(path, _companion(json.dumps(doc)[:4096]) or "")
        elif isinstance(doc, list):
            yield from _ui_messages(path, doc)
        elif isinstance(doc, dict) and isinstance(doc.get("messages"), list):
            yield from _sdk_messages(path, doc)
        else:
            yield SkippedLine(file, 0, "not a Cline task: neither a ui_messages array nor {version, messages}")


def _companion(start: str) -> str | None:
    """The companion file ``start`` (a file's first bytes) is, or None."""
    if '"model_usage"' in start or '"files_in_context"' in start:
        return "task_metadata.json"
    if '"messages_path"' in start and '"session_id"' in start:
        return "the SDK session manifest"
    return None


def _through_ui_messages(path: Path, what: str) -> Iterator[SkippedLine]:
    """A task's companion file: read with its usage source, or listed when that source is not there."""
    if what == "the SDK session manifest":
        if any(path.parent.glob("*.messages.json")):
            return
        yield SkippedLine(str(path), 0, "a Cline session manifest without its .messages.json beside it")
        return
    if (path.parent / "ui_messages.json").is_file():
        return  # its ui_messages.json reads it
    yield SkippedLine(str(path), 0, f"a Cline/Roo {what}: the usage is in ui_messages.json beside it, which is "
                                    "missing")


def _load_beside(path: Path, name: str) -> Any:
    other = path.with_name(name)
    if not other.is_file():
        return None
    try:
        return json.loads(other.read_bytes())
    except (ValueError, RecursionError, OSError):
        return None


def _ui_messages(path: Path, msgs: list[Any]) -> Iterator[ImportedRequest | SkippedLine]:
    file = str(path)
    first_ts = next((m["ts"] for m in msgs if isinstance(m, dict) and isinstance(m.get("ts"), int)), None)
    task = path.parent.name if _TASK_ID.match(path.parent.name) else f"task-{first_ts}"
    history = _load_beside(path, "api_conversation_history.json")
    history = history if isinstance(history, list) else None
    metadata = _load_beside(path, "task_metadata.json")
    model_usage = [u for u in (metadata or {}).get("model_usage") or [] if isinstance(u, dict)] \
        if isinstance(metadata, dict) else []
    found: list[tuple[int, dict[str, Any], dict[str, Any], tuple[str, ...]]] = []
    roo = False
    events: list[str] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            continue
        if m.get("say") in _CONDENSED or m.get("ask") in _CONDENSED:
            events.append("compaction")  # the next request sends the condensed context
        if m.get("type") != "say":
            continue
        say = m.get("say")
        if say in _AGGREGATES:
            yield SkippedLine(file, i + 1, f"[{i}] {say}: {_AGGREGATES[say]}")
            continue
        if say != "api_req_started":
            continue
        try:
            info = json.loads(m.get("text") or "")
        except (ValueError, TypeError):
            yield SkippedLine(file, i + 1, f"[{i}] api_req_started: text is not JSON")
            continue
        if not isinstance(info, dict):
            yield SkippedLine(file, i + 1, f"[{i}] api_req_started: text is not a JSON object")
            continue
        roo = roo or "apiProtocol" in info
        if not any(isinstance(info.get(k), int) for k in ("tokensIn", "tokensOut")):
            why = info.get("cancelReason") or info.get("streamingFailedMessage") or "no usage"
            yield SkippedLine(file, i + 1, f"[{i}] api_req_started without usage ({str(why)[:80]}): a failed or "
                                           "cancelled request")
            continue
        problem = count_problem(info, _COUNTS, f"[{i}] api_req_started")
        if problem is None and not isinstance(m.get("ts"), int):
            problem = f"[{i}] api_req_started: ts missing"
        if problem:
            yield SkippedLine(file, i + 1, problem)
            continue
        found.append((i, m, info, tuple(events)))
        events.clear()
    cached = [info for _, _, info, _ in found if (info.get("cacheReads") or 0) + (info.get("cacheWrites") or 0)]
    inclusive_by_shape = bool(cached) and all(
        (x.get("tokensIn") or 0) >= (x.get("cacheReads") or 0) + (x.get("cacheWrites") or 0) for x in cached)
    seen: dict[str, int] = {}
    for i, m, info, before in found:
        model_info = as_object(m.get("modelInfo"))
        provider_id = model_info.get("providerId") if isinstance(model_info.get("providerId"), str) else None
        model = model_info.get("modelId") if isinstance(model_info.get("modelId"), str) else None
        if model is None:
            earlier = [u for u in model_usage if isinstance(u.get("ts"), int) and u["ts"] <= m["ts"]]
            if earlier:
                model = str(earlier[-1].get("model_id") or "") or None
                provider_id = provider_id or earlier[-1].get("model_provider_id")
        model = model or "unknown"
        if roo:
            inclusive = info.get("apiProtocol") == "openai" or inclusive_by_shape
        elif provider_id in _INCLUSIVE_PROVIDERS:
            inclusive = True
        elif provider_id in _UNCACHED_PROVIDERS:
            inclusive = False
        else:
            inclusive = inclusive_by_shape
        read, write = info.get("cacheReads") or 0, info.get("cacheWrites") or 0
        tokens_in = info.get("tokensIn") or 0
        uncached = tokens_in - read - write if inclusive else tokens_in
        if uncached < 0:
            yield SkippedLine(file, i + 1, f"[{i}] api_req_started: tokensIn ({tokens_in}) is below cacheReads + "
                                           f"cacheWrites ({read + write}) in a file read as inclusive")
            continue
        try:
            usage = imported_usage(uncached=uncached, read=read, write=write, output=info.get("tokensOut"),
                                   raw={k: info[k] for k in (*_COUNTS, "cost", "apiProtocol") if k in info})
        except (ValueError, PromptCacheError) as exc:
            yield SkippedLine(file, i + 1, f"[{i}] {exc}")
            continue
        key = f"{task}/{m['ts']}"
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            key += f"#{seen[key]}"  # two requests in the same millisecond stay two
        yield ImportedRequest(
            session_key=task, dedupe_key=key, at=datetime.fromtimestamp(m["ts"] / 1000, UTC),
            body={"model": model, "messages": _body(history, m)}, usage=usage, model=model,
            source_ref=f"{file}#[{i}]", dialect="anthropic", partial=True, events=before,
            provider=_provider(provider_id, model, info))


def _provider(provider_id: str | None, model: str, info: dict[str, Any]) -> str:
    """The cache model's provider: from the provider id or model, else Roo's ``apiProtocol``."""
    if provider_id is None and model == "unknown" and info.get("apiProtocol") in ("anthropic", "openai"):
        return str(info["apiProtocol"])
    return provider_of(provider_id, model)


def _body(history: list[Any] | None, m: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages sent for the request ``m`` (see "Bodies" in the module docstring)."""
    idx = m.get("conversationHistoryIndex")
    if history is None or not isinstance(idx, int):
        return []
    end = idx + 2 if idx + 1 < len(history) and _role(history[idx + 1]) == "user" else idx + 1
    sent = [h for h in history[:max(end, 0)] if isinstance(h, dict)]
    deleted = m.get("conversationHistoryDeletedRange")
    if isinstance(deleted, list) and len(deleted) == 2 and all(isinstance(x, int) for x in deleted):
        sent = sent[:deleted[0]] + sent[deleted[1] + 1:]
    return [{"role": h.get("role"), "content": content_blocks(h.get("content"))} for h in sent]


def _role(h: Any) -> Any:
    return h.get("role") if isinstance(h, dict) else None




def _sdk_messages(path: Path, doc: dict[str, Any]) -> Iterator[ImportedRequest | SkippedLine]:
    file = str(path)
    msgs = doc["messages"]
    stem = path.name.removesuffix(".messages.json")
    folder = path.parent.name
    kind: SessionKind = "main"
    parent: str | None = None
    if folder not in (stem, "sessions") and _SDK_ID.match(folder):
        # <rootSessionId>/<agentId>.messages.json: a sub-agent of the session the folder is named after
        session, parent, kind = f"{folder}/{stem}", folder, "subagent"
    else:
        session = next((m["sessionId"] for m in msgs if isinstance(m, dict) and isinstance(m.get("sessionId"), str)),
                       stem)
    sent: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            yield SkippedLine(file, i + 1, f"messages[{i}]: not an object")
            continue
        metrics = m.get("metrics")
        if m.get("role") == "assistant" and isinstance(metrics, dict):
            problem = count_problem(metrics, ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens"),
                                    f"messages[{i}].metrics")
            read, write = metrics.get("cacheReadTokens") or 0, metrics.get("cacheWriteTokens") or 0
            total = metrics.get("inputTokens")
            if problem is None and not isinstance(total, int):
                problem = f"messages[{i}].metrics.inputTokens: missing"
            elif problem is None and isinstance(total, int) and total < read + write:
                problem = (f"messages[{i}].metrics.inputTokens ({total}) is below cacheReadTokens + "
                           f"cacheWriteTokens ({read + write}); it includes them")
            if problem is None and not isinstance(m.get("ts"), int):
                problem = f"messages[{i}].ts: missing"
            if problem or not isinstance(total, int):
                yield SkippedLine(file, i + 1, problem or f"messages[{i}].metrics.inputTokens: missing")
            else:
                info = as_object(m.get("modelInfo"))
                model = str(info.get("id") or "unknown")
                try:
                    usage = imported_usage(uncached=total - read - write, read=read, write=write,
                                           output=metrics.get("outputTokens"), raw=dict(metrics))
                except (ValueError, PromptCacheError) as exc:
                    yield SkippedLine(file, i + 1, f"messages[{i}]: {exc}")
                else:
                    yield ImportedRequest(
                        session_key=session, dedupe_key=f"{session}/{m.get('id') or m['ts']}",
                        at=datetime.fromtimestamp(m["ts"] / 1000, UTC),
                        body={"model": model, "messages": [dict(x) for x in sent]}, usage=usage, model=model,
                        source_ref=f"{file}#messages[{i}]", dialect="anthropic", partial=True, parent_key=parent,
                        session_kind=kind, request_id=m.get("id") if isinstance(m.get("id"), str) else None,
                        provider=provider_of(info.get("provider") if isinstance(info.get("provider"), str)
                                             else None, model))
        if m.get("role") in ("user", "assistant"):
            sent.append({"role": m["role"], "content": content_blocks(m.get("content"))})
