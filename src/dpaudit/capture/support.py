"""Which Opacus set-ups the hook records exactly, and refusals for the ones it would get wrong.

Silent wrong scores are the worst defect an auditor can have, so every set-up the hook does
not handle exactly is refused at construction with an error naming the option and what to do
instead. Supported: flat clipping with ``grad_sample_mode`` hooks / functorch / ew (input and
gradient canaries), ghost clipping (``grad_sample_mode="ghost"``, gradient canaries only), and
Opacus' distributed optimizers for DPDDP (``DistributedDPOptimizer``,
``DistributedDPOptimizerFastGradientClipping``): canaries are inserted on rank 0 only, before
the all-reduce, like Opacus' noise, and every rank scores the gradient after the all-reduce;
per-layer clipping in one process (``DPPerLayerOptimizer``: each parameter clipped to its own
C_p, noise sigma C with C = ||(C_p)||; ``clip_bounds`` gives the rule input canaries are clipped
by); adaptive clipping (``AdaClipDPOptimizer``: the bound C_t of every step read when it is
used, ``adaptive``). Refused:

* per-layer clipping under DPDDP (``SimpleDistributedPerLayerOptimizer``,
  ``DistributedPerLayerOptimizer``): the noise is added per layer inside the backward hooks,
  where the hook cannot see it;
* an optimizer with ``max_grad_norms`` that is not ``DPPerLayerOptimizer``, or whose
  ``max_grad_norm`` is not one number: its clip rule is unknown;
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
_DISTRIBUTED_PER_LAYER = (SimpleDistributedPerLayerOptimizer, DistributedPerLayerOptimizer)


def _bound_value(optimizer):
    bound = getattr(optimizer, "max_grad_norm", None)
    return float(bound) if isinstance(bound, torch.Tensor) and bound.numel() == 1 else bound


def is_per_layer(optimizer) -> bool:
    """Whether ``optimizer`` clips each parameter to its own bound (``DPPerLayerOptimizer``)."""
    return isinstance(optimizer, DPPerLayerOptimizer)


def is_adaptive(optimizer) -> bool:
    """Whether ``optimizer`` adapts its clip bound during training (``AdaClipDPOptimizer``)."""
    return isinstance(optimizer, AdaClipDPOptimizer)


def clip_bound(optimizer) -> float:
    """The clip bound C the optimizer's noise is scaled by at this step: flat C, the combined
    ||(C_p)|| of per-layer clipping, or adaptive clipping's current C_t."""
    return float(_bound_value(optimizer))


def clip_bounds(optimizer) -> float | list[float]:
    """The rule the optimizer clips one example by, now: a float C (flat, adaptive's C_t) or
    the per-layer bounds aligned with ``optimizer.params``."""
    if is_per_layer(optimizer):
        return [float(c) for c in optimizer.max_grad_norms]
    return clip_bound(optimizer)


def gradient_noise_multiplier(optimizer) -> float:
    """The multiplier of the noise the optimizer adds to the clipped gradient sum (std = this x
    ``clip_bound``): its ``noise_multiplier``, except under adaptive clipping, where Opacus
    adds sigma_g = (sigma^-2 - (2 sigma_u)^-2)^(-1/2) and keeps sigma for the accountant
    (Andrew et al. 2021, Theorem 1)."""
    sigma = float(optimizer.noise_multiplier)
    if not is_adaptive(optimizer) or sigma <= 0:
        return sigma
    return (sigma ** -2 - (2 * float(optimizer.unclipped_num_std)) ** -2) ** -0.5


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
    if isinstance(optimizer, _DISTRIBUTED_PER_LAYER):
        raise ValueError(
            f"optimizer: clipping='per_layer' under DPDDP ({name}) is not supported: Opacus "
            "adds its noise layer by layer inside the backward hooks, where the hook cannot "
            "read it. Audit per-layer clipping in one process, or flat clipping under DPDDP."
        )
    per_layer = type(optimizer) is DPPerLayerOptimizer
    if (
        (hasattr(optimizer, "max_grad_norms") and not per_layer)
        or (isinstance(optimizer, DPPerLayerOptimizer) and not per_layer)
        or not isinstance(_bound_value(optimizer), numbers.Real)
    ):
        raise ValueError(
            f"optimizer: {name} clips by a rule the hook does not know (max_grad_norms "
            "without DPPerLayerOptimizer, or a max_grad_norm that is not one number). Use "
            "Opacus' clipping='flat', 'per_layer' or 'adaptive'."
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


ADAPTIVE_COUNTERS = ("sample_size", "unclipped_num")


def save_counters(optimizer) -> dict:
    """The optimizer's per-step counters that its own ``clip_and_accumulate`` / ``add_noise``
    advance (adaptive clipping's ``sample_size`` and ``unclipped_num``): a probe that calls
    them restores these with ``restore_counters`` so that training is unchanged."""
    return {k: _copy(getattr(optimizer, k)) for k in ADAPTIVE_COUNTERS if hasattr(optimizer, k)}


def restore_counters(optimizer, saved: dict) -> None:
    """Undo what probe calls did to the counters ``save_counters`` saved."""
    for k, v in saved.items():
        setattr(optimizer, k, _copy(v))


def _copy(value):
    """A copy that in-place updates (``unclipped_num += ...`` on a tensor) cannot reach."""
    return value.clone() if isinstance(value, torch.Tensor) else value
