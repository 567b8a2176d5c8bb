"""Scalar-product score (Dwork et al.; Nasr et al. 2021): s_t = <g*_t, g_t>."""

from __future__ import annotations

import torch

from dpaudit.attacks.base import StepContext, StepScore


class ScalarProduct(StepScore):
    """Inner product of each canary gradient with the released gradient, summed over steps."""

    name = "scalar"

    def step(
        self, canary_grads: torch.Tensor, released: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        return canary_grads @ released
