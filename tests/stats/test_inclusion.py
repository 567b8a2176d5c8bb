"""The one-run design's inclusion probability: the plausibility check, the virtual fair-coin
labels, the subsampling lemma the reduction rests on (checked on random discrete pairs), and the
reduced p-value against Steinke et al.'s formula at the amplified parameters."""

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit.stats import epsilon_lower_bound, one_run_p_value
from dpaudit.stats.inclusion import (
    PLAUSIBILITY_LEVEL,
    amplification,
    amplified_epsilon,
    check_inclusion,
    require_plausible,
    split_p_value,
    virtual_labels,
)


def _steinke(m, r, v, eps, delta):
    """Term by term: P[Bin(r, q) >= v] + 2 m delta max_i P[v - i <= Bin < v] / i."""
    q = 1 / (1 + math.exp(-eps))
    tail = stats.binom.sf(v - 1, r, q)
    best = max(
        (stats.binom.cdf(v - 1, r, q) - stats.binom.cdf(v - i - 1, r, q)) / i
        for i in range(1, v + 1)
    )
    return min(tail + 2 * m * delta * best, 1.0)


@pytest.mark.parametrize("p", [0.5, 0.3, 0.05, 0.8])
def test_p_value_is_steinke_at_the_amplified_parameters(p):
    gamma = 2 * min(p, 1 - p)
    assert amplification(p) == pytest.approx(gamma)
    for m, r, v, eps, delta in [(1000, 100, 80, 1.0, 1e-5), (5000, 400, 390, 3.0, 1e-6)]:
        eps_v = math.log1p(gamma * math.expm1(eps))
        assert float(amplified_epsilon(eps, gamma)) == pytest.approx(eps_v, rel=1e-12)
        assert one_run_p_value(m, r, v, eps, delta, p) == pytest.approx(
            _steinke(m, r, v, eps_v, gamma * delta), rel=1e-9, abs=1e-15
        )


def _hockey(p, q, eps):
    return float(np.maximum(p - np.exp(eps) * q, 0.0).sum())


def _delta_of(p, q, eps):
    return max(_hockey(p, q, eps), _hockey(q, p, eps))


def test_subsampling_lemma_on_random_pairs():
    # The reduction's key step (docs/one_run_inclusion.md): if (P1, P0) is (eps, delta)-DP in
    # both directions, then (gamma P1 + (1 - gamma) P0, P0) is (eps', gamma delta)-DP in both
    # directions, eps' = log(1 + gamma (e^eps - 1)). Checked exactly (finite sums) on random
    # discrete pairs, each at its own delta(eps), for several eps and gamma.
    rng = np.random.default_rng(0)
    worst = -np.inf
    for _ in range(400):
        k = int(rng.integers(2, 8))
        p1, p0 = rng.dirichlet(np.ones(k) * 0.7), rng.dirichlet(np.ones(k) * 0.7)
        for eps in (0.0, 0.3, 1.0, 3.0):
            delta = _delta_of(p1, p0, eps)
            for gamma in (0.02, 0.3, 0.7, 1.0):
                mix = gamma * p1 + (1 - gamma) * p0
                eps_v = float(amplified_epsilon(eps, gamma))
                worst = max(worst, _delta_of(mix, p0, eps_v) - gamma * delta)
    assert worst <= 1e-12


def test_virtual_labels_are_fair_coins_consistent_with_membership():
    n_in, n_out = 300, 2700  # p = 0.1
    lab = np.array([virtual_labels(n_in, n_out, 0.1, s) for s in range(400)])
    assert lab[:, :n_in].all()  # every member is +1
    # a non-member is +1 with probability (1/2 - p) / (1 - p) = 4/9; overall a fair coin
    assert lab[:, n_in:].mean() == pytest.approx(4 / 9, abs=0.005)
    assert lab.mean() == pytest.approx(0.5, abs=0.005)
    hi = np.array([virtual_labels(2700, 300, 0.9, s) for s in range(400)])
    assert not hi[:, 2700:].any() and hi.mean() == pytest.approx(0.5, abs=0.005)
    half = virtual_labels(3, 2, 0.5, 0)
    assert half.tolist() == [True, True, True, False, False]  # the memberships themselves


def test_plausibility_check_refuses_designs_the_theorem_does_not_cover():
    assert split_p_value(1000, 1000, 0.5) == 1.0
    assert split_p_value(200, 5000, 0.5) < 1e-100
    with pytest.raises(ValueError, match=r"inclusion=0\.5"):
        require_plausible(200, 5000, 0.5, "one_run")
    assert require_plausible(200, 5000, 200 / 5200, "one_run") > 0.9
    with pytest.raises(ValueError, match="inclusion"):
        require_plausible(1, 300, 0.5, "one_run")
    # 1000 members against 1200 non-members: p = 2e-5 under 1/2, refused; 1100: accepted
    with pytest.raises(ValueError, match="implausible"):
        require_plausible(1000, 1200, 0.5, "one_run")
    assert require_plausible(1000, 1100, 0.5, "one_run") > PLAUSIBILITY_LEVEL
    # under the stated design a refusal is rare: about PLAUSIBILITY_LEVEL of draws at most
    rng = np.random.default_rng(1)
    n_in = rng.binomial(2000, 0.3, 20_000)
    refused = np.mean([split_p_value(k, 2000 - k, 0.3) < PLAUSIBILITY_LEVEL for k in n_in])
    assert refused <= 2 * PLAUSIBILITY_LEVEL + 3 * math.sqrt(PLAUSIBILITY_LEVEL / 20_000)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, math.nan, "0.5", None, True, 1j])
def test_inclusion_must_be_a_probability(bad):
    with pytest.raises(ValueError, match="inclusion"):
        check_inclusion(bad)
    with pytest.raises(ValueError, match="inclusion"):
        epsilon_lower_bound([1.0, 2.0], [0.0, 1.0], delta=1e-5, method="one_run", inclusion=bad)


def test_one_run_with_unequal_design_is_valid_on_nulls_and_finds_signal():
    # No signal, members drawn with p = 200/5200 (the 200 / 5000): nothing certified
    # (the old p = 1/2 bound certified 2.47 in the median here). Strong signal: certified.
    rng = np.random.default_rng(5)
    p = 200 / 5200
    for rep in range(5):
        member = rng.random(5200) < p
        s = rng.standard_normal(5200)
        b = epsilon_lower_bound(s[member], s[~member], delta=1e-5, method="one_run",
                                inclusion=p, seed=rep)
        assert b.epsilon == 0.0 and b.details["inclusion"] == p and b.details["gamma"] < 0.08
        with pytest.raises(ValueError, match="inclusion"):
            epsilon_lower_bound(s[member], s[~member], delta=1e-5, method="one_run")
        s = s + 6.0 * member
        sig = epsilon_lower_bound(s[member], s[~member], delta=1e-5, method="one_run",
                                  inclusion=p, seed=rep)
        assert sig.epsilon > 2.0 and sig.certified
