"""One-run audit (Steinke, Nasr & Jagielski 2023): p-value against a direct evaluation of
their bound, closed forms at delta = 0, and a randomized-response simulation."""

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit.stats import epsilon_from_guesses, epsilon_lower_bound, one_run_p_value
from dpaudit.stats.one_run.guesses import guess_counts
from dpaudit.stats.ties import random_order


def _direct(m, r, v, eps, delta):
    """Term-by-term evaluation of P[Bin >= v] + 2 m delta max_i P[v - i <= Bin < v] / i."""
    q = 1 / (1 + math.exp(-eps))
    tail = stats.binom.sf(v - 1, r, q)
    best = 0.0
    for i in range(1, v + 1):
        window = stats.binom.cdf(v - 1, r, q) - stats.binom.cdf(v - i - 1, r, q)
        best = max(best, window / i)
    return min(tail + 2 * m * delta * best, 1.0)


@pytest.mark.parametrize(
    ("m", "r", "v", "eps", "delta"),
    [
        (1000, 100, 80, 1.0, 1e-5),
        (1000, 500, 400, 0.5, 1e-4),
        (100, 20, 20, 2.0, 1e-3),
        (10_000, 3000, 2900, 3.0, 1e-6),
        (50, 10, 3, 0.1, 1e-2),
        (10, 5, 0, 1.0, 1e-3),
    ],
)
def test_p_value_matches_direct_evaluation(m, r, v, eps, delta):
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(
        _direct(m, r, v, eps, delta), rel=1e-9, abs=1e-15
    )


def test_all_correct_delta_zero_closed_form():
    # p = q^r with q = e^eps / (1 + e^eps): eps_lb = logit(beta^(1/r)).
    r, beta = 200, 0.05
    x = beta ** (1 / r)
    got = epsilon_from_guesses(1000, r, r, delta=0.0, significance=beta)
    assert got == pytest.approx(math.log(x / (1 - x)), rel=1e-5)
    assert epsilon_from_guesses(1000, 0, 0, delta=0.0, significance=beta) == 0.0


def test_randomized_response_never_exceeds_and_gets_close():
    # eps0-DP randomized response on every one of m canaries; all guessed (r = m).
    eps0, m = 1.0, 20_000
    rng = np.random.default_rng(9)
    v = int(rng.binomial(m, math.exp(eps0) / (1 + math.exp(eps0))))
    lb = epsilon_from_guesses(m, m, v, delta=1e-6, significance=0.05)
    assert 0.85 * eps0 <= lb <= eps0


def test_guess_counts_exact_k():
    # labels ordered by ascending score: exactly k+ top guesses "in", k- bottom guesses "out"
    labels = np.array([False, True, False, True, True])
    v = guess_counts(labels, [1, 2, 0, 2, 0], [0, 0, 2, 2, 5])
    assert v.tolist() == [1, 2, 1, 3, 2]


def test_one_run_breaks_ties_at_random_and_keeps_r_fixed():
    # binary scores: ~60% of members and ~40% of non-members score 1. Guesses are exactly k,
    # and 200 "in" guesses inside the tie group of 1s are right with its member share
    rng = np.random.default_rng(4)
    s_in = (rng.random(1000) < 0.6).astype(float)
    s_out = (rng.random(1000) < 0.4).astype(float)
    pooled = np.r_[s_in, s_out]
    labels = np.r_[np.ones(1000, bool), np.zeros(1000, bool)]
    share_ones = s_in.sum() / pooled.sum()
    top = [guess_counts(labels[random_order(pooled, seed)], [200], [0])[0] for seed in range(200)]
    assert np.mean(top) / 200 == pytest.approx(share_ones, abs=0.01)
    res = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="one_run", seed=3)
    d = res.details
    assert d["guesses"] == d["k_plus"] + d["k_minus"] and d["ties_broken_at_random"]
    assert res.epsilon == epsilon_lower_bound(
        s_in, s_out, delta=1e-5, method="one_run", seed=3
    ).epsilon


def test_one_run_bound_details_and_grid_validation():
    rng = np.random.default_rng(0)
    inc = rng.random(2000) < 0.5
    sc = np.where(inc, rng.normal(3, 1, 2000), rng.normal(0, 1, 2000))
    res = epsilon_lower_bound(sc[inc], sc[~inc], delta=1e-5, method="one_run")
    d = res.details
    assert res.epsilon > 0 and d["correct"] <= d["guesses"] <= d["m"] == 2000
    assert d["significance_per_pair"] == pytest.approx(0.05 / d["n_pairs"])
    with pytest.raises(ValueError, match="grid"):
        epsilon_lower_bound(sc[inc], sc[~inc], delta=1e-5, method="one_run", grid=[0.0])


def test_one_run_pure_dp_delta_zero():
    # delta = 0: Steinke et al.'s bound without the delta term, P[Bin(r, q) >= v] alone.
    rng = np.random.default_rng(2)
    inc = rng.random(2000) < 0.5
    sc = np.where(inc, rng.normal(3, 1, 2000), rng.normal(0, 1, 2000))
    res = epsilon_lower_bound(sc[inc], sc[~inc], delta=0.0, method="one_run")
    d = res.details
    assert res.delta == 0.0 and res.epsilon > 0
    direct = epsilon_from_guesses(
        d["m"], d["guesses"], d["correct"], delta=0.0, significance=d["significance_per_pair"]
    )
    assert res.epsilon == pytest.approx(direct)
    assert (
        res.epsilon >= epsilon_lower_bound(sc[inc], sc[~inc], delta=1e-5, method="one_run").epsilon
    )


def _p_value_full_scan(m, r, v, eps, delta):
    """The previous implementation: the max over the whole window, one bdtr per i (O(W))."""
    from scipy.special import bdtr, bdtrc, expit

    from dpaudit.stats.one_run.steinke import _WINDOW_MAX, _WINDOW_SD

    q = float(expit(eps))
    tail = 1.0 if v == 0 else float(bdtrc(v - 1, r, q))
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    sd = np.sqrt(r * q * (1.0 - q))
    lowest = max(int(np.floor(r * q - _WINDOW_SD * sd)), 0)
    w = int(min(v, max(v - lowest, 1), _WINDOW_MAX))
    i = np.arange(1, w + 1, dtype=np.float64)
    below_v = float(bdtr(v - 1, r, q))
    sums = below_v - np.where(v - i - 1 >= 0, bdtr(np.maximum(v - i - 1, 0), r, q), 0.0)
    alpha = float(np.max(sums / i))
    if w < v:
        alpha = max(alpha, (sums[-1] + float(bdtr(v - w - 1, r, q))) / (w + 1))
    return min(tail + alpha * delta * 2.0 * m, 1.0)


def test_p_value_bracketing_search_equals_full_scan():
    # random (m, r, v, eps, delta) up to m = 3e6, half with v near the top of r
    rng = np.random.default_rng(1)
    for _ in range(300):
        m = int(10 ** rng.uniform(1, 6.5))
        r = int(rng.integers(1, m + 1))
        v = int(rng.integers(0, r + 1))
        if rng.random() < 0.5:
            v = int(min(r, round(r * rng.uniform(0.5, 1.0))))
        eps, delta = float(rng.uniform(0, 8)), float(10 ** rng.uniform(-9, -2))
        got = one_run_p_value(m, r, v, eps, delta)
        assert got == pytest.approx(_p_value_full_scan(m, r, v, eps, delta), rel=0, abs=1e-12)


def test_one_run_not_applicable_when_m_delta_is_large():
    # m = 4000, delta = 2.5e-3: 2 m delta = 20. The scores separate well (delta = 0 certifies
    # > 1), so the 0 comes from the delta term: "not applicable", never evidence.
    rng = np.random.default_rng(3)
    inc = rng.random(4000) < 0.5
    sc = np.where(inc, rng.normal(1.0, 1, 4000), rng.normal(0, 1, 4000))
    assert epsilon_lower_bound(sc[inc], sc[~inc], delta=0.0, method="one_run").epsilon > 0.5
    res = epsilon_lower_bound(sc[inc], sc[~inc], delta=2.5e-3, method="one_run")
    assert res.epsilon == 0.0 and not res.applicable and not res.certified
    assert res.kind == "not applicable" and "m*delta = 10" in res.note
    assert res.details["m_delta"] == pytest.approx(10.0)
    d = res.to_dict()
    assert d["applicable"] is False and d["kind"] == "not applicable"
    # no signal at all: a plain 0 (nothing certified), applicable
    null = epsilon_lower_bound(sc[inc] * 0, sc[~inc] * 0, delta=1e-6, method="one_run")
    assert null.epsilon == 0.0 and null.applicable and null.note is None
    # the audit's table row: not applicable, epsilon nan, not counted by the verdict
    from dpaudit.experiment.judging.evaluation import bound_rows
    from dpaudit.experiment.judging.verdict import best

    rows = bound_rows({"a": (sc[inc], sc[~inc])}, ["one_run"], 2.5e-3, 0.95)
    assert rows[0].kind == "not applicable" and np.isnan(rows[0].epsilon)
    assert rows[0].error.startswith("not applicable") and best(rows, "certified") is None


def test_vectorised_p_value_lower_bound_never_exceeds_the_p_value():
    # the one-run search dismisses pairs with it: it must be a lower bound, rounding included
    from dpaudit.stats.one_run.steinke import _p_value_lower, p_value

    rng = np.random.default_rng(0)
    for _ in range(600):
        m = int(rng.integers(2, 100_000))
        r = int(rng.integers(1, m + 1))
        v = int(rng.integers(0, r + 1))
        eps, delta = float(rng.uniform(0, 6)), float(rng.choice([0.0, 1e-6, 1e-3, 0.01]))
        incl = float(rng.choice([0.5, 0.1, 0.9]))
        low = _p_value_lower(m, np.array([r]), np.array([v]), eps, delta, incl)[0]
        assert low <= p_value(m, r, v, eps, delta, incl)


def test_vectorised_delta0_brackets_match_the_scalar_p_value():
    from dpaudit.stats.one_run.steinke import _tail_upper_ends, p_value

    rng = np.random.default_rng(1)
    m, sig = 2000, 0.05 / 63
    r = rng.integers(0, 1000, 50)
    v = np.minimum(r, rng.integers(0, 1000, 50))
    for incl in (0.5, 0.2):
        ub = _tail_upper_ends(m, r, v, sig, incl)
        for ri, vi, u in zip(r, v, ub, strict=True):
            if u == 0.0:  # nothing rejected at delta = 0
                assert ri == 0 or p_value(m, int(ri), int(vi), 0.0, 0.0, incl) >= sig
            else:
                assert p_value(m, int(ri), int(vi), float(u), 0.0, incl) >= sig
                below = float(u) - 1.01e-3 * max(1.0, float(u))  # the bracket's width
                assert p_value(m, int(ri), int(vi), below, 0.0, incl) < sig
