"""Histograms of member / non-member scores on a shared binning (seed 002, Alg. 2, Sec. 4.4).

Bins: k bins with open outer bins, Bin_1 = (-inf, a + h), Bin_j = [a + (j-1)h, a + jh),
Bin_k = [b - h, inf) (the paper prints the first bin as (inf, a + h): a typo, DESIGN 4.5).
End points a, b are pooled-score quantiles (default 0.1% and 99.9%), so each outer bin holds
about 0.1% of the pooled scores. The width h comes from a rule, then k = ceil((b - a) / h) and
h is reset to (b - a) / k as in Alg. 2:

* ``"eq4.2"`` (default): h = 3.5 sigma_hat n^(-1/3), the rule of thumb under Eq. 4.2
  (2 * 3^(1/3) * pi^(1/6) ~ 3.49 is Eq. 4.2 for two equal-variance Gaussians). sigma_hat is
  the pooled within-group standard deviation, n the smaller group size.
* ``"eq4.1"``: h = (12 / (R(P') + R(Q')))^(1/3) n^(-1/3) (Theorem 4, Eq. 4.1) with the
  roughness R(f') = int f'(x)^2 dx estimated by a Gaussian-kernel plug-in (closed form
  -(1/N^2) sum_ij phi''_{sqrt2 g}(X_i - X_j), Silverman pilot bandwidth g) on at most 2,000
  evenly spaced order statistics of each side (deterministic, no random draw).

If the rule gives no usable width (e.g. constant scores within each group), k = 2 with the
edge at (a + b) / 2. ``n_bins`` fixes k directly, ``edges`` gives the interior edges
explicitly (data-independent bins).
"""

from __future__ import annotations

import numpy as np

from dpaudit._validate import check_scores, require_choice

BIN_RULES = ("eq4.2", "eq4.1")
_ROUGHNESS_POINTS = 2000


def _roughness_of_derivative(x: np.ndarray) -> float:
    """Gaussian-kernel plug-in estimate of R(f') = int f'(x)^2 dx for the density of ``x``."""
    xs = np.sort(x)
    if xs.size > _ROUGHNESS_POINTS:
        xs = xs[np.linspace(0, xs.size - 1, _ROUGHNESS_POINTS).round().astype(np.int64)]
    sd = float(np.std(xs))
    if sd == 0.0:
        return np.inf
    g = 1.06 * sd * xs.size ** (-0.2)
    s2 = 2.0 * g * g  # variance of K_g * K_g
    d = xs[:, None] - xs[None, :]
    phi = np.exp(-0.5 * d * d / s2) / np.sqrt(2.0 * np.pi * s2)
    second = phi * (d * d / (s2 * s2) - 1.0 / s2)
    return float(-np.mean(second))


def bin_width(scores_in: np.ndarray, scores_out: np.ndarray, rule: str = "eq4.2") -> float:
    """Histogram bin width h from ``rule`` ("eq4.2" or "eq4.1"); see the module docstring."""
    require_choice("bin_rule", rule, BIN_RULES)
    n = min(scores_in.size, scores_out.size)
    if rule == "eq4.2":
        sigma = np.sqrt(0.5 * (np.var(scores_in) + np.var(scores_out)))
        return float(3.5 * sigma * n ** (-1.0 / 3.0))
    rough = _roughness_of_derivative(scores_in) + _roughness_of_derivative(scores_out)
    if not np.isfinite(rough) or rough <= 0:
        return 0.0
    return float((12.0 / rough) ** (1.0 / 3.0) * n ** (-1.0 / 3.0))


def histogram_edges(
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    *,
    bin_rule: str = "eq4.2",
    n_bins: int | None = None,
    end_quantiles: tuple[float, float] = (0.001, 0.999),
    max_bins: int = 10_000,
) -> np.ndarray:
    """Interior bin edges (ascending, k - 1 of them for k bins) shared by both sides."""
    lo_q, hi_q = (float(v) for v in end_quantiles)
    if not 0.0 <= lo_q < hi_q <= 1.0:
        raise ValueError(f"end_quantiles must satisfy 0 <= lo < hi <= 1, got {end_quantiles!r}")
    pooled = np.concatenate([scores_in, scores_out])
    a, b = (float(v) for v in np.quantile(pooled, [lo_q, hi_q]))
    if b <= a:
        return np.array([a])
    if n_bins is not None:
        if int(n_bins) < 2:
            raise ValueError(f"n_bins must be an integer >= 2, got {n_bins!r}")
        k = int(n_bins)
    else:
        h = bin_width(scores_in, scores_out, bin_rule)
        k = int(np.ceil((b - a) / h)) if h > 0 and np.isfinite(h) else 2
        k = int(min(max(k, 2), max_bins))
    h = (b - a) / k
    return a + h * np.arange(1, k)


def histogram_counts(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts per bin for bins (-inf, e_1), [e_1, e_2), ..., [e_{k-1}, inf)."""
    idx = np.searchsorted(edges, scores, side="right")
    return np.bincount(idx, minlength=edges.size + 1)


def check_edges(edges) -> np.ndarray:
    """Validate user-supplied interior edges: finite, strictly increasing, at least one."""
    e = np.asarray(edges, dtype=np.float64).reshape(-1)
    if e.size == 0 or not np.all(np.isfinite(e)) or np.any(np.diff(e) <= 0):
        raise ValueError("edges must be a non-empty, finite, strictly increasing sequence")
    return e


def histograms(
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    *,
    bin_rule: str = "eq4.2",
    n_bins: int | None = None,
    end_quantiles: tuple[float, float] = (0.001, 0.999),
    edges=None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p_in, p_out, edges): relative bin frequencies of each side on a shared binning."""
    scores_in = check_scores(scores_in, "scores_in")
    scores_out = check_scores(scores_out, "scores_out")
    e = (
        check_edges(edges)
        if edges is not None
        else histogram_edges(
            scores_in, scores_out, bin_rule=bin_rule, n_bins=n_bins, end_quantiles=end_quantiles
        )
    )
    p = histogram_counts(scores_in, e) / scores_in.size
    q = histogram_counts(scores_out, e) / scores_out.size
    return p, q, e
