"""One distinctive fake key through every live and proxy path and their error paths — 200, an SDK retry, 401, 429,
529, connection refused, a streamed answer, a base URL and an upstream URL with the key in them — then the proxy's
log imported and a report written: the key is absent from the store file, the proxy log, the report, every log
record (ours and the libraries'), stdout and stderr, and every exception's message and repr.
"""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime, timedelta

import anthropic
import pytest
from _harness import FAKE_KEY, messages_body

import promptcache_nb as pc
from promptcache_nb.report import write_report

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SYSTEM = "You are a careful support agent for a billing platform. " * 150
SECRET_PARTS = (FAKE_KEY, "RELIABILITY-FAKE-KEY")


def _free_port() -> int:
    with socket.socket() as s:  # bound, then closed: nobody listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _with_key_in_url(url: str) -> str:
    return url.replace("http://", f"http://agent:{FAKE_KEY}@")


class Seen:
    """Every exception message and repr, and every object repr, met on the way."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def obj(self, *objs) -> None:
        self.texts.extend(repr(o) for o in objs)

    def error(self, exc: BaseException) -> None:
        while exc is not None:
            self.texts += [str(exc), repr(exc), repr(exc.args)]
            exc = exc.__cause__ or exc.__context__

    def expect(self, error: type[BaseException], fn) -> BaseException:
        with pytest.raises(error) as info:
            fn()
        self.error(info.value)
        return info.value


def _client(url: str, *, retries: int = 0, key: str = FAKE_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=retries)


def _session_steps(lab: pc.Lab, server: pc.SimulatorServer, url: str, seen: Seen, *, project: str) -> pc.Session:
    """A live session through ``url`` (the server, or the proxy in front of it) and every error path."""
    with _client(url, retries=1) as client:
        backend = pc.AnthropicBackend(client)
        s = lab.session(system=SYSTEM, backend=backend, start=T0, project=project)
        s.step("first", reply="one")
        server.inject_error(529, retry_after=0.01)  # the SDK retries once: stored once
        s.step("second")
        seen.obj(backend, s, *[s.turn(i) for i in range(s.n_turns)])
    with _client(url) as client:
        s = lab.session(id=s.id, backend=pc.AnthropicBackend(client, stream=True))
        s.step("streamed", reply="three")
        for status, error in ((429, pc.errors.RateLimitError), (529, pc.errors.OverloadedError)):
            server.inject_error(status, retry_after=1)
            seen.expect(error, lambda: s.step("refused", reply="no"))
    with _client(url, key="fake-key-not-the-listed-one") as client:
        bad = lab.session(id=s.id, backend=pc.AnthropicBackend(client))
        seen.expect(pc.errors.AuthenticationError, lambda: bad.step("refused", reply="no"))
    return lab.session(id=s.id)


def test_the_key_never_leaves_the_sdk(tmp_path, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    seen = Seen()
    log = tmp_path / "proxy.jsonl"
    db = tmp_path / "store.duckdb"
    dead = f"http://127.0.0.1:{_free_port()}"
    # the server accepts the fake key only: a 401 path for any other
    with pc.SimulatorServer(api_keys=[FAKE_KEY]) as server, pc.Lab(db, progress=False) as lab:
        direct = _session_steps(lab, server, server.base_url, seen, project="direct")
        with pc.RecordingProxy(_with_key_in_url(server.base_url), log) as proxy:  # an upstream URL with a key
            seen.obj(proxy)
            via = _session_steps(lab, server, proxy.url, seen, project="via-proxy")
            with _client(proxy.url) as client:  # the SDK's own error types, straight through the proxy
                server.inject_error(529)
                seen.expect(anthropic.InternalServerError, lambda: client.messages.create(**messages_body()))
                seen.expect(anthropic.AuthenticationError, lambda: _client(proxy.url, key="sk-wrong").messages.create(
                    **messages_body()))
            seen.obj(proxy, server, server.requests)
        with pc.RecordingProxy(_with_key_in_url(dead), log) as down, _client(down.url) as client:  # upstream down
            seen.expect(anthropic.APIStatusError, lambda: client.messages.create(**messages_body()))
            seen.obj(down)
        with _client(dead) as client:  # connection refused, no proxy
            s = lab.session(id=direct.id, backend=pc.AnthropicBackend(client))
            seen.expect(pc.errors.APIConnectionError, lambda: s.step("nobody there", reply="no"))
        # the key in the base URL itself (userinfo). The SDK then sends Basic auth instead of x-api-key (a 401);
        # the backend names the endpoint without the credentials. httpx and the SDK log each request's URL as
        # given (INFO/DEBUG): those third-party records are kept apart below, ours are checked with the rest.
        url_block = len(caplog.records)
        with anthropic.Anthropic(base_url=_with_key_in_url(server.base_url), api_key=FAKE_KEY,
                                 max_retries=0) as client:
            backend = pc.AnthropicBackend(client)
            s = lab.session(id=direct.id, backend=backend)
            try:
                s.step("through a URL with credentials", reply="ok", at=s.last_turn.at + timedelta(seconds=30))
            except pc.errors.APIError as exc:
                seen.error(exc)
            seen.obj(backend, s, s.last_turn)
            with anthropic.Anthropic(base_url=_with_key_in_url(dead), api_key=FAKE_KEY, max_retries=0) as down:
                s = lab.session(id=direct.id, backend=pc.AnthropicBackend(down))
                seen.expect(pc.errors.APIConnectionError, lambda: s.step("refused", reply="no"))
        url_records = set(range(url_block, len(caplog.records)))
        imported = lab.import_log(log)
        assert imported.requests > 0
        sessions = [lab.session(id=direct.id), lab.session(id=via.id), *imported.sessions]
        seen.obj(lab, imported, *sessions)
        seen.texts += [imported._repr_html_(), *(s.turns().to_csv() for s in sessions)]
        report = write_report(tmp_path / "report.html", pc.compare_df(sessions[:2]),
                              {s.id: s.turns() for s in sessions[:2]}, title="keys", notes=[f"store: {db}"])
    assert direct.n_turns in (3, 4) and via.n_turns == 3  # 200, the retried 529, the stream (+ the URL's)
    out, err = capfd.readouterr()
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("promptcache_nb"))
    others = "\n".join(caplog.handler.format(r) for i, r in enumerate(caplog.records)
                       if i not in url_records or r.name.startswith("promptcache_nb"))
    haystacks = {
        "store file": b"".join(p.read_bytes() for p in tmp_path.glob("store.duckdb*")),
        "proxy log": log.read_bytes(),
        "report": report.read_bytes(),
        "our log records": ours.encode(),
        "all log records": others.encode(),
        "stdout": out.encode(), "stderr": err.encode(),
        "messages and reprs": "\n".join(seen.texts).encode(),
    }
    assert len(haystacks["store file"]) > 100_000 and haystacks["proxy log"].count(b"\n") >= 8
    leaks = [f"{where}: {part}" for where, data in haystacks.items() for part in SECRET_PARTS
             if part.encode() in data]
    assert not leaks, leaks
