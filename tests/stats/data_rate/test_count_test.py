"""The pre-registered rank count test (``stats.data_rate.count_test``): its exact p-value
against a direct integral and simulation, its level on mechanisms at the null's boundary
(continuous and tied scores), the certified epsilon's monotone search, the counts."""

import dataclasses

import numpy as np
import pytest
from scipy import integrate
from scipy.special import bdtrc
from scipy.stats import beta as beta_law

from dpaudit.stats.data_rate import (
    RankDesign,
    certify_epsilon,
    count,
    curve_p_value,
    dp_roc,
    null_p_value,
)

DELTA = 1e-5


def tight_scores(eps, n, member, rng, delta=DELTA):
    """The tight (eps, delta)-DP pair (randomised response with a delta atom on each side):
    its ROC, ties broken at random, is exactly the (eps, delta)-DP boundary."""
    e = np.exp(eps)
    p1 = (1 - delta) * e / (1 + e)
    u = rng.random(n)
    if member:
        return np.where(u < delta, 2.0, np.where(u < delta + p1, 1.0, 0.0))
    return np.where(u < delta, -1.0, np.where(u < delta + p1, 0.0, 1.0))


def test_one_sided_p_value_is_the_beta_binomial_integral_from_above():
    # "in" guesses only: p = E_x[P(Binomial(n_in, R(x)) >= s)], x ~ Beta(k + 1, n_out - k)
    d = RankDesign(4, None, 2000, 2500, 0.05)
    roc = dp_roc(2.0, DELTA)
    for s in (20, 40, 60):
        def f(x, s=s):
            return bdtrc(s - 1, 2000, float(roc(np.array([x]))[0])) * beta_law.pdf(x, 5, 2496)
        exact = integrate.quad(f, 0, 0.02, limit=400, points=[0.002, 0.004])[0]
        ours = null_p_value(d, s, roc)
        assert exact <= ours <= exact * 1.05 + 1e-12


def test_two_sided_p_value_dominates_the_worst_case_by_simulation():
    # the null's worst case at the boundary: x, y Beta; N, M binomial at the largest rates
    rng = np.random.default_rng(3)
    d = RankDesign(3, 5, 3000, 3000, 0.05)
    e = 2.0
    c = np.exp(e)
    x = rng.beta(4, 2997, 400_000)
    y = rng.beta(6, 2995, 400_000)
    n = rng.binomial(3000 - 6, np.minimum(c * x + DELTA, 1) / (1 - y))
    m = rng.binomial(3000 - 4, np.minimum(c * y + DELTA, 1) / (1 - x))
    for s in (60, 90, 120):
        mc = float(np.mean(n + m >= s))
        se = np.sqrt(mc * (1 - mc) / x.size) + 1e-6
        assert null_p_value(d, s, dp_roc(e, DELTA)) >= mc - 3 * se


@pytest.mark.slow
@pytest.mark.parametrize("design", [RankDesign(3, 3, 500, 500, 0.05),
                                    RankDesign(6, None, 500, 500, 0.05),
                                    RankDesign(None, 20, 500, 500, 0.05)])
def test_level_holds_at_the_boundary_laplace(design):
    # Laplace(mu) vs Laplace(0) is (mu + 2 log(1 - delta), delta)-DP, on the boundary at every
    # small rate: 2000 runs reject the true claim at most 5% + 3 s.e.
    rng = np.random.default_rng([7, design.k_hi or 0, design.k_lo or 0])
    mu = 2.0
    roc = dp_roc(mu + 2 * np.log1p(-DELTA), DELTA)
    reps, rejected = 2000, 0
    for _ in range(reps):
        c = count(rng.laplace(mu, 1, 500), rng.laplace(0, 1, 500), design)
        rejected += null_p_value(design, c, roc) <= 0.05
    assert rejected / reps <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps)


@pytest.mark.slow
def test_level_holds_on_tied_scores():
    # the tight pair: three values, massive ties broken by seeded uniforms (a fresh seed per
    # run: the uniforms are part of the test's randomness)
    rng = np.random.default_rng(11)
    d = RankDesign(2, 2, 500, 500, 0.05)
    roc = dp_roc(2.0, DELTA)
    reps, rejected = 2000, 0
    for r in range(reps):
        c = count(tight_scores(2.0, 500, True, rng), tight_scores(2.0, 500, False, rng),
                  dataclasses.replace(d, tie_seed=r))
        rejected += null_p_value(d, c, roc) <= 0.05
    assert rejected / reps <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps)


def test_counts_at_ranks_without_and_with_ties():
    rng = np.random.default_rng(5)
    s_in, s_out = rng.normal(1, 1, 300), rng.normal(0, 1, 400)
    d = RankDesign(7, 4, 300, 400, 0.05)
    c = count(s_in, s_out, d)
    assert np.sum(s_out > c.t_hi) == 7 and np.sum(s_in < c.t_lo) == 4
    assert c.n_hi == np.sum(s_in > c.t_hi) and c.m_lo == np.sum(s_out < c.t_lo)
    assert c.statistic == c.n_hi + c.m_lo
    tied = count(np.ones(300), np.ones(400), d)  # ties split at random: no crossing
    assert not tied.crossed and tied.statistic == tied.n_hi + tied.m_lo
    assert np.sum(tied.n_hi) + np.sum(tied.m_lo) >= 0
    with pytest.raises(ValueError, match="n_in=300"):
        count(s_in[:-1], s_out, d)


def test_certified_epsilon_is_rejected_and_just_above_is_not():
    rng = np.random.default_rng(6)
    d = RankDesign(3, 3, 2000, 2000, 0.05)
    res = certify_epsilon(rng.laplace(3, 1, 2000), rng.laplace(0, 1, 2000), d, delta=DELTA)
    assert 0 < res.epsilon < 3
    assert res.p_value <= 0.05
    bound = res.to_epsilon_bound()
    assert bound.certified and bound.epsilon == res.epsilon and bound.kind == "certified"
    s = res.counts
    assert null_p_value(d, s, dp_roc(res.epsilon + 2e-3, DELTA)) > 0.05
    # monotone in epsilon (nested nulls, one statistic)
    ps = [null_p_value(d, s, dp_roc(e, DELTA)) for e in np.linspace(0, 4, 21)]
    assert np.all(np.diff(ps) >= -1e-15)


def test_separated_scores_cross_the_thresholds_and_still_certify():
    # members far above non-members: t_lo (5th lowest member) > t_hi (8th highest non-member);
    # the "in" side alone at FALLBACK of the level still certifies a large epsilon
    rng = np.random.default_rng(12)
    d = RankDesign(7, 4, 2000, 2000, 0.05)
    res = certify_epsilon(rng.normal(20, 1, 2000), rng.normal(0, 1, 2000), d, delta=DELTA)
    assert res.counts.crossed and res.counts.n_hi == 2000
    one = certify_epsilon(rng.normal(20, 1, 2000), rng.normal(0, 1, 2000),
                          RankDesign(7, None, 2000, 2000, 0.0005), delta=DELTA, confidence=0.9995)
    assert res.epsilon == pytest.approx(one.epsilon, abs=2e-3) and res.epsilon > 5


def test_nothing_to_show_gives_zero():
    rng = np.random.default_rng(8)
    s = rng.normal(0, 1, 400)
    res = certify_epsilon(s[:200], s[200:], RankDesign(2, None, 200, 200, 0.05), delta=DELTA)
    assert res.epsilon == 0.0


def test_curve_p_value_is_the_dp_p_value_for_a_dp_curve():
    rng = np.random.default_rng(9)
    d = RankDesign(5, 5, 1000, 1000, 0.05)
    s_in, s_out = rng.laplace(2, 1, 1000), rng.laplace(0, 1, 1000)
    p, c = curve_p_value(s_in, s_out, d, dp_roc(1.5, DELTA))
    assert p == null_p_value(d, c, dp_roc(1.5, DELTA)) == null_p_value(d, c.statistic,
                                                                       dp_roc(1.5, DELTA))


@pytest.mark.parametrize("kwargs, name", [({"k_hi": None, "k_lo": None}, "neither"),
                                          ({"k_hi": 500}, "k_hi"), ({"k_lo": -1}, "k_lo"),
                                          ({"level": 1.0}, "level")])
def test_bad_designs_name_the_parameter(kwargs, name):
    args = {"k_hi": 1, "k_lo": 1, "n_in": 500, "n_out": 500, "level": 0.05} | kwargs
    with pytest.raises(ValueError, match=name):
        RankDesign(**args)
