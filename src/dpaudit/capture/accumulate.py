"""Score accumulation: every ``StepScore`` streamed into per-canary accumulators.

Each score's (K,) value per step is added (``aggregate="sum"``) or maxed (``"max"``) into a
float64 accumulator on the model's device; with ``keep_per_step`` the per-step values are kept
too, moved to the host in chunks of 256 steps. ``ScoreAccumulator`` validates the scores once
and checks each step's shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpaudit.attacks.base import StepContext, StepScore

_CHUNK = 256  # per-step values moved to the host every this many steps


def check_scores(scores: Sequence[StepScore]) -> list[StepScore]:
    """The scores as a list; ValueError if empty, not StepScores, bad aggregate or same names."""
    score_fns = list(scores)
    if not score_fns:
        raise ValueError("scores must contain at least one StepScore")
    names = []
    for s in score_fns:
        if not isinstance(s, StepScore):
            raise ValueError(f"scores must be StepScore objects, got {type(s).__name__}")
        if s.aggregate not in ("sum", "max"):
            raise ValueError(f"score {s.name!r}: aggregate must be 'sum' or 'max'")
        names.append(s.name)
    if len(set(names)) != len(names):
        raise ValueError(f"scores must have distinct names, got {names}")
    return score_fns


class ScoreAccumulator:
    """Per-canary accumulators of ``scores`` over the recorded steps.

    Args:
        scores: the ``StepScore`` objects (checked by ``check_scores``).
        num_canaries: K, the length of every step's score vector.
        keep_per_step: also keep the (K, T) per-step values; an integer k: those of the first
            k canaries only (k, T) (e.g. an audited set's, beside a large set whose per-step
            values nobody reads: K x T numbers per score otherwise).
    """

    def __init__(self, scores: Sequence[StepScore], num_canaries: int,
                 keep_per_step: bool | int):
        self.score_fns = check_scores(scores)
        self.names = [s.name for s in self.score_fns]
        self.num_canaries = int(num_canaries)
        self.keep_per_step = bool(keep_per_step)
        self._rows = None  # keep the per-step values of the first _rows canaries (None: all)
        if not isinstance(keep_per_step, bool):
            if (not isinstance(keep_per_step, (int, np.integer))
                    or not 1 <= keep_per_step <= self.num_canaries):
                raise ValueError(f"keep_per_step must be True, False or a number of canaries "
                                 f"in [1, {self.num_canaries}], got {keep_per_step!r}")
            self._rows = int(keep_per_step)
        self._acc: dict[str, torch.Tensor] = {}
        self._buffer: dict[str, list[torch.Tensor]] = {n: [] for n in self.names}
        self._per_step: dict[str, list[np.ndarray]] = {n: [] for n in self.names}

    @property
    def needs_reference(self) -> bool:
        """Whether a score needs the reference points' clipped gradients."""
        return any(s.requires_reference_grads for s in self.score_fns)

    def start(self, dim: int, device: torch.device) -> None:
        """Start every score on vectors of length ``dim`` and zero the accumulators."""
        for s in self.score_fns:
            s.start(self.num_canaries, dim, device)
            fill = 0.0 if s.aggregate == "sum" else -float("inf")
            self._acc[s.name] = torch.full((self.num_canaries,), fill, device=device).double()

    @torch.no_grad()
    def step(self, canary_grads: torch.Tensor, released: torch.Tensor, ctx: StepContext) -> None:
        """Score one step and fold the values into the accumulators."""
        for s in self.score_fns:
            v = s.step(canary_grads, released, ctx)
            if not isinstance(v, torch.Tensor) or v.shape != (self.num_canaries,):
                raise ValueError(
                    f"score {s.name!r} returned {getattr(v, 'shape', type(v))}, "
                    f"expected a ({self.num_canaries},) tensor"
                )
            v = v.detach().double()
            acc = self._acc[s.name]
            if s.aggregate == "sum":
                acc.add_(v)
            else:
                torch.maximum(acc, v, out=acc)
            if self.keep_per_step:
                buf = self._buffer[s.name]
                buf.append(v if self._rows is None else v[: self._rows])
                if len(buf) >= _CHUNK:
                    self._flush(s.name)

    def _flush(self, name: str) -> None:
        buf = self._buffer[name]
        if buf:
            self._per_step[name].append(torch.stack(buf, dim=1).cpu().numpy())
            buf.clear()

    def scores(self) -> dict[str, np.ndarray]:
        """Score name -> (K,) float64 array of accumulated scores."""
        return {n: a.cpu().numpy().copy() for n, a in self._acc.items()}

    def per_step(self) -> dict[str, np.ndarray]:
        """Score name -> (K, T) array of per-step values (``keep_per_step`` only; (k, T) for
        ``keep_per_step=k``)."""
        if not self.keep_per_step:
            raise RuntimeError("per-step values were not kept: pass keep_per_step=True")
        for n in self._buffer:
            self._flush(n)
        return {n: np.concatenate(parts, axis=1) for n, parts in self._per_step.items()}
