"""Token counting. Every count here is an *estimate*: only an endpoint's ``usage`` is a measurement.

The estimator is chosen by the request's model (:func:`tokenizer_family`, :class:`ModelTokenizer`, the
default of every Lab):

* **OpenAI** models count their text with the exact BPE of their encoding — ``o200k_base`` (GPT-4o,
  GPT-4.1, GPT-5, o-series) or ``cl100k_base`` (GPT-4, GPT-3.5) — from the ranks bundled in the
  ``bpe-openai`` wheel (MIT; the ``o200k_base`` ranks are byte-identical to OpenAI's published file, sha256
  ``446a9538…``). Nothing is downloaded at run time. The text is exact; the per-message frame is not.
* **Claude** models use :class:`HeuristicTokenizer`, per tokenizer generation: ``claude-v3`` (Claude 3 …
  Opus 4.6, Sonnet 4.x, Haiku 4.5) as is; ``claude-v4.7`` (Opus 4.7–4.9) and ``claude-v5`` (the 5
  models), whose newer tokenizer yields more tokens for the same text
  (docs/provider_cache_rules.md#token-counts: 1.0–1.35× per Anthropic, 1.22× on code and 1.44× on English
  per ctok), scaled by a prior ratio of :data:`NEWER_CLAUDE_RATIO` until a measured calibration of the
  family replaces it.
* **Everyone else** (DeepSeek, Gemini, vLLM-served models…) uses the heuristic too, and says so: the
  estimator's :attr:`Tokenizer.name` is recorded on every prepared request (``PreparedRequest.tokenizer``).

Anthropic's tokenizer is not public: against Claude's real counts the heuristic's error is unknown until
calibrated against measured usage (:func:`promptcache_nb.calibrate`); treat absolute figures as ±20 %.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import re
import sys
import threading
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

from ._lazy import numpy as np
from ._util import model_base_id

# Pieces: letters (with one leading space, like GPT/Claude pre-tokenizers), digit groups of up to 3,
# punctuation runs, newlines, other whitespace.
_PIECE = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\n+|\s+", re.UNICODE)


@runtime_checkable
class Tokenizer(Protocol):
    """Anything with a name and a ``count(text) -> int``.

    A tokenizer may also offer ``for_model(model) -> Tokenizer`` (as :class:`ModelTokenizer` does): the
    estimator for one model's requests. :func:`~promptcache_nb.prepare` asks for it once per request body;
    a tokenizer without it counts every model's text the same way.
    """

    name: str

    def count(self, text: str) -> int: ...


_LONG_WORD = re.compile(r"[A-Za-z]{8,}")
_PUNCT_RUN = re.compile(r"[^\s\w]{3,}")
_SPACE_RUN = re.compile(r"[ \t]{9,}")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


# Recent texts' heuristic counts: a message is counted when it is sent, when it is stored and when the
# next request sends it again. Short texts only (long ones are rarely counted twice: prepare() memoises
# segments), and a bounded number of them.
_COUNTED: dict[str, int] = {}
_COUNTED_KEPT = 1024
_COUNTED_MAX_CHARS = 8192


class HeuristicTokenizer:
    """Offline estimator tuned to land near Claude's counts on English prose and code.

    One token per pre-tokenizer piece, plus: long ASCII words split every ~4.5 letters, punctuation
    runs every 2 characters, long blank runs every 8, and non-ASCII text at ~3 UTF-8 bytes a token.
    The definition is a handful of regex scans (:meth:`_count`, ~10 MB/s); texts of
    :data:`_VECTOR_MIN_CHARS` or more are counted from the runs of character classes with numpy
    (:func:`_count_runs`, the same integer, ~100 MB/s: issue 23); recent short texts are counted once
    (a message is counted when sent, stored and sent again).
    """

    name = "heuristic-v1"

    def count(self, text: str) -> int:
        if not text:
            return 0
        n = _COUNTED.get(text)
        if n is None:
            n = self._count(text) if len(text) < _VECTOR_MIN_CHARS else _count_runs(text)
            if len(text) <= _COUNTED_MAX_CHARS:
                if len(_COUNTED) >= _COUNTED_KEPT:
                    _COUNTED.clear()
                _COUNTED[text] = n
        return n

    def count_many(self, texts: list[str]) -> list[int]:
        """``[self.count(t) for t in texts]``, the ASCII texts counted in one vectorised pass over all of them
        (:func:`_count_batch`): a stored request's thousands of short blocks cost one numpy pass, not one regex
        scan each (a reopened session's first request rebuilt its last request's ~2,000 blocks so).

        Only once numpy is loaded (by pandas, for the first frame; or by a long text): importing it costs about
        what the batch saves, so a process that has not needed it yet counts text by text."""
        out = [0] * len(texts)
        batch: list[int] = []
        for i, text in enumerate(texts):
            if text.isascii() and len(text) <= _CHUNK_CHARS:
                batch.append(i)
            else:
                out[i] = self.count(text)
        if len(batch) < _BATCH_MIN_TEXTS or "numpy" not in sys.modules:
            for i in batch:
                out[i] = self.count(texts[i])
        else:
            for i, n in zip(batch, _count_batch([texts[i] for i in batch]), strict=True):
                out[i] = n
        return out

    @staticmethod
    def _count(text: str) -> int:
        """The count by definition: the pieces of ``_PIECE`` plus the extras of the long runs."""
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


# -- HeuristicTokenizer._count from runs of character classes, vectorised ------------------------------
# Below this length numpy's fixed cost (~40 µs a text) outweighs the regex scans (benchmarks/bench_tokens.py).
_VECTOR_MIN_CHARS = 1024

# The classes _PIECE and the extras tell apart. ASCII letters are apart from other letters for _LONG_WORD;
# " " and "\t" share one class for _SPACE_RUN; "_" is \w but neither letter nor digit, so no piece takes it.
_ASCII_LETTER, _LETTER, _DIGIT, _PUNCT, _SKIP, _NEWLINE, _BLANK, _SPACE, _EDGE = range(9)
_IS_SPACE = re.compile(r"\s")
_IS_LETTER = re.compile(r"[^\W\d_]")
_IS_DIGIT = re.compile(r"\d")
_IS_PUNCT = re.compile(r"[^\s\w]")


def _char_class(ch: str) -> int:
    """One character's class, asked of the regex engine itself so that \\s, \\w and \\d mean what they mean
    to ``_PIECE`` (\\s takes \\x1c-\\x1f and U+0085, \\d every decimal digit, \\w "²" and "½")."""
    if ch == "\n":
        return _NEWLINE
    if ch in " \t":
        return _BLANK
    if _IS_SPACE.match(ch):
        return _SPACE
    if _IS_LETTER.match(ch):
        return _ASCII_LETTER if ch.isascii() else _LETTER
    if _IS_DIGIT.match(ch):
        return _DIGIT
    return _PUNCT if _IS_PUNCT.match(ch) else _SKIP


_RUNS: dict[str, Any] = {}  # numpy and the class tables, made on the first long text
_UNKNOWN = 255


def _run_tables() -> dict[str, Any]:
    if "np" not in _RUNS:  # set last: another thread sees all the tables or none
        # bytes 0x80-0xff never occur in ASCII text: 0x80 is the sentinel put around it
        _RUNS["ascii"] = bytes([_char_class(chr(i)) for i in range(128)] + [_EDGE] * 128)
        # every code point's class, filled in as texts bring new characters
        wide = np.full(0x110000, _UNKNOWN, dtype=np.uint8)
        wide[:128] = np.frombuffer(_RUNS["ascii"][:128], dtype=np.uint8)
        _RUNS["wide"] = wide
        _RUNS.update(_triple_tables(np))
        _RUNS["np"] = np
    return _RUNS


def _count_runs(text: str) -> int:
    """:meth:`HeuristicTokenizer._count`, computed from the maximal runs of each character class.

    What ``_PIECE.findall`` matches, run by run: a run of letters is one piece, with one space before it
    joined; a run of digits is ceil(len / 3) pieces; a run of punctuation is one; a run of whitespace is one
    piece for its leading newlines and one for the rest (``\\s+`` is greedy and takes later newlines too),
    unless that rest is a single " " followed by a letter, digit or punctuation, which it joins. The extras
    are per run as in ``_count``. tests/test_tokens.py checks it equal to ``_count`` on adversarial text.

    Long texts are counted in parts of about :data:`_CHUNK_CHARS`, cut after a newline followed by a
    non-space, or between a non-space and a lone space followed by a non-space: no piece, run or extra spans
    such a cut, and what either side of it counts does not depend on the other, so the counts add up. Small
    arrays stay in cache and off ``mmap`` (whose fresh pages halved the speed of one 100 KB pass).
    """
    tables = _run_tables()
    total, start = 0, 0
    size = _CHUNK_CHARS if text.isascii() else _CHUNK_CHARS // 4  # 4-byte code points, 8-byte byte sums
    while len(text) - start > 2 * size:
        cut = _CUT.search(text, start + size)
        if cut is None:
            break
        total += _count_chunk(text[start:cut.end()], tables)
        start = cut.end()
    return total + _count_chunk(text[start:] if start else text, tables)


_CHUNK_CHARS = 32_768
_SHORT_RUN = 63  # the length terms of shorter runs are looked up (a table lookup costs less than a division)
_CUT = re.compile(r"\n(?=\S)|\S(?= \S)")


def _count_chunk(text: str, tables: dict[str, Any]) -> int:
    np = tables["np"]
    extra = 0
    if text.isascii():
        padded = b"\x80" + text.encode("ascii") + b"\x80"
        cls = np.frombuffer(padded.translate(tables["ascii"]), dtype=np.uint8)
        codes = np.frombuffer(padded, dtype=np.uint8)[1:-1]
    else:
        try:
            codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        except UnicodeEncodeError:  # a lone surrogate: the definition's UTF-8 length raises; so does this
            return HeuristicTokenizer._count(text)
        wide = tables["wide"]
        cls = np.empty(len(codes) + 2, dtype=np.uint8)
        cls[0] = cls[-1] = _EDGE
        inner = cls[1:-1]
        wide.take(codes, out=inner)
        new = inner == _UNKNOWN
        if new.any():
            for c in np.unique(codes[new]).tolist():
                wide[c] = _char_class(chr(c))
            wide.take(codes, out=inner)
        # runs of non-ASCII characters: one token per ~3 UTF-8 bytes past the first
        over = np.zeros(len(codes) + 2, dtype=bool)
        np.greater_equal(codes, 0x80, out=over[1:-1])
        nbytes = over[1:-1].astype(np.int32)
        nbytes += codes >= 0x800
        nbytes += codes >= 0x10000
        nbytes += over[1:-1]  # 2, 3 or 4 bytes; 0 for ASCII
        edges = np.flatnonzero(over[1:] != over[:-1])
        cum = np.zeros(len(codes) + 1, dtype=np.int64)
        np.cumsum(nbytes, out=cum[1:])
        run_bytes = cum[edges[1::2]] - cum[edges[::2]]
        extra = int(np.maximum(0, (run_bytes + 2) // 3 - 1).sum())

    per_run, _ = _run_terms(cls, codes, tables)
    return extra + int(per_run.sum())


def _run_terms(cls: Any, codes: Any, tables: dict[str, Any]) -> tuple[Any, Any]:
    """What each maximal run of character classes counts (pieces and extras but for non-ASCII bytes), and where
    each run starts in ``cls``: ``cls`` the classes of a text with an ``_EDGE`` sentinel at each end (or of texts
    joined by sentinels, :func:`_count_batch`), ``codes`` its code points without the two outer sentinels."""
    np = tables["np"]
    change = np.empty(len(cls), dtype=bool)
    change[0] = True
    np.not_equal(cls[1:], cls[:-1], out=change[1:])
    starts = np.flatnonzero(change)  # the opening sentinel, each run, the closing sentinel
    classes = cls[starts].astype(np.intp)
    cur = classes[1:-1]  # each run; classes[i] is the run before cur[i], classes[i + 2] the run after
    lens = starts[2:] - starts[1:-1]
    # what depends on the classes of a run and its neighbours alone: by (before, run, after) triple
    key = classes[:-2] * 81
    key += cur * 9
    key += classes[2:]
    per_run = tables["triple"].take(key)
    # what grows with a run's length (_length_term), looked up for the short runs, computed for the rare long ones
    short = np.minimum(lens, _SHORT_RUN)
    short += cur * (_SHORT_RUN + 1)
    per_run += tables["length"].take(short)
    for i in np.flatnonzero(lens > _SHORT_RUN).tolist():
        c, n = int(cur[i]), int(lens[i])
        per_run[i] += _length_term(c, n) - _length_term(c, _SHORT_RUN)
    lone = np.flatnonzero((lens == 1) & (cur == _BLANK))
    if len(lone):
        lone = lone[(classes[lone + 2] <= _PUNCT) & (codes[starts[lone + 1] - 1] == 0x20)]  # " " joins, "\t" not
        if len(lone):  # the space is the whole whitespace run, or all of it after its leading newlines
            before, before2 = classes[lone], classes[lone - 1]  # (lone 0: before is the sentinel)
            space_before = (before >= _NEWLINE) & (before <= _SPACE)
            first_newlines_before = (before == _NEWLINE) & ((before2 < _NEWLINE) | (before2 > _SPACE))
            per_run[lone] -= (~space_before | first_newlines_before).astype(per_run.dtype)
    return per_run, starts[1:-1]


# Below this many texts a batch is counted text by text (numpy's fixed cost per call outweighs the regex scans).
_BATCH_MIN_TEXTS = 16


def _count_batch(texts: list[str]) -> list[int]:
    """:meth:`HeuristicTokenizer._count` of each of ``texts`` (ASCII, none longer than :data:`_CHUNK_CHARS`), in
    one pass of :func:`_run_terms` over all of them.

    The texts are joined with the byte the ASCII table maps to ``_EDGE`` (the sentinel :func:`_count_chunk` puts
    around a text), so every text is bounded by sentinels as when counted alone: no run spans two texts, a run's
    neighbours are what they are alone, and a sentinel run counts nothing. Each run's terms are then added up per
    text, instead of over the whole. tests/test_tokens_fast.py checks it equal to the definition text by text.
    """
    tables = _run_tables()
    np = tables["np"]
    padded = ("\x80" + "\x80".join(texts) + "\x80").encode("latin-1")
    cls = np.frombuffer(padded.translate(tables["ascii"]), dtype=np.uint8)
    codes = np.frombuffer(padded, dtype=np.uint8)[1:-1]
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    first = np.empty(len(texts), dtype=np.int64)  # where each text starts in ``cls``
    first[0] = 1
    np.cumsum(lengths[:-1] + 1, out=first[1:])
    first[1:] += 1
    per_run, run_starts = _run_terms(cls, codes, tables)
    owner = np.searchsorted(first, run_starts, side="right") - 1  # the text each run starts in (or follows)
    totals = np.zeros(len(texts), dtype=np.int64)
    np.add.at(totals, owner, per_run)
    return [int(n) for n in totals.tolist()]


def _length_term(cls: int, n: int) -> int:
    """What a run of ``n`` characters of class ``cls`` counts for its length: ceil(n / 4.5) - 1 for a long ASCII
    word (8 letters or more), ceil(n / 3) for digits (\\d{1,3}), the piece plus ceil(n / 2) - 1 from 3 up for
    punctuation, ceil(n / 8) for blanks (their -1 is in the triple weights)."""
    if cls == _ASCII_LETTER:
        return (2 * n + 8) // 9 - 1 if n >= 8 else 0
    if cls == _DIGIT:
        return (n + 2) // 3
    if cls == _PUNCT:
        return (n + 1) // 2
    if cls == _BLANK:
        return (n + 7) // 8
    return 0


def _triple_tables(np: Any) -> dict[str, Any]:
    """The per-class tables :func:`_count_chunk` reads: by (before, run, after) class triple ``b * 81 + r * 9 +
    a``, the pieces the run counts whatever its length (``triple``); by ``class * (_SHORT_RUN + 1) + length``,
    :func:`_length_term` of runs up to :data:`_SHORT_RUN` long (``length``)."""
    def space(c: int) -> bool:
        return _NEWLINE <= c <= _SPACE

    triple = np.zeros(729, dtype=np.int64)
    for b in range(9):
        for r in range(9):
            for a in range(9):
                k = b * 81 + r * 9 + a
                triple[k] = ((r <= _LETTER < b)  # a letter run (one space before it is joined)
                             + (space(r) and not space(b))  # a whitespace run
                             + (r == _NEWLINE and not space(b) and space(a))  # \n+ then more whitespace
                             - (r == _BLANK))  # ceil(len / 8) - 1
    length = np.array([_length_term(c, n) for c in range(9) for n in range(_SHORT_RUN + 1)], dtype=np.int64)
    return {"triple": triple, "length": length}


class CharsTokenizer:
    """The crude ``ceil(chars / 4)`` rule, kept for comparison with calibrated estimates."""

    name = "chars/4"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / 4)


# -- one estimator per model family -----------------------------------------------------------------
CLAUDE_V3 = "claude-v3"
CLAUDE_V47 = "claude-v4.7"
CLAUDE_V5 = "claude-v5"
OPENAI_O200K = "openai-o200k"
OPENAI_CL100K = "openai-cl100k"
#: The tokenizer families :func:`tokenizer_family` names (besides ``deepseek``, ``gemini`` and
#: ``model:<id>`` for a model of no known family, which never pools with another).
FAMILIES = (CLAUDE_V3, CLAUDE_V47, CLAUDE_V5, OPENAI_O200K, OPENAI_CL100K, "deepseek", "gemini")

#: Prior scale of the heuristic for the Claude families with the newer tokenizer, until a measured calibration
#: of the family replaces it (``lab.session(calibration="stored")``). Issue 11 measured the unscaled
#: heuristic 25-30 % low on these models; docs/provider_cache_rules.md#token-counts gives the new tokenizer
#: 1.0-1.35× the old one per Anthropic, 1.22× on code and 1.44× on English per ctok. Agent traffic mixes code
#: and prose.
NEWER_CLAUDE_RATIO = 1.35

# Claude 4.7-4.9 share the tokenizer Opus 4.7 introduced; the 5 models keep its vocabulary with another
# message frame (ctok's v4.7 and v5 families, §8). Every other Claude id (Claude 3 ... Opus 4.6, Sonnet 4.x,
# Haiku 4.5, and ids this table does not know) is the earlier generation.
_CLAUDE_V47 = re.compile(r"^claude-[a-z]+-4-[7-9](?:$|[-@.])")
_CLAUDE_V5 = re.compile(r"^claude-[a-z]+-5(?:$|[-@.])")
# tiktoken's model table (model.py), longest prefixes first: gpt-4o and gpt-4.1 are o200k, plain gpt-4 cl100k.
_O200K = re.compile(r"^(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|o1|o3|o4|codex-|computer-use)")
_CL100K = re.compile(r"^(?:gpt-4|gpt-3\.5|gpt-35|text-embedding-3|text-embedding-ada-002)")


@lru_cache(maxsize=1024)
def tokenizer_family(model: str | None) -> str:
    """The tokenizer family of a model id: dated snapshots, ``-latest`` aliases, Bedrock and Vertex ids and an
    ``openai/`` style provider prefix resolved; a family name maps to itself.

    Example:
        >>> tokenizer_family("claude-sonnet-4-5-20250929"), tokenizer_family("claude-opus-4-7")
        ('claude-v3', 'claude-v4.7')
        >>> tokenizer_family("gpt-4.1-2025-04-14"), tokenizer_family("gpt-4-0613")
        ('openai-o200k', 'openai-cl100k')
    """
    raw = (model or "").strip()
    if raw in FAMILIES or raw.startswith("model:"):
        return raw
    base = model_base_id(raw.rsplit("/", 1)[-1]) if raw else ""
    if base.startswith("claude-"):
        if _CLAUDE_V5.match(base):
            return CLAUDE_V5
        if _CLAUDE_V47.match(base):
            return CLAUDE_V47
        return CLAUDE_V3
    if _O200K.match(base):
        return OPENAI_O200K
    if _CL100K.match(base):
        return OPENAI_CL100K
    if base.startswith("deepseek"):
        return "deepseek"
    if base.startswith("gemini"):
        return "gemini"
    return f"model:{base or 'unknown'}"


_BPE_LOCK = threading.Lock()
_BPE: dict[str, Any] = {}


def _bpe_bindings() -> Any:
    """The compiled tokenizer of ``bpe-openai`` (ranks embedded in the extension).

    Its package ``__init__`` parses every bundled ranks file in Python (~1.5 s) for a tiktoken-compatible API
    we do not use, so the extension module is loaded on its own; any surprise in the package's layout falls
    back to the ordinary import.
    """
    try:
        spec = importlib.util.find_spec("bpe_openai")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("bpe_openai")
        folder = Path(next(iter(spec.submodule_search_locations)))
        suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
        path = next(p for p in folder.iterdir() if p.name.startswith("_bindings.") and p.name.endswith(suffixes))
        ext = importlib.util.spec_from_file_location("bpe_openai._bindings", path)
        module = importlib.util.module_from_spec(ext)  # type: ignore[arg-type]
        ext.loader.exec_module(module)  # type: ignore[union-attr]
        return module
    except (ImportError, StopIteration, OSError, AttributeError):
        try:
            from bpe_openai import _bindings  # the fallback: the package __init__ parses its ranks (~1.5 s)
        except ImportError:
            raise ImportError(
                "counting OpenAI tokens exactly needs the bpe-openai package (a dependency of promptcache_nb): "
                "pip install bpe-openai"
            ) from None
        return _bindings


class BPETokenizer:
    """OpenAI's exact byte-pair encoding of a text, offline: ``o200k_base`` or ``cl100k_base``.

    The ranks come with the ``bpe-openai`` wheel (MIT, embedded in its compiled extension; verified
    token-for-token against tiktoken 0.14 on the same ranks), so nothing is downloaded. Loaded on the first
    count (~0.3 s), then ~10 MB/s. Special-token text (``<|endoftext|>``) is counted as ordinary text.

    Example:
        >>> BPETokenizer("o200k_base").count("hello world")
        2
    """

    ENCODINGS = ("o200k_base", "cl100k_base")

    def __init__(self, encoding: str = "o200k_base") -> None:
        if encoding not in self.ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(self.ENCODINGS)}, got {encoding!r}")
        self.name = encoding

    def _backend(self) -> Any:
        backend = _BPE.get(self.name)
        if backend is None:
            with _BPE_LOCK:
                backend = _BPE.get(self.name)
                if backend is None:
                    backend = _BPE[self.name] = _bpe_bindings().tokenizer_for_encoding(self.name)
        return backend

    def count(self, text: str) -> int:
        if not text:
            return 0
        try:
            return int(self._backend().count(text))
        except UnicodeEncodeError:  # a lone surrogate: count it as the U+FFFD the API would see
            return int(self._backend().count(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")))

    def encode(self, text: str) -> list[int]:
        """The token ids (for tests and curious readers)."""
        return list(self._backend().encode(text)) if text else []

    def __repr__(self) -> str:
        return f"BPETokenizer({self.name!r})"


class ModelTokenizer:
    """The estimator chosen by the request's model: the default tokenizer of every Lab.

    ``for_model(model)`` gives, by :func:`tokenizer_family`: the exact :class:`BPETokenizer` for OpenAI
    models; ``default`` scaled by ``ratios[family]`` for the Claude families with the newer tokenizer
    (:data:`NEWER_CLAUDE_RATIO`); ``default`` itself for ``claude-v3`` and every other model. ``count(text)``
    (no model known) is ``default``'s.

    Args:
        default: the estimator of Claude and other models (:class:`HeuristicTokenizer`).
        ratios: per-family prior scales of ``default`` (merged over the built-in ones; ``1.0`` turns one off).
        exact_openai: count OpenAI models with their BPE (True) or with ``default`` (False).

    Example:
        >>> tok = ModelTokenizer()
        >>> tok.for_model("gpt-4.1").name, tok.for_model("claude-sonnet-4-5").name
        ('o200k_base', 'heuristic-v1')
        >>> tok.for_model("claude-opus-4-7").name
        'heuristic-v1*1.35[claude-v4.7]'
    """

    name = "per-model-v1"

    def __init__(self, default: Tokenizer | None = None, *, ratios: Mapping[str, float] | None = None,
                 exact_openai: bool = True) -> None:
        self.default = default or HeuristicTokenizer()
        self.ratios = {CLAUDE_V47: NEWER_CLAUDE_RATIO, CLAUDE_V5: NEWER_CLAUDE_RATIO, **(ratios or {})}
        self.exact_openai = exact_openai
        self._families: dict[str, Tokenizer] = {}

    def for_family(self, family: str) -> Tokenizer:
        """The estimator of one tokenizer family (built once)."""
        tok = self._families.get(family)
        if tok is None:
            if self.exact_openai and family == OPENAI_O200K:
                tok = BPETokenizer("o200k_base")
            elif self.exact_openai and family == OPENAI_CL100K:
                tok = BPETokenizer("cl100k_base")
            elif self.ratios.get(family, 1.0) != 1.0:
                tok = CalibratedTokenizer(self.default, SimpleNamespace(model=family, ratio=self.ratios[family]))
            else:
                tok = self.default
            self._families[family] = tok
        return tok

    def for_model(self, model: str | None) -> Tokenizer:
        """The estimator of ``model``'s requests."""
        return self.for_family(tokenizer_family(model))

    def count(self, text: str) -> int:
        return self.default.count(text)

    def count_many(self, texts: list[str]) -> list[int]:
        return count_many(self.default, texts)

    def __repr__(self) -> str:
        return f"ModelTokenizer(default={self.default.name!r}, exact_openai={self.exact_openai})"


def count_many(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """``[tokenizer.count(t) for t in texts]``: in one batch when the tokenizer offers ``count_many`` (the
    heuristic does), text by text otherwise."""
    many: Callable[[list[str]], list[int]] | None = getattr(tokenizer, "count_many", None)
    return many(texts) if many is not None else [tokenizer.count(t) for t in texts]


def estimator_for(tokenizer: Tokenizer, model: str | None) -> Tokenizer:
    """The estimator ``tokenizer`` uses for ``model`` (itself when it counts every model alike)."""
    pick = getattr(tokenizer, "for_model", None)
    return pick(model) if pick is not None else tokenizer


DEFAULT_TOKENIZER: Tokenizer = ModelTokenizer()

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
            result_tokens: int = sum(segment_tokens("block", c, tokenizer) for c in content)
        else:
            result_tokens = count(str(content))
        return result_tokens + frame + 4
    if btype in ("image", "document"):
        return IMAGE_TOKENS + frame
    if btype in ("thinking", "redacted_thinking"):
        return count(str(element.get("thinking", element.get("data", "")))) + frame
    return count(_compact({k: v for k, v in element.items() if k != "cache_control"})) + frame


class _TextsOf:
    """A tokenizer that counts nothing and keeps every text it is asked to count, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return 0


class _Counted:
    """A tokenizer answering, in order, counts made beforehand of the very texts it is asked to count."""

    def __init__(self, name: str, counts: list[int]) -> None:
        self.name = name
        self._next = iter(counts).__next__

    def count(self, text: str) -> int:
        return self._next()


def segments_tokens(items: list[tuple[str, Any]], tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> list[int]:
    """:func:`segment_tokens` of each ``(kind, element)``, with all their texts counted in one batch
    (:func:`count_many`): the same integers, for many segments at once (a stored request rebuilt whole).

    :func:`segment_tokens` itself walks each element twice: once to collect the texts it counts, in order, and once
    to add up their counts, so there is one rule for what a segment counts.
    """
    texts = _TextsOf(tokenizer.name)
    for kind, element in items:
        segment_tokens(kind, element, texts)
    counted = _Counted(tokenizer.name, count_many(tokenizer, texts.texts))
    return [segment_tokens(kind, element, counted) for kind, element in items]


_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "summary_text": "text",
               "reasoning_text": "text", "refusal": "refusal"}
_MEDIA_PARTS = frozenset({"image_url", "input_image", "file", "input_file", "input_audio"})


def _parts_tokens(content: Any, count: Callable[[str], int]) -> int:
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


def _call_tokens(name: Any, arguments: Any, count: Callable[[str], int]) -> int:
    args = arguments if isinstance(arguments, str) else _compact(arguments)
    return count(str(name or "")) + count(args) + 4


def _openai_tokens(element: Any, count: Callable[[str], int]) -> int:
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
    # read-only members: a frozen Calibration satisfies them
    @property
    def model(self) -> str: ...
    @property
    def ratio(self) -> float: ...
    @property
    def overhead(self) -> float: ...


class CalibratedTokenizer:
    """A tokenizer whose counts are ``base`` counts scaled by a fitted calibration's ``ratio``.

    A calibration (:func:`promptcache_nb.calibrate`) fits *request totals*: measured ≈ ratio × estimated
    + overhead. The ratio scales every text, so segment counts, prefix lengths and minimum-length checks
    move with it; the overhead is a per-request frame the API adds once (hidden tool/system prompt,
    message framing) that belongs to no single text, so :meth:`count` leaves it out. For a request's total
    use ``calibration.apply(prepared.total_tokens)``.

    Example:
        >>> cal = pc.analysis.load_calibration(lab, "claude-sonnet-4-5")          # doctest: +SKIP
        >>> tok = CalibratedTokenizer(HeuristicTokenizer(), cal)         # doctest: +SKIP
        >>> lab2 = pc.Lab("runs.duckdb", tokenizer=tok)                   # doctest: +SKIP
    """

    def __init__(self, base: Tokenizer, calibration: _Fit) -> None:
        self.base = base
        self.calibration = calibration
        self.name = f"{base.name}*{calibration.ratio:.4g}[{calibration.model}]"
        self._models: dict[int, Tokenizer] = {}

    def count(self, text: str) -> int:
        n = self.base.count(text)
        return round(n * self.calibration.ratio) if n else 0

    def count_many(self, texts: list[str]) -> list[int]:
        ratio = self.calibration.ratio
        return [round(n * ratio) if n else 0 for n in count_many(self.base, texts)]

    def for_model(self, model: str | None) -> Tokenizer:
        """The estimator of ``model``'s requests: ``base``'s, scaled when the calibration covers ``model``
        (its family, or every model for a pooled ``"*"`` one); a calibration of one family never scales
        another's counts."""
        inner = estimator_for(self.base, model)
        target = getattr(self.calibration, "model", "*")
        if target not in ("*", None) and tokenizer_family(target) != tokenizer_family(model):
            return inner
        if inner is self.base:
            return self
        tok = self._models.get(id(inner))
        if tok is None:
            tok = self._models[id(inner)] = CalibratedTokenizer(inner, self.calibration)
        return tok

    def __repr__(self) -> str:
        return f"CalibratedTokenizer({self.base.name!r}, ratio={self.calibration.ratio:.4g})"


def session_tokenizer(base: Tokenizer, calibration: Mapping[str, Any] | None) -> Tokenizer:
    """The tokenizer of a session: the Lab's ``base``, scaled by the calibration the session opted in to
    (its stored ``config["calibration"]``: ``model``, ``ratio``, ``overhead``).

    The one place this is decided: recording, resuming, re-simulating, what-ifs and rebuild evidence all count
    a session's requests with it, so a request stored as N estimated tokens re-simulates as N.
    """
    if not calibration:
        return base
    return CalibratedTokenizer(base, SimpleNamespace(**calibration))
