"""Calibrate the offline token estimator against measured usage.

Every token figure a simulation produces is an *estimate* (:mod:`promptcache_nb.tokens`); a live or
imported turn carries a *measurement*: ``input + cache_read + cache_write`` is the request's true input
size (docs/provider_cache_rules.md#anthropic-usage). :func:`calibrate` fits, over a model's measured turns,

    measured ≈ ratio × estimated + overhead

by least squares, where ``estimated`` is the stored ``turns.total_tokens``. ``ratio`` corrects the
estimator's per-text bias; ``overhead`` is what the API adds once per request (a message frame, a hidden
tool-use system prompt: docs/provider_cache_rules.md#token-counts). The fit reports its error on the same
turns (in sample), the uncalibrated estimator's error, and a leave-one-out error, which is the honest figure
to quote (:class:`CalibrationWarning` when it is no better than uncalibrated).

The estimator differs per tokenizer family (:func:`~promptcache_nb.tokens.tokenizer_family`), so a calibration
covers one family and never pools two; importing measured traffic fits and saves one per family when it helps
(:func:`calibrate_families`).

Measured figures are never adjusted; a calibration only changes estimates, and only where a user opts
in (:meth:`Calibration.apply`, :class:`~promptcache_nb.tokens.CalibratedTokenizer`,
``lab.session(calibration="stored")``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .._util import model_base_id
from ..errors import CalibrationWarning, PromptCacheError  # noqa: F401 - CalibrationWarning: its former home
from ..tokens import FAMILIES, CalibratedTokenizer, Tokenizer, estimator_for, tokenizer_family

if TYPE_CHECKING:  # pragma: no cover - numpy and pandas load when a calibration is fitted, not with the package
    import numpy as np
    import pandas as pd

    from .._protocols import LabLike

ALL_MODELS = "*"


@dataclass(frozen=True)
class Calibration:
    """A fitted ``measured ≈ ratio × estimated + overhead`` for one model's request totals.

    Attributes:
        model: the model whose measured turns were fitted, or their tokenizer family (``claude-v3``...;
            ``"*"``: every measured model pooled, all of one family).
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

    @property
    def improves(self) -> bool:
        """The leave-one-out error is below the uncalibrated estimator's (False below 3 turns: no
        out-of-sample evidence yet)."""
        loo = self.loo_mean_abs_error_pct
        return loo is not None and loo < self.raw_mean_abs_error_pct

    def apply(self, estimated: int) -> int:
        """The calibrated estimate of a request total (never below 0)."""
        return max(0, round(self.ratio * estimated + self.overhead))

    def tokenizer_for(self, base: Tokenizer) -> CalibratedTokenizer:
        """``base`` with this calibration's ratio applied per text (the overhead stays per request)."""
        return CalibratedTokenizer(base, self)

    def save(self, lab: LabLike) -> None:
        """Store this calibration in the lab's ``calibrations`` table (one transaction)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        lab.store.save_calibration({**values, "fitted_at": self.fitted_at or datetime.now(UTC)})

    def __repr__(self) -> str:
        loo = "n/a" if self.loo_mean_abs_error_pct is None else f"{self.loo_mean_abs_error_pct:.2f}%"
        return (f"Calibration({self.model!r}, ratio={self.ratio:.4f}, overhead={self.overhead:.1f}, "
                f"n={self.n}, "
                f"error {self.mean_abs_error_pct:.2f}% mean / {self.max_abs_error_pct:.2f}% max "
                f"(leave-one-out {loo}; uncalibrated {self.raw_mean_abs_error_pct:.2f}%))")


def model_key(model: str) -> str:
    """A model id as calibrations compare them: dated snapshots, ``-latest``, Bedrock/Vertex wrappers and an
    ``openai/`` style prefix removed, and the ``-0`` alias of the Claude 4.0 models resolved
    (``claude-sonnet-4-0`` is ``claude-sonnet-4``)."""
    base = model_base_id(model.rsplit("/", 1)[-1])
    if base.startswith("claude-") and base.endswith("-0"):
        base = base[:-2]
    return base


def _measured(lab: LabLike, model: str | None, family: str | None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(models, estimated, measured) of the measured requests an estimate can be fitted on.

    Partial bodies are left out (their unlogged prefix was sized from the measured total, so their estimate
    agrees with it by construction), and so are sessions with an opted-in calibration (already scaled).
    """
    import numpy as np

    rows = [r for r in lab.store.measured_totals()
            if r["model"] is not None and not r.get("partial") and not r.get("calibrated")]
    if model is not None:  # one model, however its rows name it: dated snapshots and aliases included
        key = model_key(model)
        rows = [r for r in rows if model_key(r["model"]) == key]
    elif family is not None:
        rows = [r for r in rows if tokenizer_family(r["model"]) == family]
    est = np.array([r["estimated"] for r in rows], dtype=float)
    meas = np.array([r["measured"] for r in rows], dtype=float)
    return [r["model"] for r in rows], est, meas


def calibrate(lab: LabLike, model: str | None = None, *, family: str | None = None) -> Calibration:
    """Fit ``measured ≈ ratio × estimated + overhead`` over the lab's measured turns of ``model``.

    A calibration belongs to one tokenizer family (:func:`~promptcache_nb.tokens.tokenizer_family`): the
    estimators differ per family, so pooling, say, ``gpt-4.1`` and ``claude-sonnet-4-5`` requests would fit
    neither. Partial bodies (a log without the system prompt and tools) are not fitted: their estimate
    includes an unlogged prefix sized from the measured total.

    Args:
        lab: the :class:`~promptcache_nb.Lab` whose ``turns`` hold live or imported usage.
        model: fit only this model's turns, whatever snapshot or alias id they were stored under
            (``claude-sonnet-4-5`` finds ``claude-sonnet-4-5-20250929``, ``claude-opus-4-0`` finds
            ``claude-opus-4``).
        family: fit every model of one tokenizer family (``claude-v3``, ``openai-o200k``...); the
            calibration is labelled with the family. With neither, every measured model is pooled (``"*"``)
            — only when they share one family.

    Raises:
        PromptCacheError: fewer than 2 measured turns, all of one size (the overhead is then not
            identifiable), or (pooled) turns of several tokenizer families.

    Warns:
        CalibrationWarning: the leave-one-out error is no better than the uncalibrated estimator's.

    Example:
        >>> cal = pc.calibrate(lab, model="claude-sonnet-4-5")   # doctest: +SKIP
        >>> cal.apply(12_000), cal.loo_mean_abs_error_pct          # doctest: +SKIP
        >>> cal.save(lab)                                          # doctest: +SKIP
    """
    import numpy as np

    if model is not None and family is not None:
        raise TypeError("calibrate(): pass model= or family=, not both")
    models, est, meas = _measured(lab, model, family)
    label = model or family or ALL_MODELS
    families = sorted({tokenizer_family(m) for m in models})
    if len(families) > 1:
        by_family = "; ".join(f"{f}: {', '.join(sorted({m for m in models if tokenizer_family(m) == f}))}"
                              for f in families)
        raise PromptCacheError(
            f"calibrate({label!r}): the measured turns span {len(families)} tokenizer families ({by_family}); "
            "a calibration fits one estimator — pass family= (one of "
            f"{', '.join(repr(f) for f in families)}) or model="
        )
    if len(est) < 2:
        known = lab.store.measured_models()
        raise PromptCacheError(
            f"calibrate({label!r}): {len(est)} measured turn(s) with a complete body; need at least 2 live or "
            "imported turns (record() with usage=, or a live backend; partial bodies do not count). Models "
            f"with measured turns: {', '.join(known) or '(none)'}"
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
    cal = Calibration(
        model=label, ratio=float(ratio), overhead=float(overhead), n=int(len(est)),
        mean_abs_error_pct=float(err.mean()), max_abs_error_pct=float(err.max()),
        raw_mean_abs_error_pct=float(raw.mean()), loo_mean_abs_error_pct=loo,
        tokenizer=estimator_for(lab.tokenizer, families[0]).name, fitted_at=datetime.now(UTC),
    )
    if loo is not None and not cal.improves:
        warnings.warn(CalibrationWarning(
            f"calibrate({label!r}): the leave-one-out error ({loo:.1f}%) is no better than the uncalibrated "
            f"estimate's ({cal.raw_mean_abs_error_pct:.1f}%) over {cal.n} requests; opting in to this "
            "calibration would not improve the estimates"), stacklevel=2)
    return cal


def load_calibration(lab: LabLike, model: str | None = None, *, tokenizer: str | None = None) -> Calibration:
    """The latest saved calibration of ``model`` (``None`` → the pooled ``"*"``).

    For a model, the first of: a calibration saved under that id, one saved under another id of the same
    model (a dated snapshot or alias), one of its tokenizer family (``claude-v3``: what importing measured
    traffic saves). Only calibrations of ``tokenizer`` count — by default the model's own estimator
    (``heuristic-v1``, ``o200k_base``...) or the lab's tokenizer.

    Raises:
        PromptCacheError: none saved; the message lists what is.
    """
    label = model or ALL_MODELS
    if tokenizer is not None:
        toks = [tokenizer]
    elif model is not None:
        toks = [estimator_for(lab.tokenizer, model).name, lab.tokenizer.name]
    else:
        toks = [lab.tokenizer.name] + [estimator_for(lab.tokenizer, f).name for f in FAMILIES]
    saved = lab.store.saved_calibrations()
    if model is None:
        labels = [ALL_MODELS]
    else:
        key, fam = model_key(model), tokenizer_family(model)
        labels = [model] + sorted({m for m, _ in saved if m not in (model, ALL_MODELS) and m not in FAMILIES
                                   and model_key(m) == key}) + [fam]
    for lab_label in labels:
        for tok in dict.fromkeys(toks):
            if (lab_label, tok) in saved:
                values = lab.store.latest_calibration(lab_label, tok)
                if values is not None:
                    values["fitted_at"] = values["fitted_at"].astimezone(UTC)
                    return Calibration(**values)
    listed = [f"{m} ({t})" for m, t in saved]
    raise PromptCacheError(
        f"no saved calibration for model {label!r} and tokenizer {' or '.join(dict.fromkeys(toks))!r}; fit one "
        f"with pc.calibrate(lab, model={model!r}).save(lab). Saved: {', '.join(listed) or '(none)'}"
    )


#: Columns of :func:`calibrate_families` (``ImportResult.calibrations``).
FAMILY_COLUMNS = ["family", "models", "n", "ratio", "overhead", "raw_mean_abs_error_pct", "loo_mean_abs_error_pct",
                  "saved", "note"]


def calibrate_families(lab: LabLike, models: Iterable[str], *, save: bool = True) -> pd.DataFrame:
    """Fit (and save) one calibration per tokenizer family of ``models``, over all the lab's measured turns
    of that family: what importing measured traffic does (each measured request gives an exact prompt total).

    A calibration is saved only when it helps: at least 3 requests and a leave-one-out error below the
    uncalibrated estimator's; otherwise the row says why (no warning: an import is not the place to
    interrupt). Measured figures are never touched; a saved calibration only changes the estimates of
    sessions that opt in (``lab.session(..., calibration="stored")``).

    Returns:
        One row per family: ``family, models, n, ratio, overhead, raw_mean_abs_error_pct,
        loo_mean_abs_error_pct, saved, note``.
    """
    import pandas as pd

    rows = []
    for family in sorted({tokenizer_family(m) for m in models if m}):
        row: dict[str, Any] = dict.fromkeys(FAMILY_COLUMNS)
        row.update(family=family, saved=False)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CalibrationWarning)
                cal = calibrate(lab, family=family)
        except PromptCacheError as exc:
            row["note"] = str(exc).split(";")[0].removeprefix(f"calibrate({family!r}): ")
            rows.append(row)
            continue
        fitted = _measured(lab, None, family)[0]
        row.update(models=", ".join(sorted({model_key(m) for m in fitted})), n=cal.n, ratio=cal.ratio,
                   overhead=cal.overhead, raw_mean_abs_error_pct=cal.raw_mean_abs_error_pct,
                   loo_mean_abs_error_pct=cal.loo_mean_abs_error_pct)
        if cal.loo_mean_abs_error_pct is None:
            row["note"] = f"{cal.n} requests: too few to judge a calibration out of sample (3 needed); not saved"
        elif not cal.improves:
            row["note"] = (f"leave-one-out error {cal.loo_mean_abs_error_pct:.1f}% is no better than the "
                           f"uncalibrated {cal.raw_mean_abs_error_pct:.1f}%; not saved")
        else:
            if save:
                cal.save(lab)
            row["saved"] = save
            row["note"] = (f"leave-one-out error {cal.loo_mean_abs_error_pct:.1f}% vs "
                           f"{cal.raw_mean_abs_error_pct:.1f}% uncalibrated")
        rows.append(row)
    return pd.DataFrame(rows, columns=FAMILY_COLUMNS)
