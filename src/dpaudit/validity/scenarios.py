"""Score-generating "mechanisms" whose privacy is known exactly: the ground truth of the suite.

Each scenario is a pair of distributions on the real line, P (scores of members) and Q
(scores of non-members), with its TRUE privacy:

* ``hockey_stick(eps, reverse=False)``: H_{e^eps}(P || Q) = sup_S P(S) - e^eps Q(S)
  (``reverse=True``: H_{e^eps}(Q || P)), for any real eps;
* ``true_epsilon(delta)``: the smallest eps >= 0 with both H_{e^eps}(P||Q) <= delta and
  H_{e^eps}(Q||P) <= delta (``delta = 0``: the pure-DP epsilon, possibly inf);
* ``tradeoff(alpha)``: the trade-off curve of "member" = P against Q: the smallest FNR
  P(test says non-member) of ANY test (randomised, not only thresholds) whose FPR
  Q(test says member) is <= alpha. ``tradeoff_reverse`` is the curve of the pair in the other
  order (the test "non-member" = Q against P), the second argument of
  ``dpaudit.stats.claim.claim_test``; symmetric scenarios return the same curve.

The curves are meant as the *claimed curve of a correct mechanism*: a claim test must not
reject them more often than its error level. So every curve is rounded DOWN: the value
returned is the exact curve minus ``CURVE_MARGIN`` (1e-9, far above the float64 rounding of
the CDFs involved), clipped to [0, 1]; it is never above the true curve. The 100-step
subsampled Gaussian's curve comes from a PRV upper bound on its privacy profile and is lower
still (see that class).

Why: an epsilon lower bound that exceeds the truth more often than 1 - confidence is not a
bound. Measuring that needs mechanisms whose truth is known, covering the shapes that break
methods tuned to Gaussians: heavy tails (Student-t, whose likelihood ratio is NOT monotone,
so optimal tests are not thresholds on the score), pure-DP mechanisms (Laplace, logistic),
ties (integer scores), asymmetric pairs (Poisson subsampling) and DP-SGD's own composition.

How exact each truth is (``exactness`` of each class):

* Gaussian shift: closed form (mu-GDP, ``dpaudit.stats.gdp``).
* Laplace, logistic, one-step subsampled Gaussian: closed-form profiles and curves (CDF
  differences on the likelihood-ratio level sets), exact to float64 rounding.
* Student-t: the level sets {p > c q} are solved exactly (they are given by a quadratic), so
  the profile is P(S) - e^eps Q(S) from Student-t CDFs: the integral of max(p - e^eps q, 0)
  done analytically, checked against quadrature and Monte Carlo in the tests; the curve is
  exact at 2^16 tabulated Neyman-Pearson tests and, between them, the larger of the two
  neighbours' supporting lines (below the convex curve, by < 1e-9); the tests check it
  against the profile through the f-DP duality f(a) = sup_{eps in R} 1 - delta(eps) - e^eps a.
* Integer scores: exact finite sums.
* 100-step subsampled Gaussian: Opacus' PRV discretisation with its error bounds
  (eps_error 0.01, delta_error 1e-11): the profile returned is an UPPER bound, so the
  truth is an upper bound too, at most ~0.01 above the exact epsilon.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.special import expit, log_ndtr, logit, ndtr, ndtri, stdtr
from scipy.stats import binom, poisson

from dpaudit._validate import check_delta
from dpaudit.stats.gdp import gdp_epsilon

CURVE_MARGIN = 1e-9
"""Every claimed curve is the exact curve minus this (then clipped to [0, 1])."""

_BISECT_ITERS = 200
_TABLE_SIZE = 2**16 + 1


def _alpha(alpha) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any((a < 0) | (a > 1)):
        raise ValueError("alpha must lie in [0, 1]")
    return a


def _round_down(beta: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Curve value minus the stated margin, clipped to [0, 1], shaped like ``alpha``."""
    out = np.clip(np.asarray(beta, dtype=np.float64) - CURVE_MARGIN, 0.0, 1.0)
    return out.reshape(np.shape(alpha))


def _check_delta(delta: float) -> float:
    return check_delta(delta, zero_ok=True)


@dataclass(frozen=True)
class Scenario(ABC):
    """A pair (P = member scores, Q = non-member scores) with exactly known privacy.

    Subclasses set ``symmetric`` (True when (P, Q) and (Q, P) have the same trade-off curve),
    ``monotone`` (True when the likelihood ratio p/q is non-decreasing in the score, so
    thresholds on the score are optimal tests) and ``exactness`` (how exact the truth is).
    """

    symmetric: ClassVar[bool] = True
    monotone: ClassVar[bool] = True
    exactness: ClassVar[str] = "exact"

    @property
    @abstractmethod
    def name(self) -> str:
        """Short identifier (the key in ``SCENARIOS``)."""

    @abstractmethod
    def sample(
        self, n_in: int, n_out: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n_in`` member scores from P and ``n_out`` non-member scores from Q.

        Args:
            n_in: number of member scores.
            n_out: number of non-member scores.
            rng: a ``numpy.random.Generator`` (all randomness comes from it).
        """

    @abstractmethod
    def _hs(self, eps: np.ndarray, reverse: bool) -> np.ndarray:
        """H_{e^eps}(P||Q) (or (Q||P) if ``reverse``) for an array of eps >= 0."""

    @abstractmethod
    def pure_epsilon(self) -> float:
        """Pure-DP epsilon: sup |log p/q| over both directions (inf when unbounded)."""

    @abstractmethod
    def tradeoff(self, alpha) -> np.ndarray:
        """Exact trade-off curve of P against Q at FPR ``alpha`` (array), rounded down."""

    def tradeoff_reverse(self, alpha) -> np.ndarray:
        """Trade-off curve of the pair in the other order (Q against P), rounded down."""
        if not self.symmetric:  # pragma: no cover - asymmetric subclasses override
            raise TypeError(f"{type(self).__name__} is asymmetric and must define its reverse")
        return self.tradeoff(alpha)

    def hockey_stick(self, epsilon, *, reverse: bool = False) -> np.ndarray:
        """H_{e^eps}(P||Q) (``reverse``: H_{e^eps}(Q||P)) for real ``epsilon`` (array).

        Negative eps use H_g(P||Q) = 1 - g + g H_{1/g}(Q||P).
        """
        eps = np.asarray(epsilon, dtype=np.float64)
        flat = eps.reshape(-1)
        out = np.empty_like(flat)
        pos = flat >= 0
        if np.any(pos):
            out[pos] = self._hs(flat[pos], reverse)
        if np.any(~pos):
            g = np.exp(flat[~pos])
            out[~pos] = 1.0 - g + g * self._hs(-flat[~pos], not reverse)
        return np.clip(out, 0.0, 1.0).reshape(eps.shape)

    def _profile(self, eps: float) -> float:
        e = np.array([eps])
        return float(max(self._hs(e, False)[0], self._hs(e, True)[0]))

    def true_epsilon(self, delta: float) -> float:
        """Smallest eps >= 0 with H_{e^eps}(P||Q) <= delta and H_{e^eps}(Q||P) <= delta.

        Args:
            delta: in [0, 1); 0 gives the pure-DP epsilon (``pure_epsilon``, maybe inf).

        Bisection to 1e-12 on the profile; returns the upper end of the bracket (a value at
        which both divergences are <= delta).
        """
        delta = _check_delta(delta)
        if delta == 0.0:
            return self.pure_epsilon()
        if self._profile(0.0) <= delta:
            return 0.0
        pure = self.pure_epsilon()
        hi = pure if np.isfinite(pure) else 1.0
        while self._profile(hi) > delta:
            hi *= 2.0
            if hi > 1e4:
                raise ValueError(f"epsilon at delta={delta} exceeds 1e4")
        lo = 0.0
        for _ in range(_BISECT_ITERS):
            mid = 0.5 * (lo + hi)
            if self._profile(mid) > delta:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-12 * max(1.0, hi):
                break
        return float(hi)

    @abstractmethod
    def llr(self, x) -> np.ndarray:
        """log p(x)/q(x), the Neyman-Pearson statistic (used by the tests' simulated tests)."""


# ---------------------------------------------------------------------------------------------
# Gaussian shift


@dataclass(frozen=True)
class GaussianShift(Scenario):
    """P = N(mu, 1), Q = N(0, 1): exactly mu-GDP (truth: ``dpaudit.stats.gdp_epsilon``)."""

    mu: float = 1.0
    exactness: ClassVar[str] = "closed form (mu-GDP)"

    @property
    def name(self) -> str:
        return f"gaussian_mu{self.mu:g}"

    def sample(self, n_in, n_out, rng):
        return rng.normal(self.mu, 1.0, n_in), rng.normal(0.0, 1.0, n_out)

    def _hs(self, eps, reverse):
        mu = self.mu
        with np.errstate(over="ignore", under="ignore"):
            val = np.exp(log_ndtr(-eps / mu + mu / 2)) - np.exp(eps + log_ndtr(-eps / mu - mu / 2))
        return np.maximum(val, 0.0)

    def pure_epsilon(self):
        return float("inf")

    def true_epsilon(self, delta):
        """``gdp_epsilon(mu, delta)`` (inf at delta = 0). Args: delta in [0, 1)."""
        delta = _check_delta(delta)
        return float("inf") if delta == 0.0 else gdp_epsilon(self.mu, delta)

    def tradeoff(self, alpha):
        a = _alpha(alpha)
        return _round_down(ndtr(-ndtri(a) - self.mu), a)

    def llr(self, x):
        x = np.asarray(x, dtype=np.float64)
        return self.mu * x - self.mu**2 / 2


# ---------------------------------------------------------------------------------------------
# No signal at all


@dataclass(frozen=True)
class NoSignal(Scenario):
    """P = Q = N(0, 1): members and non-members score alike. The truth is epsilon 0 at every
    delta, so any positive certified epsilon is above it (the sharpest test of a design
    mismatch: the p = 1/2 one-run bound certified 2.47 here with 200 members against 5000)."""

    exactness: ClassVar[str] = "exact (identical distributions)"

    @property
    def name(self) -> str:
        return "no_signal"

    def sample(self, n_in, n_out, rng):
        return rng.normal(0.0, 1.0, n_in), rng.normal(0.0, 1.0, n_out)

    def _hs(self, eps, reverse):
        return np.maximum(-np.expm1(eps), 0.0)  # H_g(P||P) = (1 - g)_+

    def pure_epsilon(self):
        return 0.0

    def tradeoff(self, alpha):
        a = _alpha(alpha)
        return _round_down(1.0 - a, a)

    def llr(self, x):
        return np.zeros_like(np.asarray(x, dtype=np.float64))


# ---------------------------------------------------------------------------------------------
# Laplace shift


@dataclass(frozen=True)
class LaplaceShift(Scenario):
    """P = Laplace(shift, scale), Q = Laplace(0, scale): pure eps0 = shift / scale.

    Profile (closed form): delta(eps) = 1 - exp((eps - eps0) / 2) for 0 <= eps <= eps0, 0
    beyond; so epsilon(delta) = eps0 + 2 log(1 - delta). Curve (Dong, Roth & Su 2019):
    1 - e^eps0 a for a < e^-eps0 / 2; e^-eps0 / (4 a) up to a = 1/2; e^-eps0 (1 - a) beyond.
    """

    shift: float = 1.0
    scale: float = 1.0
    exactness: ClassVar[str] = "closed form"

    @property
    def name(self) -> str:
        return f"laplace_b{self.scale:g}"

    @property
    def eps0(self) -> float:
        return self.shift / self.scale

    def sample(self, n_in, n_out, rng):
        return rng.laplace(self.shift, self.scale, n_in), rng.laplace(0.0, self.scale, n_out)

    def _hs(self, eps, reverse):
        return np.maximum(-np.expm1((np.minimum(eps, self.eps0) - self.eps0) / 2.0), 0.0)

    def pure_epsilon(self):
        return float(self.eps0)

    def tradeoff(self, alpha):
        a = _alpha(alpha)
        e0 = self.eps0
        low = 0.5 * np.exp(-e0)
        with np.errstate(divide="ignore"):
            mid = np.exp(-e0) / (4.0 * a)
        beta = np.where(
            a < low, 1.0 - np.exp(e0) * a, np.where(a <= 0.5, mid, np.exp(-e0) * (1 - a))
        )
        return _round_down(beta, a)

    def llr(self, x):
        x = np.asarray(x, dtype=np.float64)
        return (np.abs(x) - np.abs(x - self.shift)) / self.scale


# ---------------------------------------------------------------------------------------------
# Logistic shift


@dataclass(frozen=True)
class LogisticShift(Scenario):
    """P = Logistic(shift, scale), Q = Logistic(0, scale): pure eps = shift / scale.

    The likelihood ratio is increasing in the score, with level sets solved in closed form:
    with m = shift/scale and g = exp((eps - m)/2), p/q = e^eps at x/scale = -log((1-g)/(g e^m - 1)).
    Default shift 2, scale 1: pure eps 2, eps(1e-5) = 1.99 (the issue's logistic case).
    """

    shift: float = 2.0
    scale: float = 1.0
    exactness: ClassVar[str] = "closed form"

    @property
    def name(self) -> str:
        return f"logistic_shift{self.shift:g}"

    @property
    def m(self) -> float:
        return self.shift / self.scale

    def sample(self, n_in, n_out, rng):
        return rng.logistic(self.shift, self.scale, n_in), rng.logistic(0.0, self.scale, n_out)

    def _hs(self, eps, reverse):
        m = self.m
        e = np.minimum(eps, m)
        g = np.exp((e - m) / 2.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = -np.log((1.0 - g) / np.expm1(m + np.log(g)))  # threshold, in units of scale
            val = expit(m - x) - np.exp(e) * expit(-x)
        return np.where(eps >= m, 0.0, np.maximum(np.nan_to_num(val, nan=0.0), 0.0))

    def pure_epsilon(self):
        return float(self.m)

    def tradeoff(self, alpha):
        a = _alpha(alpha)
        with np.errstate(divide="ignore"):
            beta = expit(-logit(a) - self.m)
        return _round_down(beta, a)

    def llr(self, x):
        z = np.asarray(x, dtype=np.float64) / self.scale
        m = self.m
        return m + 2.0 * np.logaddexp(0.0, -z) - 2.0 * np.logaddexp(0.0, m - z)


# ---------------------------------------------------------------------------------------------
# Student-t shift (likelihood ratio not monotone)


@dataclass(frozen=True)
class StudentTShift(Scenario):
    """P = shift + t_df, Q = t_df (unit scale). The likelihood ratio is NOT monotone.

    p/q = r(x)^k with r(x) = (df + x^2) / (df + (x - shift)^2), k = (df + 1) / 2: it rises
    above 1 on the right, falls below 1 on the left and returns to 1 in both tails, so the
    optimal tests are intervals, not thresholds on the score. The set {p > c^k q} is
    {(1 - c) x^2 + 2 c m x + df (1 - c) - c m^2 > 0}: solved exactly, its P and Q masses are
    Student-t CDF differences, so the profile P(S) - e^eps Q(S) is the integral of
    max(p - e^eps q, 0) in closed form. r ranges over [1/r_max, r_max]: pure eps = k log r_max
    (df 3, shift 1: 1.139). Symmetric: x -> shift - x swaps P and Q.
    """

    df: float = 3.0
    shift: float = 1.0
    monotone: ClassVar[bool] = False
    exactness: ClassVar[str] = "exact level sets + Student-t CDFs (checked by quadrature)"

    @property
    def name(self) -> str:
        return f"student_t{self.df:g}"

    @property
    def k(self) -> float:
        return (self.df + 1.0) / 2.0

    @property
    def r_max(self) -> float:
        nu, m2 = self.df, self.shift**2
        b = 2.0 * nu + m2
        return float((b + np.sqrt(b * b - 4.0 * nu * nu)) / (2.0 * nu))

    def sample(self, n_in, n_out, rng):
        return self.shift + rng.standard_t(self.df, n_in), rng.standard_t(self.df, n_out)

    def _masses(self, c: np.ndarray, loc: float) -> tuple[np.ndarray, np.ndarray]:
        """(mass of S_c, mass of its complement) under loc + t_df, S_c = {r(x) > c}."""
        nu, m = self.df, self.shift
        c = np.asarray(c, dtype=np.float64)
        a = 1.0 - c
        disc = np.maximum(c * m * m - nu * a * a, 0.0)
        qq = -(c * m + np.sqrt(disc))
        cc = nu * a - c * m * m
        with np.errstate(divide="ignore", invalid="ignore"):
            r1 = np.where(a == 0.0, -np.inf, qq / a)  # c < 1: the lower root; c > 1: the upper
        r2 = cc / qq

        def cdf(x):
            return stdtr(nu, x - loc)

        def sf(x):
            return stdtr(nu, loc - x)

        low = c <= 1.0  # S = (-inf, r1) U (r2, inf)
        in_low = cdf(r1) + sf(r2)
        out_low = np.maximum(cdf(r2) - cdf(r1), 0.0)
        in_high = np.maximum(sf(r2) - sf(r1), 0.0)  # c > 1: S = (r2, r1)
        out_high = cdf(r2) + sf(r1)
        s_in = np.where(low, in_low, in_high)
        s_out = np.where(low, out_low, out_high)
        rmax = self.r_max
        s_in = np.where(c >= rmax, 0.0, np.where(c <= 1.0 / rmax, 1.0, s_in))
        s_out = np.where(c >= rmax, 1.0, np.where(c <= 1.0 / rmax, 0.0, s_out))
        return s_in, s_out

    def _hs(self, eps, reverse):
        # symmetric pair: H(Q||P) = H(P||Q)
        c = np.exp(eps / self.k)
        p_s, _ = self._masses(c, self.shift)
        q_s, _ = self._masses(c, 0.0)
        return np.maximum(p_s - np.exp(eps) * q_s, 0.0)

    def pure_epsilon(self):
        return float(self.k * np.log(self.r_max))

    @functools.cached_property
    def _np_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Neyman-Pearson tests {r > c} on a fine grid of log c: (FPR, FNR, slope), by FPR."""
        # dense near the ends (c -> r_max or 1/r_max, where the FPR moves like sqrt(dc))
        u = np.log(self.r_max) * np.cos(np.linspace(np.pi, 0.0, _TABLE_SIZE))
        c = np.exp(u)
        fpr, _ = self._masses(c, 0.0)
        _, fnr = self._masses(c, self.shift)
        gamma = c**self.k  # the likelihood ratio on the boundary of the test's region
        return fpr[::-1], fnr[::-1], gamma[::-1]

    def tradeoff(self, alpha):
        """Exact at the tabulated Neyman-Pearson tests {r > c} (2^16 levels c), in between
        the larger of the two neighbours' supporting lines beta_i - gamma_i (a - a_i).

        The curve is convex with slope -gamma_i at the test of level gamma_i, so every
        supporting line lies below it (the safe side); the gap to the curve is < 1e-9.
        """
        a = _alpha(alpha)
        flat = a.reshape(-1)
        fpr, fnr, gamma = self._np_table
        j = np.clip(np.searchsorted(fpr, flat), 1, fpr.size - 1)
        left = fnr[j - 1] - gamma[j - 1] * (flat - fpr[j - 1])
        right = fnr[j] - gamma[j] * (flat - fpr[j])
        beta = np.maximum(left, right)
        beta = np.where(flat <= 0.0, 1.0, np.where(flat >= 1.0, 0.0, beta))
        return _round_down(beta, a)

    def llr(self, x):
        x = np.asarray(x, dtype=np.float64)
        nu = self.df
        return self.k * (np.log1p(x * x / nu) - np.log1p((x - self.shift) ** 2 / nu))


# ---------------------------------------------------------------------------------------------
# Integer scores with ties


class DiscreteScores(Scenario):
    """Integer scores 0..K with ties, P and Q given by their probabilities (``pmfs``).

    Everything is a finite sum: H_g(P||Q) = sum_k max(p_k - g q_k, 0); the curve is the
    piecewise-linear Neyman-Pearson curve (randomised tests at the atoms), through the
    points (Q, P) masses of the atoms sorted by p_k / q_k.
    """

    symmetric: ClassVar[bool] = False
    exactness: ClassVar[str] = "exact finite sums"

    @abstractmethod
    def pmfs(self) -> tuple[np.ndarray, np.ndarray]:
        """(P, Q) probabilities of the scores 0..K."""

    def _hs(self, eps, reverse):
        p, q = self.pmfs()
        if reverse:
            p, q = q, p
        g = np.exp(eps)[:, None]
        return np.maximum(p[None, :] - g * q[None, :], 0.0).sum(axis=1)

    def pure_epsilon(self):
        p, q = self.pmfs()
        with np.errstate(divide="ignore"):
            lr = np.abs(np.log(p) - np.log(q))
        return float(np.max(lr[(p > 0) | (q > 0)]))

    @staticmethod
    def _np_curve(alpha: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        """1 - (largest P-mass of a test with Q-mass <= alpha), decide 'p' at high p/q."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
        order = np.argsort(-ratio, kind="stable")
        fpr = np.concatenate([[0.0], np.cumsum(q[order])])
        tpr = np.concatenate([[0.0], np.cumsum(p[order])])
        fpr, tpr = np.minimum(fpr, 1.0), np.minimum(tpr, 1.0)
        # merge zero-width steps (atoms with q = 0): keep the largest TPR at each FPR
        keep = np.r_[np.diff(fpr) > 0, True]
        return 1.0 - np.interp(alpha, fpr[keep], tpr[keep])

    def tradeoff(self, alpha):
        a = _alpha(alpha)
        p, q = self.pmfs()
        return _round_down(self._np_curve(a.reshape(-1), p, q), a)

    def tradeoff_reverse(self, alpha):
        a = _alpha(alpha)
        p, q = self.pmfs()
        return _round_down(self._np_curve(a.reshape(-1), q, p), a)

    def llr(self, x):
        p, q = self.pmfs()
        k = np.asarray(x).astype(int)
        return np.log(p[k]) - np.log(q[k])


@dataclass(frozen=True)
class BinomialScores(DiscreteScores):
    """Integer scores 0..n: P = Binomial(n, p_in), Q = Binomial(n, p_out) (finite sums).

    Asymmetric for p_in != 1 - p_out. Default n = 3, p_in 0.6, p_out 0.3: pure eps = log 8
    (score 3), reverse log 5.36 (score 0). ``label`` replaces the default name
    ``binomial{n}`` (e.g. ``randomized_response``).
    """

    n: int = 3
    p_in: float = 0.6
    p_out: float = 0.3
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or f"binomial{self.n}"

    def pmfs(self) -> tuple[np.ndarray, np.ndarray]:
        """(P, Q) probabilities of the scores 0..n."""
        k = np.arange(self.n + 1)
        return binom.pmf(k, self.n, self.p_in), binom.pmf(k, self.n, self.p_out)

    def sample(self, n_in, n_out, rng):
        return (
            rng.binomial(self.n, self.p_in, n_in).astype(np.float64),
            rng.binomial(self.n, self.p_out, n_out).astype(np.float64),
        )


def randomized_response(eps0: float = 1.0) -> BinomialScores:
    """Binary scores of eps0-randomized response: the member's bit is reported truthfully with
    probability e^eps0 / (1 + e^eps0). Pure eps0-DP, symmetric; every score is tied."""
    q = float(expit(eps0))
    return BinomialScores(1, q, 1.0 - q, label=f"randomized_response_eps{eps0:g}")


@dataclass(frozen=True)
class PoissonCounts(DiscreteScores):
    """Count scores: P = Poisson(lam_in), Q = Poisson(lam_out) (e.g. how often a canary shows).

    The likelihood ratio (lam_in / lam_out)^k e^(lam_out - lam_in) is unbounded (pure eps is
    infinite) but every finite-delta quantity is a sum over k. The support is cut at K, where
    both tails are below 1e-17 (``_K``), and the tails are folded into the atom K: the sums are
    then exact for the folded pair, which is within 1e-17 of the true one in total variation,
    far inside ``CURVE_MARGIN`` (the hockey-stick moves by at most (1 + e^eps) 1e-17).
    Default lam_in 12, lam_out 10: eps(1e-5) = 3.01.
    """

    lam_in: float = 12.0
    lam_out: float = 10.0

    @property
    def name(self) -> str:
        return f"poisson_counts{self.lam_in:g}_{self.lam_out:g}"

    @property
    def _K(self) -> int:
        lam = max(self.lam_in, self.lam_out)
        k = int(lam + 12.0 * np.sqrt(lam) + 40)
        while max(poisson.sf(k, self.lam_in), poisson.sf(k, self.lam_out)) > 1e-17:
            k *= 2
        return k

    def pmfs(self) -> tuple[np.ndarray, np.ndarray]:
        k = np.arange(self._K + 1)
        p, q = poisson.pmf(k, self.lam_in), poisson.pmf(k, self.lam_out)
        p[-1] += poisson.sf(self._K, self.lam_in)
        q[-1] += poisson.sf(self._K, self.lam_out)
        return p, q

    def sample(self, n_in, n_out, rng):
        return (
            rng.poisson(self.lam_in, n_in).astype(np.float64),
            rng.poisson(self.lam_out, n_out).astype(np.float64),
        )

    def pure_epsilon(self):
        return float("inf")  # the likelihood ratio grows without bound in k

    def llr(self, x):
        k = np.asarray(x, dtype=np.float64)
        return k * np.log(self.lam_in / self.lam_out) - (self.lam_in - self.lam_out)


# ---------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian, one step


@dataclass(frozen=True)
class SubsampledGaussian(Scenario):
    """One Poisson-subsampled Gaussian step: P = (1 - q) N(0, 1) + q N(1/noise, 1), Q = N(0, 1).

    The likelihood ratio L(x) = 1 - q + q exp(mu x - mu^2 / 2), mu = 1/noise, is increasing,
    so both divergences are threshold masses in closed form. They differ: H(P||Q) is
    unbounded in eps, H(Q||P) vanishes for eps >= -log(1 - q). Default q 0.1, noise 0.5.
    """

    q: float = 0.1
    noise: float = 0.5
    symmetric: ClassVar[bool] = False
    exactness: ClassVar[str] = "closed form"

    @property
    def name(self) -> str:
        return f"subsampled_gaussian_q{self.q:g}"

    @property
    def mu(self) -> float:
        return 1.0 / self.noise

    def sample(self, n_in, n_out, rng):
        hit = rng.random(n_in) < self.q
        return rng.normal(0.0, 1.0, n_in) + self.mu * hit, rng.normal(0.0, 1.0, n_out)

    def _threshold(self, lr: np.ndarray) -> np.ndarray:
        """x with L(x) = lr (lr > 1 - q)."""
        q, mu = self.q, self.mu
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.log((lr - 1.0 + q) / q) + mu * mu / 2.0) / mu

    def _cdf_p(self, x):
        return (1.0 - self.q) * ndtr(x) + self.q * ndtr(x - self.mu)

    def _hs(self, eps, reverse):
        q, mu = self.q, self.mu
        g = np.exp(eps)
        if not reverse:  # {L > g} = {x > t}
            t = self._threshold(np.maximum(g, 1.0 - q + 1e-300))
            val = (1.0 - q - g) * ndtr(-t) + q * ndtr(mu - t)
            return np.where(g <= 1.0 - q, 1.0 - g, np.maximum(val, 0.0))
        # H_g(Q||P): {1/L > g} = {x < t}, L(t) = 1/g; empty when 1/g <= 1 - q
        ok = 1.0 / g > 1.0 - q
        t = self._threshold(np.where(ok, 1.0 / g, 1.0))
        val = (1.0 - g * (1.0 - q)) * ndtr(t) - g * q * ndtr(t - mu)
        return np.where(ok, np.maximum(val, 0.0), 0.0)

    def pure_epsilon(self):
        return float("inf")

    def tradeoff(self, alpha):
        a = _alpha(alpha)
        t = -ndtri(a)  # the threshold with Q(x > t) = alpha
        return _round_down(self._cdf_p(t), a)

    def tradeoff_reverse(self, alpha):
        """Test "non-member iff x < t" with P(x < t) = alpha: curve Q(x >= t) = Phi(-t).

        t by bisection, keeping the upper end (P(x < t) >= alpha, the safe side).
        """
        a = _alpha(alpha)
        flat = a.reshape(-1)
        lo = np.full(flat.shape, -40.0)
        hi = np.full(flat.shape, 40.0 + self.mu)
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            above = self._cdf_p(mid) >= flat
            hi = np.where(above, mid, hi)
            lo = np.where(above, lo, mid)
        beta = np.where(flat <= 0.0, 1.0, np.where(flat >= 1.0, 0.0, ndtr(-hi)))
        return _round_down(beta, a)

    def llr(self, x):
        x = np.asarray(x, dtype=np.float64)
        return np.logaddexp(np.log1p(-self.q), np.log(self.q) + self.mu * x - self.mu**2 / 2)


# ---------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian, T steps (DP-SGD's composition)


@functools.lru_cache(maxsize=8)
def _prv(noise: float, q: float, steps: int, eps_error: float, delta_error: float):
    from dpaudit.accounting import discrete_prv

    dprv = discrete_prv(noise, q, steps, eps_error, delta_error)
    t = np.asarray(dprv.domain.ts, dtype=np.float64)
    p = np.asarray(dprv.pmf, dtype=np.float64)
    return dprv, t, p


@dataclass(frozen=True)
class ComposedSubsampledGaussian(Scenario):
    """T Poisson-subsampled Gaussian steps, scored by the exact log-likelihood ratio.

    One canary's score is sum_t log(1 - q + q exp(u_t / s - 1 / (2 s^2))) with u_t ~ N(0, 1)
    (out) or u_t ~ N(0, 1) + B_t / s with B_t ~ Bernoulli(q) (in), s = ``noise``. The score
    is the privacy loss of the T-step view, so its pair of distributions has exactly the
    T-step profile of DP-SGD's canary (Opacus' "remove" PRV).

    Truth from the accountant: H(P||Q) is ``dpaudit.accounting.subsampled_gaussian_profile``
    (Opacus' PRV discretisation shifted by its error bounds, eps_error 0.01 and delta_error
    1e-11: an UPPER bound on delta(eps)). H(Q||P) = E_P[(e^-Y - e^eps)_+] comes from the same
    discretised privacy loss Y and the same coupling (``_reverse_hat``); it stays below
    H(P||Q) for eps >= 0.1 (the remove direction dominates under Poisson subsampling; checked
    in the tests). So ``true_epsilon`` is an upper bound on the exact epsilon, by at most
    about eps_error + the grid step 1e-4 (it agrees with ``accountant_epsilon(..., "prv")``
    to 1e-3): a method "above truth" here is above the exact epsilon too.

    The curve is ``tradeoff_from_profile`` of the larger of the two profiles on the eps grid
    of ``subsampled_gaussian_tradeoff``: below the exact curve, and at most 1 - that
    function (equal to it within 5e-3, checked in the tests).
    Default q 0.05, noise 1.2, 100 steps: epsilon(1e-5) = 2.46.
    """

    q: float = 0.05
    noise: float = 1.2
    steps: int = 100
    symmetric: ClassVar[bool] = False
    exactness: ClassVar[str] = "PRV upper bound (eps_error 0.01, delta_error 1e-11)"
    eps_error: ClassVar[float] = 0.01
    delta_error: ClassVar[float] = 1e-11
    num_eps: ClassVar[int] = 2000

    @property
    def name(self) -> str:
        return f"dpsgd_T{self.steps}_q{self.q:g}"

    def sample(self, n_in, n_out, rng):
        s, q, T = self.noise, self.q, self.steps
        u_out = rng.normal(0.0, 1.0, (n_out, T))
        u_in = rng.normal(0.0, 1.0, (n_in, T)) + (rng.random((n_in, T)) < q) / s

        def score(u):
            return np.logaddexp(np.log1p(-q), np.log(q) + u / s - 1.0 / (2.0 * s * s)).sum(axis=1)

        return score(u_in), score(u_out)

    def _tables(self):
        return _prv(
            float(self.noise), float(self.q), int(self.steps), self.eps_error, self.delta_error
        )

    def _delta_hat(self, e: np.ndarray) -> np.ndarray:
        """PRV upper bound delta_hat(e - eps_error) + delta_error on H_{e^e}(P||Q), e real."""
        _, t, p = self._tables()
        return _delta_hat_tables(
            t, p, np.asarray(e, dtype=np.float64), self.eps_error, self.delta_error
        )

    def _reverse_hat(self, e: np.ndarray) -> np.ndarray:
        """Upper bound on H_{e^e}(Q||P) = E_P[(e^-Y - e^e)_+] (Y the privacy loss under P).

        PRV's discretisation Y' is coupled with |Y - Y'| <= eps_error except with
        probability delta_error (Gopi et al. 2021, the coupling behind Opacus' bound), so
        (e^-Y - e^e)_+ <= e^eps_error (e^-Y' - e^(e - eps_error))_+, and on the failure event
        e^-Y <= (1 - q)^-T (Y >= T log(1 - q)).
        """
        _, t, p = self._tables()
        head_p = np.concatenate([[0.0], np.cumsum(p)])
        head_pe = np.concatenate([[0.0], np.cumsum(p * np.exp(-t))])
        ee = np.asarray(e, dtype=np.float64) - self.eps_error
        i = np.searchsorted(t, -ee, side="left")  # t_j < -ee for j < i
        est = np.maximum(head_pe[i] - np.exp(ee) * head_p[i], 0.0)
        # float64 rounding of the prefix sums, and the pmf's tiny negative entries
        rounding = 2e-16 * t.size * max(head_pe[-1], 1.0) + np.sum(np.maximum(-p, 0.0) * np.exp(-t))
        fail = self.delta_error * np.exp(-self.steps * np.log1p(-self.q))
        return np.minimum(1.0, np.exp(self.eps_error) * (est + rounding) + fail)

    def _hs(self, eps, reverse):
        return self._reverse_hat(eps) if reverse else self._delta_hat(eps)

    def pure_epsilon(self):
        return float("inf")

    def true_epsilon(self, delta):
        """Smallest eps on a 1e-4 grid with both PRV upper profiles <= delta (upper bound).

        Args:
            delta: in (0, 1) (the pure epsilon, delta = 0, is inf).
        """
        delta = _check_delta(delta)
        if delta == 0.0:
            return float("inf")
        return _grid_epsilon(self, delta)

    @functools.cached_property
    def _curve_profile(self) -> tuple[np.ndarray, np.ndarray]:
        """The (eps grid, delta) pairs of ``subsampled_gaussian_tradeoff`` (both directions)."""
        floor = 1e-10 + 2e-16 * self._tables()[1].size
        hi = 1.0
        while self._delta_hat(np.array([hi]))[0] > floor and hi < 1e4:
            hi *= 1.5
        grid = np.linspace(0.0, hi, self.num_eps)
        return grid, np.maximum(self._hs(grid, False), self._hs(grid, True))

    def tradeoff(self, alpha):
        from dpaudit.accounting import tradeoff_from_profile

        a = _alpha(alpha)
        grid, deltas = self._curve_profile
        return _round_down(1.0 - tradeoff_from_profile(a.reshape(-1), grid, deltas), a)

    def tradeoff_reverse(self, alpha):
        """The same (eps, delta) envelope bounds both orders of the pair."""
        return self.tradeoff(alpha)

    def llr(self, x):
        return np.asarray(x, dtype=np.float64)  # the score is the privacy loss itself


def _delta_hat_tables(t, p, e, eps_error, delta_error):
    """Opacus' delta estimate sum_{t_i >= e'} p_i (1 - e^{e' - t_i}) at e' = e - eps_error.

    Same suffix sums as ``dpaudit.accounting._delta_upper`` but valid for negative e too.
    """
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        tail_p = np.concatenate([np.cumsum(p[::-1])[::-1], [0.0]])
        tail_pe = np.concatenate([np.cumsum((p * np.exp(-t))[::-1])[::-1], [0.0]])
        ee = e - eps_error
        i = np.searchsorted(t, ee, side="left")
        vals = tail_p[i] - np.exp(ee) * tail_pe[i]
    vals = np.nan_to_num(np.maximum(vals, 0.0), nan=1.0) + 2e-16 * t.size
    return np.minimum(1.0, vals + delta_error)


@functools.lru_cache(maxsize=64)
def _grid_epsilon(scenario: ComposedSubsampledGaussian, delta: float) -> float:
    def worst(e):
        return np.maximum(scenario._hs(e, False), scenario._hs(e, True))

    hi = 1.0
    while worst(np.array([hi]))[0] > delta:
        hi *= 2.0
        if hi > 1e4:
            raise ValueError(f"epsilon at delta={delta} exceeds 1e4")
    grid = np.arange(0.0, hi + 1e-4, 1e-4)
    ok = worst(grid) <= delta
    return float(grid[int(np.argmax(ok))])


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        NoSignal(),
        GaussianShift(1.0),
        GaussianShift(2.0),
        LaplaceShift(1.0, 1.0),
        LaplaceShift(1.0, 0.5),
        StudentTShift(3.0, 1.0),
        LogisticShift(2.0, 1.0),
        BinomialScores(3, 0.6, 0.3),
        randomized_response(1.0),
        PoissonCounts(12.0, 10.0),
        SubsampledGaussian(0.1, 0.5),
        ComposedSubsampledGaussian(0.05, 1.2, 100),
    )
}
"""The default instances, keyed by ``name``."""
