"""The validity suite: its truth is right, and certified bounds stay below it.

Part 1 checks the ground truth of ``dpaudit.validity.scenarios`` against independent
computations (closed forms, quadrature, Monte Carlo, simulated Neyman-Pearson tests, Opacus'
PRV accountant, hand arithmetic). Part 2 runs ``validity_study`` / ``claim_study``: every
certified method of ``dpaudit.stats.METHODS`` (the ``kind`` of the returned bounds decides)
must exceed the truth in at most 1 - confidence of the repetitions, up to 3 standard errors
(of a fraction at the nominal rate); estimates must say what they assume, and how often they
exceed the truth is recorded (printed with ``-s``, and as junit properties), not asserted.

Default sizes: 50 repetitions of 500 per side (one_run and fdp_one_run 15, gdp 20), and the
unequal and small designs (``DESIGNS``) on four scenarios for the certified methods. The
``slow`` tests use 300 repetitions of 2000 scores per side, except one_run / fdp_one_run (100)
and gdp (40: an estimate at ~0.3 s a call), and every scenario on the designs.
``benchmarks/validity_table.py --designs all`` runs every method at 300 (gdp 100): its table is
``experiments/validity_designs.md``. Methods with equal repetitions share one study (one draw
per repetition), cached for the session.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import stdtr

from dpaudit.accounting import (
    accountant_epsilon,
    subsampled_gaussian_profile,
    subsampled_gaussian_tradeoff,
)
from dpaudit.stats import (
    METHOD_REGISTRY,
    METHODS,
    epsilon_lower_bound,
    gdp_delta,
    gdp_epsilon,
    gdp_tradeoff,
)
from dpaudit.validity import (
    CURVE_MARGIN,
    DESIGNS,
    SCENARIOS,
    BinomialScores,
    ComposedSubsampledGaussian,
    Design,
    DiscreteScores,
    GaussianShift,
    LaplaceShift,
    PoissonCounts,
    StudentTShift,
    SubsampledGaussian,
    claim_study,
    draw,
    draw_rng,
    randomized_response,
    validity_study,
)

DELTA = 1e-5
CONF = 0.95
NAMES = list(SCENARIOS)
EXACT = [n for n in NAMES if not isinstance(SCENARIOS[n], ComposedSubsampledGaussian)]


# --------------------------------------------------------------------------------------------
# Part 1: the truth


@pytest.mark.parametrize("mu", [1.0, 2.0])
def test_gaussian_truth_is_gdp(mu):
    s = GaussianShift(mu)
    for d in (1e-5, 1e-3, 0.1):
        assert s.true_epsilon(d) == gdp_epsilon(mu, d)
    assert s.true_epsilon(0.0) == np.inf
    for e in (0.0, 0.5, 2.0, 5.0):
        assert s.hockey_stick(e) == pytest.approx(gdp_delta(mu, e), rel=1e-9, abs=1e-15)
        assert s.hockey_stick(e, reverse=True) == s.hockey_stick(e)
    a = np.array([0.0, 1e-8, 0.01, 0.3, 0.7, 1.0])
    exact = np.clip(1.0 - gdp_tradeoff(a, mu), 0, 1)
    np.testing.assert_allclose(s.tradeoff(a), np.clip(exact - CURVE_MARGIN, 0, 1), atol=1e-15)


@pytest.mark.parametrize("b", [1.0, 0.5])
def test_laplace_truth_closed_form(b):
    s = LaplaceShift(1.0, b)
    assert s.true_epsilon(0.0) == 1.0 / b
    # delta(eps) = 1 - exp((eps - eps0)/2)  =>  eps(delta) = eps0 + 2 log(1 - delta)
    assert s.true_epsilon(1e-5) == pytest.approx(1.0 / b + 2.0 * np.log1p(-1e-5), abs=1e-10)
    assert s.true_epsilon(0.2) == pytest.approx(1.0 / b + 2.0 * np.log(0.8), abs=1e-10)
    # TV = 1 - exp(-eps0/2)
    assert s.hockey_stick(0.0) == pytest.approx(1.0 - np.exp(-0.5 / b), abs=1e-15)


def test_student_t_profile_quadrature_and_monte_carlo():
    s = StudentTShift(3.0, 1.0)
    nu, k = 3.0, 2.0

    def dens(x, loc):
        # Student-t density (df 3), from its CDF's derivative formula
        c = 2.0 / (np.pi * np.sqrt(nu))
        return c * (1.0 + (x - loc) ** 2 / nu) ** (-k)

    assert quad(lambda x: dens(x, 0.0), -np.inf, np.inf, epsabs=1e-13)[0] == pytest.approx(1.0)
    rng = np.random.default_rng(7)
    x_in, _ = s.sample(400_000, 1, rng)
    llr_in = s.llr(x_in)
    for eps in (-0.5, 0.0, 0.3, 0.8, 1.1):
        g = np.exp(eps)
        # quadrature of max(p - g q, 0): integrate p - g q over the pieces where it is
        # positive, between its zeros (bracketed on a grid, then solved to 1e-15)

        def diff(x, g=g):
            return dens(x, 1.0) - g * dens(x, 0.0)

        grid = np.linspace(-60, 60, 240_001)
        change = np.flatnonzero(np.diff(np.sign(diff(grid))) != 0)
        zeros = [brentq(diff, grid[i], grid[i + 1], xtol=1e-15) for i in change]
        edges = [-np.inf, *zeros, np.inf]
        total = 0.0
        for lo, hi in itertools.pairwise(edges):
            if np.isfinite(lo) and np.isfinite(hi):  # a point inside (lo, hi)
                mid = 0.5 * (lo + hi)
            else:
                mid = hi - 1.0 if np.isfinite(hi) else lo + 1.0
            if diff(mid) > 0:
                total += quad(diff, lo, hi, epsabs=1e-14, epsrel=1e-13, limit=500)[0]
        h = float(s.hockey_stick(eps))
        assert h == pytest.approx(total, abs=1e-9), eps
        # Monte Carlo: H_g(P||Q) = E_P[(1 - g exp(-llr))_+], a bounded integrand
        mc = np.maximum(1.0 - g * np.exp(-llr_in), 0.0)
        se = mc.std() / np.sqrt(mc.size)
        assert abs(h - mc.mean()) <= 5 * se + 1e-6, (eps, h, mc.mean(), se)
    # pure epsilon: sup of the log-likelihood ratio
    xs = np.linspace(-20, 20, 400_001)
    assert s.pure_epsilon() == pytest.approx(np.max(np.abs(s.llr(xs))), abs=1e-8)
    # the level sets are exact: stdtr is the CDF used
    assert float(stdtr(3.0, 0.0)) == 0.5


def test_student_t_curve_matches_profile_duality():
    # f(a) = sup_{eps in R} 1 - H_{e^eps}(P||Q) - e^eps a: the NP curve agrees with the profile
    s = SCENARIOS["student_t3"]
    eps = np.linspace(-1.2, 1.2, 4001)
    h = s.hockey_stick(eps)
    a = np.array([0.001, 0.01, 0.05, 0.2, 0.5, 0.8, 0.99])
    dual = np.max(1.0 - h[None, :] - np.exp(eps)[None, :] * a[:, None], axis=1)
    f = s.tradeoff(a)
    assert np.all(f >= dual - 1e-9)  # the grid sup is below the exact curve
    np.testing.assert_allclose(f, dual, atol=2e-6)


@pytest.mark.parametrize("name", EXACT)
def test_profile_and_curve_are_dual(name):
    # H_{e^eps}(P||Q) = sup_a 1 - f(a) - e^eps a, and H(Q||P) likewise with the reverse curve
    s = SCENARIOS[name]
    a = np.concatenate([np.linspace(0, 1, 100_001), np.geomspace(1e-12, 1e-3, 2000)])
    f, fr = s.tradeoff(a), s.tradeoff_reverse(a)
    for eps in (0.0, 0.5, 1.0, 1.5):
        g = np.exp(eps)
        assert np.max(1 - f - g * a) == pytest.approx(float(s.hockey_stick(eps)), abs=2e-5)
        assert np.max(1 - fr - g * a) == pytest.approx(
            float(s.hockey_stick(eps, reverse=True)), abs=2e-5
        )


@pytest.mark.parametrize("name", NAMES)
def test_curve_shape(name):
    s = SCENARIOS[name]
    a = np.linspace(0, 1, 1001)
    for f in (s.tradeoff(a), s.tradeoff_reverse(a)):
        assert f.shape == a.shape
        assert np.all(np.diff(f) <= 1e-15)  # non-increasing
        assert np.all(f <= 1.0 - a + 1e-12) and np.all(f >= 0)
    assert s.tradeoff(0.3).shape == ()
    with pytest.raises(ValueError):
        s.tradeoff(np.array([1.5]))


@pytest.mark.parametrize("name", NAMES)
def test_curve_vs_simulated_neyman_pearson(name):
    # The optimal test at FPR a, simulated from ``sample``: its FNR matches the claimed curve
    # (and ``sample`` draws from the pair the truth describes).
    s = SCENARIOS[name]
    n = 50_000 if isinstance(s, ComposedSubsampledGaussian) else 200_000  # 100 draws a score
    x_in, x_out = s.sample(n, n, np.random.default_rng(11))
    if isinstance(s, DiscreteScores):  # vertices of the NP curve: tests "score >= k"
        p, q = s.pmfs()
        ks = (1, 2, 3) if p.size <= 4 else (8, 12, 16)
        for k in ks:
            a = float(np.mean(x_out >= k))
            a_exact = q[k:].sum()
            assert a == pytest.approx(a_exact, abs=5 * np.sqrt(a_exact / n))
            fnr = float(np.mean(x_in < k))
            assert float(s.tradeoff(a_exact)) == pytest.approx(p[:k].sum(), abs=1e-8)
            assert fnr == pytest.approx(p[:k].sum(), abs=5 * np.sqrt(0.25 / n))
        return
    stat_in, stat_out = (x_in, x_out) if s.monotone else (s.llr(x_in), s.llr(x_out))
    for a in (0.01, 0.1, 0.3, 0.6):
        thr = np.quantile(stat_out, 1.0 - a)
        fnr = float(np.mean(stat_in <= thr))
        f = float(s.tradeoff(a))
        slope = abs(float(s.tradeoff(a + 1e-4)) - float(s.tradeoff(a - 1e-4))) / 2e-4
        tol = 5 * (np.sqrt(f * (1 - f) / n) + slope * np.sqrt(a * (1 - a) / n)) + 1e-4
        if isinstance(s, ComposedSubsampledGaussian):  # PRV envelope: a bound, below the truth
            assert f <= fnr + tol and fnr - f <= 0.02, (a, f, fnr)
        else:
            assert f == pytest.approx(fnr, abs=tol), (a, f, fnr)
        # reverse order: "non-member iff stat < t" at P-rate a
        thr_r = np.quantile(stat_in, a)
        fnr_r = float(np.mean(stat_out >= thr_r))
        fr = float(s.tradeoff_reverse(a))
        if isinstance(s, ComposedSubsampledGaussian):
            assert fr <= fnr_r + tol
        else:
            slope_r = (
                abs(float(s.tradeoff_reverse(a + 1e-4)) - float(s.tradeoff_reverse(a - 1e-4)))
                / 2e-4
            )
            tol_r = 5 * (np.sqrt(fr * (1 - fr) / n) + slope_r * np.sqrt(a * (1 - a) / n)) + 1e-4
            assert fr == pytest.approx(fnr_r, abs=tol_r), (a, fr, fnr_r)


def test_binomial_by_hand():
    s = BinomialScores(3, 0.6, 0.3)
    p = np.array([0.064, 0.288, 0.432, 0.216])
    q = np.array([0.343, 0.441, 0.189, 0.027])
    np.testing.assert_allclose(s.pmfs(), (p, q), atol=1e-15)
    assert s.true_epsilon(0.0) == pytest.approx(np.log(8.0))  # 0.216 / 0.027
    assert s.true_epsilon(1e-5) == pytest.approx(np.log((0.216 - 1e-5) / 0.027), abs=1e-10)
    # H_2(P||Q) = (0.432 - 0.378) + (0.216 - 0.054); H_2(Q||P) = (0.343 - 0.128) + 0
    assert float(s.hockey_stick(np.log(2.0))) == pytest.approx(0.216, abs=1e-12)
    assert float(s.hockey_stick(np.log(2.0), reverse=True)) == pytest.approx(0.215, abs=1e-12)
    # curve: vertices (0.027, 0.216), (0.216, 0.648); at 0.1 interpolate linearly
    tpr = 0.216 + (0.1 - 0.027) / 0.189 * 0.432
    assert float(s.tradeoff(0.1)) == pytest.approx(1.0 - tpr - CURVE_MARGIN, abs=1e-12)
    # reverse curve at P-rate 0.064 (say "non-member" at score 0): Q-miss 1 - 0.343
    assert float(s.tradeoff_reverse(0.064)) == pytest.approx(0.657 - CURVE_MARGIN, abs=1e-12)


def test_randomized_response_truth_by_hand():
    s = randomized_response(1.0)
    q = np.exp(1.0) / (1 + np.exp(1.0))
    assert s.name == "randomized_response_eps1" and s.pmfs()[0].tolist() == pytest.approx(
        [1 - q, q]
    )
    assert s.true_epsilon(0.0) == pytest.approx(1.0)
    # H_{e^eps}(P||Q) = q - e^eps (1 - q) at the atom 1: eps(delta) = log((q - delta) / (1 - q))
    assert s.true_epsilon(1e-5) == pytest.approx(np.log((q - 1e-5) / (1 - q)), abs=1e-10)
    assert float(s.tradeoff(1 - q)) == pytest.approx(1 - q - CURVE_MARGIN, abs=1e-12)
    assert float(s.tradeoff_reverse(0.1)) == pytest.approx(float(s.tradeoff(0.1)), abs=1e-12)


def test_poisson_counts_truth_against_direct_sums():
    s = PoissonCounts(12.0, 10.0)
    from scipy.stats import poisson

    k = np.arange(400)  # far beyond the folded support: the exact infinite sums
    p, q = poisson.pmf(k, 12.0), poisson.pmf(k, 10.0)
    for eps in (0.0, 0.5, 1.5, 3.0):
        g = np.exp(eps)
        exact = np.maximum(p - g * q, 0).sum()
        assert float(s.hockey_stick(eps)) == pytest.approx(exact, abs=1e-15)
        assert float(s.hockey_stick(eps, reverse=True)) == pytest.approx(
            np.maximum(q - g * p, 0).sum(), abs=1e-15
        )
    assert s.true_epsilon(0.0) == np.inf and 2.9 < s.true_epsilon(1e-5) < 3.1
    # the likelihood ratio is increasing in k: thresholds are the optimal tests
    assert np.all(np.diff(s.llr(np.arange(50))) > 0)


def test_logistic_truth():
    s = SCENARIOS["logistic_shift2"]
    assert s.true_epsilon(0.0) == 2.0
    assert s.true_epsilon(1e-5) == pytest.approx(1.99, abs=0.01)
    # monotone LR: H = P(x > t) - e^eps Q(x > t) at the t where llr(t) = eps
    from scipy.special import expit

    for eps in (0.2, 1.0, 1.9):
        t = brentq(lambda x, e=eps: float(s.llr(x)) - e, -50, 50, xtol=1e-14)
        assert float(s.hockey_stick(eps)) == pytest.approx(
            expit(-(t - 2.0)) - np.exp(eps) * expit(-t), abs=1e-12
        )


def test_subsampled_one_step_matches_prv():
    s = SubsampledGaussian(0.1, 0.5)
    for d in (1e-5, 1e-3):
        prv = accountant_epsilon(0.5, 0.1, 1, d, "prv").epsilon
        assert s.true_epsilon(d) == pytest.approx(prv, abs=0.05)
        assert s.true_epsilon(d) <= prv + 1e-9  # Opacus returns its upper estimate
    # the two directions differ; the reverse one is pure with eps = -log(1 - q)
    assert float(s.hockey_stick(0.2, reverse=True)) == 0.0
    assert float(s.hockey_stick(0.1, reverse=True)) > 0.0
    assert float(s.hockey_stick(0.2)) > 0.01
    assert float(s.hockey_stick(0.0)) == pytest.approx(float(s.hockey_stick(0.0, reverse=True)))


def test_composed_subsampled_truth_matches_accountant():
    s = SCENARIOS["dpsgd_T100_q0.05"]
    prv = accountant_epsilon(s.noise, s.q, s.steps, DELTA, "prv").epsilon
    assert s.true_epsilon(DELTA) == pytest.approx(prv, abs=0.05)
    assert 1.0 <= s.true_epsilon(DELTA) <= 4.0
    eps = np.linspace(0.1, 6.0, 60)
    fwd, rev = s.hockey_stick(eps), s.hockey_stick(eps, reverse=True)
    np.testing.assert_allclose(
        fwd, subsampled_gaussian_profile(s.noise, s.q, s.steps, eps), rtol=1e-5, atol=1e-8
    )
    # the remove direction dominates (Poisson subsampling), down to the reverse bound's floor
    # (delta_error (1 - q)^-T = 1.7e-9, from the coupling's failure event)
    assert np.all(rev <= np.maximum(fwd, 2e-9))
    a = np.array([1e-6, 1e-3, 0.05, 0.3, 0.7])
    ours = s.tradeoff(a)
    theirs = 1.0 - subsampled_gaussian_tradeoff(a, s.noise, s.q, s.steps)
    assert np.all(ours <= theirs + 1e-12)
    np.testing.assert_allclose(ours, theirs, atol=5e-3)


def test_composed_at_one_step_bounds_the_exact_one_step():
    # The PRV route (both directions) at T = 1 is an upper bound on the exact one-step profile.
    c, o = ComposedSubsampledGaussian(0.1, 0.5, 1), SubsampledGaussian(0.1, 0.5)
    eps = np.linspace(0.0, 6.0, 31)
    for rev in (False, True):
        hc, ho = c.hockey_stick(eps, reverse=rev), o.hockey_stick(eps, reverse=rev)
        assert np.all(hc >= ho - 1e-12)
        assert np.all(hc <= ho + 1e-2)  # the PRV error bounds: eps_error 0.01
        # ... which shift the profile by about eps_error: below the exact one 0.02 to the left
        # (plus the coupling's failure term, < 3e-9)
        shifted = o.hockey_stick(eps[eps >= 0.02] - 0.02, reverse=rev)
        assert np.all(hc[eps >= 0.02] <= shifted + 3e-9)
    assert o.true_epsilon(DELTA) <= c.true_epsilon(DELTA) <= o.true_epsilon(DELTA) + 0.02


@pytest.mark.parametrize("name", NAMES)
def test_true_epsilon_is_the_smallest(name):
    s = SCENARIOS[name]
    for d in (1e-5, 1e-2):
        e = s.true_epsilon(d)
        both = max(float(s.hockey_stick(e)), float(s.hockey_stick(e, reverse=True)))
        assert both <= d * (1 + 1e-9)
        if e > 0:
            below = e - (2e-4 if isinstance(s, ComposedSubsampledGaussian) else 1e-8)
            assert max(float(s.hockey_stick(below)), float(s.hockey_stick(below, reverse=True))) > d
    with pytest.raises(ValueError):
        s.true_epsilon(1.0)


def test_registry_and_sampling():
    assert len(NAMES) == len(set(NAMES)) >= 9
    for name, s in SCENARIOS.items():
        assert s.name == name
        a, b = s.sample(7, 5, np.random.default_rng(0))
        assert a.shape == (7,) and b.shape == (5,) and a.dtype == b.dtype == np.float64
        a2, _ = s.sample(7, 5, np.random.default_rng(0))
        np.testing.assert_array_equal(a, a2)
    r1 = draw_rng(3, SCENARIOS["laplace_b1"], 4).random(3)
    r2 = draw_rng(3, SCENARIOS["laplace_b1"], 4).random(3)
    r3 = draw_rng(3, SCENARIOS["laplace_b1"], 5).random(3)
    np.testing.assert_array_equal(r1, r2)
    assert not np.array_equal(r1, r3)


# --------------------------------------------------------------------------------------------
# Part 2: validity of the methods

FAST = {"reps": 50, "n": 500}
SLOW = {"reps": 300, "n": 2000}
# methods too slow for the default sizes: (fast reps, slow reps) at the same n. gdp (an
# estimate: how often it exceeds the truth is recorded, not asserted) costs ~0.3 s a call at
# 2000 per side; benchmarks/validity_table.py runs it at 100 repetitions.
SLOW_METHODS = {"one_run": (15, 100), "fdp_one_run": (15, 100), "gdp": (20, 40)}


def _reps(method: str, slow: bool) -> int:
    size = SLOW if slow else FAST
    return SLOW_METHODS.get(method, (size["reps"], size["reps"]))[1 if slow else 0]


def _study(method: str, slow: bool) -> list[dict]:
    """Rows of ``method``; the methods with the same repetitions run in one study (one draw
    per repetition, shared), cached for the session."""
    reps = _reps(method, slow)
    group = tuple(m for m in METHODS if _reps(m, slow) == reps)
    rows = _cached_study(group, reps, (SLOW if slow else FAST)["n"])
    return [r for r in rows if r["method"] == method]


@functools.cache
def _cached_study(methods: tuple[str, ...], reps: int, n: int) -> list[dict]:
    return validity_study(
        list(methods),
        SCENARIOS,
        reps=reps,
        n_in=n,
        n_out=n,
        delta=DELTA,
        confidence=CONF,
        seed=2024,
    )


def _report(rows, record_property) -> None:
    for r in rows:
        line = (
            f"{r['method']:>16} {r['kind']:>9} {r['scenario']:>26} {r['design']:>17} "
            f"truth {r['truth']:7.3f} "
            f"median {r['median_epsilon']:7.3f} above {r['frac_above']:.3f}"
            f"+-{r['frac_above_se']:.3f} valid {r['frac_valid']:.2f} "
            f"valid&above {r['frac_valid_above']:.3f} ({r['reps']} x {r['n_in']})"
        )
        print(line)
        record_property(f"{r['method']}/{r['scenario']}/{r['design']}", line)


def _check(rows) -> None:
    bad = []
    for r in rows:
        if r["kind"] in ("certified", "not applicable"):
            if r["frac_above"] > r["nominal"] + 3 * r["nominal_se"]:
                bad.append(r)
        else:
            assert r["kind"] == "estimate" and r["assumption"], r
    assert not bad, "certified bounds above the truth too often:\n" + "\n".join(
        f"{r['method']} on {r['scenario']}: {r['frac_above']:.3f} > "
        f"{r['nominal']:.3f} + 3 x {r['nominal_se']:.3f}"
        for r in bad
    )


@pytest.mark.xdist_group("validity_default")  # one worker: the study is shared (``_study``)
@pytest.mark.parametrize("method", METHODS)
def test_validity_default_sizes(method, record_property):
    rows = _study(method, slow=False)
    _report(rows, record_property)
    _check(rows)


@pytest.mark.slow
@pytest.mark.xdist_group("validity_full")  # one worker: the study is shared (``_study``)
@pytest.mark.parametrize("method", METHODS)
def test_validity_full_sizes(method, record_property):
    rows = _study(method, slow=True)
    _report(rows, record_property)
    _check(rows)


# The unequal and small designs (DESIGNS: 200 / 5000 Bernoulli both ways, 200 / 5000 fixed,
# one member against 300, ten per side), for the certified methods (estimates are labelled by
# the tests above). Fast: a subset of the scenarios, 20 repetitions (one_run 10); slow: every
# scenario, 100 repetitions (one_run 40). benchmarks/validity_table.py --designs all runs
# every method at the 300.
DESIGN_SCENARIOS = ["gaussian_mu1", "laplace_b1", "randomized_response_eps1", "poisson_counts12_10"]


def _design_reps(method: str, slow: bool) -> int:
    costly = method in SLOW_METHODS
    return (40 if costly else 100) if slow else (10 if costly else 20)


CERTIFIED = [m for m in METHODS if METHOD_REGISTRY[m].assumption is None]


@pytest.mark.parametrize("method", CERTIFIED)
def test_validity_unequal_and_small_designs(method, record_property):
    rows = validity_study(
        [method], DESIGN_SCENARIOS, reps=_design_reps(method, False), designs=list(DESIGNS),
        delta=DELTA, confidence=CONF, seed=2025,
    )
    _report(rows, record_property)
    _check(rows)


@pytest.mark.slow
@pytest.mark.parametrize("method", CERTIFIED)
def test_validity_unequal_and_small_designs_full(method, record_property):
    rows = validity_study(
        [method], SCENARIOS, reps=_design_reps(method, True), designs=list(DESIGNS),
        delta=DELTA, confidence=CONF, seed=2026,
    )
    _report(rows, record_property)
    _check(rows)


def test_one_run_methods_refuse_designs_they_do_not_cover():
    # the case: no signal, 200 members against 5000 non-members, and the one-run
    # methods told nothing (inclusion 1/2): refused (once certified 2.47 in the median)
    rows = validity_study(
        {"one_run": {"inclusion": 0.5}, "fdp_one_run": {"inclusion": 0.5}},
        [GaussianShift(1e-9)], reps=3, designs=["200/5000", "5000/200 bernoulli", "1/300"],
        delta=DELTA, confidence=CONF,
    )
    assert all(r["frac_refused"] == 1.0 and r["kind"] == "not applicable" for r in rows)
    assert all("inclusion" in r["refusal"] for r in rows)


def test_designs_draw_what_they_say():
    d = Design(200, 5000, bernoulli=True)
    assert d.inclusion == 200 / 5200 and d.name == "200/5000 bernoulli"
    sizes = [d.sizes(np.random.default_rng(i)) for i in range(400)]
    assert all(a + b == 5200 for a, b in sizes)
    assert np.mean([a for a, _ in sizes]) == pytest.approx(200, abs=2.0)
    assert Design(10, 10).inclusion == 0.5 and Design(1, 300).sizes(None) == (1, 300)
    s_in, s_out = draw(SCENARIOS["laplace_b1"], Design(3, 4), np.random.default_rng(0))
    assert (s_in.size, s_out.size) == (3, 4)
    with pytest.raises(ValueError, match="n_in"):
        Design(0, 4)
    with pytest.raises(ValueError, match="design"):
        validity_study(["gdp"], ["laplace_b1"], reps=1, designs=["9/9"], delta=DELTA)


def test_estimates_exceed_the_truth_off_their_model(record_property):
    # Recorded in the issue: the GDP route is above the truth every time on Laplace.
    rows = [r for r in _study("gdp", slow=False) if r["scenario"] == "laplace_b1"]
    _report(rows, record_property)
    assert rows[0]["kind"] == "estimate" and rows[0]["frac_above"] > 0.5


FINITE_PURE = [n for n in NAMES if np.isfinite(SCENARIOS[n].true_epsilon(0.0))]


@pytest.mark.parametrize("method", METHODS)
def test_validity_at_delta_zero(method, record_property):
    s_in, s_out = SCENARIOS["laplace_b1"].sample(50, 50, np.random.default_rng(0))
    try:
        b = epsilon_lower_bound(s_in, s_out, delta=0.0, method=method)
    except ValueError as err:
        pytest.skip(f"{method} does not take delta = 0: {err}")
    if b.kind != "certified":
        pytest.skip(f"{method} is an estimate")
    rows = validity_study(
        [method], FINITE_PURE, reps=30, n_in=500, n_out=500, delta=0.0, confidence=CONF, seed=1
    )
    _report(rows, record_property)
    _check(rows)


def test_study_rows_are_reproducible_and_complete():
    kw = {"reps": 3, "n_in": 40, "n_out": 30, "delta": DELTA, "confidence": CONF, "seed": 5}
    rows = validity_study(
        {"clopper_pearson": {}, "gdp": {}}, ["laplace_b1", "binomial3"], keep_epsilons=True, **kw
    )
    assert [(r["method"], r["scenario"]) for r in rows] == [
        ("clopper_pearson", "laplace_b1"),
        ("gdp", "laplace_b1"),
        ("clopper_pearson", "binomial3"),
        ("gdp", "binomial3"),
    ]
    again = validity_study(["clopper_pearson"], ["binomial3"], keep_epsilons=True, **kw)
    assert again[0]["epsilons"] == rows[2]["epsilons"]  # per-scenario seeding
    r = rows[1]
    assert r["kind"] == "estimate" and r["assumption"]
    assert rows[0]["kind"] == "certified" and rows[0]["assumption"] is None
    for key in (
        "frac_above",
        "frac_above_se",
        "median_ratio",
        "median_epsilon",
        "truth",
        "frac_valid",
        "frac_valid_above",
        "nominal",
        "nominal_se",
    ):
        assert np.isfinite(r[key])
    assert r["truth"] == SCENARIOS["laplace_b1"].true_epsilon(DELTA)
    assert len(r["epsilons"]) == 3
    with pytest.raises(ValueError, match="unknown scenario"):
        validity_study(["gdp"], ["nope"], **kw)
    with pytest.raises(ValueError, match="reps"):
        validity_study(["gdp"], ["laplace_b1"], **{**kw, "reps": 0})


# --------------------------------------------------------------------------------------------
# Part 3: the claim test (dpaudit.stats.claim.claim_test) on correct claims


def _claim_available() -> bool:
    try:
        from dpaudit.stats.claim import claim_test

        claim_test(np.arange(5.0), np.arange(5.0), lambda a: 1 - np.asarray(a))
    except (ImportError, AttributeError, NotImplementedError):
        return False
    return True


needs_claim = pytest.mark.skipif(
    not _claim_available(), reason="dpaudit.stats.claim.claim_test not available yet"
)


def _check_claims(rows, record_property) -> None:
    for r in rows:
        line = (
            f"claim {r['claimed']:>26} on {r['scenario']:>26} ({r['design']}): rejected "
            f"{r['frac_rejected']:.3f}+-{r['frac_rejected_se']:.3f} ({r['reps']} x {r['n_in']})"
        )
        print(line)
        record_property(f"claim/{r['scenario']}/{r['design']}", line)
    bad = [r for r in rows if r["frac_rejected"] > r["nominal"] + 3 * r["nominal_se"]]
    assert not bad, bad


@needs_claim
def test_claim_test_keeps_its_level_default_sizes(record_property):
    rows = claim_study(SCENARIOS, reps=40, n_in=500, n_out=500, confidence=CONF, seed=3)
    _check_claims(rows, record_property)


@needs_claim
def test_claim_test_keeps_its_level_on_unequal_and_small_designs(record_property):
    rows = claim_study(
        DESIGN_SCENARIOS, reps=20, designs=list(DESIGNS), confidence=CONF, seed=4
    )
    _check_claims(rows, record_property)


@needs_claim
@pytest.mark.slow
def test_claim_test_keeps_its_level_on_unequal_and_small_designs_full(record_property):
    rows = claim_study(SCENARIOS, reps=100, designs=list(DESIGNS), confidence=CONF, seed=5)
    _check_claims(rows, record_property)


@needs_claim
def test_claim_test_has_power_against_a_wrong_claim():
    rows = claim_study(
        ["gaussian_mu2"],
        reps=20,
        n_in=2000,
        n_out=2000,
        confidence=CONF,
        seed=3,
        claims={"gaussian_mu2": "gaussian_mu1"},
    )
    assert not rows[0]["correct"] and rows[0]["frac_rejected"] >= 0.9


@needs_claim
@pytest.mark.slow
def test_claim_test_keeps_its_level_full_sizes(record_property):
    rows = claim_study(SCENARIOS, reps=300, n_in=2000, n_out=2000, confidence=CONF, seed=3)
    _check_claims(rows, record_property)
