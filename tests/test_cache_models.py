"""OpenAI, DeepSeek and vLLM cache models against their documented rules (docs/provider_cache_rules.md#openai-automatic-caching,
#deepseek, #vllm), and re-simulating stored sessions under them.

Requests are hand-built: one user message of text blocks, each given a fixed token count, so a request is
a list of (label, tokens) and every expected figure is arithmetic from the rule being tested.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.resimulate import SELF_HOSTED, load_turns
from promptcache_nb.cache import REASONS
from promptcache_nb.request import PreparedRequest, prepare

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def req(*parts: tuple[str, int], model: str = "claude-sonnet-4-5", **rest) -> PreparedRequest:
    """A request whose segments are ``parts``: (text label, estimated tokens)."""
    body = {"model": model, "max_tokens": 64, **rest,
            "messages": [{"role": "user", "content": [{"type": "text", "text": lab} for lab, _ in parts]}]}
    r = prepare(body)
    segs = tuple(dataclasses.replace(s, tokens=n) for s, (_, n) in zip(r.segments, parts, strict=True))
    return dataclasses.replace(r, segments=segs, total_tokens=sum(n for _, n in parts))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def read(result: pc.cache.CacheResult) -> int:
    return result.usage.cache_read_input_tokens


# -- registry and shared contract ---------------------------------------------------------------
def test_registered_and_listed():
    assert {"anthropic", "openai", "deepseek", "vllm"} <= set(pc.CACHE_MODELS)
    assert isinstance(pc.get_cache_model("openai"), pc.OpenAICache)
    assert isinstance(pc.get_cache_model("deepseek"), pc.DeepSeekCache)
    assert isinstance(pc.get_cache_model("vllm"), pc.cache.VLLMCache)


@pytest.mark.parametrize("name", ["openai", "deepseek", "vllm"])
def test_usage_arithmetic_and_native_payload(name):
    cache = pc.get_cache_model(name)
    assert cache.validate_model("claude-sonnet-4-5") == "claude-sonnet-4-5"  # permissive
    results = [cache.process(req(("sys", 2000), ("a", 300)), at(0)),
               cache.process(req(("sys", 2000), ("a", 300), ("b", 200)), at(10))]
    for r in results:
        u = r.usage
        assert r.reason in REASONS
        assert u.cache_creation_input_tokens == 0  # no write fee
        assert u.total_input_tokens == (2300 if r is results[0] else 2500)
        assert u.raw == r.native
        cached = r.native.get("prompt_tokens_details", {}).get("cached_tokens")
        assert cached == u.cache_read_input_tokens
        assert r.native["prompt_tokens"] == u.total_input_tokens
        assert len(r.segment_states) == len(results[0].segment_states) + (r is results[1])
    assert results[0].reason == "cold" and results[1].reason == "hit"
    assert read(results[1]) > 0


# -- OpenAI (§2.1) --------------------------------------------------------------------------------
def test_openai_docs_example_2006_prompt_1920_cached():
    # [O2]: hits in 128-token increments from 1024; 2,006 prompt tokens -> 1,920 cached
    cache = pc.OpenAICache()
    cache.process(req(("sys", 1000), ("q", 1006)), at(0))
    r = cache.process(req(("sys", 1000), ("q", 1006)), at(30))
    assert r.native == {"prompt_tokens": 2006, "prompt_tokens_details": {"cached_tokens": 1920}}
    assert (r.usage.input_tokens, r.usage.cache_read_input_tokens) == (86, 1920)


def test_openai_increments_and_minimum():
    cache = pc.OpenAICache()
    assert [cache.cached_for(n) for n in (1023, 1024, 1151, 1152, 1500)] == [0, 1024, 1024, 1152, 1408]
    # a prompt under 1,024 tokens is not cached at all, so a longer follow-up reads nothing
    r1 = cache.process(req(("sys", 1000)), at(0))
    r2 = cache.process(req(("sys", 1000), ("a", 500)), at(10))
    assert (read(r1), r1.reason) == (0, "cold")
    assert (read(r2), r2.reason) == (0, "not_written")
    # now 1,500 tokens are cached; the next request shares them: 1024 + floor(476/128)*128 = 1408
    r3 = cache.process(req(("sys", 1000), ("a", 500), ("b", 300)), at(20))
    assert (read(r3), r3.reason) == (1408, "hit")
    r4 = cache.process(req(("s2", 800)), at(30))
    assert r4.reason == "below_minimum"


def test_openai_in_memory_idle_ttl():
    p = req(("sys", 3000))
    cache = pc.OpenAICache()  # 5-minute idle TTL
    cache.process(p, at(0))
    assert read(cache.process(p, at(299))) == 2944  # 1024 + 15*128: refreshed at 299 s
    r = cache.process(p, at(299 + 300))  # idle for exactly the TTL: gone
    assert (read(r), r.reason, r.detail["expired"]) == (0, "ttl_expired", "idle")
    longer = pc.OpenAICache(idle_ttl="10m")
    longer.process(p, at(0))
    assert read(longer.process(p, at(599))) == 2944


def test_openai_in_memory_hard_cap_one_hour_and_24h_retention():
    p = req(("sys", 3000))
    cache = pc.OpenAICache()
    reads = [read(cache.process(p, at(240 * k))) for k in range(15)]  # every 4 min: 0..56 min
    assert reads == [0] + [2944] * 14
    r = cache.process(p, at(3600))  # used every 4 minutes, but computed an hour ago: recomputed
    assert (read(r), r.reason, r.detail["expired"]) == (0, "ttl_expired", "max_age")
    assert read(cache.process(p, at(3840))) == 2944  # the recomputed prefix serves again

    day = pc.OpenAICache(retention="24h")
    day.process(p, at(0))
    assert read(day.process(p, at(7200))) == 2944  # 2 h idle
    assert read(day.process(p, at(7200 + 86_400))) == 0
    with pytest.raises(ValueError, match="max_age"):
        pc.OpenAICache(idle_ttl="2h")


def test_openai_open_retention_between_idle_ttl_and_an_hour():
    """OpenAI documents in-memory retention as a range ("5 to 10 minutes of inactivity, up to a maximum of one
    hour"): inside it the replay keeps its assumed expiry and says what a kept prefix would have served."""
    p = req(("sys", 3000))
    cache = pc.OpenAICache()
    cache.process(p, at(0))
    short = cache.process(p, at(200))  # under 5 minutes idle: live for sure, nothing open
    assert (read(short), "retention_open" in short.detail) == (2944, False)
    r = cache.process(p, at(200 + 1200))  # 20 minutes idle: the assumed 5 minutes expired it, an hour would not
    assert (read(r), r.reason) == (0, "ttl_expired")
    assert r.detail["retention_open"] == {"read_if_kept": 2944, "idle_seconds": 1200.0}
    gone = cache.process(p, at(1400 + 3600))  # an hour idle: gone under every reading of the rule
    assert (read(gone), "retention_open" in gone.detail) == (0, False)
    # the open outcome is that one request's: the next request reads the recomputed prefix either way
    assert read(cache.process(req(("sys", 3000), ("more", 500)), at(5000 + 10))) == 2944
    # "a maximum of one hour" read as of age: a prefix in use for an hour is open, not gone for sure
    used = pc.OpenAICache()
    for k in range(15):
        used.process(p, at(240 * k))
    capped = used.process(p, at(3600))
    assert capped.detail["expired"] == "max_age" and capped.detail["retention_open"]["read_if_kept"] == 2944
    # a range collapsed to a point, and the 24h retention, leave nothing open
    point = pc.OpenAICache(idle_ttl_max="5m", max_age="1h")
    point.process(p, at(0))
    assert "retention_open" not in point.process(p, at(1200)).detail
    day = pc.OpenAICache(retention="24h")
    day.process(p, at(0))
    assert read(day.process(p, at(7200))) == 2944
    with pytest.raises(ValueError, match="idle_ttl_max"):
        pc.OpenAICache(idle_ttl="10m", idle_ttl_max="5m")


def test_openai_open_retention_survives_a_resumed_session(tmp_path):
    """A session closed and reopened before a 20-minute pause stores the uninterrupted session's request after it:
    the same read, reason and open outcome."""
    t0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    rules = "Answer from the refund policy. " * 400  # over 1,024 tokens: cacheable
    asks = [("Why was invoice 7 charged twice?", 0), ("And invoice 8?", 30), ("And invoice 9?", 30 + 1200)]
    last = []
    for resume in (False, True):
        db = tmp_path / f"resumed-{resume}.duckdb"
        with pc.Lab(db, progress=False) as lab:
            s = lab.session("append_only", "openai", "gpt-5", system=rules)
            sid = s.id
            for text, sec in asks[:2] if resume else asks:
                s.step(text, reply="A retried webhook.", at=t0 + timedelta(seconds=sec))
        if resume:
            with pc.Lab(db, progress=False) as lab:
                text, sec = asks[2]
                lab.session(id=sid).step(text, reply="A retried webhook.", at=t0 + timedelta(seconds=sec))
        with pc.Lab(db, progress=False) as lab:
            t = lab.session(id=sid).last_turn
            last.append((t.usage.cache_read_input_tokens, t.cache_reason, t.cache_detail.get("retention_open")))
    assert last[0] == last[1]
    assert last[0][1] == "ttl_expired" and last[0][2]["read_if_kept"] > 1024


def test_openai_prompt_cache_key_routes_to_separate_machines():
    p = req(("sys", 3000))
    cache = pc.OpenAICache()
    cache.process(dataclasses.replace(p, rest={**p.rest, "prompt_cache_key": "a"}), at(0))
    rb = cache.process(dataclasses.replace(p, rest={**p.rest, "prompt_cache_key": "b"}), at(10))
    assert (read(rb), rb.reason) == (0, "not_written")
    assert "prompt_cache_key" in rb.detail["routing"]
    ra = cache.process(dataclasses.replace(p, rest={**p.rest, "prompt_cache_key": "a"}), at(20))
    assert read(ra) == 2944
    # the key may also come from the model's parameters
    keyed = pc.OpenAICache(prompt_cache_key="a")
    keyed.process(p, at(0))
    assert read(keyed.process(dataclasses.replace(p, rest={**p.rest, "prompt_cache_key": "z"}), at(5))) == 0


def test_openai_matches_any_prompt_on_the_machine_and_first_256_tokens_route():
    cache = pc.OpenAICache()
    cache.process(req(("sys", 300), ("a", 1500)), at(0))
    rb = cache.process(req(("sys", 300), ("b", 900)), at(10))  # same first 256 tokens: same machine
    assert read(rb) == 0  # shares only 300 tokens (< 1024)
    rc = cache.process(req(("sys", 300), ("a", 1500), ("c", 100)), at(20))  # back to the first prompt
    assert read(rc) == 1792  # 1024 + floor(776/128)*128
    assert rc.detail["hit_path"] == "messages[0].content[1]"
    rd = cache.process(req(("new", 100), ("sys", 300), ("a", 1500)), at(30))
    assert (read(rd), rd.reason) == (0, "prefix_changed")
    assert rd.detail["divergence_path"] == "messages[0].content[0]"


def test_openai_model_switch():
    cache = pc.OpenAICache()
    cache.process(req(("sys", 3000)), at(0))
    r = cache.process(req(("sys", 3000), model="claude-haiku-4-5"), at(10))
    assert (read(r), r.reason, r.detail["previous_model"]) == (0, "model_switch", "claude-sonnet-4-5")


# -- DeepSeek (§4, 2024 rules) --------------------------------------------------------------------
def test_deepseek_64_token_units_from_token_zero():
    cache = pc.DeepSeekCache()
    cache.process(req(("sys", 100)), at(0))
    r = cache.process(req(("sys", 100), ("a", 50)), at(10))
    assert r.native == {"prompt_tokens": 150, "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 86,
                        "prompt_tokens_details": {"cached_tokens": 64}}
    r2 = cache.process(req(("sys", 100), ("a", 50), ("b", 900)), at(20))
    assert read(r2) == 128  # floor(150/64)*64
    # content under 64 tokens is never a hit
    small = pc.DeepSeekCache()
    small.process(req(("x", 50)), at(0))
    r3 = small.process(req(("x", 50), ("y", 100)), at(10))
    assert (read(r3), r3.reason) == (0, "not_written")


def test_deepseek_any_live_prior_prompt():
    cache = pc.DeepSeekCache()
    cache.process(req(("p", 640), ("a", 200)), at(0))
    cache.process(req(("p", 640), ("b", 300)), at(10))
    r = cache.process(req(("p", 640), ("a", 200), ("c", 40)), at(20))
    assert read(r) == 832  # LCP with the first prompt: 840 -> 13 units


def test_deepseek_construction_delay_does_not_restart_a_build():
    p = req(("p", 1000))
    cache = pc.DeepSeekCache(construction_delay=2)
    cache.process(p, at(0))
    r1 = cache.process(p, at(1))  # still being built
    assert (read(r1), r1.reason) == (0, "not_written")
    assert r1.detail["construction_pending_seconds"] == 1.0
    assert read(cache.process(p, at(2.5))) == 960  # built at 0 + 2 s, not 1 + 2 s


def test_deepseek_lifetime():
    p = req(("p", 1000))
    cache = pc.DeepSeekCache()  # 6 h
    cache.process(p, at(0))
    assert read(cache.process(p, at(5 * 3600))) == 960
    r = cache.process(p, at(5 * 3600 + 6 * 3600))
    assert (read(r), r.reason) == (0, "ttl_expired")
    long = pc.DeepSeekCache(lifetime="2d")
    long.process(p, at(0))
    assert read(long.process(p, at(30 * 3600))) == 960


# -- vLLM (§5) ------------------------------------------------------------------------------------
def test_vllm_only_full_blocks_are_cached():
    cache = pc.cache.VLLMCache()
    cache.process(req(("s", 40)), at(0))  # blocks 0, 1 full; tokens 32-39 in a partial block
    r = cache.process(req(("s", 40), ("t", 30)), at(1))
    assert r.native == {"prompt_tokens": 70, "prompt_tokens_details": {"cached_tokens": 32}}


def test_vllm_hit_capped_at_n_minus_1():
    cache = pc.cache.VLLMCache()
    cache.process(req(("s", 48)), at(0))
    assert read(cache.process(req(("s", 48)), at(1))) == 32  # full repeat recomputes the last block
    cache2 = pc.cache.VLLMCache()
    cache2.process(req(("s", 50)), at(0))
    assert read(cache2.process(req(("s", 50)), at(1))) == 48  # the last token sits in a partial block


def test_vllm_block_hash_chain():
    cache = pc.cache.VLLMCache()
    cache.process(req(("x", 32), ("y", 32)), at(0))
    assert read(cache.process(req(("x2", 32), ("y", 32)), at(1))) == 0  # same block 2, other parent
    assert read(cache.process(req(("x", 32), ("y", 32), ("z", 16)), at(2))) == 64
    # a block spanning two segments belongs to the second: changing it loses the block
    cache.process(req(("a", 24), ("b", 24)), at(3))  # block 1 = tokens 16..31 ends inside b
    assert read(cache.process(req(("a", 24), ("c", 24), ("d", 1)), at(4))) == 16


def test_vllm_lru_eviction_frees_last_blocks_first():
    cache = pc.cache.VLLMCache(num_blocks=8)
    a, b, c = req(("a", 64)), req(("b", 64)), req(("c", 32))
    cache.process(a, at(0))  # 4 blocks
    cache.process(b, at(1))  # 4 more: the pool is full
    assert cache.pool_stats() == {"cached_blocks": 8, "empty_blocks": 0, "nodes": 2}
    rc = cache.process(c, at(2))  # needs 2: the least recently used request (a) loses its LAST 2 blocks
    assert rc.detail["evicted_blocks"] == 2
    ra = cache.process(a, at(3))
    assert (read(ra), ra.reason, ra.detail["evicted_tokens"]) == (32, "evicted", 16)
    assert ra.detail["evicted_blocks"] == 2  # a re-fills its 2 blocks from b, now the LRU
    assert read(cache.process(b, at(4))) == 32
    stats = cache.pool_stats()
    assert stats["cached_blocks"] + stats["empty_blocks"] == 8


def test_vllm_touch_makes_a_prefix_recent():
    cache = pc.cache.VLLMCache(num_blocks=8)
    a, b = req(("a", 64)), req(("b", 64))
    cache.process(a, at(0))
    cache.process(b, at(1))
    cache.process(a, at(2))  # a hit touches a: b is now the least recently used
    cache.process(req(("c", 64)), at(3))  # needs 4 blocks: all of b goes
    assert read(cache.process(a, at(4))) == 48
    r = cache.process(b, at(5))
    assert (read(r), r.reason) == (0, "evicted")


def test_vllm_partial_block_and_capacity():
    cache = pc.cache.VLLMCache(num_blocks=4)
    r = cache.process(req(("big", 80)), at(0))  # 5 blocks > 4
    assert (read(r), r.reason) == (0, "unsupported")
    assert cache.pool_stats() == {"cached_blocks": 0, "empty_blocks": 4, "nodes": 0}
    cache.process(req(("a", 40)), at(1))  # 2 full blocks + 1 partial (hash-less) block
    assert cache.pool_stats() == {"cached_blocks": 2, "empty_blocks": 2, "nodes": 1}


def test_vllm_cache_salt_separates_namespaces():
    p = req(("s", 64))
    cache = pc.cache.VLLMCache()
    cache.process(p, at(0))
    r = cache.process(dataclasses.replace(p, rest={**p.rest, "cache_salt": "tenant-b"}), at(1))
    assert (read(r), r.reason) == (0, "not_written")


def test_vllm_pool_invariant_over_a_random_walk():
    import random

    rng = random.Random(7)
    cache = pc.cache.VLLMCache(num_blocks=40)
    prompts = [[("p", 100)], [("p", 100), ("x", 90)], [("q", 120)], [("p", 100), ("y", 70), ("z", 33)]]
    for k in range(200):
        parts = list(rng.choice(prompts)) + [(f"tail{rng.randrange(4)}", rng.randrange(1, 60))]
        r = cache.process(req(*parts), at(k))
        stats = cache.pool_stats()
        assert stats["cached_blocks"] + stats["empty_blocks"] == 40
        n = sum(t for _, t in parts)
        assert read(r) % 16 == 0 and read(r) <= n - 1


# -- re-simulating stored sessions -----------------------------------------------------------------
SYSTEM = "You are the support agent for a billing product. " * 180  # ~1.6k estimated tokens
TOOLS = [{"name": "lookup", "description": "Look up an invoice by id.",
          "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}}]


def _bodies():
    msgs: list[dict] = []
    out = []
    for i in range(8):
        question = {"type": "text", "text": f"question {i} about invoices"}
        msgs = msgs + [{"role": "user", "content": [question]}]
        system = SYSTEM if i != 5 else SYSTEM + " Today is Tuesday."  # one prefix change
        body = {"model": "claude-sonnet-4-5", "max_tokens": 512, "cache_control": {"type": "ephemeral"},
                "system": [{"type": "text", "text": system}], "tools": TOOLS, "messages": msgs}
        if i == 6:
            body["system"] = SYSTEM  # string system: another shape
        out.append(body)
        msgs = msgs + [{"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]}]
    return out


@pytest.fixture
def recorded():
    lab = pc.Lab(progress=False)
    s = lab.session(project="resim")
    gaps = [0, 30, 30, 400, 30, 30, 30, 30]
    when = T0
    for body, gap in zip(_bodies(), gaps, strict=True):
        when += timedelta(seconds=gap)
        s.record(body, at=when)
    yield lab, s
    lab.close()


def test_load_turns_rebuilds_every_stored_body(recorded):
    lab, s = recorded
    turns = load_turns(lab, s.id)
    assert [t.idx for t in turns] == list(range(8))
    for t in turns:
        assert t.request.body == lab.store.turn_body(s.id, t.idx)
        ref = prepare(lab.store.turn_body(s.id, t.idx))
        assert t.request.segments == ref.segments
        assert t.request.total_tokens == ref.total_tokens


def test_resimulate_under_the_sessions_own_model_reproduces_it(recorded):
    lab, s = recorded
    df = pc.resimulate(lab, s.id, cache="anthropic")
    stored = s.turns()
    cols = ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "cost_usd"]
    assert df[cols].values.tolist() == stored[cols].values.tolist()
    assert list(df.cache_reason) == list(stored.cache_reason)
    assert df.attrs["prices"] == "genai-prices anthropic/claude-sonnet-4-5"


@pytest.mark.parametrize("name", ["openai", "deepseek", "vllm"])
def test_resimulate_matches_a_plain_replay_of_the_stored_bodies(recorded, name):
    lab, s = recorded
    df = pc.resimulate(s, cache=name)
    ref = pc.get_cache_model(name)
    expected = []
    for idx, when in lab.store.rows('SELECT idx, sent_at FROM turns WHERE session_id = ? ORDER BY idx', [s.id]):
        r = ref.process(prepare(lab.store.turn_body(s.id, idx)), when.astimezone(UTC))
        expected.append((r.usage.input_tokens, r.usage.cache_read_input_tokens, r.reason, r.native))
    got = list(zip(df.input_tokens, df.cache_read_input_tokens, df.cache_reason, df.native, strict=True))
    assert got == expected
    assert (df.cache_creation_input_tokens == 0).all()


def test_resimulate_prices(recorded):
    lab, s = recorded
    gpt5 = pc.analysis.prices_for("gpt-5")
    df = pc.resimulate(lab, s.id, cache="openai")
    row = df.iloc[2]
    expected = (row.input_tokens * gpt5.input + row.cache_read_input_tokens * gpt5.cache_read) / 1e6
    assert row.cost_usd == pytest.approx(expected)
    assert df.attrs["prices"] == gpt5.source
    assert pc.resimulate(lab, s.id, cache="openai", price_model="gpt-4.1").attrs["prices"].endswith("gpt-4.1")
    assert pc.resimulate(lab, s.id, cache="deepseek").attrs["prices"].endswith("deepseek-chat")
    v = pc.resimulate(lab, s.id, cache="vllm")
    assert (v.cost_usd == 0).all() and v.attrs["prices"] == SELF_HOSTED.source
    with pytest.raises(pc.errors.PriceError, match="prices="):
        pc.resimulate(lab, s.id, cache="openai", price_model="no-such-model-xyz")
    mine = pc.analysis.Prices(1.0, 2.0, 0.5, 0.0, 0.0, source="mine")
    assert pc.resimulate(lab, s.id, cache="vllm", prices=mine).attrs["prices"] == "mine"


def test_resimulate_passes_cache_params(recorded):
    lab, s = recorded
    short = pc.resimulate(lab, s.id, cache="deepseek", lifetime="5m")
    long = pc.resimulate(lab, s.id, cache="deepseek")
    assert short.cache_reason[3] == "ttl_expired"  # 400 s gap
    assert long.cache_read_input_tokens[3] > 0


def test_compare_caches_side_by_side(recorded):
    lab, s = recorded
    df = pc.compare_caches(s)
    assert list(df.cache) == ["anthropic", "openai", "deepseek", "vllm"]
    assert (df.requests == 8).all()
    assert (df.total_input == df.cache_read + df.cache_write + df.uncached).all()
    assert df.set_index("cache").loc["vllm", "cost_usd"] == 0
    assert df.set_index("cache").loc["openai", "cache_write"] == 0
    one = pc.resimulate(lab, s.id, cache="deepseek")
    assert df.set_index("cache").loc["deepseek", "cache_read"] == one.cache_read_input_tokens.sum()
    small = pc.compare_caches(lab, ["vllm"], session_id=s.id, params={"vllm": {"num_blocks": 64}})
    assert small.cache_read[0] < df.set_index("cache").loc["vllm", "cache_read"]


def test_session_can_run_under_each_model():
    with pc.Lab(progress=False) as lab:
        for name in ("openai", "deepseek", "vllm"):
            s = lab.session(cache=name, system=SYSTEM, project=name)
            s.step("hello", reply="hi")
            t = s.step("again", reply="ok")
            assert t.usage.cache_read_input_tokens > 0
            assert t.cache_reason == "hit"
