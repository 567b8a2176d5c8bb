"""Algorithm 3 (seed 001): Mahalanobis ranking of candidate canaries at theta_0, and selection.

m_k = ||g_k - mu_0||^2_P with (mu_0, P) from clipped reference gradients at theta_0 and any
``dpaudit.covariance`` estimator. Selection strategies: ``top`` (k highest), ``easy_medium_hard``
(highest / around the median / lowest), ``stratified`` (k at random within each of
``num_strata`` score-quantile bins) and ``in_distribution`` (the k highest below the
``cap_quantile`` quantile: moderate scores leak enough yet keep the model accurate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpaudit._validate import check_open_unit, check_scores, require_choice
from dpaudit.covariance import PrecisionOperator, estimate_precision
from dpaudit.gradients.persample import LossFn, per_sample_clipped_grads
from dpaudit.seeds import as_generator

STRATEGIES = ("top", "easy_medium_hard", "stratified", "in_distribution")


def mahalanobis_scores(grads: torch.Tensor, precision: PrecisionOperator) -> torch.Tensor:
    """(n_c,) squared Mahalanobis distances ||g_k - mu_0||_P^2 of candidate gradients."""
    return precision.mahalanobis(grads - precision.mean.to(grads.dtype))


@dataclass
class Ranking:
    """Output of Algorithm 3: candidates' scores, the estimator and (optionally) gradients."""

    scores: np.ndarray
    precision: PrecisionOperator
    candidate_grads: torch.Tensor | None


def rank_candidates(
    model: nn.Module,
    references: tuple[torch.Tensor, torch.Tensor],
    candidates: tuple[torch.Tensor, torch.Tensor],
    loss_fn: LossFn,
    max_grad_norm: float,
    method: str = "ledoit_wolf",
    param_names: list[str] | None = None,
    keep_grads: bool = True,
    **estimator_kwargs,
) -> Ranking:
    """Algorithm 3: clipped gradients at the model's current parameters, estimator, scores."""
    ref = per_sample_clipped_grads(
        model, references[0], references[1], loss_fn, max_grad_norm, param_names
    )
    op = estimate_precision(ref, method, **estimator_kwargs)
    del ref
    cand = per_sample_clipped_grads(
        model, candidates[0], candidates[1], loss_fn, max_grad_norm, param_names
    )
    scores = mahalanobis_scores(cand, op).double().cpu().numpy()
    return Ranking(scores, op, cand if keep_grads else None)


@dataclass
class Selection:
    """Chosen candidate positions, a label per choice (e.g. "easy") and their scores."""

    indices: np.ndarray
    labels: list[str]
    scores: np.ndarray

    def by_label(self) -> dict[str, np.ndarray]:
        """Indices grouped by label, in order of first appearance."""
        out: dict[str, list[int]] = {}
        for i, lab in zip(self.indices, self.labels, strict=True):
            out.setdefault(lab, []).append(int(i))
        return {k: np.asarray(v) for k, v in out.items()}


def select_canaries(
    scores,
    strategy: str = "top",
    k: int = 1,
    num_strata: int = 5,
    cap_quantile: float = 0.5,
    seed: int | np.random.Generator | None = None,
) -> Selection:
    """Choose canaries from candidate scores (higher = easier to detect); see module doc."""
    s = check_scores(scores, "scores")
    n = s.size
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    order = np.argsort(-s, kind="stable")  # highest first
    if strategy == "top":
        _need(n, k, strategy)
        idx, labels = order[:k], ["top"] * k
    elif strategy == "easy_medium_hard":
        _need(n, 3 * k, strategy)
        mid = n // 2 - k // 2
        asc = order[::-1]
        groups = {"easy": order[:k], "medium": asc[mid : mid + k], "hard": asc[:k]}
        idx = np.concatenate(list(groups.values()))
        labels = [lab for lab, g in groups.items() for _ in g]
    elif strategy == "stratified":
        if int(num_strata) != num_strata or num_strata < 1:
            raise ValueError(f"num_strata must be a positive integer, got {num_strata!r}")
        _need(n, k * num_strata, strategy)
        if seed is None:
            raise ValueError("stratified selection draws at random: pass seed")
        rng = as_generator(seed)
        asc = order[::-1]
        bins = np.array_split(asc, num_strata)  # equal-count score-quantile bins, low to high
        idx_parts, labels = [], []
        for j, b in enumerate(bins):
            if b.size < k:
                raise ValueError(f"stratum {j} has {b.size} candidates < k={k}")
            idx_parts.append(rng.choice(b, size=k, replace=False))
            labels += [f"stratum_{j}"] * k
        idx = np.concatenate(idx_parts)
    elif strategy == "in_distribution":
        q = check_open_unit(cap_quantile, "cap_quantile")
        cap = np.quantile(s, q)
        eligible = order[s[order] <= cap]
        if eligible.size < k:
            raise ValueError(f"only {eligible.size} candidates below the cap quantile {q}")
        idx, labels = eligible[:k], ["in_distribution"] * k
    else:
        require_choice("strategy", strategy, STRATEGIES)
    idx = np.asarray(idx, dtype=np.int64)
    return Selection(idx, list(labels), s[idx])


def _need(n: int, m: int, strategy: str) -> None:
    if n < m:
        raise ValueError(f"strategy {strategy!r} needs at least {m} candidates, got {n}")
