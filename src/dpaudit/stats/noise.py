"""Certified tests of DP-SGD's noise from what a white-box auditor sees at every step.

DP-SGD's claim fixes the noise exactly: at every step t each coordinate of the released sum
(the released gradient times its divisor) is the clipped sum plus a fresh N(0, sigma^2 C^2)
draw, independent across coordinates and steps. Two tests follow, each with an exact null and
no assumption on the data:

* ``noise_floor_test``: per parameter tensor j of d_j coordinates and per step t, the statistic
  X_jt = ||released sum_jt||^2 / (sigma C)^2. Whatever the clipped sum S (fixed, or random but
  independent of the step's fresh noise, as any data gradient is), ||S + Z||^2 with
  Z ~ N(0, sigma^2 C^2 I_d) is stochastically at least ||Z||^2 (a non-central chi-square
  dominates the central one, Anderson's inequality), so P(X_jt <= chi2_{d_j}.ppf(a)) <= a.
  Summed over steps the same holds against chi2_{d_j T} (step by step, conditionally on the
  past). A release with too little noise on some tensor, on some step or on every step has
  X far below its chi-square floor. Too much noise is not a privacy bug and is not tested.
* ``noise_independence_test``: at coordinates no example touches ("dead" coordinates: the
  weights of pixels blank in every image, where the Dirac canaries sit), the released sum
  minus the known canary insertions is the noise itself: z_t ~ N(0, sigma^2 C^2 I_n),
  independent across steps. The cosine of two independent isotropic Gaussian vectors in R^n
  has the exact law (1 + cos) / 2 ~ Beta((n - 1) / 2, (n - 1) / 2), whatever sigma. Noise
  reused or correlated across steps gives cosines near the correlation; the test takes the
  largest |cosine| over every pair of steps, Bonferroni over the pairs, and the per-step
  floor ||z_t||^2 / (sigma C)^2 >= chi2_n.

Each test returns a ``stats.checks.CheckResult`` whose ``rejected`` holds at the given level;
the audit splits its failure probability over these tests and its other statements
(Bonferroni). The tests of the noise's law on what the optimizer really added (its marginal,
alignments within a step, freshness across steps) are in ``stats.noise_law``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betainc
from scipy.stats import chi2

from dpaudit._validate import check_open_unit, check_real_array
from dpaudit.stats.checks import STATISTICAL, CheckResult


def _check_stds(noise_std, steps: int) -> np.ndarray:
    """The claimed noise std per step, (T,) floats > 0, from one number or T of them."""
    s = check_real_array(noise_std, "noise_std").reshape(-1)
    if s.size == 1:
        s = np.full(steps, float(s[0]))
    if s.size != steps or np.any(s <= 0):
        raise ValueError(f"noise_std must be > 0, one number or {steps} (one per step)")
    return s


# scipy's regularized lower incomplete gamma P(a, y) (cephes' igam, scipy 1.17) uses its
# uniform asymptotic expansion for a > 200 only while |y - a| < 4.5 sqrt(a), and beyond that
# a power series cut at 2000 terms: in the lower tail (a chi-square more than 4.5 sd below its
# mean) of a large a, where the series needs about z sqrt(a) terms, it returns too small a
# value (df = 1e7 at 5 sd: 0.65% too small, 1e8: 22%, 1e9: 63%): an invalid p-value.
FAR_LOWER_TAIL = 4.5  # sd of the gamma (sqrt(a)) below which the power series below is used
SERIES_BLOCK = 4096  # terms summed at a time
SERIES_TOLERANCE = 1e-18  # relative: the series stops when a term is below this x its sum


def _log_gamma_lower(a: float, y: float) -> float:
    """log P(a, y) for 0 < y < a, accurate for any a: P(a, y) = y^a e^-y / Gamma(a + 1) S,
    S = sum_k prod_{i <= k} y / (a + i) (terms decreasing from 1, summed to full precision),
    the prefactor in Stirling's form -a (l - 1 - log l) - log(2 pi a) / 2 - r(a) with l = y / a
    and r(a) = log Gamma(a) - Stirling's (its series: a > 200 here), no cancellation."""
    lam = y / a
    dl = lam - 1.0
    log_pre = (-a * (dl - np.log1p(dl)) - 0.5 * np.log(2.0 * np.pi * a)
               - (1.0 / (12.0 * a) - 1.0 / (360.0 * a**3) + 1.0 / (1260.0 * a**5)))
    log_lam = np.log(lam)
    total, log_t, start = 1.0, 0.0, 1  # the k = 0 term
    while True:
        i = np.arange(start, start + SERIES_BLOCK, dtype=np.float64)
        logs = log_t + np.cumsum(log_lam - np.log1p(i / a))  # log of each term
        total += float(np.exp(logs).sum())
        log_t, start = float(logs[-1]), start + SERIES_BLOCK
        if log_t < np.log(SERIES_TOLERANCE * total):
            return float(log_pre + np.log(total))


def _log_chi2_cdf(x: np.ndarray, df: np.ndarray) -> np.ndarray:
    """log P(chi2_df <= x), elementwise: scipy's, except in the far lower tail of a large df
    (``FAR_LOWER_TAIL``), where scipy's is too small, by ``_log_gamma_lower``."""
    x, df = np.broadcast_arrays(np.asarray(x, dtype=np.float64),
                                np.asarray(df, dtype=np.float64))
    with np.errstate(divide="ignore"):
        out = np.array(chi2.logcdf(x, df), dtype=np.float64)
    a, y = df / 2.0, x / 2.0
    far = (a > 200) & (y > 0) & (a - y >= FAR_LOWER_TAIL * np.sqrt(a))
    for k in np.flatnonzero(far):
        out.flat[k] = _log_gamma_lower(float(a.flat[k]), float(y.flat[k]))
    return out


FLOOR_STATEMENT = (
    "every parameter tensor carries at least the claimed noise N(0, (sigma C)^2) per "
    "coordinate at every step (chi-square floor of the released gradient's norm)"
)


def noise_floor_test(
    squared_norms,
    dims,
    noise_std: float,
    *,
    level: float,
    names=None,
    scale_rounding=0.0,
) -> CheckResult:
    """Is there as much noise as claimed on every tensor, at every step? (module doc)

    Args:
        squared_norms: (J, T) squared norms of the released SUM (released gradient times its
            divisor) per parameter tensor j and step t.
        dims: (J,) number of coordinates of each tensor.
        noise_std: the claimed per-coordinate noise std sigma C (> 0): one number, or (T,)
            one per step.
        level: the test's error probability (its Bonferroni share); split evenly over the
            J x T step cells and the J whole-run sums.
        names: optional J tensor names for the report.
        scale_rounding: relative, in [0, 1), one number or (T,): how far below the claimed
            scale arithmetic alone may leave the released sum's norm (``chi2_floor``); 0 for
            exact arithmetic.

    Returns:
        A ``CheckResult``: rejected when some cell's chi-square lower-tail p-value, times the
        number of cells, is below ``level``; ``witness`` names the tensor and step (or
        "all steps") and the ratio observed / expected (noise std relative to the claim).
    """
    return chi2_floor(squared_norms, dims, noise_std, level=level, names=names,
                      name="noise_floor", statement=FLOOR_STATEMENT,
                      scale_rounding=scale_rounding)


def chi2_floor(squared_norms, dims, noise_std, *, level: float, names, name: str,
               statement: str, scale_rounding=0.0) -> CheckResult:
    """The chi-square floor of per-tensor, per-step squared norms (``noise_floor_test``'s
    arguments), as the check ``name`` stating ``statement``: each (tensor, step) cell and each
    tensor's sum over the run against chi2 of d (d T) degrees of freedom, Bonferroni over the
    J T + J cells.

    ``scale_rounding`` rho (one number or (T,), in [0, 1)) is what arithmetic alone may take
    off the norms relative to the claimed scale: the cells are tested at x / (1 - rho)^2 (the
    largest norm at the claimed scale consistent with x). torch's CPU generator draws a
    float32 tensor of 16 coordinates or more with its std cast to float32, up to half an ulp
    below a claimed sigma C that float32 does not represent, and the release is rounded
    again; the witness's ratio is the observed one, x itself."""
    x = check_real_array(squared_norms, "squared_norms")
    if x.ndim != 2 or x.size == 0 or np.any(x < 0):
        raise ValueError(f"squared_norms must be a non-empty (J, T) array >= 0, got {x.shape}")
    d = check_real_array(dims, "dims").reshape(-1)
    if d.size != x.shape[0] or np.any(d < 1) or np.any(d != np.round(d)):
        raise ValueError(f"dims must be {x.shape[0]} positive integers, got {dims!r}")
    s = _check_stds(noise_std, x.shape[1])
    rho = check_real_array(scale_rounding, "scale_rounding").reshape(-1)
    if rho.size == 1:
        rho = np.full(x.shape[1], float(rho[0]))
    if rho.size != x.shape[1] or np.any(rho < 0) or np.any(rho >= 1):
        raise ValueError(f"scale_rounding must be in [0, 1), one number or {x.shape[1]} (one "
                         f"per step), got {scale_rounding!r}")
    level = check_open_unit(level, "level")
    j_n, t_n = x.shape
    names = [f"tensor {j}" for j in range(j_n)] if names is None else [str(n) for n in names]
    z = x / (s * s)[None, :]  # observed / claimed variance, per coordinate
    tested = z / ((1.0 - rho) ** 2)[None, :]  # the largest one arithmetic allows
    cells = j_n * t_n + j_n
    log_p_step = _log_chi2_cdf(tested, d[:, None])  # (J, T)
    log_p_sum = _log_chi2_cdf(tested.sum(axis=1), d * t_n)  # (J,)
    log_adj = np.log(cells)
    j_s, t_s = np.unravel_index(int(np.argmin(log_p_step)), log_p_step.shape)
    j_a = int(np.argmin(log_p_sum))
    step_min, sum_min = float(log_p_step[j_s, t_s]), float(log_p_sum[j_a])
    if step_min <= sum_min:
        log_p, witness = step_min, {
            "tensor": names[j_s],
            "step": int(t_s),
            "noise_ratio": float(np.sqrt(z[j_s, t_s] / d[j_s])),
        }
    else:
        log_p, witness = sum_min, {
            "tensor": names[j_a],
            "step": "all",
            "noise_ratio": float(np.sqrt(z[j_a].sum() / (d[j_a] * t_n))),
        }
    p = float(min(1.0, np.exp(log_p + log_adj)))
    ratio = np.sqrt(z / d[:, None])  # observed / claimed noise std per cell (>= 1 - o(1))
    per_tensor = {
        names[j]: {
            "dim": int(d[j]),
            "min_step_ratio": float(ratio[j].min()),
            "run_ratio": float(np.sqrt(z[j].sum() / (d[j] * t_n))),
            "log10_p_min": float(min(log_p_step[j].min(), log_p_sum[j]) / np.log(10)),
        }
        for j in range(j_n)
    }
    return CheckResult(
        name=name,
        kind=STATISTICAL,
        rejected=bool(np.log(level) > log_p + log_adj),
        p_value=p,
        level=level,
        statement=statement,
        witness=witness,
        checked=[f"{n} (d={int(dd)}) x {t_n} steps" for n, dd in zip(names, d, strict=True)],
        details={
            "cells": cells,
            "tensors": per_tensor,
            "ratio_per_step": np.round(ratio, 4).tolist(),  # (J, T): for the report's plot
        },
    )


def _log_cos_tail(c: np.ndarray, n: int) -> np.ndarray:
    """log P(cos >= c) for two independent isotropic vectors in R^n (n >= 2)."""
    a = (n - 1) / 2.0
    x = np.clip((1.0 + c) / 2.0, 0.0, 1.0)
    with np.errstate(divide="ignore"):
        return np.log(betainc(a, a, 1.0 - x))  # P(Beta(a, a) >= x) = I_{1-x}(a, a)


def noise_independence_test(
    noise,
    noise_std: float,
    *,
    level: float,
    where: str = "dead coordinates",
) -> CheckResult:
    """Is the noise at coordinates no example touches fresh at every step? (module doc)

    Args:
        noise: (n, T) the released sum at n dead coordinates over T steps, minus the canaries
            inserted there (n >= 3, T >= 2): under the claim, i.i.d. N(0, (sigma C)^2).
        noise_std: the claimed per-coordinate noise std sigma C (one number, or one per step).
        level: the test's error probability, split over the T (T - 1) / 2 pairs of steps (two
            one-sided tails each) and the T per-step floors.
        where: what the coordinates are, for the report.

    Returns:
        A ``CheckResult``; ``witness`` is the pair of steps with the largest |cosine| (or the
        step with too little noise) and ``details`` the largest |cosine| between distinct
        steps and its null standard deviation 1 / sqrt(n).
    """
    u = check_real_array(noise, "noise")
    if u.ndim != 2 or u.shape[0] < 3 or u.shape[1] < 2:
        raise ValueError(f"noise must be an (n >= 3, T >= 2) array, got shape {u.shape}")
    level = check_open_unit(level, "level")
    n, t_n = u.shape
    s = _check_stds(noise_std, t_n)
    sq = (u * u).sum(axis=0)
    norms = np.sqrt(sq)
    unit = u / np.where(norms > 0, norms, 1.0)
    gram = unit.T @ unit
    iu = np.triu_indices(t_n, k=1)
    cos = gram[iu]
    pairs = cos.size
    tests = 2 * pairs + t_n  # both tails of every pair, and every step's floor
    log_pair = _log_cos_tail(np.abs(cos), n)  # one tail at |cos|: x2 by the count above
    k = int(np.argmin(log_pair))
    log_floor = _log_chi2_cdf(sq / (s * s), np.full(t_n, float(n)))
    t_f = int(np.argmin(log_floor))
    zero = norms == 0
    if log_floor[t_f] < log_pair[k] or zero.any():
        t_f = int(np.argmax(zero)) if zero.any() else t_f
        log_p, witness = float(log_floor[t_f]), {
            "step": t_f,
            "noise_ratio": float(np.sqrt(sq[t_f] / (n * s[t_f] ** 2))),
        }
    else:
        log_p, witness = float(log_pair[k]), {
            "steps": [int(iu[0][k]), int(iu[1][k])],
            "cosine": float(cos[k]),
        }
    log_adj = np.log(tests)
    return CheckResult(
        name="noise_independence",
        kind=STATISTICAL,
        rejected=bool(np.log(level) > log_p + log_adj),
        p_value=float(min(1.0, np.exp(log_p + log_adj))),
        level=level,
        statement=(
            "the noise at coordinates no example touches is fresh at every step: no two steps' "
            "noise vectors are correlated and no step has less than the claimed noise"
        ),
        witness=witness,
        checked=[f"{n} {where} x {t_n} steps ({pairs} pairs of steps)"],
        details={
            "max_abs_cosine": float(np.max(np.abs(cos))),
            "null_sd": float(1.0 / np.sqrt(n)),
            "mean_cosine_lag1": float(np.mean(np.diag(gram, 1))),
            "cosine_lag1": np.round(np.diag(gram, 1), 4).tolist(),  # for the report's plot
            "tests": tests,
        },
    )
