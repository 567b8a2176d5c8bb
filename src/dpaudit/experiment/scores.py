"""Attack scores for an audit, built from ``attack.scores`` names (DESIGN 4.3).

``SCORES`` maps each name ``attack.scores`` accepts to a builder; a new attack is its
``StepScore`` in ``dpaudit.attacks`` plus one line here (the settings read the names from it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dpaudit.attacks import (
    BatchSizeScore,
    CovarianceScore,
    GLiRScore,
    MixtureLR,
    ScalarProduct,
    StepScore,
)
from dpaudit.covariance import PrecisionOperator, estimate_precision, noise_aware
from dpaudit.experiment.canary_setup import LOSS, CanarySetup
from dpaudit.experiment.settings import AuditSettings
from dpaudit.gradients import per_sample_clipped_grads
from dpaudit.threat_model import ThreatModel


@dataclass
class ScoreContext:
    """What a score builder may use: the settings, the model at theta_0, the canary setup,
    Opacus' expected batch size and the run's threat model."""

    settings: AuditSettings
    model: nn.Module
    setup: CanarySetup
    expected_batch_size: float
    threat: ThreatModel

    @functools.cached_property
    def precision(self) -> PrecisionOperator:
        """Noise-aware precision, estimated once for all scores that need it: the
        ``attack.estimator`` of the clipped reference gradients at theta_0 plus
        (sigma^2 C^2 / b) I, what the released mean's covariance is. ``woodbury`` takes that
        ridge directly (it needs one) and its optional ``attack.explained_variance``
        truncation; what it kept is recorded in the canary info (``precision``)."""
        a, dp, setup = self.settings.attack, self.settings.dp, self.setup
        x, y = setup.references
        k = min(a.n_references, len(x))
        grads = per_sample_clipped_grads(
            self.model, x[:k], y[:k], LOSS, dp.max_grad_norm, param_names=setup.param_names
        )
        if setup.coordinates is not None:  # the hook's coordinate view
            grads = grads[:, torch.as_tensor(setup.coordinates, device=grads.device)]
        if a.estimator == "woodbury":  # the noise's ridge regularises the low-rank estimate
            noise = dp.noise_multiplier**2 * dp.max_grad_norm**2 / self.expected_batch_size
            op = estimate_precision(
                grads, "woodbury", ridge=noise, explained_variance=a.explained_variance
            )
            self.setup.info["precision"] = op.summary()
            return op
        base = estimate_precision(grads, a.estimator)
        return noise_aware(base, dp.noise_multiplier, dp.max_grad_norm, self.expected_batch_size)


def _mixture_lr(ctx: ScoreContext) -> StepScore:
    """Mixture likelihood ratio at the canaries' per-step sample rate (the threat model's)."""
    if ctx.settings.canary.kind != "gradient":
        raise ValueError("attack.scores: 'mixture_lr' needs canary.kind='gradient'")
    return MixtureLR(inclusion_prob=ctx.threat.sample_rate)


SCORES: dict[str, Callable[[ScoreContext], StepScore]] = {
    "scalar": lambda ctx: ScalarProduct(),
    "covariance": lambda ctx: CovarianceScore(ctx.precision),
    "mixture_lr": _mixture_lr,
    "glir": lambda ctx: GLiRScore(ctx.precision),
    "batch_size": lambda ctx: BatchSizeScore(),
}


def build_scores(
    settings: AuditSettings,
    model,
    setup: CanarySetup,
    expected_batch_size: float,
    threat: ThreatModel,
) -> list[StepScore]:
    """One ``StepScore`` per requested attack (``SCORES``), in the order requested;
    covariance-type scores share one precision estimated from references at theta_0."""
    ctx = ScoreContext(settings, model, setup, expected_batch_size, threat)
    return [SCORES[name](ctx) for name in settings.attack_scores()]
