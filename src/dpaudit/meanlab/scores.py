"""Membership scores on released means (higher = "the target was in").

All scores take ``outputs`` of shape (rounds, d) and a target of shape (d,) or (rounds, d)
(the average-target game has one target per round) and return one score per round.

- `oracle_lr`: Eq. 5 of seed 001 / Eq. 10 of seed 000 with the true (mu, C); pass
  ``noise_var`` = C_gamma for the noisy mean (C -> C + C_gamma), and the mechanism's sample
  size (k for a sub-sampled mean) as ``n``.
- `exact_bernoulli_lr`: the exact LR of the exact Bernoulli mean (Sankararaman et al.).
- `subsampled_lr_paper`: the per-coordinate mixture expansion sum_j W_{n,j} of seed 001
  Lemma C.11 (without the third-cumulant term, which is o_p(1) in total).
- `subsampled_lr_shared`: the LR when one inclusion event is shared by all coordinates,
  log(1 - rho + rho exp(l_k)), l_k = `oracle_lr` with n -> k. Monotone in l_k.
- `plugin_lr` with `reference_estimate`: Eq. 5 with (mu, C) estimated from n_0 references,
  centred (default) or the paper's uncentred second moment; diagonal or full covariance.
- `scalar_product`: Dwork et al.'s (z - z_ref)^T mu_hat with one reference point.
A misspecified attacker is `oracle_lr` called with z_targ instead of z*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _prep(outputs, target) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(outputs, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"outputs must have shape (rounds, d), got {x.shape}")
    z = np.asarray(target, dtype=np.float64)
    if z.shape not in ((x.shape[1],), x.shape):
        raise ValueError(
            f"target must have shape (d,) or (rounds, d) matching outputs {x.shape}, got {z.shape}"
        )
    return x, z


def _check_n(n) -> float:
    if not np.isfinite(n) or n < 1:
        raise ValueError(f"n must be a sample size >= 1, got {n!r}")
    return float(n)


def oracle_lr(outputs, target, mean, var, n: float, noise_var=0.0) -> np.ndarray:
    """(z - mu)^T (C + C_gamma)^{-1} (o - mu) - ||z - mu||^2_{(C + C_gamma)^{-1}} / (2n)."""
    x, z = _prep(outputs, target)
    n = _check_n(n)
    v = np.asarray(var, dtype=np.float64) + np.asarray(noise_var, dtype=np.float64)
    if np.any(v <= 0):
        raise ValueError("var + noise_var must be > 0 in every coordinate")
    w = (z - mean) / v
    return np.sum(w * (x - mean), axis=-1) - np.sum(w * (z - mean), axis=-1) / (2.0 * n)


def exact_bernoulli_lr(outputs, target, p, n: int) -> np.ndarray:
    """Exact log LR of the exact mean of n Bernoulli(p) rows, z in {0, 1}^d.

    sum_j z_j log(mu_hat_j / p_j) + (1 - z_j) log((1 - mu_hat_j) / (1 - p_j)); it is -inf
    when the output is impossible under H1 (z_j = 1 but no 1 in coordinate j, or vice versa).
    """
    x, z = _prep(outputs, target)
    _check_n(n)
    if not np.all((z == 0) | (z == 1)):
        raise ValueError("exact_bernoulli_lr needs a binary target in {0, 1}^d")
    with np.errstate(divide="ignore"):
        t1 = np.where(z == 1, np.log(x) - np.log(p), 0.0)
        t0 = np.where(z == 0, np.log1p(-x) - np.log1p(-p), 0.0)
    return np.sum(t1 + t0, axis=-1)


def subsampled_lr_paper(outputs, target, mean, var, n: int, rho: float) -> np.ndarray:
    """sum_j W_{n,j} (seed 001 Lemma C.11, lambda_3 term dropped), k = round(rho n).

    W = rho/2 (dout^2 - din^2) + rho/(2k) + rho (1 - rho)/8 (dout^2 - din^2)^2 with
    dout = sqrt(k)(o - mu)/sigma, din = k/(sqrt(k - 1) sigma) (o - mu - (z - mu)/k).
    """
    x, z = _prep(outputs, target)
    n = _check_n(n)
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must lie in (0, 1], got {rho!r}")
    k = round(rho * n)
    if k < 2:
        raise ValueError(f"rho * n must round to at least 2 rows, got k={k}")
    sd = np.sqrt(np.asarray(var, dtype=np.float64))
    dout = np.sqrt(k) * (x - mean) / sd
    din = k / (np.sqrt(k - 1.0) * sd) * (x - mean - (z - mean) / k)
    diff = dout**2 - din**2
    w = 0.5 * rho * diff + rho / (2.0 * k) + rho * (1.0 - rho) / 8.0 * diff**2
    return np.sum(w, axis=-1)


def subsampled_lr_shared(outputs, target, mean, var, k: int, rho: float) -> np.ndarray:
    """log(1 - rho + rho exp(l_k)): the LR when the target is in the whole k-row mean or not."""
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must lie in (0, 1], got {rho!r}")
    lk = oracle_lr(outputs, target, mean, var, k)
    if rho == 1.0:
        return lk
    return np.logaddexp(np.log1p(-rho), np.log(rho) + lk)


@dataclass(frozen=True)
class ReferenceEstimate:
    """(mu_0, precision) estimated from n_0 reference points for the plug-in score."""

    mean: np.ndarray
    precision: np.ndarray  # (d,) diagonal precision, or (d, d)
    n0: int

    def weights(self, target) -> np.ndarray:
        """P (z - mu_0), shape like ``target``."""
        dz = np.asarray(target, dtype=np.float64) - self.mean
        if self.precision.ndim == 1:
            return dz * self.precision
        return dz @ self.precision.T


def reference_estimate(
    references=None,
    *,
    dist=None,
    n0: int | None = None,
    rng=None,
    centred: bool = True,
    structure: str = "diag",
    ridge: float = 0.0,
) -> ReferenceEstimate:
    """Estimate (mu_0, C_0^{-1}) from reference rows, or draw n0 of them from ``dist``.

    centred=True uses the sample covariance; False uses the paper's uncentred second moment
    C_0 = (1/n_0) sum Z Z^T. structure="diag" keeps the diagonal (D is column-independent);
    coordinates whose estimated variance is 0 get precision 0 (they carry no estimated
    information). structure="full" inverts C_0 + ridge I (needs n_0 > d or ridge > 0).
    """
    if structure not in ("diag", "full"):
        raise ValueError(f"structure must be 'diag' or 'full', got {structure!r}")
    if ridge < 0 or not np.isfinite(ridge):
        raise ValueError(f"ridge must be finite and >= 0, got {ridge!r}")
    if references is None:
        if dist is None or n0 is None or rng is None:
            raise ValueError("pass references (n0, d), or dist, n0 and rng to draw them")
        if structure == "diag":
            m, v, m2 = dist.reference_stats(rng, n0)
            c = (v if centred else m2) + ridge
            prec = np.where(c > 0, 1.0 / np.where(c > 0, c, 1.0), 0.0)
            return ReferenceEstimate(m, prec, int(n0))
        references = dist.sample(rng, n0)
    r = np.asarray(references, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] < 2:
        raise ValueError(f"references must have shape (n0 >= 2, d), got {r.shape}")
    m = r.mean(axis=0)
    if structure == "diag":
        c = (r.var(axis=0, ddof=1) if centred else np.mean(r * r, axis=0)) + ridge
        prec = np.where(c > 0, 1.0 / np.where(c > 0, c, 1.0), 0.0)
        return ReferenceEstimate(m, prec, r.shape[0])
    rc = r - m if centred else r
    cov = rc.T @ rc / (r.shape[0] - 1 if centred else r.shape[0]) + ridge * np.eye(r.shape[1])
    if np.linalg.matrix_rank(cov) < r.shape[1]:
        raise ValueError("full reference covariance is singular: use ridge > 0 or more refs")
    return ReferenceEstimate(m, np.linalg.inv(cov), r.shape[0])


def plugin_lr(outputs, target, estimate: ReferenceEstimate, n: float) -> np.ndarray:
    """(z - mu_0)^T P (o - mu_0) - ||z - mu_0||_P^2 / (2n) with the estimated (mu_0, P)."""
    x, z = _prep(outputs, target)
    n = _check_n(n)
    w = estimate.weights(z)
    return np.sum(w * (x - estimate.mean), axis=-1) - np.sum(w * (z - estimate.mean), axis=-1) / (
        2.0 * n
    )


def scalar_product(outputs, target, z_ref) -> np.ndarray:
    """Dwork et al. (2015): (z - z_ref)^T o, with one reference point z_ref ~ D."""
    x, z = _prep(outputs, target)
    return np.sum((z - np.asarray(z_ref, dtype=np.float64)) * x, axis=-1)
