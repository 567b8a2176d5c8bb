"""Trace mode (research): released gradients written to disk in ``.npy`` chunks.

At each real optimizer step the hook hands the released gradient g_t (d,) to a ``Trace``; the
trace keeps either its projection ``basis @ g_t`` onto a user basis (B x d) or, without a basis,
g_t itself (only sensible for small d), and optionally the canaries' gradients projected the
same way (K x B per step). Rows are buffered for ``chunk_steps`` steps and then written to
``released_00000.npy``, ``released_00001.npy``, ... (and ``canaries_*.npy``), so memory holds
at most ``chunk_steps`` rows, never T x d. ``meta.json`` describes the layout; ``load_trace``
reads a directory back.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


class Trace:
    """Chunked on-disk record of released gradients (optionally projected onto ``basis``)."""

    def __init__(
        self,
        directory: str | Path,
        basis: torch.Tensor | None = None,
        chunk_steps: int = 128,
        include_canaries: bool = False,
    ) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and any(self.directory.glob("*.npy")):
            raise ValueError(f"directory: {self.directory} already holds .npy files")
        if int(chunk_steps) < 1:
            raise ValueError(f"chunk_steps must be >= 1, got {chunk_steps}")
        if basis is not None:
            if not isinstance(basis, torch.Tensor) or basis.ndim != 2 or basis.shape[0] == 0:
                raise ValueError("basis must be a (B, d) torch tensor with B >= 1")
            if not basis.is_floating_point() or not bool(torch.isfinite(basis).all()):
                raise ValueError("basis must be a finite floating-point tensor")
        self.basis = basis
        self.chunk_steps = int(chunk_steps)
        self.include_canaries = bool(include_canaries)
        self._released: list[np.ndarray] = []
        self._canaries: list[np.ndarray] = []
        self._chunk = 0
        self._steps = 0
        self._dim: int | None = None
        self._meta: dict = {}

    def start(self, dim: int, device: torch.device, meta: dict) -> None:
        """Check the basis against the selection dimension and move it to ``device``."""
        if self.basis is not None and self.basis.shape[1] != dim:
            raise ValueError(
                f"basis must have d = {dim} columns (the hook's parameter selection), "
                f"got shape {tuple(self.basis.shape)}"
            )
        if self.basis is not None:
            self.basis = self.basis.to(device)
        self._dim = dim
        self._meta = dict(meta)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.basis is None else x @ self.basis.to(x.dtype).T

    def write(
        self,
        released: torch.Tensor,
        canary_grads: torch.Tensor | None = None,
        context: dict | None = None,
    ) -> None:
        """Record one step (released (d,), canary_grads (K, d)); flush a full chunk to disk.

        ``context`` holds the step's scalar DP parameters (noise_multiplier, max_grad_norm,
        sample_rate, divisor); they go to ``meta.json`` (``"varies"`` lists the
        keys whose value changed during the run).
        """
        for key, value in (context or {}).items():
            old = self._meta.setdefault(key, value)
            if old != value and key not in self._meta.setdefault("varies", []):
                self._meta["varies"].append(key)
        self._released.append(self._project(released).detach().cpu().numpy())
        if self.include_canaries and canary_grads is not None:
            self._canaries.append(self._project(canary_grads).detach().cpu().numpy())
        self._steps += 1
        if len(self._released) >= self.chunk_steps:
            self.flush()

    def flush(self) -> None:
        """Write buffered rows as the next chunk and update ``meta.json``."""
        if self._released:
            np.save(self.directory / f"released_{self._chunk:05d}.npy", np.stack(self._released))
            if self._canaries:
                np.save(
                    self.directory / f"canaries_{self._chunk:05d}.npy", np.stack(self._canaries)
                )
            self._chunk += 1
            self._released.clear()
            self._canaries.clear()
        if self._dim is not None:
            meta = dict(self._meta)
            meta.update(
                steps=self._steps,
                chunks=self._chunk,
                dim=self._dim,
                projected=self.basis is not None,
                basis_rows=None if self.basis is None else int(self.basis.shape[0]),
                include_canaries=self.include_canaries,
            )
            (self.directory / "meta.json").write_text(json.dumps(meta, indent=2))


def load_trace(directory: str | Path) -> dict:
    """Read a trace back: ``{"released": (T, B|d), "canaries": (T, K, B|d) or None, "meta"}``."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.exists():
        raise ValueError(f"directory: {directory} holds no meta.json (not a trace)")
    meta = json.loads(meta_path.read_text())
    rel = sorted(directory.glob("released_*.npy"))
    can = sorted(directory.glob("canaries_*.npy"))
    released = np.concatenate([np.load(p) for p in rel]) if rel else np.zeros((0, 0))
    canaries = np.concatenate([np.load(p) for p in can]) if can else None
    return {"released": released, "canaries": canaries, "meta": meta}
