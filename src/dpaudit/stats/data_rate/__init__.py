"""Data-rate canaries: certified evidence about the user's own epsilon (DESIGN 4.5).

Dirac gradient canaries of norm C on coordinates no data gradient reaches, each member
inserted with probability q per step (the training data's rate), scored by the summed
per-step mixture log-likelihood ratio (``attacks.mixture``): each canary is an independent
experiment whose pair has the accountant's own privacy curve. Modules:

* ``law``: the exact law of the score for a member and a non-member (``mixture_score_law``);
* ``simulate``: exact draws of the scores (``simulate_mixture_scores``);
* ``count_test``: the count test at pre-registered ranks, its exact p-value under any claimed
  ROC bound, the certified epsilon (``certify_epsilon``) and the claim test of a curve
  (``curve_p_value``), valid for any mechanism whose canaries are independent;
* ``design``: choosing the ranks from the claim before the scores are seen;
* ``plan``: every statement of the canaries, fixed from the claim (``plan_data_rate``) and
  evaluated on the scores (``DataRatePlan.evaluate``): ``epsilon_lower`` (certified),
  ``sigma_upper`` (certified) and the accountant's epsilon there (conditional on the
  mechanism being a Poisson-subsampled Gaussian), the claim test at the bounds' confidence
  and at the PRIVACY BUG level;
* ``ceiling``: what such canaries can certify at all: the count ceiling and an upper bound
  for any valid method (``count_ceiling``, ``universal_ceiling``).

Pure numpy / scipy; the accountant's curves and epsilons come in as callables
(``forecast.data_rate_plan`` wires a ``ThreatModel``).
"""

from dpaudit.stats.data_rate.ceiling import (
    CountCeiling,
    capped_pair,
    count_ceiling,
    np_power,
    universal_ceiling,
)
from dpaudit.stats.data_rate.count_test import (
    CertifiedEpsilon,
    Counts,
    RankDesign,
    certify_epsilon,
    certify_epsilon_at,
    count,
    curve_p_value,
    dp_roc,
    null_p_value,
)
from dpaudit.stats.data_rate.design import (
    EpsilonDesign,
    StatisticLaw,
    critical_value,
    design_curve,
    design_epsilon,
    power,
    statistic_law,
)
from dpaudit.stats.data_rate.law import MixtureScoreLaw, mixture_score_law, step_log_lr
from dpaudit.stats.data_rate.plan import (
    CONDITIONAL_ON,
    DataRateEvidence,
    DataRatePlan,
    noise_upper_bound_counts,
    plan_data_rate,
)
from dpaudit.stats.data_rate.simulate import simulate_mixture_scores

__all__ = [
    "CONDITIONAL_ON",
    "CertifiedEpsilon",
    "CountCeiling",
    "Counts",
    "DataRateEvidence",
    "DataRatePlan",
    "EpsilonDesign",
    "MixtureScoreLaw",
    "RankDesign",
    "StatisticLaw",
    "capped_pair",
    "certify_epsilon",
    "certify_epsilon_at",
    "count",
    "count_ceiling",
    "critical_value",
    "curve_p_value",
    "design_curve",
    "design_epsilon",
    "dp_roc",
    "mixture_score_law",
    "noise_upper_bound_counts",
    "np_power",
    "null_p_value",
    "plan_data_rate",
    "power",
    "simulate_mixture_scores",
    "statistic_law",
    "step_log_lr",
    "universal_ceiling",
]
