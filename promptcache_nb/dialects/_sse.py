"""Server-Sent Events: an incremental parser, the summary every dialect's stream reader returns, and the writer.

Dependency-free on purpose: the recording proxy feeds the chunks it relays into :class:`SseParser` as they
arrive, and the HTTP readers parse recorded stream bodies with :func:`parse_sse`; both then call
:func:`~promptcache_nb.dialects.usage_from_sse`, which hands the events to their format's ``sse_parse``, so a
streamed call is summarised by one implementation per format. The simulator writes its streams with each
format's ``sse_write`` (events encoded by :func:`encode_event`).

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

__all__ = ["SseEvent", "SseParser", "StreamSummary", "as_pairs", "encode_event", "parse_sse"]

#: (event name, parsed data): one event as the dialects' stream readers take it.
Pairs = list[tuple[str | None, Any]]


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
            ``message_start`` usage combined with ``message_delta``'s by
            :func:`~promptcache_nb.dialects.anthropic.merge_anthropic_stream_usage` (so ``output_tokens`` is the
            final count, not the placeholder, and the start's cache figures stay). OpenAI: the ``usage`` object as sent.
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
        diagnostics: the provider's cache diagnostics as the stream reported them (Anthropic: ``message_start``'s
            ``message.diagnostics``; None when absent or null).
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
    diagnostics: Any = None


def as_pairs(events: Iterable[SseEvent | Mapping[str, Any]]) -> list[tuple[str | None, Any]]:
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




def encode_event(name: str | None, data: Any) -> bytes:
    """One ``text/event-stream`` event: an ``event:`` line when named, the data (JSON unless a string), a blank line."""
    head = f"event: {name}\n" if name else ""
    body = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {body}\n\n".encode()


def halves(text: str) -> list[str]:
    """The text in two deltas (so a client sees a real stream), dropping empty ones."""
    cut = len(text) // 2
    return [piece for piece in (text[:cut], text[cut:]) if piece]
