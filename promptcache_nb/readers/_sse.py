"""Server-Sent Events for the importers and the proxy: the parser and the stream summary, from the wire formats.

The parser is :mod:`promptcache_nb.dialects._sse`; each format reads its own events
(``Dialect.sse_parse``) and :func:`usage_from_sse` picks the format. This module keeps the names importers,
the proxy and tests use.
"""

from __future__ import annotations

from ..dialects import SseEvent, SseParser, StreamSummary, parse_sse, usage_from_sse
from ..dialects.anthropic import merge_anthropic_stream_usage

__all__ = ["SseEvent", "SseParser", "StreamSummary", "merge_anthropic_stream_usage", "parse_sse", "usage_from_sse"]
