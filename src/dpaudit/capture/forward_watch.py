"""Watch the training forward for calls that input canaries cannot be replayed for.

Input canaries need their gradients computed exactly as the training examples' are. A training
forward with keyword arguments or several positional inputs (the separate pass would call
``model(x)`` without them) or one under autocast (canary gradients would stay in reduced
precision and exceed C) is noted here and refused at the next optimizer step.
"""

from __future__ import annotations

import torch
from torch import nn

from dpaudit.capture.persample import in_per_sample_pass


class ForwardWatcher:
    """Notes training forwards that input canaries cannot be replayed for (module doc).

    A forward pre-hook on the model; ``check(step)`` raises at the first optimizer step after
    such a call, before any score is accumulated from it.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._handle = None
        self.problem: str | None = None

    def attach(self) -> None:
        self._handle = self.model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _pre(self, module, args, kwargs):
        if self.problem or in_per_sample_pass() or not module.training:
            return None
        if not torch.is_grad_enabled():
            return None
        if kwargs:
            self.problem = (
                f"the training forward was called with keyword arguments {sorted(kwargs)}"
            )
        elif len(args) != 1:
            self.problem = f"the training forward was called with {len(args)} positional inputs"
        elif torch.is_autocast_enabled(args[0].device.type if torch.is_tensor(args[0])
                                       else "cpu"):
            self.problem = "the training forward ran under autocast (mixed precision)"
        return None

    def check(self, step: int) -> None:
        """Raise ValueError if a training forward could not be replayed for input canaries."""
        if self.problem:
            raise ValueError(
                f"input canaries: {self.problem} before optimizer step {step}; their gradients "
                "would be computed as model(canary_inputs) in full precision without those "
                "arguments, i.e. wrongly. Not supported yet: use gradient canaries "
                "(GradientCanaries) for this model, or a forward model(x) without autocast."
            )
