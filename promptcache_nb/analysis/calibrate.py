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
(:func:`calibrate_families`) and is not degenerate (:attr:`Calibration.refusal`: too few requests or sizes, a
ratio no tokenizer difference explains, a negative overhead, no out-of-sample gain). The advice counts a session
with a saved calibration only where it lowers the error on comparable requests (:func:`calibration_for`).

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

from .._lazy import numpy as np
from .._lazy import pandas as pd
from .._util import model_base_id
from ..errors import CalibrationWarning, PromptCacheError  # noqa: F401 - CalibrationWarning: its former home
from ..tokens import FAMILIES, CalibratedTokenizer, Tokenizer, estimator_for, tokenizer_family

if TYPE_CHECKING:  # pragma: no cover - numpy and pandas load when a calibration is fitted, not with the package

    from .._protocols import LabLike

ALL_MODELS = "*"

#: Fewest measured requests a saved calibration may rest on. The fit has two parameters; the usual rule of
#: ten observations per fitted parameter gives 20. Below that a few high-leverage requests set the slope: the
#: 6-request fit of issue #36 (ratio 10.7, overhead -10,934) turned ±6 % Claude Code baselines into ±400 %.
MIN_REQUESTS = 20

#: The band a plausible ratio lies in. It is what the real tokenizer yields per estimated token: the documented
#: differences between tokenizers (docs/provider_cache_rules.md#token-counts: Anthropic's newer tokenizer
#: 1.0-1.35x the old one, 1.22x on code and 1.44x on English per ctok) times the heuristic's own ±20 % stay
#: within 1.44 × 1.2 ≈ 1.73 and its inverse 0.58. A factor of 2 either way is no tokenizer difference: it is a
#: fit extrapolating a slope from requests of nearly one size.
RATIO_BAND = (0.5, 2.0)

#: How far below zero a fitted overhead may fall and still be a frame difference. The API adds tokens to a
#: request (message framing, a hidden tool-use system prompt), never removes any; what the estimator assumes
#: per request (4 tokens a message, 2 a block, 8 a tool: tokens.MESSAGE_FRAME_TOKENS...) may overshoot the
#: API's by tens of tokens, and noise moves a true zero by a few either side (a ±5 % fit over 48 requests:
#: −1.3). Further below zero the line is a slope extrapolated past the data (the issue's −10,934).
NEGATIVE_OVERHEAD_TOLERANCE = 50


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
        loo_mean_abs_error_pct: leave-one-out mean error: each turn predicted by a fit without every turn of
            its estimated size (a repeated request left in would predict itself); None below 3 distinct sizes.
            Quote this one: in-sample error flatters small samples.
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
        """The leave-one-out error is below the uncalibrated estimator's (False below 3 distinct sizes: no
        out-of-sample evidence yet)."""
        loo = self.loo_mean_abs_error_pct
        return loo is not None and loo < self.raw_mean_abs_error_pct

    @property
    def refusal(self) -> str | None:
        """Why this fit must not be saved or applied automatically (one line), or None when it may be.

        Refused: fewer than :data:`MIN_REQUESTS` requests; no leave-one-out error (fewer than 3 distinct
        sizes); a ratio outside :data:`RATIO_BAND`; an overhead below −:data:`NEGATIVE_OVERHEAD_TOLERANCE` (the
        API adds tokens to a request, never removes any: a negative intercept is a slope extrapolated past the
        data); a leave-one-out error no better than the uncalibrated estimator's. A refused calibration is not
        saved (by an import, or by :meth:`save` unless forced) and never applied by the advice
        (:func:`calibration_for`).
        """
        lo, hi = RATIO_BAND
        loo = self.loo_mean_abs_error_pct
        if self.n < MIN_REQUESTS:
            return f"{self.n} requests: too few to trust a fit ({MIN_REQUESTS} needed)"
        if loo is None:
            return "fewer than 3 distinct request sizes: no leave-one-out error to judge the fit by"
        if not lo <= self.ratio <= hi:
            return (f"ratio {self.ratio:.3g} is outside {lo}-{hi}: no tokenizer differs from the estimate by that "
                    "much")
        if self.overhead < -NEGATIVE_OVERHEAD_TOLERANCE:
            return (f"overhead {self.overhead:,.0f} tokens is negative: the API adds tokens to a request, never "
                    "removes them")
        if not loo < self.raw_mean_abs_error_pct:
            return (f"leave-one-out error {loo:.1f}% is no better than the uncalibrated "
                    f"{self.raw_mean_abs_error_pct:.1f}%")
        return None

    def apply(self, estimated: int) -> int:
        """The calibrated estimate of a request total (never below 0)."""
        return max(0, round(self.ratio * estimated + self.overhead))

    def tokenizer_for(self, base: Tokenizer) -> CalibratedTokenizer:
        """``base`` with this calibration's ratio applied per text (the overhead stays per request)."""
        return CalibratedTokenizer(base, self)

    def save(self, lab: LabLike, *, force: bool = False) -> None:
        """Store this calibration in the lab's ``calibrations`` table (one transaction).

        Raises:
            PromptCacheError: it is refused (:attr:`refusal`) and ``force`` is not set: a degenerate fit saved
                would be counted with by every session that opts in to ``calibration="stored"``.
        """
        if self.refusal is not None and not force:
            raise PromptCacheError(f"calibration of {self.model!r} refused: {self.refusal}; not saved "
                                   "(save(lab, force=True) stores it anyway)")
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


def _lines_without_own_group(est: np.ndarray, meas: np.ndarray,
                             groups: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Per request, the least-squares ``(ratio, overhead)`` fitted on every request outside its group, or None
    when some group's complement holds fewer than 2 distinct sizes (no line through it).

    Leave-one-out must leave a request's twins out with it: a repeated request (a retry, the same prompt
    measured twice) left in the fit predicts the held-out one exactly, which is how a 6-request fit on 2
    distinct sizes reported "leave-one-out 0.0 %". Closed form from per-group sums: one pass, any size.
    """
    _, inv = np.unique(groups, return_inverse=True)
    x = est - est.mean()  # centred: the sums of squares then lose no precision to the mean
    sums = [np.bincount(inv, weights=w, minlength=inv.max() + 1) for w in (np.ones_like(x), x, meas, x * x, x * meas)]
    n, sx, sy, sxx, sxy = (by_group.sum() - by_group for by_group in sums)  # each group's complement
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = sxx - sx * sx / n
        if np.any(n < 2) or np.any(~(spread > 1e-9 * (sxx + 1.0))):
            return None
        ratio = (sxy - sx * sy / n) / spread
        overhead = (sy - ratio * sx) / n - ratio * est.mean()
    return ratio[inv], overhead[inv]


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
    held_out = _lines_without_own_group(est, meas, est)
    if held_out is not None:
        loo_ratio, loo_overhead = held_out
        loo = float((np.abs(loo_ratio * est + loo_overhead - meas) / denom * 100).mean())
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


@dataclass(frozen=True)
class CalibrationFit:
    """The outcome of fitting one tokenizer family's calibration at import: accepted or refused, and why.

    Attributes:
        family: the tokenizer family fitted (``claude-v3``...).
        calibration: the fit, refused or not; None when no line could be fitted at all.
        refused: one line saying why it is not saved (:attr:`Calibration.refusal`, or why nothing could be
            fitted); None when it was accepted.
        saved: it was written to the lab's ``calibrations`` table.
    """

    family: str
    calibration: Calibration | None
    refused: str | None
    saved: bool = False

    @property
    def accepted(self) -> bool:
        return self.refused is None

    def __str__(self) -> str:
        if self.calibration is None:
            return f"{self.family}: nothing to fit: {self.refused}; not saved"
        if self.refused is not None:
            return f"{self.family}: calibration refused: {self.refused}; not saved"
        cal = self.calibration
        assert cal is not None and cal.loo_mean_abs_error_pct is not None  # accepted: fitted, judged out of sample
        return (f"{self.family}: leave-one-out error {cal.loo_mean_abs_error_pct:.1f}% vs "
                f"{cal.raw_mean_abs_error_pct:.1f}% uncalibrated over {cal.n} requests"
                f"{'' if self.saved else '; not saved'}")


def fit_family(lab: LabLike, family: str, *, save: bool = True) -> CalibrationFit:
    """Fit ``family``'s calibration over the lab's measured full-body requests and save it unless it is
    refused (:attr:`Calibration.refusal`): what importing measured traffic does, without warnings (an import
    is not the place to interrupt).

    Example:
        >>> fit = pc.analysis.fit_family(lab, "claude-v3")      # doctest: +SKIP
        >>> fit.accepted, str(fit)                               # doctest: +SKIP
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)
            cal = calibrate(lab, family=family)
    except PromptCacheError as exc:
        return CalibrationFit(family, None, str(exc).split(";")[0].removeprefix(f"calibrate({family!r}): "))
    if cal.refusal is not None:
        return CalibrationFit(family, cal, cal.refusal)
    if save:
        cal.save(lab)
    return CalibrationFit(family, cal, None, saved=save)


#: Columns of :func:`calibrate_families` (``ImportResult.calibrations``).
FAMILY_COLUMNS = ["family", "models", "n", "ratio", "overhead", "raw_mean_abs_error_pct", "loo_mean_abs_error_pct",
                  "saved", "note"]


def calibrate_families(lab: LabLike, models: Iterable[str], *, save: bool = True) -> pd.DataFrame:
    """Fit (and save) one calibration per tokenizer family of ``models``, over all the lab's measured turns
    of that family: what importing measured traffic does (each measured request gives an exact prompt total).

    A calibration is saved only when it is not refused (:func:`fit_family`, :attr:`Calibration.refusal`);
    otherwise the row's note says why. Measured figures are never touched; a saved calibration only changes
    the estimates of sessions that opt in (``lab.session(..., calibration="stored")``) and of the advice where
    it lowers the error (:func:`calibration_for`).

    Returns:
        One row per family: ``family, models, n, ratio, overhead, raw_mean_abs_error_pct,
        loo_mean_abs_error_pct, saved, note`` (``note``: the one-line :class:`CalibrationFit`).
    """
    rows = []
    for family in sorted({tokenizer_family(m) for m in models if m}):
        fit = fit_family(lab, family, save=save)
        row: dict[str, Any] = dict.fromkeys(FAMILY_COLUMNS)
        row.update(family=family, saved=fit.saved, note=str(fit).removeprefix(f"{family}: "))
        cal = fit.calibration
        if cal is not None:
            fitted = _measured(lab, None, family)[0]
            row.update(models=", ".join(sorted({model_key(m) for m in fitted})), n=cal.n, ratio=cal.ratio,
                       overhead=cal.overhead, raw_mean_abs_error_pct=cal.raw_mean_abs_error_pct,
                       loo_mean_abs_error_pct=cal.loo_mean_abs_error_pct)
        rows.append(row)
    return pd.DataFrame(rows, columns=FAMILY_COLUMNS)


@dataclass(frozen=True)
class CalibrationChoice:
    """How a stored session's requests are counted: with a calibration, or uncalibrated, and why.

    Attributes:
        calibration: the calibration to count with (``model``, ``ratio``, ``overhead``: a session config's
            ``calibration``), or None: the Lab's estimator as is.
        why: one line naming what was chosen and the evidence ("calibrated (ratio 1.213, claude-v3): on 143
            comparable full-body requests the error falls 4.1 % → 1.2 %").
    """

    calibration: dict[str, Any] | None
    why: str


def calibration_for(lab: LabLike, session_row: dict[str, Any]) -> CalibrationChoice:
    """The calibration a stored session's requests are counted with when they are counted again (advice,
    counterfactuals): only one that lowers the error against measured prompt sizes on comparable requests.

    * A session that opted in to a calibration keeps it (its stored estimates were counted with it).
    * A session with no measured request is counted as stored: there is nothing to judge a calibration by.
    * Otherwise the saved calibration of its model's family (:func:`load_calibration`) is applied only when it
      is not refused (:attr:`Calibration.refusal`) and its error on *comparable* requests — measured requests of
      the same tokenizer family with the same kind of body — is below the uncalibrated one, counted the way the
      calibration is applied (its ratio scales every text, :class:`~promptcache_nb.tokens.CalibratedTokenizer`):

      - partial bodies (Claude Code, Codex, pi logs hold no system prompt): ``unlogged + ratio × (estimate −
        unlogged)``; the unlogged prefix is a measured size and never scales. The calibration was never fitted on
        them, so the error is out of sample as it stands (the request each prefix was sized on agrees
        uncalibrated by construction, which leans to counting uncalibrated: the safe side).
      - full bodies: ``ratio' × estimate``, ``ratio'`` fitted without every request of the judged one's size
        (the leave-one-out of :func:`calibrate`).

    Args:
        lab: the Lab that stores the session.
        session_row: its row (``lab.store.session_row(id)``: ``id``, ``model``, ``config``).

    Example:
        >>> choice = pc.analysis.calibration_for(lab, lab.store.session_row(s.id))   # doctest: +SKIP
        >>> choice.why                                                              # doctest: +SKIP
    """
    own = session_row["config"].get("calibration")
    if own:
        return CalibrationChoice(dict(own), f"calibrated: the session's own calibration (ratio {own['ratio']:.3f}), "
                                            "chosen when it was recorded")
    mine = lab.store.measured_totals(session_id=session_row["id"])
    if not mine:
        return CalibrationChoice(None, "uncalibrated: the session has no measured request to judge a calibration by")
    model = session_row["model"] or next((r["model"] for r in mine if r["model"]), None)
    if model is None:
        return CalibrationChoice(None, "uncalibrated: the session names no model")
    try:
        cal = load_calibration(lab, model)
    except PromptCacheError:
        return CalibrationChoice(None, f"uncalibrated: no calibration saved for {tokenizer_family(model)}")
    if cal.refusal is not None:
        return CalibrationChoice(None, f"uncalibrated: the saved calibration of {cal.model} is refused: {cal.refusal}")
    family, partial = tokenizer_family(model), any(r["partial"] for r in mine)
    kind = "partial-body" if partial else "full-body"
    rows = lab.store.measured_totals(models=[m for m in lab.store.measured_models()
                                             if m is not None and tokenizer_family(m) == family])
    comparable = [r for r in rows if not r["calibrated"] and r["measured"] > 0 and bool(r["partial"]) == partial]
    if not comparable:
        return CalibrationChoice(None, f"uncalibrated: no measured {kind} {family} request to judge the calibration "
                                       f"of {cal.model} by")
    est = np.array([r["estimated"] for r in comparable], dtype=float)
    meas = np.array([r["measured"] for r in comparable], dtype=float)
    if partial:
        unlogged = np.array([r["unlogged"] for r in comparable], dtype=float)
        calibrated = unlogged + cal.ratio * (est - unlogged)
    else:
        held_out = _lines_without_own_group(est, meas, est)
        if held_out is None:
            return CalibrationChoice(None, f"uncalibrated: fewer than 3 sizes of {kind} {family} requests to judge "
                                           f"the calibration of {cal.model} by")
        calibrated = held_out[0] * est
    raw_err = float((np.abs(est - meas) / meas).mean() * 100)
    cal_err = float((np.abs(calibrated - meas) / meas).mean() * 100)
    n = f"{len(est):,} comparable {kind} requests"
    if cal_err < raw_err:
        return CalibrationChoice(
            {"model": cal.model, "ratio": float(cal.ratio), "overhead": float(cal.overhead)},
            f"calibrated (ratio {cal.ratio:.3f}, {cal.model}): on {n} the error falls {raw_err:.1f} % → "
            f"{cal_err:.1f} %")
    return CalibrationChoice(None, f"uncalibrated: the calibration of {cal.model} (ratio {cal.ratio:.3f}) raises the "
                                   f"error {raw_err:.1f} % → {cal_err:.1f} % on {n}")


def needs_calibration(lab: LabLike, models: set[str]) -> bool:
    """True when a tokenizer family of ``models`` has measured requests stored but no calibration fitted on
    them (:func:`calibrate_families` would fit one): an import fits them at its end, also when it stored nothing
    new (an import stopped after its sessions committed gets them back)."""
    fitted = {family for family, _ in lab.store.saved_calibrations()}
    return any(tokenizer_family(m) not in fitted for m in models)
