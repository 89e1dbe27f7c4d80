"""Why a request read less than it could: the reason codes and their prose, in one place.

Cache models return a :class:`Reason` code with a ``detail`` dict (``CacheResult.reason`` / ``.detail``);
the store keeps the code as text (``turns.cache_reason``). :func:`explain_reason` turns a code and its
detail into words, in two lengths: the sentence an :class:`~promptcache_nb.Observation` states, and the
short cause :func:`~promptcache_nb.rebuilds` lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from .._util import fmt_duration
from ..request import PreparedRequest, canonical_json
from ..request.diff import PrefixDiff
from ..usage import Usage

#: A measured read and the simulator's predicted one disagree only beyond this many tokens (estimated and
#: measured counts differ by ±20 % anyway).
PREDICTION_NOISE_TOKENS = 256

#: The codes a measured request that is *not* a rebuild can carry (analysis.cause); every other code means a
#: rebuild.
NOT_REBUILD = frozenset({"cold", "hit", "below_minimum", "no_breakpoint", "unsupported"})


class Reason(StrEnum):
    """Why a request read less than the previous request left behind. Stable codes, stored as text."""

    HIT = "hit"  #: read everything the previous request made cacheable
    COLD = "cold"  #: first request of the session: nothing to read yet
    MODEL_SWITCH = "model_switch"  #: caches are keyed by model
    BELOW_MINIMUM = "below_minimum"  #: prefix shorter than the model's minimum cacheable length
    TTL_EXPIRED = "ttl_expired"  #: an entry matched but had outlived its TTL
    LOOKBACK_EXCEEDED = "lookback_exceeded"  #: a live entry exists, further back than the 20-position lookback
    PREFIX_CHANGED = "prefix_changed"  #: the bytes before the previous breakpoint changed
    THINKING_CHANGED = "thinking_changed"  #: the thinking settings changed: messages lost, tools and system kept
    NO_BREAKPOINT = "no_breakpoint"  #: nothing in the request asks for caching
    NOT_WRITTEN = "not_written"  #: the previous request wrote no entry covering what this one re-sends
    EVICTED = "evicted"  #: capacity eviction (LRU caches)
    UNSUPPORTED = "unsupported"  #: the provider cannot cache this request at all
    # Found only by the analysis of measured usage (:func:`~promptcache_nb.rebuilds`), never by a cache model:
    COMPACTION = "compaction"  #: the history was replaced by a summary
    UNLOGGED_PREFIX_CHANGED = "unlogged_prefix_changed"  #: a part of the prompt the log does not hold changed
    PROVIDER_MISS = "provider_miss"  #: the logged prefix was unchanged, nothing in the timing explains the miss
    #: a rebuild whose cause needs the request bodies, which a usage-first import has not analysed yet
    NOT_ANALYSED = "not_analysed"

    def explain(self, detail: Mapping[str, Any] | None = None, **context: Any) -> str:
        """This code in words; see :func:`explain_reason` for ``context``."""
        return explain_reason(self, detail, **context)


#: The codes a cache model may return (``CacheResult.reason``), in the order of :class:`Reason`.
REASONS: tuple[str, ...] = tuple(r.value for r in Reason if r not in (Reason.COMPACTION,
                                                                       Reason.UNLOGGED_PREFIX_CHANGED,
                                                                       Reason.PROVIDER_MISS,
                                                                       Reason.NOT_ANALYSED))


def first_request_reason(read: int, detail: dict[str, Any]) -> str:
    """The code of a session's first request: ``cold`` only when it read nothing. A read came from an entry
    another session of the account wrote (caches are keyed by content, shared by the account's sessions): a
    ``hit``, marked ``detail["first_request"]`` so its sentence says so."""
    if read:
        detail["first_request"] = True
        return Reason.HIT.value
    return Reason.COLD.value


#: Session events that say the thinking settings changed before a request (pi's ``thinking_level_change`` entry).
THINKING_EVENTS = frozenset({"thinking_level_change"})
#: The top-level field whose change is a thinking change (Anthropic's ``thinking``: enabled/disabled, budget).
THINKING_FIELD = "thinking"


def thinking_change(previous: Mapping[str, Any], current: Mapping[str, Any],
                    events: Iterable[str] = ()) -> dict[str, Any] | None:
    """The evidence that the thinking settings changed between two requests, or None: the one rule the
    measured cause and the Anthropic cache model share.

    Anthropic: "changes to thinking parameters (enabled/disabled or budget)" invalidate the cached message
    prefixes while cached tools and system prompts stay valid (docs/provider_cache_rules.md#anthropic-invalidation,
    [A1][A2]; the extended-thinking guide says the same of a budget change).

    Args:
        previous / current: the two requests' top-level fields (``PreparedRequest.rest``): their ``thinking``
            values are compared as canonical JSON (an absent field differs from a present one).
        events: the session events recorded with ``current`` (a ``thinking_level_change`` from a log that keeps
            no ``thinking`` field, like pi's).

    Example:
        >>> thinking_change({"thinking": {"type": "enabled", "budget_tokens": 2048}},
        ...                 {"thinking": {"type": "enabled", "budget_tokens": 8192}})["thinking_now"]
        '{"budget_tokens":8192,"type":"enabled"}'
    """
    before, now = previous.get(THINKING_FIELD), current.get(THINKING_FIELD)
    found: dict[str, Any] = {}
    if (THINKING_FIELD in previous) != (THINKING_FIELD in current) or canonical_json(before) != canonical_json(now):
        found.update(thinking_before=None if before is None else canonical_json(before),
                     thinking_now=None if now is None else canonical_json(now))
    said = sorted(THINKING_EVENTS.intersection(events))
    if said:
        found["thinking_event"] = said[0]
    return found or None


def where(d: PrefixDiff) -> str:
    """Where a prefix diff diverges, in words (``at system[2] (byte 1,204, ~token 301)``)."""
    if d.unlogged:
        return "in the unlogged prefix (outside the logged content: the change cannot be located)"
    b, t = d.byte_offset, d.token_offset
    if b is None:
        return f"at {d.path}"
    return f"at {d.path} (byte {b:,}, ~token {t:,})"


def _tokens_at(request: PreparedRequest | None, path: str | None) -> int | None:
    if request is None or path is None:
        return None
    run = 0
    for s in request.segments:
        run += s.tokens
        if s.path == path:
            return run
    return None


def explain_reason(
    reason: str | None,
    detail: Mapping[str, Any] | None = None,
    *,
    short: bool = False,
    gap: float | None = None,
    request: PreparedRequest | None = None,
    usage: Usage | None = None,
    diff: PrefixDiff | None = None,
) -> str:
    """A reason code and its cache-model ``detail`` in words.

    Args:
        reason: a :class:`Reason` code (an unknown one is named as it is).
        detail: the ``CacheResult.detail`` (or the evidence a measured analysis gathered).
        short: a short cause for a table (``TTL expiry: the 5m entry was idle 7m00s``) instead of the
            observation's full sentence (``TTL expired: the cached prefix was last used ...``).
        gap: seconds since the previous request (for a TTL expiry whose detail does not say).
        request: the request, for the full sentence's figures.
        usage: its usage, for the same.
        diff: its prefix diff against the previous request, for the same.

    Example:
        >>> explain_reason("ttl_expired", {"expired_ttl": "5m", "expired_after_seconds": 420}, short=True)
        'TTL expiry: the 5m entry was idle 7m00s'
    """
    detail = detail or {}
    code = Reason._value2member_map_.get(reason) if reason is not None else None
    if not isinstance(code, Reason):  # a code this version does not know (a newer store, a plugin's model)
        return str(reason) if short else f"Cache model reason: {reason}."
    if short:
        return _short(code, detail, gap)
    if "lost_tokens" in detail:  # a measured request (analysis.cause.measured_cause): its figures say it
        return _measured_sentence(code, detail, gap)
    return _sentence(code, detail, gap=gap, request=request, usage=usage, diff=diff)


def _short(code: Reason, detail: Mapping[str, Any], gap: float | None) -> str:
    if code is Reason.TTL_EXPIRED:
        ttl = detail.get("expired_ttl") or detail.get("expired") or "cached"
        idle = detail.get("expired_after_seconds", detail.get("idle_seconds", gap))
        return "TTL expiry" if idle is None else f"TTL expiry: the {ttl} entry was idle {fmt_duration(idle)}"
    if code is Reason.PREFIX_CHANGED:
        return f"prefix changed at {detail.get('divergence_path')}"
    if code is Reason.MODEL_SWITCH:
        now = f" to {detail['model']}: caches are kept per model" if detail.get("model") else ""
        return f"model switch from {detail.get('previous_model')}{now}"
    if code is Reason.BELOW_MINIMUM:
        return f"prefix below the {detail.get('min_tokens', 'minimum')}-token minimum: nothing was cached"
    if code is Reason.LOOKBACK_EXCEEDED:
        return (f"breakpoint too far back: the entry at {detail.get('unreached_path')} lies beyond the "
                "20-position lookback")
    if code is Reason.NO_BREAKPOINT:
        return "no cache_control in the request"
    if code is Reason.NOT_WRITTEN:
        return "the previous request wrote no entry covering this prefix"
    if code is Reason.EVICTED:
        return "evicted under capacity pressure"
    if code is Reason.THINKING_CHANGED:
        if "thinking_now" in detail or "thinking_before" in detail:
            what = (f"thinking changed from {detail.get('thinking_before') or '(absent)'} to "
                    f"{detail.get('thinking_now') or '(absent)'}")
        else:
            what = f"thinking level changed before this request ({detail.get('thinking_event', 'a session event')})"
        return f"{what}: the messages' cache is lost, tools and system stay cached"
    if code is Reason.COMPACTION:
        n_prev, n_cur = detail.get("messages") or ("?", "?")
        return f"compaction: the history was replaced by a summary ({n_prev} -> {n_cur} messages)"
    if code is Reason.UNLOGGED_PREFIX_CHANGED:
        was, became = int(detail.get("unlogged_before") or 0), int(detail.get("unlogged_now") or 0)
        if detail.get("estimated"):
            return ("prefix changed outside the logged content: the measured prompt total minus the logged "
                    f"content's estimate went from {was:,} to {became:,} tokens, more than what was appended "
                    "explains")
        return ("prefix changed outside the logged content: the unlogged prefix (system prompt, tools) went "
                f"from {was:,} to {became:,} measured tokens")
    if code is Reason.PROVIDER_MISS:
        text = "provider-side miss (the logged prefix was unchanged)"
        if detail.get("unlogged") is not None:
            return (f"{text}: the API read {detail.get('read', 0):,} tokens, less than the "
                    f"{detail['unlogged']:,}-token prefix the log does not hold (system prompt, tools), whose "
                    "measured size did not change: a change inside it cannot be told from a miss")
        return (f"{text}: nothing in the logged request or its timing explains it — an eviction, another server "
                "or cache namespace, or a part of the prompt the provider renders differently from the log")
    if code is Reason.NOT_ANALYSED:
        return ("cause not found yet: neither the model, a compaction nor the idle time explains it, and the "
                "request bodies are analysed on first use (open the session, or lab.analyze())")
    return code.value


def _measured_sentence(code: Reason, detail: Mapping[str, Any], gap: float | None) -> str:
    """A measured request's cause with its measured figures (and the simulator's prediction when it
    disagrees): the sentence its observation and its :func:`~promptcache_nb.rebuilds` row share."""
    lost = int(detail.get("lost_tokens") or 0)
    read, write = detail.get("read", 0), detail.get("write", 0)
    held = detail.get("previous_total")
    if code.value in NOT_REBUILD:
        text = _sentence(code, detail, gap=gap, request=None, usage=None, diff=None)
        if code is Reason.COLD:
            text = _cold(int(write or 0))
        elif code is Reason.HIT and held is None and read:
            text = _read_elsewhere(int(read), int(write or 0), detail.get("read_from_session"), measured=True)
        elif code is Reason.HIT and held is not None and read == 0:
            text = "No rebuild: nothing the previous request cached had to be sent again."
        elif code is Reason.HIT and held is not None and held - read > PREDICTION_NOISE_TOKENS:
            # the read fell, but what is missing was not sent again: it left the prompt or was never cached
            rest = ("the rest left the prompt: " + _short(Reason.COMPACTION, detail, gap)
                    if detail.get("rebuild_reason") == Reason.COMPACTION.value
                    else "the rest was the previous request's uncached tail, or left the prompt")
            text = (f"No rebuild: this request read {read:,} of the {held:,} prompt tokens the previous request "
                    f"held and sent {lost:,} of them again, within the noise floor; {rest}.")
        elif code is Reason.BELOW_MINIMUM and held is not None:
            text = (f"Below the minimum: the previous prompt ({held:,} measured tokens) is shorter than the "
                    "provider caches, so nothing could be read.")
    else:
        short = _short(code, detail, gap)
        if detail.get("implicit"):
            how = (f"this one read {read:,} and sent {detail.get('resent', 0):,} uncached, so {lost:,} tokens were "
                   "sent again uncached")
        else:
            how = f"this one read {read:,} and wrote {write:,}, so {lost:,} tokens were written again"
        text = f"{short[:1].upper()}{short[1:]}. Measured: the previous request held {held:,} prompt tokens; {how}."
    predicted = detail.get("predicted_read")  # set only when the prediction disagrees (as shares of the prompt)
    if predicted is not None:
        text += (f" The simulator expected to read {predicted:,} tokens (its reason: "
                 f"{detail.get('predicted_reason')}); the API read {read:,}.")
    elif detail.get("predicted_reason") == code.value and code is not Reason.COLD:
        text = f"The simulator predicted the same: {text[:1].lower() + text[1:] if text[1:2].islower() else text}"
    return text


def _cold(write: int) -> str:
    """A first request that read nothing (a first request that read is no cold cache: :func:`_read_elsewhere`)."""
    if write:
        return (f"Cold cache: nothing was cached before this request; it wrote {write:,} tokens for the next ones "
                "to read.")
    return "Cold cache: nothing was cached before this request."


def _read_elsewhere(read: int, write: int, written_by: Any = None, *, measured: bool = False) -> str:
    """A session's first request that read: the entry it read was written by another session (caches are
    shared by an account's sessions, keyed by content, not by session). ``written_by``: the session whose entry
    the simulated shared cache read — for a measured read, the simulator's answer, said as such."""
    wrote = f", and wrote {write:,} more" if write else ""
    if not written_by:
        return f"No cold cache: this first request read {read:,} tokens another session of this account wrote{wrote}."
    if measured:
        return (f"No cold cache: this first request read {read:,} tokens another session of this account "
                f"wrote{wrote} (in the simulated shared cache, session {written_by} wrote the entry it read).")
    return f"No cold cache: this first request read {read:,} tokens session {written_by} wrote{wrote}."


def _sentence(code: Reason, detail: Mapping[str, Any], *, gap: float | None, request: PreparedRequest | None,
              usage: Usage | None, diff: PrefixDiff | None) -> str:
    write = usage.cache_creation_input_tokens if usage is not None else None
    read = usage.cache_read_input_tokens if usage is not None else None
    model = request.model if request is not None else None
    if code is Reason.COLD:
        return _cold(write or 0)
    if code is Reason.HIT:
        if detail.get("first_request") and read:
            return _read_elsewhere(read, write or 0, detail.get("read_from_session"))
        return "The cache read everything the previous request left cached."
    if code is Reason.TTL_EXPIRED:
        secs = detail.get("expired_after_seconds", gap)
        ttl = detail.get("expired_ttl", "5m")
        since = f"{fmt_duration(secs)} before this request" if secs is not None else "too long ago"
        return (f"TTL expired: the cached prefix was last used {since}, longer than its {ttl} TTL, so it "
                "had to be written again.")
    if code is Reason.BELOW_MINIMUM:
        marks = detail.get("breakpoints") or []
        tokens = _tokens_at(request, marks[-1]) if marks else None
        size = f"~{tokens:,} tokens" if tokens is not None else "too short"
        return (f"Below the minimum: the prompt up to the last breakpoint is {size}, under "
                f"{detail.get('model', model)}'s {detail.get('min_tokens', 0):,}-token minimum, so "
                "nothing is read or written.")
    if code is Reason.LOOKBACK_EXCEEDED:
        path = detail.get("unreached_path", "an earlier block")
        tokens = detail.get("unreached_tokens")
        size = f" (~{tokens:,} tokens)" if tokens is not None else ""
        return (f"Lookback exceeded: a live cache entry ends at {path}{size}, but every breakpoint is 20 or "
                "more blocks after it, beyond the 20-block lookback; add a breakpoint closer to it.")
    if code is Reason.PREFIX_CHANGED:
        d = diff
        if d is not None and d.path is not None:
            shared, t = d.shared_prefix_tokens, d.token_offset
            text = f"Prefix changed {where(d)}"
            if shared:
                text += f": the cache could reuse at most the ~{shared:,} tokens of whole blocks before it"
            else:
                text += ": no whole block before it was unchanged"
            if t is not None and t > shared and d.field is None:
                text += (f" (the ~{t - shared:,} unchanged tokens at the start of {d.path} do not count: the "
                         "cache matches whole blocks)")
            return text + "; everything after was sent again."
        return f"Prefix changed at {detail.get('divergence_path') or 'an earlier block'}."
    if code is Reason.MODEL_SWITCH:
        before = detail.get("previous_model", "the previous model")
        after = detail.get("model", model)
        if read:  # back to a model whose cache was still warm
            return (f"Model switch: {before} -> {after}; caches are kept per model, so this request read the "
                    f"{read:,} tokens {after}'s cache still held from before, none of {before}'s.")
        return f"Model switch: {before} -> {after}; caches are kept per model, so nothing could be read."
    if code is Reason.NO_BREAKPOINT:
        return "No breakpoint: the request has no cache_control marker, so nothing is read or written."
    if code is Reason.NOT_WRITTEN:
        if read:
            return (f"Read {read:,} tokens from an earlier cache entry; the previous request left no entry "
                    "covering more of this prefix.")
        return ("Not written: the previous request left no cache entry covering this prefix, so there was "
                "nothing to read.")
    if code is Reason.EVICTED:
        return "Evicted: the cache entry was dropped for capacity before its TTL ran out."
    if code is Reason.UNSUPPORTED:
        return "Unsupported: the provider cannot cache this request."
    short = _short(code, detail, gap)  # the analysis-only codes: the short cause as a sentence
    return f"{short[:1].upper()}{short[1:]}."
