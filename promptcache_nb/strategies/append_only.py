"""``append_only``: oh-my-pi's append-only context mode (can1357/oh-my-pi, after issue #3406).

``packages/agent/src/append-only-context.ts`` has two parts (docs/seed_designs.md#oh-my-pi-append-only-context):

* **StablePrefix** — the system prompt (a string array: here the host prompt and the knowledge in id
  order) and the tool specs, snapshotted with a fingerprint (JSON ``{s, t}`` hashed with the ×31 string
  hash, base 36). ``build`` keeps the snapshot while the fingerprint is unchanged and rebuilds it (a miss
  is imminent) when it changed, so a knowledge edit *does* rebuild the prefix. oh-my-pi treats tool
  order as significant, so tools are not sorted.
* **AppendOnlyLog** — messages only grow. ``syncMessages`` keeps per-message digests: new messages are
  appended; an in-place rewrite of earlier history (a compaction that does not shrink it) truncates
  the log to the longest unchanged run and re-sends from there (the #3406 fix; the seed version
  cleared everything); a shrink clears the log.

The snapshot lives in ``extra`` so a restart rebuilds identically. The log (the digests and the sync
count) is what the previous request was built from — after every sync it equals the digests of the history
synced — so it is taken from the history the session keeps (``ctx.previous_messages``) instead of being
rewritten into ``extra`` on every turn. ``extra["last_sync"]`` says what the last sync did (``append``,
``rewrite@k``, ``shrink``) and ``extra["prefix"]["version"]`` counts prefix rebuilds. Breakpoints: the last
system block and the last message block, as pi-ai's Anthropic provider places them.
"""

from __future__ import annotations

import functools
import json
from operator import is_
from typing import Any, ClassVar

from .._lazy import numpy as np
from .._util import common_prefix_length
from ._base import (
    DEFAULT_MAX_TOKENS,
    EPHEMERAL,
    Strategy,
    StrategyContext,
    fingerprint,
    format_knowledge,
    knowledge_by_id,
    last_markable_index,
    mark_message,
    text_block,
    with_cache_control,
)

_CHUNK = 1 << 16  # UTF-16 units hashed per vectorised step
_MASK = 0xFFFFFFFF


@functools.cache
def _powers() -> Any:
    """``[31**k modulo 2**64 for k in 0..CHUNK]``: uint64 arithmetic wraps, and 2**32 divides 2**64, so the low 32
    bits are exact. Built on first use (numpy is not imported with the package)."""
    powers = np.ones(_CHUNK + 1, dtype=np.uint64)
    powers[1:] = np.cumprod(np.full(_CHUNK, 31, dtype=np.uint64), dtype=np.uint64)
    return powers


def hash31(text: str) -> str:
    """oh-my-pi's string hash: ``h = ((h << 5) - h + charCode) | 0`` over UTF-16 units, base 36.

    The loop's closed form, ``sum(unit[i] * 31**(n-1-i)) mod 2**32``, computed with numpy a chunk at a time
    (a system prompt is ~100k units: a Python loop over them took ~25 ms a request)."""
    powers = _powers()
    units = np.frombuffer(text.encode("utf-16-le"), dtype="<u2")
    h = 0
    for start in range(0, len(units), _CHUNK):
        chunk = units[start:start + _CHUNK]
        m = len(chunk)
        tail = int((chunk.astype(np.uint64) * powers[m - 1::-1]).sum(dtype=np.uint64))
        h = (h * int(powers[m]) + tail) & _MASK
    return _base36(h)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def prefix_fingerprint(system_prompt: list[str], tools: list[dict[str, Any]]) -> str:
    """``JSON.stringify({s, t: [{n, d, p}]})`` hashed; tool order counts, as in oh-my-pi."""
    t = [{"n": t.get("name"), "d": t.get("description"), "p": t.get("input_schema")} for t in tools]
    return _fingerprint(tuple(system_prompt), json.dumps(t, separators=(",", ":"), ensure_ascii=False))


@functools.lru_cache(maxsize=16)
def _fingerprint(system_prompt: tuple[str, ...], tools_json: str) -> str:
    """The hash of ``{"s": system_prompt, "t": tools}`` in compact JSON, remembered: the prefix is the same on
    almost every request, and hashing it (~100 KB) each time was most of a request's cost. The tools are keyed
    by their JSON text, so an entry matches exactly when the hashed text would (``1`` and ``1.0`` differ)."""
    s = json.dumps(list(system_prompt), separators=(",", ":"), ensure_ascii=False)
    return hash31(f'{{"s":{s},"t":{tools_json}}}')


def build_prefix(ctx: StrategyContext) -> tuple[list[str], list[dict[str, Any]], bool]:
    """StablePrefix.build: (system prompt parts, tools, rebuilt?)."""
    system_prompt = [p for p in (ctx.host_prompt, format_knowledge(knowledge_by_id(ctx.knowledge))) if p]
    fp = prefix_fingerprint(system_prompt, ctx.tools)
    snap = ctx.extra.get("prefix")
    if isinstance(snap, dict) and snap.get("fingerprint") == fp:
        return list(snap["system"]), list(snap["tools"]), False
    version = (snap.get("version", 0) if isinstance(snap, dict) else 0) + 1
    ctx.extra["prefix"] = {"fingerprint": fp, "version": version, "system": system_prompt,
                           "tools": json.loads(json.dumps(ctx.tools))}
    return system_prompt, ctx.extra["prefix"]["tools"], True


class _Digests:
    """Per-object digest memo (oh-my-pi memoizes per message object); never persisted."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[dict[str, Any], str]] = {}

    def __call__(self, message: dict[str, Any]) -> str:
        hit = self._memo.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        d = fingerprint(message)[:16]
        self._memo[id(message)] = (message, d)
        return d

    def keep_only(self, messages: list[dict[str, Any]]) -> None:
        """Forget every message but ``messages`` (the history the next request's sync compares against):
        the memo no longer keeps what a compaction dropped alive."""
        memo = self._memo
        self._memo = {id(m): memo[id(m)] for m in messages if id(m) in memo and memo[id(m)][0] is m}


def sync_messages(ctx: StrategyContext, digests: list[str], previous: list[str] | None = None) -> str:
    """AppendOnlyLog sync (post-#3406); returns what it did.

    ``previous``: the digests of the history the previous request was built from — the log as that sync
    left it. Without it, a log an older session stored in ``extra["log"]`` is read and kept up to date.
    """
    if previous is not None:
        ctx.extra.pop("log", None)  # an older session's copy: the history says the same
        log: dict[str, Any] | None = {"count": len(previous), "digests": previous}
    else:
        log = ctx.extra.get("log") if isinstance(ctx.extra.get("log"), dict) else None
    logged: list[str] = list(log["digests"]) if log else []
    synced = int(log["count"]) if log else 0
    if len(digests) < synced:
        action, logged = "shrink", []  # compaction shrank the history: clear and resend
    else:
        limit = min(synced, len(logged))  # the clamp: a cleared log may leave the cursor ahead
        stable = common_prefix_length(logged[:limit], digests[:limit])
        action = "append" if stable == synced else f"rewrite@{stable}"
        logged = logged[:stable]
    logged += digests[len(logged):]
    if previous is None and log is not None:
        ctx.extra["log"] = {"count": len(digests), "digests": logged}
    return action


class AppendOnly(Strategy):
    """oh-my-pi: a fingerprinted frozen prefix and an append-only message log."""

    name: ClassVar[str] = "append_only"
    title: ClassVar[str] = "frozen prefix + append-only message log"
    source: ClassVar[str] = "oh-my-pi append-only context mode (can1357/oh-my-pi, #3038, #3406)"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._digest = _Digests()
        self._tools: tuple[str, list[dict[str, Any]]] | None = None  # (JSON text, this instance's own copy)
        self._marked: tuple[dict[str, Any], dict[str, Any]] | None = None  # (system block, its marked copy)

    def _same_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``tools`` as the objects handed out last time when its JSON (key order and types included) is the
        same: the snapshot is parsed afresh from the stored state every request, and prepare() recognises
        the objects it saw before by identity instead of serialising and hashing every tool again."""
        text = json.dumps(tools, ensure_ascii=False)
        if self._tools is None or self._tools[0] != text:
            self._tools = (text, json.loads(text))  # a private copy: nothing else holds (or edits) it
        return list(self._tools[1])

    def _marked_last(self, block: dict[str, Any]) -> dict[str, Any]:
        """``with_cache_control(block, EPHEMERAL)``, the same dict while ``block`` is (text_block's reuse)."""
        if self._marked is None or self._marked[0] is not block:
            self._marked = (block, with_cache_control(block, EPHEMERAL))
        return self._marked[1]

    def build(self, ctx: StrategyContext) -> dict[str, Any]:
        system_prompt, tools, rebuilt = build_prefix(ctx)
        tools = self._same_tools(tools)
        ctx.extra["prefix_rebuilt"] = rebuilt
        prev, msgs = ctx.previous_messages, ctx.messages
        if prev is not None and len(prev) <= len(msgs) and all(map(is_, prev, msgs)):
            # the history synced last time leads this one, the very same objects (the session's history only
            # grows): their digests are equal, so the sync is an append; no digest need be looked at
            ctx.extra.pop("log", None)  # what sync_messages does with ``previous``
            ctx.extra["last_sync"] = "append"
        else:
            ctx.extra["last_sync"] = sync_messages(ctx, [self._digest(m) for m in msgs],
                                                   None if prev is None else [self._digest(m) for m in prev])
            self._digest.keep_only(msgs)
        system = [text_block(part) for part in system_prompt]
        system[-1] = self._marked_last(system[-1])
        messages = list(ctx.messages)  # the log's content: identical to the synced history
        last = last_markable_index(messages)
        if last is not None:
            mark_message(messages, last, EPHEMERAL)
        return {
            "model": ctx.model,
            "max_tokens": DEFAULT_MAX_TOKENS,
            "system": system,
            "tools": tools,
            "messages": messages,
        }
