"""Covariance scores: seed 001 Algorithm 4 (fixed mu_0, P) and seed 000 Algorithm 7 (per step).

s_t = (g*_t - mu)^T P (g_t - mu) - ||g*_t - mu||_P^2 / (2b). On Gaussian gradients this is
exactly the log-likelihood ratio of "released mean contains g*_t" vs "does not" (DESIGN 4.3).
g_t is the released gradient as the optimizer sees it: seed 001 writes (theta_{t+1} -
theta_t)/eta, which has the opposite sign; we receive g_t directly, so no flip is needed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from dpaudit._validate import check_positive
from dpaudit.attacks.base import StepContext, StepScore
from dpaudit.covariance import (
    PrecisionOperator,
    estimate_precision,
    noise_aware,
    noise_ridge,
)


def covariance_llr(
    canary_grads: torch.Tensor,
    released: torch.Tensor,
    mean: torch.Tensor,
    precision: PrecisionOperator,
    batch_size: float,
) -> torch.Tensor:
    """(K,) values of (g* - mu)^T P (g - mu) - ||g* - mu||_P^2 / (2b).

    One projection per vector (``precision.quadratic_forms``): the K canaries and the
    released gradient each go through P's low-rank part once; the result is in the canary
    gradients' dtype.
    """
    b = check_positive(batch_size, "batch_size")
    apc, apa, _ = precision.quadratic_forms(canary_grads, released, mean)
    return (apc - apa / (2.0 * b)).to(canary_grads.dtype)


class FixedPrecisionScore(StepScore):
    """A score with a fixed reference estimator (mu_0, P) and an optional batch size b.

    ``batch_size=None`` uses the step's expected batch size. Shared by the covariance and GLiR
    scores, which differ only in the statistic they compute from (mu_0, P).
    """

    def __init__(self, precision: PrecisionOperator, batch_size: float | None = None):
        if not isinstance(precision, PrecisionOperator):
            raise ValueError("precision must be a dpaudit.covariance PrecisionOperator")
        self.precision = precision
        self.batch_size = None if batch_size is None else check_positive(batch_size, "batch_size")
        self._cache: tuple | None = None  # (weakref to g*, its version, prepare(g*))

    def start(self, num_canaries: int, dim: int, device: torch.device) -> None:
        if dim != self.precision.dim:
            raise ValueError(f"precision has d={self.precision.dim} but the canaries have d={dim}")

    def forms(
        self, canary_grads: torch.Tensor, released: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a^T P c, a^T P a, c^T P c), a = g* - mu_0, c = g - mu_0: one projection each.

        When the canary gradients are the previous step's tensor, unmodified (fixed gradient
        canaries), a's projections are reused, so the step costs one projection (of g) plus
        O(K d); no copy of the canary gradients is kept.
        """
        cache = self._cache
        if cache is not None and cache[0]() is canary_grads and cache[1] == canary_grads._version:
            prep = cache[2]
            return self.precision.forms(prep, canary_grads, released)
        prep, forms = self.precision.prepare_and_forms(canary_grads, released)
        self._cache = (weakref.ref(canary_grads), canary_grads._version, prep)
        return forms

    def step_batch_size(self, ctx: StepContext) -> float:
        """b for this step: the fixed one, or the step's expected batch size."""
        return check_positive(self.batch_size or ctx.divisor, "batch_size")


class CovarianceScore(FixedPrecisionScore):
    """Algorithm 4 with a fixed estimator (mu_0, P) for the window; summed over steps.

    ``precision`` is any ``dpaudit.covariance`` operator built from references at theta_0
    (its ``mean`` is mu_0); a noise-aware one (``noise_aware(op, sigma, C, b)``) matches
    DP-SGD. ``batch_size`` defaults to the step's expected batch size. When the canary
    gradients are the previous step's tensor (gradient canaries), their projections are reused,
    so the step costs one projection of the released gradient plus O(K d). Otherwise each
    step projects each canary and the released gradient once onto the reference span
    (``PrecisionOperator.quadratic_forms``): (K + 1) projections, no (K, d) lift.
    """

    name = "covariance"
    aggregate = "sum"

    def step(
        self, canary_grads: torch.Tensor, released: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        b = self.step_batch_size(ctx)
        apc, apa, _ = self.forms(canary_grads, released)
        return (apc - apa / (2.0 * b)).to(canary_grads.dtype)


class PerStepCovarianceScore(StepScore):
    """Seed 000 Algorithm 7: (mu_t, P_t) re-estimated at every step from reference gradients.

    The hook passes clipped reference gradients at the current parameters in
    ``ctx.reference_grads``. Normaliser 1/(2 q n) = 1/(2 B_exp). ``aggregate`` is "max" (as in
    Algorithm 7: "included in at least one step") or "sum". ``noise_aware`` adds the DP noise
    (sigma^2 C^2 / B_exp) I to the estimated covariance. ``estimator`` overrides the build
    (a callable G -> PrecisionOperator); otherwise ``estimate_precision(G, method, **kwargs)``.
    """

    name = "covariance_per_step"
    requires_reference_grads = True

    def __init__(
        self,
        aggregate: str = "max",
        method: str = "ledoit_wolf",
        noise_aware: bool = True,
        estimator: Callable[[torch.Tensor], PrecisionOperator] | None = None,
        **estimator_kwargs,
    ):
        if aggregate not in ("max", "sum"):
            raise ValueError(f"aggregate must be 'max' or 'sum', got {aggregate!r}")
        self.aggregate = aggregate
        self.method = method
        self.noise_aware = noise_aware
        self.estimator = estimator
        self.estimator_kwargs = estimator_kwargs

    def step(
        self, canary_grads: torch.Tensor, released: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        refs = ctx.reference_grads
        if refs is None:
            raise ValueError("PerStepCovarianceScore needs ctx.reference_grads (n_r, d)")
        b = ctx.divisor
        noisy = self.noise_aware and ctx.noise_multiplier > 0
        if self.estimator is not None:
            op = self.estimator(refs)
            if noisy:
                op = noise_aware(op, ctx.noise_multiplier, ctx.max_grad_norm, b)
        else:  # the noise's ridge in the estimate itself: never singular on equal references
            kwargs = dict(self.estimator_kwargs)
            if noisy:
                extra = noise_ridge(ctx.noise_multiplier, ctx.max_grad_norm, b)
                kwargs["ridge"] = kwargs.get("ridge", 0.0) + extra
            op = estimate_precision(refs, self.method, **kwargs)
        return covariance_llr(canary_grads, released, op.mean, op, b)
