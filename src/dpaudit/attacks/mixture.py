"""Per-step mixture likelihood ratio for gradient canaries inserted with probability q_c.

DESIGN 4.3: the noisy sum projected on the unit canary direction, in noise units,
u_t = <g*, sum_t> / (sigma C ||g*||) with sum_t = released * B_exp, is N(0, 1) without the
canary and N(Delta, 1) with it (other examples' gradients taken as negligible on that
direction), Delta = ||g*|| / (sigma C). The per-step Neyman-Pearson statistic of the mixture
(1 - q_c) N(0, 1) + q_c N(Delta, 1) vs N(0, 1) is
log LR_t = log(1 - q_c + q_c exp(Delta u_t - Delta^2 / 2)), computed with logaddexp; summed
over steps it is the exact log-LR of the whole run.
"""

from __future__ import annotations

import math

import torch

from dpaudit.attacks.base import StepContext, StepScore


def mixture_log_lr(u: torch.Tensor, delta: torch.Tensor, inclusion_prob: float) -> torch.Tensor:
    """log(1 - q + q exp(delta u - delta^2 / 2)), stable for any u (logaddexp)."""
    q = float(inclusion_prob)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"inclusion_prob must lie in (0, 1], got {inclusion_prob!r}")
    signal = math.log(q) + delta * u - 0.5 * delta * delta
    if q == 1.0:
        return signal
    return torch.logaddexp(torch.full_like(signal, math.log1p(-q)), signal)


class MixtureLR(StepScore):
    """Per-step mixture log-LR of fixed gradient canaries, summed over steps.

    ``inclusion_prob`` is q_c; ``None`` takes the step's sample rate (q_c = q mimics a real
    example). Needs DP noise (noise_multiplier > 0).
    """

    name = "mixture_lr"
    aggregate = "sum"

    def __init__(self, inclusion_prob: float | None = None):
        if inclusion_prob is not None and not 0.0 < float(inclusion_prob) <= 1.0:
            raise ValueError(f"inclusion_prob must lie in (0, 1], got {inclusion_prob!r}")
        self.inclusion_prob = inclusion_prob

    def step(
        self, canary_grads: torch.Tensor, released: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        if not ctx.noise_multiplier > 0:
            raise ValueError(f"MixtureLR needs noise_multiplier > 0, got {ctx.noise_multiplier!r}")
        q = ctx.sample_rate if self.inclusion_prob is None else self.inclusion_prob
        scale = ctx.noise_multiplier * ctx.max_grad_norm
        norms = canary_grads.norm(dim=1)
        if bool((norms == 0).any()):
            raise ValueError("canary_grads contains a zero vector: its direction is undefined")
        total = released.to(canary_grads.dtype) * ctx.divisor
        u = (canary_grads @ total) / (scale * norms)
        return mixture_log_lr(u, norms / scale, q)
