"""Calibrating the token estimator against measured usage, with a known ground truth."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.calibrate import Calibration
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
        record_measured(lab, lambda est: round(1.3 * est + 12))
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
                       max_abs_error_pct=2.0, tokenizer=lab.tokenizer.name).save(lab)
        cal_s = lab.session(system="You answer billing questions. " * 80, project="b", calibration="stored")
        calibrated = cal_s.step("how do refunds work?", reply="within 30 days", at=at).total_tokens
        assert 1.15 * base < calibrated < 1.35 * base
        sid = cal_s.id
    with pc.Lab(db, progress=False) as lab:  # the choice is stored with the session
        again = lab.session(id=sid)
        assert again.step("and chargebacks?", reply="see policy", at=at.replace(minute=1)).total_tokens > base
