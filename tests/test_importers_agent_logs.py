"""The agent-log readers: Claude Code transcripts, Codex rollouts and OTLP GenAI spans (pure; no store)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from promptcache_nb.errors import ImportFormatError
from promptcache_nb.readers._registry import READERS, detect, read_head
from promptcache_nb.readers._types import ImportedRequest, ReadProgress, SkippedLine
from promptcache_nb.readers.claude_code import ClaudeCodeReader
from promptcache_nb.readers.codex import CodexReader
from promptcache_nb.readers.otlp import OtlpReader

LOGS = Path(__file__).parent / "fixtures" / "logs"
SID = "4b2f7c1e-9d3a-4e8b-a6f1-2c5d8e0b7a94"
CC_PROJECT = LOGS / "claude_code" / "-home-dev-billing-service"
CC_MAIN = CC_PROJECT / f"{SID}.jsonl"
CC_SUBAGENT = CC_PROJECT / SID / "subagents" / "agent-a3f9c2d1.jsonl"
CC_ACOMPACT = CC_PROJECT / SID / "subagents" / "agent-acompact-7e21b4.jsonl"
CC_GROWING = LOGS / "claude_code" / "growing" / "9c1d5e7a-2b4f-4c8e-8d3a-5f6b7e1c0a29.jsonl"
CODEX_SID = "0199a5b2-7c3e-7d41-9f08-3b6e2a1c5d90"
CODEX = LOGS / "codex" / "2026" / "03" / "03" / f"rollout-2026-03-03T14-05-11-{CODEX_SID}.jsonl"
CODEX_GROWING = LOGS / "codex" / "growing" / "rollout-2026-03-03T16-40-02-0199a6c0-1e2d-7f3a-8b4c-5d6e7f8a9b0c.jsonl"
OTLP_DOC = LOGS / "otlp" / "refund_assistant_traces.json"
OTLP_LINES = LOGS / "otlp" / "collector_export.jsonl"
SONNET = "claude-sonnet-4-5-20250929"


def read_all(reader, path: Path) -> tuple[list[ImportedRequest], list[SkippedLine], list[ReadProgress]]:
    records = list(reader.read(path))
    reqs = [r for r in records if isinstance(r, ImportedRequest)]
    skipped = [r for r in records if isinstance(r, SkippedLine)]
    progress = [r for r in records if isinstance(r, ReadProgress)]
    assert len(reqs) + len(skipped) + len(progress) == len(records)
    return reqs, skipped, progress


def figures(req: ImportedRequest) -> tuple:
    u = req.usage
    return (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens,
            u.cache_creation_5m_input_tokens, u.cache_creation_1h_input_tokens, u.output_tokens)


def roles(body: dict) -> list[str]:
    return [m["role"] for m in body["messages"]]


def block_types(message: dict) -> list[str]:
    return [b["type"] for b in message["content"]]


# ---- Claude Code -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cc_main():
    return read_all(ClaudeCodeReader(), CC_MAIN)


def test_claude_code_one_request_per_streamed_response(cc_main):
    reqs, _, _ = cc_main
    assistant_lines = sum(1 for line in CC_MAIN.read_text().splitlines()
                          if '"type":"assistant"' in line and "<synthetic>" not in line)
    assert assistant_lines == 15
    assert len(reqs) == 11
    assert len({r.dedupe_key for r in reqs}) == 11
    first = reqs[0]
    # one response over three lines: thinking, text, tool_use, merged into one assistant message
    assert [b["type"] for b in first.reply] == ["thinking", "text", "tool_use"]
    assert first.dedupe_key == f"msg_01eYJtciwGj6i65S45pU70b0/{first.request_id}"
    assert first.request_id.startswith("req_011C")
    assert first.source_ref == f"{CC_MAIN}:3"
    # output_tokens on the first two lines is a streaming placeholder (2): the largest figure wins
    assert first.usage.output_tokens == 187
    assert first.usage.raw["output_tokens"] == 187
    # ``at`` is the first line of the response
    assert first.at == datetime(2026, 3, 2, 10, 0, 4, 905000, tzinfo=UTC)
    assert [int(r.source_ref.rsplit(":", 1)[1]) for r in reqs] == [3, 7, 9, 14, 16, 18, 21, 23, 26, 30, 34]


def test_claude_code_usage_is_exact_per_request(cc_main):
    reqs, _, _ = cc_main
    assert [figures(r) for r in reqs] == [
        (4, 0, 14259, 49, 14210, 187),  # the unlogged system prompt and tools written once, with a 1h TTL
        (3, 14259, 422, 422, 0, 62),  # then each request reads what the one before cached
        (3, 14681, 247, 247, 0, 141),
        (3, 14928, 473, 473, 0, 309),
        (3, 15401, 194, 194, 0, 44),
        (3, 15595, 66, 66, 0, 118),
        (3, 14210, 1542, 1542, 0, 121),  # after a 6-minute gap: only the 1h prefix is still cached
        (3, 15752, 121, 121, 0, 57),
        (3, 15873, 32, 32, 0, 152),
        (3, 14210, 231, 231, 0, 376),  # after compaction: the summary is new
        (3, 14441, 157, 157, 0, 61),
    ]
    assert all(r.usage.source == "imported" and r.usage.measured for r in reqs)
    assert reqs[0].usage.total_input_tokens == 14263
    assert reqs[6].at == datetime(2026, 3, 2, 10, 6, 49, 377000, tzinfo=UTC)


def test_claude_code_bodies_rebuild_the_conversation(cc_main):
    reqs, _, _ = cc_main
    for r in reqs:
        assert r.partial is True and r.dialect == "anthropic" and r.provider == "anthropic"
        assert set(r.body) == {"model", "messages"} and r.body["model"] == SONNET == r.model
        rs = roles(r.body)
        assert rs[0] == "user"
        assert all(a != b for a, b in zip(rs, rs[1:], strict=False)), "same-role turns are merged"
        assert r.parent_key is None and r.session_kind == "main" and r.session_key == SID
    assert roles(reqs[0].body) == ["user"]
    assert reqs[0].body["messages"][0]["content"][0]["text"].startswith("tests/test_refunds.py::")
    second = reqs[1].body["messages"]
    assert roles(reqs[1].body) == ["user", "assistant", "user"]
    assert block_types(second[1]) == ["thinking", "text", "tool_use"]
    assert block_types(second[2]) == ["tool_result"]
    assert second[2]["content"][0]["tool_use_id"] == second[1]["content"][2]["id"]
    assert [len(r.body["messages"]) for r in reqs] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 1, 3]


def test_claude_code_interleaved_tool_results_stay_after_their_response(cc_main):
    reqs, _, _ = cc_main
    # response 3 streamed text, tool_use A, (result A written), tool_use B, (result B): request 4 sees one
    # assistant message with all three blocks, then one user message with both results in order
    assistant, results = reqs[3].body["messages"][-2:]
    assert block_types(assistant) == ["text", "tool_use", "tool_use"]
    assert [b["name"] for b in assistant["content"][1:]] == ["Read", "Grep"]
    assert block_types(results) == ["tool_result", "tool_result"]
    assert [b["tool_use_id"] for b in results["content"]] == [b["id"] for b in assistant["content"][1:]]
    assert "ROUND_CEILING" in results["content"][1]["content"]


def test_claude_code_bodies_share_the_growing_prefix(cc_main):
    reqs, _, _ = cc_main
    for before, after in zip(reqs[:8], reqs[1:9], strict=True):
        n = len(before.body["messages"])
        assert after.body["messages"][: n - 1] == before.body["messages"][: n - 1]


def test_claude_code_compaction_restarts_history(cc_main):
    reqs, _, _ = cc_main
    assert [r.events for r in reqs].count(("compaction",)) == 1
    compacted = reqs[9]
    assert compacted.events == ("compaction",)
    (only,) = compacted.body["messages"]
    assert only["role"] == "user" and block_types(only) == ["text", "text"]
    assert only["content"][0]["text"].startswith("This session is being continued from a previous conversation")
    assert only["content"][1]["text"].startswith("Add a regression test for a JPY invoice")
    assert roles(reqs[10].body) == ["user", "assistant", "user"]
    assert reqs[10].events == ()


def test_claude_code_skips_synthetic_and_malformed_lines(cc_main):
    reqs, skipped, progress = cc_main
    file = str(CC_MAIN)
    assert [(s.file, s.line) for s in skipped] == [(file, 25), (file, 31)]
    assert "<synthetic>" in skipped[0].reason and "not an API response" in skipped[0].reason
    assert skipped[1].reason.startswith("not valid JSON")
    # the client's error message never enters a rebuilt body; the retry sees the user's request last
    assert not any("API Error" in json.dumps(r.body) for r in reqs)
    assert reqs[8].body["messages"][-1]["content"][-1]["text"].startswith("Thanks. Write a short PR description")
    # the line after the malformed one still counts: the Edit result reaches the last request
    assert block_types(reqs[10].body["messages"][-1]) == ["tool_result"]
    # unknown types (custom-title) and bookkeeping lines (queue-operation, snapshots) are not errors
    assert progress == [ReadProgress(file, 34)]


def test_claude_code_subagent_and_compaction_files_are_linked_sessions():
    reqs, skipped, progress = read_all(ClaudeCodeReader(), CC_SUBAGENT)
    assert skipped == [] and progress == [ReadProgress(str(CC_SUBAGENT), 5)]
    assert [(r.session_key, r.parent_key, r.session_kind) for r in reqs] == \
        [(f"{SID}/agent-a3f9c2d1", SID, "subagent")] * 2
    assert {r.model for r in reqs} == {"claude-haiku-4-5-20251001"}
    assert [figures(r) for r in reqs] == [(4, 0, 3147, 3147, 0, 96), (3, 3147, 142, 142, 0, 209)]
    assert [b["type"] for b in reqs[0].reply] == ["text", "tool_use"]
    assert roles(reqs[1].body) == ["user", "assistant", "user"]

    (compact,), skipped, _ = read_all(ClaudeCodeReader(), CC_ACOMPACT)
    assert skipped == []
    assert (compact.session_key, compact.parent_key, compact.session_kind) == \
        (f"{SID}/agent-acompact-7e21b4", SID, "compaction")
    # the compaction call re-sends the parent's prefix: it reads what the parent's last request wrote
    assert figures(compact) == (4, 15905, 227, 227, 0, 1240)


def test_claude_code_flat_subagent_file_takes_its_parent_from_the_lines(tmp_path):
    flat = tmp_path / "agent-a3f9c2d1.jsonl"
    shutil.copy(CC_SUBAGENT, flat)
    reqs, _, _ = read_all(ClaudeCodeReader(), flat)
    assert {(r.session_key, r.parent_key) for r in reqs} == {(f"{SID}/agent-a3f9c2d1", SID)}


def test_claude_code_truncated_last_line_is_left_for_the_next_import(tmp_path):
    reqs, skipped, progress = read_all(ClaudeCodeReader(), CC_GROWING)
    assert len(reqs) == 1 and skipped == []
    assert progress == [ReadProgress(str(CC_GROWING), 3)]
    assert figures(reqs[0]) == (4, 14210, 13, 13, 0, 29)

    # the client finishes writing the line: re-reading adds the request, the first keeps its dedupe key
    grown = tmp_path / CC_GROWING.name
    grown.write_text(CC_GROWING.read_text() + (
        'toolu_01RkD3vX8nQ2","name":"Read","input":{"file_path":"/home/dev/billing-service/.githooks/pre-push"}}],'
        '"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":42,'
        '"cache_read_input_tokens":14223,"cache_creation":{"ephemeral_5m_input_tokens":42,'
        '"ephemeral_1h_input_tokens":0},"output_tokens":71,"service_tier":"standard"}},'
        '"requestId":"req_011CGx7TnW2bQp4LmZ9sRv3K","type":"assistant",'
        '"uuid":"7a0c2e51-3b9d-4f6a-8c1e-2d4b6f8a0c13","timestamp":"2026-03-02T10:59:19.044Z"}\n'))
    again, skipped, progress = read_all(ClaudeCodeReader(), grown)
    assert skipped == [] and progress == [ReadProgress(str(grown), 4)]
    assert again[0].dedupe_key == reqs[0].dedupe_key
    assert len(again) == 2 and figures(again[1]) == (3, 14223, 42, 42, 0, 71)
    assert roles(again[1].body) == ["user", "assistant", "user"]


def test_claude_code_lines_written_twice_count_once(tmp_path):
    lines = CC_MAIN.read_text().splitlines(keepends=True)
    copy = tmp_path / CC_MAIN.name
    copy.write_text("".join(lines[:4] + [lines[3]] + lines[4:]))  # the text block of response 1 again
    reqs, _, _ = read_all(ClaudeCodeReader(), copy)
    assert len(reqs) == 11
    assert [b["type"] for b in reqs[0].reply] == ["thinking", "text", "tool_use"]


def test_claude_code_assistant_line_problems_are_reported(tmp_path):
    entry = json.loads(CC_MAIN.read_text().splitlines()[6])
    no_usage = json.loads(json.dumps(entry))
    del no_usage["message"]["usage"]
    odd_model = json.loads(json.dumps(entry))
    odd_model["message"]["model"] = "<unknown model>"
    odd_model["uuid"] = "0e5d2c4b-6a8f-4e1d-9c3b-7a5f1e2d4c6b"
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(no_usage) + "\n" + json.dumps(odd_model) + "\n")
    reqs, skipped, _ = read_all(ClaudeCodeReader(), path)
    assert reqs == []
    assert [(s.line, s.reason) for s in skipped] == [
        (1, "assistant line without usage"),
        (2, "model '<unknown model>' is not a model id: not an API response"),
    ]


# ---- Codex -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def codex():
    return read_all(CodexReader(), CODEX)


def test_codex_token_counts_written_twice_are_one_request(codex):
    reqs, _, _ = codex
    token_count_lines = sum(1 for line in CODEX.read_text().splitlines() if '"type":"token_count"' in line)
    assert token_count_lines == 17  # 8 requests written twice, plus one rate-limit update (info: null)
    lines = [10, 15, 20, 25, 29, 34, 43, 47]
    assert [r.source_ref for r in reqs] == [f"{CODEX}:{n}" for n in lines]
    assert [r.dedupe_key for r in reqs] == [f"{CODEX_SID}:{n}" for n in lines]
    assert {(r.session_key, r.parent_key, r.session_kind) for r in reqs} == {(CODEX_SID, None, "main")}
    assert {(r.model, r.dialect, r.provider, r.partial) for r in reqs} == \
        {("gpt-5-codex", "openai-responses", "openai", True)}


def test_codex_usage_counts_cached_tokens_inside_input(codex):
    reqs, _, _ = codex
    assert [(r.usage.input_tokens, r.usage.cache_read_input_tokens, r.usage.cache_creation_input_tokens,
             r.usage.output_tokens) for r in reqs] == [
        (3264, 0, 0, 212),
        (3447 - 3200, 3200, 0, 98),  # cached in 128-token steps
        (3796 - 3328, 3328, 0, 1306),
        (4335 - 3712, 3712, 0, 71),
        (4436 - 4224, 4224, 0, 164),
        (4521 - 4352, 4352, 0, 612),  # the compaction call
        (3421 - 3200, 3200, 0, 118),  # after compaction: cached only up to the first request's messages
        (3598 - 3328, 3328, 0, 143),
    ]
    assert [r.usage.total_input_tokens for r in reqs] == [3264, 3447, 3796, 4335, 4436, 4521, 3421, 3598]
    assert reqs[0].usage.raw == {"input_tokens": 3264, "cached_input_tokens": 0, "output_tokens": 212,
                                 "reasoning_output_tokens": 128, "total_tokens": 3476}
    assert [r.usage.reasoning_tokens for r in reqs] == [128, 64, 320, 0, 0, 0, 64, 0]
    # OpenAI cache writes have no TTLs; nothing was written here
    assert {(r.usage.cache_creation_5m_input_tokens, r.usage.cache_creation_1h_input_tokens) for r in reqs} == {(0, 0)}
    assert all(r.usage.source == "imported" for r in reqs)


def test_codex_bodies_are_responses_shaped(codex):
    reqs, _, _ = codex
    first = reqs[0].body
    assert list(first) == ["model", "instructions", "input"]
    assert first["model"] == "gpt-5-codex"
    assert first["instructions"].startswith("You are Codex, based on GPT-5.")
    assert [(i["type"], i["role"]) for i in first["input"]] == [("message", "user")] * 3
    assert first["input"][0]["content"][0]["text"].startswith("<user_instructions>")
    assert first["input"][2]["content"][0]["text"].startswith("cli.py has grown to 400 lines.")
    # each request's input stops where its own output items begin; the outputs are its reply
    assert [len(r.body["input"]) for r in reqs] == [3, 6, 9, 12, 15, 16, 5, 8]
    assert [i["type"] for i in reqs[1].body["input"][3:]] == ["reasoning", "function_call", "function_call_output"]
    assert [i["type"] for i in reqs[2].reply] == ["reasoning", "custom_tool_call"]
    assert reqs[5].reply is None  # the compaction call's summary is not logged as an item
    assert reqs[5].body["input"][-1]["role"] == "assistant"
    # ``at``: the first output item of the response, else the token_count line
    assert reqs[0].at == datetime(2026, 3, 3, 14, 5, 23, 771000, tzinfo=UTC)
    assert reqs[5].at == datetime(2026, 3, 3, 14, 8, 52, 774000, tzinfo=UTC)
    for before, after in zip(reqs[:5], reqs[1:6], strict=True):
        assert after.body["input"][: len(before.body["input"])] == before.body["input"]


def test_codex_compacted_replaces_the_history(codex):
    reqs, _, _ = codex
    assert [r.events for r in reqs] == [()] * 6 + [("compaction",), ()]
    after = reqs[6].body["input"]
    assert [(i["type"], i["role"]) for i in after] == [("message", "user")] * 5  # no ghost_snapshot: never sent
    assert after[3]["content"][0]["text"].startswith("Another language model started to solve this problem")
    assert after[4]["content"][0]["text"].startswith("Now rename --out to --output")
    assert reqs[6].body["instructions"] == reqs[0].body["instructions"]


def test_codex_malformed_and_truncated_lines(codex):
    _, skipped, progress = codex
    assert [(s.file, s.line) for s in skipped] == [(str(CODEX), 32)]
    assert skipped[0].reason.startswith("not valid JSON")
    assert progress == [ReadProgress(str(CODEX), 48)]

    reqs, skipped, progress = read_all(CodexReader(), CODEX_GROWING)
    assert skipped == [] and progress == [ReadProgress(str(CODEX_GROWING), 6)]
    assert [(r.usage.input_tokens, r.usage.cache_read_input_tokens, r.usage.output_tokens) for r in reqs] == \
        [(3064, 0, 41)]
    assert reqs[0].session_key == "0199a6c0-1e2d-7f3a-8b4c-5d6e7f8a9b0c"


def _rollout(path: Path, *entries: tuple[str, dict]) -> Path:
    path.write_text("".join(json.dumps({"timestamp": f"2026-03-03T15:00:{n:02d}.000Z", "type": kind,
                                        "payload": payload}) + "\n" for n, (kind, payload) in enumerate(entries)))
    return path


def test_codex_old_rollouts_without_last_usage_or_model(tmp_path):
    totals = [{"input_tokens": 5200, "cached_input_tokens": 0, "output_tokens": 90, "total_tokens": 5290},
              {"input_tokens": 10650, "cached_input_tokens": 5120, "output_tokens": 150, "total_tokens": 10800}]
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the CLI flags"}]}
    path = _rollout(
        tmp_path / "rollout-2025-09-01T10-00-00-0198f0a0-0000-7000-8000-000000000001.jsonl",
        ("event_msg", {"type": "token_count", "info": {"total_token_usage": totals[0]}}),
        ("turn_context", {"model": "gpt-5", "instructions": "Be brief."}),
        ("response_item", user),
        ("compacted", {"message": "The user asked for the CLI flags; they are --format and --out."}),
        ("event_msg", {"type": "token_count", "info": {"total_token_usage": totals[1]}}),
        ("event_msg", {"type": "token_count", "info": {"total_token_usage": totals[1]}}),
    )
    reqs, skipped, _ = read_all(CodexReader(), path)
    assert [(s.line, s.reason) for s in skipped] == [(1, "token_count before any turn_context: the model is unknown")]
    (req,) = reqs
    assert req.session_key == "0198f0a0-0000-7000-8000-000000000001"  # from the file name: no session_meta
    assert "instructions" not in req.body and req.partial
    # the difference of the cumulative totals
    assert (req.usage.input_tokens, req.usage.cache_read_input_tokens, req.usage.output_tokens) == (330, 5120, 60)
    assert req.events == ("compaction",)
    assert req.body["input"] == [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "The user asked for the CLI flags; they are --format and --out."}]}]


# ---- OTLP --------------------------------------------------------------------------------------------------


def test_otlp_document_with_conversation_ids_and_content():
    reqs, skipped, progress = read_all(OtlpReader(), OTLP_DOC)
    assert skipped == [] and progress == []  # one JSON document: no line progress
    # agent, tool and HTTP spans are not model calls: 3 chat spans of 7
    assert [r.source_ref for r in reqs] == [f"{OTLP_DOC}#{k}" for k in (1, 4, 6)]
    assert {r.session_key for r in reqs} == {"conv_01JNW4T8Q2R6"}
    assert [r.dedupe_key for r in reqs] == [f"4bf92f3577b34da6a3ce929d0e0e4736/{s}" for s in
                                            ("a1b2c3d4e5f60718", "d4e5f60718293a4b", "f60718293a4b5c6d")]
    assert [r.request_id for r in reqs] == ["msg_01Aq7Pz3Kd9Xw2", "msg_01Bt4Lm8Ns2Vy6", "msg_01Cw9Rn5Ht7Ek3"]
    assert reqs[0].at == datetime(2026, 3, 4, 9, 0, 0, 120000, tzinfo=UTC)
    # semconv: cache read and write are included in input_tokens (1082 = 37 uncached + 0 read + 1045 written)
    assert [figures(r) for r in reqs] == [(37, 0, 1045, None, None, 96), (161, 1045, 0, 0, 0, 61),
                                          (211, 1045, 0, 0, 0, 142)]
    assert [r.usage.total_input_tokens for r in reqs] == [1082, 1206, 1256]
    assert reqs[0].usage.raw["gen_ai.usage.cache_creation.input_tokens"] == 1045
    assert {(r.model, r.provider, r.dialect, r.partial) for r in reqs} == \
        {("claude-sonnet-4-5", "anthropic", "anthropic", False)}


def test_otlp_semconv_parts_become_messages_bodies():
    reqs, _, _ = read_all(OtlpReader(), OTLP_DOC)
    body = reqs[2].body
    assert list(body) == ["model", "max_tokens", "tools", "system", "messages"]  # gen_ai.request.max_tokens: 1024
    assert body["max_tokens"] == 1024
    assert [t["name"] for t in body["tools"]] == ["lookup_charge", "issue_refund"]
    assert body["tools"][0]["input_schema"]["required"] == ["account_id"]
    assert body["system"][0]["text"].startswith("You are the refunds assistant for Northwind Telecom")
    assert roles(body) == ["user", "assistant", "user", "assistant", "user"]
    assert block_types(body["messages"][1]) == ["text", "tool_use"]
    assert body["messages"][1]["content"][1] == {"type": "tool_use", "id": "toolu_01Hk2bQ7YtW4",
                                                 "name": "lookup_charge",
                                                 "input": {"account_id": "NW-20931", "date": "2026-03-01"}}
    result = body["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_01Hk2bQ7YtW4"
    assert '"charge_id": "ch_7732"' in result["content"]
    assert reqs[1].body["messages"] == body["messages"][:3]
    assert reqs[2].reply[0]["text"].startswith("You're right: the March plan was charged twice")


def test_otlp_json_lines_grouped_by_trace_with_older_spellings():
    reqs, skipped, progress = read_all(OtlpReader(), OTLP_LINES)
    assert skipped == [] and progress == [ReadProgress(str(OTLP_LINES), 3)]
    assert [r.source_ref for r in reqs] == [f"{OTLP_LINES}:{n}" for n in (1, 2, 3)]
    assert [r.session_key for r in reqs] == ["0af7651916cd43dd8448eb211c80319c"] * 2 + \
        ["7d3e1f0a9b8c4d2e6f5a4b3c2d1e0f9a"]
    # no content captured: an empty, partial body in the provider's dialect
    assert [(r.body, r.partial, r.dialect, r.provider) for r in reqs] == [
        ({"model": "gpt-4.1-mini", "messages": []}, True, "openai-chat", "openai"),
        ({"model": "gpt-4.1-mini", "messages": []}, True, "openai-chat", "openai"),
        ({"model": "claude-haiku-4-5", "messages": []}, True, "anthropic", "anthropic"),
    ]
    # intValue written as strings; gen_ai.usage.cache_read_input_tokens (older spelling), included in input
    assert figures(reqs[0])[:3] == (2304, 0, 0)
    assert figures(reqs[1]) == (307, 2304, 0, 0, 0, 143)
    # Anthropic's exclusive figures passed through (18 < 4096 + 230): input is already the uncached count
    assert figures(reqs[2]) == (18, 4096, 230, None, None, 64)
    assert reqs[2].usage.total_input_tokens == 4344


def _span_line(span_id: str, attrs: dict, *, start: int = 1772618400_000000000) -> str:
    def value(v):
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}
    span = {"traceId": "5f1e2d3c4b5a69788796a5b4c3d2e1f0", "spanId": span_id, "name": "chat",
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 10**9),
            "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


def test_otlp_openai_content_becomes_a_chat_body(tmp_path):
    messages = [
        {"role": "user", "parts": [{"type": "text", "content": "Is ticket 4411 a duplicate?"}]},
        {"role": "assistant", "parts": [{"type": "reasoning", "content": "search first"},
                                        {"type": "tool_call", "id": "call_9", "name": "search_tickets",
                                         "arguments": {"query": "login loop after SSO"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_9", "response": ["#4398"]}]},
    ]
    path = tmp_path / "triage.jsonl"
    path.write_text(_span_line("0102030405060708", {
        "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4.1", "gen_ai.conversation.id": "t-4411",
        "gen_ai.usage.input_tokens": 1480, "gen_ai.usage.cache_read.input_tokens": 1152,
        "gen_ai.usage.output_tokens": 40,
        "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "You triage support tickets."}]),
        "gen_ai.input.messages": json.dumps(messages)}) + "\n")
    (req,) = read_all(OtlpReader(), path)[0]
    assert req.dialect == "openai-chat" and req.partial  # no tool definitions captured
    assert req.body == {"model": "gpt-4.1", "messages": [
        {"role": "system", "content": "You triage support tickets."},
        {"role": "user", "content": "Is ticket 4411 a duplicate?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "search_tickets", "arguments": '{"query": "login loop after SSO"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": '["#4398"]'},
    ]}
    assert figures(req) == (328, 1152, 0, 0, 0, 40)


def test_otlp_json_lines_bad_input(tmp_path):
    good = _span_line("0a0b0c0d0e0f1011", {"gen_ai.system": "anthropic", "gen_ai.request.model": "claude-opus-4-1",
                                           "gen_ai.usage.input_tokens": 900, "gen_ai.usage.output_tokens": 12})
    no_model = _span_line("1a1b1c1d1e1f2021", {"gen_ai.usage.input_tokens": 50})
    path = tmp_path / "otel.jsonl"
    path.write_text(good + "\n" + good[:40] + "\n" + no_model + "\n" + good[:-10])
    reqs, skipped, progress = read_all(OtlpReader(), path)
    assert len(reqs) == 1 and progress == [ReadProgress(str(path), 3)]
    assert [(s.line, s.reason.split(" (")[0]) for s in skipped] == [
        (2, "not valid JSON"), (3, "span 'chat': GenAI usage without gen_ai.request.model")]
    # no cache figures reported: unknown, not zero
    assert figures(reqs[0]) == (900, None, None, None, None, 12)


def test_otlp_cache_write_ttl_follows_the_provider(tmp_path):
    path = tmp_path / "otel.jsonl"
    common = {"gen_ai.usage.input_tokens": 3000, "gen_ai.usage.cache_creation.input_tokens": 2048,
              "gen_ai.usage.output_tokens": 20}
    path.write_text(_span_line("0a0b0c0d0e0f1011", {"gen_ai.provider.name": "anthropic",
                                                    "gen_ai.request.model": "claude-sonnet-4-5", **common}) + "\n"
                    + _span_line("1a1b1c1d1e1f2021", {"gen_ai.provider.name": "deepseek",
                                                      "gen_ai.request.model": "deepseek-chat", **common}) + "\n")
    anthropic, deepseek = read_all(OtlpReader(), path)[0]
    assert figures(anthropic) == (952, 0, 2048, None, None, 20)  # spans carry no TTL split: unknown
    assert anthropic.usage.notes and "5-minute" in anthropic.usage.notes[0] and not deepseek.usage.notes
    assert figures(deepseek) == (952, 0, 2048, None, None, 20)  # no TTLs outside Anthropic
    assert (deepseek.provider, deepseek.dialect) == ("deepseek", "openai-chat")


def test_otlp_unreadable_document_is_one_skipped_line(tmp_path):
    path = tmp_path / "traces.json"
    path.write_text('{\n  "resourceSpans": [\n    {"scopeSpans": [\n')
    reqs, skipped, _ = read_all(OtlpReader(), path)
    assert reqs == [] and len(skipped) == 1 and skipped[0].reason.startswith("not a valid OTLP JSON document")


# ---- detection ---------------------------------------------------------------------------------------------


MINE = {CC_MAIN: "claude-code", CC_SUBAGENT: "claude-code", CC_ACOMPACT: "claude-code", CC_GROWING: "claude-code",
        CODEX: "codex", CODEX_GROWING: "codex", OTLP_DOC: "otlp", OTLP_LINES: "otlp"}
OTHERS = sorted(p for sub in ("exchanges", "vcr", "har") for p in (LOGS / sub).glob("*") if p.is_file())


def test_registry_holds_the_agent_log_readers():
    assert {"claude-code", "codex", "otlp"} <= set(READERS)
    assert [READERS[n].name for n in ("claude-code", "codex", "otlp")] == ["claude-code", "codex", "otlp"]


@pytest.mark.parametrize("path", sorted(MINE), ids=lambda p: p.name[:40])
def test_each_fixture_is_claimed_by_exactly_its_reader(path):
    head = read_head(path)
    claims = sorted(r.name for r in READERS.values() if r.sniff(path, head))
    assert claims == [MINE[path]]
    assert detect(path).name == MINE[path]


def test_other_formats_are_not_claimed_by_the_agent_log_readers():
    assert len(OTHERS) >= 3
    for path in OTHERS:
        head = read_head(path)
        for reader in (ClaudeCodeReader(), CodexReader(), OtlpReader()):
            assert not reader.sniff(path, head), (reader.name, path.name)


def test_a_file_in_no_format_names_the_formats_tried(tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text('{"todo": "rotate the staging keys"}\n')
    with pytest.raises(ImportFormatError) as info:
        detect(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert all(name in message for name in ("claude-code", "codex", "otlp"))


def test_claude_code_sniff_survives_a_first_line_longer_than_the_head():
    head = '{"type":"file-history-snapshot","messageId":"m","snapshot":{"trackedFileBackups":{"' + "a" * 70000
    assert ClaudeCodeReader().sniff(Path("x.jsonl"), head[: 64 * 1024])
    assert not CodexReader().sniff(Path("x.jsonl"), head[: 64 * 1024])
