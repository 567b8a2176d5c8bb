"""Histogram privacy-loss distributions and their c-fold composition (seed 002, Eq. 9.1).

THIS IS AN ESTIMATE, NOT A BOUND: no confidence statement is attached (the paper calls the
white-box composition heuristic). From the shared-bin histograms P_hat (members) and Q_hat
(non-members), the PLD omega_{P/Q} puts mass p_j on log(p_j / q_j) (and omega_{Q/P} mass q_j
on log(q_j / p_j)). Composing c independent steps convolves the PLD c times; then

    delta_tilde(eps) = max( E_{s ~ omega_{P/Q}^c}[1 - e^(eps - s)]_+ ,
                            E_{s ~ omega_{Q/P}^c}[1 - e^(eps - s)]_+ ).

Numerics (after Koskela et al. 2021): each privacy loss is rounded UP to a grid of step
``grid_step`` (so the result over-estimates the composed profile of the histogram pair by at
most a shift of c * grid_step in eps), and the c-fold convolution is one real FFT raised to the
power c, zero-padded so nothing wraps around.

Policy for bins where one side is empty (``empty_bins``):

* ``"merge"`` (default): adjacent bins are merged left to right until every merged bin has
  both counts positive (a left-over tail joins the last merged bin). Merging is a
  post-processing of the histogram, so the result is still the histogram of the same
  samples, just coarser. Why default: for smooth score distributions (DP-SGD scores) a
  one-sided empty bin is a sampling artefact of the tails; treating it as an infinite loss
  adds about c times its mass (>= c / n) to delta at EVERY eps, which swamps small delta targets.
* ``"infinite"``: the exact PLD of the empirical pair. Bins with p_j > 0 = q_j form an
  "infinite privacy loss" atom of mass p_inf; it survives composition with mass
  1 - (1 - p_inf)^c and contributes that to delta directly (1 - e^(eps - inf) = 1). Use it
  when disjoint supports are plausible (e.g. a broken mechanism).
"""

from __future__ import annotations

import numpy as np
from scipy.fft import irfft, next_fast_len, rfft

from dpaudit._validate import check_open_unit, check_positive, check_scores, require_choice
from dpaudit.stats.histogram import histograms

EMPTY_BIN_POLICIES = ("merge", "infinite")


def merge_empty_bins(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge adjacent bins until each has p > 0 and q > 0 (the ``"merge"`` policy)."""
    out_p, out_q = [], []
    acc_p = acc_q = 0.0
    for pj, qj in zip(p, q, strict=True):
        acc_p += pj
        acc_q += qj
        if acc_p > 0 and acc_q > 0:
            out_p.append(acc_p)
            out_q.append(acc_q)
            acc_p = acc_q = 0.0
    if acc_p > 0 or acc_q > 0:
        if out_p:
            out_p[-1] += acc_p
            out_q[-1] += acc_q
        else:  # one side has no mass at all: cannot happen for two probability vectors
            out_p.append(acc_p)
            out_q.append(acc_q)
    return np.asarray(out_p), np.asarray(out_q)


def _compose(a: np.ndarray, b: np.ndarray, steps: int, grid_step: float):
    """omega_{A/B}^steps on the grid: (loss values, masses, mass of the infinite atom)."""
    finite = (a > 0) & (b > 0)
    p_inf = float(np.sum(a[(a > 0) & (b == 0)]))
    mass = a[finite]
    loss = np.log(mass) - np.log(b[finite])
    idx = np.ceil(loss / grid_step - 1e-9).astype(np.int64)  # round up: pessimistic
    lo = int(idx.min())
    single = np.bincount(idx - lo, weights=mass)
    n_out = steps * (single.size - 1) + 1
    size = next_fast_len(n_out, real=True)
    composed = np.maximum(irfft(rfft(single, size) ** steps, size)[:n_out], 0.0)
    keep = composed > 0
    s = (steps * lo + np.arange(n_out)[keep]) * grid_step
    return s, composed[keep], 1.0 - (1.0 - p_inf) ** steps


def _profile(composed, eps: np.ndarray) -> np.ndarray:
    """E_{s ~ omega^c}[1 - e^(eps - s)]_+ plus the infinite atom, for an array of eps."""
    s, w, atom = composed
    e = np.asarray(eps, dtype=np.float64)[..., None]
    return np.sum(w * np.maximum(-np.expm1(e - s), 0.0), axis=-1) + atom


def _prepare(scores_in, scores_out, steps, grid_step, empty_bins, bin_options):
    s_in = check_scores(scores_in, "scores_in")
    s_out = check_scores(scores_out, "scores_out")
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    check_positive(grid_step, "grid_step")
    require_choice("empty_bins", empty_bins, EMPTY_BIN_POLICIES)
    p, q, _ = histograms(s_in, s_out, **bin_options)
    if empty_bins == "merge":
        p, q = merge_empty_bins(p, q)
    steps = int(steps)
    return _compose(p, q, steps, grid_step), _compose(q, p, steps, grid_step)


def histogram_pld_profile(
    scores_in,
    scores_out,
    epsilons,
    *,
    steps: int,
    grid_step: float = 1e-3,
    empty_bins: str = "merge",
    **bin_options,
) -> np.ndarray:
    """ESTIMATED delta(eps) of the ``steps``-fold composition (Eq. 9.1); not a bound.

    ``bin_options`` go to ``histogram.histograms`` (bin_rule, n_bins, end_quantiles, edges).
    """
    eps = np.asarray(epsilons, dtype=np.float64)
    if not np.all(np.isfinite(eps)):
        raise ValueError("epsilons must be finite")
    pq, qp = _prepare(scores_in, scores_out, steps, grid_step, empty_bins, bin_options)
    return np.maximum(_profile(pq, eps), _profile(qp, eps))


def histogram_pld_epsilon(
    scores_in,
    scores_out,
    *,
    delta: float,
    steps: int,
    grid_step: float = 1e-3,
    empty_bins: str = "merge",
    **bin_options,
) -> float:
    """ESTIMATED smallest eps with delta_tilde(eps) <= delta after ``steps`` compositions.

    Returns +inf when the infinite-loss atom alone exceeds ``delta`` (``"infinite"`` policy).
    """
    delta = check_open_unit(delta, "delta")
    pq, qp = _prepare(scores_in, scores_out, steps, grid_step, empty_bins, bin_options)

    def tail(composed, x: float):  # only losses above x contribute to delta(x)
        s, w, atom = composed
        i = int(np.searchsorted(s, x, side="right"))
        return s[i:], w[i:], atom

    def prof(x: float) -> float:
        return float(max(_profile(tail(pq, x), np.array(x)), _profile(tail(qp, x), np.array(x))))

    if prof(0.0) <= delta:
        return 0.0
    hi = 1.0
    while prof(hi) > delta:
        hi *= 2.0
        if hi > 1e4:
            return float("inf")
    lo = 0.0
    while hi - lo > 1e-9 * max(1.0, hi):  # far below the grid's rounding (grid_step)
        mid = 0.5 * (lo + hi)
        if prof(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi
