"""pc.widgets.Monitor: a captured session's calls as they arrive, from the capture's callback (no polling), its
controller tested without a kernel or a browser."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anthropic
import pytest

import promptcache_nb as pc
from promptcache_nb.turn import has_record_listeners
from promptcache_nb.widgets import MonitorController

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

MODEL = "claude-sonnet-4-5"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOST = "You are the billing platform's support agent. Answer from the ledger, cite invoice ids. " * 60


@pytest.fixture
def env():
    with pc.SimulatorServer() as server, pc.Lab(progress=False) as lab:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="sk-fake", max_retries=0)
        yield lab, client
        client.close()


def call(client, i: int, *, clock: bool = False, text: str | None = None) -> None:
    now = T0 + timedelta(seconds=40 * i)
    system = (f"Current time: {now:%H:%M}\n" if clock else "") + HOST
    client.messages.create(model=MODEL, max_tokens=32, extra_headers={"x-promptcache-at": now.isoformat()},
                           system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
                           messages=[{"role": "user", "content": text or f"invoice {i}?"}])


def test_the_controller_follows_the_capture_as_calls_arrive(env):
    lab, client = env
    with lab.capture(client) as cap:
        ctl = MonitorController(cap.session)  # before any call
        seen = []
        ctl.subscribe(seen.append)
        assert ctl.n_requests == 0 and "no request yet" in ctl.html()
        for i in range(4):
            call(client, i, clock=True)
            assert ctl.n_requests == i + 1  # updated by the capture's callback, not by reading the store
    assert seen == ["turn"] * 4
    df = cap.session.turns()
    assert [r["request_id"] for r in ctl.rows] == list(df.request_id)
    prompt = (df.input_tokens + df.cache_read_input_tokens + df.cache_creation_input_tokens).sum()
    assert ctl.read_pct == pytest.approx(df.cache_read_input_tokens.sum() * 100 / prompt)
    assert ctl.saved_usd == pytest.approx((df.cost_no_cache_usd - df.cost_usd).sum())
    html = ctl.html()
    # the minute turns before requests 2 and 3: each wrote again the prompt the one before had cached
    assert int(df.broke.sum()) == 2
    assert '<span data-field="requests">4</span>' in html and '<span data-field="breaks">2</span>' in html
    assert "<b>request 3</b>" in html and "prefix diff" in html and "observation" in html
    # a monitor made afterwards reads what is stored, then follows
    late = MonitorController(cap.session)
    assert late.rows == ctl.rows and late.read_pct == pytest.approx(ctl.read_pct)
    ctl.close()
    late.close()
    assert not has_record_listeners(cap.session.id)


def test_content_is_escaped(env):
    lab, client = env
    with lab.capture(client) as cap:
        ctl = MonitorController(cap.session)
        call(client, 0)
        call(client, 1, text="<img src=x onerror=alert(1)> evil\u202eexe")  # in the latest request's diff
    html = ctl.html()
    assert "<img" not in html and "&lt;img" in html and "⟨RLO⟩" in html
    ctl.close()


def test_the_widget_updates_and_carries_a_static_snapshot(env):
    lab, client = env
    with lab.capture(client) as cap:
        monitor = pc.widgets.Monitor(cap.session)
        assert monitor.requests == 0
        call(client, 0)
        call(client, 1)
        assert monitor.requests == 2 and '<span data-field="requests">2</span>' in monitor._html.value
        bundle = monitor._repr_mimebundle_()
        assert "static snapshot of the Monitor widget" in bundle["text/html"]
        assert '<span data-field="requests">2</span>' in bundle["text/html"]
        assert repr(monitor) == f"Monitor(session={cap.session.id!r}, requests=2)"
        monitor.close()
        call(client, 2)  # no longer followed
    assert monitor.requests == 2 and len(cap.session.turns()) == 3
