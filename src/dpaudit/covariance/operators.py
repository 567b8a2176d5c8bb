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

    def quadratic_forms(
        self, g_star: torch.Tensor, g: torch.Tensor, mean: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a_k^T P c, a_k^T P a_k, c^T P c) in float64, a = g*_k - mean, c = g - mean.

        ``g_star`` is (K, d), ``g`` (d,), ``mean`` defaults to the operator's. What the
        covariance and GLiR scores need; ``prepare(g_star)`` once and ``forms(prep, g_star,
        g)`` per step when g* does not change (fixed gradient canaries).
        """
        return self.prepare_and_forms(g_star, g, mean)[1]

    def prepare_and_forms(
        self, g_star: torch.Tensor, g: torch.Tensor, mean: torch.Tensor | None = None
    ) -> tuple[dict, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(``prepare(g_star, mean)``, ``forms(...)``) in one go (one pass where possible)."""
        prep = self.prepare(g_star, mean)
        return prep, self.forms(prep, g_star, g, mean)

    def prepare(self, g_star: torch.Tensor, mean: torch.Tensor | None = None) -> dict:
        """The per-canary work that ``forms`` reuses: here P a and a^T P a (a = g* - mean)."""
        g_star, _ = _as_batch(g_star, self.dim, "g_star")
        a = g_star - (self.mean if mean is None else mean).to(g_star.dtype)
        pa = self._apply(a).to(torch.float64)
        return {"pa": pa, "apa": (pa * a.to(torch.float64)).sum(1)}

    def forms(
        self, prep: dict, g_star: torch.Tensor, g: torch.Tensor, mean: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a^T P c, a^T P a, c^T P c) from ``prepare(g_star, mean)`` and g (d,)."""
        c = g.to(torch.float64) - (self.mean if mean is None else mean).to(torch.float64)
        apc = prep["pa"] @ c
        cpc = self._mahalanobis(c.unsqueeze(0)).to(torch.float64)[0]
        return apc, prep["apa"], cpc

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

    ``factor`` (n, d) holds the reference gradients in their dtype and device; ``offset`` (d,),
    when given, is subtracted from every row *implicitly* (X = factor - 1 offset^T), so the
    centred covariance needs no n x d copy of the references (the operator keeps a reference to
    ``factor``, not a copy: do not modify it in place afterwards). ``scale`` multiplies X^T X
    (1/n for the empirical covariance, (1 - alpha)/n for shrinkage). The eigen-decomposition
    of the n x n matrix scale X X^T (float64, accumulated in column chunks) gives C's
    non-zero spectrum; ``rank`` keeps at most that many top components and
    ``explained_variance`` (in (0, 1]) the fewest whose eigenvalues sum to at least that
    fraction of tr(C) (the dropped variance is then modelled by the ridge alone).
    ``explained_variance_kept`` and ``rank_kept`` report what was kept.

    When the kept rank r is at most half of n, the orthonormal basis W (r x d, in the factor's
    dtype) is formed once (one matrix product, no other n x d temporary) and a projection
    costs r d; otherwise W^T v = coef^T (X v) goes through the references (n d per vector).
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
        *,
        offset: torch.Tensor | None = None,
        explained_variance: float | None = None,
        _basis: torch.Tensor | None = None,
        _total_variance: float | None = None,
    ):
        if not ridge > 0:
            raise ValueError(
                f"low-rank covariance needs ridge > 0 to be invertible, got ridge={ridge!r}"
            )
        self.mean = mean
        self.factor = factor
        self.offset = offset
        self.scale = float(scale)
        self.ridge = float(ridge)
        self.rank = rank
        self.explained_variance = _check_fraction(explained_variance)
        if _eig is None:
            gram = gram64(factor, offset=offset) * self.scale
            _total_variance = float(torch.trace(gram))
            _eig = _top_eigen(gram, rank, self.explained_variance)
        self.eigenvalues, self._v = _eig
        lam_sum = float(self.eigenvalues.sum())
        self.total_variance = lam_sum if _total_variance is None else float(_total_variance)
        self.rank_kept = int(self.eigenvalues.numel())
        self.explained_variance_kept = (
            lam_sum / self.total_variance if self.total_variance > 0 else 1.0
        )
        # W = X^T V diag(sqrt(scale / lambda)): orthonormal columns spanning C's range.
        self._coef = self._v * torch.sqrt(self.scale / self.eigenvalues).unsqueeze(0)
        if _basis is None and 2 * self.rank_kept <= factor.shape[0]:
            _basis = self._lift(torch.eye(self.rank_kept, dtype=torch.float64, device=mean.device))
        self._basis = _basis  # W^T (r, d) in the factor's dtype, or None (go through X)

    def summary(self) -> dict:
        """What the operator kept: n references, rank, explained variance, ridge, basis form."""
        return {
            "n_refs": int(self.factor.shape[0]),
            "rank": self.rank_kept,
            "explained_variance_requested": self.explained_variance,
            "explained_variance_kept": self.explained_variance_kept,
            "ridge": self.ridge,
            "basis": "explicit (r x d)" if self._basis is not None else "through references",
        }

    def _project(self, v: torch.Tensor) -> torch.Tensor:
        """c = W^T v, (K, r) in float64: one product with the basis or the references."""
        vv = v.to(self.factor.dtype)
        if self._basis is not None:
            return (vv @ self._basis.T).to(torch.float64)
        xv = vv @ self.factor.T
        if self.offset is not None:
            xv = xv - (vv @ self.offset.to(vv.dtype)).unsqueeze(1)
        return xv.to(torch.float64) @ self._coef

    def _lift(self, c: torch.Tensor) -> torch.Tensor:
        """W c, (K, d) in the factor's dtype."""
        if getattr(self, "_basis", None) is not None:
            return c.to(self.factor.dtype) @ self._basis
        u = c @ self._coef.T  # (K, n) float64
        out = u.to(self.factor.dtype) @ self.factor
        if self.offset is not None:  # in place: no second (K, d) temporary
            out.addr_(u.sum(1).to(out.dtype), self.offset.to(out.dtype), alpha=-1)
        return out

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

    def _mean_projection(self, mean: torch.Tensor) -> torch.Tensor:
        """W^T mean (r,), cached for the operator's own mean."""
        if mean is self.mean:
            if getattr(self, "_proj_mean", None) is None:
                self._proj_mean = self._project(mean.unsqueeze(0))[0]
            return self._proj_mean
        return self._project(mean.unsqueeze(0))[0]

    def prepare(self, g_star: torch.Tensor, mean: torch.Tensor | None = None) -> dict:
        """Projections W^T a (K, r) and ||a||^2 of a = g* - mean: ONE projection per canary.

        W^T a = W^T g* - W^T mean (linear), so no (K, d) centred copy is formed; ||a||^2 is
        accumulated in float64 over column chunks of g* - mean.
        """
        g_star, _ = _as_batch(g_star, self.dim, "g_star")
        mean = self.mean if mean is None else mean
        proj = self._project(g_star) - self._mean_projection(mean)
        aa, _ = _centred_products(g_star, mean, None)
        return {"proj": proj, "aa": aa}

    def forms(
        self, prep: dict, g_star: torch.Tensor, g: torch.Tensor, mean: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a^T P c, a^T P a, c^T P c) with one projection of c = g - mean and no lift.

        P = I / rho - W diag(lambda / (rho (lambda + rho))) W^T, so every form is a Euclidean
        product over rho minus a product of r-dimensional projections: g costs one projection
        plus O(K d). The Euclidean products are accumulated in float64; the projections are
        products in the factor's dtype (for float32: relative error ~1e-7 lambda_max / rho
        per form, small for DP-SGD's noise-aware precision, rho >= sigma^2 C^2 / b).
        """
        g_star, _ = _as_batch(g_star, self.dim, "g_star")
        mean = self.mean if mean is None else mean
        c = g.to(g_star.dtype) - mean.to(g_star.dtype)
        pc = self._project(c.unsqueeze(0))[0]
        _, dot = _centred_products(g_star, mean, c)
        return self._combine(prep["proj"], prep["aa"], pc, dot, c)

    def prepare_and_forms(
        self, g_star: torch.Tensor, g: torch.Tensor, mean: torch.Tensor | None = None
    ) -> tuple[dict, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``prepare`` and ``forms`` with the K canaries and g projected in ONE pass.

        The (K + 1) vectors are multiplied with the references (or the basis) column chunk by
        column chunk, so the n_r x d matrix is read from memory once per step, not twice, and
        no (K + 1, d) stacked copy is formed.
        """
        g_star, _ = _as_batch(g_star, self.dim, "g_star")
        mean = self.mean if mean is None else mean
        c = g.to(g_star.dtype) - mean.to(g_star.dtype)
        proj = self._project_pair(g_star, c)
        pa, pc = proj[:-1] - self._mean_projection(mean), proj[-1]
        aa, dot = _centred_products(g_star, mean, c)
        prep = {"proj": pa, "aa": aa}
        return prep, self._combine(pa, aa, pc, dot, c)

    def _project_pair(
        self, a: torch.Tensor, c: torch.Tensor, chunk_elems: int = 1 << 22
    ) -> torch.Tensor:
        """W^T [a; c] (K + 1, r) in float64, reading the stored matrix once, by column chunks."""
        mat = self._basis if self._basis is not None else self.factor
        dtype = mat.dtype
        rows = torch.zeros(a.shape[0] + 1, mat.shape[0], dtype=torch.float64, device=a.device)
        step = max(1, chunk_elems // max(mat.shape[0], 1))
        for j in range(0, self.dim, step):
            # one product per chunk for the K + 1 vectors ((K + 1) x step temporary)
            both = torch.cat([a[:, j : j + step].to(dtype), c[j : j + step].to(dtype)[None]])
            rows += (both @ mat[:, j : j + step].T).to(torch.float64)
        if self._basis is not None:
            return rows
        if self.offset is not None:
            off = self.offset.to(dtype)
            shift = torch.cat([a.to(dtype) @ off, (c.to(dtype) @ off).unsqueeze(0)])
            rows -= shift.to(torch.float64).unsqueeze(1)
        return rows @ self._coef

    def _combine(self, pa, aa, pc, dot, c):
        """The three forms from projections (pa, pc), ||a||^2, a . c and c (module doc)."""
        cc = (c.to(torch.float64) ** 2).sum()
        lam = self.eigenvalues
        w = lam / (self.ridge * (lam + self.ridge))
        apc = dot / self.ridge - (pa * w) @ pc
        apa = aa / self.ridge - (pa * pa * w).sum(1)
        cpc = cc / self.ridge - (pc * pc * w).sum()
        return apc, apa, cpc

    def covariance_apply(self, v):
        c = self._project(v)
        return self._lift(c * self.eigenvalues).to(torch.float64) + self.ridge * v.to(torch.float64)

    def with_ridge(self, extra):
        op = LowRankPrecision(
            self.mean,
            self.factor,
            self.scale,
            self.ridge + _check_extra(extra),
            self.rank,
            _eig=(self.eigenvalues, self._v),
            offset=self.offset,
            explained_variance=self.explained_variance,
            _basis=self._basis,
            _total_variance=self.total_variance,
        )
        op.intensity = self.intensity
        return op


def _centred_products(
    g_star: torch.Tensor, mean: torch.Tensor, c: torch.Tensor | None, chunk_elems: int = 1 << 22
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(||g*_k - mean||^2, (g*_k - mean) . c), by column chunks (small temporaries).

    Each chunk's products are BLAS products in g*'s dtype; chunks are summed in float64.
    """
    k, d = g_star.shape
    aa = torch.zeros(k, dtype=torch.float64, device=g_star.device)
    dot = None if c is None else torch.zeros_like(aa)
    step = max(1, chunk_elems // max(k, 1))
    for j in range(0, d, step):
        block = g_star[:, j : j + step] - mean[j : j + step].to(g_star.dtype)
        aa += torch.einsum("kd,kd->k", block, block).to(torch.float64)
        if c is not None:
            dot += (block @ c[j : j + step].to(block.dtype)).to(torch.float64)
    return aa, dot


def _check_fraction(value: float | None) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"explained_variance must lie in (0, 1] or be None, got {value!r}")
    return v


def gram64(
    x: torch.Tensor, chunk_elems: int = 1 << 22, offset: torch.Tensor | None = None
) -> torch.Tensor:
    """X X^T (n x n): per column chunk in X's dtype, accumulated across chunks in float64.

    Exact float64 for float64 input; for float32 input each chunk (<= 2^22 / n columns) is a
    float32 product, so rounding does not grow with d, and no n x d float64 copy is made.
    ``offset`` (d,) is subtracted from every row chunk by chunk (the centred Gram matrix
    without an n x d centred copy).
    """
    n, d = x.shape
    out = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    step = max(1, chunk_elems // max(n, 1))
    rows = _GRAM_ROW_BLOCK
    for j in range(0, d, step):
        block = x[:, j : j + step]
        if offset is not None:
            block = block - offset[j : j + step].to(x.dtype)
        if n <= rows:
            out += (block @ block.T).to(torch.float64)
            continue
        for i in range(0, n, rows):  # lower triangle only, by column strips (~5/8 of a gemm)
            out[i:, i : i + rows] += (block[i:] @ block[i : i + rows].T).to(torch.float64)
    if n > rows:
        low = torch.tril(out, -1)
        out = torch.tril(out) + low.T  # exact symmetry (the upper triangle mirrors the lower)
    return out


_GRAM_ROW_BLOCK = 64  # row block of gram64's lower-triangle products


def _top_eigen(
    gram: torch.Tensor, rank: int | None, explained_variance: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-negligible eigenpairs of a symmetric PSD n x n matrix, largest first.

    ``rank`` keeps at most that many; ``explained_variance`` the fewest whose eigenvalues sum
    to at least that fraction of the trace.
    """
    evals, evecs = torch.linalg.eigh(gram)
    evals, evecs = evals.flip(0), evecs.flip(1)
    top = float(evals[0]) if evals.numel() else 0.0
    tol = max(top, 0.0) * gram.shape[0] * torch.finfo(torch.float64).eps * 10
    keep = evals > tol
    if rank is not None:
        keep &= torch.arange(evals.numel(), device=evals.device) < rank
    if explained_variance is not None and explained_variance < 1.0:
        total = float(torch.trace(gram))
        cum = torch.cumsum(evals.clamp_min(0.0), 0)
        needed = int(torch.searchsorted(cum, explained_variance * total * (1 - 1e-12)))
        keep &= torch.arange(evals.numel(), device=evals.device) <= needed
    return evals[keep], evecs[:, keep]
