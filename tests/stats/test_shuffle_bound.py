"""Chua et al.'s lower bound on the true epsilon of shuffled fixed-size batches
(``stats.shuffle_bound``): exact for one batch a pass (the Gaussian mechanism), its event
probabilities against a simulation, never above what knowing the target's batch would give,
monotone where it must be, and above the Poisson accountant where shuffling leaks more."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.special import ndtr

from dpaudit.stats import gdp_epsilon
from dpaudit.stats.shuffle_bound import shuffled_batches_epsilon_lower_bound as bound


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_one_batch_a_pass_is_the_gaussian_mechanism(sigma):
    # b = 1: P = N(2, sigma^2), Q = N(1, sigma^2): the threshold events are the optimal tests
    assert bound(sigma, 1, 1, 1e-5) == pytest.approx(gdp_epsilon(1 / sigma, 1e-5), rel=1e-4)


def test_the_event_probabilities_match_a_simulation():
    # P(max_t y_t > C) for y = shift e_t + N(0, sigma^2 I_b), the formula the bound uses
    rng = np.random.default_rng(0)
    b, sigma, n = 4, 1.0, 400_000
    y = rng.normal(0.0, sigma, (n, b))
    for shift in (2.0, 1.0):
        z = y.copy()
        z[:, 0] += shift  # which batch holds the target does not matter (symmetry)
        top = z.max(axis=1)
        for c in (0.5, 2.0, 3.5):
            formula = 1 - ndtr((c - shift) / sigma) * ndtr(c / sigma) ** (b - 1)
            mc = float((top > c).mean())
            assert abs(mc - formula) <= 4 * np.sqrt(formula * (1 - formula) / n)


@pytest.mark.parametrize(("sigma", "b", "passes"), [(0.8, 50, 1), (1.0, 20, 4), (2.0, 10, 3)])
def test_never_above_knowing_the_targets_batch(sigma, b, passes):
    # knowing the batch, each pass is N(2) against N(1): composed, mu = sqrt(E) / sigma
    assert bound(sigma, b, passes, 1e-5) <= gdp_epsilon(np.sqrt(passes) / sigma, 1e-5) + 1e-9


def test_monotone_in_the_noise_and_the_passes():
    eps = [bound(s, 100, 2, 1e-6) for s in (0.6, 0.8, 1.0, 1.5)]
    assert all(a > b for a, b in itertools.pairwise(eps))
    by_pass = [bound(1.0, 100, e, 1e-6) for e in (1, 2, 5)]
    assert all(a < b for a, b in itertools.pairwise(by_pass))


def test_the_published_single_pass_values():
    # Chua et al.'s cube-set bound for b = 1000 batches, delta 1e-6 (their formulas, evaluated
    # independently on a grid of step 0.01): 10.997, 3.724, 0.601 at sigma 0.5, 1, 1.5
    for sigma, eps in ((0.5, 10.997), (1.0, 3.724), (1.5, 0.601)):
        assert bound(sigma, 1000, 1, 1e-6) == pytest.approx(eps, abs=2e-3)


def test_shuffling_leaks_more_than_the_poisson_claim_at_small_noise():
    from dpaudit.accounting import accountant_epsilon

    # 1000 batches a pass (q = 1/1000), one pass, sigma 0.8: the Poisson accountant's claim
    # is far below what shuffled batches provably leak
    claim = accountant_epsilon(0.8, 1e-3, 1000, 1e-6, "prv").epsilon
    assert bound(0.8, 1000, 1, 1e-6) > 5 * claim


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="noise_multiplier"):
        bound(0.0, 10, 1, 1e-5)
    with pytest.raises(ValueError, match="passes"):
        bound(1.0, 10, 0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        bound(1.0, 10, 1, 0.0)
