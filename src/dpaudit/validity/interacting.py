"""One-run mechanisms whose canaries interact, with each canary's privacy known exactly.

The one-run claim test (``stats.one_run_claim``) must hold whatever the canaries do to each
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

``draw(m, rng)`` returns (scores, members) with members a bool array (S_i = +1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit, ndtr, ndtri


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
    "SharedLoudness",
    "gdp_roc",
    "loud_epsilon",
    "rejection_rate",
]
