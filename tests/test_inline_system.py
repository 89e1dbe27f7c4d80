"""Mid-conversation ``role: "system"`` messages in a Messages body (issue 21, item 12): accepted where the API places
them, segmented in order like any message, cached like any block, refused with one line where the API refuses them
(docs/provider_cache_rules.md#anthropic-mid-conversation-system-messages).

The bodies follow the shape of a recorded claude-opus-4-8 call (a system message with one text block marked
``cache_control``, last in ``messages``, after a user turn), written here with our own text.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import anthropic
import pytest

import promptcache_nb as pc
from promptcache_nb.errors import BodyValidationError
from promptcache_nb.request import canonical_bytes, detect_dialect, prepare, validate_request
from promptcache_nb.request.validate import check_request

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
MODEL = "claude-opus-4-8"
KEY = "fake-key-for-local-simulator"
LEDGER = "\n".join(f"Ledger line {i:04d}: invoice {1000 + i} for account {i % 37} is {'paid' if i % 3 else 'open'}, "
                   f"due on day {i % 28 + 1}." for i in range(150))
MARK = {"type": "ephemeral", "ttl": "5m"}


def user(content):
    return {"role": "user", "content": content}


def assistant(content):
    return {"role": "assistant", "content": content}


def system(content):
    return {"role": "system", "content": content}


def text(t, **extra):
    return {"type": "text", "text": t, **extra}


def first_body() -> dict:
    """Top-level system, a long user turn, an answer, a short user turn, then the inline system message (marked)."""
    return {"model": MODEL, "max_tokens": 256, "system": "Answer in one word.", "messages": [
        user([text(LEDGER)]), assistant([text("Noted")]), user([text("Which invoices are open?")]),
        system([text("From now on, answer in French.", cache_control=MARK)])]}


def next_body() -> dict:
    """The same conversation, grown: the inline system message stays where it was, an answer and a turn follow."""
    b = first_body()
    b["messages"] += [assistant([text("Ouvertes")]), user([text("And paid ones?")])]
    return b


def body(*messages, **extra) -> dict:
    return {"model": MODEL, "max_tokens": 16, **extra, "messages": list(messages)}


# -- record(): accepted, segmented at its position, cached like any block ------------------------------------------
def test_record_writes_at_the_inline_system_message_then_reads_it(tmp_path):
    """Refused on the old code (``must be 'user' or 'assistant', got 'system'``): now the marked inline system
    message is a breakpoint that writes the prefix through it, and the next request reads exactly that."""
    with pc.Lab(tmp_path / "s.duckdb", progress=False) as lab:
        s = lab.session(model=MODEL)
        first = s.record(first_body(), at=T0)
        second = s.record(next_body(), at=T0 + timedelta(seconds=30))
        sid = first.session_id
        assert first.usage.cache_read_input_tokens == 0
        written = first.usage.cache_creation_input_tokens
        assert written > 1024  # the whole prefix through the system message, above the model's minimum
        assert first.usage.cache_creation_5m_input_tokens == written
        assert second.usage.cache_read_input_tokens == written
        assert first.body == canonical_bytes(first_body()) and second.body == canonical_bytes(next_body())
    with pc.Lab(tmp_path / "s.duckdb", progress=False) as lab:  # byte for byte from the store
        again = lab.session(id=sid)
        assert again.turn(0).body == canonical_bytes(first_body())
        assert again.turn(1).body == canonical_bytes(next_body())
        assert lab.store.turn_body(sid, 1) == next_body()


def test_the_inline_system_message_is_its_own_segment_at_its_position_and_a_breakpoint():
    p = prepare(first_body())
    assert p.dialect == "anthropic"
    assert [(s.path, s.kind, s.role) for s in p.segments] == [
        ("system", "system", None),
        ("messages[0].content[0]", "msg-start", "user"),
        ("messages[1].content[0]", "msg-start", "assistant"),
        ("messages[2].content[0]", "msg-start", "user"),
        ("messages[3].content[0]", "msg-start", "system"),
    ]
    inline = p.segments[-1]
    assert inline.level == "messages" and inline.cache_control == MARK
    assert pc.get_cache_model("anthropic").breakpoints(p) == [(4, "5m")]
    # a string-content system message is one segment too, and a body with one rebuilds exactly
    grown = body(user("hi"), system("Be brief."), assistant("ok"), system="Answer in one word.")
    assert [(s.path, s.kind, s.role) for s in prepare(grown).segments][2] == ("messages[1].content", "msg-str", "system")


def test_a_prefix_diff_puts_a_changed_inline_system_message_at_its_position():
    """Changing the inline system message keeps the top-level system and the turns before it: the prefix breaks
    at messages[3], not at ``system``."""
    before, after = next_body(), next_body()
    after["messages"][3] = system([text("From now on, answer in German.", cache_control=MARK)])
    d = pc.diff(before, after)
    assert d.path == "messages[3].content[0]" and d.index == 4
    assert d.shared_prefix_tokens == prepare(before).cumulative_tokens()[3]
    assert pc.diff(first_body(), next_body()).pure_append


# -- the validator: the placement and content rules, one line each ----------------------------------------------
@pytest.mark.parametrize("messages", [
    [user("hi"), system("Be brief.")],  # last
    [user("hi"), system("Be brief."), assistant("ok")],  # followed by an assistant turn
    [user("hi"), system([text("a"), text("b", cache_control=MARK)]), assistant([text("ok")]), user("more")],
    [user("look it up"), assistant([{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                                     "input": {"query": "x"}}]), system("Cite sources.")],  # after a server tool use
], ids=["last", "before-assistant", "blocks", "after-server-tool-use"])
def test_placements_the_api_takes_are_accepted(messages):
    assert validate_request(body(*messages), "anthropic") == []
    assert validate_request(body(*messages, system="top-level"), None) == []  # detected as Messages


@pytest.mark.parametrize(("messages", "expected"), [
    ([system("Be brief."), user("hi")],
     "messages[0].role: a 'system' message cannot be the first message; instructions that apply from the start go "
     "in the top-level `system` field"),
    ([user("hi"), assistant("ok"), system("Be brief.")],
     "messages[2].role: a 'system' message must follow a user message (or an assistant message that ends in a "
     "server tool use), got one after an assistant message"),
    ([user("hi"), system("a"), system("b")],
     "messages[2].role: consecutive 'system' messages are not allowed (messages[1] is one); merge them"),
    ([user("hi"), system("Be brief."), user("again")],
     "messages[2].role: must be 'assistant' after the 'system' message messages[1] (a system message is the last "
     "message or is followed by an assistant turn)"),
    ([user("hi"), system([{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}])],
     "messages[1].content[0].type: a 'system' message holds text blocks only, got 'image'"),
    ([user("hi"), {"role": "wizard", "content": "x"}],
     "messages[1].role: must be 'user', 'assistant' or 'system', got 'wizard'"),
], ids=["first", "after-assistant", "consecutive", "followed-by-user", "image", "unknown-role"])
def test_placements_the_api_refuses_are_one_line_naming_the_rule(messages, expected):
    assert [str(p) for p in validate_request(body(*messages), "anthropic")] == [expected]
    with pytest.raises(BodyValidationError, match=r"^request 2: ") as info:
        check_request(body(*messages), "anthropic", request=2)
    assert "\n" not in str(info.value)


def test_a_growing_history_checks_a_system_message_against_the_turn_after_it():
    """The previous body's final system message is checked again when a turn follows it (its repeated history is
    not re-walked, but the state it leaves is)."""
    before = body(user("hi"), system("Be brief."))
    good, bad = body(user("hi"), system("Be brief."), assistant("ok")), body(user("hi"), system("Be brief."), user("?"))
    assert validate_request(good, "anthropic", previous=before) == []
    assert [p.path for p in validate_request(bad, "anthropic", previous=before)] == ["messages[2].role"]


def test_dialect_detection_reads_a_later_system_message_by_its_content():
    marked = body(user("hi"), system([text("Be brief.", cache_control=MARK)]))
    assert detect_dialect(marked) == "anthropic"
    assert detect_dialect(body(system("Be terse."), user("hi"))) == "openai-chat"  # first: never Messages
    assert detect_dialect(body(user("hi"), system("Be terse."), user("again"))) == "openai-chat"  # nothing else


def test_record_refuses_a_misplaced_system_message_and_stores_nothing():
    with pc.Lab(progress=False) as lab:
        s = lab.session(model=MODEL)
        with pytest.raises(BodyValidationError, match=r"messages\[2\]\.role: a 'system' message must follow"):
            s.record(body(user("hi"), assistant("ok"), system("Be brief."), system="Answer in one word."), at=T0)
        assert lab.sql("select count(*) n from turns").n[0] == 0


# -- the simulator endpoint, through the real anthropic SDK -----------------------------------------------------
@pytest.fixture
def client():
    srv = pc.SimulatorServer().start()
    c = anthropic.Anthropic(base_url=srv.base_url, api_key=KEY, max_retries=0)
    yield c
    c.close()
    srv.stop()


def _at(seconds: float) -> dict:
    return {"x-promptcache-at": (T0 + timedelta(seconds=seconds)).isoformat()}


def test_the_simulator_answers_an_inline_system_message_with_200_and_caches_it(client):
    """The SDK (2.14's ``SystemMessageParam``) sends ``role: "system"`` as given: 200, a write at the marked
    system message, then a read of it; a misplaced one is a 400 naming the field."""
    first = client.messages.create(**first_body(), extra_headers=_at(0))
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_input_tokens > 1024
    second = client.messages.create(**next_body(), extra_headers=_at(30))
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.role: a 'system' message cannot be the first"):
        client.messages.create(**body(system("Be brief."), user("hi")), extra_headers=_at(60))
    counted = client.messages.count_tokens(model=MODEL, system="Answer in one word.", messages=next_body()["messages"])
    assert counted.input_tokens > 1024
    assert json.loads(json.dumps(first.model_dump()))["usage"]["cache_creation"]["ephemeral_5m_input_tokens"] > 0
