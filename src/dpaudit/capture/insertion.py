"""Gradient insertion: the included gradient canaries added to the clipped sum before noise.

At each real optimizer step the hook draws which gradient canaries are included (``policy``:
``"every_step"``, ``"bernoulli"`` with their own numpy generator, ``"never"``), sums the
included vectors, maps that sum from the hook's coordinates (the selection, or the view) to the
full parameter selection and adds it to ``p.summed_grad`` just before the optimizer adds its
noise. ``GradientInsertion`` holds the canaries on the model's device and does the draws and the
addition; the hook decides when.

Sparse canaries (``GradientCanaries.sparse`` / ``dirac``) never become (K, d): their included
values are summed on the union S of their supports and added at S, so a step costs
O(K x |support|); ``score_vectors`` gives the (K, columns) matrices the scores see, either in
the hook's coordinates or, when the hook routes scoring through S (``support()``), in S.
Dirac canaries (one entry per row) can be given to the scores as ``DiracRows`` instead, the
(K, columns) matrix never built: a step then costs O(K), not O(K x columns) (K^2 for K Dirac
canaries in their own coordinate view, 4 x 10^10 bytes and ~10^10 operations per step at
K = 10^5), with the same values (``DiracRows``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpaudit.capture.gradient_canaries import NORM_SLACK, GradientCanaries
from dpaudit.capture.view import CoordinateView


class DiracRows:
    """K rows of a (K, cols) matrix with one entry each, row k being ``values[k]`` at column
    ``index[k]``, without the matrix: what scores that read the canaries only through
    ``rows @ vector`` and ``rows.norm(dim=1)`` (``ScalarProduct``, ``MixtureLR``) get in place
    of the dense rows of Dirac canaries. O(K) per product instead of O(K cols).

    The values are those of the dense rows: a row's product with a vector is one rounded
    product plus exact zeros, its norm sqrt(v^2) plus exact zeros, whatever the summation
    order (the released vector is checked finite, so no 0 x inf)."""

    def __init__(self, index: torch.Tensor, values: torch.Tensor, cols: int) -> None:
        if index.shape != values.shape or index.ndim != 1:
            raise ValueError(f"DiracRows: index and values must be (K,), got "
                             f"{tuple(index.shape)} and {tuple(values.shape)}")
        self.index, self.values, self.cols = index, values, int(cols)

    @classmethod
    def cat(cls, blocks: Sequence[DiracRows]) -> DiracRows:
        """The rows of ``blocks`` one after the other (``torch.cat`` of the dense rows)."""
        return cls(torch.cat([b.index for b in blocks]), torch.cat([b.values for b in blocks]),
                   blocks[0].cols)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((int(self.index.numel()), self.cols))

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def __len__(self) -> int:
        return int(self.index.numel())

    def __matmul__(self, vec: torch.Tensor) -> torch.Tensor:
        if not isinstance(vec, torch.Tensor) or vec.shape != (self.cols,):
            raise ValueError(f"DiracRows @ vector: need a ({self.cols},) tensor, got "
                             f"{getattr(vec, 'shape', type(vec).__name__)}")
        if vec.dtype != self.values.dtype:  # as the dense matmul refuses
            raise RuntimeError(f"DiracRows @ vector: dtypes differ ({self.values.dtype} and "
                               f"{vec.dtype})")
        return self.values * vec.index_select(0, self.index)

    def norm(self, p="fro", dim=None) -> torch.Tensor:
        """The rows' Euclidean norms (``dim=1``; the only norm the scores take)."""
        if dim != 1 or p not in ("fro", 2):
            raise NotImplementedError("DiracRows.norm: only the rows' 2-norms (dim=1)")
        return torch.linalg.vector_norm(self.values.unsqueeze(1), dim=1)

    def to_dense(self) -> torch.Tensor:
        """The (K, cols) matrix (K x cols memory: for tests and small K only)."""
        out = self.values.new_zeros(len(self), self.cols)
        return out.scatter_(1, self.index.unsqueeze(1), self.values.unsqueeze(1))


class RowBlocks:
    """The rows of several blocks one after the other, each a (K_b, cols) tensor or
    ``DiracRows``, without concatenating them: what ``ScalarProduct`` and ``MixtureLR`` get
    when Dirac canaries share a hook with dense ones (input canaries' per-sample gradients).
    ``torch.cat`` would make the Dirac rows a dense (K, cols) matrix and copy every block at
    every step; here each block answers ``@ vector`` and ``norm(dim=1)`` itself, with the
    values of the concatenated matrix (each row's product and norm are its own block's)."""

    def __init__(self, blocks: Sequence) -> None:
        cols = {int(b.shape[1]) for b in blocks}
        if len(cols) != 1 or any(b.ndim != 2 for b in blocks):
            raise ValueError(f"RowBlocks: blocks must be (K_b, cols) with one cols, got "
                             f"{[tuple(b.shape) for b in blocks]}")
        self.blocks, self.cols = list(blocks), cols.pop()

    @property
    def shape(self) -> torch.Size:
        return torch.Size((sum(int(b.shape[0]) for b in self.blocks), self.cols))

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks[0].dtype

    @property
    def device(self) -> torch.device:
        return self.blocks[0].device

    def __len__(self) -> int:
        return int(self.shape[0])

    def __matmul__(self, vec: torch.Tensor) -> torch.Tensor:
        return torch.cat([b @ vec for b in self.blocks])

    def norm(self, p="fro", dim=None) -> torch.Tensor:
        """The rows' Euclidean norms (``dim=1``; the only norm the scores take)."""
        if dim != 1 or p not in ("fro", 2):
            raise NotImplementedError("RowBlocks.norm: only the rows' 2-norms (dim=1)")
        return torch.cat([b.norm(dim=1) for b in self.blocks])

    def to_dense(self) -> torch.Tensor:
        """The (K, cols) matrix (for tests and small K only)."""
        return torch.cat([b.to_dense() if isinstance(b, DiracRows) else b for b in self.blocks])


class ClippedRows:
    """K clipped per-sample gradient rows kept as the per-parameter row views they came from
    (the folded canary rows of Opacus' ``grad_sample``) and their clip factors, never written
    out as a (K, d) matrix: what ``ScalarProduct`` and ``MixtureLR`` need of input canaries is
    each row's product with the release and its norm, which the parts give exactly (each
    part read in ``dtype``, at least float32). Saves the K x d buffer and its write per step.

    Args:
        parts: the (K, w_p) row views, one per selected parameter, in the view's order.
        factors: the (K, 1) clip factor of each part (one shared factor under flat clipping).
        part_norms: (K, len(parts)) the parts' norms before clipping, in ``dtype``.
        dtype: the dtype the rows are read in.
    """

    def __init__(self, parts, factors, part_norms: torch.Tensor, dtype: torch.dtype) -> None:
        self.parts, self.factors = list(parts), list(factors)
        self.part_norms = part_norms
        self._dtype = dtype
        self.widths = [int(p.shape[1]) for p in self.parts]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((int(self.parts[0].shape[0]), sum(self.widths)))

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    def __len__(self) -> int:
        return int(self.shape[0])

    def __matmul__(self, vec: torch.Tensor) -> torch.Tensor:
        out = None
        for part, f, v in zip(self.parts, self.factors, vec.split(self.widths), strict=True):
            term = (part.to(self._dtype) @ v.to(self._dtype)) * f.squeeze(1)
            out = term if out is None else out + term
        return out

    def norm(self, p="fro", dim=None) -> torch.Tensor:
        """The clipped rows' Euclidean norms (``dim=1``; the only norm the scores take)."""
        if dim != 1 or p not in ("fro", 2):
            raise NotImplementedError("ClippedRows.norm: only the rows' 2-norms (dim=1)")
        scaled = torch.cat([self.part_norms[:, [i]] * f for i, f in enumerate(self.factors)],
                           dim=1)
        return scaled.norm(dim=1)

    def __mul__(self, scale: float) -> ClippedRows:
        """The rows times a number (adaptive clipping's C_0 / C_t)."""
        return ClippedRows(self.parts, [f * scale for f in self.factors], self.part_norms,
                           self._dtype)

    def to(self, dtype: torch.dtype) -> ClippedRows:
        return ClippedRows(self.parts, self.factors, self.part_norms, dtype)

    def split(self, sizes: Sequence[int]) -> list[ClippedRows]:
        """Consecutive groups of rows (one per canary set)."""
        out, start = [], 0
        for n in sizes:
            sl = slice(start, start + n)
            out.append(ClippedRows([p[sl] for p in self.parts], [f[sl] for f in self.factors],
                                   self.part_norms[sl], self._dtype))
            start += n
        return out

    def to_dense(self) -> torch.Tensor:
        """The (K, d) matrix (for tests and small K only)."""
        return torch.cat([p.to(self._dtype) * f for p, f in zip(self.parts, self.factors,
                                                                 strict=True)], dim=1)


def check_gradient_canaries(canaries: Sequence, dim: int, max_grad_norm: float, where: str) -> None:
    """Raise ValueError unless every ``GradientCanaries`` in ``canaries`` has ``dim`` columns
    and rows of norm <= C (``where`` names the coordinates, for the message). No K x d
    temporaries: norms are computed per 64 rows, or from the sparse values."""
    for c in canaries:
        if not isinstance(c, GradientCanaries):
            continue
        if c.dim != dim:
            raise ValueError(
                f"canaries: gradient canary vectors must have d = {dim} columns ({where}), "
                f"got shape {(len(c), c.dim)}"
            )
        norms = c.norms()
        too_big = (norms > max_grad_norm * (1 + NORM_SLACK)).nonzero().flatten()
        if too_big.numel():
            raise ValueError(
                f"canaries: gradient canaries must have norm <= C = {max_grad_norm}; "
                f"canaries {too_big.tolist()[:20]} have norms {norms[too_big].tolist()[:20]}"
            )


class GradientInsertion:
    """Inclusion draws and insertion of the gradient canaries among ``canaries``.

    Args:
        canaries: the hook's canary list (input canaries get a False inclusion and no vector).
        view: the hook's coordinate view (canary vectors are in its coordinates).
    """

    def __init__(self, canaries: Sequence, view: CoordinateView) -> None:
        self.canaries = list(canaries)
        self.view = view
        self.num_canaries = sum(len(c) for c in self.canaries)
        self.active = any(isinstance(c, GradientCanaries) for c in self.canaries)
        self._fixed_row: np.ndarray | None = None
        self._policy_masks: list | None = None  # per set: (every_step, bernoulli) masks
        self._rngs: list[np.random.Generator | None] = [None] * len(self.canaries)
        self._is_grad = [isinstance(c, GradientCanaries) for c in self.canaries]
        self._sparse = [
            g and c.is_sparse for g, c in zip(self._is_grad, self.canaries, strict=True)
        ]
        self._support = self._full_support()
        self._support_blocks = None

    @property
    def all_sparse(self) -> bool:
        """Every canary is a sparse gradient canary."""
        return all(self._sparse)

    @property
    def any_dirac(self) -> bool:
        """Some canary set is sparse gradient canaries with one entry each (``score_vectors``
        gives those sets as ``DiracRows``)."""
        return any(self._is_dirac(i) for i in range(len(self.canaries)))

    def _is_dirac(self, i: int) -> bool:
        c = self.canaries[i]
        return bool(self._sparse[i]) and c.indices.shape[1] == 1

    def _to_full(self, idx: torch.Tensor) -> torch.Tensor:
        """Hook coordinates -> indices into the full flattened selection."""
        idx = idx.long()
        return idx if self.view.coordinates is None else self.view.coordinates[idx]

    def _full_support(self) -> torch.Tensor | None:
        """Sorted union (full-selection indices) of the sparse canaries' supports, or None."""
        parts = [
            self._to_full(c.indices.cpu()).reshape(-1)
            for c, sp in zip(self.canaries, self._sparse, strict=True)
            if sp
        ]
        return torch.unique(torch.cat(parts)) if parts else None

    def support(self) -> torch.Tensor | None:
        """The union S of the sparse canaries' supports (full-selection indices, sorted)."""
        return self._support

    # ------------------------------------------------------------------ set-up
    def start(self, device: torch.device, dtype: torch.dtype) -> None:
        """Move the canaries to the model's device and dtype and seed the inclusion draws."""
        self._device, self._dtype = device, dtype
        self._always = [
            np.array(c.policies) == "every_step" if g else None
            for c, g in zip(self.canaries, self._is_grad, strict=True)
        ]
        # dense sets: (K, dim) in hook coordinates; sparse sets: positions in S and values
        self._dense = [
            c.vectors.to(device=device, dtype=dtype) if g and not sp else None
            for c, g, sp in zip(self.canaries, self._is_grad, self._sparse, strict=True)
        ]
        support = self._support
        self._s_full = None if support is None else support.to(device)
        self._pos, self._vals = [], []
        for c, sp in zip(self.canaries, self._sparse, strict=True):
            if sp:
                pos = torch.searchsorted(support, self._to_full(c.indices.cpu()))
                self._pos.append(pos.to(device))
                self._vals.append(c.values.to(device=device, dtype=dtype))
            else:
                self._pos.append(None)
                self._vals.append(None)
        fixed = [
            vec[torch.from_numpy(always).to(device)].sum(0)
            for vec, always in zip(self._dense, self._always, strict=True)
            if vec is not None and always.any()
        ]
        self._every_step_dense = torch.stack(fixed).sum(0) if fixed else None
        self._every_step_sparse = None
        if support is not None:
            buf = torch.zeros(support.numel(), device=device, dtype=dtype)
            for pos, vals, always in zip(self._pos, self._vals, self._always, strict=True):
                if pos is not None and always.any():
                    keep = torch.from_numpy(always).to(device)
                    buf.index_add_(0, pos[keep].reshape(-1), vals[keep].reshape(-1))
            self._every_step_sparse = buf
            self._s_ranges = [
                (int(torch.searchsorted(support, a)), int(torch.searchsorted(support, b)))
                for a, b in zip(self.view.offsets[:-1], self.view.offsets[1:], strict=True)
            ]
        self._rngs = [
            np.random.default_rng(c.seed) if g and "bernoulli" in c.policies else None
            for c, g in zip(self.canaries, self._is_grad, strict=True)
        ]
        if not any(r is not None for r in self._rngs):
            self._fixed_row = self.draw()

    def score_vectors(self, routed: bool, dirac_rows: bool = False) -> list:
        """Per canary set, the (K_set, columns) vectors scores see (None for input canaries):
        columns are the hook's coordinates, or positions in S when ``routed``;
        ``dirac_rows``: the Dirac sets (one entry a row) as ``DiracRows``, never
        (K_set, columns)."""
        out = []
        for i, (c, dense, pos, vals) in enumerate(zip(
            self.canaries, self._dense, self._pos, self._vals, strict=True
        )):
            if dense is not None:
                if routed:
                    raise RuntimeError("dense gradient canaries cannot be routed through S")
                out.append(dense)
            elif pos is not None:
                cols = self._s_full.numel() if routed else c.dim
                where = pos if routed else c.indices.long().to(self._device)
                if dirac_rows and self._is_dirac(i):
                    out.append(DiracRows(where[:, 0].contiguous(), vals[:, 0].contiguous(), cols))
                else:
                    out.append(vals.new_zeros(len(c), cols).scatter_(1, where, vals))
            else:
                out.append(None)
        return out

    def support_positions(self) -> list[torch.Tensor | None]:
        """Per canary set, its sparse canaries' (K_set, nnz) positions in S (None for input
        and dense gradient canaries); after ``start``."""
        return list(self._pos)

    @torch.no_grad()
    def data_on_support(self) -> torch.Tensor | None:
        """(|S|,) the optimizer's clipped sum ``p.summed_grad`` on the union S of the sparse
        canaries' supports, read before any canary is inserted (the data's own contribution
        there: exactly zero at every step for canaries independent of the data), in the
        parameters' dtype on the model's device; None without sparse canaries. O(|S|), no host
        sync."""
        if self._support is None:
            return None
        if self._support_blocks is None:  # (parameter, its local indices), once
            self._support_blocks = [
                (p, self._s_full[lo:hi] - a) for (p, a, _), (lo, hi) in
                zip(self.view.slices(), self._s_ranges, strict=True) if hi > lo]
        parts = [p.summed_grad.take(local) if p.summed_grad is not None
                 else local.new_zeros(local.shape, dtype=p.dtype)
                 for p, local in self._support_blocks]  # take indexes as 1-D, like put_
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    # ------------------------------------------------------------------ per step
    def draw(self) -> np.ndarray:
        """One (K,) bool row of inclusions for this step (input canaries: False)."""
        if self._fixed_row is not None:  # nothing random: the same row every step
            return self._fixed_row.copy()
        if self._policy_masks is None:  # once: a set's policies never change (K strings
            # read into an array at every step cost 4 ms at K = 2 x 10^4)
            self._policy_masks = [
                None if not isinstance(c, GradientCanaries) else
                (np.array(c.policies) == "every_step", np.array(c.policies) == "bernoulli")
                for c in self.canaries]
        row = []
        for c, rng, masks in zip(self.canaries, self._rngs, self._policy_masks, strict=True):
            if masks is None:
                row.append(np.zeros(len(c), dtype=bool))
                continue
            every, bern = masks
            inc = every.copy()
            n = int(bern.sum())
            if n:
                inc[bern] = rng.random(n) < float(c.inclusion_prob)
            row.append(inc)
        return np.concatenate(row)

    def included_sum(self, row: np.ndarray) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(dense (full_dim,) sum of the included dense canaries or None, (|S|,) sum of the
        included sparse canaries on S or None)."""
        if not row.any():
            return None, None
        dense = [] if self._every_step_dense is None else [self._every_step_dense]
        sparse = None if self._every_step_sparse is None else self._every_step_sparse.clone()
        start = 0
        for c, vec, pos, vals, always in zip(
            self.canaries, self._dense, self._pos, self._vals, self._always, strict=True
        ):
            n = len(c)
            if always is not None:
                mask = row[start : start + n] & ~always
                if mask.any():
                    idx = torch.from_numpy(np.flatnonzero(mask)).to(self._device)
                    if vec is not None:
                        dense.append(vec.index_select(0, idx).sum(0))
                    else:
                        sparse.index_add_(
                            0,
                            pos.index_select(0, idx).reshape(-1),
                            vals.index_select(0, idx).reshape(-1),
                        )
            start += n
        total = self.view.scatter(torch.stack(dense).sum(0)) if dense else None
        return total, sparse

    def insert(self, row: np.ndarray, step: int, scale: float = 1.0) -> None:
        """Add the canaries included in ``row`` to every selected ``p.summed_grad``, times
        ``scale`` (adaptive clipping: C_t / C_0, so that a canary of norm C_0 is one of C_t)."""
        total, sparse = self.included_sum(row)
        if total is None and sparse is None:
            return
        if scale != 1.0:
            total = None if total is None else total * scale
            sparse = None if sparse is None else sparse * scale
        for i, (p, a, b) in enumerate(self.view.slices()):
            if p.summed_grad is None:
                raise RuntimeError(f"parameter has no summed_grad at step {step}")
            if total is not None:
                p.summed_grad.add_(total[a:b].view_as(p.summed_grad).to(p.summed_grad.dtype))
            if sparse is not None:
                lo, hi = self._s_ranges[i]
                if hi > lo:  # put_ indexes the tensor as 1-D, contiguous or not
                    sg = p.summed_grad
                    sg.put_(self._s_full[lo:hi] - a, sparse[lo:hi].to(sg.dtype), accumulate=True)
