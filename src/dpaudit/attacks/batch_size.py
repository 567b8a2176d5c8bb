"""Batch-size score: what the released gradient's scale says about the realised batch size.

A correct DP optimizer divides the noisy sum by the *expected* batch size, so the released
gradient's norm carries no membership signal beyond the sum itself. An optimizer that divides
by the *realised* size (Opacus issue 571's leak class) releases (sum + N(0, s^2 C^2 I)) / |B_t|
whose norm is about sigma C sqrt(d) / |B_t| when the noise dominates: the estimate
sigma C sqrt(d) / ||g_t|| recovers |B_t|, and summed over steps it is larger, by about
q T, when the target is in the data set. All canaries get the same value: it is a
multi-run (fixed-target) attack.
"""

from __future__ import annotations

import math

import torch

from dpaudit.attacks.base import StepContext, StepScore


class BatchSizeScore(StepScore):
    """sigma C sqrt(d) / ||g_t||: an estimate of the batch size the optimizer divided by."""

    name = "batch_size"
    aggregate = "sum"

    def step(
        self, canary_grads: torch.Tensor, released: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        if not ctx.noise_multiplier > 0:
            raise ValueError("BatchSizeScore needs noise_multiplier > 0")
        norm = released.double().norm()
        scale = ctx.noise_multiplier * ctx.max_grad_norm * math.sqrt(released.numel())
        value = scale / norm.clamp_min(1e-300)
        return value.expand(canary_grads.shape[0]).to(canary_grads.dtype)
