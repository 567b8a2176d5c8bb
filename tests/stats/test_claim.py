"""The claim test: valid rejections, power, mu_lower and the effective-noise bound."""

import numpy as np
import pytest
from scipy.special import ndtr, ndtri

from dpaudit.stats import OrientationWarning
from dpaudit.stats.claim import claim_test, mu_lower_bound, noise_upper_bound


def gdp_curve(mu):
    return lambda a: ndtr(ndtri(1.0 - np.asarray(a)) - mu)


def test_a_true_gdp_claim_is_rarely_rejected():
    # 400 repetitions of 500 + 500 exact mu = 1 scores tested against the true curve:
    # false rejections <= 5% + 3 s.e. (s.e. of a 5% rate over 400 = 1.1%).
    rejected = 0
    for rep in range(400):
        rng = np.random.default_rng([11, rep])
        s_in, s_out = rng.normal(1.0, 1.0, 500), rng.normal(0.0, 1.0, 500)
        rejected += claim_test(s_in, s_out, gdp_curve(1.0), confidence=0.95).rejected
    assert rejected / 400 <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 400)


def test_an_understated_claim_is_rejected_with_a_witness():
    rng = np.random.default_rng(0)
    s_in, s_out = rng.normal(2.0, 1.0, 5000), rng.normal(0.0, 1.0, 5000)
    res = claim_test(s_in, s_out, gdp_curve(1.5), confidence=0.95)
    assert res.rejected and res.margin > 0
    x, y = (res.fpr_upper, res.fnr_upper)
    if res.order == "out vs in":  # the pair's other order: the roles of the errors swap
        x, y = y, x
    assert y < res.claimed_error
    assert res.claimed_error == pytest.approx(float(gdp_curve(1.5)(x)), rel=1e-9)
    mu_lb = mu_lower_bound(res.rows)
    assert 1.5 < mu_lb < 2.0  # certified: not mu-GDP below mu_lb, and below the truth


def test_reversed_scores_give_no_evidence_and_a_warning():
    rng = np.random.default_rng(1)
    s_in, s_out = rng.normal(-3.0, 1.0, 500), rng.normal(0.0, 1.0, 500)
    with pytest.warns(OrientationWarning):
        res = claim_test(s_in, s_out, gdp_curve(0.1))
    assert not res.rejected and "flipped" in res.note


def test_noise_upper_bound_matches_the_gdp_closed_form():
    # GDP family mu(sigma) = 10 / sigma: rejected exactly when 10 / sigma < mu_lb.
    rng = np.random.default_rng(2)
    s_in, s_out = rng.normal(2.0, 1.0, 3000), rng.normal(0.0, 1.0, 3000)
    res = claim_test(s_in, s_out, gdp_curve(1.0))
    mu_lb = mu_lower_bound(res.rows)
    closed = 10.0 / mu_lb
    found = noise_upper_bound(res.rows, lambda s: gdp_curve(10.0 / s), 3.0, rtol=1e-4)
    assert found == pytest.approx(closed, rel=2e-4)
    assert found >= closed  # the returned end of the bracket is a rejected sigma
    start_above = noise_upper_bound(res.rows, lambda s: gdp_curve(10.0 / s), 50.0, rtol=1e-4)
    assert start_above == pytest.approx(closed, rel=2e-4)


def test_noise_upper_bound_stops_at_sigma_min():
    # closed form 10 / mu_lb ~ 5.6: a floor above it is returned (it is rejected: "at most
    # the floor") and no curve below the floor is ever built; a floor below it changes nothing
    rng = np.random.default_rng(2)
    s_in, s_out = rng.normal(2.0, 1.0, 3000), rng.normal(0.0, 1.0, 3000)
    rows = claim_test(s_in, s_out, gdp_curve(1.0)).rows
    closed = 10.0 / mu_lower_bound(rows)
    seen = []

    def family(sigma):
        seen.append(sigma)
        return gdp_curve(10.0 / sigma)

    assert noise_upper_bound(rows, family, 20.0, sigma_min=8.0) == 8.0
    assert min(seen) == 8.0 and closed < 8.0
    low = noise_upper_bound(rows, family, 20.0, sigma_min=1.0, rtol=1e-4)
    assert low == pytest.approx(closed, rel=2e-4)
    with pytest.raises(ValueError, match="sigma_min"):
        noise_upper_bound(rows, family, 20.0, sigma_min=-1.0)


def test_no_evidence_gives_an_infinite_noise_bound():
    # Identical in and out scores: at every threshold FPR + FNR = 1, so the upper bounds sum
    # to more than 1 and no sigma, however large, is rejected.
    s = np.arange(100.0)
    res = claim_test(s, s, gdp_curve(1.0))
    assert not res.rejected and mu_lower_bound(res.rows) == 0.0
    assert noise_upper_bound(res.rows, lambda x: gdp_curve(10.0 / x), 5.0) == np.inf
    built = []  # and no curve is built to find it out (each may cost a privacy profile)
    assert noise_upper_bound(res.rows, lambda x: built.append(x) or gdp_curve(10.0 / x), 5.0) \
        == np.inf
    assert built == []


def test_claim_test_checks_its_inputs():
    with pytest.raises(ValueError, match="scores_in"):
        claim_test([], [1.0], gdp_curve(1.0))
    with pytest.raises(ValueError, match="confidence"):
        claim_test([1.0], [0.0], gdp_curve(1.0), confidence=1.5)
