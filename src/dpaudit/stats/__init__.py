"""Attack outcomes to numbers: ROC, AUC, TPR at FPR, epsilon lower bounds, GDP algebra."""

from dpaudit.stats.bounds import METHOD_REGISTRY, METHODS, MethodSpec, epsilon_lower_bound
from dpaudit.stats.clopper_pearson import cp_upper, eps_from_rates, mu_from_rates
from dpaudit.stats.density import canonne_tau, histogram_privacy_profile, hockey_stick
from dpaudit.stats.gaussian_fit import GaussianAssumptionWarning, gaussian_checks
from dpaudit.stats.gdp import (
    gdp_advantage,
    gdp_auc,
    gdp_compose,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    gdp_tradeoff,
)
from dpaudit.stats.histogram import histograms
from dpaudit.stats.noise import CheckResult, noise_floor_test, noise_independence_test
from dpaudit.stats.one_run.steinke import epsilon_from_guesses
from dpaudit.stats.one_run.steinke import p_value as one_run_p_value
from dpaudit.stats.pld import histogram_pld_epsilon, histogram_pld_profile
from dpaudit.stats.result import EpsilonBound
from dpaudit.stats.roc import auc, roc_curve, tpr_at_fpr
from dpaudit.stats.sampling import poisson_sampling_test, sampling_by_example_test
from dpaudit.stats.threshold_selection import (
    DEFAULT_SELECTION,
    Bonferroni,
    FixedThreshold,
    Naive,
    RateBounds,
    Split,
    ThresholdStrategy,
)
from dpaudit.stats.thresholds import (
    OrientationWarning,
    adaptive_threshold,
    apply_threshold,
    check_orientation,
    fixed_threshold,
    neyman_pearson_threshold,
    orientation_test,
)

__all__ = [
    "DEFAULT_SELECTION",
    "METHODS",
    "METHOD_REGISTRY",
    "Bonferroni",
    "CheckResult",
    "EpsilonBound",
    "FixedThreshold",
    "GaussianAssumptionWarning",
    "MethodSpec",
    "Naive",
    "OrientationWarning",
    "RateBounds",
    "Split",
    "ThresholdStrategy",
    "adaptive_threshold",
    "apply_threshold",
    "auc",
    "canonne_tau",
    "check_orientation",
    "cp_upper",
    "eps_from_rates",
    "epsilon_from_guesses",
    "epsilon_lower_bound",
    "fixed_threshold",
    "gaussian_checks",
    "gdp_advantage",
    "gdp_auc",
    "gdp_compose",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "gdp_tradeoff",
    "histogram_pld_epsilon",
    "histogram_pld_profile",
    "histogram_privacy_profile",
    "histograms",
    "hockey_stick",
    "mu_from_rates",
    "neyman_pearson_threshold",
    "noise_floor_test",
    "noise_independence_test",
    "one_run_p_value",
    "orientation_test",
    "poisson_sampling_test",
    "roc_curve",
    "sampling_by_example_test",
    "tpr_at_fpr",
]
