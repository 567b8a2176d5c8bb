"""The audit's threat model, derived from its settings in one place (``ThreatModel``).

Which sample rate the canaries realise (every step: 1; Bernoulli gradient canaries: q_c,
default the data's q; input canaries: the data's q), their norm relative to C, and whether
each canary's (score, membership) is an independent draw of the one-canary experiment, which
the threshold-based certified methods and the claim test need.
"""

from __future__ import annotations

from dpaudit.experiment.settings import AuditSettings
from dpaudit.threat_model import ThreatModel


def canary_sample_rate(settings: AuditSettings, sample_rate: float) -> float:
    """Per-step probability that a member canary enters the noisy sum."""
    c = settings.canary
    if c.kind == "gradient" and c.policy == "every_step":
        return 1.0
    if c.kind == "gradient" and c.inclusion_prob is not None:
        return float(c.inclusion_prob)
    return float(sample_rate)


def threat_model_for(
    settings: AuditSettings, sample_rate: float, steps: int, canary_norm: float | None = None
) -> ThreatModel:
    """The ``ThreatModel`` of an audit with the data's Poisson ``sample_rate`` and ``steps``."""
    dp, c = settings.dp, settings.canary
    norm = None
    if c.kind == "gradient":
        norm = canary_norm if canary_norm is not None else c.norm
    return ThreatModel(
        noise_multiplier=dp.noise_multiplier,
        max_grad_norm=dp.max_grad_norm,
        sample_rate=canary_sample_rate(settings, sample_rate),
        steps=int(steps),
        delta=dp.delta,
        canary_kind=c.kind,
        canary_norm=norm,
        training_sample_rate=float(sample_rate),
    )


def independent_canaries(settings: AuditSettings, canary_info: dict | None) -> bool:
    """True when every canary's (score, membership) is an independent one-canary experiment.

    Multi-run audits with one canary per run; and Dirac gradient canaries that all sit on
    coordinates no data gradient touches (each sees only its own coordinate's noise), in any
    mode. Otherwise canaries trained together in one run can influence each other's scores.
    """
    c = settings.canary
    if settings.audit.mode == "multi_run" and c.count == 1:
        return True
    info = canary_info or {}
    return (
        c.kind == "gradient"
        and c.direction == "dirac"
        and info.get("canaries_on_zero_gradient_coordinates") == c.count
    )
