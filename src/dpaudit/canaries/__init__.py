"""Canary candidates and their Mahalanobis ranking (seed 001 Algorithm 3, seed 000 Algorithm 6).

Candidates (in-distribution, mislabeled, blank and crafted inputs; Dirac and random-direction
gradient canaries of norm C) are scored by ||g - mu_0||^2_P at theta_0 with any
``dpaudit.covariance`` estimator, then selected (top-K, easy / medium / hard, stratified,
capped in-distribution). The predicted DP-SGD leakage of each choice lives here too (the
seed 001 Figure 3 experiment that uses all this is ``dpaudit.tasks.figure3``; the figures of
canary choice are ``dpaudit.report.canary_plots``).
"""

from dpaudit.canaries.leakage import PredictedLeakage, predicted_leakage
from dpaudit.canaries.ranking import (
    STRATEGIES,
    Ranking,
    Selection,
    mahalanobis_scores,
    rank_candidates,
    select_canaries,
)
from dpaudit.canaries.sources import (
    INPUT_SOURCES,
    CandidateSource,
    InputCandidates,
    blank_inputs,
    crafted_distinct_inputs,
    crafted_inputs,
    dirac_canaries,
    in_distribution,
    mislabeled,
    random_direction_canaries,
    scale_to_norm,
)
from dpaudit.canaries.trajectory import TrajectoryRanking, rank_along_trajectory

__all__ = [
    "INPUT_SOURCES",
    "STRATEGIES",
    "CandidateSource",
    "InputCandidates",
    "PredictedLeakage",
    "Ranking",
    "Selection",
    "TrajectoryRanking",
    "blank_inputs",
    "crafted_distinct_inputs",
    "crafted_inputs",
    "dirac_canaries",
    "in_distribution",
    "mahalanobis_scores",
    "mislabeled",
    "predicted_leakage",
    "random_direction_canaries",
    "rank_along_trajectory",
    "rank_candidates",
    "scale_to_norm",
    "select_canaries",
]
