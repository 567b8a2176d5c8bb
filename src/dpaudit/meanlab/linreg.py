"""Seed 004 lab: membership inference on min-norm (and ridge) least squares with p of D features.

Data: beta ~ N(0, I_D / D), x_i ~ N(0, I_D), y_i = x_i^T beta + eps_i, eps ~ N(0, s^2). The
model fits the first p features of n points and predicts y0_hat = x0_p^T beta_hat. Theorem 3.2
(p > n + 1): y0_hat | m = 0 has variance
    sigma0^2 = (n/p)(1/D + (1 + s^2 - p/D)/(p - n - 1)) ||x0_p||^2
(exact in expectation over X, beta), and y0_hat | m = 1 equals y0 (interpolation), variance
sigma1^2 = s^2 + ||x0||^2 / D. The optimal attack thresholds y0_hat^2 at alpha^2 (Eq. 3).
The simulation retrains the model for every draw. Ridge (beta_hat = (X^T X + n lam I)^{-1}
X^T y) is validated by simulation only: seed 004's closed form for it is known to be off.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr
from scipy.stats import chi2

from dpaudit._validate import check_nonnegative, check_positive
from dpaudit.seeds import as_generator


def _dims(n: int, p: int, D: int) -> tuple[int, int, int]:
    n, p, D = int(n), int(p), int(D)
    if n < 2 or p < 1 or D < p:
        raise ValueError(f"need n >= 2, 1 <= p <= D; got n={n}, p={p}, D={D}")
    return n, p, D


def minnorm_variances(x0, n: int, p: int, noise_std: float = 1.0) -> tuple[float, float]:
    """(sigma0^2, sigma1^2) of Theorem 3.2 for the feature vector x0 (length D); p > n + 1."""
    x0 = np.asarray(x0, dtype=np.float64).reshape(-1)
    n, p, D = _dims(n, p, x0.size)
    if p <= n + 1:
        raise ValueError(f"Theorem 3.2 needs p > n + 1, got p={p}, n={n}")
    s2 = check_nonnegative(noise_std, "noise_std") ** 2
    xp2 = float(np.sum(x0[:p] ** 2))
    s0 = (n / p) * (1.0 / D + (1.0 + s2 - p / D) / (p - n - 1.0)) * xp2
    s1 = s2 + float(np.sum(x0**2)) / D
    return s0, s1


def optimal_threshold(var0: float, var1: float) -> float:
    """alpha^2 where the N(0, var0) and N(0, var1) densities cross (Eq. 3; symmetric)."""
    v0, v1 = check_positive(var0, "var0"), check_positive(var1, "var1")
    if v0 == v1:
        raise ValueError("var0 == var1: the two distributions are identical")
    return float(v0 * v1 * np.log(v1 / v0) / (v1 - v0))


def variance_advantage(var0: float, var1: float) -> float:
    """Advantage of the optimal y^2 test between N(0, var0) and N(0, var1) (Eq. 4, Rem. 3.3)."""
    if var0 == var1:
        return 0.0
    a = np.sqrt(optimal_threshold(var0, var1))
    return float(2.0 * abs(ndtr(a / np.sqrt(var0)) - ndtr(a / np.sqrt(var1))))


def variance_roc(alpha, var0: float, var1: float):
    """TPR at FPR alpha of the best y^2 test (larger-variance side flagged as member)."""
    a = np.asarray(alpha, dtype=np.float64)
    v0, v1 = check_positive(var0, "var0"), check_positive(var1, "var1")
    if v1 >= v0:  # member if y^2 > t, P0(y^2 > t) = alpha
        out = chi2.sf(chi2.isf(a, 1) * v0 / v1, 1)
    else:  # member if y^2 < t
        out = chi2.cdf(chi2.ppf(a, 1) * v0 / v1, 1)
    return float(out) if np.ndim(out) == 0 else out


def theoretical_advantage(x0, n: int, p: int, noise_std: float = 1.0) -> float:
    """Eq. 4 for one x0: the Gaussian-variance advantage with Theorem 3.2's variances."""
    return variance_advantage(*minnorm_variances(x0, n, p, noise_std))


def simulate_predictions(
    x0,
    n: int,
    p: int,
    rounds: int,
    member: bool,
    seed,
    noise_std: float = 1.0,
    ridge: float = 0.0,
    batch_floats: int = 4_000_000,
) -> np.ndarray:
    """y0_hat over ``rounds`` independent retrainings (fresh beta, X, eps each time).

    member=True puts (x0, y0) in row 0 of the training set. The features p+1..D of the other
    rows only enter y through X_{i,>p} beta_{>p} ~ N(0, ||beta_{>p}||^2), drawn exactly.
    Fits use the n x n dual system when p > n, the p x p primal one otherwise; ``ridge`` is
    lam in (X^T X + n lam I)^{-1} X^T y (0: min-norm least squares).
    """
    x0 = np.asarray(x0, dtype=np.float64).reshape(-1)
    n, p, D = _dims(n, p, x0.size)
    rng = as_generator(seed)
    rounds = int(rounds)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    s = check_nonnegative(noise_std, "noise_std")
    lam = check_nonnegative(ridge, "ridge")
    x0p = x0[:p]
    out = np.empty(rounds)
    bsz = max(1, int(batch_floats) // (n * p))
    for lo in range(0, rounds, bsz):
        b = min(bsz, rounds - lo)
        beta = rng.standard_normal((b, D)) / np.sqrt(D)
        X = rng.standard_normal((b, n, p))
        rest = np.sqrt(np.sum(beta[:, p:] ** 2, axis=1))[:, None]
        y = np.einsum("bnp,bp->bn", X, beta[:, :p]) + rest * rng.standard_normal((b, n))
        y += s * rng.standard_normal((b, n))
        if member:
            X[:, 0, :] = x0p
            y[:, 0] = beta @ x0 + s * rng.standard_normal(b)
        out[lo : lo + b] = _fit_predict(X, y, x0p, n * lam)
    return out


def _fit_predict(X: np.ndarray, y: np.ndarray, x0p: np.ndarray, reg: float) -> np.ndarray:
    """x0p^T beta_hat for a batch of designs X (b, n, p) and responses y (b, n)."""
    _b, n, p = X.shape
    if p > n:  # beta_hat = X^T (X X^T + reg I)^{-1} y  (min-norm solution when reg = 0)
        G = X @ X.transpose(0, 2, 1) + reg * np.eye(n)
        c = np.linalg.solve(G, y[..., None])[..., 0]
        return np.einsum("bn,bn->b", X @ x0p, c)
    G = X.transpose(0, 2, 1) @ X + reg * np.eye(p)
    rhs = np.einsum("bnp,bn->bp", X, y)
    beta = np.linalg.solve(G, rhs[..., None])[..., 0]
    return beta @ x0p


def empirical_advantage(pred0, pred1, var0: float, var1: float) -> float:
    """TPR - FPR of the y^2 test at the theoretical optimal threshold alpha^2 (no refitting)."""
    t = optimal_threshold(var0, var1)
    sign = 1.0 if var1 > var0 else -1.0
    tpr = np.mean(sign * (np.asarray(pred1) ** 2 - t) > 0)
    fpr = np.mean(sign * (np.asarray(pred0) ** 2 - t) > 0)
    return float(tpr - fpr)


def advantage_standard_error(tpr: float, fpr: float, n1: int, n0: int) -> float:
    """s.e. of TPR - FPR from two independent binomial proportions on n1 and n0 draws."""
    for v, name in ((tpr, "tpr"), (fpr, "fpr")):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {v!r}")
    return float(np.sqrt(tpr * (1 - tpr) / n1 + fpr * (1 - fpr) / n0))


def advantage_sweep(
    gammas,
    n: int,
    D: int,
    rounds: int,
    seed,
    noise_std: float = 1.0,
    ridge: float = 0.0,
) -> list[dict]:
    """For each gamma = p/n (p > n + 1): simulated vs Theorem 3.2 variances and advantages.

    One x0 ~ N(0, I_D) for the whole sweep (the papers average Eq. 4 over a few x0).
    ``theory_*`` entries are only reported for ridge = 0 (min-norm).
    """
    rng = as_generator(seed)
    x0 = rng.standard_normal(int(D))
    rows = []
    for g in gammas:
        p = round(float(g) * n)
        pred0 = simulate_predictions(x0, n, p, rounds, False, rng, noise_std, ridge)
        pred1 = simulate_predictions(x0, n, p, rounds, True, rng, noise_std, ridge)
        v0, v1 = float(np.mean(pred0**2)), float(np.mean(pred1**2))
        row = {
            "gamma": p / n,
            "p": p,
            "var0_sim": v0,
            "var1_sim": v1,
            "adv_gauss_fit": variance_advantage(v0, v1),
        }
        if ridge == 0.0 and p > n + 1:
            t0, t1 = minnorm_variances(x0, n, p, noise_std)
            row.update(
                var0_theory=t0,
                var1_theory=t1,
                adv_theory=variance_advantage(t0, t1),
                adv_sim=empirical_advantage(pred0, pred1, t0, t1),
            )
        rows.append(row)
    return rows
