"""The joint GDP test at one-sided order-statistic candidates (Nasr et al. 2023's GDP fit).

At an "out" candidate of rank k the true FPR is <= W ~ Beta(k+1, n_out - k) (exactly, see
``threshold_selection``) and, given the threshold, the false negatives are Binomial(n_in,
FNR). If the mechanism is mu-GDP, FNR >= G_mu(FPR) >= G_mu(W) with G_mu(a) =
Phi(Phi^-1(1 - a) - mu), so fn is stochastically larger than the mixture X* of
Binomial(n_in, G_mu(W)) over W and p(mu) = P(X* <= fn_observed) is a valid p-value ("in"
candidates: the same with the roles swapped, G_mu being its own inverse). p grows with mu;
a candidate's mu_lb is the supremum of the mu with p(mu) <= level.

**p as a distribution function.** Binomial(n, g) <= c exactly when the (c+1)-th smallest of n
uniforms exceeds g, and that order statistic is B ~ Beta(c+1, n-c). So with Z = Phi^-1(1 - W)
and Y = Phi^-1(B) independent, p(mu) = P(Z - Y <= mu): a candidate's mu_lb is the level-quantile
of D = Z - Y, both laws known in closed form (regularised incomplete beta functions).

**A lattice that only errs low.** On the lattice h * integers, Z is rounded down and Y up, so
D' = Z' - Y' <= D and P(D' <= mu) >= p(mu) for every mu: the level-quantile of D' never exceeds
the true mu_lb, and is below it by at most 2h (``_STEP``). The law of D' is the discrete
convolution of the two rounded laws (cell masses from ``betainc``), one FFT; mass beyond the
``eps``-quantiles of Z and Y is sent to the infinities on the side that raises P(D' <= mu), and
``_FLOAT_SLACK`` covers the arithmetic's rounding. One candidate costs one convolution, no
search.

**Dismissing candidates.** For any q, p(mu) >= P(Z <= z_q) P(Y >= z_q - mu) (the event
implies D <= mu), so mu_lb <= F_Z^-1(q) - F_Y^-1(1 - level / q): an upper bound on every
candidate at once (a few quantiles each). Candidates are visited by this bound, highest first,
and one whose bound is below the best lattice value found cannot win and is skipped.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betainc, betaincinv, ndtr, ndtri

from dpaudit.stats.threshold_selection import OneSidedCandidates

_STEP = 1e-3  # largest lattice step h: the returned mu_lb is within 2h below the exact one
_CELLS = 1024  # the step is refined to range / _CELLS for variables narrower than that
_FLOAT_SLACK = 1e-12  # added to every lattice p-value: cancellation in cumsum / FFT
_DIRECT_MAX = 200_000  # np.convolve below this product of lengths, FFT above


def _tail_eps(level: float) -> float:
    """Mass left beyond the quantile range of each variable (counted against the test)."""
    return min(1e-10, 1e-6 * level)


def _convolve(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Full linear convolution of two non-negative vectors (FFT when long)."""
    if x.size * y.size <= _DIRECT_MAX:
        return np.convolve(x, y)
    size = x.size + y.size - 1
    n = 1 << (size - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(x, n) * np.fft.rfft(y, n), n)[:size]
    return np.maximum(out, 0.0)


def lattice_mu(rank: int, n_own: int, cross: int, n_other: int, level: float,
               step: float | None = None) -> float:
    """A candidate's mu_lb on the lattice (module doc): sup{mu : P(D' <= mu) <= level}.

    ``rank``: own-side rank (W ~ Beta(rank+1, n_own-rank)); ``cross``: the other side's count
    at the threshold (< ``n_other``); ``level``: the test's level; ``step``: the lattice step
    (default: ``_STEP``, or the wider variable's range / ``_CELLS`` when that is finer).
    Returns -inf when even the lowest lattice value is not rejected.
    """
    a, b = rank + 1.0, float(n_own - rank)
    c, d = cross + 1.0, float(n_other - cross)
    eps = _tail_eps(level)
    # quantile ranges, each computed on the side of the Beta law that keeps its precision:
    # 1 - W ~ Beta(b, a) and 1 - B ~ Beta(d, c)
    z_lo, z_hi = ndtri(betaincinv(b, a, eps)), -ndtri(betaincinv(a, b, eps))
    y_lo, y_hi = ndtri(betaincinv(c, d, eps)), -ndtri(betaincinv(d, c, eps))
    if step is None:
        step = min(_STEP, max(z_hi - z_lo, y_hi - y_lo) / _CELLS)
    iz0, iz1 = int(np.floor(z_lo / step)), int(np.floor(z_hi / step))
    iy0, iy1 = int(np.ceil(y_lo / step)), int(np.ceil(y_hi / step))
    gz = np.arange(iz0, iz1 + 1) * step
    gy = np.arange(iy0, iy1 + 1) * step
    s_z = betainc(a, b, ndtr(-gz))  # P(Z >= g)
    c_y = betainc(c, d, ndtr(gy))  # P(Y <= g)
    # Z down: [g_j, g_j+1) -> g_j, Z >= last -> last, Z < first -> -inf;
    # Y up: (g_j-1, g_j] -> g_j, Y <= first -> first, Y > last -> +inf
    p_z = np.append(s_z[:-1] - s_z[1:], s_z[-1])
    p_y = np.insert(np.diff(c_y), 0, c_y[0])
    infinite = (1.0 - s_z[0]) + (1.0 - c_y[-1])  # D' = -inf: counts towards every p
    cdf = np.cumsum(_convolve(np.maximum(p_z, 0.0), np.maximum(p_y[::-1], 0.0)))
    cdf += infinite + _FLOAT_SLACK
    k = int(np.searchsorted(cdf, level, side="right"))  # first lattice value not rejected
    if k >= cdf.size:
        return np.inf
    return (iz0 - iy1 + k) * step


def _upper_bounds(cands: OneSidedCandidates, level: float) -> np.ndarray:
    """Per candidate, min over a few q of F_Z^-1(q) - F_Y^-1(1 - level/q) (module doc):
    >= the exact mu_lb, hence >= its lattice value. -inf where no test is possible."""
    out = cands.side == "out"
    n_own = np.where(out, cands.n_out, cands.n_in).astype(np.float64)
    n_other = np.where(out, cands.n_in, cands.n_out).astype(np.float64)
    rank = cands.rank.astype(np.float64)
    cross = np.minimum(cands.cross, n_other - 1.0)
    q = level ** np.linspace(0.05, 0.95, 7)[:, None]
    z = ndtri(betaincinv(n_own - rank, rank + 1.0, q))  # Z's q-quantile: Phi(z) ~ 1 - W
    y = -ndtri(betaincinv(n_other - cross, cross + 1.0, level / q))  # P(Y >= y) = level/q
    bound = np.min(z - y, axis=0)
    return np.where(cands.cross < n_other, bound, -np.inf)


def joint_gdp_mu(cands: OneSidedCandidates, level: float) -> tuple[float, int | None]:
    """Largest mu rejected by a joint test at some candidate: (mu_lb, index) or (0.0, None).

    Each candidate's mu_lb is its lattice quantile (module doc), never above the exact
    supremum of the mu with p(mu) <= ``level``; with ``level`` = beta / m a union bound over
    the m candidates makes max mu_lb a level-beta bound. Only positive values count; of
    candidates with the same mu_lb the one listed first is reported.
    """
    best, index = 0.0, None
    bounds = _upper_bounds(cands, level)
    for i in np.argsort(-bounds, kind="stable"):
        i = int(i)
        if bounds[i] < best or (bounds[i] == best and index is not None and i > index):
            break  # sorted: no later candidate can win either
        out = cands.side[i] == "out"
        n_own, n_other = (cands.n_out, cands.n_in) if out else (cands.n_in, cands.n_out)
        mu = lattice_mu(int(cands.rank[i]), n_own, int(cands.cross[i]), n_other, level)
        if mu > best or (mu == best and mu > 0 and (index is None or i < index)):
            best, index = float(mu), i
    return best, index
