"""Threshold attacks to (epsilon, delta): Clopper-Pearson bounds and the GDP fit (DESIGN 4.5).

At a threshold t ("member iff score >= t") the false positives among the non-members and the
false negatives among the members are binomial counts, so one-sided Clopper-Pearson (CP)
bounds FPR_u, FNR_u hold with confidence 1 - beta each. Two lower bounds follow:

* ``clopper_pearson``: eps = max(log((1 - delta - FNR_u) / FPR_u), log((1 - delta - FPR_u) / FNR_u))
  (Jagielski et al. 2020), valid for any mechanism;
* ``gdp`` (Nasr et al. 2023): mu_lb = z(1 - FPR_u) - z(FNR_u), then eps(delta) of mu_lb-GDP.
  This assumes the mechanism is (close to) Gaussian: it lower-bounds the GDP parameter.

Choosing t on the same scores invalidates the confidence unless corrected. Selection rules:

* ``"bonferroni"`` (default): a fixed-size candidate set, every CP bound at level
  beta / (2 m) for m candidates, so all 2m bounds hold jointly. The candidates are order
  statistics of ONE side each (k-th largest non-member score, j-th smallest member score, at
  geometrically spaced ranks, plus "just above every non-member" and "the lowest member").
  At such a threshold the other side's count is exactly binomial, and the own side's true
  rate is Beta-distributed and stochastically dominated by what CP assumes (exact for
  continuous scores), so the joint guarantee holds although the thresholds are data-driven.
* ``"split"``: pick the threshold on a seeded random half, certify on the other half
  (CP at beta / 2 for each of the two rates).
* ``"naive"``: max over every ROC threshold with uncorrected CP bounds. INVALID (its
  confidence is not the stated one); it exists only to show what the correction buys.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaincinv, ndtri

from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.stats.result import ASSUME_GDP, EpsilonBound
from dpaudit.stats.roc import count_at_or_above

SELECTIONS = ("bonferroni", "split", "naive")


def cp_upper(k, n, alpha):
    """One-sided Clopper-Pearson upper bound on a binomial rate: P(rate <= bound) >= 1 - alpha.

    ``k`` successes out of ``n`` (arrays broadcast); the bound is 1 when ``k == n``.
    """
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    full = k >= n
    out = betaincinv(k + 1.0, np.where(full, 1.0, n - k), 1.0 - alpha)
    out = np.where(full, 1.0, out)
    return float(out) if out.ndim == 0 else out


def eps_from_rates(fpr, fnr, delta: float):
    """(eps, delta)-DP lower bound implied by error rates: both directions of the DP inequality.

    Returns max(log((1 - delta - fnr) / fpr), log((1 - delta - fpr) / fnr)) clipped at 0
    (arrays broadcast). A zero rate with positive numerator gives +inf (caller's job to avoid).
    """
    fpr = np.asarray(fpr, dtype=np.float64)
    fnr = np.asarray(fnr, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0)) - np.log(fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0)) - np.log(fnr)
    out = np.maximum(np.nan_to_num(np.maximum(a, b), nan=0.0, neginf=0.0), 0.0)
    return float(out) if out.ndim == 0 else out


def mu_from_rates(fpr, fnr):
    """GDP parameter implied by error rates: z(1 - fpr) - z(fnr) (Nasr et al. 2023)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = ndtri(1.0 - np.asarray(fpr, dtype=np.float64)) - ndtri(
            np.asarray(fnr, dtype=np.float64)
        )
    out = np.nan_to_num(out, nan=-np.inf)
    return float(out) if out.ndim == 0 else out


def candidate_thresholds(s_in: np.ndarray, s_out: np.ndarray, n_candidates: int) -> np.ndarray:
    """Data-driven but Bonferroni-safe thresholds: one-sided order statistics (module doc).

    ``s_in`` and ``s_out`` must be sorted ascending. About ``n_candidates / 2`` per side.
    """
    per_side = max(int(n_candidates) // 2, 2)
    n_out, n_in = s_out.size, s_in.size
    # k = number of non-members at or above the threshold (k = 0: just above the maximum).
    k = np.unique(np.round(np.geomspace(1, n_out + 1, per_side)).astype(np.int64) - 1)
    k = k[k < n_out]
    from_out = np.where(k == 0, np.nextafter(s_out[-1], np.inf), s_out[n_out - np.maximum(k, 1)])
    # j = number of members strictly below the threshold (threshold = (j+1)-th smallest member).
    j = np.unique(np.round(np.geomspace(1, n_in, per_side)).astype(np.int64) - 1)
    from_in = s_in[j]
    return np.unique(np.concatenate([from_out, from_in]))


def _rates_at(s_in: np.ndarray, s_out: np.ndarray, thresholds: np.ndarray):
    """False-positive and false-negative counts at each threshold (sorted inputs)."""
    fp = count_at_or_above(s_out, thresholds)
    fn = s_in.size - count_at_or_above(s_in, thresholds)
    return fp, fn


def _objective(kind: str, fpr_u, fnr_u, delta: float):
    """Per-threshold value to maximise: eps (clopper_pearson) or mu_lb (gdp)."""
    if kind == "clopper_pearson":
        return eps_from_rates(fpr_u, fnr_u, delta)
    return mu_from_rates(fpr_u, fnr_u)


def _best(kind, s_in, s_out, thresholds, level, delta):
    """Evaluate all thresholds at CP level ``level`` and return the best one's numbers."""
    fp, fn = _rates_at(s_in, s_out, thresholds)
    fpr_u = cp_upper(fp, s_out.size, level)
    fnr_u = cp_upper(fn, s_in.size, level)
    values = np.atleast_1d(_objective(kind, fpr_u, fnr_u, delta))
    i = int(np.argmax(values))
    return {
        "threshold": float(thresholds[i]),
        "value": float(values[i]),
        "fp": int(np.atleast_1d(fp)[i]),
        "fn": int(np.atleast_1d(fn)[i]),
        "fpr_upper": float(np.atleast_1d(fpr_u)[i]),
        "fnr_upper": float(np.atleast_1d(fnr_u)[i]),
    }


def threshold_bound(
    kind: str,
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    *,
    delta: float,
    confidence: float,
    threshold_selection: str = "bonferroni",
    seed: int | np.random.Generator | None = 0,
    n_candidates: int = 100,
) -> EpsilonBound:
    """The ``clopper_pearson`` or ``gdp`` bound (``kind``) with a threshold selection rule.

    Inputs are validated 1-d float arrays. Returns an ``EpsilonBound`` whose ``details``
    record the counts at the chosen threshold, the CP level used and the candidate count.
    """
    if threshold_selection not in SELECTIONS:
        raise ValueError(
            f"threshold_selection must be one of {SELECTIONS}, got {threshold_selection!r}"
        )
    if int(n_candidates) < 2:
        raise ValueError(f"n_candidates must be an integer >= 2, got {n_candidates!r}")
    beta = 1.0 - confidence
    s_in, s_out = np.sort(scores_in), np.sort(scores_out)
    details: dict = {"threshold_selection": threshold_selection}
    if threshold_selection == "bonferroni":
        cands = candidate_thresholds(s_in, s_out, n_candidates)
        level = beta / (2 * cands.size)
        best = _best(kind, s_in, s_out, cands, level, delta)
        details.update(n_thresholds=int(cands.size), n_eval_in=s_in.size, n_eval_out=s_out.size)
    elif threshold_selection == "naive":
        cands = np.unique(np.concatenate([s_in, s_out, [np.nextafter(s_out[-1], np.inf)]]))
        level = beta / 2
        best = _best(kind, s_in, s_out, cands, level, delta)
        details.update(n_thresholds=int(cands.size), warning="uncorrected: confidence invalid")
    else:  # split
        if s_in.size < 2 or s_out.size < 2:
            raise ValueError("threshold_selection='split' needs at least 2 scores on each side")
        rng = np.random.default_rng(seed)
        p_in, p_out = rng.permutation(scores_in), rng.permutation(scores_out)
        h_in, h_out = s_in.size // 2, s_out.size // 2
        sel_in, sel_out = np.sort(p_in[:h_in]), np.sort(p_out[:h_out])
        ev_in, ev_out = np.sort(p_in[h_in:]), np.sort(p_out[h_out:])
        cands = np.unique(np.concatenate([sel_in, sel_out, [np.nextafter(sel_out[-1], np.inf)]]))
        chosen = _best(kind, sel_in, sel_out, cands, beta / 2, delta)["threshold"]
        level = beta / 2
        best = _best(kind, ev_in, ev_out, np.array([chosen]), level, delta)
        details.update(n_thresholds=1, n_eval_in=ev_in.size, n_eval_out=ev_out.size)
    details.update(fp=best["fp"], fn=best["fn"], cp_level=level)
    mu_lower = None
    if kind == "clopper_pearson":
        eps = max(best["value"], 0.0)
    else:
        mu_lower = max(best["value"], 0.0)
        eps = gdp_epsilon(mu_lower, delta) if mu_lower > 0 else 0.0
    return EpsilonBound(
        epsilon=float(eps),
        method=kind,
        confidence=confidence,
        delta=delta,
        n_in=int(s_in.size),
        n_out=int(s_out.size),
        threshold=best["threshold"],
        fpr_upper=best["fpr_upper"],
        fnr_upper=best["fnr_upper"],
        mu_lower=mu_lower,
        valid=threshold_selection != "naive",
        details=details,
        assumption=ASSUME_GDP if kind == "gdp" else None,
    )
