"""Counterfactual replays and ranked advice (issue 22): the fixes as transforms, the equivalence with the strategies
they stand for, and the Claude Code TTL case."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import _benchmarks
import pandas as pd
import pytest

import promptcache_nb as pc
from promptcache_nb.advice import _fixes
from promptcache_nb.advice._fixes import Request
from promptcache_nb.analysis import load_turns
from promptcache_nb.request.validate import validate_request

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "data/scenarios/support_agent.yaml"
GAPS_LOG = Path(__file__).parent / "fixtures" / "logs" / "claude_code_gaps"

#: counterfactual cost vs the strategy's own replay, relative (measured gaps: docs/howto/advice.md)
EQUIVALENCE_BOUND = 0.10


@pytest.fixture(scope="module")
def lab() -> pc.Lab:
    with pc.Lab(progress=False) as lab:
        yield lab


@pytest.fixture(scope="module")
def replays(lab: pc.Lab) -> dict[str, pc.Session]:
    return {st: lab.replay(SCENARIO, strategy=st)
            for st in ("naive", "clock_in_system", "clock_at_tail", "append_only", "durable_delta")}


def _requests(lab: pc.Lab, s: pc.Session) -> list[Request]:
    return [Request(t.at, t.request.body, t.idx) for t in load_turns(lab, s.id)]


def _no_cc(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_cc(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_no_cc(v) for v in value]
    return value


def _strip_added_text(original: list[dict], sent: list[dict]) -> list[dict]:
    """``sent`` messages with the text blocks a carrier appended removed (to compare with the originals)."""
    out = []
    for o, m in zip(original, sent, strict=True):
        if m is o:
            out.append(o)
            continue
        content = m["content"]
        n = 1 if isinstance(o["content"], str) else len(o["content"])
        kept = content[:n]
        assert all(b["type"] == "text" for b in content[n:])  # only text blocks were added
        out.append({**m, "content": o["content"] if isinstance(o["content"], str) else kept})
    return out


def _check_shape(before: list[Request], after: list[Request]) -> None:
    """Same number of requests, same times, same order: one per original request."""
    assert len(after) == len(before)
    assert [r.at for r in after] == [r.at for r in before]
    assert [r.origin for r in after] == [r.origin for r in before]
    assert not any(r.ping for r in after)


# -- each fix, as a transform --------------------------------------------------------------------
def test_tail_volatile_moves_only_the_clock_to_the_newest_user_message(lab, replays) -> None:
    before = _requests(lab, replays["clock_in_system"])
    frozen = copy.deepcopy([r.body for r in before])
    done = _fixes.tail_volatile(before)
    _check_shape(before, done.requests)
    assert [r.body for r in before] == frozen  # inputs never mutated
    clock = "2026-11-02 09:00 (Monday)"
    assert clock in before[0].body["system"][1]["text"]
    clocks = {json.dumps(r.body["system"][1]) for r in done.requests}
    assert len(clocks) == 1  # the clock block no longer changes (knowledge in system[0] still does: a real change)
    assert not any("09:0" in json.dumps(r.body["system"]) for r in done.requests)
    for a, b in zip(before, done.requests, strict=True):
        assert b.body["tools"] is a.body["tools"]  # only the named change
        assert {k: v for k, v in b.body.items() if k not in ("system", "messages")} == \
            {k: v for k, v in a.body.items() if k not in ("system", "messages")}
        assert _strip_added_text(a.body["messages"], b.body["messages"]) == a.body["messages"]
        assert validate_request(b.body) == []
    assert clock in json.dumps(done.requests[0].body["messages"][-1])
    assert done.evidence.startswith("system[1] byte ")
    assert "`2026-11-02 09:00 (Monday)` → `2026-11-02 09:01 (Monday)`" in done.evidence
    assert "of 100 requests" in done.evidence


def test_tail_volatile_keeps_the_text_it_moved_in_history() -> None:
    t0 = datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    bodies, msgs = [], []
    for k in range(5):
        msgs = [*msgs, {"role": "user", "content": f"question {k}"}]
        bodies.append({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": msgs,
                       "system": [{"type": "text", "text": "You are terse."},
                                  {"type": "text", "text": f"Current time: 13:0{k}\nRuntime: linux"}]})
        msgs = [*msgs, {"role": "assistant", "content": f"answer {k}"}]
    reqs = [Request(t0 + timedelta(minutes=k), b, k) for k, b in enumerate(bodies)]
    done = _fixes.tail_volatile(reqs)
    assert done.evidence == "system[1] byte 0: `Current time: 13:00` → `Current time: 13:01`, changes on 4 of 5 requests"
    last = done.requests[-1].body
    assert last["system"][1]["text"] == "Runtime: linux"
    carried = [m["content"][-1]["text"] for m in last["messages"] if m["role"] == "user"]
    assert carried == [f"Current time: 13:0{k}" for k in range(5)]  # each user message keeps its own clock
    # each request's history is the previous one's plus new messages: a pure append
    for a, b in zip(done.requests, done.requests[1:], strict=False):
        assert b.body["messages"][: len(a.body["messages"])] == a.body["messages"]


def test_durable_deltas_pin_the_first_memory_and_pass_the_host_prompt_through(lab, replays) -> None:
    before = _requests(lab, replays["naive"])
    done = _fixes.durable_deltas(before)
    _check_shape(before, done.requests)
    memory = _fixes._memory(_fixes._system_texts(before[0].body))
    assert [heading for _, heading in memory] == ["## 12. Long-term knowledge", "## Long-term Knowledge"]
    clocks = set()
    for a, b in zip(before, done.requests, strict=True):
        texts = _fixes._system_texts(b.body)
        assert _fixes._memory(texts) == memory  # the memory pinned at its first bytes
        # the rest (the host's own prompt, the clock naive renders into it) as the request had it, as Lore leaves it
        assert texts == _fixes._with_memory(_fixes._system_texts(a.body), memory)
        clocks.add(texts[0].split("## Current Time\n")[1][:16])
        assert b.body["tools"] is a.body["tools"]
        assert _strip_added_text(a.body["messages"], b.body["messages"]) == a.body["messages"]
        assert validate_request(b.body) == []
    deltas = [blk["text"] for m in done.requests[-1].body["messages"] if m["role"] == "user"
              for blk in (m["content"] if isinstance(m["content"], list) else [])
              if blk.get("type") == "text" and blk["text"].startswith("System prompt update")]
    assert deltas and "Superseded lines" in deltas[0]
    assert "deltas in 100 requests" in done.evidence and len(clocks) > 20  # the clock still ticks in the prompt


def test_durable_deltas_pin_a_prompt_without_memory_whole() -> None:
    t0 = datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    bodies = [{"model": "claude-sonnet-4-5", "max_tokens": 64, "system": f"You help.\nRule {k // 2}: be brief.",
               "messages": [{"role": "user", "content": f"q{j}"} if j % 2 == 0 else {"role": "assistant", "content": "a"}
                            for j in range(2 * k + 1)]} for k in range(4)]
    done = _fixes.durable_deltas([Request(t0 + timedelta(minutes=k), b, k) for k, b in enumerate(bodies)])
    assert all(r.body["system"] == "You help.\nRule 0: be brief." for r in done.requests)
    assert "1 delta in 4 requests" in done.evidence  # carried on in history: no second delta
    texts = [b["text"] for m in done.requests[3].body["messages"] if isinstance(m["content"], list)
             for b in m["content"] if b.get("type") == "text" and b["text"].startswith("System prompt update")]
    assert texts == ["System prompt update (this replaces what the system prompt above says):\nChanged or new lines:\n"
                     "Rule 1: be brief.\nSuperseded lines (ignore them above):\nRule 0: be brief."]


def test_frozen_prefix_sorts_tools_and_changes_nothing_else(lab, replays) -> None:
    before = _requests(lab, replays["naive"])
    done = _fixes.frozen_prefix(before)
    _check_shape(before, done.requests)
    for a, b in zip(before, done.requests, strict=True):
        names = [t["name"] for t in b.body["tools"]]
        assert names == sorted(names) and sorted(names) == sorted(t["name"] for t in a.body["tools"])
        assert b.body["system"] == a.body["system"] and b.body["messages"] == a.body["messages"]
    assert "tools not in name order" in done.evidence


def test_frozen_prefix_never_rewrites_history() -> None:
    t0 = datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    m0 = {"role": "user", "content": "long tool output " * 20}
    a0 = {"role": "assistant", "content": "ok"}
    trimmed = {"role": "user", "content": "[output trimmed]"}
    later = [trimmed, a0, {"role": "user", "content": "next"}, a0, {"role": "user", "content": "more"}]
    bodies = [{"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [m0]},
              {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [m0, a0, {"role": "user", "content": "next"}]},
              {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": later},
              {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [*later, a0, {"role": "user", "content": "x"}]},
              {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "summary"}]}]
    done = _fixes.frozen_prefix([Request(t0 + timedelta(minutes=k), b, k) for k, b in enumerate(bodies)])
    assert done.requests[2].body["messages"][0] == m0  # re-sent as first sent
    assert done.requests[3].body["messages"][0] == m0  # and on every later request
    assert done.requests[3].body["messages"][1:] == bodies[3]["messages"][1:]
    assert done.requests[4].body["messages"] == bodies[4]["messages"]  # a compaction starts anew
    assert done.changed == [2, 3] and "messages[0] re-rendered" in done.evidence


def test_breakpoints_place_two_markers_and_nothing_else(lab, replays) -> None:
    before = _requests(lab, replays["naive"])
    done = _fixes.breakpoints(before)
    _check_shape(before, done.requests)
    for a, b in zip(before, done.requests, strict=True):
        assert "cache_control" not in b.body
        # none on the tools: oh-my-pi and Lore place none there (the strategies this fix stands for)
        assert "cache_control" not in b.body["tools"][-1] and "cache_control" in b.body["system"][-1]
        assert "cache_control" in b.body["messages"][-1]["content"][-1]
        assert _fixes._marker_count(b.body) == 2
        assert _no_cc(b.body["tools"]) == _no_cc(a.body["tools"])
        assert validate_request(b.body) == []


def test_ttl_sets_each_marker_by_where_it_sits(lab, replays) -> None:
    before = _requests(lab, replays["durable_delta"])
    everywhere = _fixes.ttl(before, through="messages")
    _check_shape(before, everywhere.requests)
    for a, b in zip(before, everywhere.requests, strict=True):
        marks = [m for m in _ttls(b.body)]
        assert marks and set(marks) == {"1h"}
        assert _no_cc(a.body) == _no_cc(b.body)
    system_only = _fixes.ttl(before, through="system")
    _check_shape(before, system_only.requests)
    for a, b in zip(before, system_only.requests, strict=True):
        assert _no_cc(a.body) == _no_cc(b.body)
        marks = _ttls(b.body)
        assert "1h" in marks and "5m" in marks
        assert marks == sorted(marks)  # "1h" < "5m": every 1h breakpoint before every 5m one, as the API requires
        assert {m["cache_control"].get("ttl") for m in b.body["system"] if "cache_control" in m} == {"1h"}
    none = _fixes.ttl(before, through=None)
    assert set().union(*(_ttls(r.body) for r in none.requests)) == {"5m"}
    with pytest.raises(ValueError, match="through='cache'"):
        _fixes.ttl(before, through="cache")


def _ttls(body: dict) -> list[str]:
    from promptcache_nb.advice._counterfactual import _fixes_ttls

    return _fixes_ttls(body)


def _gapped_session(lab: pc.Lab, gaps_min: list[float], *, turn_words: int = 40) -> pc.Session:
    """A session whose marked system prompt (~5k tokens) stays and whose conversation grows, with these gaps."""
    s = lab.session(strategy="naive", project=f"gaps-{len(lab.sessions())}")
    system = [{"type": "text", "text": " ".join(f"rule{i} keeps invoices tidy" for i in range(1200)),
               "cache_control": {"type": "ephemeral"}}]
    messages: list[dict] = []
    at = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    for k, gap in enumerate([0.0, *gaps_min]):
        at += timedelta(minutes=gap)
        if messages:
            messages = [*messages, {"role": "assistant", "content": [{"type": "text", "text": f"done {k}"}]}]
        words = " ".join(f"w{k}x{j}" for j in range(turn_words))
        last = {"role": "user", "content": [{"type": "text", "text": f"step {k}: {words}",
                                             "cache_control": {"type": "ephemeral"}}]}
        sent = [{**m, "content": [{kk: vv for kk, vv in b.items() if kk != "cache_control"} for b in m["content"]]}
                for m in messages]
        messages = [*messages, last]
        s.record({"model": "claude-sonnet-4-5", "max_tokens": 64, "system": system, "messages": [*sent, last]},
                 at=at)
    return s


def test_ttl_choice_gaps_under_5_minutes_get_no_1h() -> None:
    with pc.Lab(progress=False) as lab:
        s = _gapped_session(lab, [0.5, 2, 4, 1, 3, 4.5, 0.5, 2])
        (row,) = pc.advise(s, fixes=("ttl",)).findings.itertuples()
        assert row.verdict == "costs more" and row.usd_saved < 0 and row.requests == []
        assert row.evidence.startswith("keep the TTLs as sent (the cheapest)")
        assert "no idle gap between 5 and 60 min" in row.evidence
        # applied anyway, on request: the cheapest other choice, a 1h run ending on the system prompt
        cf = pc.counterfactual(s, fixes=["ttl"])
        ttls = [_ttls(b) for b in _bodies(cf)]
        assert all(t == ["1h", "5m"] for t in ttls)


def test_ttl_choice_10_to_50_minute_gaps_get_1h_everywhere() -> None:
    with pc.Lab(progress=False) as lab:
        s = _gapped_session(lab, [10, 25, 50, 15, 40, 30])
        (row,) = pc.advise(s, fixes=("ttl",)).findings.itertuples()
        assert row.verdict == "saves" and row.usd_saved > 0
        assert row.requests == [1, 2, 3, 4, 5, 6]  # every gap: a read where 5m rebuilt
        assert row.evidence.startswith("1h on system, messages; reads instead of rebuilding after 6 gaps (10 min "
                                       "before 1, 25 min before 2, 50 min before 3, …)")
        cf = pc.counterfactual(s, fixes=["ttl"])
        assert all(set(_ttls(b)) == {"1h"} for b in _bodies(cf))


def test_ttl_choice_mixed_gaps_put_1h_only_on_the_system_prompt() -> None:
    """Many short gaps and three idle ones: the system prompt (written twice) pays for 1h; the conversation, written
    anew every request, does not (its 2× writes outweigh the two early rebuilds they would avoid)."""
    with pc.Lab(progress=False) as lab:
        gaps = [0.5] * 30
        gaps[4], gaps[7], gaps[20] = 20, 30, 70  # two gaps a 1h entry outlives, one it does not
        s = _gapped_session(lab, gaps, turn_words=150)
        (row,) = pc.advise(s, fixes=("ttl",)).findings.itertuples()
        assert row.verdict == "saves"
        assert row.requests == [5, 8]  # after the 20 and 30 min gaps; after 70 min everything rebuilds anyway
        assert row.evidence == ("1h on system; 5m on messages; reads instead of rebuilding after 2 gaps (20 min "
                                "before 5, 30 min before 8); over 60 min, the 70 min gap before request 21 rebuilds "
                                "under any TTL")
        cf = pc.counterfactual(s, fixes=["ttl"])
        assert all(_ttls(b) == ["1h", "5m"] for b in _bodies(cf))
        everything = pc.advise(s, fixes=("ttl",))  # the same choice twice: deterministic
        assert everything.findings.usd_saved.iloc[0] == row.usd_saved
        # like for like: the choice costs less than 1h on every marker and than 5m on every marker
        whatif = pc.ttl_whatif(s)
        for ttl in ("1h", "5m"):
            assert row.cost_counterfactual_usd < whatif[whatif.ttl == ttl].cost_usd.sum()


def _bodies(s: pc.Session) -> list[dict]:
    return [t.request.body for t in load_turns(s.lab, s.id)]


def test_keep_warm_pings_only_gaps_a_few_pings_can_bridge() -> None:
    t0 = datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    times = [t0, t0 + timedelta(minutes=3), t0 + timedelta(minutes=23), t0 + timedelta(minutes=143)]
    reqs = [Request(at, body, k) for k, at in enumerate(times)]
    done = _fixes.keep_warm(reqs, ttl_seconds=lambda _b: 300.0, worth=lambda _i, n: n <= 11)
    real = [r for r in done.requests if not r.ping]
    assert [r.at for r in real] == times and [r.origin for r in real] == [0, 1, 2, 3]
    pings = [r for r in done.requests if r.ping]
    # the 20 min gap needs 4 pings (every 4 min); the 120 min gap would need 29 > 11: left cold
    assert [p.at for p in pings] == [times[1] + timedelta(minutes=4 * m) for m in range(1, 5)]
    assert all(p.body == {**body, "max_tokens": 0} for p in pings)
    assert done.changed == [2]


def test_unknown_fix_and_strategy_fail_naming_the_known_ones(replays) -> None:
    with pytest.raises(ValueError, match="known: frozen_prefix"):
        pc.counterfactual(replays["naive"], fixes=["clock"])
    with pytest.raises(ValueError, match="use one of naive, clock_at_tail"):
        pc.counterfactual(replays["naive"], strategy="rewrite_knowledge")
    with pytest.raises(ValueError, match="one of them"):
        pc.counterfactual(replays["naive"])


# -- the strategies as ground truth --------------------------------------------------------------
def _equivalence_table() -> ModuleType:
    """``benchmarks/equivalence_table.py``: its ``write_proxy_log`` is the one way the tests log a replay."""
    return _benchmarks.load("equivalence_table")


#: The session's requests as the recording proxy logs them: bodies and the usage the cache model reported.
write_proxy_log = _equivalence_table().write_proxy_log


@pytest.fixture(scope="module")
def churn_replays(lab: pc.Lab) -> dict[str, pc.Session]:
    return {st: lab.replay("data/scenarios/knowledge_churn.yaml", strategy=st)
            for st in ("naive", "clock_in_system", "clock_at_tail", "append_only", "durable_delta")}


@pytest.mark.parametrize("scenario", ["support_agent", "knowledge_churn"])
@pytest.mark.parametrize("source", ["naive", "clock_in_system"])
def test_counterfactual_lands_close_to_the_strategy_it_stands_for(request, lab, tmp_path, scenario, source) -> None:
    replays = request.getfixturevalue("replays" if scenario == "support_agent" else "churn_replays")
    log = write_proxy_log(replays[source], tmp_path / f"{source}.jsonl")
    (imported,) = lab.import_log(log).sessions
    assert imported.strategy is None  # no strategy information survives the log
    for target in ("clock_at_tail", "append_only", "durable_delta"):
        cf = pc.counterfactual(imported, strategy=target)
        assert cf.counterfactual_of == imported.id and imported.counterfactual_of is None
        assert cf.fixes == pc.advice.STRATEGY_FIXES[target] and imported.fixes == ()
        got, real = cf.turns(), replays[target].turns()
        assert len(got) == len(real) == len(imported.turns())
        assert list(got["sent_at"]) == list(imported.turns()["sent_at"])  # the original times
        gap = abs(got.cost_usd.sum() - real.cost_usd.sum()) / real.cost_usd.sum()
        assert gap < EQUIVALENCE_BOUND, (source, target, gap)


def test_advice_on_a_clock_in_the_system_prompt(lab, replays) -> None:
    advice = pc.advise(replays["clock_in_system"])
    top = advice.findings.iloc[0]
    assert list(advice.findings.usd_saved) == sorted(advice.findings.usd_saved, reverse=True)
    assert {"tail_volatile", "durable_deltas", "all"} <= set(advice.findings.fix)
    tv = advice.findings.set_index("fix").loc["tail_volatile"]
    assert tv.verdict == "saves" and tv.usd_saved > 0.5 and tv.tokens_saved > 0 and tv.extra_tokens > 0
    assert tv.label == "simulated (counterfactual)"
    assert tv.confidence.startswith("no measured usage")
    assert advice.summary().startswith(top.action) and "on these 100 requests" in advice.summary()
    ttl = advice.findings.set_index("fix").loc["ttl"]
    assert ttl.verdict == "costs more" and ttl.usd_saved < 0  # said out loud
    # apply stores the counterfactual whose figures the advice reported
    cf = advice.apply("tail_volatile")
    assert cf.config["fixes"] == ["tail_volatile"] and cf.config["counterfactual_of"] == replays["clock_in_system"].id
    assert cf.turns().cost_usd.sum() == pytest.approx(tv.cost_counterfactual_usd, rel=1e-9)
    html = advice._repr_html_()
    assert "simulated (counterfactual)" in html and "<script" not in html
    assert "tail_volatile" in repr(advice)


def test_advice_html_escapes_what_it_quotes(lab) -> None:
    s = lab.session(strategy="naive", project="xss", system="<script>alert(1)</script>")
    t0 = datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
    msgs: list[dict] = []
    for k in range(5):
        msgs = [*msgs, {"role": "user", "content": f"q{k}"}]
        s.record({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": msgs,
                  "system": f"<script>alert(1)</script>\n<b>Clock</b> 13:0{k}\u202e"}, at=t0 + timedelta(minutes=k))
        msgs = [*msgs, {"role": "assistant", "content": "a"}]
    advice = pc.advise(s)
    page = advice._repr_html_()
    assert "<script>" not in page and "<b>Clock" not in page and "\u202e" not in page
    assert "&lt;b&gt;Clock&lt;/b&gt; 13:00⟨RLO⟩" in page


# -- partial logs: Claude Code ------------------------------------------------------------------
def test_claude_code_ttl_advice_names_exactly_the_rebuilds_after_5_to_60_minute_gaps() -> None:
    with pc.Lab(progress=False) as lab:
        (s,) = lab.import_log(GAPS_LOG).sessions
        gaps = [None if g is None else round(g / 60) for g in
                [None, *((b - a).total_seconds() for a, b in zip(list(s.turns()["sent_at"]), list(s.turns()["sent_at"])[1:], strict=False))]]
        assert gaps == [None, 1, 3, 20, 90, 1]
        advice = pc.advise(s)
        by_fix = advice.findings.set_index("fix")
        # the one rebuild TTL decides: after the 20 min gap; not after 3 (a hit either way) nor 90 (expired either way)
        assert by_fix.loc["ttl", "requests"] == [3]
        # Claude Code wrote its ~14k-token system prompt at 1h. Two 1h writes (2×) cost more than the one rebuild
        # at 5m (1.25×) they avoid after the 20 min gap: 5m is the cheaper choice, and the evidence says which gaps
        assert by_fix.loc["ttl", "evidence"] == (
            "5m on prefix, conversation; rebuilds after the 20 min gap before request 3 (read as sent, for 2× writes "
            "that cost more); over 60 min, the 90 min gap before request 4 rebuilds under any TTL")
        assert by_fix.loc["ttl", "verdict"] == "saves" and by_fix.loc["ttl", "tokens_saved"] < 0
        assert by_fix.loc["ttl", "confidence"].startswith("replay reproduces 100% of 6 measured requests")
        assert by_fix.loc["ttl", "cost_basis"] == "measured"
        assert by_fix.loc["ttl", "usd_saved_low"] <= by_fix.loc["ttl", "usd_saved"] <= by_fix.loc["ttl", "usd_saved_high"]
        # 1h on every breakpoint instead: reads after that same gap only, and costs more than as sent
        hour = pc.ttl_whatif(s)
        hour, sent = hour[hour.ttl == "1h"].reset_index(drop=True), s.turns()
        assert [i for i in range(len(sent)) if hour.cache_read_input_tokens[i] > sent.cache_read_input_tokens[i]
                ] == [3]
        missing = advice.not_possible.set_index("fix")
        assert set(missing.index) == {"frozen_prefix", "tail_volatile", "durable_deltas", "breakpoints"}
        assert "no system prompt or tools" in missing.loc["tail_volatile", "why"]
        cf = pc.counterfactual(s, fixes=["ttl", "tail_volatile"])
        assert cf.config["fixes"] == ["ttl"] and "tail_volatile" in cf.config["fixes_not_possible"]
        assert cf.config["cache_params"]["client_ttls"] == ["5m", "5m"]
        assert len(cf.turns()) == len(s.turns())


def test_shipped_claude_code_example_gets_only_timing_advice() -> None:
    with pc.Lab(progress=False) as lab:
        lab.import_log(pc.data_path("logs") / "claude_code")
        advice = pc.advise(lab)
        assert set(advice.findings.fix) <= {"ttl", "keep_warm", "stagger", "all"}
        assert advice.fleet is not None and set(advice.fleet.fix) == set(advice.findings.fix)
        main = advice.findings[(advice.findings.fix == "ttl") & (advice.findings.requests.map(len) > 0)]
        (row,) = main.itertuples()
        assert row.requests == [6]  # the rebuild after the 6-minute gap, not the one after a /clear
        # a Lab's advice holds no session's bodies (they would grow with the history): apply() reads its session
        # back, and stores the counterfactual that session's own advice stores
        assert advice._kept == {} and advice._requests == {sid: n for sid, n in (
            (r["id"], r["requests"]) for r in lab.store.original_sessions()) if n}
        cf = advice.apply("ttl", session=row.session)
        assert cf.config["counterfactual_of"] == row.session
        assert row.session in advice.summary() or "requests" in advice.summary()
        own = pc.advise(lab.session(id=row.session))
        assert set(own._kept) == {row.session}
        alone = own.apply("ttl")
        columns = ["cache_read_input_tokens", "cache_creation_input_tokens", "input_tokens", "cost_usd"]
        assert alone.turns()[columns].equals(cf.turns()[columns]) and alone.id != cf.id
        # the counterfactuals are not advised again
        assert {r["id"] for r in lab.store.original_sessions()}.isdisjoint({cf.id, alone.id})


def test_sessions_that_shared_a_project_cache_are_replayed_together() -> None:
    """A second Claude Code conversation 45 min after the first reads the system prompt the first wrote at 1h.
    Replayed alone it would write it; replayed with its project's sessions (each under its own client TTLs) the
    baseline reads what was measured, and its advice's confidence goes from meaningless to exact."""
    from promptcache_nb.advice._advice import _confidence
    from promptcache_nb.advice._counterfactual import Original

    with pc.Lab(progress=False) as lab:
        lab.import_log(pc.data_path("logs") / "claude_code")
        rows = {r["id"]: r for r in lab.store.session_rows(None)}
        later = next(sid for sid, r in rows.items() if r["config"]["session_kind"] == "main"
                     and lab.session(id=sid).n_turns == 1)
        orig = Original.load(lab.session(id=later))
        assert {x.key for x in orig.shared} == set(rows) - {later}  # its project, within the hour before it
        # only sessions that sent within the window are read back: one query says which
        first, last = orig.turns[0].at, orig.turns[-1].at
        others = sorted(set(rows) - {later})
        assert lab.store.sessions_sending_between(others, first - timedelta(hours=2), last) == others
        assert lab.store.sessions_sending_between(others, last + timedelta(seconds=1), last) == []
        measured = lab.session(id=later).turns().cache_read_input_tokens.tolist()
        together = orig.simulate(orig.plan(()))
        alone = Original(orig.lab, orig.row, orig.turns, orig.calibration, orig.cache, orig.cache_params, orig.memo)
        apart = alone.simulate(alone.plan(()))
        assert apart.cache_read_input_tokens.tolist() == [0] and measured == [14210]
        assert together.cache_read_input_tokens.tolist() == measured
        err_apart, _ = _confidence(alone.fits())
        err_together, label = _confidence(orig.fits())
        assert err_apart > 5 and err_together < 0.05 and "low" not in label
        advice = pc.advise(lab.session(id=later))
        assert {c.split("; tokens ")[0] for c in advice.findings.confidence} == {label}
        # another cache model is no provider cache these sessions shared: replayed alone
        assert Original.load(lab.session(id=later), cache="openai").shared == ()


def test_compaction_timing_on_the_shipped_partial_logs() -> None:
    """Claude Code compacted 4.6 min after its last request (a warm 5m cache: the conversation it had cached is
    discarded) 3 requests after a 6 min gap had expired that cache anyway; pi likewise; Codex had no idle gap."""
    expected = {
        "claude_code": (9, 6, "discarded a warm cache (1,695 tokens); the 6 min gap before request 6 had expired it "
                              "3 requests earlier: compacting there rebuilds once, not twice"),
        "pi": (8, 6, "discarded a warm cache (8,600 tokens); the 12 min gap before request 6 had expired it 2 "
                     "requests earlier: compacting there rebuilds once, not twice"),
        "codex": (6, None, "discarded a warm cache (1,152 tokens); no idle gap since the first request: no cheaper "
                           "moment in this log"),
    }
    for name, (idx, cold, verdict) in expected.items():
        with pc.Lab(progress=False) as lab:
            lab.import_log(pc.data_path("logs") / name)
            advice = pc.advise(lab)
            (row,) = advice.compactions.itertuples(index=False)
            assert (row.idx, row.verdict, row.source, bool(row.warm)) == (idx, verdict, "measured", True)
            assert (None if pd.isna(row.cold_gap_before) else int(row.cold_gap_before)) == cold
            turns = lab.session(id=row.session).turns()
            assert row.rewrite_tokens == turns.cache_creation_input_tokens[idx]  # the measured write, as stored
            at = turns["sent_at"]
            assert row.gap_seconds == (at[idx] - at[idx - 1]).total_seconds() < row.ttl_seconds
            assert f"compaction {row.session} request {idx}: " in advice.text(width=400)
            assert "not simulated" in advice.text(width=400) and "Compaction timing" in advice._repr_html_()
            # the one function says the same
            again = pc.advice.compaction_timing(lab.session(id=row.session))
            assert list(again.verdict) == [verdict] and "not simulated" in again.attrs["not_simulated"]


def test_compaction_after_an_idle_gap_is_well_timed() -> None:
    with pc.Lab(progress=False) as lab:
        s = _gapped_session(lab, [1, 1])
        body = _bodies(s)[-1]
        summary = {"role": "user", "content": [{"type": "text", "text": "Summary: the invoices are tidy.",
                                                "cache_control": {"type": "ephemeral"}}]}
        at = s.turns()["sent_at"].iloc[-1].to_pydatetime()
        s.record({**body, "messages": [summary]}, at=at + timedelta(minutes=12), events=("compaction",))
        s.record({**body, "messages": [{**summary, "content": [{"type": "text", "text": "Summary: tidy."}]},
                                       {"role": "assistant", "content": "ok"},
                                       {"role": "user", "content": [{"type": "text", "text": "next",
                                                                     "cache_control": {"type": "ephemeral"}}]}]},
                 at=at + timedelta(minutes=13), events=("compaction",))
        df = pc.advice.compaction_timing(s)
        first, second = df.itertuples(index=False)
        assert (first.idx, bool(first.warm), first.discarded_tokens, first.source) == (3, False, 0, "simulated")
        assert first.verdict == ("well timed: after a 12 min gap the cache had expired (TTL 5 min); the rewrite "
                                 "discarded nothing warm")
        assert bool(second.warm) and second.discarded_tokens > 0  # right after the first: nothing idle since
        assert second.verdict.endswith("no idle gap since the previous compaction: no cheaper moment in this log")


# -- the command line ----------------------------------------------------------------------------
def test_cli_advise_prints_ranked_findings_within_120_columns(tmp_path, capsys) -> None:
    from promptcache_nb.cli import main

    db = tmp_path / "runs.duckdb"
    with pc.Lab(db, progress=False) as lab:
        lab.import_log(GAPS_LOG)
        lab.import_log(pc.data_path("logs") / "claude_code")
        sid = lab.sessions().id.iloc[0]
    assert main(["advise", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "anchored on measured usage)." in out  # the summary, wrapped
    assert "fidelity: replay reproduces" in out
    assert max(map(len, lines)) <= 120
    assert "tail_volatile not possible (5 sessions): the log holds no system prompt or tools" in out
    assert main(["advise", "--db", str(db), "--session", sid]) == 0
    one = capsys.readouterr().out
    firsts = [ln for ln in one.splitlines() if " — " in ln and not ln.startswith(" ")]
    assert firsts and not any(ln.startswith(sid) for ln in firsts)  # one session: no session column
    assert main(["advise", "--db", str(db), "--session", "nope"]) == 2
    assert "no session 'nope'" in capsys.readouterr().err
    with pc.Lab(db, progress=False) as lab:  # read-only: nothing was stored
        assert not any(r["config"].get("counterfactual_of") for r in lab.store.session_rows())


# -- the widget ----------------------------------------------------------------------------------
def test_whatif_controller_and_widget(lab, replays) -> None:
    s = replays["clock_in_system"]
    c = pc.widgets.WhatIfController(s)
    assert c.available == pc.advice.FIXES and c.not_possible == {}
    base = c.totals()
    assert base["counterfactual_cost_usd"] == pytest.approx(base["simulated_cost_usd"])  # no fix: the original
    assert c.first_changed() is None and "no request body changed" in c.diff_html()
    c.toggle("tail_volatile", True)
    t = c.totals()
    assert c.fixes == ("tail_volatile",) and t["counterfactual_cost_usd"] < base["simulated_cost_usd"]
    df = c.frame()
    assert len(df) == 100 and df.counterfactual_read_pct.mean() > df.simulated_read_pct.mean()
    assert c.first_changed() == 0 and "original (left) against counterfactual (right)" in c.diff_html()
    with pytest.raises(ValueError, match="unknown fix"):
        c.toggle("clock", True)

    w = pc.widgets.WhatIf(s)
    assert repr(w) == f"WhatIf(session={s.id!r}, fixes=[])"
    w._boxes["durable_deltas"].value = True  # a click on the box
    assert w.controller.fixes == ("durable_deltas",) and w.fixes == ["durable_deltas"]
    w.tick("tail_volatile")
    assert w.controller.fixes == ("tail_volatile", "durable_deltas") and w._boxes["tail_volatile"].value
    w.untick("durable_deltas")
    assert w.controller.fixes == ("tail_volatile",)
    assert "simulated (counterfactual)" in w._header.value and "<script" not in w.snapshot_html()
    w.rank()
    assert "every fix, ranked" in w._findings.value and "tail_volatile" in w.snapshot_html()


def test_whatif_on_a_partial_log_offers_only_timing_fixes() -> None:
    with pc.Lab(progress=False) as lab:
        (s,) = lab.import_log(GAPS_LOG).sessions
        w = pc.widgets.WhatIf(s)
        assert set(w._boxes) == {"ttl", "keep_warm", "stagger"}  # timing fixes: no body change
        assert "tail_volatile: not possible" in w._missing.value
        with pytest.raises(ValueError, match="no system prompt or tools"):
            w.tick("breakpoints")
        w.tick("ttl")
        df = w.controller.frame()
        # the ttl choice here is 5m on both breakpoints (cheaper than Claude Code's 1h prefix): request 3, after the
        # 20 min gap, rebuilds what it read as sent
        assert df.measured_cost_usd.notna().all() and df.loc[3, "counterfactual_read_pct"] < df.loc[3, "measured_read_pct"]


# -- like for like -------------------------------------------------------------------------------
def test_no_fix_replays_a_simulated_session_exactly(lab, replays) -> None:
    s = replays["durable_delta"]
    same = pc.counterfactual(s, fixes=[])
    a, b = s.turns(), same.turns()
    assert list(b.cache_read_input_tokens) == list(a.cache_read_input_tokens)
    assert b.cost_usd.sum() == pytest.approx(a.cost_usd.sum(), rel=1e-12)
    assert same.fixes == () and same.counterfactual_of == s.id


def test_counterfactual_under_another_cache_model(lab, replays) -> None:
    s = replays["clock_in_system"]
    cf = pc.counterfactual(s, fixes=["tail_volatile", "ttl"], cache="openai")
    assert cf.cache == "openai" and cf.fixes == ("tail_volatile",)
    assert "no TTL to choose" in cf.config["fixes_not_possible"]["ttl"]
    before = pc.resimulate(lab, s.id, cache="openai").cost_usd.sum()  # the original under the same model
    assert cf.turns().cost_usd.sum() < before


def test_a_lab_where_nothing_saves_says_so() -> None:
    with pc.Lab(progress=False) as lab:
        s = lab.session(strategy="naive", project="flat")
        t0 = datetime(2026, 1, 5, 13, 0, tzinfo=UTC)
        body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "Be terse.",
                "messages": [{"role": "user", "content": "hi"}]}
        s.record(body, at=t0)
        advice = pc.advise(lab)
        assert advice.summary() == "No fix saves anything we can show on this request (simulated (counterfactual))."
        assert set(advice.findings.verdict) <= {"saves nothing", "costs more"}
        assert advice.fleet is not None and len(advice.fleet) == len(advice.findings)


def test_the_ttl_fix_agrees_with_the_ttl_whatif(lab, replays) -> None:
    """The ``ttl`` fix's choice is one of the cuts :func:`pc.ttl_whatif` bounds: never dearer than 1h or 5m on every
    breakpoint, and exactly the whatif's figure when it chose 1h everywhere (two paths, one figure)."""
    for s in (replays["durable_delta"], replays["clock_in_system"]):
        advice = pc.advise(s, fixes=("ttl",))
        whatif = pc.ttl_whatif(s)
        row = advice.findings.set_index("fix").loc["ttl"]
        kept = row.evidence.startswith("keep the TTLs as sent")
        for ttl in ("1h", "5m"):
            whole = whatif[whatif.ttl == ttl].cost_usd.sum()
            if kept:  # as sent was the cheapest: the other choice shown is dearer than as sent only
                assert row.cost_basis_usd <= whole + 1e-9
            else:
                assert row.cost_counterfactual_usd <= whole + 1e-9
    with pc.Lab(progress=False) as other:
        other.import_log(pc.data_path("logs") / "claude_code")
        main = next(x for x in (other.session(id=i) for i in other.sessions().id) if x.n_turns > 5)
        advice = pc.advise(main, fixes=("ttl",))
        row = advice.findings.set_index("fix").loc["ttl"]
        assert row.evidence.startswith("1h on prefix, conversation")
        # the whatif replays both sides; the advice anchors the same difference on the measured cost
        whatif = pc.ttl_whatif(main)
        measured = main.turns().cost_usd.sum()
        simulated_diff = whatif[whatif.ttl == "1h"].cost_usd.sum() - pc.resimulate(main, cache="anthropic").cost_usd.sum()
        anchored_diff = row.cost_counterfactual_usd - measured
        assert row.cost_basis_usd == pytest.approx(measured)
        assert anchored_diff == pytest.approx(simulated_diff, rel=0.25)
