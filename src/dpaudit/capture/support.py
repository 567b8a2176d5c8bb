"""Which Opacus set-ups the hook records exactly, and refusals for the ones it would get wrong.

Silent wrong scores are the worst defect an auditor can have, so every set-up the hook does
not handle exactly is refused at construction with an error naming the option and what to do
instead. Supported: flat clipping with ``grad_sample_mode`` hooks / functorch / ew (input and
gradient canaries), ghost clipping (``grad_sample_mode="ghost"``, gradient canaries only), and
Opacus' distributed optimizers for DPDDP (``DistributedDPOptimizer``,
``DistributedDPOptimizerFastGradientClipping``): canaries are inserted on rank 0 only, before
the all-reduce, like Opacus' noise, and every rank scores the gradient after the all-reduce.
Refused:

* ``clipping="adaptive"`` (``AdaClipDPOptimizer``): the clip bound moves during training and
  Opacus' accountant does not account for the privacy spent on the bound itself, so neither a
  fixed-C canary nor the claimed curve would match what is run;
* ``clipping="per_layer"`` (``DPPerLayerOptimizer`` and its distributed variants, any optimizer
  with ``max_grad_norms``): Opacus clips each layer at its own bound, the hook clips flat;
* FSDP (``grad_sample_mode="ghost_fsdp"``): parameters are sharded, the hook reads whole ones;
* more than one process with an optimizer that is not Opacus' distributed one: each rank would
  add its own noise and the hook could not tell which gradient is applied;
* input canaries (or reference points) with ghost clipping: ghost clipping keeps no per-sample
  gradients, and the separate per-sample pass would not use its clip rule.

Training forwards that input canaries cannot be replayed for are caught by
``forward_watch.ForwardWatcher``.
"""

from __future__ import annotations

import numbers

import torch
from opacus.optimizers import (
    AdaClipDPOptimizer,
    DistributedDPOptimizer,
    DistributedDPOptimizerFastGradientClipping,
    DPOptimizerFastGradientClipping,
    DPPerLayerOptimizer,
    FSDPOptimizerFastGradientClipping,
    SimpleDistributedPerLayerOptimizer,
)
from opacus.optimizers.ddp_perlayeroptimizer import DistributedPerLayerOptimizer

DISTRIBUTED = (DistributedDPOptimizer, DistributedDPOptimizerFastGradientClipping)
_PER_LAYER = (DPPerLayerOptimizer, SimpleDistributedPerLayerOptimizer, DistributedPerLayerOptimizer)


def world_size() -> int:
    """Processes in the default torch.distributed group (1 when there is none)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def is_distributed(optimizer) -> bool:
    """Whether ``optimizer`` is one of Opacus' distributed optimizers the hook supports."""
    return isinstance(optimizer, DISTRIBUTED)


def is_ghost(optimizer) -> bool:
    """Whether ``optimizer`` does ghost (fast gradient) clipping."""
    return isinstance(optimizer, DPOptimizerFastGradientClipping)


def check_optimizer_supported(optimizer) -> None:
    """Raise ValueError naming the option when the hook cannot record ``optimizer`` exactly."""
    name = type(optimizer).__name__
    if isinstance(optimizer, AdaClipDPOptimizer):
        raise ValueError(
            f"optimizer: clipping='adaptive' ({name}) is not supported: the clip bound changes "
            "during training while canaries and the claimed curve would use a fixed one, and "
            "Opacus' accountant does not account for the noisy bound updates. Audit with "
            "clipping='flat' at the bound your run converges to (max_grad_norm=C)."
        )
    if (
        isinstance(optimizer, _PER_LAYER)
        or hasattr(optimizer, "max_grad_norms")
        or not isinstance(getattr(optimizer, "max_grad_norm", None), numbers.Real)
    ):
        raise ValueError(
            f"optimizer: clipping='per_layer' ({name}) is not supported: Opacus clips each "
            "layer at its own bound and the hook clips canaries with one flat bound. Audit "
            "with clipping='flat' (one max_grad_norm)."
        )
    if isinstance(optimizer, FSDPOptimizerFastGradientClipping) or "FSDP" in name:
        raise ValueError(
            f"optimizer: grad_sample_mode='ghost_fsdp' ({name}) is not supported: parameters "
            "are sharded across ranks. Audit with DPDDP (DifferentiallyPrivateDistributed"
            "DataParallel) or in one process."
        )
    ws = world_size()
    if ws > 1 and not is_distributed(optimizer):
        raise ValueError(
            f"optimizer: {ws} processes but {name} is not Opacus' distributed optimizer: each "
            "rank would add its own noise and the hook could not tell which gradient is "
            "applied. Wrap the model in opacus.distributed.DifferentiallyPrivateDistributed"
            "DataParallel before make_private (it then returns DistributedDPOptimizer), or "
            "audit a single-process run."
        )


def check_input_canaries_supported(optimizer) -> None:
    """Raise ValueError if input canaries (or reference points) cannot be computed exactly."""
    if is_ghost(optimizer):
        raise ValueError(
            f"canaries: input canaries and reference points are not supported with "
            f'grad_sample_mode="ghost" ({type(optimizer).__name__}): ghost clipping keeps '
            "no per-sample gradients. Use gradient canaries (GradientCanaries) with ghost "
            "clipping, or grad_sample_mode='hooks' or 'functorch' for input canaries."
        )
