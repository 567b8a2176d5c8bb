"""The joint GDP test's lattice (stats/joint_gdp.py): the lattice mu_lb is never above the exact
supremum and at most two steps below it, checked against the p-value written as the original
Beta-mixture of binomials and integrated by adaptive quadrature; the candidate dismissal bound
is above every lattice value, so the maximum equals the one over all candidates."""

import itertools
import warnings

import numpy as np
import pytest
from scipy import integrate
from scipy.special import bdtr, betaincinv, ndtr, ndtri

from dpaudit.stats import joint_gdp
from dpaudit.stats.threshold_selection import Bonferroni


def _exact_p(rank, n_own, cross, n_other, mu):
    """p(mu) = E_W[P(Bin(n_other, G_mu(W)) <= cross)], W ~ Beta(rank+1, n_own-rank), by quad on
    W's probability scale (split at its tails), to ~1e-11 relative."""
    a, b = rank + 1.0, n_own - rank

    def integrand(q):
        return bdtr(cross, n_other, ndtr(-ndtri(betaincinv(a, b, q)) - mu))

    tails = np.geomspace(1e-15, 1e-3, 13)
    edges = np.unique(np.concatenate([[0.0], tails, np.linspace(0, 1, 65), 1 - tails, [1.0]]))
    with warnings.catch_warnings():  # roundoff complaints where bdtr saturates at 0 or 1
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        return sum(integrate.quad(integrand, lo, hi, epsabs=1e-15, epsrel=1e-10, limit=200)[0]
                   for lo, hi in itertools.pairwise(edges))


CASES = [  # rank, n_own, cross, n_other, level
    (0, 50, 40, 60, 0.01), (15, 1000, 886, 1000, 0.005), (249, 1000, 401, 1000, 0.005),
    (7049, 100000, 68454, 100000, 0.0025), (0, 100000, 95000, 100000, 0.001),
    (3, 20, 19, 20, 0.05), (62, 1000, 999, 1000, 0.005),
]


@pytest.mark.parametrize("rank,n_own,cross,n_other,level", CASES)
def test_lattice_mu_is_rejected_and_within_two_steps(rank, n_own, cross, n_other, level):
    mu = joint_gdp.lattice_mu(rank, n_own, cross, n_other, level)
    step = joint_gdp._STEP  # the largest step the default lattice takes
    assert _exact_p(rank, n_own, cross, n_other, mu - 1e-12) <= level  # valid: never too high
    assert _exact_p(rank, n_own, cross, n_other, mu + 2 * step + 1e-6) > level  # tight


@pytest.mark.parametrize("rank,n_own,cross,n_other,level", CASES[:4])
def test_a_finer_lattice_stays_below_the_exact_supremum(rank, n_own, cross, n_other, level):
    coarse = joint_gdp.lattice_mu(rank, n_own, cross, n_other, level, step=2e-2)
    fine = joint_gdp.lattice_mu(rank, n_own, cross, n_other, level, step=2e-4)
    assert coarse <= fine + 1e-12
    assert _exact_p(rank, n_own, cross, n_other, fine - 1e-12) <= level
    assert _exact_p(rank, n_own, cross, n_other, fine + 4e-4 + 1e-6) > level


@pytest.mark.parametrize("seed,mu_true,n_in,n_out", [(4, 1.5, 400, 700), (5, 0.0, 300, 300),
                                                     (6, 3.0, 2000, 1500)])
def test_dismissal_bound_is_above_every_candidate_and_keeps_the_maximum(seed, mu_true, n_in,
                                                                        n_out):
    rng = np.random.default_rng(seed)
    s_in, s_out = rng.normal(mu_true, 1, n_in), rng.normal(0, 1, n_out)
    cands = Bonferroni().candidates(np.sort(s_in), np.sort(s_out))
    level = 0.05 / cands.thresholds.size
    bounds = joint_gdp._upper_bounds(cands, level)
    each = []
    for i in range(cands.thresholds.size):
        out = cands.side[i] == "out"
        n_own, n_other = (cands.n_out, cands.n_in) if out else (cands.n_in, cands.n_out)
        if cands.cross[i] >= n_other:
            each.append(-np.inf)
            assert bounds[i] == -np.inf
            continue
        each.append(joint_gdp.lattice_mu(int(cands.rank[i]), n_own, int(cands.cross[i]),
                                         n_other, level))
        assert each[-1] <= bounds[i]
    best, index = joint_gdp.joint_gdp_mu(cands, level)
    top = max(each)
    if top > 0:
        assert best == top and index == each.index(top)  # first listed among equals
    else:
        assert (best, index) == (0.0, None)
