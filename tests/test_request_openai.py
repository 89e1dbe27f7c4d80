"""OpenAI Chat Completions and Responses bodies, OpenAI usage, partial bodies (unlogged prefix) and the
linear untrusted prepare (reuse of the previous request's segments)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import promptcache_nb as pc
from promptcache_nb.dialects import usage_from_openai
from promptcache_nb.request import (
    UNLOGGED_PATH,
    LoggedBody,
    canonical_bytes,
    compute_diff,
    detect_dialect,
    prepare,
    rebuild_body,
    segment_offset,
    shared_prefix_of,
)
from promptcache_nb.request._canonical import RESPONSES_ITEM_TYPES
from promptcache_nb.usage import Usage

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)

CHAT_TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_invoice", "description": "Fetch an invoice by its number.",
        "parameters": {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}}},
    {"type": "custom", "custom": {"name": "run_sql", "description": "Run a read-only SQL query."}},
]


def chat_body() -> dict:
    return {
        "model": "gpt-4.1", "max_completion_tokens": 800, "temperature": 0.2,
        "tools": copy.deepcopy(CHAT_TOOLS),
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}},
        "messages": [
            {"role": "developer", "content": "You answer billing questions for Acme's finance team."},
            {"role": "system", "content": [{"type": "text", "text": "Quote invoice numbers exactly."}]},
            {"role": "user", "name": "dana", "content": [
                {"type": "text", "text": "Why was INV-2291 prorated?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
                {"type": "file", "file": {"file_id": "file-abc"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "lookup_invoice", "arguments": "{\"number\":\"INV-2291\"}"}},
                {"id": "call_2", "type": "custom", "custom": {"name": "run_sql", "input": "select 1"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"amount\": 1200.0, \"days\": 12}"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "1"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "It started mid-cycle."},
                                              {"type": "refusal", "refusal": "I can't share card data."}],
             "refusal": None, "annotations": []},
            {"role": "function", "name": "legacy", "content": "ok"},
            {"role": "user", "content": "Thanks — and INV-2292?"},
        ],
    }


# One input item of every documented type (openai SDK ResponseInputItemParam), in realistic shapes.
ALL_ITEMS = [
    {"role": "user", "content": "Summarise the failing build."},  # EasyInputMessage: no type
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
    {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "See the screenshot."},
        {"type": "input_image", "image_url": "https://example.test/ci.png", "detail": "auto"},
        {"type": "input_file", "file_id": "file-123"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Check the logs first."}],
     "encrypted_content": "gAAAAB..."},
    {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "read_log",
     "arguments": "{\"job\":\"build-42\"}"},
    {"type": "function_call_output", "call_id": "call_a", "output": "error: missing semicolon at main.ts:3"},
    {"type": "custom_tool_call", "call_id": "call_b", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "custom_tool_call_output", "call_id": "call_b", "output": "patched"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed",
     "action": {"type": "search", "query": "ts error TS1005"}},
    {"type": "file_search_call", "id": "fs_1", "queries": ["tsconfig"], "status": "completed"},
    {"type": "computer_call", "id": "cu_1", "call_id": "call_c", "status": "completed",
     "action": {"type": "click", "button": "left", "x": 10, "y": 20}, "pending_safety_checks": []},
    {"type": "computer_call_output", "call_id": "call_c",
     "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="}},
    {"type": "local_shell_call", "id": "ls_1", "call_id": "call_d", "status": "completed",
     "action": {"type": "exec", "command": ["npm", "test"], "env": {}}},
    {"type": "local_shell_call_output", "id": "ls_1", "output": "1 failing"},
    {"type": "shell_call", "call_id": "call_e", "action": {"commands": ["ls"]}, "status": "completed"},
    {"type": "shell_call_output", "call_id": "call_e", "output": [
        {"stdout": "src\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
    {"type": "apply_patch_call", "call_id": "call_f", "status": "completed",
     "operation": {"type": "update_file", "path": "src/main.ts", "diff": "@@\n-a\n+a;"}},
    {"type": "apply_patch_call_output", "call_id": "call_f", "status": "completed"},
    {"type": "mcp_list_tools", "id": "ml_1", "server_label": "ci", "tools": [{"name": "rerun", "input_schema": {}}]},
    {"type": "mcp_approval_request", "id": "mr_1", "server_label": "ci", "name": "rerun", "arguments": "{}"},
    {"type": "mcp_approval_response", "approval_request_id": "mr_1", "approve": True},
    {"type": "mcp_call", "id": "mc_1", "server_label": "ci", "name": "rerun", "arguments": "{}", "output": "queued"},
    {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": None},
    {"type": "code_interpreter_call", "id": "ci_1", "container_id": "cntr_1", "code": "print(1)",
     "status": "completed", "outputs": [{"type": "logs", "logs": "1"}]},
    {"type": "tool_search_call", "id": "ts_1", "call_id": "call_g", "arguments": {"query": "deploy"},
     "status": "completed"},
    {"type": "tool_search_output", "call_id": "call_g", "tools": [], "status": "completed"},
    {"type": "additional_tools", "tools": [{"type": "function", "name": "deploy", "parameters": {}}]},
    {"type": "configuration_update", "id": "cfg_1"},
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB..."},
    {"type": "compaction_trigger"},
    {"type": "program", "id": "pg_1", "call_id": "call_h", "code": "await tools.read()", "fingerprint": "fp"},
    {"type": "program_output", "id": "po_1", "call_id": "call_h", "result": "ok", "status": "completed"},
    {"type": "item_reference", "id": "msg_0"},
    {"id": "rs_0"},  # item_reference: the type is optional
]


def responses_body() -> dict:
    return {
        "model": "gpt-5.3-codex", "instructions": "You are a coding agent working in this repository.",
        "max_output_tokens": 2000, "reasoning": {"effort": "medium"}, "store": False,
        "tools": [{"type": "function", "name": "read_log", "description": "Read a CI log.",
                   "parameters": {"type": "object", "properties": {"job": {"type": "string"}}}},
                  {"type": "web_search"}, {"type": "custom", "name": "apply_patch"},
                  {"type": "mcp", "server_label": "ci", "server_url": "https://ci.example.test/mcp"}],
        "text": {"format": {"type": "text"}, "verbosity": "low"},
        "input": copy.deepcopy(ALL_ITEMS),
    }


def stored_roundtrip(p: pc.request.PreparedRequest) -> dict:
    return rebuild_body(p.shape, p.rest, [(s.kind, s.role, s.element) for s in p.segments])


def same_segments(a: pc.request.PreparedRequest, b: pc.request.PreparedRequest) -> None:
    assert [(s.path, s.kind, s.role, s.content_hash, s.block_hash, s.tokens, s.nbytes, s.cache_control)
            for s in a.segments] == [
           (s.path, s.kind, s.role, s.content_hash, s.block_hash, s.tokens, s.nbytes, s.cache_control)
           for s in b.segments]
    assert [canonical_bytes(s.element) for s in a.segments] == [canonical_bytes(s.element) for s in b.segments]
    assert a.shape == b.shape and a.rest == b.rest and a.total_tokens == b.total_tokens


# -- Chat Completions -----------------------------------------------------------------------------

def test_chat_body_segments_in_prefix_order_with_paths_kinds_and_roles():
    p = prepare(chat_body())
    assert p.dialect == "openai-chat"
    assert [(s.path, s.kind, s.role) for s in p.segments] == [
        ("tools[0]", "tool", None), ("tools[1]", "tool", None), ("response_format", "schema", None),
        ("messages[0]", "msg-whole", "developer"), ("messages[1]", "msg-whole", "system"),
        ("messages[2]", "msg-whole", "user"), ("messages[3]", "msg-whole", "assistant"),
        ("messages[4]", "msg-whole", "tool"), ("messages[5]", "msg-whole", "tool"),
        ("messages[6]", "msg-whole", "assistant"), ("messages[7]", "msg-whole", "function"),
        ("messages[8]", "msg-whole", "user")]
    assert set(p.rest) == {"model", "max_completion_tokens", "temperature"}
    assert all(s.tokens > 0 for s in p.segments) and p.total_tokens == sum(s.tokens for s in p.segments)
    # tool calls and tool results are counted, not just framed
    call = p.segments[6]
    assert call.tokens > prepare({**chat_body(), "messages": [{"role": "assistant", "content": ""}]}).segments[-1].tokens


def test_chat_round_trip_is_byte_exact_and_prepares_back_to_the_same_segments():
    body = chat_body()
    p = prepare(body)
    back = stored_roundtrip(p)
    assert isinstance(back, LoggedBody) and back.dialect == "openai-chat"
    assert canonical_bytes(back) == canonical_bytes(body) and back == body
    same_segments(prepare(back), p)


def test_segment_offsets_point_at_each_segment_in_the_canonical_bytes():
    for body in (chat_body(), responses_body(), {**responses_body(), "input": "Fix the build."}):
        p = prepare(body)
        raw = canonical_bytes(p.body)
        for i, s in enumerate(p.segments):
            off = segment_offset(p, i)
            assert raw[off : off + s.nbytes] == canonical_bytes(s.element), s.path


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b["messages"].append({"role": "robot", "content": "x"}), "messages[9].role: unknown role 'robot'"),
    (lambda b: b["messages"][0].update(colour="red"), "messages[0].colour: unknown key for a 'developer' message"),
    (lambda b: b["messages"][4].pop("tool_call_id"), "messages[4].tool_call_id: required"),
    (lambda b: b["messages"][2]["content"].append({"type": "video", "url": "x"}),
     "messages[2].content[4].type: unknown content part type 'video' for a 'user' message"),
    (lambda b: b["messages"][3]["tool_calls"].append({"type": "magic"}),
     "messages[3].tool_calls[2].type: unknown tool call type 'magic'"),
    (lambda b: b["tools"].append({"type": "retrieval"}), "tools[2].type: unknown tool type 'retrieval'"),
    (lambda b: b["tools"][0].pop("function"), "tools[0].function: must be an object with a 'name'"),
    (lambda b: b["messages"].append({"role": "user"}), "messages[9].content: missing"),
    (lambda b: b.update(messages={"role": "user"}), "messages: must be a list"),
])
def test_chat_shapes_it_does_not_understand_are_refused_in_one_line_naming_the_field(mutate, message):
    body = chat_body()
    mutate(body)
    with pytest.raises(ValueError) as info:
        prepare(body)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


# -- Responses ------------------------------------------------------------------------------------

def test_every_documented_responses_item_type_is_covered():
    types = {it.get("type", "message" if "role" in it else "item_reference") for it in ALL_ITEMS}
    assert types == RESPONSES_ITEM_TYPES


def test_responses_body_segments_paths_round_trip():
    body = responses_body()
    p = prepare(body)
    assert p.dialect == "openai-responses"
    paths = [s.path for s in p.segments]
    assert paths[:6] == ["tools[0]", "tools[1]", "tools[2]", "tools[3]", "text", "instructions"]
    assert paths[6:] == [f"input[{i}]" for i in range(len(ALL_ITEMS))]
    assert [s.kind for s in p.segments[4:7]] == ["schema", "system", "item"]
    assert p.segments[6].role == "user" and p.segments[8].role == "user" and p.segments[10].role is None
    assert p.segments[7].message_index == 1
    back = stored_roundtrip(p)
    assert canonical_bytes(back) == canonical_bytes(body)
    same_segments(prepare(back), p)
    # a string input is one segment
    q = prepare({"model": "gpt-5", "input": "Hello"})
    assert [(s.path, s.kind) for s in q.segments] == [("input", "msg-str")]
    assert canonical_bytes(stored_roundtrip(q)) == canonical_bytes({"model": "gpt-5", "input": "Hello"})


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b["input"].insert(4, {"type": "foo"}), "input[4].type: unknown item type 'foo'"),
    (lambda b: b["input"].append({"call_id": "x"}), "input[35].type: missing"),
    (lambda b: b["input"][1].update(role="robot"), "input[1].role: unknown role 'robot'"),
    (lambda b: b["input"][2]["content"].append({"type": "input_video"}),
     "input[2].content[3].type: unknown content part type 'input_video'"),
    (lambda b: b.update(instructions=["x"]), "instructions: must be a string"),
    (lambda b: b.update(input=7), "input: must be a string or a list of input items"),
    (lambda b: b["tools"].append({"type": "teleport"}), "tools[4].type: unknown tool type 'teleport'"),
    (lambda b: b.update(messages=[]), "messages: not a Responses field"),
])
def test_responses_shapes_it_does_not_understand_are_refused(mutate, message):
    body = responses_body()
    mutate(body)
    with pytest.raises(ValueError) as info:
        prepare(body)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_dialect_detection_and_an_explicit_dialect_that_survives_the_store():
    assert detect_dialect(chat_body()) == "openai-chat"
    assert detect_dialect(responses_body()) == "openai-responses"
    assert detect_dialect({"model": "m", "system": "s", "messages": []}) == "anthropic"
    plain = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    assert detect_dialect(plain) == "anthropic"  # no evidence: read as Messages
    p = prepare(plain, dialect="openai-chat")
    assert p.dialect == "openai-chat" and p.segments[0].path == "messages[0]"
    same_segments(prepare(stored_roundtrip(p)), p)
    with pytest.raises(ValueError, match="dialect: must be one of"):
        prepare(plain, dialect="gemini")
    # an explicit "anthropic" the body alone would not tell is recorded too
    odd = {"model": "claude-opus-4-8", "messages": [{"role": "user", "content": "a"},
                                                    {"role": "system", "content": "b"}]}
    q = prepare(odd, dialect="anthropic")
    assert q.dialect == "anthropic" and q.shape["dialect"] == "anthropic"
    same_segments(prepare(stored_roundtrip(q)), q)


def test_token_prefix_cache_models_run_on_openai_bodies():
    for name in ("openai", "deepseek", "vllm"):
        cache = pc.get_cache_model(name)
        a = prepare(chat_body())
        b_body = chat_body()
        b_body["messages"].append({"role": "assistant", "content": "INV-2292 was not prorated."})
        r1, r2 = cache.process(a, T0), cache.process(prepare(b_body), T0 + timedelta(seconds=5))
        assert r1.usage.total_input_tokens == a.total_tokens
        assert r2.reason in ("hit", "below_minimum"), name


def test_diff_of_openai_bodies_names_the_segment_and_byte():
    a, b = responses_body(), responses_body()
    b["input"][6]["output"] = "error: missing comma at main.ts:3"
    d = pc.diff(a, b)
    assert d.path == "input[6]" and d.history_rewrite.message_index == 6
    raw = canonical_bytes(b)
    assert raw[d.byte_offset:].startswith(b"comma")
    assert "comma" in str(d.excerpt)
    c = chat_body()
    c2 = {**chat_body(), "temperature": 0.9, "model": "gpt-4.1-mini"}
    d2 = pc.diff(c, c2)
    assert d2.field == "model" and d2.index == 0
    assert [f.path for f in d2.ignored_changes] == ["temperature"]


# -- usage ------------------------------------------------------------------------------------------

def test_openai_chat_usage_converts_exactly():
    raw = {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
           "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
           "completion_tokens_details": {"reasoning_tokens": 128}}
    u = usage_from_openai(raw)
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.output_tokens,
            u.reasoning_tokens, u.source) == (86, 1920, 0, 300, 128, "imported")
    assert u.total_input_tokens == 2006 and u.raw == raw and u.raw is not raw
    assert (u.cache_creation_5m_input_tokens, u.cache_creation_1h_input_tokens) == (0, 0)


def test_openai_responses_usage_with_cache_writes_converts_exactly():
    raw = {"input_tokens": 50_000, "output_tokens": 900,
           "input_tokens_details": {"cached_tokens": 40_960, "cache_write_tokens": 8_000},
           "output_tokens_details": {"reasoning_tokens": 512}}
    u = usage_from_openai(raw, api="responses", source="live")
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (1_040, 40_960, 8_000)
    assert u.total_input_tokens == 50_000 and u.source == "live" and u.reasoning_tokens == 512
    assert u.cache_creation_5m_input_tokens is None  # OpenAI writes have no 5m/1h TTL


def test_openai_usage_without_a_cached_figure_is_unknown_not_zero():
    u = usage_from_openai({"prompt_tokens": 900, "completion_tokens": 5})
    assert u.input_tokens is None and u.cache_read_input_tokens is None and u.total_input_tokens is None
    assert u.output_tokens == 5 and u.raw["prompt_tokens"] == 900
    d = usage_from_openai({"prompt_tokens": 900, "completion_tokens": 5, "prompt_cache_hit_tokens": 640,
                           "prompt_cache_miss_tokens": 260})  # DeepSeek
    assert (d.input_tokens, d.cache_read_input_tokens) == (260, 640)


class _SDKUsage:
    def model_dump(self, exclude_none: bool = False) -> dict:
        return {"input_tokens": 10, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 0}}


@pytest.mark.parametrize(("raw", "api", "message"), [
    ({"completion_tokens": 3}, "chat", "usage.prompt_tokens: missing"),
    ({"prompt_tokens": -1}, "chat", "usage.prompt_tokens: must be a non-negative int"),
    ({"prompt_tokens": 10.0}, "chat", "usage.prompt_tokens: must be a non-negative int"),
    ({"prompt_tokens": True}, "chat", "usage.prompt_tokens: must be a non-negative int"),
    ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}}, "chat",
     "usage.prompt_tokens_details.cached_tokens (11) exceeds usage.prompt_tokens (10)"),
    ({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 5}}, "responses",
     "usage.input_tokens_details.cached_tokens (6) + cache_write_tokens (5) exceeds usage.input_tokens (10)"),
    ({"input_tokens": 10, "input_tokens_details": [1]}, "responses", "usage.input_tokens_details: must be an object"),
    ({"input_tokens": 10, "output_tokens": "5"}, "responses", "usage.output_tokens: must be a non-negative int"),
    ({"prompt_tokens": 10}, "embeddings", "api: must be 'chat' or 'responses'"),
    ([1, 2], "chat", "usage: must be an object"),
])
def test_openai_usage_shapes_it_does_not_understand_are_refused(raw, api, message):
    with pytest.raises(ValueError) as info:
        usage_from_openai(raw, api=api)
    assert str(info.value).startswith(message)


def test_openai_usage_from_an_sdk_object_and_the_positional_constructor_still_works():
    assert usage_from_openai(_SDKUsage(), api="responses").input_tokens == 10
    u = Usage(1, 2, 3, 3, 0, 4, "live", {"x": 1})
    assert u.reasoning_tokens is None and u.total_input_tokens == 6


# -- unlogged prefix -----------------------------------------------------------------------------

def claude_code_body(n_turns: int) -> dict:
    msgs = []
    for i in range(n_turns):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"Step {i}: run the tests again."}]})
        msgs.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": "pytest -q", "timeout": 120}}]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{i} passed", "is_error": False}]})
    return {"model": "claude-sonnet-4-5", "max_tokens": 32000, "messages": msgs}


def test_unlogged_prefix_is_one_measured_segment_first_and_not_part_of_the_body():
    body = claude_code_body(2)
    p = prepare(body, unlogged_prefix_tokens=18_000)
    first = p.segments[0]
    assert (first.path, first.kind, first.tokens, first.nbytes, first.level) == (UNLOGGED_PATH, "unlogged", 18_000, 0, "tools")
    assert p.unlogged_prefix_tokens == 18_000 and p.shape["unlogged"] == 18_000
    assert p.total_tokens == 18_000 + prepare(body).total_tokens
    assert [s.path for s in p.segments[1:]] == [s.path for s in prepare(body).segments]
    assert prepare(body, unlogged_prefix_tokens=18_001).segments[0].content_hash != first.content_hash
    back = stored_roundtrip(p)
    assert back == body and canonical_bytes(back) == canonical_bytes(body) and "unlogged" not in json.dumps(back)
    same_segments(prepare(back), p)
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="unlogged_prefix_tokens"):
            prepare(body, unlogged_prefix_tokens=bad)


def test_a_change_in_the_unlogged_prefix_is_said_to_lie_outside_the_log():
    body = claude_code_body(2)
    a = prepare(body, unlogged_prefix_tokens=18_000)
    b = prepare(body, unlogged_prefix_tokens=18_500)
    d = compute_diff(a, b)
    assert d.path == UNLOGGED_PATH and d.unlogged and d.index == 0
    assert d.byte_offset is None and d.token_offset is None and d.excerpt is None
    assert d.summary() == ("diverges in the unlogged prefix (18,000 -> 18,500 tokens, measured): the change lies "
                           "outside the logged content and cannot be located")
    assert "cannot be located" in d._repr_html_()
    same = compute_diff(a, prepare(claude_code_body(3), unlogged_prefix_tokens=18_000))
    assert same.pure_append and not same.unlogged


def test_unlogged_prefix_round_trips_through_a_real_store(tmp_path):
    path = tmp_path / "x.duckdb"
    usage = {"input_tokens": 12, "cache_read_input_tokens": 18_000, "cache_creation_input_tokens": 300,
             "output_tokens": 40}
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(start=T0)
        sid = s.id
        t0 = s.record(claude_code_body(1), at=T0, usage=usage, unlogged_prefix_tokens=18_000)
        t1 = s.record(claude_code_body(2), at=T0 + timedelta(seconds=20), usage=usage,
                      unlogged_prefix_tokens=18_000)
        broke = {**usage, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 19_000}
        t2 = s.record(claude_code_body(2), at=T0 + timedelta(seconds=40), usage=broke,
                      unlogged_prefix_tokens=19_000)
        assert t0.prepared.segments[0].kind == "unlogged" and t1.diff.pure_append
        assert t2.diff.unlogged and "outside the logged content" in t2.diff.summary()
        assert "in the unlogged prefix (outside the logged content: the change cannot be located)" in (
            t2.observation.explanation)
        for i, n in enumerate((1, 2, 2)):
            body = lab.store.turn_body(sid, i)
            assert canonical_bytes(body) == canonical_bytes(claude_code_body(n))
        stored = s.turn(2)
        assert stored.prepared.segments[0].tokens == 19_000 and stored.diff.unlogged
    with pc.Lab(path, progress=False) as lab:  # a restart: the last request is prepared from the store
        s = lab.session(id=sid)
        assert s.previous_request.segments[0].tokens == 19_000 and s.previous_request.segments[0].path == UNLOGGED_PATH
        t3 = s.record(claude_code_body(3), at=T0 + timedelta(minutes=1), usage=usage, unlogged_prefix_tokens=19_000)
        assert t3.diff.pure_append and t3.total_tokens == prepare(
            claude_code_body(3), unlogged_prefix_tokens=19_000).total_tokens


def test_openai_bodies_and_usage_through_session_record_and_the_store(tmp_path):
    with pc.Lab(tmp_path / "x.duckdb", progress=False) as lab:
        s = lab.session(cache="openai", model="gpt-4.1", start=T0)
        first = chat_body()
        t0 = s.record(first, at=T0, usage={"prompt_tokens": 3000, "completion_tokens": 20,
                                           "prompt_tokens_details": {"cached_tokens": 0}})
        second = chat_body()
        second["messages"].append({"role": "assistant", "content": "INV-2292 was billed in full."})
        t1 = s.record(second, at=T0 + timedelta(seconds=30), usage={
            "prompt_tokens": 3100, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 2944}})
        assert (t1.usage.input_tokens, t1.usage.cache_read_input_tokens) == (156, 2944)
        assert t1.diff.pure_append and t0.prepared.dialect == "openai-chat"
        r = s.record(responses_body(), at=T0 + timedelta(seconds=60), usage={
            "input_tokens": 4000, "output_tokens": 10, "input_tokens_details": {"cached_tokens": 0}})
        assert r.prepared.dialect == "openai-responses"
        for i, body in enumerate((first, second, responses_body())):
            back = lab.store.turn_body(s.id, i)
            assert canonical_bytes(back) == canonical_bytes(body)
            same_segments(prepare(back), prepare(body))
        with pytest.raises(pc.errors.SessionError, match=r"usage.prompt_tokens: missing"):
            s.record(second, at=T0 + timedelta(seconds=90), usage={"completion_tokens": 1})
        # re-simulation rebuilds the stored OpenAI requests with the same segments
        df = s.resimulate("openai")
        assert list(df.total_tokens) == [t0.total_tokens, t1.total_tokens, r.total_tokens]
        assert list(df.cache_reason[:2]) == ["cold", "hit"]


def test_partial_sessions_resimulate_with_their_unlogged_prefix():
    usage = {"input_tokens": 12, "cache_read_input_tokens": 18_000, "cache_creation_input_tokens": 300,
             "output_tokens": 40}
    with pc.Lab(progress=False) as lab:
        s = lab.session(start=T0)
        turns = [s.record(claude_code_body(i), at=T0 + timedelta(seconds=10 * i), usage=usage,
                          unlogged_prefix_tokens=18_000) for i in (1, 2, 3)]
        df = s.resimulate("openai")
        assert list(df.total_tokens) == [t.total_tokens for t in turns] and turns[0].total_tokens > 18_000
        assert list(df.cache_reason) == ["cold", "hit", "hit"]


# -- linear untrusted prepare ---------------------------------------------------------------------

def test_previous_reuse_gives_the_same_segments_as_a_fresh_prepare_and_shares_them():
    a = claude_code_body(30)
    b = claude_code_body(31)
    pa = prepare(json.loads(json.dumps(a)))
    pb = prepare(json.loads(json.dumps(b)), previous=pa)
    same_segments(pb, prepare(b))
    n = len(pa.segments)
    assert all(x is y for x, y in zip(pb.segments[:n], pa.segments, strict=True))  # reused, not rebuilt
    assert shared_prefix_of(pb, pa) == n and shared_prefix_of(pb, pb) == 0
    d, fresh = compute_diff(pa, pb), compute_diff(prepare(a), prepare(b))
    assert (d.index, d.pure_append, d.appended, d.shared_prefix_tokens) == (
        fresh.index, fresh.pure_append, fresh.appended, fresh.shared_prefix_tokens)


def test_diffs_from_reused_segments_equal_diffs_of_fresh_prepares():
    def sent(n: int, marker_at_end: bool = True) -> dict:
        body = claude_code_body(n)
        if marker_at_end:  # Claude Code moves its breakpoint to the last block every request
            body["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return body

    bodies = [sent(3), sent(4), sent(4, marker_at_end=False), sent(2), {**sent(5), "model": "claude-opus-4-5"}]
    edited = sent(5)
    edited["messages"][4]["content"][0]["input"]["timeout"] = 120.0
    bodies.append(edited)
    prev = fresh_prev = None
    for body in bodies:
        cur = prepare(json.loads(json.dumps(body)), previous=prev)
        fresh = prepare(body)
        same_segments(cur, fresh)
        if prev is not None:
            a, b = compute_diff(prev, cur), compute_diff(fresh_prev, fresh)
            assert (a.index, a.path, a.field, a.shared_prefix_tokens, a.pure_append, a.byte_offset, a.token_offset,
                    a.added, a.removed, a.changed, a.moved, str(a.history_rewrite), a.summary()) == (
                    b.index, b.path, b.field, b.shared_prefix_tokens, b.pure_append, b.byte_offset, b.token_offset,
                    b.added, b.removed, b.changed, b.moved, str(b.history_rewrite), b.summary())
        prev, fresh_prev = cur, fresh


@pytest.mark.parametrize(("old", "new"), [(1, 1.0), (1.0, 1), (True, 1), (0, False), (0.0, -0.0), (10**16, 1e16)])
def test_equal_but_differently_typed_numbers_are_never_reused(old, new):
    assert old == new and canonical_bytes(old) != canonical_bytes(new)
    a, b = claude_code_body(3), claude_code_body(3)
    a["messages"][1]["content"][0]["input"]["timeout"] = old
    b["messages"][1]["content"][0]["input"]["timeout"] = new
    pa = prepare(a)
    pb = prepare(b, previous=pa)
    same_segments(pb, prepare(b))
    assert pb.segments[1].block_hash != pa.segments[1].block_hash
    assert compute_diff(pa, pb).path == "messages[1].content[0]"


def test_reuse_works_for_every_dialect_and_each_section_independently():
    a, b = responses_body(), responses_body()
    b["tools"][0]["description"] = "Read a CI log (last 500 lines)."  # a changed tool: the input is still reused
    b["input"].append({"type": "function_call_output", "call_id": "call_z", "output": "ok"})
    pa = prepare(a)
    pb = prepare(b, previous=pa)
    same_segments(pb, prepare(b))
    assert pb.segments[1] is pa.segments[1] and pb.segments[0] is not pa.segments[0]
    assert all(pb.segments[i] is pa.segments[i] for i in range(4, len(pa.segments)))
    assert shared_prefix_of(pb, pa) == 0
    c, d = chat_body(), chat_body()
    d["messages"][8]["content"] = "Thanks!"
    pc_ = prepare(c)
    pd_ = prepare(d, previous=pc_)
    same_segments(pd_, prepare(d))
    assert shared_prefix_of(pd_, pc_) == len(pc_.segments) - 1


def test_reuse_skips_validation_only_for_exactly_equal_units_and_respects_the_shape():
    good = claude_code_body(2)
    pa = prepare(good)
    bad = claude_code_body(2)
    bad["messages"].append({"role": "user", "content": 5})
    with pytest.raises(ValueError, match=r"messages\[6\].content"):
        prepare(bad, previous=pa)
    s1 = prepare({"model": "m", "system": "Be terse.", "messages": []})
    with pytest.raises(ValueError, match=r"system\[0\]: must be a content block"):  # str -> list: not reused
        prepare({"model": "m", "system": ["Be terse."], "messages": []}, previous=s1)


def test_copy_owns_the_body_and_shares_the_unchanged_parts_with_the_previous_one():
    a = claude_code_body(3)
    pa = prepare(a, copy=True)
    a["messages"][0]["content"][0]["text"] = "mutated after prepare"
    assert pa.body["messages"][0]["content"][0]["text"] == "Step 0: run the tests again."
    b = claude_code_body(4)
    pb = prepare(b, previous=pa, copy=True)
    assert pb.body["messages"][0] is pa.body["messages"][0] and pb.body["messages"][-1] is not b["messages"][-1]
    assert canonical_bytes(pb.body) == canonical_bytes(claude_code_body(4))
    same_segments(pb, prepare(claude_code_body(4)))


def test_store_new_blocks_from_the_shared_prefix_gives_the_same_rows():
    with pc.Lab(progress=False) as lab:
        store = lab.store
        pa = prepare(claude_code_body(5))
        rows = store.new_blocks(pa, "{}", "rest-hash")
        pb = prepare(claude_code_body(6), previous=pa)
        k = shared_prefix_of(pb, pa)
        store._known_blocks.update(r[0] for r in rows)  # as after writing pa
        assert store.new_blocks(pb, "{}", "rest-hash", shared=k) == store.new_blocks(pb, "{}", "rest-hash")


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.0, -0.0, 1.0, 2.5]) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_json, min_size=1, max_size=5), st.lists(_json, min_size=1, max_size=5))
def test_reuse_is_exact_for_any_json_values(xs, ys):
    def body(values):
        return {"model": "m", "system": "s", "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": json.dumps(i),
                                          "extra": v}]} for i, v in enumerate(values)]}
    pa = prepare(body(xs))
    pb = prepare(body(ys), previous=pa)
    same_segments(pb, prepare(body(ys)))
