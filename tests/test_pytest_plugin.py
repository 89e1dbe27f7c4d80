"""The prompt_cache pytest plugin, run as a user runs it: pytest in a subprocess on a small agent (the anthropic SDK
against the simulator endpoint), with and without a clock in its system prompt, a baseline round trip, -n 2, and
pc.assert_cache_stable in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import promptcache_nb as pc

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow,  # other processes: a pytest run each
              pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")]

AGENT = '''
from datetime import UTC, datetime, timedelta

import anthropic
import pytest

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOST = "You are the billing platform's support agent. Answer from the ledger, cite invoice ids. " * 60
TOOLS = [{"name": n, "description": f"Look up {n.split('_')[1]} records by id.",
          "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}}
         for n in ("get_invoice", "get_customer", "get_refund")]


def run_agent(base_url, *, clock, turns=4, virtual=True, mode="conversation"):
    """A small agent loop, a request every 40 s (on the simulator's clock; on the wall clock, one right after the
    other, with virtual=False). ``clock``: False, "minute" (True) or "second" in the system prompt; ``mode``:
    "conversation" (one history), "calls" (single-message calls), "reorder" (tools reordered at turn 2), "edit"
    (a knowledge edit in the system prompt at turn 2), "tiny" (a system prompt below the minimum)."""
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-fake-plugin-key", max_retries=0)
    history = []
    for i in range(turns):
        now = T0 + timedelta(seconds=40 * i)
        stamp = f"{now:%Y-%m-%d %H:%M:%S}" if clock == "second" else f"{now:%Y-%m-%d %H:%M}"
        system = (f"Current time: {stamp} UTC\\n" if clock else "") + (
            "You are terse." if mode == "tiny" else HOST)
        if mode == "edit":
            system += "Refund window: " + ("30 days." if i < 2 else "14 days.")
        tools = list(reversed(TOOLS)) if mode == "reorder" and i >= 2 else TOOLS
        question = {"role": "user", "content": f"What happened to invoice {8810 + i}?"}
        history = [question] if mode == "calls" else [*history, question]
        msg = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=64, messages=history, tools=tools,
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            extra_headers={"x-promptcache-at": now.isoformat()} if virtual else None)
        history.append({"role": "assistant", "content": msg.content[0].text})
    client.close()
'''

TESTS = AGENT + '''

def test_stable(prompt_cache):
    run_agent(prompt_cache.base_url, clock=False)
    assert len(prompt_cache.session.turns()) == 4


def test_clock(prompt_cache):
    run_agent(prompt_cache.base_url, clock=CLOCK)


@pytest.mark.prompt_cache(max_breaks=2)
def test_two_breaks_allowed(prompt_cache):
    run_agent(prompt_cache.base_url, clock=True)


@pytest.mark.prompt_cache(min_read_pct=60)
def test_read_threshold(prompt_cache):
    run_agent(prompt_cache.base_url, clock=False, virtual=False)  # the wall clock: back-to-back calls read
    assert all(read > 1000 for read in list(prompt_cache.session.turns().cache_read_input_tokens)[1:])
'''

#: The agents a cache gate exists for, and the ones it must let through: one subprocess run.
CASES = AGENT + '''

def test_clock_every_second(prompt_cache):
    run_agent(prompt_cache.base_url, clock="second")


def test_clock_in_single_message_calls(prompt_cache):
    run_agent(prompt_cache.base_url, clock="second", mode="calls")


def test_stable_single_message_calls(prompt_cache):
    run_agent(prompt_cache.base_url, clock=False, mode="calls")


def test_tools_reordered(prompt_cache):
    run_agent(prompt_cache.base_url, clock=False, mode="reorder")


def test_knowledge_edit_in_the_system_prompt(prompt_cache):
    run_agent(prompt_cache.base_url, clock=False, mode="edit")


def test_below_the_minimum(prompt_cache):
    run_agent(prompt_cache.base_url, clock="second", mode="tiny")


def test_stable(prompt_cache):
    run_agent(prompt_cache.base_url, clock=False)
'''


def run_pytest(tmp_path: Path, *args: str, clock: bool, env: dict | None = None,
               tests: str = TESTS) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_agent.py").write_text(tests.replace("clock=CLOCK", f"clock={clock}"))
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0", **(env or {})}
    environ.pop("GITHUB_STEP_SUMMARY", None) if not env or "GITHUB_STEP_SUMMARY" not in env else None
    # -p names the plugin explicitly: a checkout not yet reinstalled has no entry point (make test reinstalls)
    # no:nbval: nbval imports nbformat -> jsonschema's format checkers, ~2-4 s per process these runs never use
    cmd = [sys.executable, "-m", "pytest", "-p", "promptcache_nb.pytest_plugin", "-p", "no:cacheprovider", "-p", "no:nbval",
           "-W", "ignore::DeprecationWarning", "-q", "-rA", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300)


def test_a_clock_fails_with_the_located_diff_a_stable_agent_passes_and_a_baseline_round_trips(tmp_path):
    # One run records the baseline and shows both outcomes: test_clock's agent has a clock in its system prompt,
    # test_stable's is the same agent without one (the default thresholds: no break allowed).
    summary, baseline = tmp_path / "summary.md", tmp_path / "cache_baseline.json"
    res = run_pytest(tmp_path, "--prompt-cache-baseline", str(baseline), "--prompt-cache-update", clock=True,
                     env={"GITHUB_STEP_SUMMARY": str(summary)})
    out = res.stdout
    assert res.returncode == 1, out + res.stderr
    assert "4 passed" not in out and "1 failed, 3 passed" in out and "FAILED test_agent.py::test_clock" in out, out
    assert "PASSED test_agent.py::test_stable" in out, out
    failure = out[out.index("test_clock"):]
    # the minute changes before requests 2 and 3: both wrote again the system prompt the one before had cached
    assert "2 requests broke the cache (at most 0 allowed): request 2 (req_sim_" in failure, failure
    assert ", request 3 (req_sim_" in failure and "sent again 1," in failure, failure
    assert "diverges at system[0] (byte 422" in failure  # the segment path and byte offset
    assert "excerpt: Current time: 2026-11-02 09:0⟪ 0 UTC↵You are" in failure  # invisible characters shown
    assert "⟫ → ⟪ 1 UTC↵" in failure and "pytest_plugin.py" not in failure  # the message, not our frames
    # the summary table: one per test, with the first break's location
    text = summary.read_text()
    assert text.count("#### prompt cache: `test_agent.py::") == 4
    clock_table = text[text.index("test_agent.py::test_clock"):].split("####")[0]
    assert "| 4 | " in clock_table and "| 2 | system[0] byte 422 |" in clock_table, text
    # the baseline it recorded
    data = json.loads(baseline.read_text())
    assert data["test_agent.py::test_stable"]["breaks"] == 0
    assert data["test_agent.py::test_stable"]["requests"] == 4
    assert data["test_agent.py::test_two_breaks_allowed"]["breaks"] == 2
    # against it: unchanged figures pass (test_one_break_allowed) and a baseline that promised a better read
    # fails, naming the baseline (test_stable), in one run
    data["test_agent.py::test_stable"]["read_pct"] = 99.5
    baseline.write_text(json.dumps(data))
    res = run_pytest(tmp_path, "--prompt-cache-baseline", str(baseline), "-k", "stable or two_breaks", clock=False)
    out = res.stdout
    assert res.returncode == 1 and "1 failed, 1 passed" in out, out + res.stderr
    assert "PASSED test_agent.py::test_two_breaks_allowed" in out and "FAILED test_agent.py::test_stable" in out, out
    assert "the baseline 99.5 %" in out[out.index("test_stable"):], out


def test_the_gate_fails_the_agents_it_exists_for_and_passes_the_stable_ones(tmp_path):
    # picoclaw #617 and the OpenClaw clock fixes: an agent that never reads its cache is what the gate is for
    res = run_pytest(tmp_path, clock=False, tests=CASES)
    out = res.stdout
    assert res.returncode == 1 and "4 failed, 3 passed" in out, out + res.stderr
    for name in ("clock_every_second", "clock_in_single_message_calls", "tools_reordered",
                 "knowledge_edit_in_the_system_prompt"):
        assert f"FAILED test_agent.py::test_{name}" in out, out
    for name in ("stable", "stable_single_message_calls", "below_the_minimum"):
        assert f"PASSED test_agent.py::test_{name}" in out, out

    def failure(name: str) -> str:
        return out[out.index(f"_ test_{name} _"):].split("\n_")[0]

    every_second = failure("clock_every_second")
    assert "read 0.0 %, 3 breaks" in every_second and "request 1 (req_sim_" in every_second, every_second
    assert "diverges at system[0] (byte 314" in every_second and "09:00:⟪ 00 UTC↵" in every_second
    calls = failure("clock_in_single_message_calls")
    assert "3 breaks" in calls and "diverges at system[0]" in calls, calls
    reordered = failure("tools_reordered")
    assert "1 break" in reordered and "request 2 (req_sim_" in reordered and "tools[0]" in reordered, reordered
    assert "same set in another order" in reordered
    edit = failure("knowledge_edit_in_the_system_prompt")
    assert "request 2 (req_sim_" in edit and "⟪ 30 days. ⟫ → ⟪ 14 days. ⟫" in edit, edit
    # the below-minimum prompt passes, with a note saying why nothing could break
    passed = out[out.index("PASSES"):]
    assert "nothing could be cached" in passed and "1,024-token minimum" in passed, passed


def test_under_xdist(tmp_path):
    baseline = tmp_path / "b.json"
    res = run_pytest(tmp_path, "-n", "2", "--prompt-cache-baseline", str(baseline), "--prompt-cache-update",
                     clock=True)
    assert "1 failed, 3 passed" in res.stdout, res.stdout + res.stderr
    assert "request 2 (req_sim_" in res.stdout
    assert sorted(json.loads(baseline.read_text())) == [  # both workers' tests merged into one file
        f"test_agent.py::test_{n}" for n in ("clock", "read_threshold", "stable", "two_breaks_allowed")]


# -- in-process: the same check a notebook cell calls ----------------------------------------------------------
def test_assert_cache_stable_names_the_breaking_request(tmp_path):
    ns: dict = {}
    exec(AGENT, ns)  # the same agent, through a capture instead of the plugin
    import anthropic

    with pc.SimulatorServer() as server, pc.Lab(progress=False) as lab:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="sk-fake", max_retries=0)
        sessions = {}
        for clock in (False, True):
            ns["anthropic"] = _Reuse(client)
            with lab.capture(client) as cap:
                ns["run_agent"](server.base_url, clock=clock)
            sessions[clock] = cap.session
        check = pc.assert_cache_stable(sessions[False], min_read_pct=50)
        assert check.ok and check.requests == 4 and check.read_pct > 50 and not check.breaks
        with pytest.raises(AssertionError) as info:
            pc.assert_cache_stable(sessions[True])
        msg = str(info.value)
        assert "request 2 (req_sim_" in msg and "diverges at system[0] (byte 422" in msg, msg
        assert "⟫ → ⟪ 1 UTC↵" in msg
        with pytest.raises(AssertionError, match=r"read .* % of prompt tokens from the cache \(at least 99 %"):
            pc.assert_cache_stable(sessions[False], min_read_pct=99)
        assert pc.assert_cache_stable(sessions[True], max_breaks=2).ok
        client.close()


class _Reuse:
    """Stands in for the anthropic module inside the agent: hands it the captured client."""

    def __init__(self, client):
        self._client = client

    def Anthropic(self, **kwargs):  # noqa: N802 - the SDK's name
        client = self._client
        client.close = lambda: None
        return client


def test_an_upstream_goes_through_the_recording_proxy(tmp_path):
    with pc.SimulatorServer() as upstream:  # stands in for https://api.anthropic.com
        res = run_pytest(tmp_path, "--prompt-cache-upstream", upstream.base_url, "-k", "stable", clock=False)
        assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout + res.stderr
        assert [r.status for r in upstream.requests] == [200] * 4  # the test's calls reached the upstream
