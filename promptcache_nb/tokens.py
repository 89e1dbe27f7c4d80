"""Token counting. Every count here is an *estimate*: only an endpoint's ``usage`` is a measurement.

No tokenizer download happens at run time. The default :class:`HeuristicTokenizer` splits text the way
BPE pre-tokenizers do (words, number groups, punctuation runs, whitespace) and charges each piece by
its length and script. Its error against Claude's real tokenizer is unknown until calibrated against
measured usage (see :func:`promptcache_nb.calibrate`); treat absolute figures as ±20 %.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Protocol, runtime_checkable

# Pieces: letters (with one leading space, like GPT/Claude pre-tokenizers), digit groups of up to 3,
# punctuation runs, newlines, other whitespace.
_PIECE = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\n+|\s+", re.UNICODE)


@runtime_checkable
class Tokenizer(Protocol):
    """Anything with a name and a ``count(text) -> int``."""

    name: str

    def count(self, text: str) -> int: ...


_LONG_WORD = re.compile(r"[A-Za-z]{8,}")
_PUNCT_RUN = re.compile(r"[^\s\w]{3,}")
_SPACE_RUN = re.compile(r"[ \t]{9,}")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


class HeuristicTokenizer:
    """Offline estimator tuned to land near Claude's counts on English prose and code.

    One token per pre-tokenizer piece, plus: long ASCII words split every ~4.5 letters, punctuation
    runs every 2 characters, long blank runs every 8, and non-ASCII text at ~3 UTF-8 bytes a token.
    Implemented with a handful of C-level regex scans (no per-piece Python loop): ~50 MB/s.
    """

    name = "heuristic-v1"

    def count(self, text: str) -> int:
        if not text:
            return 0
        total = len(_PIECE.findall(text))
        for w in _LONG_WORD.findall(text):
            total += math.ceil(len(w) / 4.5) - 1
        for p in _PUNCT_RUN.findall(text):
            total += math.ceil(len(p) / 2) - 1
        for sp in _SPACE_RUN.findall(text):
            total += math.ceil(len(sp) / 8) - 1
        if not text.isascii():
            for run in _NON_ASCII.findall(text):
                total += max(0, math.ceil(len(run.encode("utf-8")) / 3) - 1)
        return total


class CharsTokenizer:
    """The crude ``ceil(chars / 4)`` rule, kept for comparison with calibrated estimates."""

    name = "chars/4"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / 4)


DEFAULT_TOKENIZER: Tokenizer = HeuristicTokenizer()

# Fixed framing the API adds around blocks (role markers, tool wrappers). Estimates, not documented.
MESSAGE_FRAME_TOKENS = 4
TOOL_FRAME_TOKENS = 8
BLOCK_FRAME_TOKENS = 2
IMAGE_TOKENS = 1_600


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def segment_tokens(kind: str, element: Any, tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> int:
    """Estimated tokens of one request segment (a tool, a system block or a message content block).

    ``kind`` is the segment's kind from :mod:`promptcache_nb.request` (``tool``, ``system``, ``msg``...).
    Only the text a model sees is counted, plus a small fixed frame per block.
    """
    count = tokenizer.count
    if isinstance(element, str):
        frame = MESSAGE_FRAME_TOKENS if kind.startswith("msg") else BLOCK_FRAME_TOKENS
        return count(element) + frame
    if kind == "tool":
        # Anthropic tools are flat with an input_schema; OpenAI Chat nests {"function": {..., "parameters"}},
        # OpenAI Responses is flat with "parameters"
        inner = element.get("function") if isinstance(element.get("function"), dict) else element
        schema = inner.get("input_schema") if "input_schema" in inner else inner.get("parameters")
        return (
            count(str(inner.get("name", "")))
            + count(str(inner.get("description", "")))
            + (count(_compact(schema)) if schema is not None else 0)
            + TOOL_FRAME_TOKENS
        )
    if kind == "msg-whole" or kind == "item":
        return _openai_tokens(element, count)
    frame = MESSAGE_FRAME_TOKENS if kind == "msg-start" else BLOCK_FRAME_TOKENS
    if not isinstance(element, dict):  # an empty content list, or something the API would reject
        return MESSAGE_FRAME_TOKENS + count(_compact(element))
    btype = element.get("type")
    if btype == "text":
        return count(element.get("text", "")) + frame
    if btype == "tool_use":
        return count(str(element.get("name", ""))) + count(_compact(element.get("input", {}))) + frame + 4
    if btype == "tool_result":
        content = element.get("content", "")
        if isinstance(content, list):
            inner = sum(segment_tokens("block", c, tokenizer) for c in content)
        else:
            inner = count(str(content))
        return inner + frame + 4
    if btype in ("image", "document"):
        return IMAGE_TOKENS + frame
    if btype in ("thinking", "redacted_thinking"):
        return count(str(element.get("thinking", element.get("data", "")))) + frame
    return count(_compact({k: v for k, v in element.items() if k != "cache_control"})) + frame


_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "summary_text": "text",
               "reasoning_text": "text", "refusal": "refusal"}
_MEDIA_PARTS = frozenset({"image_url", "input_image", "file", "input_file", "input_audio"})


def _parts_tokens(content: Any, count: Any) -> int:
    """Tokens of an OpenAI message's content: a string or a list of content parts."""
    if isinstance(content, str):
        return count(content)
    if not isinstance(content, list):
        return 0 if content is None else count(_compact(content))
    n = 0
    for part in content:
        t = part.get("type") if isinstance(part, dict) else None
        if t in _TEXT_PARTS:
            n += count(str(part.get(_TEXT_PARTS[t], "")))
        elif t in _MEDIA_PARTS:
            n += IMAGE_TOKENS
        else:
            n += count(_compact(part))
    return n


def _call_tokens(name: Any, arguments: Any, count: Any) -> int:
    args = arguments if isinstance(arguments, str) else _compact(arguments)
    return count(str(name or "")) + count(args) + 4


def _openai_tokens(element: Any, count: Any) -> int:
    """A whole OpenAI Chat message (``msg-whole``) or Responses input item (``item``)."""
    if not isinstance(element, dict):
        return MESSAGE_FRAME_TOKENS + count(_compact(element))
    t = element.get("type")
    if t is None and "role" in element or t == "message":
        n = _parts_tokens(element.get("content"), count) + MESSAGE_FRAME_TOKENS
        for call in element.get("tool_calls") or ():
            fn = (call.get("function") or call.get("custom") or {}) if isinstance(call, dict) else {}
            n += _call_tokens(fn.get("name"), fn.get("arguments", fn.get("input", "")), count)
        fc = element.get("function_call")
        if isinstance(fc, dict):
            n += _call_tokens(fc.get("name"), fc.get("arguments", ""), count)
        for key in ("refusal", "reasoning_content"):
            if isinstance(element.get(key), str):
                n += count(element[key])
        return n
    if t == "function_call":
        return _call_tokens(element.get("name"), element.get("arguments", ""), count) + BLOCK_FRAME_TOKENS
    if t == "custom_tool_call":
        return _call_tokens(element.get("name"), element.get("input", ""), count) + BLOCK_FRAME_TOKENS
    if t in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
        return _parts_tokens(element.get("output"), count) + BLOCK_FRAME_TOKENS + 4
    if t == "reasoning":
        # the visible summary and content; encrypted_content is opaque (its tokens are not knowable here)
        return (sum(_parts_tokens([p], count) for p in element.get("summary") or ())
                + sum(_parts_tokens([p], count) for p in element.get("content") or ()) + BLOCK_FRAME_TOKENS)
    if t == "item_reference" or (t is None and set(element) == {"id"}):
        return BLOCK_FRAME_TOKENS  # the referenced item's content is held by the server, not the body
    return count(_compact(element)) + BLOCK_FRAME_TOKENS


class _Fit(Protocol):
    model: str
    ratio: float
    overhead: float


class CalibratedTokenizer:
    """A tokenizer whose counts are ``base`` counts scaled by a fitted calibration's ``ratio``.

    A calibration (:func:`promptcache_nb.calibrate`) fits *request totals*: measured ≈ ratio × estimated
    + overhead. The ratio scales every text, so segment counts, prefix lengths and minimum-length checks
    move with it; the overhead is a per-request frame the API adds once (hidden tool/system prompt,
    message framing) that belongs to no single text, so :meth:`count` leaves it out. For a request's total
    use ``calibration.apply(prepared.total_tokens)``.

    Example:
        >>> cal = pc.load_calibration(lab, "claude-sonnet-4-5")          # doctest: +SKIP
        >>> tok = CalibratedTokenizer(HeuristicTokenizer(), cal)         # doctest: +SKIP
        >>> lab2 = pc.Lab("runs.duckdb", tokenizer=tok)                   # doctest: +SKIP
    """

    def __init__(self, base: Tokenizer, calibration: _Fit) -> None:
        self.base = base
        self.calibration = calibration
        self.name = f"{base.name}*{calibration.ratio:.4g}[{calibration.model}]"

    def count(self, text: str) -> int:
        n = self.base.count(text)
        return round(n * self.calibration.ratio) if n else 0

    def __repr__(self) -> str:
        return f"CalibratedTokenizer({self.base.name!r}, ratio={self.calibration.ratio:.4g})"
