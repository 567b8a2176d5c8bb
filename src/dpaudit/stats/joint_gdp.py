"""The joint GDP test at one-sided order-statistic candidates (Nasr et al. 2023's GDP fit).

At an "out" candidate of rank k the true FPR is <= W ~ Beta(k+1, n_out - k) (exactly, see
``threshold_selection``) and, given the threshold, the false negatives are Binomial(n_in,
FNR). If the mechanism is mu-GDP, FNR >= G_mu(FPR) >= G_mu(W) with G_mu(a) =
Phi(Phi^-1(1 - a) - mu), so fn is stochastically larger than the mixture X* of
Binomial(n_in, G_mu(W)) over W and p(mu) = P(X* <= fn_observed) is a valid p-value ("in"
candidates: the same with the roles swapped, G_mu being its own inverse). p grows with mu;
a candidate's mu_lb is the largest mu with p(mu) <= level.

The expectation over W is an upper Riemann sum on a fixed grid of Beta quantiles (``_FINE``:
the integrand increases with W, so the computed p-value is never smaller than the true one).
The search is cheap because of a coarse grid ``_COARSE`` that is a SUBSET of the fine one: on
it the upper sum is >= the fine upper sum and the lower sum <= the fine lower sum <= the true
p. So a coarse lower sum above the level rules a mu out and a coarse upper sum at or below it
rules it in, both without a fine evaluation; the fine sum (the number that decides, the same
as before this module existed) is evaluated only inside the coarse bracket, by a bracketed
secant search (``bracket.largest_accepted``). Candidates are visited in the order of a cruder bound
(one-sided bounds at level / 2 on each side), so that the best one usually comes first and
the others are dismissed by one coarse sum at its mu.
"""

from __future__ import annotations

import numpy as np
from scipy.special import bdtr, betaincinv, ndtr, ndtri

from dpaudit.stats.bracket import largest_accepted
from dpaudit.stats.threshold_selection import OneSidedCandidates

# Quadrature on the probability scale of the own side's Beta law.
_TAIL = np.geomspace(1e-14, 1e-3, 120)
_FINE = np.unique(np.concatenate([np.linspace(0.0, 1.0, 4097), _TAIL, 1.0 - _TAIL]))
_COARSE = np.unique(np.concatenate([np.linspace(0.0, 1.0, 129), _TAIL[::8], 1.0 - _TAIL[::8]]))
assert np.isin(_COARSE, _FINE).all()  # a refinement: the coarse sums bracket the fine ones
_MU_CAP = 200.0
_TOL = 1e-9  # relative width at which the search stops (the lower end is returned)


class _JointP:
    """p(mu) of one candidate: the fine upper sum, and coarse lower / upper sums around it."""

    def __init__(self, rank: int, n_own: int, cross: int, n_other: int):
        self._a, self._b = rank + 1.0, float(n_own - rank)
        self._cross, self._n_other = cross, n_other
        self._z_coarse = self._z(_COARSE)
        self._z_fine: np.ndarray | None = None  # computed when first needed (the costly part)

    def _z(self, q: np.ndarray) -> np.ndarray:
        w = betaincinv(self._a, self._b, q)  # own-side rate quantiles (Beta law)
        with np.errstate(divide="ignore"):
            return ndtri(1.0 - w)

    def _h(self, z: np.ndarray, mu: float) -> np.ndarray:
        # P(Bin(n_other, G_mu(w)) <= cross), G_mu(w) = Phi(Phi^-1(1 - w) - mu)
        return bdtr(self._cross, self._n_other, ndtr(z - mu))

    def coarse(self, mu: float) -> tuple[float, float]:
        """(lower, upper) Riemann sums on the coarse grid: lower <= p_fine(mu) <= upper."""
        h = self._h(self._z_coarse, mu)
        width = np.diff(_COARSE)
        return float(np.dot(width, h[:-1])), float(np.dot(width, h[1:]))

    def fine(self, mu: float) -> float:
        """The p-value: the upper Riemann sum on the fine grid (right end points)."""
        if self._z_fine is None:
            self._z_fine = self._z(_FINE[1:])
        return float(np.dot(np.diff(_FINE), self._h(self._z_fine, mu)))


def _decide(jp: _JointP, mu: float, level: float) -> bool | None:
    """True when p_fine(mu) <= level is certain from the coarse sums, False when
    p_fine(mu) > level is, None when only the fine sum can tell."""
    lower, upper = jp.coarse(mu)
    if lower > level:
        return False
    if upper <= level:
        return True
    return None


def _search(jp: _JointP, level: float, lo: float, hi: float) -> float:
    """Largest mu in [lo, hi) with p_fine(mu) <= level, given p_fine(lo) <= level < p_fine(hi),
    to relative width ``_TOL`` (the returned end always satisfies the test)."""
    # narrow the bracket on the coarse sums: the lower end while a coarse upper sum admits
    # it, the upper end while a coarse lower sum excludes it (two bisections)
    a, b = lo, hi  # p_fine(a) <= level, p_fine(b) > level; (a, b) undecided once narrowed
    while b - a > _TOL * max(1.0, a):
        mid = 0.5 * (a + b)
        ok = _decide(jp, mid, level)
        if ok is None:
            break
        a, b = (mid, b) if ok else (a, mid)
    if b - a <= _TOL * max(1.0, a):
        return a
    c, d = mid, b  # [c, d): the upper end's search, c undecided
    while d - c > 1e-3 * (b - a):
        mid = 0.5 * (c + d)
        if _decide(jp, mid, level) is False:
            d = mid
        else:
            c = mid
    hi = d
    c, d = a, 0.5 * (a + b)  # (c, d]: the lower end's search, d undecided
    while d - c > 1e-3 * (b - a):
        mid = 0.5 * (c + d)
        if _decide(jp, mid, level) is True:
            c = mid
        else:
            d = mid
    lo = c
    ends = tuple(float(np.log(max(sum(jp.coarse(x)), 1e-300) / (2.0 * level))) for x in (lo, hi))
    return largest_accepted(jp.fine, lambda value: value <= level, level, lo, hi, _TOL, ends)


def _joint_mu(rank: int, n_own: int, cross: int, n_other: int, level: float, floor: float):
    """sup{mu >= floor : p(mu) <= level} or None when p(floor) > level."""
    jp = _JointP(rank, n_own, cross, n_other)
    ok = _decide(jp, floor, level)
    if ok is False or (ok is None and jp.fine(floor) > level):
        return None
    lo, hi = floor, max(2.0 * floor, 1.0)
    while True:  # an upper end: p_fine(hi) > level
        ok = _decide(jp, hi, level)
        if ok is None:
            ok = jp.fine(hi) <= level
        if not ok:
            break
        lo, hi = hi, 2.0 * hi
        if hi > _MU_CAP:
            return lo
    return float(_search(jp, level, lo, hi))


def _split_estimates(cands: OneSidedCandidates, level: float) -> np.ndarray:
    """Each candidate's mu from separate one-sided bounds at level / 2 per side (the joint
    test's cruder cousin, which tracks it closely): the visiting order only, never the result."""
    out = cands.side == "out"
    n_own = np.where(out, cands.n_out, cands.n_in).astype(np.float64)
    n_other = np.where(out, cands.n_in, cands.n_out).astype(np.float64)
    own = betaincinv(cands.rank + 1.0, n_own - cands.rank, 1.0 - 0.5 * level)
    cross = np.minimum(cands.cross, n_other - 1.0)
    other = betaincinv(cross + 1.0, n_other - cross, 1.0 - 0.5 * level)
    return ndtri(1.0 - own) - ndtri(other)


def joint_gdp_mu(cands: OneSidedCandidates, level: float) -> tuple[float, int | None]:
    """Largest mu rejected by a joint test at some candidate: (mu_lb, index) or (0.0, None).

    Each candidate's mu_lb is the largest mu with p(mu) <= ``level`` (module doc); with
    ``level`` = beta / m a union bound over the m candidates makes max mu_lb a level-beta
    bound. Of candidates with the same mu_lb the one listed first is reported.
    """
    best, index = 0.0, None
    for i in np.argsort(-_split_estimates(cands, level), kind="stable"):
        i = int(i)
        out = cands.side[i] == "out"
        n_own, n_other = (cands.n_out, cands.n_in) if out else (cands.n_in, cands.n_out)
        rank, cross = int(cands.rank[i]), int(cands.cross[i])
        if cross >= n_other:
            continue
        mu = _joint_mu(rank, n_own, cross, n_other, level, best)
        if mu is not None and (index is None or mu > best or (mu == best and i < index)):
            best, index = mu, i
    return best, index
