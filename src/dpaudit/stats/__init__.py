"""Attack outcomes to numbers: ROC, AUC, TPR at FPR, epsilon lower bounds, GDP algebra."""

from dpaudit.stats.gdp import (
    gdp_advantage,
    gdp_auc,
    gdp_compose,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    gdp_tradeoff,
)

__all__ = [
    "gdp_advantage",
    "gdp_auc",
    "gdp_compose",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "gdp_tradeoff",
]
