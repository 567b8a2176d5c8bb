"""Precision operators P = (C + rho I)^{-1}, applied without forming d x d when d is large.

Every estimator of ``dpaudit.covariance`` returns one of three operators, each holding the
reference mean ``mean`` (d,) and a precision that can be applied to a batch of vectors:

- ``DensePrecision``: a d x d covariance, Cholesky-factored in float64 (small d only);
- ``DiagonalPrecision``: per-coordinate variances;
- ``LowRankPrecision``: C = sum_i lambda_i w_i w_i^T (rank r <= n_r, from the n_r x n_r Gram
  matrix of the references) plus a ridge, applied with the Woodbury identity in the stable
  eigen form P v = v / rho - W diag(lambda / (rho (lambda + rho))) W^T v. Memory O(n_r d), one
  application O(K n_r d); the n_r x n_r core is float64.

``with_ridge(extra)`` adds ``extra * I`` to the covariance (the noise-aware shift of DP-SGD,
DESIGN 4.3) and shares the factors of the original operator.
"""

from __future__ import annotations

import abc
import warnings

import torch

DENSE_MAX_DIM = 20_000
"""Largest d for which a d x d matrix may be formed (``dense()``, ``DensePrecision``)."""


def _as_batch(v: torch.Tensor, dim: int, name: str = "V") -> tuple[torch.Tensor, bool]:
    """View ``v`` as (K, d); remember whether it was a single vector."""
    if v.ndim == 1:
        v = v.unsqueeze(0)
        single = True
    elif v.ndim == 2:
        single = False
    else:
        raise ValueError(f"{name} must have shape (d,) or (K, d), got {tuple(v.shape)}")
    if v.shape[1] != dim:
        raise ValueError(f"{name} must have {dim} columns (the operator's d), got {v.shape[1]}")
    return v, single


class PrecisionOperator(abc.ABC):
    """A regularised inverse covariance P with the reference mean, applied batch-wise."""

    mean: torch.Tensor
    ridge: float

    @property
    def dim(self) -> int:
        """The dimension d."""
        return int(self.mean.shape[0])

    @property
    def device(self) -> torch.device:
        """Device of the stored factors (that of the reference gradients)."""
        return self.mean.device

    def apply(self, v: torch.Tensor) -> torch.Tensor:
        """P v for v of shape (d,) or (K, d); the result has v's shape and dtype."""
        batch, single = _as_batch(v, self.dim)
        out = self._apply(batch).to(v.dtype)
        return out[0] if single else out

    def mahalanobis(self, v: torch.Tensor) -> torch.Tensor:
        """Squared P-norms v^T P v (no centring): a scalar for (d,), a (K,) tensor for (K, d)."""
        batch, single = _as_batch(v, self.dim)
        out = self._mahalanobis(batch).to(v.dtype)
        return out[0] if single else out

    def dense(self) -> torch.Tensor:
        """The d x d precision in float64; refused above ``DENSE_MAX_DIM``."""
        if self.dim > DENSE_MAX_DIM:
            raise ValueError(
                f"dense() forms a d x d matrix: refused for d={self.dim} > {DENSE_MAX_DIM}"
            )
        eye = torch.eye(self.dim, dtype=torch.float64, device=self.device)
        return self._apply(eye).to(torch.float64)

    @abc.abstractmethod
    def covariance_apply(self, v: torch.Tensor) -> torch.Tensor:
        """(C + rho I) v for v of shape (K, d): the modelled covariance, for checks."""

    @abc.abstractmethod
    def with_ridge(self, extra: float) -> PrecisionOperator:
        """The operator for C + (rho + extra) I (shares the stored factors)."""

    @abc.abstractmethod
    def _apply(self, v: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def _mahalanobis(self, v: torch.Tensor) -> torch.Tensor: ...


def _check_extra(extra: float) -> float:
    e = float(extra)
    if not e >= 0.0 or e == float("inf"):
        raise ValueError(f"extra ridge must be a finite non-negative number, got {extra!r}")
    return e


class DiagonalPrecision(PrecisionOperator):
    """P = diag(1 / (var_j + rho)): ignores correlations, O(d) memory."""

    def __init__(self, mean: torch.Tensor, variances: torch.Tensor, ridge: float = 0.0):
        total = variances.to(torch.float64) + ridge
        if not bool(torch.all(total > 0)):
            bad = int(torch.sum(total <= 0))
            raise ValueError(
                f"diagonal covariance is singular: {bad} coordinate(s) have zero variance; "
                "pass ridge > 0"
            )
        self.mean = mean
        self.variances = variances.to(torch.float64)
        self.ridge = float(ridge)
        self._inv = 1.0 / total

    def _apply(self, v):
        return v.to(torch.float64) * self._inv

    def _mahalanobis(self, v):
        v64 = v.to(torch.float64)
        return (v64 * v64 * self._inv).sum(1)

    def covariance_apply(self, v):
        return v.to(torch.float64) * (self.variances + self.ridge)

    def with_ridge(self, extra):
        return DiagonalPrecision(self.mean, self.variances, self.ridge + _check_extra(extra))


class DensePrecision(PrecisionOperator):
    """P = (C + rho I)^{-1} from a d x d covariance, Cholesky in float64 with jitter."""

    def __init__(self, mean: torch.Tensor, covariance: torch.Tensor, ridge: float = 0.0):
        d = covariance.shape[0]
        if d > DENSE_MAX_DIM:
            raise ValueError(f"dense covariance refused for d={d} > {DENSE_MAX_DIM}")
        self.mean = mean
        self.covariance = covariance.to(torch.float64)
        self.ridge = float(ridge)
        self.jitter = 0.0
        eye = torch.eye(d, dtype=torch.float64, device=covariance.device)
        base = self.covariance + self.ridge * eye
        scale = float(torch.diagonal(base).mean().abs()) or 1.0
        chol, info = torch.linalg.cholesky_ex(base)
        jitter = 1e-12 * scale
        while int(info) != 0:
            if jitter > 1e-6 * scale:
                raise ValueError(
                    "covariance + ridge is not positive definite even with jitter "
                    f"{jitter:.3g}: pass a larger ridge or use a shrinkage estimator"
                )
            chol, info = torch.linalg.cholesky_ex(base + jitter * eye)
            if int(info) == 0:
                self.jitter = jitter
                warnings.warn(
                    f"Cholesky needed jitter {jitter:.3g} (relative {jitter / scale:.1e})",
                    RuntimeWarning,
                    stacklevel=2,
                )
            jitter *= 10.0
        self._chol = chol

    def _apply(self, v):
        return torch.cholesky_solve(v.to(torch.float64).T, self._chol).T

    def _mahalanobis(self, v):
        z = torch.linalg.solve_triangular(self._chol, v.to(torch.float64).T, upper=False)
        return (z * z).sum(0)

    def covariance_apply(self, v):
        return v.to(torch.float64) @ self.covariance + self.ridge * v.to(torch.float64)

    def with_ridge(self, extra):
        return DensePrecision(self.mean, self.covariance, self.ridge + _check_extra(extra))


class LowRankPrecision(PrecisionOperator):
    """P = (scale X^T X + rho I)^{-1} via the Woodbury identity; never forms d x d.

    ``factor`` X is (n, d) (the centred or raw reference gradients, in their dtype and device),
    ``scale`` multiplies X^T X (1/n for the empirical covariance, (1 - alpha)/n for shrinkage).
    The eigen-decomposition of the n x n matrix scale X X^T (float64, accumulated in column
    chunks) gives C's non-zero spectrum; ``rank`` keeps only the top components.
    ``intensity`` is the shrinkage intensity alpha when built by a shrinkage estimator.
    """

    intensity: float | None = None

    def __init__(
        self,
        mean: torch.Tensor,
        factor: torch.Tensor,
        scale: float,
        ridge: float,
        rank: int | None = None,
        _eig: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        if not ridge > 0:
            raise ValueError(
                f"low-rank covariance needs ridge > 0 to be invertible, got ridge={ridge!r}"
            )
        self.mean = mean
        self.factor = factor
        self.scale = float(scale)
        self.ridge = float(ridge)
        self.rank = rank
        if _eig is None:
            _eig = _top_eigen(gram64(factor) * self.scale, rank)
        self.eigenvalues, self._v = _eig
        # W = X^T V diag(sqrt(scale / lambda)): orthonormal columns spanning C's range.
        self._coef = self._v * torch.sqrt(self.scale / self.eigenvalues).unsqueeze(0)

    def _project(self, v: torch.Tensor) -> torch.Tensor:
        """c = W^T v, (K, r) in float64."""
        xv = v.to(self.factor.dtype) @ self.factor.T
        return xv.to(torch.float64) @ self._coef

    def _lift(self, c: torch.Tensor) -> torch.Tensor:
        """W c, (K, d) in the factor's dtype."""
        return (c @ self._coef.T).to(self.factor.dtype) @ self.factor

    def _apply(self, v):
        c = self._project(v)
        lam = self.eigenvalues
        w = lam / (self.ridge * (lam + self.ridge))
        out = v.to(torch.promote_types(v.dtype, self.factor.dtype)) / self.ridge
        return out - self._lift(c * w).to(out.dtype)

    def _mahalanobis(self, v):
        # Stable form: ||v - W c||^2 / rho + sum c^2 / (lambda + rho) (no cancellation).
        c = self._project(v)
        resid = v.to(self.factor.dtype) - self._lift(c)
        r2 = (resid.to(torch.float64) ** 2).sum(1)
        return r2 / self.ridge + (c * c / (self.eigenvalues + self.ridge)).sum(1)

    def covariance_apply(self, v):
        c = self._project(v)
        return self._lift(c * self.eigenvalues).to(torch.float64) + self.ridge * v.to(torch.float64)

    def with_ridge(self, extra):
        return LowRankPrecision(
            self.mean,
            self.factor,
            self.scale,
            self.ridge + _check_extra(extra),
            self.rank,
            _eig=(self.eigenvalues, self._v),
        )


def gram64(x: torch.Tensor, chunk_elems: int = 1 << 22) -> torch.Tensor:
    """X X^T (n x n): per column chunk in X's dtype, accumulated across chunks in float64.

    Exact float64 for float64 input; for float32 input each chunk (<= 2^22 / n columns) is a
    float32 product, so rounding does not grow with d, and no n x d float64 copy is made.
    """
    n, d = x.shape
    out = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    step = max(1, chunk_elems // max(n, 1))
    for j in range(0, d, step):
        block = x[:, j : j + step]
        out += (block @ block.T).to(torch.float64)
    return out


def _top_eigen(gram: torch.Tensor, rank: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-negligible eigenpairs of a symmetric PSD n x n matrix, largest first."""
    evals, evecs = torch.linalg.eigh(gram)
    evals, evecs = evals.flip(0), evecs.flip(1)
    top = float(evals[0]) if evals.numel() else 0.0
    tol = max(top, 0.0) * gram.shape[0] * torch.finfo(torch.float64).eps * 10
    keep = evals > tol
    if rank is not None:
        keep &= torch.arange(evals.numel(), device=evals.device) < rank
    return evals[keep], evecs[:, keep]
