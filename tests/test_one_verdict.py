"""One verdict per request (issue #38): on every shipped scenario and every shipped log, the requests that broke
the cache are the same in ``turns.broke``, ``pc.rebuilds``, the observation's words, the observation box, the
side-by-side column header, the summary counts and the cache gate; OpenClaw's read-drop rule is only the
``openclaw_broke`` cross-check."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

import promptcache_nb as pc
from promptcache_nb._data import data_path
from promptcache_nb.analysis.gate import check_cache, check_conversations
from promptcache_nb.widgets._controllers import StepperController
from promptcache_nb.widgets._views import _column_label

pytestmark = [pytest.mark.filterwarnings("ignore::promptcache_nb.errors.UnpricedModelWarning"),
              pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")]

SCENARIOS = sorted(p.stem for p in data_path("scenarios").glob("*.yaml"))
LOGS = sorted(p.name for p in data_path("logs").iterdir() if p.is_dir())


def _verdicts(session: pc.Session) -> dict[str, set[int]]:
    """The breaking requests' indices, as each place that states the verdict states it."""
    df = session.turns()
    stated = {
        "turns.broke": {int(i) for i in df.idx[df.broke.astype("boolean").fillna(False)]},
        "pc.rebuilds": {int(i) for i in pc.rebuilds(session).idx},
        "gate": {b.index for b in check_cache(session).breaks},
        "explanation": {int(r.idx) for r in df.itertuples() if str(r.explanation or "").startswith("Cache break")},
    }
    controller = StepperController(session)
    boxes, headers = set(), set()
    for i in range(len(df)):
        view = controller.view(i)
        assert view is not None
        if "cache break" in view.observation_html():
            boxes.add(i)
        if 'data-broke="true"' in _column_label(session.strategy, view):
            headers.add(i)
    stated["observation box"], stated["column header"] = boxes, headers
    summary = pc.analysis.session_summary(session.lab, [session.id]).iloc[0]
    assert summary.rebuilds == len(stated["turns.broke"]), summary
    return stated


def _assert_one_verdict(session: pc.Session) -> set[int]:
    stated = _verdicts(session)
    reference = stated["turns.broke"]
    for where, found in stated.items():
        assert found == reference, f"{session.id}: {where} says {sorted(found)}, turns.broke {sorted(reference)}"
    return reference


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_shipped_scenario_states_one_verdict(scenario: str, tmp_path: Path) -> None:
    path = data_path("scenarios") / f"{scenario}.yaml"
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        broke = {s: _assert_one_verdict(lab.replay(path, strategy=s, stop_after=12))
                 for s in ("clock_in_system", "durable_delta")}
    # the clock in the system prompt rewrites its prefix whenever the minute turns: the verdict sees it even when
    # the agent never read its cache (OpenClaw's read-drop rule needs a read above zero first)
    assert broke["clock_in_system"], broke


@pytest.mark.parametrize("log", LOGS)
def test_every_shipped_log_states_one_verdict_before_and_after_analysis(log: str, tmp_path: Path) -> None:
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        res = lab.import_log(data_path("logs") / log, progress=False)
        assert res.sessions, log
        usage_first = {s.id: set(pc.rebuilds(s).idx) for s in res.sessions}
        before = {sid: {int(i) for i in lab.store.turns_frame(sid, ("idx", "broke")).query("broke == True").idx}
                  for sid in usage_first}
        lab.analyze(progress=False)
        for s in res.sessions:
            s = lab.open_session(s.id)
            after = _assert_one_verdict(s)
            measured = (s.turns().usage_source.isin(["live", "imported"])).all()
            if measured:  # the rule needs the measured figures only: a usage-first import's verdict is final
                assert before[s.id] == after, (log, s.id, before[s.id], after)


T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOST = "You answer from the ledger and cite invoice ids. " * 150


def test_a_clock_in_the_system_prompt_breaks_every_request_openclaw_sees_none(tmp_path: Path) -> None:
    # A clock (to the minute, a minute apart) after the first system block: every request reads that block and
    # writes the rest of its prompt again. Its read never drops, so OpenClaw's rule never fires; the verdict does.
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        s = lab.session(system=HOST, strategy="clock_in_system")
        for i in range(4):
            s.step(f"question {i}", reply="ok", at=T0 + timedelta(minutes=i))
        df = s.turns()
        reads = list(df.cache_read_input_tokens)
        assert reads[0] == 0 and len(set(reads[1:])) == 1  # the same read every time: no drop
        assert list(df.broke) == [False, True, True, True]
        assert list(df.openclaw_broke) == [False, False, False, False]
        assert _assert_one_verdict(s) == {1, 2, 3}
        with pytest.raises(AssertionError, match="3 requests broke the cache"):
            pc.assert_cache_stable(s)


def _conversation(lab: pc.Lab, strategy: str, system: str, minute: int) -> pc.Session:
    s = lab.session(system=system, strategy=strategy)
    s.step(f"question {minute}", reply="ok", at=T0 + timedelta(minutes=minute))
    return s


def test_conversations_of_one_scope_break_the_prefix_they_share(tmp_path: Path) -> None:
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        stable = [_conversation(lab, "append_only", HOST, i) for i in range(3)]
        assert check_conversations(stable) == ()
        clocked = [_conversation(lab, "clock_in_system", HOST, 10 + i) for i in range(3)]
        found = check_conversations(clocked)
        assert [(b.session_id, b.against) for b in found] == [
            (clocked[1].id, clocked[0].id), (clocked[2].id, clocked[1].id)]
        assert all((b.path or "").startswith("system") and b.cause == "system_changed" for b in found), found
        assert "broke the prefix it shares with conversation" in found[0].text()
        # a conversation that cached nothing leaves nothing to break (below the minimum)
        tiny = [_conversation(lab, "clock_in_system", "Be terse.", 20 + i) for i in range(2)]
        assert check_conversations(tiny) == ()
        # nor does one whose entry had expired (an hour later)
        late = [clocked[0], _conversation(lab, "clock_in_system", HOST, 90)]
        assert check_conversations(late) == ()


def test_a_prompt_below_the_minimum_passes_with_a_note(tmp_path: Path) -> None:
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        s = lab.session(system="Be terse.", strategy="clock_in_system")
        for i in range(3):
            s.step(f"q{i}", reply="ok", at=T0 + timedelta(minutes=i))
        check = pc.assert_cache_stable(s)
        assert check.ok and not check.breaks
        assert check.notes and "nothing could be cached" in check.notes[0]
        assert "note: nothing could be cached" in check.message()


def test_openclaw_crosscheck_names_the_verdict_and_the_rule_apart(tmp_path: Path) -> None:
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        s = lab.replay(data_path("scenarios") / "clock_tick.yaml", strategy="clock_in_system", stop_after=12)
        cc = pc.analysis.openclaw_crosscheck(s)
        df = s.turns()
        assert list(cc.broke) == [None if pd.isna(b) else bool(b) for b in df.broke]
        assert list(cc.openclaw_broke) == [None if pd.isna(b) else bool(b) for b in df.openclaw_broke]
        assert {"agent_broke", "agent_changes", "agree"} <= set(cc.columns)


def test_the_gate_shows_the_providers_word_beside_ours(tmp_path: Path) -> None:
    anthropic = pytest.importorskip("anthropic")
    host = "You answer from the ledger and cite invoice ids. " * 150
    with pc.SimulatorServer(cache_params={"ttft_seconds": 0}) as server, \
            pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab, \
            anthropic.Anthropic(base_url=server.base_url, api_key="sk-fake-verdict", max_retries=0) as client:
        with lab.capture(client, diagnostics=True) as cap:
            history: list[dict[str, str]] = []
            for i in range(3):  # a clock in the system prompt, one conversation
                history.append({"role": "user", "content": f"question {i}"})
                msg = client.messages.create(
                    model="claude-sonnet-4-5", max_tokens=32, messages=history,
                    system=[{"type": "text", "text": f"Now: 09:00:{10 * i:02d}\n" + host,
                             "cache_control": {"type": "ephemeral"}}])
                history.append({"role": "assistant", "content": msg.content[0].text})
        s = cap.session
        check = check_cache(s)
        assert [b.index for b in check.breaks] == [1, 2]
        message = check.message()
        assert message.count("The provider's cache diagnostics (measured): the system prompt changed") == 2, message
        assert "Ours agrees" in message
        html = StepperController(s).view(1).observation_html()
        assert "cache break" in html and "provider&#x27;s cache diagnostics" in html.replace("'", "&#x27;")
