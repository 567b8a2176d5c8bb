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

The noise's scale at the accountant's granularity (issue 65). A worst-case example puts its
whole clipped norm where the noise is smallest, so each step's privacy is that of its
smallest scale over the tensors: one pooled scale lets a small tensor's (or a few steps')
deficit be averaged away. The cells below bound each tensor's scale over runs of consecutive
steps:

* ``run_counts`` / ``run_edges``: how many runs each tensor's steps are cut into, from its
  size alone (before any data): a large tensor step by step, a small one over long runs, the
  smallest over every step;
* ``equal_width_alphas``: each unit's one-sided failure probability, chosen before the data
  so that every unit's lower end at its median sum is the same fraction 1 - w of the truth
  (the large tensors' units, tight anyway, need almost none of it), under the budget below;
* ``scale_lowers``: the cells' exact one-sided chi-square lower ends.

Why the budget is counted over units and atoms, not over every cell (a joint statement, not
Bonferroni over the cells): each tensor's scale is assumed constant within each of its runs.
Tensors cut into the same runs form a group; on each run of a group, the group's smallest
scale belongs to one tensor (fixed by the mechanism, not by the data), and the step's
smallest scale min_j r_j is one group's smallest. The lower end min_j lb_j exceeds it only if
that tensor's cell fails. So the cells that matter are at most one per unit (group, run), and
at most one per atom (the blocks between consecutive run edges of any tensor, on which every
scale is constant): P[some step's bound fails] <= the sum of the ``atoms`` largest of the
units' probabilities, every tensor of a unit getting the unit's (intersection-union: a bound
on a minimum needs no multiplicity over the tensors it is the minimum of). The small tensors,
bounded over the whole training, form one unit: each gets the whole of its probability.
Under per-layer clipping the step's scale combines every tensor's
(1 / r^2 = sum_g w_g / r_g^2), so every cell matters: each is its own unit, ``atoms=None``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaincc
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


def run_edges(steps: int, runs: int) -> np.ndarray:
    """The edges of ``runs`` consecutive runs of near-equal length over ``steps`` steps:
    round(i steps / runs) for i = 0..runs (run k is steps [edges[k], edges[k + 1])). Counts
    that divide one another (powers of two, and ``steps`` itself) give nested runs: every edge
    of the coarser is an edge of the finer (the same rational, rounded once)."""
    t, m = int(steps), int(runs)
    if t < 1 or not 1 <= m <= t:
        raise ValueError(f"need steps >= 1 and 1 <= runs <= steps, got steps={steps!r}, "
                         f"runs={runs!r}")
    return np.round(np.arange(m + 1, dtype=np.float64) * t / m).astype(np.int64)


def run_counts(dims, steps: int, min_draws: float) -> np.ndarray:
    """Per tensor, how many runs its steps are cut into, from its size alone: the largest of
    1, 2, 4, ... (then ``steps``: one run per step) whose shortest run still holds at least
    ``min_draws`` noise coordinates (d_j x its length). A tensor with fewer than
    ``min_draws`` coordinates over the whole training keeps one run (it has too few draws
    to bound its scale tightly; the caller names it)."""
    d = np.asarray(dims, dtype=np.float64).reshape(-1)
    t = int(steps)
    if t < 1 or d.size == 0 or np.any(~np.isfinite(d)) or np.any(d < 1):
        raise ValueError(f"need steps >= 1 and dims >= 1, got steps={steps!r}, dims={dims!r}")
    if not (np.isfinite(min_draws) and min_draws > 0):
        raise ValueError(f"min_draws must be positive, got {min_draws!r}")
    out = np.ones(d.size, dtype=np.int64)
    for j, dj in enumerate(d):
        m = 1
        while m < t:
            nxt = t if 2 * m >= t else 2 * m
            if dj * (t // nxt) < min_draws:
                break
            m = nxt
        out[j] = m
    return out


def _median_chi2(dof: np.ndarray) -> np.ndarray:
    return chi2.ppf(0.5, dof)


def equal_width_alphas(dofs, budget: float, atoms: int | None = None
                       ) -> tuple[np.ndarray, float]:
    """One-sided failure probabilities for cells of ``dofs`` degrees of freedom, chosen before
    the data: the same lower end 1 - w at every cell's median sum (a cell of D coordinates
    gets P[chi2(D) > median(D) / (1 - w)^2]), w the smallest for which the sum of the
    ``atoms`` largest probabilities (all of them when None) is at most ``budget`` (module
    doc). Returns (probabilities, w)."""
    d = np.asarray(dofs, dtype=np.float64).reshape(-1)
    if d.size == 0 or np.any(~np.isfinite(d)) or np.any(d <= 0):
        raise ValueError(f"dofs must be a non-empty array of positive numbers, got {dofs!r}")
    if not 0.0 < float(budget) < 1.0:
        raise ValueError(f"budget must lie in (0, 1), got {budget!r}")
    k = d.size if atoms is None else int(atoms)
    if not 1 <= k:
        raise ValueError(f"atoms must be a positive integer or None, got {atoms!r}")
    unique, counts = np.unique(d, return_counts=True)
    med = _median_chi2(unique)
    half = unique / 2.0

    def alphas(w: float) -> np.ndarray:
        # the lower end sqrt(S / chi2.isf(alpha, D)) is 1 - w at S = median(D) exactly when
        # alpha = P[chi2(D) > median / (1 - w)^2]
        return gammaincc(half, med / (1.0 - w) ** 2 / 2.0)

    def excess(w: float) -> float:
        a = alphas(w)
        order = np.argsort(-a)
        taken = np.minimum(np.cumsum(counts[order]), k)
        per = np.diff(taken, prepend=0)  # how many of each value are among the k largest
        return float(np.dot(a[order], per)) - float(budget)

    lo, hi = 0.0, 1.0 - 1e-12
    if excess(lo) <= 0:  # a budget of 1/2 or more per atom: every lower end at the median
        w = lo
    else:
        w = brentq(excess, lo, hi, xtol=1e-10)
        while excess(w) > 0:  # the root's rounding: never above the budget
            w = min(hi, w + 1e-10)
    per_unique = alphas(w)
    return per_unique[np.searchsorted(unique, d)], float(w)


def scale_lowers(sum_sq, dofs, alphas, errors=0.0) -> np.ndarray:
    """Exact one-sided lower ends of the scales of several cells: P[r_c >= it] >= 1 -
    alpha_c for each (``scale_lower`` at confidence 1 - alpha_c, vectorised). ``errors``:
    each cell's bound on the Euclidean norm of its recovery error (module doc)."""
    s = np.asarray(sum_sq, dtype=np.float64)
    d = np.broadcast_to(np.asarray(dofs, dtype=np.float64), s.shape)
    a = np.broadcast_to(np.asarray(alphas, dtype=np.float64), s.shape)
    e = np.broadcast_to(np.asarray(errors, dtype=np.float64), s.shape)
    if np.any(~np.isfinite(s)) or np.any(s < 0):
        raise ValueError("sum_sq must be finite and non-negative")
    if np.any(~np.isfinite(d)) or np.any(d <= 0):
        raise ValueError("dofs must be positive")
    if np.any(~(a > 0)) or np.any(~(a < 1)):
        raise ValueError("alphas must lie in (0, 1)")
    if np.any(~np.isfinite(e)) or np.any(e < 0):
        raise ValueError("errors must be finite and non-negative")
    norm = np.maximum(np.sqrt(s) - e, 0.0)
    return norm / np.sqrt(chi2.isf(a, d))
