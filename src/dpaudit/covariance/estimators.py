"""Estimators (mu_0, P) from reference gradients G (n_r x d), shared by canaries and attacks.

All work on G's device. The mean is accumulated in float64. ``centred=True`` (default) uses the
empirical covariance (1/n) sum (g - mu)(g - mu)^T; ``centred=False`` the papers' uncentred
second moment (1/n) sum g g^T (seed 001 Algorithm 3, seed 000 Algorithm 7). Shrinkage
intensities follow Ledoit & Wolf (2004) and Chen et al. (2010, OAS) as computed by scikit-learn,
but from the n x n Gram matrix, so they cost O(n^2 d) and never form d x d.
"""

from __future__ import annotations

import torch

from dpaudit._validate import check_nonnegative, check_positive, require_choice
from dpaudit.covariance.operators import (
    DENSE_MAX_DIM,
    DensePrecision,
    DiagonalPrecision,
    LowRankPrecision,
    PrecisionOperator,
    _check_fraction,
    _top_eigen,
    gram64,
)

ESTIMATORS = ("dense", "diagonal", "ledoit_wolf", "oas", "woodbury")


def _check_refs(g: torch.Tensor) -> torch.Tensor:
    if not isinstance(g, torch.Tensor) or g.ndim != 2:
        raise ValueError("reference gradients must be a 2-d tensor (n_r, d)")
    if g.shape[0] < 2:
        raise ValueError(f"need at least 2 reference gradients, got n_r={g.shape[0]}")
    return g


_MEAN_ROWS = 16  # rows summed in G's dtype (one BLAS product) before a float64 accumulation


def _mean64(g: torch.Tensor) -> torch.Tensor:
    """Row mean in float64: blocks of 16 rows summed by a BLAS product in G's dtype, the
    blocks accumulated in float64 (no n x d temporary). Also the finiteness check of G: a NaN
    or inf anywhere makes its column's sum non-finite (O(d) to test instead of O(n d))."""
    total = torch.zeros(g.shape[1], dtype=torch.float64, device=g.device)
    for i in range(0, g.shape[0], _MEAN_ROWS):
        block = g[i : i + _MEAN_ROWS]
        ones = torch.ones(block.shape[0], dtype=g.dtype, device=g.device)
        total += (ones @ block).to(torch.float64)
    if not bool(torch.isfinite(total).all()):
        raise ValueError("reference gradients contain NaN or inf")
    return total / g.shape[0]


def reference_mean(g: torch.Tensor) -> torch.Tensor:
    """Mean of the rows of G, accumulated in float64, returned in G's dtype."""
    _check_refs(g)
    return _mean64(g).to(g.dtype)


def _factor(g: torch.Tensor, centred: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, X) with X = G - mean (centred) or G itself (uncentred second moment)."""
    mean64 = _mean64(g)
    x = g - mean64.to(g.dtype) if centred else g  # one rounding; no n x d float64 copy
    return mean64.to(g.dtype), x


def _implicit_factor(g: torch.Tensor, centred: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mean, offset): the low-rank operators centre G implicitly (offset = mean), no copy."""
    mean = _mean64(g).to(g.dtype)
    return mean, (mean if centred else None)


def _ridge(ridge: float, rel_ridge: float, avg_var: float) -> float:
    return check_nonnegative(ridge, "ridge") + check_nonnegative(rel_ridge, "rel_ridge") * avg_var


def dense_precision(
    g: torch.Tensor, centred: bool = True, ridge: float = 0.0, rel_ridge: float = 0.0
) -> DensePrecision:
    """(C + rho I)^{-1} with the full d x d empirical covariance (small d only).

    rho = ridge + rel_ridge * tr(C)/d. Without a ridge, C is singular when n_r <= d (centred)
    or n_r < d (uncentred): that request raises ``ValueError`` instead of returning garbage.
    """
    _check_refs(g)
    n, d = g.shape
    if d > DENSE_MAX_DIM:
        raise ValueError(
            f"dense estimator forms d x d: refused for d={d} > {DENSE_MAX_DIM}; "
            "use method='woodbury', 'ledoit_wolf', 'oas' or 'diagonal'"
        )
    mean, x = _factor(g, centred)
    x64 = x.to(torch.float64)
    cov = x64.T @ x64 / n
    rho = _ridge(ridge, rel_ridge, float(torch.trace(cov)) / d)
    rank_max = n - 1 if centred else n
    if rho == 0.0 and rank_max < d:
        raise ValueError(
            f"the {'centred' if centred else 'uncentred'} covariance of n_r={n} reference "
            f"gradients in d={d} has rank <= {rank_max} < d and is singular: pass ridge > 0 "
            "or use a shrinkage / woodbury estimator"
        )
    return DensePrecision(mean, cov, rho)


def diagonal_precision(
    g: torch.Tensor, centred: bool = True, ridge: float = 0.0, rel_ridge: float = 0.0
) -> DiagonalPrecision:
    """diag(1 / (var_j + rho)): per-coordinate (centred or raw) second moments."""
    _check_refs(g)
    mean, x = _factor(g, centred)
    var = (x.to(torch.float64) ** 2).sum(0) / g.shape[0]
    rho = _ridge(ridge, rel_ridge, float(var.mean()))
    return DiagonalPrecision(mean, var, rho)


def woodbury_precision(
    g: torch.Tensor,
    ridge: float = 0.0,
    rel_ridge: float = 0.0,
    centred: bool = True,
    rank: int | None = None,
    explained_variance: float | None = None,
) -> LowRankPrecision:
    """(C + rho I)^{-1} with C the (rank-truncated) empirical covariance, by Woodbury.

    Args:
        g: reference gradients (n_r, d); kept by reference (centred implicitly, not copied).
        ridge, rel_ridge: rho = ridge + rel_ridge * tr(C)/d, which must be positive.
        centred: empirical covariance (True) or uncentred second moment (False).
        rank: keep at most this many top eigen-components of C.
        explained_variance: keep the fewest top components whose eigenvalues sum to at least
            this fraction (in (0, 1]) of tr(C); the operator's ``rank_kept`` and
            ``explained_variance_kept`` (and ``summary()``) report the choice. None: all.

    Memory: G itself plus, when the kept rank r <= n_r / 2, an r x d basis; no other n_r x d
    temporary. Set-up O(n_r^2 d); a projection costs min(r, n_r) d per vector.
    """
    _check_refs(g)
    n, d = g.shape
    if rank is not None and (int(rank) != rank or rank < 1):
        raise ValueError(f"rank must be a positive integer or None, got {rank!r}")
    explained_variance = _check_fraction(explained_variance)
    mean, offset = _implicit_factor(g, centred)
    gram = gram64(g, offset=offset)
    rho = _ridge(ridge, rel_ridge, float(torch.trace(gram)) / (n * d))
    if rho <= 0.0:
        raise ValueError(
            "woodbury estimator needs a positive ridge (ridge > 0 or rel_ridge > 0): "
            f"the covariance of n_r={n} references in d={d} is singular without it"
        )
    eig = _top_eigen(gram / n, rank, explained_variance)
    return LowRankPrecision(
        mean,
        g,
        1.0 / n,
        rho,
        rank,
        _eig=eig,
        offset=offset,
        explained_variance=explained_variance,
        _total_variance=float(torch.trace(gram)) / n,
    )


def _shrinkage_stats(gram: torch.Tensor, n: int, d: int) -> tuple[float, float, float]:
    """(mu = tr(S)/d, ||S||_F^2, sum_k ||x_k||^4) from the Gram matrix of X, S = X^T X / n."""
    trace_s = float(torch.trace(gram)) / n
    frob2 = float((gram * gram).sum()) / (n * n)
    fourth = float((torch.diagonal(gram) ** 2).sum())
    return trace_s / d, frob2, fourth


def ledoit_wolf_intensity(g: torch.Tensor, centred: bool = True) -> float:
    """Ledoit-Wolf shrinkage intensity alpha in [0, 1] (scikit-learn's formula, O(n^2 d))."""
    _check_refs(g)
    n, d = g.shape
    if d == 1:
        return 0.0
    _, offset = _implicit_factor(g, centred)
    mu, frob2, fourth = _shrinkage_stats(gram64(g, offset=offset), n, d)
    beta = (fourth / n - frob2) / (d * n)
    delta = (frob2 - 2.0 * mu * mu * d + d * mu * mu) / d  # ||S - mu I||_F^2 / d
    beta = min(beta, delta)
    return 0.0 if beta == 0.0 else float(beta / delta)


def oas_intensity(g: torch.Tensor, centred: bool = True) -> float:
    """Oracle-approximating shrinkage intensity (Chen et al. 2010, as in scikit-learn)."""
    _check_refs(g)
    n, d = g.shape
    if d == 1:
        return 0.0
    _, offset = _implicit_factor(g, centred)
    mu, frob2, _ = _shrinkage_stats(gram64(g, offset=offset), n, d)
    alpha = frob2 / (d * d)
    num = alpha + mu * mu
    den = (n + 1) * (alpha - mu * mu / d)
    return 1.0 if den == 0 else float(min(num / den, 1.0))


def shrinkage_precision(
    g: torch.Tensor,
    method: str = "ledoit_wolf",
    centred: bool = True,
    ridge: float = 0.0,
    intensity: float | None = None,
) -> LowRankPrecision:
    """((1 - alpha) S + alpha (tr S / d) I + ridge I)^{-1}, applied through the low-rank form.

    alpha is data-driven (``method`` = "ledoit_wolf" or "oas") unless ``intensity`` is given.
    """
    if method not in ("ledoit_wolf", "oas"):
        raise ValueError(f"method must be 'ledoit_wolf' or 'oas', got {method!r}")
    _check_refs(g)
    n, d = g.shape
    if intensity is None:
        fn = ledoit_wolf_intensity if method == "ledoit_wolf" else oas_intensity
        alpha = fn(g, centred)
    else:
        alpha = float(intensity)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"intensity must lie in [0, 1], got {intensity!r}")
    mean, offset = _implicit_factor(g, centred)
    gram = gram64(g, offset=offset)
    nu = float(torch.trace(gram)) / (n * d)
    rho = alpha * nu + check_nonnegative(ridge, "ridge")
    if rho <= 0.0:
        raise ValueError(
            "shrinkage covariance is singular (zero shrinkage target and no ridge): "
            "the reference gradients are all equal, pass ridge > 0"
        )
    scale = (1.0 - alpha) / n
    eig = _top_eigen(gram * scale, None)
    op = LowRankPrecision(
        mean,
        g,
        scale,
        rho,
        None,
        _eig=eig,
        offset=offset,
        _total_variance=float(gram.trace()) * scale,
    )
    op.intensity = alpha
    return op


def noise_ridge(noise_multiplier: float, max_grad_norm: float, batch_size: float) -> float:
    """sigma^2 C_clip^2 / b: the ridge DP-SGD's noise adds to the reference covariance.

    The mean of b clipped gradients plus N(0, sigma^2 C_clip^2 I)/b has covariance
    (C + sigma^2 C_clip^2 / b I) / b (DESIGN 4.3). Pass it as an estimator's ``ridge`` where
    the references alone may be singular (all equal, e.g. on dead coordinates).
    """
    sigma = check_nonnegative(noise_multiplier, "noise_multiplier")
    clip = check_positive(max_grad_norm, "max_grad_norm")
    b = check_positive(batch_size, "batch_size")
    return sigma * sigma * clip * clip / b


def noise_aware(
    op: PrecisionOperator, noise_multiplier: float, max_grad_norm: float, batch_size: float
) -> PrecisionOperator:
    """Shift any estimator to C + (sigma^2 C_clip^2 / b) I (``noise_ridge``): what DP-SGD's
    released mean sees."""
    return op.with_ridge(noise_ridge(noise_multiplier, max_grad_norm, batch_size))


def estimate_precision(
    g: torch.Tensor,
    method: str = "ledoit_wolf",
    centred: bool = True,
    ridge: float = 0.0,
    rel_ridge: float = 0.0,
    rank: int | None = None,
    explained_variance: float | None = None,
) -> PrecisionOperator:
    """Dispatch by name: "dense", "diagonal", "ledoit_wolf", "oas" or "woodbury".

    ``rank`` and ``explained_variance`` (truncation of the reference span) are woodbury's.
    """
    if method != "woodbury" and (rank is not None or explained_variance is not None):
        raise ValueError(
            f"rank / explained_variance truncate the woodbury estimator only, got method={method!r}"
        )
    if method == "dense":
        return dense_precision(g, centred, ridge, rel_ridge)
    if method == "diagonal":
        return diagonal_precision(g, centred, ridge, rel_ridge)
    if method in ("ledoit_wolf", "oas"):
        if rel_ridge:
            raise ValueError("rel_ridge is not used by shrinkage estimators: pass ridge")
        return shrinkage_precision(g, method, centred, ridge)
    if method == "woodbury":
        return woodbury_precision(g, ridge, rel_ridge, centred, rank, explained_variance)
    require_choice("method", method, ESTIMATORS)
    raise AssertionError(f"estimator {method!r} has no branch")  # pragma: no cover
