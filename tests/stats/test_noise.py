"""The certified noise tests (``stats.noise``): exact p-values by hand, validity under the
claim (false rejections <= level + 3 s.e. by simulation, with a data signal the tests must not
mistake for noise), and power against the bugs they exist for."""

import math

import numpy as np
import pytest
from scipy.stats import beta, chi2

from dpaudit.stats import noise_floor_test, noise_independence_test, poisson_sampling_test


def _limit(level: float, reps: int) -> float:
    return level + 3 * math.sqrt(level * (1 - level) / reps)


def test_noise_floor_p_value_by_hand():
    # one tensor of 10 coordinates, one step: 2 cells (the step and the run's sum), each
    # P[chi2_10 <= x / s^2]; the smallest, times 2
    x, s = np.array([[2.0]]), 0.5
    res = noise_floor_test(x, [10], s, level=0.05, names=["w"])
    assert res.p_value == pytest.approx(2 * chi2.cdf(2.0 / 0.25, 10), rel=1e-10)
    assert res.witness["tensor"] == "w" and res.witness["noise_ratio"] == pytest.approx(
        math.sqrt(8.0 / 10)
    )


def test_noise_floor_scale_rounding_by_hand_and_refusals():
    # the cells are tested at x / (1 - rho)^2 (the largest norm arithmetic allows at the
    # claimed scale); the witness's ratio stays the observed one
    x, s, rho = np.array([[0.5, 3.0]]), 0.5, 0.01
    res = noise_floor_test(x, [10], s, level=0.05, scale_rounding=rho)
    assert res.p_value == pytest.approx(
        3 * chi2.cdf(0.5 / 0.25 / (1 - rho) ** 2, 10), rel=1e-10)
    assert res.witness["noise_ratio"] == pytest.approx(math.sqrt(2.0 / 10))
    per_step = noise_floor_test(x, [10], s, level=0.05, scale_rounding=[rho, 0.0])
    assert per_step.p_value == pytest.approx(res.p_value, rel=1e-10)  # step 0 is the witness
    assert noise_floor_test(x, [10], s, level=0.05, scale_rounding=0.0).p_value < res.p_value
    for bad in (1.0, -1e-9, [0.1, 0.1, 0.1]):
        with pytest.raises(ValueError, match="scale_rounding"):
            noise_floor_test(x, [10], s, level=0.05, scale_rounding=bad)


def _mp_log_chi2_cdf(df: float, x: float) -> float:
    """log P(chi2_df <= x) in 25-digit arithmetic: the gamma series, summed to 1e-20."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(25):
        a, y = mp.mpf(df) / 2, mp.mpf(x) / 2
        term = total = mp.mpf(1)
        k = 0
        while term > total * mp.mpf(10) ** -20:
            k += 1
            term *= y / (a + k)
            total += term
        return float(a * mp.log(y) - y - mp.loggamma(a + 1) + mp.log(total))


@pytest.mark.parametrize(("df", "z"), [(402, -4.6), (25600, -5.0), (2.56e6, -5.0),
                                       (1e7, -7.0), (1e8, -20.0)])
def test_chi2_floor_lower_tail_is_exact_for_large_df(df, z):
    # scipy's chi2.logcdf is too small more than 4.5 sd below the mean of a large df (its
    # series is cut at 2000 terms): 0.65% at df 1e7, 22% at 1e8; the floor's is exact
    from dpaudit.stats.noise import _log_chi2_cdf

    x = df + z * math.sqrt(2 * df)
    exact = _mp_log_chi2_cdf(df, x)
    assert float(_log_chi2_cdf(np.array([x]), np.array([df]))[0]) == pytest.approx(
        exact, abs=1e-9)
    if df >= 1e6:  # the run's cell of a tensor of df / 100 coordinates over 100 steps
        res = noise_floor_test(np.full((1, 100), x / 100), [df / 100], 1.0, level=0.05)
        assert res.witness["step"] == "all"
        assert math.log(res.p_value) == pytest.approx(exact + math.log(101), abs=1e-9)


def _released(rng, dims, steps, std, signal, noise_scale=1.0):
    """Squared norms of (S + Z) per tensor and step; S of norm ``signal`` in a fixed direction
    (the data's clipped sum), Z ~ N(0, (noise_scale std)^2 I)."""
    out = np.empty((len(dims), steps))
    for j, d in enumerate(dims):
        s = np.zeros(d)
        s[0] = signal
        z = rng.normal(0.0, noise_scale * std, (steps, d))
        out[j] = ((s + z) ** 2).sum(axis=1)
    return out


@pytest.mark.parametrize("signal", [0.0, 30.0])
def test_noise_floor_keeps_its_level(signal):
    # 300 correct releases of tensors of 3, 40 and 400 coordinates over 20 steps, with or
    # without a data signal: rejected in at most 5% + 3 s.e. (the dominance argument says the
    # signal can only make rejection rarer)
    rng = np.random.default_rng(0)
    rej = [
        noise_floor_test(_released(rng, [3, 40, 400], 20, 2.0, signal), [3, 40, 400], 2.0,
                         level=0.05).rejected
        for _ in range(300)
    ]
    assert np.mean(rej) <= _limit(0.05, 300)


def test_noise_floor_catches_missing_and_scaled_noise():
    rng = np.random.default_rng(1)
    x = _released(rng, [5, 2000], 30, 1.0, 3.0)
    x[1, 7] = 3.0**2  # step 7 of the big tensor released without noise
    res = noise_floor_test(x, [5, 2000], 1.0, level=0.01, names=["b", "w"])
    assert res.rejected and res.witness == {"tensor": "w", "step": 7, "noise_ratio": pytest.approx(
        3.0 / math.sqrt(2000))}
    scaled = _released(rng, [5, 2000], 30, 1.0, 3.0, noise_scale=0.95)  # 5% less noise
    res = noise_floor_test(scaled, [5, 2000], 1.0, level=0.01, names=["b", "w"])
    assert res.rejected and res.witness["step"] == "all" and res.witness["tensor"] == "w"
    # per-step claimed stds: the same release judged against a schedule
    stds = np.full(30, 1.0)
    assert noise_floor_test(scaled, [5, 2000], stds, level=0.01).rejected


def test_cosine_null_law_is_exact():
    # (1 + cos) / 2 ~ Beta((n - 1) / 2, (n - 1) / 2) for independent isotropic vectors
    rng = np.random.default_rng(2)
    n = 5
    a, b = rng.normal(size=(200_000, n)), rng.normal(size=(200_000, n)) * 3.0
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    for c in (0.0, 0.5, 0.9):
        exact = beta.sf((1 + c) / 2, (n - 1) / 2, (n - 1) / 2)
        assert np.mean(cos >= c) == pytest.approx(exact, abs=4 * math.sqrt(exact / 200_000))


def test_noise_independence_keeps_its_level_and_sees_reuse():
    rng = np.random.default_rng(3)
    rej = [
        noise_independence_test(rng.normal(0, 2.0, (60, 25)), 2.0, level=0.05).rejected
        for _ in range(300)
    ]
    assert np.mean(rej) <= _limit(0.05, 300)
    # every step's noise correlated 0.4 with the first step's: caught, with the pair
    first = rng.normal(0, 1.0, (200, 1))
    corr = 0.4 * first + math.sqrt(1 - 0.16) * rng.normal(0, 1.0, (200, 25))
    res = noise_independence_test(corr, 1.0, level=0.01)
    assert res.rejected and "cosine" in res.witness and res.witness["cosine"] > 0.2
    # a step without noise: caught by the floor at the probes
    zero = rng.normal(0, 1.0, (200, 25))
    zero[:, 4] = 0.0
    res = noise_independence_test(zero, 1.0, level=0.01)
    assert res.rejected and res.witness["step"] == 4


def test_poisson_sampling_test_level_and_power():
    rng = np.random.default_rng(4)
    n, q = 1348, 1 / 21
    rej = [
        poisson_sampling_test(rng.binomial(n, q, 100), n, q, level=0.05).rejected
        for _ in range(400)
    ]
    assert np.mean(rej) <= _limit(0.05, 400)
    fixed = poisson_sampling_test(np.full(100, 64), n, q, level=0.01)
    assert fixed.rejected and fixed.witness["failed"] == "regularity"
    slow = poisson_sampling_test(rng.binomial(n, 0.9 * q, 100), n, q, level=0.01)
    assert slow.rejected and slow.witness["failed"] == "rate"


def test_poisson_sampling_sees_fixed_size_batches_with_a_short_epoch_end():
    # 100 steps of shuffled batches of 64 from 1437 examples (22 full batches and one of 29
    # per epoch): the short batches swamp the variance, the count at the expected size does not
    sizes = ([64] * 22 + [29]) * 4 + [64] * 8
    res = poisson_sampling_test(sizes, 1437, 64 / 1437, level=1e-6)
    assert res.rejected and res.witness["failed"] == "expected size"
    assert res.details["steps_at_expected_size"] == 96 and res.p_value < 1e-30
