"""The premises' intervals: the noise scale's chi-square interval and the rate's Clopper-Pearson
interval against simulation, scipy's own exact interval and closed forms."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import binomtest, chi2

from dpaudit.stats.premises import (
    equal_width_alphas,
    rate_interval,
    rate_upper,
    run_counts,
    run_edges,
    scale_interval,
    scale_lower,
    scale_lowers,
)


@pytest.mark.parametrize("dof", [10, 400, 25_600])
def test_scale_interval_covers_at_its_confidence(dof):
    """4,000 simulated noises of scale r = 1.3: two-sided 90% coverage within 4 binomial
    standard errors, each one-sided end missing about half the rest."""
    rng = np.random.default_rng(dof)
    r, n = 1.3, 4000
    s = r**2 * rng.chisquare(dof, n)
    ends = np.array([scale_interval(x, dof, 0.90) for x in s])
    miss_low, miss_high = (ends[:, 0] > r).mean(), (ends[:, 1] < r).mean()
    se = np.sqrt(0.05 * 0.95 / n)
    assert abs(miss_low - 0.05) < 4 * se and abs(miss_high - 0.05) < 4 * se
    lower = np.array([scale_lower(x, dof, 0.95) for x in s[:500]])
    np.testing.assert_allclose(lower, ends[:500, 0])  # the one-sided end at 95%


def test_scale_interval_widens_by_the_recovery_error():
    lo, hi = scale_interval(1000.0, 1000, 0.95)
    elo, ehi = scale_interval(1000.0, 1000, 0.95, error=3.0)
    assert elo < lo and ehi > hi
    # the error moves the norm by at most 3: the ends are those of (sqrt(S) -+ 3)^2
    np.testing.assert_allclose(elo, scale_interval((np.sqrt(1000) - 3) ** 2, 1000, 0.95)[0])
    np.testing.assert_allclose(ehi, scale_interval((np.sqrt(1000) + 3) ** 2, 1000, 0.95)[1])


@pytest.mark.parametrize(("k", "n"), [(0, 50), (7, 50), (50, 50), (6400, 134_800)])
def test_rate_interval_is_scipys_exact_interval(k, n):
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    np.testing.assert_allclose(rate_interval(k, n, 0.95), (ci.low, ci.high), rtol=1e-9,
                               atol=1e-12)
    one = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert rate_upper(k, n, 0.975) == pytest.approx(one.high, rel=1e-9, abs=1e-12)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="dof"):
        scale_interval(1.0, 0, 0.95)
    with pytest.raises(ValueError, match="sum_sq"):
        scale_interval(-1.0, 10, 0.95)
    with pytest.raises(ValueError, match="confidence"):
        rate_interval(1, 10, 1.5)
    with pytest.raises(ValueError, match="successes"):
        rate_interval(11, 10, 0.95)


def test_runs_are_fixed_by_the_sizes_and_nested():
    """The run counts 1, 2, 4, ... then one per step are nested (every coarser edge is a finer
    one's), cover the steps, and each tensor gets the most runs that keep 5,000 draws each."""
    for steps in (7, 88, 100, 1000):
        edges = [set(run_edges(steps, m).tolist()) for m in (1, 2, 4, 8, steps) if m <= steps]
        assert all(a <= b for a, b in itertools.pairwise(edges))
        assert all(min(e) == 0 and max(e) == steps for e in edges)
    # 88 steps: 72 coordinates a step pool 88 (6,336 draws: one run), 1,152 over 16 runs of 5
    # or 6 steps, 25,600 step by step, 8 over everything (704 draws: too few, still one run)
    np.testing.assert_array_equal(run_counts([72, 1152, 25_600, 8], 88, 5000), [1, 16, 88, 1])
    with pytest.raises(ValueError, match="runs"):
        run_edges(10, 11)
    with pytest.raises(ValueError, match="min_draws"):
        run_counts([10], 5, 0)


@pytest.mark.parametrize("atoms", [16, None])
def test_equal_width_alphas_spend_the_budget_on_equal_lower_ends(atoms):
    """At every cell's median sum the lower ends are the same 1 - w; the sum of the atoms'
    largest probabilities (all of them when None: Bonferroni) is the budget; the large cells
    get almost none of it."""
    dofs = np.array([704, 880, 1408, 6336] + [6336] * 16 + [7920] * 16, dtype=float)
    a, w = equal_width_alphas(dofs, 0.01, atoms)
    top = np.sort(a)[::-1][: dofs.size if atoms is None else atoms]
    assert top.sum() == pytest.approx(0.01, rel=1e-6) and top.sum() <= 0.01
    # (scipy's chi2.isf loses digits below 1e-12: the large cells' ends are not compared)
    ends = [scale_lower(chi2.ppf(0.5, d), d, 1 - x) for d, x in zip(dofs, a, strict=True)
            if x > 1e-12]
    assert len(ends) >= 3
    np.testing.assert_allclose(ends, 1 - w, rtol=1e-9)
    assert a[-1] < 1e-10 < a[0]
    big = a > 1e-9  # scale_lower's confidence 1 - alpha keeps alpha's digits down to that
    np.testing.assert_allclose(scale_lowers(dofs[big], dofs[big], a[big]),
                               [scale_lower(d, d, 1 - x) for d, x in zip(dofs[big], a[big],
                                                                         strict=True)])
    with pytest.raises(ValueError, match="budget"):
        equal_width_alphas(dofs, 1.5)
    with pytest.raises(ValueError, match="alphas"):
        scale_lowers([1.0], [1.0], [0.0])
