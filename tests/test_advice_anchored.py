"""Advice you can bet on (issue 36): counterfactuals anchored on measured usage, intervals, verdicts that respect
them, and every ttl / keep_warm finding recomputed by hand arithmetic from the measured timestamps and usage."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _benchmarks
import pytest
from test_advice import write_proxy_log

import promptcache_nb as pc
from promptcache_nb.advice._counterfactual import Original

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"
GAPS_LOG = Path(__file__).parent / "fixtures" / "logs" / "claude_code_gaps"
LIFE = {"5m": 300.0, "1h": 3600.0}


def _n(x: Any) -> int:
    return 0 if x is None or x != x else int(x)


def hand_ttl(orig: Original, new: tuple[str, str]) -> float:
    """What switching a partial log's (prefix, conversation) breakpoints to ``new`` TTLs saves, by arithmetic on
    the measured usage and timestamps alone: every write re-priced at its part's new TTL (a rewrite the provider
    made recurs), a read whose part would have expired in the gap re-written, a rebuild the new TTL would have
    survived read instead. No cache model is involved."""
    old = tuple(orig.cache_params.get("client_ttls") or ("5m", "5m"))
    first = orig.fits()[0]
    prefix = round((orig.partial or 0) * first.scale)
    saved = 0.0
    prev_total: int | None = None
    prev_at = None
    for t in orig.turns:
        s = t.stored
        p = orig.prices(t.model)
        assert p is not None
        rd, w5, w1 = p.cache_read, p.cache_write_5m, p.cache_write_1h
        mult = {"5m": w5, "1h": w1}
        read, write = _n(s["cache_read_input_tokens"]), _n(s["cache_creation_input_tokens"])
        write_1h = _n(s["cache_creation_1h_input_tokens"])
        total = read + write + _n(s["input_tokens"])
        gap = None if prev_at is None else (t.at - prev_at).total_seconds()
        prefix_w = max(0, min(read + write, prefix) - read)  # the written span runs from the read onwards
        conv_w = write - prefix_w
        delta = (prefix_w * mult[new[0]] + conv_w * mult[new[1]]) - ((write - write_1h) * w5 + write_1h * w1)
        if gap is not None:
            prefix_r, conv_r = min(read, prefix), max(0, read - prefix)
            for part_read, ttl, was in ((prefix_r, new[0], old[0]), (conv_r, new[1], old[1])):
                if part_read and LIFE[ttl] < gap <= LIFE[was]:
                    delta += part_read * (mult[ttl] - rd)  # alive as sent, expired under the new TTL
            tail = max(0, total - (prev_total or 0))
            rebuilt = {0: prefix_w, 1: max(0, conv_w - tail)}
            for k in (0, 1):
                if rebuilt[k] and LIFE[old[k]] < gap <= LIFE[new[k]]:
                    delta -= rebuilt[k] * (mult[new[k]] - rd)  # expired as sent, alive under the new TTL
        saved -= delta / 1e6
        prev_total, prev_at = total, t.at
    return saved


def hand_keep_warm(orig: Original, finding: Any) -> float:
    """What the pings of a keep_warm finding save, by arithmetic on the measured usage: each kept gap's rebuilt
    tokens read instead of written, minus the pings (each reads the previous request's measured prompt)."""
    saved = 0.0
    turns = orig.turns
    for k in finding.requests:
        i = next(j for j, t in enumerate(turns) if t.idx == k)
        s, prev = turns[i].stored, turns[i - 1].stored
        p = orig.prices(turns[i].model)
        assert p is not None
        prev_total = sum(_n(prev[c]) for c in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
        write = _n(s["cache_creation_input_tokens"])
        total = write + _n(s["cache_read_input_tokens"]) + _n(s["input_tokens"])
        rebuilt = max(0, write - max(0, total - prev_total))
        share_1h = _n(s["cache_creation_1h_input_tokens"]) / write if write else 0.0
        w = p.cache_write_5m * (1 - share_1h) + p.cache_write_1h * share_1h
        gap = (turns[i].at - turns[i - 1].at).total_seconds()
        pings = int((gap - 1) // (LIFE["5m"] - 60))
        saved += (rebuilt * (w - p.cache_read) - pings * prev_total * p.cache_read) / 1e6
    return saved


def _check_timing_findings(lab: pc.Lab) -> int:
    """Every ttl and keep_warm finding of ``lab``'s partial-log sessions against the hand arithmetic: the same
    sign, and the hand figure inside the finding's interval. Returns how many were checked."""
    checked = 0
    for sid in lab.sessions().id:
        s = lab.session(id=sid)
        orig = Original.load(s)
        if orig.partial is None or not orig.measured:
            continue
        advice = pc.advise(s, fixes=("ttl", "keep_warm"))
        for f in advice.findings.itertuples(index=False):
            if f.fix == "ttl":
                plan = orig.plan(("ttl",))
                hand = hand_ttl(orig, tuple(plan.cache_params["client_ttls"]))
            elif f.fix == "keep_warm" and f.requests:
                hand = hand_keep_warm(orig, f)
            else:
                continue
            tol = 2e-4 + 0.02 * abs(hand)
            assert f.usd_saved_low - tol <= hand <= f.usd_saved_high + tol, (sid, f.fix, hand, f.saved)
            if abs(hand) > 1e-3 and f.verdict in ("saves", "costs more"):
                assert (hand > 0) == (f.usd_saved > 0), (sid, f.fix, hand, f.saved)
            assert f.usd_saved_high <= sum(
                float(orig.turns[i].stored["cost_usd"]) for i, t in enumerate(orig.turns) if t.idx in f.cost_changed
            ) + 1e-9  # no finding claims more than the measured cost of what it changes
            checked += 1
    return checked


def test_timing_findings_on_the_shipped_logs_match_hand_arithmetic() -> None:
    with pc.Lab(progress=False) as lab:
        lab.import_log(pc.data_path("logs") / "claude_code")
        lab.import_log(GAPS_LOG)
        assert _check_timing_findings(lab) >= 4




@pytest.mark.slow
@pytest.mark.skipif(not (REALDATA / "claude-code-spotter").is_dir(), reason="../shared/realdata is not on this machine")
def test_timing_findings_on_real_claude_code_logs_match_hand_arithmetic() -> None:
    with pc.Lab(progress=False) as lab:
        lab.import_log(_benchmarks.load("advice_fidelity").plain(REALDATA / "claude-code-spotter"), progress=False)
        assert _check_timing_findings(lab) >= 4


# -- a provider-side rewrite the simulator cannot see -------------------------------------------
def _session_with_rewrites(lab: pc.Lab, tmp_path: Path, rewrites: set[int]) -> pc.Session:
    """A 12-request conversation at 2-minute gaps (one 20-minute gap before request 6), logged with the usage the
    simulator predicted, except that the provider rewrote the whole prefix at ``rewrites`` (read 0)."""
    s = lab.session(strategy="naive", project=f"rw{len(rewrites)}")
    t0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    msgs: list[dict] = []
    at = t0
    for k in range(12):
        at += timedelta(minutes=20 if k == 6 else 2)
        newest = {"role": "user", "content": [{"type": "text", "text": f"step {k}: " + "check the logs " * 40,
                                               "cache_control": {"type": "ephemeral"}}]}
        s.record({"model": "claude-sonnet-4-5", "max_tokens": 256, "system": [
            {"type": "text", "text": "You are a careful SRE assistant. " * 300, "cache_control": {"type": "ephemeral"}}],
            "messages": [*msgs, newest]}, at=at, output_tokens=120)
        msgs = [*msgs, {"role": "user", "content": [{"type": "text", "text": newest["content"][0]["text"]}]}]
        msgs = [*msgs, {"role": "assistant", "content": f"done {k}"}]
    log = write_proxy_log(s, tmp_path / f"rw{len(rewrites)}.jsonl")
    import json
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    for k in rewrites:
        u = lines[k]["usage"]
        u["cache_creation_input_tokens"] += u["cache_read_input_tokens"]
        u["cache_creation"]["ephemeral_5m_input_tokens"] += u["cache_read_input_tokens"]
        u["cache_read_input_tokens"] = 0
        lines[k]["response"]["usage"] = u
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (imported,) = lab.import_log(log).sessions
    return imported


def test_short_gap_rewrites_recur_under_a_1h_ttl_and_keep_their_measured_cost(tmp_path) -> None:
    with pc.Lab(progress=False) as lab:
        clean = _session_with_rewrites(lab, tmp_path, set())
        broken = _session_with_rewrites(lab, tmp_path, {2, 3, 4, 8, 9, 10})
        fid = pc.fidelity(broken).iloc[0]
        assert fid.provider_miss == 6 and fid.agreement == pytest.approx(6 / 12)
        assert pc.fidelity(clean).iloc[0].agreement == 1.0
        # under a TTL fix the provider's rewrites recur: same outcome as measured, their writes re-priced at the
        # fix's TTL (1h on the system prompt costs 2x base, not 1.25x), never cheaper than measured
        plan = Original.load(broken).plan(("ttl",))
        cf = pc.counterfactual(broken, fixes=["ttl"])
        got, measured = cf.turns(), broken.turns()
        hour = plan.applied["ttl"].detail["through"] is not None
        for k in (2, 3, 4, 8, 9, 10):
            assert got.cache_read_input_tokens[k] == measured.cache_read_input_tokens[k] == 0
            assert got.cache_creation_input_tokens[k] == measured.cache_creation_input_tokens[k]
            assert got.cost_usd[k] >= measured.cost_usd[k] - 1e-12
            assert (got.cache_creation_1h_input_tokens[k] > 0) == hour
        advice = pc.advise(broken)
        assert advice.provider_misses is not None and list(advice.provider_misses.requests.iloc[0]) == [2, 3, 4, 8, 9,
                                                                                                         10]
        assert advice.provider_misses.lost_usd.iloc[0] > 0


# -- measured stays measured -------------------------------------------------------------------
def test_the_headline_is_a_share_of_the_measured_cost(tmp_path) -> None:
    with pc.Lab(progress=False) as lab:
        s = _session_with_rewrites(lab, tmp_path, {3})
        measured = float(s.turns().cost_usd.sum())
        advice = pc.advise(s)
        f = advice.findings
        assert (f.cost_basis == "measured").all() and f.cost_basis_usd.iloc[0] == pytest.approx(measured)
        assert f.pct_of_cost.iloc[0] == pytest.approx(f.usd_saved.iloc[0] / measured)
        # one computation: no fix stores the measured original; apply stores the finding's own figure
        same = pc.counterfactual(s, fixes=[])
        assert same.turns().cost_usd.sum() == pytest.approx(measured, rel=1e-9)
        assert list(same.turns().cache_read_input_tokens) == list(s.turns().cache_read_input_tokens)
        for row in f.itertuples(index=False):
            if row.fix != "all":
                cf = advice.apply(row.fix)
                assert cf.turns().cost_usd.sum() == pytest.approx(row.cost_counterfactual_usd, rel=1e-6)
            assert row.usd_saved_low <= row.usd_saved <= row.usd_saved_high
            assert (row.verdict == "saves") == (row.usd_saved_low > 5e-5)
            assert row.saved.startswith("$") or row.saved.startswith("-$")


def test_a_labs_headline_counts_each_sessions_best_fix_once(tmp_path) -> None:
    with pc.Lab(progress=False) as lab:
        for k in range(2):
            lab.replay("data/scenarios/support_agent.yaml", strategy="clock_in_system", project=f"p{k}")
        advice = pc.advise(lab)
        best = advice.best()
        assert len(best) == 2 and set(best.verdict) == {"saves"}
        per_session = advice.findings[advice.findings.verdict == "saves"].groupby("session").usd_saved.max()
        assert best.usd_saved.sum() == pytest.approx(per_session.sum())
        total = advice.findings[advice.findings.verdict == "saves"].usd_saved.sum()
        assert best.usd_saved.sum() < total  # alternatives are not added up
        assert f"${best.usd_saved.sum():,.2f}" in advice.summary()


def test_a_compaction_call_without_its_history_claims_no_saving() -> None:
    with pc.Lab(progress=False) as lab:
        lab.import_log(pc.data_path("logs") / "claude_code")
        kinds = {r["id"]: r["config"].get("session_kind") for r in lab.store.session_rows()}
        compactions = [sid for sid, k in kinds.items() if k == "compaction"]
        if not compactions:
            pytest.skip("the shipped Claude Code log holds no compaction call")
        for sid in compactions:
            advice = pc.advise(lab.session(id=sid))
            assert (advice.findings.usd_saved < 5e-5).all(), advice.findings[["fix", "saved"]]
            assert pc.fidelity(lab.session(id=sid)).iloc[0].history_missing >= 1


# -- stagger: same-prefix requests sent before the first had written --------------------------
def test_stagger_lets_a_sub_agent_read_what_its_sibling_was_still_writing() -> None:
    """Two sub-agents of one project start 0.2 s apart with the same 6k-token system prompt: the second is sent
    before the first's entry is readable (the cache model's ttft_seconds) and writes it again. Staggered by 2 s it
    reads it; the finding says which request moved and what it saves."""
    t0 = datetime(2026, 4, 1, 10, 0, tzinfo=UTC)
    system = [{"type": "text", "text": "You review pull requests for a payments service. " * 500,
               "cache_control": {"type": "ephemeral"}}]
    with pc.Lab(progress=False) as lab:
        sessions = []
        for k, delay in enumerate((0.0, 0.2)):
            s = lab.session(strategy="naive", project="agents", cache_scope="project")
            s.record({"model": "claude-sonnet-4-5", "max_tokens": 512, "system": system,
                      "messages": [{"role": "user", "content": f"review file {k}"}]},
                     at=t0 + timedelta(seconds=delay), output_tokens=200)
            sessions.append(s)
        late = sessions[1]
        assert late.turns().cache_read_input_tokens.iloc[0] == 0  # raced its sibling: wrote the prefix again
        advice = pc.advise(late, fixes=("stagger",))
        row = advice.findings.set_index("fix").loc["stagger"]
        assert row.verdict == "saves" and row.requests == [0] and row.usd_saved > 0
        assert "within 2 s" in row.evidence
        cf = advice.apply("stagger")
        assert cf.turns().cache_read_input_tokens.iloc[0] > 5000
        assert cf.turns()["sent_at"].iloc[0] == t0 + timedelta(seconds=2)
        # the first sub-agent raced nobody: nothing to stagger
        first = pc.advise(sessions[0], fixes=("stagger",)).findings.set_index("fix").loc["stagger"]
        assert first.verdict == "saves nothing" and first.requests == []
        # a cache model that does not model when entries become readable has nothing to stagger against
        other = pc.counterfactual(late, fixes=["stagger"], cache="openai")
        assert "nothing to stagger against" in other.config["fixes_not_possible"]["stagger"]


def test_a_write_logged_without_its_ttl_split_is_anchored_as_a_5m_write(tmp_path) -> None:
    """A log whose usage has no ``cache_creation`` object (Bedrock, older API versions) still anchors every write:
    a fix's counterfactual on a log of our own cache model equals that model's replay of the fix."""
    import json

    with pc.Lab(progress=False) as lab:
        s = lab.replay("data/scenarios/support_agent.yaml", strategy="clock_in_system")
        log = write_proxy_log(s, tmp_path / "nosplit.jsonl")
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        for x in lines:
            for u in (x["usage"], x["response"]["usage"]):
                u.pop("cache_creation", None)
        log.write_text("".join(json.dumps(x) + "\n" for x in lines))
        (imported,) = lab.import_log(log).sessions
        assert imported.turns().cache_creation_5m_input_tokens.isna().all()
        orig = Original.load(imported)
        plan = orig.plan(("tail_volatile",))
        rep = orig.anchored(plan)
        simulated = float(orig.simulate(plan).cost_usd.sum())
        assert rep.cost == pytest.approx(simulated, rel=1e-6)
        assert pc.counterfactual(imported, fixes=[]).turns().cost_usd.sum() == pytest.approx(
            imported.turns().cost_usd.sum(), rel=1e-9)


# -- OpenAI: what the documented retention leaves open, and the scale of a measured prompt ------------------------
_RULES = " ".join(f"Refund rule {k}: a duplicate charge on invoice series {k} is refunded within {k % 9 + 2} "
                  "business days, to the original card, with the ledger entry referencing the charge id." for k in
                  range(60))


def _openai_log(path: Path, gaps: list[float], kept: dict[int, bool], *, scale: float) -> Path:
    """A recording-proxy log of a Chat Completions conversation on gpt-5: a long system prompt, one question and
    answer more each request, sent ``gaps`` seconds apart. The measured prompt is ``scale`` times our estimate's
    size (another tokenizer); each request reads the previous prompt (128-token steps), except after a gap
    ``kept`` says the provider did not keep (then nothing)."""
    t0 = datetime(2026, 11, 3, 14, 0, tzinfo=UTC)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _RULES}]
    lines, at, prev = [], t0, 0
    for i, gap in enumerate([0.0, *gaps]):
        at = at + timedelta(seconds=gap)
        messages = [*messages, {"role": "user", "content": f"Why was invoice {i} charged twice? " * 8}]
        prompt = round(scale * (len(_RULES) + 300 * (i + 1)) / 4)
        cached = 0 if i == 0 or not kept.get(i, True) else 1024 + (prev - 1024) // 128 * 128
        usage = {"prompt_tokens": prompt, "completion_tokens": 1800, "total_tokens": prompt + 1800,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        body = {"model": "gpt-5", "messages": messages}
        lines.append({"v": 1, "at": at.isoformat().replace("+00:00", "Z"), "method": "POST",
                      "url": "https://api.openai.com/v1/chat/completions", "path": "/v1/chat/completions",
                      "status": 200, "request": body,
                      "response": {"id": f"chatcmpl-{i}", "object": "chat.completion", "model": "gpt-5",
                                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "A retry."},
                                                "finish_reason": "stop"}], "usage": usage},
                      "usage": usage, "request_id": f"req_{i:04d}", "latency_ms": 900, "provider": "openai"})
        messages = [*messages, {"role": "assistant", "content": "A retry."}]
        prev = prompt
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def test_openai_outcomes_the_documented_retention_leaves_open_follow_the_measured_read(tmp_path) -> None:
    """OpenAI keeps an idle in-memory prefix between 5 minutes and an hour: a read after a 20-minute gap and a
    rebuild after a 25-minute one are both what the documented rule allows, so both are reproduced (and say so);
    after 70 minutes a read is a disagreement (``ttl``)."""
    gaps = [30, 30, 1200, 30, 1500, 30, 4200, 30]
    log = _openai_log(tmp_path / "oa.jsonl", gaps, {3: True, 5: False, 7: True}, scale=1.0)
    with pc.Lab(progress=False) as lab:
        (s,) = lab.import_log(log).sessions
        per = pc.fidelity(s, per_request=True).set_index("idx")
        row = pc.fidelity(s).iloc[0]
    assert per.retention_kept[3] is True and per.reproduced[3]  # read after 20 idle minutes: the provider kept it
    assert per.retention_kept[5] is False and per.reproduced[5]  # rebuilt after 25 minutes: it did not
    assert per.retention_kept.isna()[7] and (per.cause[7], per.reproduced[7]) == ("ttl", False)  # 70 min: outside
    assert row.retention_open == 2 and row.ttl == 1


def test_the_scaled_replay_scales_the_prompt_not_the_output(tmp_path) -> None:
    """A measured prompt 4x our estimate (another tokenizer) scales the replay's prompt tokens, never its output
    tokens, which are the measured ones already: the scaled cost lands on the measured one."""
    log = _openai_log(tmp_path / "oa.jsonl", [30] * 6, {}, scale=4.0)
    with pc.Lab(progress=False) as lab:
        (s,) = lab.import_log(log).sessions
        row = pc.fidelity(s).iloc[0]
    assert row.median_scale > 3
    assert abs(row.cost_error) < 0.05, row.cost_error


def test_an_open_retention_outcome_without_a_measurement_widens_the_high_end() -> None:
    """A simulated session replayed under OpenAI's cache, the clock moved out of its system prompt: after a 20- and a
    25-minute gap the replay assumes the prefix expired (no saving there), but OpenAI may have kept it, and then the
    fix reads more. Nothing measured says which: the saving and its low end are the assumed expiry's, the high end
    carries the kept outcome (and a range collapsed to 5 minutes carries nothing)."""
    t0 = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
    rules = "Refund rule: a duplicate charge is refunded within five business days to the original card. " * 60
    with pc.Lab(progress=False) as lab:
        s = lab.session("clock_in_system", "anthropic", "claude-sonnet-4-5", system=rules)
        at = t0
        for i, gap in enumerate([0, 70, 70, 70, 1200, 70, 70, 1500, 70]):
            at = at + timedelta(seconds=gap)
            s.step(f"Why was invoice {i} charged twice?", reply="A retried webhook.", at=at)
        reps = {}
        for open_until in ("1h", "5m"):
            orig = Original.load(s, cache="openai")
            orig.cache_params = {"idle_ttl_max": open_until}
            reps[open_until] = orig.anchored(orig.plan(("tail_volatile",)))
    wide, point = reps["1h"], reps["5m"]
    assert wide.saved == pytest.approx(point.saved) and wide.low == pytest.approx(point.low) and wide.saved > 0
    assert wide.high > point.high + 0.5 * wide.saved
