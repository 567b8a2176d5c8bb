"""epsilon_lower_bound: estimator quality on exactly mu-GDP scores, coverage, perfect
separation, JSON output and bad input."""

import json

import numpy as np
import pytest
from scipy import stats

from dpaudit.stats import EpsilonBound, cp_upper, epsilon_lower_bound, gdp_epsilon
from dpaudit.stats.bounds import METHODS

DELTA = 1e-6


def _gdp_scores(mu, n, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n)


# Measured fractions of the true epsilon at 10,000 + 10,000 scores, delta = 1e-6, 95% (seed 7):
# gdp ~0.92-0.95; clopper_pearson ~0.25-0.39; one_run ~0.22-0.41; density ~0.09-0.15;
# density_tv ~0.56-0.70. Lower limits sit below those with margin, but far above 0.
QUALITY_FLOOR = {
    "gdp": 0.85,
    "clopper_pearson": 0.2,
    "one_run": 0.15,
    "density": 0.05,
    "density_tv": 0.4,
}


@pytest.mark.parametrize("mu", [1.0, 2.0, 4.0])
def test_estimator_quality_on_exact_gdp_scores(mu):
    s_in, s_out = _gdp_scores(mu, 10_000, seed=7)
    truth = gdp_epsilon(mu, DELTA)
    for method, floor in QUALITY_FLOOR.items():
        res = epsilon_lower_bound(s_in, s_out, delta=DELTA, confidence=0.95, method=method)
        assert res.epsilon <= truth, (method, res.epsilon, truth)
        assert res.epsilon >= floor * truth, (method, res.epsilon / truth)


def test_cp_upper_exact_coverage():
    # Exact (no Monte Carlo): P_k~Bin(n,p)[cp_upper(k) >= p] >= 1 - alpha for every p.
    n, alpha = 60, 0.05
    k = np.arange(n + 1)
    ub = cp_upper(k, n, alpha)
    worst = 1.0
    for p in np.linspace(0.001, 0.999, 400):
        worst = min(worst, float(np.sum(stats.binom.pmf(k, n, p)[ub >= p])))
    assert worst >= 1 - alpha - 1e-12
    assert worst <= 1 - alpha + 0.02  # and not trivially conservative
    assert cp_upper(n, n, alpha) == 1.0
    assert cp_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n))


@pytest.mark.slow
def test_coverage_over_repetitions():
    """300 reps of 200 + 200 mu-GDP scores: fraction above the truth <= 5% + 3 MC s.e."""
    mu, delta, reps, conf = 1.0, 1e-3, 300, 0.95
    truth = gdp_epsilon(mu, delta)
    limit = (1 - conf) + 3 * np.sqrt(conf * (1 - conf) / reps)
    rng = np.random.default_rng(2024)
    above = {m: 0 for m in METHODS}
    means = {m: 0.0 for m in METHODS}
    for _ in range(reps):
        s_in, s_out = rng.normal(mu, 1, 200), rng.normal(0, 1, 200)
        # one_run needs independent fair-coin membership of m = 400 canaries
        inc = rng.random(400) < 0.5
        sc = np.where(inc, rng.normal(mu, 1, 400), rng.normal(0, 1, 400))
        for m in METHODS:
            a, b = (sc[inc], sc[~inc]) if m == "one_run" else (s_in, s_out)
            e = epsilon_lower_bound(a, b, delta=delta, confidence=conf, method=m).epsilon
            above[m] += e > truth
            means[m] += e / reps
    for m in METHODS:
        assert above[m] / reps <= limit, (m, above[m] / reps)
    # The bounds are not vacuous at this sample size (measured means: gdp ~1.3, cp ~0.6).
    assert means["gdp"] > 0.25 * truth and means["clopper_pearson"] > 0.1 * truth


def test_split_and_naive_selection():
    s_in, s_out = _gdp_scores(2.0, 2000, seed=3)
    truth = gdp_epsilon(2.0, DELTA)
    split = epsilon_lower_bound(
        s_in, s_out, delta=DELTA, method="gdp", threshold_selection="split", seed=5
    )
    again = epsilon_lower_bound(
        s_in, s_out, delta=DELTA, method="gdp", threshold_selection="split", seed=5
    )
    assert split == again and 0.5 * truth < split.epsilon <= truth  # seeded, reproducible
    assert split.details["n_eval_in"] == 1000
    naive = epsilon_lower_bound(
        s_in, s_out, delta=DELTA, method="clopper_pearson", threshold_selection="naive"
    )
    assert naive.valid is False and split.valid is True


def test_perfect_separation_gives_sample_size_limit():
    n, delta, conf = 50, 1e-5, 0.95
    s_in, s_out = np.full(n, 10.0), np.zeros(n)
    cp = epsilon_lower_bound(s_in, s_out, delta=delta, confidence=conf, method="clopper_pearson")
    level = (1 - conf) / (2 * cp.details["n_thresholds"])
    u = 1 - level ** (1 / n)  # CP upper bound for 0 errors out of n
    assert cp.fpr_upper == pytest.approx(u) and cp.fnr_upper == pytest.approx(u)
    assert cp.epsilon == pytest.approx(np.log((1 - delta - u) / u))
    g = epsilon_lower_bound(s_in, s_out, delta=delta, confidence=conf, method="gdp")
    assert g.mu_lower == pytest.approx(2 * stats.norm.ppf(1 - u))
    assert g.epsilon == pytest.approx(gdp_epsilon(g.mu_lower, delta))
    for method in ("one_run", "density", "density_tv"):
        e = epsilon_lower_bound(s_in, s_out, delta=delta, confidence=conf, method=method).epsilon
        assert 0 < e < np.inf, method


def test_to_dict_is_strict_json():
    s_in, s_out = _gdp_scores(1.0, 300, seed=0)
    for m in METHODS:
        res = epsilon_lower_bound(s_in, s_out, delta=1e-5, method=m)
        assert isinstance(res, EpsilonBound)
        d = json.loads(json.dumps(res.to_dict(), allow_nan=False))
        assert d["method"] == m and d["epsilon"] == res.epsilon and d["delta"] == 1e-5


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"scores_in": []}, "scores_in"),
        ({"scores_out": [0.0, np.nan]}, "scores_out"),
        ({"scores_in": [np.inf, 1.0]}, "scores_in"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": -0.1}, "delta"),
        ({"confidence": 1.0}, "confidence"),
        ({"confidence": 0.0}, "confidence"),
        ({"method": "bayes"}, "method"),
        ({"method": "one_run", "threshold_selection": "split"}, "threshold_selection"),
        ({"method": "gdp", "bin_rule": "eq4.2"}, "bin_rule"),
        ({"method": "gdp", "seed": 1}, "seed"),
        ({"method": "gdp", "threshold_selection": "split", "n_candidates": 5}, "n_candidates"),
        ({"method": "gdp", "threshold_selection": "best"}, "threshold_selection"),
        ({"method": "clopper_pearson", "n_candidates": 1}, "n_candidates"),
        ({"method": "one_run", "grid": [1.5]}, "grid"),
        ({"method": "density", "bin_rule": "sturges"}, "bin_rule"),
        ({"method": "density", "n_bins": 1}, "n_bins"),
        ({"method": "density_tv", "end_quantiles": (0.9, 0.1)}, "end_quantiles"),
        ({"method": "density", "edges": [1.0, 0.0]}, "edges"),
    ],
)
def test_bad_input(kwargs, name):
    args = {"scores_in": [1.0, 2.0, 3.0], "scores_out": [0.0, 1.0], "delta": 1e-5}
    args.update({"method": "clopper_pearson"})
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        epsilon_lower_bound(args.pop("scores_in"), args.pop("scores_out"), **args)
