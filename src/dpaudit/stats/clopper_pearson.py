"""Threshold attacks to (epsilon, delta): Clopper-Pearson bounds and the GDP fit (DESIGN 4.5).

A threshold strategy (module ``threshold_selection``, default ``Bonferroni()``) gives rows
whose upper bounds FPR_u, FNR_u on the true error rates hold jointly with probability
>= 1 - beta.
Two lower bounds follow:

* ``clopper_pearson``: eps = max over rows of
  max(log((1 - delta - FNR_u) / FPR_u), log((1 - delta - FPR_u) / FNR_u)) (Jagielski et al.
  2020), valid for any mechanism; delta = 0 (pure DP) is allowed.
* ``gdp`` (Nasr et al. 2023): a lower bound mu_lb on the GDP parameter, then eps(delta) of
  mu_lb-GDP. This assumes the mechanism's trade-off curve is GDP-shaped (an estimate). With
  the default one-sided order-statistic candidates each candidate is tested JOINTLY against the
  mu-GDP curve (``joint_gdp_mu``): the own side's true rate has an exact Beta law and the other
  side's count is binomial, so the two sources of noise are combined instead of each paying
  for half the error budget. Other strategies use mu_lb = max over rows of z(1 - FPR_u) -
  z(FNR_u).
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from dpaudit._validate import check_delta, check_rates
from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.stats.joint_gdp import joint_gdp_mu
from dpaudit.stats.result import ASSUME_GDP, EpsilonBound
from dpaudit.stats.threshold_selection import (
    DEFAULT_SELECTION,
    Bonferroni,
    check_selection,
    cp_upper,
)

__all__ = ["cp_upper", "eps_from_rates", "joint_gdp_mu", "mu_from_rates", "threshold_bound"]


def eps_from_rates(fpr, fnr, delta: float):
    """(eps, delta)-DP lower bound implied by error rates: both directions of the DP inequality.

    Returns max(log((1 - delta - fnr) / fpr), log((1 - delta - fpr) / fnr)) clipped at 0
    (arrays broadcast). A zero rate with positive numerator gives +inf (caller's job to avoid).
    """
    fpr = check_rates(fpr, "fpr")
    fnr = check_rates(fnr, "fnr")
    delta = check_delta(delta, zero_ok=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0)) - np.log(fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0)) - np.log(fnr)
    out = np.maximum(np.nan_to_num(np.maximum(a, b), nan=0.0, neginf=0.0), 0.0)
    return float(out) if out.ndim == 0 else out


def mu_from_rates(fpr, fnr):
    """GDP parameter implied by error rates: z(1 - fpr) - z(fnr) (Nasr et al. 2023)."""
    fpr, fnr = check_rates(fpr, "fpr"), check_rates(fnr, "fnr")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = ndtri(1.0 - fpr) - ndtri(fnr)
    out = np.nan_to_num(out, nan=-np.inf)
    return float(out) if out.ndim == 0 else out


def threshold_bound(
    kind: str,
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    *,
    delta: float,
    confidence: float,
    selection=DEFAULT_SELECTION,
) -> EpsilonBound:
    """The ``clopper_pearson`` or ``gdp`` bound (``kind``) with a threshold strategy.

    Inputs are validated 1-d float arrays. ``details`` record the strategy, the counts at the
    chosen threshold, the per-bound CP level and the number of rows.
    """
    selection = check_selection(selection)
    beta = 1.0 - confidence
    s_in, s_out = np.sort(scores_in), np.sort(scores_out)
    if kind == "clopper_pearson":

        def objective(f, g):
            return eps_from_rates(f, g, delta)
    else:
        objective = mu_from_rates
    rb = selection.rate_bounds(s_in, s_out, beta, objective)
    rows = np.atleast_1d(objective(rb.fpr_upper, rb.fnr_upper))
    i = int(np.argmax(rows))
    details: dict = {
        "selection": rb.strategy,
        "n_thresholds": int(rb.thresholds.size),
        "cp_level": rb.level,
        "n_eval_in": rb.n_in,
        "n_eval_out": rb.n_out,
    }
    if not selection.valid:
        details["warning"] = "uncorrected threshold choice: the confidence is not valid"
    mu_lower = None
    if kind == "clopper_pearson":
        eps = max(float(rows[i]), 0.0)
    elif isinstance(selection, Bonferroni):
        mu, j = joint_gdp_mu(selection.candidates(s_in, s_out), 2.0 * rb.level)
        details.update(test="joint (own-side Beta law x binomial)", mu_rows=float(max(rows[i], 0)))
        if j is not None:
            i = j
        mu_lower = mu
        eps = gdp_epsilon(mu_lower, delta) if mu_lower > 0 else 0.0
    else:
        mu_lower = max(float(rows[i]), 0.0)
        eps = gdp_epsilon(mu_lower, delta) if mu_lower > 0 else 0.0
    details.update(fp=int(rb.fp[i]), fn=int(rb.fn[i]))
    return EpsilonBound(
        epsilon=float(eps),
        method=kind,
        confidence=confidence,
        delta=delta,
        n_in=int(s_in.size),
        n_out=int(s_out.size),
        threshold=float(rb.thresholds[i]),
        fpr_upper=float(rb.fpr_upper[i]),
        fnr_upper=float(rb.fnr_upper[i]),
        mu_lower=mu_lower,
        valid=bool(selection.valid),
        details=details,
        assumption=ASSUME_GDP if kind == "gdp" else None,
    )
