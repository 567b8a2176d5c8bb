"""Closed-form leakage of the mean mechanisms (DESIGN 4.2; seeds 000/001 Thms 3.1, 4.1-4.3).

Leakage scores: m* = (1/n)||z* - mu||^2_{C^{-1}}; noisy m~ uses (C + C_gamma)^{-1};
misspecified m_scal, m_targ. The LR score is N(-m/2, m) out and N(m/2, m) in, so every view
is Gaussian DP with mu = sqrt(m): power Phi(z_a + sqrt m), leakage 2 Phi(sqrt(m)/2) - 1,
threshold -m/2 + sqrt(m) z_{1-a}; the (eps, delta) view comes from `dpaudit.stats`.

Sub-sampling, two formulas (both kept; the tests say which simulation each one describes):
- `subsampled_power_paper`: Phi(z_a + sqrt(rho m*)) (seed 001 Thm 4.2, Eq. 10). Its proof
  treats each coordinate's inclusion as independent: it describes
  `SubsampledMean(mode="independent")`.
- `subsampled_power_mixture`: rho Phi(z_a + sqrt(m*/rho)) + (1 - rho) a. With one shared
  inclusion event (DP-SGD), H1 is a mixture: with prob. rho a k-row mean containing z*
  (leakage m*/rho), else exactly H0. It describes `SubsampledMean(mode="shared")` and,
  approximately, Poisson sampling with rho = q.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

from dpaudit._validate import check_nonnegative, check_open_unit, check_positive
from dpaudit.stats import gdp_advantage, gdp_auc, gdp_delta, gdp_epsilon, gdp_tradeoff


def _vec(x, d: int, name: str) -> np.ndarray:
    a = np.broadcast_to(np.asarray(x, dtype=np.float64), (d,))
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    return a


def _check_rho(rho: float) -> float:
    r = float(rho)
    if not 0.0 < r <= 1.0:
        raise ValueError(f"rho must lie in (0, 1], got {rho!r}")
    return r


def leakage_score(mean, var, target, n: float, noise_var=0.0) -> float:
    """m = (1/n) ||z - mu||^2_{(C + C_gamma)^{-1}} (m* when noise_var = 0, m~ otherwise)."""
    mean = np.asarray(mean, dtype=np.float64)
    d = mean.size
    z = _vec(target, d, "target")
    v = _vec(var, d, "var") + _vec(noise_var, d, "noise_var")
    if np.any(v <= 0):
        raise ValueError("var + noise_var must be > 0 in every coordinate")
    n = check_positive(n, "n")
    return float(np.sum((z - mean) ** 2 / v) / n)


def misspecified_scores(mean, var, z_star, z_targ, n: float) -> tuple[float, float]:
    """(m_scal, m_targ) = ((1/n)(z_targ - mu)^T C^{-1}(z* - mu), (1/n)||z_targ - mu||^2_{C^-1})."""
    mean = np.asarray(mean, dtype=np.float64)
    d = mean.size
    v = _vec(var, d, "var")
    zs, zt = _vec(z_star, d, "z_star"), _vec(z_targ, d, "z_targ")
    n = check_positive(n, "n")
    return (
        float(np.sum((zt - mean) * (zs - mean) / v) / n),
        float(np.sum((zt - mean) ** 2 / v) / n),
    )


def misspecified_mu(mean, var, z_star, z_targ, n: float) -> float:
    """GDP parameter of the misspecified LR attack: |m_scal| / sqrt(m_targ) (Thm 4.3)."""
    m_scal, m_targ = misspecified_scores(mean, var, z_star, z_targ, n)
    if m_targ <= 0:
        raise ValueError("z_targ equals mu: the misspecified score is constant")
    return abs(m_scal) / np.sqrt(m_targ)


def linear_score_mu(weights, mean, var, target, n: float, noise_var=0.0) -> float:
    """Signed separation (E_in - E_out)/sd_out of any score w^T o + c on the exact/noisy mean.

    Under H0 Var(w^T o) = w^T (C + C_gamma) w / n and H1 shifts the mean by w^T (z - mu)/n.
    Covers the oracle LR (sqrt m*), misspecified, plug-in (for its realised estimates)
    and scalar-product scores.
    """
    mean = np.asarray(mean, dtype=np.float64)
    d = mean.size
    w = _vec(weights, d, "weights")
    z = _vec(target, d, "target")
    v = _vec(var, d, "var") + _vec(noise_var, d, "noise_var")
    n = check_positive(n, "n")
    sd = np.sqrt(np.sum(w * w * v) / n)
    if sd <= 0:
        raise ValueError("weights are zero: the score is constant")
    return float(np.sum(w * (z - mean)) / n / sd)


def lr_moments(m: float) -> dict[str, float]:
    """Asymptotic LR score moments: out N(-m/2, m), in N(m/2, m)."""
    m = check_nonnegative(m, "m")
    return {"mean_out": -m / 2.0, "var_out": m, "mean_in": m / 2.0, "var_in": m}


def power(alpha, m: float):
    """Power of the LR test at FPR alpha: Phi(z_alpha + sqrt(m)) (Eq. 4 / 9)."""
    return gdp_tradeoff(alpha, np.sqrt(check_nonnegative(m, "m")))


def roc_of_mu(alpha, mu: float):
    """Phi(z_alpha + mu) for any real separation mu (a negative mu is a reversed attack)."""
    a = np.asarray(alpha, dtype=np.float64)
    if np.any((a < 0) | (a > 1)) or not np.isfinite(mu):
        raise ValueError("alpha must lie in [0, 1] and mu must be finite")
    out = ndtr(ndtri(a) + mu)
    return float(out) if out.ndim == 0 else out


def leakage(m: float) -> float:
    """Optimal advantage Phi(sqrt(m)/2) - Phi(-sqrt(m)/2) (Eq. 3 / 8)."""
    return gdp_advantage(np.sqrt(check_nonnegative(m, "m")))


def lr_threshold(alpha: float, m: float) -> float:
    """Threshold with FPR alpha on the LR score: -m/2 + sqrt(m) z_{1 - alpha}."""
    a = check_open_unit(alpha, "alpha")
    m = check_nonnegative(m, "m")
    return float(-m / 2.0 + np.sqrt(m) * ndtri(1.0 - a))


def subsampled_power_paper(alpha, m: float, rho: float):
    """Seed 001 Eq. 10: Phi(z_alpha + sqrt(rho m*)) (per-coordinate inclusion)."""
    return power(alpha, _check_rho(rho) * check_nonnegative(m, "m"))


def subsampled_power_mixture(alpha, m: float, rho: float):
    """Shared inclusion event: rho Phi(z_alpha + sqrt(m*/rho)) + (1 - rho) alpha."""
    rho = _check_rho(rho)
    a = np.asarray(alpha, dtype=np.float64)
    out = rho * np.asarray(power(a, check_nonnegative(m, "m") / rho)) + (1.0 - rho) * a
    return float(out) if out.ndim == 0 else out


def subsampled_leakage_paper(m: float, rho: float) -> float:
    """2 Phi(sqrt(rho m*)/2) - 1."""
    return leakage(_check_rho(rho) * m)


def subsampled_leakage_mixture(m: float, rho: float) -> float:
    """max_a (TPR - FPR) of the mixture: rho (2 Phi(sqrt(m*/rho)/2) - 1)."""
    rho = _check_rho(rho)
    return rho * leakage(m / rho)


def subsampled_auc_mixture(m: float, rho: float) -> float:
    """AUC of the mixture ROC: rho Phi(sqrt(m*/rho)/sqrt 2) + (1 - rho)/2."""
    rho = _check_rho(rho)
    return rho * gdp_auc(np.sqrt(check_nonnegative(m, "m") / rho)) + (1.0 - rho) / 2.0


def mixture_delta(epsilon: float, mu: float, rho: float) -> float:
    """delta(eps) of in = rho N(mu,1) + (1-rho) N(0,1) against out = N(0,1), in||out direction.

    Exact by the amplification identity H_{e^eps}(rho P + (1-rho) Q || Q) =
    rho H_{e^eps'}(P || Q), eps' = log(1 + (e^eps - 1)/rho). (The out||in direction is
    not covered here; see `dpaudit.accounting` for the full subsampled-Gaussian profile.)
    """
    eps = check_nonnegative(epsilon, "epsilon")
    rho = _check_rho(rho)
    eps_p = float(np.log1p(np.expm1(eps) / rho))
    return rho * gdp_delta(check_positive(mu, "mu"), eps_p)


def mixture_epsilon(mu: float, rho: float, delta: float) -> float:
    """Smallest eps >= 0 with `mixture_delta`(eps) <= delta."""
    delta = check_open_unit(delta, "delta")
    if mixture_delta(0.0, mu, rho) <= delta:
        return 0.0
    hi = 1.0
    while mixture_delta(hi, mu, rho) > delta:
        hi *= 2.0
        if hi > 1e4:
            raise ValueError(f"epsilon for mu={mu}, rho={rho}, delta={delta} exceeds 1e4")
    return float(brentq(lambda e: mixture_delta(e, mu, rho) - delta, 0.0, hi, xtol=1e-10))


def gdp_view(mu: float, deltas=(1e-5,)) -> dict:
    """mu-GDP summary: mu, AUC, advantage, and eps(delta) for each delta (dpaudit.stats)."""
    mu = check_nonnegative(mu, "mu")
    eps = {str(d): (0.0 if mu == 0 else gdp_epsilon(mu, d)) for d in deltas}
    return {"mu": mu, "auc": gdp_auc(mu), "advantage": gdp_advantage(mu), "epsilon": eps}


def average_target_m(d: int, n: float) -> float:
    """E_{z ~ D}[m*] = d / n (seed 000 Remark 3.3): the average-target game's leakage score."""
    return check_positive(d, "d") / check_positive(n, "n")


def tpr_standard_error(alpha: float, roc, n_in: int, n_out: int) -> float:
    """Monte-Carlo s.e. of the empirical TPR at FPR alpha, for a theoretical ROC ``roc(a)``.

    TPR(1 - TPR)/n_in from the members, plus slope^2 alpha(1 - alpha)/n_out from the
    threshold estimated on the non-members (slope = the ROC's derivative at alpha).
    """
    a = check_open_unit(alpha, "alpha")
    t = float(roc(a))
    h = 1e-4 * min(a, 1 - a)
    slope = (float(roc(a + h)) - float(roc(a - h))) / (2 * h)
    return float(np.sqrt(t * (1 - t) / n_in + slope**2 * a * (1 - a) / n_out))
