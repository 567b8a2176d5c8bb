"""Synthetic membership games on the empirical mean (seeds 000/001) and min-norm regression
(seed 004), with the closed-form theory they are checked against (DESIGN 4.2, 4.7)."""

from dpaudit.meanlab.distributions import (
    ProductDistribution,
    as_target,
    bernoulli_from_p,
    bernoulli_product,
    easy_target,
    gaussian_product,
    hard_target,
    make_target,
    medium_target,
    product_distribution,
)
from dpaudit.meanlab.games import (
    GameResult,
    average_target_game,
    fixed_target_game,
    membership_bits,
    oracle_score,
)
from dpaudit.meanlab.mechanisms import (
    ExactMean,
    NoisyMean,
    PoissonSubsampledMean,
    SubsampledMean,
)

__all__ = [
    "ExactMean",
    "GameResult",
    "NoisyMean",
    "PoissonSubsampledMean",
    "ProductDistribution",
    "SubsampledMean",
    "as_target",
    "average_target_game",
    "bernoulli_from_p",
    "bernoulli_product",
    "easy_target",
    "fixed_target_game",
    "gaussian_product",
    "hard_target",
    "make_target",
    "medium_target",
    "membership_bits",
    "oracle_score",
    "product_distribution",
]
