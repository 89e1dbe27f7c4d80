"""How well the simulated original reproduces a session's measured requests: the evidence every saving's
interval is built from (:mod:`._anchor`).

Per session: the measured cost beside the simulated original's (raw, and scaled to the measured prompt sizes), the
read shares, how many requests the replay reproduces (read share within 10 % of the prompt), and why the others
differ:

* ``provider_miss`` — the provider rebuilt what the replay read, with the logged prefix unchanged;
* ``ttl`` — the provider expired (or kept) an entry across an idle gap where the replay did the opposite;
* ``unexplained_read`` — the provider read what the replay did not predict: another session's entry, or a
  prefix the log does not hold; ``first_read_explained`` says whether the first request's measured read is
  reproduced by the sessions replayed beside it (its account's scope): the replay read on it, a share of the prompt
  within :data:`~._anchor.AGREEMENT` of the measured one — a compaction call's read of its parent's entry counts,
  though no saving is claimed on it — and ``first_read_from`` names the session that wrote what it read;
* ``unpredicted_write`` — the same read, but the provider wrote what the replay sent uncached (or the reverse);
* ``below_minimum`` — the replay thought the prefix too short to cache;
* ``history_missing`` — a compaction call logged without the conversation it summarises;
* ``unsupported`` — the cache model could not simulate the request;
* ``token_drift`` (not a disagreement) — reproduced, with the estimated prompt more than 10 % off the measured;
* ``retention_open`` (not a disagreement) — requests whose outcome the provider's documented retention leaves open
  (OpenAI keeps an idle in-memory prefix somewhere between 5 minutes and an hour): the replay takes the one the
  measured read shows (``retention_kept`` per request: True when the provider kept the prefix).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from .._lazy import pandas as pd
from ..session import Session
from ._anchor import AGREEMENT, RequestFit, share_of
from ._counterfactual import Original, originals

if TYPE_CHECKING:  # pragma: no cover

    from ..lab import Lab

CAUSES = ("provider_miss", "ttl", "unexplained_read", "unpredicted_write", "below_minimum", "history_missing",
          "unsupported")

FIDELITY_COLUMNS = [
    "session", "requests", "measured_requests", "cost_measured_usd", "cost_simulated_usd", "cost_scaled_usd",
    "cost_error", "read_share_measured", "read_share_simulated", "agreement", *CAUSES, "token_drift", "retention_open",
    "median_scale", "first_read_tokens", "first_read_explained", "first_read_from", "shared_with",
]

REQUEST_COLUMNS = ["session", "idx", "sent_at", "model", "gap_seconds", "measured_read", "measured_write",
                   "measured_uncached", "simulated_read", "simulated_write", "simulated_uncached", "scale",
                   "reproduced", "cause", "retention_kept", "cost_measured_usd", "cost_simulated_usd", "residual_usd"]


def _share(fits: list[RequestFit], simulated: bool) -> float | None:
    read = total = 0
    for f in fits:
        u = f.simulated if simulated else f.measured
        if u is None or f.measured is None:
            continue
        scale = f.scale if simulated else 1.0
        read += round(scale * (u.cache_read_input_tokens or 0))
        total += round(scale * (u.total_input_tokens or 0))
    return read / total if total else None


def session_fidelity(session_id: str, orig: Original) -> dict[str, Any]:
    """One row of :func:`fidelity` (``orig``: the session read back as the advice reads it)."""
    fits = orig.fits()
    measured = [f for f in fits if f.measured is not None]
    cost_m = sum(f.measured_cost or 0.0 for f in measured) if measured else None
    cost_s = sum(f.simulated_cost or 0.0 for f in measured)
    scaled = sum(f.scaled_cost or 0.0 for f in measured)
    first = fits[0] if fits else None
    first_read = first.measured.cache_read_input_tokens if first is not None and first.measured else None
    explained = None
    if first is not None and first.measured is not None and first_read:
        sim = first.simulated
        # whether the replay reproduces the read, not whether a saving may be claimed on the request (a compaction
        # call is never "reproduced", but its read of the parent's entry is what the replay shows)
        explained = bool(sim is not None and (sim.cache_read_input_tokens or 0) > 0
                         and abs(share_of(first.measured) - share_of(sim)) <= AGREEMENT)
    writer = None
    if explained:
        detail = orig.baseline().cache_detail.iloc[0] if fits else None
        writer = detail.get("read_from_session") if isinstance(detail, dict) else None
    row: dict[str, Any] = {
        "session": session_id, "requests": len(fits), "measured_requests": len(measured),
        "cost_measured_usd": cost_m, "cost_simulated_usd": cost_s if measured else None,
        "cost_scaled_usd": scaled if measured else None,
        "cost_error": (scaled - cost_m) / cost_m if cost_m else None,
        "read_share_measured": _share(fits, False), "read_share_simulated": _share(fits, True),
        "agreement": sum(f.reproduced for f in measured) / len(measured) if measured else None,
        "token_drift": sum(f.cause == "token_drift" for f in measured),
        "retention_open": sum(f.retention_kept is not None for f in measured),
        "median_scale": statistics.median(f.scale for f in measured) if measured else None,
        "first_read_tokens": first_read, "first_read_explained": explained, "first_read_from": writer,
        "shared_with": [s.key for s in orig.shared],
    }
    for cause in CAUSES:
        row[cause] = sum(f.cause == cause for f in measured)
    return row


def fidelity(session_or_lab: Session | Lab, *, per_request: bool = False) -> pd.DataFrame:
    """How the simulated original compares with the measured usage, per session (or per request).

    The advice's own replay is used (the session's cache model, its account's other sessions beside it): the
    figures here are the error bars of every saving :func:`~promptcache_nb.advise` reports.

    Args:
        session_or_lab: a stored session, or a Lab (every session but counterfactuals).
        per_request: one row per request (measured and simulated read / write / uncached, scale, reproduced,
            cause, residual) instead of one per session.

    Returns:
        ``FIDELITY_COLUMNS`` (``cost_error``: scaled simulated − measured, over measured; ``agreement``: the share
        of measured requests reproduced; a column per disagreement cause) or ``REQUEST_COLUMNS``.

    Example:
        >>> pc.fidelity(lab)[["session", "cost_error", "agreement", "provider_miss"]]  # doctest: +SKIP
    """
    rows: list[dict[str, Any]] = []
    for orig in originals(session_or_lab, desc="fidelity"):
        sid = str(orig.row["id"])
        rows.extend(_request_rows(sid, orig.fits()) if per_request else [session_fidelity(sid, orig)])
    df = pd.DataFrame(rows, columns=REQUEST_COLUMNS if per_request else FIDELITY_COLUMNS)
    df.attrs["label"] = "measured beside simulated (estimated tokens)"
    return df


def _request_rows(session_id: str, fits: list[RequestFit]) -> list[dict[str, Any]]:
    out = []
    for f in fits:
        m, s = f.measured, f.simulated
        out.append({
            "session": session_id, "idx": f.idx, "sent_at": f.at, "model": f.model, "gap_seconds": f.gap_seconds,
            "measured_read": None if m is None else m.cache_read_input_tokens,
            "measured_write": None if m is None else m.cache_creation_input_tokens,
            "measured_uncached": None if m is None else m.input_tokens,
            "simulated_read": None if s is None else s.cache_read_input_tokens,
            "simulated_write": None if s is None else s.cache_creation_input_tokens,
            "simulated_uncached": None if s is None else s.input_tokens,
            "scale": f.scale, "reproduced": f.reproduced, "cause": f.cause, "retention_kept": f.retention_kept,
            "cost_measured_usd": f.measured_cost,
            "cost_simulated_usd": f.simulated_cost, "residual_usd": f.residual if m is not None else None,
        })
    return out
