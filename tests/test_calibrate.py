"""Calibrating the token estimator against measured usage, with a known ground truth."""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.calibrate import Calibration, calibrate_families
from promptcache_nb.request import SegmentMemo, prepare
from promptcache_nb.tokens import CalibratedTokenizer, HeuristicTokenizer

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
WORDS = "invoice ledger refund webhook currency audit schema latency".split()


def body(i: int, model: str = "claude-sonnet-4-5") -> dict:
    text = " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(40 + 37 * i))
    return {"model": model, "max_tokens": 64, "system": [{"type": "text", "text": "Be exact."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}


def record_measured(lab: pc.Lab, truth, n: int = 12, model: str = "claude-sonnet-4-5"):
    """Record n bodies whose imported usage is ``truth(estimate)`` (all of it uncached input)."""
    s = lab.session(project=f"cal-{model}-{len(lab.sessions())}", model=model)
    memo = SegmentMemo(lab.tokenizer)
    pairs = []
    for i in range(n):
        b = body(i, model)
        est = prepare(b, memo=memo).total_tokens
        measured = truth(est)
        s.record(b, at=T0 + timedelta(minutes=i), usage={
            "input_tokens": measured, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
            "output_tokens": 7})
        pairs.append((est, measured))
    return s, pairs


@pytest.fixture
def lab():
    with pc.Lab(progress=False) as lab:
        yield lab


def test_recovers_a_known_ratio_and_overhead(lab):
    s, pairs = record_measured(lab, lambda est: round(1.2 * est + 50))
    cal = pc.calibrate(lab, model="claude-sonnet-4-5")
    assert cal.model == "claude-sonnet-4-5" and cal.n == 12
    assert cal.ratio == pytest.approx(1.2, abs=1e-3)
    assert cal.overhead == pytest.approx(50, abs=1.0)
    assert cal.max_abs_error_pct < 0.5  # only the ±0.5-token rounding of the truth is left
    assert cal.raw_mean_abs_error_pct > 15  # the uncalibrated estimate was ~20 % low
    assert cal.tokenizer == lab.tokenizer.for_model("claude-sonnet-4-5").name == "heuristic-v1"  # the model's estimator
    est, measured = pairs[5]
    assert abs(cal.apply(est) - measured) <= 1
    # measured figures are never adjusted
    assert list(s.turns().input_tokens) == [m for _, m in pairs]
    assert set(s.turns().usage_source) == {"imported"}


def test_reports_the_error_honestly_on_noisy_data(lab):
    rng = random.Random(3)
    record_measured(lab, lambda est: round((1.1 * est + 30) * rng.uniform(0.9, 1.1)), n=30)
    cal = pc.calibrate(lab)
    assert cal.model == "*"
    assert 1.0 < cal.ratio < 1.2
    assert 1.0 < cal.mean_abs_error_pct < 10
    assert cal.max_abs_error_pct >= cal.mean_abs_error_pct
    assert cal.loo_mean_abs_error_pct >= cal.mean_abs_error_pct  # out of sample is never better here
    assert "leave-one-out" in repr(cal)


def test_only_measured_turns_of_the_model_count(lab):
    record_measured(lab, lambda est: 2 * est, n=4, model="claude-haiku-4-5")
    sim = lab.session(project="simulated")
    for i in range(3):
        sim.record(body(i), at=T0 + timedelta(minutes=i))  # simulated: not a measurement
    with pytest.raises(pc.PromptCacheError, match="claude-haiku-4-5"):
        pc.calibrate(lab, model="claude-sonnet-4-5")
    assert pc.calibrate(lab, model="claude-haiku-4-5").ratio == pytest.approx(2.0)


def test_needs_different_sizes(lab):
    s = lab.session(project="same")
    for i in range(3):
        s.record(body(1), at=T0 + timedelta(minutes=i), usage={
            "input_tokens": 500, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0})
    with pytest.raises(pc.PromptCacheError, match="same estimated size"):
        pc.calibrate(lab)


def test_save_and_load_through_the_m002_migration(tmp_path):
    path = tmp_path / "cal.duckdb"
    with pc.Lab(path, progress=False) as lab:
        assert "m002_calibrations" in lab.store.migrations()
        record_measured(lab, lambda est: round(1.3 * est + 12), n=24)
        cal = pc.calibrate(lab, model="claude-sonnet-4-5")
        cal.save(lab)
        with pytest.raises(pc.PromptCacheError, match="pc.calibrate"):
            pc.analysis.load_calibration(lab, "claude-haiku-4-5")
    with pc.Lab(path, progress=False) as lab:  # reopening migrates nothing twice
        assert lab.store.migrations_applied_now == []
        back = pc.analysis.load_calibration(lab, "claude-sonnet-4-5")
    assert isinstance(back, Calibration)
    assert (back.ratio, back.overhead, back.n) == (cal.ratio, cal.overhead, cal.n)
    assert back.loo_mean_abs_error_pct == pytest.approx(cal.loo_mean_abs_error_pct)
    assert back.fitted_at == cal.fitted_at


def test_calibrated_tokenizer_scales_texts_not_requests():
    cal = Calibration("claude-sonnet-4-5", ratio=1.25, overhead=40, n=10, mean_abs_error_pct=1.0,
                      max_abs_error_pct=2.0)
    base = HeuristicTokenizer()
    tok = CalibratedTokenizer(base, cal)
    assert isinstance(tok, pc.tokens.Tokenizer)
    text = "The ledger reconciles every refund against the original invoice."
    assert tok.count(text) == round(base.count(text) * 1.25)
    assert tok.count("") == 0
    assert cal.apply(1000) == 1290
    assert cal.tokenizer_for(base).name == tok.name
    with pc.Lab(tokenizer=tok, progress=False) as lab:
        s = lab.session(project="scaled", system="You are terse. " * 400)
        plain = prepare(body(0))  # the default estimator
        t = s.record(body(0), at=T0)
        assert t.total_tokens > plain.total_tokens  # segment counts scale with the ratio


def test_session_opts_in_to_a_stored_calibration(tmp_path):
    from datetime import UTC, datetime

    import promptcache_nb as pc

    at = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    db = tmp_path / "cal.duckdb"
    with pc.Lab(db, progress=False) as lab:
        plain = lab.session(system="You answer billing questions. " * 80, project="a")
        base = plain.step("how do refunds work?", reply="within 30 days", at=at).total_tokens
        pc.analysis.Calibration(model="claude-sonnet-4-5", ratio=1.25, overhead=40.0, n=10, mean_abs_error_pct=1.0,
                       max_abs_error_pct=2.0, tokenizer=lab.tokenizer.name).save(lab, force=True)
        cal_s = lab.session(system="You answer billing questions. " * 80, project="b", calibration="stored")
        calibrated = cal_s.step("how do refunds work?", reply="within 30 days", at=at).total_tokens
        assert 1.15 * base < calibrated < 1.35 * base
        sid = cal_s.id
    with pc.Lab(db, progress=False) as lab:  # the choice is stored with the session
        again = lab.session(id=sid)
        assert again.step("and chargebacks?", reply="see policy", at=at.replace(minute=1)).total_tokens > base


# -- refusing degenerate fits (issue #36 item 9) ------------------------------------------------------------

def record_sizes(lab: pc.Lab, indices, truth, *, project: str):
    """Record ``body(i)`` for each of ``indices`` (repeats allowed: a retried request) with measured usage
    ``truth(estimate)``."""
    s = lab.session(project=project)
    for k, i in enumerate(indices):
        b = body(i)
        s.record(b, at=T0 + timedelta(minutes=k), usage={
            "input_tokens": truth(prepare(b).total_tokens), "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0, "output_tokens": 7})
    return s


@pytest.mark.parametrize(("indices", "truth", "reason"), [
    (range(6), lambda e: round(1.2 * e + 50), "6 requests: too few"),
    # 24 requests of 2 sizes: leaving one out leaves its twins in, which predict it exactly
    ([26, 29] * 12, lambda e: round(1.2 * e + 50), "fewer than 3 distinct request sizes"),
    (range(24), lambda e: round(3 * e + 10), "ratio 3 is outside 0.5-2.0"),
    (range(4, 28), lambda e: round(1.2 * e - 200), "overhead -200 tokens is negative"),
], ids=["too-few", "two-sizes", "ratio", "negative-overhead"])
def test_each_kind_of_degenerate_fit_is_refused_and_not_saved(lab, indices, truth, reason):
    record_sizes(lab, indices, truth, project="degenerate")
    cal = pc.calibrate(lab, family="claude-v3")  # an explicit fit is still returned: the user sees it
    assert cal.refusal is not None and cal.refusal.startswith(reason)
    fit = pc.analysis.fit_family(lab, "claude-v3")
    assert isinstance(fit, pc.analysis.CalibrationFit)
    assert (fit.accepted, fit.saved, fit.refused) == (False, False, cal.refusal)
    assert str(fit) == f"claude-v3: calibration refused: {cal.refusal}; not saved"
    assert "\n" not in str(fit)
    row = calibrate_families(lab, ["claude-sonnet-4-5"]).set_index("family").loc["claude-v3"]
    assert not row.saved and reason in row.note
    with pytest.raises(pc.PromptCacheError, match="refused: " + re.escape(reason)):
        cal.save(lab)  # nor by hand, unless forced
    assert lab.store.saved_calibrations() == []


def test_a_fit_no_better_out_of_sample_is_refused(lab):
    # unbiased ±5 % noise: the uncalibrated estimate is already as good as any fit
    record_sizes(lab, range(24), lambda e: e, project="noise")
    s = lab.session(project="noise2")
    for i in range(24):
        b = body(i)
        est = prepare(b).total_tokens
        s.record(b, at=T0 + timedelta(hours=1, minutes=i), usage={
            "input_tokens": round(est * (1.05 if i % 2 else 0.95)), "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0})
    fit = pc.analysis.fit_family(lab, "claude-v3")
    assert fit.calibration is not None and 0.9 < fit.calibration.ratio < 1.1
    assert fit.refused is not None and "is no better than the uncalibrated" in fit.refused
    assert lab.store.saved_calibrations() == []


def test_a_good_fit_is_accepted_and_saved(lab):
    record_sizes(lab, range(24), lambda e: round(1.2 * e + 50), project="good")
    fit = pc.analysis.fit_family(lab, "claude-v3")
    assert fit.accepted and fit.saved and fit.refused is None
    assert fit.calibration.ratio == pytest.approx(1.2, abs=1e-3) and fit.calibration.refusal is None
    assert fit.calibration.loo_mean_abs_error_pct < 0.5 < fit.calibration.raw_mean_abs_error_pct
    assert str(fit).startswith("claude-v3: leave-one-out error 0.")
    assert lab.store.saved_calibrations() == [("claude-v3", "heuristic-v1")]
    assert pc.analysis.load_calibration(lab, "claude-sonnet-4-5").ratio == fit.calibration.ratio


def test_leave_one_out_leaves_repeated_requests_out(lab):
    # the fit: 6 requests of 2 sizes (each sent three times), measured on the line 10.7 × est − 10,934
    record_sizes(lab, [26, 29] * 3, lambda e: round(10.7 * e - 10_934), project="retries")
    cal = pc.calibrate(lab, family="claude-v3")
    assert cal.n == 6 and cal.ratio == pytest.approx(10.7, abs=0.01) and cal.overhead == pytest.approx(-10_934, abs=15)
    assert cal.mean_abs_error_pct < 0.1  # in sample the line is exact ...
    assert cal.loo_mean_abs_error_pct is None  # ... but no request can be predicted without its twins: not 0.0 %
    # with a third size the held-out size is predicted by a line through the other two
    record_sizes(lab, [10], lambda e: round(1.2 * e + 50), project="third")
    with pytest.warns(pc.errors.CalibrationWarning, match="no better than the uncalibrated"):
        assert pc.calibrate(lab, family="claude-v3").loo_mean_abs_error_pct > 100


def proxy_line(i: int, b: dict, total: int) -> str:
    """One call of ``b`` as the recording proxy logs it, with ``total`` prompt tokens measured."""
    usage = {"input_tokens": total, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
             "output_tokens": 9}
    return json.dumps({
        "v": 1, "at": (T0 + timedelta(seconds=30 * i)).isoformat().replace("+00:00", "Z"), "method": "POST",
        "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200, "request": b,
        "response": {"id": f"msg_01Cal{i:04d}", "type": "message", "role": "assistant", "model": b["model"],
                     "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": usage},
        "usage": usage, "request_id": f"req_011Cal{i:04d}", "latency_ms": 900, "provider": "anthropic"}) + "\n"


@pytest.mark.parametrize("repeats", [3, 12], ids=["6-requests", "24-requests"])
def test_importing_a_log_that_fits_degenerately_saves_no_calibration(tmp_path, repeats):
    # the shape measured on real logs: a few requests of two sizes, retried, on a steep line
    bodies = [body(i) for i in [26, 29] * repeats]
    log = tmp_path / "proxy.jsonl"
    log.write_text("".join(proxy_line(i, b, round(10.7 * prepare(b).total_tokens - 10_934))
                           for i, b in enumerate(bodies)), encoding="utf-8")
    with pc.Lab(tmp_path / "lab.duckdb", progress=False) as lab:
        result = lab.import_log(log, deep=True)
        assert result.requests == len(bodies)
        row = result.calibrations.set_index("family").loc["claude-v3"]
        assert row.n == len(bodies) and row.ratio == pytest.approx(10.7, abs=0.01)
        assert not row.saved and row.note.startswith("calibration refused: ")
        assert lab.store.saved_calibrations() == []
        (s,) = result.sessions
        choice = pc.analysis.calibration_for(lab, lab.store.session_row(s.id))
        assert choice.calibration is None and choice.why.startswith("uncalibrated: no calibration saved")


# -- choosing a calibration per session by its error on comparable requests --------------------------------

def record_partial(lab: pc.Lab, truth, *, project: str, unlogged: int = 3_000, n: int = 12):
    """A partial-body session (a Claude Code style log: no system prompt; an unlogged prefix of ``unlogged``
    tokens) whose measured prompt is ``truth(unlogged, logged estimate)``."""
    s = lab.session(project=project)
    for i in range(n):
        p = prepare(body(i), unlogged_prefix_tokens=unlogged)
        s.record(body(i), at=T0 + timedelta(minutes=i), prepared=p, usage={
            "input_tokens": truth(unlogged, p.total_tokens - unlogged), "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0, "output_tokens": 7})
    return s


def test_a_calibration_that_worsens_partial_bodies_is_not_applied_to_them(lab):
    full = record_sizes(lab, range(24), lambda e: round(1.5 * e + 50), project="proxy")
    assert pc.analysis.fit_family(lab, "claude-v3").saved
    # the partial logs' growth is counted right as it is: scaling it by 1.5 would overshoot
    partial = record_partial(lab, lambda u, logged: u + logged, project="claude-code")
    choice = pc.analysis.calibration_for(lab, lab.store.session_row(partial.id))
    assert isinstance(choice, pc.analysis.CalibrationChoice) and choice.calibration is None
    assert choice.why.startswith("uncalibrated: the calibration of claude-v3 (ratio 1.500) raises the error 0.0 % → ")
    assert choice.why.endswith("on 12 comparable partial-body requests")
    # the same calibration still counts the full-body traffic it was fitted on, where it helps out of sample
    own = pc.analysis.calibration_for(lab, lab.store.session_row(full.id))
    assert own.calibration is not None and own.calibration["ratio"] == pytest.approx(1.5, abs=1e-3)
    assert own.why.startswith("calibrated (ratio 1.500, claude-v3): on 24 comparable full-body requests the error "
                              "falls ")
    # the advice reads it back that way, and says why
    from promptcache_nb.advice._counterfactual import Original

    orig = Original.load(partial)
    assert orig.calibration is None and orig.calibration_note == choice.why
    assert [t.request.total_tokens for t in orig.turns] == list(partial.turns().total_tokens)
    assert Original.load(full).calibration_note == own.why


def test_a_calibration_that_helps_partial_bodies_is_applied_to_them(lab):
    record_sizes(lab, range(24), lambda e: round(1.5 * e + 50), project="proxy")
    assert pc.analysis.fit_family(lab, "claude-v3").saved
    partial = record_partial(lab, lambda u, logged: u + round(1.5 * logged), project="claude-code")
    choice = pc.analysis.calibration_for(lab, lab.store.session_row(partial.id))
    assert choice.calibration is not None and choice.why.startswith("calibrated (ratio 1.500, claude-v3): on 12 "
                                                                    "comparable partial-body requests")
    from promptcache_nb.advice._counterfactual import Original

    orig = Original.load(partial)
    assert orig.calibration == choice.calibration
    measured = list(partial.turns().input_tokens)
    counted = [t.request.total_tokens for t in orig.turns]
    assert all(abs(c - m) <= 0.01 * m for c, m in zip(counted, measured, strict=True))


def test_a_degenerate_calibration_saved_before_is_never_applied(lab):
    # what an import saved before fits were refused: the 6-request fit with its "0.0 %" leave-one-out
    Calibration("claude-v3", ratio=10.7, overhead=-10_934.0, n=6, mean_abs_error_pct=0.0, max_abs_error_pct=0.0,
                raw_mean_abs_error_pct=20.0, loo_mean_abs_error_pct=0.0, tokenizer="heuristic-v1").save(lab, force=True)
    partial = record_partial(lab, lambda u, logged: u + logged, project="claude-code")
    choice = pc.analysis.calibration_for(lab, lab.store.session_row(partial.id))
    assert choice == pc.analysis.CalibrationChoice(
        None, "uncalibrated: the saved calibration of claude-v3 is refused: 6 requests: too few to trust a fit (20 "
              "needed)")


def test_a_session_keeps_its_own_calibration_and_a_simulated_one_none(lab):
    sim = lab.session(project="simulated")
    sim.record(body(1), at=T0)
    assert pc.analysis.calibration_for(lab, lab.store.session_row(sim.id)).why.startswith(
        "uncalibrated: the session has no measured request")
    cal = Calibration("claude-sonnet-4-5", ratio=1.25, overhead=40, n=10, mean_abs_error_pct=1.0, max_abs_error_pct=2.0)
    opted = lab.session(project="opted", calibration=cal)
    opted.record(body(1), at=T0)
    choice = pc.analysis.calibration_for(lab, lab.store.session_row(opted.id))
    assert choice.calibration == {"model": "claude-sonnet-4-5", "ratio": 1.25, "overhead": 40.0}
    assert choice.why.startswith("calibrated: the session's own calibration")
