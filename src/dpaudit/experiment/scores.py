"""Attack scores for an audit, built from ``attack.scores`` names (DESIGN 4.3)."""

from __future__ import annotations

import torch

from dpaudit.attacks import (
    BatchSizeScore,
    CovarianceScore,
    GLiRScore,
    MixtureLR,
    ScalarProduct,
    StepScore,
)
from dpaudit.capture import per_sample_clipped_grads
from dpaudit.covariance import estimate_precision, noise_aware
from dpaudit.experiment.canary_setup import LOSS, CanarySetup
from dpaudit.experiment.settings import AuditSettings


def build_scores(
    settings: AuditSettings, model, setup: CanarySetup, expected_batch_size: float
) -> list[StepScore]:
    """One ``StepScore`` per requested attack; covariance-type scores use references at theta_0.

    Covariance and GLiR use a noise-aware precision: the ``attack.estimator`` of the clipped
    reference gradients plus (sigma^2 C^2 / b) I, what the released mean's covariance is.
    """
    a, dp = settings.attack, settings.dp
    precision = None
    if {"covariance", "glir"} & set(a.scores):
        x, y = setup.references
        k = min(a.n_references, len(x))
        grads = per_sample_clipped_grads(
            model, x[:k], y[:k], LOSS, dp.max_grad_norm, param_names=setup.param_names
        )
        if setup.coordinates is not None:  # the hook's coordinate view
            grads = grads[:, torch.as_tensor(setup.coordinates, device=grads.device)]
        base = estimate_precision(grads, a.estimator)
        precision = noise_aware(base, dp.noise_multiplier, dp.max_grad_norm, expected_batch_size)
    out: list[StepScore] = []
    for name in a.scores:
        if name == "scalar":
            out.append(ScalarProduct())
        elif name == "covariance":
            out.append(CovarianceScore(precision))
        elif name == "glir":
            out.append(GLiRScore(precision))
        elif name == "mixture_lr":
            if settings.canary.kind != "gradient":
                raise ValueError("attack.scores: 'mixture_lr' needs canary.kind='gradient'")
            q_c = setup.inclusion_prob if setup.inclusion_prob is not None else 1.0
            out.append(MixtureLR(inclusion_prob=q_c))
        elif name == "batch_size":
            out.append(BatchSizeScore())
    return out
