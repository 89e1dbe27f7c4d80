"""Issue 41: a key never leaves through a URL. The recording proxy's repr and its line for an upstream 404 that
echoes the path, a capture whose SDK base_url path holds a key (our simulator's log record and 404 text, the SDK
exception, ``cap.calls`` / ``cap.df()``), keys as ``;key=`` / ``#key=`` / a path segment ``key=`` and Gemini's
``?key=``: one function, :func:`promptcache_nb._redact.redact_url`, shows every URL. Real loopback HTTP."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import anthropic
import pytest
from _harness import fake_keys

import promptcache_nb as pc
from promptcache_nb._redact import redact_url, scrub, url_secrets
from promptcache_nb.live.proxy import RecordingProxy

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

KEYS = fake_keys("URLPATH")
ANT, GOOGLE = KEYS["anthropic"], KEYS["google"]
#: a secret no pattern recognises: only its name (key, token...) says what it is
PLAIN = "hunter2-URLPATH-plain"
MODEL = "claude-sonnet-4-5"


@pytest.fixture(scope="module")
def api():
    with pc.SimulatorServer() as server:
        yield server


def _raw_get(url: str, target: str) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# -- the one function -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("url", "shown"), [
    (f"https://gw.example/v1/models;key={PLAIN}", "https://gw.example/v1/models;key=[redacted]"),
    (f"https://gw.example/v1/models;api_key={PLAIN}/x", "https://gw.example/v1/models;api_key=[redacted]/x"),
    (f"https://gw.example/v1/key={PLAIN}/messages", "https://gw.example/v1/key=[redacted]/messages"),
    (f"https://gw.example/v1/models#key={PLAIN}", "https://gw.example/v1/models"),
    (f"https://gw.example/v1/models#access_token={PLAIN}&x=1", "https://gw.example/v1/models#x=1"),
    (f"https://gw.example/v1/models;key={PLAIN}?beta=true", "https://gw.example/v1/models;key=[redacted]?beta=true"),
    (f"https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent"
     f"?alt=sse&key={GOOGLE}",
     "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"),
    (f"https://gw.example/v1beta/models/gemini-2.5-flash:generateContent?key={PLAIN}",
     "https://gw.example/v1beta/models/gemini-2.5-flash:generateContent"),
    (f"https://user:{PLAIN}@gw.example/v1", "https://gw.example/v1"),
    (f"https://gw.example/{ANT}/v1/messages", "https://gw.example/[redacted]/v1/messages"),
], ids=["semicolon", "semicolon-mid", "segment", "fragment", "fragment-kept", "semicolon-query", "gemini",
        "gemini-plain", "userinfo", "upstream-prefix"])
def test_redact_url_removes_each_form_and_url_secrets_names_it(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "URLPATH" not in shown
    secrets = url_secrets(url)
    assert secrets and all("URLPATH" in s for s in secrets)
    echoed = f"404: {url} not found; {url.split('//', 1)[1]}"
    assert "URLPATH" not in scrub(echoed, secrets)


def test_ordinary_paths_are_shown_as_they_are() -> None:
    for url in ("/v1/messages", "https://api.anthropic.com/v1/messages?beta=true",
                "https://h/v1beta/models/gemini-2.5-flash:generateContent?alt=sse",
                "https://h/v1/models;rev=3/x", "https://h/a=b/c#section-2", "https://h:8080/v1/rev=1"):
        assert redact_url(url) == url
        assert url_secrets(url) == []


# -- the recording proxy ----------------------------------------------------------------------------------------
def test_a_proxy_upstream_with_a_key_in_its_path(api: Any, tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    log_path = tmp_path / "calls.jsonl"
    proxy = RecordingProxy(f"{api.base_url}/{ANT}", log_path)
    assert "URLPATH" not in repr(proxy) and "URLPATH" not in proxy.upstream
    assert proxy.upstream == f"{api.base_url}/[redacted]"
    with proxy:
        assert "URLPATH" not in repr(proxy)
        answer = _raw_get(proxy.url, f"/v1/messages;key={PLAIN}?beta=true#token={PLAIN}")
        with anthropic.Anthropic(base_url=proxy.url, api_key="local", max_retries=0) as client, \
                pytest.raises(anthropic.NotFoundError) as caught:
            client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    # the simulator answered 404 naming the path it saw (ours, redacted at the source) ...
    assert b"404" in answer.split(b"\r\n", 1)[0] and b"URLPATH" not in answer
    assert "URLPATH" not in repr(caught.value) + str(caught.value)
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [x["status"] for x in lines] == [404, 404]
    assert lines[0]["url"] == f"{api.base_url}/[redacted]/v1/messages;key=[redacted]?beta=true"
    assert lines[1]["url"] == f"{api.base_url}/[redacted]/v1/messages"
    assert "URLPATH" not in log_path.read_text()
    records = "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP Request: GET" in records and "URLPATH" not in records


def test_an_upstream_that_echoes_the_whole_url_is_scrubbed(tmp_path: Path) -> None:
    """A gateway whose 404 body repeats the URL it was called with, key and all (not our simulator)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from promptcache_nb.live._asgi import ServerThread

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"error": {"message": f"no route for {request.url}"}}, status_code=404)

    app = Starlette(routes=[Route("/{rest:path}", echo, methods=["GET", "POST"])])
    server = ServerThread(app, host="127.0.0.1", port=0, name="echo-gw", header_timeout=10)
    server.start()
    try:
        log_path = tmp_path / "calls.jsonl"
        upstream = f"http://127.0.0.1:{server.port}/{ANT}"
        with RecordingProxy(upstream, log_path) as proxy:
            answer = _raw_get(proxy.url, f"/v1/models;key={PLAIN}?key={GOOGLE}")
    finally:
        server.stop()
    assert b"URLPATH" in answer  # the client sees the upstream's answer as it came ...
    (line,) = (json.loads(x) for x in log_path.read_text().splitlines())
    assert line["status"] == 404
    assert line["response"]["error"]["message"].startswith("no route for http://127.0.0.1:")
    assert "URLPATH" not in log_path.read_text()  # ... the log never keeps the key


def test_a_proxy_error_naming_an_unreachable_upstream_keeps_no_key(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    log_path = tmp_path / "calls.jsonl"
    with RecordingProxy(f"http://127.0.0.1:{port}/{ANT}/gw;token={PLAIN}", log_path) as proxy:
        answer = _raw_get(proxy.url, "/v1/messages")
    assert b" 502 " in answer.split(b"\r\n", 1)[0] and b"URLPATH" not in answer
    (line,) = (json.loads(x) for x in log_path.read_text().splitlines())
    assert "unreachable" in line["error"] and "URLPATH" not in log_path.read_text()


# -- capture: a key in the SDK's base_url path -------------------------------------------------------------------
def test_a_capture_whose_base_url_holds_a_key_shows_it_nowhere(api: Any, tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    with pc.Lab(tmp_path / "r.duckdb", progress=False) as lab, \
            anthropic.Anthropic(base_url=f"{api.base_url}/{ANT};key={PLAIN}", api_key="local",
                                max_retries=0) as client:
        with lab.capture(client) as cap, pytest.raises(anthropic.NotFoundError) as caught:
            client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        shown = [repr(caught.value), str(caught.value), repr(cap.calls), cap.df().to_csv(), repr(cap)]
        stored = lab.sql("SELECT * FROM turns").to_csv()
    (call,) = cap.calls
    assert call.status == 404 and not call.stored
    assert call.path == "/[redacted];key=[redacted]/v1/messages"
    assert "not found" in str(caught.value)
    records = "\n".join(r.getMessage() for r in caplog.records)  # ours, the SDK's, httpx's and uvicorn's
    assert "/[redacted];key=[redacted]/v1/messages -> 404" in records  # the simulator's DEBUG record
    assert "HTTP Request: POST" in records
    for text in (*shown, records, stored):
        assert "URLPATH" not in text


def test_a_live_backend_base_url_with_a_key_is_shown_redacted(api: Any) -> None:
    from promptcache_nb.live.anthropic_backend import AnthropicBackend

    client = anthropic.Anthropic(base_url=f"{api.base_url}/{ANT}", api_key="local", max_retries=0)
    backend = AnthropicBackend(client=client)
    assert backend.base_url == f"{api.base_url}/[redacted]"
    assert "URLPATH" not in repr(backend)
    client.close()
