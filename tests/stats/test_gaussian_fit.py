"""Parametric Gaussian-fit bound: tight on Gaussian scores, sound, and self-checking."""

import numpy as np
import pytest

from dpaudit.stats import GaussianAssumptionWarning, epsilon_lower_bound, gdp_epsilon


@pytest.mark.parametrize("mu", [0.5, 1.0, 1.7])
def test_tight_with_5000_per_side(mu):
    rng = np.random.default_rng(11)
    s_in, s_out = rng.standard_normal(5000) + mu, rng.standard_normal(5000)
    res = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="gaussian")
    truth = gdp_epsilon(mu, 1e-5)
    assert 0.85 * truth <= res.epsilon <= truth
    assert res.valid and res.details["gaussian_check"]["passed"]
    assert res.mu_lower < mu


def test_coverage_at_95_percent():
    # 400 repetitions of 100 + 100 scores at mu = 1: the fraction of bounds above the truth
    # must stay <= 5% + 3 binomial standard errors (3 * sqrt(.05 * .95 / 400) = 3.3%).
    rng = np.random.default_rng(3)
    truth = gdp_epsilon(1.0, 1e-5)
    above = 0
    for _ in range(400):
        s_in, s_out = rng.standard_normal(100) + 1.0, rng.standard_normal(100)
        res = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="gaussian", check_level=1e-9)
        above += res.epsilon > truth
    assert above / 400 <= 0.05 + 0.033


def test_scale_invariant():
    rng = np.random.default_rng(0)
    s_in, s_out = rng.standard_normal(300) + 1.0, rng.standard_normal(300)
    kw = {"delta": 1e-5, "method": "gaussian", "check_level": 1e-9}
    a = epsilon_lower_bound(s_in, s_out, **kw)
    b = epsilon_lower_bound(7 * s_in + 3, 7 * s_out + 3, **kw)
    assert a.epsilon == pytest.approx(b.epsilon, rel=1e-9)


def test_non_gaussian_scores_are_flagged():
    rng = np.random.default_rng(1)
    s_in, s_out = rng.exponential(size=3000) + 0.5, rng.exponential(size=3000)
    with pytest.warns(GaussianAssumptionWarning):
        res = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="gaussian")
    assert not res.valid and not res.details["gaussian_check"]["passed"]


def test_unequal_variances_are_flagged():
    rng = np.random.default_rng(2)
    s_in, s_out = 2.0 * rng.standard_normal(3000) + 1, rng.standard_normal(3000)
    with pytest.warns(GaussianAssumptionWarning):
        res = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="gaussian")
    assert res.details["gaussian_check"]["equal_variance_p"] < 0.01


def test_bad_input():
    with pytest.raises(ValueError, match="at least 3"):
        epsilon_lower_bound([1.0, 2.0], [0.0, 1.0, 2.0], delta=1e-5, method="gaussian")
    with pytest.raises(ValueError, match="check_level"):
        epsilon_lower_bound([1, 2, 3.0], [0, 1, 2.0], delta=1e-5, method="gaussian", check_level=2)
    with pytest.raises(ValueError, match="constant"):
        epsilon_lower_bound([1, 1, 1.0], [1, 1, 1.0], delta=1e-5, method="gaussian")


@pytest.mark.parametrize("n_small", [3, 10, 19])
def test_too_few_scores_for_the_normality_test_is_never_valid(n_small):
    # Below MIN_NORMALITY = 20 per side the normality test cannot run: the result is still
    # computed (an estimate) but marked invalid with the reason, never "counted as passed".
    rng = np.random.default_rng(5)
    s_in, s_out = rng.standard_normal(n_small) + 3.0, rng.standard_normal(500)
    with pytest.warns(GaussianAssumptionWarning, match="at least 20"):
        res = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="gaussian")
    check = res.details["gaussian_check"]
    assert not res.valid and not check["passed"] and check["normal_p_in"] is None
    assert "at least 20" in check["reason"] and f"n_in={n_small}" in check["reason"]
    assert res.assumption is not None and not res.certified and res.kind == "estimate"


def test_twenty_per_side_runs_the_checks():
    rng = np.random.default_rng(6)
    s_in, s_out = rng.standard_normal(20) + 1.0, rng.standard_normal(20)
    res = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="gaussian", check_level=1e-9)
    check = res.details["gaussian_check"]
    assert check["normal_p_in"] is not None and check["normal_p_out"] is not None
    assert res.valid and check["passed"] and "reason" not in check
    assert res.assumption is not None and res.kind == "estimate"
