"""The score interface shared by live capture and offline traces.

A ``StepScore`` turns one optimizer step's white-box view into one number per canary:
``step(canary_grads, released, ctx)`` gets the K canaries' clipped gradients g*_t (K x d, for
input canaries at the current parameters, for gradient canaries the fixed vector), the released
gradient g_t (d,) = (clipped sum [+ canaries] + noise) / B_exp, and a ``StepContext`` with the
DP parameters. The capture hook calls it at every step and accumulates the values per canary
(``aggregate``: ``"sum"`` over steps as in seed 001 Algorithm 4, or ``"max"`` as in seed 000
Algorithm 7); the same object scores recorded traces offline. Everything stays on the device of
the tensors it is given and costs O(K d) per step plus the cost of any precision operator.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepContext:
    """What a score may know about the step besides the gradients.

    ``divisor``: what the released gradient was divided by, the sum of clipped gradients plus
    noise over it: Opacus' expected batch size B_exp x gradient-accumulation steps x world size
    for ``loss_reduction="mean"``, 1 for ``"sum"`` (``expected_batch_size`` is its former
    name, still readable). ``reference_grads`` holds clipped per-sample gradients of reference
    points at the current parameters (n_r x d) when the score sets
    ``requires_reference_grads``; otherwise ``None``.
    """

    step: int
    noise_multiplier: float
    max_grad_norm: float
    divisor: float
    sample_rate: float
    reference_grads: torch.Tensor | None = None

    @property
    def expected_batch_size(self) -> float:
        """The former name of ``divisor`` (it is B_exp only for one process without
        accumulation and ``loss_reduction="mean"``)."""
        return self.divisor


class StepScore(abc.ABC):
    """Per-step membership score of K canaries; higher means "member"."""

    name: str = "score"
    aggregate: str = "sum"
    requires_reference_grads: bool = False

    def start(self, num_canaries: int, dim: int, device: torch.device) -> None:  # noqa: B027
        """Called once before the first step (set up per-run state); default: nothing."""

    @abc.abstractmethod
    def step(
        self, canary_grads: torch.Tensor, released: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        """Return a (K,) tensor of this step's scores."""
