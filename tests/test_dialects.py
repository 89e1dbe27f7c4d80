"""The wire formats: each dialect implements the protocol, segments round-trip, streams round-trip, detection."""

from __future__ import annotations

import json

import pytest

from promptcache_nb import dialects
from promptcache_nb.dialects import Dialect, parse_sse, usage_from_anthropic, usage_from_openai, usage_from_sse
from promptcache_nb.request import canonical_bytes, prepare, rebuild_body, validate_request
from promptcache_nb.usage import Usage

ANTHROPIC_BODY = {
    "model": "claude-sonnet-4-5", "max_tokens": 64,
    "tools": [{"name": "lookup", "description": "Find an invoice.", "input_schema": {"type": "object"}}],
    "system": [{"type": "text", "text": "You are a billing agent.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": "Why was invoice 8812 charged twice?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."},
                                          {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"id": 8812}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "two charges"}]},
    ],
}
CHAT_BODY = {
    "model": "gpt-4o", "max_completion_tokens": 64,
    "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
    "response_format": {"type": "json_object"},
    "messages": [
        {"role": "system", "content": "You are a billing agent."},
        {"role": "user", "content": "Why was invoice 8812 charged twice?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "two charges"},
    ],
}
RESPONSES_BODY = {
    "model": "gpt-4o", "max_output_tokens": 64, "instructions": "You are a billing agent.",
    "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    "text": {"format": {"type": "text"}},
    "input": [
        {"role": "user", "content": "Why was invoice 8812 charged twice?"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "two charges"},
    ],
}
SAMPLES = {"anthropic": ANTHROPIC_BODY, "openai-chat": CHAT_BODY, "openai-responses": RESPONSES_BODY}


@pytest.mark.parametrize("name", dialects.DIALECTS)
def test_each_dialect_implements_the_protocol(name: str) -> None:
    d = dialects.get(name)
    assert isinstance(d, Dialect)
    assert d.name == name
    assert d in dialects.all_dialects()
    members = [m for m in dir(Dialect) if not m.startswith("_")] + list(Dialect.__annotations__)
    assert all(hasattr(d, m) for m in members)


def test_the_registry_refuses_an_unknown_name_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match="must be one of anthropic, openai-chat, openai-responses"):
        dialects.get("gemini")


@pytest.mark.parametrize("name", dialects.DIALECTS)
def test_detect_on_samples(name: str) -> None:
    body = SAMPLES[name]
    assert dialects.detect(body) is dialects.get(name)


def test_detect_without_evidence_reads_messages() -> None:
    assert dialects.detect({"model": "m", "messages": [{"role": "user", "content": "hi"}]}) is dialects.ANTHROPIC


@pytest.mark.parametrize("name", dialects.DIALECTS)
def test_segment_then_rebuild_round_trips(name: str) -> None:
    body = SAMPLES[name]
    p = prepare(body)
    assert p.wire is dialects.get(name)
    chain = [(s.kind, s.role, s.element) for s in p.segments]
    again = rebuild_body(p.shape, p.rest, chain)
    assert again == body
    assert canonical_bytes(again) == canonical_bytes(body)
    assert prepare(again).segments == p.segments
    assert validate_request(body, name) == []


@pytest.mark.parametrize("name", dialects.DIALECTS)
def test_rebuild_refuses_an_unknown_kind(name: str) -> None:
    with pytest.raises(ValueError, match="unknown segment kind"):
        dialects.get(name).rebuild({}, {}, [("wizard", None, {})])


def _anthropic_response() -> dict:
    usage = Usage(12, 1_000, 300, 300, 0, 7).to_anthropic()
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Two charges: a retry."}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": usage}


def _chat_response() -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Two charges: a retry.",
                                                 "refusal": None}, "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1_312, "completion_tokens": 7, "total_tokens": 1_319,
                      "prompt_tokens_details": {"cached_tokens": 1_280}}}


def _responses_response() -> dict:
    item = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "Two charges: a retry.", "annotations": []}]}
    return {"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4o", "output": [item],
            "usage": {"input_tokens": 1_312, "input_tokens_details": {"cached_tokens": 1_280},
                      "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}}}


RESPONSES = {"anthropic": _anthropic_response, "openai-chat": _chat_response,
             "openai-responses": _responses_response}


@pytest.mark.parametrize("name", dialects.DIALECTS)
def test_sse_write_then_parse_round_trips(name: str) -> None:
    d = dialects.get(name)
    response = RESPONSES[name]()
    stream = b"".join(d.sse_write(response))
    summary = usage_from_sse(parse_sse(stream))  # auto-detected
    assert summary.dialect == name
    assert summary.complete
    assert summary.usage == response["usage"]
    assert summary.model == response["model"]
    assert summary.response_id == response["id"]
    assert d.sse_parse([(e.event, json.loads(e.data) if e.data != "[DONE]" else e.data)
                        for e in parse_sse(stream)]) == summary
    assert d.usage(summary.usage, source="live") == d.usage(response["usage"], source="live")
    assert d.reply(response)


def test_usage_conversion_lives_in_the_dialects() -> None:
    raw = {"input_tokens": 3, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 0, "output_tokens": 1}
    assert dialects.ANTHROPIC.usage(raw, source="imported") == usage_from_anthropic(raw, source="imported")
    chat = _chat_response()["usage"]
    assert dialects.OPENAI_CHAT.usage(chat, source="imported") == usage_from_openai(chat, api="chat")
    assert usage_from_openai(chat, api="openai-chat") == usage_from_openai(chat, api="chat")
    resp = _responses_response()["usage"]
    got = dialects.OPENAI_RESPONSES.usage(resp, source="imported")
    assert got == usage_from_openai(resp, api="responses")
    assert (got.input_tokens, got.cache_read_input_tokens, got.total_input_tokens) == (32, 1_280, 1_312)


@pytest.mark.parametrize("name", dialects.DIALECTS)
def test_error_bodies_have_the_apis_shape(name: str) -> None:
    body = json.loads(dialects.get(name).error_body(429, "slow down", "req_1"))
    if dialects.get(name).provider == "anthropic":
        assert body == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"},
                        "request_id": "req_1"}
    else:
        assert body == {"error": {"message": "slow down", "type": "requests", "param": None,
                                  "code": "rate_limit_exceeded"}}


def test_message_segments_is_the_one_anthropic_rule() -> None:
    """prepare's trusted path, its checked path and a body plan's segment count follow one rule."""
    from promptcache_nb.dialects.anthropic import message_segments, messages_width
    from promptcache_nb.request import SegmentMemo
    from promptcache_nb.request._canonical import BodyPlan

    msgs = ANTHROPIC_BODY["messages"] + [{"role": "assistant", "content": []}]
    body = {**ANTHROPIC_BODY, "messages": msgs}
    expected = [(u[0], u[1]) for i, m in enumerate(msgs) for u in message_segments(i, m["role"], m["content"])]
    for p in (prepare(body), prepare(body, trusted=True, memo=SegmentMemo())):
        assert [(s.path, s.kind) for s in p.segments if s.level == "messages"] == expected
    assert messages_width(msgs) == len(expected)
    assert BodyPlan(body).n_segments == len(prepare(body).segments)


def test_derived_data_is_declared_and_dropped_by_replace() -> None:
    import dataclasses

    p = prepare(ANTHROPIC_BODY)
    q = prepare({**ANTHROPIC_BODY, "messages": [*ANTHROPIC_BODY["messages"],
                                                {"role": "assistant", "content": "Done."}]}, previous=p)
    assert q.derived.prefix_of is not None and q.derived.prefix_of[0]() is p
    assert q.cumulative_tokens()[-1] == q.total_tokens
    assert "_cum" not in vars(q) and "_prefix_of" not in vars(q)
    r = dataclasses.replace(q)
    assert r.derived is not q.derived and r.derived.prefix_of is None
    assert r.cumulative_tokens() == q.cumulative_tokens()
