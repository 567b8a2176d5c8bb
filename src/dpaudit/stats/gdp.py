"""Gaussian differential privacy algebra (DESIGN 4.1).

mu-GDP means distinguishing the neighbouring outputs is as hard as telling N(0, 1) from
N(mu, 1). These helpers convert between mu and (epsilon, delta), and give the ROC of the
optimal test. They are accurate for mu in [0.01, 20] and delta down to 1e-10 (computed in
log space where terms under- or overflow).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr, ndtri

from dpaudit._validate import (
    check_nonnegative,
    check_open_unit,
    check_positive,
    check_rates,
    check_real_array,
)

_MU_MAX = 200.0


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(eps) of a mu-GDP mechanism: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    mu = check_positive(mu, "mu")
    eps = check_nonnegative(epsilon, "epsilon")
    a = -eps / mu + mu / 2.0
    b = -eps / mu - mu / 2.0
    first = np.exp(log_ndtr(a))
    second = np.exp(eps + log_ndtr(b))
    return float(max(first - second, 0.0))


def _log_gdp_delta(mu: float, eps: float) -> float:
    """log delta(eps), stable for tiny delta: lPhi(a) + log(1 - e^{eps + lPhi(b) - lPhi(a)})."""
    a = -eps / mu + mu / 2.0
    b = -eps / mu - mu / 2.0
    la = log_ndtr(a)
    ratio = eps + log_ndtr(b) - la  # log of second/first, always < 0
    return float(la + np.log(-np.expm1(min(ratio, -1e-300))))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon >= 0 such that a mu-GDP mechanism is (epsilon, delta)-DP."""
    mu = check_positive(mu, "mu")
    delta = check_open_unit(delta, "delta")
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    target = np.log(delta)
    hi = max(1.0, mu * mu)
    while _log_gdp_delta(mu, hi) > target:
        hi *= 2.0
        if hi > 1e6:
            raise ValueError(f"epsilon for mu={mu}, delta={delta} exceeds 1e6")
    return float(brentq(lambda e: _log_gdp_delta(mu, e) - target, 0.0, hi, xtol=1e-12, rtol=1e-12))


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest mu such that mu-GDP implies (epsilon, delta)-DP (inverse of ``gdp_epsilon``)."""
    eps = check_nonnegative(epsilon, "epsilon")
    delta = check_open_unit(delta, "delta")
    target = np.log(delta)
    lo, hi = 1e-8, 1.0
    if _log_gdp_delta(lo, eps) > target:
        return 0.0
    while _log_gdp_delta(hi, eps) < target:
        hi *= 2.0
        if hi > _MU_MAX:
            raise ValueError(f"mu for epsilon={epsilon}, delta={delta} exceeds {_MU_MAX}")
    return float(brentq(lambda m: _log_gdp_delta(m, eps) - target, lo, hi, xtol=1e-12, rtol=1e-12))


def gdp_tradeoff(alpha, mu: float):
    """ROC of the optimal mu-GDP test: the largest TPR at FPR alpha, Phi(z_alpha + mu).

    This is 1 - f(alpha) for the f-DP trade-off function f = G_mu; ``alpha`` may be an array.
    """
    mu = check_nonnegative(mu, "mu")
    a = check_rates(alpha, "alpha")
    out = ndtr(ndtri(a) + mu)
    return float(out) if out.ndim == 0 else out


def gdp_auc(mu: float) -> float:
    """Area under the mu-GDP ROC: Phi(mu / sqrt 2)."""
    return float(ndtr(check_nonnegative(mu, "mu") / np.sqrt(2.0)))


def gdp_advantage(mu: float) -> float:
    """Maximal membership advantage TPR - FPR of a mu-GDP mechanism: 2 Phi(mu/2) - 1."""
    return float(2.0 * ndtr(check_nonnegative(mu, "mu") / 2.0) - 1.0)


def gdp_compose(mus) -> float:
    """mu of the composition of independent Gaussian tests: sqrt(sum mu_t^2)."""
    m = check_real_array(mus, "mus")
    if np.any(m < 0):
        raise ValueError(f"mus must be finite and non-negative, got {mus!r}")
    return float(np.sqrt(np.sum(m * m)))
