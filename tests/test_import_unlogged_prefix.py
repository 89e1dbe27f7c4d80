"""Unlogged prefixes identified by what the log says, and compaction calls replayed against their parent (issue 36
item 5): Claude Code sessions that shared their system prompt share it in simulation, and a compaction call reads
the conversation its parent wrote instead of writing it all again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.advice._counterfactual import Original
from promptcache_nb.analysis import history_missing, load_turns
from promptcache_nb.ingest._prefixes import SHARE_COVER
from promptcache_nb.request import SegmentMemo, prepare

#: written by tests/fixtures/make_claude_code_unlogged.py (kept out of the shipped example logs, whose figures other
#: tests pin)
LOGS = Path(__file__).parent / "fixtures" / "claude_code_unlogged"
SHARED = LOGS / "shared_prefix" / "-home-dev-inventory-api"
FIRST = SHARED / "3c8e5a21-7f04-4d6b-9e2a-81b0c4d7e5f3.jsonl"  # 09:12, wrote the system prompt
SECOND = SHARED / "8f1d2b6c-0a93-4e57-b2c8-6d4e9f1a3b70.jsonl"  # 09:14, its first request read it
COMPACTION = LOGS / "compaction" / "-home-dev-ledger-sync"
PARENT_ID = "c41f7e09-2d5b-4a86-93e1-7b0a5c8d2f64"


def _by_key(result: pc.ImportResult) -> dict[str, pc.Session]:
    return {s.session_config.session_key: s for s in result.sessions}


def _own_estimate(s: pc.Session) -> int:
    """What the old rule sized the session's unlogged prefix as: its first request's measured total minus the
    estimated logged part (counted as at import, before the import fitted a calibration)."""
    first = load_turns(s.lab, s.id)[0]
    logged = prepare(dict(first.request.body), memo=SegmentMemo(s.lab.tokenizer)).total_tokens
    return _measured_total(first.stored) - logged


def _measured_total(row: dict[str, object]) -> int:
    return sum(int(row[k]) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))


def _replay(s: pc.Session) -> list[dict[str, int]]:
    """The simulated replay the advice runs (its scope's other sessions beside it), per request."""
    orig = Original.load(s)
    df = orig.simulate(orig.plan(()))
    return [{"read": int(r.cache_read_input_tokens), "write": int(r.cache_creation_input_tokens)}
            for r in df.itertuples()]


def test_two_sessions_that_shared_their_system_prompt_share_it_in_simulation() -> None:
    with pc.Lab(progress=False) as lab:
        sessions = _by_key(lab.import_log(SHARED))
        first, second = sessions[FIRST.stem], sessions[SECOND.stem]
        a, b = first.session_config, second.session_config
        # sized one by one the two estimates differ (by 2 tokens here): the old rule never shared them
        assert _own_estimate(first) != _own_estimate(second)
        assert a.unlogged_prefix_of is not None and a.unlogged_prefix_of == b.unlogged_prefix_of
        assert a.unlogged_prefix_tokens == b.unlogged_prefix_tokens
        assert b.unlogged_prefix_read == 14210  # the evidence: its first request's measured cache read
        heads = {load_turns(lab, s.id)[0].request.segments[0] for s in (first, second)}
        assert len({h.content_hash for h in heads}) == 1 and {h.kind for h in heads} == {"unlogged"}
        # the measured read of the second session's first request, and now the simulated one too
        assert int(load_turns(lab, second.id)[0].stored["cache_read_input_tokens"]) == 14210
        replay = _replay(second)
        assert replay[0]["read"] >= a.unlogged_prefix_tokens
        assert replay[0]["write"] < 100  # only its own first message


def test_the_writer_stored_after_its_reader_still_shares(tmp_path: Path) -> None:
    """Sessions are stored in key order, not time order: the earlier session, imported after the one that read
    its prefix, joins that one's prefix."""
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        second = lab.import_log(SECOND).sessions[0]
        first = lab.import_log(FIRST).sessions[0]
        assert first.session_config.unlogged_prefix_of == second.session_config.unlogged_prefix_of
        assert first.session_config.unlogged_prefix_tokens == second.session_config.unlogged_prefix_tokens


def _rewrite(src: Path, dst: Path, change: dict[str, object] | None = None, *, unread: bool = False) -> Path:
    """``src`` with each line's fields in ``change`` replaced, and (``unread``) the first response's cache read
    moved to its write: a first request that found nothing cached."""
    lines = [json.loads(x) for x in src.read_text(encoding="utf-8").splitlines()]
    first_id = next(x["message"]["id"] for x in lines if x["type"] == "assistant")
    for x in lines:
        x.update(change or {})
        if unread and x["type"] == "assistant" and x["message"]["id"] == first_id:
            u = x["message"]["usage"]
            u["cache_creation_input_tokens"] += u["cache_read_input_tokens"]
            u["cache_creation"]["ephemeral_1h_input_tokens"] += u["cache_read_input_tokens"]
            u["cache_read_input_tokens"] = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return dst


@pytest.mark.parametrize("case", ["no read", "another version", "another cwd"])
def test_without_evidence_or_with_another_identity_nothing_is_shared(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "-home-dev-inventory-api"
    folder.mkdir()
    shutil.copy(FIRST, folder / FIRST.name)
    change = {"another version": {"version": "2.0.32"}, "another cwd": {"cwd": "/home/dev/inventory-api-2"}}
    _rewrite(SECOND, folder / SECOND.name, change.get(case), unread=case == "no read")
    with pc.Lab(progress=False) as lab:
        sessions = _by_key(lab.import_log(folder))
        a, b = (sessions[p.stem].session_config for p in (FIRST, SECOND))
        assert a.unlogged_prefix_of != b.unlogged_prefix_of
        assert b.unlogged_prefix_tokens == _own_estimate(sessions[SECOND.stem])  # its own measurement
        replay = _replay(sessions[SECOND.stem])
        assert replay[0]["read"] == 0  # nothing in the simulation says it was shared


def test_a_compaction_call_reads_what_its_parent_wrote() -> None:
    with pc.Lab(progress=False) as lab:
        sessions = _by_key(lab.import_log(COMPACTION))
        parent = sessions[PARENT_ID]
        call = next(s for k, s in sessions.items() if k != PARENT_ID)
        assert call.session_config.session_kind == "compaction" and call.parent_id == parent.id
        parent_turns, call_turns = load_turns(lab, parent.id), load_turns(lab, call.id)
        assert [history_missing(t) for t in parent_turns] == [False] * len(parent_turns)
        assert [history_missing(t) for t in call_turns] == [True]
        (turn,) = call_turns
        assert json.loads(turn.stored["events"]) == ["history_missing", "history_from_parent"]
        # the history came from the parent's last request before the call: its messages come first
        before = parent_turns[2].request.body["messages"]
        assert turn.request.body["messages"][: len(before) - 1] == before[:-1]
        assert turn.request.body["messages"][-1]["content"][-1]["text"].startswith("Your task is to create")
        # the same system prompt and tools as the parent's
        assert turn.request.segments[0] == parent_turns[0].request.segments[0]
        measured_read = int(turn.stored["cache_read_input_tokens"])
        measured_total = _measured_total(turn.stored)
        (replayed,) = _replay(call)
        assert replayed["read"] >= SHARE_COVER * measured_read  # read the parent's conversation...
        assert replayed["write"] < 0.05 * measured_total  # ...instead of writing it all again
        # the prediction stored at import too: it wrote no 1h entry of its own, so it takes the parent's client TTLs
        # and shares the parent's simulated cache
        assert call.session_config.cache_params == parent.session_config.cache_params == {"client_ttls": ["1h", "5m"]}
        predicted = json.loads(turn.stored["cache_detail"])["predicted_usage"]
        assert predicted["cache_read_input_tokens"] >= SHARE_COVER * measured_read
        assert predicted["cache_creation_input_tokens"] < 0.05 * measured_total


def test_a_compaction_call_without_its_parent_in_the_import_is_only_flagged() -> None:
    (agent,) = COMPACTION.glob("*/subagents/agent-acompact-*.jsonl")
    with pc.Lab(progress=False) as lab:
        call = lab.import_log(agent).sessions[0]
        (turn,) = load_turns(lab, call.id)
        assert history_missing(turn)
        assert json.loads(turn.stored["events"]) == ["history_missing"]
        assert len(turn.request.body["messages"]) == 1  # the logged tail alone
