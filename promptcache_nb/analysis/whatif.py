"""What-ifs over a stored session under the Anthropic cache model: other TTLs, keep-warm pings, and
where (and why) the cache was rebuilt.

* :func:`ttl_whatif` rewrites every ``cache_control`` ttl of every stored body (explicit markers and the
  top-level automatic one) and replays the session: per-turn usage and cost with 5m vs 1h entries
  (1h writes cost 2× base input, 5m writes 1.25×; reads refresh either for free —
  docs/provider_cache_rules.md#anthropic-pricing).
* :func:`keep_warm` adds a ping every ``every`` during each gap between requests: the previous request
  re-sent with ``max_tokens: 0`` (pre-warming, docs/provider_cache_rules.md#anthropic-ttl-and-refresh), which
  reads — and so refreshes — the cached prefix. It reports the rebuilds the pings avoid and what they cost.
* :func:`rebuilds` lists the requests that had to write again what the cache held, each with its cause:
  from the measured figures first (live or imported usage), from the cache model's reason otherwise.

The what-ifs are simulated over estimated tokens (a request whose model the cache model does not know
gets no figures, never an error); costs use the session's prices (its explicit ``prices=`` or
genai-prices for each turn's own model, NULL when it has no exact price).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .._config import SessionConfig
from .._lazy import pandas as pd
from .._protocols import LabLike, StoredSession, resolve_session
from .._util import fmt_duration, parse_duration
from ..cache import AnthropicCache, CacheModel, Reason, explain_reason, get_cache_model
from ..cache._reasons import NOT_REBUILD
from ..errors import PromptCacheError
from ..request import PreparedRequest, SegmentMemo, prepare
from ..tokens import session_tokenizer
from ..usage import Usage
from ._ideal import carried_over, simulated_lost
from .cause import NOISE_FLOOR, MeasuredCause, MeasuredRequest, measured_cause
from .prices import Prices
from .resimulate import StoredTurn, load_turns, request_prices, simulate, stored_session_row

WHATIF_COLUMNS = [
    "ttl", "idx", "sent_at", "gap_seconds", "total_tokens", "input_tokens", "cache_read_input_tokens",
    "cache_creation_input_tokens", "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens",
    "output_tokens", "cache_reason", "cost_usd",
]

REBUILD_COLUMNS = [
    "idx", "sent_at", "gap_seconds", "expected_read", "read", "lost_tokens", "reason", "cause", "changed_path",
    "read_from_session", "detail", "measured", "explanation",
]



def _session_prices(row: dict[str, Any]) -> Callable[[str], Prices | None]:
    own = SessionConfig.from_stored(row["config"]).prices
    if own:
        fixed = Prices(**own)
        return lambda _model: fixed
    return lambda model: request_prices("anthropic", model)


def _cost(price: Callable[[str], Prices | None], model: str, usage: Usage, at: Any) -> float | None:
    p = price(model)
    return None if p is None else p.cost(usage, at)


def _anthropic(row: dict[str, Any], ttl: str | None = None) -> CacheModel:
    params = dict(SessionConfig.from_stored(row["config"]).cache_params) if row["cache_model"] == "anthropic" else {}
    if ttl is not None:  # the what-if TTL applies to the breakpoints assumed on partial bodies too
        params = {**params, "client_ttls": (ttl, ttl)}
    return get_cache_model("anthropic", **params)


def _with_output(usage: Usage, output: int | None) -> Usage:
    return Usage(usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens,
                 usage.cache_creation_5m_input_tokens, usage.cache_creation_1h_input_tokens, output,
                 "simulated", usage.raw)


def _gaps(turns: list[StoredTurn]) -> list[float | None]:
    return [None] + [(b.at - a.at).total_seconds() for a, b in zip(turns, turns[1:], strict=False)]


def ttl_whatif(
    lab_or_session: StoredSession | LabLike,
    session_id: str | None = None,
    ttls: Iterable[str] = ("5m", "1h"),
) -> pd.DataFrame:
    """Per-turn usage and cost of a stored session had every cache breakpoint used each TTL.

    Args:
        lab_or_session: a Session, or a Lab with ``session_id``.
        ttls: the TTLs to compare (``"5m"``, ``"1h"``).

    Returns:
        Long format, one row per (ttl, turn): ``ttl, idx, sent_at, gap_seconds``, the usage columns,
        ``cache_reason`` and ``cost_usd``. Totals: ``df.groupby("ttl")[["cost_usd"]].sum()``. A turn whose
        model the Anthropic cache model does not know has no usage, ``cache_reason`` ``unsupported``.

    Example:
        >>> df = pc.ttl_whatif(s)                                  # doctest: +SKIP
        >>> df.groupby("ttl").cost_usd.sum()                       # doctest: +SKIP
    """
    lab, sid = resolve_session(lab_or_session, session_id)
    row = stored_session_row(lab, sid)
    price = _session_prices(row)
    frames = []
    for ttl in ttls:
        if ttl not in ("5m", "1h"):
            raise ValueError(f"ttl must be '5m' or '1h' (Anthropic's two TTLs), got {ttl!r}")
        turns = load_turns(lab, sid, ttl=ttl)
        cache = _anthropic(row, ttl)
        gaps = _gaps(turns)
        rows: list[tuple[Any, ...]] = []  # WHATIF_COLUMNS
        for t, gap in zip(turns, gaps, strict=True):
            res = simulate(cache, t.request, t.at)
            if res is None:
                rows.append((ttl, t.idx, t.at, gap, t.request.total_tokens, None, None, None, None, None,
                             t.output_tokens, "unsupported", None))
                continue
            u = _with_output(res.usage, t.output_tokens)
            rows.append((ttl, t.idx, t.at, gap, t.request.total_tokens, u.input_tokens,
                         u.cache_read_input_tokens, u.cache_creation_input_tokens,
                         u.cache_creation_5m_input_tokens, u.cache_creation_1h_input_tokens, u.output_tokens,
                         res.reason, _cost(price, t.model, u, t.at)))
        frames.append(pd.DataFrame(rows, columns=WHATIF_COLUMNS))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=WHATIF_COLUMNS)


def _is_rebuild(t: StoredTurn, usage: Usage, prev_total: int | None, reason: str | None) -> bool:
    """The verdict on one simulated run's request (:func:`~promptcache_nb.analysis._ideal.simulated_lost`)."""
    return t.idx > 0 and usage.cache_read_input_tokens is not None and simulated_lost(
        prev_total, usage.cache_read_input_tokens, usage.cache_creation_input_tokens, usage.input_tokens, reason,
        implicit=t.request.wire.implicit_caching) > 0


def keep_warm(
    session: StoredSession | LabLike,
    every: str | float | timedelta = "4m",
    *,
    session_id: str | None = None,
    max_gap: str | float | timedelta | None = None,
    ttl: str | None = None,
) -> KeepWarm:
    """What a keep-warm ping every ``every`` would have saved, and cost.

    A ping re-sends the previous request with ``max_tokens: 0`` at ``prev + every``, ``prev + 2·every``...
    up to the next request, reading (and so refreshing) the cached prefix; it costs the tokens it reads
    (and writes, if its entry had already expired). Both runs are simulated with the Anthropic model.

    Args:
        session: a Session (or a Lab, with ``session_id``).
        every: the ping interval, e.g. ``"4m"`` (under a 5m TTL).
        max_gap: do not keep gaps longer than this warm (pinging overnight rarely pays); None = all.
        ttl: rewrite every breakpoint to this TTL first (``"5m"`` / ``"1h"``), as in :func:`ttl_whatif`.

    Returns:
        A :class:`KeepWarm`: ``every_seconds, pings, ping_cost_usd, rebuilds_without, rebuilds_with,
        rebuilds_avoided, cost_without_usd`` (requests only), ``cost_with_usd`` (requests + pings),
        ``net_saving_usd``, and ``turns``: a per-request DataFrame of both runs. A rebuild is a request
        that sent again some of what the previous one held and was no hit (the verdict's rule,
        :func:`~promptcache_nb.analysis._ideal.simulated_lost`).

    Example:
        >>> pc.keep_warm(s, every="4m").rebuilds_avoided       # doctest: +SKIP
    """
    lab, sid = resolve_session(session, session_id)
    row = stored_session_row(lab, sid)
    price = _session_prices(row)
    step = parse_duration(every)
    if step.total_seconds() <= 0:
        raise ValueError(f"every must be a positive duration, got {every!r}")
    limit = None if max_gap is None else parse_duration(max_gap).total_seconds()
    turns = load_turns(lab, sid, ttl=ttl)
    gaps = _gaps(turns)
    plain, warm = _anthropic(row, ttl), _anthropic(row, ttl)
    out_rows = []
    pings = 0
    ping_cost = 0.0
    prev: StoredTurn | None = None
    prev_total: int | None = None
    for t, gap in zip(turns, gaps, strict=True):
        n_pings = 0
        if prev is not None and gap is not None and (limit is None or gap <= limit):
            at = prev.at + step
            while at < t.at:
                res = simulate(warm, prev.request, at)
                if res is not None:
                    ping_cost += _cost(price, prev.model, _with_output(res.usage, 0), at) or 0.0
                n_pings += 1
                at += step
        pings += n_pings
        a, b = simulate(plain, t.request, t.at), simulate(warm, t.request, t.at)
        if a is None or b is None:  # a model the cache model cannot simulate: no figures
            out_rows.append({
                "idx": t.idx, "sent_at": t.at, "gap_seconds": gap, "pings_before": n_pings, "read_without": None,
                "read_with": None, "reason_without": "unsupported", "reason_with": "unsupported",
                "rebuild_without": False, "rebuild_with": False, "cost_without_usd": None, "cost_with_usd": None,
            })
        else:
            ua, ub = _with_output(a.usage, t.output_tokens), _with_output(b.usage, t.output_tokens)
            out_rows.append({
                "idx": t.idx, "sent_at": t.at, "gap_seconds": gap, "pings_before": n_pings,
                "read_without": ua.cache_read_input_tokens, "read_with": ub.cache_read_input_tokens,
                "reason_without": a.reason, "reason_with": b.reason,
                "rebuild_without": _is_rebuild(t, ua, prev_total, a.reason),
                "rebuild_with": _is_rebuild(t, ub, prev_total, b.reason),
                "cost_without_usd": _cost(price, t.model, ua, t.at), "cost_with_usd": _cost(price, t.model, ub, t.at),
            })
        prev, prev_total = t, t.request.total_tokens
    df = pd.DataFrame(out_rows)
    without = int(df.rebuild_without.sum()) if len(df) else 0
    with_ = int(df.rebuild_with.sum()) if len(df) else 0
    cost_without = float(df.cost_without_usd.sum()) if len(df) else 0.0
    cost_with = (float(df.cost_with_usd.sum()) if len(df) else 0.0) + ping_cost
    return KeepWarm(
        every_seconds=step.total_seconds(), pings=pings, ping_cost_usd=ping_cost, rebuilds_without=without,
        rebuilds_with=with_, rebuilds_avoided=without - with_, cost_without_usd=cost_without,
        cost_with_usd=cost_with, net_saving_usd=cost_without - cost_with, turns=df,
    )


@dataclass(frozen=True, repr=False)
class KeepWarm:
    """What :func:`keep_warm` found: the pings, the rebuilds they avoid, and the money either way.

    Attributes:
        every_seconds: the ping interval. pings: how many pings the gaps needed.
        ping_cost_usd: what the pings cost (the tokens they read, or wrote once an entry had expired).
        rebuilds_without / rebuilds_with: requests that had to write again what the cache held.
        rebuilds_avoided: ``rebuilds_without - rebuilds_with``.
        cost_without_usd: the requests alone. cost_with_usd: the requests plus the pings.
        net_saving_usd: ``cost_without_usd - cost_with_usd`` (negative: the pings cost more).
        turns: per-request DataFrame of both runs.

    Item access (``result["pings"]``) works as it did when this was a dict.
    """

    every_seconds: float
    pings: int
    ping_cost_usd: float
    rebuilds_without: int
    rebuilds_with: int
    rebuilds_avoided: int
    cost_without_usd: float
    cost_with_usd: float
    net_saving_usd: float
    turns: pd.DataFrame = field(compare=False)

    def __getitem__(self, name: str) -> Any:
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def keys(self) -> list[str]:
        return list(self.__dataclass_fields__)

    def __repr__(self) -> str:
        return (f"KeepWarm(every={fmt_duration(self.every_seconds)}, pings={self.pings}, "
                f"rebuilds_avoided={self.rebuilds_avoided} of {self.rebuilds_without}, "
                f"ping_cost_usd={self.ping_cost_usd:.4f}, net_saving_usd={self.net_saving_usd:.4f}, "
                f"turns=<{len(self.turns)} requests>)")


def _cause(reason: str | None, detail: dict[str, Any], gap: float | None) -> str:
    """One line a notebook reader can act on (:func:`~promptcache_nb.cache.explain_reason`, short)."""
    return explain_reason(reason, detail, short=True, gap=gap)


_REBUILD_COLUMNS = ("idx", "sent_at", "model", "total_tokens", "input_tokens", "cache_read_input_tokens",
                    "cache_creation_input_tokens", "usage_source", "cache_reason", "cache_detail", "events",
                    "cache_creation_1h_input_tokens")
#: What a rebuild row carries for pricing (:func:`rebuild_rows`), beside :data:`REBUILD_COLUMNS`.
_USAGE_PARTS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                "cache_creation_1h_input_tokens")


def rebuilds(session: StoredSession | LabLike, *, session_id: str | None = None,
             noise_floor: int = NOISE_FLOOR) -> pd.DataFrame:
    """The requests that had to send again what the cache held, each with its cause: of one session, or of
    every session of a Lab at once (a ``session`` column first).

    **Measured requests** (live or imported usage) are judged on their measured figures only, by the one
    function that also gave the request its stored ``cache_reason`` and its explanation
    (:func:`~promptcache_nb.analysis.cause.measured_cause`, see there for the rule): a rebuild is what the
    request sent again of what the previous request held — ``clamp(previous prompt total − cache read, 0,
    re-sent)`` measured tokens, where re-sent is the cache write on a provider with explicit writes
    (Anthropic) and everything not read on one that caches implicitly (OpenAI, Codex, DeepSeek, Gemini) —
    counted only above ``noise_floor``. The cause is the first the evidence supports: a model switch; a
    compaction; a TTL expiry; a thinking change (``thinking_changed``: a ``thinking_level_change`` event or a
    changed ``thinking`` field, the messages lost and tools and system kept); a change of the unlogged prefix
    (only with evidence); a prefix change located in the body; the 20-block lookback; else a provider-side miss
    (the logged prefix was unchanged). So a row's ``reason`` is the request's own ``cache_reason`` and its
    ``explanation`` is the sentence its observation states. ``explanation`` gives the measured figures, then the
    simulator's prediction when it disagrees.

    **Simulated requests** are judged as before: a request (not the first) whose cache read is below
    what the previous request carried over and whose cache model did not report ``hit``, with the cache
    model's reason (turns stored without one are re-simulated under the Anthropic model).

    The rows are selected in SQL over the stored causes, for every session in one query
    (``store/_rollups.py``); only a store written before causes were stored has its sessions recomputed from
    their bodies.

    Args:
        session: a Session; a Lab with ``session_id``; or a Lab alone: every session.
        noise_floor: measured rebuilds of at most this many tokens are ignored (the stored causes use
            :data:`~promptcache_nb.analysis.cause.NOISE_FLOOR`; a lower floor lists the cause the same
            function found for the smaller ones).

    Returns:
        One row per rebuild: ``idx, sent_at, gap_seconds, expected_read, read, lost_tokens, reason, cause,
        changed_path, read_from_session`` (the session of the account whose cache entry the simulated read came
        from, when another wrote it; else None), ``detail`` (a dict of the evidence), ``measured`` and
        ``explanation``; for a whole Lab,
        ``session`` first, ordered by session id then index (the rows of each session are the rows a call for
        that session returns).

    Example:
        >>> pc.rebuilds(s)[["idx", "cause", "lost_tokens"]]        # doctest: +SKIP
        >>> pc.rebuilds(lab).groupby("session").lost_tokens.sum()  # doctest: +SKIP
    """
    if session_id is None and not isinstance(session, StoredSession):
        return pd.DataFrame(rebuild_rows(session, None, noise_floor=noise_floor), columns=["session", *REBUILD_COLUMNS])
    lab, sid = resolve_session(session, session_id)
    return pd.DataFrame(rebuild_rows(lab, [sid], noise_floor=noise_floor), columns=REBUILD_COLUMNS)


def rebuild_rows(lab: LabLike, session_ids: list[str] | None = None, *, noise_floor: int = NOISE_FLOOR,
                 explain: bool = True) -> list[dict[str, Any]]:
    """The rows of :func:`rebuilds` for ``session_ids`` (None: every session) as dicts, ``session`` first, each
    also carrying what pricing it needs: ``model``, ``usage_source``, the usage parts (``input_tokens``...), its
    session's ``cache_model`` and explicit ``session_prices`` (JSON text, or None). The rows are the ones SQL
    selected (``store/_rollups.py``), built here; ``explain=False`` leaves out what only a reader needs (the
    evidence, the cause and the explanation: no JSON read, no sentence written) for a count or a sum."""
    found = lab.store.rebuild_rows(session_ids, noise_floor=noise_floor, not_rebuild=sorted(NOT_REBUILD))
    rows: list[dict[str, Any]] = []
    for r in found:
        sid = r["session_id"]
        session = {"cache_model": r["cache_model"], "session_prices": r["session_prices"]}
        if r["legacy"]:  # a cause was never stored: this session's rows are found again from its bodies
            rows.extend({"session": sid, **row, **session} for row in _recomputed_rows(lab, sid, noise_floor))
            continue
        usage = {"model": r["model"], "usage_source": r["usage_source"], **{k: r[k] for k in _USAGE_PARTS},
                 **session}
        gap = None if r["gap_seconds"] is None else float(r["gap_seconds"])
        expected = carried_over(int(r["prev_total"]), int(r["total"]))
        at, idx = r["sent_at"], r["idx"]
        if not explain:  # the SQL rule selected it; its lost tokens are the stored cause's (or expected − read)
            lost = int(r["lost"]) if r["measured"] or r["lost"] else expected - int(r["cache_read_input_tokens"])
            rows.append({"session": sid, "idx": idx, "sent_at": at, "gap_seconds": gap, "lost_tokens": lost,
                         "measured": bool(r["measured"]), **usage})
            continue
        detail = json.loads(r["cache_detail"]) if isinstance(r["cache_detail"], str) else {}
        reason = r["cache_reason"]
        if r["measured"]:
            row = _measured_row(reason, detail, noise_floor)
            if row is not None:  # the SQL rule and this one agree: a row it selected always has one
                rows.append({"session": sid, "idx": idx, "sent_at": at, "gap_seconds": gap, **row, "measured": True,
                             **usage})
        else:
            rows.append({"session": sid, **_simulated_row(idx, at, gap, expected, int(r["cache_read_input_tokens"]),
                                                          reason, detail), **usage})
    return rows


def _simulated_row(idx: int, at: Any, gap: float | None, expected: int, read: int, reason: str | None,
                   detail: dict[str, Any]) -> dict[str, Any]:
    cause = _cause(reason, detail, gap)
    lost = detail.get("simulated_lost_tokens")  # stored since one verdict (#38); before, what was not carried over
    return {"idx": idx, "sent_at": at, "gap_seconds": gap, "expected_read": expected, "read": read,
            "lost_tokens": int(lost) if isinstance(lost, int) else expected - read, "reason": reason, "cause": cause,
            "changed_path": detail.get("divergence_path") if reason == "prefix_changed" else None,
            "read_from_session": detail.get("read_from_session"), "detail": detail, "measured": False,
            "explanation": cause}


def _recomputed_rows(lab: LabLike, sid: str, noise_floor: int) -> list[dict[str, Any]]:
    """One session's rebuild rows with the causes a store written before they were stored lacks computed again
    (simulated requests re-simulated under the Anthropic model, measured ones by ``measured_cause``)."""
    df = lab.store.turns_frame(sid, _REBUILD_COLUMNS)
    reasons = list(df.cache_reason)
    details = [json.loads(d) if isinstance(d, str) else {} for d in df.cache_detail]
    measured = [s in ("live", "imported") for s in df.usage_source]
    if any(r is None and not m for r, m in zip(reasons, measured, strict=True)):
        cache = _anthropic(stored_session_row(lab, sid))
        for i, t in enumerate(load_turns(lab, sid)):
            res = simulate(cache, t.request, t.at)
            if reasons[i] is None and not measured[i] and res is not None:
                reasons[i], details[i] = res.reason, res.detail
    records = df.to_dict("records")
    evidence: _Evidence | None = None
    rows: list[dict[str, Any]] = []
    pricing = ("model", "usage_source", *_USAGE_PARTS)
    prev_total: int | None = None
    prev_at = None
    for i, r in enumerate(df.itertuples(index=False)):
        parts = (r.input_tokens, r.cache_read_input_tokens, r.cache_creation_input_tokens)
        known = None if any(pd.isna(p) for p in parts) else int(sum(parts))
        total = known if known is not None else int(r.total_tokens)
        read = None if pd.isna(r.cache_read_input_tokens) else int(r.cache_read_input_tokens)
        gap = None if prev_at is None else (r.sent_at - prev_at).total_seconds()
        if i and measured[i]:
            reason, detail = reasons[i], details[i]
            if "lost_tokens" not in detail:
                evidence = evidence or _Evidence(lab, sid)
                found = evidence.cause(i, records, detail, reason)
                reason, detail = (found.reason, found.detail) if found is not None else (reason, {})
            row = _measured_row(reason, detail, noise_floor)
            if row is not None:
                rows.append({"idx": r.idx, "sent_at": r.sent_at, "gap_seconds": gap, **row, "measured": True,
                             **{k: records[i][k] for k in pricing}})
        elif prev_total is not None:
            expected = carried_over(prev_total, total)
            # a store from before causes were stored: the rule of its day (read below what was carried over)
            if r.idx > 0 and read is not None and read < expected and reasons[i] != "hit":
                rows.append({**_simulated_row(r.idx, r.sent_at, gap, expected, read, reasons[i], details[i]),
                             **{k: records[i][k] for k in pricing}})
        prev_total, prev_at = total, r.sent_at
    return rows


def _measured_row(reason: str | None, detail: dict[str, Any], noise_floor: int) -> dict[str, Any] | None:
    """A measured request's rebuild row from its stored cause (None: no rebuild above ``noise_floor``)."""
    lost = int(detail.get("lost_tokens") or 0)
    if lost <= noise_floor or reason in (Reason.COLD.value, Reason.BELOW_MINIMUM.value):
        return None
    if reason is None or reason in NOT_REBUILD:  # under the stored floor: the cause found for it all the same
        reason = detail.get("rebuild_reason")
        if reason is None:
            return None
    return {"expected_read": int(detail.get("expected_read") or 0), "read": detail.get("read"), "lost_tokens": lost,
            "reason": reason, "cause": explain_reason(reason, detail, short=True),
            "changed_path": detail.get("changed_path"), "read_from_session": detail.get("read_from_session"),
            "detail": detail, "explanation": explain_reason(reason, detail)}


def _int(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


class _Evidence:
    """The stored bodies of a session, to find the measured causes a store written before they were stored
    lacks (built on demand)."""

    def __init__(self, lab: LabLike, session_id: str) -> None:
        self.store = lab.store
        self.sid = session_id
        row = stored_session_row(lab, session_id)
        config = SessionConfig.from_stored(row["config"])
        params = dict(config.cache_params)
        try:
            self.cache: CacheModel = get_cache_model(row["cache_model"], **params)
        except PromptCacheError:
            self.cache = AnthropicCache()
        self.memo = SegmentMemo(session_tokenizer(lab.tokenizer, config.calibration))
        self._requests: dict[int, PreparedRequest] = {}

    def request(self, idx: int) -> PreparedRequest:
        req = self._requests.get(idx)
        if req is None:
            req = self._requests[idx] = prepare(self.store.turn_body(self.sid, idx), memo=self.memo)
        return req

    def _measured(self, row: dict[str, Any]) -> MeasuredRequest:
        usage = Usage(_int(row["input_tokens"]), _int(row["cache_read_input_tokens"]),
                      _int(row["cache_creation_input_tokens"]), source=row["usage_source"])
        events = tuple(json.loads(row["events"])) if isinstance(row["events"], str) else ()
        return MeasuredRequest(self.request(int(row["idx"])), row["sent_at"].to_pydatetime(), usage, events)

    def cause(self, i: int, records: list[dict[str, Any]], detail: dict[str, Any],
              predicted_reason: str | None) -> MeasuredCause | None:
        cur = records[i]
        if not _total(cur):
            return None
        # the previous request that reached the API: entries such as Claude Code's "<synthetic>" ones carry
        # no prompt (total 0) and touch no cache
        j = i - 1
        while j >= 0 and not _total(records[j]):
            j -= 1
        if j < 0 or records[j]["usage_source"] not in ("live", "imported"):
            return None
        prev = self._measured(records[j])
        try:
            points = self.cache.retention_points(prev.request)
        except PromptCacheError:
            points = [(prev.request.total_tokens, 300.0)]
        try:
            minimum = self.cache.min_cacheable_tokens(str(cur["model"]))
        except PromptCacheError:
            minimum = 0
        return measured_cause(prev, self._measured(cur), retention_points=points, minimum=minimum,
                              predicted_reason=predicted_reason, predicted_detail=detail)


def _total(row: dict[str, Any]) -> int | None:
    parts = (row["input_tokens"], row["cache_read_input_tokens"], row["cache_creation_input_tokens"])
    return None if any(pd.isna(p) for p in parts) else int(sum(parts))
