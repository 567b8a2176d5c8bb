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
