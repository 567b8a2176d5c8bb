"""The anchor's GDP estimate (Annamalai & De Cristofaro 2024) against their procedure written
out threshold by threshold with scipy's binomtest, and its place among the methods."""

import numpy as np
import pytest
from scipy.optimize import root_scalar
from scipy.stats import binomtest, norm

from dpaudit.stats import epsilon_lower_bound
from dpaudit.stats.anchor_gdp import anchor_gdp_bound


def _their_procedure(scores, labels, alpha, delta):
    """utils/audit.py's compute_eps_lower_from_mia with method 'GDP', as published."""
    best = None
    for t in np.sort(np.unique(scores)):
        fp = int(np.sum(scores[labels == 0] >= t))
        fn = int(np.sum(scores[labels == 1] < t))
        _, fpr_r = binomtest(fp, int(np.sum(labels == 0))).proportion_ci(1 - 2 * alpha)
        _, fnr_r = binomtest(fn, int(np.sum(labels == 1))).proportion_ci(1 - 2 * alpha)
        mu = norm.ppf(1 - fpr_r) - norm.ppf(fnr_r)
        if mu < 0:
            eps = 0.0
        else:
            def eq6(e, mu=mu):
                return (norm.cdf(-e / mu + mu / 2) - np.exp(e) * norm.cdf(-e / mu - mu / 2)
                        - delta)
            try:
                eps = root_scalar(eq6, bracket=[0, 50], method="brentq").root
            except ValueError:
                eps = 0.0
        best = eps if best is None else max(best, eps)
    return best


@pytest.mark.parametrize("mu,n", [(1.0, 30), (2.5, 40), (0.0, 25)])
def test_matches_their_procedure(mu, n):
    rng = np.random.default_rng(int(10 * mu) + n)
    s_in, s_out = rng.normal(mu, 1, n), rng.normal(0, 1, n + 3)
    scores = np.concatenate([s_in, s_out])
    labels = np.concatenate([np.ones(n), np.zeros(n + 3)])
    want = _their_procedure(scores, labels, 0.05, 1e-5)
    got = anchor_gdp_bound(s_in, s_out, delta=1e-5, confidence=0.95)
    assert got.epsilon == pytest.approx(want, abs=1e-6)


def test_an_estimate_that_never_counts_as_a_bound():
    rng = np.random.default_rng(0)
    res = epsilon_lower_bound(rng.normal(2, 1, 100), rng.normal(0, 1, 100), delta=1e-5,
                              method="anchor_gdp")
    assert res.kind == "estimate" and not res.valid and not res.certified
    assert "uncorrected" in res.details["warning"] and res.details["alpha"] == 0.05
    # ties: the rule score >= t puts a tied non-member among the guessed members
    tied = anchor_gdp_bound(np.ones(10), np.ones(10), delta=1e-5, confidence=0.95)
    assert tied.epsilon == 0.0


def test_perfect_separation_at_100_per_side():
    """The most 100 + 100 trainings can show: mu = 2 Phi^-1(1 - CP(0, 100)) = 3.776."""
    res = anchor_gdp_bound(np.ones(100), np.zeros(100), delta=1e-5, confidence=0.95)
    assert res.mu_lower == pytest.approx(3.776, abs=1e-3)
