"""Seed 000 Algorithm 6: canary ranks accumulated along a simulated DP-SGD trajectory.

A copy of the model is trained with plain DP-SGD on the non-auditing data (Poisson batches of
rate q, clipping C, Gaussian noise sigma C on the sum, learning rate eta). At every step the
batch's clipped gradients give (mu_t, P_t) (any ``dpaudit.covariance`` estimator; the paper uses
the uncentred second moment), every candidate's clipped gradient at theta_{t-1} is ranked by its
Mahalanobis distance (rank 0 = closest), and the ranks are summed. The m candidates with the
largest sums are the ones that stay far from the data along the whole trajectory.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpaudit._validate import check_nonnegative, check_positive
from dpaudit.covariance import estimate_precision
from dpaudit.gradients.persample import LossFn, per_sample_clipped_grads, unwrap_model


@dataclass
class TrajectoryRanking:
    """Summed ranks per candidate, the chosen indices (largest sums first), steps used."""

    rank_sum: np.ndarray
    selected: np.ndarray
    steps_used: int


def rank_along_trajectory(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    candidates: tuple[torch.Tensor, torch.Tensor],
    loss_fn: LossFn,
    *,
    num_canaries: int,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    max_grad_norm: float,
    lr: float,
    seed: int,
    method: str = "ledoit_wolf",
    **estimator_kwargs,
) -> TrajectoryRanking:
    """Algorithm 6 on a copy of ``model`` (the original is not modified); seeded."""
    if int(steps) < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    if not 0.0 < float(sample_rate) <= 1.0:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    sigma = check_nonnegative(noise_multiplier, "noise_multiplier")
    clip = check_positive(max_grad_norm, "max_grad_norm")
    eta = check_positive(lr, "lr")
    n_c = int(candidates[0].shape[0])
    if not 1 <= int(num_canaries) <= n_c:
        raise ValueError(f"num_canaries must be in [1, {n_c}], got {num_canaries!r}")
    sim = copy.deepcopy(unwrap_model(model))
    params = [p for p in sim.parameters() if p.requires_grad]
    device = params[0].device
    gen = torch.Generator(device=device).manual_seed(int(seed))
    x_tr, y_tr = train[0].to(device), train[1].to(device)
    rank_sum = np.zeros(n_c)
    used = 0
    for _ in range(int(steps)):
        mask = torch.rand(x_tr.shape[0], generator=gen, device=device) < float(sample_rate)
        if int(mask.sum()) < 2:  # no covariance from fewer than two gradients: skip the step
            continue
        batch = per_sample_clipped_grads(sim, x_tr[mask], y_tr[mask], loss_fn, clip)
        op = estimate_precision(batch, method, **estimator_kwargs)
        cand = per_sample_clipped_grads(sim, candidates[0], candidates[1], loss_fn, clip)
        dist = op.mahalanobis(cand - op.mean.to(cand.dtype)).double().cpu().numpy()
        rank_sum += np.argsort(np.argsort(dist, kind="stable"), kind="stable")
        used += 1
        noise = torch.randn(batch.shape[1], generator=gen, device=device, dtype=batch.dtype)
        update = batch.mean(0) + sigma * clip * noise / batch.shape[0]
        with torch.no_grad():
            offset = 0
            for p in params:
                p -= eta * update[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
    selected = np.argsort(-rank_sum, kind="stable")[: int(num_canaries)]
    return TrajectoryRanking(rank_sum, selected, used)
