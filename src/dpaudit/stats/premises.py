"""Exact confidence intervals for the accountant's measurable premises (DESIGN 4.5, the user's
epsilon from both sides).

The white-box records measure two of the numbers the accountant composes:

* the noise's scale: the noise the optimizer added, in units of the claimed std sigma C of
  its step, has squared norm S over D coordinates (steps x tensors); with a true scale r
  times the claimed one, S / r^2 is chi-square with D degrees of freedom, so

      r^2 in [S / chi2_{1 - a/2}(D), S / chi2_{a/2}(D)]

  with probability 1 - a, exactly (``scale_interval``). The recovered noise carries rounding
  (each coordinate within ``rounding`` of the true noise), so the true norm lies within
  sqrt(sum d_t rounding_t^2) of the recovered one: the lower end uses the smallest norm, the
  upper the largest;
* the sampling rate: under Poisson sampling the batches of T steps hold Binomial(n T, q)
  examples in all, so the Clopper-Pearson interval of that count is exact
  (``rate_interval``).

Both are statements about the mechanism that ran, at the stated confidence, whatever its
parameters: valid, and as tight as the records allow (relative widths about 1 / sqrt(2 D)
and 1 / sqrt(n T q)). ``scale_lower`` and ``rate_upper`` are their one-sided ends, the least
favourable values an upper side on epsilon needs.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import beta, chi2

from dpaudit._validate import check_open_unit


def _alpha(confidence: float) -> float:
    return 1.0 - check_open_unit(confidence, "confidence")


def scale_lower(sum_sq: float, dof: float, confidence: float = 0.975,
                error: float = 0.0) -> float:
    """The exact one-sided lower confidence bound of the scale r: P[r >= it] >= confidence
    (the lower end of ``scale_interval`` at 2 confidence - 1)."""
    return scale_interval(sum_sq, dof, 2.0 * confidence - 1.0, error)[0]


def rate_upper(successes: int, trials: int, confidence: float = 0.975) -> float:
    """The exact one-sided Clopper-Pearson upper bound of a binomial rate: P[q <= it] >=
    confidence (the upper end of ``rate_interval`` at 2 confidence - 1)."""
    return rate_interval(successes, trials, 2.0 * confidence - 1.0)[1]


def scale_interval(sum_sq: float, dof: float, confidence: float = 0.95,
                   error: float = 0.0) -> tuple[float, float]:
    """The exact two-sided interval of a Gaussian noise's scale r (true std / claimed std).

    Args:
        sum_sq: the squared norm of the noise in units of the claimed std (> 0).
        dof: its number of coordinates D (> 0).
        confidence: the interval's coverage, in (0, 1).
        error: an upper bound on the Euclidean norm of the recovery error (the noise read is
            within ``error`` of the true noise, in the same units); 0 when exact.

    Returns:
        (lower, upper) ends for r.
    """
    s, d, e = float(sum_sq), float(dof), float(error)
    if not (np.isfinite(s) and s >= 0.0):
        raise ValueError(f"sum_sq must be a finite non-negative number, got {sum_sq!r}")
    if not (np.isfinite(d) and d > 0):
        raise ValueError(f"dof must be positive, got {dof!r}")
    if not (np.isfinite(e) and e >= 0.0):
        raise ValueError(f"error must be a finite non-negative number, got {error!r}")
    a = _alpha(confidence)
    norm = np.sqrt(s)
    lo = max(norm - e, 0.0) ** 2 / chi2.isf(a / 2, d)
    hi = (norm + e) ** 2 / chi2.ppf(a / 2, d)
    return float(np.sqrt(lo)), float(np.sqrt(hi))


def rate_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Clopper-Pearson two-sided interval of a binomial rate (exact, conservative).

    Args:
        successes: k, the examples drawn over all batches (0 <= k <= trials).
        trials: n T, the draws (> 0).
        confidence: the interval's coverage, in (0, 1).
    """
    k, n = int(successes), int(trials)
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {k} of {n}")
    a = _alpha(confidence)
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.isf(a / 2, k + 1, n - k))
    return lo, hi
