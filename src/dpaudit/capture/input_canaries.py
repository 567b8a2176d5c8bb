"""Input canaries: examples whose clipped gradients the hook computes at every step (DESIGN 3).

``InputCanaries`` are examples (x*, y*) whose clipped gradients the hook computes at the current
parameters at every step; whether they are members is decided by the training data, not by the
hook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class InputCanaries:
    """K examples whose clipped per-sample gradients are computed at every optimizer step.

    ``inputs`` has shape (K, *input_shape) (floating point), ``targets`` shape (K, ...);
    ``loss_fn(output, target)`` is the per-example training loss (mean over a batch of one).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: LossFn = nn.functional.cross_entropy

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, torch.Tensor) or not isinstance(self.targets, torch.Tensor):
            raise ValueError("InputCanaries: inputs and targets must be torch tensors")
        if self.inputs.ndim < 1 or self.inputs.shape[0] == 0:
            raise ValueError(
                f"InputCanaries: inputs must have a leading canary axis with K >= 1, "
                f"got shape {tuple(self.inputs.shape)}"
            )
        if not self.inputs.is_floating_point():
            raise ValueError(
                f"InputCanaries: inputs must be floating point, got {self.inputs.dtype}"
            )
        if self.targets.ndim < 1 or self.targets.shape[0] != self.inputs.shape[0]:
            raise ValueError(
                f"InputCanaries: targets must have shape (K, ...) with K = {self.inputs.shape[0]}, "
                f"got {tuple(self.targets.shape)}"
            )
        if not callable(self.loss_fn):
            raise ValueError("InputCanaries: loss_fn must be callable(output, target)")

    def __len__(self) -> int:
        return int(self.inputs.shape[0])
