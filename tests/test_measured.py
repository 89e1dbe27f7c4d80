"""Right numbers on measured traffic (issue 11): rebuilds, efficiency, labels, prices and cache realism, on
hand-built measured sessions whose answers follow from the usage we give them.

Every session here is recorded with ``Session.record(body, usage=...)`` (imported, *measured* usage) on a
real DuckDB file. Measured prompt totals are chosen independently of the estimator (a ~1.8k-token
estimated body may carry 20k measured tokens), so a figure that leaked an estimate would show.
"""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis._ideal import ideal_read, rebuilt_tokens
from promptcache_nb.analysis.prices import price_model_id
from promptcache_nb.cache.anthropic import AnthropicCache, resolve_model
from promptcache_nb.request import prepare

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SYSTEM = "You are the support agent for a billing product. " * 180  # ~1.8k estimated tokens
SONNET = pc.analysis.prices_for("claude-sonnet-4-5")


def body(n_turns: int, *, system: str = SYSTEM, model: str = "claude-sonnet-4-5", auto: bool = True,
         system_marker: bool = False, first: str = "question 0") -> dict:
    msgs: list[dict] = []
    for i in range(n_turns):
        if i:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i - 1}"}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": first if i == 0 else f"question {i}"}]})
    sys_block: dict = {"type": "text", "text": system}
    if system_marker:
        sys_block["cache_control"] = {"type": "ephemeral"}
    out = {"model": model, "max_tokens": 256, "system": [sys_block], "messages": msgs}
    if auto:
        out["cache_control"] = {"type": "ephemeral"}
    return out


def usage(uncached: int, read: int, write: int, output: int = 10) -> dict:
    """An Anthropic ``usage`` object: prompt total = uncached + read + write."""
    return {"input_tokens": uncached, "cache_read_input_tokens": read, "cache_creation_input_tokens": write,
            "output_tokens": output}


@pytest.fixture
def lab(tmp_path):
    with pc.Lab(tmp_path / "x.duckdb", progress=False) as lab:
        yield lab


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- 1. measured-first rebuilds -----------------------------------------------------------------

def test_the_uncached_tail_of_every_request_is_never_a_rebuild(lab):
    s = lab.session(project="tail")
    s.record(body(1), at=at(0), usage=usage(3, 0, 20_000))
    s.record(body(2), at=at(30), usage=usage(3, 20_000, 1_500))   # the 3-token tail of #0 is not lost
    s.record(body(3), at=at(60), usage=usage(2, 21_503, 1_200))
    s.record(body(4), at=at(90), usage=usage(1, 22_600, 1_000))   # read 105 short of #2: under the floor
    assert pc.rebuilds(s).empty
    # the floor is a parameter: at 100 tokens the 105-token shortfall counts
    df = pc.rebuilds(s, noise_floor=100)
    assert list(df.idx) == [3] and df.lost_tokens[0] == 22_705 - 22_600 and bool(df.measured[0])


def test_a_ttl_expiry_with_its_gap(lab):
    s = lab.session(project="ttl")
    s.record(body(1), at=at(0), usage=usage(3, 0, 20_000))
    s.record(body(2), at=at(30), usage=usage(3, 20_000, 1_500))
    s.record(body(3), at=at(30 + 420), usage=usage(3, 0, 23_000))  # 7 minutes idle: past the 5m TTL
    df = pc.rebuilds(s)
    assert list(df.idx) == [2]
    row = df.iloc[0]
    assert (row.reason, row.cause) == ("ttl_expired", "TTL expiry: the 5m entry was idle 7m00s")
    # clamp(previous prompt total − read, 0, write): the 21,503 tokens #1 held, all written again
    assert (row.expected_read, row.read, row.lost_tokens) == (21_503, 0, 21_503)
    assert row.detail["gap_seconds"] == 420 and row.detail["ttl_seconds"] == 300
    assert "previous request held 21,503 prompt tokens; this one read 0 and wrote 23,000" in row.explanation


def test_a_1h_system_entry_survives_the_gap_only_the_5m_rest_expires(lab):
    s = lab.session(project="ttl-1h")
    b1, b2 = body(1, system_marker=True), body(2, system_marker=True)
    for b in (b1, b2):
        b["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    s.record(b1, at=at(0), usage=usage(3, 0, 20_000))
    s.record(b2, at=at(600), usage=usage(3, 18_000, 3_500))  # 10 minutes: the 1h system entry is read
    row = pc.rebuilds(s).iloc[0]
    assert row.reason == "ttl_expired" and row.cause == "TTL expiry: the 5m entry was idle 10m00s"
    assert row.lost_tokens == 20_003 - 18_000


def test_a_compaction(lab):
    s = lab.session(project="compaction")
    s.record(body(10), at=at(0), usage=usage(3, 0, 40_000))
    s.record(body(11), at=at(20), usage=usage(3, 40_000, 600))
    summary = body(1, first="Summary of the conversation so far: refunds, invoices, the ledger.")
    t = s.record(summary, at=at(40), usage=usage(3, 18_000, 2_000))  # the system prompt is still read
    df = pc.rebuilds(s)
    assert list(df.idx) == [t.index]
    row = df.iloc[0]
    assert row.reason == "compaction" and row.cause.startswith("compaction: the history was replaced")
    assert "21 -> 1 messages" in row.cause and row.lost_tokens == 2_000
    # a compaction the log declares is one too, whatever the body looks like
    s2 = lab.session(project="compaction-event")
    s2.record(body(3), at=at(0), usage=usage(3, 0, 30_000))
    s2.record(body(4, first="a summary"), at=at(20), usage=usage(3, 18_000, 12_000), events=["compaction"])
    assert list(pc.rebuilds(s2).reason) == ["compaction"]


def test_a_prefix_change_located_in_the_logged_body(lab):
    s = lab.session(project="prefix")
    s.record(body(3), at=at(0), usage=usage(3, 0, 30_000))
    edited = body(4, system=SYSTEM.replace("billing", "invoicing", 1))
    s.record(edited, at=at(30), usage=usage(3, 0, 31_500))
    row = pc.rebuilds(s).iloc[0]
    d = pc.diff(body(3), edited)
    assert row.reason == "prefix_changed" and row.changed_path == "system[0]"
    assert row.cause == f"prefix changed at system[0] (byte {d.byte_offset:,})"
    assert row.detail["byte"] == d.byte_offset and "invoicing" in row.detail["excerpt"]
    assert row.lost_tokens == 30_003


def test_a_pure_append_that_lost_its_cache_is_found_and_not_explained_away(lab):
    """The logged body only appended, the API read nothing, nothing timed out: a provider-side miss (the
    logged prefix was unchanged) — and the simulator, which expected a full read, says so."""
    s = lab.session(project="evicted")
    s.record(body(2), at=at(0), usage=usage(3, 0, 20_000))
    s.record(body(3), at=at(30), usage=usage(3, 20_000, 1_500))
    t = s.record(body(4), at=at(60), usage=usage(3, 0, 23_000))
    row = pc.rebuilds(s).iloc[0]
    predicted = t.cache_detail["predicted_usage"]["cache_read_input_tokens"]
    assert predicted == prepare(body(3)).total_tokens  # the simulator read all #1 wrote (estimated)
    assert row.reason == "provider_miss" == t.cache_reason and row.lost_tokens == 21_503
    assert row.cause.startswith("provider-side miss (the logged prefix was unchanged)")
    assert f"The simulator expected to read {predicted:,} tokens (its reason: hit); the API read 0." in row.explanation
    # the per-turn explanation puts the measurement first, then the same sentence as the rebuild row
    text = t.observation.explanation
    assert text.startswith("Cache break: read 0 cached tokens and sent again 21,503 the cache held for it.")
    assert row.explanation in text
    assert "The cache read everything the previous request left cached" not in text


def _partial(b: dict, unlogged: int):
    return prepare(b, unlogged_prefix_tokens=unlogged)


def test_a_prefix_change_outside_the_logged_content(lab):
    # (a) the unlogged prefix itself changed size between two partial bodies: the first divergence is it
    s = lab.session(project="partial-a")
    b1, b2 = body(2, system="Be brief."), body(3, system="Be brief.")
    s.record(b1, at=at(0), usage=usage(3, 0, 25_000), prepared=_partial(b1, 24_000))
    s.record(b2, at=at(30), usage=usage(3, 0, 26_500), prepared=_partial(b2, 25_000))
    row = pc.rebuilds(s).iloc[0]
    assert row.reason == "unlogged_prefix_changed" and row.changed_path == "(unlogged prefix)"
    assert "went from 24,000 to 25,000 measured tokens" in row.cause
    # (b) same unlogged size, the logged part only appended, but the measured total grew 1,500 tokens for an
    # append of a few: measured total − logged estimate moved, so the unlogged part changed (with evidence)
    s = lab.session(project="partial-b")
    s.record(b1, at=at(0), usage=usage(3, 0, 25_000), prepared=_partial(b1, 24_000))
    t = s.record(b2, at=at(30), usage=usage(3, 10_000, 16_500), prepared=_partial(b2, 24_000))
    row = pc.rebuilds(s).iloc[0]
    assert row.reason == "unlogged_prefix_changed" == t.cache_reason and row.changed_path is None
    assert row.cause.startswith("prefix changed outside the logged content: the measured prompt total minus the "
                                "logged content's estimate went from ")
    assert row.lost_tokens == 25_003 - 10_000 and row.explanation in t.observation.explanation
    # (c) the same read, but the measured total grew by what was appended: no evidence of a change outside the
    # log, so no such claim — a provider-side miss, saying the read stopped inside the unlogged prefix
    s = lab.session(project="partial-c")
    grown = 25_003 + (_partial(b2, 24_000).total_tokens - _partial(b1, 24_000).total_tokens)
    s.record(b1, at=at(0), usage=usage(3, 0, 25_000), prepared=_partial(b1, 24_000))
    t = s.record(b2, at=at(30), usage=usage(3, 10_000, grown - 10_003), prepared=_partial(b2, 24_000))
    row = pc.rebuilds(s).iloc[0]
    assert row.reason == "provider_miss" == t.cache_reason
    assert row.cause.startswith("provider-side miss (the logged prefix was unchanged): the API read 10,000 tokens, "
                                "less than the 24,000-token prefix the log does not hold")
    assert "prefix changed outside" not in t.observation.explanation


def test_a_model_switch(lab):
    s = lab.session(project="switch")
    s.record(body(2), at=at(0), usage=usage(3, 0, 20_000))
    t = s.record(body(3, model="claude-haiku-4-5"), at=at(30), usage=usage(3, 0, 21_500))
    row = pc.rebuilds(s).iloc[0]
    assert row.reason == "model_switch"
    assert row.cause == "model switch from claude-sonnet-4-5 to claude-haiku-4-5: caches are kept per model"
    assert t.ideal_cache_read == 0


def test_simulated_sessions_keep_their_rebuilds():
    """A simulated session has no measured rows: the cache model's reasons, as before."""
    with pc.Lab(progress=False) as lab:
        s = lab.session(project="sim")
        for k, gap in zip(range(1, 4), (0, 30, 400), strict=True):
            s.record(body(k), at=at(gap if k < 3 else 430))
        df = pc.rebuilds(s)
        assert list(df.reason) == ["ttl_expired"] and not df.measured.any()
        assert df.explanation[0] == df.cause[0]


# -- 2. efficiency <= 1 ------------------------------------------------------------------------

def _bounded(df) -> float:
    assert (df.cache_read_input_tokens <= df.ideal_cache_read).all()
    eff = df.cache_read_input_tokens.sum() / df.ideal_cache_read.sum()
    assert 0 <= eff <= 1
    return eff


def test_efficiency_is_at_most_one_on_measured_simulated_and_mixed_sessions(lab, scenarios_dir):
    measured = lab.session(project="eff-measured")
    measured.record(body(1), at=at(0), usage=usage(3, 0, 20_000))
    t1 = measured.record(body(2), at=at(30), usage=usage(3, 20_000, 1_500))
    measured.record(body(3), at=at(60), usage=usage(3, 0, 23_000))
    measured.record(body(4), at=at(90), usage=usage(3, 23_000, 1_500))
    # the ideal of a measured request is the previous request's measured total, capped at its own
    assert t1.ideal_cache_read == 20_003
    assert list(measured.turns().ideal_cache_read) == [0, 20_003, 21_503, 23_003]
    assert _bounded(measured.turns()) == pytest.approx(43_000 / 64_509)

    # a switch back to a model whose cache is still warm reads it: the ideal is what was read, not 0
    simulated = lab.replay(scenarios_dir / "mcp_reconnect.yaml", strategy="durable_delta")
    _bounded(simulated.turns())

    mixed = lab.session(project="eff-mixed")
    mixed.record(body(1), at=at(0))                                     # simulated
    mixed.record(body(2), at=at(20), usage=usage(3, 18_000, 1_500))     # measured after a simulated one
    mixed.record(body(3), at=at(40))                                    # simulated after a measured one
    _bounded(mixed.turns())
    assert all(0 <= e <= 1 for e in pc.compare_df([measured, simulated, mixed]).efficiency)


def test_the_one_ideal_rule():
    a, b = prepare(body(2)), prepare(body(3))
    assert ideal_read(None, a).rule == "first"
    assert ideal_read(a, b).tokens == a.total_tokens  # estimates when nothing is measured
    assert ideal_read(a, b, previous_total=50_000, current_total=40_000).tokens == 40_000  # capped
    assert ideal_read(a, b, previous_total=20_000, current_total=22_000, gap_seconds=400,
                      retention_points=[(a.total_tokens, 300.0)]).rule == "ttl"
    assert ideal_read(a, prepare(body(3, model="claude-haiku-4-5"))).tokens == 0
    assert ideal_read(a, prepare(body(3, model="claude-sonnet-4-5-20250929"))).tokens == a.total_tokens
    assert ideal_read(a, b, previous_total=500, minimum=1024).rule == "below_minimum"
    assert ideal_read(a, prepare(body(3, model="claude-haiku-4-5")), cache_read=700).tokens == 700  # floor
    assert rebuilt_tokens(21_503, 21_500, 1_500) == 3 and rebuilt_tokens(21_503, 0, 900) == 900


# -- 3. labels and explanations ----------------------------------------------------------------

def test_a_hit_at_an_early_breakpoint_is_a_hit(lab):
    """The most common layout: one marker, on the system prompt. Every later request reads it."""
    s = lab.session(project="early")
    s.record(body(1, auto=False, system_marker=True), at=at(0))
    t = s.record(body(2, auto=False, system_marker=True), at=at(30))
    system_tokens = prepare(body(1)).segments[0].tokens
    assert t.usage.cache_read_input_tokens == system_tokens
    assert t.cache_reason == "hit"
    assert "nothing to read" not in t.observation.explanation
    assert "The cache read everything the previous request left cached." in t.observation.explanation
    # measured, the same layout: the system prompt read, the uncached conversation never a rebuild
    m = lab.session(project="early-measured")
    m.record(body(1, auto=False, system_marker=True), at=at(0), usage=usage(1_200, 0, 18_000))
    t = m.record(body(2, auto=False, system_marker=True), at=at(30), usage=usage(1_300, 18_000, 0))
    assert t.cache_reason == "hit" and "nothing to read" not in t.observation.explanation
    assert ("The simulator predicted the same: no rebuild: this request read 18,000 of the 19,200 prompt tokens the "
            "previous request held" in t.observation.explanation)
    assert pc.rebuilds(m).empty


def test_a_switch_back_to_a_warm_model_says_what_it_read():
    with pc.Lab(progress=False) as lab:
        s = lab.session(project="back")
        s.record(body(1), at=at(0))
        s.record(body(2, model="claude-haiku-4-5"), at=at(20))
        t = s.record(body(3), at=at(40))
        read = t.usage.cache_read_input_tokens
        assert read > 0 and t.cache_reason == "model_switch"
        assert "nothing could be read" not in t.observation.explanation
        assert f"read the {read:,} tokens claude-sonnet-4-5's cache still held" in t.observation.explanation


# -- 4. prices per request, exact model ids -------------------------------------------------------

def test_model_ids_resolve_exactly_never_by_prefix():
    assert price_model_id("claude-sonnet-4-5-20250929") == ("anthropic", "claude-sonnet-4-5")
    assert price_model_id("claude-sonnet-4-5") == ("anthropic", "claude-sonnet-4-5")
    assert price_model_id("gpt-5-2025-08-07") == ("openai", "gpt-5")
    assert price_model_id("claude-opus-4-9") is None  # not claude-opus-4 (3x the price)
    assert price_model_id("claude-sonnet-4-5-preview-x") is None  # genai-prices would match it by prefix
    assert price_model_id("<synthetic>") is None
    with pytest.raises(pc.errors.PriceError, match="claude-opus-4-9"):
        pc.analysis.prices_for("claude-opus-4-9")
    assert resolve_model("claude-sonnet-4-5-20250929") == "claude-sonnet-4-5"
    assert resolve_model("claude-opus-4-0") == resolve_model("claude-opus-4-20250514") == "claude-opus-4"
    with pytest.raises(pc.errors.UnknownModelError):
        resolve_model("claude-opus-4-9")


def test_each_request_is_priced_by_its_own_model(lab):
    s = lab.session(project="own-model")  # the session's model is claude-sonnet-4-5
    u = pc.Usage(1_000, 10_000, 2_000, 2_000, 0, 500, "imported")
    t = s.record(body(1, model="claude-haiku-4-5"), at=at(0), usage=u)
    # Haiku 4.5: $1 input, $0.10 read, $1.25 5m write, $5 output per MTok
    assert t.cost_usd == pytest.approx((1_000 * 1 + 10_000 * 0.10 + 2_000 * 1.25 + 500 * 5) / 1e6)
    dated = s.record(body(2, model="claude-sonnet-4-5-20250929"), at=at(10), usage=u)
    assert dated.cost_usd == pytest.approx((1_000 * 3 + 10_000 * 0.30 + 2_000 * 3.75 + 500 * 15) / 1e6)


# documented per-MTok rates (docs/provider_cache_rules.md#openai-automatic-caching [O4], OpenAI pricing): input, cached input, output
OPENAI_RATES = {"gpt-5-mini": (0.25, 0.025, 2.0), "gpt-4.1": (2.0, 0.5, 8.0), "gpt-5.3-codex": (1.75, 0.175, 14.0)}


def chat(model: str, n: int) -> dict:
    msgs = [{"role": "system", "content": SYSTEM}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"question {i}"})
    return {"model": model, "messages": msgs, "prompt_cache_key": "billing"}


@pytest.mark.parametrize("model", sorted(OPENAI_RATES))
def test_openai_sessions_are_priced_by_their_own_ids(lab, model):
    s = lab.session(cache="openai", model=model, project=f"oa-{model}")
    rate_in, rate_cached, rate_out = OPENAI_RATES[model]
    raw = {"prompt_tokens": 12_000, "prompt_tokens_details": {"cached_tokens": 10_240},
           "completion_tokens": 900, "completion_tokens_details": {"reasoning_tokens": 600}}
    u = pc.Usage(12_000 - 10_240, 10_240, 0, 0, 0, 900, "imported", raw)
    t = s.record(chat(model, 2), at=at(0), usage=u)
    # reasoning tokens are part of the 900 output tokens: priced once, as output
    assert t.cost_usd == pytest.approx(((12_000 - 10_240) * rate_in + 10_240 * rate_cached + 900 * rate_out) / 1e6)
    assert t.cost_no_cache_usd == pytest.approx((12_000 * rate_in + 900 * rate_out) / 1e6)


def test_an_openai_cache_write_is_priced_at_the_models_write_rate(lab):
    s = lab.session(cache="openai", model="gpt-5.6", project="gpt-5.6")
    t = s.record(chat("gpt-5.6", 1), at=at(0), usage=pc.Usage(100, 0, 10_000, 10_000, 0, 0, "imported"))
    assert t.cost_usd == pytest.approx((100 * 4.0 + 10_000 * 5.0) / 1e6)  # writes at 1.25x the $4 input


def test_an_unknown_model_mid_session_never_breaks_it(tmp_path):
    path = tmp_path / "x.duckdb"
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(project="unknown")
        s.record(body(1), at=at(0), usage=usage(3, 0, 20_000))
        with pytest.warns(pc.errors.UnpricedModelWarning, match="<synthetic>") as caught:
            syn = s.record(body(2, model="<synthetic>"), at=at(10), usage=usage(0, 0, 0, 0))
            opus = s.record(body(2, model="claude-opus-4-9"), at=at(20), usage=usage(3, 0, 21_000))
        assert len([w for w in caught if issubclass(w.category, pc.errors.UnpricedModelWarning)]) == 1  # once per session
        assert syn.cost_usd is None and opus.cost_usd is None  # never claude-opus-4's price
        assert syn.cache_reason is None  # no prompt reached the API, and the simulator cannot predict it
        assert opus.cache_reason == "model_switch"  # measured: the one cause, found without the simulator
        after = s.record(body(3), at=at(30), usage=usage(3, 20_000, 1_500))  # no UnknownModelError
        assert after.cost_usd == pytest.approx(SONNET.cost(after.usage, at(30)))
        df = pc.ttl_whatif(s)
        assert set(df[df.idx == 1].cache_reason) == {"unsupported"}  # <synthetic>: no model to simulate
        # claude-opus-4-9 is simulated with its family's nearest documented rule (cache.anthropic.model_rule), but
        # its cost stays unknown: genai-prices has no exact price for it
        opus_rows = df[df.idx == 2]
        assert "unsupported" not in set(opus_rows.cache_reason) and opus_rows.cost_usd.isna().all()
        assert pc.keep_warm(s, every="4m")["pings"] == 0
        pc.rebuilds(s)
        sid = s.id
    with pc.Lab(path, progress=False) as lab:  # resume: the simulated cache is rebuilt, skipping them
        s = lab.session(id=sid)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            t = s.record(body(4), at=at(40), usage=usage(3, 21_500, 1_500))
        assert t.cache_reason == "hit" and t.cost_usd is not None
        assert t.ideal_cache_read == 21_503  # the previous request's measured total, read back from the store


def test_calibrate_finds_dated_ids(lab):
    s = lab.session(project="cal")
    for i in range(4):
        b = body(i + 1, model="claude-sonnet-4-5-20250929")
        s.record(b, at=at(60 * i), usage=usage(1_000 * (i + 1) + 7, 0, 0))
    cal = pc.calibrate(lab, model="claude-sonnet-4-5")
    assert cal.n == 4 and cal.model == "claude-sonnet-4-5"
    assert pc.calibrate(lab, model="claude-sonnet-4-5-20250929").n == 4


# -- 5. cache realism ----------------------------------------------------------------------------

def _two_breakpoints(n: int, first: str = "question 0") -> dict:
    return body(n, system_marker=True, first=first)


def test_a_read_refreshes_every_entry_along_its_prefix():
    """Rules §1.6: cached content is refreshed each time it is used — reading the conversation uses the
    system prompt before it. The system entry, written once at t=0 and never read on its own, is still
    there 11 minutes later because the conversation after it was read every two minutes."""
    system_tokens = prepare(body(1)).segments[0].tokens
    outcomes = {}
    for along in (True, False):
        cache = AnthropicCache(refresh_along_prefix=along)
        for k in range(6):  # t = 0, 2, 4, 6, 8, 10 minutes: each request reads the previous one's entry
            r = cache.process(prepare(_two_breakpoints(k + 1)), at(120 * k))
            assert k == 0 or r.usage.cache_read_input_tokens > system_tokens
        # at 11 minutes the first message changes: only the system prompt's entry can still be read
        outcomes[along] = cache.process(prepare(_two_breakpoints(7, first="edited")), at(660))
    assert outcomes[True].usage.cache_read_input_tokens == system_tokens
    assert outcomes[True].reason == "prefix_changed"
    assert outcomes[False].usage.cache_read_input_tokens == 0  # last written at t=0: expired at 5 minutes
    assert outcomes[False].reason == "ttl_expired"


def test_openai_extended_retention_from_the_request():
    def req(retention: str | None) -> object:
        b = chat("gpt-5.2", 3)
        if retention:
            b["prompt_cache_retention"] = retention
        return prepare(b)

    for retention, expected in ((None, "ttl_expired"), ("in_memory", "ttl_expired"), ("24h", "hit")):
        cache = pc.OpenAICache()
        cache.process(req(retention), at(0))
        r = cache.process(req(retention), at(1_800))  # 30 minutes idle
        assert r.reason == expected, retention
        assert cache.default_ttl_seconds(req(retention)) == (86_400 if retention == "24h" else 300)
    # a session-wide 24h default, and a request that asks for in_memory
    cache = pc.OpenAICache(retention="24h")
    cache.process(req("in_memory"), at(0))
    assert cache.process(req(None), at(1_800)).reason == "ttl_expired"
