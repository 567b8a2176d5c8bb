"""Canary independence, watched at every step: the data's clipped sum on the canaries' support.

Gradient canaries are independent experiments (each canary's score a draw of the one-canary
experiment, whatever the others do) only where no data gradient reaches their coordinates at
any step. Coordinates dead at the initial parameters are not enough: ReLU units dead at
theta_0 come alive during training (400+ of 5,000 in a small CNN on digits). The hook sees the
optimizer's clipped sum of the batch (``p.summed_grad``) right before it inserts the canaries,
so ``IndependenceWatch`` reads it on the union S of the sparse canaries' supports at every
step: for independent canaries it is exactly zero (a sum of exact zeros). Where it is not, the
record names the canaries, the coordinates and the first step, and the audit withdraws the
statements that assume independent canaries (``experiment.judging``).

Cost: O(|S|) per step on the model's device, no host synchronisation until ``record`` (on
CPU, where reading a flag costs nothing, an all-zero step returns after one ``any``).
Dense gradient canaries and input canaries share coordinates with the data by construction;
they are not watched (their sets are listed as not applicable).
"""

from __future__ import annotations

import numpy as np
import torch

from dpaudit.capture.records import IndependenceRecord

_NAMED = 8  # coordinates named in the record, per canary set


class IndependenceWatch:
    """The data's clipped sum on the sparse gradient canaries' support, every step.

    Args:
        insertion: the hook's ``GradientInsertion`` (its canaries, support and positions).
        param_names: the hook's parameter selection (names the coordinates).
        shapes: the selected parameters' shapes, in selection order.
    """

    def __init__(self, insertion, param_names: list[str], shapes: list[tuple]) -> None:
        self._insertion = insertion
        self._names = list(param_names)
        self._shapes = [tuple(s) for s in shapes]
        self._offsets = np.cumsum([0] + [int(np.prod(s)) for s in self._shapes])
        self.active = insertion.support() is not None
        self._first: torch.Tensor | None = None
        self._largest: torch.Tensor | None = None
        self._steps = 0

    def start(self, device: torch.device) -> None:
        """Allocate the per-coordinate state on the model's device (after the insertion's
        ``start``)."""
        if not self.active:
            return
        n = self._insertion.support().numel()
        self._first = torch.full((n,), -1, dtype=torch.int64, device=device)
        self._largest = torch.zeros(n, dtype=torch.float64, device=device)

    @torch.no_grad()
    def observe(self, step: int, bound: float) -> None:
        """Before the canaries are inserted at ``step``: the data's clipped sum on S, in units
        of this step's clip bound ``bound``."""
        self._steps = step + 1
        if not self.active:
            return
        data = self._insertion.data_on_support()
        if data.device.type == "cpu" and not bool(data.any()):
            return  # all zeros (the independent case): nothing changes; a free check on CPU
        data = data.to(torch.float64).abs_()  # take / cat made it ours: summed_grad is untouched
        self._first.masked_fill_((self._first < 0) & (data != 0), step)
        torch.maximum(self._largest, data.div_(float(bound)), out=self._largest)

    def _coordinate(self, index: int) -> dict:
        """A full-selection index as (parameter, position in it)."""
        j = int(np.searchsorted(self._offsets, index, side="right") - 1)
        local = int(index - self._offsets[j])
        where = np.unravel_index(local, self._shapes[j]) if self._shapes[j] else ()
        return {"coordinate": int(index), "parameter": self._names[j],
                "position": [int(i) for i in where]}

    def record(self) -> IndependenceRecord:
        """Per canary set, which canaries the data reached and where (``IndependenceRecord``)."""
        sets = []
        positions = self._insertion.support_positions() if self.active else []
        support = self._insertion.support().numpy() if self.active else None
        first = self._first.cpu().numpy() if self.active else None
        largest = self._largest.cpu().numpy() if self.active else None
        for i, c in enumerate(self._insertion.canaries):
            pos = positions[i] if i < len(positions) else None
            if pos is None:
                sets.append({"set": i, "watched": False, "canaries": len(c)})
                continue
            pos = pos.cpu().numpy()  # (K_set, nnz) positions in S
            f = first[pos]  # (K_set, nnz)
            live = f >= 0
            live_rows = live.any(axis=1)
            coords = np.unique(pos[live])
            order = coords[np.argsort(first[coords], kind="stable")][:_NAMED]
            named = [{**self._coordinate(int(support[p])), "step": int(first[p]),
                      "largest": float(largest[p])} for p in order]
            sets.append({
                "set": i, "watched": True, "canaries": len(c),
                "coordinates": int(np.unique(pos).size),
                "live_canaries": int(live_rows.sum()),
                "live_coordinates": int(coords.size),
                "first_step": int(first[coords].min()) if coords.size else -1,
                "largest": float(largest[np.unique(pos)].max()) if pos.size else 0.0,
                "first_live": named,
                "live_rows": np.flatnonzero(live_rows).tolist(),
            })
        return IndependenceRecord(steps=self._steps, sets=sets)


def seen_independent(hook, index: int) -> tuple[bool, str]:
    """Whether canary set ``index`` of ``hook`` was seen to be independent experiments, and
    why (not): Dirac gradient canaries on distinct coordinates, every score reading each
    canary's own coordinate only (``ScalarProduct``, ``MixtureLR``: the hook's
    ``dirac_rows``), and the data's clipped sum exactly zero there at every step (the hook's
    ``IndependenceRecord``). Then the release on each canary's coordinate is that canary plus
    the noise of its coordinate, and the scores are independent draws. The own loop's
    ``audit_report`` and the CLI's trainings read it alike."""
    from dpaudit.capture.gradient_canaries import GradientCanaries

    c = hook.canaries[index]
    if not isinstance(c, GradientCanaries) or not c.is_sparse or c.indices.shape[1] != 1:
        return False, "not Dirac gradient canaries"
    if np.unique(c.indices.cpu().numpy()).size != len(c):
        return False, "two canaries share a coordinate"
    if not hook.dirac_rows:
        return False, "a score reads more than each canary's own coordinate"
    if hook.steps == 0:
        return False, "no step was recorded"
    entry = hook.canary_independence().of_set(index)
    if entry is None or not entry.get("watched"):
        return False, "not watched"
    if entry["live_canaries"]:
        return False, (f"the data reached {entry['live_canaries']} canaries (first at step "
                       f"{entry['first_step']})")
    return True, ("the data's clipped sum was exactly zero on every canary's coordinate at "
                  f"every one of {hook.steps} steps")
