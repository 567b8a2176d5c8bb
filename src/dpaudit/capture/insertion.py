"""Gradient insertion: the included gradient canaries added to the clipped sum before noise.

At each real optimizer step the hook draws which gradient canaries are included (``policy``:
``"every_step"``, ``"bernoulli"`` with their own numpy generator, ``"never"``), sums the
included vectors, scatters that sum from the view into the full parameter selection and adds
it to ``p.summed_grad`` just before the optimizer adds its noise. ``GradientInsertion`` holds
the canaries on the model's device and does the draws and the addition; the hook decides when.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpaudit.capture.gradient_canaries import GradientCanaries
from dpaudit.capture.view import CoordinateView

NORM_SLACK = 1e-6  # relative float slack on the ||g*|| <= C check


def check_gradient_canaries(canaries: Sequence, dim: int, max_grad_norm: float, where: str) -> None:
    """Raise ValueError unless every ``GradientCanaries`` in ``canaries`` has ``dim`` columns
    and rows of norm <= C (``where`` names the coordinates, for the message)."""
    for c in canaries:
        if not isinstance(c, GradientCanaries):
            continue
        if c.dim != dim:
            raise ValueError(
                f"canaries: gradient canary vectors must have d = {dim} columns ({where}), "
                f"got shape {tuple(c.vectors.shape)}"
            )
        norms = c.vectors.double().norm(dim=1)
        too_big = (norms > max_grad_norm * (1 + NORM_SLACK)).nonzero().flatten()
        if too_big.numel():
            raise ValueError(
                f"canaries: gradient canaries must have norm <= C = {max_grad_norm}; "
                f"canaries {too_big.tolist()} have norms {norms[too_big].tolist()}"
            )


class GradientInsertion:
    """Inclusion draws and insertion of the gradient canaries among ``canaries``.

    Args:
        canaries: the hook's canary list (input canaries get a False inclusion and no vector).
        view: the hook's coordinate view (canary vectors are in view coordinates).
    """

    def __init__(self, canaries: Sequence, view: CoordinateView) -> None:
        self.canaries = list(canaries)
        self.view = view
        self.num_canaries = sum(len(c) for c in self.canaries)
        self.active = any(isinstance(c, GradientCanaries) for c in self.canaries)
        self._fixed_row: np.ndarray | None = None
        self.vectors: list[torch.Tensor | None] = [None] * len(self.canaries)
        self._rngs: list[np.random.Generator | None] = [None] * len(self.canaries)

    def start(self, device: torch.device, dtype: torch.dtype) -> None:
        """Move the vectors to the model's device and dtype and seed the inclusion draws."""
        self.vectors = [
            c.vectors.to(device=device, dtype=dtype) if isinstance(c, GradientCanaries) else None
            for c in self.canaries
        ]
        self._always = [
            np.array(c.policies) == "every_step" if isinstance(c, GradientCanaries) else None
            for c in self.canaries
        ]
        fixed = [
            vec[torch.from_numpy(always).to(device)].sum(0)
            for vec, always in zip(self.vectors, self._always, strict=True)
            if vec is not None and always.any()
        ]
        self._every_step_sum = torch.stack(fixed).sum(0) if fixed else None
        self._rngs = [
            np.random.default_rng(c.seed)
            if isinstance(c, GradientCanaries) and "bernoulli" in c.policies
            else None
            for c in self.canaries
        ]
        if not any(self._rngs):
            self._fixed_row = self.draw()

    def draw(self) -> np.ndarray:
        """One (K,) bool row of inclusions for this step (input canaries: False)."""
        if self._fixed_row is not None:  # nothing random: the same row every step
            return self._fixed_row.copy()
        row = []
        for c, rng in zip(self.canaries, self._rngs, strict=True):
            if not isinstance(c, GradientCanaries):
                row.append(np.zeros(len(c), dtype=bool))
                continue
            pol = np.array(c.policies)
            inc = pol == "every_step"
            bern = pol == "bernoulli"
            if bern.any():
                inc[bern] = rng.random(int(bern.sum())) < float(c.inclusion_prob)
            row.append(inc)
        return np.concatenate(row)

    def included_sum(self, row: np.ndarray) -> torch.Tensor | None:
        """The (full_dim,) sum of the canaries included in ``row`` (None if none is)."""
        if not row.any():
            return None
        # every-step canaries: their fixed sum; Bernoulli ones: the rows drawn this step
        blocks = [] if self._every_step_sum is None else [self._every_step_sum]
        start = 0
        for c, vec, always in zip(self.canaries, self.vectors, self._always, strict=True):
            n = len(c)
            if vec is not None:
                mask = row[start : start + n] & ~always
                if mask.any():
                    idx = torch.from_numpy(np.flatnonzero(mask)).to(vec.device)
                    blocks.append(vec.index_select(0, idx).sum(0))
            start += n
        return self.view.scatter(torch.stack(blocks).sum(0))

    def insert(self, row: np.ndarray, step: int) -> None:
        """Add the canaries included in ``row`` to every selected ``p.summed_grad``."""
        total = self.included_sum(row)
        if total is None:
            return
        for p, a, b in self.view.slices():
            if p.summed_grad is None:
                raise RuntimeError(f"parameter has no summed_grad at step {step}")
            p.summed_grad.add_(total[a:b].view_as(p.summed_grad).to(p.summed_grad.dtype))
