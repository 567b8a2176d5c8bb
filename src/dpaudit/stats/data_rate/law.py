"""The exact law of the summed mixture log-likelihood ratio of a data-rate canary.

A Dirac gradient canary of norm r C on a coordinate no data gradient reaches, inserted with
probability q per step (the data's rate), sees at step t its coordinate of the noisy sum in
units of the claimed noise sigma C: u_t = D b_t + tau z_t, with b_t ~ Bernoulli(q_true) for a
member and 0 for a non-member, z_t ~ N(0, 1), D = r / sigma (the canary's shift), tau the
true noise over the claimed one (1 on a correct run). The audit's score (``attacks.mixture``,
DESIGN 4.3) is S = sum_t l(u_t), l(u) = log(1 - q_s + q_s exp(D_s u - D_s^2 / 2)), with the
score's own (q_s, D_s), the claimed ones. On a correct run (q_true = q_s, D = D_s, tau = 1) S is
the exact log-likelihood ratio of the T-step Poisson-subsampled Gaussian: its law under the
non-member is the mechanism's privacy-loss law, and every threshold test on S is a
Neyman-Pearson test of the mechanism.

l is increasing in u, so one step's law has a closed-form CDF: P(l(u) <= x) = P(u <= l^-1(x)),
with l^-1(x) = (log(expm1(x) + q_s) - log(q_s) + D_s^2 / 2) / D_s for x > log(1 - q_s). The
T-step sum's law is computed by discretising one step on a grid of width h (the mass of each
cell [k h - h / 2, k h + h / 2) from the CDF, the grid shifted so that its mean is the exact
one, as Opacus' PRV discretisation does), and composing T times by FFT on a circular window
around the sum's mass. The rounding adds a variance of at most T h^2 / 12 to the sum (with the
default h = sd / 4000: a relative 5e-9 of its variance); the tests check the CDFs against
exact simulation and the window against one twice as wide. Probabilities below about 1e-13 are
at the FFT's rounding floor; the audit needs rates of 1e-8 and above.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtr

from dpaudit._validate import check_count, check_open_unit, check_positive

_U_TAIL = 13.0  # one step's noise is truncated at 13 sd: mass beyond < 1e-38
_WINDOW_SD = 40.0  # the sum's window: 40 sd of the sum on each side of the two means
_MEAN_POINTS = 20_001  # trapezoid nodes of one step's exact mean (spectral: error < 1e-12)


def _inverse_step(x, q: float, d: float) -> np.ndarray:
    """u with l(u) = x (``-inf`` at and below log(1 - q), where l has no preimage)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = (np.log(np.expm1(x) + q) - np.log(q) + 0.5 * d * d) / d
    return np.where(x <= np.log1p(-q), -np.inf, u)


def step_log_lr(u, q: float, d: float) -> np.ndarray:
    """One step's score l(u) = log(1 - q + q exp(d u - d^2 / 2)), the number
    ``attacks.mixture.mixture_log_lr`` computes, as log1p(q expm1(.)): accurate for every u
    with d u < 700 (twice as fast as logaddexp; larger d u falls back to it)."""
    u = np.asarray(u, dtype=np.float64)
    x = d * u - 0.5 * d * d
    with np.errstate(over="ignore"):
        out = np.log1p(q * np.expm1(x))
    big = x > 700.0
    if np.any(big):
        out = np.where(big, np.logaddexp(np.log1p(-q), np.log(q) + x), out)
    return out


def _step_cdf_sf(x, q_s, d_s, q_t, d_t, tau, member: bool):
    """(CDF, survival) of one step's score at x, for a member or a non-member."""
    u = _inverse_step(x, q_s, d_s) / tau
    if not member:
        return ndtr(u), ndtr(-u)
    shifted = u - d_t / tau
    cdf = (1.0 - q_t) * ndtr(u) + q_t * ndtr(shifted)
    sf = (1.0 - q_t) * ndtr(-u) + q_t * ndtr(-shifted)
    return cdf, sf


def _step_moments(q_s, d_s, q_t, d_t, tau, member: bool) -> tuple[float, float]:
    """Exact mean and variance of one step's score (trapezoid in u, error < 1e-12)."""
    lo, hi = -_U_TAIL * tau - 10.0, _U_TAIL * tau + abs(d_t) + 10.0
    u = np.linspace(lo, hi, _MEAN_POINTS)
    du = u[1] - u[0]
    dens = np.exp(-0.5 * (u / tau) ** 2)
    if member:
        dens = (1.0 - q_t) * dens + q_t * np.exp(-0.5 * ((u - d_t) / tau) ** 2)
    dens = dens / (np.sqrt(2.0 * np.pi) * tau)
    lu = step_log_lr(u, q_s, d_s)
    mean = float(np.sum(lu * dens) * du)
    var = float(np.sum((lu - mean) ** 2 * dens) * du)
    return mean, var


@dataclass(frozen=True)
class MixtureScoreLaw:
    """The law of the summed score S of one member and one non-member canary, on grids.

    ``values_in`` / ``pmf_in``: the member's S takes value ``values_in[j]`` with probability
    ``pmf_in[j]`` (the discretised law, ascending values); likewise ``values_out`` /
    ``pmf_out`` for a non-member. ``params`` records what it was computed for. Rates at a
    threshold t (the audit's counts are binomial in them): ``sf_in(t)`` = P(member's S >= t),
    ``sf_out(t)``, ``cdf_in(t)`` = P(member's S < t), ``cdf_out(t)``.
    """

    values_in: np.ndarray
    pmf_in: np.ndarray
    values_out: np.ndarray
    pmf_out: np.ndarray
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("values_in", "pmf_in", "values_out", "pmf_out"):
            getattr(self, name).setflags(write=False)
        # suffix sums: P(S >= values[j]); written once (frozen dataclass)
        object.__setattr__(self, "_tail_in", _suffix(self.pmf_in))
        object.__setattr__(self, "_tail_out", _suffix(self.pmf_out))

    @property
    def exact_pair(self) -> bool:
        """True when the score is the exact log-LR of the pair (a correct run's law)."""
        p = self.params
        return (p.get("true_rate") == p.get("score_rate") and p.get("true_shift") ==
                p.get("score_shift") and p.get("noise_ratio") == 1.0)

    def sf_in(self, t) -> np.ndarray:
        """P(member's score >= t), vectorised."""
        return _sf(self.values_in, self._tail_in, t)

    def sf_out(self, t) -> np.ndarray:
        """P(non-member's score >= t), vectorised."""
        return _sf(self.values_out, self._tail_out, t)

    def cdf_in(self, t) -> np.ndarray:
        """P(member's score < t), vectorised."""
        return 1.0 - self.sf_in(t)

    def cdf_out(self, t) -> np.ndarray:
        """P(non-member's score < t), vectorised."""
        return 1.0 - self.sf_out(t)

    def thresholds(self) -> np.ndarray:
        """Candidate thresholds: the midpoints between the non-member grid's atoms (a threshold
        between two atoms is unambiguous on the grid)."""
        v = self.values_out
        return 0.5 * (v[1:] + v[:-1])

    def roc(self, x) -> np.ndarray:
        """The score's ROC: P(member's score > t) at the threshold t where P(non-member's
        score > t) = x, linear between the grid's thresholds (a randomised threshold test),
        vectorised. For a correct run's law (the score is the log-LR) it is the mechanism's
        own (Neyman-Pearson) curve."""
        x_t, y_t = self._roc_points()
        return np.interp(np.asarray(x, dtype=np.float64), x_t, y_t)

    def roc_reverse(self, y) -> np.ndarray:
        """The pair's other order: P(non-member's score < t) at the threshold where
        P(member's score < t) = y, linear between thresholds, vectorised."""
        y_t, q_t = self._roc_reverse_points()
        return np.interp(np.asarray(y, dtype=np.float64), y_t, q_t)

    def _threshold_tails(self) -> tuple[np.ndarray, np.ndarray]:
        """(P(member >= t), P(non-member >= t)) at ``thresholds()``: on one grid (the two
        laws' atoms within a quarter cell of each other, as ``mixture_score_law`` makes
        them) threshold j lies between atoms j and j + 1 of both, so the tails are read off
        by index; otherwise by search."""
        if not hasattr(self, "_tails_cache"):
            v_in, v_out = self.values_in, self.values_out
            if v_in.size == v_out.size and v_out.size > 1 and np.max(
                    np.abs(v_in - v_out)) < 0.25 * float(np.min(np.diff(v_out))):
                tails = (self._tail_in[1:-1], self._tail_out[1:-1])
            else:
                t = self.thresholds()
                tails = (self.sf_in(t), self.sf_out(t))
            object.__setattr__(self, "_tails_cache", tails)
        return self._tails_cache

    def _roc_points(self):
        if not hasattr(self, "_roc_cache"):
            sf_in, sf_out = self._threshold_tails()
            x_t = np.concatenate([[0.0], sf_out[::-1], [1.0]])
            y_t = np.concatenate([[0.0], sf_in[::-1], [1.0]])
            object.__setattr__(self, "_roc_cache", _last_of_runs(x_t, y_t))
        return self._roc_cache

    def _roc_reverse_points(self):
        if not hasattr(self, "_rev_cache"):
            sf_in, sf_out = self._threshold_tails()
            y_t = np.concatenate([[0.0], 1.0 - sf_in, [1.0]])
            q_t = np.concatenate([[0.0], 1.0 - sf_out, [1.0]])
            object.__setattr__(self, "_rev_cache", _last_of_runs(y_t, q_t))
        return self._rev_cache

    def mean(self, member: bool) -> float:
        """Mean of the member's (``True``) or non-member's score."""
        v, p = (self.values_in, self.pmf_in) if member else (self.values_out, self.pmf_out)
        return float(np.dot(v, p))

    def hockey_stick(self, epsilon) -> tuple[np.ndarray, np.ndarray]:
        """(delta of "member vs non-member", delta of "non-member vs member") at each epsilon:
        sup over events A of P(A) - e^eps Q(A), and of Q(A) - e^eps P(A), P the member's law,
        Q the non-member's. Only for ``exact_pair`` laws, where the score is the log-LR
        (dP/dQ = e^S), so each is an expectation of a factor in [0, 1], stable on the grid:
        E_P[(1 - e^(eps - S))_+] and E_Q[(1 - e^(eps + S))_+]."""
        if not self.exact_pair:
            raise ValueError("hockey_stick needs the exact pair's law (true parameters = the "
                             "score's): the score is then the log-likelihood ratio")
        e = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))[:, None]
        with np.errstate(over="ignore"):
            d1 = np.sum(self.pmf_in * np.maximum(1.0 - np.exp(e - self.values_in), 0.0), axis=1)
            d2 = np.sum(self.pmf_out * np.maximum(1.0 - np.exp(e + self.values_out), 0.0),
                        axis=1)
        return d1, d2

    def epsilon(self, delta: float) -> float:
        """Smallest epsilon with both hockey-stick deltas <= ``delta`` (bisection to 1e-6):
        the pair's exact (epsilon, delta), for comparison with an accountant."""
        delta = check_open_unit(delta, "delta")
        lo, hi = 0.0, 1.0
        while max(d[0] for d in self.hockey_stick(hi)) > delta:
            lo, hi = hi, 2.0 * hi
            if hi > 1e3:
                raise ValueError("epsilon beyond 1000 at this delta")
        if max(d[0] for d in self.hockey_stick(0.0)) <= delta:
            return 0.0
        while hi - lo > 1e-6:
            mid = 0.5 * (lo + hi)
            if max(d[0] for d in self.hockey_stick(mid)) > delta:
                lo = mid
            else:
                hi = mid
        return hi


def _last_of_runs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An ROC's points with x made non-decreasing and, where x repeats, the largest y kept
    (np.interp's points must increase)."""
    x, y = np.maximum.accumulate(x), np.maximum.accumulate(y)
    keep = np.concatenate([x[1:] != x[:-1], [True]])
    return x[keep], y[keep]


def _int_power(f: np.ndarray, n: int) -> np.ndarray:
    """f ** n for a complex array and an integer n >= 1, by repeated squaring (about 2 log2 n
    products: ten times faster than numpy's complex power, which goes through exp and log,
    and as accurate)."""
    out, base = None, f.copy()
    while True:
        if n & 1:
            out = base.copy() if out is None else out * base
        n >>= 1
        if not n:
            return out
        base *= base


def _suffix(pmf: np.ndarray) -> np.ndarray:
    out = np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]])
    return np.minimum(out, 1.0)


def _sf(values: np.ndarray, tail: np.ndarray, t) -> np.ndarray:
    t = np.asarray(t, dtype=np.float64)
    return tail[np.searchsorted(values, t, side="left")]


def mixture_score_law(
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    *,
    canary_norm: float = 1.0,
    true_rate: float | None = None,
    true_noise: float | None = None,
    true_norm: float | None = None,
    resolution: float = 4000.0,
) -> MixtureScoreLaw:
    """The law of the summed mixture log-LR for one member and one non-member canary.

    Args:
        steps: T, the number of steps.
        sample_rate: q, the claimed per-step inclusion probability (the score's q).
        noise_multiplier: the claimed sigma (the score's D = canary_norm / sigma).
        canary_norm: the canary's norm over the clip norm C (<= 1 for a neighbouring record).
        true_rate, true_noise, true_norm: the mechanism that really ran, when it differs from
            the claim (defaults: the claimed values): the canaries are inserted with
            probability ``true_rate``, the noise is ``true_noise`` x C, the canary's norm
            ``true_norm`` x C; the score keeps the claimed parameters, as the audit's does.
        resolution: the sum's standard deviation over the grid width h (default 4000).

    Returns:
        A ``MixtureScoreLaw``. Cost: one FFT of 2^19-2^21 points per side (0.1-0.5 s).
    """
    steps = check_count(steps, "steps", 1)
    q_s = check_open_unit(sample_rate, "sample_rate")
    sigma = check_positive(noise_multiplier, "noise_multiplier")
    r = check_positive(canary_norm, "canary_norm")
    q_t = q_s if true_rate is None else float(true_rate)
    if not 0.0 <= q_t <= 1.0:
        raise ValueError(f"true_rate must lie in [0, 1], got {true_rate!r}")
    tau = 1.0 if true_noise is None else check_positive(true_noise, "true_noise") / sigma
    r_t = r if true_norm is None else check_positive(true_norm, "true_norm")
    d_s, d_t = r / sigma, r_t / sigma
    resolution = check_positive(resolution, "resolution")

    mom = {m: _step_moments(q_s, d_s, q_t, d_t, tau, m) for m in (True, False)}
    sd = float(np.sqrt(steps * max(mom[True][1], mom[False][1])))
    h = sd / resolution
    u_max = _U_TAIL * tau + max(d_t, 0.0)
    x_max = float(step_log_lr(u_max, q_s, d_s))
    x_min = float(np.log1p(-q_s))
    k = np.arange(int(np.floor(x_min / h)) - 1, int(np.ceil(x_max / h)) + 2)
    edges = (np.append(k, k[-1] + 1) - 0.5) * h
    means = [steps * mom[m][0] for m in (True, False)]
    lo = min(means) - _WINDOW_SD * sd - 3.0 * x_max
    hi = max(means) + _WINDOW_SD * sd + 3.0 * x_max
    n_grid = 1 << int(np.ceil(np.log2((hi - lo) / h)))
    offset = int(np.round(lo / (steps * h)))  # each step's atoms start at index k - offset
    out = {}
    for member in (True, False):
        cdf, sf = _step_cdf_sf(edges, q_s, d_s, q_t, d_t, tau, member)
        upper = _inverse_step(edges[:-1], q_s, d_s) > 0
        cells = np.where(upper, sf[:-1] - sf[1:], cdf[1:] - cdf[:-1])
        cells = np.maximum(cells, 0.0)
        cells /= cells.sum()
        shift = mom[member][0] - float(np.dot(k * h, cells))
        a = np.zeros(n_grid)
        np.add.at(a, np.mod(k - offset, n_grid), cells)
        pmf = np.maximum(np.fft.irfft(_int_power(np.fft.rfft(a), steps), n_grid), 0.0)
        pmf /= pmf.sum()
        values = (np.arange(n_grid) + steps * offset) * h + steps * shift
        out[member] = (values, pmf)
    # one index range for both (atom i of the member's law and of the non-member's are the
    # same grid point up to the mean shifts' difference, below 1e-12)
    nz = np.flatnonzero((out[True][1] > 0) | (out[False][1] > 0))
    cut = slice(int(nz[0]), int(nz[-1]) + 1)
    out = {m: (v[cut], p[cut]) for m, (v, p) in out.items()}
    params = {"steps": steps, "score_rate": q_s, "score_shift": d_s, "true_rate": q_t,
              "true_shift": d_t, "noise_ratio": tau, "h": h, "grid": n_grid}
    return MixtureScoreLaw(out[True][0], out[True][1], out[False][0], out[False][1], params)
