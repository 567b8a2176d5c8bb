"""The noise Opacus really draws, beside what the audit's records recover of it, cell by cell
(no tests here: ``tests/capture/test_noise_harness.py`` and ``benchmarks/noise_harness.py``).

``drawn_noise()`` wraps Opacus' ``_generate_noise`` in every module that calls it and keeps
each draw with its ``reference`` (the tensor the noise is added to). Right after the real
``add_noise`` (the hook's ``WhiteBoxRecorder.after_noise``) the draw of each parameter is the
last one whose reference *is* that parameter's ``summed_grad`` (the noise probe's extra calls
draw on fresh zero sums, adaptive clipping's count noise on the count: neither matches). For
every (tensor, step) cell it keeps:

* ``opacus_std``: the std Opacus drew that tensor's noise with, and ``claimed_std``: the one the
  records claim (``NoiseRecorder.record``'s argument, ``StepRecord.noise_std``);
* ``drawn_sq``: ||n||^2 / claimed_std^2 of the drawn float32 noise n (in float64);
* ``recorded_sq`` / ``rounding``: what ``NoiseRecorder`` kept (``NoiseStep.sq``, ``.rounding``:
  the squared norm ``noise_scale`` tests, in units of the claimed variance);
* ``max_error``: max_i |h_i - n_i| with h = release - clipped sum (the recovery, in float64),
  ``ulp_bound``: max_i of half an ulp of the float32 release at i, and ``error_over_ulp``:
  max_i |h_i - n_i| / (half an ulp of release_i), at most 1 when the only error is the
  rounding of fl(s + n);
* ``released_sq``: what ``noise_floor`` reads (``StepRecord.released_sq`` / claimed_std^2).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field

import numpy as np
import torch

OPACUS_MODULES = (
    "opacus.optimizers.optimizer",
    "opacus.optimizers.optimizer_fast_gradient_clipping",
    "opacus.optimizers.adaclipoptimizer",
    "opacus.optimizers.ddp_perlayeroptimizer",
    "opacus.optimizers.fsdpoptimizer_fast_gradient_clipping",
)


@dataclass
class Cell:
    """One (tensor, step) cell (module doc)."""

    step: int
    tensor: str
    dim: int
    opacus_std: float
    claimed_std: float = float("nan")
    drawn_sq: float = float("nan")
    recorded_sq: float = float("nan")
    rounding: float = float("nan")
    max_error: float = float("nan")
    ulp_bound: float = float("nan")
    error_over_ulp: float = float("nan")  # max_i |h_i - n_i| / (half an ulp of release_i)
    released_sq: float = float("nan")
    record_std: float = float("nan")  # StepRecord.noise_std


@dataclass
class Capture:
    """Every cell of the trainings run inside ``drawn_noise()``, in step order per training."""

    cells: list[Cell] = field(default_factory=list)
    draws: list = field(default_factory=list)  # (reference, std, noise) since the last step
    trainings: int = 0

    def array(self, name: str) -> np.ndarray:
        return np.array([getattr(c, name) for c in self.cells], dtype=np.float64)


def _half_ulp(x: torch.Tensor) -> torch.Tensor:
    """Half the spacing of x's dtype at |x| (elementwise, float64): the largest error of a
    rounding to nearest whose result is x."""
    a = x.abs()
    up = torch.nextafter(a, torch.full_like(a, float("inf")))
    return (up.double() - a.double()) / 2.0


@contextlib.contextmanager
def drawn_noise():
    """Capture the drawn and the recovered noise of every step (module doc); yields a
    ``Capture``. Everything patched is restored on exit."""
    from dpaudit.capture import noise_record, recorder
    from dpaudit.capture.support import clip_bound, gradient_noise_multiplier

    cap = Capture()
    mods = [importlib.import_module(m) for m in OPACUS_MODULES]
    original = mods[0]._generate_noise

    def generate(std, reference, generator=None, secure_mode=False):
        noise = original(std, reference, generator=generator, secure_mode=secure_mode)
        cap.draws.append((reference, float(std), noise.detach().clone()))
        return noise

    after, on_release, reduce_ = (recorder.WhiteBoxRecorder.after_noise,
                                  recorder.WhiteBoxRecorder.on_release,
                                  noise_record.NoiseRecorder._reduce)
    pending: dict = {}  # the NoiseRecorder's outputs of this step

    @torch.no_grad()
    def after_noise(self, opt):
        step = getattr(self, "_harness_step", 0)
        self._harness_step = step + 1
        claimed = gradient_noise_multiplier(opt) * clip_bound(opt)
        new = []
        for name, p in zip(self.names, opt.params, strict=True):
            mine = [d for d in cap.draws if d[0] is p.summed_grad]
            if not mine:
                raise RuntimeError(f"no noise draw was seen for {name}")
            _, std, n = mine[-1]
            release = p.grad.detach().reshape(-1)
            h = release.double() - p.summed_grad.detach().reshape(-1).double()
            nd = n.reshape(-1).double()
            err, ulp = (h - nd).abs(), _half_ulp(release)
            cell = Cell(step=step, tensor=name, dim=int(p.numel()), opacus_std=std,
                        claimed_std=claimed,
                        drawn_sq=float((nd * nd).sum()) / claimed**2,
                        max_error=float(err.max()) / claimed,
                        ulp_bound=float(ulp.max()) / claimed,
                        error_over_ulp=float((err / ulp).max()))
            new.append(cell)
        cap.draws.clear()
        pending.clear()
        after(self, opt)
        if pending:
            sq, err = pending["sq"], pending["err"]
            for j, cell in enumerate(new):
                cell.recorded_sq, cell.rounding = float(sq[j]), float(err)
        cap.cells.extend(new)
        self._harness_last = new

    def reduce(self, noise_std):
        small, err = reduce_(self, noise_std)
        pending["sq"], pending["err"] = small[: len(self.dims)].copy(), err
        return small, err

    def release(self, opt, step, noise_std, divisor, inclusion):
        on_release(self, opt, step, noise_std, divisor, inclusion)
        rec = self._steps[-1]
        for j, cell in enumerate(getattr(self, "_harness_last", [])):
            cell.released_sq = float(rec.released_sq[j]) / cell.claimed_std**2
            cell.record_std = rec.noise_std

    try:
        for m in mods:
            m._generate_noise = generate
        recorder.WhiteBoxRecorder.after_noise = after_noise
        recorder.WhiteBoxRecorder.on_release = release
        noise_record.NoiseRecorder._reduce = reduce
        yield cap
    finally:
        for m in mods:
            m._generate_noise = original
        recorder.WhiteBoxRecorder.after_noise = after
        recorder.WhiteBoxRecorder.on_release = on_release
        noise_record.NoiseRecorder._reduce = reduce_


def compare(cap: Capture) -> dict:
    """The harness's numbers over every captured cell (``Capture``): the claimed std against
    Opacus', the recovery error against its rounding bound, the recorded squared norm against
    the drawn one, and the chi-square lower-tail p-value of each (the noise_scale cell's, from
    the records' conservative upper bound, against the drawn noise's own)."""
    from scipy.stats import chi2

    c = cap.cells
    if not c:
        raise ValueError("no cell was captured")
    d = cap.array("dim")
    drawn, rec, r = cap.array("drawn_sq"), cap.array("recorded_sq"), cap.array("rounding")
    upper = (np.sqrt(rec) + np.sqrt(d) * r) ** 2  # what noise_scale_test tests
    log_p_drawn = chi2.logcdf(drawn, d)
    log_p_rec = chi2.logcdf(upper, d)
    std_rel = np.abs(cap.array("claimed_std") / cap.array("opacus_std") - 1.0)
    rec_std_rel = np.abs(cap.array("record_std") / cap.array("opacus_std") - 1.0)
    k = int(np.argmin(log_p_drawn))
    return {
        "cells": len(c),
        "max_claimed_std_rel_error": float(np.nanmax(std_rel)),
        "max_record_std_rel_error": float(np.nanmax(rec_std_rel)),
        "max_recovery_error": float(np.nanmax(cap.array("max_error"))),  # units of sigma C
        "max_error_over_ulp_bound": float(np.nanmax(cap.array("error_over_ulp"))),
        "max_recorded_rounding": float(np.nanmax(r)),
        "max_sq_rel_error": float(np.nanmax(np.abs(rec / drawn - 1.0))),
        "max_log10_p_gap": float(np.nanmax(np.abs(log_p_rec - log_p_drawn)) / np.log(10)),
        "conservative": bool(np.all(log_p_rec >= log_p_drawn - 1e-9)),
        "smallest_cell": {"tensor": c[k].tensor, "step": c[k].step, "dim": c[k].dim,
                          "drawn_ratio": float(np.sqrt(drawn[k] / d[k])),
                          "recorded_ratio": float(np.sqrt(rec[k] / d[k])),
                          "released_ratio": float(np.sqrt(c[k].released_sq / d[k])),
                          "log10_p_drawn": float(log_p_drawn[k] / np.log(10)),
                          "log10_p_recorded": float(log_p_rec[k] / np.log(10))},
    }
