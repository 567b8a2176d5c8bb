"""The tests of the noise's law (``stats.noise_law``): their nulls hold for the generator that
really runs (torch's float32 normals on the CPU, bounded at 5.77 sigma; Opacus' secure mode,
the sum of four normals over two; a release rounded to float32 around a large clipped sum),
by simulation (rejections <= level + 3 s.e.), and each has power against the departures it
exists for, at the PRIVACY BUG level (p far below 1e-6)."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import chi2, norm

from dpaudit.stats.noise_law import (
    hoeffding_log_p,
    marginal_bins,
    marginal_edges,
    marginal_null,
    noise_freshness_test,
    noise_marginal_test,
    noise_scale_test,
)


def _limit(level: float, reps: int) -> float:
    return level + 3 * math.sqrt(level * (1 - level) / reps)


def _counts(x: np.ndarray) -> np.ndarray:
    return np.bincount(marginal_bins(x), minlength=len(marginal_edges()) + 1)


def test_bins_are_the_edges_and_the_null_sums_to_one():
    e = marginal_edges()
    assert np.all(np.diff(e) > 0) and e[0] == -5.0 and e[-1] == 5.0
    rng = np.random.default_rng(0)
    x = rng.normal(0, 2, 100_000)
    # marginal_bins is searchsorted over the edges (away from the edges themselves)
    assert np.array_equal(marginal_bins(x), np.searchsorted(e, x, side="right"))
    p, _tol, excess = marginal_null()
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    # the 256 equal-probability bins, the outer two cut at 3 sigma
    assert np.allclose(p[6:260], 1 / 256) and p[5] == pytest.approx(1 / 256 - norm.cdf(-3))
    assert excess.sum() == 2 and excess[0] and excess[-1]


def _torch_normal(gen, steps, n, secure=False):
    if secure:  # Opacus' secure_mode: four float32 normals, summed, halved
        return [sum(torch.normal(0.0, 1.0, (n,), generator=gen) for _ in range(4)).numpy() / 2
                for _ in range(steps)]
    return [torch.normal(0.0, 1.0, (n,), generator=gen).numpy() for _ in range(steps)]


@pytest.mark.parametrize("secure", [False, True])
def test_marginal_keeps_its_level_on_torchs_generator(secure):
    # 300 runs of 10 steps x 2000 float32 normals from torch's CPU generator (bounded at 5.77
    # sigma, Box-Muller on 24-bit uniforms): rejected in at most 5% + 3 s.e.
    gen = torch.Generator().manual_seed(1 if secure else 0)
    rej = []
    for _ in range(300):
        steps = _torch_normal(gen, 10, 2000, secure)
        st = np.stack([_counts(z) for z in steps])
        rej.append(noise_marginal_test(st, st.sum(axis=0, keepdims=True), np.zeros(10),
                                       level=0.05).rejected)
    assert np.mean(rej) <= _limit(0.05, 300)


def test_marginal_null_holds_after_float32_rounding_around_a_large_sum():
    # the release fl32(S + n) minus S (S up to 1000 sigma: rounding up to 6e-5 sigma): the
    # rounding bound keeps the test valid
    gen = torch.Generator().manual_seed(2)
    s = torch.linspace(-1000.0, 1000.0, 4000)
    rej = []
    for _ in range(200):
        n = torch.normal(0.0, 1.0, (4000,), generator=gen)
        rec = ((s + n).double() - s.double()).numpy()
        r = float(np.finfo(np.float32).eps / 2 * (s + n).abs().max())
        c = _counts(rec)[None]
        rej.append(noise_marginal_test(c, c, np.array([r]), level=0.05).rejected)
    assert np.mean(rej) <= _limit(0.05, 200)


def _law(name, rng, n):
    if name == "laplace":
        return rng.laplace(0, 1 / math.sqrt(2), n)
    if name == "uniform":  # bounded: a shift of C lands outside the support
        return rng.uniform(-math.sqrt(3), math.sqrt(3), n)
    if name == "rounded":  # multiples of sigma C / 4 (variance 1 + 1/192)
        return np.round(rng.normal(0, 1, n) * 4) / 4
    if name == "student":
        return rng.standard_t(5, n) / math.sqrt(5 / 3)
    raise ValueError(name)


@pytest.mark.parametrize("law", ["laplace", "uniform", "rounded", "student"])
def test_marginal_sees_laws_of_the_right_variance(law):
    # 20 steps x 2000 values of a law with variance (about) sigma^2: p far below 1e-6
    rng = np.random.default_rng(3)
    st = np.stack([_counts(_law(law, rng, 2000)) for _ in range(20)])
    res = noise_marginal_test(st, st.sum(axis=0, keepdims=True), np.zeros(20), level=1e-6)
    assert res.rejected and res.p_value < 1e-12, res.witness


def test_hoeffding_bound_holds_for_rademacher_lag_sums():
    # Q_L / sqrt(V_L) of a Gaussian vector at a lag: the tail is below 2 exp(-z^2 / 2)
    rng = np.random.default_rng(4)
    z = []
    for _ in range(4000):
        x = rng.normal(size=200) * rng.uniform(0.2, 3.0, 200)  # any scales, symmetric
        q, v = (x[:-5] * x[5:]).sum(), ((x[:-5] * x[5:]) ** 2).sum()
        z.append(abs(q) / math.sqrt(v))
    z = np.asarray(z)
    for t in (1.5, 2.0, 2.5, 3.0):
        assert np.mean(z >= t) <= math.exp(hoeffding_log_p(t)) + 3 * math.sqrt(
            math.exp(hoeffding_log_p(t)) / 4000)


def _sketches(rows):
    return np.stack(rows), np.zeros(len(rows))


def test_freshness_keeps_its_level():
    rng = np.random.default_rng(5)
    rej = []
    for _ in range(300):
        y, err = _sketches([rng.normal(size=300) * rng.uniform(0.5, 2) for _ in range(12)])
        rej.append(noise_freshness_test(y, err, [("a", 0, 100), ("all tensors", 0, 300)],
                                        level=0.05).rejected)
    assert np.mean(rej) <= _limit(0.05, 300)


@pytest.mark.parametrize("pattern", ["reused", "antithetic", "period", "correlated"])
def test_freshness_sees_reuse_at_any_lag(pattern):
    rng = np.random.default_rng(6)
    rows = [rng.normal(size=512) for _ in range(30)]
    if pattern == "reused":  # one step's noise again, 17 steps later
        rows[20] = rows[3].copy()
    elif pattern == "antithetic":  # every odd step is minus the one before
        rows = [rows[t] if t % 2 == 0 else -rows[t - 1] for t in range(30)]
    elif pattern == "period":  # a generator re-seeded every 5 steps
        rows = [rows[t % 5] for t in range(30)]
    else:  # correlation 0.5 with the first step, every step
        rows = [0.5 * rows[0] + math.sqrt(0.75) * r for r in rows]
    y, err = _sketches(rows)
    res = noise_freshness_test(y, err, [("all tensors", 0, 512)], level=1e-6)
    assert res.rejected and res.p_value < 1e-8, res.witness


def test_freshness_rounding_slack_is_conservative():
    # entries known only to within err: the slack can only make rejection rarer
    rng = np.random.default_rng(7)
    y, _ = _sketches([rng.normal(size=256) for _ in range(10)])
    exact = noise_freshness_test(y, np.zeros(10), [("all tensors", 0, 256)], level=0.05)
    loose = noise_freshness_test(y, np.full(10, 1e-3), [("all tensors", 0, 256)], level=0.05)
    assert loose.p_value >= exact.p_value


def test_scale_test_by_hand_and_rounding_upper_bound():
    # one tensor of 10 coordinates, one step; the rounding raises the norm bound
    res = noise_scale_test(np.array([[2.0]]), [10], 1.0, np.array([0.0]), level=0.05)
    assert res.p_value == pytest.approx(2 * chi2.cdf(2.0, 10), rel=1e-10)
    loose = noise_scale_test(np.array([[2.0]]), [10], 1.0, np.array([0.01]), level=0.05)
    bound = (math.sqrt(2.0) + math.sqrt(10) * 0.01) ** 2
    assert loose.p_value == pytest.approx(2 * chi2.cdf(bound, 10), rel=1e-10)
    assert res.name == "noise_scale" and res.kind == "certified (statistical)"
    # the std's own rounding (torch casts it to the noise's dtype): the bound / (1 - rho)
    cast = noise_scale_test(np.array([[2.0]]), [10], 1.0, np.array([0.01]), level=0.05,
                            scale_rounding=1e-3)
    assert cast.p_value == pytest.approx(2 * chi2.cdf(bound / (1 - 1e-3) ** 2, 10), rel=1e-10)


def test_truncated_moment_is_exact_and_its_test_keeps_its_level():
    from dpaudit.stats.noise_law import truncated_moment

    mean, var = truncated_moment()
    z = np.random.default_rng(8).normal(size=4_000_000)
    x = np.minimum(z * z, 9.0) ** 2
    assert mean == pytest.approx(x.mean(), abs=4 * math.sqrt(var / x.size))
    assert var == pytest.approx(x.var(), rel=0.01)
    # torch's generator, 300 runs of 10 steps x 2 tensors of 3000 and 40 coordinates
    gen = torch.Generator().manual_seed(9)
    rej = []
    for _ in range(300):
        m = np.array([[float((torch.normal(0.0, 1.0, (d,), generator=gen) ** 2)
                             .clamp(max=9.0).pow(2).sum()) for d in (3000, 40)]
                      for _ in range(10)])
        st = np.stack([_counts(torch.normal(0.0, 1.0, (200,), generator=gen).numpy())
                       for _ in range(10)])  # the sampled values: Gaussian too
        rej.append(noise_marginal_test(st, st.sum(axis=0, keepdims=True), np.zeros(10),
                                       level=0.05, moments=m, dims=[3000, 40]).rejected)
    assert np.mean(rej) <= _limit(0.05, 300)


@pytest.mark.parametrize("law", ["laplace", "uniform", "student"])
def test_truncated_moment_sees_one_step_of_the_wrong_law(law):
    # one step of 30000 coordinates among 20 Gaussian ones: p far below 1e-6 from it alone
    rng = np.random.default_rng(10)
    steps = [rng.normal(size=30000) for _ in range(20)]
    steps[7] = _law(law, rng, 30000)
    m = np.array([[(np.minimum(z * z, 9.0) ** 2).sum()] for z in steps])
    st = np.stack([_counts(rng.normal(size=200)) for _ in range(20)])  # a Gaussian sample
    res = noise_marginal_test(st, st.sum(axis=0, keepdims=True), np.zeros(20),
                              level=1e-6, moments=m, dims=[30000])
    assert res.rejected and res.p_value < 1e-10 and res.witness["step"] == 7, res.witness
