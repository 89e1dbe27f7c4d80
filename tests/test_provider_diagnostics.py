"""The provider's word (issue #38 part 3): Anthropic's cache diagnostics asked for by the capture, the recording proxy
and live sessions, answered by SimulatorServer from its own requests, stored per request, read from recordings, and
put beside our diagnosis (pc.provider_crosscheck) — the real anthropic SDK, real HTTP on loopback, real DuckDB."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import anthropic
import httpx2
import pandas as pd
import pytest
import yaml

import promptcache_nb as pc
from promptcache_nb.analysis import provider_agrees, provider_note
from promptcache_nb.dialects.anthropic import DIAGNOSTICS_BETA, read_diagnosis
from promptcache_nb.live._diagnostics import DiagnosticsChain, with_beta

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

KEY = "sk-test-diagnostics-0123456789abcdef"  # a fake key: it must never reach the store or a log
MODEL = "claude-sonnet-4-5"
POLICY = "You are a careful support agent for a billing platform. Refunds follow policy 7. " * 60
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
TOOLS = [{"name": name, "description": f"{name}: " + "look the account up and report what it holds. " * 30,
          "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}}
         for name in ("lookup_invoice", "refund", "escalate")]


def system_at(when: datetime) -> list[dict]:
    """The canonical broken agent's system prompt: the clock first, the cached policy after it."""
    return [{"type": "text", "text": f"Current time: {when:%Y-%m-%d %H:%M:%S} UTC.\n" + POLICY,
             "cache_control": {"type": "ephemeral"}}]


def reasons(lab: pc.Lab) -> list[tuple[int, str | None, int | None]]:
    df = lab.sql("SELECT idx, provider_cache_miss_reason AS r, provider_cache_missed_tokens AS n FROM turns "
                 "ORDER BY session_id, idx")
    return [(int(i), None if pd.isna(r) else r, None if pd.isna(n) else int(n))
            for i, r, n in df.itertuples(index=False)]


@pytest.fixture
def client(simulator):
    with anthropic.Anthropic(base_url=simulator.base_url, api_key=KEY, max_retries=0) as c:
        yield c


@pytest.fixture
def lab(tmp_path):
    lab = pc.Lab(tmp_path / "diag.duckdb", progress=False)
    yield lab
    lab.close()


# -- the simulator answers from its own requests -----------------------------------------------------------
def test_simulator_answers_each_reason_from_the_request_the_id_names(client, simulator):
    messages = [{"role": "user", "content": "Is invoice 42 refundable?"}]

    def ask(previous: str | None, **changes):
        body = {"model": MODEL, "max_tokens": 32, "system": system_at(T0), "tools": TOOLS, "messages": messages,
                "diagnostics": {"previous_message_id": previous}, **changes}
        return client.messages.create(**body)

    first = ask(None)
    assert first.diagnostics is None  # opted in, nothing to compare yet
    appended = ask(first.id, messages=[*messages, {"role": "assistant", "content": "Checking."},
                                       {"role": "user", "content": "Thanks."}])
    assert appended.diagnostics is None  # entries only appended: no divergence
    got = {}
    for name, change in {
        "model_changed": {"model": "claude-opus-4-5"},
        "tools_changed": {"tools": TOOLS[::-1]},
        "system_changed": {"system": system_at(T0 + timedelta(seconds=1))},
        "messages_changed": {"messages": [{"role": "user", "content": "Is invoice 43 refundable?"}]},
    }.items():
        reason = ask(first.id, **change).diagnostics.cache_miss_reason
        got[name] = (reason.type, reason.cache_missed_input_tokens)
    assert [t for t, _ in got.values()] == list(got)
    # everything after the divergence: the whole prompt for a model or tools change, less for later changes
    assert got["model_changed"][1] == got["tools_changed"][1] > got["system_changed"][1] > got["messages_changed"][1] > 0
    assert ask(first.id, tool_choice={"type": "any"}).diagnostics.cache_miss_reason.type == "unavailable"
    assert ask("msg_never_sent").diagnostics.cache_miss_reason.type == "previous_message_not_found"
    with anthropic.Anthropic(base_url=simulator.base_url, api_key=KEY + "-other", max_retries=0) as other:
        foreign = other.messages.create(model=MODEL, max_tokens=32, messages=messages,
                                        diagnostics={"previous_message_id": first.id})
    assert foreign.diagnostics.cache_miss_reason.type == "previous_message_not_found"  # fingerprints per workspace


def test_simulator_streams_the_diagnosis_and_leaves_other_requests_alone(client):
    first = client.messages.create(model=MODEL, max_tokens=32, system=system_at(T0),
                                   messages=[{"role": "user", "content": "hi"}], diagnostics={"previous_message_id": None})
    with client.messages.stream(model=MODEL, max_tokens=32, system=system_at(T0 + timedelta(hours=1)),
                                messages=[{"role": "user", "content": "hi"}],
                                diagnostics={"previous_message_id": first.id}) as stream:
        events = [e for e in stream if e.type == "message_start"]
        final = stream.get_final_message()
    assert events[0].message.diagnostics.cache_miss_reason.type == "system_changed"
    assert final.diagnostics.cache_miss_reason.type == "system_changed"
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=32,
                                                   messages=[{"role": "user", "content": "hi"}])
    assert "diagnostics" not in json.loads(raw.http_response.content)  # not asked: answered as before


# -- the capture ---------------------------------------------------------------------------------------------
class _Spy(httpx2.BaseTransport):
    """The client's own transport: sees each request as it leaves (after the capture's wrapper)."""

    def __init__(self) -> None:
        self.inner = httpx2.HTTPTransport()
        self.sent: list[tuple[dict, dict]] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.sent.append((dict(request.headers), json.loads(request.content)))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_capture_asks_for_the_diagnosis_and_stores_the_answer(simulator, lab):
    spy = _Spy()
    with anthropic.Anthropic(base_url=simulator.base_url, api_key=KEY, max_retries=0,
                             http_client=httpx2.Client(transport=spy)) as client:
        with lab.capture(client, diagnostics=True) as cap:
            ids = []
            for minute in range(3):  # the clock in the system prompt: every request rewrites the cache
                msg = client.messages.create(
                    model=MODEL, max_tokens=32, system=system_at(T0 + timedelta(minutes=minute)),
                    messages=[{"role": "user", "content": "Is invoice 42 refundable?"}])
                ids.append(msg.id)
    assert cap.stored == 3
    assert [b["diagnostics"]["previous_message_id"] for _, b in spy.sent] == [None, *ids[:2]]
    assert all(h["anthropic-beta"] == DIAGNOSTICS_BETA for h, _ in spy.sent)
    stored = reasons(lab)
    assert [r for _, r, _ in stored] == [None, "system_changed", "system_changed"]
    assert all(n and n > 1000 for _, r, n in stored if r)
    assert KEY not in json.dumps(lab.sql("SELECT * FROM turns").astype(str).to_dict("records"))


def test_capture_without_diagnostics_changes_nothing(simulator, lab):
    spy = _Spy()
    with anthropic.Anthropic(base_url=simulator.base_url, api_key=KEY, max_retries=0,
                             http_client=httpx2.Client(transport=spy)) as client, lab.capture(client):
        for _ in range(2):
            client.messages.create(model=MODEL, max_tokens=32, system=system_at(T0),
                                   messages=[{"role": "user", "content": "hi"}])
    assert all("diagnostics" not in b and "anthropic-beta" not in h for h, b in spy.sent)
    assert [r for _, r, _ in reasons(lab)] == [None, None]


# -- the recording proxy -------------------------------------------------------------------------------------
def test_proxy_asks_per_conversation_and_the_import_stores_the_answer(simulator, lab, tmp_path):
    log = tmp_path / "calls.jsonl"
    with pc.RecordingProxy(simulator.base_url, log, diagnostics=True) as proxy, \
            anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0) as client:
        for i in range(3):  # two conversations interleaved: each names its own previous response
            for user, tools in (("alice", TOOLS if i % 2 == 0 else TOOLS[::-1]), ("bob", TOOLS)):
                with client.messages.stream(model=MODEL, max_tokens=32, tools=tools, system=system_at(T0),
                                            metadata={"user_id": user},
                                            messages=[{"role": "user", "content": f"Hello from {user}"}],
                                            extra_headers={"anthropic-beta": "context-1m-2025-08-07"}) as s:
                    s.get_final_message()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert KEY not in log.read_text()
    named = [(e["request"]["metadata"]["user_id"], e["request"]["diagnostics"]["previous_message_id"]) for e in lines]
    assert named[:2] == [("alice", None), ("bob", None)] and named[2][1] != named[3][1]
    assert {u for u, p in named[2:4]} == {"alice", "bob"} and all(p and p.startswith("msg_") for _, p in named[2:])
    lab.import_log(log)
    df = pc.provider_crosscheck(lab)  # one session per conversation, as the import groups them
    by_session = sorted((list(g.provider_cache_miss_reason), list(g.our_divergence), list(g.agrees))
                        for _, g in df.groupby("session_id"))
    assert by_session == [(["none", "none"], ["none", "none"], [True, True]),
                          (["tools_changed", "tools_changed"], ["tools", "tools"], [True, True])]


def test_proxy_merges_the_beta_header_and_the_cli_flag(simulator, tmp_path):
    assert with_beta("context-1m-2025-08-07") == f"context-1m-2025-08-07,{DIAGNOSTICS_BETA}"
    assert with_beta(f"{DIAGNOSTICS_BETA}, x") == f"{DIAGNOSTICS_BETA},x"
    from promptcache_nb.cli import build_parser

    args = build_parser().parse_args(["proxy", "--upstream", simulator.base_url, "--log", str(tmp_path / "x.jsonl"),
                                      "--diagnostics"])
    assert args.diagnostics is True


# -- imports: a cassette and a HAR file holding the response's diagnostics ---------------------------------
def _message(msg_id: str, diagnostics: object, usage: dict) -> dict:
    out = {"id": msg_id, "type": "message", "role": "assistant", "model": MODEL,
           "content": [{"type": "text", "text": "Invoice 42 is refundable."}], "stop_reason": "end_turn",
           "stop_sequence": None, "usage": usage}
    if diagnostics is not ...:
        out["diagnostics"] = diagnostics
    return out


def _requests() -> list[dict]:
    out = []
    for i, previous in enumerate([None, "msg_01A", "msg_01B", "msg_01C"]):
        out.append({"model": MODEL, "max_tokens": 256, "system": system_at(T0 + timedelta(minutes=i)),
                    "messages": [{"role": "user", "content": "Is invoice 42 refundable?"}],
                    "diagnostics": {"previous_message_id": previous}})
    return out


USAGES = [{"input_tokens": 12, "cache_creation_input_tokens": 1500, "cache_read_input_tokens": 0, "output_tokens": 9}] * 4
DIAGNOSES = [None,
             {"cache_miss_reason": {"type": "system_changed", "cache_missed_input_tokens": 1490}},
             {"cache_miss_reason": None},
             {"cache_miss_reason": {"type": "previous_message_not_found"}}]


def test_a_cassette_and_a_har_file_are_read(lab, tmp_path):
    bodies = _requests()
    interactions = []
    for i, (body, diag, usage) in enumerate(zip(bodies, DIAGNOSES, USAGES, strict=True)):
        response = _message(f"msg_01{'ABCD'[i]}", diag, usage)
        interactions.append({
            "request": {"method": "POST", "uri": "https://api.anthropic.com/v1/messages", "body": json.dumps(body),
                        "headers": {"content-type": ["application/json"], "anthropic-beta": [DIAGNOSTICS_BETA]}},
            "response": {"status": {"code": 200, "message": "OK"},
                         "headers": {"content-type": ["application/json"], "request-id": [f"req_01{'ABCD'[i]}"],
                                     "date": [f"Mon, 02 Nov 2026 09:0{i}:00 GMT"]},
                         "body": {"string": json.dumps(response)}}})
    cassette = tmp_path / "cassettes" / "test_refunds.yaml"
    cassette.parent.mkdir()
    cassette.write_text(yaml.safe_dump({"interactions": interactions, "version": 1}))

    # the HAR file: one streamed answer (diagnostics in message_start), the rest as JSON, base64 for one
    entries = []
    for i, (body, diag, usage) in enumerate(zip(bodies, DIAGNOSES, USAGES, strict=True)):
        message = _message(f"msg_02{'ABCD'[i]}", diag, usage)
        if i == 1:
            start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
            events = [("message_start", {"type": "message_start", "message": start}),
                      ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                         "usage": {"output_tokens": 9}}),
                      ("message_stop", {"type": "message_stop"})]
            text = "".join(f"event: {n}\ndata: {json.dumps(d)}\n\n" for n, d in events)
            content = {"mimeType": "text/event-stream", "text": text}
            body = {**body, "stream": True}
        elif i == 2:
            content = {"mimeType": "application/json", "encoding": "base64",
                       "text": base64.b64encode(json.dumps(message).encode()).decode()}
        else:
            content = {"mimeType": "application/json", "text": json.dumps(message)}
        entries.append({
            "startedDateTime": f"2026-11-02T10:0{i}:00.000Z", "time": 812,
            "request": {"method": "POST", "url": "https://api.anthropic.com/v1/messages", "httpVersion": "HTTP/1.1",
                        "headers": [{"name": "content-type", "value": "application/json"}],
                        "postData": {"mimeType": "application/json", "text": json.dumps(body)}},
            "response": {"status": 200, "statusText": "OK", "httpVersion": "HTTP/1.1",
                         "headers": [{"name": "content-type", "value": content["mimeType"]},
                                     {"name": "request-id", "value": f"req_02{'ABCD'[i]}"}],
                         "content": {"size": len(content["text"]), **content}}})
    har = tmp_path / "browser.har"
    har.write_text(json.dumps({"log": {"version": "1.2", "creator": {"name": "test", "version": "1"},
                                       "entries": entries}}))
    for path in (cassette, har):
        result = lab.import_log(path)
        assert result.requests == 4, result.skipped
    want = [None, "system_changed", "pending", "previous_message_not_found"]
    got = reasons(lab)
    assert [r for _, r, _ in got] == want * 2
    assert [n for _, _, n in got] == [None, 1490, None, None] * 2
    df = pc.provider_crosscheck(lab)
    assert df.agrees.tolist() == [True, None, None] * 2  # pending and not found: nothing to compare


def test_read_diagnosis_rules():
    asked = {"diagnostics": {"previous_message_id": "msg_1"}}
    assert read_diagnosis(asked, None).reason == "none"
    assert read_diagnosis({"diagnostics": {"previous_message_id": None}}, None) is None  # a first request
    assert read_diagnosis({}, None) is None  # nobody asked
    found = read_diagnosis({}, {"cache_miss_reason": {"type": "tools_changed", "cache_missed_input_tokens": 7}})
    assert (found.reason, found.missed_tokens) == ("tools_changed", 7)  # a log that kept only the response
    assert read_diagnosis(asked, {"cache_miss_reason": {"type": 3}}) is None


def test_the_chain_names_each_conversations_previous_response():
    chain = DiagnosticsChain(lambda body: body["metadata"]["user_id"])
    a, b = {"metadata": {"user_id": "a"}}, {"metadata": {"user_id": "b"}}
    chain.answered(a, "msg_a1")
    assert chain.ask(a)["diagnostics"] == {"previous_message_id": "msg_a1"}
    assert chain.ask(b)["diagnostics"] == {"previous_message_id": None}
    own = {**a, "diagnostics": {"previous_message_id": "msg_mine"}}
    assert chain.ask(own) == own  # a body that asks itself is left as it is


# -- live sessions and the cross-check -----------------------------------------------------------------------
def test_live_session_with_the_clock_in_its_system_prompt(client, lab):
    backend = pc.AnthropicBackend(client, diagnostics=True)
    assert "diagnostics=True" in repr(backend)
    s = lab.session("clock_in_system", system=POLICY, backend=backend, start=T0, step="2m")
    for q in ("Is invoice 42 refundable?", "And invoice 43?", "Thanks."):
        s.step(q, reply="Checking.")
    df = pc.provider_crosscheck(s)
    assert list(df.idx) == [1, 2]
    assert list(df.provider_cache_miss_reason) == ["system_changed", "system_changed"]
    assert list(df.cache_reason) == ["prefix_changed", "prefix_changed"]
    assert list(df.our_divergence) == ["system", "system"] and df.agrees.all()
    assert "diagnostics" not in json.dumps(s.turns().to_dict("records"), default=str)  # the strategy's body stored
    note = provider_note(lab.store.turn_row(s.id, 1))
    assert note.startswith("The provider's cache diagnostics (measured): the system prompt changed, ~")
    assert note.endswith("Ours agrees.")


def test_live_session_with_its_tools_reordered(client, lab):
    backend = pc.AnthropicBackend(client, diagnostics=True)
    s = lab.session(system=POLICY, tools=TOOLS, backend=backend, start=T0)
    s.step("Is invoice 42 refundable?", reply="Checking.")
    body = s.last_turn.request
    s.record({**body, "tools": body["tools"][::-1],
              "messages": [*body["messages"], {"role": "assistant", "content": "Checking."},
                           {"role": "user", "content": "And 43?"}]})
    df = pc.provider_crosscheck(s)
    assert list(df.provider_cache_miss_reason) == ["tools_changed"] and list(df.our_divergence) == ["tools"]
    assert df.agrees.tolist() == [True]
    assert df.provider_cache_missed_tokens[0] > 1000


def test_live_session_without_diagnostics_stores_nothing(client, lab):
    s = lab.session(system=POLICY, backend=pc.AnthropicBackend(client), start=T0)
    s.step("one", reply="a")
    s.step("two", reply="b")
    assert [r for _, r, _ in reasons(lab)] == [None, None]
    assert pc.provider_crosscheck(lab).empty


def test_provider_agrees_mapping():
    row = {"provider_cache_miss_reason": "system_changed", "diverge_path": "tools[0]", "pure_append": False}
    assert provider_agrees(row) is False
    assert provider_note(row).endswith("Ours differs (our diff: tools).")
    assert provider_agrees({**row, "provider_cache_miss_reason": "model_changed", "diverge_path": "speed"}) is True
    assert provider_agrees({"provider_cache_miss_reason": "none", "diverge_path": None, "pure_append": True}) is True
    assert provider_agrees({"provider_cache_miss_reason": "none", "diverge_path": "messages[0].content[0]",
                            "pure_append": False}) is False
    assert provider_agrees({"provider_cache_miss_reason": "unavailable", "diverge_path": "thinking"}) is True
    assert provider_agrees({"provider_cache_miss_reason": "unavailable", "diverge_path": "system"}) is None
    assert provider_note({"provider_cache_miss_reason": None}) is None
    assert provider_agrees({"provider_cache_miss_reason": "tools_changed", "diverge_path": None,
                            "pure_append": None}) is None  # no diff of ours (a first request)



def test_async_capture_and_a_streaming_backend_ask_too(simulator, lab):
    import asyncio

    async def calls() -> None:
        async with anthropic.AsyncAnthropic(base_url=simulator.base_url, api_key=KEY, max_retries=0) as client:
            with lab.capture(client, diagnostics=True, project="async"):
                for minute in range(2):
                    async with client.messages.stream(
                            model=MODEL, max_tokens=32, system=system_at(T0 + timedelta(minutes=minute)),
                            messages=[{"role": "user", "content": "hi"}]) as stream:
                        await stream.get_final_message()

    asyncio.run(calls())
    with anthropic.Anthropic(base_url=simulator.base_url, api_key=KEY, max_retries=0) as client:
        s = lab.session(system=POLICY, tools=TOOLS, backend=pc.AnthropicBackend(client, stream=True, diagnostics=True),
                        start=T0, model="claude-opus-4-5")
        s.step("one", reply="a")
        s.record({**s.last_turn.request, "model": MODEL})
    assert [r for _, r, _ in reasons(lab)] == [None, "system_changed", None, "model_changed"]
