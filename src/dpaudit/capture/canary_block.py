"""A parameter block of the audit's own, which no data gradient can reach: independent gradient
canaries for any model.

Dirac gradient canaries are independent experiments only on coordinates no data gradient
reaches at any step. Many models have none by structure (a tanh MLP on dense data, a CNN
whose padded windows see every pixel), and coordinates dead only at the initial parameters
come alive during training. ``add_canary_block(model, size)`` gives the model a block of
``size`` parameters that the data provably never touch, without changing what the model
computes:

* the block is a bias-free ``nn.Linear(size, 1)`` registered as the model's last submodule
  (``dpaudit_canaries``); it is fed an all-zero input and its output's sum, an exact 0 for
  every finite weight, is added to the model's first output tensor (by a forward hook on the
  model, or by the model itself where it calls every child in turn, as ``nn.Sequential``
  does: the block is then its identity last layer). Its
  per-example gradient is the outer product of the loss gradient with that zero input:
  exactly zero for every example at every step, whatever the data and the parameters. Opacus
  computes its per-sample gradients like any Linear's, the DP optimizer clips and noises it
  like any parameter, so the released gradient there is the noise plus the canaries inserted:
  each canary is the only signal on its coordinate;
* the model's outputs are the same numbers (x + 0 = x; -0.0 becomes 0.0) and the clipping
  norms gain exact zeros; its parameters come last in ``model.parameters()``, so the DP
  optimizer draws their noise after every other parameter's: the first step is bit for bit
  the step without the block, and later steps draw their noise from the same generator
  further on (the block's noise used some of it), so the run is another draw of the same
  training, not the same draw. Its ``state_dict`` gains the block's entry until
  ``block.remove()`` (after training).

Add it before ``make_private`` and before building the optimizer (its parameters must be the
optimizer's), then ``block.canaries(model)``: Dirac canaries on its coordinates, each a member
with probability 1/2, in the coordinates the hook and ``trainable_dim(model)`` use. The hook
checks at every step that the data's clipped sum there is exactly zero
(``capture.independence``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from dpaudit.names import DATA_RATE_PER_SIDE

NAME = "dpaudit_canaries"
# the hook's default canaries (``canary_choice.default_canaries``): the every-step stress test
# of the mechanism, and the canaries inserted like an example, DATA_RATE_PER_SIDE per side;
# add_canary_block's default size holds both
STRESS_COUNT = 1000
BLOCK_SIZE = STRESS_COUNT + 2 * DATA_RATE_PER_SIDE


class CanaryBlock(nn.Module):
    """The audit's own parameter block (module doc): ``size`` parameters no data reach."""

    def __init__(self, size: int) -> None:
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive integer (coordinates), got {size!r}")
        self.size = size
        with torch.random.fork_rng(devices=[]):  # Linear's init draws: not the user's stream
            self.linear = nn.Linear(size, 1, bias=False)
        nn.init.zeros_(self.linear.weight)
        # a mark on the parameter itself (it survives Opacus' wrapping): code that sees only
        # the optimizer's tensors can tell the audit's block from the model's own layers
        self.linear.weight.dpaudit_canary_block = True
        self._handle = None
        self.called = False
        self._zeros = None  # the all-zero input, reused across calls (``_zero_input``)
        # a plain reference (a Module attribute would make the model a child of the block)
        object.__setattr__(self, "_owner", None)

    def forward(self, x):
        """``x`` plus the block's exact zero (a tensor; anything else passes unchanged): the
        identity, so that a container that calls every child (``nn.Sequential``) runs it as
        its last layer, and the model's forward hook adds it otherwise."""
        if not isinstance(x, torch.Tensor):
            return x
        self.called = True
        rows = x.shape[0] if x.ndim else 1
        # the sum is an exact 0 connected to every example's loss: each example's gradient
        # on the block is (its loss gradient) x (a zero input), exactly zero
        return x + self.linear(self._zero_input(rows, x.device)).sum().to(x.dtype)

    def _zero_input(self, rows: int, device) -> torch.Tensor:
        """(rows, size) zeros: the first rows of one all-zero buffer kept across calls (nothing
        writes to it: autograd and Opacus only read a module's input), grown when a batch is
        larger. Allocating and clearing rows x size floats at every step cost as much as the
        block's own per-example gradient."""
        dtype, buf = self.linear.weight.dtype, self._zeros
        if buf is None or buf.shape[0] < rows or buf.device != device or buf.dtype != dtype:
            buf = torch.zeros(rows, self.size, device=device, dtype=dtype)
            self._zeros = buf
        return buf[:rows]

    def coordinates(self, model: nn.Module) -> list[int]:
        """The block's flat coordinates in ``model``'s trainable parameters (the hook's and
        ``trainable_dim``'s numbering; ``model`` wrapped by Opacus or not)."""
        from dpaudit.capture.coordinates import trainable_parameters

        offset = 0
        for _, p in trainable_parameters(model):
            if p is self.linear.weight:
                return list(range(offset, offset + p.numel()))
            offset += p.numel()
        raise ValueError("the canary block is not a trainable part of this model (was it "
                         "removed, or frozen?)")

    def canaries(self, model: nn.Module, count: int | None = None, *, norm: float = 1.0,
                 seed: int = 0, inclusion: float = 0.5):
        """Dirac gradient canaries on ``count`` of the block's coordinates (default all), each a
        member (inserted at every step) with probability ``inclusion``, independently (seeded):
        the random design the one-run bounds assume. ``norm``: the canaries' norm (at most
        the clip bound C)."""
        from dpaudit.capture.coordinates import trainable_dim
        from dpaudit.capture.gradient_canaries import GradientCanaries

        coords = self.coordinates(model)
        k = len(coords) if count is None else int(count)
        if not 1 <= k <= len(coords):
            raise ValueError(f"count must be in [1, {len(coords)}] (the block's size), got "
                             f"{count!r}")
        rng = np.random.default_rng(seed)
        chosen = sorted(rng.choice(coords, k, replace=False).tolist())
        members = rng.random(k) < inclusion
        return GradientCanaries.dirac(
            chosen, norm=norm, dim=trainable_dim(model),
            policy=["every_step" if m else "never" for m in members])

    def remove(self) -> None:
        """Take the block out of the model (its hook and its submodule), after training."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        owner = self._owner
        if owner is not None and getattr(owner, NAME, None) is self:
            delattr(owner, NAME)
        object.__setattr__(self, "_owner", None)


class _Handles:
    """Two hook handles removed together."""

    def __init__(self, *handles) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _first_tensor(out):
    """(the first tensor of a forward's output, a function putting a replacement back)."""
    if isinstance(out, torch.Tensor):
        return out, lambda t: t
    if isinstance(out, Mapping):
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                def put(t, key=key):
                    new = out if hasattr(out, "__setitem__") else dict(out)
                    new[key] = t
                    return new
                return value, put
    if isinstance(out, Sequence) and not isinstance(out, str):
        for i, value in enumerate(out):
            if isinstance(value, torch.Tensor):
                def put(t, i=i):
                    items = list(out)
                    items[i] = t
                    return type(out)(items) if isinstance(out, tuple) else items
                return value, put
    return None, None


def add_canary_block(model: nn.Module, size: int | None = None) -> CanaryBlock:
    """Give ``model`` a block of ``size`` parameters no data gradient reaches (module doc);
    call it before ``make_private`` and before building the optimizer. Returns the block
    (``block.canaries(model)`` after ``make_private``; ``block.remove()`` after training).
    ``size``: default ``BLOCK_SIZE`` (21,000: the hook's default canaries, the
    every-step stress test's 1,000 and 10,000 per side inserted like an example); it costs
    each step a per-example gradient of ``size`` zeros and ``size`` noise draws."""
    if size is None:
        size = BLOCK_SIZE
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch nn.Module, got {type(model).__name__}")
    if hasattr(model, "_module"):
        raise ValueError("add_canary_block: call it on your model before make_private (this "
                         "one is already wrapped by Opacus), and build the optimizer after it")
    if getattr(model, NAME, None) is not None:
        raise ValueError("add_canary_block: this model has a canary block already")
    ref = next(model.parameters(), None)
    block = CanaryBlock(size)
    if ref is not None:
        block.to(device=ref.device, dtype=ref.dtype)
    model.add_module(NAME, block)

    def reset(module, args):
        block.called = False

    def add_zero(module, args, out):
        if block.called:  # the model ran it itself (nn.Sequential calls every child)
            return out
        first, put = _first_tensor(out)
        if first is None:
            raise ValueError("the canary block needs a tensor among the model's outputs")
        return put(block(first))

    pre = model.register_forward_pre_hook(reset)
    post = model.register_forward_hook(add_zero)
    block._handle = _Handles(pre, post)
    object.__setattr__(block, "_owner", model)
    return block
