"""request.validate: one answer to "does this body follow its API's documented shape", for record() and the server.

The bad-input corpus (tests/bad_inputs/bodies, run by tests/test_bad_inputs.py) holds one case per refused body;
this file covers what the corpus cannot: bodies that must pass, the lenient mode, the incremental walk, the
server agreeing with the validator, and the SDK's block types.
"""

from __future__ import annotations

import json
import time
import typing
from pathlib import Path

import pytest
import typing_extensions
import yaml

import promptcache_nb as pc
from promptcache_nb.errors import BodyValidationError
from promptcache_nb.request import BodyProblem, check_request, validate_request
from promptcache_nb.request.validate import ANTHROPIC_BLOCK_TYPES, MAX_DEPTH, MAX_PROBLEMS

MODEL = "claude-sonnet-4-5"
REPO = Path(__file__).resolve().parent.parent
BODIES = Path(__file__).resolve().parent / "bad_inputs" / "bodies"


def body(*messages: dict, **fields: object) -> dict:
    return {"model": MODEL, "max_tokens": 64, **fields, "messages": list(messages)}


def user(content: object) -> dict:
    return {"role": "user", "content": content}


def assistant(content: object) -> dict:
    return {"role": "assistant", "content": content}


TOOL = {"name": "calc", "description": "Add numbers.", "input_schema": {"type": "object"}}
CALL = {"type": "tool_use", "id": "toolu_01", "name": "calc", "input": {"a": 2, "b": 2}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "4"}


@pytest.mark.parametrize("good", [
    body(user("hi")),
    body(user("hi"), max_tokens=0),  # pre-warming (docs/provider_cache_rules.md#anthropic-ttl-and-refresh)
    body(user("hi"), assistant("")),  # an empty final assistant message: prefill
    body(user("hi"), assistant([])),
    body(user("2+2?"), assistant([CALL]), user([RESULT]), assistant("It is 4."), tools=[TOOL]),
    body(user("search"), assistant([{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                                     "input": {"query": "x"}},
                                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}]),
         user("thanks"), tools=[{"type": "web_search_20250305", "name": "web_search"}]),
    body(user("hi"), system=[{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}]),
    body(user([{"type": "text", "text": "café ☕ \u202e"}]), metadata={"user_id": "u-1"}, temperature=0.5),
    {"model": "gpt-4o", "messages": [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4"}, {"role": "assistant", "content": "4"}],
     "max_completion_tokens": None},
    {"model": "gpt-4o", "input": [
        {"role": "user", "content": "2+2?"},
        {"type": "function_call", "call_id": "call_1", "name": "calc", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "4"}]},
    # the call is in the stored previous response
    {"model": "gpt-4o", "previous_response_id": "resp_1",
     "input": [{"type": "function_call_output", "call_id": "call_1", "output": "4"}]},
    {"model": "gpt-4o", "input": "hi", "stream": True},
])
def test_documented_shapes_pass(good):
    assert validate_request(good) == []
    assert check_request(good) == []


def test_count_tokens_takes_no_max_tokens():
    tokens_body = {"model": MODEL, "messages": [user("hi")]}
    assert validate_request(tokens_body, "anthropic", count_tokens=True) == []
    assert [str(p) for p in validate_request(tokens_body, "anthropic")] == ["max_tokens: Field required"]


def test_a_partial_log_need_not_hold_what_it_never_records():
    """An agent transcript has no max_tokens; telemetry without content has no messages."""
    assert validate_request({"model": MODEL, "messages": [user("hi")]}, "anthropic", partial=True) == []
    assert validate_request({"messages": []}, "anthropic", partial=True) == []
    assert [str(p) for p in validate_request({"messages": [user("")]}, "anthropic", partial=True)] == [
        "messages[0].content: all messages must have non-empty content except for the optional final assistant "
        "message"]


def test_a_problem_names_its_field_in_both_notations():
    p, unanswered = validate_request(body(user("2+2?"), assistant([CALL]), user([{**RESULT, "tool_use_id": "toolu_99"}])))
    assert unanswered.path == "messages[1].content[0].id" and "has no tool_result" in unanswered.problem
    assert p.path == "messages[2].content[0].tool_use_id" and p.kind == "api"
    assert p.api_path == "messages.2.content.0.tool_use_id"
    assert str(p) == f"{p.path}: {p.problem}" and p.api_line == f"{p.api_path}: {p.problem}"
    assert BodyProblem("", "request body must be a JSON object, got list").api_line.startswith("request body")


def test_strict_raises_one_line_naming_the_request_and_the_field():
    bad = body(user("hi"), {"role": "wizard", "content": "x"}, user("y"), {"role": "system", "content": "y"},
               {"role": "system", "content": "z"})
    with pytest.raises(BodyValidationError) as info:
        check_request(bad, "anthropic", request=3)  # undeclared, a `system` role with nothing else reads as Chat
    assert str(info.value) == ("request 3: messages[1].role: must be 'user', 'assistant' or 'system', got 'wizard'; "
                               "and 1 more problem")
    assert isinstance(info.value, pc.errors.SessionError) and isinstance(info.value, ValueError)
    assert [p.path for p in info.value.problems] == ["messages[1].role", "messages[4].role"]  # two system messages
    with pytest.raises(BodyValidationError, match=r"^log\.jsonl:7: request 0: messages\[0\]\.role"):
        check_request(body(assistant("x")), request=0, source="log.jsonl:7")


def test_lenient_returns_what_the_api_refuses_and_raises_only_for_what_json_cannot_hold():
    odd = body(assistant("I start."), user(""), tools=[{"name": "t", "input_schema": {}}] * 2)
    problems = check_request(odd, lenient=True)
    assert [p.path for p in problems] == ["tools[1].name", "messages[0].role", "messages[1].content"]
    assert {p.kind for p in problems} == {"api"}
    with pytest.raises(BodyValidationError, match=r"metadata\.score: NaN is not a JSON value"):
        check_request(body(assistant("I start."), metadata={"score": float("nan")}), lenient=True)


def test_json_problems_come_first_in_body_order_and_name_the_value():
    import datetime as dt

    bad = body({"role": "wizard", "content": "x"}, metadata={"when": dt.date(2025, 1, 1), 2: "two", "s": b"x"})
    assert [str(p) for p in validate_request(bad)] == [
        "metadata.when: date is not a JSON value (a JSON body holds strings, numbers, booleans, null, lists and "
        "objects)",
        "metadata: object keys must be strings, got number key 2",
        "metadata.s: bytes is not a JSON value (a JSON body holds strings, numbers, booleans, null, lists and "
        "objects)",
        "messages[0].role: must be 'user', 'assistant' or 'system', got 'wizard'",
    ]


def test_deep_nesting_is_data_not_stack():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    start = time.perf_counter()
    [p] = validate_request(body(user("hi"), metadata={"d": deep}))
    assert time.perf_counter() - start < 1
    assert p.kind == "json" and p.problem == f"nested deeper than {MAX_DEPTH} levels"
    assert len(p.path) < 120  # elided in the middle: one readable line
    # exactly at the limit is fine: the body is level 1, so metadata.d is level 3
    ok: list = []
    for _ in range(MAX_DEPTH - 3):
        ok = [ok]
    assert validate_request(body(user("hi"), metadata={"d": ok})) == []
    assert validate_request(body(user("hi"), metadata={"d": [ok]}))[0].problem.startswith("nested deeper")


def test_problems_are_capped():
    problems = validate_request(body(user("hi"), metadata={f"k{i}": float("nan") for i in range(1000)}))
    assert len(problems) == MAX_PROBLEMS


def test_previous_skips_the_repeated_history_but_not_the_rules_across_messages():
    first = body(user("hi"), assistant(""))  # a valid prefill...
    assert validate_request(first) == []
    second = json.loads(json.dumps(first))  # fresh objects, as an importer parses them
    second["messages"].append(user("more"))  # ...is an empty message once the history goes on
    assert [p.path for p in validate_request(second, previous=first)] == ["messages[1].content"]
    # what the repeated prefix would hold is not walked again; a new tail is
    nan_tail = {**second, "messages": [*second["messages"], assistant([{"type": "text", "text": "x", "n": float("nan")}])]}
    assert [p.path for p in validate_request(nan_tail, previous=second) if p.kind == "json"] == [
        "messages[3].content[0].n"]
    # "the same" means the same bytes, not just ==: Decimal(1) == 1, but JSON has no Decimal
    from decimal import Decimal

    one = body(user([{"type": "text", "text": "x", "n": 1}]))
    decimal = body(user([{"type": "text", "text": "x", "n": Decimal(1)}]), assistant("y"))
    assert [p.path for p in validate_request(decimal, previous=one)] == ["messages[0].content[0].n"]


def test_previous_resumes_the_checks_with_the_state_the_repeated_history_leaves():
    """The repeated messages are not checked again (a log of 1,000 growing requests costs its new tails), but the
    first new message is checked against them: a tool call still awaiting its answer, in each dialect."""
    def grown(first: dict, *tail: dict, key: str = "messages") -> dict:
        again = json.loads(json.dumps(first))  # fresh objects, as an importer parses them
        again[key] += list(tail)
        return again

    asked = body(user("2+2?"), assistant([CALL]))
    assert validate_request(asked) == []
    assert validate_request(grown(asked, user([RESULT])), previous=asked) == []
    assert [p.path for p in validate_request(grown(asked, user("no answer")), previous=asked)] == [
        "messages[1].content[0].id"]
    chat_call = {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}, chat_call,
                                            {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]}
    assert validate_request(chat) == []
    assert validate_request(grown(chat, {"role": "tool", "tool_call_id": "call_1", "content": "again"}),
                            previous=chat)[0].path == "messages[3].tool_call_id"  # answered already
    responses = {"model": "gpt-4o", "input": [{"type": "function_call", "call_id": "c1", "name": "f",
                                               "arguments": "{}"}]}
    assert validate_request(responses) == []
    answer = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    assert validate_request(grown(responses, answer, key="input"), previous=responses) == []
    orphan = {**answer, "call_id": "c2"}
    assert [p.path for p in validate_request(grown(responses, orphan, key="input"), previous=responses)] == [
        "input[1].call_id"]
    # a problem of the repeated history is the previous body's: reported there, once
    odd = body(user([{"type": "txt", "text": "x"}]))
    assert [p.path for p in validate_request(odd)] == ["messages[0].content[0].type"]
    assert validate_request(grown(odd, assistant("ok")), previous=odd) == []


def test_tool_results_answer_the_message_just_before():
    later = body(user("2+2?"), assistant([CALL]), user([RESULT]), assistant("4"), user([RESULT]))
    assert [str(p) for p in validate_request(later)] == [
        "messages[4].content[0].tool_use_id: no tool_use with id 'toolu_01' in the previous message; each "
        "tool_result answers a tool_use of the message just before it"]


def test_every_sdk_content_block_type_is_known():
    """ANTHROPIC_BLOCK_TYPES keeps up with the installed anthropic SDK's typed params (content blocks)."""
    from anthropic.types.message_content_param import MessageContentParam

    def literal_types(tp: object) -> set[str]:
        out: set[str] = set()
        for arg in typing.get_args(tp):
            if typing_extensions.is_typeddict(arg):
                hint = typing.get_type_hints(arg)["type"]
                out.update(typing.get_args(hint))
            else:
                out |= literal_types(arg)
        return out

    sdk = literal_types(MessageContentParam)
    try:
        from anthropic.types.beta.beta_content_block_param import BetaContentBlockParam
        sdk |= literal_types(BetaContentBlockParam)
    except ImportError:  # an older SDK without the beta module
        pass
    assert "tool_use" in sdk and sdk <= ANTHROPIC_BLOCK_TYPES, sorted(sdk - ANTHROPIC_BLOCK_TYPES)


def _corpus() -> list:
    expected = yaml.safe_load((BODIES / "expected.yaml").read_text(encoding="utf-8"))
    return [pytest.param(name, id=name) for name, spec in sorted(expected.items())
            if not isinstance(spec, dict) or not ({"inject", "usage", "at"} & spec.keys())]


@pytest.mark.parametrize("name", _corpus())
def test_the_server_answers_every_corpus_body_with_the_validators_first_problem(name):
    """One implementation: the simulator endpoint's 400 is the validator's first problem, in the API's notation."""
    raw = (BODIES / name).read_bytes()
    sent = json.loads(raw)
    dialect = yaml.safe_load((BODIES / "expected.yaml").read_text(encoding="utf-8"))[name]
    dialect = dialect.get("dialect") if isinstance(dialect, dict) else None
    dialect = dialect or (pc.request.detect_dialect(sent) if isinstance(sent, dict) else "anthropic")
    path = {"anthropic": "/v1/messages", "openai-chat": "/v1/chat/completions",
            "openai-responses": "/v1/responses"}[dialect]
    server = pc.SimulatorServer()
    status, _, payload = server.handle("POST", path, {"x-api-key": "sk-corpus", "authorization": "Bearer sk-corpus"},
                                       raw)
    assert status == 400, payload
    message = json.loads(payload)["error"]["message"]
    if b"NaN" in raw or b"Infinity" in raw:  # refused by the JSON parser before any validation
        assert "is not a JSON value" in message
    else:
        assert message == validate_request(sent, dialect)[0].api_line


@pytest.mark.parametrize("strategy", pc.STRATEGIES)
def test_every_body_a_strategy_builds_is_valid(strategy):
    """What replay sends passes the strict check, so record() can refuse everything else."""
    with pc.Lab(progress=False) as lab:
        s = lab.replay(REPO / "data" / "scenarios" / "tool_loop.yaml", strategy=strategy)
        previous = None
        for i in range(s.n_turns):
            request = s.turn(i).request
            assert validate_request(request, previous=previous) == [], (i, request)
            previous = request
