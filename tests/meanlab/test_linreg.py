"""Seed 004 lab: min-norm regression membership inference vs Theorem 3.2 (DESIGN 4.7).

Variances: simulated E[y0_hat^2] by retraining vs Theorem 3.2, tolerance 4 s.e. with the s.e.
of a mean of y0_hat^2 computed from its sample standard deviation. Advantages: binomial s.e.
of TPR - FPR. Ridge: Monte-Carlo facts only (its closed form is known to be off).
"""

import numpy as np
import pytest
from scipy.stats import norm

from dpaudit.meanlab import linreg as lr

K_SE = 4.0
N, DIM = 30, 600


def _x0(seed=0):
    return np.random.default_rng(seed).standard_normal(DIM)


def _check_var(pred, theory):
    sq = pred**2
    se = sq.std(ddof=1) / np.sqrt(sq.size)
    assert abs(sq.mean() - theory) < K_SE * se, (sq.mean(), theory, se)
    return sq.mean() / theory - 1


@pytest.mark.parametrize("gamma", [3.0, 8.0])
def test_simulated_variances_match_theorem_3_2(gamma):
    x0 = _x0()
    p = int(gamma * N)
    v0, v1 = lr.minnorm_variances(x0, N, p)
    pred0 = lr.simulate_predictions(x0, N, p, 3000, False, 1)
    pred1 = lr.simulate_predictions(x0, N, p, 3000, True, 2)
    _check_var(pred0, v0)
    _check_var(pred1, v1)
    assert abs(pred0.mean()) < K_SE * np.sqrt(v0 / 3000)


@pytest.mark.slow
def test_simulated_variances_within_a_few_percent():
    x0 = _x0(3)
    for gamma in (2.0, 4.0, 8.0):
        p = int(gamma * N)
        v0, v1 = lr.minnorm_variances(x0, N, p)
        r0 = _check_var(lr.simulate_predictions(x0, N, p, 12000, False, 4), v0)
        r1 = _check_var(lr.simulate_predictions(x0, N, p, 12000, True, 5), v1)
        assert abs(r0) < 0.05 and abs(r1) < 0.05, (gamma, r0, r1)


def test_member_prediction_is_the_label_when_interpolating():
    x0 = _x0(1)
    a = lr.simulate_predictions(x0, N, 90, 5, True, 7)
    # same stream, refit by hand: y0_hat equals the training label y0 exactly
    rng = np.random.default_rng(7)
    beta = rng.standard_normal((5, DIM)) / np.sqrt(DIM)
    rng.standard_normal((5, N, 90))
    rng.standard_normal((5, N))
    rng.standard_normal((5, N))
    y0 = beta @ x0 + rng.standard_normal(5)
    np.testing.assert_allclose(a, y0, rtol=1e-8)


def test_advantage_minimum_near_gamma_2_and_rising():
    rows = lr.advantage_sweep([1.3, 2.0, 4.0, 12.0], N, DIM, 1000, seed=8)
    theory = [r["adv_theory"] for r in rows]
    sim = [r["adv_sim"] for r in rows]
    assert np.argmin(theory) == 1 and theory[1] < 0.1
    assert theory[1] < theory[2] < theory[3]
    assert np.argmin(sim) == 1
    assert sim[3] > sim[2] + 0.1 and sim[3] > 0.45
    for r in rows:  # s.e. of TPR - FPR <= sqrt(2 * 0.25 / 1000); Thm 3.2 is asymptotic
        assert abs(r["adv_sim"] - r["adv_theory"]) < K_SE * np.sqrt(0.5 / 1000) + 0.03


def test_threshold_advantage_and_roc_closed_forms():
    v0, v1 = 0.5, 2.0
    t = lr.optimal_threshold(v0, v1)
    a = np.sqrt(t)
    assert norm.pdf(a, scale=np.sqrt(v0)) == pytest.approx(norm.pdf(a, scale=np.sqrt(v1)))
    alphas = np.linspace(1e-4, 1 - 1e-4, 20001)
    best = np.max(lr.variance_roc(alphas, v0, v1) - alphas)
    assert lr.variance_advantage(v0, v1) == pytest.approx(best, abs=1e-6)
    assert lr.variance_advantage(v1, v0) == pytest.approx(lr.variance_advantage(v0, v1))
    assert lr.variance_advantage(1.0, 1.0) == 0.0
    assert lr.optimal_threshold(v0, v1) == pytest.approx(lr.optimal_threshold(v1, v0))


def test_ridge_by_monte_carlo():
    x0 = _x0(2)
    p = 2 * N
    tiny = lr.simulate_predictions(x0, N, p, 200, True, 9, ridge=1e-10)
    exact = lr.simulate_predictions(x0, N, p, 200, True, 9, ridge=0.0)
    np.testing.assert_allclose(tiny, exact, rtol=1e-5, atol=1e-8)
    _, v1 = lr.minnorm_variances(x0, N, p)
    ridge1 = lr.simulate_predictions(x0, N, p, 3000, True, 10, ridge=0.1) ** 2
    # ridge no longer interpolates: the member prediction shrinks below Var(y0)
    assert ridge1.mean() < v1 - K_SE * ridge1.std(ddof=1) / np.sqrt(ridge1.size)
    under = lr.simulate_predictions(x0, N, N // 2, 50, False, 11, ridge=0.1)  # primal path
    assert np.all(np.isfinite(under))


def test_linreg_input_errors():
    with pytest.raises(ValueError, match="p > n"):
        lr.minnorm_variances(_x0(), N, N + 1)
    with pytest.raises(ValueError, match="p <= D"):
        lr.simulate_predictions(_x0(), N, DIM + 1, 5, False, 0)
    with pytest.raises(ValueError, match="var0 == var1"):
        lr.optimal_threshold(1.0, 1.0)
    with pytest.raises(ValueError, match="ridge"):
        lr.simulate_predictions(_x0(), N, 60, 5, False, 0, ridge=-1.0)
