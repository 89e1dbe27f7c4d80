"""Wire formats: one module per API request format, each implementing the :class:`Dialect` protocol.

* :mod:`.anthropic` — Anthropic Messages (``POST /v1/messages``);
* :mod:`.openai_chat` — OpenAI Chat Completions (``POST /v1/chat/completions``);
* :mod:`.openai_responses` — OpenAI Responses (``POST /v1/responses``).

Each knows its format's detection, segments (and the body rebuilt from them), validation, native usage, server-sent
events (read and written) and error body; nothing outside this package asks which format it holds. Look one up with
:func:`get` (by name) or :func:`detect` (from a body); a caller resolves it once per request and keeps the object.

Adding a format (Gemini, Bedrock): a module here with a class satisfying :class:`Dialect`, listed in
``_registry.py``.

Example:
    >>> from promptcache_nb import dialects
    >>> dialects.detect({"model": "gpt-4o", "input": "hi"}).name
    'openai-responses'
    >>> dialects.get("anthropic").usage({"input_tokens": 3, "output_tokens": 1}, source="live").input_tokens
    3
"""

from __future__ import annotations

from ._base import Dialect, DialectName, SegmentKind, SegmentSink, Unit
from ._problems import BodyProblem
from ._registry import (
    ANTHROPIC,
    DIALECTS,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    OpenAIApi,
    all_dialects,
    detect,
    detect_stream,
    get,
    usage_from_anthropic,
    usage_from_openai,
    usage_from_sse,
)
from ._sse import SseEvent, SseParser, StreamSummary, parse_sse

__all__ = [
    "ANTHROPIC",
    "DIALECTS",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "OpenAIApi",
    "BodyProblem",
    "Dialect",
    "DialectName",
    "SegmentKind",
    "SegmentSink",
    "SseEvent",
    "SseParser",
    "StreamSummary",
    "Unit",
    "all_dialects",
    "detect",
    "detect_stream",
    "get",
    "parse_sse",
    "usage_from_anthropic",
    "usage_from_openai",
    "usage_from_sse",
]
