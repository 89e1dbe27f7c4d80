"""A session's request path: a request built by its strategy (``step``) or produced elsewhere (``record``), sent
through the backend and its simulated cache, priced, and written to the store with its Turn."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from . import analysis as _analysis
from . import pipeline
from ._util import digest, parse_duration, user_stacklevel, utc
from .analysis import limits
from .analysis.prices import Prices
from .cache import CacheResult
from .dialects import get as get_format
from .dialects.anthropic import ProviderDiagnosis
from .errors import (
    APIError,
    BodyValidationError,
    InvalidRequestError,
    PromptCacheError,
    SessionError,
    UnpricedModelWarning,
)
from .live import DirectSimulator
from .live._base import SIMULATED_REPLY
from .pipeline import SessionState
from .request import BodyProblem, PreparedRequest, check_request, prepare
from .scenario import ToolCall
from .session_core import SessionCore, check_texts
from .store import Store
from .turn import Turn, has_record_listeners, notify_recorded
from .usage import Usage, UsageSource


class SessionRecording(SessionCore):
    """Building, sending and storing a session's requests (:class:`~promptcache_nb.Session` is one)."""

    # -- requests -----------------------------------------------------------------------------
    def step(
        self,
        user: str,
        reply: str | None = None,
        *,
        at: datetime | None = None,
        tool_calls: Iterable[Any] = (),
    ) -> Turn:
        """Send the next user message (and any tool loop) and return the last request's Turn.

        Args:
            user: the user's message.
            reply: the assistant's final answer. ``None`` means "use the model's answer" (live backends);
                the simulator then answers with a fixed acknowledgement.
            at: when the user sent it (UTC). Default: previous request + the session's step gap.
            tool_calls: :class:`~promptcache_nb.scenario.ToolCall` values (or dicts with name, input,
                result): each makes the assistant call a tool and adds one more request.
        """
        self._check_open()
        self._check_strategy()
        at = self._next_at(at)
        calls = [_as_call(c) for c in tool_calls]
        check_texts(SessionError, f"turn {self._state.next_index}", required=("user",), user=user, reply=reply,
                    tool_calls=[[c.name, c.input, c.result] for c in calls])
        turns: list[Turn] = []

        def run(store: Store) -> SessionState:
            # a user turn and its tool loop are one transaction: all of its requests are stored, or none
            state = self._state
            new_msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": user}]}]
            user_text: str | None = user
            when = at
            for call in calls:
                ns = self._id_namespace.get("session", self.id)
                tool_id = "toolu_" + digest(f"{ns}/{state.next_index}".encode(), tag="tool")[:24]
                use = {"role": "assistant", "content": [
                    {"type": "tool_use", "id": tool_id, "name": call.name, "input": call.input}]}
                state = self._built_request(state, store, new_msgs, use, at=when, user_text=user_text, turns=turns)
                result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id, "content": call.result}
                if call.is_error:
                    result["is_error"] = True
                new_msgs = [{"role": "user", "content": [result]}]
                user_text = None
                when = when + call.after
            final = None if reply is None else {"role": "assistant", "content": [{"type": "text", "text": reply}]}
            stored = self._built_request(state, store, new_msgs, final, at=when, user_text=user_text, turns=turns)
            self._announce(store, turns)
            return stored

        self._commit(run, requests=True)
        self._check_context_window(turns)
        return turns[-1]

    def preview(self, user: str, *, at: datetime | None = None) -> PreparedRequest:
        """The request ``step(user)`` would send next, built by the strategy but not sent or stored.

        Nothing changes: no request, no state, no delta row. The Stepper's Restart uses it to check that a
        session resumed from the store builds the same bytes as the object it replaced.

        Example:
            >>> before = s.preview("next question").body  # doctest: +SKIP
            >>> s = s.restart()  # doctest: +SKIP
            >>> s.preview("next question").body == before  # doctest: +SKIP
            True
        """
        self._check_open()
        new = [{"role": "user", "content": [{"type": "text", "text": user}]}]
        return self._build(self._state, new, at=self._next_at(at)).prepared

    def _announce(self, store: Store, turns: list[Turn]) -> None:
        """Tell :func:`~promptcache_nb.turn.on_record` listeners of ``turns`` once they are committed
        (inside ``Lab.atomic``: when the block commits; never when it rolls back)."""
        if has_record_listeners(self.id):
            sid = self.id
            store.on_commit(lambda: notify_recorded(sid, list(turns)))

    def _check_context_window(self, turns: list[Turn]) -> None:
        """One :class:`~promptcache_nb.errors.ContextWindowWarning` for the first stored request of this session
        object past its model's context window (measured input tokens when the usage is measured, else the
        estimate): said once, like an unpriced model, so an imported log of a 1M-context beta session is one
        warning, not one per request. After the commit: a warning turned into an error (``-W error``) never
        undoes a stored request."""
        if self._warned_window:
            return
        for t in turns:
            # stacklevel 3: counted from this method, the warning points at step()'s / record()'s caller
            if limits.check_request(t.prepared, where=f"session {self.id!r}: request {t.index}",
                                    usage=t.usage if t.usage.measured else None, stacklevel=3):
                self._warned_window = True
                return

    def _check_strategy(self) -> None:
        if self._missing_strategy is not None:
            raise SessionError(f"session {self.id!r} is read-only here: {self._missing_strategy}; install the package "
                               "that provides it (or register_strategy it) to step the session")
        if self._strategy is None:
            raise SessionError(f"session {self.id!r} was imported ({self.source}); it has no strategy to build a "
                               "request with: add requests with record(), or replay a scenario in a new session")

    def _next_at(self, at: datetime | None) -> datetime:
        prev_at = self._state.previous_at
        if at is None:
            return (prev_at + self._step_gap) if prev_at else self._start
        # a naive time is ambiguous (local? UTC?) and a string is not parsed here: one line, never a raw error
        got = None
        if not isinstance(at, datetime):
            got = f"{type(at).__name__} {at!r}"[:200]
        elif at.utcoffset() is None:
            got = f"the naive datetime {at.isoformat()}"
        else:
            try:
                at = utc(at)
            except OverflowError:  # year 1 at a positive offset has no UTC time
                got = f"{at.isoformat()}, out of range in UTC"
        if got is not None:
            raise SessionError(f"request {self._state.next_index}: at: must be a timezone-aware datetime, got {got}")
        if prev_at is not None and at < prev_at:
            raise SessionError(
                f"turn {self._state.next_index}: at={at.isoformat()} is before the previous request "
                f"({prev_at.isoformat()}); time only moves forward"
            )
        return at

    def _build(self, state: SessionState, new_msgs: list[dict[str, Any]], *, at: datetime) -> pipeline.Built:
        """The strategy's next request over the history plus ``new_msgs`` (:func:`pipeline.build`)."""
        self._check_strategy()
        assert self._strategy is not None  # checked just above
        return pipeline.build(state, self._strategy, session_id=self.id, project_id=self.project,
                              strategy_name=self.strategy, new_messages=new_msgs, at=at,
                              knowledge=self._lab.knowledge_cache.entries(self.project),
                              params=dict(self._config.strategy_params), memo=self._memo)

    def _built_request(self, state: SessionState, store: Store, new_msgs: list[dict[str, Any]],
                       reply_msg: dict[str, Any] | None, *, at: datetime, user_text: str | None,
                       turns: list[Turn]) -> SessionState:
        """One strategy-built request of a step: built, sent, stored; returns the state after it."""
        built = self._build(state, new_msgs, at=at)
        resp_content, usage, cache_result, request_id, diagnosis = self._send(state, built.prepared, at)
        # A scripted reply or tool call keeps the conversation the scenario's (and comparable across backends);
        # the endpoint's own answer is used when the caller asked for it (reply=None).
        if reply_msg is not None:
            content, history = reply_msg["content"], reply_msg["content"]
        else:
            content = resp_content if resp_content is not None else [{"type": "text", "text": SIMULATED_REPLY}]
            history = pipeline.history_reply(content)
        outcome = pipeline.Outcome(self._with_output(usage, content), cache_result, request_id, content, history,
                                   diagnosis)
        return self._store_request(state, store, built.prepared, at=at, events=list(built.events), outcome=outcome,
                                   built=built, user_text=user_text, turns=turns)

    def record(self, body: dict[str, Any], *, at: datetime | None = None,
               usage: Usage | dict[str, Any] | None = None, request_id: str | None = None,
               events: Iterable[str] = (), reply: list[dict[str, Any]] | None = None,
               source_ref: str | None = None, dedupe_key: str | None = None,
               prepared: PreparedRequest | None = None, dialect: str | None = None,
               unlogged_prefix_tokens: int | None = None, usage_source: UsageSource | None = None,
               body_problems: Iterable[BodyProblem] = (), output_tokens: int | None = None,
               agent_observation: Mapping[str, Any] | None = None, latency_ms: float | None = None,
               source_span: tuple[int, int, str] | None = None,
               provider_diagnosis: ProviderDiagnosis | None = None) -> Turn:
        """Store a request produced elsewhere (a log, a proxy). With ``usage`` it is *imported*
        (measured) usage; without, the session's cache model simulates it. The strategy is not used.

        ``source_ref`` (file:line) and ``dedupe_key`` are kept per request for imports; ``prepared`` lets
        an importer pass a body it already segmented (its own dialect, unlogged prefix, shared prefix).
        ``dialect`` (``anthropic``, ``openai-chat``, ``openai-responses``; detected when omitted) and
        ``unlogged_prefix_tokens`` (a partial body's measured unlogged prefix) are passed to ``prepare``;
        a ``usage`` dict is read in the body's dialect. ``reply`` (the answer's content blocks) and ``request_id``
        are stored as given, with or without ``usage``; without them a simulated request stores the backend's.
        The body is copied; what equals the previous request's body is shared with it, so a growing history costs
        only its new tail.

        The body must follow its API's documented shape (:func:`~promptcache_nb.request.validate_request`), or a
        :class:`~promptcache_nb.errors.BodyValidationError` names the field and nothing is stored. A caller
        passing ``prepared`` vouches for the body: the importer checks it leniently itself (a log holds what was
        sent) and passes what the API would refuse as ``body_problems``, stored with the request
        (``turns.body_problems``). ``output_tokens`` sets a simulated request's output (a counterfactual keeps
        the original's: caching never changes what a model writes). ``agent_observation``: the logging agent's
        own cache observation of this request (OpenClaw's ``cache:result``), stored as
        ``cache_detail["agent_observation"]`` beside ours. ``latency_ms``: how long the live call took
        (``turns.latency_ms``), when it was timed. ``source_span``: (byte offset, length, digest) of the log line
        an imported request was read from. ``provider_diagnosis``: the provider's own diagnosis of the request's
        cache prefix, when its response carried one (``turns.provider_cache_miss_reason``).
        """
        self._check_open()
        state = self._state
        at = self._next_at(at)
        if prepared is None:
            try:
                # strict: what the API would refuse is refused here; the previous body's repeated history was
                # validated with it and is not walked again
                check_request(body, dialect, request=state.next_index, partial=unlogged_prefix_tokens is not None,
                              previous=None if state.previous is None else state.previous.body)
                prepared = prepare(body, memo=self._memo, previous=state.previous, copy=True, dialect=dialect,
                                   unlogged_prefix_tokens=unlogged_prefix_tokens, keep_texts=True)
            except BodyValidationError:
                raise
            except (ValueError, TypeError) as exc:
                raise SessionError(f"request {state.next_index}: {exc}") from None
        if usage is not None:
            # measured figures are authoritative; the cache model only predicts
            measured = self._given_usage(usage, prepared.dialect, usage_source)
            content, request_id_, cache_result = reply, request_id, self._predict(prepared, at)
        else:
            # simulated: what the backend answered (its content and request id) is what is stored, unless the caller
            # gave the answer its agent got (then its output tokens are estimated from that answer)
            content, measured, cache_result, request_id_, sent_diagnosis = self._send(state, prepared, at)
            provider_diagnosis = provider_diagnosis or sent_diagnosis
            if reply is not None:
                content, measured = reply, replace(measured, output_tokens=None)
            if output_tokens is not None:
                measured = replace(measured, output_tokens=output_tokens)
            request_id_ = request_id if request_id is not None else request_id_
        outcome = pipeline.Outcome(self._with_output(measured, content), cache_result, request_id_, content, None,
                                   provider_diagnosis)
        turns: list[Turn] = []

        def write(store: Store) -> SessionState:
            stored = self._store_request(
                state, store, prepared, at=at, events=[*state.pending_events, *events], outcome=outcome, built=None,
                user_text=None, turns=turns, source_ref=source_ref, dedupe_key=dedupe_key,
                body_problems=tuple(body_problems), agent_observation=agent_observation, latency_ms=latency_ms,
                source_span=source_span)
            self._announce(store, turns)
            return stored

        self._commit(write, requests=True)
        self._check_context_window(turns)
        return turns[-1]

    def _given_usage(self, usage: Usage | dict[str, Any], dialect: str, source: UsageSource | None) -> Usage:
        """Measured usage passed to :meth:`record`, read in the body's dialect. Every count is checked (an int in
        ``0..MAX_TOKENS``, a 5m/1h split no larger than its total), a Usage built by hand too: a bad one is a
        one-line SessionError naming the field, before anything reaches the price library or the store."""
        try:
            if isinstance(usage, Usage):
                given = usage.check()
            else:
                given = get_format(dialect).usage(usage, source="imported")
        except ValueError as exc:
            raise SessionError(f"request {self._state.next_index}: {exc}") from None
        if source is not None:  # e.g. a proxy log of our own simulator: simulated
            return given if given.source == source else given.with_source(source)
        return given.with_source("imported") if given.source == "simulated" else given

    def _predict(self, prepared: PreparedRequest, at: datetime) -> CacheResult | None:
        """What the cache model predicts for a request whose usage was measured (the figures stay measured)."""
        cache = self._cache()
        try:
            return cache.process(prepared, at).as_prediction()
        except PromptCacheError:
            # e.g. a model the cache model's table lacks (Claude Code's "<synthetic>"): no prediction; cache
            # models raise before changing state, so the simulated cache goes on unchanged
            return None
        except BaseException:
            self._cache_stale()
            raise

    def _send(self, state: SessionState, prepared: PreparedRequest, at: datetime
              ) -> tuple[list[dict[str, Any]] | None, Usage, CacheResult | None, str | None, ProviderDiagnosis | None]:
        """Send a request through the backend: (reply content, usage, cache result, request id, the provider's
        diagnosis of its cache prefix)."""
        cache = self._cache()
        try:
            resp = self.backend.send(prepared, at=at, cache=cache)
        except APIError as exc:
            self._cache_stale()
            if exc.turn is None:
                raise exc.at_turn(state.next_index) from None
            raise
        except BaseException:
            self._cache_stale()  # the simulated cache may have moved; rebuild it from the store
            raise
        return resp.content, resp.usage, resp.cache_result, resp.request_id, resp.provider_diagnosis

    def _with_output(self, usage: Usage, content: list[dict[str, Any]] | None) -> Usage:
        """Usage with the reply's output tokens estimated when the endpoint did not report them."""
        if usage.output_tokens is not None or content is None:
            return usage
        return replace(usage, output_tokens=pipeline.reply_output_tokens(content, self._lab.tokenizer))

    def _ideal_inputs(self, state: SessionState, prepared: PreparedRequest) -> tuple[list[tuple[int, float]] | None,
                                                                                        int]:
        """The cache model's figures the ideal read needs: the previous request's retention points (None: no
        previous request) and the minimum cacheable length for this request's model."""
        cache = self._cache()
        points = None
        prev = state.previous
        if prev is not None and state.previous_at is not None:
            try:
                points = cache.retention_points(prev)
            except InvalidRequestError:
                points = [(prev.total_tokens, 300.0)]
        try:
            minimum = cache.min_cacheable_tokens(prepared.model)
        except PromptCacheError:
            minimum = 0
        return points, minimum

    def _store_request(self, state: SessionState, store: Store, prepared: PreparedRequest, *, at: datetime,
                       events: list[str], outcome: pipeline.Outcome, built: pipeline.Built | None,
                       user_text: str | None, turns: list[Turn], source_ref: str | None = None,
                       dedupe_key: str | None = None, body_problems: tuple[BodyProblem, ...] = (),
                       agent_observation: Mapping[str, Any] | None = None,
                       latency_ms: float | None = None,
                       source_span: tuple[int, int, str] | None = None) -> SessionState:
        """The pipeline's record of a sent request, written to the store; returns the state after it (the
        caller swaps it in once stored) and appends the request's Turn to ``turns``."""
        points, minimum = self._ideal_inputs(state, prepared)
        step = pipeline.advance(
            state, session_id=self.id, project_id=self.project, prepared=prepared, at=at, events=events,
            outcome=outcome, built=built, user_text=user_text, prices=self._priced(prepared.model, outcome.usage),
            retention_points=points, minimum=minimum,
            transport="direct" if isinstance(self.backend, DirectSimulator) else "http",
            source_ref=source_ref, dedupe_key=dedupe_key, body_problems=body_problems,
            agent_observation=agent_observation, latency_ms=latency_ms, source_span=source_span,
        )
        store.write_request(step.write, tokenizer=self._memo)
        rec, analysis, cache_result = step.record, step.analysis, outcome.cache_result
        turns.append(Turn(
            session_id=self.id, index=rec.idx, at=at, request=prepared.body, usage=step.usage,
            ideal_cache_read=rec.ideal_cache_read or 0, total_tokens=rec.total_tokens or 0, cost_usd=rec.cost_usd,
            cost_no_cache_usd=rec.cost_no_cache_usd, cache_reason=rec.cache_reason,
            cache_detail=analysis.cache_detail, events=events, reply=outcome.reply,
            request_id=rec.request_id, prepared=prepared, cache_result=cache_result, diff=analysis.diff,
            observation=analysis.observation, prompt_cache_info=analysis.prompt_cache_info,
            cost_source=rec.cost_source,
        ))
        return step.state

    def _priced(self, model: str, usage: Usage) -> Prices | None:
        # unknown usage has no cost whatever the price: no lookup, and no "unpriced" warning
        return None if usage.total_input_tokens is None else self._request_prices(model, usage)

    def _request_prices(self, model: str, usage: Usage) -> Prices | None:
        """The prices of one request, by its own model: explicit prices, else genai-prices by the exact id
        (measured usage: never a stand-in, :func:`~promptcache_nb.analysis.request_prices`). A model without an
        exact price is unpriced (its cost NULL, or the cost its provider reported), with one
        :class:`~promptcache_nb.errors.UnpricedModelWarning` per session when no cost is known — never another
        model's price."""
        prices = self._prices or _analysis.request_prices(self.cache, model, measured=usage.measured)
        if prices is None and usage.reported_cost is None and not self._warned_unpriced:
            self._warned_unpriced = True
            warnings.warn(UnpricedModelWarning(model, self.id), stacklevel=user_stacklevel())
        return prices


def _as_call(c: Any) -> Any:

    if isinstance(c, ToolCall):
        return c
    if isinstance(c, dict):
        after = parse_duration(c.get("after", 4))
        return ToolCall(c["name"], dict(c.get("input", {})), str(c["result"]), bool(c.get("is_error", False)), after)
    raise TypeError(f"tool_calls items must be ToolCall or dict, got {type(c).__name__}")
