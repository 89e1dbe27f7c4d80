"""Which sessions of a partial log share one unlogged prefix, and its one agreed size.

A log that holds no system prompt or tools (Claude Code, Codex, pi) gets one synthetic ``unlogged`` segment first,
sized from the measured usage of the session's first request (measured prompt total minus the estimated logged
part: docs/provider_cache_rules.md#unlogged-prefix). Sized per session, two sessions that sent the very same system
prompt get sizes a few estimated tokens apart, so in simulation they never share it, while the provider served the
second one's first request from what the first wrote.

So the segment is identified by what the log does say, never by the estimate:

* the request's ``prefix_identity`` (client, client version, model, working directory, session kind: what the
  client builds its system prompt and tools from) names the *identity*;
* the measured cache read of a session's first request is the evidence that it shared a prefix written before: a
  first request that read at least :data:`SHARE_COVER` of a variant's agreed size read that variant's prefix
  (nothing shorter than the system prompt is cached by these clients, and a read needs the whole prefix before
  its breakpoint to match).

A session joins the latest variant of its identity that such a read links it to: its own first request read the
variant's prefix (the variant has a session that started before it), or the variant's first session started after
it and read the prefix on its first request (sessions are stored in key order, not time order: the writer can be
stored after its reader). Otherwise it starts a new variant, with its own estimated size. All sessions of a
variant carry that variant's id (``<identity digest>.<n>``) and its size, so their unlogged segments have one
content hash (:func:`~promptcache_nb.request.unlogged_segment`) and the simulated cache shares them.

Without evidence nothing is shared: a first request that read nothing wrote a prefix of its own, as far as the
measurement says (a changed date or git status in the system prompt, an expired cache).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._config import DEFAULT_ACCOUNT, SessionConfig
from .._util import digest

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

#: A first request's measured cache read covers a variant's agreed size when it is at least this share of it: the
#: agreed size is an estimate (measured total minus the estimated logged part of one request), off by a few tokens.
SHARE_COVER = 0.95


@dataclass(frozen=True)
class UnloggedPrefix:
    """A session's unlogged prefix: its size (tokens) and whose it is (``of``: ``<identity digest>.<n>``)."""

    tokens: int
    of: str | None


def identity_digest(identity: dict[str, str]) -> str:
    """The short digest naming an identity (what its variants' ids start with)."""
    # the identity is a flat mapping of strings: sorted JSON is canonical for it
    return digest(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode(), tag="unlogged-prefix")[:16]


@dataclass(frozen=True)
class _Member:
    at: datetime
    read: int


def agreed_prefix(store: Store, account: str, session_id: str, identity: dict[str, str] | None, *,
                  estimate: int, read: int | None, at: datetime) -> UnloggedPrefix:
    """The unlogged prefix of session ``session_id`` (first request sent ``at``, whose measured cache read is
    ``read``, and whose prefix is ``estimate`` tokens by its own measurement), given the sessions of its identity
    already stored in its ``account`` (who shares the provider's cache, whatever folder or door they came through;
    see the module docstring). Without an identity: the estimate, its own."""
    if identity is None:
        return UnloggedPrefix(estimate, None)
    tag = identity_digest(identity)
    variants: dict[str, tuple[int, list[_Member]]] = {}
    for row in store.unlogged_prefix_sessions(account, tag, default_account=DEFAULT_ACCOUNT):
        if row["id"] == session_id:
            continue
        config = SessionConfig.from_stored(row["config"])
        if config.unlogged_prefix_of is None or config.unlogged_prefix_tokens is None:
            continue
        got = variants.setdefault(config.unlogged_prefix_of, (config.unlogged_prefix_tokens, []))
        got[1].append(_Member(config.start, config.unlogged_prefix_read or 0))
    linked: list[tuple[datetime, str]] = []  # (the linking session's start, variant)
    for of, (tokens, members) in variants.items():
        before = [m.at for m in members if m.at <= at]
        if before and covers(read, tokens):
            linked.append((max(before), of))  # it read what a session before it wrote
            continue
        first = min(members, key=lambda m: m.at)
        if first.at > at and covers(first.read, tokens):
            linked.append((first.at, of))  # the variant's first session read what this one wrote
    if linked:
        of = max(linked)[1]
        return UnloggedPrefix(variants[of][0], of)
    return UnloggedPrefix(estimate, f"{tag}.{_next_variant(variants, tag)}")


def covers(read: int | None, tokens: int) -> bool:
    """A first request's measured cache read ``read`` covers an unlogged prefix of ``tokens`` (:data:`SHARE_COVER`)."""
    return read is not None and read > 0 and read >= SHARE_COVER * tokens


def _next_variant(variants: dict[str, Any], tag: str) -> int:
    numbers = [int(of.rsplit(".", 1)[1]) for of in variants if of.rsplit(".", 1)[1].isdigit()]
    return max(numbers, default=0) + 1
