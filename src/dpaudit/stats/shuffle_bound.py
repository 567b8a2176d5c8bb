"""A sound lower bound on the true epsilon of DP-SGD with shuffled fixed-size batches.

Opacus' accountants assume Poisson sampling. Real loaders often cut a random permutation of
the data into fixed-size batches, pass after pass, and report the Poisson epsilon: Chua et al.
(ICML 2024, "How Private are DP-SGD Implementations?") show that the true epsilon of shuffled
batches can be far larger. Their argument gives a lower bound from one pair of neighbouring
datasets, which this module computes in closed form:

* the neighbours differ in one example x (zeroing-out: x in one, a null example of gradient 0
  in the other; with Poisson sampling that is exactly removing x, so Opacus' claim covers the
  pair). Every other example's clipped gradient is -C on one direction, x's is +C (a linear
  loss makes the gradients constant, so the releases are not adaptive). Per pass of b batches,
  after the known -C B_t of each batch is added back and everything is divided by C, the
  release on that direction is P = (1/b) sum_t N(2 e_t, sigma^2 I_b) with x and
  Q = (1/b) sum_t N(e_t, sigma^2 I_b) with the null example: the batch holding the target is
  shifted, and which batch that is is uniform;
* the event E_C = {max_t y_t > C} has P(E_C) = 1 - Phi((C - 2)/sigma) Phi(C/sigma)^(b-1) and
  Q(E_C) = 1 - Phi((C - 1)/sigma) Phi(C/sigma)^(b-1); over E passes reshuffled independently,
  the event "at least k passes have max_t y_t > C" has binomial probabilities;
* every event A gives delta(eps) >= P(A) - e^eps Q(A) for the mechanism's true privacy curve,
  hence eps_true(delta) >= log((P(A) - delta) / Q(A)); the bound is the largest over a grid of
  C and every k.

It is a lower bound on the worst case over datasets (the accountant's claim is one too), with
no statistics: a closed form, valid whatever the training data. A pass here is one shuffle of
the whole data set; extra steps beyond the last full pass only add privacy loss, so counting
full passes keeps the bound valid.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr
from scipy.stats import binom

from dpaudit._validate import check_delta, check_positive

_C_POINTS = 4001


def _log_max_below(c: np.ndarray, shift: float, sigma: float, b: int) -> np.ndarray:
    """log P(max_t y_t <= c) for y = shift e_t + N(0, sigma^2 I_b), t uniform."""
    return log_ndtr((c - shift) / sigma) + (b - 1) * log_ndtr(c / sigma)


def shuffled_batches_epsilon_lower_bound(noise_multiplier: float, batches_per_pass: int,
                                         passes: int, delta: float) -> float:
    """The largest epsilon the cube events prove for shuffled fixed-size batches (module doc).

    Args:
        noise_multiplier: sigma (noise std sigma C for clip norm C).
        batches_per_pass: b, the batches of one shuffle of the data (ceil(n / batch size)).
        passes: E, the number of full passes (each a fresh shuffle).
        delta: the delta at which epsilon is bounded.

    Returns:
        A lower bound on the true epsilon at ``delta`` (0 when no event proves more).
    """
    sigma = check_positive(noise_multiplier, "noise_multiplier")
    delta = check_delta(delta)
    b, e = int(batches_per_pass), int(passes)
    if b < 1 or e < 1:
        raise ValueError(f"batches_per_pass and passes must be >= 1, got {b} and {e}")
    c = np.linspace(-4.0 * sigma, 2.0 + 12.0 * sigma, _C_POINTS)
    p_one = -np.expm1(_log_max_below(c, 2.0, sigma, b))  # P(E_C), target present
    q_one = -np.expm1(_log_max_below(c, 1.0, sigma, b))  # Q(E_C), null example
    best = 0.0
    for k in range(1, e + 1):
        p_a = binom.sf(k - 1, e, p_one)
        q_a = binom.sf(k - 1, e, q_one)
        ok = (p_a > delta) & (q_a > 0)
        if not ok.any():
            continue
        eps = np.log(p_a[ok] - delta) - np.log(q_a[ok])
        best = max(best, float(eps.max()))
    return best if math.isfinite(best) else 0.0
