"""The Anthropic cache model's refresh along the prefix: shared expiries give the per-entry walk's results.

A read refreshes every live entry up to the one it hit. The model keeps the entries one read refreshed
on one shared expiry per TTL, so a long session's requests do not each touch hundreds of entries
(``cache.anthropic._Along``). These tests replay random request streams — growing histories, edits,
compactions, idle gaps across both TTLs, a model switch, two sessions sharing the cache — once as is and
once with every refresh forced through the entry-by-entry walk, and require identical results.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from promptcache_nb.cache import anthropic
from promptcache_nb.cache.anthropic import AnthropicCache
from promptcache_nb.request import prepare

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
GAPS = (0.2, 1, 5, 20, 60, 200, 299, 301, 400, 1000, 3599, 3601, 5000)


def _mark(msgs: list, i: int, ttl: str) -> None:
    """Replace ``msgs[i]`` by a copy whose last block carries a breakpoint."""
    content = list(msgs[i]["content"])
    content[-1] = {**content[-1], "cache_control": {"type": "ephemeral", "ttl": ttl}}
    msgs[i] = {"role": msgs[i]["role"], "content": content}


def _stream(seed: int, n: int = 60):
    """(stream key, prepared request, time) of a random conversation or two."""
    rnd = random.Random(seed)
    hist: dict[str, list] = {"a": [], "b": []}
    system = [{"type": "text", "text": "sys " * 1200, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    t = T0
    previous: dict[str, object] = {}
    for k in range(n):
        key = rnd.choice("aaab") if seed % 3 == 0 else "a"
        h = hist[key]
        op = rnd.random()
        if op < 0.05 and h:  # an edit in the middle (a compaction)
            h[:] = h[:rnd.randrange(len(h))] + [{"role": "user", "content": [{"type": "text", "text": f"edit {k}"}]}]
        elif op < 0.08:
            h[:] = []
        for _ in range(rnd.choice((1, 1, 2, 3))):
            role = "user" if not h or h[-1]["role"] == "assistant" else "assistant"
            h.append({"role": role, "content": [{"type": "text", "text": f"{key} m{k} " * rnd.randint(1, 300)}]})
        if h[-1]["role"] != "user":
            h.append({"role": "user", "content": [{"type": "text", "text": f"u{k}"}]})
        msgs = list(h)
        tail = rnd.choice(("5m", "5m", "1h")) if rnd.random() < 0.2 else "5m"
        if len(msgs) > 2 and rnd.random() < 0.7:
            _mark(msgs, len(msgs) - 3, tail)  # the previous request's tail, as the Lore strategies mark it
        _mark(msgs, len(msgs) - 1, tail)
        model = "claude-opus-4-1" if rnd.random() < 0.05 else "claude-sonnet-4-5"
        t = t + timedelta(seconds=rnd.choice(GAPS))
        req = prepare({"model": model, "max_tokens": 10, "system": system, "messages": msgs},
                      previous=previous.get(key))  # only the new tail is hashed
        previous[key] = req
        yield key, req, t


def _results(seed: int) -> list:
    rnd = random.Random(seed)
    cache = AnthropicCache(ttft_seconds=rnd.choice((0.0, 0.5, 3.0)), lookback=rnd.choice((3, 5, 20)))
    out = []
    for key, req, t in _stream(seed):
        cache.stream(key)
        out.append(cache.process(req, t))
    return out


SEEDS = range(24)


@pytest.mark.parametrize("seed", SEEDS)
def test_shared_expiries_give_the_per_entry_walk(seed, monkeypatch):
    fast = _results(seed)
    walks = []
    real_walk = anthropic._Along._refresh_each

    def walk(self, hit, t):
        walks.append(hit)
        real_walk(self, hit, t)

    monkeypatch.setattr(anthropic._Along, "refresh", walk)  # every refresh walks entry by entry
    assert _results(seed) == fast
    assert walks  # the comparison did go through refreshes


def test_the_streams_cover_hits_expiries_and_walks(monkeypatch):
    """The random streams reach the cases that matter (else the comparison above proves little)."""
    walks = []
    real_walk = anthropic._Along._refresh_each

    def counted(self, hit, t):
        walks.append(hit)
        real_walk(self, hit, t)

    monkeypatch.setattr(anthropic._Along, "_refresh_each", counted)
    reasons = {r.reason for seed in SEEDS for r in _results(seed)}
    assert {"hit", "ttl_expired", "prefix_changed", "model_switch", "lookback_exceeded"} <= reasons
    assert walks  # a hit short of the entries refreshed before happens, and takes the walk


def test_a_long_append_only_session_never_walks(monkeypatch):
    """The usual turn (read what the previous one wrote, write a new tail) refreshes in O(1)."""
    walks = []
    monkeypatch.setattr(anthropic._Along, "_refresh_each", lambda self, hit, t: walks.append(hit))
    cache = AnthropicCache()
    system = [{"type": "text", "text": "rule " * 2000, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    msgs: list = []
    req = None
    for k in range(300):
        msgs = msgs + [{"role": "user", "content": [{"type": "text", "text": f"question {k}"}]}]
        marked = [*msgs[:-1], {"role": "user", "content": [
            {"type": "text", "text": f"question {k}", "cache_control": {"type": "ephemeral"}}]}]
        req = prepare({"model": "claude-sonnet-4-5", "max_tokens": 10, "system": system, "messages": marked},
                      previous=req)
        r = cache.process(req, T0 + timedelta(seconds=20 * k))
        assert k == 0 or r.reason == "hit"
        msgs = msgs + [{"role": "assistant", "content": [{"type": "text", "text": f"answer {k}"}]}]
    assert not walks
    assert len(cache._along.entries) > 250  # hundreds of entries along the prefix, refreshed in O(1)
