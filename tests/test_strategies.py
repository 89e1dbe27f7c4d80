"""The seven context strategies: layouts pinned, characteristic behaviour measured with the real
Anthropic cache model through Lab/Session, and the reference-scenario efficiency."""

from __future__ import annotations

import copy
import importlib
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.request import canonical_bytes
from promptcache_nb.store import Delta, KnowledgeEntry
from promptcache_nb.strategies import DeltaTable, StrategyContext, get_strategy, strategy_class
from promptcache_nb.strategies._base import safe_insert_index
from promptcache_nb.strategies._lore import DURABLE_BANNER, VOLATILE_BANNER
from promptcache_nb.strategies.append_only import hash31

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "scenarios" / "support_agent.yaml"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
TEACHING_ORDER = ("naive", "clock_in_system", "clock_at_tail", "append_only", "rewrite_knowledge",
                  "volatile_delta", "durable_delta")
HOST = "You are the billing support assistant. Answer precisely and cite the ticket. " * 120
TOOLS = [
    {"name": "search_logs", "description": "Search service logs.",
     "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}},
    {"name": "get_ticket", "description": "Fetch a ticket.",
     "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}},
]
KNOWLEDGE = [
    ("pref", "Draft style", "Plain text drafts, signed by the support team.", "preference"),
    ("tz", "Log times are UTC", "Convert ticket local times to UTC before searching logs.", "gotcha"),
    ("lag", "Replica lag", "The SQL replica lags the primary by up to ninety seconds.", "fact"),
    ("inc", "Webhook incident", "Webhook deliveries were delayed in eu-west on 28 October.", "incident"),
]
CALL = {"name": "search_logs", "input": {"q": "timeout"}, "result": "3 matches", "after": 4}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new_session(lab: pc.Lab, strategy: str, **kw) -> pc.Session:
    s = lab.session(strategy, system=kw.pop("system", HOST), tools=TOOLS, project=kw.pop("project", strategy),
                    start=T0, **kw)
    for key, title, content, category in KNOWLEDGE:
        s.knowledge.add(title, content, category=category, key=key, at=T0)
    return s


def texts(block_or_message) -> str:
    content = block_or_message.get("content", block_or_message.get("text"))
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))


def through(t: pc.Turn, path: str) -> int:
    """Estimated tokens of the request's prefix up to and including the segment at ``path``."""
    paths = [s.path for s in t.prepared.segments]
    return t.prepared.cumulative_tokens()[paths.index(path)]


def system_bytes(t: pc.Turn) -> bytes:
    return canonical_bytes(t.request["system"])


@pytest.fixture
def lab():
    with pc.Lab(progress=False) as lab:
        yield lab


# -- the registry --------------------------------------------------------------------------------

def test_registered_in_teaching_order_with_citations():
    assert pc.STRATEGIES == TEACHING_ORDER
    for name in TEACHING_ORDER:
        cls = strategy_class(name)
        module = importlib.import_module(cls.__module__)
        assert cls.name == name and cls.title and cls.source and cls.__doc__
        assert module.__doc__ and "#" in module.__doc__, f"{name}: the module docstring cites its design"
        assert repr(get_strategy(name)).startswith(f"<strategy {name}:")


# -- clock_in_system -----------------------------------------------------------------------------

def test_clock_in_system_layout(lab):
    s = new_session(lab, "clock_in_system")
    body = s.step("Why was acct 7 charged twice?", "Looking.", at=at(0)).request
    static, dynamic = body["system"]
    assert static["cache_control"] == {"type": "ephemeral"} and "cache_control" not in dynamic
    assert static["text"].startswith(HOST) and "\n\n---\n\n## Long-term Knowledge" in static["text"]
    assert dynamic["text"] == (
        "## Current Time\n2026-11-02 09:00 (Monday)\n\n## Runtime\nlinux amd64, agent runtime 1.4")
    assert [t["name"] for t in body["tools"]] == ["get_ticket", "search_logs"]
    assert body["cache_control"] == {"type": "ephemeral"}


def test_clock_in_system_minute_change_reprocesses_history(lab):
    s = new_session(lab, "clock_in_system")
    s.step("first question", "first answer", at=at(0))
    same_minute = s.step("second question", "second answer", at=at(40))
    assert same_minute.cache_reason == "hit"
    assert same_minute.usage.cache_read_input_tokens == s.turn(0).total_tokens
    next_minute = s.step("third question", "third answer", at=at(65))
    # only tools + the static block are read; the whole history after system[1] is written again
    assert next_minute.cache_result.detail["divergence_path"] == "system[1]"
    assert next_minute.usage.cache_read_input_tokens == through(next_minute, "system[0]")
    assert next_minute.usage.cache_read_input_tokens < next_minute.ideal_cache_read


def test_clock_in_system_static_text_cached_by_source_fingerprint(lab):
    s = new_session(lab, "clock_in_system")
    s.step("q0", "a0", at=at(0))
    fp = s._state.strategy_state["extra"]["static_prompt"]["fingerprint"]
    s.step("q1", "a1", at=at(70))
    assert s._state.strategy_state["extra"]["static_prompt"]["fingerprint"] == fp
    s.knowledge.update(s.knowledge.id_for("lag"), content="Replica lag is now under five seconds.")
    t = s.step("q2", "a2", at=at(80))
    assert s._state.strategy_state["extra"]["static_prompt"]["fingerprint"] != fp
    assert "under five seconds" in t.request["system"][0]["text"]


# -- clock_at_tail -------------------------------------------------------------------------------

def test_clock_at_tail_carries_clock_on_the_user_turn(lab):
    s = new_session(lab, "clock_at_tail")
    t0 = s.step("first question", "first answer", at=at(0))
    (system,) = t0.request["system"]
    assert system["cache_control"] == {"type": "ephemeral"}
    assert "## Current Time" not in texts(t0.request["system"][0])
    assert [t["name"] for t in t0.request["tools"]] == ["get_ticket", "search_logs"]
    carrier, user = t0.request["messages"][0]["content"]
    assert carrier["text"].startswith("<runtime_context>\n## Current Time\n2026-11-02 09:00 (Monday)")
    assert user == {"type": "text", "text": "first question"}
    loop = s.step("check the logs", "found it", at=at(75), tool_calls=[CALL, CALL])
    msgs = loop.request["messages"]
    # the old message replays its 09:00 carrier; the active user turn has 09:01, tool results have none
    assert msgs[0]["content"][0] == carrier
    assert "2026-11-02 09:01 (Monday)" in msgs[2]["content"][0]["text"]
    assert [texts(m).count("<runtime_context>") for m in msgs] == [1, 0, 1, 0, 0, 0, 0]
    # minute changes never break: every request reads all the previous one wrote
    for i in range(1, s.n_turns):
        assert s.turn(i).cache_reason == "hit", i
    s.knowledge.update(s.knowledge.id_for("tz"), content="Logs are UTC; tickets show local time.")
    changed = s.step("and now?", "ok", at=at(130))
    assert changed.cache_result.detail["divergence_path"] == "system[0]"
    assert changed.usage.cache_read_input_tokens < changed.ideal_cache_read


def test_clock_at_tail_restart_replays_old_carriers(lab):
    s = new_session(lab, "clock_at_tail")
    s.step("q0", "a0", at=at(0))
    s.step("q1", "a1", at=at(70))
    s = s.restart()
    t = s.step("q2", "a2", at=at(140))
    assert [m["content"][0]["text"].split("\n")[2] for m in t.request["messages"][::2]] == [
        "2026-11-02 09:00 (Monday)", "2026-11-02 09:01 (Monday)", "2026-11-02 09:02 (Monday)"]
    assert t.cache_reason == "hit"


# -- append_only ---------------------------------------------------------------------------------

def test_hash31_matches_the_javascript_string_hash():
    assert hash31("abc") == "22ci"  # 96354, Java's "abc".hashCode()
    assert hash31("polygenelubricants") == "zik0zk"  # -2**31 as signed, 2**31 after >>> 0


def test_append_only_frozen_prefix_and_log(lab):
    s = new_session(lab, "append_only")
    t0 = s.step("q0", "a0", at=at(0))
    assert [t["name"] for t in t0.request["tools"]] == ["search_logs", "get_ticket"]  # order counts
    host, knowledge = t0.request["system"]
    assert host == {"type": "text", "text": HOST} and knowledge["cache_control"] == {"type": "ephemeral"}
    assert t0.request["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    extra = s._state.strategy_state["extra"]
    assert (extra["prefix"]["version"], extra["prefix_rebuilt"], extra["last_sync"]) == (1, True, "append")
    t1 = s.step("q1", "a1", at=at(30))
    assert (s._state.strategy_state["extra"]["prefix"]["version"], s._state.strategy_state["extra"]["prefix_rebuilt"]) == (1, False)
    assert t1.cache_reason == "hit"
    s.knowledge.add("New gotcha", "Retries after 24h are new charges.", category="gotcha")
    t2 = s.step("q2", "a2", at=at(60))
    extra = s._state.strategy_state["extra"]
    assert (extra["prefix"]["version"], extra["prefix_rebuilt"]) == (2, True)
    assert t2.cache_result.detail["divergence_path"] == "system[1]"
    # the log is what the previous request was built from: the session's history, never rewritten into state
    assert "log" not in extra and len(s._state.built_messages) == 5
    s.compact("We discussed three questions.")
    s.step("q3", "a3", at=at(90))
    assert s._state.strategy_state["extra"]["last_sync"] == "shrink"  # 5 messages synced, 3 now: clear and resend
    # ... also after a restart: the synced history (3 messages) comes back from the store, compacted rows too
    s.compact("Another summary.")
    s = s.restart()
    s.step("q4", "a4", at=at(120))
    assert s._state.strategy_state["extra"]["last_sync"] == "rewrite@0"  # 3 synced, 3 now, the first one rewritten


def test_append_only_rewrite_keeps_the_longest_unchanged_run(lab):
    s = new_session(lab, "append_only")
    s.step("q0", "a0", at=at(0))
    s.compact("Summary.")  # 1 message synced; now 3, the first one rewritten
    s.step("q1", "a1", at=at(30))
    assert s._state.strategy_state["extra"]["last_sync"] == "rewrite@0"


# -- rewrite_knowledge ---------------------------------------------------------------------------

def test_rewrite_knowledge_layout_and_rerank_invariance(lab):
    s = new_session(lab, "rewrite_knowledge")
    t0 = s.step("replica lag ninety seconds sql", "ok", at=at(0))
    host, stable, context = t0.request["system"]
    assert host == {"type": "text", "text": HOST}
    assert stable["cache_control"] == {"type": "ephemeral", "ttl": "1h"} and "Draft style" in stable["text"]
    assert "cache_control" not in context and "Draft style" not in context["text"]
    assert context["text"].index("Replica lag") < context["text"].index("Webhook incident")
    assert t0.request["cache_control"] == {"type": "ephemeral"}
    assert s._state.strategy_state["ltm_pin_keys"] == sorted(e.pin_key for e in s.knowledge if e.category != "preference")
    # a query that would rank the incident first changes nothing: the key set is unchanged
    t1 = s.step("webhook incident eu-west delayed deliveries", "ok", at=at(30))
    assert system_bytes(t1) == system_bytes(t0) and t1.cache_reason == "hit"


def test_rewrite_knowledge_change_breaks_at_system_2(lab):
    s = new_session(lab, "rewrite_knowledge")
    t0 = s.step("q0", "a0", at=at(0))
    s.step("q1", "a1", at=at(30))
    s.knowledge.update(s.knowledge.id_for("inc"), content="Postmortem published: a Kafka rebalance.")
    t2 = s.step("q2", "a2", at=at(60))
    assert t2.request["system"][:2] == t0.request["system"][:2]
    assert "Kafka rebalance" in t2.request["system"][2]["text"]
    assert t2.cache_result.detail["divergence_path"] == "system[2]"
    assert t2.usage.cache_read_input_tokens == through(t2, "system[1]") < t2.ideal_cache_read


# -- volatile_delta ------------------------------------------------------------------------------

def test_volatile_delta_breaks_the_request_after_a_delta(lab):
    s = new_session(lab, "volatile_delta")
    t0 = s.step("q0", "a0", at=at(0))
    s.step("q1", "a1", at=at(30))
    s.knowledge.update(s.knowledge.id_for("lag"), content="Replica lag is under five seconds now.")
    t2 = s.step("q2", "a2", at=at(60))
    delta = t2.request["messages"][-2]
    assert texts(delta).startswith(VOLATILE_BANNER) and "under five seconds" in texts(delta)
    assert t2.cache_reason == "hit" and system_bytes(t2) == system_bytes(t0)
    t3 = s.step("q3", "a3", at=at(90))
    assert not any(VOLATILE_BANNER in texts(m) for m in t3.request["messages"])
    assert t3.cache_reason == "prefix_changed"
    assert t3.usage.cache_read_input_tokens < t3.ideal_cache_read
    assert s.deltas().empty  # nothing persisted


# -- durable_delta -------------------------------------------------------------------------------

def _delta_texts(t: pc.Turn) -> list[str]:
    return [texts(m) for m in t.request["messages"] if texts(m).startswith(DURABLE_BANNER)]


def test_durable_delta_layout_and_breakpoints(lab):
    s = new_session(lab, "durable_delta")
    s.step("q0", "a0", at=at(0))
    t = s.step("q1", "a1", at=at(30))
    host, stable, context = t.request["system"]
    assert host["text"] == HOST and "cache_control" not in host
    assert stable["cache_control"] == context["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert s._state.strategy_state["stable_ltm_text"] == stable["text"] and s._state.strategy_state["ltm_pin_text"] == context["text"]
    assert "cache_control" not in t.request
    assert t.cache_result.detail["breakpoints"] == [
        "system[1]", "system[2]", "messages[0].content[0]", "messages[2].content[0]"]
    assert t.cache_result.detail["breakpoint_ttls"] == ["1h", "1h", "5m", "5m"]


def test_durable_delta_keeps_system_and_surfaces_every_change(lab):
    s = new_session(lab, "durable_delta")
    turns = [s.step("q0", "a0", at=at(0)), s.step("q1", "a1", at=at(30))]
    system = system_bytes(turns[0])
    # (method, args, kwargs, what the next request must show); always the live session's book
    changes = [
        ("update", ["lag"], {"content": "Replica lag is under five seconds now."}, "under five seconds"),
        ("add", ["Idempotency window", "Adyen keys expire after 24 hours."], {"category": "gotcha"},
         "Adyen keys expire"),
        ("remove", ["inc"], {}, f"* [{s.knowledge.id_for('inc')[:8]}]"),
        ("update", ["pref"], {"content": "Drafts open with the ticket number."}, "ticket number"),
    ]
    for i, (method, args, kwargs, visible) in enumerate(changes):
        if method != "add":
            args = [s.knowledge.id_for(args[0])]
        getattr(s.knowledge, method)(*args, **kwargs)
        t = s.step(f"q{i + 2}", f"a{i + 2}", at=at(60 + 30 * i))
        assert visible in _delta_texts(t)[-1], i  # visible in the very next request
        assert system_bytes(t) == system, i
        assert t.cache_reason == "hit" and t.usage.cache_read_input_tokens == t.ideal_cache_read, i
        turns.append(t)
        s = s.restart()
    assert "## Superseded Long-term Knowledge" in _delta_texts(turns[-1])[-1]
    rows = s.deltas()
    assert len(rows) == 4
    # each row replays byte-identically at its own position on every later request
    final = s.step("q9", "a9", at=at(300))
    for seq, row in enumerate(rows.itertuples()):
        insert_at = json.loads(row.selector)["insertAt"]
        message = json.loads(row.content)
        assert final.request["messages"][insert_at + seq] == message
    assert system_bytes(final) == system and final.cache_reason == "hit"


def test_durable_delta_is_cumulative_and_appends_only_on_a_new_key_set(lab):
    s = new_session(lab, "durable_delta")
    s.step("q0", "a0", at=at(0))
    s.knowledge.update(s.knowledge.id_for("lag"), content="Replica lag is under five seconds now.")
    s.step("q1", "a1", at=at(30))
    s.step("q2 webhook incident", "a2", at=at(60))  # nothing changed: no new row, even re-ranked
    assert len(s.deltas()) == 1
    s.knowledge.update(s.knowledge.id_for("tz"), content="Logs are UTC, tickets local.")
    s.step("q3", "a3", at=at(90))
    rows = [json.loads(c) for c in s.deltas().content]
    assert len(rows) == 2
    second = texts(rows[1])
    assert "under five seconds" in second and "Logs are UTC, tickets local." in second
    assert second.index("Logs are UTC") < second.index("under five seconds")  # newest change first
    lag = s.knowledge.get(s.knowledge.id_for("lag"))
    assert lag.pin_key not in s._state.strategy_state["ltm_pin_keys"]  # the baseline stays frozen at the first pin
    assert any(k.startswith(lag.id + ":") for k in s._state.strategy_state["ltm_pin_keys"])
    assert s._state.strategy_state["ltm_cache_text"] == s._state.strategy_state["ltm_pin_text"]  # Lore resets the cache to the pin


def test_durable_delta_rerank_alone_changes_nothing(lab):
    s = new_session(lab, "durable_delta")
    t0 = s.step("replica lag sql", "ok", at=at(0))
    t1 = s.step("webhook incident eu-west", "ok", at=at(30))
    t2 = s.step("convert ticket local times utc logs", "ok", at=at(60))
    assert system_bytes(t0) == system_bytes(t1) == system_bytes(t2)
    assert s.deltas().empty and t2.cache_reason == "hit"


def test_durable_delta_truncates_into_listed_sections(lab):
    s = new_session(lab, "durable_delta", strategy_params={"delta_budget_tokens": 50})
    s.step("q0", "a0", at=at(0))
    ids = []
    for i in range(6):
        ids.append(s.knowledge.add(f"Runbook {i}", f"Step {i}: " + "check the ledger twice. " * 30,
                                   category="procedure", key=f"rb{i}"))
    t = s.step("q1", "a1", at=at(30))
    text = _delta_texts(t)[-1]
    shown, rest = text.split("\n\n## Additional Changed Knowledge (truncated)\n\n")
    assert sum(f"[{i[:8]}]" in shown for i in ids) == 1  # nothing fits 200 chars: the first, alone
    lines = rest.split("\n")
    listed = [line for line in lines if line.startswith("* **[")]
    assert len(listed) == 3 and listed == sorted(listed)
    assert all(line.endswith("...") and len(line.split("**: ")[1]) == 503 for line in listed)
    assert lines[-1] == (
        "* 2 more changed entries omitted; older pinned system[2] entries for those IDs are stale.")


def test_durable_delta_never_inserted_after_tool_use():
    entries = [KnowledgeEntry("a" * 26, "p", 1, "Lag", "ninety seconds", "fact", False, T0),
               KnowledgeEntry("b" * 26, "p", 1, "Tz", "UTC logs", "gotcha", False, T0)]
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "check"}]}, use, result]
    state = {"host_prompt": "H", "tools": [], "model": "m", "extra": {}}
    strategy = get_strategy("durable_delta")
    first = StrategyContext("s", "p", 0, T0, "m", "H", [], entries[:1], messages[:3], (), state,
                            DeltaTable([]))
    strategy.build(first)
    deltas = DeltaTable(first.deltas.list())
    ctx = StrategyContext("s", "p", 1, T0, "m", "H", [], entries, messages, (), state, deltas)
    out = strategy.build(ctx)["messages"]
    assert deltas.list()[0].selector == {"target": "messages", "insertAt": 3}
    assert [m["role"] for m in out] == ["user", "assistant", "user", "user", "assistant", "user"]
    assert texts(out[3]).startswith(DURABLE_BANNER) and out[4]["content"][0]["type"] == "tool_use"
    assert safe_insert_index([*messages, use, result], 6) == 5
    assert safe_insert_index([messages[0], use], 2) == 1


def test_durable_delta_reanchors_on_compaction(lab):
    s = new_session(lab, "durable_delta")
    t0 = s.step("q0", "a0", at=at(0))
    s.knowledge.update(s.knowledge.id_for("lag"), content="Replica lag is under five seconds now.")
    s.step("q1", "a1", at=at(30))
    s.step("q2", "a2", at=at(60))
    s.compact("We talked about replica lag.")
    t = s.step("q3", "a3", at=at(90))
    rows = s.deltas()
    assert len(rows) == 1 and json.loads(rows.selector[0]) == {"target": "messages", "insertAt": 2}
    assert "under five seconds" in texts(t.request["messages"][2])
    assert system_bytes(t) == system_bytes(t0)
    assert t.usage.cache_read_input_tokens == t.ideal_cache_read == through(t, "system[2]")


def test_durable_delta_corrupt_pin_keys_repin_once(lab):
    s = new_session(lab, "durable_delta")
    s.step("q0", "a0", at=at(0))
    lab.store.con.execute(
        """UPDATE session_state SET ltm_pin_keys = '{"corrupt": true}' WHERE session_id = ?""", [s.id]
    ).fetchall()
    s = s.restart()
    s.step("q1", "a1", at=at(30))
    keys = s._state.strategy_state["ltm_pin_keys"]
    assert keys == sorted(e.pin_key for e in s.knowledge if e.category != "preference")
    t2 = s.step("q2", "a2", at=at(60))
    assert s._state.strategy_state["ltm_pin_keys"] == keys and s.deltas().empty and t2.cache_reason == "hit"


def test_move_sessions_carries_durable_delta_rows(lab):
    s = new_session(lab, "durable_delta", project="before")
    s.step("q0", "a0", at=at(0))
    s.knowledge.update(s.knowledge.id_for("lag"), content="Replica lag is under five seconds now.")
    t1 = s.step("q1", "a1", at=at(30))
    assert lab.move_sessions("before", "after") == 1
    assert lab.sql("SELECT project_id FROM session_prompt_deltas").project_id.tolist() == ["after"]
    s = s.restart()
    t2 = s.step("q2", "a2", at=at(60))
    assert _delta_texts(t2)[0] == _delta_texts(t1)[0] and t2.cache_reason == "hit"
    assert system_bytes(t2) == system_bytes(t1)
    # knowledge stays with its project (Lore's moveSessions): the new project's empty set supersedes it all
    assert _delta_texts(t2)[1].count("\n* [") == len(KNOWLEDGE)


# -- every strategy ------------------------------------------------------------------------------

def _context(name: str, messages: list, state: dict) -> StrategyContext:
    entries = [KnowledgeEntry(f"{c}" * 26, "p", 1, f"T{c}", f"content {c}", cat, False, T0)
               for c, cat in (("a", "fact"), ("b", "preference"), ("c", "gotcha"))]
    deltas = DeltaTable([Delta(0, {"target": "messages", "insertAt": 1}, {"role": "user", "content": "d"})])
    return StrategyContext("s", "p", 3, T0, "claude-sonnet-4-5", "H", copy.deepcopy(TOOLS), entries, messages,
                           ("knowledge_add:aaaaaaaa",), state, deltas)


@pytest.mark.parametrize("name", TEACHING_ORDER)
def test_build_is_pure_and_state_is_json(name):
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]}
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "check"}]}, use,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]
    frozen = copy.deepcopy(messages)
    state = {"host_prompt": "H", "tools": TOOLS, "model": "m", "extra": {}}
    a = _context(name, messages, copy.deepcopy(state))
    b = _context(name, copy.deepcopy(frozen), copy.deepcopy(state))
    body_a, body_b = get_strategy(name).build(a), get_strategy(name).build(b)
    assert messages == frozen, "build must never mutate ctx.messages"
    assert canonical_bytes(body_a) == canonical_bytes(body_b)
    assert json.loads(json.dumps(a.state)) == a.state
    for d in a.deltas.list():
        assert json.loads(json.dumps([d.selector, d.content])) == [d.selector, d.content]




# -- the reference scenario ----------------------------------------------------------------------

DETERMINISM_TURNS = 6  # 16 requests: a 6-call tool loop and a knowledge addition


def _stored_bodies(lab: pc.Lab, s: pc.Session, n: int) -> list[bytes]:
    return [canonical_bytes(lab.store.turn_body(s.id, i)) for i in range(n)]


@pytest.fixture(scope="module")
def reference_runs(stored_replay, tmp_path_factory):
    """Each strategy replayed on the reference scenario in its own fresh Lab (conftest's stored replays,
    made once per test run; read here from a copy)."""
    out = {}
    n = sum(1 + len(t.tool_calls) for t in pc.load_scenario(REFERENCE).turns[:DETERMINISM_TURNS])
    for name, stored in stored_replay.many(TEACHING_ORDER, REFERENCE).items():
        copy = tmp_path_factory.mktemp("reference") / stored.path.name
        shutil.copyfile(stored.path, copy)
        with pc.Lab(copy, progress=False) as lab:
            s = lab.session(id=stored.session_id)
            out[name] = (s.efficiency(), s.turns(), _stored_bodies(lab, s, n))
    return out


@pytest.mark.parametrize("name", TEACHING_ORDER)
def test_two_replays_are_byte_identical(name, reference_runs):
    """Same scenario, two fresh Labs: every stored request body is the same, byte for byte."""
    with pc.Lab(progress=False) as lab:
        s = lab.replay(REFERENCE, strategy=name, stop_after=DETERMINISM_TURNS)
        again = _stored_bodies(lab, s, s.n_turns)
    assert again == reference_runs[name][2] and len(again) == 16


def test_reference_scenario_efficiency(reference_runs, capsys):
    rows = []
    for name, (eff, df, _) in reference_runs.items():
        read = df.cache_read_input_tokens.sum() / df.total_tokens.sum()
        rows.append(f"{name:18s} cache_read={read:6.1%} efficiency={eff:6.1%} cost=${df.cost_usd.sum():.4f}")
    with capsys.disabled():
        print("\nsupport_agent.yaml:\n" + "\n".join(rows))
    effs = {name: run[0] for name, run in reference_runs.items()}
    assert effs["durable_delta"] >= 0.98
    assert effs["naive"] < effs["clock_in_system"] < effs["clock_at_tail"] < effs["rewrite_knowledge"]
    assert effs["rewrite_knowledge"] < effs["durable_delta"]


def test_durable_delta_never_reads_less_than_ideal_on_the_reference(reference_runs):
    df = reference_runs["durable_delta"][1]
    assert (df.cache_read_input_tokens >= df.ideal_cache_read).all()
    assert set(df.cache_reason) <= {"cold", "hit", "ttl_expired"}


# -- append_only: the fast paths send what the plain algorithm sends ------------------------------

def _hash31_loop(text: str) -> str:
    """The JavaScript loop, one UTF-16 unit at a time (what the vectorised hash31 must equal)."""
    from promptcache_nb.strategies.append_only import _base36
    h, data = 0, text.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h = ((h << 5) - h + (data[i] | data[i + 1] << 8)) & 0xFFFFFFFF
    return _base36(h)


def test_hash31_vectorised_matches_the_loop():
    import random
    rng = random.Random(7)
    cases = ["", "a", "é😀\U0010ffff\x00", "x" * 65535, "y" * 65536, "z" * 65537, HOST]
    for n in (1, 31, 1000, 70_000, 140_001):  # around and across the 65,536-unit chunks, surrogate pairs too
        cases.append("".join(chr(rng.choice((rng.randint(0, 0x7F), rng.randint(0x80, 0xD7FF),
                                             rng.randint(0xE000, 0x10FFFF)))) for _ in range(n)))
    for text in cases:
        assert hash31(text) == _hash31_loop(text), len(text)


def test_append_only_prefix_fingerprint_memo_is_exact():
    """The memo is keyed by the hashed text: values Python calls equal but JSON writes differently (1, 1.0,
    True; key order) get their own fingerprints, each the one the plain computation gives."""
    from promptcache_nb.strategies.append_only import prefix_fingerprint

    def plain(system, tools):
        t = [{"n": x.get("name"), "d": x.get("description"), "p": x.get("input_schema")} for x in tools]
        return _hash31_loop(json.dumps({"s": system, "t": t}, separators=(",", ":"), ensure_ascii=False))

    def tool(schema):
        return [{"name": "t", "description": "d", "input_schema": schema}]

    variants = [tool({"minimum": 1}), tool({"minimum": 1.0}), tool({"minimum": True}),
                tool({"a": 1, "b": 2}), tool({"b": 2, "a": 1}), copy.deepcopy(TOOLS)]
    seen = set()
    for _ in range(2):  # cold, then from the memo
        for system in (["H"], ["H", "K"], [HOST]):
            for tools in variants:
                fp = prefix_fingerprint(system, tools)
                assert fp == plain(system, tools)
                seen.add(fp)
    assert len(seen) == 3 * len(variants)


def test_append_only_reuses_tools_only_when_their_json_is_the_same():
    s = strategy_class("append_only")()
    one, other = [{"name": "t", "input_schema": {"minimum": 1}}], [{"name": "t", "input_schema": {"minimum": 1.0}}]
    a = s._same_tools(one)
    assert a == one and a[0] is not one[0]  # a private copy
    assert s._same_tools(copy.deepcopy(one))[0] is a[0]  # same JSON: the same objects, prepare() knows them
    b = s._same_tools(other)
    assert json.dumps(b) == json.dumps(other) and b[0] is not a[0]
    reordered = [{"input_schema": {"minimum": 1.0}, "name": "t"}]
    assert json.dumps(s._same_tools(reordered)) == json.dumps(reordered)  # key order kept, as sent


def test_append_only_digest_memo_keeps_only_the_live_history():
    messages = [{"role": "user", "content": [{"type": "text", "text": f"m{i}"}]} for i in range(4)]
    s = strategy_class("append_only")()
    ctx = _context("append_only", messages, {"host_prompt": "H", "tools": TOOLS, "model": "m", "extra": {}})
    s.build(ctx)  # first request: synced through the digests
    assert ctx.extra["last_sync"] == "append" and len(s._digest._memo) == 4
    grown = [*messages, {"role": "assistant", "content": [{"type": "text", "text": "r"}]}]
    ctx = _context("append_only", grown, ctx.state)
    ctx.previous_messages = messages
    s.build(ctx)  # the same objects lead: an append, no digest looked at
    assert ctx.extra["last_sync"] == "append" and len(s._digest._memo) == 4
    summary = [{"role": "user", "content": [{"type": "text", "text": "summary"}]}, *grown[2:]]
    ctx = _context("append_only", summary, ctx.state)
    ctx.previous_messages = grown
    s.build(ctx)  # compaction shrank the history
    assert ctx.extra["last_sync"] == "shrink"
    assert {id(m) for m, _ in s._digest._memo.values()} == {id(m) for m in summary}  # the dropped ones forgotten


def _original_append_only_build(self, ctx):
    """``AppendOnly.build`` as it was before its fast paths (the digests of every message synced through
    ``sync_messages`` each request, tools and the marked system block made afresh)."""
    from promptcache_nb.strategies import append_only as ao
    system_prompt, tools, rebuilt = ao.build_prefix(ctx)
    ctx.extra["prefix_rebuilt"] = rebuilt
    prev = ctx.previous_messages
    digest = lambda m: ao.fingerprint(m)[:16]  # noqa: E731
    ctx.extra["last_sync"] = ao.sync_messages(ctx, [digest(m) for m in ctx.messages],
                                              None if prev is None else [digest(m) for m in prev])
    system = [ao.text_block(part) for part in system_prompt]
    system[-1] = ao.with_cache_control(system[-1], ao.EPHEMERAL)
    messages = list(ctx.messages)
    last = ao.last_markable_index(messages)
    if last is not None:
        ao.mark_message(messages, last, ao.EPHEMERAL)
    return {"model": ctx.model, "max_tokens": ao.DEFAULT_MAX_TOKENS, "system": system, "tools": tools,
            "messages": messages}


def _with_restarts(sc: pc.Scenario) -> pc.Scenario:
    """``sc`` (compaction.yaml: compacted before turn 8) with two more compactions, the first with a restart
    (turn 10 has no tool call: 3 messages synced), the second rewriting those 3 without shrinking them, and a
    restart alone: the slow sync paths (shrink, rewrite@0), also across a resume from the store."""
    from dataclasses import replace

    from promptcache_nb.scenario import Compaction, Restart
    extra = {10: (Compaction("Another summary."), Restart()), 11: (Compaction("A third summary."),),
             12: (Restart(),)}
    turns = tuple(replace(t, events=t.events + extra.get(i, ())) for i, t in enumerate(sc.turns))
    return replace(sc, turns=turns)


@pytest.mark.parametrize("scenario", ["compaction", "compaction+restarts", "mcp_reconnect", "knowledge_churn"])
def test_append_only_fast_paths_build_the_original_bodies(scenario, monkeypatch):
    """Every scenario event (compaction, restart, tool change, knowledge churn): the bodies the strategy
    builds (key order kept) and stores, and its ``extra``, equal those of the original algorithm (plain hash
    loop, no fingerprint memo, every digest synced)."""
    from promptcache_nb.strategies import append_only as ao
    sc = pc.load_scenario(REFERENCE.parent / f"{scenario.split('+')[0]}.yaml")
    if scenario.endswith("+restarts"):
        sc = _with_restarts(sc)

    def run(build):
        seen = []

        def recording(self, ctx):
            body = build(self, ctx)
            seen.append((json.dumps(body, ensure_ascii=False), json.dumps(ctx.extra, sort_keys=True)))
            return body

        with monkeypatch.context() as m:
            m.setattr(ao.AppendOnly, "build", recording)
            with pc.Lab(progress=False) as lab:
                s = lab.replay(sc, strategy="append_only")
                return seen, _stored_bodies(lab, s, s.n_turns)

    fast = run(ao.AppendOnly.build)
    with monkeypatch.context() as m:
        m.setattr(ao, "prefix_fingerprint", lambda system, tools: _hash31_loop(json.dumps(
            {"s": system, "t": [{"n": t.get("name"), "d": t.get("description"), "p": t.get("input_schema")}
                                for t in tools]}, separators=(",", ":"), ensure_ascii=False)))
        original = run(_original_append_only_build)
    assert fast[0] == original[0] and fast[1] == original[1] and len(fast[1]) == len(fast[0]) == sc.n_requests
    syncs = {json.loads(extra)["last_sync"] for _, extra in fast[0]}
    if scenario.startswith("compaction"):
        assert syncs - {"append"}, syncs  # the slow path (a rewritten or shrunk history) was taken too
    if scenario.endswith("+restarts"):
        assert {"shrink", "rewrite@0"} <= syncs, syncs
