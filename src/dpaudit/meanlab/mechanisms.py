"""Mean mechanisms of seeds 000/001 with exact, vectorised samplers of their outputs.

Each mechanism samples ``rounds`` outputs at once given the membership bits of the rounds
(Algorithm 1's crafter: under b = 1 the target replaces one of the n rows). Sums of the
other rows come from `ProductDistribution.sample_sum`, so no n x d matrix is ever built.

- `ExactMean`: mu_hat = (1/n) sum Z_i.
- `NoisyMean`: mu_hat + N(0, C_gamma)/sqrt(n) ("paper", seed 001 Sec. 4 I), or noise
  N(0, gamma^2) on the *sum* ("sum", the DP-style Gaussian mechanism: gamma/n on the mean).
- `SubsampledMean`: k = round(rho n) rows without replacement. "shared": one inclusion event
  for the target shared by all coordinates (as in DP-SGD); "independent": an independent
  inclusion event per coordinate (the model the paper's proof of Thm 4.2 actually analyses).
- `PoissonSubsampledMean`: every row kept with probability q; the sum is divided by the
  realised batch size ("actual") or by q n ("expected", Opacus' normalisation).
The misspecified target is a scoring choice, not a mechanism: score with z_targ while the
game runs with z* (see `games.fixed_target_game(score_target=...)`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpaudit.meanlab.distributions import ProductDistribution
from dpaudit.seeds import as_generator


def _check_n(n: int) -> int:
    if int(n) != n or int(n) < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    return int(n)


def _members(members) -> np.ndarray:
    b = np.asarray(members)
    if b.ndim != 1 or b.size == 0:
        raise ValueError("members must be a non-empty 1-d array of membership bits")
    if not np.all((b == 0) | (b == 1)):
        raise ValueError("members must contain only 0/1 (or booleans)")
    return b.astype(bool)


def _target(dist: ProductDistribution, target, rounds: int) -> np.ndarray:
    z = np.asarray(target, dtype=np.float64)
    if z.shape not in ((dist.d,), (rounds, dist.d)):
        raise ValueError(
            f"target must have shape (d,) or (rounds, d) = {(rounds, dist.d)}, got {z.shape}"
        )
    return z


@dataclass(frozen=True)
class ExactMean:
    """Empirical mean of n rows; the target replaces one row when b = 1."""

    n: int

    def __post_init__(self) -> None:
        _check_n(self.n)

    def noise_var(self, dist: ProductDistribution) -> np.ndarray:
        """Extra per-coordinate variance in units of C/n (0 here; see NoisyMean)."""
        return np.zeros(dist.d)

    def sample(self, dist: ProductDistribution, target, members, rng) -> np.ndarray:
        """Outputs (rounds, d) for the given membership bits."""
        rng = as_generator(rng, "rng")
        b = _members(members)
        z = _target(dist, target, b.size)
        s = dist.sample_sum(rng, (self.n - b.astype(np.int64))[:, None], b.size)
        s += b[:, None] * z
        return s / self.n


@dataclass(frozen=True)
class NoisyMean:
    """Exact mean plus Gaussian noise; ``gamma`` scalar or per-coordinate (length d).

    scaling="paper": noise N(0, diag gamma^2)/sqrt(n) on the mean (C_gamma in Thm 4.1).
    scaling="sum": noise N(0, gamma^2) on the sum, i.e. gamma/n on the mean; for the theory
    this is C_gamma = gamma^2 / n.
    """

    n: int
    gamma: float | np.ndarray
    scaling: str = "paper"

    def __post_init__(self) -> None:
        _check_n(self.n)
        if self.scaling not in ("paper", "sum"):
            raise ValueError(f"scaling must be 'paper' or 'sum', got {self.scaling!r}")
        g = np.asarray(self.gamma, dtype=np.float64)
        if not np.all(np.isfinite(g)) or np.any(g < 0):
            raise ValueError(f"gamma must be finite and >= 0, got {self.gamma!r}")

    def noise_var(self, dist: ProductDistribution) -> np.ndarray:
        """C_gamma as it enters m~ = (1/n)||z - mu||^2_{(C + C_gamma)^{-1}}."""
        g2 = np.broadcast_to(np.asarray(self.gamma, dtype=np.float64) ** 2, (dist.d,))
        return g2 if self.scaling == "paper" else g2 / self.n

    def sample(self, dist: ProductDistribution, target, members, rng) -> np.ndarray:
        """Outputs (rounds, d): exact mean + noise."""
        rng = as_generator(rng, "rng")
        out = ExactMean(self.n).sample(dist, target, members, rng)
        sd = np.sqrt(self.noise_var(dist) / self.n)
        return out + sd * rng.standard_normal(out.shape)


@dataclass(frozen=True)
class SubsampledMean:
    """Mean of k = round(rho n) rows drawn without replacement (Thm 4.2's mechanism).

    mode="shared": the target is in the sub-sample with probability k/n, one event for the
    whole vector; given inclusion the output is (z + sum of k - 1 rows)/k, else (sum of k
    rows)/k. mode="independent": a separate inclusion event per coordinate.
    """

    n: int
    rho: float
    mode: str = "shared"

    def __post_init__(self) -> None:
        _check_n(self.n)
        if not 0.0 < float(self.rho) <= 1.0:
            raise ValueError(f"rho must lie in (0, 1], got {self.rho!r}")
        if self.mode not in ("shared", "independent"):
            raise ValueError(f"mode must be 'shared' or 'independent', got {self.mode!r}")
        if self.k < 1:
            raise ValueError(f"rho * n must round to at least 1 row, got k={self.k}")

    @property
    def k(self) -> int:
        """Sub-sample size k = round(rho n)."""
        return round(float(self.rho) * self.n)

    @property
    def rate(self) -> float:
        """Exact inclusion probability of the target, k / n."""
        return self.k / self.n

    def noise_var(self, dist: ProductDistribution) -> np.ndarray:
        """No added noise."""
        return np.zeros(dist.d)

    def sample(self, dist: ProductDistribution, target, members, rng) -> np.ndarray:
        """Outputs (rounds, d)."""
        rng = as_generator(rng, "rng")
        b = _members(members)
        z = _target(dist, target, b.size)
        shape = (b.size, 1) if self.mode == "shared" else (b.size, dist.d)
        inc = b.reshape(-1, 1) & (rng.random(shape) < self.rate)
        s = dist.sample_sum(rng, self.k - inc.astype(np.int64), b.size)
        s += inc * z
        return s / self.k


@dataclass(frozen=True)
class PoissonSubsampledMean:
    """Each of the n rows (target included, when b = 1) kept independently with prob. q."""

    n: int
    q: float
    normalise: str = "actual"

    def __post_init__(self) -> None:
        _check_n(self.n)
        if not 0.0 < float(self.q) <= 1.0:
            raise ValueError(f"q must lie in (0, 1], got {self.q!r}")
        if self.normalise not in ("actual", "expected"):
            raise ValueError(f"normalise must be 'actual' or 'expected', got {self.normalise!r}")

    @property
    def rate(self) -> float:
        """Inclusion probability of the target."""
        return float(self.q)

    def noise_var(self, dist: ProductDistribution) -> np.ndarray:
        """No added noise."""
        return np.zeros(dist.d)

    def sample(self, dist: ProductDistribution, target, members, rng) -> np.ndarray:
        """Outputs (rounds, d); an empty batch releases 0 (sum 0 over max(K, 1))."""
        rng = as_generator(rng, "rng")
        b = _members(members)
        z = _target(dist, target, b.size)
        others = rng.binomial(self.n - b.astype(np.int64), self.q)
        inc = b & (rng.random(b.size) < self.q)
        s = dist.sample_sum(rng, others[:, None], b.size)
        s += inc[:, None] * z
        if self.normalise == "expected":
            return s / (self.q * self.n)
        return s / np.maximum(others + inc, 1)[:, None]
