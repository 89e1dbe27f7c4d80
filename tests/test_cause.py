"""One cause per measured request (issue 21, items 8 and 9).

A request recorded with measured usage gets its ``cache_reason``, its observation's explanation and its
``pc.rebuilds`` row from one function (``analysis.cause.measured_cause``): every case here asserts the three
agree. Sessions are recorded with ``Session.record(body, usage=...)`` on a real DuckDB file; measured totals
are chosen independently of the estimator.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.cause import NOISE_FLOOR, MeasuredRequest, measured_cause
from promptcache_nb.cache._reasons import NOT_REBUILD
from promptcache_nb.request import prepare
from promptcache_nb.usage import Usage

T0 = datetime(2026, 11, 3, 14, 0, tzinfo=UTC)
SYSTEM = "You answer questions about the ledger service: invoices, refunds, payouts and their audit trail. " * 90


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def body(n_turns: int, *, system: str = SYSTEM, model: str = "claude-sonnet-4-5", first: str = "question 0") -> dict:
    msgs: list[dict] = []
    for i in range(n_turns):
        if i:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i - 1}"}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": first if i == 0 else f"question {i}"}]})
    return {"model": model, "max_tokens": 512, "system": [{"type": "text", "text": system}], "messages": msgs,
            "cache_control": {"type": "ephemeral"}}


def usage(uncached: int, read: int, write: int) -> dict:
    return {"input_tokens": uncached, "cache_read_input_tokens": read, "cache_creation_input_tokens": write,
            "output_tokens": 40}


def responses_body(n_turns: int, model: str = "gpt-5") -> dict:
    """A Codex-style Responses request: instructions, then the conversation as input items."""
    items: list[dict] = []
    for i in range(n_turns):
        if i:
            items.append({"role": "assistant", "content": [{"type": "output_text", "text": f"Ran step {i - 1}."}]})
        items.append({"role": "user", "content": [{"type": "input_text", "text": f"Next: step {i} of the refactor."}]})
    return {"model": model, "instructions": "You are a coding agent in a terminal. " * 120, "input": items}


def responses_usage(prompt: int, cached: int) -> dict:
    """An OpenAI Responses ``usage``: the prompt figure includes the cached tokens; no cache-write figure."""
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": 120}


@pytest.fixture
def lab(tmp_path):
    with pc.Lab(tmp_path / "cause.duckdb", progress=False) as lab:
        yield lab


def agree(s) -> object:
    """Every measured request's stored reason, explanation and rebuilds row name one cause; returns the rows."""
    rows = pc.rebuilds(s)
    listed = set(rows.idx)
    df = s.turns()
    for r in rows.itertuples():
        t = s.turn(int(r.idx))
        assert t.cache_reason == r.reason == df.cache_reason[r.idx]
        assert r.explanation in t.observation.explanation  # the same sentence, word for word
        assert "no break" not in t.observation.explanation
        assert "The cache read everything" not in t.observation.explanation
    for idx, reason in zip(df.idx, df.cache_reason, strict=True):
        if idx and isinstance(reason, str):
            assert (reason not in NOT_REBUILD) == (idx in listed), (idx, reason)
    return rows


def test_a_compaction(lab):
    s = lab.session(project="compaction")
    s.record(body(10), at=at(0), usage=usage(3, 0, 40_000))
    s.record(body(11), at=at(20), usage=usage(3, 40_000, 600))
    t = s.record(body(1, first="Summary so far: the refund flow and the ledger audit."), at=at(40),
                 usage=usage(3, 18_000, 2_000), events=["compaction"])
    row = agree(s).iloc[0]
    assert (row.idx, row.reason, t.cache_reason) == (2, "compaction", "compaction")
    assert "21 -> 1 messages" in row.cause and "eviction" not in t.observation.explanation


def test_a_ttl_expiry(lab):
    s = lab.session(project="ttl")
    s.record(body(1), at=at(0), usage=usage(3, 0, 20_000))
    s.record(body(2), at=at(30), usage=usage(3, 20_000, 1_500))
    t = s.record(body(3), at=at(30 + 420), usage=usage(3, 0, 23_000))
    row = agree(s).iloc[0]
    assert t.cache_reason == "ttl_expired" and row.cause == "TTL expiry: the 5m entry was idle 7m00s"
    assert t.observation.explanation.startswith("Cache break: read 0 cached tokens and sent again 21,503")
    assert ("TTL expiry: the 5m entry was idle 7m00s. Measured: the previous request held 21,503 prompt tokens; "
            "this one read 0 and wrote 23,000, so 21,503 tokens were written again.") in t.observation.explanation


def test_a_located_prefix_change(lab):
    s = lab.session(project="prefix")
    s.record(body(3), at=at(0), usage=usage(3, 0, 30_000))
    edited = body(4, system=SYSTEM.replace("refunds", "chargebacks", 1))
    t = s.record(edited, at=at(30), usage=usage(3, 0, 31_500))
    row = agree(s).iloc[0]
    assert t.cache_reason == "prefix_changed" and row.changed_path == "system[0]"
    assert row.cause.startswith("prefix changed at system[0] (byte ")


def _partial(b: dict, unlogged: int):
    return prepare(b, unlogged_prefix_tokens=unlogged)


def test_an_unlogged_prefix_change_with_evidence(lab):
    s = lab.session(project="unlogged")
    b1, b2 = body(2, system="Be brief."), body(3, system="Be brief.")
    s.record(b1, at=at(0), usage=usage(3, 0, 25_000), prepared=_partial(b1, 24_000))
    t = s.record(b2, at=at(30), usage=usage(3, 0, 26_500), prepared=_partial(b2, 25_000))
    row = agree(s).iloc[0]
    assert t.cache_reason == "unlogged_prefix_changed"
    assert "went from 24,000 to 25,000 measured tokens" in row.cause


def test_a_provider_side_miss_with_the_logged_prefix_unchanged(lab):
    """Only appended, read fell to 0 within the TTL: not an eviction claimed, not a change outside the log."""
    s = lab.session(project="miss")
    s.record(body(2), at=at(0), usage=usage(3, 0, 20_000))
    s.record(body(3), at=at(30), usage=usage(3, 20_000, 1_500))
    t = s.record(body(4), at=at(60), usage=usage(3, 0, 23_000))
    row = agree(s).iloc[0]
    assert t.cache_reason == "provider_miss" and row.cause.startswith(
        "provider-side miss (the logged prefix was unchanged)")
    assert "prefix changed outside the logged content" not in t.observation.explanation
    assert "The request only appended 2 segments to the previous one." in t.observation.explanation


def test_a_rebuild_under_openclaws_break_threshold_never_says_no_break(lab):
    """57,015 read before, 55,500 now (not 5 % lower: no OpenClaw break), but 2,280 tokens written again."""
    s = lab.session(project="small")
    s.record(body(2), at=at(0), usage=usage(3, 0, 57_015))
    s.record(body(3), at=at(30), usage=usage(3, 57_015, 800))
    t = s.record(body(4), at=at(60), usage=usage(3, 55_538, 2_280))
    # a break by the verdict (2,280 tokens written again), none by OpenClaw's read-drop rule (a 2.6 % drop)
    assert t.observation.broke is True and t.observation.openclaw_broke is False
    row = agree(s).iloc[0]
    assert row.lost_tokens == 57_818 - 55_538 == 2_280
    assert t.observation.explanation.startswith(
        "Cache break: read 55,538 cached tokens and sent again 2,280 the cache held for it.")


def test_openai_codex_usage_without_cache_writes_has_rebuilds(lab):
    """Responses usage reports only cached_tokens: the tokens re-sent uncached are the rebuild."""
    s = lab.session(project="codex", cache="openai")
    s.record(responses_body(1), at=at(0), usage=responses_usage(21_000, 0))
    t1 = s.record(responses_body(2), at=at(20), usage=responses_usage(22_400, 20_992))  # 128-token granularity
    t2 = s.record(responses_body(3), at=at(40), usage=responses_usage(23_900, 0))      # read 0, re-sent 22,400
    t3 = s.record(responses_body(4), at=at(60), usage=responses_usage(25_300, 0))      # 0 after 0: still no hit
    assert t1.cache_reason == "hit"
    rows = agree(s)
    assert list(rows.idx) == [2, 3] and [t2.cache_reason, t3.cache_reason] == ["provider_miss"] * 2
    assert list(rows.lost_tokens) == [22_400, 23_900]
    assert ("Measured: the previous request held 23,900 prompt tokens; this one read 0 and sent 25,300 uncached, "
            "so 23,900 tokens were sent again uncached.") in t3.observation.explanation
    # below OpenAI's 1,024-token minimum nothing is cached: reading 0 after 0 is no rebuild, and no hit either
    small = lab.session(project="codex-small", cache="openai")
    small.record({"model": "gpt-5", "input": "Hi."}, at=at(0), usage=responses_usage(700, 0))
    t = small.record({"model": "gpt-5", "input": "Hi again."}, at=at(20), usage=responses_usage(720, 0))
    assert t.cache_reason == "below_minimum" and agree(small).empty


def test_the_function_itself():
    prev = MeasuredRequest(prepare(body(2)), at(0), Usage(3, 0, 20_000, source="imported"))
    cur = MeasuredRequest(prepare(body(3)), at(30), Usage(3, 20_000, 1_500, source="imported"))
    hit = measured_cause(prev, cur)
    assert hit is not None and (hit.reason, hit.rebuild, hit.lost_tokens) == ("hit", False, 3)
    lost = measured_cause(prev, MeasuredRequest(cur.request, at(30), Usage(3, 0, 21_500, source="imported")))
    assert lost is not None and lost.rebuild and lost.lost_tokens == 20_003 > NOISE_FLOOR
    assert lost.reason == "provider_miss" and lost.explanation.startswith("Provider-side miss")
    # a first request that read 20,000 tokens read another session's entry: not cold; one that read nothing is
    first = measured_cause(None, cur)
    assert first is not None and (first.reason, first.rebuild) == ("hit", False)
    assert "Cold" not in first.explanation and "read 20,000 tokens another session of this account wrote" in \
        first.explanation
    cold = measured_cause(None, prev)
    assert cold is not None and cold.reason == "cold" and cold.explanation == (
        "Cold cache: nothing was cached before this request; it wrote 20,000 tokens for the next ones to read.")
    assert measured_cause(prev, MeasuredRequest(cur.request, at(30), Usage(3, 20_000, 1_500))) is None  # simulated


def test_summaries_show_both_counts(lab):
    s = lab.session(project="counts")
    s.record(body(1), at=at(0), usage=usage(3, 0, 57_015))
    s.record(body(2), at=at(30), usage=usage(3, 57_015, 800))
    s.record(body(3), at=at(60), usage=usage(3, 55_538, 2_280))   # a break (a rebuild), no OpenClaw break
    s.record(body(4), at=at(90), usage=usage(3, 0, 60_000))       # both
    totals = pc.summarize(s.turns())
    assert (totals["breaks"], totals["rebuilds"]) == (2, 2)  # one verdict: a break is a rebuild
    assert pc.compare_df([s]).rebuilds[0] == 2
    assert list(s.turns().openclaw_broke) == [False, False, False, True]  # OpenClaw's rule, the cross-check
    assert pc.analysis.session_summary(lab, [s.id]).openclaw_breaks[0] == 1


def test_the_shipped_logs_agree():
    with pc.Lab(progress=False) as lab:
        result = lab.import_log(pc.data_path("logs"))
        for s in result.sessions:
            agree(s)
        summary = result.summary()
        assert {"openclaw_breaks", "rebuilds"} <= set(summary.columns)
        assert summary.rebuilds.sum() == sum(len(pc.rebuilds(s)) for s in result.sessions)


def test_the_cause_is_the_same_after_a_restart_and_skips_placeholder_entries(tmp_path):
    """A session reopened from the store finds the cause it would have found uninterrupted, and an entry that
    never reached the API (Claude Code's "<synthetic>" ones, usage all 0) is no baseline."""
    path = tmp_path / "restart.duckdb"
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(project="restart")
        s.record(body(1), at=at(0), usage=usage(3, 0, 20_000))
        s.record(body(2), at=at(30), usage=usage(3, 20_000, 1_500))
        sid = s.id
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(id=sid)
        t = s.record(body(3), at=at(30 + 420), usage=usage(3, 0, 23_000))
        assert t.cache_reason == "ttl_expired" and agree(s).lost_tokens[0] == 21_503
    with pc.Lab(progress=False) as lab, pytest.warns(pc.errors.UnpricedModelWarning):
        s = lab.session(project="placeholder")
        s.record(body(1), at=at(0), usage=usage(3, 0, 20_000))
        s.record(body(2), at=at(30), usage=usage(3, 20_000, 1_500))
        s.record(body(2, model="<synthetic>"), at=at(40), usage=usage(0, 0, 0))
        t = s.record(body(3), at=at(60), usage=usage(3, 0, 23_000))
        row = agree(s).iloc[0]
        assert (row.idx, t.cache_reason, row.lost_tokens) == (3, "provider_miss", 21_503)  # not "model switch"


def test_a_store_written_before_the_cause_was_stored_gets_the_same_cause(lab):
    """``rebuilds`` on rows without a stored measured cause finds it again with the same function."""
    from promptcache_nb.analysis.whatif import _REBUILD_COLUMNS, _Evidence

    s = lab.session(project="old-store")
    s.record(body(1), at=at(0), usage=usage(3, 0, 20_000))
    s.record(body(2), at=at(30), usage=usage(3, 20_000, 1_500))
    t = s.record(body(3), at=at(30 + 420), usage=usage(3, 0, 23_000))
    records = lab.store.turns_frame(s.id, _REBUILD_COLUMNS).to_dict("records")
    old_detail = {"predicted_usage": t.cache_detail["predicted_usage"]}  # what an older version stored
    found = _Evidence(lab, s.id).cause(2, records, old_detail, t.cache_detail["predicted_reason"])
    assert found is not None and (found.reason, found.lost_tokens) == (t.cache_reason, 21_503)
    assert found.explanation in t.observation.explanation
