"""The recording proxy end to end, over real HTTP on loopback: the anthropic and openai SDKs through the proxy to
SimulatorServer (and to a tiny upstream that shows exactly what was forwarded), then the log it wrote.

Also the HTTP layer the proxy shares with SimulatorServer: body limits, slow clients, bad framing, wrong methods,
and many clients at once.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anthropic
import anyio
import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount

import promptcache_nb as pc
from promptcache_nb.live._asgi import ServerThread
from promptcache_nb.live.proxy import DECODABLE, RecordingProxy

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent
KEY = "fake-anthropic-key-DISTINCTIVE-0000"
OPENAI_KEY = "fake-openai-key-DISTINCTIVE-1111"
DIRECT_KEY = "fake-key-direct-path"
SECRETS = (KEY, OPENAI_KEY, "DISTINCTIVE")
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
MODEL = "claude-sonnet-4-5"
LONG = "You are a careful support agent for a billing platform. Answer from the ledger only. " * 120


def at(seconds: float) -> dict[str, str]:
    return {"x-promptcache-at": (T0 + timedelta(seconds=seconds)).isoformat()}


def messages_body(text: str = "Where is invoice 42?") -> dict:
    return {"model": MODEL, "max_tokens": 64,
            "system": [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": text}]}


def chat_messages(text: str = "Where is invoice 42?") -> list[dict]:
    return [{"role": "system", "content": LONG}, {"role": "user", "content": text}]


def lines(path: Path) -> list[dict]:
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), "every line is complete once the calls returned"
    return [json.loads(line) for line in raw.splitlines()]


def dump(usage) -> dict:
    return usage.model_dump(exclude_none=True)


@pytest.fixture
def api(simulator):
    """The shared simulator endpoint (tests/conftest.py), reset for each test."""
    return simulator


@pytest.fixture
def log_path(tmp_path) -> Path:
    return tmp_path / "logs" / "calls.jsonl"


@pytest.fixture
def proxy(api, log_path):
    with RecordingProxy(api.base_url, log_path) as p:
        yield p


# -- a tiny upstream that shows what arrived -------------------------------------------------------
class EchoUpstream:
    """Echoes each request; ``/v1/messages`` streams SSE, holding after the first event until released."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.release = threading.Event()
        self.finished = threading.Event()
        app = Starlette(routes=[Mount("/", app=self._app)])
        self.server = ServerThread(app, host="127.0.0.1", port=0, name="echo-upstream")
        self.url = f"http://127.0.0.1:{self.server.port}"

    async def _app(self, scope, receive, send) -> None:
        request = Request(scope, receive)
        body = await request.body()
        self.received.append({"method": request.method, "raw_path": scope["raw_path"],
                              "query": scope["query_string"], "headers": list(scope["headers"]), "body": body})
        path = scope["path"]
        if path == "/v1/messages":
            response = StreamingResponse(self._events(), media_type="text/event-stream",
                                         headers={"request-id": "req_echo_1"})
        elif path == "/gzip":
            usage = {"input_tokens": 11, "cache_read_input_tokens": 2048, "cache_creation_input_tokens": 0,
                     "output_tokens": 3}
            payload = gzip.compress(json.dumps({"id": "msg_gz", "type": "message", "usage": usage}).encode())
            response = Response(payload, headers={"content-encoding": "gzip", "content-type": "application/json"})
        else:
            response = JSONResponse({"echo": True}, headers={"x-upstream": "yes", "x-request-id": "req_echo_2",
                                                             "connection": "close"})
        await response(scope, receive, send)

    async def _events(self):
        start = {"type": "message_start", "message": {
            "id": "msg_echo", "type": "message", "role": "assistant", "model": MODEL, "content": [],
            "usage": {"input_tokens": 9, "cache_read_input_tokens": 4096, "cache_creation_input_tokens": 0,
                      "output_tokens": 1}}}
        yield f"event: message_start\ndata: {json.dumps(start)}\n\n".encode()
        await anyio.to_thread.run_sync(self.release.wait, 10)  # hold until the test saw the first event
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}
        yield f"event: message_delta\ndata: {json.dumps(delta)}\n\n".encode()
        yield b'event: message_stop\ndata: {"type": "message_stop"}\n\n'
        self.finished.set()


@pytest.fixture
def echo():
    upstream = EchoUpstream()
    upstream.server.start()
    yield upstream
    upstream.release.set()
    upstream.server.stop()


# -- anthropic SDK ----------------------------------------------------------------------------------
def test_anthropic_sync_and_streaming_usage_identical_to_direct_and_logged(api, proxy, log_path):
    via = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    direct = anthropic.Anthropic(base_url=api.base_url, api_key=DIRECT_KEY, max_retries=0)
    got: dict[str, list] = {"via": [], "direct": []}
    for name, client in (("via", via), ("direct", direct)):  # separate workspaces: each path warms its own cache
        got[name].append(client.messages.create(**messages_body(), extra_headers=at(0)).usage)
        with client.messages.stream(**messages_body("And 43?"), extra_headers=at(30)) as stream:
            text = "".join(stream.text_stream)
            got[name].append(stream.get_final_message().usage)
        events = list(client.messages.create(**messages_body("And 44?"), extra_headers=at(60), stream=True))
        assert [e.type for e in events][0] == "message_start" and text == "(simulated reply)"
        final = events[0].message.usage.model_copy(update={"output_tokens": events[-2].usage.output_tokens})
        got[name].append(final)
    via.close()
    direct.close()
    assert got["via"] == got["direct"]
    assert got["via"][0].cache_creation_input_tokens > 1024 and got["via"][1].cache_read_input_tokens > 1024

    logged = lines(log_path)
    assert [line["path"] for line in logged] == ["/v1/messages"] * 3
    assert [line["usage"] for line in logged] == [dump(u) for u in got["via"]]
    first, streamed = logged[0], logged[1]
    assert list(first) == ["v", "at", "method", "url", "path", "status", "request", "response", "usage",
                           "request_id", "latency_ms", "provider", "simulated"]
    assert first["simulated"] is True  # the upstream was our simulator: its usage must never read as measured
    assert first["v"] == 1 and first["status"] == 200 and first["provider"] == "anthropic"
    assert first["request"] == messages_body() and first["response"]["content"][0]["text"] == "(simulated reply)"
    assert first["request_id"] == api.requests[0].request_id and first["latency_ms"] > 0
    assert first["url"] == f"{api.base_url}/v1/messages"
    assert datetime.fromisoformat(first["at"]).tzinfo is not None and first["at"].endswith("Z")
    assert streamed["response"] is None and streamed["request"]["stream"] is True
    assert [e["event"] for e in streamed["sse"]][:2] == ["message_start", "ping"]
    assert streamed["sse"][-1] == {"event": "message_stop", "data": {"type": "message_stop"}}


def test_exchanges_reader_reads_the_same_usage(api, proxy, log_path):
    exchanges = pytest.importorskip("promptcache_nb.readers.exchanges")
    from promptcache_nb.readers._types import ImportedRequest

    with anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0) as client:
        plain = client.messages.create(**messages_body(), extra_headers=at(0)).usage
        with client.messages.stream(**messages_body("again"), extra_headers=at(10)) as stream:
            streamed = stream.get_final_message().usage
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=OPENAI_KEY, max_retries=0) as oa:
        chat = oa.chat.completions.create(model="gpt-4o", messages=chat_messages(), extra_headers=at(20)).usage
    records = [r for r in exchanges.ExchangesReader().read(log_path) if isinstance(r, ImportedRequest)]
    assert len(records) == 3
    for record, sdk in zip(records[:2], (plain, streamed), strict=True):
        assert record.usage == pc.dialects.usage_from_anthropic(sdk, source=record.usage.source)
        assert record.usage.source == "simulated"  # the simulator's x-promptcache-simulator header, logged
    assert records[2].usage.cache_read_input_tokens == chat.prompt_tokens_details.cached_tokens
    assert records[2].usage.total_input_tokens == chat.prompt_tokens
    assert records[2].dialect == "openai-chat"


def test_streamed_events_are_relayed_as_they_arrive(echo, log_path):
    """The upstream holds after its first event; the client must already have it (nothing buffered whole)."""
    with RecordingProxy(echo.url, log_path) as proxy, httpx.Client(timeout=20) as http, \
            http.stream("POST", proxy.url + "/v1/messages?beta=true", json=messages_body(),
                        headers={"x-api-key": KEY}) as response:
        chunks = response.iter_raw()
        first = next(chunks)
        assert b"message_start" in first and b"message_delta" not in first
        assert not echo.finished.is_set()
        assert not log_path.read_bytes()  # the call is not complete: no line yet
        echo.release.set()
        rest = b"".join(chunks)
        assert b"message_stop" in rest
    deadline = time.monotonic() + 5
    while not log_path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    (line,) = lines(log_path)
    assert line["path"] == "/v1/messages" and line["url"].endswith("/v1/messages?beta=true")
    assert line["usage"] == {"input_tokens": 9, "cache_read_input_tokens": 4096, "cache_creation_input_tokens": 0,
                             "output_tokens": 5}
    assert line["request_id"] == "req_echo_1"


def test_sdk_stream_through_the_proxy_is_incremental(log_path):
    with pc.SimulatorServer(stream_delay=0.15) as slow, RecordingProxy(slow.base_url, log_path) as proxy, \
            anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0) as client:
        arrivals = []
        for event in client.messages.create(**messages_body(), stream=True):
            arrivals.append((time.perf_counter(), event.type))
    assert [kind for _, kind in arrivals][-1] == "message_stop"
    # 8 events, 0.15 s apart: the first reached the SDK about a second before the last
    assert arrivals[-1][0] - arrivals[0][0] > 0.6
    assert lines(log_path)[0]["latency_ms"] > 600


# -- openai SDK -------------------------------------------------------------------------------------
def test_openai_chat_and_responses_sync_and_streaming(api, proxy, log_path):
    results: dict[str, list] = {"via": [], "direct": []}
    for name, base, key in (("via", proxy.url, OPENAI_KEY), ("direct", api.base_url, "sk-direct-openai")):
        with openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0) as client:
            r = client.chat.completions.create(model="gpt-4o", messages=chat_messages(), extra_headers=at(0))
            assert r.choices[0].message.content == "(simulated reply)"
            results[name].append(r.usage)
            chunks = list(client.chat.completions.create(
                model="gpt-4o", messages=chat_messages("And 43?"), stream=True,
                stream_options={"include_usage": True}, extra_headers=at(10)))
            assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "(simulated reply)"
            results[name].append(chunks[-1].usage)
            r = client.responses.create(model="gpt-4o", instructions=LONG, input="Where is invoice 42?",
                                        extra_headers=at(20))
            assert r.output_text == "(simulated reply)"
            results[name].append(r.usage)
            with client.responses.stream(model="gpt-4o", instructions=LONG, input="And 43?",
                                         extra_headers=at(30)) as stream:
                kinds = [event.type for event in stream]
                results[name].append(stream.get_final_response().usage)
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert results["via"] == results["direct"]
    chat_sync, chat_stream = results["via"][:2]
    assert chat_sync.prompt_tokens > 1024 and chat_sync.prompt_tokens_details.cached_tokens == 0
    assert chat_stream.prompt_tokens_details.cached_tokens >= 1024  # the shared system prompt, read

    logged = lines(log_path)
    assert [line["path"] for line in logged] == ["/v1/chat/completions"] * 2 + ["/v1/responses"] * 2
    assert [line["usage"] for line in logged] == [dump(u) for u in results["via"]]
    assert {line["provider"] for line in logged} == {"openai"}
    assert logged[1]["sse"][-1] == {"event": None, "data": "[DONE]"}
    assert logged[3]["sse"][-1]["event"] == "response.completed"
    assert logged[0]["request_id"].startswith("req_sim_") and logged[0]["response"]["id"].startswith("chatcmpl-")


def test_responses_bodies_are_modelled_not_counted_as_empty(api):
    """Responses ``instructions``/``input`` reach the cache model (request.prepare's OpenAI dialect)."""
    with openai.OpenAI(base_url=api.base_url + "/v1", api_key=OPENAI_KEY, max_retries=0) as client:
        first = client.responses.create(model="gpt-4o", instructions=LONG, input="hi", extra_headers=at(0))
        second = client.responses.create(model="gpt-4o", instructions=LONG, input="hello", extra_headers=at(5))
    assert first.usage.input_tokens > 1024
    assert second.usage.input_tokens_details.cached_tokens >= 1024


# -- what is forwarded and what is written -----------------------------------------------------------
def test_request_forwarded_unchanged_minus_hop_by_hop_and_response_relayed(echo, log_path):
    body = b'{"model": "x",  "odd spacing": true}'
    headers = {"x-api-key": KEY, "anthropic-beta": "a,b", "anthropic-version": "2023-06-01",
               "connection": "keep-alive, x-hop", "x-hop": "only for the first hop", "te": "trailers",
               "accept-encoding": "gzip, br, zstd", "content-type": "application/json"}
    with RecordingProxy(echo.url, log_path) as proxy, httpx.Client() as http:
        r = http.request("PATCH", proxy.url + "/v1/some/thing%20x?b=2&a=1&a=%20", content=body, headers=headers)
    assert r.status_code == 200 and r.json() == {"echo": True}
    assert r.headers["x-upstream"] == "yes" and r.headers["x-request-id"] == "req_echo_2"
    (got,) = echo.received
    assert got["method"] == "PATCH" and got["body"] == body
    assert got["raw_path"] == b"/v1/some/thing%20x" and got["query"] == b"b=2&a=1&a=%20"
    sent = dict(got["headers"])
    assert sent[b"x-api-key"] == KEY.encode() and sent[b"anthropic-beta"] == b"a,b"
    assert sent[b"anthropic-version"] == b"2023-06-01" and sent[b"content-type"] == b"application/json"
    assert sent[b"host"] == echo.url.removeprefix("http://").encode()
    for hop in (b"x-hop", b"te", b"connection"):
        assert hop not in sent
    # narrowed to what the proxy can decode for its log (gzip always; br and zstd only with their libraries)
    assert sent[b"accept-encoding"].decode() == ", ".join(c for c in ("gzip", "br", "zstd") if c in DECODABLE)
    (line,) = lines(log_path)
    assert line["method"] == "PATCH" and line["path"] == "/v1/some/thing%20x" and line["request"] is not None
    assert line["request_id"] == "req_echo_2" and "provider" not in line
    assert KEY not in log_path.read_text()


def test_gzip_response_relayed_as_sent_and_decoded_for_the_log(echo, log_path):
    with RecordingProxy(echo.url, log_path) as proxy, httpx.Client() as http:
        raw = http.post(proxy.url + "/gzip", json={"model": MODEL}, headers={"accept-encoding": "gzip"})
        assert raw.headers["content-encoding"] == "gzip" and raw.json()["id"] == "msg_gz"
    (line,) = lines(log_path)
    assert line["response"]["id"] == "msg_gz" and line["usage"]["cache_read_input_tokens"] == 2048
    assert line["request_id"] == "msg_gz"


def test_other_paths_are_forwarded_and_logged_for_the_importer_to_skip(api, proxy, log_path):
    with httpx.Client(base_url=proxy.url) as http:
        models = http.get("/v1/models", headers={"x-api-key": KEY})
        count = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": [
            {"role": "user", "content": "hi"}]}, headers={"x-api-key": KEY})
    assert models.status_code == 404 and models.json()["error"]["type"] == "not_found_error"
    assert count.status_code == 200 and count.json()["input_tokens"] > 0
    logged = lines(log_path)
    assert [(line["method"], line["path"], line["status"]) for line in logged] == [
        ("GET", "/v1/models", 404), ("POST", "/v1/messages/count_tokens", 200)]
    assert logged[0]["request"] is None and logged[0]["usage"] is None
    assert [r.path for r in api.requests] == ["/v1/models", "/v1/messages/count_tokens"]


def test_keys_never_reach_the_log_stderr_or_reprs(api, tmp_path, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    log_path = tmp_path / "calls.jsonl"
    upstream = api.base_url.replace("http://", "http://alice:pw-DISTINCTIVE-2222@")
    texts = []
    with RecordingProxy(upstream, log_path) as proxy:
        texts.append(repr(proxy))
        with anthropic.Anthropic(base_url=proxy.url + "/", api_key=KEY, max_retries=0) as client:
            client.messages.create(**messages_body())
            with anthropic.Anthropic(base_url=proxy.url, api_key="bad", max_retries=0) as refusing, \
                    pytest.raises(anthropic.AuthenticationError) as refused:
                refusing.messages.create(**messages_body())
            texts.append(str(refused.value))
        with httpx.Client(base_url=proxy.url) as http:  # a key in the query string, and a cookie
            http.get("/v1/models?key=" + KEY + "&beta=true", headers={"cookie": f"session={KEY}"})
    with RecordingProxy("http://bob:pw-DISTINCTIVE-3333@127.0.0.1:9", log_path) as down, \
            openai.OpenAI(base_url=down.url + "/v1", api_key=OPENAI_KEY, max_retries=0) as client:
        texts.append(repr(down))
        with pytest.raises(openai.APIStatusError) as bad_gateway:
            client.chat.completions.create(model="gpt-4o", messages=chat_messages())
        texts.append(str(bad_gateway.value) + bad_gateway.value.response.text)
    out, err = capfd.readouterr()
    logged = log_path.read_text()
    assert len(lines(log_path)) == 4
    assert "beta=true" in logged and "key=" not in logged
    for haystack in (logged, caplog.text, out, err, "\n".join(texts)):
        for secret in (*SECRETS, "pw-DISTINCTIVE", "alice:", "bob:"):
            assert secret not in haystack, secret


def test_upstream_down_gives_502_and_a_line_with_the_reason(log_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with RecordingProxy(f"http://127.0.0.1:{port}", log_path) as proxy:
        with anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0) as client, \
                pytest.raises(anthropic.APIStatusError) as info:
            client.messages.create(**messages_body())
        assert info.value.status_code == 502
        assert "unreachable" in info.value.message and f"127.0.0.1:{port}" in info.value.message
        r = httpx.get(proxy.url + "/v1/models")
        assert r.status_code == 502 and r.json()["error"]["type"] == "api_error"
    first, second = lines(log_path)
    assert first["status"] is None and "unreachable" in first["error"] and first["request"] == messages_body()
    assert first["usage"] is None and first["response"] is None and second["path"] == "/v1/models"


def test_413_on_oversized_bodies_nothing_forwarded(api, log_path):
    with RecordingProxy(api.base_url, log_path, max_body_bytes=4096) as proxy, httpx.Client() as http:
        declared = http.post(proxy.url + "/v1/messages", content=b"x" * 5000, headers={"x-api-key": KEY})
        chunked = http.post(proxy.url + "/v1/messages", content=iter([b"x" * 3000, b"y" * 3000]),
                            headers={"x-api-key": KEY})
        fits = http.post(proxy.url + "/v1/messages", headers={"x-api-key": KEY}, json={
            "model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "short"}]})
    assert declared.status_code == chunked.status_code == 413
    assert declared.json()["error"]["type"] == "request_too_large" and "4096" in declared.json()["error"]["message"]
    assert fits.status_code == 200
    assert [r.status for r in api.requests] == [200]  # the refused bodies never reached the upstream
    logged = lines(log_path)
    assert [line["status"] for line in logged] == [None, None, 200]
    assert "limit of 4096 bytes" in logged[0]["error"]


def test_binds_loopback_by_default_and_warns_otherwise(api, log_path, caplog, monkeypatch):
    with RecordingProxy(api.base_url, log_path) as proxy:
        assert proxy.host == "127.0.0.1" and proxy.url.startswith("http://127.0.0.1:")
        assert proxy._server._sock.getsockname()[0] == "127.0.0.1"
    assert "stopped" in repr(proxy) and not caplog.records
    monkeypatch.setattr("promptcache_nb.live._serving.is_loopback", lambda host: False)
    with RecordingProxy(api.base_url, log_path):
        pass
    assert "anyone who can reach it" in caplog.text
    caplog.clear()
    monkeypatch.setattr("promptcache_nb.live._serving.is_loopback", lambda host: False)
    with pc.SimulatorServer():
        pass
    assert "accepts any API key" in caplog.text
    with pytest.raises(ValueError, match="http"):
        RecordingProxy("ftp://user:secret@example.com", log_path)
    with pytest.raises(RuntimeError, match="not running"):
        RecordingProxy(api.base_url, log_path).url  # noqa: B018


def test_log_removed_while_running_is_recreated(api, proxy, log_path):
    with anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0) as client:
        client.messages.create(**messages_body())
        log_path.rename(log_path.with_suffix(".1"))  # rotated
        client.messages.create(**messages_body("again"))
    assert len(lines(log_path)) == len(lines(log_path.with_suffix(".1"))) == 1 and proxy.recorded == 2


def test_closing_the_proxy_mid_stream_records_what_arrived(echo, log_path):
    proxy = RecordingProxy(echo.url, log_path).start()
    with httpx.Client(timeout=10) as http, http.stream("POST", proxy.url + "/v1/messages",
                                                       json=messages_body()) as response:
        chunks = response.iter_raw()
        assert b"message_start" in next(chunks)
        proxy.close()  # the upstream still holds its stream open: cancelled after the grace period
        with pytest.raises(httpx.HTTPError):  # the client sees a broken stream, not a complete one
            b"".join(chunks)
    (line,) = lines(log_path)
    assert line["status"] == 200 and "stopped before the response was complete" in line["error"]
    assert line["sse"][0]["event"] == "message_start"


def test_client_going_away_mid_stream_is_logged_and_the_upstream_call_closed(echo, log_path):
    with RecordingProxy(echo.url, log_path) as proxy:
        with httpx.Client(timeout=10) as http, http.stream("POST", proxy.url + "/v1/messages",
                                                           json=messages_body()) as response:
            assert b"message_start" in next(response.iter_raw())
        deadline = time.monotonic() + 5
        while not log_path.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        (line,) = lines(log_path)
        assert line["status"] == 200 and "client closed" in line["error"]
        assert line["usage"]["input_tokens"] == 9  # what had arrived is kept
        echo.release.set()


# -- many clients, and the CLI ------------------------------------------------------------------------
def test_eight_threads_through_proxy_and_server_all_answered_and_logged(api, proxy, log_path):
    def worker(n: int) -> list[int]:
        statuses = []
        with anthropic.Anthropic(base_url=proxy.url, api_key=f"{KEY}-{n}", max_retries=0) as client, \
                httpx.Client(base_url=proxy.url) as http:
            for i in range(25):
                if i % 5 == 4:  # mixed in: malformed JSON and a wrong method, which must not disturb the rest
                    statuses.append(http.post("/v1/messages", content=b"{", headers={"x-api-key": KEY}).status_code)
                    statuses.append(http.delete("/v1/messages", headers={"x-api-key": KEY}).status_code)
                else:
                    msg = client.messages.create(**messages_body(f"worker {n} question {i}"))
                    statuses.append(200 if msg.content[0].text == "(simulated reply)" else 0)
        return statuses

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(worker, range(8)))
    assert all(s == [200, 200, 200, 200, 400, 405] * 5 for s in results)
    logged = lines(log_path)
    assert len(logged) == 8 * 30 == proxy.recorded
    assert sorted({line["status"] for line in logged}) == [200, 400, 405]
    assert api.workspaces == 8


def test_cli_proxy_prints_its_url_at_once_and_records(api, tmp_path):
    log_path = tmp_path / "cli.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "promptcache_nb.cli", "proxy", "--upstream", api.base_url, "--log", str(log_path),
         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        first = proc.stdout.readline()  # arrives through a pipe: the line is flushed
        assert "listening on http://127.0.0.1:" in first and api.base_url in first
        url = first.split("listening on ", 1)[1].split()[0]
        exports = [proc.stdout.readline().strip(), proc.stdout.readline().strip()]
        assert exports == [f"export ANTHROPIC_BASE_URL={url}", f"export OPENAI_BASE_URL={url}/v1"]
        with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as client:
            client.messages.create(**messages_body())
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    (line,) = lines(log_path)
    assert line["status"] == 200 and KEY not in err + out


# -- the HTTP layer shared with SimulatorServer ------------------------------------------------------
def _raw(url: str, data: bytes, *, wait: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.parametrize("length", [b"abc", b"-5"])
def test_server_bad_content_length_is_a_400_not_a_traceback(api, length, capfd):
    reply = _raw(api.base_url, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")
    assert "Traceback" not in capfd.readouterr().err


def test_server_refuses_oversized_bodies_without_reading_them(log_path):
    with pc.SimulatorServer(max_body_bytes=1000) as server:
        head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\nContent-Length: 3000000000\r\n\r\n"
        reply = _raw(server.base_url, head)
        assert reply.startswith(b"HTTP/1.1 413") and b"request_too_large" in reply
        r = httpx.post(server.base_url + "/v1/chat/completions", content=b"x" * 2000, headers={"authorization": "Bearer k"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"  # OpenAI's shape there
        assert [x.status for x in server.requests] == [413, 413]


def test_a_50_mb_body_gets_413_from_the_server_and_the_proxy_at_their_default_limit(api, proxy):
    big = b"x" * (50 * 1024 * 1024)
    for url, path in ((api.base_url, "/v1/messages"), (proxy.url, "/v1/messages"), (api.base_url, "/v1/responses")):
        r = httpx.post(url + path, content=big, headers={"x-api-key": KEY}, timeout=30)
        assert r.status_code == 413, (url, path)
    assert [x.status for x in api.requests] == [413, 413]  # the proxy's refusal never reached the server


def test_server_times_out_slow_clients_and_keeps_serving_others():
    with pc.SimulatorServer(request_timeout=0.5) as server:
        t = time.monotonic()
        partial_headers = _raw(server.base_url, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
        partial_body = _raw(server.base_url, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\n"
                                             b"Content-Length: 100\r\n\r\n{")
        assert time.monotonic() - t < 4
        assert partial_headers == b""  # closed without an answer: there is no request to answer
        assert partial_body.startswith(b"HTTP/1.1 408")
        with anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0) as client:
            assert client.messages.create(**messages_body()).content[0].text == "(simulated reply)"


def test_server_wrong_method_is_a_json_405_and_validation_follows_the_api(api):
    with httpx.Client(base_url=api.base_url, headers={"x-api-key": KEY}) as http:
        r = http.delete("/v1/messages")
        assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]["type"]
        r = http.request("TRACE", "/v1/chat/completions")
        assert r.status_code == 405 and "message" in r.json()["error"]
        base = {"model": MODEL, "max_tokens": 16}
        for messages, problem in (
            ([], "at least one message"),
            ([{"role": "system", "content": "x"}], "cannot be the first message"),
            ([{"role": "wizard", "content": "x"}], "'user', 'assistant' or 'system'"),
            ([{"role": "assistant", "content": "x"}], "first message"),
            ([{"role": "user", "content": ""}], "non-empty content"),
            ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}]}],
             "tool_use_id"),
        ):
            r = http.post("/v1/messages", json={**base, "messages": messages})
            assert r.status_code == 400 and problem in r.json()["error"]["message"], messages
        ok = [{"role": "user", "content": "2+2?"},
              {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {}}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}]},
              {"role": "assistant", "content": ""}]
        assert http.post("/v1/messages", json={**base, "messages": ok}).status_code == 200


def test_server_slow_request_does_not_stall_other_clients(monkeypatch):
    """One workspace's slow cache computation never blocks another workspace (no global lock)."""
    gate = threading.Event()
    with pc.SimulatorServer() as server:
        original = server._process

        def slow_for_one_key(prepared, workspace, name, when):
            if prepared.body["messages"][0]["content"] == "slow":
                gate.wait(10)
            return original(prepared, workspace, name, when)

        monkeypatch.setattr(server, "_process", slow_for_one_key)

        def slow_call():
            with anthropic.Anthropic(base_url=server.base_url, api_key="sk-ant-slow", max_retries=0) as c:
                return c.messages.create(**{**messages_body(), "messages": [{"role": "user", "content": "slow"}]})

        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(slow_call)
            t = time.monotonic()
            with anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0) as client:
                for _ in range(3):
                    client.messages.create(**messages_body())
            fast = time.monotonic() - t
            gate.set()
            assert pending.result(timeout=10).content[0].text == "(simulated reply)"
        assert fast < 5


def test_server_forgets_the_least_recently_used_workspace():
    with pc.SimulatorServer(max_workspaces=2) as server:
        def create(key: str, seconds: float):
            with anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0) as c:
                return c.messages.create(**messages_body(), extra_headers=at(seconds)).usage

        assert create("sk-a", 0).cache_creation_input_tokens > 0
        create("sk-b", 1)
        assert create("sk-a", 2).cache_read_input_tokens > 0  # a is now the most recently used
        create("sk-c", 3)  # evicts b
        assert server.workspaces == 2
        assert create("sk-a", 4).cache_read_input_tokens > 0
        assert create("sk-b", 5).cache_read_input_tokens == 0  # b's cache was forgotten


def test_server_cli_listening_line_is_flushed_through_a_pipe():
    proc = subprocess.Popen([sys.executable, "-m", "promptcache_nb.cli", "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert "listening on http://127.0.0.1:" in proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
