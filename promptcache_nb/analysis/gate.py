"""A cache gate for tests and notebooks: did any request of a session break the prompt cache?

``pc.assert_cache_stable(session)`` fails (``AssertionError``) when a request broke the cache by OpenClaw's rule
(the ``broke`` column: :mod:`promptcache_nb.analysis.observe`), or, with thresholds, when more than
``max_breaks`` requests broke it or the session read less than ``min_read_pct`` of its prompt tokens from the
cache. The message names each breaking request (index and request id) and where its prefix stopped matching the
previous request's: the segment path, the byte offset and an excerpt with invisible characters shown — the
same :class:`~promptcache_nb.PrefixDiff` and observation a notebook shows. The pytest plugin
(``promptcache_nb.pytest_plugin``) fails a test with this message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..session import Session


@dataclass(frozen=True)
class CacheBreak:
    """One request that broke the cache.

    Attributes:
        index: the request's index in its session. request_id: the endpoint's id, when known.
        cache_read: what it read. previous_cache_read: the last read before it (OpenClaw's baseline).
        location: where its prefix stopped matching the previous request's (``PrefixDiff.summary()``).
        path: the first differing segment's path. byte_offset: the byte it differs at (None: not located).
        excerpt: the text around the divergence, invisible characters shown (None: not located).
        explanation: the observation's plain words.
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

    def text(self) -> str:
        head = f"request {self.index}" + (f" ({self.request_id})" if self.request_id else "")
        lines = [f"{head} broke the cache: read {_n(self.cache_read)} after {_n(self.previous_cache_read)}",
                 f"  {self.location}"]
        if self.excerpt:
            lines.append(f"  excerpt: {self.excerpt}")
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
        breaks: the requests that broke the cache (OpenClaw's rule), in order.
        min_read_pct, max_breaks: the thresholds checked.
        failures: one line per threshold passed (empty: the check passed).
    """

    session_id: str
    requests: int
    read_pct: float | None
    breaks: tuple[CacheBreak, ...]
    min_read_pct: float | None
    max_breaks: int | None
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def message(self) -> str:
        """The failure message: what failed, then every breaking request with its located diff."""
        read = "—" if self.read_pct is None else f"{self.read_pct:.1f} %"
        lines = [f"prompt cache check of session {self.session_id}: {self.requests} requests, read {read}, "
                 f"{len(self.breaks)} break{'s' if len(self.breaks) != 1 else ''}"]
        lines += [f"- {f}" for f in self.failures]
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


def check_cache(session: Session, *, min_read_pct: float | None = None, max_breaks: int | None = 0) -> CacheCheck:
    """Check ``session`` against the thresholds: at most ``max_breaks`` requests that broke the cache (OpenClaw's
    rule; None: any number) and at least ``min_read_pct`` % of prompt tokens read from the cache (None: no
    minimum). Never raises for a failed check: see :attr:`CacheCheck.failures`."""
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
        breaks.append(CacheBreak(
            index=index, request_id=t.request_id, cache_read=t.usage.cache_read_input_tokens,
            previous_cache_read=None if obs is None else obs.previous_cache_read,
            location="no prefix diff" if d is None else d.summary(),
            path=None if d is None else d.path, byte_offset=None if d is None else d.byte_offset,
            excerpt=None if excerpt is None else str(excerpt),
            explanation="" if obs is None else obs.explanation))
    failures = []
    if max_breaks is not None and len(breaks) > max_breaks:
        failures.append(f"{len(breaks)} request{'s' if len(breaks) != 1 else ''} broke the cache "
                        f"(at most {max_breaks} allowed): "
                        + ", ".join(f"request {b.index}" + (f" ({b.request_id})" if b.request_id else "")
                                    for b in breaks))
    if min_read_pct is not None and (read_pct is None or read_pct < min_read_pct):
        got = "no usage" if read_pct is None else f"{read_pct:.1f} %"
        failures.append(f"read {got} of prompt tokens from the cache (at least {min_read_pct:g} % required)")
    return CacheCheck(session.id, len(df), read_pct, tuple(breaks), min_read_pct, max_breaks, tuple(failures))


def assert_cache_stable(session: Session, *, min_read_pct: float | None = None,
                        max_breaks: int | None = 0) -> CacheCheck:
    """Fail (``AssertionError``) when ``session`` broke the prompt cache: more than ``max_breaks`` requests broke
    it (OpenClaw's rule; default: none may), or it read less than ``min_read_pct`` % of its prompt tokens from the
    cache. The message names each breaking request and shows its located diff. Returns the check when it passes.

    Example:
        >>> import promptcache_nb as pc
        >>> with pc.Lab() as lab:
        ...     s = lab.session(system="You are terse. " * 400)
        ...     _ = [s.step(q, reply="ok") for q in ("a", "b", "c")]
        ...     pc.assert_cache_stable(s, min_read_pct=50).ok
        True
    """
    check = check_cache(session, min_read_pct=min_read_pct, max_breaks=max_breaks)
    if not check.ok:
        raise AssertionError(check.message())
    return check
