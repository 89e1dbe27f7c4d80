"""The request pipeline: build → (send) → ideal read → price → analyse → a typed record and the next state.

Pure: no SQL, no clock, no I/O. :class:`~promptcache_nb.Session` sends the request (through its backend, or
predicts measured usage with its cache model) between :func:`build` and :func:`advance`; the store writes what
:func:`advance` returns (``Store.write_request``) and the session swaps in the returned :class:`SessionState`
only once that write is stored. A failed request therefore restores nothing: it changed nothing.

``Session.step`` (a strategy builds the request), ``Session.record`` (a request made elsewhere: imports, the
proxy), ``Lab.replay`` (through ``step``) and the importers (through ``record``) all go through here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from orjson import OPT_SORT_KEYS as _SORTED
from orjson import dumps as _orjson_dumps

from . import analysis as _analysis
from ._types import Delta, KnowledgeEntry, RequestRecord, encode_segment_map
from ._util import digest
from .analysis.prices import Prices
from .cache import CacheResult
from .dialects.anthropic import ProviderDiagnosis
from .errors import PromptCacheError, SessionError
from .request import BodyProblem, PreparedRequest, SegmentMemo, canonical_json, prepare
from .store._codecs import encode_message, prefix_chain, state_columns
from .store._write import RequestWrite
from .strategies import DeltaTable, Strategy, StrategyContext
from .tokens import segment_tokens
from .usage import Usage


@dataclass(frozen=True, slots=True)
class SessionState:
    """What a session holds in memory between requests, as one value: replaced whole once a change is stored,
    never edited in place (its lists and dicts are shared with the next state where unchanged)."""

    strategy_state: dict[str, Any]  #: the ``session_state`` row: host prompt, tools, model, ``extra``, pin state
    written: dict[str, Any] | None  #: its columns as last written (None: unknown, the next write rewrites it)
    messages: list[dict[str, Any]]  #: the conversation as the agent knows it (compacted messages left out)
    message_seq: int  #: the next ``session_messages`` seq
    built_messages: list[dict[str, Any]] | None  #: the history the last strategy-built request was built from
    deltas: list[Delta]  #: the session's prompt-delta rows
    previous: PreparedRequest | None  #: the last stored request (the next one is diffed against it)
    previous_at: datetime | None
    previous_keys: list[str]  #: its segments' chain keys and prefix node ids (the next chain extends them)
    previous_nodes: list[str]
    observation: Any  #: the observation state the next request is observed against (analysis.ObservationState)
    next_index: int
    pending_events: tuple[str, ...]  #: event codes recorded since the last request


@dataclass(frozen=True, slots=True)
class Built:
    """A request a strategy built from the session's history, with what it would change (:func:`build`)."""

    prepared: PreparedRequest
    history: list[dict[str, Any]]  #: the messages it was built from: the session's, then ``new_messages``
    new_messages: list[dict[str, Any]]  #: the user message or tool result (and a tool call) this request adds
    strategy_state: dict[str, Any]  #: the state row after the strategy ran
    deltas: DeltaTable  #: the prompt-delta rows after the strategy ran (``ops``: its changes)
    events: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What came back for a request: its usage and the cache model's verdict (a prediction when the usage is
    measured), and its reply."""

    usage: Usage
    cache_result: CacheResult | None
    request_id: str | None
    reply: list[dict[str, Any]] | None  #: the reply's content blocks, stored with the request (None: none)
    history_reply: list[dict[str, Any]] | None  #: what of it enters the history (see :func:`history_reply`)
    #: the provider's own diagnosis of the request's cache prefix, when its response carried one
    provider_diagnosis: ProviderDiagnosis | None = None


@dataclass(frozen=True, slots=True)
class Advance:
    """One request through the pipeline: what to store, the session's next state, and the per-request
    analysis the returned :class:`~promptcache_nb.Turn` shows."""

    write: RequestWrite
    state: SessionState
    analysis: _analysis.TurnAnalysis
    usage: Usage

    @property
    def record(self) -> RequestRecord:
        return self.write.record


def build(state: SessionState, strategy: Strategy, *, session_id: str, project_id: str, strategy_name: str,
          new_messages: list[dict[str, Any]], at: datetime, knowledge: list[KnowledgeEntry],
          params: dict[str, Any], memo: SegmentMemo) -> Built:
    """The strategy's next request over the session's history plus ``new_messages``, with the state and delta
    rows it would write. ``state`` is not changed: the strategy works on a copy of what it may write."""
    idx = state.next_index
    history = state.messages + new_messages
    # a copy the strategy may change: the big immutable parts (host prompt, tools) are shared
    values = dict(state.strategy_state)
    # ``extra`` deep-copied as a reload from the store gives it: parsed from the JSON last written (not serialised
    # again each turn: for some strategies it holds the whole stable prefix)
    written = state.written["extra"] if state.written is not None else None
    values["extra"] = json.loads(written if written is not None else canonical_json(state.strategy_state["extra"]))
    if values.get("ltm_pin_keys") is not None:
        values["ltm_pin_keys"] = list(values["ltm_pin_keys"])
    deltas = DeltaTable(state.deltas)
    ctx = StrategyContext(
        session_id=session_id, project_id=project_id, request_index=idx, now=at, model=values["model"],
        host_prompt=values["host_prompt"], tools=values["tools"], knowledge=knowledge, messages=history,
        events=state.pending_events, state=values, deltas=deltas, params=params,
        previous_messages=state.built_messages,
    )
    try:
        body = strategy.build(ctx)
        prepared = prepare(body, memo=memo, trusted=True, previous=state.previous)
    except PromptCacheError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise SessionError(f"turn {idx}: strategy {strategy_name!r} built an invalid request: {exc}") from exc
    return Built(prepared, history, new_messages, values, deltas, state.pending_events)


def advance(
    state: SessionState,
    *,
    session_id: str,
    project_id: str,
    prepared: PreparedRequest,
    at: datetime,
    events: list[str],
    outcome: Outcome,
    built: Built | None,
    user_text: str | None,
    prices: Prices | None,
    retention_points: list[tuple[int, float]] | None,
    minimum: int,
    transport: str,
    source_ref: str | None = None,
    dedupe_key: str | None = None,
    body_problems: tuple[BodyProblem, ...] = (),
    agent_observation: Mapping[str, Any] | None = None,
    latency_ms: float | None = None,
    source_span: tuple[int, int, str] | None = None,
) -> Advance:
    """From a sent request and what came back to its :class:`~promptcache_nb.RequestRecord`, the rows the
    store needs, and the session's next state.

    Args:
        state: the session's state before the request.
        built: the strategy's request (``step``), or None for a request made elsewhere (``record``).
        prices: the request's model's prices (None: unpriced, its cost is NULL).
        retention_points: the cache model's ``(prefix tokens, lifetime seconds)`` for the previous request;
            ``minimum``: its minimum cacheable length for this request's model (the ideal read's inputs).
        transport: ``direct`` (an in-process simulator) or ``http``.
        body_problems: what the API would refuse in a body stored as a log holds it (a lenient import).
        agent_observation: the logging agent's own observation of this request, kept in ``cache_detail`` beside
            the cause (``agent_observation``).
    """
    idx = state.next_index
    usage, cache_result, content = outcome.usage, outcome.cache_result, outcome.reply
    prev, prev_at = state.previous, state.previous_at
    ideal = _analysis.ideal_read(
        prev, prepared, previous_total=getattr(state.observation, "prompt_total", None),
        current_total=usage.total_input_tokens,
        gap_seconds=(at - prev_at).total_seconds() if prev is not None and prev_at is not None else None,
        retention_points=retention_points, compaction="compaction" in events, minimum=minimum,
        cache_read=usage.cache_read_input_tokens,
    ).tokens
    cost, cost_nc, cost_source = request_cost(usage, prices, at)
    keys, nodes, shared = prefix_chain(prepared, state.previous_keys, state.previous_nodes)
    rest_body = canonical_json({"shape": prepared.shape, "rest": prepared.rest})
    # a measured request's one cause (cache_reason, cache_detail, explanation) is decided in the analysis
    analysis = _analysis.analyse_turn(
        previous=prev, current=prepared, usage=usage, cache_result=cache_result, previous_state=state.observation,
        at=at, previous_at=prev_at, events=events, transport=transport, retention_points=retention_points,
        minimum=minimum,
    )
    detail = analysis.cache_detail
    if agent_observation is not None:
        detail = {**(detail or {}), "agent_observation": dict(agent_observation)}
    messages: list[tuple[int, dict[str, Any]]] = []
    added: list[dict[str, Any]] = []
    if built is not None:
        added = list(built.new_messages)
        if content is not None:
            added.append({"role": "assistant", "content": outcome.history_reply})
        messages = list(enumerate(added, start=state.message_seq))
    # the session_state row is rewritten only when it changed (most requests it does not)
    if built is not None:
        values = built.strategy_state
    else:
        values = state.strategy_state
    written = state_columns(values)
    reply_ref, reply_blocks = (None, []) if content is None else encode_message(
        {"role": "assistant", "content": content})
    record = RequestRecord(
        session_id=session_id, idx=idx, sent_at=at, model=prepared.model, tail_node=nodes[-1] if nodes else None,
        rest_hash=digest(rest_body.encode(), tag="seg"), n_segments=len(prepared.segments),
        total_tokens=prepared.total_tokens, body_bytes=prepared.segment_bytes,
        input_tokens=usage.input_tokens, cache_read_input_tokens=usage.cache_read_input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_creation_5m_input_tokens=usage.cache_creation_5m_input_tokens,
        cache_creation_1h_input_tokens=usage.cache_creation_1h_input_tokens,
        output_tokens=usage.output_tokens, reasoning_tokens=usage.reasoning_tokens, usage_source=usage.source,
        usage_raw=None if usage.raw is None else canonical_json(usage.raw),
        ideal_cache_read=ideal, cost_usd=cost, cost_no_cache_usd=cost_nc,
        cache_reason=analysis.cache_reason,
        cache_detail=None if detail is None else canonical_json(detail),
        events=canonical_json(events), request_id=outcome.request_id, user_text=label(user_text), reply=reply_ref,
        segment_map=encode_segment_map(cache_result.segment_states) if cache_result else None,
        transport=transport, source_ref=source_ref, dedupe_key=dedupe_key,
        body_problems=canonical_json([{"path": p.path, "problem": p.problem} for p in body_problems])
        if body_problems else None,
        notes="\n".join(usage.notes) or None, cost_source=cost_source, latency_ms=latency_ms,
        source_offset=None if source_span is None else source_span[0],
        source_length=None if source_span is None else source_span[1],
        source_digest=None if source_span is None else source_span[2],
        **provider_columns(outcome.provider_diagnosis),
        # the history the strategy built it from: the next request's previous_messages after a restart
        n_messages=len(built.history) if built is not None else None,
        **analysis.columns,
    )
    write = RequestWrite(
        record=record, prepared=prepared, nodes=nodes, shared=shared, rest_body=rest_body,
        reply_blocks=reply_blocks, messages=messages,
        state=None if written == state.written else values, state_previous=state.written,
        delta_ops=built.deltas.ops if built is not None else [], project_id=project_id,
        consumes_pending_events=bool(state.pending_events),
    )
    moved: dict[str, Any] = {}  # one replace() for the whole state change: a request makes many
    if built is not None:
        moved = {"strategy_state": values, "messages": built.history + added[len(built.new_messages):],
                 "message_seq": state.message_seq + len(messages), "built_messages": built.history,
                 "deltas": built.deltas.list()}
    after = replace(state, written=written, previous=prepared, previous_at=at, previous_keys=keys,
                    previous_nodes=nodes, observation=analysis.state, next_index=idx + 1, pending_events=(), **moved)
    return Advance(write, after, analysis, usage)


def reply_output_tokens(content: list[dict[str, Any]], tokenizer: Any) -> int:
    """Estimated output tokens of a reply whose usage reports none: its content blocks counted as messages."""
    return sum(segment_tokens("msg", b, tokenizer) for b in content)


def usage_record(*, session_id: str, idx: int, at: datetime, model: str, usage: Usage, prices: Prices | None,
                 events: tuple[str, ...] | list[str], cause: Any, request_id: str | None,
                 source_ref: str | None, dedupe_key: str | None, latency_ms: float | None = None,
                 source_span: tuple[int, int, str] | None = None, openclaw_broke: bool | None = None,
                 previous_cache_read: int | None = None,
                 provider_diagnosis: ProviderDiagnosis | None = None) -> RequestRecord:
    """The ``turns`` row of a request a usage-first import stores: its measured figures, cost and the cause its
    usage alone shows (``cause``: an :class:`~promptcache_nb.analysis.cause.MeasuredCause`, or None), every
    body-derived column NULL until the session is analysed (which replaces the row with :func:`advance`'s).
    ``broke`` is the cause's verdict (the rebuild rule needs the measured figures only, so it is final before any
    analysis); ``openclaw_broke`` / ``previous_cache_read``: OpenClaw's read-drop verdict against the last reported
    read, as usage alone gives it (:func:`~promptcache_nb.analysis.observe.usage_break`), a cross-check."""
    cost, cost_nc, cost_source = request_cost(usage, prices, at)
    detail = None if cause is None else _json_text(cause.detail)
    offset, length, span_digest = source_span if source_span is not None else (None, None, None)
    codes = canonical_json(list(events)) if events else "[]"  # most requests follow no event
    return RequestRecord(
        session_id=session_id, idx=idx, sent_at=at, model=model, tail_node=None, rest_hash=None, n_segments=None,
        total_tokens=None, body_bytes=None, input_tokens=usage.input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_creation_5m_input_tokens=usage.cache_creation_5m_input_tokens,
        cache_creation_1h_input_tokens=usage.cache_creation_1h_input_tokens,
        output_tokens=usage.output_tokens, reasoning_tokens=usage.reasoning_tokens, usage_source=usage.source,
        usage_raw=None if usage.raw is None else _json_text(usage.raw), ideal_cache_read=None,
        cost_usd=cost, cost_no_cache_usd=cost_nc, cache_reason=None if cause is None else cause.reason,
        cache_detail=detail, events=codes, request_id=request_id, user_text=None, reply=None,
        diverge_path=None, diverge_byte=None, diverge_token=None, shared_prefix_tokens=None, pure_append=None,
        broke=None if usage.cache_read_input_tokens is None else bool(cause is not None and cause.rebuild),
        openclaw_broke=openclaw_broke, previous_cache_read=previous_cache_read, changes=None,
        # the sentence of a rebuild (or a first request): a hit's says only that nothing was lost
        explanation=cause.explanation if cause is not None and (cause.rebuild or idx == 0) else None,
        segment_map=None, transport=None, source_ref=source_ref, dedupe_key=dedupe_key, n_messages=None,
        notes="\n".join(usage.notes) or None, cost_source=cost_source, latency_ms=latency_ms,
        source_offset=offset, source_length=length, source_digest=span_digest,
        **provider_columns(provider_diagnosis),
    )


def provider_columns(diagnosis: ProviderDiagnosis | None) -> dict[str, Any]:
    """The ``turns`` columns of the provider's own diagnosis (both None when there is none)."""
    if diagnosis is None:
        return {"provider_cache_miss_reason": None, "provider_cache_missed_tokens": None}
    return {"provider_cache_miss_reason": diagnosis.reason, "provider_cache_missed_tokens": diagnosis.missed_tokens}


def _json_text(value: Any) -> str:
    """Sorted-key JSON text of a usage-first row's JSON column, by orjson (several times faster than the
    canonical encoder, and a usage-first row is replaced whole when its session is analysed); what orjson cannot
    encode (a lone surrogate, an int past 64 bits) the canonical encoder does."""
    try:
        return str(_orjson_dumps(value, option=_SORTED).decode())
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return canonical_json(value)


#: ``turns.cost_source`` of a request priced by the cost its provider reported (OpenRouter's ``usage.cost``).
REPORTED_COST_SOURCE = "reported by provider"


def request_cost(usage: Usage, prices: Prices | None, at: datetime) -> tuple[float | None, float | None, str | None]:
    """``(cost, cost without caching, cost source)`` of one request.

    By ``prices`` (its model's, exactly resolved, or explicit); else by the cost the provider reported in the
    response (``usage.cost``, e.g. OpenRouter), labelled :data:`REPORTED_COST_SOURCE`, with no cost without
    caching (no rates to compute it from); else unknown (None, None, None) — never another model's price.
    Unknown usage has no cost either way.
    """
    if usage.total_input_tokens is None:
        return None, None, None
    if prices is not None:
        cost, cost_nc = prices.costs(usage, at)
        return cost, cost_nc, prices.source
    reported = usage.reported_cost
    if reported is not None:
        return reported, None, REPORTED_COST_SOURCE
    return None, None, None


def history_reply(content: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A model's own answer as it enters the history. ``tool_use`` blocks are left out: the session does
    not run tools, and a tool_use without its tool_result makes the next request invalid (HTTP 400).
    ``turn.reply`` keeps the full answer; script tool loops with ``tool_calls=``."""
    if not content or not any(b.get("type") == "tool_use" for b in content):
        return content
    kept = [b for b in content if b.get("type") != "tool_use"]
    if not kept:
        names = ", ".join(sorted({str(b.get("name")) for b in content if b.get("type") == "tool_use"}))
        kept = [{"type": "text", "text": f"(the model asked to call {names}; tool calls are not run here)"}]
    return kept


def label(text: str | None, limit: int = 160) -> str | None:
    """The ``user_text`` column is a label for tables; the full text is in the request body."""
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"
