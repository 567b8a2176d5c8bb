"""Canaries and their membership for one audit (DESIGN 3, steps 2-3).

What every design shares (the membership bits, reference examples, the parameters the
canaries live in, the seeded generator) is drawn here; the design ``canary.kind`` names
(``experiment.canary_designs``) builds the canaries from it.
"""

from __future__ import annotations

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpaudit import seeds
from dpaudit.experiment.canary_designs import BuildContext, CanarySetup, design_of
from dpaudit.experiment.canary_designs.base import tensors
from dpaudit.experiment.settings import AuditSettings
from dpaudit.gradients import resolve_parameter_names

__all__ = ["CanarySetup", "draw_membership", "setup_canaries"]


def draw_membership(count: int, inclusion: float, seed: int) -> np.ndarray:
    """Independent Bernoulli(inclusion) membership bits, one per canary (one-run audits)."""
    rng = seeds.stream(seed, seeds.MEMBERSHIP)
    return rng.random(count) < inclusion


def setup_canaries(
    settings: AuditSettings,
    model: nn.Module,
    train_set: Dataset,
    membership: np.ndarray | None = None,
) -> CanarySetup:
    """Build the canaries of ``settings.canary`` at the model's current (initial) parameters."""
    c, seed = settings.canary, settings.seed
    device = next(model.parameters()).device
    rng = seeds.stream(seed, seeds.CANARY_SETUP)
    n = len(train_set)
    ref_idx = rng.choice(n, size=min(c.n_references, n), replace=False)
    references = tuple(t.to(device) for t in tensors(train_set, ref_idx))
    params = resolve_parameter_names(model, c.params)
    if membership is None:
        membership = draw_membership(c.count, settings.audit.inclusion, seed)
    if len(membership) != c.count:
        raise ValueError(f"membership has {len(membership)} bits for canary.count={c.count}")
    ctx = BuildContext(settings, model, train_set, references, params, np.asarray(membership),
                       rng, device)
    setup = design_of(c).build(ctx)
    if not isinstance(setup, CanarySetup):
        raise TypeError(f"canary design {c.kind!r} must build a CanarySetup, got "
                        f"{type(setup).__name__}")
    return setup
