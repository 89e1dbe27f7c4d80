"""What every context strategy gets and returns.

A strategy turns the session's state (host prompt, tools, knowledge, history, clock, events) into the
exact Anthropic Messages body for the next request. It keeps every bit of state it needs in
``ctx.state`` (the ``session_state`` row) and ``ctx.deltas`` (``session_prompt_deltas``), so a restart
that rebuilds the context from the store yields byte-identical requests.
"""

from __future__ import annotations

import json
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Self

from .._options import Options as _Options
from .._types import Delta, KnowledgeEntry
from .._util import digest

DEFAULT_MAX_TOKENS = 4096
EPHEMERAL = {"type": "ephemeral"}
EPHEMERAL_1H = {"type": "ephemeral", "ttl": "1h"}


class DeltaTable:
    """The session's ``session_prompt_deltas`` rows; writes land in the turn's transaction."""

    def __init__(self, rows: list[Delta]) -> None:
        self._rows = {d.seq: d for d in rows}
        self.ops: list[tuple[str, int, dict[str, Any] | None, dict[str, Any] | None]] = []

    def list(self) -> list[Delta]:
        """Rows ordered by seq."""
        return [self._rows[k] for k in sorted(self._rows)]

    def append(self, selector: dict[str, Any], content: dict[str, Any]) -> int:
        """Add a row with seq = MAX(seq) + 1 (Lore's ``appendSessionPromptDelta``)."""
        seq = max(self._rows, default=-1) + 1
        self.upsert(seq, selector, content)
        return seq

    def upsert(self, seq: int, selector: dict[str, Any], content: dict[str, Any]) -> None:
        self._rows[seq] = Delta(seq, selector, content)
        self.ops.append(("upsert", seq, selector, content))

    def delete(self, seq: int) -> None:
        self._rows.pop(seq, None)
        self.ops.append(("delete", seq, None, None))


@dataclass
class StrategyContext:
    """Everything a strategy may read, and the two places it may write (``state``, ``deltas``).

    ``messages`` is the conversation as the agent knows it, the current user message (or tool result)
    last. Treat it and its dicts as read-only: they are shared with the session's history. ``params`` are
    the strategy's options as the session stored them (checked against :attr:`Strategy.Options` when the
    session was created). ``previous_messages`` is the history the session's previous strategy-built
    request was made from (None before the first one, or when the store cannot tell): what a strategy
    would otherwise persist in ``state`` on every turn (a message count, digests) comes from it.
    """

    session_id: str
    project_id: str
    request_index: int
    now: datetime
    model: str
    host_prompt: str
    tools: list[dict[str, Any]]
    knowledge: list[KnowledgeEntry]
    messages: list[dict[str, Any]]
    events: tuple[str, ...]
    state: dict[str, Any]
    deltas: DeltaTable
    params: dict[str, Any] = field(default_factory=dict)
    previous_messages: list[dict[str, Any]] | None = None

    @property
    def latest_user_text(self) -> str:
        for m in reversed(self.messages):
            if m["role"] != "user":
                continue
            content = m["content"]
            if isinstance(content, str):
                return content
            texts = [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]
            if texts:
                return "\n".join(texts)
        return ""

    @property
    def extra(self) -> dict[str, Any]:
        """Strategy-specific persisted state (JSON-serialisable values only)."""
        extra: dict[str, Any] = self.state.setdefault("extra", {})
        return extra


class Strategy(ABC):
    """Assemble a request. Subclasses set ``name``, ``title`` and ``source`` (the system they reproduce).

    A strategy with parameters declares them once, in a nested ``Options`` model (a subclass of
    ``Strategy.Options``, described fields with defaults), and reads ``self.options.x``; the constructor takes
    the same names as keyword arguments (``lab.session(strategy_params=...)`` passes them), its signature and
    the ``Args:`` of its docstring come from the model.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    source: ClassVar[str]

    class Options(_Options):
        """The strategy's parameters (``lab.session(strategy_params=...)``); none by default."""

    #: The validated parameters this strategy builds with.
    options: Options

    def __init__(self, **options: Any) -> None:
        self.options = type(self).Options.check(options, owner=f"strategy {self.name!r}")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = cls.Options.signature()  # type: ignore[attr-defined] # read by inspect.signature
        cls.__doc__ = cls.Options.document(cls.__doc__)

    @classmethod
    def from_stored(cls, params: Mapping[str, Any] | None) -> Self:
        """The strategy with the options a session stored (names it does not know ignored: a session stored
        before options were checked keeps loading)."""
        return cls(**cls.Options.stored(params, owner=f"strategy {cls.name!r}").explicit())

    @abstractmethod
    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        """Return the Messages API body for the next request."""

    @classmethod
    def check_params(cls, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """``params`` validated against :attr:`Options`: the options set, with their validated values.
        Raises :class:`~promptcache_nb.InvalidOptionError` (one line naming the valid options)."""
        return cls.Options.check(params, owner=f"strategy {cls.name!r}").explicit()

    def __repr__(self) -> str:
        return f"<strategy {self.name}: {self.title}>"


# -- shared rendering helpers (deterministic: no locale, no wall clock, no set order) -----------

_WORD = re.compile(r"[a-z0-9]+")


def clock_text(now: datetime) -> str:
    """picoclaw's minute-resolution clock line: ``2026-11-02 09:03 (Monday)``."""
    days = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    return f"{now:%Y-%m-%d %H:%M} ({days[now.weekday()]})"


def runtime_text() -> str:
    """A fixed runtime line: the scenario's, never the host machine's (determinism)."""
    return "linux amd64, agent runtime 1.4"


def rank_by_relevance(entries: list[KnowledgeEntry], query: str) -> list[KnowledgeEntry]:
    """Entries ordered by word overlap with ``query`` (ties by id): a stand-in for a retriever."""
    words = set(_WORD.findall(query.lower()))

    def score(e: KnowledgeEntry) -> int:
        return len(words & set(_WORD.findall(f"{e.title} {e.content}".lower())))

    return sorted(entries, key=lambda e: (-score(e), e.id))


def format_entry(e: KnowledgeEntry) -> str:
    return f"* **[{e.short_id}] {e.title}** ({e.category}): {e.content}"


def format_knowledge(entries: list[KnowledgeEntry], heading: str = "## Long-term Knowledge") -> str:
    if not entries:
        return f"{heading}\n\n(none)"
    return heading + "\n\n" + "\n".join(format_entry(e) for e in entries)


def sorted_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(tools, key=lambda t: str(t.get("name", "")))


# The blocks text_block made last, by (text, cache_control): the same text gives the very same dict every
# turn, which prepare() recognises by identity instead of canonicalising and hashing it again (a host
# prompt is ~100 KB per request). Bodies are never mutated (history objects are shared the same way);
# a few entries, least recently used dropped, as a strategy that re-renders its system prompt every turn
# would otherwise keep each version alive.
_BLOCKS: dict[tuple[str, tuple[tuple[str, Any], ...] | None], dict[str, Any]] = {}
_BLOCKS_KEPT = 64
_BLOCKS_LOCK = threading.Lock()


def text_block(text: str, cache_control: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``{"type": "text"}`` block; equal arguments give the same dict object (treat it as read-only)."""
    key = (text, None if cache_control is None else tuple(cache_control.items()))
    with _BLOCKS_LOCK:
        block = _BLOCKS.pop(key, None)
        if block is None:
            block = {"type": "text", "text": text}
            if cache_control is not None:
                block["cache_control"] = dict(cache_control)
            if len(_BLOCKS) >= _BLOCKS_KEPT:
                del _BLOCKS[next(iter(_BLOCKS))]
        _BLOCKS[key] = block  # most recently used last
    return block


def fingerprint(value: Any) -> str:
    """A digest of ``value``'s canonical JSON: what a cached rendering is keyed by."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return digest(text.encode("utf-8"), tag="strategy")


def knowledge_by_id(entries: list[KnowledgeEntry]) -> list[KnowledgeEntry]:
    """Entries in id order: the rendering order of designs that do not rank per query."""
    return sorted(entries, key=lambda e: e.id)


#: The knowledge categories the bundled strategies and scenarios use. ``preference`` has a meaning: Lore-style
#: designs (``durable_delta``, ``rewrite_knowledge``) pin preference entries in a stable 1 h system block and
#: render the rest as context; the others are labels. The knowledge editor refuses a category outside this set
#: (and the categories already in the book), so a typo such as ``preferance`` cannot silently lose that meaning.
KNOWLEDGE_CATEGORIES: tuple[str, ...] = ("fact", "gotcha", "incident", "note", "preference", "procedure")


def split_preferences(entries: list[KnowledgeEntry]) -> tuple[list[KnowledgeEntry], list[KnowledgeEntry]]:
    """(stable preference entries, context entries), each in id order (Lore's category split)."""
    ordered = knowledge_by_id(entries)
    prefs = [e for e in ordered if e.category == "preference"]
    return prefs, [e for e in ordered if e.category != "preference"]


# -- cache_control placement (never mutate the history's dicts: copy, then mark) ------------------

def with_cache_control(block: dict[str, Any], cache_control: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``block`` carrying ``cache_control``."""
    return {**block, "cache_control": dict(cache_control)}


def _markable(message: dict[str, Any]) -> bool:
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return False  # a string content is left alone: marking it would change its shape next turn
    last = content[-1]
    return isinstance(last, dict) and last.get("type") not in ("thinking", "redacted_thinking") and (
        last.get("type") != "text" or bool(last.get("text"))
    )


def last_markable_index(messages: list[dict[str, Any]], end: int | None = None) -> int | None:
    """Index of the last message before ``end`` whose last block may carry ``cache_control``."""
    for i in range(len(messages) - 1 if end is None else end - 1, -1, -1):
        if _markable(messages[i]):
            return i
    return None


def mark_message(messages: list[dict[str, Any]], index: int, cache_control: dict[str, Any]) -> None:
    """Replace ``messages[index]`` (in the caller's own list) by a copy whose last block is marked."""
    m = messages[index]
    content = list(m["content"])
    content[-1] = with_cache_control(content[-1], cache_control)
    messages[index] = {"role": m["role"], "content": content}


# -- message shapes ------------------------------------------------------------------------------

def has_tool_use(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return message.get("role") == "assistant" and isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in content
    )


def is_user_text(message: dict[str, Any]) -> bool:
    """A user turn typed by a person (not a message made only of tool results)."""
    if message.get("role") != "user":
        return False
    content = message.get("content")
    if isinstance(content, str):
        return True
    return any(isinstance(b, dict) and b.get("type") == "text" for b in content or ())


def safe_insert_index(messages: list[dict[str, Any]], desired: int) -> int:
    """Lore's ``safeDeltaInsertIndex``: never insert right after an assistant ``tool_use``.

    Walks back while ``messages[idx - 1]`` is an assistant message with a ``tool_use`` block, which
    protects both a completed tool_use/tool_result pair and a pending call (the "#747 regression").
    """
    idx = max(0, min(desired, len(messages)))
    while idx > 0 and has_tool_use(messages[idx - 1]):
        idx -= 1
    return idx
