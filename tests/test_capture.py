"""lab.capture(client): the real anthropic and openai SDKs (sync, async, streamed) against the simulator endpoint,
each completed call stored with the usage the SDK returned, retries, failures and the key kept out."""

from __future__ import annotations

import asyncio
import gc
import json
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anthropic
import httpx2
import openai
import pytest

import promptcache_nb as pc
from promptcache_nb.dialects import usage_from_anthropic, usage_from_openai
from promptcache_nb.ingest.capture import on_record
from promptcache_nb.usage import Usage

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

KEY = "sk-test-capture-0123456789abcdef"  # a fake key: it must never reach the store
MODEL = "claude-sonnet-4-5"
SYSTEM = [{"type": "text", "text": "You are a careful support agent for a billing platform. " * 150,
           "cache_control": {"type": "ephemeral"}}]
LONG_USER = "Summarise the refund policy for invoices older than 30 days. " * 200
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
COLUMNS = ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
           "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens", "output_tokens"]


@pytest.fixture(autouse=True, scope="module")
def _collect_sdk_clients():
    """Tests here build SDK clients, and some may leave them to the garbage collector: collect them when the
    module ends, so a pooled loopback socket's ResourceWarning never surfaces later inside another module's test
    (warnings are errors). Once per module, not per test: a full collection costs ~0.25 s, and these tests'
    garbage emits no warning (checked: none of the 13 per-test collections found one; an unclosed socket's is
    ignored suite-wide anyway, pyproject.toml)."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def server(simulator):
    """The shared simulator endpoint (tests/conftest.py), reset for each test."""
    return simulator


@pytest.fixture
def lab(tmp_path):
    lab = pc.Lab(tmp_path / "capture.duckdb", progress=False)
    yield lab
    lab.close()


def messages(n: int) -> list[dict]:
    out: list[dict] = []
    for i in range(n):
        out += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
    return [*out, {"role": "user", "content": f"question {n}"}]


def at(seconds: float) -> dict:
    """The simulator's clock for a call (an entry written at t is read from the next call on)."""
    return {"x-promptcache-at": (T0 + timedelta(seconds=seconds)).isoformat()}


def stored(session: pc.Session) -> list[dict]:
    df = session.turns()
    return [{k: (None if df[k][i] != df[k][i] else int(df[k][i])) for k in COLUMNS} for i in range(len(df))]


def as_row(u: Usage) -> dict:
    return {"input_tokens": u.input_tokens, "cache_read_input_tokens": u.cache_read_input_tokens,
            "cache_creation_input_tokens": u.cache_creation_input_tokens,
            "cache_creation_5m_input_tokens": u.cache_creation_5m_input_tokens,
            "cache_creation_1h_input_tokens": u.cache_creation_1h_input_tokens, "output_tokens": u.output_tokens}


def key_absent(lab: pc.Lab) -> None:
    path = lab.path
    lab.close()
    data = Path(path).read_bytes()
    assert KEY.encode() not in data and b"sk-test-capture" not in data


# -- anthropic --------------------------------------------------------------------------------------------
def test_anthropic_sync_create_and_stream_are_stored_with_the_usage_the_sdk_returned(server, lab):
    client = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)  # created before
    before = client._client._transport
    with lab.capture(client) as cap:
        got = [client.messages.create(model=MODEL, max_tokens=32, system=SYSTEM, messages=messages(0),
                                      extra_headers=at(0))]
        with client.messages.stream(model=MODEL, max_tokens=32, system=SYSTEM, messages=messages(1),
                                    extra_headers=at(10)) as stream:
            for _ in stream:
                pass
            got.append(stream.get_final_message())
            stream_id = stream.response.headers["request-id"]
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=32, system=SYSTEM,
                                                       messages=messages(2), extra_headers=at(20))
        got.append(raw.parse())
    assert client._client._transport is before  # unwrapped on exit
    s = cap.session
    assert s.strategy is None and s.source == "capture:anthropic"
    expected = [as_row(usage_from_anthropic(m.usage.model_dump())) for m in got]
    assert stored(s) == expected
    assert expected[1]["cache_read_input_tokens"] > 1000  # the second call read the first one's prefix
    df = s.turns()
    ids = [got[0]._request_id, stream_id, got[2]._request_id]
    assert list(df.request_id) == ids == [c.request_id for c in cap.calls] and len(set(ids)) == 3
    assert set(df.usage_source) == {"simulated"}  # the simulator endpoint answered
    assert [c.streamed for c in cap.calls] == [False, True, False]
    assert all(c.latency_ms > 0 and c.reason is None for c in cap.calls)
    assert s.turn(2).request == {"model": MODEL, "max_tokens": 32, "system": SYSTEM, "messages": messages(2)}
    client.close()
    key_absent(lab)


def test_anthropic_async_create_and_stream(server, lab):
    async def run() -> tuple:
        client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
        with lab.capture(client) as cap:
            first = await client.messages.create(model=MODEL, max_tokens=32, system=SYSTEM, messages=messages(0),
                                                 extra_headers=at(0))
            stream = await client.messages.create(model=MODEL, max_tokens=32, system=SYSTEM, messages=messages(1),
                                                  stream=True, extra_headers=at(10))
            start = delta = None
            async for event in stream:
                if event.type == "message_start":
                    start = event.message.usage.model_dump()
                elif event.type == "message_delta":
                    delta = event.usage.output_tokens
        await client.close()
        return cap, first, start, delta

    cap, first, start, delta = asyncio.run(run())
    rows = stored(cap.session)
    assert rows[0] == as_row(usage_from_anthropic(first.usage.model_dump()))
    assert rows[1] == as_row(usage_from_anthropic({**start, "output_tokens": delta}))
    assert rows[1]["cache_read_input_tokens"] > 1000
    key_absent(lab)


# -- openai -------------------------------------------------------------------------------------------------
def _openai_row(usage: dict, api: str) -> dict:
    return as_row(usage_from_openai(usage, api=api))


def test_openai_sync_chat_responses_and_streams(server, lab):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    with lab.capture(client) as cap:
        a = client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": LONG_USER}])
        chunks = list(client.chat.completions.create(
            model="gpt-5", messages=[{"role": "user", "content": LONG_USER}], stream=True,
            stream_options={"include_usage": True}))
        r = client.responses.create(model="gpt-5", input=LONG_USER)
    s = cap.session
    assert s.cache == "openai" and s.source == "capture:openai"
    rows = stored(s)
    assert rows[0] == _openai_row(a.usage.model_dump(), "chat")
    assert rows[1] == _openai_row(chunks[-1].usage.model_dump(), "chat")
    assert rows[1]["cache_read_input_tokens"] > 0  # the stream read what the first call wrote
    assert rows[2] == _openai_row(r.usage.model_dump(), "responses")
    assert list(s.turns().request_id) == [a._request_id, cap.calls[1].request_id, r._request_id]
    client.close()
    key_absent(lab)


def test_openai_async_create_and_stream(server, lab):
    async def run() -> tuple:
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
        with lab.capture(client, project="nb") as cap:
            a = await client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": LONG_USER}])
            stream = await client.chat.completions.create(
                model="gpt-5", messages=[{"role": "user", "content": LONG_USER}], stream=True,
                stream_options={"include_usage": True})
            last = None
            async for chunk in stream:
                last = chunk
        await client.close()
        return cap, a, last

    cap, a, last = asyncio.run(run())
    assert cap.session.project == "nb"
    assert stored(cap.session) == [_openai_row(a.usage.model_dump(), "chat"),
                                   _openai_row(last.usage.model_dump(), "chat")]
    key_absent(lab)


# -- retries, failures, what is not stored ---------------------------------------------------------------
def test_a_retried_call_is_one_request_and_a_failed_call_is_not_stored(server, lab):
    client = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=2)
    server.inject_error(529, retry_after=0.01)
    with lab.capture(client) as cap:
        msg = client.messages.create(model=MODEL, max_tokens=32, system=SYSTEM, messages=messages(0))
        server.inject_error(429, times=3, retry_after=0.01)
        with pytest.raises(anthropic.RateLimitError):  # the SDK's own error, after its own retries
            client.messages.create(model=MODEL, max_tokens=32, system=SYSTEM, messages=messages(1))
    assert [c.status for c in cap.calls] == [529, 200, 429, 429, 429]
    assert [c.reason for c in cap.calls] == ["HTTP 529", None, "HTTP 429", "HTTP 429", "HTTP 429"]
    assert len(cap.session.turns()) == 1 and cap.session.turns().request_id[0] == msg._request_id
    assert cap.stored == 1
    df = cap.df()
    assert list(df.request_index) == [pd_na := df.request_index[0], 0, pd_na, pd_na, pd_na]
    client.close()


def test_errors_and_timeouts_are_the_sdks_own(server, lab):
    refused = anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key=KEY, max_retries=0)
    bad_key = anthropic.Anthropic(base_url=server.base_url, api_key="bad", max_retries=0)
    with lab.capture(refused) as cap1, lab.capture(bad_key, session=None) as cap2:
        with pytest.raises(anthropic.APIConnectionError):
            refused.messages.create(model=MODEL, max_tokens=32, messages=messages(0))
        with pytest.raises(anthropic.AuthenticationError):
            bad_key.messages.create(model=MODEL, max_tokens=32, messages=messages(0))
    assert cap1.calls[0].status is None and cap1.calls[0].reason == "ConnectError"
    assert cap2.calls[0].reason == "HTTP 401"
    assert cap1.stored == cap2.stored == 0 and len(lab.sql("SELECT * FROM turns")) == 0

    # a read timeout inside a stream: the same exception as without the capture, nothing stored
    slow = pc.SimulatorServer(stream_delay=0.5).start()
    try:
        client = anthropic.Anthropic(base_url=slow.base_url, api_key=KEY, max_retries=0, timeout=0.2)

        def call() -> type[BaseException]:
            try:
                for _ in client.messages.create(model=MODEL, max_tokens=32, messages=messages(0), stream=True):
                    pass
            except Exception as exc:
                return type(exc)
            raise AssertionError("no timeout")

        without = call()
        with lab.capture(client) as cap:
            assert call() is without
        assert cap.stored == 0 and "Timeout" in (cap.calls[0].reason or "")
    finally:
        slow.stop()


def test_a_stream_closed_before_its_end_is_not_stored_half(server, lab):
    slow = pc.SimulatorServer(stream_delay=0.01).start()
    try:
        client = anthropic.Anthropic(base_url=slow.base_url, api_key=KEY, max_retries=0)
        with lab.capture(client) as cap:
            stream = client.messages.create(model=MODEL, max_tokens=32, system=SYSTEM, messages=messages(0),
                                            stream=True)
            next(iter(stream))
            stream.close()
        assert cap.calls[0].reason == "response closed before its end" and cap.stored == 0
        assert len(cap.session.turns()) == 0
    finally:
        slow.stop()


def test_not_analysed_endpoints_are_listed_not_stored(server, lab):
    client = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    with lab.capture(client) as cap:
        client.messages.count_tokens(model=MODEL, messages=messages(0))
    assert cap.calls[0].reason == "endpoint not analysed: /v1/messages/count_tokens" and cap.stored == 0


def test_a_real_endpoint_is_live_and_the_transport_is_restored_after_an_error(lab):
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
              "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn", "stop_sequence": None,
              "usage": {"input_tokens": 12, "cache_read_input_tokens": 3000, "cache_creation_input_tokens": 40,
                        "cache_creation": {"ephemeral_5m_input_tokens": 40, "ephemeral_1h_input_tokens": 0},
                        "output_tokens": 5}}

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert json.loads(request.content)["messages"] == messages(0)  # sent unchanged
        return httpx2.Response(200, json=answer, headers={"request-id": "req_live_1"})

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    client = anthropic.Anthropic(api_key=KEY, http_client=http, max_retries=0)
    original = http._transport
    with pytest.raises(RuntimeError, match="boom"), lab.capture(client) as cap:
        client.messages.create(model=MODEL, max_tokens=32, messages=messages(0))
        raise RuntimeError("boom")
    assert http._transport is original
    t = cap.session.last_turn
    assert t.usage.source == "live" and t.request_id == "req_live_1"
    assert as_row(t.usage) == as_row(usage_from_anthropic(answer["usage"]))


def test_a_plain_httpx_client_and_a_listener(server, lab):
    seen = []
    with httpx2.Client(base_url=server.base_url) as http:
        with lab.capture(http) as cap:
            unsubscribe = on_record(cap.session, seen.append)
            r = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 16, "messages": messages(0)},
                          headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
            unsubscribe()
            http.post("/v1/messages", json={"model": MODEL, "max_tokens": 16, "messages": messages(1)},
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and cap.stored == 2
    assert [t.index for t in seen] == [0]  # called once per stored request, until unsubscribed


def test_capture_into_a_given_session_and_bad_clients(server, lab):
    s = lab.session(project="mine")
    with pytest.raises(TypeError, match="not an httpx-based client"), lab.capture(object()):
        pass
    client = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    with pc.capture(client, lab=lab, session=s) as cap:
        client.messages.create(model=MODEL, max_tokens=32, messages=messages(0))
    assert cap.session is s and s.last_turn.usage.source == "simulated"
    # the first captured call is stored after the session's own clock (time only moves forward)
    assert s.last_turn.index == 0


def test_a_call_that_cannot_be_stored_still_returns_to_the_caller(server, tmp_path):
    lab = pc.Lab(tmp_path / "closed.duckdb", progress=False)
    client = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    with lab.capture(client) as cap:
        lab.close()  # the store is gone: the SDK call must not notice
        msg = client.messages.create(model=MODEL, max_tokens=32, messages=messages(0))
    assert msg.content[0].text == "(simulated reply)"
    assert cap.stored == 0 and cap.calls[0].reason.startswith("not stored: ")
    assert KEY not in cap.calls[0].reason
    client.close()


def test_each_captured_call_stores_its_latency(server, lab):
    client = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    with lab.capture(client) as cap:
        for i in range(2):
            client.messages.create(model=MODEL, max_tokens=32, system=SYSTEM, messages=messages(i),
                                   extra_headers=at(10 * i))
    client.close()
    df = cap.session.turns()
    calls = cap.df()
    # the store keeps what the capture timed, call by call (from sending the request to its last byte)
    assert list(df.latency_ms) == list(calls.latency_ms)
    assert (df.latency_ms > 0).all()
