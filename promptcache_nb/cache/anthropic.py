"""Anthropic prompt caching, as documented (docs/provider_cache_rules.md#anthropic-breakpoints and
the Anthropic sections after it, whose "notes §1.x" the section numbers below refer to; sources [A1]-[A3]).

Rules modelled, each cited where it is applied:

* explicit ``cache_control`` blocks and top-level automatic caching, which marks the last eligible block
  (§1.1); at most 4 breakpoints, the automatic one included (the API's 400 text on more);
* prefix order tools → system → messages and exact matching (§1.2); one entry written per breakpoint, a
  cumulative hash of the prefix ending there (§1.4 rule 1);
* reads walk back from each breakpoint, latest first, at most 20 positions counting the breakpoint
  itself (§1.4 rules 2-3) — the docs' 10/15/35-block example is a test;
* per-model minimum cacheable length, a dated table (§1.5); shorter prefixes are neither read nor written.
  A Claude model the table lacks (``claude-sonnet-5-5``) is simulated with its family's nearest documented row
  (:func:`model_rule`), and every result says so in ``detail["model_rule"]`` — never "unsupported"
  (docs/provider_cache_rules.md#anthropic-minimum-length);
* 5m and 1h TTLs, refreshed for free on every read; entries are visible only once the writing
  response has begun (``ttft_seconds``) (§1.6);
* a read refreshes every live entry along the prefix it read, not only the entry it matched: the
  cached content is "refreshed for no additional cost each time [it] is used" [A1][A2], and reading a
  longer prefix uses the shorter ones' content. The docs do not say it in so many words
  (docs/provider_cache_rules.md#anthropic-lookback lists the refresh scope as ambiguous); measured logs
  settle it — a system-prompt entry is still read 11 minutes after its last write while the conversation
  after it is read every few seconds (issue 11).
  ``refresh_along_prefix=False`` restores the narrower reading (only the matched entry);
* 1h breakpoints must come before 5m ones; the bill splits as read = A, 1h write = B − A,
  5m write = C − B (§1.8);
* caches keyed by model; ``tool_choice`` and thinking changes invalidate the messages level only;
  ``speed`` the system level (§1.3 table). A request whose chain diverges where its messages start while its
  ``thinking`` differs from the previous request's is ``thinking_changed`` (tools and system still read).

Stated assumptions where the docs are silent: a string ``content`` counts as one block; run coalescing of
``tool_use`` / ``tool_result`` blocks ([A4], 3P only) is off unless ``coalesce_tool_runs=True``; the
1h-after-5m order is treated as HTTP 400.

**The client's breakpoints on partial bodies** (``assume_client_breakpoints``, on by default). A log that
lacks the system prompt and tools (a Claude Code transcript, imported with ``partial=True``) also lacks the
``cache_control`` markers the client put on them, so its bodies carry no marker at all and would read as
``no_breakpoint``. For such a body — an unlogged prefix and no marker anywhere — the model assumes the
layout Claude Code sends: a breakpoint at the end of the system prompt (the unlogged prefix) and one on
the last block of the conversation, which moves forward every turn ("on a normal turn, the prefix is the
entire previous request", code.claude.com/docs/en/prompt-caching [A6]; third-party captures of its
requests show ``cache_control`` on the system blocks and the latest message, none on the tools:
akaszubski/anyclaude-local#6, diegosouzapw/OmniRoute#8934). Each breakpoint's TTL is ``client_ttls``
(prefix, conversation); importing sets it from the measured 5m/1h write split of the session's requests
(:func:`client_ttls_from_usage`: Claude Code writes its system prompt with a 1h TTL and the conversation
with 5m when both appear). The stored body is never changed: the markers exist only in the simulation.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from .._util import common_prefix_length, model_base_id
from ..errors import InvalidRequestError, UnknownModelError
from ..request import PreparedRequest, canonical_json
from ..request._canonical import prefix_record
from ..usage import Usage
from ._base import CacheModel, CacheResult
from ._reasons import Reason, first_request_reason, thinking_change

LOOKBACK_POSITIONS = 20
MAX_BREAKPOINTS = 4
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}

# Minimum cacheable prompt length per model (§1.5), as of the 2026-04-16 docs copy [A2] unless noted.
# Where copies conflict we pick the value observed in production reports and say so.
MIN_CACHEABLE_TOKENS: dict[str, int] = {
    "claude-opus-4-8": 1024,  # [A12]
    "claude-opus-4-7": 4096,  # [A3]; 3P summaries say 2048
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-opus-4-1": 1024,
    "claude-opus-4": 1024,
    "claude-sonnet-4-6": 2048,  # [A2] 2026-04-16 and observed in [A11]; a later copy says 1024
    "claude-sonnet-4-5": 1024,
    "claude-sonnet-4": 1024,
    "claude-3-7-sonnet": 1024,
    "claude-3-5-sonnet": 1024,  # [A1]
    "claude-3-opus": 1024,  # [A1]
    "claude-haiku-4-5": 4096,
    "claude-3-5-haiku": 2048,
    "claude-3-haiku": 2048,
    # [A16]: the later copy of the page, as quoted verbatim in third-party notes ("512 tokens for Claude Opus 5,
    # Claude Fable 5, and Claude Mythos 5 … 1,024 tokens for Claude Opus 4.8, Claude Sonnet 5, ...")
    "claude-opus-5": 512,
    "claude-fable-5": 512,
    "claude-mythos-5": 512,
    "claude-sonnet-5": 1024,
}
MIN_TABLE_AS_OF = "2026-04-16"  # the 5-series rows: the later copy [A16]

#: Claude model families: a model of one of them that the table lacks takes its family's nearest documented row.
FAMILIES = ("opus", "sonnet", "haiku", "fable", "mythos")
# claude-<family>-<major>[-<minor>] (4.x and later) or claude-<major>[-<minor>]-<family> (3.x)
_NEW_STYLE = re.compile(r"claude-(?P<family>[a-z]+)-(?P<major>\d)(?:-(?P<minor>\d))?")
_OLD_STYLE = re.compile(r"claude-(?P<major>\d)(?:-(?P<minor>\d))?-(?P<family>[a-z]+)")


def resolve_model(model: str) -> str:
    """Map a model id to its row of the minimum table, exactly: the id itself, its dated snapshots
    (``claude-sonnet-4-5-20250929``, Vertex ``@20250929``), ``-latest``, the ``-0`` aliases of the 4.0
    models (``claude-opus-4-0``) and Bedrock ids (``anthropic.claude-sonnet-4-5-20250929-v1:0``).

    Never by prefix: ``claude-opus-4-9`` is not ``claude-opus-4`` (its minimum and price differ), so an id
    the table lacks raises :class:`~promptcache_nb.errors.UnknownModelError` (the cache model then simulates a
    Claude model with its family's rule: :func:`model_rule`).
    """
    return _exact_row(model, MIN_CACHEABLE_TOKENS)


def _exact_row(model: str, table: Mapping[str, int]) -> str:
    if model in table:
        return model
    base = model_base_id(model)
    if base in table:
        return base
    if base.endswith("-0") and base[:-2] in table:
        return base[:-2]
    raise UnknownModelError(model, list(table))


@dataclass(frozen=True)
class ModelRule:
    """The minimum-length rule one model is simulated with (§1.5)."""

    model: str  #: the model's own id (its dated snapshots and aliases are one cache): the key of its entries
    row: str  #: the row of the minimum table that applies: the model's own, or its family's nearest
    note: str | None  #: why ``row`` is not the model's own (None when it is)


def _family_version(model_id: str) -> tuple[str, tuple[int, int]] | None:
    """(family, (major, minor)) of a Claude model id, or None when it names no known family."""
    found = _NEW_STYLE.fullmatch(model_id) or _OLD_STYLE.fullmatch(model_id)
    if found is None or found.group("family") not in FAMILIES:
        return None
    return found.group("family"), (int(found.group("major")), int(found.group("minor") or 0))


def model_rule(model: str, table: Mapping[str, int] = MIN_CACHEABLE_TOKENS) -> ModelRule:
    """The row of ``table`` (minimum cacheable tokens by model) that ``model`` is simulated with.

    Its own row when the table has one (:func:`resolve_model`'s exact matching). Otherwise, for a Claude model
    of a known family (:data:`FAMILIES`), the family's nearest documented row — the latest at or before the
    model's version, else the earliest after it — with a note saying so: a new model is simulated with the
    rule of the model it succeeds, and the result says it was not its own
    (docs/provider_cache_rules.md#anthropic-minimum-length).

    Raises:
        UnknownModelError: not a Claude model of a known family (``gpt-4o``, ``claude-2``, a misspelt id).

    Example:
        >>> model_rule("claude-sonnet-5-5-20261001").row, model_rule("claude-haiku-5-5").row
        ('claude-sonnet-5', 'claude-haiku-4-5')
    """
    try:
        row = _exact_row(model, table)
        return ModelRule(row, row, None)
    except UnknownModelError:
        base = model_base_id(model)
        parsed = _family_version(base)
        if parsed is None:
            raise
    family, version = parsed
    rows = sorted((v, r) for r in table if (fv := _family_version(r)) is not None and fv[0] == family
                  for v in (fv[1],))
    if not rows:
        raise UnknownModelError(model, list(table))
    before = [r for v, r in rows if v <= version]
    row = before[-1] if before else rows[0][1]
    note = (f"{base} has no documented minimum cacheable length: simulated with {row}'s ({table[row]:,} tokens), "
            f"the nearest documented {family} model")
    return ModelRule(base, row, note)


def client_ttls_from_usage(usages: Iterable[Any]) -> tuple[str, str] | None:
    """The TTLs a client gave its (prefix, last block) breakpoints, read from measured usage: the
    ``cache_creation`` 5m/1h split tells which TTL the client asked for (log_formats.md, Claude Code).

    A 1h write anywhere means the prefix was written with 1h; a 5m write means the conversation was (1h
    before 5m is the only order the API accepts, §1.8); only 1h writes: both 1h. None when no request
    reports a split (unknown: the API's default, 5m, applies).

    Example:
        >>> from promptcache_nb import Usage
        >>> client_ttls_from_usage([Usage(4, 0, 14259, 49, 14210), Usage(3, 14259, 422, 422, 0)])
        ('1h', '5m')
    """
    w5 = w1h = 0
    for u in usages:
        w5 += getattr(u, "cache_creation_5m_input_tokens", None) or 0
        w1h += getattr(u, "cache_creation_1h_input_tokens", None) or 0
    if not w5 and not w1h:
        return None
    return ("1h" if w1h else "5m", "5m" if w5 else "1h")


class _Cell:
    """One expiry shared by the entries a read refreshed together (see :class:`_Along`)."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


class _Entry:
    """A cache entry. Its expiry is its own, or the cell it shares with the entries refreshed with it."""

    __slots__ = ("ttl", "_expires", "visible_at", "written_at", "tokens", "cell", "writer")

    def __init__(self, ttl: str, expires_at: float, visible_at: float, written_at: float, tokens: int,
                 writer: Hashable = None) -> None:
        self.ttl, self._expires, self.visible_at, self.written_at, self.tokens = (
            ttl, expires_at, visible_at, written_at, tokens)
        self.cell: _Cell | None = None
        #: the request stream (a session id, :meth:`CacheModel.stream`) that wrote it: a read by another names it
        self.writer = writer

    @property
    def expires_at(self) -> float:
        cell = self.cell
        return self._expires if cell is None else cell.value

    @expires_at.setter
    def expires_at(self, value: float) -> None:
        self.cell, self._expires = None, value

    def detach(self) -> None:
        """Keep the current expiry as the entry's own (its cell's later refreshes no longer apply)."""
        cell = self.cell
        if cell is not None:
            self.cell, self._expires = None, cell.value


class _Along:
    """The live entries on the current request's chain, by position: what a read refreshes along its prefix.

    A read refreshes every live entry up to the one it hit: in a long session, hundreds of entries every
    request. The entries one read refreshed share one expiry per TTL (a :class:`_Cell`), so the next read
    refreshes them all with one assignment per TTL while every one of them lies at or below its hit (the
    usual turn, which reads what the previous one wrote); any other case walks the entries one by one.

    Invariant: an entry sharing one of ``cells`` is in ``entries`` (on the chain); entries leaving the
    chain or replaced by a write are detached first.
    """

    def __init__(self) -> None:
        self.entries: dict[int, _Entry] = {}  # may keep dead entries: they are never refreshed again
        self.top = -1  # the highest position in entries
        self.cells: dict[str, tuple[_Cell, int]] = {}  # ttl -> (cell, highest position sharing it)
        self.loose: set[int] = set()  # positions whose entry has its own expiry (or another's cell)

    def _release(self, entry: _Entry) -> None:
        cell = entry.cell
        if cell is not None and any(cell is c for c, _ in self.cells.values()):
            entry.detach()

    def cut(self, n: int) -> None:
        """Keep the positions below ``n`` (the run the new request shares with the previous one)."""
        if self.top < n:
            return
        for i in [i for i in self.entries if i >= n]:
            self._release(self.entries.pop(i))
        self.loose = {i for i in self.loose if i < n}
        self.top = max(self.entries, default=-1)

    def add(self, i: int, entry: _Entry) -> None:
        old = self.entries.get(i)
        if old is not None and old is not entry:
            self._release(old)
        self.entries[i] = entry
        self.loose.add(i)
        self.top = max(self.top, i)

    def refresh(self, hit: int, t: float) -> None:
        """Every live, visible entry at positions up to ``hit`` expires at ``t`` + its TTL (§1.6)."""
        if any(top > hit and cell.value > t for cell, top in self.cells.values()):
            self._refresh_each(hit, t)
            return
        cells: dict[str, tuple[_Cell, int]] = {}
        for ttl, (cell, top) in self.cells.items():
            if cell.value > t:  # a dead cell's entries stay dead
                cell.value = t + TTL_SECONDS[ttl]
                cells[ttl] = (cell, top)
        loose: set[int] = set()
        for i in self.loose:
            e = self.entries[i]
            if e.expires_at <= t:
                continue
            if i <= hit and e.visible_at <= t:
                _share_expiry(cells, e, i, t)
            else:
                loose.add(i)
        self.cells, self.loose = cells, loose

    def _refresh_each(self, hit: int, t: float) -> None:
        ours = [c for c, _ in self.cells.values()]
        live: dict[int, _Entry] = {}
        cells: dict[str, tuple[_Cell, int]] = {}
        loose: set[int] = set()
        for i, e in self.entries.items():
            if e.cell is not None and any(e.cell is c for c in ours):
                e.detach()
            if e.expires_at <= t:
                continue
            live[i] = e
            if i <= hit and e.visible_at <= t:
                _share_expiry(cells, e, i, t)
            else:
                loose.add(i)
        self.entries, self.cells, self.loose = live, cells, loose
        self.top = max(live, default=-1)


def _first_index(segments: Any, pred: Any) -> int:
    """Index of the first segment matching ``pred`` (tools and system come first: a short walk)."""
    for i, s in enumerate(segments):
        if pred(s):
            return i
    return len(segments)


def _h(parent: bytes, key: str) -> bytes:
    return hashlib.sha256(parent + key.encode()).digest()[:16]


class AnthropicCache(CacheModel):
    """Simulated Anthropic prompt cache for one workspace (its options: :class:`AnthropicCache.Options`)."""

    name: ClassVar[str] = "anthropic"
    known_models: ClassVar[tuple[str, ...]] = tuple(MIN_CACHEABLE_TOKENS)
    #: the documented minimum cacheable length per model, before ``options.min_tokens``
    min_table: ClassVar[Mapping[str, int]] = MIN_CACHEABLE_TOKENS

    class Options(CacheModel.Options):
        ttft_seconds: float = Field(0.5, ge=0, description="seconds before an entry written by a request becomes "
                                    "readable (the response must have begun, §1.6)")
        min_tokens: dict[str, int] | None = Field(None, description="per-model overrides of the minimum "
                                                  "cacheable length table")
        lookback: int = Field(LOOKBACK_POSITIONS, ge=1, description="positions checked per breakpoint (20)")
        coalesce_tool_runs: bool = Field(False, description="count a run of consecutive tool_use (or "
                                         "tool_result) blocks as one position")
        refresh_along_prefix: bool = Field(True, description="a read refreshes every live entry along the prefix "
                                           "it read (True) or only the entry it matched (False)")
        assume_client_breakpoints: bool = Field(True, description="a partial body (an unlogged prefix) with no "
                                                "cache_control anywhere gets the client's layout: a breakpoint at "
                                                "the end of the unlogged prefix and one on the last block")
        client_ttls: tuple[Literal["5m", "1h"], Literal["5m", "1h"]] = Field(
            ("5m", "5m"), description="TTLs of the assumed breakpoints: (unlogged prefix, last block)")

        @field_validator("client_ttls")
        @classmethod
        def _ttl_order(cls, value: tuple[str, str]) -> tuple[str, str]:
            if value == ("5m", "1h"):
                raise ValueError("a 1h breakpoint must not come after a 5m one: use ('1h', '5m'), ('1h', '1h') or "
                                 "('5m', '5m')")
            return value

    options: Options

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: the minimum cacheable length per model: the documented table with ``options.min_tokens`` over it
        self.min_tokens = {**self.min_table, **(self.options.min_tokens or {})}
        self._rules: dict[str, ModelRule] = {}
        self.reset()

    def _options_changed(self) -> None:
        self.min_tokens = {**self.min_table, **(self.options.min_tokens or {})}
        self._rules = {}

    def reset(self) -> None:
        self._entries: dict[tuple[str, bytes], _Entry] = {}
        self._prev_keys: list[str] = []
        self._prev_chain: list[bytes] = []
        self._prev_segments: tuple[Any, ...] = ()
        self._prev_salts: tuple[Any, ...] = ()
        self._salts_now: tuple[Any, ...] = ()
        self._prev_model: str | None = None
        self._prev_rest: dict[str, Any] = {}  # the previous request's top-level fields (its thinking settings)
        self._prev_total = 0
        self._prev_cacheable = 0
        self._prev_written: set[int] = set()
        # entries known to lie on the previous request's chain (refresh along prefix)
        self._along: _Along | None = None  # None: unknown (no request yet, or another stream ran since)
        self._shared_now = 0

    stream_state: ClassVar[tuple[str, ...]] = (
        "_prev_keys", "_prev_chain", "_prev_segments", "_prev_salts", "_prev_model", "_prev_rest", "_prev_total",
        "_prev_cacheable", "_prev_written", "_along",
    )

    def _stream_switched(self) -> None:
        self._along = None  # another stream may have written entries on this chain since

    def state_horizon_seconds(self) -> float:
        """One hour: the longest TTL (§1.6); an entry untouched for that long has expired."""
        return max(TTL_SECONDS.values())

    def validate_model(self, model: str) -> str:
        return self.model_rule(model).model

    def model_rule(self, model: str) -> ModelRule:
        """The minimum-length rule ``model`` is simulated with (:func:`model_rule` over ``self.min_tokens``).

        Raises:
            UnknownModelError: not a Claude model this cache can simulate.
        """
        rule = self._rules.get(model)
        if rule is None:
            rule = self._rules[model] = model_rule(model, self.min_tokens)
        return rule

    # -- validation ---------------------------------------------------------------------------
    def breakpoints(self, req: PreparedRequest) -> list[tuple[int, str]]:
        """(segment index, ttl) of every breakpoint, validated as the API does (HTTP 400 otherwise).

        Computed once per request and layout (the session asks again for the ideal read of the next turn).
        """
        layout = self._layout_key()
        got = req.derived.breakpoints
        if got is None or got[0] != layout:
            got = req.derived.breakpoints = (layout, self._breakpoints(req))
        return got[1]

    def _layout_key(self) -> tuple[Any, ...]:
        """What decides a request's breakpoints besides the request (the key of their memo on the request)."""
        return (self.name, self.options.assume_client_breakpoints, self.options.client_ttls)

    def _automatic(self, req: PreparedRequest) -> Any:
        """The body's top-level ``cache_control`` (automatic caching, §1.1), or None."""
        return req.rest.get("cache_control")

    def _writes(self, marks: list[tuple[int, str]], cum: list[int], read: int, minimum: int) -> list[tuple[int, str]]:
        """The breakpoints a request writes: beyond what it read, and long enough (§1.5: the whole prefix up to the
        breakpoint counts)."""
        return [(bp, ttl) for bp, ttl in marks if cum[bp] > read and cum[bp] >= minimum]

    def _native(self, usage: Usage) -> dict[str, Any]:
        """The usage object as this provider's API reports it."""
        return usage.to_anthropic()

    def _explicit_marks(self, req: PreparedRequest) -> list[tuple[int, str]]:
        """(index, ttl) of every segment's own ``cache_control``: the previous request's for the leading
        segments the two share as the very same objects, a walk over the new ones only (O(new segments))."""
        prev, k = prefix_record(req)
        known = prev.derived.explicit_marks if prev is not None and k else None
        marks: list[tuple[int, str]] = [m for m in known if m[0] < k] if known is not None else []
        segs = req.segments
        for i in range(k if known is not None else 0, len(segs)):
            cc = segs[i].cache_control
            if cc is not None:
                marks.append((i, self._ttl_of(cc)))
        req.derived.explicit_marks = tuple(marks)
        return marks

    def _breakpoints(self, req: PreparedRequest) -> list[tuple[int, str]]:
        marks = self._explicit_marks(req)
        auto = self._automatic(req)
        if (not marks and auto is None and self.options.assume_client_breakpoints and req.segments
                and req.segments[0].kind == "unlogged"):
            return self._client_breakpoints(req)
        if auto is not None:
            ttl = self._ttl_of(auto)
            target = self._last_eligible(req)
            if target is not None:
                existing = dict(marks).get(target)
                if existing is None:
                    if len(marks) >= MAX_BREAKPOINTS:
                        raise InvalidRequestError(
                            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                            f"Found {len(marks) + 1}."
                        )
                    marks.append((target, ttl))
                    marks.sort()
                elif existing != ttl:
                    raise InvalidRequestError(
                        "cache_control: the automatic cache_control TTL conflicts with the explicit "
                        f"cache_control on the last block ({ttl!r} vs {existing!r})"
                    )
        if len(marks) > MAX_BREAKPOINTS:
            raise InvalidRequestError(
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(marks)}."
            )
        seen_5m = False
        for _, ttl in marks:
            if ttl == "5m":
                seen_5m = True
            elif seen_5m:
                raise InvalidRequestError(
                    "cache_control: a ttl='1h' cache_control block must not come after a ttl='5m' block"
                )
        return marks

    def _client_breakpoints(self, req: PreparedRequest) -> list[tuple[int, str]]:
        """The layout the client sent and the log dropped: the end of the unlogged prefix, and automatic
        caching on the last eligible block (module docstring)."""
        prefix_ttl, tail_ttl = self.options.client_ttls
        marks: list[tuple[int, str]] = [(0, prefix_ttl)]
        last = self._last_eligible(req)
        if last is not None and last > 0:
            marks.append((last, tail_ttl))
        return marks

    @staticmethod
    def _ttl_of(cc: Any) -> str:
        if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
            raise InvalidRequestError("cache_control.type: Input should be 'ephemeral'")
        ttl = cc.get("ttl", "5m")
        if ttl not in TTL_SECONDS:
            raise InvalidRequestError(f"cache_control.ttl: Input should be '5m' or '1h', got {ttl!r}")
        return str(ttl)

    @staticmethod
    def _last_eligible(req: PreparedRequest) -> int | None:
        # Automatic caching walks back over blocks that cannot carry cache_control (§1.1 edge cases).
        for i in range(len(req.segments) - 1, -1, -1):
            el = req.segments[i].element
            if isinstance(el, str):
                if el:
                    return i
                continue
            if isinstance(el, dict):
                t = el.get("type")
                if t in ("thinking", "redacted_thinking") or (t == "text" and not el.get("text")):
                    continue
                return i
        return None

    # -- hashing ------------------------------------------------------------------------------
    def _keys(self, req: PreparedRequest) -> list[str]:
        sys_salt = canonical_json({"speed": req.rest.get("speed")})
        msg_salt = canonical_json(
            {k: req.rest.get(k) for k in ("tool_choice", "thinking", "output_config")}
        )
        salts = (sys_salt, msg_salt)
        segments = req.segments
        keys: list[str] = []
        sys_done = msg_done = False
        # Leading segments that are the very objects of the previous request keep their keys.
        self._keys_shared = 0
        prev = self._prev_segments
        if prev and self._prev_salts == salts:
            # identical objects compare by identity, in C; prepare() recorded how many lead the way already
            before, k = prefix_record(req)
            n = common_prefix_length(segments, prev, k if before is not None and before.segments is prev else 0)
            if n:
                self._keys_shared = n
                keys = self._prev_keys[:n]
                sys_done = n > _first_index(segments, lambda s: s.kind != "tool")
                msg_done = n > _first_index(segments, lambda s: s.level == "messages")
                segments = segments[n:]
        self._salts_now = salts
        for seg in segments:
            key = f"{seg.kind}:{seg.role or ''}:{seg.content_hash}"
            if seg.kind != "tool" and not sys_done:
                key += "|" + sys_salt
                sys_done = True
            if seg.level == "messages" and not msg_done:
                key += "|" + msg_salt
                msg_done = True
            keys.append(key)
        return keys

    def _chain(self, keys: list[str]) -> list[bytes]:
        # Reuse the previous request's chain for the shared leading run: O(new segments) per turn.
        prev_keys, prev_chain = self._prev_keys, self._prev_chain
        n = common_prefix_length(keys, prev_keys, self._keys_shared)
        self._shared_now = n
        chain = prev_chain[:n]
        parent = chain[-1] if chain else b"root"
        for key in keys[n:]:
            parent = _h(parent, key)
            chain.append(parent)
        return chain

    def _positions(self, req: PreparedRequest) -> list[int]:
        """Lookback position number per segment (consecutive tool runs share one when coalescing)."""
        if not self.options.coalesce_tool_runs:
            return range(len(req.segments))  # type: ignore[return-value]
        pos, out, prev = -1, [], None
        for seg in req.segments:
            t = seg.element.get("type") if isinstance(seg.element, dict) else None
            run = t if (self.options.coalesce_tool_runs and t in ("tool_use", "tool_result")) else None
            if run is None or run != prev:
                pos += 1
            prev = run
            out.append(pos)
        return out

    # -- the model ----------------------------------------------------------------------------
    def default_ttl_seconds(self, request: PreparedRequest) -> float:
        marks = self.breakpoints(request)
        return TTL_SECONDS[marks[-1][1]] if marks else TTL_SECONDS["5m"]

    def min_cacheable_tokens(self, model: str) -> int:
        return self.min_tokens[self.model_rule(model).row]

    def ttls_for(self, model: str) -> tuple[str, ...]:
        return tuple(TTL_SECONDS)  # 5m and 1h on every model (§1.6)

    def retention_points(self, request: PreparedRequest) -> list[tuple[int, float]]:
        # The whole request lives as long as its last breakpoint's TTL; an earlier 1h breakpoint keeps
        # its shorter prefix alive after the 5m part has expired.
        marks = self.breakpoints(request)
        if not marks:
            return [(request.total_tokens, TTL_SECONDS["5m"])]
        cum = request.cumulative_tokens()
        points = [(cum[bp], TTL_SECONDS[ttl]) for bp, ttl in marks]
        points.append((request.total_tokens, TTL_SECONDS[marks[-1][1]]))
        return points

    def process(self, request: PreparedRequest, at: datetime) -> CacheResult:
        rule = self.model_rule(request.model)
        model, minimum = rule.model, self.min_tokens[rule.row]
        marks = self.breakpoints(request)
        t = at.timestamp()
        keys = self._keys(request)
        chain = self._chain(keys)
        cum = request.cumulative_tokens()
        total = cum[-1] if cum else 0
        positions = self._positions(request)

        hit: int | None = None
        expired_seen: _Entry | None = None
        lookback = self.options.lookback
        for bp, _ttl in sorted(marks, reverse=True):
            i = bp
            while i >= 0 and positions[bp] - positions[i] < lookback:
                e = self._entries.get((model, chain[i]))
                if e is not None:
                    if e.visible_at <= t < e.expires_at:
                        hit = i
                        break
                    if t >= e.expires_at and expired_seen is None:
                        expired_seen = e
                i -= 1
            if hit is not None:
                break
        read = cum[hit] if hit is not None else 0
        along = self._entries_along(model, chain, t) if self.options.refresh_along_prefix else None
        stream = self.__dict__.get("_stream_key")
        read_from: Hashable = None
        if hit is not None:
            e = self._entries[(model, chain[hit])]
            if e.writer is not None and e.writer != stream:
                read_from = e.writer  # another session of the cache's scope wrote what this one read
            if along is not None and along.entries.get(hit) is e:
                along.refresh(hit, t)  # free refresh on read (§1.6), of every live entry the read went through
            else:
                e.expires_at = t + TTL_SECONDS[e.ttl]
                if along is not None:
                    along.refresh(hit - 1, t)

        writes = self._writes(marks, cum, read, minimum)
        for bp, ttl in writes:
            entry = self._entries[(model, chain[bp])] = _Entry(
                ttl, t + TTL_SECONDS[ttl], t + self.options.ttft_seconds, t, cum[bp], stream
            )
            if along is not None:
                along.add(bp, entry)
        if along is not None:
            self._along = along
        b = max((cum[bp] for bp, ttl in writes if ttl == "1h"), default=read)
        c = max((cum[bp] for bp, _ in writes), default=read)
        w1h, w5m = b - read, c - b
        usage = Usage(
            input_tokens=total - c,
            cache_read_input_tokens=read,
            cache_creation_input_tokens=w1h + w5m,
            cache_creation_5m_input_tokens=w5m,
            cache_creation_1h_input_tokens=w1h,
            source="simulated",
        )
        # read, write, uncached: three runs, found by bisection of the cumulative sums
        n_read = bisect_right(cum, read) if read else 0
        n_write = bisect_right(cum, c)
        states = ("read",) * n_read + ("write",) * (n_write - n_read) + ("uncached",) * (len(cum) - n_write)
        detail: dict[str, Any] = {
            "breakpoints": [request.segments[bp].path for bp, _ in marks],
            "breakpoint_ttls": [ttl for _, ttl in marks],
            "hit_path": request.segments[hit].path if hit is not None else None,
            "written_paths": [request.segments[bp].path for bp, _ in writes],
            "min_tokens": minimum,
            "model": model,
        }
        if rule.note is not None:
            detail["model_rule"] = rule.note  # another model's documented minimum, said on every row
        if marks and marks[0][0] == 0 and request.segments[0].kind == "unlogged":
            detail["assumed_breakpoints"] = True  # the client's layout, not markers of the logged body
        if read_from is not None:
            detail["read_from_session"] = str(read_from)
        reason = self._reason(request, model, marks, chain, positions, cum, read, minimum, t, expired_seen, detail)
        self._prev_keys, self._prev_chain = keys, chain
        self._prev_segments, self._prev_salts = request.segments, self._salts_now
        self._prev_model, self._prev_total, self._prev_rest = model, total, dict(request.rest)
        self._prev_cacheable = c  # the longest prefix this request read or wrote: what it left cached
        self._prev_written = {bp for bp, _ in writes}
        return CacheResult(usage, Reason(reason), detail, states, self._native(usage))

    def _entries_along(self, model: str, chain: list[bytes], t: float) -> _Along:
        """Live entries on ``chain`` by position: the previous request's for the shared run (entries
        never move), looked up for the new positions only — O(new segments) per request."""
        along = self._along if model == self._prev_model else None
        if along is None:
            along, n = _Along(), 0
        else:
            n = self._shared_now
            along.cut(n)
        get = self._entries.get
        for i in range(n, len(chain)):
            e = get((model, chain[i]))
            if e is not None and e.expires_at > t:
                along.add(i, e)
        return along

    def _reason(
        self, req: PreparedRequest, model: str, marks: list[tuple[int, str]], chain: list[bytes], positions: list[int],
        cum: list[int], read: int, minimum: int, t: float, expired_seen: _Entry | None, detail: dict[str, Any],
    ) -> str:
        if self._prev_model is None:
            # the first request of its session: a read came from another session sharing the cache
            return first_request_reason(read, detail)
        # the first position where this request's prefix differs from the previous one
        n = common_prefix_length(chain, self._prev_chain, self._shared_now)
        detail["divergence_index"] = n
        detail["divergence_path"] = req.segments[n].path if n < len(req.segments) else None
        # a hit reads everything the previous request left cached — up to its last breakpoint, which need not
        # be its last block (a marker on the system prompt only: every later request reading it is a hit)
        possible = min(self._prev_cacheable, cum[-1] if cum else 0)
        if possible and read >= possible and self._prev_model == model:
            return "hit"
        if self._prev_model != model:
            detail["previous_model"] = self._prev_model
            return "model_switch"
        if not marks:
            return "no_breakpoint"
        if cum and cum[marks[-1][0]] < minimum:
            return "below_minimum"
        if expired_seen is not None:
            detail["expired_after_seconds"] = round(t - expired_seen.expires_at + TTL_SECONDS[expired_seen.ttl], 3)
            detail["expired_ttl"] = expired_seen.ttl
            return "ttl_expired"
        # a live entry on this chain that no lookback window reached (a full scan, on misses only)
        for i in range(len(chain) - 1, -1, -1):
            e = self._entries.get((model, chain[i]))
            if e is not None and e.visible_at <= t < e.expires_at and cum[i] > read:
                if all(positions[bp] - positions[i] >= self.options.lookback for bp, _ in marks if bp >= i):
                    detail["unreached_path"] = req.segments[i].path
                    detail["unreached_tokens"] = cum[i]
                    return "lookback_exceeded"
        # the thinking settings salt the messages level only (§1.3): the chain diverges where the messages start
        thinking = thinking_change(self._prev_rest, req.rest)
        if thinking is not None and n < len(req.segments) and req.segments[n].level == "messages":
            detail.update(thinking)
            return "thinking_changed"
        if n < len(self._prev_chain):
            return "prefix_changed"
        return "not_written"


def _share_expiry(cells: dict[str, tuple[_Cell, int]], entry: _Entry, index: int, t: float) -> None:
    """Put ``entry`` (read at ``t``) in its TTL's shared expiry cell: one refresh then moves them all."""
    cell, top = cells.get(entry.ttl) or (_Cell(t + TTL_SECONDS[entry.ttl]), index)
    entry.cell = cell
    cells[entry.ttl] = (cell, max(top, index))


AnthropicOptions = AnthropicCache.Options  # its former name
