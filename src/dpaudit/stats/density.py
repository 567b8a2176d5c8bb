"""Density-estimation audit (seed 002, Sections 4-5): hockey-stick divergence of histograms.

For score samples P (members) and Q (non-members) binned on a shared histogram
(``dpaudit.stats.histogram``), H_{e^eps}(P_hat || Q_hat) = sum_j [p_j - e^eps q_j]_+
estimates the privacy profile; by data processing the binned true distributions have a
profile no larger than the mechanism's (Lemma 4.1).

Rigorous lower bound (Lemmas 4.2 / 4.3). Canonne's bound: with probability >= 1 - b,
TV(p, p_hat) <= tau(n, k, b) = max(sqrt(k / n), sqrt(2 ln(2 / b) / n)) for n samples on k bins.
We spend b = beta / 2 on each histogram, so BOTH hold jointly with probability >= 1 - beta
(union bound over the two histograms). On that event, for either direction and every eps
simultaneously (the two directions reuse the same two events, so no further split),

    H(P~ || Q~) >= H(P_hat || Q_hat) - tau_P - e^eps tau_Q,
    H(Q~ || P~) >= H(Q_hat || P_hat) - tau_Q - e^eps tau_P,

which is Lemma 4.3's (1 + e^eps) tau when the group sizes are equal. delta_lb(eps) is the
larger of the two (floored at 0) and eps_lb(delta) = sup{eps : delta_lb(eps) > delta}.
Caveat: with the default data-driven bins the bin edges depend (weakly, through a, b, h) on
the same scores; pass ``edges`` for bins fixed in advance when strict validity matters.

``density_tv`` additionally ASSUMES a Gaussian mechanism: TV_lb = TV_hat - tau_P - tau_Q,
then TV = 2 Phi(mu / 2) - 1 gives mu_lb (sigma_ub = 1 / mu_lb at sensitivity 1), and
eps = eps(delta) of mu_lb-GDP.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from dpaudit._validate import check_count, check_open_unit, check_real_array, check_scores
from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.stats.histogram import histograms
from dpaudit.stats.result import ASSUME_GDP, EpsilonBound


def _check_distribution(x, name: str) -> np.ndarray:
    arr = check_real_array(x, name).reshape(-1)
    if arr.size == 0 or np.any(arr < 0):
        raise ValueError(f"{name} must be a non-empty array of finite non-negative probabilities")
    if abs(arr.sum() - 1.0) > 1e-9:
        raise ValueError(f"{name} must sum to 1, got {arr.sum()!r}")
    return arr


def hockey_stick(p, q, epsilon):
    """H_{e^eps}(P || Q) = sum_j max(p_j - e^eps q_j, 0) for discrete P, Q on the same support.

    ``epsilon`` may be a scalar (returns float) or an array (returns an array); any real eps.
    """
    p = _check_distribution(p, "p")
    q = _check_distribution(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same length, got {p.size} and {q.size}")
    eps = check_real_array(epsilon, "epsilon")
    out = _hs(p, q, eps)
    return float(out) if out.ndim == 0 else out


def _hs(p: np.ndarray, q: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Unchecked vectorised hockey-stick over an array of eps."""
    e = np.exp(np.asarray(eps, dtype=np.float64))[..., None]
    return np.sum(np.maximum(p - e * q, 0.0), axis=-1)


def canonne_tau(n: int, k: int, beta: float) -> float:
    """TV radius that an n-sample, k-bin empirical distribution is within w.p. >= 1 - beta."""
    n, k = check_count(n, "n", 1), check_count(k, "k", 1)
    beta = check_open_unit(beta, "beta")
    return float(max(np.sqrt(k / n), np.sqrt(2.0 * np.log(2.0 / beta) / n)))


def histogram_privacy_profile(
    scores_in, scores_out, epsilons, *, confidence: float | None = None, **bin_options
) -> np.ndarray:
    """delta_hat(eps) = max(H(P_hat||Q_hat), H(Q_hat||P_hat)) on a grid of eps (an estimate).

    With ``confidence`` set, returns the rigorous lower bound delta_lb(eps) instead (module
    doc). ``bin_options``: bin_rule, n_bins, end_quantiles, edges (``histogram.histograms``).
    """
    s_in = check_scores(scores_in, "scores_in")
    s_out = check_scores(scores_out, "scores_out")
    eps = check_real_array(epsilons, "epsilons")
    p, q, _ = histograms(s_in, s_out, **bin_options)
    if confidence is None:
        return np.maximum(_hs(p, q, eps), _hs(q, p, eps))
    beta = 1.0 - check_open_unit(confidence, "confidence")
    t_in = canonne_tau(s_in.size, p.size, beta / 2)
    t_out = canonne_tau(s_out.size, p.size, beta / 2)
    e = np.exp(eps)
    lb = np.maximum(_hs(p, q, eps) - t_in - e * t_out, _hs(q, p, eps) - t_out - e * t_in)
    return np.maximum(lb, 0.0)


def _sup_eps(a: np.ndarray, b: np.ndarray, t_a: float, t_b: float, delta: float) -> float:
    """sup{eps >= 0 : H(A||B)(eps) - t_a - e^eps t_b > delta} by bisection (0 if empty)."""

    def g(x: float) -> float:
        return float(_hs(a, b, np.array(x))) - t_a - np.exp(x) * t_b - delta

    if g(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, float(np.log(1.0 / t_b)) + 1.0  # g(hi) < 0 since e^hi t_b > 1
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if g(mid) > 0:
            lo = mid
        else:
            hi = mid
    return lo


def density_bound(
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    *,
    delta: float,
    confidence: float,
    tv_only: bool = False,
    **bin_options,
) -> EpsilonBound:
    """The ``density`` (or, with ``tv_only``, ``density_tv``) lower bound; see module doc."""
    p, q, edges = histograms(scores_in, scores_out, **bin_options)
    k = p.size
    beta = 1.0 - confidence
    t_in = canonne_tau(scores_in.size, k, beta / 2)
    t_out = canonne_tau(scores_out.size, k, beta / 2)
    tv_hat = float(0.5 * np.sum(np.abs(p - q)))
    details = {"n_bins": k, "tau_in": t_in, "tau_out": t_out, "tv_hat": tv_hat}
    details["edges_range"] = [float(edges[0]), float(edges[-1])]
    mu_lower = None
    if tv_only:
        tv_lb = tv_hat - t_in - t_out
        details["tv_lower"] = tv_lb
        if tv_lb > 0:
            mu_lower = float(2.0 * ndtri(0.5 * (1.0 + tv_lb)))
            details["sigma_upper"] = 1.0 / mu_lower
            eps = gdp_epsilon(mu_lower, delta)
        else:
            mu_lower, eps = 0.0, 0.0
        method = "density_tv"
    else:
        e1 = _sup_eps(p, q, t_in, t_out, delta)
        e2 = _sup_eps(q, p, t_out, t_in, delta)
        eps = max(e1, e2)
        details["direction"] = "in||out" if e1 >= e2 else "out||in"
        method = "density"
    return EpsilonBound(
        epsilon=float(eps),
        method=method,
        confidence=confidence,
        delta=delta,
        n_in=int(scores_in.size),
        n_out=int(scores_out.size),
        mu_lower=mu_lower,
        details=details,
        assumption=ASSUME_GDP if tv_only else None,
    )
