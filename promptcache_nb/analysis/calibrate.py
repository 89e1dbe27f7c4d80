"""Calibrate the offline token estimator against measured usage.

Every token figure a simulation produces is an *estimate* (:mod:`promptcache_nb.tokens`); a live or
imported turn carries a *measurement*: ``input + cache_read + cache_write`` is the request's true input
size (rules §1.8). :func:`calibrate` fits, over a model's measured turns,

    measured ≈ ratio × estimated + overhead

by least squares, where ``estimated`` is the stored ``turns.total_tokens``. ``ratio`` corrects the
estimator's per-text bias; ``overhead`` is what the API adds once per request (rules §8: a message
frame, a hidden tool-use system prompt). The fit reports its error on the same turns (in sample), the
uncalibrated estimator's error, and a leave-one-out error, which is the honest figure to quote.

Measured figures are never adjusted; a calibration only changes estimates, and only where a user opts
in (:meth:`Calibration.apply`, :class:`~promptcache_nb.tokens.CalibratedTokenizer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from .._util import model_base_id
from ..errors import PromptCacheError
from ..tokens import CalibratedTokenizer, Tokenizer

ALL_MODELS = "*"


@dataclass(frozen=True)
class Calibration:
    """A fitted ``measured ≈ ratio × estimated + overhead`` for one model's request totals.

    Attributes:
        model: the model whose measured turns were fitted (``"*"``: all models pooled).
        ratio: measured tokens per estimated token.
        overhead: tokens per request on top (may be negative when the estimator's frames overshoot).
        n: measured turns fitted.
        mean_abs_error_pct: mean |calibrated − measured| / measured, in percent, on the fitted turns.
        max_abs_error_pct: the worst such turn.
        raw_mean_abs_error_pct: the uncalibrated estimator's mean error on the same turns.
        loo_mean_abs_error_pct: leave-one-out mean error (each turn predicted by a fit without it);
            None below 3 turns. Quote this one: in-sample error flatters small samples.
        tokenizer: the estimator that was calibrated (a calibration is only valid for it).
        fitted_at: when the fit was made (UTC).
    """

    model: str
    ratio: float
    overhead: float
    n: int
    mean_abs_error_pct: float
    max_abs_error_pct: float
    raw_mean_abs_error_pct: float = float("nan")
    loo_mean_abs_error_pct: float | None = None
    tokenizer: str = "heuristic-v1"
    fitted_at: datetime | None = None

    def apply(self, estimated: int) -> int:
        """The calibrated estimate of a request total (never below 0)."""
        return max(0, round(self.ratio * estimated + self.overhead))

    def tokenizer_for(self, base: Tokenizer) -> CalibratedTokenizer:
        """``base`` with this calibration's ratio applied per text (the overhead stays per request)."""
        return CalibratedTokenizer(base, self)

    def save(self, lab: Any) -> None:
        """Store this calibration in the lab's ``calibrations`` table (one transaction)."""
        store = lab.store
        fitted_at = self.fitted_at or datetime.now(UTC)
        with store.transaction():  # rolls back on failure, never after a COMMIT that went through
            store.con.execute(
                "INSERT OR REPLACE INTO calibrations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [self.model, self.tokenizer, self.ratio, self.overhead, self.n, self.mean_abs_error_pct,
                 self.max_abs_error_pct, self.raw_mean_abs_error_pct, self.loo_mean_abs_error_pct, fitted_at],
            ).fetchall()

    def __repr__(self) -> str:
        loo = "n/a" if self.loo_mean_abs_error_pct is None else f"{self.loo_mean_abs_error_pct:.2f}%"
        return (f"Calibration({self.model!r}, ratio={self.ratio:.4f}, overhead={self.overhead:.1f}, "
                f"n={self.n}, "
                f"error {self.mean_abs_error_pct:.2f}% mean / {self.max_abs_error_pct:.2f}% max "
                f"(leave-one-out {loo}; uncalibrated {self.raw_mean_abs_error_pct:.2f}%))")


def _measured(lab: Any, model: str | None) -> tuple[np.ndarray, np.ndarray]:
    rows = lab.store.rows(
        """SELECT model, total_tokens, input_tokens + cache_read_input_tokens + cache_creation_input_tokens
           FROM turns
           WHERE usage_source IN ('live', 'imported') AND input_tokens IS NOT NULL
                 AND cache_read_input_tokens IS NOT NULL AND cache_creation_input_tokens IS NOT NULL
           ORDER BY session_id, idx""",
    )
    if model is not None:  # one model, however its rows name it: dated snapshots and -latest aliases included
        base = model_base_id(model)
        rows = [r for r in rows if r[0] is not None and model_base_id(r[0]) == base]
    est = np.array([r[1] for r in rows], dtype=float)
    meas = np.array([r[2] for r in rows], dtype=float)
    return est, meas


def calibrate(lab: Any, model: str | None = None) -> Calibration:
    """Fit ``measured ≈ ratio × estimated + overhead`` over the lab's measured turns of ``model``.

    Args:
        lab: the :class:`~promptcache_nb.Lab` whose ``turns`` hold live or imported usage.
        model: fit only this model's turns, whatever snapshot or alias id they were stored under
            (``claude-sonnet-4-5`` finds ``claude-sonnet-4-5-20250929``); None pools every model (``"*"``).

    Raises:
        PromptCacheError: fewer than 2 measured turns, or all of one size (the overhead is then
            not identifiable).

    Example:
        >>> cal = pc.calibrate(lab, model="claude-sonnet-4-5")   # doctest: +SKIP
        >>> cal.apply(12_000), cal.loo_mean_abs_error_pct          # doctest: +SKIP
        >>> cal.save(lab)                                          # doctest: +SKIP
    """
    est, meas = _measured(lab, model)
    label = model or ALL_MODELS
    if len(est) < 2:
        known = [r[0] for r in lab.store.rows(
            "SELECT DISTINCT model FROM turns WHERE usage_source IN ('live', 'imported') ORDER BY model")]
        raise PromptCacheError(
            f"calibrate({label!r}): {len(est)} measured turn(s); need at least 2 live or imported turns "
            "(record() with usage=, or a live backend). Models with measured turns: "
            f"{', '.join(known) or '(none)'}"
        )
    if np.ptp(est) == 0:
        raise PromptCacheError(
            f"calibrate({label!r}): every measured turn has the same estimated size ({int(est[0])}); "
            "the per-request overhead cannot be separated from the ratio — measure requests of different "
            "sizes"
        )
    x = np.column_stack([est, np.ones_like(est)])
    (ratio, overhead), *_ = np.linalg.lstsq(x, meas, rcond=None)
    fitted = ratio * est + overhead
    denom = np.where(meas > 0, meas, 1.0)
    err = np.abs(fitted - meas) / denom * 100
    raw = np.abs(est - meas) / denom * 100
    loo = None
    if len(est) >= 3:
        # leave-one-out residuals of a linear least-squares fit: e_i / (1 - h_ii)
        h = np.einsum("ij,jk,ik->i", x, np.linalg.pinv(x.T @ x), x)
        loo_res = (meas - fitted) / np.where(h < 1, 1 - h, np.nan)
        loo = float(np.nanmean(np.abs(loo_res) / denom * 100))
    return Calibration(
        model=label, ratio=float(ratio), overhead=float(overhead), n=int(len(est)),
        mean_abs_error_pct=float(err.mean()), max_abs_error_pct=float(err.max()),
        raw_mean_abs_error_pct=float(raw.mean()), loo_mean_abs_error_pct=loo,
        tokenizer=lab.tokenizer.name, fitted_at=datetime.now(UTC),
    )


def load_calibration(lab: Any, model: str | None = None, *, tokenizer: str | None = None) -> Calibration:
    """The latest saved calibration of ``model`` (``None`` → the pooled ``"*"``) for the lab's tokenizer.

    Raises:
        PromptCacheError: none saved; the message lists what is.
    """
    label = model or ALL_MODELS
    tok = tokenizer or lab.tokenizer.name
    row = lab.store.one(
        """SELECT model, ratio, overhead, n, mean_abs_error_pct, max_abs_error_pct, raw_mean_abs_error_pct,
                  loo_mean_abs_error_pct, tokenizer, fitted_at
           FROM calibrations WHERE model = ? AND tokenizer = ? ORDER BY fitted_at DESC LIMIT 1""",
        [label, tok],
    )
    if row is None:
        saved = [f"{m} ({t})" for m, t in lab.store.rows(
            "SELECT DISTINCT model, tokenizer FROM calibrations ORDER BY model, tokenizer")]
        raise PromptCacheError(
            f"no saved calibration for model {label!r} and tokenizer {tok!r}; fit one with "
            f"pc.calibrate(lab, model={model!r}).save(lab). Saved: {', '.join(saved) or '(none)'}"
        )
    keys = ("model", "ratio", "overhead", "n", "mean_abs_error_pct", "max_abs_error_pct",
            "raw_mean_abs_error_pct", "loo_mean_abs_error_pct", "tokenizer", "fitted_at")
    values = dict(zip(keys, row, strict=True))
    values["fitted_at"] = values["fitted_at"].astimezone(UTC)
    return Calibration(**values)
