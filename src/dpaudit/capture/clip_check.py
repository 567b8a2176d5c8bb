"""The clipping check: the optimizer's own clipping, probed example by example (deterministic).

DP-SGD's sensitivity rests on one invariant: adding or removing one example changes the
clipped sum by at most C. The hook sees the batch's per-sample gradients (``p.grad_sample``)
just before the noise, so it can run the optimizer's own ``clip_and_accumulate`` (whatever it
is: Opacus', or a patched, buggy one) on sub-batches of them and measure what one example
really contributes:

* on the first step and a seeded random share ``probe_rate`` of the others, for the example
  with the largest gradient norm (measured here, over every parameter tensor) and one example
  drawn at random: the optimizer's clipped sum of the batch made of that example alone (O(d));
  a clipping bug lives in code that runs at every step, so a share of the steps sees it while
  keeping the check's cost a small part of training's;
* on the first step and a seeded random share ``leave_one_out_rate`` of the others (among the
  probed ones), for the same examples: the clipped sum of a sub-batch (the example and up to
  ``LOO_CONTEXT`` others of the batch drawn at random, in batch order) minus the clipped sum
  of the same sub-batch without the example (O(``LOO_CONTEXT`` d)): the exact change the
  add / remove relation is about, on a batch that Poisson sampling could have drawn. On the
  first step the ``FIRST_STEP_ALL`` examples of largest norm are probed: a bug that shows
  only for some examples (micro-batches clipped together change the sum by more than C only
  when the other examples of the micro-batch point elsewhere) gets that many chances.

A contribution of norm above C (1 + ``TOLERANCE``) is a sensitivity violation seen on data:
deterministic evidence, no statistics (``experiment.judging.clipping`` judges its epsilon
cost). C is read from the optimizer at every step: the flat bound, per-layer clipping's
combined ||(C_p)|| (each parameter's part is also measured against its own C_p:
``max_group_ratio``), adaptive clipping's current C_t (its counters restored after the probes).
It catches an example left unclipped, a layer left out
of the norm, micro-batches clipped as one example, clipping at the wrong norm. It cannot see a
per-sample gradient that is itself wrong (that needs an independent per-example reference, as
the conformance suite has). Nothing here changes training: the probes run on copies of the
row selection and the optimizer's ``p.grad_sample`` / ``p.summed_grad`` are restored exactly.
Not available without per-sample gradients (ghost clipping).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from opacus.optimizers import DPOptimizer

from dpaudit import seeds
from dpaudit.capture.support import clip_bound, clip_bounds, restore_counters, save_counters

TOLERANCE = 1e-4  # float32 sums of B clipped rows: rounding far below this share of C
FIRST_STEP_ALL = 16  # examples probed on the first step (largest gradient norms first)
LOO_CONTEXT = 8  # other examples in a leave-one-out probe's sub-batch


@dataclass
class ClipRecord:
    """The largest contribution one probe found at one step (``ratio`` = norm / C)."""

    step: int
    example: int
    kind: str  # "single" (the example alone) or "leave_one_out"
    norm: float
    ratio: float
    gradient_norm: float  # the example's own per-sample gradient norm, for the report
    group_ratio: float | None = None  # per-layer clipping: the largest ||part_p|| / C_p


class ClippingCheck:
    """Probes of the optimizer's clipping at each step (module doc).

    Args:
        max_grad_norm: the claimed clip norm C (the optimizer's own bound is read at every
            step; this one is reported).
        seed: seeds the random examples and the probed steps
            (``seeds.stream(seed, seeds.CLIP_CHECK)``; never the training's streams).
        probe_rate: share of the steps (after the first) that are probed, in (0, 1].
        leave_one_out_rate: share of the steps (after the first) with leave-one-out probes,
            in [0, ``probe_rate``].
    """

    def __init__(
        self,
        max_grad_norm: float,
        seed: int,
        probe_rate: float = 0.25,
        leave_one_out_rate: float = 0.1,
    ):
        if not 0.0 < probe_rate <= 1.0:
            raise ValueError(f"probe_rate must be in (0, 1], got {probe_rate!r}")
        if not 0.0 <= leave_one_out_rate <= probe_rate:
            raise ValueError(
                f"leave_one_out_rate must be in [0, probe_rate={probe_rate}], "
                f"got {leave_one_out_rate!r}"
            )
        self.max_grad_norm = float(max_grad_norm)
        self.rng = seeds.stream(seed, seeds.CLIP_CHECK)
        self.probe_rate = float(probe_rate)
        self.leave_one_out_rate = float(leave_one_out_rate)
        self.records: list[ClipRecord] = []
        self.steps_seen = 0
        self.steps_checked = 0
        self.leave_one_out_steps = 0
        self.unchecked: str | None = None
        self._bound = self.max_grad_norm
        self._groups: list[float] | None = None

    @torch.no_grad()
    def run(self, opt: DPOptimizer, step: int) -> None:
        """Probe this step's clipping (before the noise is added), when it is drawn."""
        p0 = opt.params[0]
        if getattr(p0, "grad_sample", None) is None:
            self.unchecked = "no per-sample gradients (ghost clipping): clipping not probed"
            return
        self.steps_seen += 1
        u = 0.0 if step == 0 else float(self.rng.random())  # one draw per step: reproducible
        if u >= self.probe_rate:
            return
        flats = [opt._get_flat_grad_sample(p) for p in opt.params]
        b = flats[0].shape[0]
        if b == 0:
            return
        # float32 is enough here: the norms only pick the probed examples and are reported
        norms = torch.stack([g.reshape(b, -1).norm(2, dim=1) for g in flats], dim=1).norm(
            2, dim=1
        ).double()
        if step == 0:  # the first batch: its FIRST_STEP_ALL largest norms
            picks = torch.argsort(norms, descending=True)[:FIRST_STEP_ALL].tolist()
        else:  # the largest norm and one example at random
            picks = [int(torch.argmax(norms))] + ([int(self.rng.integers(b))] if b > 1 else [])
        loo = b > 1 and u < self.leave_one_out_rate
        saved = [(p.grad_sample, p.summed_grad) for p in opt.params]
        counters = save_counters(opt)
        self._bound = clip_bound(opt)
        bounds = clip_bounds(opt)
        self._groups = bounds if isinstance(bounds, list) else None
        try:
            for i in dict.fromkeys(picks):
                alone = self._clipped_sum(opt, flats, torch.tensor([i]))
                self._record(step, i, "single", alone, float(norms[i]))
                if loo:
                    others = np.delete(np.arange(b), i)
                    rest = np.sort(self.rng.choice(others, min(LOO_CONTEXT, b - 1), replace=False))
                    with_i = np.sort(np.append(rest, i))
                    full = self._clipped_sum(opt, flats, torch.from_numpy(with_i))
                    without = self._clipped_sum(opt, flats, torch.from_numpy(rest))
                    diff = [a - r for a, r in zip(full, without, strict=True)]
                    self._record(step, i, "leave_one_out", diff, float(norms[i]))
        finally:
            restore_counters(opt, counters)
            for p, (gs, sg) in zip(opt.params, saved, strict=True):
                p.grad_sample, p.summed_grad = gs, sg
        self.steps_checked += 1
        self.leave_one_out_steps += int(loo)

    @staticmethod
    def _clipped_sum(opt: DPOptimizer, flats, rows: torch.Tensor) -> list[torch.Tensor]:
        """The optimizer's ``clip_and_accumulate`` on the selected rows of the batch."""
        for p, g in zip(opt.params, flats, strict=True):
            # a fresh tensor (a copy of the rows): the optimizer marks what it clips as
            # processed, and the real per-sample gradients must stay unmarked
            p.grad_sample = g.index_select(0, rows.to(g.device))
            p.summed_grad = None
        opt.clip_and_accumulate()
        return [p.summed_grad.detach().to(torch.float64) for p in opt.params]

    def _record(self, step: int, example: int, kind: str, parts: list[torch.Tensor],
                grad_norm: float) -> None:
        norm = _norm(parts)
        group = None
        if self._groups is not None:
            group = max(float(torch.linalg.vector_norm(x)) / c
                        for x, c in zip(parts, self._groups, strict=True))
        self.records.append(
            ClipRecord(step, example, kind, norm, norm / self._bound, grad_norm, group)
        )

    def summary(self) -> dict:
        """Plain-JSON summary: the largest ratio of each kind, the violations, what ran."""
        out: dict = {
            "steps_seen": self.steps_seen,
            "steps_checked": self.steps_checked,
            "leave_one_out_steps": self.leave_one_out_steps,
            "probes": len(self.records),
            "tolerance": TOLERANCE,
            "unchecked": self.unchecked,
        }
        for kind in ("single", "leave_one_out"):
            rs = [r for r in self.records if r.kind == kind]
            out[f"max_ratio_{kind}"] = max((r.ratio for r in rs), default=None)
        groups = [r.group_ratio for r in self.records if r.group_ratio is not None]
        if groups:  # per-layer clipping: each part against its own bound C_p
            out["max_group_ratio"] = max(groups)
        bad = [r for r in self.records if r.ratio > 1.0 + TOLERANCE]
        out["violations"] = len(bad)
        out["worst"] = None if not bad else vars(max(bad, key=lambda r: r.ratio))
        return out


def _norm(parts: list[torch.Tensor]) -> float:
    return float(np.sqrt(sum(float((x * x).sum()) for x in parts)))
