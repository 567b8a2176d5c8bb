"""Canaries and their membership for one run (DESIGN 3, steps 2-3).

What every design shares (the membership bits, reference examples, the parameters the
canaries live in, the seeded generator) is drawn here from the ``AuditPlan``; the design
``canary.kind`` names (``experiment.canary_designs``) builds the canaries from it.
"""

from __future__ import annotations

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpaudit import seeds
from dpaudit.experiment.canary_designs import BuildContext, CanarySetup
from dpaudit.experiment.canary_designs.base import tensors
from dpaudit.experiment.plan import AuditPlan, data_context, draw_membership
from dpaudit.gradients import resolve_parameter_names

__all__ = ["CanarySetup", "setup_canaries"]


def setup_canaries(
    plan: AuditPlan,
    model: nn.Module,
    train_set: Dataset,
    membership: np.ndarray | None = None,
) -> CanarySetup:
    """Build the plan's canaries at the model's current (initial) parameters."""
    c = plan.canary
    device = next(model.parameters()).device
    rng = seeds.stream(plan.seed, seeds.CANARY_SETUP)
    n = len(train_set)
    ref_idx = rng.choice(n, size=min(c.n_references, n), replace=False)
    references = tuple(t.to(device) for t in tensors(train_set, ref_idx))
    params = resolve_parameter_names(model, None if c.params is None else list(c.params))
    if membership is None:
        membership = draw_membership(plan)
    if len(membership) != c.count:
        raise ValueError(f"membership has {len(membership)} bits for canary.count={c.count}")
    ctx = BuildContext(c.options, data_context(plan, n), model, train_set, references, params,
                       np.asarray(membership), rng, device)
    setup = c.design.build(ctx)
    if not isinstance(setup, CanarySetup):
        raise TypeError(f"canary design {c.kind!r} must build a CanarySetup, got "
                        f"{type(setup).__name__}")
    return setup
