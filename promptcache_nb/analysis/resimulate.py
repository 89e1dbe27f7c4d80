"""Re-simulate a stored session under another provider's cache model, without re-running its strategy.

The stored request bodies are replayed, in order and at their stored times, through a fresh cache model
(``anthropic``, ``openai``, ``deepseek``, ``vllm`` or any registered one). Output tokens are the stored
ones: caching never changes what a model writes. Token figures are the *estimated* counts of the
canonical body, so every result here is ``simulated``, even for a session whose own usage was measured.

Speed: all of a session's turns, prefix nodes and blocks are read in three queries; each distinct stored
block is parsed and token-counted once, and each prefix node becomes one shared
:class:`~promptcache_nb.Segment`, so a 1,000-turn session rebuilds in well under a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from .._config import SessionConfig
from .._lazy import pandas as pd
from .._protocols import LabLike, StoredSession, ensure_analysed, resolve_session
from .._types import HISTORY_MISSING
from .._util import digest
from ..cache import CacheModel, CacheResult, get_cache_model
from ..cache._prefix import common_prefix_len
from ..errors import PriceError, PromptCacheError, SessionError
from ..request import PreparedRequest, Segment, SegmentMemo, canonical_bytes, content_hash, prepare, rebuild_body
from ..request._canonical import mark_prefix
from ..store import Store, StoredNode
from ..tokens import session_tokenizer
from ..usage import Usage
from .frames import SUMMARY_ALIASES, usage_totals
from .prices import Prices, price_provider, prices_for

if TYPE_CHECKING:  # pragma: no cover - pandas loads with the first frame, not with the package

    from ..dialects import SegmentKind

#: The stand-in price model per cache model, for *simulated* requests whose own model is another provider's: a
#: what-if the user asked for (an Anthropic session re-simulated under OpenAI's cache is priced as ``gpt-5``). A
#: request whose model is the provider's own is priced by its own id (``gpt-5.3-codex`` as ``gpt-5.3-codex``), and
#: *measured* traffic only ever by its own model (:func:`request_prices`).
PRICE_MODELS: dict[str, str] = {"openai": "gpt-5", "deepseek": "deepseek-chat", "gemini": "gemini-2.5-flash"}

#: genai-prices' provider of a cache model's own models, where it is named otherwise.
_PRICE_PROVIDERS: dict[str, str] = {"gemini": "google"}

#: vLLM is self-hosted: tokens cost nothing, the saving is compute. Explicit zeros, never a silent default.
SELF_HOSTED = Prices(0.0, 0.0, 0.0, 0.0, 0.0, source="self-hosted (no token price)")

RESIM_COLUMNS = [
    "idx", "sent_at", "model", "cache", "total_tokens", "input_tokens", "cache_read_input_tokens",
    "cache_creation_input_tokens", "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens",
    "output_tokens", "cache_reason", "cost_usd", "cost_no_cache_usd", "native", "cache_detail",
]

COMPARE_COLUMNS = [
    "cache", "prices", "requests", "total_input", "cache_read", "cache_write", "uncached", "cache_read_pct",
    "cost_usd", "cost_no_cache_usd", "saved_usd",
    "read_pct",  # the old name of cache_read_pct (frames.SUMMARY_ALIASES), kept working
]


# -- reading a session back ---------------------------------------------------------------------
@dataclass(frozen=True)
class StoredTurn:
    """One stored request, rebuilt for replay: its row figures and its prepared request."""

    idx: int
    at: datetime
    model: str
    request: PreparedRequest
    output_tokens: int | None
    stored: dict[str, Any] = field(repr=False)


_TURN_FIELDS = (
    "idx", "sent_at", "model", "tail_node", "rest_hash", "output_tokens", "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens", "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens",
    "usage_source", "total_tokens", "ideal_cache_read", "cost_usd", "cache_reason", "cache_detail", "events",
    "broke", "provider_cache_miss_reason",
)


def history_missing(turn: StoredTurn) -> bool:
    """True when the log lacked this request's conversation history (the stored event
    :data:`~promptcache_nb._types.HISTORY_MISSING`: a compaction call, which re-sent its parent's conversation).

    Its measured usage is exact, but its body is either the history rebuilt from the parent's log (the event
    ``history_from_parent`` beside it) or the logged tail alone, so a simulated replay of it, and any saving a
    counterfactual finds on it, rests on a body that was not logged: claim none on it.

    Example:
        >>> [t.idx for t in load_turns(lab, sid) if history_missing(t)]  # doctest: +SKIP
    """
    raw = turn.stored.get("events")
    events = json.loads(raw) if isinstance(raw, str) else raw or []
    return HISTORY_MISSING in events


_resolve = resolve_session  # the name the analysis modules used


def stored_session_row(lab: LabLike, session_id: str) -> dict[str, Any]:
    """The stored row of ``session_id`` (``config`` a dict), or a SessionError naming the known ones."""
    row = lab.store.session_row(session_id)
    if row is None:
        known = lab.store.session_ids()
        raise SessionError(f"no session {session_id!r} in {lab.path!r}; known: {', '.join(known) or '(none)'}")
    return row


#: From this many new blocks in one request the loader counts them in one batch (``SegmentMemo.count_ahead``).
_COUNT_AHEAD = 32


class _Loader:
    """A session's stored requests (all, or those sent ``since`` a time), built from the prefix tree with one
    Segment per node: the one bulk rebuild of stored bodies (re-simulation, what-ifs, and a session resuming
    its simulated cache), three queries for any number of requests, every dialect and partial bodies.

    ``memo`` is the session's own (its tokenizer, and counts it already made); by default a new one with the
    session's tokenizer.
    """

    def __init__(self, lab: LabLike, session_id: str, *, ttl: str | None = None, since: datetime | None = None,
                 memo: SegmentMemo | None = None) -> None:
        store: Store = lab.store
        session_row = stored_session_row(lab, session_id)
        self.session_id = session_id
        self.ttl = ttl
        self.rows = store.turn_rows(session_id, _TURN_FIELDS, since=since)
        rests, nodes = store.session_blocks(session_id, since=since, nodes=bool(self.rows))
        self.rests = {h: store.parse_block(h, b, "turns.rest_hash") for h, b in rests.items()}
        self._store = store
        self.nodes: dict[str, StoredNode] = nodes
        # the session's own tokenizer (its opted-in calibration included): a request re-simulates as it was stored
        self.memo = memo or SegmentMemo(session_tokenizer(lab.tokenizer,
                                                                SessionConfig.from_stored(session_row["config"]).calibration))
        self._view = self.memo  # the memo of the current request's model (SegmentMemo.for_model)
        self._segs: dict[tuple[str, bool, int], Segment] = {}  # (node, system is a str, id(view))
        self._counters: dict[str, tuple[int, int, int, int]] = {}  # node -> tools, system, messages, block
        self._chains: dict[str, list[str]] = {}  # tail -> its chain
        self._on_chain: dict[str, tuple[list[str], int]] = {}  # node -> (a chain through it, its position there)
        self._totals: dict[tuple[int, str], int] = {}  # (id(view), node) -> estimated tokens through the node
        self._blocks: dict[str, tuple[Any, dict[str, Any] | None, str, str, int]] = {}  # node -> _parsed

    def _chain(self, tail: str) -> list[str]:
        """Node ids from the root to ``tail``; reuses the chain through the nearest ancestor already seen, whether
        it was a request's tail or not (a request that changes its predecessor's last block, as a moving cache
        marker does, branches off below that tail: walking up to the root each time cost O(depth) per request)."""
        got = self._chains.get(tail)
        if got is not None:
            return got
        new: list[str] = []
        node: str | None = tail
        on_chain = self._on_chain
        while node is not None and node not in on_chain:
            new.append(node)
            node = self.nodes[node].parent
        if node is None:
            chain = new[::-1]
        else:
            known, at = on_chain[node]
            chain = known[: at + 1] + new[::-1]
        for i in range(len(chain) - len(new), len(chain)):
            on_chain[chain[i]] = (chain, i)
        self._chains[tail] = chain
        return chain

    def _parsed(self, node: str) -> tuple[Any, dict[str, Any] | None, str, str, int]:
        """A node's block as the request holds it (its ``cache_control`` ttl rewritten when asked): element, marker,
        storage hash, content hash, canonical bytes. Parsed once per node."""
        got = self._blocks.get(node)
        if got is None:
            n = self.nodes[node]
            bhash, body = n.block_hash, n.body
            element = self._store.parse_block(bhash, body, "prefix_nodes.block_hash")
            cc = element.get("cache_control") if isinstance(element, dict) else None
            nbytes = len(body.encode())
            if cc is not None and self.ttl is not None:
                cc = {**cc, "ttl": self.ttl}
                element = {**element, "cache_control": cc}
                exact = canonical_bytes(element)
                bhash, nbytes = digest(exact, tag="seg"), len(exact)
            got = self._blocks[node] = (element, cc, bhash, bhash if cc is None else content_hash(element), nbytes)
        return got

    def _count_ahead(self, view: SegmentMemo, nodes: list[str]) -> None:
        """Count the blocks of ``nodes`` in one batch (``SegmentMemo.count_ahead``), when they are many: the first
        request rebuilt brings its whole history at once."""
        if len(nodes) >= _COUNT_AHEAD:
            view.count_ahead([(self.nodes[node].kind, parsed[3], parsed[0])
                              for node in nodes for parsed in (self._parsed(node),)])

    def _segment(self, node: str, sys_str: bool) -> Segment:
        view = self._view
        vid = id(view)
        seg = self._segs.get((node, sys_str, vid))
        if seg is not None:
            return seg
        n = self.nodes[node]
        parent, kind, role = n.parent, n.kind, n.role
        nt, ns, nm, nb = self._counters[parent] if parent is not None else (0, 0, 0, 0)
        if kind == "tool":
            path, nt = f"tools[{nt}]", nt + 1
        elif kind == "system":
            path, ns = ("system" if sys_str else f"system[{ns}]"), ns + 1
        elif kind == "msg":
            path, nb = f"messages[{nm - 1}].content[{nb}]", nb + 1
        elif kind == "msg-start":
            path, nm, nb = f"messages[{nm}].content[0]", nm + 1, 1
        else:  # msg-str, msg-empty
            path, nm, nb = f"messages[{nm}].content", nm + 1, 0
        self._counters[node] = (nt, ns, nm, nb)
        total = self._totals[(vid, parent)] if parent is not None else 0
        element, cc, bhash, chash, nbytes = self._parsed(node)
        tokens = view.tokens(kind, chash, element)
        seg = Segment(path, cast("SegmentKind", kind), role, chash, bhash, tokens, cc, element, nbytes)  # as stored
        self._segs[(node, sys_str, vid)] = seg
        self._totals[(vid, node)] = total + seg.tokens
        return seg

    def _generic(self, shape: dict[str, Any], rest: dict[str, Any], chain: list[str],
                 previous: PreparedRequest | None) -> PreparedRequest:
        elements = self.__dict__.setdefault("_elements", {})
        triples = []
        for node in chain:
            n = self.nodes[node]
            kind, role, body = n.kind, n.role, n.body
            el = elements.get(node)
            if el is None:
                el = elements[node] = self._store.parse_block(n.block_hash, body, "prefix_nodes.block_hash")
                cc = el.get("cache_control") if isinstance(el, dict) else None
                if isinstance(cc, dict) and self.ttl is not None:
                    el = elements[node] = {**el, "cache_control": {**cc, "ttl": self.ttl}}
            triples.append((kind, role, el))
        return prepare(rebuild_body(shape, rest, triples), memo=self.memo, previous=previous)

    def turns(self) -> Iterator[StoredTurn]:
        """The session's requests in order.

        Consecutive requests share their unchanged Segment objects and message dicts (built
        incrementally: O(new segments) per turn); treat bodies as read-only.
        """
        prev_chain: list[str] = []
        prev_segs: tuple[Segment, ...] = ()
        prev_sys_str = False
        prev_req: PreparedRequest | None = None
        last: PreparedRequest | None = None  # the last request yielded
        generic: PreparedRequest | None = None
        tools: list[Any] = []
        system: list[Any] = []
        msgs: list[dict[str, Any]] = []
        for row in self.rows:
            rest_row = self.rests[row["rest_hash"]]
            shape, rest = rest_row["shape"], dict(rest_row["rest"])
            if self.ttl is not None and isinstance(rest.get("cache_control"), dict):
                rest["cache_control"] = {**rest["cache_control"], "ttl": self.ttl}
            sys_str = shape.get("system") == "str"
            chain = self._chain(row["tail_node"]) if row["tail_node"] is not None else []
            if "dialect" in shape or "unlogged" in shape:
                # OpenAI dialects and partial bodies: the one generic rebuild (request.rebuild_body + prepare)
                generic = last = self._generic(shape, rest, chain, generic)
                prev_chain, prev_segs = [], ()  # the incremental Messages rebuild starts over after it
                yield StoredTurn(row["idx"], row["sent_at"].astimezone(UTC), row["model"], generic,
                                 row["output_tokens"], row)
                continue
            view = self.memo.for_model(rest.get("model"))
            if view is not self._view:  # another estimator (a model switch): nothing carries over
                self._view, prev_chain, prev_segs = view, [], ()
            shared = common_prefix_len(chain, prev_chain) if sys_str == prev_sys_str else 0
            self._count_ahead(view, chain[shared:])
            new = tuple(self._segment(node, sys_str) for node in chain[shared:])
            segs = prev_segs[:shared] + new
            nt, ns, nm, nb = self._counters[chain[shared - 1]] if shared else (0, 0, 0, 0)
            tools, system, msgs = tools[:nt], system[:ns], msgs[:nm]
            fresh = False  # may the last message dict be mutated (built for this request)?
            if nm and isinstance(msgs[-1]["content"], list) and len(msgs[-1]["content"]) > nb:
                msgs[-1] = {"role": msgs[-1]["role"], "content": msgs[-1]["content"][:nb]}
                fresh = True
            for seg in new:
                kind, el = seg.kind, seg.element
                if kind == "tool":
                    tools.append(el)
                elif kind == "system":
                    system.append(el)
                elif kind == "msg":
                    if not fresh:
                        msgs[-1] = {"role": msgs[-1]["role"], "content": list(msgs[-1]["content"])}
                        fresh = True
                    msgs[-1]["content"].append(el)
                else:
                    msgs.append({"role": seg.role, "content": [el] if kind == "msg-start" else el})
                    fresh = True
            body = dict(rest)
            if shape.get("tools") == "list":
                body["tools"] = tools
            if sys_str:
                body["system"] = system[0]
            elif shape.get("system") == "list":
                body["system"] = system
            if shape.get("messages") == "list":
                body["messages"] = msgs
            total = self._totals[(id(view), chain[-1])] if chain else 0
            req = PreparedRequest(body, segs, shape, rest, total, view.tokenizer.name)
            if shared and prev_req is not None:
                mark_prefix(req, prev_req, shared)  # per-segment sums extend the previous request's
            prev_chain, prev_segs, prev_sys_str, prev_req = chain, segs, sys_str, req
            last = req
            yield StoredTurn(row["idx"], row["sent_at"].astimezone(UTC), row["model"], req, row["output_tokens"],
                             row)
        if last is not None and last is prev_req:
            _index_units(last)


def _index_units(req: PreparedRequest) -> None:
    """What ``prepare`` records of a Messages request's units (each tool, system block and message's span of
    segments), for the last request rebuilt: it is the ``previous`` of a resuming session's next request, whose
    ``prepare`` then reuses its segments for the units the two bodies repeat instead of segmenting and hashing
    the whole history again. One pass over its segments; the per-unit bytes are computed when first compared."""
    units: dict[str, list[tuple[int, int]]] = {}
    if req.shape.get("tools") == "list":
        units["tools"] = []
    if req.shape.get("system") in ("str", "list"):
        units["system"] = []
    if req.shape.get("messages") == "list":
        units["messages"] = []
    for i, seg in enumerate(req.segments):
        kind = seg.kind
        if kind == "msg":  # the next block of the message started before it
            spans = units["messages"]
            spans[-1] = (spans[-1][0], i + 1)
        else:
            units["tools" if kind == "tool" else "system" if kind == "system" else "messages"].append((i, i + 1))
    derived = req.derived
    derived.units, derived.snaps = units, {}
    derived.msg_spans = units.get("messages", [])


def load_turns(
    lab_or_session: LabLike | StoredSession, session_id: str | None = None, *, ttl: str | None = None,
    since: datetime | None = None, memo: SegmentMemo | None = None,
) -> list[StoredTurn]:
    """A stored session's requests, rebuilt from the store in bulk (``ttl`` rewrites every ``cache_control``
    ttl; ``since``: only the requests sent at or after it; ``memo``: the session's segment memo)."""
    lab, sid = _resolve(lab_or_session, session_id)
    ensure_analysed(lab, sid)  # a usage-first session's bodies, on first use
    return list(_Loader(lab, sid, ttl=ttl, since=since, memo=memo).turns())


# -- prices -------------------------------------------------------------------------------------
def _price_resolver(cache_name: str, session_row: dict[str, Any], *, price_model: str | None,
                    prices: Prices | None, measured: bool = False) -> Callable[[str], Prices | None]:
    """turn model -> Prices under ``cache_name``: explicit prices, else genai-prices by each turn's own
    model (:func:`request_prices`; ``measured``: a measured session replayed under its own cache model, priced by
    its own models only, never a stand-in); None for a model without an exact price — never a silent zero."""
    if prices is not None:
        return lambda _model: prices
    own = SessionConfig.from_stored(session_row["config"]).prices
    if price_model is None and cache_name == "anthropic" and own:
        fixed = Prices(**own)  # the session's own explicit prices
        return lambda _model: fixed
    if price_model is not None:
        fixed = prices_for(price_model)  # asked for by name: an unknown one is an error
        return lambda _model: fixed
    return lambda model: request_prices(cache_name, model, measured=measured)


# -- re-simulation ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SharedStream:
    """Another session's requests, replayed through the same cache as a session's own and interleaved with them by
    time (a project's sub-agents, compaction calls and other conversations read each other's entries): its
    stream key, its requests, and its cache options (its client's TTLs)."""

    key: str
    turns: Sequence[StoredTurn]
    options: Mapping[str, Any]


def _interleaved(turns: Sequence[StoredTurn], cache: CacheModel, own_key: str,
                 shared: Sequence[SharedStream]) -> Iterator[StoredTurn]:
    """``turns``, with ``shared`` streams' requests simulated between them in time order (ties by stream key and
    index, as a scope cache's rebuild orders them; the own turns keep their order), each under its own stream and
    options."""
    own = cache.options
    kind = type(cache).Options
    others = [(s.key, kind.stored(s.options, owner=f"cache model {cache.name!r}"), t) for s in shared for t in s.turns]
    events = sorted([*((t.at, own_key, k, own, t, True) for k, t in enumerate(turns)),
                     *((t.at, key, t.idx, opts, t, False) for key, opts, t in others)], key=lambda e: e[:3])
    for _, key, _, opts, t, mine in events:
        cache.stream(key)
        cache.use_options(opts)
        if mine:
            yield t
        else:
            simulate(cache, t.request, t.at)
    cache.use_options(own)


def _replay(turns: Sequence[StoredTurn], cache: CacheModel, price: Callable[[str], Prices | None], *,
            shared: Sequence[SharedStream] = (), own_key: str = "") -> pd.DataFrame:
    cache.reset()
    cache.forget_streams()
    rows: list[tuple[Any, ...]] = []  # RESIM_COLUMNS
    for t in (_interleaved(turns, cache, own_key, shared) if shared else turns):
        result = simulate(cache, t.request, t.at)
        if result is None:  # a model this cache model cannot simulate: no figures, never a crash
            rows.append((t.idx, t.at, t.model, cache.name, t.request.total_tokens, None, None, None, None, None,
                         t.output_tokens, "unsupported", None, None, None, {"model": t.model}))
            continue
        u = result.usage
        usage = Usage(u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens,
                      u.cache_creation_5m_input_tokens, u.cache_creation_1h_input_tokens, t.output_tokens,
                      "simulated", result.native or u.raw)
        p = price(t.model)
        rows.append((
            t.idx, t.at, t.model, cache.name, t.request.total_tokens, usage.input_tokens,
            usage.cache_read_input_tokens, usage.cache_creation_input_tokens,
            usage.cache_creation_5m_input_tokens, usage.cache_creation_1h_input_tokens, usage.output_tokens,
            result.reason, None if p is None else p.cost(usage, t.at),
            None if p is None else p.cost_without_cache(usage, t.at), usage.raw, result.detail,
        ))
    df = pd.DataFrame(rows, columns=RESIM_COLUMNS)
    return df


def _cache_for(name: str | CacheModel, session_row: dict[str, Any], params: dict[str, Any]) -> CacheModel:
    if isinstance(name, CacheModel):
        if params:
            raise TypeError("pass cache parameters to the cache model's constructor, not with an instance")
        return name
    if not params and name == session_row["cache_model"]:
        params = dict(SessionConfig.from_stored(session_row["config"]).cache_params)  # the session's own settings
    return get_cache_model(name, **params)


def resimulate(
    lab: LabLike | StoredSession,
    session_id: str | None = None,
    cache: str | CacheModel = "openai",
    *,
    price_model: str | None = None,
    prices: Prices | None = None,
    **cache_params: Any,
) -> pd.DataFrame:
    """Per-turn usage and cost of a stored session had it run against another provider's cache.

    The stored bodies are replayed at their stored times through a fresh ``cache`` model; the session's
    strategy is not re-run. Figures are simulated over estimated token counts (``usage_source`` of the
    stored turns does not carry over). Under the session's own cache model with no ``cache_params`` the
    session's own settings are used, so a simulated session reproduces its stored usage.

    Args:
        lab: the :class:`~promptcache_nb.Lab` (or a Session, with ``session_id`` omitted).
        session_id: the stored session.
        cache: a name from ``pc.CACHE_MODELS`` or a :class:`~promptcache_nb.CacheModel` instance.
        price_model: price the tokens as this model (genai-prices). Defaults: ``openai`` → ``gpt-5``,
            ``deepseek`` → ``deepseek-chat``, ``anthropic`` → each turn's own model; ``vllm`` is
            self-hosted and priced at explicit zeros (``SELF_HOSTED``).
        prices: explicit :class:`~promptcache_nb.Prices` (wins over ``price_model``).
        **cache_params: the cache model's parameters (``idle_ttl="10m"``, ``num_blocks=4096``...).

    Returns:
        One row per turn: ``idx, sent_at, model, cache, total_tokens`` and the usage columns of
        ``Session.turns()``, ``cache_reason``, ``cost_usd``, ``cost_no_cache_usd``, ``native`` (the
        provider's usage object) and ``cache_detail``. ``df.attrs["prices"]`` names the price source.

    Example:
        >>> df = pc.resimulate(lab, s.id, cache="deepseek")          # doctest: +SKIP
        >>> df.cache_read_input_tokens.sum() / df.total_tokens.sum()  # doctest: +SKIP
    """
    lab, sid = _resolve(lab, session_id)
    row = stored_session_row(lab, sid)
    turns = load_turns(lab, sid)
    return _resimulate_turns(turns, row, cache, price_model=price_model, prices=prices, params=cache_params)


def _resimulate_turns(turns: Sequence[StoredTurn], row: dict[str, Any], cache: str | CacheModel, *,
                      price_model: str | None, prices: Prices | None, params: dict[str, Any],
                      shared: Sequence[SharedStream] = ()) -> pd.DataFrame:
    if row is None:
        raise SessionError("no such session")
    model = _cache_for(cache, row, params)
    # Another provider's cache is a what-if the user asked for (its stand-in prices other providers' models); the
    # session's own cache replays its measured traffic, priced as it was stored: by each request's own model.
    measured = model.name == row["cache_model"] and any(t.stored.get("usage_source") != "simulated" for t in turns)
    price = _price_resolver(model.name, row, price_model=price_model, prices=prices, measured=measured)
    df = _replay(turns, model, price, shared=shared, own_key=row["id"])
    sources = sorted({p.source for m in set(df.model) if (p := price(m)) is not None}) if len(df) else []
    df.attrs["prices"] = ", ".join(sources)
    df.attrs["cache"] = model.name
    return df


def summarize_usage(df: pd.DataFrame) -> dict[str, Any]:
    """Totals of a :func:`resimulate` frame (:func:`~promptcache_nb.analysis.frames.usage_totals`), with the
    old ``read_pct`` name beside ``cache_read_pct``."""
    totals = usage_totals(df)
    return {**totals, **{old: totals[new] for old, new in SUMMARY_ALIASES.items()}}


def compare_caches(
    session: StoredSession | LabLike,
    caches: Iterable[str | CacheModel] = ("anthropic", "openai", "deepseek", "vllm"),
    *,
    session_id: str | None = None,
    params: dict[str, dict[str, Any]] | None = None,
    price_models: dict[str, str] | None = None,
) -> pd.DataFrame:
    """One stored session re-simulated under several providers' caches, side by side.

    Args:
        session: a Session (or a Lab, with ``session_id``).
        caches: cache model names (or instances), one row each, in this order.
        params: per-cache parameters, e.g. ``{"vllm": {"num_blocks": 2048}}``.
        price_models: per-cache price model overrides, e.g. ``{"openai": "gpt-4.1"}``.

    Returns:
        One row per cache: ``cache, prices, requests, total_input, cache_read, cache_write, uncached,
        cache_read_pct, cost_usd, cost_no_cache_usd, saved_usd`` (tokens estimated; costs in USD) — the
        columns of :func:`~promptcache_nb.compare_df` — and ``read_pct``, the old name of ``cache_read_pct``.

    Example:
        >>> pc.compare_caches(s)  # doctest: +SKIP
    """
    lab, sid = _resolve(session, session_id)
    row = stored_session_row(lab, sid)
    turns = load_turns(lab, sid)  # read and built once, replayed under every model
    params, price_models = params or {}, price_models or {}
    out = []
    for cache in caches:
        name = cache.name if isinstance(cache, CacheModel) else cache
        df = _resimulate_turns(turns, row, cache, price_model=price_models.get(name), prices=None,
                               params=dict(params.get(name, {})))
        out.append({"cache": name, "prices": df.attrs["prices"], **summarize_usage(df)})
    return pd.DataFrame(out, columns=COMPARE_COLUMNS)


def default_prices(cache_name: str, model: str) -> Prices:
    """The price a *simulated* request of ``model`` pays under ``cache_name``: its own model's (exactly
    resolved), or the provider's stand-in (``PRICE_MODELS``) when the model belongs to another provider (a Claude
    session simulated under OpenAI's cache is priced as ``gpt-5``, a what-if the user asked for by naming the
    cache); explicit zeros for self-hosted vLLM. Measured traffic is never priced here: :func:`request_prices`.

    Raises:
        PriceError: no exact price for the model (never another model's price, never a silent zero).
    """
    if cache_name == "vllm":
        return SELF_HOSTED
    stand_in = PRICE_MODELS.get(cache_name)
    if stand_in is not None:
        provider = price_provider(model)
        if provider is not None and provider != _PRICE_PROVIDERS.get(cache_name, cache_name):
            return prices_for(stand_in)
    return prices_for(model)


def request_prices(cache_name: str, model: str, *, measured: bool = False) -> Prices | None:
    """The prices of one request, or None when there is no exact price (its cost is then NULL, or the cost its
    provider reported: ``pipeline.request_cost``).

    A *measured* request (live or imported usage) is priced by its own model only — exactly resolved, an
    OpenRouter-style ``vendor/model`` id included (:func:`~promptcache_nb.analysis.prices.price_model_id`) —
    whatever the cache model: a log's ``mistral-large-latest`` is never priced as another provider's stand-in. A
    simulated one as :func:`default_prices`.
    """
    try:
        if measured:
            return SELF_HOSTED if cache_name == "vllm" else prices_for(model)
        return default_prices(cache_name, model)
    except PriceError:
        return None


def simulate(cache: CacheModel, request: PreparedRequest, at: datetime) -> CacheResult | None:
    """``cache.process``, or None for a request the cache model cannot simulate (a model its table lacks,
    Claude Code's ``<synthetic>`` entries...). Cache models raise those errors before changing any state."""
    try:
        return cache.process(request, at)
    except PromptCacheError:
        return None
