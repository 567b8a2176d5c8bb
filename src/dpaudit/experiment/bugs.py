"""Planted privacy bugs: a DP optimizer under test that silently breaks its guarantee.

An audit is only worth something if it catches real bugs. Each bug below is patched onto one
``DPOptimizer`` instance (``plant_bug`` returns the function that removes it) while the
accountant keeps reporting the nominal guarantee:

* ``"halved_noise"``: the Gaussian noise uses sigma / 2; the accountant still sees sigma.
* ``"scaled_noise"``: the noise uses ``factor`` x sigma (``dp.bug_factor``, e.g. 0.9 for a 10%
  noise reduction), the accountant still sees sigma: the knob for measuring an audit's power.
* ``"unclipped_example"``: in every batch, the example with the largest gradient norm is
  added unclipped (an off-by-one in a clipping loop). High-norm canaries (mislabeled, blank)
  are exactly the examples that trigger it.
* ``"realised_batch_size"``: the noisy sum is divided by the realised batch size instead of
  the expected one (the leak class of Opacus issue 571). With Poisson sampling the released
  gradient's scale then reveals how many examples were drawn, which on a tiny dataset reveals
  whether the target was drawn. The scalar-product attack is blind to it (signal and noise are
  rescaled alike); ``dpaudit.attacks.BatchSizeScore`` sees it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from dpaudit.capture.patching import InstancePatch
from dpaudit.gradients.persample import clip_factor

BUGS = ("none", "halved_noise", "scaled_noise", "unclipped_example", "realised_batch_size")


def _patch(opt: DPOptimizer, name: str, replacement: Callable) -> Callable[[], None]:
    """Install ``replacement`` as ``opt.<name>`` and return the exact restore."""
    return InstancePatch(opt, name, replacement, owner="plant_bug").apply().restore


def _scaled_noise(opt: DPOptimizer, factor: float) -> Callable[[], None]:
    original = opt.add_noise

    def add_noise() -> None:
        nominal = opt.noise_multiplier
        opt.noise_multiplier = nominal * factor
        try:
            original()
        finally:
            opt.noise_multiplier = nominal

    return _patch(opt, "add_noise", add_noise)


def _unclipped_example(opt: DPOptimizer) -> Callable[[], None]:
    def clip_and_accumulate() -> None:
        if len(opt.grad_samples[0]) == 0:
            factor = torch.zeros((0,), device=opt.grad_samples[0].device)
        else:
            norms = torch.stack(
                [g.reshape(len(g), -1).norm(2, dim=-1) for g in opt.grad_samples], dim=1
            ).norm(2, dim=1)
            factor = clip_factor(norms, opt.max_grad_norm)
            factor[int(torch.argmax(norms))] = 1.0  # the bug: the largest one is not clipped
        for p in opt.params:
            _check_processed_flag(p.grad_sample)
            gs = opt._get_flat_grad_sample(p).to(p.dtype)
            grad = torch.einsum("i,i...", factor.to(gs.device, p.dtype), gs)
            p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
            _mark_as_processed(p.grad_sample)

    return _patch(opt, "clip_and_accumulate", clip_and_accumulate)


def _realised_batch_size(opt: DPOptimizer) -> Callable[[], None]:
    if opt.loss_reduction != "mean":
        raise ValueError("bug 'realised_batch_size' needs loss_reduction='mean'")

    def scale_grad() -> None:
        realised = max(1, len(opt.grad_samples[0]))
        for p in opt.params:
            p.grad /= realised

    return _patch(opt, "scale_grad", scale_grad)


_PLANTERS = {
    "halved_noise": lambda opt: _scaled_noise(opt, 0.5),
    "unclipped_example": _unclipped_example,
    "realised_batch_size": _realised_batch_size,
}


def plant_bug(optimizer: DPOptimizer, bug: str, factor: float = 0.5) -> Callable[[], None]:
    """Patch ``bug`` onto ``optimizer`` (plant it before attaching an ``AuditHook``).

    ``factor`` is the noise scale of ``"scaled_noise"`` (in (0, 1]; ignored by the others).
    Returns a function that restores the correct optimizer. ``bug="none"`` changes nothing.
    """
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {BUGS}, got {bug!r}")
    if not isinstance(optimizer, DPOptimizer):
        raise ValueError(f"optimizer must be an Opacus DPOptimizer, got {type(optimizer).__name__}")
    if bug == "none":
        return lambda: None
    if bug == "scaled_noise":
        if not 0.0 < float(factor) <= 1.0:
            raise ValueError(f"factor (dp.bug_factor) must lie in (0, 1], got {factor!r}")
        return _scaled_noise(optimizer, float(factor))
    return _PLANTERS[bug](optimizer)
