"""Guess counts fixed by the claim (``stats.one_run.design``) and the infimum of the claims
not refuted (``stats.one_run.confidence_set``): closed forms, brute force, simulation."""

import numpy as np
import pytest

from dpaudit.stats import epsilon_lower_bound, gdp_epsilon, gdp_mu
from dpaudit.stats.one_run.confidence_set import infimum_not_refuted
from dpaudit.stats.one_run.design import (
    EXACT_CANDIDATES,
    Family,
    PieceRule,
    claim_guess_count,
    claim_guess_pair,
    exact_median,
    expected_correct,
    guess_count_grid,
    guess_pairs,
    median_correct,
    piece_rule,
    soonest_guess_count,
)
from dpaudit.stats.one_run.guesses import guess_table
from dpaudit.stats.one_run.recursion import gdp_roc_inverse, largest_refuted, refutes


def _gauss(mu, m, seed):
    rng = np.random.default_rng(seed)
    members = rng.random(m) < 0.5
    scores = rng.standard_normal(m) + mu * members
    return scores[members], scores[~members]


def test_grid_halves_per_octave_and_keeps_at_least_ten_guesses():
    ks = guess_count_grid(10_000)
    assert ks.max() == 5000 and ks.min() >= 10
    assert np.all(np.diff(ks) > 0)
    # 8 counts per halving: k and 2k are 8 grid steps apart
    i = int(np.searchsorted(ks, 625))
    assert ks[i] == 625 and ks[i + 8] == 1250
    assert guess_count_grid(15).size == 0  # m/2 < 10: no count


def test_expected_correct_matches_simulation():
    m, mu, k = 4000, 1.0, np.array([40, 400, 2000])
    sims = []
    for seed in range(400):
        rng = np.random.default_rng(seed)
        members = np.repeat([True, False], m // 2)
        scores = rng.standard_normal(m) + mu * members
        top = np.argsort(scores)[::-1]
        sims.append([members[top[:kk]].sum() for kk in k])
    mean = np.mean(sims, axis=0)
    se = np.std(sims, axis=0) / np.sqrt(len(sims))
    np.testing.assert_allclose(expected_correct(k, mu, m), mean, atol=4 * se.max() + 1.0)
    assert np.all(median_correct(k, mu, m) <= k)
    assert np.all(np.diff(median_correct(400, np.array([0.2, 0.5, 1.0, 2.0]), m)) >= 0)


def test_claim_guess_count_is_the_best_count_for_the_claims_own_scores():
    m, level, mu = 10_000, 0.05, 1.0
    fam = Family("gdp")
    k = claim_guess_count(m, level, fam, mu)
    ks = guess_count_grid(m)
    got = largest_refuted(ks, median_correct(ks, mu, m), True, m=m, level=level,
                          roc_inverse=gdp_roc_inverse)
    assert k == ks[int(np.argmax(got))]
    # a count in the middle of the grid, neither the smallest nor half of the canaries
    assert ks[0] < k < ks[-1]
    # smaller levels need more guesses to refute anything
    assert claim_guess_count(m, 1e-6, fam, mu) >= k
    with pytest.raises(ValueError, match="family"):
        Family("renyi")


def test_two_sided_median_matches_simulation():
    """The bottom "out" guesses count like the top "in" ones (reflection): the pair's median
    model against simulated ideal scores."""
    m, mu, k = 4000, 1.0, 200
    sims = []
    for seed in range(300):
        rng = np.random.default_rng(seed)
        members = rng.random(m) < 0.5
        order = np.argsort(rng.standard_normal(m) + mu * members)
        sims.append(members[order[-k:]].sum() + (~members[order[:k]]).sum())
    assert abs(np.median(sims) - median_correct(k, mu, m, k)) <= 3
    assert median_correct(k, mu, m, 0) == median_correct(k, mu, m)


def test_claim_guess_pair_is_the_best_pair_and_two_sided_wins_from_a_thousand_canaries():
    """The pair that certifies most at its exact median among the binomial model's best
    EXACT_CANDIDATES (the model's median can be one count off); two-sided at epsilon 4."""
    level, fam = 0.05, Family("epsdelta", 1e-5)
    mu = gdp_mu(4.0, 1e-5)
    for m in (1000, 10_000):
        kp, km = guess_pairs(m)
        got = largest_refuted(kp + km, median_correct(kp, mu, m, km), km == 0, m=m,
                              level=level, roc_inverse=fam.roc_inverse, cap=fam.cap)
        top = np.argsort(-got, kind="stable")[:EXACT_CANDIDATES]
        exact = np.array([exact_median(m, mu, int(kp[i]), int(km[i])) for i in top])
        value = largest_refuted(kp[top] + km[top], exact, km[top] == 0, m=m, level=level,
                                roc_inverse=fam.roc_inverse, cap=fam.cap)
        best = top[int(np.argmax(value))]
        assert claim_guess_pair(m, level, fam, mu) == (kp[best], km[best])
        assert km[best] == kp[best] > 0  # two-sided at epsilon 4
        one = claim_guess_pair(m, level, fam, mu, two_sided=False)
        assert one[1] == 0 and one == (claim_guess_pair(m, level, fam, mu, False)[0], 0)
        one_value = largest_refuted(np.array([one[0]]),
                                    np.array([exact_median(m, mu, one[0], 0)]), True, m=m,
                                    level=level, roc_inverse=fam.roc_inverse, cap=fam.cap)[0]
        assert value.max() > one_value


def test_soonest_count_minimises_the_weakest_refuted_alternative():
    m, level = 8000, 0.05
    k = soonest_guess_count(m, level, lambda y: gdp_roc_inverse(y, 1.0))
    ks = guess_count_grid(m)
    assert k in ks
    # brute force: for each k, the smallest ideal shift whose median count refutes mu = 1
    shifts = np.linspace(1.0, 4.0, 301)
    first = []
    for kk in ks:
        med = median_correct(np.full(shifts.size, kk), shifts, m)
        ok = refutes(np.full(shifts.size, kk), med, 1.0, True, m=m, level=level)
        first.append(shifts[np.argmax(ok)] if ok.any() else np.inf)
    assert first[int(np.flatnonzero(ks == k)[0])] <= min(first) + 0.02


def test_infimum_against_a_scan_of_every_claim():
    s_in, s_out = _gauss(1.0, 6000, seed=3)
    base = guess_table(s_in, s_out, method="test", pairs=[])
    rule = piece_rule(base.m, 0.05, Family("gdp"))
    assert rule.starts[0] == 0.0 and np.all(np.diff(rule.starts) > 0)
    assert rule.ks.size == rule.starts.size and set(rule.ks) <= set(guess_count_grid(base.m))
    table = base.counts([(int(k), 0) for k in np.unique(rule.ks)])
    value, piece = infimum_not_refuted(table, rule)
    # brute force: each claim on a fine grid tested with its piece's count
    thetas = np.linspace(0.0, 2.0, 4001)
    piece_of = np.searchsorted(rule.starts, thetas, side="right") - 1
    k_of = rule.ks[piece_of]
    v_of = np.asarray(table.correct)[np.searchsorted(table.k_plus, k_of)]
    refuted = refutes(k_of, v_of, thetas, True, m=base.m, level=0.05)
    first_kept = thetas[np.argmin(refuted)]
    assert np.all(refuted[thetas < value - 1e-4])  # everything below the infimum is refuted
    assert first_kept == pytest.approx(value, abs=1e-3)
    assert rule.starts[piece] <= value


def test_infimum_is_valid_when_refutation_is_not_monotone():
    # two pieces: below 0.5 a count so small that nothing is refuted, above it a large one
    s_in, s_out = _gauss(2.0, 4000, seed=1)
    base = guess_table(s_in, s_out, method="test", pairs=[])
    rule = PieceRule(Family("gdp"), base.m, 0.05, np.array([0.0, 0.5]), np.array([10, 500]))
    table = base.counts([(10, 0), (500, 0)])
    assert largest_refuted([500], table.correct[1:], True, m=base.m, level=0.05)[0] > 0.5
    value, piece = infimum_not_refuted(table, rule)
    # 10 guesses refute only small claims: the infimum stops in the first piece, below 0.5,
    # even though the larger count refutes much more above it
    top10 = largest_refuted([10], table.correct[:1], True, m=base.m, level=0.05)[0]
    assert piece == 0 and value == pytest.approx(min(top10, 0.5))
    with pytest.raises(ValueError, match="guess counts"):
        infimum_not_refuted(base.counts([(10, 0)]), rule)


@pytest.mark.slow
@pytest.mark.parametrize("design_mu", [None, 1.0])
def test_certified_epsilon_covers_the_truth_on_independent_canaries(design_mu):
    # 200 runs of 2000 exact 1-GDP canaries: the certified epsilon exceeds the truth in at
    # most 5% + 3 s.e. of them (both guess-count designs)
    mu, delta, runs = 1.0, 1e-5, 200
    truth = gdp_epsilon(mu, delta)
    opts = {} if design_mu is None else {"design_mu": design_mu}
    over = 0
    for seed in range(runs):
        s_in, s_out = _gauss(mu, 2000, seed=1000 + seed)
        try:
            b = epsilon_lower_bound(s_in, s_out, delta=delta, method="fdp_one_run_certified",
                                    **opts)
        except ValueError:  # an implausible split is refused: no statement
            continue
        over += b.epsilon > truth
    rate = over / runs
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / runs)


def test_claim_fixed_count_reaches_two_thirds_of_mu_at_ten_thousand():
    # ideal scores, eps 4 at delta 1e-5: the design count at the claim's own mu certifies
    # mu_lower / mu well above the 0.57 of the earlier Bonferroni design (5 draws, median)
    mu = gdp_mu(4.0, 1e-5)
    ratios = []
    for seed in range(5):
        s_in, s_out = _gauss(mu, 10_000, seed=seed)
        b = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="fdp_one_run", design_mu=mu)
        ratios.append(b.mu_lower / mu)
    assert np.median(ratios) > 0.62


def test_two_sided_pairs_leave_a_canary_unguessed_and_small_runs_work():
    """A two-sided pair guesses at most m - 1 canaries (the exact law needs the gap between
    the two cut points); the own loop's 24 canaries get a pair too."""
    kp, km = guess_pairs(24)
    assert np.all(kp + km <= 23) and (km > 0).any()
    pair = claim_guess_pair(24, 0.05, Family("gdp"), 1.0)
    assert sum(pair) <= 23
