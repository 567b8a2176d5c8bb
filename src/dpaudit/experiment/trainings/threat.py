"""The audit's threat model, derived from its settings in one place (``ThreatModel``).

The canary design (``experiment.canary_designs``) says what it realises: the kind of canary,
the per-step rate at which a member enters the noisy sum (every step: 1; Bernoulli gradient
canaries: q_c, default the data's q; input canaries: the data's q), the canary's norm relative
to C, and whether each canary's (score, membership) is an independent draw of the one-canary
experiment, which the threshold-based certified methods and the claim test need.
"""

from __future__ import annotations

from dpaudit.experiment.canary_designs import design_of
from dpaudit.experiment.settings import AuditSettings
from dpaudit.threat_model import ThreatModel


def threat_model_for(
    settings: AuditSettings, sample_rate: float, steps: int, canary_norm: float | None = None
) -> ThreatModel:
    """The ``ThreatModel`` of an audit with the data's Poisson ``sample_rate`` and ``steps``."""
    dp, design = settings.dp, design_of(settings.canary)
    return ThreatModel(
        noise_multiplier=dp.noise_multiplier,
        max_grad_norm=dp.max_grad_norm,
        sample_rate=design.sample_rate(settings, sample_rate),
        steps=int(steps),
        delta=dp.delta,
        canary_kind=design.threat_kind,
        canary_norm=design.canary_norm(settings, canary_norm),
        training_sample_rate=float(sample_rate),
    )


def independent_canaries(settings: AuditSettings, canary_info: dict | None) -> bool:
    """True when every canary's (score, membership) is an independent one-canary experiment:
    multi-run audits with one canary per run, and designs whose canaries do not see each
    other (``CanaryDesign.independent``: e.g. Dirac gradient canaries that all sit on
    coordinates no data gradient touches), in any mode."""
    if settings.audit.mode == "multi_run" and settings.canary.count == 1:
        return True
    return design_of(settings.canary).independent(settings, canary_info or {})
