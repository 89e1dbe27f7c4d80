"""The public API from the Foundation brief."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

import promptcache_nb as pc

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
TOOLS = [{"name": "lookup_account", "description": "Look up a customer account by id. " * 20,
          "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}]
HOST = "You are a careful support agent for a billing platform. " * 120


def test_exports_are_sorted_and_resolvable():
    assert pc.__all__ == sorted(pc.__all__)
    for name in pc.__all__:
        assert getattr(pc, name) is not None, name


def test_imports_point_left_along_the_flow():
    """Style rule: stages import only stages to their left (errors/_util are leaves)."""
    order = ["errors", "_util", "usage", "tokens", "scenario", "request", "store", "strategies", "cache",
             "live", "analysis", "session", "plots", "report", "widgets", "cli"]
    pkg = Path(pc.__file__).parent
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        stage = rel.parts[0].removesuffix(".py")
        if stage not in order:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
                target = node.module.split(".")[0]
                if node.level == 1 and len(rel.parts) > 1:
                    continue  # sibling inside the same stage
                if target in order and order.index(target) > order.index(stage):
                    if (stage, target) in {("strategies", "store"), ("analysis", "session")}:
                        continue
                    pytest.fail(f"{rel} imports {target}: imports must point left along the flow")


def test_brief_api_end_to_end(tmp_path):
    db = tmp_path / "runs.duckdb"
    with pc.Lab(db, progress=False) as lab:
        s = lab.session(strategy="naive", cache="anthropic", model="claude-sonnet-4-5", project="demo",
                        system=HOST, tools=TOOLS)
        eid = s.knowledge.add("Title", "content", category="gotcha")
        assert isinstance(eid, str)
        s.knowledge.update(eid, content="new content")
        t = s.step("user text", reply="assistant text", at=T0)
        assert t.index == 0 and isinstance(t.request, dict) and isinstance(t.body, bytes)
        assert isinstance(t.usage, pc.Usage) and t.usage.source == "simulated"
        assert t.usage.total_input_tokens == t.total_tokens
        s.knowledge.remove(eid)
        t2 = s.step("more", reply="ok", at=T0 + timedelta(seconds=20))
        assert "new content" not in t2.body.decode()
        t3 = s.record(t2.request, at=T0 + timedelta(seconds=30), usage={"input_tokens": 5,
                      "cache_read_input_tokens": 100, "cache_creation_input_tokens": 0, "output_tokens": 3})
        assert t3.usage.source == "imported" and t3.usage.cache_read_input_tokens == 100
        df = s.turns()
        assert isinstance(df, pd.DataFrame) and list(df.idx) == [0, 1, 2]
        eff = df.cache_read_input_tokens.sum() / df.ideal_cache_read.sum()  # one line of pandas
        assert eff >= 0
        assert lab.sql("select count(*) n from turns").n[0] == 3
        sid = s.id
        assert "naive" in pc.STRATEGIES and "anthropic" in pc.CACHE_MODELS
    # resume after close, from the store alone
    with pc.Lab(db, progress=False) as lab:
        s2 = lab.session(id=sid)
        assert s2.n_turns == 3 and s2.project == "demo"
        t4 = s2.step("after restart", reply="fine", at=T0 + timedelta(seconds=40))
        assert t4.index == 3


def test_unknown_names_list_valid_ones():
    with pc.Lab(progress=False) as lab:
        with pytest.raises(pc.errors.UnknownStrategyError, match="valid: .*naive"):
            lab.session(strategy="nope")
        with pytest.raises(pc.errors.UnknownCacheModelError, match="valid: .*anthropic"):
            lab.session(cache="nope")
        with pytest.raises(pc.errors.UnknownModelError, match="claude-sonnet-4-5"):
            lab.session(model="claude-nonexistent-9")


def test_price_missing_is_an_error_not_zero():
    with pytest.raises(pc.errors.PriceError, match="prices="):
        pc.analysis.prices_for("no-such-model-anywhere")
    with pc.Lab(progress=False) as lab:
        p = pc.analysis.Prices(input=1, output=2, cache_read=0.1, cache_write_5m=1.25, cache_write_1h=2)
        s = lab.session(system=HOST, prices=p)
        t = s.step("x", reply="y", at=T0)
        assert t.cost_usd == pytest.approx(p.cost(t.usage))


def test_ideal_cache_read_rules():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, tools=TOOLS)
        t0 = s.step("a", reply="b", at=T0)
        assert t0.ideal_cache_read == 0
        t1 = s.step("c", reply="d", at=T0 + timedelta(seconds=30))
        assert t1.ideal_cache_read == t0.total_tokens
        t2 = s.step("e", reply="f", at=T0 + timedelta(minutes=7))  # gap > 5m TTL
        assert t2.ideal_cache_read == 0
        s.set_tools(TOOLS + [{"name": "z", "description": "new tool", "input_schema": {"type": "object"}}])
        assert s.step("g", reply="h", at=T0 + timedelta(minutes=7, seconds=20)).ideal_cache_read == 0
        t4 = s.step("i", reply="j", at=T0 + timedelta(minutes=7, seconds=40))
        s.compact("we discussed invoices")
        t5 = s.step("k", reply="l", at=T0 + timedelta(minutes=8))
        assert 0 < t5.ideal_cache_read < t4.total_tokens
        assert t5.ideal_cache_read == t5.prepared.tokens_before_messages()
        s.switch_model("claude-opus-4-1")
        assert s.step("m", reply="n", at=T0 + timedelta(minutes=8, seconds=20)).ideal_cache_read == 0


def test_time_only_moves_forward():
    with pc.Lab(progress=False) as lab:
        s = lab.session()
        s.step("a", reply="b", at=T0)
        with pytest.raises(pc.errors.SessionError, match="turn 1: .*before the previous request"):
            s.step("c", reply="d", at=T0 - timedelta(seconds=1))
        with pytest.raises(pc.errors.SessionError, match="at: must be a timezone-aware datetime"):
            s.step("c", reply="d", at=datetime(2026, 11, 2, 10, 0))  # noqa: DTZ001
        for bad, got in ((datetime(2026, 11, 2, 10, 0), "the naive datetime 2026-11-02T10:00:00"),  # noqa: DTZ001
                         ("2026-11-02T10:00:00Z", "str '2026-11-02T10:00:00Z'"), (1_700_000_000, "int 1700000000"),
                         (datetime.min.replace(tzinfo=timezone(timedelta(hours=5))), "0001-01-01T00:00:00+05:00, "
                          "out of range in UTC")):
            with pytest.raises(pc.errors.SessionError) as info:
                s.step("c", reply="d", at=bad)
            assert str(info.value) == f"request 1: at: must be a timezone-aware datetime, got {got}"
        assert s.n_turns == 1


def test_lab_none_is_in_memory_and_other_paths_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pc.Lab(None, progress=False) as lab:  # an unset setting: in memory, never a file named "None"
        lab.session().step("a", reply="b")
        assert lab.path == ":memory:"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match=r"^Lab\(path\): a file path \(str or Path\) or None, got int$"):
        pc.Lab(5)
    assert list(tmp_path.iterdir()) == []


def test_tool_loop_makes_one_request_per_call():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST)
        last = s.step("find it", reply="found", at=T0, tool_calls=[
            {"name": "lookup_account", "input": {"id": "a1"}, "result": "{...}"},
            pc.scenario.ToolCall("lookup_account", {"id": "a2"}, "{...}"),
        ])
        assert last.index == 2
        msgs = last.request["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
        assert msgs[1]["content"][0]["type"] == "tool_use"
        assert msgs[2]["content"][0]["tool_use_id"] == msgs[1]["content"][0]["id"]
        assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]


def test_move_sessions_carries_prompt_deltas():
    with pc.Lab(progress=False) as lab:
        s = lab.session(project="demo")
        lab.store.con.execute("INSERT INTO session_prompt_deltas VALUES (?, 0, 'demo', '{}', '{}')", [s.id]).fetchall()
        assert lab.move_sessions("demo", "other") == 1
        assert s.project == "other"
        assert lab.sql("select project_id from session_prompt_deltas").project_id.tolist() == ["other"]
        assert lab.sql("select project_id from sessions").project_id.tolist() == ["other"]


def test_replay_and_restart_event(tmp_path, scenarios_dir):
    sc = pc.load_scenario(scenarios_dir / "tiny.yaml")
    with pc.Lab(tmp_path / "r.duckdb", progress=False) as lab:
        s = lab.replay(sc, strategy="naive")
        assert s.n_turns == sc.n_requests
        assert len(s.turns()) == sc.n_requests


@pytest.mark.slow
def test_resume_in_a_new_process_sends_identical_bytes(tmp_path):
    db = tmp_path / "p.duckdb"
    with pc.Lab(db, progress=False) as lab:
        s = lab.session(system=HOST, tools=TOOLS)
        for i in range(3):
            s.step(f"q{i}", reply=f"a{i}", at=T0 + timedelta(seconds=10 * i))
        sid = s.id
        expected = s.step("q3", reply="a3", at=T0 + timedelta(seconds=40)).body
    # drop the last turn? no: continue in another process from a copy taken before it
    with pc.Lab(db, progress=False) as lab:
        lab.store.con.execute("DELETE FROM turns WHERE idx = 3").fetchall()
        lab.store.con.execute("DELETE FROM session_messages WHERE turn_idx = 3").fetchall()
    code = f"""
import sys, promptcache_nb as pc
from datetime import datetime, timedelta, UTC
with pc.Lab({str(db)!r}, progress=False) as lab:
    t = lab.session(id={sid!r}).step("q3", reply="a3", at=datetime(2026, 11, 2, 9, 0, 40, tzinfo=UTC))
    sys.stdout.buffer.write(t.body)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    assert out == expected


class FlakyBackend(pc.live.DirectSimulator):
    """Fails the n-th send once (a 529 in the middle of a tool loop)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.sent = fail_at, 0

    def send(self, request, *, at, cache):
        self.sent += 1
        if self.sent == self.fail_at:
            raise RuntimeError("injected failure")
        return super().send(request, at=at, cache=cache)


def _loop_turns(s):
    s.step("hi", reply="hello", at=T0)
    return s.step("find both", reply="done", at=T0 + timedelta(seconds=30), tool_calls=[
        {"name": "lookup_account", "input": {"id": "a1"}, "result": "one"},
        {"name": "lookup_account", "input": {"id": "a2"}, "result": "two"},
    ])


def test_a_failed_tool_loop_stores_nothing_and_can_be_retried():
    with pc.Lab(progress=False) as lab:
        clean = lab.session(system=HOST, tools=TOOLS, project="clean")
        expected = _loop_turns(clean).body
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, tools=TOOLS, project="clean", backend=FlakyBackend(fail_at=3))
        s.step("hi", reply="hello", at=T0)
        before = {t: lab.sql(f"select count(*) n from {t}").n[0] for t in ("turns", "session_messages", "blocks")}
        with pytest.raises(RuntimeError, match="injected"):
            s.step("find both", reply="done", at=T0 + timedelta(seconds=30), tool_calls=[
                {"name": "lookup_account", "input": {"id": "a1"}, "result": "one"},
                {"name": "lookup_account", "input": {"id": "a2"}, "result": "two"},
            ])
        after = {t: lab.sql(f"select count(*) n from {t}").n[0] for t in ("turns", "session_messages", "blocks")}
        assert before == after and s.n_turns == 1
        assert [m["role"] for m in s.messages] == ["user", "assistant"]
        t = s.step("find both", reply="done", at=T0 + timedelta(seconds=30), tool_calls=[
            {"name": "lookup_account", "input": {"id": "a1"}, "result": "one"},
            {"name": "lookup_account", "input": {"id": "a2"}, "result": "two"},
        ])
        assert t.index == 3 and t.body == expected


def test_second_lab_on_the_same_file_in_one_process_is_refused(tmp_path):
    db = tmp_path / "one.duckdb"
    lab = pc.Lab(db, progress=False)
    try:
        with pytest.raises(pc.StoreLockedError, match="another pc.Lab in this process"):
            pc.Lab(db, progress=False)
    finally:
        lab.close()
    pc.Lab(db, progress=False).close()  # fine once the first is closed


def test_closed_lab_says_so():
    lab = pc.Lab(progress=False)
    s = lab.session()
    lab.close()
    for call in (lambda: lab.session(), lambda: lab.sql("select 1"), lambda: lab.session(id=s.id),
                 lambda: lab.move_sessions("default", "x")):
        with pytest.raises(pc.errors.StoreError, match="closed"):
            call()
    with pytest.raises(pc.errors.SessionError, match="closed"):
        s.step("x", reply="y")


def test_move_sessions_of_an_empty_project_changes_nothing():
    with pc.Lab(progress=False) as lab:
        lab.session(project="a")
        assert lab.move_sessions("nope", "b") == 0
        assert lab.sql("select id from projects order by id").id.tolist() == ["a"]


def test_removed_key_added_again_resolves_to_the_live_entry(tmp_path):
    p = tmp_path / "readd.yaml"
    p.write_text(
        "model: claude-sonnet-4-5\nhost_prompt: You help.\nknowledge:\n  - {key: k, title: Same, content: one}\n"
        "turns:\n  - {user: a, reply: b}\n  - user: c\n    reply: d\n    events: [{knowledge_remove: {key: k}}]\n"
        "  - user: e\n    reply: f\n    events: [{knowledge_add: {key: k, title: Same, content: two}}]\n"
        "  - user: g\n    reply: h\n    events: [{knowledge_update: {key: k, content: three}}]\n")
    with pc.Lab(progress=False) as lab:
        s = lab.replay(pc.load_scenario(p))
        assert [e.content for e in s.knowledge.list()] == ["three"]


@pytest.mark.parametrize(("body", "where"), [
    ({"model": "claude-sonnet-4-5", "max_tokens": 8,
      "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]}, "messages[0].content"),
    ({"model": "claude-sonnet-4-5", "max_tokens": 8, "tools": None, "messages": []}, "tools"),
    ({"model": "claude-sonnet-4-5", "max_tokens": 8, "system": {"text": "x"}, "messages": []}, "system"),
    ({"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": 3}]},
     "messages[0].content"),
])
def test_record_rejects_shapes_the_api_rejects(body, where):
    with pc.Lab(progress=False) as lab:
        s = lab.session()
        with pytest.raises(pc.errors.SessionError, match=rf"request 0: {re.escape(where)}"):
            s.record(body, at=T0)
        assert lab.sql("select count(*) n from turns").n[0] == 0


def test_editing_a_turns_request_changes_nothing_else():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST)
        t = s.step("What is my balance?", reply="$0", at=T0)
        t.request["messages"][0]["content"][0]["text"] = "EDITED"
        t.reply[0]["text"] = "EDITED"
        t2 = s.step("next", reply="ok", at=T0 + timedelta(seconds=5))
        assert b"EDITED" not in t2.body and b"EDITED" not in s.turn(0).body


def test_imported_usage_for_a_model_the_simulator_lacks():
    with pc.Lab(progress=False) as lab:
        s = lab.session()
        t = s.record({"model": "claude-2.1", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}, at=T0,
                     usage={"input_tokens": 12, "output_tokens": 3})
        assert t.usage.source == "imported" and t.cache_reason is None


def test_ideal_is_zero_below_the_minimum_cacheable_length():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="Short prompt.")
        s.step("a", reply="b", at=T0)
        t = s.step("c", reply="d", at=T0 + timedelta(seconds=10))
        assert t.total_tokens < 1024 and t.ideal_cache_read == 0 and t.cache_reason == "below_minimum"


def test_a_models_tool_use_answer_does_not_break_the_next_request():
    class AsksForTools(pc.live.DirectSimulator):
        def send(self, request, *, at, cache):
            r = super().send(request, at=at, cache=cache)
            block = {"type": "tool_use", "id": "toolu_x", "name": "lookup_account", "input": {"id": "a"}}
            return pc.live.BackendResponse(usage=r.usage, cache_result=r.cache_result,
                                      content=[{"type": "text", "text": "Let me check."}, block])

    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, tools=TOOLS, backend=AsksForTools())
        t = s.step("look it up", at=T0)  # reply=None: the model's own answer
        assert t.reply[-1]["type"] == "tool_use"  # the turn keeps the whole answer
        t2 = s.step("thanks", reply="ok", at=T0 + timedelta(seconds=10))
        kinds = [b["type"] for m in t2.request["messages"] for b in m["content"]]
        assert "tool_use" not in kinds


def test_stored_turns_use_the_labs_tokenizer():
    with pc.Lab(progress=False, tokenizer=pc.tokens.CharsTokenizer()) as lab:
        s = lab.session(system=HOST)
        s.step("a", reply="b", at=T0)
        live = s.step("c", reply="d", at=T0 + timedelta(seconds=5))
        stored = s.turn(1)
        assert stored.prepared.total_tokens == live.total_tokens
        assert stored.diff.shared_prefix_tokens == live.diff.shared_prefix_tokens


def test_costs_follow_the_requests_time_and_size_not_the_wall_clock():
    u = pc.Usage(input_tokens=1_000_000, cache_read_input_tokens=0, cache_creation_input_tokens=0,
                 cache_creation_5m_input_tokens=0, cache_creation_1h_input_tokens=0, output_tokens=0)
    ds = pc.analysis.prices_for("deepseek-chat")
    peak = ds.cost(u, datetime(2026, 11, 2, 10, 0, tzinfo=UTC))
    off_peak = ds.cost(u, datetime(2026, 11, 2, 17, 0, tzinfo=UTC))
    assert off_peak < peak  # DeepSeek's off-peak discount, from genai-prices
    assert ds.cost(u) == ds.cost(u)  # no `at`: a fixed reference time, never the wall clock
    sonnet = pc.analysis.prices_for("claude-sonnet-4-5")
    small = pc.Usage(100_000, 0, 0, 0, 0, 0)
    assert sonnet.cost(u, T0) > 10 * sonnet.cost(small, T0)  # above 200k input tokens the tier rate applies


def _every_strategys_bytes(path: str) -> str:
    """One digest of every stored request body of the scenario replayed under each strategy, in one Lab."""
    with pc.Lab(progress=False) as lab:
        out = []
        for name in pc.STRATEGIES:
            s = lab.replay(path, strategy=name)
            out += [hashlib.sha256(pc.request.canonical_bytes(lab.store.turn_body(s.id, i))).hexdigest()
                    for i in range(s.n_turns)]
    return hashlib.sha256("".join(out).encode()).hexdigest()


@pytest.mark.slow
def test_same_scenario_same_bytes_across_processes_and_hash_seeds(scenarios_dir):
    """This process (``PYTHONHASHSEED=0`` in ``make test``, random otherwise) and a fresh interpreter with
    another hash seed replay the same bytes."""
    scenario = str(scenarios_dir / "knowledge_churn.yaml")
    here = os.environ.get("PYTHONHASHSEED")
    seed = "1" if here == "987" else "987"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_session_api as t; "
            "print(t._every_strategys_bytes(sys.argv[2]))")
    with subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent), scenario],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}) as child:  # runs while this one does
        here_bytes = _every_strategys_bytes(scenario)
        out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    assert out.strip() == here_bytes
