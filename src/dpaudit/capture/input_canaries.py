"""Input canaries: examples whose clipped gradients the hook computes at every step (DESIGN 3).

``InputCanaries`` are K examples whose clipped gradients the hook computes at the current
parameters at every step; whether they are members is decided by the training data, not by the
hook. An example is whatever the model's forward takes: the canaries carry their own forward
arguments, each with a leading K axis, and the k-th canary's gradient is that of
``loss_fn(model(inputs[k:k+1], *[a[k:k+1] for a in args], **{n: v[k:k+1] for n, v in
kwargs.items()}), targets[k:k+1])``. So

* ``InputCanaries(x, y)``: ``model(x)``, floating point features or integer token ids alike;
* ``InputCanaries(x, y, args=(side,))``: ``model(x, side)`` (several positional inputs);
* ``InputCanaries(tokens, y, kwargs={"key_padding_mask": mask})``: each canary with its own
  padding mask, ``model(tokens, key_padding_mask=mask)``.

The training forward must be called with the same tensor arguments (same positions, same
keyword names, same trailing shapes when the canaries are folded into the batch); arguments
that are not tensors (e.g. ``need_weights=False``) are taken from the training call itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from dpaudit.gradients import LossFn


def argument_kind(dtype: torch.dtype) -> str:
    """'float', 'int', 'bool' or 'complex': a canary's tensor argument is cast to the training
    call's dtype only within its kind (a bool padding mask is never read as a float one)."""
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return "complex"
    return "int"


@dataclass
class InputCanaries:
    """K examples whose clipped per-sample gradients are computed at every optimizer step.

    Args:
        inputs: (K, ...) tensor, the forward's first positional argument for each canary
            (floating point features, integer token ids, any dtype the model takes).
        targets: (K, ...) tensor of the canaries' targets.
        loss_fn: ``loss_fn(output, target)`` is the per-example training loss (mean over a
            batch of one), e.g. ``nn.functional.cross_entropy`` (default).
        args: further positional tensor arguments of the forward, each (K, ...):
            ``model(inputs, *args, **kwargs)``.
        kwargs: keyword tensor arguments of the forward, name -> (K, ...) tensor, e.g. a
            per-canary ``key_padding_mask`` / ``attention_mask``.

    Every tensor has the canaries on its first axis; a ValueError names the argument that does
    not. The module doc says how they are matched with the training forward.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: LossFn = nn.functional.cross_entropy
    args: tuple[torch.Tensor, ...] = ()
    kwargs: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, torch.Tensor):
            raise ValueError(
                f"InputCanaries: inputs must be a torch tensor, got {type(self.inputs).__name__}"
            )
        if self.inputs.ndim < 1 or self.inputs.shape[0] == 0:
            raise ValueError(
                f"InputCanaries: inputs must have a leading canary axis with K >= 1, "
                f"got shape {tuple(self.inputs.shape)}"
            )
        k = int(self.inputs.shape[0])
        if not isinstance(self.targets, torch.Tensor):
            raise ValueError(
                f"InputCanaries: targets must be a torch tensor, got {type(self.targets).__name__}"
            )
        if self.targets.ndim < 1 or self.targets.shape[0] != k:
            raise ValueError(
                f"InputCanaries: targets must have shape (K, ...) with K = {k}, "
                f"got {tuple(self.targets.shape)}"
            )
        if not callable(self.loss_fn):
            raise ValueError("InputCanaries: loss_fn must be callable(output, target)")
        if isinstance(self.args, torch.Tensor) or not isinstance(self.args, tuple | list):
            raise ValueError(
                "InputCanaries: args must be a tuple of (K, ...) tensors (the forward's further "
                f"positional arguments), got {type(self.args).__name__}"
            )
        self.args = tuple(self.args)
        for i, a in enumerate(self.args):
            self._check_tensor(f"args[{i}]", a, k)
        if not isinstance(self.kwargs, Mapping):
            raise ValueError(
                "InputCanaries: kwargs must be a dict name -> (K, ...) tensor, "
                f"got {type(self.kwargs).__name__}"
            )
        self.kwargs = dict(self.kwargs)
        for name, v in self.kwargs.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(
                    f"InputCanaries: kwargs keys must be argument names, got {name!r}"
                )
            self._check_tensor(f"kwargs[{name!r}]", v, k)

    @staticmethod
    def _check_tensor(label: str, value: object, k: int) -> None:
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"InputCanaries: {label} must be a (K, ...) tensor with K = {k}, "
                f"got {type(value).__name__} (non-tensor arguments come from the training call)"
            )
        if value.ndim < 1 or value.shape[0] != k:
            raise ValueError(
                f"InputCanaries: {label} must have shape (K, ...) with K = {k}, "
                f"got {tuple(value.shape)}"
            )

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def positional(self) -> tuple[torch.Tensor, ...]:
        """The positional tensor arguments ``(inputs, *args)``."""
        return (self.inputs, *self.args)

    @property
    def signature(self) -> tuple[int, tuple[str, ...]]:
        """(number of positional tensor arguments, sorted keyword names): what a training
        forward must match for these canaries to be computed like its examples."""
        return 1 + len(self.args), tuple(sorted(self.kwargs))

    def slots(self) -> dict[int | str, torch.Tensor]:
        """Every tensor argument by position (int) or keyword name (str)."""
        out: dict[int | str, torch.Tensor] = dict(enumerate(self.positional))
        out.update(self.kwargs)
        return out

    def to(self, device: torch.device | str) -> InputCanaries:
        """A copy with every tensor (inputs, targets, args, kwargs) on ``device``."""
        return InputCanaries(
            self.inputs.to(device),
            self.targets.to(device),
            self.loss_fn,
            tuple(a.to(device) for a in self.args),
            {n: v.to(device) for n, v in self.kwargs.items()},
        )

    def select(self, index: torch.Tensor | slice) -> InputCanaries:
        """The canaries at ``index`` (a slice, index or boolean mask over the K axis)."""
        return InputCanaries(
            self.inputs[index],
            self.targets[index],
            self.loss_fn,
            tuple(a[index] for a in self.args),
            {n: v[index] for n, v in self.kwargs.items()},
        )
