"""The joint GDP test's quadrature and search (stats/joint_gdp.py): the coarse grid brackets
the fine p-value, and the fast search returns what a plain bisection on the fine p-value does."""

import numpy as np
import pytest
from scipy.special import bdtr, betaincinv, ndtr, ndtri

from dpaudit.stats import joint_gdp
from dpaudit.stats.threshold_selection import Bonferroni


def _fine_p(rank, n_own, cross, n_other, mu):
    """The fine upper Riemann sum written out independently of the module's class."""
    q = joint_gdp._FINE
    w = betaincinv(rank + 1.0, n_own - rank, q[1:])
    with np.errstate(divide="ignore"):
        h = bdtr(cross, n_other, ndtr(ndtri(1.0 - w) - mu))
    return float(np.dot(np.diff(q), h))


def _bisect_mu(rank, n_own, cross, n_other, level):
    """sup{mu >= 0 : fine p(mu) <= level} by plain bisection to 1e-11 (the reference)."""
    if _fine_p(rank, n_own, cross, n_other, 0.0) > level:
        return None
    lo, hi = 0.0, 1.0
    while _fine_p(rank, n_own, cross, n_other, hi) <= level:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-11:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _fine_p(rank, n_own, cross, n_other, mid) <= level else (lo, mid)
    return lo


def test_coarse_grid_is_part_of_the_fine_one():
    assert np.isin(joint_gdp._COARSE, joint_gdp._FINE).all()
    assert joint_gdp._COARSE[0] == 0.0 and joint_gdp._COARSE[-1] == 1.0


@pytest.mark.parametrize("rank,n_own,cross,n_other", [(0, 50, 40, 60), (62, 1000, 700, 1000),
                                                       (3, 20000, 19000, 20000)])
def test_coarse_sums_bracket_the_fine_p_value(rank, n_own, cross, n_other):
    jp = joint_gdp._JointP(rank, n_own, cross, n_other)
    for mu in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0):
        lower, upper = jp.coarse(mu)
        fine = jp.fine(mu)
        ref = _fine_p(rank, n_own, cross, n_other, mu)
        assert fine == pytest.approx(ref, rel=1e-12, abs=1e-300)
        assert lower <= fine * (1 + 1e-12) + 1e-300
        assert fine <= upper * (1 + 1e-12) + 1e-300


@pytest.mark.parametrize("rank,n_own,cross,n_other,level", [
    (0, 50, 40, 60, 0.01), (15, 1000, 886, 1000, 0.005), (249, 1000, 401, 1000, 0.005),
    (7049, 100000, 68454, 100000, 0.0025),
])
def test_search_matches_plain_bisection(rank, n_own, cross, n_other, level):
    ref = _bisect_mu(rank, n_own, cross, n_other, level)
    got = joint_gdp._joint_mu(rank, n_own, cross, n_other, level, 0.0)
    assert (ref is None) == (got is None)
    if ref is not None:
        assert got == pytest.approx(ref, rel=2e-9)
        assert _fine_p(rank, n_own, cross, n_other, got) <= level  # the returned mu is rejected


def test_candidates_visiting_order_does_not_change_the_maximum():
    rng = np.random.default_rng(4)
    s_in, s_out = rng.normal(1.5, 1, 400), rng.normal(0, 1, 700)
    cands = Bonferroni().candidates(np.sort(s_in), np.sort(s_out))
    level = 0.05 / cands.thresholds.size
    best, index = joint_gdp.joint_gdp_mu(cands, level)
    each = []
    for i in range(cands.thresholds.size):
        out = cands.side[i] == "out"
        n_own, n_other = (cands.n_out, cands.n_in) if out else (cands.n_in, cands.n_out)
        if cands.cross[i] < n_other:
            mu = _bisect_mu(int(cands.rank[i]), n_own, int(cands.cross[i]), n_other, level)
            each.append(-1.0 if mu is None else mu)
        else:
            each.append(-1.0)
    assert best == pytest.approx(max(each), rel=2e-9)
    assert each[index] == pytest.approx(best, rel=2e-9)
