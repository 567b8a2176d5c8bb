"""The coordinate view: the flattened parameter selection, optionally restricted to indices.

The hook records and scores vectors in the coordinates of its parameter selection, flattened in
``named_parameters`` order (``selection``). ``coordinates=`` restricts that further to a 1-D list
of distinct indices (a coordinate-level selection): the released gradient and the input canaries'
clipped gradients are gathered at them, gradient canaries given in view coordinates are scattered
into the full vector for insertion. ``CoordinateView`` does both directions and reads the released
gradient; it costs O(|view|) per vector, never O(d) copies beyond the one flatten of ``p.grad``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def check_coordinates(coordinates, full_dim: int) -> torch.Tensor | None:
    """The view as a (|view|,) int64 CPU tensor of distinct indices in [0, full_dim), or None."""
    if coordinates is None:
        return None
    arr = np.asarray(
        coordinates.detach().cpu().numpy() if isinstance(coordinates, torch.Tensor) else coordinates
    )
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"coordinates must be a non-empty 1-D sequence of indices, got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"coordinates must be integers, got dtype {arr.dtype}")
    if arr.min() < 0 or arr.max() >= full_dim:
        raise ValueError(
            f"coordinates must lie in [0, {full_dim}) (the flattened parameter selection), "
            f"got range [{arr.min()}, {arr.max()}]"
        )
    if np.unique(arr).size != arr.size:
        raise ValueError("coordinates must be distinct")
    return torch.as_tensor(arr, dtype=torch.int64)


class CoordinateView:
    """Gather / scatter between the flattened selection of ``params`` and the view.

    Args:
        params: the selected parameters, in selection order.
        coordinates: None (the whole selection) or distinct indices into it (``check_coordinates``).
    """

    def __init__(self, params: Sequence[torch.Tensor], coordinates: torch.Tensor | None) -> None:
        self.params = list(params)
        self.offsets = np.cumsum([0] + [p.numel() for p in self.params]).tolist()
        self.full_dim = int(self.offsets[-1])
        self.coordinates = coordinates
        self.dim = self.full_dim if coordinates is None else int(coordinates.numel())
        self._index: torch.Tensor | None = None
        self._blocks = None

    def to(self, device: torch.device) -> CoordinateView:
        """Move the index to ``device`` (once, at the first step); returns self."""
        self._index = None if self.coordinates is None else self.coordinates.to(device)
        self._blocks = None
        return self

    @property
    def index(self) -> torch.Tensor | None:
        """The view's indices on the model's device (None: the whole selection)."""
        return self._index

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Restrict vectors (..., full_dim) along the last axis to the view."""
        return x if self._index is None else x.index_select(x.ndim - 1, self._index)

    def scatter(self, v: torch.Tensor) -> torch.Tensor:
        """A (|view|,) vector as the (full_dim,) vector that is zero off the view."""
        if self._index is None:
            return v
        return v.new_zeros(self.full_dim).index_copy_(0, self._index, v)

    @torch.no_grad()
    def released(self) -> torch.Tensor:
        """The released gradient ``p.grad`` of the selection, flattened and gathered.

        With a view, each parameter's coordinates are gathered from its own ``p.grad``
        (O(|view|), no flattened copy of the whole selection)."""
        if self._index is None:
            return torch.cat([p.grad.reshape(-1) for p in self.params])
        if self._blocks is None:
            self._blocks = self._per_parameter_blocks()
        parts = [
            p.grad.reshape(-1).index_select(0, local)
            for p, local in zip(self.params, self._blocks[0], strict=True)
            if local is not None
        ]
        gathered = torch.cat(parts) if len(parts) > 1 else parts[0]
        return gathered.index_select(0, self._blocks[1])  # back to the view's order

    def _per_parameter_blocks(self):
        """Per parameter, the sorted local indices of the view's coordinates in it (or None),
        and the permutation from that parameter-sorted order back to the view's order."""
        idx = self._index
        order = torch.argsort(idx)
        srt = idx.index_select(0, order)
        locals_ = []
        for a, b in zip(self.offsets[:-1], self.offsets[1:], strict=True):
            lo = int(torch.searchsorted(srt, a))
            hi = int(torch.searchsorted(srt, b))
            locals_.append(srt[lo:hi] - a if hi > lo else None)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        return locals_, back

    def slices(self):
        """(parameter, start, stop) of each parameter's block in the flattened selection."""
        return zip(self.params, self.offsets[:-1], self.offsets[1:], strict=True)
