"""One-run mechanisms whose canaries interact, with each canary's privacy known exactly.

The one-run claim test (``stats.one_run.claim``) must hold whatever the canaries do to each
other; a suite of independent (score, membership) pairs cannot show that. Each mechanism here
draws the m canaries' memberships S (fair coins) and ONE joint output, from which a score per
canary is read, and is exactly ``mu``-GDP with respect to every canary's bit for every value
of the others (the claim a correct test must not reject), while the canaries' correct guesses
are correlated:

* ``SharedLoudness(mu, p)``: with probability p (one coin for the whole run) every canary's
  output is randomized response with the largest epsilon mu-GDP allows at that p, otherwise
  a fair coin. Given the other canaries' bits their outputs reveal the state, so each canary
  sees the pair "state revealed, then randomized response or nothing": its ROC has the
  vertices (0, 0), (p (1 - q), p q), (1 - p q, 1 - p (1 - q)), (1, 1), q = e^eps / (1 + e^eps),
  and eps is chosen so that the second vertex lies ON mu-GDP's ROC (``loud_epsilon``): the
  curve is below mu-GDP's everywhere (a concave ROC above every vertex is above their hull)
  and touches it. In the loud runs the top half of the guesses are right with probability q,
  far above what independent mu-GDP canaries allow: the counter-example to modelling one-run
  guesses by independent canaries (``docs/one_run_fdp.md``).
* ``AdaptiveGaussian(mu, quiet)``: sequential Gaussian releases Y_i = c_i S_i / 2 + Z_i whose
  shift c_i = mu when the previous release Y_{i-1} > 0 and ``quiet * mu`` otherwise (earlier
  outputs steer later ones). Given the other bits, canary i sees Y_{i-1} (independent of
  S_i) and then a Gaussian shift c_i <= mu; the later releases are post-processing: exactly
  a mixture of c-GDP pairs with c revealed, below mu-GDP and equal to it when c = mu. The
  score is the likelihood-ratio statistic c_i Y_i.
* ``RegimeMixture(mu, a)``: mu-GDP's own pair split into randomized responses at a random
  privacy-loss level t = |Y| (the same folded-normal law under both bits; given t the sign is
  randomized response at epsilon mu t), with ONE coin per run choosing the level range of
  every canary: the top-a quantile of t ("loud", probability a) or the bottom 1 - a. Each
  canary's output reveals t, and the others' outputs reveal only the range, a function of t:
  post-processing of mu-GDP's pair, so exactly mu-GDP (class doc). Given the regime the
  canaries are independent and the loud runs' guesses far better than mu-GDP's: the family
  over which ``validity.ceiling`` finds what any sound count test can certify.

``draw(m, rng)`` returns (scores, members) with members a bool array (S_i = +1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit, ndtr, ndtri

from dpaudit._validate import check_open_unit, check_positive


def gdp_roc(alpha, mu: float) -> np.ndarray:
    """mu-GDP's ROC: the largest TPR at FPR ``alpha``, Phi(Phi^-1(alpha) + mu)."""
    with np.errstate(divide="ignore"):
        return ndtr(ndtri(np.asarray(alpha, dtype=np.float64)) + mu)


def loud_epsilon(mu: float, p: float) -> float:
    """The eps with p q = ROC_mu(p (1 - q)), q = expit(eps): the loudest randomized response
    that a state of probability p allows under mu-GDP (``SharedLoudness``)."""
    if not (mu > 0 and 0 < p < 1):
        raise ValueError(f"need mu > 0 and 0 < p < 1, got mu={mu!r}, p={p!r}")

    def gap(eps):
        q = expit(eps)
        return float(gdp_roc(p * (1 - q), mu) - p * q)

    hi = 1.0
    while gap(hi) > 0:
        hi *= 2.0
        if hi > 200:
            raise ValueError(f"no finite loud epsilon for mu={mu}, p={p}")
    return float(brentq(gap, 0.0, hi, xtol=1e-13))


@dataclass(frozen=True)
class SharedLoudness:
    """Randomized response for all canaries at once with probability ``p`` (module doc)."""

    mu: float
    p: float
    epsilon: float = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "epsilon", loud_epsilon(self.mu, self.p))

    @property
    def q(self) -> float:
        return float(expit(self.epsilon))

    def roc_vertices(self) -> np.ndarray:
        """(FPR, TPR) vertices of one canary's exact ROC (state revealed)."""
        p, q = self.p, self.q
        return np.array([[0, 0], [p * (1 - q), p * q], [1 - p * q, 1 - p * (1 - q)], [1, 1]])

    def hockey_stick(self, eps: float) -> float:
        """delta(eps) of one canary's pair (state revealed; symmetric)."""
        p, q = self.p, self.q
        P = np.array([p * q, p * (1 - q), (1 - p) / 2, (1 - p) / 2])
        Q = np.array([p * (1 - q), p * q, (1 - p) / 2, (1 - p) / 2])
        return float(np.maximum(P - np.exp(eps) * Q, 0.0).sum())

    def true_epsilon(self, delta: float) -> float:
        """Smallest eps >= 0 with delta(eps) <= delta (the revealed state's; an upper bound
        on the run's, whose state is only inferred)."""
        if self.hockey_stick(0.0) <= delta:
            return 0.0
        return float(brentq(lambda e: self.hockey_stick(e) - delta, 0.0, self.epsilon + 1.0))

    def draw(self, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        members = rng.random(m) < 0.5
        if rng.random() < self.p:
            keep = rng.random(m) < self.q
            said = np.where(keep, members, ~members)
        else:
            said = rng.random(m) < 0.5
        return np.where(said, 1.0, -1.0), members


@dataclass(frozen=True)
class AdaptiveGaussian:
    """Sequential Gaussian releases steered by the previous output (module doc)."""

    mu: float
    quiet: float = 0.25

    def draw(self, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        members = rng.random(m) < 0.5
        s = np.where(members, 1.0, -1.0)
        z = rng.standard_normal(m)
        y = np.empty(m)
        c = np.empty(m)
        prev = 1.0
        for i in range(m):  # each shift depends on the release before it
            c[i] = self.mu if prev > 0 else self.quiet * self.mu
            y[i] = c[i] * s[i] / 2 + z[i]
            prev = y[i]
        return c * y, members

    def true_epsilon(self, delta: float) -> float:
        """At most mu-GDP's epsilon (equal when the loud shift is revealed)."""
        from dpaudit.stats.gdp import gdp_epsilon

        return float(gdp_epsilon(self.mu, delta))


def folded_survival(t, mu: float) -> np.ndarray:
    """P[|Y| > t] for Y ~ N(mu/2, 1) (equally for N(-mu/2, 1)): the law of the privacy-loss
    level of mu-GDP's pair, Phi(mu/2 - t) + Phi(-t - mu/2), t >= 0."""
    t = np.asarray(t, dtype=np.float64)
    return ndtr(mu / 2 - t) + ndtr(-t - mu / 2)


def folded_isf(v, mu: float) -> np.ndarray:
    """The t >= 0 with ``folded_survival(t, mu) = v`` for v in (0, 1], elementwise (vectorised
    Newton steps kept inside a bisection bracket; about 1e-13 accurate, also far in the tail).

    Phi(mu/2 - t) <= S(t) <= 2 Phi(mu/2 - t) brackets the root by
    [max(0, mu/2 - Phi^-1(v)), mu/2 - Phi^-1(v/2)], so a few steps suffice for any v. For
    v > 1/2 the equation is solved as CDF = 1 - v (exact in floating point), which resolves
    small t even where S(t) rounds to 1 (large mu)."""
    v = np.asarray(v, dtype=np.float64)
    low_half = v > 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.maximum(0.0, mu / 2 - ndtri(v))
        hi = mu / 2 - ndtri(v / 2)
        t = (lo + hi) / 2
        for _ in range(100):
            # decreasing in t, g > 0 means t is left of the root: S(t) - v, or 1 - v - F(t)
            cdf = ndtr(t - mu / 2) - ndtr(-t - mu / 2)
            g = np.where(low_half, (1.0 - v) - cdf, folded_survival(t, mu) - v)
            lo = np.where(g > 0, t, lo)
            hi = np.where(g > 0, hi, t)
            dens = np.exp(-0.5 * (t - mu / 2) ** 2) + np.exp(-0.5 * (t + mu / 2) ** 2)
            step = g / (dens / np.sqrt(2 * np.pi))
            new = t + step
            new = np.where((new >= lo) & (new <= hi), new, (lo + hi) / 2)
            done = np.abs(new - t) <= 1e-13 * (1.0 + t)
            t = new
            if done.all():
                break
    return t


@dataclass(frozen=True)
class RegimeMixture:
    """mu-GDP's pair as randomized responses at a random level, the level's range shared by
    all canaries: loud (top-a quantile) with probability ``a``, quiet otherwise.

    Why each canary is exactly mu-GDP. Let Y ~ N(S mu/2, 1) be one canary's mu-GDP output
    (S = +1 member, -1 not). Its level t = |Y| has the folded-normal law |N(mu/2, 1)| under
    both values of S, and given t, sign(Y) = S with probability expit(mu t): randomized
    response at epsilon mu t. The mechanism draws ONE coin per run; with probability a every
    canary's t comes from the law of t restricted to [q, inf), q its (1 - a) quantile
    (``threshold``), otherwise from the law restricted to [0, q); each canary's sign is its
    own randomized response at mu t, and its score is y = sign * t, the output itself
    (log-likelihood ratio mu y, so y is the optimal score). Marginally over the coin each t
    has the folded-normal law, so each canary's (t, sign) is distributed exactly as mu-GDP's
    (|Y|, sign Y) pair: its score is N(+-mu/2, 1). Given the other canaries' bits, their
    outputs depend on this canary only through the regime, and the regime is the function
    1[t >= q] of this canary's own t: the (regime, y) pair is post-processing of y, so it is
    exactly mu-GDP with respect to every canary's bit for every value of the others (its
    likelihood ratio is still e^(mu y): ``tests/validity/test_interacting.py`` integrates its
    ROC). Yet given the regime the canaries are independent and, in a loud run, each is a
    louder pair than mu-GDP's (the ROC ROC_mu(a x) / a near the origin): the top-scored
    guesses are right together, far more often than independent mu-GDP canaries allow.
    """

    mu: float
    a: float
    threshold: float = field(init=False)

    def __post_init__(self):
        mu = check_positive(self.mu, "mu")
        a = check_open_unit(self.a, "a")
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "threshold", float(folded_isf(a, mu)))

    def __repr__(self) -> str:
        return f"RegimeMixture(mu={self.mu:.4g}, a={self.a:g})"

    def band(self, loud: bool) -> tuple[float, float]:
        """The range [lo, hi) of the level t = |y| in the loud or the quiet regime."""
        return (self.threshold, np.inf) if loud else (0.0, self.threshold)

    def levels(self, n: int, loud: bool, rng: np.random.Generator) -> np.ndarray:
        """n levels t drawn exactly from the folded-normal law restricted to the regime's
        band: t = S^-1(v), S the survival function and v uniform on (0, a] (loud) or
        (a, 1] (quiet)."""
        u = 1.0 - rng.random(n)  # in (0, 1]
        v = self.a * u if loud else self.a + (1.0 - self.a) * u
        return folded_isf(v, self.mu)

    def draw_regime(self, m: int, rng: np.random.Generator, loud: bool):
        """(scores, members) of a run in the given regime: the canaries are independent."""
        members = rng.random(m) < 0.5
        t = self.levels(m, loud, rng)
        keep = rng.random(m) < expit(self.mu * t)
        said = np.where(keep, members, ~members)
        return np.where(said, t, -t), members

    def draw(self, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        loud = bool(rng.random() < self.a)
        return self.draw_regime(m, rng, loud)

    def true_epsilon(self, delta: float) -> float:
        """mu-GDP's epsilon: each canary's pair is exactly mu-GDP's."""
        from dpaudit.stats.gdp import gdp_epsilon

        return float(gdp_epsilon(self.mu, delta))


class IndependentRandomizedResponse:
    """Independent eps0-randomized response: each canary's score is +1 or -1, its bit with
    probability e^eps0 / (1 + e^eps0). Not interacting, and not mu-GDP: eps0-DP, hence
    (eps0, delta)-DP for every delta, the null that binds (epsilon, delta) count tests (the k
    top guesses are right Binomial(k, q) times, k top and k bottom ones Binomial(2k, q))."""

    def __init__(self, eps0: float):
        self.eps0 = float(check_positive(eps0, "eps0"))

    def __repr__(self) -> str:
        return f"IndependentRandomizedResponse(eps={self.eps0:.4g})"

    def draw(self, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        members = rng.random(m) < 0.5
        said = np.where(rng.random(m) < expit(self.eps0), members, ~members)
        return np.where(said, 1.0, -1.0), members

    def true_epsilon(self, delta: float) -> float:
        """eps0 at every delta."""
        return self.eps0


def rejection_rate(mechanism, test, *, m: int, reps: int, seed: int = 0) -> tuple[float, float]:
    """Fraction of ``reps`` runs whose (scores_in, scores_out) ``test`` rejects, and its
    standard error; run r draws from ``np.random.default_rng([seed, r])``."""
    hits = 0
    for r in range(reps):
        scores, members = mechanism.draw(m, np.random.default_rng([seed, r]))
        hits += bool(test(scores[members], scores[~members]))
    rate = hits / reps
    return rate, float(np.sqrt(max(rate * (1 - rate), 1.0 / reps) / reps))


__all__ = [
    "AdaptiveGaussian",
    "IndependentRandomizedResponse",
    "RegimeMixture",
    "SharedLoudness",
    "folded_isf",
    "folded_survival",
    "gdp_roc",
    "loud_epsilon",
    "rejection_rate",
]
