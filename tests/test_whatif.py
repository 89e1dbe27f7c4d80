"""TTL what-if, keep-warm pings and rebuild attribution (docs/provider_cache_rules.md#anthropic-lookback to docs/provider_cache_rules.md#anthropic-pricing) on recorded sessions whose
right answers follow from the stored totals: every body uses top-level automatic caching, so a request
writes (or reads) everything up to its last block."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb.request import prepare

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SYSTEM = "You are the support agent for a billing product. " * 180  # ~1.6k tokens: above 1,024
SONNET = pc.analysis.prices_for("claude-sonnet-4-5")


def body(n_turns: int, *, system: str = SYSTEM, model: str = "claude-sonnet-4-5", extra_blocks: int = 0):
    msgs: list[dict] = []
    for i in range(n_turns):
        if i:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i - 1}"}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"question {i}"}]})
    if extra_blocks:
        parts = [{"type": "text", "text": f"part {k}"} for k in range(extra_blocks)]
        msgs[-1] = {"role": "user", "content": parts}
    return {"model": model, "max_tokens": 256, "cache_control": {"type": "ephemeral"},
            "system": [{"type": "text", "text": system}], "messages": msgs}


def record(lab: pc.Lab, bodies: list[dict], gaps: list[float]) -> pc.Session:
    s = lab.session(project=f"p{len(lab.sessions())}")
    when = T0
    for b, gap in zip(bodies, gaps, strict=True):
        when += timedelta(seconds=gap)
        s.record(b, at=when)
    return s


@pytest.fixture
def lab():
    with pc.Lab(progress=False) as lab:
        yield lab


@pytest.fixture
def idle_session(lab):
    """Four appended turns; the third comes after 6m40s idle (past 5m, within 1h)."""
    return record(lab, [body(k) for k in range(1, 5)], [0, 30, 400, 30])


def test_ttl_whatif_5m_vs_1h(idle_session):
    s = idle_session
    totals = list(s.turns().total_tokens)
    df = pc.ttl_whatif(s)
    five, hour = df[df.ttl == "5m"].reset_index(drop=True), df[df.ttl == "1h"].reset_index(drop=True)
    assert list(five.gap_seconds[1:]) == [30, 400, 30]
    # 5m: the entry written at turn 1 has expired by turn 2, which rebuilds everything
    assert list(five.cache_read_input_tokens) == [0, totals[0], 0, totals[2]]
    assert list(five.cache_creation_5m_input_tokens) == [totals[0], totals[1] - totals[0], totals[2],
                                                         totals[3] - totals[2]]
    assert five.cache_reason[2] == "ttl_expired"
    # 1h: every write is a 1h write, and turn 2 reads what turn 1 wrote
    assert list(hour.cache_read_input_tokens) == [0, totals[0], totals[1], totals[2]]
    growth = [b - a for a, b in zip(totals, totals[1:], strict=False)]
    assert list(hour.cache_creation_1h_input_tokens) == [totals[0], *growth]
    assert (hour.cache_creation_5m_input_tokens == 0).all()
    # costs from the prices: 1h writes 2x base, 5m writes 1.25x, reads 0.1x
    assert five.cost_usd[2] == pytest.approx(totals[2] * SONNET.cache_write_5m / 1e6)
    assert hour.cost_usd[2] == pytest.approx((totals[1] * SONNET.cache_read
                                             + (totals[2] - totals[1]) * SONNET.cache_write_1h) / 1e6)
    # the stored session itself is the 5m case
    assert list(five.cost_usd) == pytest.approx(list(s.turns().cost_usd))


def test_ttl_rewrite_touches_only_cache_control(idle_session):
    s = idle_session
    for t in pc.analysis.load_turns(s, ttl="1h"):
        assert t.request.body["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
        stored = s._lab.store.turn_body(s.id, t.idx)
        assert {**t.request.body, "cache_control": stored["cache_control"]} == stored
        assert prepare(t.request.body).segments == t.request.segments
    # explicit markers too: a 5m system breakpoint becomes a 1h one, and the 1h run reads across the gap
    explicit = body(1)
    explicit["system"][0]["cache_control"] = {"type": "ephemeral"}
    del explicit["cache_control"]
    e = record(s._lab, [explicit, explicit], [0, 600])
    [first, second] = pc.analysis.load_turns(e, ttl="1h")
    assert second.request.segments[0].cache_control == {"type": "ephemeral", "ttl": "1h"}
    assert prepare(second.request.body).segments == second.request.segments
    df = pc.ttl_whatif(e)
    system_tokens = second.request.segments[0].tokens
    assert list(df.cache_read_input_tokens) == [0, 0, 0, system_tokens]
    assert list(df.cache_reason[:2]) == ["cold", "ttl_expired"]


def test_ttl_whatif_takes_lab_and_id(idle_session):
    lab = idle_session._lab
    df = pc.ttl_whatif(lab, idle_session.id, ttls=("1h",))
    assert set(df.ttl) == {"1h"} and len(df) == 4
    with pytest.raises(ValueError, match="5m"):
        pc.ttl_whatif(idle_session, ttls=("2h",))


def test_keep_warm_ping_avoids_the_rebuild(idle_session):
    s = idle_session
    totals = list(s.turns().total_tokens)
    out = pc.keep_warm(s, every="4m")
    assert out["pings"] == 1  # at +4m in the 6m40s gap; +8m is past the next request
    assert repr(out).startswith("KeepWarm(every=4m00s, pings=1, rebuilds_avoided=1 of 1, ping_cost_usd=")
    assert repr(out).endswith("turns=<4 requests>)") and out.pings == out["pings"]  # a short repr, no frame
    # the ping re-sends turn 1, reading everything turn 1 cached
    assert out["ping_cost_usd"] == pytest.approx(totals[1] * SONNET.cache_read / 1e6)
    assert (out["rebuilds_without"], out["rebuilds_with"], out["rebuilds_avoided"]) == (1, 0, 1)
    turns = out["turns"]
    assert list(turns.pings_before) == [0, 0, 1, 0]
    assert turns.read_with[2] == totals[1] and turns.read_without[2] == 0
    assert out["cost_with_usd"] == pytest.approx(turns.cost_with_usd.sum() + out["ping_cost_usd"], abs=1e-6)
    assert out["net_saving_usd"] == pytest.approx(out["cost_without_usd"] - out["cost_with_usd"], abs=1e-6)
    assert out["net_saving_usd"] > 0  # one cheap read beats re-writing ~2k tokens at 1.25x

    assert pc.keep_warm(s, every="2m")["pings"] == 3  # +2, +4, +6 minutes
    capped = pc.keep_warm(s, every="4m", max_gap="5m")
    assert (capped["pings"], capped["rebuilds_avoided"]) == (0, 0)
    assert pc.keep_warm(s, every="4m", ttl="1h")["rebuilds_without"] == 0
    with pytest.raises(ValueError, match="positive"):
        pc.keep_warm(s, every=0)


def test_rebuilds_attribute_each_cause(lab):
    small = "Be brief."
    bodies = [
        body(1),                                     # 0 cold
        body(2),                                     # 1 hit
        body(3),                                     # 2 after 400 s: TTL expiry
        body(4, system=SYSTEM + " Edited."),         # 3 host prompt edit: prefix change at system[0]
        body(5, system=SYSTEM + " Edited.", model="claude-sonnet-4"),  # 4 model switch
        body(6, system=SYSTEM + " Edited.", model="claude-sonnet-4", extra_blocks=19),  # 5 lookback
        body(1, system=small, model="claude-sonnet-4"),  # 6 a new, tiny conversation: below the minimum
        body(2, system=small, model="claude-sonnet-4"),  # 7 and its next turn
    ]
    s = record(lab, bodies, [0, 30, 400, 30, 30, 30, 30, 30])
    df = pc.rebuilds(s)
    # 6 and 7: below the minimum, nothing could be cached, so nothing was written again: no break
    assert list(df.idx) == [2, 3, 4, 5]
    assert list(df.reason) == ["ttl_expired", "prefix_changed", "model_switch", "lookback_exceeded"]
    causes = dict(zip(df.idx, df.cause, strict=True))
    assert causes[2] == "TTL expiry: the 5m entry was idle 6m40s"
    assert causes[3] == "prefix changed at system[0]"
    assert causes[4] == "model switch from claude-sonnet-4-5 to claude-sonnet-4: caches are kept per model"
    assert causes[5].startswith("breakpoint too far back: the entry at messages[8]")
    assert list(s.turns().cache_reason)[6:] == ["below_minimum", "below_minimum"]
    assert df.changed_path.tolist()[1] == "system[0]"
    totals = list(s.turns().total_tokens)
    row = df.set_index("idx").loc[2]
    assert (row.expected_read, row.read, row.lost_tokens) == (totals[1], 0, totals[1])


def test_rebuilds_explains_turns_stored_without_a_reason(idle_session):
    s = idle_session
    s._lab.store.con.execute("UPDATE turns SET cache_reason = NULL, cache_detail = NULL").fetchall()
    df = pc.rebuilds(s)
    assert list(df.idx) == [2] and df.reason[0] == "ttl_expired"


# -- partial Claude Code bodies: the client's breakpoints (AnthropicCache(assume_client_breakpoints=True)) --

@pytest.fixture(scope="module")
def claude_code():
    """The example Claude Code session (11 requests, no parent): partial bodies without any cache_control."""
    with pc.Lab(progress=False) as lab:
        result = lab.import_log(pc.data_path("logs"))
        s = next(s for s in result.sessions
                 if s.source.startswith("claude-code") and s.parent_id is None and len(s.turns()) == 11)
        yield s


def test_claude_code_bodies_stay_as_logged(claude_code):
    import json
    from pathlib import Path

    from promptcache_nb.readers._registry import READERS
    from promptcache_nb.request import canonical_bytes

    s = claude_code
    path = Path(s.source.split(":", 1)[1])
    logged = [r.body for r in READERS["claude-code"].read(path)
              if isinstance(r, pc.readers.ImportedRequest) and r.model != "<synthetic>"]
    stored = [s._lab.store.turn_body(s.id, i) for i in range(11)]
    assert [canonical_bytes(b) for b in stored] == [canonical_bytes(b) for b in logged]  # byte-identical
    assert not any("cache_control" in json.dumps(b) for b in stored)  # the breakpoints exist only in the model
    assert s.session_config.cache_params == {"client_ttls": ["1h", "5m"]}  # from the measured 5m/1h write split


def test_claude_code_session_simulates_the_clients_breakpoints(claude_code):
    s = claude_code
    df = s.turns()
    # measured causes: request 9 follows a compaction and sent only 231 tokens again (under the noise floor)
    assert list(df.cache_reason) == ["cold", "hit", "hit", "hit", "hit", "hit", "ttl_expired", "hit", "hit",
                                     "hit", "hit"]
    assert s.turn(9).cache_detail["predicted_reason"] == "prefix_changed"
    assert "No rebuild: this request read 14,210 of the 15,908 prompt tokens" in s.turn(9).observation.explanation
    assert "the rest left the prompt: compaction" in s.turn(9).observation.explanation
    detail = s.turn(6).cache_detail
    assert detail["assumed_breakpoints"] and detail["breakpoints"][0] == "(unlogged prefix)"
    assert detail["breakpoint_ttls"] == ["1h", "5m"]
    # the simulator reads what the API read after the 6m18s gap: the 1h system-prompt entry, 14,210 tokens
    assert detail["predicted_usage"]["cache_read_input_tokens"] == df.cache_read_input_tokens[6] == 14_210
    # the layout is a documented option: off, nothing is ever cached (the old behaviour)
    off = pc.resimulate(s, cache="anthropic", assume_client_breakpoints=False)
    assert set(off.cache_reason[1:]) == {"no_breakpoint"} and off.cache_read_input_tokens.sum() == 0


def test_ttl_whatif_on_claude_code(claude_code):
    df = pc.ttl_whatif(claude_code)
    five, hour = df[df.ttl == "5m"].set_index("idx"), df[df.ttl == "1h"].set_index("idx")
    # 5m everywhere: the 6m18s gap before request 6 loses the whole prefix, system prompt included
    assert (five.cache_reason[6], five.cache_read_input_tokens[6]) == ("ttl_expired", 0)
    assert five.cache_creation_input_tokens[6] == five.total_tokens[6]
    # 1h everywhere: request 6 reads everything request 5 held
    assert (hour.cache_reason[6], hour.cache_read_input_tokens[6]) == ("hit", hour.total_tokens[5])
    assert hour.cache_read_input_tokens.sum() == 150_829 and five.cache_read_input_tokens.sum() == 135_165
    assert hour.cost_usd.sum() == pytest.approx(0.1675, abs=5e-4)
    assert five.cost_usd.sum() == pytest.approx(0.1848, abs=5e-4)
    # elsewhere both read what the previous request left (a hit), except the history edit at request 9
    assert [i for i in range(1, 11) if hour.cache_reason[i] != "hit"] == [9]


def test_keep_warm_on_claude_code_avoids_the_rebuild_at_request_6(claude_code):
    kw = pc.keep_warm(claude_code, every="4m")
    turns = kw.turns.set_index("idx")
    assert (kw.pings, kw.rebuilds_without, kw.rebuilds_with, kw.rebuilds_avoided) == (2, 2, 1, 1)
    assert bool(turns.rebuild_without[6]) and not turns.rebuild_with[6] and turns.reason_with[6] == "hit"
    assert turns.pings_before[6] == 1 and turns.read_with[6] == 15_664  # everything request 5 held
    assert bool(turns.rebuild_with[9])  # a history edit no ping can prevent
    # with the client's 1h system-prompt entry, only 1.5k tokens were at stake: the pings cost more
    assert kw.ping_cost_usd == pytest.approx(0.0095, abs=2e-4)
    assert kw.net_saving_usd == pytest.approx(-0.0045, abs=2e-4)
    # with every breakpoint at 5m the whole prefix was at stake: the same pings pay for themselves
    assert pc.keep_warm(claude_code, every="4m", ttl="5m").net_saving_usd == pytest.approx(0.0446, abs=5e-4)


def test_client_breakpoint_options():
    from promptcache_nb.cache.anthropic import AnthropicCache, client_ttls_from_usage

    assert client_ttls_from_usage([pc.Usage(4, 0, 14259, 49, 14210), pc.Usage(3, 14259, 422, 422, 0)]) == ("1h", "5m")
    assert client_ttls_from_usage([pc.Usage(4, 0, 3147, 3147, 0)]) == ("5m", "5m")
    assert client_ttls_from_usage([pc.Usage(4, 0, 500, 0, 500)]) == ("1h", "1h")
    assert client_ttls_from_usage([pc.Usage(4, 0, 0, None, None)]) is None
    with pytest.raises(pc.PromptCacheError, match="client_ttls"):
        pc.get_cache_model("anthropic", client_ttls=("5m", "1h"))  # 1h must come first
    # an explicit marker anywhere: the body says what it wants, nothing is assumed
    cache = AnthropicCache()
    marked = {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi " * 900, "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]}
    req = prepare(marked, unlogged_prefix_tokens=5_000)
    assert [req.segments[i].path for i, _ in cache.breakpoints(req)] == ["messages[0].content[0]"]
    bare = prepare({**marked, "messages": [{"role": "user", "content": "hi " * 900}]}, unlogged_prefix_tokens=5_000)
    assert cache.breakpoints(bare) == [(0, "5m"), (1, "5m")]
    assert AnthropicCache(assume_client_breakpoints=False).breakpoints(bare) == []
    complete = prepare({**marked, "messages": [{"role": "user", "content": "hi " * 900}]})  # not partial
    assert cache.breakpoints(complete) == []
