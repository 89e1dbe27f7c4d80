"""Issue #21, HTTP recordings: nothing dropped as a duplicate, detection past a huge first body, streamed and
server-side-compaction usage counted as the API defines, and Amazon Bedrock calls read.

Cassettes here are written in vcrpy's own shape (``interactions: [{request: {body, headers, method, uri},
response: {body: {string}, headers, status: {code, message}}}]``, keys sorted as vcrpy's YAML serializer writes
them) with traffic invented for these tests; the proxy lines follow ``exchanges.py``'s format.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

import promptcache_nb as pc
from promptcache_nb.readers._http import HttpExchange, convert_exchange
from promptcache_nb.readers._sse import parse_sse, usage_from_sse
from promptcache_nb.readers._types import ImportedRequest, SkippedLine
from promptcache_nb.readers.exchanges import ExchangesReader
from promptcache_nb.readers.har import HarReader
from promptcache_nb.readers.vcr import VcrReader

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "http_exact"
REDACTED_OPENAI = FIXTURES / "crewai_style_redacted_ids_openai.yaml"
REDACTED_ANTHROPIC = FIXTURES / "crewai_style_redacted_ids_anthropic.yaml"
T0 = datetime(2026, 3, 9, 14, 0, tzinfo=UTC)


def requests_of(records: list[Any]) -> list[ImportedRequest]:
    return [r for r in records if isinstance(r, ImportedRequest)]


def skipped_of(records: list[Any]) -> list[SkippedLine]:
    return [r for r in records if isinstance(r, SkippedLine)]


def interaction(uri: str, body: dict | str | bytes, response: dict | str | bytes, *, request_headers: dict | None = None,
                response_headers: dict | None = None) -> dict:
    """One vcrpy interaction (headers map a name to a list of values, as vcrpy records them)."""
    request_body = body if isinstance(body, str | bytes) else json.dumps(body)
    response_body = response if isinstance(response, str | bytes) else json.dumps(response)
    return {
        "request": {"body": request_body, "headers": {k: [v] for k, v in (request_headers or {}).items()},
                    "method": "POST", "uri": uri},
        "response": {"body": {"string": response_body},
                     "headers": {k: [v] for k, v in (response_headers or {"content-type": "application/json"}).items()},
                     "status": {"code": 200, "message": "OK"}},
    }


def write_cassette(path: Path, interactions: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"interactions": interactions, "version": 1}, sort_keys=True,
                                   default_flow_style=False, width=1_000_000), encoding="utf-8")
    return path


# --- 1. dedupe that cannot drop a real request --------------------------------------------------------------


def test_redacted_request_ids_do_not_make_two_calls_one_in_a_cassette() -> None:
    for cassette in (REDACTED_OPENAI, REDACTED_ANTHROPIC):
        reqs = requests_of(list(VcrReader().read(cassette)))
        assert len(reqs) == 2
        assert [r.request_id for r in reqs] == ["REQUEST-ID-XXX"] * 2  # what the cassette says, kept
        keys = [r.dedupe_key for r in reqs]
        assert len(set(keys)) == 2, keys
        assert all(k.startswith(f"{cassette}#interactions[{i}]|") for i, k in enumerate(keys))
        assert keys == [r.dedupe_key for r in requests_of(list(VcrReader().read(cassette)))]  # stable


def test_redacted_request_ids_are_all_stored_on_a_fresh_store_and_once_on_reimport(tmp_path: Path) -> None:
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        res = lab.import_log([REDACTED_OPENAI, REDACTED_ANTHROPIC])
        assert res.requests == 4 and res.already_stored == 0, res.skipped
        by_source = {s.source.split(":", 1)[1]: s for s in res.sessions}
        openai = by_source[str(REDACTED_OPENAI)].turns()
        # the second call is the OpenAI provider-side miss the redacted id used to hide
        assert list(openai.cache_read_input_tokens) == [1920, 0]
        again = lab.import_log([REDACTED_OPENAI, REDACTED_ANTHROPIC])
        assert again.requests == 0 and again.already_stored == 4


def test_a_trustworthy_request_id_stays_the_key_and_a_true_duplicate_is_one_request(tmp_path: Path) -> None:
    call = interaction("https://api.anthropic.com/v1/messages",
                       {"model": "claude-haiku-4-5", "max_tokens": 64,
                        "messages": [{"role": "user", "content": "Status of INC-4411?"}]},
                       {"id": "msg_01Dup", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
                        "content": [{"type": "text", "text": "Mitigated at 14:02."}], "stop_reason": "end_turn",
                        "usage": {"input_tokens": 19, "output_tokens": 9}},
                       response_headers={"content-type": "application/json", "request-id": "req_011CVdup"})
    other = json.loads(json.dumps(call))
    other["response"]["headers"]["request-id"] = ["req_011CVother"]
    path = write_cassette(tmp_path / "dup.yaml", [call, call, other])
    reqs = requests_of(list(VcrReader().read(path)))
    assert [r.dedupe_key for r in reqs] == ["req_011CVdup", "req_011CVdup", "req_011CVother"]


def test_same_file_name_in_two_folders_is_two_sessions(tmp_path: Path) -> None:
    body = {"model": "claude-haiku-4-5", "max_tokens": 32, "messages": [{"role": "user", "content": "ping"}]}
    reply = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5", "content": [],
             "stop_reason": "end_turn", "usage": {"input_tokens": 8, "output_tokens": 1}}
    a = write_cassette(tmp_path / "svc_a" / "cassettes" / "test_ping.yaml",
                       [interaction("https://api.anthropic.com/v1/messages", body, reply)])
    b = write_cassette(tmp_path / "svc_b" / "cassettes" / "test_ping.yaml",
                       [interaction("https://api.anthropic.com/v1/messages", body, reply)])
    (ra,), (rb,) = requests_of(list(VcrReader().read(a))), requests_of(list(VcrReader().read(b)))
    assert ra.session_key != rb.session_key
    with pc.Lab(progress=False) as lab:
        res = lab.import_log([a, b])
        assert res.requests == 2 and len(res.sessions) == 2


def proxy_line(i: int, *, started: datetime, request_id: str | None, question: str, read: int) -> dict:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 512,
            "system": [{"type": "text", "text": "You triage alerts for the payments cluster.",
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": question}]}
    usage = {"input_tokens": 14 + i, "cache_read_input_tokens": read, "cache_creation_input_tokens": 0,
             "output_tokens": 40 + i}
    return {"v": 1, "at": started.isoformat().replace("+00:00", "Z"), "method": "POST",
            "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200,
            "request": body,
            "response": {"id": f"msg_01Triage{i:03d}", "type": "message", "role": "assistant",
                         "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": f"Alert {i}: noise."}],
                         "stop_reason": "end_turn", "usage": usage},
            "usage": usage, "request_id": request_id, "latency_ms": 800.0 + i}


def test_proxy_log_keys_are_per_line_stable_while_it_grows_out_of_order(tmp_path: Path) -> None:
    log = tmp_path / "proxy.jsonl"
    # written in completion order: call 2 started first but finished last; 3 and 4 carry a redacted id, 5 none
    lines = [
        proxy_line(0, started=T0 + timedelta(seconds=5), request_id="req_011CVa0", question="Disk alert on db-3?",
                   read=2048),
        proxy_line(1, started=T0 + timedelta(seconds=7), request_id="req_011CVa1", question="And on db-4?", read=2048),
        proxy_line(2, started=T0, request_id="req_011CVa2", question="Summarise the night.", read=2048),
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    first = {r.source_ref: r.dedupe_key for r in requests_of(list(ExchangesReader().read(log)))}
    assert first == {f"{log}:1": "req_011CVa0", f"{log}:2": "req_011CVa1", f"{log}:3": "req_011CVa2"}
    more = [
        proxy_line(3, started=T0 + timedelta(seconds=2), request_id="REQUEST-ID-XXX", question="Pager noise?",
                   read=2048),
        proxy_line(4, started=T0 + timedelta(seconds=9), request_id="REQUEST-ID-XXX", question="Mute until 9?",
                   read=0),
        proxy_line(5, started=T0 + timedelta(seconds=1), request_id=None, question="Who is on call?", read=2048),
        proxy_line(6, started=T0 + timedelta(seconds=3), request_id="REQUEST-ID-XXX", question="Mute until 9?",
                   read=0),
    ]
    with log.open("a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(x) + "\n" for x in more))
    second = {r.source_ref: r.dedupe_key for r in requests_of(list(ExchangesReader().read(log)))}
    assert {ref: second[ref] for ref in first} == first  # what was keyed before keeps its key
    assert len(set(second.values())) == 7  # no two calls share a key, redacted or missing ids included
    assert second[f"{log}:4"] == "REQUEST-ID-XXX"  # the first use of an id is its key
    assert second == {r.source_ref: r.dedupe_key for r in requests_of(list(ExchangesReader().read(log)))}


def test_proxy_log_with_a_redacted_id_stores_every_call(tmp_path: Path) -> None:
    log = tmp_path / "proxy.jsonl"
    lines = [proxy_line(i, started=T0 + timedelta(seconds=10 * i), request_id="REQUEST-ID-XXX",
                        question=f"Alert {i}: what fired?", read=2048) for i in range(3)]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    with pc.Lab(progress=False) as lab:
        res = lab.import_log(log)
        assert res.requests == 3 and len(res.skipped) == 0
        assert lab.import_log(log).already_stored == 3


# --- 2. detection reads until it knows; nothing vanishes --------------------------------------------------------


def long_conversation(target_bytes: int = 250_000) -> list[dict]:
    """An on-call conversation whose turns add up to ``target_bytes`` of JSON (invented log excerpts)."""
    messages: list[dict] = []
    i = 0
    while len(json.dumps(messages)) < target_bytes:
        log_lines = "\n".join(
            f"2026-03-09T0{(i + k) % 10}:{k % 60:02d}:11Z checkout-api pod-{k % 7} p99={180 + (i * 37 + k) % 900}ms "
            f"upstream=ledger-replica-{k % 3} status={'200' if (i + k) % 11 else '504'}" for k in range(40))
        messages.append({"role": "user", "content": f"Here is the next window of logs (#{i}):\n{log_lines}"})
        messages.append({"role": "assistant",
                         "content": f"Window #{i}: the 504s line up with ledger-replica-{i % 3} lag; p99 stays high."})
        i += 1
    messages.append({"role": "user", "content": "Given all of that, what should the postmortem say caused it?"})
    return messages


#: The usage of a Messages response after server-side compaction, shaped as the compaction docs' example: the
#: top-level figures are the final ("message") iteration's; the summarising ("compaction") iteration is reported
#: only inside ``usage.iterations``, and here it wrote the long conversation to the cache.
COMPACTION_USAGE = {
    "input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 52,
    "iterations": [
        {"type": "compaction", "input_tokens": 9, "cache_creation_input_tokens": 55_096, "cache_read_input_tokens": 0,
         "cache_creation": {"ephemeral_5m_input_tokens": 55_096, "ephemeral_1h_input_tokens": 0},
         "output_tokens": 1_840},
        {"type": "message", "input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
         "output_tokens": 52},
    ],
}


def compaction_cassette(path: Path) -> Path:
    body = {"model": "claude-sonnet-4-6", "max_tokens": 2048,
            "context_management": {"edits": [{"type": "compact_20260112",
                                              "trigger": {"type": "input_tokens", "value": 50_000}}]},
            "messages": long_conversation()}
    response = {"id": "msg_01Compact", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
                "content": [{"type": "compaction", "content": "Summary: checkout p99 rose with ledger-replica lag…"},
                            {"type": "text", "text": "Root cause: replica lag after the 02:00 vacuum."}],
                "stop_reason": "end_turn", "usage": COMPACTION_USAGE}
    return write_cassette(path, [interaction(
        "https://api.anthropic.com/v1/messages?beta=true", body, response,
        request_headers={"anthropic-beta": "compact-2026-01-12", "anthropic-version": "2023-06-01",
                         "content-type": "application/json"},
        response_headers={"content-type": "application/json", "request-id": "req_011CVcompact"})])


def test_vcr_sniff_knows_a_cassette_whose_first_body_is_past_the_head(tmp_path: Path) -> None:
    path = compaction_cassette(tmp_path / "test_postmortem_long_session.yaml")
    data = path.read_bytes()
    assert len(data) > 250_000 and data.index(b"uri:") > 64 * 1024  # vcrpy sorts body before uri
    reader = VcrReader()
    for size in (64 * 1024, 128 * 1024, 256 * 1024, len(data)):
        assert reader.sniff(path, data[:size].decode("utf-8", errors="replace")), size
    # a head cut anywhere: never a false "no" once the list's first item shows, never a crash
    for cut in range(0, 200, 7):
        head = data[:cut].decode("utf-8", errors="replace")
        assert reader.sniff(path, head) == ("- request:\n" in head), cut
    for other in (HarReader(), ExchangesReader()):
        assert not other.sniff(path, data.decode())


def test_har_and_vcr_json_sniff_with_a_huge_first_body(tmp_path: Path) -> None:
    big = json.dumps({"model": "claude-haiku-4-5", "messages": long_conversation(150_000)})
    har = {"log": {"version": "1.2", "creator": {"name": "mitmproxy", "version": "11.0"}, "entries": [
        {"startedDateTime": "2026-03-09T14:00:00Z", "request": {
            "method": "POST", "url": "https://api.anthropic.com/v1/messages", "headers": [],
            "postData": {"mimeType": "application/json", "text": big}},
         "response": {"status": 200, "headers": [], "content": {"mimeType": "application/json", "text": "{}"}}}]}}
    text = json.dumps(har, indent=2)
    assert HarReader().sniff(tmp_path / "x.har", text[:64 * 1024])
    assert not VcrReader().sniff(tmp_path / "x.har", text[:64 * 1024])
    cassette = {"interactions": [{"request": {"body": big, "headers": {}, "method": "POST",
                                              "uri": "https://api.anthropic.com/v1/messages"},
                                  "response": {"status": {"code": 200}, "body": {"string": "{}"}}}], "version": 1}
    text = json.dumps(cassette, indent=4)
    assert '"uri"' not in text[:64 * 1024]
    assert VcrReader().sniff(tmp_path / "x.json", text[:64 * 1024])
    assert not HarReader().sniff(tmp_path / "x.json", text[:64 * 1024])


CLAUDE_CODE_LINE = {"parentUuid": None, "isSidechain": False, "userType": "external", "cwd": "/home/dev/payments",
                    "sessionId": "6f1c2a9e-0b7d-4c1e-9a51-2f3b8d7e6c10", "version": "2.0.14", "type": "user",
                    "message": {"role": "user", "content": "why is checkout slow?"},
                    "uuid": "0c9e1f7a-3d2b-4e8f-a1c6-5b4d3e2f1a09", "timestamp": "2026-03-09T13:59:58.120Z"}


def proxy_log_with_a_claude_code_line(tmp_path: Path) -> Path:
    log = tmp_path / "proxy.jsonl"
    lines = [json.dumps(CLAUDE_CODE_LINE)] + [
        json.dumps(proxy_line(i, started=T0 + timedelta(seconds=10 * i), request_id=f"req_011CVcc{i}",
                              question=f"Alert {i}?", read=2048)) for i in range(5)]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return log


def test_a_claude_code_line_in_a_proxy_log_is_skipped_with_a_reason(tmp_path: Path) -> None:
    log = proxy_log_with_a_claude_code_line(tmp_path)
    reader = ExchangesReader()
    assert reader.sniff(log, log.read_text())
    records = list(reader.read(log))
    assert len(requests_of(records)) == 5
    (skip,) = skipped_of(records)
    assert (skip.file, skip.line) == (str(log), 1) and "claude-code entry, not a proxy record" in skip.reason
    stray = log.with_name("stray.jsonl")
    stray.write_text(json.dumps({"hello": "world"}) + "\n" + log.read_text().split("\n", 1)[1], encoding="utf-8")
    (other,) = skipped_of(list(reader.read(stray)))
    assert other.line == 1 and other.reason == "not a proxy record: no request, path, status"


def test_a_claude_code_line_in_a_proxy_log_end_to_end(tmp_path: Path) -> None:
    """Needs the lead's detection change too (today the Claude Code reader, asked first, claims the file)."""
    log = proxy_log_with_a_claude_code_line(tmp_path)
    with pc.Lab(progress=False) as lab:
        res = lab.import_log(log)
        assert res.files == [(str(log), "exchanges")]
        assert res.requests == 5
        assert [(r["line"], "claude-code" in r["reason"]) for r in res.skipped.to_dict("records")] == [(1, True)]


# --- 3. streaming usage -------------------------------------------------------------------------------------------


def sse(events: list[dict]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


MESSAGE_START = {"type": "message_start", "message": {
    "id": "msg_01Stream", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
    "stop_reason": None, "usage": {"input_tokens": 6, "cache_creation_input_tokens": 120,
                                   "cache_read_input_tokens": 30_000,
                                   "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 120},
                                   "output_tokens": 1}}}
BLOCKS = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
          {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Rolled back."}},
          {"type": "content_block_stop", "index": 0}]


def streamed(delta_usage: dict) -> dict[str, Any]:
    events = [MESSAGE_START, *BLOCKS,
              {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": delta_usage},
              {"type": "message_stop"}]
    return usage_from_sse(parse_sse(sse(events)), "anthropic").usage or {}


def test_stream_usage_keeps_message_start_cache_figures_and_takes_the_final_output() -> None:
    # the documented shape: message_delta carries the final output (and may repeat the cumulative input figures)
    for delta in ({"output_tokens": 311}, {"input_tokens": 6, "cache_creation_input_tokens": 120,
                                            "cache_read_input_tokens": 30_000, "output_tokens": 311}):
        usage = streamed(delta)
        assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"],
                usage["output_tokens"]) == (6, 30_000, 120, 311)
        assert usage["cache_creation"] == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 120}


def test_stream_usage_a_zero_placeholder_in_message_delta_does_not_erase_the_cache_read() -> None:
    # an Anthropic-compatible gateway fills the figures it does not track with 0: cumulative counts cannot fall
    usage = streamed({"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                      "output_tokens": 311})
    assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"],
            usage["output_tokens"]) == (6, 30_000, 120, 311)


def test_stream_usage_a_delta_write_total_drops_a_split_that_no_longer_adds_up() -> None:
    usage = streamed({"cache_creation_input_tokens": 480, "output_tokens": 311})  # a server tool wrote more
    assert usage["cache_creation_input_tokens"] == 480 and "cache_creation" not in usage


def test_streamed_cassette_imports_the_cache_read_from_message_start(tmp_path: Path) -> None:
    events = [MESSAGE_START, *BLOCKS,
              {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
               "usage": {"input_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
                         "output_tokens": 311}},
              {"type": "message_stop"}]
    body = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": True,
            "messages": [{"role": "user", "content": "Roll back checkout?"}]}
    path = write_cassette(tmp_path / "stream.yaml", [interaction(
        "https://gateway.internal/anthropic/v1/messages", body, sse(events),
        response_headers={"content-type": "text/event-stream", "request-id": "req_011CVstream"})])
    (req,) = requests_of(list(VcrReader().read(path)))
    u = req.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.cache_creation_1h_input_tokens,
            u.output_tokens) == (6, 30_000, 120, 120, 311)


# --- 4. server-side compaction --------------------------------------------------------------------------------


def test_compaction_cassette_reads_and_keeps_the_iterations(tmp_path: Path) -> None:
    path = compaction_cassette(tmp_path / "test_postmortem_long_session.yaml")
    (req,) = requests_of(list(VcrReader().read(path)))
    assert req.usage.raw["iterations"][0]["cache_creation_input_tokens"] == 55_096
    assert req.model == "claude-sonnet-4-6" and req.request_id == "req_011CVcompact"


def test_compaction_iterations_cache_write_is_stored_end_to_end(tmp_path: Path) -> None:
    """Server-side compaction reports the summarising iteration only inside ``usage.iterations`` (the
    compaction docs: top-level usage is the final iteration's; the iterations together are what is billed).

    Depends on ``dialects.usage_from_anthropic`` counting the iterations (another branch): fails until that is merged.
    """
    path = compaction_cassette(tmp_path / "test_postmortem_long_session.yaml")
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        res = lab.import_log(path)
        assert res.requests == 1 and res.files == [(str(path), "vcr")]
        (turn,) = res.sessions[0].turns().to_dict("records")
        assert turn["cache_creation_input_tokens"] == 55_096
        assert turn["output_tokens"] >= 52


# --- 5. Amazon Bedrock ------------------------------------------------------------------------------------------

BEDROCK = "https://bedrock-runtime.us-east-1.amazonaws.com/model"
PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
SYSTEM_TEXT = "You are the release assistant for the payments monorepo. Answer in two sentences. " * 30


def aws_event(event_type: str, payload: dict) -> bytes:
    """One ``application/vnd.amazon.eventstream`` message (prelude, string headers, payload, CRCs)."""
    headers = b""
    for name, value in ((":event-type", event_type), (":content-type", "application/json"),
                        (":message-type", "event")):
        headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(value)) + value.encode()
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + headers + body
    return message + struct.pack(">I", zlib.crc32(message))


def invoke_chunk(event: dict) -> bytes:
    return aws_event("chunk", {"bytes": base64.b64encode(json.dumps(event).encode()).decode()})


def bedrock_cassette(path: Path) -> Path:
    anthropic_body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 400,
                      "system": [{"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}}],
                      "messages": [{"role": "user", "content": "Is the 4.12 release blocked?"}]}
    invoke_response = {"id": "msg_bdrk_01Invoke", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                       "content": [{"type": "text", "text": "No; the flaky test was quarantined."}],
                       "stop_reason": "end_turn",
                       "usage": {"input_tokens": 11, "cache_creation_input_tokens": 1_310,
                                 "cache_read_input_tokens": 0, "output_tokens": 17}}
    converse_body = {"system": [{"text": SYSTEM_TEXT}, {"cachePoint": {"type": "default"}}],
                     "messages": [{"role": "user", "content": [{"text": "Who owns the release today?"}]}],
                     "inferenceConfig": {"maxTokens": 400}}
    converse_response = {"output": {"message": {"role": "assistant", "content": [{"text": "Priya, until 18:00."}]}},
                         "stopReason": "end_turn",
                         "usage": {"inputTokens": 9, "outputTokens": 8, "totalTokens": 1_327,
                                   "cacheReadInputTokens": 1_310, "cacheWriteInputTokens": 0},
                         "metrics": {"latencyMs": 612}}
    stream_events = [
        {"type": "message_start", "message": {"id": "msg_bdrk_01Stream", "type": "message", "role": "assistant",
                                              "model": "claude-sonnet-4-5", "content": [],
                                              "usage": {"input_tokens": 12, "cache_creation_input_tokens": 24,
                                                        "cache_read_input_tokens": 1_310, "output_tokens": 1}}},
        *BLOCKS,
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}},
        {"type": "message_stop", "amazon-bedrock-invocationMetrics": {
            "inputTokenCount": 12, "outputTokenCount": 6, "invocationLatency": 840, "firstByteLatency": 390,
            "cacheReadInputTokenCount": 1_310, "cacheWriteInputTokenCount": 24}},
    ]
    stream_body = b"".join(invoke_chunk(e) for e in stream_events)
    converse_stream_body = b"".join([
        aws_event("messageStart", {"role": "assistant"}),
        aws_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Tag v4.12.0 "}}),
        aws_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "after the canary."}}),
        aws_event("contentBlockStop", {"contentBlockIndex": 0}),
        aws_event("messageStop", {"stopReason": "end_turn"}),
        aws_event("metadata", {"usage": {"inputTokens": 15, "outputTokens": 7, "totalTokens": 1_332,
                                         "cacheReadInputTokens": 1_310, "cacheWriteInputTokens": 0},
                               "metrics": {"latencyMs": 701}}),
    ])
    converse_stream_request = dict(converse_body, messages=[
        {"role": "user", "content": [{"text": "When do we tag?"}]}])
    headers = {"content-type": "application/json", "x-amzn-requestid": ""}
    quoted = PROFILE.replace(":", "%3A")
    return write_cassette(path, [
        interaction(f"{BEDROCK}/{quoted}/invoke", anthropic_body, invoke_response,
                    response_headers=dict(headers, **{"x-amzn-requestid": "7f0c1d2e-aaaa-4b5c-9d8e-000000000001"})),
        interaction(f"{BEDROCK}/{quoted}/converse", converse_body, converse_response,
                    response_headers=dict(headers, **{"x-amzn-requestid": "7f0c1d2e-aaaa-4b5c-9d8e-000000000002"})),
        interaction(f"{BEDROCK}/{quoted}/invoke-with-response-stream", anthropic_body, stream_body,
                    response_headers={"content-type": "application/vnd.amazon.eventstream",
                                      "x-amzn-requestid": "7f0c1d2e-aaaa-4b5c-9d8e-000000000003"}),
        interaction(f"{BEDROCK}/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2F{quoted}"
                    "/converse-stream", converse_stream_request, converse_stream_body,
                    response_headers={"content-type": "application/vnd.amazon.eventstream",
                                      "x-amzn-requestid": "7f0c1d2e-aaaa-4b5c-9d8e-000000000004"}),
    ])


def test_bedrock_invoke_and_converse_calls_are_read(tmp_path: Path) -> None:
    path = bedrock_cassette(tmp_path / "test_release_assistant_bedrock.yaml")
    records = list(VcrReader().read(path))
    assert skipped_of(records) == []
    invoke, converse, invoke_stream, converse_stream = requests_of(records)
    assert {r.model for r in (invoke, converse, invoke_stream, converse_stream)} == {PROFILE}
    assert all(r.provider == "anthropic" and r.dialect == "anthropic" for r in (invoke, converse))

    def figures(r: ImportedRequest) -> tuple:
        u = r.usage
        return u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.output_tokens

    assert figures(invoke) == (11, 0, 1_310, 17)
    assert figures(converse) == (9, 1_310, 0, 8)
    assert converse.usage.raw["cacheReadInputTokens"] == 1_310  # the native payload, Bedrock's names
    assert figures(invoke_stream) == (12, 1_310, 24, 6)
    assert figures(converse_stream) == (15, 1_310, 0, 7)
    assert invoke.request_id == "7f0c1d2e-aaaa-4b5c-9d8e-000000000001"
    # the Converse body becomes the Messages body Claude receives: cachePoint → cache_control on the block before
    assert converse.body["system"] == [{"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}}]
    assert converse.body["messages"] == [{"role": "user", "content": [{"type": "text",
                                                                        "text": "Who owns the release today?"}]}]
    assert converse.body["max_tokens"] == 400 and converse.reply == [{"type": "text", "text": "Priya, until 18:00."}]
    assert invoke.body["system"] == converse.body["system"]  # the same prefix, whichever API sent it
    assert converse_stream.reply == [{"type": "text", "text": "Tag v4.12.0 after the canary."}]


def test_bedrock_cassette_end_to_end(tmp_path: Path) -> None:
    path = bedrock_cassette(tmp_path / "test_release_assistant_bedrock.yaml")
    with pc.Lab(progress=False) as lab:
        res = lab.import_log(path)
        assert res.requests == 4 and len(res.skipped) == 0
        df = res.sessions[0].turns()
        assert list(df.cache_read_input_tokens) == [0, 1_310, 1_310, 1_310]
        # priced at Bedrock's own (regional) rates, never as a look-alike
        assert res.unknown_models == [] and df.cost_usd.notna().all()
        assert pc.analysis.prices_for(PROFILE).provider_id == "aws"


def test_bedrock_other_models_and_damaged_streams_are_skipped_with_a_reason() -> None:
    def convert(url: str, body: Any, response: Any, headers: dict | None = None) -> Any:
        ex = HttpExchange("POST", url, 200, json.dumps(body), response, response_headers=headers or {})
        return convert_exchange(ex, file="b.yaml", line=1, source_ref="b.yaml#interactions[0]", fallback_at=T0)

    nova = convert(f"{BEDROCK}/amazon.nova-pro-v1%3A0/converse", {"messages": []}, "{}")
    assert nova == SkippedLine("b.yaml", 1, "Bedrock model not analysed (not a Claude model): amazon.nova-pro-v1:0")
    opaque = convert(f"{BEDROCK}/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aapplication-inference-profile"
                     "%2Fk3x9p2q7w1ab/invoke",
                     {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64,
                      "messages": [{"role": "user", "content": "hi"}]},
                     json.dumps({"id": "msg_bdrk_1", "type": "message", "role": "assistant", "content": [],
                                 "usage": {"input_tokens": 8, "output_tokens": 2}}))
    assert isinstance(opaque, ImportedRequest) and opaque.model == "k3x9p2q7w1ab"  # Claude, by its body's shape
    cut = invoke_chunk(MESSAGE_START)[:-9]
    damaged = convert(f"{BEDROCK}/{PROFILE}/invoke-with-response-stream",
                      {"anthropic_version": "bedrock-2023-05-31", "messages": []}, cut,
                      {"content-type": "application/vnd.amazon.eventstream"})
    assert isinstance(damaged, SkippedLine) and damaged.reason.startswith("event stream")


# --- 1b. OTLP spans: ids only where trustworthy ---------------------------------------------------------------


def otlp_span(span_id: str, trace_id: str, start_s: int, tokens: int) -> dict:
    def attr(key: str, value: dict) -> dict:
        return {"key": key, "value": value}
    return {"traceId": trace_id, "spanId": span_id, "name": "chat gpt-4.1-mini", "kind": 3,
            "startTimeUnixNano": str(1_773_064_800 + start_s) + "000000000",
            "endTimeUnixNano": str(1_773_064_801 + start_s) + "000000000",
            "attributes": [attr("gen_ai.operation.name", {"stringValue": "chat"}),
                           attr("gen_ai.system", {"stringValue": "openai"}),
                           attr("gen_ai.request.model", {"stringValue": "gpt-4.1-mini"}),
                           attr("gen_ai.usage.input_tokens", {"intValue": str(tokens)}),
                           attr("gen_ai.usage.cache_read_input_tokens", {"intValue": "1024"}),
                           attr("gen_ai.usage.output_tokens", {"intValue": "90"})]}


def test_otlp_spans_without_trustworthy_ids_are_each_their_own_request(tmp_path: Path) -> None:
    from promptcache_nb.readers.otlp import OtlpReader

    def line(*spans: dict) -> str:
        return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [
            {"scope": {"name": "opentelemetry.instrumentation.openai_v2"}, "spans": list(spans)}]}]}) + "\n"

    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    path = tmp_path / "collector.jsonl"
    path.write_text(
        line(otlp_span("", "", 0, 2300), otlp_span("", "", 5, 2400))  # an exporter that strips ids: one line
        + line(otlp_span("0000000000000000", "0" * 32, 9, 2500))  # the spec's invalid (all-zero) ids
        + line(otlp_span("00f067aa0ba902b7", trace, 12, 2600), otlp_span("00f067aa0ba902b7", trace, 15, 2700)),
        encoding="utf-8")
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"resourceMetrics": []}) + "\n")  # a metrics export line in the traces file
    records = list(OtlpReader().read(path))
    assert skipped_of(records) == [SkippedLine(str(path), 4, "not an OTLP trace or log export (no resourceSpans or "
                                                             "resourceLogs list)")]
    keys = [r.dedupe_key for r in requests_of(records)]
    assert len(keys) == 5 and len(set(keys)) == 5, keys
    assert keys[3] == f"{trace}/00f067aa0ba902b7"  # a real id, the first time the file names it
    assert keys == [r.dedupe_key for r in requests_of(list(OtlpReader().read(path)))]


def test_stream_usage_with_compaction_iterations_takes_message_delta_as_sent() -> None:
    """With server-side compaction the final ``message_delta`` carries ``iterations``; its top-level figures are
    then the last iteration's (lower than ``message_start``'s), and the iterations hold the rest."""
    usage = streamed({"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                      "output_tokens": 52, "iterations": COMPACTION_USAGE["iterations"]})
    assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["output_tokens"]) == (12, 0, 52)
    assert usage["iterations"][0]["cache_creation_input_tokens"] == 55_096 and "cache_creation" not in usage


def test_bedrock_stream_recorded_as_text_is_read(tmp_path: Path) -> None:
    events = [MESSAGE_START, *BLOCKS, {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                       "usage": {"output_tokens": 9}}]
    body = b"".join(invoke_chunk(e) for e in events)
    ex = HttpExchange("POST", f"{BEDROCK}/{PROFILE}/invoke-with-response-stream", 200,
                      json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64,
                                  "messages": [{"role": "user", "content": "hi"}]}),
                      body.decode("utf-8", errors="surrogateescape"),
                      response_headers={"content-type": "application/vnd.amazon.eventstream"})
    req = convert_exchange(ex, file="b.yaml", line=1, source_ref="b.yaml#interactions[0]", fallback_at=T0)
    assert isinstance(req, ImportedRequest)
    assert (req.usage.cache_read_input_tokens, req.usage.output_tokens, req.model) == (30_000, 9, PROFILE)


def test_har_sniff_on_a_head_cut_anywhere() -> None:
    import re

    har = Path(__file__).resolve().parent / "fixtures" / "logs" / "har" / "billing_widget.har"
    text = har.read_text(encoding="utf-8")
    opened = re.compile(r'"log"\s*:\s*\{\s*"(?:version|creator|browser|pages|entries|comment)"\s*:')
    for cut in range(0, 120):
        head = text[:cut]
        assert HarReader().sniff(har, head) == bool(opened.search(head)), cut
        assert not VcrReader().sniff(har, head) and not ExchangesReader().sniff(har, head)
