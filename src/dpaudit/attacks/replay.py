"""Offline scoring of recorded per-step data with any ``StepScore`` (same code as live capture).

``score_trace`` replays T steps: released gradients (T, d), canary gradients either fixed
(K, d), per step (T, K, d), or a callable t -> (K, d), and a ``StepContext`` (or a callable
t -> StepContext, e.g. to supply reference gradients at theta_t). It returns the aggregated
(K,) scores and, on request, the (K, T) per-step values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from dpaudit.attacks.base import StepContext, StepScore


def aggregate_steps(per_step: torch.Tensor, how: str) -> torch.Tensor:
    """Combine a (K, T) table of step scores: "sum" or "max" over steps."""
    if how == "sum":
        return per_step.sum(1)
    if how == "max":
        return per_step.max(1).values
    raise ValueError(f"aggregate must be 'sum' or 'max', got {how!r}")


def score_trace(
    score: StepScore,
    canary_grads: torch.Tensor | Callable[[int], torch.Tensor],
    released_trace: torch.Tensor | Sequence[torch.Tensor],
    ctx_fn: StepContext | Callable[[int], StepContext],
    per_step: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Replay a recorded run through ``score``; returns (K,) (and (K, T) if ``per_step``)."""
    num_steps = len(released_trace)
    if num_steps == 0:
        raise ValueError("released_trace is empty: expected at least one step")

    def grads_at(t: int) -> torch.Tensor:
        if callable(canary_grads):
            return canary_grads(t)
        if canary_grads.ndim == 3:
            if canary_grads.shape[0] != num_steps:
                raise ValueError(
                    f"canary_grads has {canary_grads.shape[0]} steps, released_trace {num_steps}"
                )
            return canary_grads[t]
        if canary_grads.ndim != 2:
            raise ValueError("canary_grads must be (K, d), (T, K, d) or a callable")
        return canary_grads

    def ctx_at(t: int) -> StepContext:
        if callable(ctx_fn):
            return ctx_fn(t)
        return dataclasses.replace(ctx_fn, step=t)

    first = grads_at(0)
    score.start(first.shape[0], first.shape[1], first.device)
    cols = []
    for t in range(num_steps):
        g = first if t == 0 else grads_at(t)
        cols.append(score.step(g, released_trace[t], ctx_at(t)))
    table = torch.stack(cols, 1)
    agg = aggregate_steps(table, score.aggregate)
    return (agg, table) if per_step else agg
