"""Membership games against the closed-form theory (seeds 000/001, DESIGN 4.2).

Setting: Bernoulli(p), p ~ U[0.25, 0.75]^d, d = 1000, n = 200 (tau = d/n = 5 as in the papers).
Tolerance: 4 Monte-Carlo standard errors, computed here from the normal variance of the score
moments and, for TPR at a fixed FPR, from `theory.tpr_standard_error` (binomial variance of
the TPR plus the ROC slope times the binomial variance of the estimated threshold).
"""

import numpy as np
import pytest

from dpaudit.meanlab import (
    ExactMean,
    NoisyMean,
    PoissonSubsampledMean,
    SubsampledMean,
    average_target_game,
    bernoulli_product,
    fixed_target_game,
    gaussian_product,
    make_target,
)
from dpaudit.meanlab import scores as sc
from dpaudit.meanlab import theory as th
from dpaudit.stats import auc, tpr_at_fpr

K_SE = 4.0
FPRS = np.array([0.01, 0.05, 0.1, 0.3])
D, N, ROUNDS = 1000, 200, 3000


@pytest.fixture(scope="module")
def lab():
    dist = bernoulli_product(D, 0.25, 11)
    return dist, {k: make_target(dist, k, 12) for k in ("easy", "medium", "hard")}


def _z_scores(s_in, s_out, roc):
    """(empirical - theory) / s.e. of the TPR at each FPR in FPRS."""
    emp = tpr_at_fpr(s_in, s_out, FPRS)
    se = np.array([th.tpr_standard_error(a, roc, s_in.size, s_out.size) for a in FPRS])
    return (emp - roc(FPRS)) / se


@pytest.mark.parametrize("name", ["easy", "hard"])
def test_lr_score_moments_match_theorem_3_1(lab, name):
    dist, targets = lab
    z = targets[name]
    m = th.leakage_score(dist.mean, dist.var, z, N)
    g = fixed_target_game(dist, ExactMean(N), z, ROUNDS, seed=1, balanced=True)
    s_in, s_out = g.split("lr")
    for s, mean in ((s_out, -m / 2), (s_in, m / 2)):
        assert abs(s.mean() - mean) < K_SE * np.sqrt(m / s.size)
        assert abs(s.var(ddof=1) - m) < K_SE * m * np.sqrt(2 / (s.size - 1))


@pytest.mark.parametrize("gamma", [0.0, 1.0])
def test_tpr_at_fpr_matches_power_for_exact_and_noisy_mean(lab, gamma):
    dist, targets = lab
    z = targets["medium"]
    mech = ExactMean(N) if gamma == 0 else NoisyMean(N, gamma)
    m = th.leakage_score(dist.mean, dist.var, z, N, mech.noise_var(dist))
    g = fixed_target_game(dist, mech, z, ROUNDS, seed=2)
    zs = _z_scores(*g.split("lr"), lambda a: th.power(a, m))
    assert np.all(np.abs(zs) < K_SE), zs


def test_noise_on_the_sum_is_gaussian_dp_with_its_own_scale(lab):
    dist, targets = lab
    z = targets["easy"]
    mech = NoisyMean(N, 20.0, "sum")  # gamma/n on the mean: C_gamma = gamma^2 / n = 2
    m = th.leakage_score(dist.mean, dist.var, z, N, mech.noise_var(dist))
    g = fixed_target_game(dist, mech, z, ROUNDS, seed=3)
    zs = _z_scores(*g.split("lr"), lambda a: th.power(a, m))
    assert np.all(np.abs(zs) < K_SE), zs


@pytest.mark.parametrize("rho", [0.25, 0.5])
def test_subsampling_shared_event_matches_mixture_not_paper(lab, rho):
    """DESIGN 4.2: with one shared inclusion event the ROC is the mixture formula."""
    dist, targets = lab
    z = targets["easy"]
    m = th.leakage_score(dist.mean, dist.var, z, N)
    mech = SubsampledMean(N, rho, "shared")
    s_in, s_out = fixed_target_game(dist, mech, z, ROUNDS, seed=4).split("lr")
    mix = _z_scores(s_in, s_out, lambda a: th.subsampled_power_mixture(a, m, mech.rate))
    paper = _z_scores(s_in, s_out, lambda a: th.subsampled_power_paper(a, m, mech.rate))
    assert np.all(np.abs(mix) < K_SE), mix
    assert np.max(np.abs(paper)) > 3 * K_SE, paper  # the paper's rho m* is clearly rejected


@pytest.mark.parametrize("rho", [0.25, 0.5])
def test_subsampling_independent_coordinates_matches_paper_not_mixture(lab, rho):
    """The paper's Phi(z_a + sqrt(rho m*)) describes per-coordinate independent inclusion."""
    dist, targets = lab
    z = targets["easy"]
    m = th.leakage_score(dist.mean, dist.var, z, N)
    mech = SubsampledMean(N, rho, "independent")
    s_in, s_out = fixed_target_game(dist, mech, z, ROUNDS, seed=5).split("lr")
    paper = _z_scores(s_in, s_out, lambda a: th.subsampled_power_paper(a, m, mech.rate))
    mix = _z_scores(s_in, s_out, lambda a: th.subsampled_power_mixture(a, m, mech.rate))
    assert np.all(np.abs(paper) < K_SE), paper
    assert np.max(np.abs(mix)) > 3 * K_SE, mix


@pytest.mark.slow
def test_poisson_subsampling_matches_mixture(lab):
    dist, targets = lab
    z = targets["easy"]
    m = th.leakage_score(dist.mean, dist.var, z, N)
    s_in, s_out = fixed_target_game(dist, PoissonSubsampledMean(N, 0.3), z, 6000, seed=6).split(
        "lr"
    )
    # batch size is random (Bin(n, q)), so allow one extra s.e. for the smeared m*/K
    zs = _z_scores(s_in, s_out, lambda a: th.subsampled_power_mixture(a, m, 0.3))
    assert np.all(np.abs(zs) < K_SE + 1), zs


def test_misspecified_target_matches_theorem_4_3(lab):
    dist, targets = lab
    z = targets["easy"]
    zt = z.copy()
    flip = np.random.default_rng(7).random(D) < 0.3
    zt[flip] = 1 - zt[flip]
    mu = th.misspecified_mu(dist.mean, dist.var, z, zt, N)
    assert 0.5 < mu < np.sqrt(th.leakage_score(dist.mean, dist.var, z, N))
    g = fixed_target_game(dist, ExactMean(N), z, ROUNDS, seed=8, score_target=zt)
    zs = _z_scores(*g.split("lr"), lambda a: th.roc_of_mu(a, mu))
    assert np.all(np.abs(zs) < K_SE), zs


def test_exact_bernoulli_lr_is_asymptotically_eq5(lab):
    dist, targets = lab
    z = targets["hard"]
    scores = {
        "eq5": lambda o, t: sc.oracle_lr(o, t, dist.mean, dist.var, N),
        "exact": lambda o, t: sc.exact_bernoulli_lr(o, t, dist.mean, N),
    }
    g = fixed_target_game(dist, ExactMean(N), z, 1000, scores, seed=9)
    for b in (True, False):
        sel = g.members == b
        assert np.corrcoef(g.scores["eq5"][sel], g.scores["exact"][sel])[0, 1] > 0.99


def test_plugin_score_loses_power_smoothly_as_n0_shrinks(lab):
    """Figure 6: power decreases with n0, and matches the theory given the estimates."""
    dist, targets = lab
    z = targets["easy"]
    rng = np.random.default_rng(10)
    ests = {n0: sc.reference_estimate(dist=dist, n0=n0, rng=rng) for n0 in (10, 40, 400, 40000)}
    mus = {
        n0: th.linear_score_mu(e.weights(z), dist.mean, dist.var, z, N) for n0, e in ests.items()
    }
    m = th.leakage_score(dist.mean, dist.var, z, N)
    assert list(mus.values()) == sorted(mus.values())  # monotone in n0
    assert mus[40000] == pytest.approx(np.sqrt(m), rel=1e-3)
    assert mus[10] > 0.75 * np.sqrt(m)  # "the decrease is negligible even for small n0"
    scores = {n0: (lambda o, t, e=e: sc.plugin_lr(o, t, e, N)) for n0, e in ests.items()}
    g = fixed_target_game(dist, ExactMean(N), z, ROUNDS, scores, seed=11)
    for n0, mu in mus.items():
        zs = _z_scores(*g.split(n0), lambda a, mu=mu: th.roc_of_mu(a, mu))
        assert np.all(np.abs(zs) < K_SE), (n0, zs)


def test_plugin_beats_scalar_product_when_variances_differ():
    rng = np.random.default_rng(12)
    var = np.exp(rng.uniform(-np.log(10), np.log(10), D))
    dist = gaussian_product(np.zeros(D), var)
    z = 1.2 * np.sqrt(var)
    z_ref = dist.sample(rng, 1)[0]
    est = sc.reference_estimate(dist=dist, n0=2000, rng=rng)
    scores = {
        "plugin": lambda o, t: sc.plugin_lr(o, t, est, N),
        "scalar": lambda o, t: sc.scalar_product(o, t, z_ref),
    }
    g = fixed_target_game(dist, ExactMean(N), z, ROUNDS, scores, seed=13)
    mu_p = th.linear_score_mu(est.weights(z), dist.mean, dist.var, z, N)
    mu_s = th.linear_score_mu(z - z_ref, dist.mean, dist.var, z, N)
    assert mu_p > mu_s + 0.5
    tp = tpr_at_fpr(*g.split("plugin"), 0.1)
    ts = tpr_at_fpr(*g.split("scalar"), 0.1)
    se = np.hypot(
        th.tpr_standard_error(0.1, lambda a: th.roc_of_mu(a, mu_p), 1500, 1500),
        th.tpr_standard_error(0.1, lambda a: th.roc_of_mu(a, mu_s), 1500, 1500),
    )
    assert tp - ts > K_SE * se
    assert auc(*g.split("plugin")) > auc(*g.split("scalar"))


def test_average_target_game_has_leakage_tau(lab):
    dist, _ = lab
    g = average_target_game(dist, ExactMean(N), ROUNDS, seed=14)
    assert g.targets.shape == (ROUNDS, D)
    tau = th.average_target_m(D, N)
    zs = _z_scores(*g.split("lr"), lambda a: th.power(a, tau))
    assert np.all(np.abs(zs) < K_SE), zs


def test_games_are_reproducible_from_the_seed(lab):
    dist, targets = lab
    mech = SubsampledMean(N, 0.5)
    a = fixed_target_game(dist, mech, targets["easy"], 50, seed=3, chunk=7)
    b = fixed_target_game(dist, mech, targets["easy"], 50, seed=3, chunk=7)
    c = fixed_target_game(dist, mech, targets["easy"], 50, seed=4, chunk=7)
    np.testing.assert_array_equal(a.members, b.members)
    np.testing.assert_array_equal(a.scores["lr"], b.scores["lr"])
    assert not np.array_equal(a.scores["lr"], c.scores["lr"])
    bal = fixed_target_game(dist, mech, targets["easy"], 50, seed=3, balanced=True)
    assert bal.members.sum() == 25


def test_game_input_errors(lab):
    dist, targets = lab
    with pytest.raises(ValueError, match="rounds"):
        fixed_target_game(dist, ExactMean(N), targets["easy"], 1)
    with pytest.raises(ValueError, match="scores must"):
        fixed_target_game(dist, ExactMean(N), targets["easy"], 10, scores={})
    with pytest.raises(ValueError, match="returned shape"):
        fixed_target_game(dist, ExactMean(N), targets["easy"], 10, scores={"bad": lambda o, t: o})
    with pytest.raises(ValueError, match="unknown score"):
        fixed_target_game(dist, ExactMean(N), targets["easy"], 10).split("nope")
