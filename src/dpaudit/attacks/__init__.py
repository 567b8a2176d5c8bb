"""Membership scores computed from the white-box view of DP-SGD (DESIGN 4.3).

Every score is a ``StepScore``: the capture hook calls it at each optimizer step, and
``score_trace`` replays recorded per-step data through the same object offline.
"""

from dpaudit.attacks.base import StepContext, StepScore
from dpaudit.attacks.batch_size import BatchSizeScore
from dpaudit.attacks.covariance import CovarianceScore, PerStepCovarianceScore, covariance_llr
from dpaudit.attacks.glir import GLiRScore, ncx2_logcdf
from dpaudit.attacks.mixture import MixtureLR, mixture_log_lr
from dpaudit.attacks.replay import aggregate_steps, score_trace
from dpaudit.attacks.scalar import ScalarProduct

__all__ = [
    "BatchSizeScore",
    "CovarianceScore",
    "GLiRScore",
    "MixtureLR",
    "PerStepCovarianceScore",
    "ScalarProduct",
    "StepContext",
    "StepScore",
    "aggregate_steps",
    "covariance_llr",
    "mixture_log_lr",
    "ncx2_logcdf",
    "score_trace",
]
