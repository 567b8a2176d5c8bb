"""Which Opacus set-ups the hook records exactly, and refusals for the ones it would get wrong.

Silent wrong scores are the worst defect an auditor can have, so every set-up the hook does
not yet handle exactly is refused with an error naming the option and what to do instead:

* distributed training (DPDDP with Opacus' distributed optimizers, or any process group with
  more than one rank): Opacus adds the noise on rank 0 and all-reduces inside ``step()``, after
  the step hook, so canaries would enter the applied gradient once per rank and each rank
  would score a gradient that is not the one applied;
* ``clipping="adaptive"``: the clip bound moves during training while canaries and the claim
  would use a fixed one;
* ``clipping="per_layer"``: Opacus clips each layer at its own bound, the hook uses one flat
  bound;
* ghost clipping (``grad_sample_mode="ghost"``): no per-sample gradients to read.

Training forwards that input canaries cannot be replayed for are caught by
``forward_watch.ForwardWatcher``.
"""

from __future__ import annotations

import torch
from opacus.optimizers import (
    AdaClipDPOptimizer,
    DistributedDPOptimizer,
    DPOptimizerFastGradientClipping,
    DPPerLayerOptimizer,
    SimpleDistributedPerLayerOptimizer,
)

_DISTRIBUTED = (DistributedDPOptimizer, SimpleDistributedPerLayerOptimizer)


def _world_size() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def check_optimizer_supported(optimizer) -> None:
    """Raise ValueError naming the option when the hook cannot record ``optimizer`` exactly."""
    name = type(optimizer).__name__
    if isinstance(optimizer, _DISTRIBUTED) or "Distributed" in name or _world_size() > 1:
        raise ValueError(
            f"optimizer: distributed DP training ({name}, world size {_world_size()}) is not "
            "supported yet: Opacus adds the noise on rank 0 and all-reduces after the step "
            "hook, so canaries would enter the applied gradient once per rank and ranks would "
            "score gradients that are not the applied one. Audit a single-process run with the "
            "same model, data and DP settings."
        )
    if isinstance(optimizer, AdaClipDPOptimizer):
        raise ValueError(
            "optimizer: clipping='adaptive' is not supported yet: the clip bound changes "
            "during training while canaries and the claimed curve would use a fixed one. "
            "Audit with clipping='flat' at the bound your run converges to."
        )
    if isinstance(optimizer, DPPerLayerOptimizer) or hasattr(optimizer, "max_grad_norms"):
        raise ValueError(
            "optimizer: clipping='per_layer' is not supported yet: Opacus clips each layer at "
            "its own bound and the hook would clip canaries with one flat bound. Audit with "
            "clipping='flat'."
        )
    if isinstance(optimizer, DPOptimizerFastGradientClipping):
        raise ValueError(
            "optimizer: ghost clipping (grad_sample_mode='ghost') is not supported yet: it "
            "keeps no per-sample gradients for the hook to read. Audit with "
            "grad_sample_mode='hooks' or 'functorch'."
        )
