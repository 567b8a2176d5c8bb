"""Parametric Gaussian fit: a GDP lower bound from means and variances (method ``"gaussian"``).

When the attack scores are Gaussian with a common variance — as the epoch-summed scalar score
of a gradient canary on a coordinate the data never touch is — the mechanism seen by the
attack is exactly mu-GDP with mu = (m_in - m_out) / s. A confidence bound on mu needs far fewer
samples than the nonparametric threshold methods, which must resolve tiny FPRs.

Bound (all parts jointly at level 1 - beta by a union bound): Welch lower bound on
m_in - m_out at level beta/2, chi-square upper bounds on each side's standard deviation at
beta/4 each, mu_lb = max(0, diff_lb) / max(sd_upper), eps = eps_GDP(mu_lb, delta).

It stays an estimate (``assumption`` = ``ASSUME_GAUSSIAN_SCORES``) whatever the checks say.
The model is checked, not assumed silently: D'Agostino-Pearson normality tests on each side and
a two-sided F test of the variance ratio. Their p-values go into ``details["gaussian_check"]``;
when any is below ``check_level / 3`` (family-wise level ``check_level``) the result is marked
``valid=False`` and a ``GaussianAssumptionWarning`` is raised, so a report can say the
parametric number should not be trusted.

Minimum sizes: at least ``MIN_FIT`` = 3 scores per side to compute anything (ValueError
below), and at least ``MIN_NORMALITY`` = 20 per side for the normality test (its kurtosis part
is not valid below 20). With fewer, the checks could not run: the result is ``valid=False``
with the reason in ``details["gaussian_check"]["reason"]``, never counted as passed.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats as st

from dpaudit._validate import check_scores
from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.stats.result import ASSUME_GAUSSIAN_SCORES, EpsilonBound

MIN_FIT = 3
MIN_NORMALITY = 20


class GaussianAssumptionWarning(UserWarning):
    """The scores fail a normality or equal-variance check: the Gaussian fit is not trusted."""


def gaussian_checks(s_in: np.ndarray, s_out: np.ndarray) -> dict:
    """p-values of normality (each side) and equal variance (F test, two-sided).

    A side with fewer than ``MIN_NORMALITY`` scores gets ``None`` (test not run); the variance
    test needs at least 2 scores per side.
    """
    s_in, s_out = check_scores(s_in, "s_in"), check_scores(s_out, "s_out")
    for name, s in (("s_in", s_in), ("s_out", s_out)):
        if s.size < 2:
            raise ValueError(f"{name} needs at least 2 scores for the variance test, got {s.size}")
    out = {}
    for name, s in (("in", s_in), ("out", s_out)):
        out[f"normal_p_{name}"] = (
            float(st.normaltest(s).pvalue) if s.size >= MIN_NORMALITY else None
        )
    f = np.var(s_in, ddof=1) / np.var(s_out, ddof=1)
    cdf = st.f.cdf(f, s_in.size - 1, s_out.size - 1)
    out["variance_ratio"] = float(f)
    out["equal_variance_p"] = float(min(1.0, 2 * min(cdf, 1 - cdf)))
    return out


def gaussian_bound(
    s_in: np.ndarray,
    s_out: np.ndarray,
    *,
    delta: float,
    confidence: float,
    check_level: float = 0.01,
) -> EpsilonBound:
    """Epsilon estimate under the Gaussian equal-variance model (see module docstring)."""
    if s_in.size < MIN_FIT or s_out.size < MIN_FIT:
        raise ValueError(f"method='gaussian' needs at least {MIN_FIT} scores on each side")
    if not 0.0 < float(check_level) < 1.0:
        raise ValueError(f"check_level must lie in (0, 1), got {check_level!r}")
    beta = 1.0 - confidence
    n1, n0 = s_in.size, s_out.size
    v1, v0 = np.var(s_in, ddof=1), np.var(s_out, ddof=1)
    se = np.sqrt(v1 / n1 + v0 / n0)
    df = se**4 / ((v1 / n1) ** 2 / (n1 - 1) + (v0 / n0) ** 2 / (n0 - 1)) if se > 0 else n1 + n0
    diff = float(np.mean(s_in) - np.mean(s_out))
    diff_lb = diff - float(st.t.ppf(1 - beta / 2, df)) * se
    sd_ub = max(
        np.sqrt(v * (n - 1) / st.chi2.ppf(beta / 4, n - 1)) for v, n in ((v1, n1), (v0, n0))
    )
    if sd_ub == 0.0:
        raise ValueError("scores_in and scores_out are constant: a Gaussian fit is undefined")
    mu_lb = max(0.0, diff_lb) / sd_ub
    checks = gaussian_checks(s_in, s_out)
    pvals = [p for k, p in checks.items() if k.endswith("_p") or "_p_" in k]
    checks["check_level"] = check_level
    if min(n1, n0) < MIN_NORMALITY:
        passed = False
        checks["reason"] = (
            f"the normality test needs at least {MIN_NORMALITY} scores per side "
            f"(got n_in={n1}, n_out={n0}): the Gaussian model could not be checked"
        )
    else:
        passed = all(p >= check_level / len(pvals) for p in pvals)
        if not passed:
            checks["reason"] = f"a normality or equal-variance test rejects at {check_level}"
    checks["passed"] = passed
    if not passed:
        warnings.warn(
            f"{checks['reason']} ({checks}); the 'gaussian' estimate is not trustworthy here",
            GaussianAssumptionWarning,
            stacklevel=3,
        )
    eps = gdp_epsilon(mu_lb, delta) if mu_lb > 0 else 0.0
    return EpsilonBound(
        epsilon=eps,
        method="gaussian",
        confidence=confidence,
        delta=delta,
        n_in=n1,
        n_out=n0,
        mu_lower=mu_lb,
        valid=passed,
        assumption=ASSUME_GAUSSIAN_SCORES,
        details={
            "mu_hat": diff / np.sqrt(0.5 * (v1 + v0)),
            "mean_diff": diff,
            "mean_diff_lower": diff_lb,
            "sd_upper": sd_ub,
            "gaussian_check": checks,
        },
    )
