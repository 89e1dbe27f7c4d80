"""The Anthropic cache model against the documented rules (docs/provider_cache_rules.md#anthropic-breakpoints and after)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb.cache.anthropic import AnthropicCache, resolve_model
from promptcache_nb.request import PreparedRequest, prepare

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
EPH = {"type": "ephemeral"}


def body(n_blocks: int, marks: dict[int, str] | None = None, *, model: str = "claude-sonnet-4-5",
         auto: bool = False, **rest) -> dict:
    """One user message with n text blocks b1..bn; marks maps 1-based block number -> ttl."""
    blocks = []
    for i in range(1, n_blocks + 1):
        b = {"type": "text", "text": f"block {i}"}
        if marks and i in marks:
            b["cache_control"] = {"type": "ephemeral", "ttl": marks[i]}
        blocks.append(b)
    out = {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": blocks}], **rest}
    if auto:
        out["cache_control"] = dict(EPH)
    return out


def with_tokens(req: PreparedRequest, per_block: int) -> PreparedRequest:
    """Give every segment a fixed token count, so expected figures are simple arithmetic."""
    segs = tuple(dataclasses.replace(s, tokens=per_block) for s in req.segments)
    return dataclasses.replace(req, segments=segs, total_tokens=per_block * len(segs))


def run(cache: AnthropicCache, b: dict, at: datetime, per_block: int = 200):
    return cache.process(with_tokens(prepare(b), per_block), at)


def test_docs_worked_lookback_example_10_15_35():
    # [A2] turn 1: 10 blocks, breakpoint on 10 -> written at 10
    cache = AnthropicCache()
    r1 = run(cache, body(10, {10: "5m"}), T0)
    assert (r1.usage.cache_read_input_tokens, r1.usage.cache_creation_input_tokens) == (0, 2000)
    # turn 2: 15 blocks, breakpoint on 15 -> lookback finds 10: read 1-10, write 11-15
    r2 = run(cache, body(15, {15: "5m"}), T0 + timedelta(seconds=10))
    assert r2.usage.cache_read_input_tokens == 2000
    assert r2.usage.cache_creation_input_tokens == 1000
    assert r2.detail["hit_path"] == "messages[0].content[9]"
    # turn 3: 35 blocks, breakpoint on 35 -> checks 35..16, finds nothing
    r3 = run(cache, body(35, {35: "5m"}), T0 + timedelta(seconds=20))
    assert r3.usage.cache_read_input_tokens == 0
    assert r3.usage.cache_creation_input_tokens == 7000
    assert r3.reason == "lookback_exceeded"


def test_worked_example_second_breakpoint_at_15_finds_turn_two_entry():
    cache = AnthropicCache()
    run(cache, body(10, {10: "5m"}), T0)
    run(cache, body(15, {15: "5m"}), T0 + timedelta(seconds=10))
    r3 = run(cache, body(35, {15: "5m", 35: "5m"}), T0 + timedelta(seconds=20))
    assert r3.usage.cache_read_input_tokens == 15 * 200
    assert r3.usage.cache_creation_input_tokens == 20 * 200


def test_lookback_counts_breakpoint_itself_as_first_of_20():
    cache = AnthropicCache()
    run(cache, body(10, {10: "5m"}), T0)
    # breakpoint at 29: positions 29..10 are 20 positions -> block 10 is reached
    assert run(cache, body(29, {29: "5m"}), T0 + timedelta(seconds=5)).usage.cache_read_input_tokens == 2000
    cache = AnthropicCache()
    run(cache, body(10, {10: "5m"}), T0)
    # breakpoint at 30: 30..11 -> block 10 is the 21st position: no hit
    assert run(cache, body(30, {30: "5m"}), T0 + timedelta(seconds=5)).usage.cache_read_input_tokens == 0


def test_usage_identity_and_split():
    cache = AnthropicCache()
    b = body(12, {6: "1h", 10: "5m"})
    r = run(cache, b, T0)
    u = r.usage
    assert u.total_input_tokens == 12 * 200
    assert u.cache_creation_1h_input_tokens == 1200  # B - A, A = 0, B = block 6
    assert u.cache_creation_5m_input_tokens == 800  # C - B, C = block 10
    assert u.input_tokens == 400  # after the last breakpoint
    assert u.cache_creation_input_tokens == u.cache_creation_5m_input_tokens + u.cache_creation_1h_input_tokens
    assert r.native["cache_creation"] == {"ephemeral_5m_input_tokens": 800, "ephemeral_1h_input_tokens": 1200}


def test_more_than_four_breakpoints_is_the_apis_400():
    with pytest.raises(pc.errors.InvalidRequestError, match="A maximum of 4 blocks with cache_control may be provided. Found 5."):
        run(AnthropicCache(), body(8, {1: "5m", 2: "5m", 3: "5m", 4: "5m", 5: "5m"}), T0)


def test_automatic_breakpoint_takes_a_slot():
    with pytest.raises(pc.errors.InvalidRequestError, match="Found 5"):
        run(AnthropicCache(), body(8, {1: "5m", 2: "5m", 3: "5m", 4: "5m"}, auto=True), T0)


def test_automatic_caching_marks_last_block_and_moves_forward():
    cache = AnthropicCache()
    r1 = run(cache, body(6, auto=True), T0)
    assert r1.detail["breakpoints"] == ["messages[0].content[5]"]
    r2 = run(cache, body(8, auto=True), T0 + timedelta(seconds=30))
    assert r2.usage.cache_read_input_tokens == 1200
    assert r2.usage.cache_creation_input_tokens == 400


def test_automatic_same_block_conflicting_ttl_is_400():
    b = body(6, {6: "1h"}, auto=True)
    with pytest.raises(pc.errors.InvalidRequestError, match="conflicts"):
        run(AnthropicCache(), b, T0)


def test_one_hour_after_five_minutes_is_400():
    with pytest.raises(pc.errors.InvalidRequestError, match="1h"):
        run(AnthropicCache(), body(8, {3: "5m", 6: "1h"}), T0)


def test_minimum_cacheable_length_per_model():
    cache = AnthropicCache()
    # 5 blocks x 200 = 1000 < 1024 (Sonnet 4.5): nothing written, nothing read, no error
    r = run(cache, body(5, {5: "5m"}), T0)
    assert (r.usage.cache_creation_input_tokens, r.usage.cache_read_input_tokens, r.usage.input_tokens) == (0, 0, 1000)
    # Haiku 4.5 needs 4096
    r = run(AnthropicCache(), body(20, {20: "5m"}, model="claude-haiku-4-5"), T0)
    assert r.usage.cache_creation_input_tokens == 0
    r = run(AnthropicCache(), body(21, {21: "5m"}, model="claude-haiku-4-5"), T0)
    assert r.usage.cache_creation_input_tokens == 4200


def test_below_minimum_reason():
    cache = AnthropicCache()
    run(cache, body(3, {3: "5m"}), T0)
    assert run(cache, body(4, {4: "5m"}), T0 + timedelta(seconds=5)).reason == "below_minimum"


def test_ttl_expiry_and_refresh_on_read():
    cache = AnthropicCache()
    run(cache, body(10, {10: "5m"}), T0)
    # read at +4m refreshes the 5m lifetime ...
    assert run(cache, body(10, {10: "5m"}), T0 + timedelta(minutes=4)).usage.cache_read_input_tokens == 2000
    # ... so +8m (4m after the refresh) still hits
    assert run(cache, body(10, {10: "5m"}), T0 + timedelta(minutes=8)).usage.cache_read_input_tokens == 2000
    # a 5m01s gap expires it
    r = run(cache, body(10, {10: "5m"}), T0 + timedelta(minutes=13, seconds=1))
    assert r.usage.cache_read_input_tokens == 0
    assert r.reason == "ttl_expired"


def test_one_hour_ttl_survives_a_long_gap():
    cache = AnthropicCache()
    run(cache, body(10, {10: "1h"}), T0)
    assert run(cache, body(10, {10: "1h"}), T0 + timedelta(minutes=50)).usage.cache_read_input_tokens == 2000
    assert run(cache, body(10, {10: "1h"}), T0 + timedelta(minutes=50 + 61)).usage.cache_read_input_tokens == 0


def test_entry_not_visible_before_response_begins():
    cache = AnthropicCache(ttft_seconds=2.0)
    run(cache, body(10, {10: "5m"}), T0)
    assert run(cache, body(10, {10: "5m"}), T0 + timedelta(seconds=1)).usage.cache_read_input_tokens == 0
    assert run(cache, body(10, {10: "5m"}), T0 + timedelta(seconds=3)).usage.cache_read_input_tokens == 2000


def test_caches_are_keyed_by_model():
    cache = AnthropicCache()
    run(cache, body(10, {10: "5m"}), T0)
    r = run(cache, body(10, {10: "5m"}, model="claude-opus-4-1"), T0 + timedelta(seconds=5))
    assert r.usage.cache_read_input_tokens == 0
    assert r.reason == "model_switch"


def _layered(**rest) -> dict:
    tools = [{"name": f"tool_{i}", "description": "d" * 10, "input_schema": {"type": "object"}} for i in range(5)]
    system = [{"type": "text", "text": "sys one"}, {"type": "text", "text": "sys two", "cache_control": dict(EPH)}]
    tools[-1]["cache_control"] = dict(EPH)
    msgs = [{"role": "user", "content": [{"type": "text", "text": f"m{i}"} for i in range(5)]}]
    msgs[0]["content"][-1]["cache_control"] = dict(EPH)
    return {"model": "claude-sonnet-4-5", "max_tokens": 10, "tools": tools, "system": system, "messages": msgs, **rest}


def test_tool_choice_invalidates_messages_level_only():
    cache = AnthropicCache()
    run(cache, _layered(), T0)
    r = run(cache, _layered(tool_choice={"type": "any"}), T0 + timedelta(seconds=5))
    # tools (5) + system (2) blocks still read at the system breakpoint; messages re-written
    assert r.usage.cache_read_input_tokens == 7 * 200
    assert r.usage.cache_creation_input_tokens == 5 * 200


def test_thinking_change_invalidates_messages_level_only():
    cache = AnthropicCache()
    run(cache, _layered(), T0)
    r = run(cache, _layered(thinking={"type": "enabled", "budget_tokens": 2048}), T0 + timedelta(seconds=5))
    assert r.usage.cache_read_input_tokens == 7 * 200


def test_tool_definition_change_invalidates_everything():
    cache = AnthropicCache()
    run(cache, _layered(), T0)
    b = _layered()
    b["tools"][0]["description"] = "changed"
    r = run(cache, b, T0 + timedelta(seconds=5))
    assert r.usage.cache_read_input_tokens == 0
    assert r.reason == "prefix_changed"
    assert r.detail["divergence_path"] == "tools[0]"


def test_moving_a_marker_is_not_a_prefix_change():
    cache = AnthropicCache()
    run(cache, body(10, {10: "5m"}), T0)
    r = run(cache, body(12, {12: "5m"}), T0 + timedelta(seconds=5))
    assert r.usage.cache_read_input_tokens == 2000  # block 10's entry, even though its marker moved


def test_no_breakpoint_caches_nothing():
    r = run(AnthropicCache(), body(10), T0)
    assert r.usage.input_tokens == 2000 and r.usage.cache_creation_input_tokens == 0


def test_model_table_and_unknown_model():
    assert resolve_model("claude-sonnet-4-5-20250929") == "claude-sonnet-4-5"
    with pytest.raises(pc.errors.UnknownModelError, match="valid: claude-3-5-haiku"):
        resolve_model("gpt-4o")


def test_segment_states_for_segment_map():
    cache = AnthropicCache()
    run(cache, body(10, {10: "5m"}), T0)
    r = run(cache, body(13, {12: "5m"}), T0 + timedelta(seconds=5))
    assert r.segment_states == ("read",) * 10 + ("write",) * 2 + ("uncached",)
