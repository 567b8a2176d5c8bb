"""``RegimeMixture`` is exactly mu-GDP per canary, yet its canaries' guesses are correlated.

(a) one canary's score, pooled over many runs, has mu-GDP's law N(+-mu/2, 1) given its bit;
(b) the pair "regime revealed, then y", built from the mechanism's own pieces (the level's
restricted law, randomized response at mu t), has mu-GDP's ROC and privacy profile exactly
(numerical integration of its Neyman-Pearson tests), while the loud regime alone is louder;
(c) in loud runs the top-scored guesses are right far more often than with independent
mu-GDP canaries. Fixed seeds throughout.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats
from scipy.optimize import brentq
from scipy.special import expit, ndtr

from dpaudit.stats.gdp import gdp_delta, gdp_epsilon
from dpaudit.validity.interacting import (
    RegimeMixture,
    folded_isf,
    folded_survival,
    gdp_roc,
)

MU = 1.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"mu": 0.0, "a": 0.1}, "mu"), ({"mu": -1.0, "a": 0.1}, "mu"),
     ({"mu": float("nan"), "a": 0.1}, "mu"), ({"mu": 1.0, "a": 0.0}, "a"),
     ({"mu": 1.0, "a": 1.0}, "a"), ({"mu": 1.0, "a": 1.5}, "a"), ({"mu": 1.0, "a": "x"}, "a")],
)
def test_rejects_bad_parameters(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        RegimeMixture(**kwargs)


def test_repr_and_threshold():
    mech = RegimeMixture(1, 0.1)
    assert repr(mech) == "RegimeMixture(mu=1, a=0.1)"
    assert folded_survival(mech.threshold, 1.0) == pytest.approx(0.1, rel=1e-12)
    assert mech.band(True) == (mech.threshold, np.inf)
    assert mech.band(False) == (0.0, mech.threshold)


@pytest.mark.parametrize("mu", [0.01, 0.5, 1.0, 4.0, 20.0])
def test_folded_isf_inverts_the_survival_function(mu):
    v = np.concatenate([10.0 ** -np.arange(1.0, 250.0, 7.0), np.linspace(1e-6, 1.0, 500)])
    t = folded_isf(v, mu)
    assert np.all(t >= 0)
    np.testing.assert_allclose(folded_survival(t, mu), v, rtol=1e-10)
    assert folded_isf(1.0, mu) < 1e-12
    assert folded_isf(0.5, mu) == pytest.approx(float(folded_isf(np.array([0.5]), mu)[0]))


@pytest.mark.parametrize("loud", [True, False])
def test_levels_follow_the_restricted_folded_normal_law(loud):
    mech = RegimeMixture(MU, 0.1)
    t = mech.levels(20_000, loud, np.random.default_rng(1))
    lo, hi = mech.band(loud)
    assert np.all((t >= lo) & (t < hi))
    mass = folded_survival(lo, MU) - folded_survival(hi, MU)

    def cdf(x):
        return (folded_survival(lo, MU) - folded_survival(np.clip(x, lo, hi), MU)) / mass

    assert stats.kstest(t, cdf).pvalue > 0.01


def test_a_canarys_score_has_gdp_law_given_its_bit():
    """(a) Per-run fractions of member (non-member) scores below x, averaged over 2,500 runs
    of 40 canaries, against Phi(x -+ mu/2): within 4.5 standard errors of the run-to-run
    spread (runs are independent; canaries within a run are not). And a KS test on one
    canary per run (independent across runs)."""
    mech = RegimeMixture(MU, 0.1)
    xs = np.linspace(-2.5, 2.5, 11)
    runs, loud = [], 0
    first = {True: [], False: []}
    for r in range(2500):
        rng = np.random.default_rng([5, r])
        scores, members = mech.draw(40, rng)
        loud += bool(np.abs(scores).min() >= mech.threshold)
        below = scores[:, None] <= xs
        runs.append([below[members].mean(0), below[~members].mean(0)])
        first[bool(members[0])].append(scores[0])
    runs = np.array(runs)  # (runs, in/out, x)
    mean, se = runs.mean(0), runs.std(0, ddof=1) / np.sqrt(len(runs))
    want = np.array([ndtr(xs - MU / 2), ndtr(xs + MU / 2)])
    assert np.all(np.abs(mean - want) <= 4.5 * se + 1e-9)
    assert np.abs(mean - want).max() < 0.01
    assert stats.kstest(first[True], stats.norm(MU / 2).cdf).pvalue > 0.01
    assert stats.kstest(first[False], stats.norm(-MU / 2).cdf).pvalue > 0.01
    assert abs(loud / 2500 - 0.1) < 4 * np.sqrt(0.09 / 2500)  # the shared coin's rate


def _pair_densities(mech):
    """One canary's output (regime R, score y) under bit b, from the mechanism's pieces:
    P[R] x (the level's law restricted to R's band, normalised) x P[sign | t, b], sign = b
    with probability expit(mu t). No shortcut through phi(y -+ mu/2). Vectorised in y."""
    mu = mech.mu

    def folded_pdf(t):
        return stats.norm.pdf(t - mu / 2) + stats.norm.pdf(t + mu / 2)

    parts = []
    for loud in (True, False):
        lo, hi = mech.band(loud)
        p_regime = mech.a if loud else 1 - mech.a
        mass = folded_survival(lo, mu) - folded_survival(hi, mu)

        def dens(y, b, lo=lo, hi=hi, p_regime=p_regime, mass=mass):
            t = np.abs(y)
            agree = (y > 0) == (b == 1)
            sign = np.where(agree, expit(mu * t), expit(-mu * t))
            return np.where((t >= lo) & (t < hi), p_regime * folded_pdf(t) / mass * sign, 0.0)

        parts.append((dens, [(-hi, -lo), (lo, hi)]))
    return parts


_U, _W = np.polynomial.legendre.leggauss(120)


def _integral(f, x0, x1):
    """Gauss-Legendre (120 nodes) on [x0, x1], where f is smooth (no band edge inside)."""
    y = (x0 + x1) / 2 + (x1 - x0) / 2 * _U
    return float((x1 - x0) / 2 * (_W * f(y)).sum())


def _np_test(parts, lam, *, only=None):
    """(FPR, TPR) of the Neyman-Pearson test "p1 > lam p0" on the (regime, y) pair, by
    locating where the numerically computed likelihood ratio crosses lam (grid + brentq)
    and integrating both densities there (Gauss-Legendre between the crossings and band
    edges, |y| <= 12). ``only``: one regime's part."""
    alpha = beta = 0.0
    for i, (dens, pieces) in enumerate(parts):
        if only is not None and i != only:
            continue

        def h(y, dens=dens):
            return np.log(dens(y, 1)) - np.log(dens(y, 0)) - np.log(lam)

        for a, b in pieces:
            a, b = max(a, -12.0), min(b, 12.0)
            if a >= b:
                continue
            grid = np.linspace(a, b, 401)[1:-1]
            hv = h(grid)
            cuts = [a] + [brentq(h, grid[j], grid[j + 1], xtol=1e-15)
                          for j in np.flatnonzero(hv[:-1] * hv[1:] < 0)] + [b]
            for x0, x1 in itertools.pairwise(cuts):
                if h((x0 + x1) / 2) > 0:
                    alpha += _integral(lambda y, d=dens: d(y, 0), x0, x1)
                    beta += _integral(lambda y, d=dens: d(y, 1), x0, x1)
    return alpha, beta


def test_revealed_regime_pair_is_exactly_gdp():
    """(b) The (regime, y) pair's ROC equals Phi(Phi^-1(alpha) + mu) to 1e-9 on a grid of
    alpha (its likelihood ratio is e^(mu y), as without the regime), its privacy profile is
    mu-GDP's, and the loud regime alone is louder than mu-GDP (why canaries interact)."""
    mech = RegimeMixture(MU, 0.1)
    parts = _pair_densities(mech)
    total = [sum(_integral(lambda y, d=dens, b=bit: d(y, b), max(lo, -12.0), min(hi, 12.0))
                 for lo, hi in pieces if max(lo, -12.0) < min(hi, 12.0))
             for dens, pieces in parts for bit in (0, 1)]
    np.testing.assert_allclose(total, [0.1, 0.1, 0.9, 0.9], atol=1e-12)
    alphas = []
    for c in np.linspace(-2.5, 3.5, 13):  # thresholds on the likelihood ratio e^(mu c)
        alpha, beta = _np_test(parts, np.exp(MU * c))
        alphas.append(alpha)
        assert beta == pytest.approx(float(gdp_roc(alpha, MU)), abs=1e-9)
    assert min(alphas) < 1e-3 and max(alphas) > 0.95
    for eps in (0.0, 0.5, 1.0, 2.0):
        alpha, beta = _np_test(parts, np.exp(eps))
        assert beta - np.exp(eps) * alpha == pytest.approx(gdp_delta(MU, eps), abs=1e-7)
    # Given the loud regime only: (alpha/a, beta/a) lies above mu-GDP's ROC near the origin.
    alpha, beta = _np_test(parts, np.exp(MU * 2.5), only=0)
    assert beta / 0.1 > float(gdp_roc(alpha / 0.1, MU)) + 0.05


def _top_k_correct(draw, m, k, runs, seed):
    out = np.empty(runs)
    for r in range(runs):
        scores, members = draw(m, np.random.default_rng([seed, r]))
        out[r] = members[np.argsort(-scores)[:k]].sum()
    return out


def test_loud_runs_guess_better_than_independent_canaries():
    """(c) Top-100 of 1,000 canaries, mu = 1, 200 runs each: the loud regime of
    ``RegimeMixture(1, 0.1)`` gets about 95 right, independent mu-GDP canaries about 87; the
    means are more than 20 standard errors apart, and the median loud run is past the
    independent runs' 95% quantile (a test calibrated on independent canaries rejects most
    loud runs); the quiet regime gets fewer right than independent canaries."""
    mech = RegimeMixture(MU, 0.1)
    loud = _top_k_correct(lambda m, rng: mech.draw_regime(m, rng, True), 1000, 100, 200, 2)
    quiet = _top_k_correct(lambda m, rng: mech.draw_regime(m, rng, False), 1000, 100, 200, 4)

    def independent(m, rng):
        members = rng.random(m) < 0.5
        return rng.standard_normal(m) + np.where(members, MU / 2, -MU / 2), members

    indep = _top_k_correct(independent, 1000, 100, 200, 3)
    se = np.sqrt(loud.var(ddof=1) / 200 + indep.var(ddof=1) / 200)
    assert loud.mean() - indep.mean() > 20 * se
    assert np.median(loud) > np.quantile(indep, 0.95)
    assert quiet.mean() < indep.mean() - 10 * se


def test_true_epsilon_is_gdps():
    assert RegimeMixture(1.0, 0.3).true_epsilon(1e-5) == gdp_epsilon(1.0, 1e-5)
