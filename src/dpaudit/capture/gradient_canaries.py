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

import numpy as np
import torch

from dpaudit._validate import did_you_mean, quoted, require_choice
from dpaudit.names import CANARY_POLICIES

POLICIES = CANARY_POLICIES


def policy_sample_rate(policy: str, inclusion_prob: float | None) -> float:
    """Per-step probability that a canary of ``policy`` enters the noisy sum: 1 for
    ``"every_step"``, q_c = ``inclusion_prob`` for ``"bernoulli"``, 0 for ``"never"`` (the one
    rule; the threat model's canary sample rate is this for its members)."""
    require_choice("policy", policy, POLICIES)
    if policy == "bernoulli":
        if inclusion_prob is None:
            raise ValueError("policy 'bernoulli' needs inclusion_prob (q_c)")
        return float(inclusion_prob)
    return 1.0 if policy == "every_step" else 0.0

# The one rule for a canary's norm, ||g*|| <= C * (1 + NORM_SLACK), wherever it is checked (the
# hook's check of the canaries it is given, the settings' canary.norm). The slack is relative
# float rounding: a row scaled to norm C in float32 has a computed norm up to a few float32
# ulps (~1e-7 relative) above C, which 1e-9 would refuse; 1e-6 changes the sensitivity by a
# factor 1 + 1e-6, far below any bound's resolution.
NORM_SLACK = 1e-6


_CHUNK_ROWS = 64  # rows of a dense (K, d) matrix validated at a time (no K x d temporaries)


def _row_norms(rows: torch.Tensor) -> torch.Tensor:
    """(K,) float64 Euclidean norms of the rows of a (K, d) tensor, 64 rows at a time."""
    out = torch.empty(rows.shape[0], dtype=torch.float64)
    for a in range(0, rows.shape[0], _CHUNK_ROWS):
        out[a : a + _CHUNK_ROWS] = torch.linalg.vector_norm(
            rows[a : a + _CHUNK_ROWS].double(), dim=1
        ).cpu()
    return out


def _all_finite(rows: torch.Tensor) -> bool:
    """Whether every entry is finite, 64 rows at a time (no K x d boolean temporary)."""
    return all(
        bool(torch.isfinite(rows[a : a + _CHUNK_ROWS]).all())
        for a in range(0, rows.shape[0], _CHUNK_ROWS)
    )


NO_COORDINATES = (
    "GradientCanaries.dirac: coords is empty. From dead_coordinates(model, data) this means "
    "the model has no coordinates its data can never reach (no input feature is zero in every "
    "example, or the first layer does not read the input itself: e.g. a tanh MLP on dense "
    "data). What to do next: (1) input canaries, InputCanaries(x, y) with a coin-flip "
    "membership, need no dead coordinates; (2) Dirac canaries on coordinates the data use, "
    "e.g. GradientCanaries.dirac(range(k), norm, dim), are valid canaries but not independent "
    "experiments: give audit_report independent_canaries=False (the default; only the "
    "one-run bound certifies); (3) dead_coordinates(model, data, kind='at_theta0') gives "
    "coordinates dead only at the initial parameters, which training can revive (then the "
    "canaries are not independent for the whole training). docs/python_api.md, \"Canaries for "
    "your model\"."
)
"""What ``GradientCanaries.dirac`` says when it is given no coordinates: why, and what to do."""


class GradientCanaries:
    """K fixed gradient vectors in R^d inserted into the clipped sum before noise by policy.

    Dense: ``GradientCanaries(vectors, policy, inclusion_prob, seed)`` with a (K, d) tensor.
    Sparse (what ``dirac`` builds): ``GradientCanaries.sparse(indices, values, dim, ...)``, row k
    being ``values[k]`` at columns ``indices[k]``; the hook then costs O(K x |support|) per step
    and never builds the (K, d) matrix (module ``insertion``). ``vectors`` is always available as
    the dense (K, d) matrix, built on demand for sparse canaries (it costs K x d: avoid it at
    scale; ``norms()`` and ``support()`` do not).

    ``policy`` is one of ``"every_step"``, ``"bernoulli"``, ``"never"`` or a sequence of K of
    them; ``inclusion_prob`` (q_c in (0, 1]) and ``seed`` are required when any canary uses
    ``"bernoulli"``. The inclusion draws use ``numpy.random.default_rng(seed)``, one uniform per
    Bernoulli canary per real optimizer step, in canary order.
    """

    def __init__(
        self,
        vectors: torch.Tensor | None = None,
        policy: str | Sequence[str] = "every_step",
        inclusion_prob: float | None = None,
        seed: int | np.random.SeedSequence | Sequence[int] | None = None,
        *,
        indices: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        dim: int | None = None,
    ) -> None:
        self.policy, self.inclusion_prob, self.seed = policy, inclusion_prob, seed
        if vectors is not None:
            if indices is not None or values is not None or dim is not None:
                raise ValueError(
                    "GradientCanaries: give either dense vectors or sparse indices/values/dim, "
                    "not both"
                )
            self._check_dense(vectors)
            self._dense, self._indices, self._values = vectors, None, None
            self._dim = int(vectors.shape[1])
        else:
            self._check_sparse(indices, values, dim)
            self._dense, self._indices, self._values = None, indices, values
            self._dim = int(dim)
        k = len(self)
        if isinstance(policy, str):
            pols = (policy,) * k
        else:
            pols = tuple(policy)
            if len(pols) != k:
                raise ValueError(
                    f"GradientCanaries: policy must be a string or a sequence of K = {k} "
                    f"strings, got {len(pols)}"
                )
        bad = sorted({p for p in pols if p not in POLICIES})
        if bad:
            raise ValueError(
                f"GradientCanaries: policy must be among {POLICIES}, got {quoted(bad)}"
                f"{did_you_mean(bad[0], POLICIES)}")
        self.policies: tuple[str, ...] = pols
        if "bernoulli" in pols:
            q = inclusion_prob
            if q is None or not 0.0 < float(q) <= 1.0:
                raise ValueError(
                    f"GradientCanaries: inclusion_prob must be in (0, 1] for the bernoulli "
                    f"policy, got {q!r}"
                )
            if seed is None:
                raise ValueError("GradientCanaries: seed is required for the bernoulli policy")

    @staticmethod
    def _check_dense(v) -> None:
        if not isinstance(v, torch.Tensor) or v.ndim != 2 or v.shape[0] == 0 or v.shape[1] == 0:
            raise ValueError(
                "GradientCanaries: vectors must be a (K, d) torch tensor with K, d >= 1, got "
                f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}"
            )
        if not v.is_floating_point():
            raise ValueError(f"GradientCanaries: vectors must be floating point, got {v.dtype}")
        if not _all_finite(v):
            raise ValueError("GradientCanaries: vectors must be finite")

    @staticmethod
    def _check_sparse(indices, values, dim) -> None:
        if not isinstance(indices, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise ValueError(
                "GradientCanaries: vectors (dense) or indices and values (sparse) tensors "
                "are required"
            )
        if indices.ndim != 2 or indices.shape[0] == 0 or indices.shape[1] == 0:
            raise ValueError(
                f"GradientCanaries: indices must be a (K, s) tensor with K, s >= 1, got "
                f"{tuple(indices.shape)}"
            )
        if indices.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"GradientCanaries: indices must be integers, got {indices.dtype}")
        if values.shape != indices.shape or not values.is_floating_point():
            raise ValueError(
                "GradientCanaries: values must be a floating-point tensor shaped like indices "
                f"{tuple(indices.shape)}, got {values.dtype} {tuple(values.shape)}"
            )
        if not isinstance(dim, int | np.integer) or dim < 1:
            raise ValueError(f"GradientCanaries: dim must be a positive integer, got {dim!r}")
        if int(indices.min()) < 0 or int(indices.max()) >= dim:
            raise ValueError(
                f"GradientCanaries: indices must lie in [0, {dim}), got range "
                f"[{int(indices.min())}, {int(indices.max())}]"
            )
        if indices.shape[1] > 1:
            srt = indices.sort(dim=1).values
            if bool((srt[:, 1:] == srt[:, :-1]).any()):
                raise ValueError("GradientCanaries: indices must be distinct within each row")
        if not bool(torch.isfinite(values).all()):
            raise ValueError("GradientCanaries: values must be finite")

    @classmethod
    def sparse(
        cls,
        indices: torch.Tensor,
        values: torch.Tensor,
        dim: int,
        policy: str | Sequence[str] = "every_step",
        inclusion_prob: float | None = None,
        seed: int | np.random.SeedSequence | Sequence[int] | None = None,
    ) -> GradientCanaries:
        """K sparse canaries: row k is ``values[k]`` at columns ``indices[k]`` (both (K, s),
        distinct columns within a row) of R^dim."""
        return cls(None, policy, inclusion_prob, seed, indices=indices, values=values, dim=dim)

    # ------------------------------------------------------------------ views of the vectors
    def __len__(self) -> int:
        src = self._dense if self._dense is not None else self._indices
        return int(src.shape[0])

    def __repr__(self) -> str:
        kind = "dense" if self._dense is not None else f"sparse s={self._indices.shape[1]}"
        return f"GradientCanaries(K={len(self)}, d={self._dim}, {kind}, policy={self.policy!r})"

    @property
    def dim(self) -> int:
        """Dimension d of the vectors (the size of the hook's parameter selection)."""
        return self._dim

    @property
    def is_sparse(self) -> bool:
        """Whether the canaries are stored as indices and values."""
        return self._dense is None

    @property
    def indices(self) -> torch.Tensor | None:
        """(K, s) column indices of sparse canaries (None for dense ones)."""
        return self._indices

    @property
    def values(self) -> torch.Tensor | None:
        """(K, s) values of sparse canaries (None for dense ones)."""
        return self._values

    @property
    def dtype(self) -> torch.dtype:
        return (self._dense if self._dense is not None else self._values).dtype

    @property
    def vectors(self) -> torch.Tensor:
        """The dense (K, d) matrix (built on demand, K x d memory, for sparse canaries)."""
        if self._dense is not None:
            return self._dense
        out = torch.zeros(len(self), self._dim, dtype=self._values.dtype)
        return out.scatter_(1, self._indices.long().cpu(), self._values.cpu())

    def member_sample_rate(self, membership: np.ndarray | None = None) -> float:
        """The per-step rate at which the members (``membership``; None: every canary whose
        policy is not ``"never"``) enter the noisy sum (``policy_sample_rate``); members with
        different policies are refused: each policy has its own threat model."""
        pols = np.asarray(self.policies)
        member = set(pols[pols != "never"] if membership is None else pols[membership])
        if len(member) > 1:
            raise ValueError(
                f"canaries: member gradient canaries use several policies {sorted(member)}; "
                "audit one policy at a time (each has its own threat model)"
            )
        policy = member.pop() if member else "every_step"
        q_c = 1.0 if self.inclusion_prob is None else self.inclusion_prob
        return policy_sample_rate(policy, q_c)

    def norms(self) -> torch.Tensor:
        """(K,) float64 norms, without a K x d temporary."""
        if self._dense is not None:
            return _row_norms(self._dense)
        return torch.linalg.vector_norm(self._values.double(), dim=1).cpu()

    def support(self) -> torch.Tensor | None:
        """Sorted distinct columns any sparse canary touches (None for dense ones)."""
        if self._dense is not None:
            return None
        return torch.unique(self._indices.long().cpu().reshape(-1))

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
        """One canary per coordinate: ``norm`` times the unit vector e_coord in R^dim, stored
        sparsely (K indices and values; ``vectors`` densifies on demand)."""
        coords = [int(c) for c in coords]
        if not coords:
            raise ValueError(NO_COORDINATES)
        outside = [c for c in coords if c < 0 or c >= dim]
        if outside:
            raise ValueError(
                f"GradientCanaries.dirac: coords must lie in [0, {dim}) (the trainable "
                f"parameters' flat coordinates, dpaudit.capture.flat_coordinate); "
                f"{len(outside)} of {len(coords)} do not: {quoted(outside)}")
        if not norm > 0:
            raise ValueError(f"GradientCanaries.dirac: norm must be positive, got {norm!r}")
        indices = torch.tensor(coords, dtype=torch.int64).reshape(-1, 1)
        values = torch.full((len(coords), 1), float(norm), dtype=dtype)
        return cls.sparse(indices, values, int(dim), policy, inclusion_prob, seed)

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
