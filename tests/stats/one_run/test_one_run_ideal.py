"""The exact law of correct guesses on ideal scores (``stats.one_run.ideal``): the posterior
against its definition, the pair law against simulation and against the ceiling's banded
posteriors, and the design's exact medians."""

import numpy as np
import pytest
from scipy.special import ndtr

from dpaudit.stats.gdp import gdp_mu
from dpaudit.stats.one_run.design import exact_median, median_correct
from dpaudit.stats.one_run.ideal import ideal_posterior, median_count, pair_count_pmf
from dpaudit.validity.ceiling import pair_count_pmf as banded_pair_pmf

MU = gdp_mu(4.0, 1e-5)


def test_ideal_posterior_is_the_share_of_members_above_the_quantile():
    post = ideal_posterior(MU)
    for r in (1e-4, 0.01, 0.3, 0.5, 0.9):
        # the upper r-quantile t of the mixture, found independently on a fine grid
        t = np.linspace(-10, 10, 2_000_001)
        tail = 0.5 * (ndtr(MU - t) + ndtr(-t))
        q = t[np.argmin(np.abs(tail - r))]
        assert post(np.array([r]), np.array([1 - r]))[0] == pytest.approx(
            0.5 * ndtr(MU - q) / r, rel=1e-4)


def test_the_pair_law_matches_simulation_and_the_banded_one():
    m, k, runs = 600, 25, 3000
    pmf = pair_count_pmf(ideal_posterior(MU), m, k, k)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(pmf, banded_pair_pmf(MU, m, k, k), atol=1e-9)
    sims = []
    for r in range(runs):
        rng = np.random.default_rng([3, r])
        members = rng.random(m) < 0.5
        order = np.argsort(rng.standard_normal(m) + MU * members)
        sims.append(members[order[-k:]].sum() + (~members[order[:k]]).sum())
    sims = np.array(sims)
    mean = float(np.dot(np.arange(pmf.size), pmf))
    assert sims.mean() == pytest.approx(mean, abs=4 * sims.std() / np.sqrt(runs))
    survival = pmf[::-1].cumsum()[::-1]
    for c in (35, 40, 45):
        assert abs((sims >= c).mean() - survival[c]) <= 4 * np.sqrt(0.25 / runs)


def test_exact_medians_correct_the_binomial_model_by_a_count():
    """At m = 1000, k = 37 a side the binomial model says 67 and the exact median is 66 (the
    tooth the design used to miss); the design re-ranks by the exact one."""
    assert int(median_correct(37, MU, 1000, 37)) == 67
    assert exact_median(1000, MU, 37, 37) == 66
    pmf = pair_count_pmf(ideal_posterior(MU), 1000, 37, 37, nodes=24)
    assert median_count(pmf) == 66
    survival = pmf[::-1].cumsum()[::-1]
    assert survival[66] > 0.5 >= survival[67]
