"""The live code path: the anthropic SDK against the SimulatorServer, and AnthropicBackend in a session."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anthropic
import httpx
import pytest

import promptcache_nb as pc
from promptcache_nb.live.server import run_serve, serve_main
from promptcache_nb.request import prepare

# claude-sonnet-4-5 (the reference scenario's model) is on the SDK's deprecation list; the SDK warns on
# every call, which is information for a notebook user, not a failure of ours.
pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05_live_api.ipynb"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
MODEL = "claude-sonnet-4-5"
KEY = "fake-key-for-local-simulator"  # not a real key format on purpose
LONG_SYSTEM = [{"type": "text", "text": "You are a careful support agent for a billing platform. " * 150,
                "cache_control": {"type": "ephemeral"}}]
USAGE_COLUMNS = ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                 "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens"]
TABLES = ("turns", "blocks", "prefix_nodes", "session_messages")


@pytest.fixture
def server(simulator):
    """The shared simulator endpoint (tests/conftest.py), reset for each test."""
    return simulator


@pytest.fixture
def client(server):
    c = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    yield c
    c.close()


def body(text: str = "Where is invoice 42?") -> dict:
    return {"model": MODEL, "max_tokens": 64, "system": LONG_SYSTEM,
            "messages": [{"role": "user", "content": text}]}


def at(seconds: float) -> dict:
    return {"x-promptcache-at": (T0 + timedelta(seconds=seconds)).isoformat()}


def counts(lab: pc.Lab) -> dict[str, int]:
    return {t: int(lab.sql(f"SELECT count(*) AS n FROM {t}").n[0]) for t in TABLES}


# -- the SDK against the server -----------------------------------------------------------------
def test_sync_create_writes_then_reads_and_honours_the_virtual_clock(client):
    raw = client.messages.with_raw_response.create(**body(), extra_headers=at(0))
    first = raw.parse()
    assert raw.headers["request-id"] == first._request_id == "req_sim_000001"
    assert first.content[0].text == "(simulated reply)" and first.stop_reason == "end_turn"
    u = first.usage
    assert u.cache_read_input_tokens == 0 and u.cache_creation_input_tokens > 1024
    assert u.cache_creation.ephemeral_5m_input_tokens == u.cache_creation_input_tokens
    assert u.cache_creation.ephemeral_1h_input_tokens == 0
    second = client.messages.create(**body("And invoice 43?"), extra_headers=at(60))
    assert second.usage.cache_read_input_tokens == u.cache_creation_input_tokens
    # 6 minutes of scenario time later the 5m entry (refreshed at +60s) has expired
    third = client.messages.create(**body("And 44?"), extra_headers=at(60 + 301))
    assert third.usage.cache_read_input_tokens == 0
    assert third.usage.cache_creation_input_tokens == u.cache_creation_input_tokens


def test_async_client(server):
    async def run() -> tuple[anthropic.types.Usage, str | None]:
        async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key=KEY, max_retries=0) as ac:
            first = await ac.messages.create(**body(), extra_headers=at(0))
            second = await ac.messages.create(**body(), extra_headers=at(10))
            return first.usage, second.usage, second._request_id

    first, second, rid = asyncio.run(run())
    assert first.cache_creation_input_tokens > 1024
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert rid == "req_sim_000002"


def test_messages_stream_helper(client):
    with client.messages.stream(**body(), extra_headers=at(0)) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        assert stream.request_id == "req_sim_000001"
    assert text == "(simulated reply)"
    plain = client.messages.create(**body(), extra_headers=at(10))  # same prefix: now read
    assert final.usage.cache_creation_input_tokens == plain.usage.cache_read_input_tokens > 1024
    assert final.usage.output_tokens == plain.usage.output_tokens > 0
    assert final.usage.cache_creation.ephemeral_5m_input_tokens == final.usage.cache_creation_input_tokens


def test_create_stream_true_events(client):
    events = list(client.messages.create(**body(), extra_headers=at(0), stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    start, delta = events[0].message.usage, events[-2].usage
    assert start.cache_creation_input_tokens > 1024 and start.input_tokens > 0
    assert delta.output_tokens > 0 and delta.cache_creation_input_tokens == start.cache_creation_input_tokens
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == "(simulated reply)"


def test_caches_are_per_key_and_per_model(server, client):
    client.messages.create(**body(), extra_headers=at(0))
    with anthropic.Anthropic(base_url=server.base_url, api_key="sk-ant-other", max_retries=0) as other:
        assert other.messages.create(**body(), extra_headers=at(5)).usage.cache_read_input_tokens == 0
    assert client.messages.create(**{**body(), "model": "claude-sonnet-4-6"},
                                  extra_headers=at(6)).usage.cache_read_input_tokens == 0
    assert client.messages.create(**body(), extra_headers=at(7)).usage.cache_read_input_tokens > 0
    assert server.workspaces == 2
    assert [r.workspace for r in server.requests] == ["ws1", "ws2", "ws1", "ws1"]


def test_endpoint_errors_have_the_api_shape(server, client):
    with httpx.Client(base_url=server.base_url) as http:
        r = http.post("/v1/messages", json=body())
        error = {"type": "authentication_error", "message": "x-api-key header is required"}
        assert r.status_code == 401
        assert r.json() == {"type": "error", "error": error, "request_id": r.headers["request-id"]}
        r = http.post("/v1/messages", json=body(), headers={"x-api-key": KEY, "x-promptcache-at": "monday"})
        assert r.status_code == 400 and "x-promptcache-at" in r.json()["error"]["message"]
        r = http.post("/v1/messages", content=b"{", headers={"x-api-key": KEY})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = http.post("/v1/messages/count_tokens", json=body(), headers={"x-api-key": KEY})
        assert r.status_code == 200 and r.json()["input_tokens"] > 1024
        r = http.get("/v1/models", headers={"x-api-key": KEY})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError, match="claude-nonexistent"):
        client.messages.create(**{**body(), "model": "claude-nonexistent-9"})
    with pytest.raises(ValueError, match="cannot inject"):
        server.inject_error(418)


def test_only_listed_keys_are_accepted():
    with pc.SimulatorServer(api_keys=["sk-ant-allowed"]) as srv:
        for key, ok in (("sk-ant-allowed", True), ("sk-ant-other", False)):
            with anthropic.Anthropic(base_url=srv.base_url, api_key=key, max_retries=0) as c:
                if ok:
                    c.messages.create(**body())
                else:
                    with pytest.raises(anthropic.AuthenticationError):
                        c.messages.create(**body())
        assert "sk-ant-allowed" not in repr(srv.__dict__)


# -- AnthropicBackend in a session --------------------------------------------------------------
def test_backend_stores_measured_usage_request_id_and_prediction(client):
    with pc.Lab(progress=False) as lab:
        backend = pc.AnthropicBackend(client)
        s = lab.session(system=LONG_SYSTEM[0]["text"], backend=backend, start=T0)
        s.step("first question", reply="first answer")
        t = s.step("second question")  # reply=None: the endpoint's answer is stored
        assert t.reply == [{"type": "text", "text": "(simulated reply)"}]
        assert t.request_id == "req_sim_000002" and t.cache_reason == "hit"
        predicted = t.cache_detail["predicted_usage"]
        assert predicted["cache_read_input_tokens"] == t.usage.cache_read_input_tokens > 0
        df = s.turns()
        assert list(df.request_id) == ["req_sim_000001", "req_sim_000002"]
        assert list(df.usage_source) == ["simulated", "simulated"]  # the server says it simulated
        assert backend.virtual_clock


def test_no_sdk_deprecation_warning_for_the_default_model_through_a_local_endpoint(client):
    """The default model is deprecated in the SDK's table; against the simulator that says nothing (issue 13)."""
    import warnings

    def warned(backend: pc.AnthropicBackend) -> list[str]:
        with warnings.catch_warnings(record=True) as seen, pc.Lab(progress=False) as lab:
            warnings.simplefilter("always")  # past this module's ignore mark
            lab.session(model="claude-sonnet-4-5", system="Be brief.", backend=backend).step("hello", reply="hi")
        return [str(w.message) for w in seen if "is deprecated" in str(w.message)]

    assert warned(pc.AnthropicBackend(client)) == []
    assert warned(pc.AnthropicBackend(client, virtual_clock=False))  # a remote endpoint still warns


def test_backend_repr_stream_option_and_client_checks(server, client):
    backend = pc.AnthropicBackend(client, stream=True)
    assert repr(backend) == f"AnthropicBackend(base_url='{server.base_url}', predict=True, stream=True)"
    assert KEY not in repr(backend)
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=LONG_SYSTEM[0]["text"], backend=backend, start=T0)
        t = s.step("hello", reply="hi")
        assert t.request_id == "req_sim_000001" and t.usage.cache_creation_input_tokens > 1024
    assert server.requests[0].stream
    ac = anthropic.AsyncAnthropic(api_key="x", base_url=server.base_url)
    with pytest.raises(TypeError, match="synchronous"):
        pc.AnthropicBackend(ac)
    asyncio.run(ac.close())
    with anthropic.Anthropic(api_key="x", base_url="https://api.anthropic.com") as remote:
        assert not pc.AnthropicBackend(remote).virtual_clock
    with anthropic.Anthropic(api_key="x", base_url="http://user:pw@localhost:9") as local:
        b = pc.AnthropicBackend(local)
        assert b.virtual_clock and "pw" not in repr(b)


@pytest.fixture
def live_session(server):
    """A session through the server with one stored turn, and a way to swap the client's retries."""
    lab = pc.Lab(progress=False)
    clients: list[anthropic.Anthropic] = []

    def session_with(max_retries: int = 0, api_key: str = KEY) -> pc.Session:
        c = anthropic.Anthropic(base_url=server.base_url, api_key=api_key, max_retries=max_retries)
        clients.append(c)
        return lab.session(id=s0.id, backend=pc.AnthropicBackend(c))

    first = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    clients.append(first)
    s0 = lab.session(system=LONG_SYSTEM[0]["text"], backend=pc.AnthropicBackend(first), start=T0)
    s0.step("first", reply="ok")
    yield lab, session_with
    for c in clients:
        c.close()
    lab.close()


def test_401_leaves_the_store_unchanged(server, live_session):
    lab, session_with = live_session
    before = counts(lab)
    s = session_with(api_key="bad")
    with pytest.raises(pc.errors.AuthenticationError) as info:
        s.step("second", reply="ok")
    err = info.value
    assert err.status_code == 401 and err.request_id == server.requests[-1].request_id
    assert "\n" not in str(err) and "ANTHROPIC_API_KEY" in str(err)
    assert counts(lab) == before
    assert session_with().step("second", reply="ok").index == 1


def test_400_five_breakpoints(server, live_session):
    lab, session_with = live_session
    before = counts(lab)
    s = session_with()
    bad = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": [
        {"type": "text", "text": f"b{i}", "cache_control": {"type": "ephemeral"}} for i in range(5)]}]}
    with pytest.raises(pc.errors.InvalidRequestError, match="Found 5") as info:
        s.record(bad)
    assert info.value.turn == 1 and isinstance(info.value, pc.errors.APIError)
    assert server.requests[-1].status == 400
    assert counts(lab) == before
    # the backend itself carries the endpoint's request id
    with pytest.raises(pc.errors.InvalidRequestError) as direct:
        s.backend.send(prepare(bad), at=T0 + timedelta(hours=1), cache=pc.get_cache_model("anthropic"))
    assert direct.value.request_id == server.requests[-1].request_id
    assert s.step("second", reply="ok").index == 1


def test_429_surfaces_retry_after(server, live_session):
    lab, session_with = live_session
    before = counts(lab)
    server.inject_error(429, retry_after=7)
    s = session_with()
    with pytest.raises(pc.errors.RateLimitError) as info:
        s.step("second", reply="ok")
    assert info.value.retry_after == 7.0 and "retry after 7s" in str(info.value)
    assert info.value.request_id == server.requests[-1].request_id
    assert counts(lab) == before
    assert s.step("second", reply="ok").index == 1


def test_529_overloaded(server, live_session):
    lab, session_with = live_session
    before = counts(lab)
    server.inject_error(529)
    s = session_with()
    with pytest.raises(pc.errors.OverloadedError) as info:
        s.step("second", reply="ok")
    assert info.value.status_code == 529 and info.value.error_type == "overloaded_error"
    assert counts(lab) == before
    assert s.step("second", reply="ok").index == 1


def test_a_request_retried_by_the_sdk_is_stored_once(server, live_session):
    lab, session_with = live_session
    before = counts(lab)
    server.inject_error(529, retry_after=0.01)
    s = session_with(max_retries=2)
    t = s.step("second", reply="ok")
    assert [r.status for r in server.requests[-2:]] == [529, 200]
    assert t.request_id == server.requests[-1].request_id
    assert counts(lab)["turns"] == before["turns"] + 1
    assert list(s.turns().request_id)[-1] == t.request_id
    # the prediction stayed in step with what was stored: the retried turn reads turn 0's prefix
    assert t.cache_reason == "hit" and t.usage.cache_read_input_tokens > 0


def test_connection_error(server):
    with anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key=KEY, max_retries=0) as c, \
            pc.Lab(progress=False) as lab:
        s = lab.session(backend=pc.AnthropicBackend(c))
        with pytest.raises(pc.errors.APIConnectionError, match="127.0.0.1:9"):
            s.step("hello", reply="hi")
        assert counts(lab)["turns"] == 0


# -- the same numbers either way ----------------------------------------------------------------
def _replay_both(server, scenario, strategy: str, stored_session):
    # one Lab each: knowledge ids derive from the project name, which a second replay in one Lab suffixes.
    # The direct replay (the in-process simulator) is conftest's, stored once per test run.
    direct = stored_session(strategy, scenario).turns()
    with pc.Lab(progress=False) as lab, \
            anthropic.Anthropic(base_url=server.base_url, api_key=f"sk-ant-{strategy}", max_retries=0) as c:
        via_sdk = lab.replay(scenario, strategy=strategy, backend=pc.AnthropicBackend(c)).turns()
    return direct, via_sdk


def _strategies() -> list[str]:
    others = [n for n in pc.STRATEGIES if n != "naive"]
    return ["naive"] + (["durable_delta"] if "durable_delta" in others else others[:1])


@pytest.mark.parametrize("strategy", _strategies())
def test_reference_scenario_identical_usage_direct_and_through_the_sdk(server, reference_scenario, strategy,
                                                                          stored_session):
    direct, via_sdk = _replay_both(server, reference_scenario, strategy, stored_session)
    assert len(direct) == len(via_sdk) == pc.load_scenario(reference_scenario).n_requests
    # Output tokens (and so cost) are the endpoint's own answer's; everything the cache decides is equal.
    # Scripted replies and tool calls must win over the endpoint's answer, or the two conversations drift
    # apart after turn 0 (Session._built_request).
    cols = USAGE_COLUMNS + ["total_tokens", "ideal_cache_read", "cache_reason", "usage_source", "broke"]
    assert direct[cols].equals(via_sdk[cols]), direct[cols].compare(via_sdk[cols]).head()
    assert via_sdk.request_id.notna().all() and direct.request_id.isna().all()


def test_unscripted_replies_identical_including_output(server):
    """reply=None: the endpoint's answer equals the simulator's, so every column matches, output included."""
    offsets = (0, 10, 20, 480, 490)
    frames = []
    with anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0) as c:
        for backend in (None, pc.AnthropicBackend(c)):
            with pc.Lab(progress=False) as lab:
                s = lab.session(system=LONG_SYSTEM[0]["text"], backend=backend, start=T0)
                for i, sec in enumerate(offsets):
                    s.step(f"question {i}", at=T0 + timedelta(seconds=sec))
                frames.append(s.turns())
    direct, via_sdk = frames
    cols = USAGE_COLUMNS + ["output_tokens", "usage_source", "cost_usd", "cache_reason"]
    assert direct[cols].equals(via_sdk[cols])
    assert list(direct.cache_reason) == ["cold", "hit", "hit", "prefix_changed", "hit"]


# -- keys ---------------------------------------------------------------------------------------
def test_key_never_reaches_store_logs_or_reprs(server, tmp_path, caplog, capfd):
    key = "sk-ant-test-" + secrets.token_urlsafe(30)[:40]
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "live.duckdb"
    with anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=1) as c:
        backend = pc.AnthropicBackend(c)
        with pc.Lab(db, progress=False) as lab:
            s = lab.session(system=LONG_SYSTEM[0]["text"], backend=backend, start=T0)
            server.inject_error(529, retry_after=0.01)
            turns = [s.step("hello", reply="hi"), s.step("again")]
            texts = [repr(backend), repr(s), repr(lab), repr(server), *map(repr, turns),
                     s.turns().to_csv(), json.dumps(turns[-1].cache_detail)]
    # a refused key: the error names the problem, not the key
    with pc.SimulatorServer(api_keys=["sk-ant-only-this-one"]) as strict, \
            anthropic.Anthropic(base_url=strict.base_url, api_key=key, max_retries=0) as refused, \
            pytest.raises(pc.errors.AuthenticationError) as info:
        pc.AnthropicBackend(refused).send(prepare(body()), at=T0, cache=pc.get_cache_model("anthropic"))
    texts.append(str(info.value))
    out, err = capfd.readouterr()
    files = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) > 0
    for haystack in (files, caplog.text.encode(), out.encode(), err.encode(), "\n".join(texts).encode(),
                     repr(server.requests).encode()):
        assert key.encode() not in haystack
        assert key[12:].encode() not in haystack  # nor its random part


@pytest.mark.slow  # a kernel process runs the notebook
def test_notebook_live_path_keeps_the_key_out_of_outputs(server, monkeypatch):
    """Execute notebook 05 as if a real key were set, against the local server, and grep its outputs."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    if not NOTEBOOK.exists():
        pytest.skip("notebooks/05_live_api.ipynb not written yet")
    key = "sk-ant-test-" + secrets.token_hex(20)
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert key not in outputs and key[12:] not in outputs
    assert "ANTHROPIC_API_KEY is set" in outputs  # the live branch ran, against the local server
    assert any(r.status == 200 for r in server.requests)


# -- CLI ----------------------------------------------------------------------------------------
def test_serve_main_runs_until_stopped(capsys):
    seen: list[str] = []

    def ready(srv: pc.SimulatorServer) -> None:
        with anthropic.Anthropic(base_url=srv.base_url, api_key=KEY, max_retries=0) as c:
            seen.append(c.messages.create(**body()).content[0].text)
        threading.Timer(0.05, srv.stop).start()

    assert serve_main(["--port", "0", "--ttft", "0.1"], ready=ready) == 0
    assert seen == ["(simulated reply)"]
    assert "listening on http://127.0.0.1:" in capsys.readouterr().out
    with pytest.raises(pc.errors.UnknownCacheModelError):
        run_serve(type("A", (), {"cache": "nope", "host": "127.0.0.1", "port": 0, "ttft": None})())


def test_error_tree():
    assert issubclass(pc.errors.InvalidRequestError, pc.errors.APIError) and issubclass(pc.errors.APIError, pc.PromptCacheError)
    e = pc.errors.RateLimitError("slow down", retry_after=2, request_id="req_1").at_turn(4)
    assert str(e) == ("turn 4: rate_limit_error (429): slow down; retry after 2s, or raise the client's "
                      "max_retries [request_id req_1]")
    assert e.retry_after == 2 and e.request_id == "req_1"
    assert str(pc.errors.InvalidRequestError("Found 5.")) == "invalid_request_error (400): Found 5."
