"""The exact law of a one-run audit's correct guesses on ideal scores, and what it is built
from: the order statistics of the cut points (``order_statistic_nodes``).

Ideal scores: m independent canaries, each a member with probability 1/2, scores N(mu, 1) for
members and N(0, 1) for non-members (the Gaussian mechanism). "In" for the k+ top scores and
"out" for the k- bottom ones: V, the correct guesses, has an exact law. R2, the lower tail
fraction at the (k- + 1)-th smallest score, is Beta(k- + 1, m - k-); given it, the upper tail
fraction at the (k+ + 1)-th largest is (1 - R2) B with B ~ Beta(k+ + 1, m - k+ - k- - 1)
independent of R2; given both, the two groups are independent iid draws from the score law
above and below the cut points, so V = Bin(k+, pi(R1)) + Bin(k-, pi(R2)), pi(r) = P[member |
score above the upper r-quantile] (the bottom's is the top's: reflecting y -> mu - y swaps
members and non-members). Nested Gauss-Legendre over the two, the binomials convolved per node
pair (``pair_count_pmf``). ``design`` uses it to fix guess counts by the claim's exact median;
``validity.ceiling`` to compute the ceilings (with its own posteriors for regime bands).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import betainc, betaincinv, ndtr, ndtri, roots_legendre
from scipy.stats import binom

_Z = 8.0  # the normal scores' range of the quadrature (mass 1.2e-15 outside)


def gl_nodes(n: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = roots_legendre(n)
    return (x + 1) / 2, w / 2


def order_statistic_nodes(k, m: int, nodes: int):
    """Nodes and weights for E[f(R)], R ~ Beta(k + 1, m - k) = the (k+1)-th largest of m
    uniforms' tail fraction: R = Q(Phi(z)), Q the Beta quantile, z standard normal, and
    Gauss-Legendre in z on [-8, 8] (mass 1e-15 outside), split where R = 1/2 (pi(r) has
    a kink there, the loud band's gap in the scores). Returns the nodes r and 1 - r (each
    computed directly: accurate near 0 and 1) and the weights, shape k.shape + (nodes,)."""
    u, w = gl_nodes(max(nodes // 2, 2))
    k = np.asarray(k, dtype=np.float64)[..., None]
    zs = ndtri(betainc(k + 1, m - k, 0.5))  # z where R = 1/2
    zs = np.where(np.abs(zs) < _Z, zs, 0.0)
    z = np.concatenate([-_Z + (zs + _Z) * u, zs + (_Z - zs) * u], axis=-1)
    wz = np.concatenate([(zs + _Z) * w, (_Z - zs) * w], axis=-1) * np.exp(-z * z / 2) / np.sqrt(
        2 * np.pi)
    wz = wz / wz.sum(axis=-1, keepdims=True)  # the 1e-15 outside, and rounding
    return betaincinv(k + 1, m - k, ndtr(z)), betaincinv(m - k, k + 1, ndtr(-z)), wz


def ideal_posterior(mu: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """pi(r, 1 - r) = P[member | score above the upper r-quantile] for ideal scores (members
    N(mu, 1), non-members N(0, 1), 1/2 each): the quantile t of the mixture's survival
    function by vectorised bisection, then (1/2) P[N(mu, 1) > t] / r."""

    def posterior(r, rc):
        r = np.clip(np.asarray(r, dtype=np.float64), 1e-300, 1.0)
        lo, hi = np.full(r.shape, -40.0), np.full(r.shape, 40.0)
        for _ in range(80):
            t = 0.5 * (lo + hi)
            above = 0.5 * (ndtr(mu - t) + ndtr(-t)) > r
            lo, hi = np.where(above, t, lo), np.where(above, hi, t)
        t = 0.5 * (lo + hi)
        return np.clip(0.5 * ndtr(mu - t) / r, 0.0, 1.0)

    return posterior


def pair_count_pmf(posterior, m: int, k_plus: int, k_minus: int, *,
                   nodes: int = 24) -> np.ndarray:
    """The (k+ + k- + 1,) pmf of V (module doc) for the score law whose ``posterior(r, 1 - r)``
    is P[member | above the upper r-quantile] (``ideal_posterior(mu)`` for ideal scores), the
    bottom's by reflection. Needs 1 <= k+ and k+ + k- <= m - 1."""
    kp, km = int(k_plus), int(k_minus)
    if kp < 1 or km < 0 or kp + km > m - 1:
        raise ValueError(f"k_plus, k_minus: need 1 <= k+ and k+ + k- <= m - 1 = {m - 1}, "
                         f"got {kp}, {km}")
    if km == 0:
        r, rc, w = (a[0] for a in order_statistic_nodes(np.array([kp]), m, nodes))
        p = posterior(r, rc)
        return (binom.pmf(np.arange(kp + 1)[None, :], kp, p[:, None]) * w[:, None]).sum(0)
    r2, r2c, w2 = (a[0] for a in order_statistic_nodes(np.array([km]), m, nodes))
    b, _, w1 = (a[0] for a in order_statistic_nodes(np.array([kp]), m - km - 1, nodes))
    r1 = (1.0 - r2)[:, None] * b[None, :]  # (N2, N1)
    p1 = posterior(r1, 1.0 - r1).reshape(-1)
    p2 = posterior(r2, r2c)
    pmf1 = binom.pmf(np.arange(kp + 1)[None, :], kp, p1[:, None])  # (N2 N1, k+ + 1)
    pmf2 = np.repeat(binom.pmf(np.arange(km + 1)[None, :], km, p2[:, None]), b.size, axis=0)
    size = kp + km + 1
    n = 1 << int(np.ceil(np.log2(size)))
    conv = np.fft.irfft(np.fft.rfft(pmf1, n) * np.fft.rfft(pmf2, n), n)[:, :size]
    w = (w2[:, None] * w1[None, :]).reshape(-1)
    return np.clip((conv * w[:, None]).sum(0), 0.0, None)


def median_count(pmf: np.ndarray) -> int:
    """The median of a count's pmf: c - 1 for the smallest c with P[V >= c] <= 1/2."""
    survival = pmf[::-1].cumsum()[::-1]
    below = survival <= 0.5
    return int(np.argmax(below)) - 1 if below.any() else pmf.size - 1


__all__ = ["gl_nodes", "ideal_posterior", "median_count", "order_statistic_nodes",
           "pair_count_pmf"]
