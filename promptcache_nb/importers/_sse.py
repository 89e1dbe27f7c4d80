"""Server-Sent Events: an incremental parser and the usage summary of a streamed LLM response.

Dependency-free on purpose: the recording proxy feeds the chunks it relays into :class:`SseParser` as they
arrive, and the HTTP readers parse recorded stream bodies with :func:`parse_sse`; both then call
:func:`usage_from_sse` so a streamed call is summarised by one implementation.

The parser follows the WHATWG ``text/event-stream`` rules: lines end with CRLF, LF or CR (even when a chunk
splits a CRLF pair or a UTF-8 character); ``field: value`` drops one space after the colon; ``data`` lines
join with ``\\n``; lines starting with ``:`` are comments; a blank line dispatches the event; a field line with
no colon names a field with an empty value. Unlike a browser, :meth:`SseParser.close` also dispatches a final
event that was not followed by a blank line (recordings cut at the last byte are common).

Example::

    >>> p = SseParser()
    >>> p.feed(b"event: ping\\r\\ndata: {}\\r") + p.feed(b"\\n\\r\\n")
    [SseEvent(event='ping', data='{}', id=None, retry=None)]
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SseEvent", "SseParser", "StreamSummary", "merge_anthropic_stream_usage", "parse_sse", "usage_from_sse"]


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event.

    Attributes:
        event: the ``event:`` field, or None when absent (the spec's default type ``message``).
        data: the ``data:`` lines joined with ``\\n``.
        id: the last ``id:`` seen in the stream (the spec's "last event id"), or None.
        retry: the ``retry:`` reconnection time in ms, when this event set one.
    """

    event: str | None
    data: str
    id: str | None = None
    retry: int | None = None

    def json(self) -> Any:
        """``data`` parsed as JSON (raises ``ValueError`` when it is not JSON, e.g. OpenAI's ``[DONE]``)."""
        return json.loads(self.data)


class SseParser:
    """Incremental ``text/event-stream`` parser: feed ``bytes`` or ``str`` chunks, get complete events back.

    Feed either bytes (decoded as UTF-8, a character split between chunks is fine) or str, not both in one
    stream. Call :meth:`close` at the end of the stream for a last event not followed by a blank line.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._skip_lf = False  # the previous chunk ended with CR: a leading LF belongs to that line break
        self._started = False
        self._event: str | None = None
        self._data: list[str] = []
        self._has_data = False
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes | str) -> list[SseEvent]:
        """Consume one chunk; return the events it completed (possibly none)."""
        text = self._decoder.decode(chunk) if isinstance(chunk, bytes | bytearray) else chunk
        return self._consume(text, final=False)

    def close(self) -> list[SseEvent]:
        """End of stream: return the last event when the stream did not end with a blank line."""
        text = self._decoder.decode(b"", final=True)
        events = self._consume(text, final=True)
        if self._has_data:
            events.append(self._dispatch())
        return events

    def _consume(self, text: str, *, final: bool) -> list[SseEvent]:
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._skip_lf and text:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
        buf = self._buffer + text
        events: list[SseEvent] = []
        start = 0
        n = len(buf)
        cr = lf = -1
        while start < n:
            # remember the next CR/LF positions: re-scanning for a CR that never comes would be quadratic
            if cr != n and cr < start:
                cr = buf.find("\r", start)
                cr = n if cr < 0 else cr
            if lf != n and lf < start:
                lf = buf.find("\n", start)
                lf = n if lf < 0 else lf
            if cr == n and lf == n:
                break
            if cr < lf:
                end, nxt = cr, cr + 1
                if nxt < n:
                    if buf[nxt] == "\n":
                        nxt += 1
                elif not final:
                    self._skip_lf = True  # CR at chunk end: the LF may come with the next chunk
            else:
                end, nxt = lf, lf + 1
            event = self._line(buf[start:end])
            if event is not None:
                events.append(event)
            start = nxt
        self._buffer = buf[start:]
        if final and self._buffer:
            event = self._line(self._buffer)
            self._buffer = ""
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            if self._has_data:
                return self._dispatch()
            self._event = None  # a blank line with no data resets the event type (spec)
            self._retry = None
            return None
        if line[0] == ":":
            return None  # comment (keep-alive)
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry":
            if value.isdigit():
                self._retry = int(value)
        return None

    def _dispatch(self) -> SseEvent:
        event = SseEvent(event=self._event, data="\n".join(self._data), id=self._last_id, retry=self._retry)
        self._event = None
        self._data = []
        self._has_data = False
        self._retry = None
        return event


def parse_sse(stream: bytes | str | Iterable[bytes | str]) -> list[SseEvent]:
    """Parse a whole recorded stream (one bytes/str body, or an iterable of chunks) into events."""
    parser = SseParser()
    chunks: Iterable[bytes | str] = [stream] if isinstance(stream, bytes | bytearray | str) else stream
    events: list[SseEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events


@dataclass(frozen=True)
class StreamSummary:
    """What a streamed response said about itself once complete.

    Attributes:
        dialect: ``anthropic``, ``openai-chat`` or ``openai-responses`` (detected from the events).
        usage: the provider's native usage object for the whole call, or None when the stream carried none
            (an OpenAI Chat stream without ``stream_options.include_usage``). Anthropic: the
            ``message_start`` usage combined with ``message_delta``'s by :func:`merge_anthropic_stream_usage`
            (so ``output_tokens`` is the final count, not the placeholder, and the start's cache figures
            stay). OpenAI: the ``usage`` object as sent.
        response_id: the response's ``id`` (``msg_…``, ``chatcmpl-…``, ``resp_…``).
        model: the model the response names.
        content: the reply rebuilt from the deltas: Anthropic content blocks; for OpenAI Chat one assistant
            message dict (``content`` and ``tool_calls``); for Responses the ``output`` items.
        stop_reason: ``stop_reason`` / ``finish_reason`` / Responses ``status``.
        error: one line when the stream reported an error (an ``error`` event, ``response.failed``).
        events: how many events were read.
        complete: the stream reached its final usage (Anthropic ``message_delta`` usage, an OpenAI Chat usage
            chunk or ``[DONE]``, a Responses ``response.completed``/``incomplete``/``failed``). False for a
            stream cut short, whose Anthropic ``output_tokens`` is still the placeholder.
    """

    dialect: str
    usage: dict[str, Any] | None
    response_id: str | None = None
    model: str | None = None
    content: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    error: str | None = None
    events: int = 0
    complete: bool = False


def _as_pairs(events: Iterable[SseEvent | Mapping[str, Any]]) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) for each event; data that is not JSON stays a string."""
    pairs: list[tuple[str | None, Any]] = []
    data: Any  # the event's text, parsed when it is JSON
    for ev in events:
        if isinstance(ev, SseEvent):
            name, data = ev.event, ev.data
        else:
            name, data = ev.get("event"), ev.get("data")
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                pass
        pairs.append((name, data))
    return pairs


def _detect(pairs: list[tuple[str | None, Any]]) -> str:
    for name, data in pairs:
        kind = data.get("type") if isinstance(data, dict) else None
        kind = kind or name or ""
        if kind.startswith("response."):
            return "openai-responses"
        if kind in ("message_start", "content_block_start", "content_block_delta", "message_delta"):
            return "anthropic"
        if isinstance(data, dict) and data.get("object") == "chat.completion.chunk":
            return "openai-chat"
    return "openai-chat"


def usage_from_sse(events: Iterable[SseEvent | Mapping[str, Any]], provider: str = "auto") -> StreamSummary:
    """Summarise a complete streamed response: final usage, response id, model and rebuilt content.

    Args:
        events: the stream's events, as :class:`SseEvent` or dicts ``{"event": name, "data": str | JSON}``.
        provider: ``anthropic``, ``openai`` (Chat or Responses, told apart by the events), ``openai-chat``,
            ``openai-responses``, or ``auto``.

    Example (``body``: a recorded Anthropic stream)::

        summary = usage_from_sse(parse_sse(body), "anthropic")
        summary.usage["output_tokens"]  # the final count from message_delta, not message_start's placeholder
    """
    pairs = _as_pairs(events)
    if provider in ("anthropic", "openai-chat", "openai-responses"):
        dialect = provider
    else:
        dialect = _detect(pairs)
        if provider == "openai" and dialect == "anthropic":
            dialect = "openai-chat"
    if dialect == "anthropic":
        return _anthropic(pairs)
    if dialect == "openai-responses":
        return _responses(pairs)
    return _chat(pairs)


#: Counts message_start reports for real (its output_tokens is a placeholder, so the delta's always wins).
_INPUT_COUNTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def merge_anthropic_stream_usage(start: dict[str, Any] | None, delta: dict[str, Any]) -> dict[str, Any]:
    """The usage of a streamed Anthropic message: ``message_start``'s usage combined with one ``message_delta``'s.

    The rule, from the Messages streaming docs ("The token counts shown in the ``usage`` field of the
    ``message_delta`` event are *cumulative*", https://docs.anthropic.com/en/docs/build-with-claude/streaming) and
    the SDK's ``MessageDeltaUsage`` (every count optional but ``output_tokens``):

    - start from ``message_start``'s ``message.usage`` (input, cache read, cache write and its 5m/1h
      ``cache_creation`` split; ``output_tokens`` there is a placeholder);
    - every field ``message_delta`` carries with a value replaces it (cumulative, so the delta's figure is the
      whole call's); a field it omits or sends as null keeps ``message_start``'s figure, so the cache read
      reported only at the start is never lost;
    - a cumulative input count cannot fall: a delta input/cache figure *below* ``message_start``'s is a
      placeholder (Anthropic-compatible gateways send ``0`` for figures they do not track), not a total, and
      ``message_start``'s figure stays. Except when the delta carries ``iterations`` (server-side compaction):
      its top-level figures then describe the final iteration and are taken as sent;
    - when the delta changes ``cache_creation_input_tokens`` without its own ``cache_creation`` object, the
      start's 5m/1h split no longer sums to the total and is dropped (the split becomes unknown, never wrong).

    Several ``message_delta`` events (server tools) are merged in order; each is cumulative, so the last wins.
    """
    usage = dict(start or {})
    compaction = isinstance(delta.get("iterations"), list)
    for key, value in delta.items():
        if value is None:
            continue
        before = usage.get(key)
        if (not compaction and key in _INPUT_COUNTS and _is_count(before) and _is_count(value)
                and value < before):
            continue
        usage[key] = value
    written_before = (start or {}).get("cache_creation_input_tokens")
    if ("cache_creation" not in delta and "cache_creation" in usage
            and usage.get("cache_creation_input_tokens") != written_before):
        del usage["cache_creation"]
    return usage


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _anthropic(pairs: list[tuple[str | None, Any]]) -> StreamSummary:
    usage: dict[str, Any] | None = None
    response_id = model = stop_reason = error = None
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, list[str]] = {}
    complete = False
    for name, data in pairs:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        if kind == "message_start":
            message = data.get("message") or {}
            response_id = message.get("id")
            model = message.get("model")
            if isinstance(message.get("usage"), dict):
                usage = dict(message["usage"])
        elif kind == "content_block_start":
            blocks[int(data.get("index", len(blocks)))] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta":
            index = int(data.get("index", 0))
            block = blocks.setdefault(index, {})
            delta = data.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif dtype == "input_json_delta":
                partial_json.setdefault(index, []).append(delta.get("partial_json", ""))
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif dtype == "signature_delta":
                block["signature"] = delta.get("signature")
            elif dtype == "citations_delta":
                block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "message_delta":
            stop_reason = (data.get("delta") or {}).get("stop_reason", stop_reason)
            delta_usage = data.get("usage")
            if isinstance(delta_usage, dict):
                usage = merge_anthropic_stream_usage(usage, delta_usage)
                complete = True
        elif kind == "error":
            err = data.get("error") or {}
            error = f"{err.get('type', 'error')}: {err.get('message', '')}".strip().rstrip(":")
    for index, parts in partial_json.items():
        text = "".join(parts)
        try:
            blocks[index]["input"] = json.loads(text) if text else {}
        except ValueError:
            blocks[index]["input"] = text  # keep what came: a stream cut inside a tool call
    content = [blocks[i] for i in sorted(blocks)]
    return StreamSummary("anthropic", usage, response_id, model, content, stop_reason, error, len(pairs), complete)


def _chat(pairs: list[tuple[str | None, Any]]) -> StreamSummary:
    usage: dict[str, Any] | None = None
    response_id = model = stop_reason = error = None
    text: list[str] = []
    role = "assistant"
    tool_calls: dict[int, dict[str, Any]] = {}
    complete = False
    for _name, data in pairs:
        if not isinstance(data, dict):
            complete = complete or data == "[DONE]"
            continue
        if "error" in data and data.get("object") != "chat.completion.chunk":
            err = data["error"] if isinstance(data["error"], dict) else {"message": str(data["error"])}
            error = f"{err.get('type') or err.get('code') or 'error'}: {err.get('message', '')}"
            continue
        response_id = data.get("id", response_id)
        model = data.get("model", model)
        if isinstance(data.get("usage"), dict):
            usage = dict(data["usage"])
            complete = True
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            role = delta.get("role") or role
            if delta.get("content"):
                text.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                slot = tool_calls.setdefault(
                    int(call.get("index", len(tool_calls))),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                stop_reason = choice["finish_reason"]
    message: dict[str, Any] = {"role": role, "content": "".join(text) if text else None}
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    return StreamSummary("openai-chat", usage, response_id, model, [message], stop_reason, error, len(pairs),
                         complete)


def _responses(pairs: list[tuple[str | None, Any]]) -> StreamSummary:
    usage: dict[str, Any] | None = None
    response_id = model = stop_reason = error = None
    output: list[dict[str, Any]] = []
    complete = False
    for name, data in pairs:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        response = data.get("response")
        if isinstance(response, dict):
            response_id = response.get("id", response_id)
            model = response.get("model", model)
            stop_reason = response.get("status", stop_reason)
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                complete = True
                if isinstance(response.get("usage"), dict):
                    usage = dict(response["usage"])
                output = list(response.get("output") or output)
            if kind == "response.failed":
                err = response.get("error") or {}
                error = f"{err.get('code', 'failed')}: {err.get('message', '')}"
        elif kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            index = data.get("output_index", len(output))
            while len(output) <= index:
                output.append({})
            output[index] = data["item"]
        elif kind == "error":
            error = f"{data.get('code') or 'error'}: {data.get('message', '')}"
    return StreamSummary("openai-responses", usage, response_id, model, output, stop_reason, error, len(pairs),
                         complete)
