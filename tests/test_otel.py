"""pc.live.OtlpReceiver and `promptcache-nb otel`: agents' OTLP exports over real HTTP on loopback become requests
with measured usage in a real store, one transaction per export; bad payloads are refused whole."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

import promptcache_nb as pc
from promptcache_nb.widgets import MonitorController

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "otel"
SECRET = "sk-ant-api03-" + "otelHeaderSecret" + "0123456789abcdef"  # built here: no key-shaped literal in the tree

#: (fixture, signal, [(agent session id, model, uncached, read, write, output, reasoning)]), by each agent's
#: documented arithmetic (importers/otlp.py): Claude Code's input_tokens is already uncached; Codex and Gemini CLI
#: count cached tokens inside the input; Gemini's thoughts are billed as output; GenAI spans include read and write
#: in gen_ai.usage.input_tokens (current and deprecated names alike); Gemini's gen_ai event and the invoke_agent span
#: are not requests.
EXPECTED = {
    "claude_code_logs.json": ("logs", [
        ("9d4f6c1e-2b7a-4e38-a1c5-7f0e3d92b6aa", "claude-sonnet-4-5-20250929", 4, 0, 21874, 311, None),
        ("9d4f6c1e-2b7a-4e38-a1c5-7f0e3d92b6aa", "claude-sonnet-4-5-20250929", 6, 21874, 1536, 188, None),
        ("9d4f6c1e-2b7a-4e38-a1c5-7f0e3d92b6aa", "claude-haiku-4-5-20251001", 412, 0, 0, 37, None),
        ("e21c8b40-5f3d-4a96-b7e2-1d9c0a4f8e35", "claude-sonnet-4-5-20250929", 3, 21874, 0, 94, None)]),
    "codex_logs.json": ("logs", [
        ("019a5c3e-7b21-7d40-a9f6-2c81e0b4d573", "gpt-5-codex", 14210, 0, 0, 906, 640),
        ("019a5c3e-7b21-7d40-a9f6-2c81e0b4d573", "gpt-5-codex", 15388 - 14080, 14080, 0, 233, 128)]),
    "gemini_cli_logs.json": ("logs", [
        ("5c0e8a13-6f2b-4d79-b1a4-93e7d20c6f58", "gemini-2.5-pro", 9875, 0, 0, 412 + 1024, 1024),
        ("5c0e8a13-6f2b-4d79-b1a4-93e7d20c6f58", "gemini-2.5-pro", 11402 - 9421, 9421, 0, 156 + 288, 288)]),
    "genai_traces.json": ("traces", [
        ("conv_7c1e0b9a", "claude-sonnet-4-5", 8210 - 8192, 0, 8192, 250, None),
        ("conv_7c1e0b9a", "claude-sonnet-4-5", 8590 - 8192 - 371, 8192, 371, 152, None)]),
    "genai_logs.json": ("logs", [("thread_5Yq1", "gpt-4.1-mini", 3120 - 2944, 2944, 0, 88, None)]),
}
USAGE_SQL = """SELECT s.config, t.model, t.input_tokens, t.cache_read_input_tokens, t.cache_creation_input_tokens,
                      t.output_tokens, t.reasoning_tokens, t.usage_source
               FROM turns t JOIN sessions s ON s.id = t.session_id ORDER BY t.sent_at, t.session_id"""


def post(url: str, body: bytes, *, content_type: str = "application/json", encoding: str | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    head = {"Content-Type": content_type, **(headers or {})}
    if encoding:
        head["Content-Encoding"] = encoding
    request = urllib.request.Request(url, data=body, headers=head, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read(), r.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("content-type", "")


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def stored_usage(lab: pc.Lab) -> list[tuple[Any, ...]]:
    rows = lab.sql(USAGE_SQL).to_dict("records")
    return [(json.loads(r["config"])["session_key"], r["model"], r["input_tokens"], r["cache_read_input_tokens"],
             r["cache_creation_input_tokens"], r["output_tokens"],
             None if r["reasoning_tokens"] != r["reasoning_tokens"] or r["reasoning_tokens"] is None
             else int(r["reasoning_tokens"]), r["usage_source"]) for r in rows]


def counts(lab: pc.Lab) -> tuple[int, int]:
    row = lab.sql("SELECT (SELECT count(*) FROM turns) AS t, (SELECT count(*) FROM sessions) AS s").iloc[0]
    return int(row.t), int(row.s)


def to_protobuf(doc: dict[str, Any], message: Any) -> bytes:
    """The export as its exporter sends it over http/protobuf (ids as bytes: base64 in protobuf's JSON mapping)."""
    doc = copy.deepcopy(doc)
    for rs in doc.get("resourceSpans", []):
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    for rl in doc.get("resourceLogs", []):
        for sl in rl["scopeLogs"]:
            for rec in sl["logRecords"]:
                for key in ("traceId", "spanId"):
                    if key in rec:
                        rec[key] = base64.b64encode(bytes.fromhex(rec[key])).decode()
    return bytes(json_format.ParseDict(doc, message()).SerializeToString())


@pytest.fixture
def lab():
    with pc.Lab(progress=False) as lab:
        yield lab


@pytest.fixture
def otel(lab, tmp_path):
    with pc.live.OtlpReceiver(lab, spool=tmp_path / "spool") as receiver:
        yield receiver


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_agents_export_lands_with_its_measured_usage(otel, lab, name):
    sig, expected = EXPECTED[name]
    batches: list[pc.live.OtlpBatch] = []
    otel.subscribe(batches.append)
    status, body, ctype = post(f"{otel.url}/v1/{sig}", fixture(name))
    assert (status, json.loads(body), ctype) == (200, {}, "application/json")
    assert stored_usage(lab) == [(*row, "imported") for row in expected]
    (batch,) = batches
    assert (batch.requests, batch.stored, batch.rejected) == (len(expected), len(expected), 0)
    assert len(batch.session_ids) == len({row[0] for row in expected})  # a session per agent session id
    assert [r["input_tokens"] for r in batch.rows] == [row[2] for row in expected]


@pytest.mark.parametrize("name", ["claude_code_logs.json", "genai_traces.json"])
def test_protobuf_and_gzip_bodies_store_what_json_does(lab, tmp_path, name):
    sig = EXPECTED[name][0]
    message = logs_service_pb2.ExportLogsServiceRequest if sig == "logs" else trace_service_pb2.ExportTraceServiceRequest
    raw = to_protobuf(json.loads(fixture(name)), message)
    with pc.Lab(progress=False) as other, pc.live.OtlpReceiver(other, spool=tmp_path / "a") as proto, \
            pc.live.OtlpReceiver(lab, spool=tmp_path / "b") as zipped:
        status, body, ctype = post(f"{proto.url}/v1/{sig}", raw, content_type="application/x-protobuf")
        assert (status, body, ctype) == (200, b"", "application/x-protobuf")  # an empty Export*ServiceResponse
        assert post(f"{zipped.url}/v1/{sig}", gzip.compress(fixture(name)), encoding="gzip")[0] == 200
        want = [(*row, "imported") for row in EXPECTED[name][1]]
        assert stored_usage(other) == want and stored_usage(lab) == want


def test_a_retried_export_is_stored_once_and_a_session_grows(otel, lab):
    batches: list[pc.live.OtlpBatch] = []
    otel.subscribe(batches.append)
    doc = json.loads(fixture("claude_code_logs.json"))
    for _ in range(2):
        assert post(f"{otel.url}/v1/logs", json.dumps(doc).encode())[0] == 200
    assert [(b.stored, b.duplicates) for b in batches] == [(4, 0), (0, 4)]
    assert "4 already stored" in batches[1].line()
    later = _later_call(doc, seconds=60, read=23410, write=0)
    assert post(f"{otel.url}/v1/logs", json.dumps(later).encode())[0] == 200
    assert batches[-1].stored == 1 and counts(lab) == (5, 2)
    assert [r["idx"] for r in batches[-1].rows] == [3]  # appended to the agent's session


def _later_call(doc: dict[str, Any], *, seconds: float, read: int, write: int) -> dict[str, Any]:
    """The export of one more api_request of the fixture's first session, ``seconds`` after its last one."""
    out = copy.deepcopy(doc)
    records = out["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    last = copy.deepcopy(next(r for r in records if r["body"]["stringValue"] == "claude_code.api_request"))
    attrs = {a["key"]: a for a in last["attributes"]}
    at = datetime(2026, 11, 3, 14, 2, 11, tzinfo=UTC) + timedelta(seconds=seconds)
    attrs["event.timestamp"]["value"]["stringValue"] = at.isoformat().replace("+00:00", "Z")
    attrs["event.sequence"]["value"]["stringValue"] = str(100 + int(seconds))
    attrs["cache_read_tokens"]["value"]["stringValue"] = str(read)
    attrs["cache_creation_tokens"]["value"]["stringValue"] = str(write)
    out["resourceLogs"][0]["scopeLogs"][0]["logRecords"] = [last]
    return out


BAD = [
    ("invalid JSON", b'{"resourceLogs": [', "application/json", None, 400, "not valid JSON (line 1"),
    ("wrong shape", b'{"resourceLogs": 5}', "application/json", None, 400, "expected an object with a 'resourceLogs'"),
    ("not a resource", b'{"resourceLogs": [7]}', "application/json", None, 400, "resourceLogs[0] is not an object"),
    ("bad protobuf", b"not a protobuf message", "application/x-protobuf", None, 400, "not a protobuf"),
    ("bad gzip", b"plain text, not gzip", "application/json", "gzip", 400, "not valid gzip"),
    ("cut gzip", gzip.compress(b"{}" * 100)[:12], "application/json", "gzip", 400, "gzip body is truncated"),
    ("unknown encoding", b"{}", "application/json", "br", 400, "Content-Encoding 'br' is not supported"),
    ("not OTLP at all", b"hello", "text/plain", None, 415, "Content-Type 'text/plain'"),
]


@pytest.mark.parametrize(("what", "body", "ctype", "encoding", "status", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_malformed_export_gets_one_line_and_stores_nothing(otel, lab, what, body, ctype, encoding, status, says):
    assert post(f"{otel.url}/v1/logs", fixture("codex_logs.json"))[0] == 200
    before, spool = counts(lab), otel.spool_path.read_bytes()
    got, reply, _ = post(f"{otel.url}/v1/logs", body, content_type=ctype, encoding=encoding)
    message = json.loads(reply)["message"]
    assert got == status and says in message and "\n" not in message
    assert counts(lab) == before and otel.spool_path.read_bytes() == spool


def test_an_oversized_export_gets_413_compressed_or_not(lab, tmp_path):
    with pc.live.OtlpReceiver(lab, spool=tmp_path, max_body_bytes=4096) as otel:
        status, reply, _ = post(f"{otel.url}/v1/logs", fixture("claude_code_logs.json"))  # 12 KB
        assert status == 413 and "exceeds the limit of 4096 bytes" in json.loads(reply)["message"]
        bomb = gzip.compress(b" " * 1_000_000)  # 1 KB on the wire, 1 MB inside
        status, reply, _ = post(f"{otel.url}/v1/logs", bomb, encoding="gzip")
        assert status == 413 and "decompresses to more than" in json.loads(reply)["message"]
        assert counts(lab) == (0, 0) and otel.spool_path.read_bytes() == b""


def test_an_export_whose_store_fails_leaves_nothing_behind(tmp_path):
    path = tmp_path / "s.duckdb"
    lab = pc.Lab(path, progress=False)
    otel = pc.live.OtlpReceiver(lab, spool=tmp_path / "spool").start()
    try:
        assert post(f"{otel.url}/v1/logs", fixture("codex_logs.json"))[0] == 200
        spool = otel.spool_path.read_bytes()
        lab.close()  # the store goes away under the receiver: the next export cannot be stored
        status, reply, _ = post(f"{otel.url}/v1/logs", fixture("claude_code_logs.json"))
        assert status == 500 and "could not be stored" in json.loads(reply)["message"]
        assert otel.spool_path.read_bytes() == spool  # its spool line removed
    finally:
        otel.close()
    with pc.Lab(path, progress=False) as again:
        assert counts(again) == (2, 1)


def test_a_record_that_cannot_be_read_is_rejected_and_the_rest_stored(otel, lab):
    doc = json.loads(fixture("gemini_cli_logs.json"))
    response = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][1]
    for a in response["attributes"]:
        if a["key"] == "cached_content_token_count":
            a["value"] = {"intValue": "99999"}  # more cached than the whole prompt
    status, body, _ = post(f"{otel.url}/v1/logs", json.dumps(doc).encode())
    answer = json.loads(body)["partialSuccess"]
    assert status == 200 and answer["rejectedLogRecords"] == "1"
    assert "cached_content_token_count (99999) exceeds input_token_count (9875)" in answer["errorMessage"]
    assert counts(lab) == (1, 1)


def test_metrics_are_answered_and_not_stored(otel, lab):
    batches: list[pc.live.OtlpBatch] = []
    otel.subscribe(batches.append)
    point = {"asDouble": 1520, "timeUnixNano": "1793800000000000000",
             "attributes": [{"key": "type", "value": {"stringValue": "cacheRead"}}]}
    doc = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "claude_code.token.usage", "unit": "tokens",
                                                              "sum": {"dataPoints": [point, point]}}]}]}]}
    assert post(f"{otel.url}/v1/metrics", json.dumps(doc).encode())[:2] == (200, b"{}")
    assert counts(lab) == (0, 0) and batches[0].items == 2 and "not stored" in batches[0].line()


def test_an_export_posted_to_the_root_is_taken_by_its_top_level_list(otel, lab):
    assert post(f"{otel.url}/", fixture("gemini_cli_logs.json"))[0] == 200
    assert counts(lab) == (2, 1)
    status, reply, _ = post(f"{otel.url}/", b"\x0a\x00", content_type="application/x-protobuf")
    assert status == 400 and "/v1/logs" in json.loads(reply)["message"]


def test_no_header_value_is_stored_logged_or_spooled(otel, lab, caplog):
    caplog.set_level(logging.DEBUG)
    headers = {"Authorization": f"Bearer {SECRET}", "x-api-key": SECRET}
    assert post(f"{otel.url}/v1/logs", fixture("claude_code_logs.json"), headers=headers)[0] == 200
    assert post(f"{otel.url}/v1/logs", b"{", headers=headers)[0] == 400
    everything = (lab.sql("SELECT * FROM turns").to_json(date_format="iso")
                  + lab.sql("SELECT * FROM sessions").to_json(date_format="iso"))
    assert SECRET not in everything and SECRET not in caplog.text
    assert SECRET not in otel.spool_path.read_text()


def test_it_binds_loopback_unless_told_otherwise(lab, tmp_path, caplog):
    with pc.live.OtlpReceiver(lab, spool=tmp_path) as otel:
        assert otel.url.startswith("http://127.0.0.1:")
        outside = [a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
                   if not a[4][0].startswith("127.")]
        for address in outside:  # the port is not reachable from another interface
            with pytest.raises(OSError), socket.create_connection((address, otel.port), timeout=2):
                pass
    with caplog.at_level(logging.WARNING), pc.live.OtlpReceiver(lab, host="0.0.0.0", spool=tmp_path):
        assert "listens on 0.0.0.0" in caplog.text


def test_analysing_a_received_session_reads_its_spool_and_keeps_its_measured_rows(otel, lab):
    for name in EXPECTED:
        assert post(f"{otel.url}/v1/{EXPECTED[name][0]}", fixture(name))[0] == 200
    before = stored_usage(lab)
    assert lab.analyze(progress=False) == 6  # every session, its bodies read again from the spool
    assert stored_usage(lab) == before
    with pc.Lab(progress=False) as other:  # the spool is an OTLP JSON Lines log like any other
        other.import_log(otel.spool_path)
        assert stored_usage(other) == before


def test_the_file_importer_reads_the_same_exports(lab):
    res = lab.import_log(sorted(FIXTURES.glob("*.json")))
    want = sorted((*row, "imported") for _, rows in EXPECTED.values() for row in rows)
    assert res.skipped.empty and sorted(stored_usage(lab)) == want


def test_the_monitor_follows_the_receiver_as_exports_arrive(otel, lab):
    ctl = MonitorController(otel)
    seen: list[str] = []
    ctl.subscribe(seen.append)
    assert ctl.n_requests == 0 and "no request yet" in ctl.html() and otel.url in ctl.html()
    assert post(f"{otel.url}/v1/logs", fixture("claude_code_logs.json"))[0] == 200
    assert ctl.n_requests == 4 and seen == ["turn"]
    df = lab.sql("SELECT * FROM turns")
    prompt = (df.input_tokens + df.cache_read_input_tokens + df.cache_creation_input_tokens).sum()
    assert ctl.read_pct == pytest.approx(df.cache_read_input_tokens.sum() * 100 / prompt)
    assert ctl.saved_usd == pytest.approx((df.cost_no_cache_usd - df.cost_usd).sum())
    assert post(f"{otel.url}/v1/logs", fixture("codex_logs.json"))[0] == 200
    assert ctl.n_requests == 6 and seen == ["turn", "turn"]
    html = ctl.html()
    assert '<span data-field="requests">6</span>' in html and "019a5c3e-7b21-7d40-a9f6-2c81e0b4d573" not in html
    assert "14,080" in html  # the latest request's measured cache read
    ctl.close()
    assert post(f"{otel.url}/v1/logs", fixture("gemini_cli_logs.json"))[0] == 200
    assert ctl.n_requests == 6  # closed: no longer following


def test_a_monitor_over_an_open_session_follows_it_through_the_receiver(otel, lab):
    doc = json.loads(fixture("claude_code_logs.json"))
    assert post(f"{otel.url}/v1/logs", json.dumps(doc).encode())[0] == 200
    (sid,) = [b for b in lab.sql("SELECT session_id FROM turns WHERE idx = 2").session_id]
    session = lab.open_session(sid)  # analysed now (its bodies from the spool): later requests are recorded
    ctl = MonitorController(session)
    assert ctl.n_requests == 3
    assert post(f"{otel.url}/v1/logs", json.dumps(_later_call(doc, seconds=90, read=23410, write=0)).encode())[0] == 200
    assert ctl.n_requests == 4 and ctl.rows[-1]["read"] == 23410
    ctl.close()


def test_the_widget_counts_what_the_receiver_stores(otel):
    monitor = pc.widgets.Monitor(otel)
    assert monitor.requests == 0 and repr(monitor) == f"Monitor(receiver={otel.url!r}, requests=0)"
    assert post(f"{otel.url}/v1/traces", fixture("genai_traces.json"))[0] == 200
    assert monitor.requests == 2
    monitor.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_otel_receives_until_interrupted_and_the_store_holds_the_requests(tmp_path):
    store = tmp_path / "live.duckdb"
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "promptcache_nb.cli", "otel", str(store), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        first = proc.stdout.readline()
        assert f"on http://127.0.0.1:{port}" in first and str(store) in first
        claude = proc.stdout.readline()
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{port}" in claude
        assert "CLAUDE_CODE_ENABLE_TELEMETRY=1" in claude and "OTEL_LOGS_EXPORTER=otlp" in claude
        assert f"GEMINI_TELEMETRY_OTLP_ENDPOINT=http://127.0.0.1:{port}" in proc.stdout.readline()
        assert f'endpoint = "http://127.0.0.1:{port}/v1/logs"' in proc.stdout.readline()
        assert f'pc.widgets.Monitor("http://127.0.0.1:{port}")' in proc.stdout.readline()
        # the notebook's side: the receiver's process holds the store, the widget follows it over loopback
        monitor = pc.widgets.Monitor(f"http://127.0.0.1:{port}")
        monitor.controller.receiver.interval = 0.1
        assert monitor.requests == 0 and "no request yet" in monitor.controller.html()
        status = post(f"http://127.0.0.1:{port}/v1/logs", fixture("claude_code_logs.json"),
                      headers={"Authorization": f"Bearer {SECRET}"})[0]
        assert status == 200
        line = proc.stdout.readline()
        assert "logs: 6 log records, 4 API requests, 4 stored in 2 session(s)" in line
        deadline = time.monotonic() + 20
        while monitor.requests < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert monitor.requests == 4 and monitor.controller.receiver.error is None
        rows = monitor.controller.rows  # the receiver's rows, as it stored them
        assert sorted(r["read"] for r in rows) == sorted(row[3] for row in EXPECTED["claude_code_logs.json"][1])
        monitor.close()
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert SECRET not in out + err
    with pc.Lab(store, read_only=True, progress=False) as lab:
        assert stored_usage(lab) == [(*row, "imported") for row in EXPECTED["claude_code_logs.json"][1]]


def test_a_port_in_use_is_one_error_and_leaves_no_spool(lab, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        receiver = pc.live.OtlpReceiver(lab, port=busy.getsockname()[1], spool=tmp_path / "spool")
        with pytest.raises(pc.errors.PromptCacheError, match=r"cannot listen on 127\.0\.0\.1:\d+ .*--port N"):
            receiver.start()
    assert not (tmp_path / "spool").exists() and not receiver.running


def test_an_export_that_finds_the_labs_connection_busy_gets_503_and_stores_nothing(otel, lab):
    import threading
    import time

    assert post(f"{otel.url}/v1/logs", fixture("codex_logs.json"))[0] == 200
    before, spool = counts(lab), otel.spool_path.read_bytes()
    con = lab.store.con
    started = threading.Event()
    failures: list[str] = []

    def long_query() -> None:  # the notebook's thread, running a long query on the same Lab
        started.set()
        try:
            con.execute("SELECT sum(i * i) FROM range(4000000000) t(i)").fetchall()
        except Exception as exc:  # noqa: BLE001 - interrupted below
            failures.append(type(exc).__name__)

    worker = threading.Thread(target=long_query)
    worker.start()
    started.wait()
    time.sleep(0.3)
    try:
        status, reply, _ = post(f"{otel.url}/v1/logs", fixture("claude_code_logs.json"))
    finally:
        con.interrupt()
        worker.join()
    assert failures, "the long query ended before the export arrived: the test proves nothing"
    assert status == 503 and "busy" in json.loads(reply)["message"]
    assert counts(lab) == before and otel.spool_path.read_bytes() == spool
    assert post(f"{otel.url}/v1/logs", fixture("claude_code_logs.json"))[0] == 200  # the exporter's retry
    assert counts(lab) == (before[0] + 4, before[1] + 2)


def test_a_js_exporters_split_timestamp_reads_as_the_same_time(otel, lab):
    doc = json.loads(fixture("genai_logs.json"))
    record = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    ns = int(record["timeUnixNano"])
    low = ns & 0xFFFFFFFF
    record["timeUnixNano"] = {"low": low - (1 << 32) if low >= 1 << 31 else low, "high": ns >> 32}  # signed halves
    assert post(f"{otel.url}/v1/logs", json.dumps(doc).encode())[0] == 200
    sent = lab.sql("SELECT sent_at FROM turns").sent_at.iloc[0]
    assert sent.to_pydatetime().replace(tzinfo=UTC) == datetime.fromtimestamp(ns // 10**9, UTC).replace(
        microsecond=ns % 10**9 // 1000)


def test_odd_shapes_inside_a_valid_export_never_break_the_receiver(otel, lab):
    deep = '{"arrayValue": {"values": [' * 3000 + '{"stringValue": "x"}' + "]}}" * 3000
    odd = [
        b'{"resourceLogs": [{"scopeLogs": 5}]}',
        b'{"resourceLogs": [{"scopeLogs": [{"logRecords": "abc"}]}]}',
        b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [7, null]}]}]}',
        b'{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"sum": {"dataPoints": 3}}]}]}]}',
        ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"attributes": [{"key": "gen_ai.request.model", "value": '
         + deep + "}]}]}]}]}").encode(),
    ]
    for doc in odd:
        sig = "metrics" if b"resourceMetrics" in doc else "traces" if b"resourceSpans" in doc else "logs"
        status = post(f"{otel.url}/v1/{sig}", doc)[0]
        assert status in (200, 400), (doc[:80], status)
    assert counts(lab) == (0, 0) and post(f"{otel.url}/v1/logs", fixture("codex_logs.json"))[0] == 200


def test_a_follower_reads_what_the_receiver_stored_since_it_started(otel):
    assert post(f"{otel.url}/v1/logs", fixture("codex_logs.json"))[0] == 200  # before: not the follower's
    follower = pc.live.OtlpFollower(otel.url)
    assert follower.poll() == []
    assert post(f"{otel.url}/v1/logs", fixture("claude_code_logs.json"))[0] == 200
    (batch,) = follower.poll()
    assert batch.signal == "logs" and batch.stored == 4 and len(batch.rows) == 4
    assert all(isinstance(r["sent_at"], datetime) for r in batch.rows)
    assert follower.poll() == []  # each export once
    assert urllib.request.urlopen(f"{otel.url}/pcnb/v1/batches?after=0").status == 200
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(f"{otel.url}/pcnb/v1/batches?after=x")
    assert bad.value.code == 400


def test_a_follower_with_no_receiver_is_one_line():
    with pytest.raises(pc.errors.PromptCacheError, match=r"no OTLP receiver answers at http://127\.0\.0\.1:\d+.*"
                                                          r"promptcache-nb otel STORE"):
        pc.live.OtlpFollower(f"http://127.0.0.1:{_free_port()}", timeout=2)
