"""The simulator endpoint and the recording proxy under load: 8 clients × 25 requests at once (SDK calls, streams,
malformed JSON, wrong methods and paths, bodies over the limit) while slow clients hold requests that never
finish. Every answer is the right one, the slow requests are timed out without stalling anyone, the proxy writes
one intact log line per call, and both bind 127.0.0.1 by default. ``benchmarks/bench_reliability.py`` runs
8 × 200 and a 50 MB body.

(``tests/test_proxy.py`` checks each of these behaviours one at a time; here they happen together.)
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from _harness import MIX, run_load

import promptcache_nb as pc

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

THREADS, PER_THREAD = 8, 25
LIMIT = 64 * 1024  # a small body limit, so over-the-limit bodies are cheap to send
TIMEOUT = 1.0
SLOW = 4  # clients holding a request that never finishes


def _check(report) -> None:
    assert report.total == THREADS * PER_THREAD
    assert not report.errors, report.errors[:10]
    assert set(report.sent) == set(MIX)  # every kind was exercised


def test_server_under_load_answers_everyone_correctly():
    with pc.SimulatorServer(max_body_bytes=LIMIT, request_timeout=TIMEOUT) as server:
        assert server._server._sock.getsockname()[0] == "127.0.0.1"
        report = run_load(server.base_url, threads=THREADS, per_thread=PER_THREAD, max_body_bytes=LIMIT,
                          request_timeout=TIMEOUT, slow=SLOW, seed=1)
        _check(report)
        statuses = Counter(r.status for r in server.requests)
        assert statuses[200] == report.sent["messages"] + report.sent["stream"]
        assert statuses[413] == report.sent["oversized"]
        assert server.workspaces == THREADS


def test_proxy_under_load_answers_and_logs_every_call(tmp_path):
    log = tmp_path / "calls.jsonl"
    with pc.SimulatorServer(request_timeout=TIMEOUT) as server, \
            pc.RecordingProxy(server.base_url, log, max_body_bytes=LIMIT, request_timeout=TIMEOUT) as proxy:
        assert proxy.host == "127.0.0.1" and proxy._server._sock.getsockname()[0] == "127.0.0.1"
        report = run_load(proxy.url, threads=THREADS, per_thread=PER_THREAD, max_body_bytes=LIMIT,
                          request_timeout=TIMEOUT, slow=SLOW, seed=2)
        _check(report)
        upstream = Counter(r.status for r in server.requests)
    raw = log.read_bytes()
    assert raw.endswith(b"\n")
    lines = [json.loads(line) for line in raw.splitlines()]  # concurrent appends never interleave
    timed_out = [line for line in lines if "not received within" in (line.get("error") or "")]
    assert len(timed_out) == SLOW // 2  # the slow clients that got as far as a body; the others sent no request
    assert len(lines) == report.total + len(timed_out) == proxy.recorded
    logged = Counter(line["status"] for line in lines)
    assert logged[200] == upstream[200] == report.sent["messages"] + report.sent["stream"]
    assert logged[None] == report.sent["oversized"] + len(timed_out)  # refused by the proxy, never forwarded
    assert 413 not in upstream
