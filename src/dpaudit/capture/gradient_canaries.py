"""Gradient canaries: fixed vectors the hook adds to the clipped sum before noise (DESIGN 3).

``GradientCanaries`` are fixed vectors g* (norm <= C, in the coordinates of the hook's
parameter selection) that the hook itself adds to the clipped sum before noise, per step, with
an inclusion policy: ``"every_step"``, ``"bernoulli"`` (probability q_c per step, independently
per canary) or ``"never"`` (an "out" canary that is only scored). The policy may be one string
for all K vectors or a sequence of K strings (one-run audits: in-canaries ``"every_step"``,
out-canaries ``"never"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

POLICIES = ("every_step", "bernoulli", "never")


@dataclass
class GradientCanaries:
    """K fixed gradient vectors (K, d) inserted into the clipped sum before noise by policy.

    ``policy`` is one of ``"every_step"``, ``"bernoulli"``, ``"never"`` or a sequence of K of
    them; ``inclusion_prob`` (q_c in (0, 1]) and ``seed`` are required when any canary uses
    ``"bernoulli"``. The inclusion draws use ``numpy.random.default_rng(seed)``, one uniform per
    Bernoulli canary per real optimizer step, in canary order.
    """

    vectors: torch.Tensor
    policy: str | Sequence[str] = "every_step"
    inclusion_prob: float | None = None
    seed: int | np.random.SeedSequence | None = None
    policies: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        v = self.vectors
        if not isinstance(v, torch.Tensor) or v.ndim != 2 or v.shape[0] == 0 or v.shape[1] == 0:
            raise ValueError(
                "GradientCanaries: vectors must be a (K, d) torch tensor with K, d >= 1, got "
                f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}"
            )
        if not v.is_floating_point():
            raise ValueError(f"GradientCanaries: vectors must be floating point, got {v.dtype}")
        if not bool(torch.isfinite(v).all()):
            raise ValueError("GradientCanaries: vectors must be finite")
        k = v.shape[0]
        if isinstance(self.policy, str):
            pols = (self.policy,) * k
        else:
            pols = tuple(self.policy)
            if len(pols) != k:
                raise ValueError(
                    f"GradientCanaries: policy must be a string or a sequence of K = {k} "
                    f"strings, got {len(pols)}"
                )
        bad = sorted({p for p in pols if p not in POLICIES})
        if bad:
            raise ValueError(f"GradientCanaries: policy must be among {POLICIES}, got {bad}")
        self.policies = pols
        if "bernoulli" in pols:
            q = self.inclusion_prob
            if q is None or not 0.0 < float(q) <= 1.0:
                raise ValueError(
                    f"GradientCanaries: inclusion_prob must be in (0, 1] for the bernoulli "
                    f"policy, got {q!r}"
                )
            if self.seed is None:
                raise ValueError("GradientCanaries: seed is required for the bernoulli policy")

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        """Dimension d of the vectors (the size of the hook's parameter selection)."""
        return int(self.vectors.shape[1])

    @classmethod
    def dirac(
        cls,
        coords: Sequence[int],
        norm: float,
        dim: int,
        policy: str | Sequence[str] = "every_step",
        inclusion_prob: float | None = None,
        seed: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> GradientCanaries:
        """One canary per coordinate: ``norm`` times the unit vector e_coord in R^dim."""
        coords = [int(c) for c in coords]
        if not coords:
            raise ValueError("GradientCanaries.dirac: coords must be non-empty")
        if any(c < 0 or c >= dim for c in coords):
            raise ValueError(f"GradientCanaries.dirac: coords must lie in [0, {dim}), got {coords}")
        if not norm > 0:
            raise ValueError(f"GradientCanaries.dirac: norm must be positive, got {norm!r}")
        vectors = torch.zeros(len(coords), dim, dtype=dtype)
        vectors[torch.arange(len(coords)), torch.tensor(coords)] = float(norm)
        return cls(vectors, policy=policy, inclusion_prob=inclusion_prob, seed=seed)

    @classmethod
    def random_directions(
        cls,
        k: int,
        dim: int,
        norm: float,
        seed: int,
        policy: str | Sequence[str] = "every_step",
        inclusion_prob: float | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> GradientCanaries:
        """K isotropic random directions of length ``norm``; ``seed`` seeds the directions
        (torch.Generator) and the inclusion draws (numpy)."""
        if k < 1 or dim < 1:
            raise ValueError(
                f"GradientCanaries.random_directions: need k, dim >= 1, got {k}, {dim}"
            )
        if not norm > 0:
            raise ValueError(
                f"GradientCanaries.random_directions: norm must be positive, got {norm}"
            )
        gen = torch.Generator().manual_seed(int(seed))
        z = torch.randn(k, dim, generator=gen, dtype=torch.float64)
        vectors = (z / z.norm(dim=1, keepdim=True) * float(norm)).to(dtype)
        return cls(vectors, policy=policy, inclusion_prob=inclusion_prob, seed=seed)
