"""The recording proxy never writes a key it can recognise: by name in the query string whatever the separator, and
by value (Anthropic, OpenAI, Google keys, bearer tokens, JWTs) anywhere in the URL — path, query, fragment,
percent-encoded; inside bodies with ``redact_bodies`` / ``--redact-bodies``. Real loopback HTTP: raw requests
through the proxy to SimulatorServer, then the log file, the Python log records and the upstream's view."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anthropic
import pytest
from _harness import fake_keys

import promptcache_nb as pc
from promptcache_nb.live.proxy import KEY_PATTERNS, RecordingProxy, redact_json, redact_url

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
KEYS = fake_keys("DISTINCTIVE")
ANT, OAI, OAI_LEGACY, GOOGLE = KEYS["anthropic"], KEYS["openai"], KEYS["openai legacy"], KEYS["google"]
BEARER, JWT = KEYS["bearer"], KEYS["jwt"]
MODEL = "claude-sonnet-4-5"


@pytest.fixture(scope="module")
def api():
    with pc.SimulatorServer() as server:
        yield server


def raw_get(url: str, target: str) -> bytes:
    """A request whose target is sent byte for byte (an SDK would encode or drop a fragment or a ';')."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# (the cases and more) target, what the logged url keeps
CASES = [
    (f"/v1/models?beta=true;key={ANT}", "beta=true"),                  # ';' instead of '&'
    (f"/v1/models?{ANT}", "/v1/models"),                               # a bare value
    (f"/v1/models?beta=true?x={ANT}", "beta=true"),                    # a second '?'
    (f"/v1/models?beta=true#{ANT}", "beta=true"),                      # after '#'
    (f"/v1/{ANT}/models", "/v1/"),                                     # a path segment
    (f"/v1/models?api_key={OAI}&beta=true", "beta=true"),              # by name, '&' (already held)
    (f"/v1/models?q={OAI_LEGACY}", "q="),
    (f"/v1/models?g={GOOGLE}", "g="),
    (f"/v1/models?h=Bearer%20{BEARER}", "h="),                         # percent-encoded space
    (f"/v1/models?h=Bearer+{BEARER}", "h="),
    (f"/v1/models?t={JWT}", "t="),
    ("/v1/models?k=" + "".join(f"%{b:02X}" for b in ANT.encode()), "k="),  # every byte percent-encoded
    (f"/v1/models;{ANT}", "/v1/models"),
    (f"/v1/models?a,{ANT}", "a,"),
]


def test_keys_in_any_url_component_never_reach_the_log(api, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    log_path = tmp_path / "calls.jsonl"
    with RecordingProxy(api.base_url, log_path) as proxy:
        for target, _ in CASES:
            raw_get(proxy.url, target)
    logged = log_path.read_text()
    lines = [json.loads(line) for line in logged.splitlines()]
    assert len(lines) == len(CASES)
    for line, (target, kept) in zip(lines, CASES, strict=True):
        assert kept in line["url"], (target, line["url"])
        assert "DISTINCTIVE" not in line["url"] + line["path"], (target, line["url"], line["path"])
    assert lines[4]["path"] == "/v1/[redacted]/models"
    # the proxy's and httpx's log records (the upstream's own records are the upstream's business)
    records = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("promptcache_nb.server"))
    assert "HTTP Request: GET" in records  # httpx's line for each upstream call, filtered
    for secret in ("DISTINCTIVE", "Zx9D", "%73%6B"):
        assert secret not in logged, secret
        assert secret not in records, secret


def test_a_key_in_a_body_is_logged_unless_redact_bodies(api, tmp_path):
    body = {"model": MODEL, "max_tokens": 16, "metadata": {"user_id": ANT},
            "messages": [{"role": "user", "content": f"my keys: {OAI} and {GOOGLE}; the task-0123456789abcdefghij"}]}
    logs = {}
    for redact in (False, True):
        log_path = tmp_path / f"calls-{redact}.jsonl"
        with RecordingProxy(api.base_url, log_path, redact_bodies=redact) as proxy, \
                anthropic.Anthropic(base_url=proxy.url, api_key="local", max_retries=0) as client:
            client.messages.create(**body)
            with client.messages.stream(**body) as stream:
                stream.until_done()
        logs[redact] = log_path.read_text()
    assert ANT in logs[False]  # documented: bodies are logged as sent by default
    assert "DISTINCTIVE" not in logs[True]
    first, streamed = (json.loads(line) for line in logs[True].splitlines())
    assert first["request"]["metadata"]["user_id"] == "[redacted]"
    assert first["request"]["messages"][0]["content"] == (
        "my keys: [redacted] and [redacted]; the task-0123456789abcdefghij")  # a word holding "sk-" is kept
    assert first["usage"]["input_tokens"] > 0 and streamed["sse"] and streamed["usage"]["output_tokens"] > 0


def test_cli_redact_bodies_flag(api, tmp_path):
    log_path = tmp_path / "cli.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "promptcache_nb.cli", "proxy", "--upstream", api.base_url, "--log", str(log_path),
         "--port", "0", "--redact-bodies"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = proc.stdout.readline().split("listening on ", 1)[1].split()[0]
        with anthropic.Anthropic(base_url=url, api_key="local", max_retries=0) as client:
            client.messages.create(model=MODEL, max_tokens=16, metadata={"user_id": ANT},
                                   messages=[{"role": "user", "content": "hi"}])
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    (line,) = (json.loads(x) for x in log_path.read_text().splitlines())
    assert line["request"]["metadata"] == {"user_id": "[redacted]"}


@pytest.mark.parametrize(("what", "example"), [
    ("Anthropic", ANT), ("OpenAI", OAI), ("OpenAI", OAI_LEGACY), ("Google", GOOGLE), ("bearer", f"Bearer {BEARER}"),
    ("JSON Web Token", JWT)])
def test_every_documented_pattern_is_recognised(what, example):
    assert any(what in name for name, _ in KEY_PATTERNS)
    assert redact_json({"a": [f"x {example} y"]}) == {"a": ["x [redacted] y"]}
    assert "DISTINCTIVE" not in redact_url(f"https://h/p?{example.replace(' ', '%20')}")


def test_ordinary_urls_and_text_are_untouched():
    for url in ("https://api.anthropic.com/v1/messages?beta=true", "https://h/v1/chat/completions",
                "https://h/v1/models/claude-sonnet-4-5?limit=20&after_id=abc", "https://h/desk-0123456789abcdefghijk"):
        assert redact_url(url) == url
    text = {"content": "Ask the desk-0123456789abcdefghij team; Bearer of bad news"}
    assert redact_json(json.loads(json.dumps(text))) == text
