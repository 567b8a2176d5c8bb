"""A validity suite with exactly known truth.

Score-generating mechanisms whose true privacy (epsilon at every delta, trade-off curve) is
known in closed form or to a stated accuracy (``scenarios``), and repeated-audit studies
that measure how often each epsilon lower bound, or the claim test, goes past that truth
(``study``). Certified bounds must stay below the truth except with probability
1 - confidence on every scenario; estimates are shown for what they are.
"""

from dpaudit.validity.scenarios import (
    CURVE_MARGIN,
    SCENARIOS,
    BinomialScores,
    ComposedSubsampledGaussian,
    DiscreteScores,
    GaussianShift,
    LaplaceShift,
    LogisticShift,
    NoSignal,
    PoissonCounts,
    Scenario,
    StudentTShift,
    SubsampledGaussian,
    randomized_response,
)
from dpaudit.validity.study import DESIGNS, Design, claim_study, draw, draw_rng, validity_study

__all__ = [
    "CURVE_MARGIN",
    "DESIGNS",
    "SCENARIOS",
    "BinomialScores",
    "ComposedSubsampledGaussian",
    "Design",
    "DiscreteScores",
    "GaussianShift",
    "LaplaceShift",
    "LogisticShift",
    "NoSignal",
    "PoissonCounts",
    "Scenario",
    "StudentTShift",
    "SubsampledGaussian",
    "claim_study",
    "draw",
    "draw_rng",
    "randomized_response",
    "validity_study",
]
