"""vLLM automatic prefix caching, V1 engine (docs/provider_cache_rules.md#vllm [V1]-[V4]).

Rules modelled (the §5 pseudo-algorithm):

* the KV cache is split into blocks of ``block_size`` tokens (default 16, ``CacheConfig.DEFAULT_BLOCK_SIZE``
  [V3]); each *full* block is keyed by ``hash((parent_block_hash, block_tokens, extra_keys))`` — a hash
  chain, so a block matches only if every block before it matches too [V1]. ``cache_salt`` (read from
  the body's ``cache_salt`` field, else the ``cache_salt=`` parameter) and the model go into the first
  block, separating namespaces [V1];
* only full blocks are cached; the lookup takes the longest run of cached blocks from block 0, capped at
  ``num_tokens - 1`` ("we must recompute the last token to obtain logits" [V2]), so a full repeat
  recomputes its whole last block;
* every block of a finished request stays cached while it sits in the free queue; blocks are freed in
  *reverse* order, so a request's last blocks are evicted first; allocation pops the least recently
  used free block and evicts its hash; a hit "touches" a block, taking it out of the free queue [V1].
  Capacity is ``num_blocks`` GPU KV blocks (default 32,768 ≈ 0.5 M tokens, roughly an 80 GB GPU serving
  an 8B model); there is no TTL;
* usage: ``prompt_tokens_details.cached_tokens`` (with ``--enable-prompt-tokens-details`` [V4]); there is
  no price. In :class:`~promptcache_nb.Usage`: read = cached, write = 0, uncached = prompt − cached.

Requests run one at a time (a replay), so a request's blocks are all free again before the next
starts. A prompt needing more blocks than the pool holds cannot be scheduled: reason ``unsupported``.
Approximation: when the n − 1 cap makes a full repeat recompute a block that is still cached, vLLM holds
two copies under one hash; we count the copy as a free, hash-less block.

Block identity in this simulator: block ``k`` covers tokens ``[16k, 16k + 16)``; it is identified by the
chain of segments through the segment holding its last token, plus ``k`` (see
:mod:`promptcache_nb.cache._prefix`: 0 tokens are shared inside a segment that differs). Tool/system
rendering differences between Anthropic and the served model's chat template are ignored (same segments,
same estimated counts). The cache is kept as a trie of segment nodes, each holding a count of its cached
blocks, with a heap of leaves by last use, so a request costs O(new segments + evicted nodes).
"""

from __future__ import annotations

import heapq
import sys
from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from pydantic import Field

from ..request import PreparedRequest
from ._base import CacheModel, CacheResult
from ._prefix import ChainInterner, common_prefix_len, divergence, miss_reason, read_only_result, segment_path
from ._reasons import first_request_reason

BLOCK_SIZE = 16
NUM_BLOCKS = 32_768


@dataclass(eq=False)
class _Node:
    """One segment of a cached chain: its blocks are ``[lo, hi)``; ``count`` of them (a prefix) are cached."""

    parent: int | None
    lo: int
    hi: int
    count: int
    children: int = 0
    stamp: int = -1  # the last request that ended here, or in a since-evicted descendant
    heap_seq: int = -1


class VLLMCache(CacheModel):
    """Simulated vLLM prefix cache (one server, one KV pool).

    Example:
        >>> import promptcache_nb as pc
        >>> cache = pc.get_cache_model("vllm", num_blocks=4096)
    """

    name: ClassVar[str] = "vllm"

    class Options(CacheModel.Options):
        block_size: int = Field(BLOCK_SIZE, ge=1, description="tokens per KV block (16)")
        num_blocks: int | None = Field(NUM_BLOCKS, ge=1, description="KV blocks in the pool; None for an "
                                       "unbounded pool (no eviction)")
        cache_salt: str | None = Field(None, description="namespace salt when the body has no cache_salt field")

    options: Options

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.reset()

    def min_cacheable_tokens(self, model: str) -> int:
        return self.options.block_size + 1  # only full blocks, and a hit leaves at least one token to compute

    def reset(self) -> None:
        self._chains = ChainInterner()
        self._nodes: dict[int, _Node] = {}
        self._ever: set[int] = set()  # nodes that were once fully cached (to tell eviction apart)
        self._heap: list[tuple[int, int, int, int | None]] = []  # (stamp, 0 empty | 1 leaf, seq, node)
        self._empty: dict[int, int] = {}  # heap seq -> hash-less free blocks in that run
        self._seq = 0
        self._tick = 0
        self._push(-1, 0, None, self.options.num_blocks if self.options.num_blocks is not None else sys.maxsize)
        self._last_root: int | None = None
        self._last_chain: list[int] = []  # the previous scheduled request: all its full blocks cached
        self._prev: dict[str, Any] | None = None

    #: No TTL (state_horizon_seconds is None): an unused block stays until allocations evict it, so the
    #: pool after a request depends on every request before it; a resumed session replays all of them.
    stream_state: ClassVar[tuple[str, ...]] = ("_prev",)

    def validate_model(self, model: str) -> str:
        return model

    def default_ttl_seconds(self, request: PreparedRequest) -> float:
        return float("inf")  # LRU eviction only, no TTL [V1]

    def pool_stats(self) -> dict[str, int]:
        """Cached (hashed) blocks, hash-less free blocks and trie nodes; cached + free = ``num_blocks``."""
        return {"cached_blocks": sum(nd.count for nd in self._nodes.values()),
                "empty_blocks": sum(self._empty.values()), "nodes": len(self._nodes)}

    # -- the pool -----------------------------------------------------------------------------
    def _push(self, stamp: int, prio: int, node: int | None, empty: int = 0) -> int:
        self._seq += 1
        heapq.heappush(self._heap, (stamp, prio, self._seq, node))
        if node is None:
            self._empty[self._seq] = empty
        return self._seq

    def _push_leaf(self, nid: int, nd: _Node) -> None:
        nd.heap_seq = self._push(nd.stamp, 1, nid)

    def _remove(self, nid: int, nd: _Node, pinned: int | None) -> None:
        """Drop an emptied leaf; its parent inherits its last use and may become a leaf itself."""
        nodes = self._nodes
        while True:
            del nodes[nid]
            pid = nd.parent
            if pid is None:
                return
            parent = nodes[pid]
            parent.children -= 1
            parent.stamp = max(parent.stamp, nd.stamp)
            if parent.children:
                return
            if parent.count == 0 and pid != pinned:  # a block-less connector segment: nothing to keep
                nid, nd = pid, parent
                continue
            self._push_leaf(pid, parent)
            return

    def _allocate(self, need: int, pinned: int | None) -> int:
        """Take ``need`` free blocks, least recently used first; returns how many cached blocks it evicted."""
        heap, nodes, evicted, aside = self._heap, self._nodes, 0, []
        while need > 0 and heap:
            entry = heapq.heappop(heap)
            stamp, prio, seq, nid = entry
            if nid is None:
                free = self._empty.pop(seq)
                take = min(free, need)
                need -= take
                if free > take:
                    self._push(stamp, 0, None, free - take)
                continue
            nd = nodes.get(nid)
            if nd is None or nd.heap_seq != seq or nd.children:
                continue  # stale entry
            if nid == pinned:  # in use by this request (ref_cnt > 0): not in the free queue
                aside.append(entry)
                continue
            take = min(nd.count, need)
            nd.count -= take
            need -= take
            evicted += take
            if nd.count:
                self._push_leaf(nid, nd)
            else:
                self._remove(nid, nd, pinned)
        for entry in aside:
            heapq.heappush(heap, entry)
        return evicted

    # -- the model ----------------------------------------------------------------------------
    def process(self, request: PreparedRequest, at: datetime) -> CacheResult:
        model = request.model
        salt = request.rest.get("cache_salt", self.options.cache_salt)
        root, chain, cum, n = self._chains.prompt(request, "vllm", model, salt)
        size = self.options.block_size
        full, blocks = n // size, -(-n // size)
        cap = (n - 1) // size if n else 0  # hits stop at num_tokens - 1 [V2]
        nodes = self._nodes

        # Longest run of cached blocks. The previous request's blocks are all still cached (nothing ran
        # since it finished), so its shared run needs no checking.
        i = common_prefix_len(chain, self._last_chain) if root == self._last_root else 0
        walked = full
        pinned = chain[i - 1] if i else None
        while i < len(chain):
            nd = nodes.get(chain[i])
            if nd is None:
                walked = cum[i - 1] // size if i else 0
                break
            pinned = chain[i]
            if nd.count < nd.hi - nd.lo:
                walked = nd.lo + nd.count
                break
            i += 1
        hit_blocks = min(walked, cap)
        cached = hit_blocks * size
        # what was once cached along this chain: more than we read means blocks were evicted
        j = i
        while j < len(chain) and chain[j] in self._ever:
            j += 1
        once = min(full if j == len(chain) else (cum[j - 1] // size if j else 0), cap) * size
        need = blocks - hit_blocks
        capacity = self.options.num_blocks if self.options.num_blocks is not None else sys.maxsize

        detail: dict[str, Any] = {"model": model, "block_size": size, "cache_salt": salt}
        if need > capacity - walked:
            cached, status = 0, "unsupported"
            detail["blocks_needed"] = blocks
            detail["num_blocks"] = capacity
        else:
            status = None
            self._tick += 1
            detail["evicted_blocks"] = self._allocate(need, pinned)
            self._insert(chain, cum, i)
            if blocks - hit_blocks > full - walked:  # partial last block (and a recomputed duplicate)
                self._push(self._tick, 0, None, blocks - hit_blocks - (full - walked))
            self._ever.update(chain)
            self._last_root, self._last_chain = root, chain

        detail["hit_path"] = segment_path(request, _segment_of(cum, cached)) if cached else None
        reason = status or self._reason(request, chain, cum, n, cached, cap, once, detail)
        self._prev = {"root": root, "model": model, "salt": salt, "n": n, "chain": chain}
        return read_only_result(n, cum, cached, reason, detail)

    def _insert(self, chain: list[int], cum: list[int], start: int) -> None:
        """Cache every full block of the request; it ends as the most recently used."""
        nodes, size = self._nodes, self.options.block_size
        for k in range(start, len(chain)):
            nid = chain[k]
            lo, hi = (cum[k - 1] // size if k else 0), cum[k] // size
            nd = nodes.get(nid)
            if nd is None:
                parent = chain[k - 1] if k else None
                nodes[nid] = _Node(parent, lo, hi, hi - lo)
                if parent is not None:
                    nodes[parent].children += 1
            else:
                nd.count = hi - lo
        if chain:
            tip = nodes[chain[-1]]
            tip.stamp = self._tick
            if not tip.children:
                self._push_leaf(chain[-1], tip)

    def _reason(self, request: PreparedRequest, chain: list[int], cum: list[int], n: int, cached: int, cap: int,
                once: int, detail: dict[str, Any]) -> str:
        prev = self._prev
        if prev is None:  # a read on a session's first request came from a session sharing the cache
            return first_request_reason(cached, detail)
        if prev["model"] != request.model:
            detail["previous_model"] = prev["model"]
            return "model_switch"
        if prev["salt"] != detail["cache_salt"]:
            detail["previous_cache_salt"] = prev["salt"]
            return "not_written"  # another namespace: the salt is hashed into the first block [V1]
        shared = divergence(request, chain, prev["chain"], detail)
        if cap == 0:
            return "below_minimum"  # no full block before the last token
        size = self.options.block_size
        possible = min(prev["n"] // size, cap) * size
        if once > cached:
            detail["evicted_tokens"] = once - cached
            return "evicted"
        if cached >= possible > 0:
            return "hit"
        if possible == 0:
            detail["previous_tokens"] = prev["n"]
            return "not_written"
        return miss_reason(prev, shared, cum, n)


def _segment_of(cum: list[int], tokens: int) -> int:
    """Index of the segment holding token ``tokens - 1``."""
    return bisect_left(cum, tokens)


VLLMOptions = VLLMCache.Options  # its former name
