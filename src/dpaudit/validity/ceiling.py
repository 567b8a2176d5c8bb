"""The sound ceiling of one-run count tests: what any valid count test can certify.

A count test of the claim "every canary is mu'-GDP" guesses "in" for the k top-scored of m
canaries (k fixed in advance) and rejects when the number of correct guesses V_k reaches a
critical value c. It is valid only if P[V_k >= c] <= level under EVERY mechanism that is
mu'-GDP per canary, interacting canaries included. The regime mixtures
``RegimeMixture(mu', a)`` (``validity.interacting``) are such mechanisms, so a valid c is at
least

    c(k, mu') = max over the nulls of min {c : P_null[V_k >= c] <= level},

the nulls being the regime mixtures on a grid of a (``DEFAULT_A_GRID``) and independent
mu'-GDP canaries. On ideal scores (independent Gaussian canaries of true mu: members
N(mu, 1), non-members N(0, 1)) the test certifies the largest mu' whose critical value the
observed V_k reaches; the ceiling is the best guess count's median certified mu', as the
fraction of the true epsilon it stands for (``count_test_ceiling``). No count test with a
fixed guess count that is valid on every mu'-GDP mechanism certifies more in the median: the
ceiling is an upper bound for those tests (the best k is chosen knowing mu, and other null
families could only lower it), not a figure any test attains. Measured (eps 4, delta 1e-5):
0.64 / 0.75 / 0.81 of epsilon at m = 1e3 / 1e4 / 1e5, against 0.79 / 0.93 / 0.98 for the
same tests calibrated on independent canaries only (``a_grid=()``), which are not valid: at
mu = 1, m = 1e4, k = m/2 the latter's critical value is passed by every loud run of
``RegimeMixture(1, 0.1)``, a rejection rate of the true claim of 0.100, twice the level.

The certified EPSILON tests a different family, (eps', delta)-DP, whose nulls include pure
eps'-DP randomized response on independent canaries; its ceiling (``epsilon_count_ceiling``)
is lower: 0.34 / 0.51 / 0.65 of epsilon at eps 4 (a mu'-GDP curve implies far lower
precision in the top scores than randomized response at its epsilon does).

V_k's laws are computed exactly, not simulated. Given the regime the canaries are
independent, with iid (score, membership) pairs; given the (k+1)-th largest score, whose
tail fraction R is Beta(k + 1, m - k), the k top scores are iid from the law above it, so

    V_k | R ~ Binomial(k, pi(R)),   pi(r) = P[member | score above the upper r-quantile],

and P[V_k >= c] = E[Binomial(k, pi(R)) >= c] is a one-dimensional integral, done by
Gauss-Legendre quadrature in the normal score of R's quantile, split at R = 1/2 (within 1e-9
of 512 nodes; ``count_survival``; ``simulated_counts`` is the Monte Carlo cross-check of the
tests). One canary's score in a regime with level band [lo, hi) of t = |y| has density
proportional to phi(y -+ mu'/2) on {|y| in [lo, hi)}: the threshold of a tail fraction is an
inverse of the folded-normal survival function (``folded_isf``) and pi a ratio of normal
CDF differences.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betainc, expit, ndtr
from scipy.stats import binom

from dpaudit._validate import check_count, check_open_unit, check_positive
from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.stats.one_run.ideal import median_count, order_statistic_nodes
from dpaudit.stats.one_run.ideal import pair_count_pmf as _pair_pmf
from dpaudit.validity.interacting import folded_isf, folded_survival

# Regime probabilities of the null family: small ones (the loud runs fit in the test's 5%),
# the range around the level where they bind, large ones (nearly independent canaries).
DEFAULT_A_GRID = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7,
                  0.9, 0.99)
INDEPENDENT = "independent"
_NODES = 48  # Gauss-Legendre nodes (tests: within 1e-9 of 512 nodes)
_RTOL = 1e-4  # certified mu' to _RTOL x its upper end


def _mass(c, x1, x2):
    """N(c, 1)'s mass of (x1, x2), x1 <= x2, from the side where it is accurate."""
    return np.where(x1 > c, ndtr(c - x1) - ndtr(c - x2), ndtr(x2 - c) - ndtr(x1 - c))


def _posteriors(mu, r, rc, lo, hi):
    """pi(r) = P[member | score above the band's upper r-quantile] (``mu``, ``lo``, ``hi``
    broadcast against the nodes ``r``; ``rc`` = 1 - r).

    In the band |y| in [lo, hi) the score law (members and non-members 1/2 each) is
    symmetric, and P[y > s | band] = (S(s) - S(hi)) / (2 w) for s >= lo, S the folded-normal
    survival function, w = S(lo) - S(hi) the band's mass: the threshold is ``folded_isf``
    of 2 w r + S(hi) for r <= 1/2, and minus that of 1 - r above (symmetry)."""
    s_hi = folded_survival(hi, mu)
    w = folded_survival(lo, mu) - s_hi
    rr = np.clip(np.where(r <= 0.5, r, rc), 1e-300, 0.5)
    s = np.maximum(folded_isf(np.minimum(2 * w * rr + s_hi, 1.0), mu), lo)
    a1 = _mass(mu / 2, s, hi)  # members' mass above s (s >= 0: the positive half only)
    a0 = _mass(-mu / 2, s, hi)
    upper = r > 0.5  # above -s: everything but the reflection of the mass above s
    a1, a0 = np.where(upper, w - a0, a1), np.where(upper, w - a1, a0)
    return a1 / (a1 + a0)


def _survival(pi, wq, k, c):
    """E[P[Binomial(k, pi(R)) >= c]] over the quadrature (last axis); P[Bin(k, p) >= c] is
    the regularized incomplete beta I_p(c, k - c + 1) for 1 <= c <= k, exactly 1 below and
    exactly 0 above."""
    k0 = np.asarray(k, dtype=np.float64)
    c0 = np.asarray(c, dtype=np.float64)
    k, c = k0[..., None], c0[..., None]
    cc = np.clip(c, 1, k)
    sf = betainc(cc, k - cc + 1, pi)
    mixed = np.clip((sf * wq).sum(axis=-1), 0.0, 1.0)
    # exact by construction, not by the quadrature weights' sum (whose last bit depends on
    # numpy's SIMD summation order): P[V >= c] is 1 for c <= 0 and 0 for c > k
    return np.where(c0 <= 0, 1.0, np.where(c0 > k0, 0.0, mixed))


def count_survival(mu, m: int, k, c, *, lo=0.0, hi=np.inf, nodes: int = _NODES) -> np.ndarray:
    """P[V_k >= c] for m independent canaries whose output is mu-GDP's restricted to the level
    band |y| in [lo, hi) (lo = 0, hi = inf: independent mu-GDP canaries, the same law as ideal
    scores N(mu, 1) / N(0, 1)); ``mu``, ``k``, ``c``, ``lo``, ``hi`` broadcast, 1 <= k < m."""
    mu, k, c, lo, hi = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                             for v in (mu, k, c, lo, hi)))
    r, rc, wq = order_statistic_nodes(k, m, nodes)
    pi = _posteriors(mu[..., None], r, rc, lo[..., None], hi[..., None])
    return _survival(pi, wq, k, c)


def null_family(a_grid=DEFAULT_A_GRID, independent: bool = True) -> list[tuple[str, float]]:
    """(name, a) of the nulls: the regime mixtures on ``a_grid``, then independent canaries
    (a = 1: one band, the whole line)."""
    out = [(f"a={float(a):g}", check_open_unit(a, "a_grid entry")) for a in a_grid]
    if independent:
        out.append((INDEPENDENT, 1.0))
    if not out:
        raise ValueError("a_grid is empty and independent is False: no null to test against")
    return out


def _components(mu, a_values):
    """Per null (axis 0) its two components: (weights, lo, hi) each, broadcast against mu (a
    regime mixture: loud band [q, inf) with weight a and quiet band [0, q); a = 1, the
    independent canaries: the whole line, weight 1, and an unused second component)."""
    mu = np.asarray(mu, dtype=np.float64)
    a = np.asarray(a_values, dtype=np.float64).reshape((-1,) + (1,) * mu.ndim)
    independent = np.broadcast_to(a >= 1.0, a.shape[:1] + mu.shape)
    q = np.where(independent, 0.0, folded_isf(np.where(independent, 0.5, a), mu))
    inf = np.full(q.shape, np.inf)
    loud = (np.where(independent, 1.0, a), q, inf)
    quiet = (np.where(independent, 0.0, 1 - a), np.zeros(q.shape), np.where(independent, inf, q))
    return loud, quiet


class _Nulls:
    """The nulls' posteriors at the quadrature nodes, for claims ``mu`` and guess counts ``k``
    (broadcast); ``survival(c)``: P[V_k >= c] under each null, shape (nulls,) + broadcast."""

    def __init__(self, mu, m, k, a_values, nodes):
        mu, k = np.broadcast_arrays(np.asarray(mu, dtype=np.float64),
                                    np.asarray(k, dtype=np.float64))
        r, rc, self.wq = order_statistic_nodes(k, m, nodes)
        self.k = k
        self.parts = [(w, _posteriors(mu[..., None], r, rc, lo[..., None], hi[..., None]))
                      for w, lo, hi in _components(mu, a_values)]

    def survival(self, c):
        out = 0.0
        for w, pi in self.parts:
            out = out + np.where(w > 0, w * _survival(pi, self.wq, self.k, c), 0.0)
        return out

    def critical(self, level):
        """Smallest c with P[V_k >= c] <= level, per null (integer bisection)."""
        shape = self.parts[0][0].shape
        low = np.zeros(shape)  # P[V >= low] > level
        high = np.broadcast_to(self.k + 1.0, shape)  # P[V >= k + 1] = 0
        while np.any(high - low > 1):
            mid = np.floor((low + high) / 2)
            ok = self.survival(mid) <= level
            open_ = high - low > 1
            high = np.where(open_ & ok, mid, high)
            low = np.where(open_ & ~ok, mid, low)
        return high


def critical_values(mu_claim, m: int, k, *, level: float = 0.05, a_grid=DEFAULT_A_GRID,
                    independent: bool = True, nodes: int = _NODES) -> dict[str, np.ndarray]:
    """Per null (``null_family``), the smallest c with P[V_k >= c] <= ``level`` for the claim
    ``mu_claim``-GDP, at each guess count ``k`` (and claim; the two broadcast). A count test
    valid on all of them must reject no earlier than their maximum."""
    check_positive(float(np.min(mu_claim)), "mu_claim")
    m = check_count(m, "m", 2)
    level = check_open_unit(level, "level")
    family = null_family(a_grid, independent)
    crit = _Nulls(mu_claim, m, _check_ks(k, m), [a for _, a in family], nodes).critical(level)
    return {name: c for (name, _), c in zip(family, crit.astype(np.int64), strict=True)}


def _check_ks(k, m):
    k = np.asarray(k)
    if k.dtype.kind not in "iu" and not np.all(np.asarray(k) == np.round(k)):
        raise ValueError(f"k must be integer guess counts, got {k!r}")
    if np.any(k < 1) or np.any(k >= m):
        raise ValueError(f"k must lie in [1, m - 1] = [1, {m - 1}], got {k!r}")
    return k.astype(np.float64)


def certified_mu(counts, k, m: int, mu_max: float, *, level: float = 0.05,
                 a_grid=DEFAULT_A_GRID, independent: bool = True, nodes: int = _NODES,
                 rtol: float = _RTOL) -> np.ndarray:
    """The largest mu' in [0, ``mu_max``] whose critical value (max over the nulls) the
    observed count V_k = ``counts`` reaches, i.e. P[V_k >= count] <= ``level`` under every
    null: the claim the count test refutes, so "mu > mu'" is certified (0 when even
    mu_max * 1e-6 is not refuted). Bisection on mu' to ``rtol * mu_max``, vectorised over the
    (count, k) pairs; assumes the nulls' P[V_k >= c] nondecreasing in mu' (tested)."""
    mu_max = check_positive(mu_max, "mu_max")
    m = check_count(m, "m", 2)
    level = check_open_unit(level, "level")
    counts, k = np.broadcast_arrays(np.asarray(counts, dtype=np.float64), _check_ks(k, m))
    a_values = [a for _, a in null_family(a_grid, independent)]

    def reached(mu):
        return _Nulls(mu, m, k, a_values, nodes).survival(counts).max(axis=0) <= level

    lo = np.full(counts.shape, mu_max * 1e-6)
    hi = np.full(counts.shape, mu_max)
    top = reached(hi)
    base = reached(lo)
    while np.any((hi - lo > rtol * mu_max) & base & ~top):
        mid = (lo + hi) / 2
        ok = reached(mid)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.where(top, mu_max, np.where(base, lo, 0.0))


def _median_count(mu, m, k, nodes):
    """The median of V_k on ideal scores of true mu (independent canaries): c - 1 for the
    smallest c with P[V_k >= c] <= 1/2."""
    return _Nulls(mu, m, k, [1.0], nodes).critical(0.5)[0] - 1


def default_k_grid(m: int, size: int = 200) -> np.ndarray:
    """Guess counts 1 <= k < m, log-spaced (every k when m <= ``size``): data-independent."""
    return np.unique(np.round(np.geomspace(1, m - 1, size)).astype(np.int64))


def count_test_ceiling(mu: float, m: int, *, level: float = 0.05, delta: float = 1e-5,
                       a_grid=DEFAULT_A_GRID, k_grid=None, nodes: int = _NODES) -> dict:
    """The sound ceiling of one-sided count tests on m ideal canaries of true ``mu``.

    For each guess count k of ``k_grid`` (default ``default_k_grid(m)``), the median of V_k
    on ideal scores (exact), and the largest claim mu' whose critical value (max over the
    regime mixtures on ``a_grid`` and independent canaries, ``critical_values``) that median
    reaches; converted to epsilon at ``delta`` over the true epsilon (``gdp_epsilon``), the
    best k's is the ceiling. As V_k -> mu' is monotone, the median certified mu' is the
    certified mu' of the median count: no Monte Carlo in the answer (deterministic; the
    probabilities are exact to ~1e-9, mu' to 1e-4 mu). The median is V_k's (exact), where a
    simulation would take the median of a few draws.

    Returns a dict: ``fraction`` (the ceiling, certified epsilon / true epsilon), ``k`` (the
    best guess count), ``mu_certified`` and ``epsilon_certified`` there, ``median_count``,
    ``critical`` (each null's critical value at the best k for the smallest claim the median
    count does not refute: the values that stop it), ``binding`` (the nulls whose critical
    value exceeds the median count there), ``by_k`` (k, median count, certified fraction for
    every k), and the inputs.
    """
    mu = check_positive(mu, "mu")
    m = check_count(m, "m", 2)
    level = check_open_unit(level, "level")
    delta = check_open_unit(delta, "delta")
    ks = default_k_grid(m) if k_grid is None else np.unique(_check_ks(k_grid, m)).astype(int)
    eps = gdp_epsilon(mu, delta)
    med = _median_count(mu, m, ks.astype(float), nodes)
    cert = certified_mu(med, ks, m, mu, level=level, a_grid=a_grid, nodes=nodes)
    frac = np.array([gdp_epsilon(c, delta) / eps if c > 0 else 0.0 for c in cert])
    best = int(np.argmax(frac))
    k_best = int(ks[best])
    above = cert[best] + 1.01 * _RTOL * mu  # just past the bisection's bracket
    crit = critical_values(above, m, k_best, level=level, a_grid=a_grid, nodes=nodes)
    crit = {name: int(v) for name, v in crit.items()}
    return {
        "mu": mu, "m": m, "level": level, "delta": delta, "epsilon": eps,
        "fraction": float(frac[best]), "k": k_best, "mu_certified": float(cert[best]),
        "epsilon_certified": float(frac[best] * eps), "median_count": int(med[best]),
        "critical": crit,
        "binding": [name for name, v in crit.items() if v > med[best]],
        "a_grid": [float(a) for a in a_grid],
        "by_k": {"k": ks.tolist(), "median_count": med.astype(int).tolist(),
                 "fraction": frac.tolist()},
    }


def epsilon_count_ceiling(mu: float, m: int, *, level: float = 0.05, delta: float = 1e-5,
                          k_grid=None, nodes: int = _NODES) -> dict:
    """The sound ceiling of one-sided count tests of (epsilon', delta)-DP claims (the certified
    epsilon's), on m ideal canaries of true ``mu``.

    Every eps'-DP mechanism is (eps', delta)-DP, among them independent randomized response at
    eps' (score +1 or -1, right with probability q = e^eps' / (1 + e^eps')). There the k top
    guesses are k of the "+1" outputs in random order, so V_k ~ Binomial(k, q) exactly (k at
    most the "+1" count, which is m/2 in the median). A test valid for the claim must keep this
    null below ``level``: its critical count at k is at least the binomial's (1 - level)
    quantile. For each k of ``k_grid`` (default ``default_k_grid(m)``) the median V_k of ideal
    scores (exact) certifies at most the largest eps' with P[Binomial(k, q') >= median] <=
    level; the best k's, over the true epsilon ``gdp_epsilon(mu, delta)``, is the ceiling.
    No interaction is needed for it, and the delta part of the claim could only lower it.

    Returns a dict: ``fraction``, ``k``, ``epsilon_certified``, ``median_count`` and the
    inputs.
    """
    mu = check_positive(mu, "mu")
    m = check_count(m, "m", 2)
    level = check_open_unit(level, "level")
    delta = check_open_unit(delta, "delta")
    ks = default_k_grid(m) if k_grid is None else np.unique(_check_ks(k_grid, m)).astype(int)
    ks = ks[ks <= m // 2]
    eps = gdp_epsilon(mu, delta)
    med = _median_count(mu, m, ks.astype(float), nodes)
    best_eps, best_k, best_v = 0.0, int(ks[0]), 0
    for k, v in zip(ks, med, strict=True):
        e = _rr_epsilon(int(k), int(v), level)
        if e > best_eps:
            best_eps, best_k, best_v = e, int(k), int(v)
    return {"mu": mu, "m": m, "level": level, "delta": delta, "epsilon": eps,
            "fraction": best_eps / eps, "k": best_k, "epsilon_certified": best_eps,
            "median_count": best_v}


def pair_count_pmf(mu: float, m: int, k_plus: int, k_minus: int, *,
                   nodes: int = 24) -> np.ndarray:
    """The exact law of the correct guesses of "in" on the k+ top and "out" on the k- bottom
    of m ideal canaries of true ``mu`` (``stats.one_run.ideal.pair_count_pmf`` with this
    module's posteriors of independent mu-GDP canaries)."""
    return _pair_pmf(lambda r, rc: _posteriors(mu, r, rc, 0.0, np.inf), m, k_plus, k_minus,
                     nodes=nodes)


def pair_median_count(mu: float, m: int, k_plus: int, k_minus: int, *, nodes: int = 24) -> int:
    """The median of V (``pair_count_pmf``) on ideal scores: c - 1 for the smallest c with
    P[V >= c] <= 1/2."""
    return median_count(pair_count_pmf(mu, m, k_plus, k_minus, nodes=nodes))


def _rr_epsilon(guesses: int, count: int, level: float) -> float:
    """The largest eps' with P[Binomial(guesses, e^eps' / (1 + e^eps')) >= count] <= level
    (randomized response's correct guesses; 0 if not even eps' = 0 is refuted)."""
    def tail(e):
        return float(binom.sf(count - 1, guesses, expit(e)))

    if count < 1 or tail(0.0) > level:
        return 0.0
    hi = 1.0
    while tail(hi) <= level and hi < 1e3:
        hi *= 2.0
    lo = 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if tail(mid) <= level else (lo, mid)
    return lo


def two_sided_epsilon_count_ceiling(mu: float, m: int, *, level: float = 0.05,
                                    delta: float = 1e-5, k_grid=None,
                                    nodes: int = 24) -> dict:
    """The sound ceiling of count tests of (epsilon', delta)-DP claims that guess "in" for the
    k top and "out" for the k bottom scores (2k guesses), on m ideal canaries of true ``mu``.

    Under independent randomized response at eps' (an eps'-DP, hence (eps', delta)-DP,
    mechanism) the k top guesses are k of the "+1" outputs and the k bottom ones k of the
    "-1" outputs, each right with probability q = e^eps' / (1 + e^eps') independently: V ~
    Binomial(2k, q) exactly (k at most each output's count, m/2 in the median). A valid test's
    critical count is at least that binomial's (1 - level) quantile, so the median V of ideal
    scores (exact: ``pair_median_count``) certifies at most the largest eps' with
    P[Binomial(2k, q') >= median] <= level. The best k of ``k_grid`` (default: 48 counts,
    log-spaced from 10 to (m - 1) / 2), over the true epsilon, is the ceiling. Beside it
    ``epsilon_count_ceiling`` is the one-sided one; a two-sided count test valid for
    interacting canaries (the recursion, Steinke et al.) stays below this.

    Returns a dict: ``fraction``, ``k`` (per side), ``epsilon_certified``, ``median_count``,
    ``by_k`` and the inputs.
    """
    mu = check_positive(mu, "mu")
    m = check_count(m, "m", 4)
    level = check_open_unit(level, "level")
    delta = check_open_unit(delta, "delta")
    top = (m - 1) // 2  # 2k <= m - 1
    if k_grid is None:
        ks = np.unique(np.round(np.geomspace(min(10, top), top, 48)).astype(np.int64))
    else:
        ks = np.unique(_check_ks(k_grid, m)).astype(np.int64)
        ks = ks[ks <= top]
    eps = gdp_epsilon(mu, delta)
    meds, certs = [], []
    for k in ks:
        v = pair_median_count(mu, m, int(k), int(k), nodes=nodes)
        meds.append(v)
        certs.append(_rr_epsilon(2 * int(k), v, level))
    best = int(np.argmax(certs))
    return {"mu": mu, "m": m, "level": level, "delta": delta, "epsilon": eps,
            "fraction": certs[best] / eps, "k": int(ks[best]),
            "epsilon_certified": certs[best], "median_count": int(meds[best]),
            "by_k": {"k": ks.tolist(), "median_count": meds,
                     "fraction": [c / eps for c in certs]}}


def simulated_counts(draw, m: int, ks, draws: int, seed: int = 0) -> np.ndarray:
    """V_k at each of ``ks`` over ``draws`` runs of ``draw(m, rng) -> (scores, members)``
    (run r uses ``np.random.default_rng([seed, r])``): shape (draws, len(ks)). The Monte Carlo
    check of ``count_survival``."""
    ks = np.asarray(ks, dtype=np.int64)
    out = np.empty((draws, ks.size), dtype=np.int64)
    for r in range(draws):
        scores, members = draw(m, np.random.default_rng([seed, r]))
        order = np.argsort(-scores, kind="stable")
        out[r] = np.cumsum(members[order])[ks - 1]
    return out


__all__ = [
    "DEFAULT_A_GRID",
    "INDEPENDENT",
    "certified_mu",
    "count_survival",
    "count_test_ceiling",
    "critical_values",
    "default_k_grid",
    "epsilon_count_ceiling",
    "null_family",
    "pair_count_pmf",
    "pair_median_count",
    "simulated_counts",
    "two_sided_epsilon_count_ceiling",
]
