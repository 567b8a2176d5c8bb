"""The premises' intervals: the noise scale's chi-square interval and the rate's Clopper-Pearson
interval against simulation, scipy's own exact interval and closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from dpaudit.stats.premises import rate_interval, rate_upper, scale_interval, scale_lower


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
