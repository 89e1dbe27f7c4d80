"""A cache gate for tests and notebooks: did any request break the prompt cache?

``pc.assert_cache_stable(session)`` fails (``AssertionError``) when a request broke the cache — it read less than
it could have: it wrote again, or sent uncached, a prefix the cache held and kept alive for it (the ``broke``
column: the one verdict of :mod:`promptcache_nb.analysis.observe`, the rule :func:`~promptcache_nb.rebuilds`
lists) — or, with thresholds, when more than ``max_breaks`` requests broke it or the session read less than
``min_read_pct`` of its prompt tokens from the cache. An agent that never manages to read its cache (a clock in
its system prompt) breaks it on every request after the first.

:func:`check_conversations` judges what one conversation cannot show: the conversations of one cache scope (an
account, a test's endpoint) share their tools and system prompt, so a conversation whose first request changed
them while an earlier conversation's entry was alive broke the shared prefix (four single-message calls with a
clock in the system prompt break it three times).

A prompt below the model's minimum cacheable length passes with a note saying nothing could be cached. The
message names each breaking request (index and request id) and where its prefix stopped matching: the segment
path, the byte offset and an excerpt with invisible characters shown — the same
:class:`~promptcache_nb.PrefixDiff` and observation a notebook shows. The pytest plugin
(``promptcache_nb.pytest_plugin``) fails a test with this message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .._lazy import pandas as pd
from .._protocols import StoredSession
from ..request.diff import compute_diff
from .crosscheck import provider_note
from .observe import cache_retention

if TYPE_CHECKING:  # pragma: no cover
    from ..turn import Turn


class CheckedSession(StoredSession, Protocol):
    """What the gate reads of a session (a :class:`~promptcache_nb.Session`): its turns frame and its stored
    turns, declared here so the analysis never imports the session above it."""

    def turns(self) -> pd.DataFrame: ...

    def turn(self, index: int) -> Turn: ...


#: How long an entry written by one conversation stays readable for the next when nothing says otherwise: the
#: shortest TTL any provider we model keeps (Anthropic's 5 minutes; 1 hour where a breakpoint asks for it).
DEFAULT_TTL_SECONDS = 300.0
LONG_TTL_SECONDS = 3600.0


@dataclass(frozen=True)
class CacheBreak:
    """One request that broke the cache.

    Attributes:
        index: the request's index in its session. request_id: the endpoint's id, when known.
        cache_read: what it read. previous_cache_read: what the request before it read.
        lost_tokens: what it sent again of what the cache held for it. cause: its ``cache_reason``.
        location: where its prefix stopped matching the previous request's (``PrefixDiff.summary()``).
        path: the first differing segment's path. byte_offset: the byte it differs at (None: not located).
        excerpt: the text around the divergence, invisible characters shown (None: not located).
        explanation: the observation's plain words.
        session_id: the session (conversation) it belongs to.
        against: for a break between conversations, the earlier conversation whose cached prefix it lost.
        provider_reason: the provider's own diagnosis in one sentence (``provider_note``), when it was asked for
            one (None otherwise).
    """

    index: int
    request_id: str | None
    cache_read: int | None
    previous_cache_read: int | None
    location: str
    path: str | None
    byte_offset: int | None
    excerpt: str | None
    explanation: str
    lost_tokens: int = 0
    cause: str | None = None
    session_id: str | None = None
    against: str | None = None
    provider_reason: str | None = None

    def text(self) -> str:
        head = f"request {self.index}" + (f" ({self.request_id})" if self.request_id else "")
        if self.against is not None:
            head = f"conversation {self.session_id}, {head}"
            what = (f"broke the prefix it shares with conversation {self.against}: read {_n(self.cache_read)}, "
                    f"sent again {self.lost_tokens:,} tokens that conversation had cached")
        else:
            what = (f"broke the cache: read {_n(self.cache_read)} (the request before read "
                    f"{_n(self.previous_cache_read)}), sent again {self.lost_tokens:,} tokens it held")
        lines = [f"{head} {what}" + (f" — {self.cause}" if self.cause else ""), f"  {self.location}"]
        if self.excerpt:
            lines.append(f"  excerpt: {self.excerpt}")
        if self.provider_reason:
            lines.append(f"  {self.provider_reason}")
        if self.explanation:
            lines.append(f"  {self.explanation}")
        return "\n".join(lines)


@dataclass(frozen=True)
class CacheCheck:
    """A session's cache figures against thresholds (:func:`check_cache`).

    Attributes:
        session_id: the session checked. requests: how many requests it holds.
        read_pct: Σ cache read / Σ prompt tokens (uncached + cache read + cache write) × 100 over requests with
            usage; None without any.
        breaks: the requests that broke the cache (the ``broke`` verdict), in order.
        min_read_pct, max_breaks: the thresholds checked.
        failures: one line per threshold passed (empty: the check passed).
        notes: what a passing check should still say (a prompt below the minimum cacheable length: nothing
            could be cached, so nothing could break).
    """

    session_id: str
    requests: int
    read_pct: float | None
    breaks: tuple[CacheBreak, ...]
    min_read_pct: float | None
    max_breaks: int | None
    failures: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures

    def message(self) -> str:
        """The failure message: what failed, then every breaking request with its located diff."""
        read = "—" if self.read_pct is None else f"{self.read_pct:.1f} %"
        lines = [f"prompt cache check of session {self.session_id}: {self.requests} requests, read {read}, "
                 f"{len(self.breaks)} break{'s' if len(self.breaks) != 1 else ''}"]
        lines += [f"- {f}" for f in self.failures]
        lines += [f"note: {n}" for n in self.notes]
        lines += [b.text() for b in self.breaks]
        return "\n".join(lines)

    def first_break_location(self) -> str:
        """The first break's segment path and byte offset (``—`` without a break)."""
        if not self.breaks:
            return "—"
        b = self.breaks[0]
        if b.path is None:
            return b.location
        return b.path + ("" if b.byte_offset is None else f" byte {b.byte_offset:,}")


def _n(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


_PROVIDER_COLUMNS = ("provider_cache_miss_reason", "provider_cache_missed_tokens", "diverge_path", "pure_append")


def _provider_reason(session: CheckedSession, index: int) -> str | None:
    """The provider's own diagnosis of a request, as one sentence beside ours (None when it was not asked)."""
    row = session.lab.store.turn_row(session.id, index, _PROVIDER_COLUMNS)
    return None if row is None else provider_note(row)


def check_cache(session: CheckedSession, *, min_read_pct: float | None = None,
                max_breaks: int | None = 0) -> CacheCheck:
    """Check ``session`` against the thresholds: at most ``max_breaks`` requests that broke the cache (the
    ``broke`` verdict; None: any number) and at least ``min_read_pct`` % of prompt tokens read from the cache
    (None: no minimum). Never raises for a failed check: see :attr:`CacheCheck.failures`."""
    df = session.turns()
    read = df.cache_read_input_tokens.fillna(0).sum()
    sent = (df.input_tokens.fillna(0) + df.cache_read_input_tokens.fillna(0)
            + df.cache_creation_input_tokens.fillna(0)).sum()
    read_pct = None if sent == 0 else float(read * 100.0 / sent)
    breaks = []
    for index in (int(i) for i in df.idx[df.broke.astype("boolean").fillna(False)]):
        t = session.turn(index)
        d, obs = t.diff, t.observation
        excerpt = None if d is None or d.index is None or d.unlogged else d.excerpt
        previous = session.turn(index - 1).usage.cache_read_input_tokens if index else None
        breaks.append(CacheBreak(
            index=index, request_id=t.request_id, cache_read=t.usage.cache_read_input_tokens,
            previous_cache_read=previous,
            location="no prefix diff" if d is None else d.summary(),
            path=None if d is None else d.path, byte_offset=None if d is None else d.byte_offset,
            excerpt=None if excerpt is None else str(excerpt),
            explanation="" if obs is None else obs.explanation,
            lost_tokens=0 if obs is None else obs.lost_tokens, cause=t.cache_reason, session_id=session.id,
            provider_reason=_provider_reason(session, index)))
    failures = []
    if max_breaks is not None and len(breaks) > max_breaks:
        failures.append(f"{len(breaks)} request{'s' if len(breaks) != 1 else ''} broke the cache "
                        f"(at most {max_breaks} allowed): "
                        + ", ".join(f"request {b.index}" + (f" ({b.request_id})" if b.request_id else "")
                                    for b in breaks))
    if min_read_pct is not None and (read_pct is None or read_pct < min_read_pct):
        got = "no usage" if read_pct is None else f"{read_pct:.1f} %"
        failures.append(f"read {got} of prompt tokens from the cache (at least {min_read_pct:g} % required)")
    return CacheCheck(session.id, len(df), read_pct, tuple(breaks), min_read_pct, max_breaks, tuple(failures),
                      _below_minimum_notes(session, df))


def _below_minimum_notes(session: CheckedSession, df: object) -> tuple[str, ...]:
    """A note when the model's minimum cacheable length kept every request out of the cache."""
    assert isinstance(df, pd.DataFrame)
    with_usage = df[df.cache_read_input_tokens.notna()]
    if with_usage.empty or (with_usage.cache_read_input_tokens.fillna(0) > 0).any() or (
            with_usage.cache_creation_input_tokens.fillna(0) > 0).any():
        return ()
    below = with_usage.cache_reason == "below_minimum"
    if not below.any():
        return ()
    detail = session.turn(int(with_usage.idx[below].iloc[0])).cache_detail
    minimum = detail.get("min_tokens")
    size = f"its {int(minimum):,}-token minimum" if isinstance(minimum, int | float) else "its minimum"
    return (f"nothing could be cached: the prompt is below {detail.get('model', 'the model')}'s minimum cacheable "
            f"length ({size}), so there was no cache to break",)


def check_conversations(sessions: Sequence[CheckedSession]) -> tuple[CacheBreak, ...]:
    """The breaks *between* the conversations of one cache scope (sessions of one account or one test endpoint,
    in any order): a conversation whose first request changed the tools or the system prompt the previous
    conversation had cached, while that entry was alive (sent within its TTL: 5 minutes, 1 hour where a breakpoint
    asked for it), broke the prefix they share. A change in the messages is a new conversation, not a break; an
    earlier conversation that cached nothing (below the minimum, no breakpoint) leaves nothing to break."""
    firsts = []
    for s in sessions:
        df = s.turns()
        if len(df):
            firsts.append((df.sent_at.iloc[0], s, df))
    firsts.sort(key=lambda f: (f[0], f[1].id))
    out: list[CacheBreak] = []
    for (_, before, before_df), (at, now, _) in zip(firsts, firsts[1:], strict=False):
        cached = (before_df.cache_read_input_tokens.fillna(0) + before_df.cache_creation_input_tokens.fillna(0))
        if not (cached > 0).any():
            continue
        first_of_before = before.turn(0)
        ttl = LONG_TTL_SECONDS if cache_retention(first_of_before.prepared) == "long" else DEFAULT_TTL_SECONDS
        last_at = before_df.sent_at.iloc[-1]
        if (at - last_at).total_seconds() > ttl:
            continue
        t = now.turn(0)
        d = compute_diff(first_of_before.prepared, t.prepared)
        shared_part = d.path is not None and d.path.split("[", 1)[0] in ("tools", "system")
        if not (shared_part or d.tools_reordered) or d.pure_append:
            continue
        read = t.usage.cache_read_input_tokens
        held = int(first_of_before.usage.cache_read_input_tokens or 0) + int(
            first_of_before.usage.cache_creation_input_tokens or 0)
        excerpt = None if d.index is None or d.unlogged else d.excerpt
        out.append(CacheBreak(
            index=0, request_id=t.request_id, cache_read=read, previous_cache_read=None, location=d.summary(),
            path=d.path, byte_offset=d.byte_offset, excerpt=None if excerpt is None else str(excerpt),
            explanation="", lost_tokens=max(0, min(held, int(t.usage.total_input_tokens or 0)) - int(read or 0)),
            cause="tools_changed" if d.tools_reordered or (d.path or "").startswith("tools") else "system_changed",
            session_id=now.id, against=before.id, provider_reason=_provider_reason(now, 0)))
    return tuple(out)


def assert_cache_stable(session: CheckedSession, *, min_read_pct: float | None = None,
                        max_breaks: int | None = 0) -> CacheCheck:
    """Fail (``AssertionError``) when ``session`` broke the prompt cache: more than ``max_breaks`` requests broke
    it (the ``broke`` verdict: a request read less than it could have; default: none may), or it read less than
    ``min_read_pct`` % of its prompt tokens from the cache. The message names each breaking request and shows its
    located diff. Returns the check when it passes (with a note when nothing could be cached).

    Example:
        >>> import promptcache_nb as pc
        >>> with pc.Lab() as lab:
        ...     s = lab.session(system="You are terse. " * 400, strategy="append_only")
        ...     _ = [s.step(q, reply="ok") for q in ("a", "b", "c")]
        ...     pc.assert_cache_stable(s, min_read_pct=50).ok
        True
    """
    check = check_cache(session, min_read_pct=min_read_pct, max_breaks=max_breaks)
    if not check.ok:
        raise AssertionError(check.message())
    return check
