"""Threshold strategies: hand-computed CP numbers (Fixed, Split), the default candidate rule,
joint coverage of Bonferroni's rows by simulation (and Naive's failure), and the joint GDP test."""

import numpy as np
import pytest
from scipy import stats

import dpaudit.stats as dstats
from dpaudit.stats import (
    DEFAULT_SELECTION,
    Bonferroni,
    FixedThreshold,
    Naive,
    RateBounds,
    Split,
    cp_upper,
    epsilon_lower_bound,
)
from dpaudit.stats.threshold_selection import check_selection, default_ranks

BETA = 0.05


def test_exports_and_default():
    for name in ("Bonferroni", "Split", "FixedThreshold", "Naive", "RateBounds"):
        assert name in dstats.__all__
    assert DEFAULT_SELECTION == Bonferroni() and "DEFAULT_SELECTION" in dstats.__all__
    with pytest.raises(ValueError, match="selection"):
        check_selection("bonferroni")


def test_fixed_threshold_by_hand():
    # member iff score >= 4.5: no non-member reaches it (fp = 0 of 4), 4 of the 5 members fall
    # below it (fn = 4 of 5). One-sided CP at beta / 2 each, in closed form:
    # k = 0: 1 - a^(1/n); k = n - 1: (1 - a)^(1/n).
    s_in = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    s_out = np.array([0.0, 1.0, 2.0, 3.0])
    rb = FixedThreshold(4.5).rate_bounds(s_in, s_out, BETA)
    a = BETA / 2
    assert isinstance(rb, RateBounds) and rb.level == a
    assert rb.fp.tolist() == [0] and rb.fn.tolist() == [4] and (rb.n_out, rb.n_in) == (4, 5)
    assert rb.fpr_upper[0] == pytest.approx(1 - a ** (1 / 4))
    assert rb.fnr_upper[0] == pytest.approx((1 - a) ** (1 / 5))
    # epsilon_lower_bound reads the same row: eps = log((1 - delta - FNR_u) / FPR_u), delta = 0
    res = epsilon_lower_bound(
        s_in, s_out, delta=0.0, method="clopper_pearson", selection=FixedThreshold(4.5)
    )
    fpr_u, fnr_u = 1 - a ** (1 / 4), (1 - a) ** (1 / 5)
    assert res.epsilon == pytest.approx(max(np.log((1 - fnr_u) / fpr_u), 0.0))
    with pytest.raises(ValueError, match="value"):
        FixedThreshold(np.inf)


@pytest.mark.parametrize(("fraction", "n_eval"), [(0.5, 3), (1 / 3, 4)])
def test_split_by_hand(fraction, n_eval):
    # Constant scores on each side: whatever the permutation, the certifying part has n_eval
    # scores per side and the chosen threshold separates them: fp = fn = 0 there.
    s_in, s_out = np.full(6, 5.0), np.zeros(6)
    rb = Split(seed=3, fraction=fraction).rate_bounds(s_in, s_out, BETA)
    a = BETA / 2
    assert (rb.n_out, rb.n_in) == (n_eval, n_eval) and rb.level == a
    assert rb.fp.tolist() == [0] and rb.fn.tolist() == [0] and 0.0 < rb.thresholds[0] <= 5.0
    assert rb.fpr_upper[0] == pytest.approx(1 - a ** (1 / n_eval))
    assert rb.fnr_upper[0] == pytest.approx(1 - a ** (1 / n_eval))
    with pytest.raises(ValueError, match="fraction"):
        Split(fraction=1.0)
    with pytest.raises(ValueError, match="at least 2"):
        Split().rate_bounds(np.array([1.0]), s_out, BETA)


def test_split_uses_the_objective_and_is_seeded():
    rng = np.random.default_rng(0)
    s_in, s_out = np.sort(rng.normal(2, 1, 400)), np.sort(rng.normal(0, 1, 400))
    a = Split(seed=1).rate_bounds(s_in, s_out, BETA)
    assert np.array_equal(a.thresholds, Split(seed=1).rate_bounds(s_in, s_out, BETA).thresholds)
    assert not np.array_equal(a.thresholds, Split(seed=2).rate_bounds(s_in, s_out, BETA).thresholds)
    # an objective that only rewards a tiny FPR bound pushes the threshold up
    low_fpr = Split(seed=1).rate_bounds(s_in, s_out, BETA, objective=lambda f, g: -f)
    assert low_fpr.thresholds[0] > a.thresholds[0] and low_fpr.fp[0] < a.fp[0]


def test_default_ranks_rule():
    assert default_ranks(1000).tolist() == [0, 3, 15, 62, 249]
    assert default_ranks(100).tolist() == [0, 2, 8, 24]
    assert default_ranks(1).tolist() == [0]
    for n in (2, 7, 50, 10_000, 200_000):
        r = default_ranks(n)
        assert r[0] == 0 and np.all(np.diff(r) > 0) and r[-1] <= max(n // 4, 1)


def test_bonferroni_rows_structure():
    rng = np.random.default_rng(1)
    s_in, s_out = np.sort(rng.normal(1, 1, 1000)), np.sort(rng.normal(0, 1, 1000))
    rb = Bonferroni().rate_bounds(s_in, s_out, BETA)
    ranks = default_ranks(1000)
    m = 2 * ranks.size
    assert rb.thresholds.size == m and rb.level == pytest.approx(BETA / (2 * m))
    out_rows, in_rows = slice(0, ranks.size), slice(ranks.size, m)
    assert rb.fp[out_rows].tolist() == ranks.tolist()  # k false positives by construction
    assert rb.fn[in_rows].tolist() == ranks.tolist()  # k false negatives by construction
    np.testing.assert_allclose(rb.fpr_upper[out_rows], cp_upper(ranks, 1000, rb.level))
    np.testing.assert_allclose(rb.fnr_upper[out_rows], cp_upper(rb.fn[out_rows], 1000, rb.level))
    custom = Bonferroni(ranks=(0, 5, 5000)).rate_bounds(s_in, s_out, BETA)
    assert custom.thresholds.size == 4  # rank 5000 does not exist with 1000 scores
    with pytest.raises(ValueError, match="ranks"):
        Bonferroni(ranks=(-1,))


def _joint_failures(strategy, reps, n_in, n_out, mu, beta, seed):
    """Repetitions where some row's TRUE rate exceeds its bound (N(mu,1) vs N(0,1) scores)."""
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(reps):
        s_in, s_out = np.sort(rng.normal(mu, 1, n_in)), np.sort(rng.normal(0, 1, n_out))
        rb = strategy.rate_bounds(s_in, s_out, beta)
        true_fpr = stats.norm.sf(rb.thresholds)  # P(S_out >= t)
        true_fnr = stats.norm.cdf(rb.thresholds - mu)  # P(S_in < t)
        fails += bool(np.any((true_fpr > rb.fpr_upper) | (true_fnr > rb.fnr_upper)))
    return fails / reps


@pytest.mark.parametrize(("mu", "n_in", "n_out"), [(0.0, 30, 30), (1.0, 20, 40)])
def test_bonferroni_joint_coverage(mu, n_in, n_out):
    reps, beta = 2000, 0.2  # a large beta makes an undercoverage visible with 2000 repetitions
    frac = _joint_failures(Bonferroni(), reps, n_in, n_out, mu, beta, seed=11)
    assert frac <= beta + 3 * np.sqrt(beta * (1 - beta) / reps)


def test_naive_rows_fail_jointly():
    reps, beta = 500, 0.2
    frac = _joint_failures(Naive(), reps, 30, 30, 0.0, beta, seed=12)
    assert frac > beta + 3 * np.sqrt(beta * (1 - beta) / reps)  # why it is marked invalid
    assert (
        Naive.valid is False
        and "INVALID"
        in Naive().rate_bounds(np.array([1.0, 2.0]), np.array([0.0, 1.0]), beta).strategy
    )


def test_joint_gdp_coverage_without_signal():
    # Identical score distributions: the mechanism seen by the attack is 0-GDP, so any
    # mu_lower > 0 is a false claim; it must happen in at most beta (+ 3 s.e.) of repetitions.
    rng = np.random.default_rng(13)
    reps, conf = 300, 0.8
    false = 0
    for _ in range(reps):
        s_in, s_out = rng.normal(0, 1, 40), rng.normal(0, 1, 40)
        res = epsilon_lower_bound(s_in, s_out, delta=1e-5, confidence=conf, method="gdp")
        false += res.mu_lower > 0
    beta = 1 - conf
    assert false / reps <= beta + 3 * np.sqrt(beta * (1 - beta) / reps)
