"""The guess-count recursion of Mahloujifar, Melis & Chaudhuri ("Auditing f-Differential
Privacy in One Run", arXiv 2410.22235, ICML 2025, Algorithm 3): does a claimed trade-off curve
allow v correct guesses out of r? Proofs: ``docs/one_run_fdp.md``.

Setting (as in Steinke et al.'s one-run audit, ``steinke``): each of the m canaries is included
independently with probability 1/2, the auditor makes r guesses and v of them are right. Claim:
the mechanism is f-DP with respect to every canary's bit (whatever the other canaries do) and
P[>= v correct] >= tau. With C the number of correct guesses, R_j = E[C 1{C >= j}] / m and
H_j = E[(r - C) 1{C >= j}] / m:

* R_v >= tau v / m, and probability mass at C = c adds c / m to R_j and (r - c) / m to H_j
  for every j <= c, so R_j - R_{j+1} = j / (r - j) (H_j - H_{j+1});
* f-DP ties correct guesses above level j to wrong guesses at level j (fbar = 1 - f, the ROC
  of the optimal test): R_{j+1} <= fbar(H_j) for guesses both ways (the paper's bound), and
  R_{j+1} <= fbar(2 H_j) / 2 when every guess says "in" (or every guess says "out"). The
  one-sided form is our sharpening: for a fixed canary i, "guessed and right" and "guessed
  and wrong" are then the *same* event of the output under S_i = +1 and S_i = -1, each world
  of probability 1/2; Jensen (fbar is concave) over the other canaries and over i gives the
  factor 2 ("out" guesses use f in the other direction: G_mu is symmetric). With guesses
  both ways the two directions add up and the factor is lost.

Starting from all the mass tau at C = v and descending j = v-1, ..., 0 with the smallest H_j
these allow (``refutes``) gives r_0 + h_0 <= R_0 + H_0 = r / m (by induction on j,
R_j >= r_j and R_j - c H_j >= r_j - c h_j for c = j / (r - j)). If the recursion exceeds r / m,
then P[>= v correct] < tau: the claim is refuted at level tau.

A claim enters as its inverse ROC, tpr -> the smallest FPR reaching it: ``gdp_roc_inverse``
(mu-GDP), ``epsdelta_roc_inverse`` ((epsilon, delta)-DP), ``roc_inverse_of`` (any curve, by
bisection). ``largest_refuted`` finds the largest parameter of a family that given counts
refute.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import ndtr, ndtri

from dpaudit.stats.claim import check_curve

RocInverse = Callable[[np.ndarray], np.ndarray]
MU_CAP = 50.0  # search limit for mu (reported as mu_lower if still refuted there)
EPSILON_CAP = 50.0  # search limit for the certified epsilon
_POINTS = 63  # parameter values tried per candidate per refinement round
_REL_TOL = 1e-6
_INVERSE_SAFETY = 1.0 - 1e-12  # shrink closed-form inverses below float rounding ...
_INVERSE_ABS = 1e-15  # ... and absolutely: 1 - delta - e^eps (1 - y) cancels at ulp(1)
_BISECT_STEPS = 60


def gdp_roc_inverse(tpr, mu):
    """Smallest FPR at which mu-GDP's ROC reaches ``tpr``: Phi(Phi^-1(tpr) - mu) (vectorised)."""
    return ndtr(ndtri(tpr) - mu)


def refutes(
    guesses, correct, param, one_sided, *, m: int, level: float, roc_inverse=gdp_roc_inverse
) -> np.ndarray:
    """Vectorised Algorithm-3 test: True where the claim ``param`` is refuted at ``level``.

    ``roc_inverse(tpr, param)``: the smallest FPR at which the claimed ROC (1 - f) reaches
    ``tpr``, vectorised over both (default: mu-GDP, ``param`` = mu). It must never exceed the
    exact inverse (a larger value could refute a true claim). All array arguments broadcast
    together (one entry per test). The recursion runs over the levels j = v-1, ..., 0 for all
    entries at once; an entry leaves when its wrong-guess bound stops growing (nothing changes
    after that) or as soon as the bounds exceed r / m.
    """
    arrs = np.broadcast_arrays(
        np.asarray(guesses, dtype=np.float64),
        np.asarray(correct, dtype=np.float64),
        np.asarray(param, dtype=np.float64),
        np.where(np.asarray(one_sided, dtype=bool), 2.0, 1.0),
    )
    k, v, mus, lam = (a.ravel() for a in arrs)
    # (r_v, h_v): if P[C >= v] >= level, then R_v >= r_v and R_v - c H_v >= r_v - c h_v for
    # every c <= v / (k - v); below v, h_j is a lower bound on H_j (docs/one_run_fdp.md)
    r = level * v / m
    h = level * (k - v) / m
    # R_j <= E[C] / m <= 1 / lam (one-sided: C <= number of canaries in, or out), so a start
    # above it is already a contradiction; R_j + H_j <= k / m ends the recursion.
    refuted = (v >= 1) & (lam * r > 1.0)
    act = np.flatnonzero((v >= 1) & ~refuted)
    r, h, j, k, mus, lam = r[act], h[act], v[act] - 1.0, k[act], mus[act], lam[act]
    cap = k / m
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        while act.size:
            # smallest H_j that R_{j+1} = r allows
            h_new = np.asarray(roc_inverse(lam * r, mus), dtype=np.float64) / lam
            r_new = r + j / (k - j) * (h_new - h)
            grows = h_new > h
            hit = grows & ((r_new + h_new > cap) | (lam * r_new > 1.0))
            refuted[act[hit]] = True
            keep = grows & ~hit & (j >= 1.0)
            if not keep.all():
                act, k, mus, lam, cap = act[keep], k[keep], mus[keep], lam[keep], cap[keep]
                r_new, h_new, j = r_new[keep], h_new[keep], j[keep]
            r, h, j = r_new, h_new, j - 1.0
    return refuted.reshape(arrs[0].shape)


def refutes_gdp(guesses, correct, mu, *, m: int, level: float, one_sided: bool = True):
    """True where r = ``guesses`` guesses with v = ``correct`` right refute mu-GDP at ``level``.

    ``m``: number of canaries (each included independently with probability 1/2);
    ``one_sided``: all guesses say "in" (or all say "out"), which allows the sharper bound
    (module doc). Arrays broadcast; returns a bool array (a bool for scalar input).
    """
    out = refutes(guesses, correct, mu, one_sided, m=int(m), level=float(level))
    return bool(out) if out.ndim == 0 else out


def largest_refuted(
    guesses,
    correct,
    one_sided,
    *,
    m: int,
    level: float,
    roc_inverse=gdp_roc_inverse,
    cap: float = MU_CAP,
    prune: bool = False,
) -> np.ndarray:
    """For each candidate, the largest parameter of a claim family that its guesses refute.

    ``roc_inverse(tpr, param)`` describes the family (``refutes``; default mu-GDP); the
    family must grow less private with the parameter, so that refutation is monotone (mu of
    GDP, epsilon of (epsilon, delta)-DP). Returns 0 where not even the parameter 0 is refuted.
    A bracket [lo, hi] (lo refuted, hi not) is found by doubling from 1 and then shrunk by
    trying 63 values per candidate per round, all candidates at once, to a relative width of
    1e-6. The lower end is returned (a refuted value), capped at ``cap``. ``prune``: stop
    refining a candidate once its bracket lies below the best lower end (only the maximum is
    then exact; the other values are still refuted ones).
    """
    k = np.atleast_1d(np.asarray(guesses, dtype=np.float64))
    v = np.atleast_1d(np.asarray(correct, dtype=np.float64))
    sided = np.broadcast_to(np.asarray(one_sided, dtype=bool), k.shape)
    lo = np.zeros(k.size)
    hi = np.ones(k.size)

    def test(idx, params):
        return refutes(
            k[idx, None], v[idx, None], params, sided[idx, None], m=m, level=level,
            roc_inverse=roc_inverse,
        )

    alive = np.flatnonzero(test(np.arange(k.size), np.zeros((k.size, 1)))[:, 0])
    hi[np.setdiff1d(np.arange(k.size), alive)] = 0.0  # not even the parameter 0 is refuted
    while alive.size:  # doubling
        grow = alive[test(alive, hi[alive, None])[:, 0]]
        lo[grow] = hi[grow]
        hi[grow] = np.minimum(2.0 * hi[grow], cap)
        alive = grow[lo[grow] < cap]
    frac = np.arange(1, _POINTS + 1) / (_POINTS + 1.0)
    fine = np.arange(k.size)
    while True:
        fine = fine[hi[fine] - lo[fine] > _REL_TOL * np.maximum(lo[fine], 1e-3)]
        if prune:
            fine = fine[hi[fine] > lo.max()]
        if not fine.size:
            return lo
        grid = lo[fine, None] + (hi[fine] - lo[fine])[:, None] * frac[None, :]
        res = test(fine, grid)
        n_ok = np.where(res.all(axis=1), _POINTS, np.argmin(res, axis=1))  # first not refuted
        has = n_ok > 0
        lo[fine[has]] = grid[has, n_ok[has] - 1]
        below = n_ok < _POINTS
        hi[fine[below]] = grid[below, n_ok[below]]


def largest_refuted_mu(
    guesses, correct, one_sided, *, m: int, level: float, prune: bool = False
) -> np.ndarray:
    """For each candidate, the largest mu that its guesses refute at ``level`` (0 if none):
    ``largest_refuted`` for the mu-GDP family, capped at ``MU_CAP``."""
    return largest_refuted(guesses, correct, one_sided, m=m, level=level, prune=prune)


def epsdelta_roc_inverse(delta: float):
    """The (epsilon, delta)-DP family as ``roc_inverse(tpr, epsilon)`` for the recursion.

    (eps, delta)-DP's ROC is max(alpha, min(1, delta + e^eps alpha, 1 - e^-eps (1 - delta -
    alpha))); the smallest alpha reaching y < 1 is min(y, max(0, (y - delta) e^-eps,
    1 - delta - e^eps (1 - y))).
    """

    def inverse(tpr, eps):
        y = np.asarray(tpr, dtype=np.float64)
        e = np.asarray(eps, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            reach = np.maximum((y - delta) * np.exp(-e), 1.0 - delta - np.exp(e) * (1.0 - y))
        reach = np.nan_to_num(reach, nan=0.0, neginf=0.0)
        return shrink_inverse(np.minimum(y, np.maximum(reach, 0.0)), y)

    return inverse


def shrink_inverse(alpha, tpr):
    """An inverse ROC value moved below its float rounding (the recursion must not use a
    value above the exact inverse): relative 1e-12 and absolute 1e-15 (several ulp of 1,
    the rounding of the lines' cancellations), floored at 0. ``tpr`` is unused: kept so
    every inverse passes through one place."""
    del tpr
    return np.maximum(alpha * _INVERSE_SAFETY - _INVERSE_ABS, 0.0)


def roc_inverse_of(tradeoff, name: str = "tradeoff") -> RocInverse:
    """The inverse ROC of any claimed trade-off curve, by bisection (for curves without one).

    Returns y -> the largest alpha found with 1 - f(alpha) < y, within 2^-60 of the exact
    smallest alpha reaching y and never above it, so the recursion stays conservative. The
    curve is checked first (``check_curve``: a ``CurveError`` names ``name``).
    """
    curve = check_curve(tradeoff, name)

    def inverse(tpr):
        y = np.asarray(tpr, dtype=np.float64)
        lo, hi = np.zeros_like(y), y.copy()  # the ROC is >= alpha, so the answer is <= y
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            reached = 1.0 - np.asarray(curve(mid), dtype=np.float64) >= y
            hi = np.where(reached, mid, hi)
            lo = np.where(reached, lo, mid)
        return lo

    return inverse


__all__ = [
    "EPSILON_CAP",
    "MU_CAP",
    "RocInverse",
    "epsdelta_roc_inverse",
    "gdp_roc_inverse",
    "largest_refuted",
    "largest_refuted_mu",
    "refutes",
    "refutes_gdp",
    "roc_inverse_of",
    "shrink_inverse",
]
