"""Distributions, mechanisms, scores and closed-form theory of dpaudit.meanlab.

Monte-Carlo checks use a tolerance of 4 standard errors, each computed in the test from the
binomial / normal variance of the quantity estimated.
"""

import numpy as np
import pytest
from scipy.special import ndtr

from dpaudit.meanlab import (
    ExactMean,
    NoisyMean,
    PoissonSubsampledMean,
    SubsampledMean,
    bernoulli_from_p,
    bernoulli_product,
    easy_target,
    gaussian_product,
    hard_target,
    make_target,
    product_distribution,
)
from dpaudit.meanlab import scores as sc
from dpaudit.meanlab import theory as th
from dpaudit.stats import gdp_delta, gdp_epsilon

K_SE = 4.0


def test_bernoulli_targets_and_leakage_closed_form():
    p = np.array([0.3, 0.6, 0.5, 0.7])
    dist = bernoulli_from_p(p)
    np.testing.assert_array_equal(easy_target(dist), [1, 0, 1, 0])
    np.testing.assert_array_equal(hard_target(dist), [0, 1, 0, 1])
    n = 10
    m_easy = ((0.7 / 0.3) + (0.6 / 0.4) + 1.0 + (0.7 / 0.3)) / n  # (1 - p)/p or p/(1 - p)
    assert th.leakage_score(dist.mean, dist.var, easy_target(dist), n) == pytest.approx(m_easy)
    m_hard = ((0.3 / 0.7) + (0.4 / 0.6) + 1.0 + (0.3 / 0.7)) / n
    assert th.leakage_score(dist.mean, dist.var, hard_target(dist), n) == pytest.approx(m_hard)


def test_papers_setting_leakage_scores():
    # p ~ U[0.25, 0.75]: E[m*_easy] = tau * 4 (ln 2 - 1/4), E[m*_hard] = tau * 4 (ln 1.5 - 1/4).
    dist = bernoulli_product(20000, 0.25, 0)
    n = 4000
    easy = th.leakage_score(dist.mean, dist.var, easy_target(dist), n)
    hard = th.leakage_score(dist.mean, dist.var, hard_target(dist), n)
    assert easy == pytest.approx(5 * 4 * (np.log(2) - 0.25), rel=0.02)
    assert hard == pytest.approx(5 * 4 * (np.log(1.5) - 0.25), rel=0.02)
    med = th.leakage_score(dist.mean, dist.var, make_target(dist, "medium", 1), n)
    assert med == pytest.approx(th.average_target_m(20000, n), rel=0.05)


@pytest.mark.parametrize("kind", ["bernoulli", "gaussian"])
def test_sample_sum_moments(kind):
    rng = np.random.default_rng(0)
    if kind == "bernoulli":
        dist = bernoulli_from_p(rng.uniform(0.2, 0.8, 50))
    else:
        dist = gaussian_product(rng.normal(size=50), rng.uniform(0.5, 2.0, 50))
    counts = np.array([[3], [40]] * 2000)
    s = dist.sample_sum(rng, counts, counts.shape[0])
    for c in (3, 40):
        rows = s[counts[:, 0] == c]
        se = np.sqrt(c * dist.var / rows.shape[0])
        assert np.all(np.abs(rows.mean(0) - c * dist.mean) < K_SE * se)
        z = (rows.var(0, ddof=1) / (c * dist.var) - 1) / np.sqrt(2 / rows.shape[0])
        assert np.abs(z.mean()) * np.sqrt(50) < K_SE  # average of 50 standardised errors


def test_custom_family_row_fallback_matches_moments():
    # Uniform[0, 2 u_j]: mean u_j, var u_j^2 / 3; no sum sampler, so rows are drawn and masked.
    u = np.array([0.5, 1.0, 2.0])
    dist = product_distribution(
        u, u**2 / 3, lambda r, k: r.uniform(0, 2 * u, (k, 3)), support=(np.zeros(3), 2 * u)
    )
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 6, size=(3000, 3))
    s = dist.sample_sum(rng, counts, 3000)
    resid = s - counts * u
    se = np.sqrt(np.sum(counts * u**2 / 3, axis=0)) / 3000
    assert np.all(np.abs(resid.mean(0)) < K_SE * se)
    np.testing.assert_array_equal(easy_target(dist), 2 * u)  # ties go to the upper end


def test_exact_mean_under_h1_has_the_target_in_it():
    dist = gaussian_product(np.zeros(4), np.array([1.0, 2.0, 0.5, 3.0]))
    z = np.array([5.0, -5.0, 2.0, 0.0])
    n, r = 20, 20000
    out = ExactMean(n).sample(dist, z, np.ones(r, bool), 3)
    se = np.sqrt((n - 1) * dist.var) / n / np.sqrt(r)
    assert np.all(np.abs(out.mean(0) - z / n) < K_SE * se)
    out0 = ExactMean(n).sample(dist, z, np.zeros(r, bool), 3)
    assert np.all(np.abs(out0.mean(0)) < K_SE * np.sqrt(dist.var / n / r))


# noise variance on the mean: paper gamma^2 / n, DP-style (noise on the sum) gamma^2 / n^2
@pytest.mark.parametrize("scaling,expected", [("paper", 4.0 / 10), ("sum", 4.0 / 100)])
def test_noisy_mean_variance(scaling, expected):
    dist = gaussian_product(np.zeros(200), np.ones(200))
    n, r = 10, 4000
    out = NoisyMean(n, 2.0, scaling).sample(dist, np.zeros(200), np.zeros(r, bool), 4)
    v = out.var(0, ddof=1).mean()  # 200 coordinates, each var has rel. s.e. sqrt(2/r)
    target = 1.0 / n + expected
    assert abs(v / target - 1) < K_SE * np.sqrt(2 / r / 200)


def test_shared_and_independent_inclusion_events():
    # A huge target makes inclusion visible coordinate by coordinate.
    dist = gaussian_product(np.zeros(30), np.ones(30))
    z = np.full(30, 1e6)
    n, r = 40, 6000
    shared = SubsampledMean(n, 0.25, "shared").sample(dist, z, np.ones(r, bool), 5)
    inc = shared > 1e3
    assert np.all(inc == inc[:, :1])  # one event for the whole vector
    rate = 10 / 40
    assert abs(inc[:, 0].mean() - rate) < K_SE * np.sqrt(rate * (1 - rate) / r)
    indep = SubsampledMean(n, 0.25, "independent").sample(dist, z, np.ones(r, bool), 5)
    inc = indep > 1e3
    assert abs(inc.mean() - rate) < K_SE * np.sqrt(rate * (1 - rate) / inc.size)
    corr = np.corrcoef(inc[:, 0], inc[:, 1])[0, 1]
    assert abs(corr) < K_SE / np.sqrt(r)
    # given inclusion, the output is (z + sum of k - 1 rows)/k
    k = SubsampledMean(n, 0.25).k
    vals = shared[shared[:, 0] > 1e3, 0] - 1e6 / k
    assert abs(vals.mean()) < K_SE * np.sqrt((k - 1) / k**2 / vals.size)
    pois = PoissonSubsampledMean(n, 0.25).sample(dist, z, np.ones(r, bool), 6)
    inc = pois[:, 0] > 1e3
    assert abs(inc.mean() - 0.25) < K_SE * np.sqrt(0.25 * 0.75 / r)


def test_reference_stats_are_unbiased():
    rng = np.random.default_rng(2)
    for dist in (
        bernoulli_product(4000, 0.25, 3),
        gaussian_product(np.ones(4000), rng.uniform(1, 3, 4000)),
    ):
        m, v, m2 = dist.reference_stats(rng, 25)
        # average over 4000 coordinates of standardised errors
        zm = (m - dist.mean) / np.sqrt(dist.var / 25)
        assert abs(zm.mean()) < K_SE / np.sqrt(4000)
        rel = v / dist.var - 1
        assert abs(rel.mean()) < K_SE * rel.std() / np.sqrt(4000)
        np.testing.assert_allclose(m2, v * 24 / 25 + m * m, rtol=1e-10, atol=1e-12)


def test_oracle_lr_and_linear_theory_agree():
    dist = bernoulli_product(300, 0.25, 4)
    z = easy_target(dist)
    n = 60
    m = th.leakage_score(dist.mean, dist.var, z, n)
    w = (z - dist.mean) / dist.var
    assert th.linear_score_mu(w, dist.mean, dist.var, z, n) == pytest.approx(np.sqrt(m))
    # score at the exact mean equal to mu: -m/2; at mu + (z - mu)/n: +m/2
    o = np.stack([dist.mean, dist.mean + (z - dist.mean) / n])
    s = sc.oracle_lr(o, z, dist.mean, dist.var, n)
    np.testing.assert_allclose(s, [-m / 2, m / 2])
    # misspecification: z_targ = z* is optimal; otherwise Cauchy-Schwarz
    assert th.misspecified_mu(dist.mean, dist.var, z, z, n) == pytest.approx(np.sqrt(m))
    zt = hard_target(dist)
    m_scal, m_targ = th.misspecified_scores(dist.mean, dist.var, z, zt, n)
    assert abs(m_scal) <= np.sqrt(m_targ * m) + 1e-12
    assert th.misspecified_mu(dist.mean, dist.var, z, zt, n) == pytest.approx(
        abs(th.linear_score_mu((zt - dist.mean) / dist.var, dist.mean, dist.var, z, n))
    )


def test_power_threshold_leakage_closed_forms():
    m = 4.0
    assert th.power(0.05, 0.0) == pytest.approx(0.05)
    assert th.power(0.1, m) == pytest.approx(ndtr(-1.2815515655 + 2.0), abs=1e-9)
    t = th.lr_threshold(0.1, m)
    assert 1 - ndtr((t + m / 2) / 2.0) == pytest.approx(0.1)  # FPR of the threshold
    assert 1 - ndtr((t - m / 2) / 2.0) == pytest.approx(th.power(0.1, m))
    assert th.leakage(m) == pytest.approx(2 * ndtr(1.0) - 1)
    a = np.linspace(0.001, 0.999, 999)
    assert th.leakage(m) == pytest.approx(np.max(th.power(a, m) - a), abs=1e-5)


def test_subsampling_formulas():
    m, a = 6.0, np.linspace(0.001, 0.999, 999)
    np.testing.assert_allclose(th.subsampled_power_mixture(a, m, 1.0), th.power(a, m))
    np.testing.assert_allclose(th.subsampled_power_paper(a, m, 1.0), th.power(a, m))
    for rho in (0.1, 0.5):
        mix = th.subsampled_power_mixture(a, m, rho)
        assert th.subsampled_leakage_mixture(m, rho) == pytest.approx(np.max(mix - a), abs=1e-4)
        auc = np.trapezoid(np.concatenate([[0], mix, [1]]), np.concatenate([[0], a, [1]]))
        assert th.subsampled_auc_mixture(m, rho) == pytest.approx(auc, abs=2e-3)
        assert th.subsampled_leakage_paper(m, rho) == pytest.approx(th.leakage(rho * m))
    assert th.mixture_delta(1.0, 2.0, 1.0) == pytest.approx(gdp_delta(2.0, 1.0))
    eps = th.mixture_epsilon(2.0, 0.3, 1e-5)
    assert th.mixture_delta(eps, 2.0, 0.3) == pytest.approx(1e-5, rel=1e-6)
    assert eps < gdp_epsilon(2.0, 1e-5)  # amplification by sub-sampling


def test_gdp_view_uses_stats():
    v = th.gdp_view(1.5, (1e-5, 1e-3))
    assert v["epsilon"]["1e-05"] == pytest.approx(gdp_epsilon(1.5, 1e-5))
    assert v["auc"] == pytest.approx(ndtr(1.5 / np.sqrt(2)))
    assert th.gdp_view(0.0)["epsilon"]["1e-05"] == 0.0


def test_plugin_full_equals_diag_on_diagonal_data_and_scalar_product():
    rng = np.random.default_rng(5)
    refs = rng.normal(size=(500, 3)) * [1.0, 2.0, 3.0]
    full = sc.reference_estimate(refs, structure="full")
    diag = sc.reference_estimate(refs, structure="diag")
    np.testing.assert_allclose(np.diag(np.linalg.inv(full.precision)), 1 / diag.precision)
    o, z = rng.normal(size=(4, 3)), np.array([1.0, 2.0, 3.0])
    assert sc.scalar_product(o, z, np.ones(3)) == pytest.approx(o @ (z - 1))
    unc = sc.reference_estimate(refs, centred=False)
    np.testing.assert_allclose(1 / unc.precision, np.mean(refs**2, 0))


def test_exact_bernoulli_lr_matches_binomial_ratio():
    from scipy.stats import binom

    p, n = np.array([0.3, 0.6]), 12
    counts = np.array([[4, 7], [0, 12]])
    z = np.array([1.0, 0.0])
    s = sc.exact_bernoulli_lr(counts / n, z, p, n)
    direct = (
        binom.logpmf(counts[:, 0] - 1, n - 1, p[0])
        - binom.logpmf(counts[:, 0], n, p[0])
        + binom.logpmf(counts[:, 1], n - 1, p[1])
        - binom.logpmf(counts[:, 1], n, p[1])
    )
    np.testing.assert_allclose(s, direct)
    assert np.isneginf(s[1])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: SubsampledMean(100, 1.5), "rho"),
        (lambda: SubsampledMean(100, 0.5, "both"), "mode"),
        (lambda: NoisyMean(100, -1.0), "gamma"),
        (lambda: ExactMean(1), "n must"),
        (lambda: PoissonSubsampledMean(10, 0.0), "q must"),
        (lambda: bernoulli_product(10, 0.6), "a must"),
        (lambda: bernoulli_from_p([0.0, 0.5]), "p must"),
        (lambda: gaussian_product([0.0], [0.0]), "var must"),
        (lambda: easy_target(gaussian_product([0.0], [1.0])), "bounded support"),
        (lambda: make_target(bernoulli_from_p([0.5]), "hardest"), "target must"),
        (lambda: make_target(bernoulli_from_p([0.5]), [1.0, 0.0]), "length d"),
        (lambda: ExactMean(5).sample(bernoulli_from_p([0.5]), [1.0], [2], 0), "members"),
        (lambda: ExactMean(5).sample(bernoulli_from_p([0.5]), [1.0], [1], None), "rng"),
        (lambda: th.leakage_score([0.5], [0.25], [1.0], 0), "n must"),
        (lambda: th.subsampled_power_mixture(0.1, 1.0, 0.0), "rho"),
        (lambda: sc.oracle_lr(np.zeros((2, 3)), np.zeros(2), 0, 1, 5), "target must"),
        (lambda: sc.reference_estimate(np.zeros((3, 5)), structure="full"), "singular"),
        (lambda: sc.reference_estimate(), "pass references"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
