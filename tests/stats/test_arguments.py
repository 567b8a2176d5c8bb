"""Every public statistics function checks its arguments: a ValueError that names the argument,
for strings, None, booleans, complex numbers, NaN and out-of-range values, before computing.

The table below covers every name in ``dpaudit.stats.__all__`` that takes arguments (a test
checks it is complete) and the claim test's module."""

import math

import numpy as np
import pytest

import dpaudit.stats as st
from dpaudit.stats import claim
from dpaudit.stats.threshold_selection import Bonferroni

S_IN = np.linspace(1.0, 3.0, 40)
S_OUT = np.linspace(0.0, 2.0, 40)


def _curve_ok(a):
    return 1.0 - np.asarray(a, dtype=float)


def _rows():
    return claim.rate_bounds(S_IN, S_OUT, confidence=0.95)


# (callable, good kwargs, argument name, bad values) -- the call with the good kwargs must work
# two examples, two batches of sizes 2 and 2 ({0, 1} twice): counts (2, 2), a 2-bucket sketch
_BY_EXAMPLE = {"counts": [2, 2], "sizes": [2, 2], "signatures": np.ones((2, 2)),
               "bucket_sizes": [1, 1], "bucket_signed": [1.0, 1.0], "q": 0.5, "level": 0.05}

CASES = [
    (st.epsilon_lower_bound, {"scores_in": S_IN, "scores_out": S_OUT, "delta": 1e-5,
                              "method": "clopper_pearson"},
     "delta", ["1e-5", None, True, 1j, math.nan, -1.0, 1.0]),
    (st.epsilon_lower_bound, {"scores_in": S_IN, "scores_out": S_OUT, "delta": 1e-5,
                              "method": "gdp"},
     "confidence", ["0.95", None, True, 0.0, 1.0, math.nan]),
    (st.epsilon_lower_bound, {"scores_in": S_IN, "scores_out": S_OUT, "delta": 1e-5,
                              "method": "one_run"},
     "scores_in", [S_IN + 0j, ["a", "b"], [], [np.nan], None]),
    (st.epsilon_lower_bound, {"scores_in": S_IN, "scores_out": S_OUT, "delta": 1e-5,
                              "method": "clopper_pearson"},
     "selection", ["bonferroni", None, 3]),
    (st.epsilon_lower_bound, {"scores_in": S_IN, "scores_out": S_OUT, "delta": 1e-5,
                              "method": "clopper_pearson"},
     "method", ["cp", None]),
    (claim.claim_test, {"scores_in": S_IN, "scores_out": S_OUT, "tradeoff": _curve_ok},
     "tradeoff", [None, 3.0, lambda a: np.full(np.shape(a), np.nan),
                  lambda a: np.full(np.shape(a), 2.0), lambda a: np.asarray(a),
                  lambda a: 0.5, lambda a: np.asarray(a) + 1j]),
    (claim.claim_test, {"scores_in": S_IN, "scores_out": S_OUT, "tradeoff": _curve_ok},
     "tradeoff_reverse", [lambda a: np.full(np.shape(a), np.nan), "curve"]),
    (claim.claim_test, {"scores_in": S_IN, "scores_out": S_OUT, "tradeoff": _curve_ok},
     "confidence", ["0.95", None, 1.5]),
    (claim.claim_test, {"scores_in": S_IN, "scores_out": S_OUT, "tradeoff": _curve_ok},
     "selection", ["bonferroni", 1]),
    (claim.claim_test, {"scores_in": S_IN, "scores_out": S_OUT, "tradeoff": _curve_ok},
     "scores_out", [S_OUT + 1j, "abc"]),
    (claim.rate_bounds, {"scores_in": S_IN, "scores_out": S_OUT, "confidence": 0.95},
     "confidence", ["0.95", None]),
    (claim.rejects, {"rows": None, "tradeoff": _curve_ok}, "tradeoff",
     [lambda a: np.full(np.shape(a), np.nan), None]),
    (claim.mu_lower_bound, {"rows": None}, "rows", ["rows", None, 3]),
    (claim.noise_upper_bound, {"rows": None, "family": lambda s: _curve_ok,
                               "sigma_start": 1.0},
     "sigma_start", ["1", None, -1.0, math.nan]),
    (claim.noise_upper_bound, {"rows": None, "family": lambda s: _curve_ok,
                               "sigma_start": 1.0},
     "family", [None, 3]),
    (st.cp_upper, {"k": 3, "n": 10, "alpha": 0.05}, "alpha", ["0.05", None, 0.0, 1.0]),
    (st.cp_upper, {"k": 3, "n": 10, "alpha": 0.05}, "k", [-1, 11, "3", np.nan]),
    (st.cp_upper, {"k": 3, "n": 10, "alpha": 0.05}, "n", [0, 2.5, "10"]),
    (st.eps_from_rates, {"fpr": 0.1, "fnr": 0.2, "delta": 1e-5}, "fpr", ["0.1", -0.1, 1.5]),
    (st.eps_from_rates, {"fpr": 0.1, "fnr": 0.2, "delta": 1e-5}, "delta", ["1e-5", None, 1.0]),
    (st.mu_from_rates, {"fpr": 0.1, "fnr": 0.2}, "fnr", ["0.2", math.nan, 2.0]),
    (st.gdp_delta, {"mu": 1.0, "epsilon": 1.0}, "mu", ["1", None, -1.0, 1j]),
    (st.gdp_delta, {"mu": 1.0, "epsilon": 1.0}, "epsilon", ["1", math.nan]),
    (st.gdp_epsilon, {"mu": 1.0, "delta": 1e-5}, "delta", ["1e-5", None, 0.0]),
    (st.gdp_mu, {"epsilon": 1.0, "delta": 1e-5}, "epsilon", ["1", -1.0]),
    (st.gdp_tradeoff, {"alpha": 0.1, "mu": 1.0}, "alpha", ["0.1", 1.5, math.nan]),
    (st.gdp_tradeoff, {"alpha": 0.1, "mu": 1.0}, "mu", ["1", -1.0]),
    (st.gdp_auc, {"mu": 1.0}, "mu", ["1", None, -1.0]),
    (st.gdp_advantage, {"mu": 1.0}, "mu", ["1", None]),
    (st.gdp_compose, {"mus": [1.0, 2.0]}, "mus", [["a"], [-1.0], [math.nan], None, [1j]]),
    (st.auc, {"scores_in": S_IN, "scores_out": S_OUT}, "scores_in", [S_IN + 1j, [], None]),
    (st.roc_curve, {"scores_in": S_IN, "scores_out": S_OUT}, "scores_out", [["x"], []]),
    (st.tpr_at_fpr, {"scores_in": S_IN, "scores_out": S_OUT, "fpr": 0.1}, "fpr",
     ["0.1", 1.5, None]),
    (st.canonne_tau, {"n": 100, "k": 10, "beta": 0.05}, "beta", ["0.05", 0.0, None]),
    (st.canonne_tau, {"n": 100, "k": 10, "beta": 0.05}, "n", [0, 1.5, "100"]),
    (st.canonne_tau, {"n": 100, "k": 10, "beta": 0.05}, "k", [0, 2.5]),
    (st.hockey_stick, {"p": [0.5, 0.5], "q": [0.4, 0.6], "epsilon": 0.1}, "epsilon",
     ["0.1", None, math.nan]),
    (st.hockey_stick, {"p": [0.5, 0.5], "q": [0.4, 0.6], "epsilon": 0.1}, "p",
     [[0.5, 0.6], ["a"], [0.5 + 1j, 0.5]]),
    (st.histogram_privacy_profile, {"scores_in": S_IN, "scores_out": S_OUT,
                                    "epsilons": [0.0, 1.0]},
     "epsilons", [["a"], [math.nan]]),
    (st.histogram_privacy_profile, {"scores_in": S_IN, "scores_out": S_OUT,
                                    "epsilons": [0.0, 1.0]},
     "confidence", ["0.9", 2.0]),
    (st.histograms, {"scores_in": S_IN, "scores_out": S_OUT}, "scores_in", [S_IN + 1j]),
    (st.histogram_pld_profile, {"scores_in": S_IN, "scores_out": S_OUT, "steps": 3,
                                "epsilons": [0.5]},
     "steps", [0, 1.5, "3"]),
    (st.histogram_pld_epsilon, {"scores_in": S_IN, "scores_out": S_OUT, "steps": 3,
                                "delta": 1e-5},
     "delta", ["1e-5", None, 0.0]),
    (st.gaussian_checks, {"s_in": S_IN, "s_out": S_OUT}, "s_in", [S_IN + 1j, [1.0]]),
    (st.one_run_p_value, {"m": 100, "r": 10, "v": 8, "epsilon": 1.0, "delta": 1e-5},
     "epsilon", ["1", None, math.nan, -1.0]),
    (st.one_run_p_value, {"m": 100, "r": 10, "v": 8, "epsilon": 1.0, "delta": 1e-5},
     "delta", ["1e-5", -1.0, 1.5]),
    (st.one_run_p_value, {"m": 100, "r": 10, "v": 8, "epsilon": 1.0, "delta": 1e-5},
     "inclusion", [0.0, "0.5"]),
    (st.one_run_p_value, {"m": 100, "r": 10, "v": 8, "epsilon": 1.0, "delta": 1e-5},
     "m", [1.5, "100", 5]),
    (st.epsilon_from_guesses, {"m": 100, "r": 10, "v": 8, "delta": 1e-5,
                               "significance": 0.05},
     "significance", ["0.05", 0.0, None]),
    (st.epsilon_from_guesses, {"m": 100, "r": 10, "v": 8, "delta": 1e-5,
                               "significance": 0.05},
     "v", [11, -1, 2.5]),
    (st.adaptive_threshold, {"reference_out": S_OUT, "n_top": 3}, "n_top", [0, 2.5, "3"]),
    (st.neyman_pearson_threshold, {"reference_out": S_OUT, "alpha": 0.1}, "alpha",
     ["0.1", None]),
    (st.fixed_threshold, {"value": 1.0}, "value", ["1", None, math.inf]),
    (st.apply_threshold, {"scores": S_IN, "threshold": 1.0}, "threshold", ["1", None]),
    (st.orientation_test, {"scores_in": S_IN, "scores_out": S_OUT}, "p_value", ["0.1", 0.0]),
    (st.check_orientation, {"scores_in": S_IN, "scores_out": S_OUT}, "p_value", [None]),
    (st.FixedThreshold, {"value": 1.0}, "value", ["1", None]),
    (st.Split, {"seed": 0, "fraction": 0.5}, "fraction", ["0.5", 1.0]),
    (st.Split, {"seed": 0, "fraction": 0.5}, "seed", ["0", 1.5, None]),
    (Bonferroni, {"ranks": (0, 3)}, "ranks", [("a",), (-1,), ()]),
    (st.noise_floor_test, {"squared_norms": np.ones((2, 3)) * 10, "dims": [10, 10],
                           "noise_std": 1.0, "level": 0.05},
     "squared_norms", [np.ones(3), -np.ones((2, 3)), "x", np.ones((2, 3)) + 1j]),
    (st.noise_floor_test, {"squared_norms": np.ones((2, 3)) * 10, "dims": [10, 10],
                           "noise_std": 1.0, "level": 0.05},
     "dims", [[10], [0, 10], [1.5, 10]]),
    (st.noise_floor_test, {"squared_norms": np.ones((2, 3)) * 10, "dims": [10, 10],
                           "noise_std": 1.0, "level": 0.05},
     "noise_std", [0.0, "1", [1.0, 2.0], None]),
    (st.noise_floor_test, {"squared_norms": np.ones((2, 3)) * 10, "dims": [10, 10],
                           "noise_std": 1.0, "level": 0.05},
     "level", [0.0, "0.05", None]),
    (st.noise_floor_test, {"squared_norms": np.ones((2, 3)) * 10, "dims": [10, 10],
                           "noise_std": 1.0, "level": 0.05},
     "scale_rounding", [1.0, -0.1, [0.0, 0.0], "x", None]),
    (st.noise_independence_test, {"noise": np.ones((5, 3)), "noise_std": 1.0, "level": 0.05},
     "noise", [np.ones((2, 3)), np.ones((5, 1)), np.ones(5), [["a"]]]),
    (st.noise_independence_test, {"noise": np.ones((5, 3)), "noise_std": 1.0, "level": 0.05},
     "noise_std", [-1.0, "x"]),
    (st.poisson_sampling_test, {"batch_sizes": [3, 4, 5], "n": 50, "q": 0.1, "level": 0.05},
     "batch_sizes", [[3], [-1, 2], [1.5, 2], "ab"]),
    (st.poisson_sampling_test, {"batch_sizes": [3, 4, 5], "n": 50, "q": 0.1, "level": 0.05},
     "n", [0, 2.5, 4, True]),
    (st.poisson_sampling_test, {"batch_sizes": [3, 4, 5], "n": 50, "q": 0.1, "level": 0.05},
     "q", [0.0, "0.1", 1.5]),
    (st.sampling_by_example_test, _BY_EXAMPLE, "counts", [[-1, 2, 2], [0.5, 1, 1], [9, 0, 0]]),
    (st.sampling_by_example_test, _BY_EXAMPLE, "sizes", [[2], [1, 1]]),
    (st.sampling_by_example_test, _BY_EXAMPLE, "signatures", [np.zeros((3, 2)),
                                                              np.zeros(2)]),
    (st.sampling_by_example_test, _BY_EXAMPLE, "bucket_signed", [[1.0]]),
    (st.sampling_by_example_test, _BY_EXAMPLE, "q", [0.0, 1.0]),
]

_ROWS_FUNCS = (claim.rejects, claim.mu_lower_bound, claim.noise_upper_bound)


def _call(func, kwargs):
    if func in _ROWS_FUNCS and kwargs.get("rows", 1) is None:
        kwargs = {**kwargs, "rows": _rows()}
    return func(**kwargs)


@pytest.mark.parametrize(
    ("func", "good", "name", "bad"),
    [(f, g, n, b) for f, g, n, bads in CASES for b in bads],
    ids=[f"{f.__name__}-{n}-{i}" for f, g, n, bads in CASES for i in range(len(bads))],
)
def test_bad_argument_raises_value_error_naming_it(func, good, name, bad):
    _call(func, dict(good))  # the good call works
    kwargs = dict(good)
    kwargs[name] = bad
    if func in _ROWS_FUNCS and name == "rows":
        with pytest.raises(ValueError, match=name):
            func(**kwargs)
        return
    with pytest.raises(ValueError, match=name):
        _call(func, kwargs)


def test_every_public_function_is_covered():
    funcs = [f for f, *_ in CASES]
    covered = {name for name in st.__all__ if any(getattr(st, name) is f for f in funcs)}
    no_args = {"METHODS", "METHOD_REGISTRY", "DEFAULT_SELECTION", "EpsilonBound",
               "GaussianAssumptionWarning", "OrientationWarning", "MethodSpec", "RateBounds",
               "ThresholdStrategy", "Naive", "Bonferroni", "CheckResult"}
    missing = sorted(set(st.__all__) - covered - no_args)
    assert not missing, f"public stats functions without an argument check case: {missing}"
