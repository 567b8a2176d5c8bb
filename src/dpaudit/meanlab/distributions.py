"""Column-independent data distributions of the mean lab, and the targets attacked in them.

A `ProductDistribution` is D = D_1 x ... x D_d, described by per-coordinate mean and variance
(all the theory needs) and by exact samplers of *sums of rows*: the empirical mean of k rows
only depends on their coordinate-wise sum, so the games never build a k x d matrix when a
sufficient statistic exists (Bernoulli: Binomial counts; Gaussian: one normal per coordinate).
Targets: `easy_target` / `hard_target` (farthest / nearest support point, seed 001 Sec. 6.1),
`medium_target` (a draw from D) and user targets checked by `as_target`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dpaudit.seeds import as_generator

RowSampler = Callable[[np.random.Generator, int], np.ndarray]
SumSampler = Callable[[np.random.Generator, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class ProductDistribution:
    """Column-independent distribution with known mean/variance and exact samplers.

    kind: "bernoulli" (mean = p), "gaussian", or "custom" (rows drawn by ``row_sampler``,
    optionally sums by ``sum_sampler``). ``support`` = (low, high) per coordinate when bounded.
    """

    kind: str
    mean: np.ndarray
    var: np.ndarray
    support: tuple[np.ndarray, np.ndarray] | None = None
    row_sampler: RowSampler | None = field(default=None, repr=False)
    sum_sampler: SumSampler | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in ("bernoulli", "gaussian", "custom"):
            raise ValueError(f"kind must be 'bernoulli', 'gaussian' or 'custom', got {self.kind!r}")
        mean = np.asarray(self.mean, dtype=np.float64).reshape(-1)
        var = np.asarray(self.var, dtype=np.float64).reshape(-1)
        if mean.size == 0 or mean.shape != var.shape:
            raise ValueError(
                f"mean and var must be non-empty 1-d arrays of equal length, got "
                f"{mean.shape} and {var.shape}"
            )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var)) and np.all(var > 0)):
            raise ValueError("var must be finite and > 0 in every coordinate (mean finite)")
        if self.kind == "custom" and self.row_sampler is None:
            raise ValueError("a 'custom' distribution needs row_sampler(rng, size) -> (size, d)")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "var", var)

    @property
    def d(self) -> int:
        """Number of coordinates."""
        return int(self.mean.size)

    def sample(self, rng: np.random.Generator | int, size: int) -> np.ndarray:
        """``size`` i.i.d. rows, shape (size, d) (builds the matrix: use for references only)."""
        rng = as_generator(rng, "rng")
        size = int(size)
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if self.kind == "bernoulli":
            return (rng.random((size, self.d)) < self.mean).astype(np.float64)
        if self.kind == "gaussian":
            return self.mean + np.sqrt(self.var) * rng.standard_normal((size, self.d))
        rows = np.asarray(self.row_sampler(rng, size), dtype=np.float64)
        if rows.shape != (size, self.d):
            raise ValueError(f"row_sampler returned shape {rows.shape}, expected {(size, self.d)}")
        return rows

    def sample_sum(self, rng: np.random.Generator | int, counts, rounds: int) -> np.ndarray:
        """Exact draw of the coordinate-wise sum of ``counts`` i.i.d. rows, shape (rounds, d).

        ``counts`` (non-negative integers) broadcasts against (rounds, d): a scalar, a column
        (rounds, 1) of per-round counts, or a full (rounds, d) array of per-coordinate counts.
        """
        rng = as_generator(rng, "rng")
        c = np.broadcast_to(np.asarray(counts), (int(rounds), self.d))
        if not np.issubdtype(c.dtype, np.integer):
            if not np.all(c == np.round(c)):
                raise ValueError("counts must be integers")
            c = c.astype(np.int64)
        if np.any(c < 0):
            raise ValueError("counts must be >= 0")
        if self.kind == "bernoulli":
            return rng.binomial(c, self.mean).astype(np.float64)
        if self.kind == "gaussian":
            cf = c.astype(np.float64)
            return cf * self.mean + np.sqrt(cf * self.var) * rng.standard_normal(c.shape)
        if self.sum_sampler is not None:
            out = np.asarray(self.sum_sampler(rng, c), dtype=np.float64)
            if out.shape != c.shape:
                raise ValueError(f"sum_sampler returned shape {out.shape}, expected {c.shape}")
            return out
        return self._sum_by_rows(rng, c)

    def _sum_by_rows(self, rng: np.random.Generator, c: np.ndarray) -> np.ndarray:
        """Fallback for custom families: draw max(count) rows per round and mask the rest."""
        out = np.empty(c.shape, dtype=np.float64)
        for r in range(c.shape[0]):
            kmax = int(c[r].max())
            rows = self.sample(rng, kmax)
            keep = np.arange(kmax)[:, None] < c[r][None, :]
            out[r] = np.sum(np.where(keep, rows, 0.0), axis=0)
        return out

    def reference_stats(
        self, rng: np.random.Generator | int, n0: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, centred variance, uncentred second moment) of n0 reference rows, exactly.

        Uses sufficient statistics where they exist (Bernoulli counts; Gaussian mean and
        chi-square sum of squares), so Figure 6's sweep over n0 costs O(d) per point.
        The centred variance uses the unbiased 1/(n0 - 1) normalisation.
        """
        rng = as_generator(rng, "rng")
        n0 = int(n0)
        if n0 < 2:
            raise ValueError(f"n0 must be >= 2 reference points, got {n0}")
        if self.kind == "bernoulli":
            c = rng.binomial(n0, self.mean).astype(np.float64)
            m = c / n0
            return m, (c - c * m) / (n0 - 1), m
        if self.kind == "gaussian":
            sd = np.sqrt(self.var)
            m = self.mean + sd * rng.standard_normal(self.d) / np.sqrt(n0)
            v = self.var * rng.chisquare(n0 - 1, self.d) / (n0 - 1)
            return m, v, v * (n0 - 1) / n0 + m * m
        rows = self.sample(rng, n0)
        return rows.mean(axis=0), rows.var(axis=0, ddof=1), np.mean(rows * rows, axis=0)


def bernoulli_product(
    d: int, a: float = 0.25, rng: np.random.Generator | int = 0
) -> ProductDistribution:
    """Bern(p) with p ~ U[a, 1 - a]^d drawn once (the papers' setting: a = 0.25)."""
    d = int(d)
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    if not 0.0 < float(a) < 0.5:
        raise ValueError(f"a must lie in (0, 0.5) so that p stays inside (0, 1), got {a!r}")
    p = as_generator(rng, "rng").uniform(a, 1.0 - a, size=d)
    return bernoulli_from_p(p)


def bernoulli_from_p(p) -> ProductDistribution:
    """Bern(p) product for given coordinate probabilities p in (0, 1)."""
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    if p.size == 0 or not np.all((p > 0) & (p < 1)):
        raise ValueError("p must be a non-empty array with every entry in (0, 1)")
    zeros = np.zeros_like(p)
    return ProductDistribution("bernoulli", p, p * (1 - p), support=(zeros, zeros + 1.0))


def gaussian_product(mean, var) -> ProductDistribution:
    """Independent N(mean_j, var_j) coordinates."""
    return ProductDistribution("gaussian", np.asarray(mean), np.asarray(var))


def product_distribution(
    mean,
    var,
    row_sampler: RowSampler,
    sum_sampler: SumSampler | None = None,
    support: tuple[np.ndarray, np.ndarray] | None = None,
) -> ProductDistribution:
    """Any independent-column family: its mean, variance and a row sampler (rng, size)."""
    return ProductDistribution(
        "custom", np.asarray(mean), np.asarray(var), support, row_sampler, sum_sampler
    )


def as_target(dist: ProductDistribution, z) -> np.ndarray:
    """Check a user target (length d, finite) and return it as float64."""
    z = np.asarray(z, dtype=np.float64).reshape(-1)
    if z.shape != (dist.d,) or not np.all(np.isfinite(z)):
        raise ValueError(f"target must be a finite vector of length d={dist.d}, got {z.shape}")
    return z


def _support(dist: ProductDistribution, which: str) -> tuple[np.ndarray, np.ndarray]:
    if dist.support is None:
        raise ValueError(
            f"{which}_target needs a bounded support (Bernoulli or custom with "
            "support=...); for unbounded families pass a user target"
        )
    return dist.support


def easy_target(dist: ProductDistribution) -> np.ndarray:
    """Support point with the largest Mahalanobis distance: the farther end per coordinate.

    For Bernoulli this is 1{p_j <= 1/2} (seed 001 Sec. 6.1): ties go to the upper end.
    """
    lo, hi = _support(dist, "easy")
    return np.where(dist.mean - lo > hi - dist.mean, lo, hi).astype(np.float64)


def hard_target(dist: ProductDistribution) -> np.ndarray:
    """Support point with the smallest Mahalanobis distance among corners: 1{p_j > 1/2}."""
    lo, hi = _support(dist, "hard")
    return np.where(dist.mean - lo > hi - dist.mean, hi, lo).astype(np.float64)


def medium_target(dist: ProductDistribution, rng: np.random.Generator | int) -> np.ndarray:
    """A target drawn from D itself: leakage score of order d / n (seed 001 Sec. 6.1)."""
    return dist.sample(rng, 1)[0]


def make_target(
    dist: ProductDistribution, kind: str | np.ndarray, rng: np.random.Generator | int = 0
) -> np.ndarray:
    """Target by name ('easy', 'hard', 'medium') or a user vector."""
    if isinstance(kind, str):
        if kind == "easy":
            return easy_target(dist)
        if kind == "hard":
            return hard_target(dist)
        if kind == "medium":
            return medium_target(dist, rng)
        raise ValueError(f"target must be 'easy', 'medium', 'hard' or a vector, got {kind!r}")
    return as_target(dist, kind)
