"""Annamalai & De Cristofaro's GDP figure (NeurIPS 2024), as their code computes it: an estimate.

"Nearly tight black-box auditing of differentially private machine learning" reports
epsilon_emp from the scores of 200 trainings (100 with the canary, 100 without) by
(``utils/audit.py`` of spalabucr/bb-audit-dpsgd):

1. at every threshold t among the scores (rule: score >= t means "member"), Clopper-Pearson
   upper ends of the false-positive and false-negative rates, each two-sided at 1 - 2 alpha
   (so each one-sided at 1 - alpha; alpha = 0.05);
2. mu_t = Phi^-1(1 - FPR_u) - Phi^-1(FNR_u), the GDP parameter those rates imply;
3. epsilon of mu-GDP at delta for the largest mu_t, over every threshold, with no correction
   for having chosen it after looking at the scores.

It assumes a GDP-shaped trade-off curve, and the threshold maximised over every score is not
covered by the rates' confidence: the number is an **estimate**, never a bound (``valid`` is
False, so the verdict never rests on it). dpaudit's certified figure on the same scores is
``clopper_pearson`` with a corrected threshold choice (``threshold_selection``). Registered
as ``anchor_gdp`` so an audit reports both on the same scores, like with like.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from dpaudit._validate import check_open_unit
from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.stats.result import EpsilonBound
from dpaudit.stats.threshold_selection import cp_upper

ANCHOR_ALPHA = 0.05  # the anchor's significance level (their --alpha default)
ASSUME_ANCHOR_GDP = (
    "GDP-shaped trade-off curve, threshold maximised over every score without correction "
    "(Annamalai & De Cristofaro 2024's estimator: Clopper-Pearson rates at 1 - alpha each)"
)


def anchor_gdp_bound(scores_in: np.ndarray, scores_out: np.ndarray, *, delta: float,
                     confidence: float, alpha: float = ANCHOR_ALPHA) -> EpsilonBound:
    """The anchor's GDP estimate (module doc) of member / non-member scores at ``delta``.

    Args:
        scores_in, scores_out: finite 1-d scores, higher meaning "member".
        delta: the delta of the epsilon reported.
        confidence: recorded only; the anchor's own ``alpha`` sets each rate's level.
        alpha: each rate's one-sided Clopper-Pearson level (the anchor's 0.05).
    """
    alpha = check_open_unit(alpha, "alpha")
    s_in, s_out = np.sort(scores_in), np.sort(scores_out)
    n_in, n_out = s_in.size, s_out.size
    t = np.unique(np.concatenate([s_in, s_out]))
    fp = n_out - np.searchsorted(s_out, t, side="left")  # non-members with score >= t
    fn = np.searchsorted(s_in, t, side="left")  # members with score < t
    fpr_u, fnr_u = cp_upper(fp, n_out, alpha), cp_upper(fn, n_in, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = np.nan_to_num(ndtri(1.0 - fpr_u) - ndtri(fnr_u), nan=-np.inf)
    i = int(np.argmax(mu))
    best = float(mu[i])
    eps = gdp_epsilon(best, delta) if best > 0 else 0.0
    return EpsilonBound(
        epsilon=float(eps), method="anchor_gdp", confidence=confidence, delta=delta,
        n_in=int(n_in), n_out=int(n_out), threshold=float(t[i]), fpr_upper=float(fpr_u[i]),
        fnr_upper=float(fnr_u[i]), mu_lower=max(best, 0.0), valid=False,
        details={"alpha": alpha, "thresholds": int(t.size), "fp": int(fp[i]), "fn": int(fn[i]),
                 "warning": "uncorrected threshold choice (every score): not a bound"},
        assumption=ASSUME_ANCHOR_GDP,
    )
