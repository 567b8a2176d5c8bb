"""Predicted leakage of chosen canaries under DP-SGD noise (DESIGN 4.2-4.4).

With the noise-aware covariance Sigma = C_0 + (sigma^2 C_clip^2 / b) I, one step in which the
canary is in the batch is a Gaussian test with separation mu_step = sqrt(m~),
m~ = ||g* - mu_0||^2_{Sigma^{-1}} / b. Composing the steps in which it participates gives
mu = sqrt(n_incl) mu_step (``gdp_compose``) and epsilon(delta) (``gdp_epsilon``): the best
any attack can do if the gradients were Gaussian and fixed at theta_0. The epoch-summed
covariance score of Algorithm 4 over T steps with n_incl inclusions separates in from out by
n_incl sqrt(m~ / T) (noise from all T steps, signal from n_incl), which is what a measured
ROC of that attack should be compared with.

That prediction takes the estimated covariance for the data's: where the estimate is poor
(d >> n references) the attack's direction a = Sigma^-1 (g* - mu_0) can have far more variance
than the estimate says. ``heldout_grads`` (clipped gradients of points that are neither
references nor canaries) measure it: the separation becomes a^T (g* - mu_0) over the held-out
standard deviation of a^T g plus the noise's, ``mu * sqrt(q / v)`` with q = ||g* - mu_0||^2_P
and v = a^T (Sigma_heldout + sigma^2 C^2 / b I) a.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dpaudit._validate import check_open_unit, check_positive
from dpaudit.covariance import PrecisionOperator, noise_aware, noise_ridge
from dpaudit.stats import gdp_auc, gdp_compose, gdp_epsilon


@dataclass
class PredictedLeakage:
    """Per-canary predictions; arrays of shape (K,)."""

    m_tilde: np.ndarray
    mu_step: np.ndarray
    mu_composed: np.ndarray
    epsilon: np.ndarray
    auc_composed: np.ndarray
    mu_summed_score: np.ndarray | None
    auc_summed_score: np.ndarray | None
    heldout_ratio: np.ndarray | None = None  # sqrt(q / v): held-out over estimated separation
    auc_summed_score_heldout: np.ndarray | None = None

    def as_dict(self) -> dict:
        """Plain lists, for JSON reports."""
        return {k: (None if v is None else np.asarray(v).tolist()) for k, v in vars(self).items()}


def predicted_leakage(
    canary_grads: torch.Tensor,
    precision: PrecisionOperator,
    noise_multiplier: float,
    max_grad_norm: float,
    batch_size: float,
    inclusions: int = 1,
    delta: float = 1e-5,
    total_steps: int | None = None,
    add_noise: bool = True,
    heldout_grads: torch.Tensor | None = None,
) -> PredictedLeakage:
    """Predictions for canaries with clipped gradients ``canary_grads`` (K, d) at theta_0.

    ``precision`` is the reference estimator (without noise); ``add_noise`` applies the DP-SGD
    shift. ``inclusions`` is the number of steps the canary is in; ``total_steps`` (if given)
    adds the prediction for the epoch-summed covariance score. ``heldout_grads`` (n, d), n >= 2
    clipped gradients of data that are neither references nor canaries, adds the same
    prediction with the variance along each attack direction measured on them
    (``heldout_ratio``, ``auc_summed_score_heldout``; needs ``total_steps``).
    """
    b = check_positive(batch_size, "batch_size")
    delta = check_open_unit(delta, "delta")
    if int(inclusions) != inclusions or inclusions < 1:
        raise ValueError(f"inclusions must be a positive integer, got {inclusions!r}")
    op = noise_aware(precision, noise_multiplier, max_grad_norm, b) if add_noise else precision
    diff = canary_grads - op.mean.to(canary_grads.dtype)
    m = op.mahalanobis(diff).double().cpu().numpy() / b
    mu_step = np.sqrt(np.maximum(m, 0.0))
    mu_comp = np.array([gdp_compose([u] * int(inclusions)) for u in mu_step])
    eps = np.array([gdp_epsilon(u, delta) if u > 0 else 0.0 for u in mu_comp])
    auc_comp = np.array([gdp_auc(u) for u in mu_comp])
    mu_sum = auc_sum = None
    if total_steps is not None:
        if int(total_steps) < int(inclusions):
            raise ValueError(f"total_steps must be >= inclusions, got {total_steps!r}")
        mu_sum = int(inclusions) * np.sqrt(np.maximum(m, 0.0) / int(total_steps))
        auc_sum = np.array([gdp_auc(u) for u in mu_sum])
    ratio = auc_held = None
    if heldout_grads is not None:
        if mu_sum is None or heldout_grads.ndim != 2 or heldout_grads.shape[0] < 2:
            raise ValueError(
                "heldout_grads must be (n >= 2, d) gradients and needs total_steps, got "
                f"shape {tuple(heldout_grads.shape)}, total_steps={total_steps!r}"
            )
        noise_var = noise_ridge(noise_multiplier, max_grad_norm, b) if add_noise else 0.0
        ratio = heldout_ratio(diff, op, heldout_grads, noise_var)
        auc_held = np.array([gdp_auc(u) for u in mu_sum * ratio])
    return PredictedLeakage(m, mu_step, mu_comp, eps, auc_comp, mu_sum, auc_sum, ratio, auc_held)


def heldout_ratio(
    diff: torch.Tensor, op: PrecisionOperator, heldout: torch.Tensor, noise_var: float
) -> np.ndarray:
    """sqrt(q / v) per row of ``diff`` (K, d): q = diff^T P diff (the variance the estimate
    gives the attack direction a = P diff), v = a's variance over the ``heldout`` rows plus
    ``noise_var`` ||a||^2 (what it has). 1 when the estimate is the held-out covariance."""
    a = op.apply(diff.to(op.mean.dtype)).double()
    q = (diff.double() * a).sum(1)
    proj = heldout.to(a.device, a.dtype) @ a.T  # (n, K)
    v = proj.var(0) + float(noise_var) * (a * a).sum(1)
    ratio = torch.where(v > 0, torch.clamp(q, min=0.0) / v, torch.ones_like(v))
    return torch.sqrt(ratio).cpu().numpy()
