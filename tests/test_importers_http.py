"""HTTP-recording readers: the SSE parser, exchange conversion, and the vcr / har / exchanges formats.

Fixtures are written by tests/fixtures/logs/make_http_fixtures.py (invented traffic in each format's shape).
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promptcache_nb.errors import ImportFormatError, PromptCacheError
from promptcache_nb.readers._http import HttpExchange, convert_exchange, convert_usage, endpoint_dialect
from promptcache_nb.readers._http import _Skip as Skip
from promptcache_nb.readers._registry import READERS, detect
from promptcache_nb.readers._sse import SseEvent, SseParser, parse_sse, usage_from_sse
from promptcache_nb.readers._types import ImportedRequest, ReadProgress, SkippedLine
from promptcache_nb.readers.exchanges import EXCHANGES_FORMAT_VERSION, ExchangesReader
from promptcache_nb.readers.har import HarReader
from promptcache_nb.readers.vcr import VcrReader

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
TRIAGE = LOGS / "vcr" / "test_triage_month_end_ticket.yaml"
ONCALL = LOGS / "vcr" / "test_oncall_checkout_latency.yaml"
BILLING = LOGS / "har" / "billing_widget.har"
REVIEW = LOGS / "exchanges" / "review_bot.jsonl"
GROWING = LOGS / "exchanges" / "release_notes_growing.jsonl"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def figures(req: ImportedRequest) -> tuple[int | None, ...]:
    u = req.usage
    return (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens,
            u.cache_creation_5m_input_tokens, u.cache_creation_1h_input_tokens, u.output_tokens)


def split(records: list) -> tuple[list[ImportedRequest], list[SkippedLine], list[ReadProgress]]:
    return ([r for r in records if isinstance(r, ImportedRequest)], [r for r in records if isinstance(r, SkippedLine)],
            [r for r in records if isinstance(r, ReadProgress)])


# --- SSE parser --------------------------------------------------------------------------------------------

STREAM = (": keep-alive\n"
          "event: message_start\ndata: {\"a\": 1}\n\n"
          "event: multi\ndata: first\ndata:second\ndata\n\n"
          "id: 7\nretry: 1500\ndata: with id\n\n"
          "event: last\ndata: no blank line after me")


def test_sse_fields_multiline_data_comments_and_final_event():
    events = parse_sse(STREAM)
    assert events == [
        SseEvent("message_start", '{"a": 1}'),
        SseEvent("multi", "first\nsecond\n"),  # "data:second" keeps no space; a bare "data" is an empty line
        SseEvent(None, "with id", id="7", retry=1500),
        SseEvent("last", "no blank line after me", id="7"),  # the last event id carries over (spec)
    ]
    assert events[0].json() == {"a": 1}


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_sse_line_endings_and_every_split_point_give_the_same_events(newline):
    text = STREAM.replace("\n", newline)
    whole = parse_sse(text)
    assert [e.event for e in whole] == ["message_start", "multi", None, "last"]
    data = text.encode()
    for cut in range(1, len(data)):  # every split, including inside "\r\n" and in the middle of a line
        assert parse_sse([data[:cut], data[cut:]]) == whole, cut
    assert parse_sse([bytes([b]) for b in data]) == whole


def test_sse_incremental_feed_returns_events_as_they_complete():
    p = SseParser()
    assert p.feed(b"event: ping\r\ndata: {}\r") == []
    assert p.feed(b"\n") == []  # the LF completing the CRLF of the data line, not a blank line
    assert p.feed(b"\r\n") == [SseEvent("ping", "{}")]
    assert p.feed("data: é".encode()[:-1]) == []  # a UTF-8 character split between chunks
    assert p.feed("é".encode()[-1:] + b"\n\n") == [SseEvent(None, "é")]
    assert p.close() == []


def test_sse_bom_blank_lines_without_data_and_unknown_fields():
    events = parse_sse("\ufeffevent: dropped\n\nfoo: bar\ndata: kept\n\n\n\n")
    assert events == [SseEvent(None, "kept")]  # a blank line with no data resets the event name


# --- stream summaries --------------------------------------------------------------------------------------

ANTHROPIC_STREAM = "".join(f"event: {json.loads(d)['type']}\ndata: {d}\n\n" for d in [
    '{"type":"message_start","message":{"id":"msg_01X","model":"claude-sonnet-4-5","content":[],"usage":'
    '{"input_tokens":6,"cache_creation_input_tokens":120,"cache_read_input_tokens":3000,"output_tokens":1}}}',
    '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking "}}',
    '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the logs."}}',
    '{"type":"content_block_stop","index":0}',
    '{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"grep","input":{}}}',
    '{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\\"pattern\\": \\"time"}}',
    '{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"out\\"}"}}',
    '{"type":"content_block_stop","index":1}',
    '{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":57}}',
    '{"type":"message_stop"}',
])


def test_anthropic_stream_summary_takes_final_output_tokens_and_rebuilds_blocks():
    s = usage_from_sse(parse_sse(ANTHROPIC_STREAM), "anthropic")
    assert s.dialect == "anthropic" and s.response_id == "msg_01X" and s.model == "claude-sonnet-4-5"
    assert s.usage == {"input_tokens": 6, "cache_creation_input_tokens": 120, "cache_read_input_tokens": 3000,
                       "output_tokens": 57}
    assert s.content == [{"type": "text", "text": "Checking the logs."},
                         {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"pattern": "timeout"}}]
    assert s.stop_reason == "tool_use" and s.error is None and s.events == 11
    as_dicts = [{"event": e.event, "data": json.loads(e.data)} for e in parse_sse(ANTHROPIC_STREAM)]
    assert usage_from_sse(as_dicts, "auto") == s  # the proxy's parsed form, and auto-detection


def test_anthropic_stream_error_event_is_reported():
    text = ANTHROPIC_STREAM.split("event: message_delta")[0] + (
        'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n')
    s = usage_from_sse(parse_sse(text), "anthropic")
    assert s.error == "overloaded_error: Overloaded"
    assert s.usage["output_tokens"] == 1  # only the placeholder: the caller must not trust it


def _chat_stream(with_usage: bool) -> str:
    chunks = [
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4.1-2025-04-14", "choices": [
            {"index": 0, "delta": {"role": "assistant", "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_recent_deploys",
                                                                           "arguments": ""}}]}}]},
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4.1-2025-04-14", "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"hours\":"}}]}}]},
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4.1-2025-04-14", "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 6}"}}]},
             "finish_reason": "tool_calls"}]},
    ]
    if with_usage:
        chunks.append({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4.1-2025-04-14",
                       "choices": [], "usage": {"prompt_tokens": 2200, "completion_tokens": 20,
                                                "prompt_tokens_details": {"cached_tokens": 1920}}})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_openai_chat_stream_usage_only_with_include_usage():
    s = usage_from_sse(parse_sse(_chat_stream(True)), "openai")
    assert s.dialect == "openai-chat" and s.response_id == "chatcmpl-1" and s.stop_reason == "tool_calls"
    assert s.usage == {"prompt_tokens": 2200, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 1920}}
    assert s.content == [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_recent_deploys", "arguments": '{"hours": 6}'}}]}]
    assert usage_from_sse(parse_sse(_chat_stream(False)), "openai").usage is None


def test_openai_responses_stream_usage_from_response_completed():
    usage = {"input_tokens": 1602, "input_tokens_details": {"cached_tokens": 1280}, "output_tokens": 91}
    item = {"id": "fc_1", "type": "function_call", "name": "get_payment_events", "arguments": "{}", "call_id": "c1"}
    text = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in [
        {"type": "response.created", "response": {"id": "resp_1", "model": "gpt-5-mini", "status": "in_progress",
                                                  "output": [], "usage": None}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {"id": "resp_1", "model": "gpt-5-mini-2025-08-07",
                                                    "status": "completed", "output": [item], "usage": usage}},
    ])
    s = usage_from_sse(parse_sse(text), "openai")
    assert (s.dialect, s.response_id, s.model, s.stop_reason) == (
        "openai-responses", "resp_1", "gpt-5-mini-2025-08-07", "completed")
    assert s.usage == usage and s.content == [item]


# --- usage conversion and exchanges ------------------------------------------------------------------------


def test_openai_usage_cached_tokens_are_included_in_the_prompt_figure():
    u = convert_usage({"prompt_tokens": 1630, "completion_tokens": 176,
                       "prompt_tokens_details": {"cached_tokens": 1280, "audio_tokens": 0}}, "openai-chat")
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.output_tokens) == (
        350, 1280, 0, 176)
    assert u.total_input_tokens == 1630 and u.source == "imported" and u.raw["prompt_tokens"] == 1630
    w = convert_usage({"input_tokens": 3000, "output_tokens": 9,
                       "input_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 1920}}, "openai-responses")
    assert (w.input_tokens, w.cache_read_input_tokens, w.cache_creation_input_tokens) == (56, 1024, 1920)
    deepseek = convert_usage({"prompt_tokens": 900, "completion_tokens": 5, "prompt_cache_hit_tokens": 768,
                              "prompt_cache_miss_tokens": 132}, "openai-chat")
    assert (deepseek.input_tokens, deepseek.cache_read_input_tokens) == (132, 768)
    unknown = convert_usage({"prompt_tokens": 900, "completion_tokens": 5}, "openai-chat")
    assert (unknown.input_tokens, unknown.cache_read_input_tokens, unknown.output_tokens) == (None, None, 5)


@pytest.mark.parametrize(("usage", "dialect", "reason"), [
    ({"input_tokens": 10, "output_tokens": 2}, "openai-chat", "usage.prompt_tokens: missing"),
    ({"prompt_tokens": "1536", "completion_tokens": 2}, "openai-chat", "usage.prompt_tokens: must be a non-negative int, got '1536'"),
    ({"prompt_tokens": 100, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 128}}, "openai-chat",
     "usage.prompt_tokens_details.cached_tokens (128) exceeds usage.prompt_tokens (100)"),
    ({"input_tokens": 10, "output_tokens": 2, "input_tokens_details": [1]}, "openai-responses",
     "usage.input_tokens_details: must be an object, got list"),
    ({"prompt_tokens": 31, "completion_tokens": 22}, "anthropic", "usage.input_tokens: missing"),
    ({"input_tokens": 3, "output_tokens": 1, "cache_read_input_tokens": -5}, "anthropic",
     "usage.cache_read_input_tokens: must be a non-negative int, got -5"),
    ({"input_tokens": 3, "output_tokens": 1, "cache_creation": {"ephemeral_1h_input_tokens": 1.5}}, "anthropic",
     "usage.cache_creation.ephemeral_1h_input_tokens: must be a non-negative int, got 1.5"),
    ([3, 1], "anthropic", "usage: must be an object, got list"),
])
def test_unknown_usage_shapes_name_the_field(usage, dialect, reason):
    with pytest.raises(Skip) as info:
        convert_usage(usage, dialect)
    assert info.value.args[0].startswith("unknown usage shape: ")
    assert reason in info.value.args[0]


@pytest.mark.parametrize(("method", "url", "dialect"), [
    ("POST", "https://api.anthropic.com/v1/messages", "anthropic"),
    ("POST", "http://127.0.0.1:8765/anthropic/v1/messages", "anthropic"),
    ("POST", "https://api.anthropic.com/v1/messages/count_tokens", None),
    ("POST", "https://api.anthropic.com/v1/messages/batches", None),
    ("POST", "https://api.openai.com/v1/threads/thread_1/messages", None),
    ("GET", "https://api.anthropic.com/v1/messages", None),
    ("POST", "https://api.openai.com/v1/chat/completions", "openai-chat"),
    ("POST", "https://x.openai.azure.com/openai/deployments/gpt4/chat/completions?api-version=2025-01-01", "openai-chat"),
    ("POST", "https://api.openai.com/v1/responses", "openai-responses"),
    ("GET", "https://api.openai.com/v1/responses/resp_1", None),
    ("POST", "https://api.openai.com/v1/embeddings", None),
])
def test_endpoint_dialects(method, url, dialect):
    assert endpoint_dialect(method, url) == dialect


MESSAGE = {"id": "msg_9", "type": "message", "model": "claude-haiku-4-5-20251001", "content": [],
           "usage": {"input_tokens": 12, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
                     "output_tokens": 3}}


def _convert(**kw) -> ImportedRequest | SkippedLine:
    base = {"method": "POST", "url": "https://api.anthropic.com/v1/messages", "status": 200,
            "request_body": json.dumps({"model": "claude-haiku-4-5", "messages": []}),
            "response_body": json.dumps(MESSAGE)}
    base.update(kw)
    return convert_exchange(HttpExchange(**base), file="f.yaml", line=4, source_ref="f.yaml#interactions[3]",
                            fallback_at=T0)


def test_exchange_body_encodings():
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    deflated = raw_deflate.compress(json.dumps(MESSAGE).encode()) + raw_deflate.flush()
    gz = _convert(request_body=gzip.compress(json.dumps({"model": "claude-haiku-4-5", "messages": []}).encode()),
                  request_headers={"Content-Encoding": "gzip"}, response_body=gzip.compress(json.dumps(MESSAGE).encode()))
    assert isinstance(gz, ImportedRequest) and gz.usage.input_tokens == 12  # gzip found by its magic bytes too
    d = _convert(response_body=deflated, response_headers={"content-encoding": "deflate"})
    assert isinstance(d, ImportedRequest) and d.request_id == "msg_9" and d.dedupe_key == "msg_9"
    br = _convert(response_body=b"\x8b\x02\x80", response_headers={"Content-Encoding": "br"})
    assert br == SkippedLine("f.yaml", 4, "response body encoded with br (not supported; record with decoded bodies)")
    assert _convert(response_body=b"\x1f\x8bnot gzip").reason.startswith("response body is not valid gzip")


@pytest.mark.parametrize(("kw", "reason"), [
    ({"status": 529}, "HTTP 529"),
    ({"status": None}, "no response"),
    ({"request_body": "model=claude"}, "request body is not JSON"),
    ({"response_body": "<html>bad gateway</html>"}, "response body is not JSON"),
    ({"response_body": json.dumps({"id": "msg_9", "content": []})}, "response has no usage"),
    ({"request_body": json.dumps({"messages": []}), "response_body": json.dumps(dict(MESSAGE, model=None))},
     "request has no model"),
    ({"url": "https://api.anthropic.com/v1/files", "method": "GET"}, "endpoint not analysed: /v1/files"),
])
def test_exchange_skip_reasons(kw, reason):
    assert _convert(**kw) == SkippedLine("f.yaml", 4, reason)


def test_exchange_session_keys_and_times():
    plain = _convert(response_headers={"Request-Id": "req_1", "Date": "Wed, 04 Mar 2026 16:02:11 GMT"})
    assert plain.session_key == "f.yaml|anthropic" and plain.request_id == "req_1"
    assert plain.at == datetime(2026, 3, 4, 16, 2, 11, tzinfo=UTC) and plain.source_ref == "f.yaml#interactions[3]"
    assert plain.provider == "anthropic" and plain.partial is False and plain.model == "claude-haiku-4-5"
    user = _convert(request_body=json.dumps({"model": "m", "messages": [], "metadata": {"user_id": "u-42"}}))
    assert user.session_key == "f.yaml|anthropic|u-42" and user.at == T0
    chat = {"id": "chatcmpl-9", "created": 1772460581, "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1300, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1152}}}
    oa = _convert(url="https://api.openai.com/v1/chat/completions",
                  request_body=json.dumps({"model": "gpt-4.1", "messages": [], "user": "u-7"}),
                  response_body=json.dumps(chat), response_headers={"x-request-id": "req_abc"})
    assert (oa.session_key, oa.dialect, oa.provider, oa.request_id) == ("f.yaml|openai|u-7", "openai-chat", "openai",
                                                                        "req_abc")
    assert oa.at == datetime.fromtimestamp(1772460581, tz=UTC)  # no Date header: the body's created time
    assert oa.reply == [{"role": "assistant", "content": "ok"}]


def test_streamed_exchange_without_usage_is_skipped_not_zero():
    skipped = _convert(url="/v1/chat/completions", request_body=json.dumps({"model": "gpt-4.1", "stream": True}),
                       response_body=_chat_stream(False))
    assert skipped == SkippedLine("f.yaml", 4, "streamed without usage")
    ok = _convert(url="/v1/chat/completions", request_body=json.dumps({"model": "gpt-4.1", "stream": True}),
                  response_body=_chat_stream(True))  # no content-type: stream: true and an SSE body suffice
    assert (ok.usage.input_tokens, ok.usage.cache_read_input_tokens, ok.request_id) == (280, 1920, "chatcmpl-1")
    errored = _convert(response_body=ANTHROPIC_STREAM.split("event: message_delta")[0]
                       + 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"x"}}\n\n',
                       response_headers={"content-type": "text/event-stream"})
    assert errored.reason == "stream ended with an error: overloaded_error: x"


# --- vcr ---------------------------------------------------------------------------------------------------


def test_vcr_anthropic_triage_cassette():
    reqs, skipped, progress = split(list(VcrReader().read(TRIAGE)))
    f = str(TRIAGE)
    assert progress == []
    assert skipped == [SkippedLine(f, 1, "endpoint not analysed: /v1/models"),
                       SkippedLine(f, 4, "endpoint not analysed: /v1/messages/count_tokens"),
                       SkippedLine(f, 5, "HTTP 429")]
    assert [figures(r) for r in reqs] == [(4, 0, 1874, 1874, 0, 96), (4, 1874, 206, 206, 0, 131),
                                          (4, 2080, 451, 451, 0, 247)]
    assert [r.request_id for r in reqs] == ["req_011CVaK2m7QpZr1xYd4TtN8e", "req_011CVaK2xW3nH5bJ9sE1fLqu",
                                            "req_011CVaK3GmT8cR2vPz6NwYhD"]
    assert [r.source_ref for r in reqs] == [f"{f}#interactions[1]", f"{f}#interactions[2]", f"{f}#interactions[5]"]
    assert [r.at for r in reqs] == [datetime(2026, 3, 2, 9, 14, s, tzinfo=UTC) for s in (7, 10, 16)]
    assert {(r.dialect, r.provider, r.model, r.session_key) for r in reqs} == {
        ("anthropic", "anthropic", "claude-sonnet-4-5-20250929", f"{f}|anthropic")}
    assert reqs[1].body["stream"] is True and "stream" not in reqs[0].body  # streamed (SSE) and not
    assert reqs[1].reply[1] == {"type": "tool_use", "id": "toolu_01Hs4JdW7nEcX9pLq2RbV5Ty", "name": "search_kb",
                                "input": {"query": "invoices stuck in sending status outbound email delay eu-west",
                                          "product_area": "invoicing"}}
    assert reqs[2].reply[0]["text"].startswith("Priority: P2\nQueue: billing-ops")  # the gzip body, decoded
    assert reqs[2].body["messages"][-1]["content"][0]["type"] == "tool_result"
    for prev, cur in zip(reqs, reqs[1:], strict=False):  # a growing history: each read = the previous prefix
        assert cur.usage.cache_read_input_tokens == prev.usage.cache_read_input_tokens + \
            prev.usage.cache_creation_input_tokens
    assert all(r.usage.source == "imported" and r.usage.raw for r in reqs)


def test_vcr_openai_chat_cassette():
    reqs, skipped, _ = split(list(VcrReader().read(ONCALL)))
    f = str(ONCALL)
    assert skipped == [SkippedLine(f, 3, "endpoint not analysed: /v1/files"),
                       SkippedLine(f, 5, "streamed without usage")]
    assert [(r.usage.input_tokens, r.usage.cache_read_input_tokens, r.usage.cache_creation_input_tokens,
             r.usage.output_tokens, r.usage.total_input_tokens) for r in reqs] == [
        (1244, 0, 0, 38, 1244), (239, 1152, 0, 45, 1391), (350, 1280, 0, 176, 1630)]
    assert {(r.dialect, r.provider, r.model, r.session_key) for r in reqs} == {
        ("openai-chat", "openai", "gpt-4.1", f"{f}|openai|oncall-assistant-v3")}
    assert [r.request_id for r in reqs] == ["req_7c1e4a9b2f6d4e8a9b3c5d7e1f2a4b6c",
                                            "req_0b8d2f6a4c1e4b7d8a2c6e9f3b5d7a1c",
                                            "req_9e2b4d6f8a1c4e3b5d7f9a2c4e6b8d0f"]
    assert [m["role"] for m in reqs[2].body["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert reqs[1].reply[0]["tool_calls"][0]["function"] == {
        "name": "query_metrics", "arguments": '{"service":"risk-scorer","metric":"latency_p99_ms","window_minutes":60}'}
    assert all(r.usage.cache_read_input_tokens % 128 == 0 for r in reqs)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_vcr_yaml_alias_bomb_is_refused_in_one_line(tmp_path):
    lines = ["interactions:", "- request:", "    uri: https://api.anthropic.com/v1/messages", "lol0: &l0 [lol, lol]"]
    lines += [f"lol{i}: &l{i} [*l{i - 1}, *l{i - 1}, *l{i - 1}, *l{i - 1}]" for i in range(1, 14)]
    bomb = _write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    assert detect(bomb).name == "vcr"
    with pytest.raises(ImportFormatError) as info:
        list(VcrReader().read(bomb))
    assert "alias bomb" in str(info.value) and str(bomb) in str(info.value) and "\n" not in str(info.value)
    loop = _write(tmp_path, "loop.yaml", "interactions: &a\n- request: {uri: x, self: *a}\n")
    with pytest.raises(ImportFormatError, match="alias refers to itself"):
        list(VcrReader().read(loop))
    broken = _write(tmp_path, "broken.yaml", "interactions:\n- request: {uri: x\n  method: [\n")
    with pytest.raises(ImportFormatError, match=r"not a valid YAML cassette \(.* at line \d+\)") as info:
        list(VcrReader().read(broken))
    assert isinstance(info.value, PromptCacheError) and "\n" not in str(info.value)
    unsafe = _write(tmp_path, "unsafe.yaml", "interactions:\n- request: !!python/object/apply:os.system [echo hi]\n")
    with pytest.raises(ImportFormatError, match="not a valid YAML cassette"):
        list(VcrReader().read(unsafe))


def test_vcr_size_cap(tmp_path, monkeypatch):
    import promptcache_nb.readers.vcr as vcr

    monkeypatch.setattr(vcr, "MAX_CASSETTE_BYTES", 1000)
    with pytest.raises(ImportFormatError, match="over the 0 MiB limit"):
        list(VcrReader().read(ONCALL))


def test_vcr_ruby_style_json_cassette_and_parsed_body(tmp_path):
    response = json.dumps(dict(MESSAGE, id="msg_ruby"))
    ruby = {"http_interactions": [
        {"request": {"method": "post", "uri": "https://api.anthropic.com/v1/messages",
                     "body": {"encoding": "UTF-8", "string": json.dumps({"model": "claude-haiku-4-5", "messages": []})},
                     "headers": {"Content-Type": ["application/json"]}},
         "response": {"status": {"code": 200, "message": "OK"}, "headers": {"Content-Type": ["application/json"]},
                      "body": {"encoding": "ASCII-8BIT", "base64_string": base64.b64encode(response.encode()).decode()}},
         "recorded_at": "Wed, 04 Mar 2026 10:00:00 GMT"},
        {"request": {"method": "POST", "uri": "https://api.anthropic.com/v1/messages", "body": None,
                     "parsed_body": {"model": "claude-haiku-4-5", "messages": []}, "headers": {}},
         "response": {"status": {"code": 200}, "headers": {}, "body": {"string": ""},
                      "parsed_body": dict(MESSAGE, id="msg_parsed")}}],
        "recorded_with": "VCR 6.3.1"}
    path = _write(tmp_path, "ruby.json", json.dumps(ruby))
    assert detect(path).name == "vcr"
    reqs = list(VcrReader().read(path))
    assert [r.request_id for r in reqs] == ["msg_ruby", "msg_parsed"]
    assert reqs[0].at == datetime(2026, 3, 4, 10, tzinfo=UTC) and reqs[1].at == reqs[0].at  # carried forward


# --- har ---------------------------------------------------------------------------------------------------


def test_har_responses_agent():
    reqs, skipped, _ = split(list(HarReader().read(BILLING)))
    f = str(BILLING)
    assert skipped == [SkippedLine(f, 3, "endpoint not analysed: /openai/v1/files/file-3Rk7Vb2Nw9Qe5Yt1Lm8Xc4"),
                       SkippedLine(f, 5, "no response")]
    assert [(r.usage.input_tokens, r.usage.cache_read_input_tokens, r.usage.cache_creation_input_tokens,
             r.usage.output_tokens) for r in reqs] == [(1318, 0, 0, 236), (322, 1280, 0, 91), (251, 1536, 0, 174)]
    assert [r.usage.raw["output_tokens_details"]["reasoning_tokens"] for r in reqs] == [192, 64, 64]
    assert {(r.dialect, r.provider, r.model, r.session_key) for r in reqs} == {
        ("openai-responses", "openai", "gpt-5-mini", f"{f}|openai|billing-widget")}
    assert [r.at for r in reqs] == [datetime(2026, 3, 3, 9, 21, 5, 118000, tzinfo=UTC),
                                    datetime(2026, 3, 3, 9, 21, 9, 377000, tzinfo=UTC),
                                    datetime(2026, 3, 3, 9, 21, 12, 640000, tzinfo=UTC)]  # +01:00 → UTC
    assert [r.source_ref for r in reqs] == [f"{f}#entries[0]", f"{f}#entries[1]", f"{f}#entries[3]"]
    assert [r.request_id for r in reqs] == ["req_b1d3f5a7c9e24b6d8f0a2c4e6b8d0f2a", "req_c2e4a6b8d0f14c3e5a7b9d1f3a5c7e9b",
                                            "req_e4a6c8d0f2b34e5a7c9d1f3b5d7e9a1c"]
    assert reqs[0].reply[1]["name"] == "lookup_invoice"  # from base64 content
    assert reqs[1].reply[1]["name"] == "get_payment_events"  # from the stream's response.completed
    assert [item.get("type") for item in reqs[2].body["input"]] == [
        None, "function_call", "function_call_output", "function_call", "function_call_output"]


def test_har_broken_json_is_one_line_error(tmp_path):
    path = _write(tmp_path, "cut.har", BILLING.read_text(encoding="utf-8")[:5000])
    assert detect(path).name == "har"
    with pytest.raises(ImportFormatError, match=r"cut\.har: not valid HAR JSON"):
        list(HarReader().read(path))


# --- exchanges ---------------------------------------------------------------------------------------------


def test_exchanges_review_bot_log():
    records = list(ExchangesReader().read(REVIEW))
    reqs, skipped, progress = split(records)
    f = str(REVIEW)
    assert [s.line for s in skipped] == [3, 4, 6]
    assert skipped[0].reason.startswith("not valid JSON (")
    assert skipped[1:] == [SkippedLine(f, 4, "endpoint not analysed: /v1/messages/count_tokens"),
                           SkippedLine(f, 6, "unknown usage shape: usage.input_tokens: missing")]
    assert progress == [ReadProgress(f, 7)] and records[-1] == progress[0]
    assert [figures(r) for r in reqs] == [(5, 0, 3112, 664, 2448, 276), (5, 3112, 866, 866, 0, 133),
                                          (5, 3978, 545, 545, 0, 405), (5, 4523, 501, 501, 0, 92)]
    assert [r.source_ref for r in reqs] == [f"{f}:1", f"{f}:2", f"{f}:5", f"{f}:7"]
    assert [r.dedupe_key for r in reqs] == ["req_011CVdR1a2B3c4D5e6F7g8H9", "req_011CVdR1j2K3l4M5n6P7q8R9",
                                            "req_011CVdR2b3C4d5E6f7G8h9J1", "req_011CVdR2t3U4v5W6x7Y8z9A1"]
    assert {r.session_key for r in reqs} == {f"{f}|anthropic|ci-review-bot"}
    assert reqs[0].at == datetime(2026, 3, 4, 16, 2, 11, 204000, tzinfo=UTC)
    assert reqs[1].reply[0]["text"].startswith("Two issues.")  # raw SSE chunks cut mid-event
    assert reqs[2].reply[0]["input"]["line"] == 48  # parsed events
    assert reqs[3].reply is None and reqs[3].usage.output_tokens == 92  # the proxy kept only usage


def test_exchanges_truncated_last_line_waits_for_the_next_import(tmp_path):
    records = list(ExchangesReader().read(GROWING))
    reqs, skipped, progress = split(records)
    assert skipped == [] and [figures(r) for r in reqs] == [(97, 0, 0, 0, 0, 78), (131, 0, 0, 0, 0, 46)]
    assert progress == [ReadProgress(str(GROWING), 2)]
    grown = tmp_path / "log.jsonl"
    shutil.copy(GROWING, grown)
    lines = GROWING.read_text(encoding="utf-8").split("\n")
    complete_third = json.dumps({"v": 1, "at": "2026-03-06T11:42:40.118Z", "path": "/v1/messages", "status": 200,
                                 "request": {"model": "claude-sonnet-4-5-20250929", "messages": []},
                                 "response": None, "usage": {"input_tokens": 140, "output_tokens": 60},
                                 "request_id": "req_third"})
    grown.write_text("\n".join(lines[:2]) + "\n" + complete_third + "\n", encoding="utf-8")
    reqs2, _, progress2 = split(list(ExchangesReader().read(grown)))
    assert [r.request_id for r in reqs2][-1] == "req_third" and progress2 == [ReadProgress(str(grown), 3)]
    # a complete object without its newline (a hand-edited file) is read; an incomplete one is left
    grown.write_text("\n".join(lines[:2]) + "\n" + complete_third, encoding="utf-8")
    assert split(list(ExchangesReader().read(grown)))[2] == [ReadProgress(str(grown), 3)]


def test_exchanges_line_checks(tmp_path):
    ok = {"v": 1, "at": "2026-03-06T11:40:02Z", "path": "/v1/messages", "status": 200,
          "request": {"model": "claude-haiku-4-5", "messages": []}, "response": MESSAGE, "usage": None,
          "request_id": None}
    lines = [dict(ok, v=EXCHANGES_FORMAT_VERSION + 1), dict(ok, at="yesterday"), dict(ok, status="200"),
             dict(ok, sse=["data: {}\n\n", {"event": "x"}]), [1, 2], dict(ok, status=429), ok]
    path = _write(tmp_path, "x.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    reqs, skipped, progress = split(list(ExchangesReader().read(path)))
    assert [s.reason for s in skipped] == [
        "exchanges format version 2 is newer than this reader (1); upgrade promptcache_nb",
        "at: Invalid isoformat string: 'yesterday'",
        "status is '200', not an HTTP status",
        "sse mixes raw text chunks and parsed events",
        "a JSON list, not an object",
        "HTTP 429"]
    assert [r.request_id for r in reqs] == ["msg_9"] and reqs[0].source_ref == f"{path}:7"
    assert progress == [ReadProgress(str(path), 8)]


def test_exchanges_sniff_survives_a_first_line_longer_than_the_head(tmp_path):
    line = {"v": 1, "at": "2026-03-06T11:40:02Z", "method": "POST", "url": "https://api.anthropic.com/v1/messages",
            "path": "/v1/messages", "status": 200,
            "request": {"model": "claude-haiku-4-5", "system": "policy " * 30000, "messages": []},
            "response": MESSAGE, "usage": None, "request_id": "req_long"}
    path = _write(tmp_path, "proxy.log", json.dumps(line) + "\n")
    assert path.stat().st_size > 64 * 1024
    assert detect(path).name == "exchanges"
    assert [r.request_id for r in ExchangesReader().read(path) if isinstance(r, ImportedRequest)] == ["req_long"]


# --- registry ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "name"), [(TRIAGE, "vcr"), (ONCALL, "vcr"), (BILLING, "har"),
                                            (REVIEW, "exchanges"), (GROWING, "exchanges")])
def test_detect_by_content(path, name, tmp_path):
    assert READERS[name].name == name and detect(path).name == name
    renamed = tmp_path / "capture.txt"  # the name is never consulted
    shutil.copy(path, renamed)
    assert detect(renamed).name == name


def test_detect_unknown_file_names_it_and_the_formats_tried(tmp_path):
    path = _write(tmp_path, "notes.md", "# Release notes\n\nNothing to import here.\n")
    with pytest.raises(ImportFormatError) as info:
        detect(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not a known log format (formats tried: ") and "\n" not in message
    assert {"exchanges", "har", "vcr"} <= set(info.value.tried)


def test_http_readers_do_not_claim_the_other_formats_fixtures():
    mine = {LOGS / "vcr", LOGS / "har", LOGS / "exchanges"}
    others = [p for p in LOGS.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".json", ".yaml", ".har")
              and not any(d in p.parents for d in mine)]
    for path in others:
        head = path.read_bytes()[:65536].decode("utf-8", errors="replace")
        for reader in (VcrReader(), HarReader(), ExchangesReader()):
            assert not reader.sniff(path, head), (reader.name, path)


def test_anthropic_stream_cut_before_message_delta_keeps_cache_figures_output_unknown():
    cut = ANTHROPIC_STREAM.split("event: message_delta")[0]
    assert usage_from_sse(parse_sse(cut), "anthropic").complete is False
    assert usage_from_sse(parse_sse(ANTHROPIC_STREAM), "anthropic").complete is True
    req = _convert(response_body=cut, response_headers={"content-type": "text/event-stream"})
    assert (req.usage.input_tokens, req.usage.cache_read_input_tokens, req.usage.cache_creation_input_tokens,
            req.usage.output_tokens) == (6, 3000, 120, None)
    assert req.reply[1]["input"] == {"pattern": "timeout"}


def test_exchanges_error_field_explains_a_missing_response(tmp_path):
    line = {"v": 1, "at": "2026-03-06T11:40:02Z", "path": "/v1/messages", "status": None,
            "request": {"model": "claude-haiku-4-5", "messages": []}, "response": None, "usage": None,
            "request_id": None, "latency_ms": 30000.0, "error": "upstream timed out after 30 s"}
    path = _write(tmp_path, "x.jsonl", json.dumps(line) + "\n")
    assert list(ExchangesReader().read(path))[0] == SkippedLine(str(path), 1, "no response: upstream timed out after 30 s")


def test_vcr_empty_cassette_is_recognised_and_yields_nothing(tmp_path):
    path = _write(tmp_path, "test_nothing_recorded.yaml", "interactions: []\nversion: 1\n")
    assert detect(path).name == "vcr" and list(VcrReader().read(path)) == []
