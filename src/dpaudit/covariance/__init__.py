"""Mean / covariance / precision estimators shared by canaries and attacks (DESIGN 4.3, 4.4).

From clipped reference gradients G (n_r x d, on the model's device) build the mean mu_0 and a
precision operator P with batched ``apply`` and ``mahalanobis``: dense (small d), diagonal,
Ledoit-Wolf / OAS shrinkage and low-rank + ridge (both applied through the Woodbury identity,
never d x d), and the noise-aware shift C + (sigma^2 C_clip^2 / b) I of DP-SGD.
"""

from dpaudit.covariance.estimators import (
    ESTIMATORS,
    dense_precision,
    diagonal_precision,
    estimate_precision,
    ledoit_wolf_intensity,
    noise_aware,
    noise_ridge,
    oas_intensity,
    reference_mean,
    shrinkage_precision,
    woodbury_precision,
)
from dpaudit.covariance.operators import (
    DENSE_MAX_DIM,
    DensePrecision,
    DiagonalPrecision,
    LowRankPrecision,
    PrecisionOperator,
    gram64,
)

__all__ = [
    "DENSE_MAX_DIM",
    "ESTIMATORS",
    "DensePrecision",
    "DiagonalPrecision",
    "LowRankPrecision",
    "PrecisionOperator",
    "dense_precision",
    "diagonal_precision",
    "estimate_precision",
    "gram64",
    "ledoit_wolf_intensity",
    "noise_aware",
    "noise_ridge",
    "oas_intensity",
    "reference_mean",
    "shrinkage_precision",
    "woodbury_precision",
]
