"""The hook's white-box phase: what each step tells about the mechanism itself.

``WhiteBoxRecorder`` is called by ``AuditHook`` at four moments of every real optimizer step
and keeps, per step, a ``records.StepRecord``:

* ``clip_and_accumulate`` (wrapped: it runs once per physical batch, so under
  BatchMemoryManager several times a step): the rows clipped, summed into the step's logical
  batch size;
* ``before_noise`` (in the wrapped ``add_noise``, before anything is added): the batch's size
  and the clipping probes (``clip_check.ClippingCheck``, the optimizer's own clipping run on
  single examples and leave-one-out sub-batches);
* ``probe_noise`` (right before the real ``add_noise``, the clipped sum final): the noise probe
  (``noise_probe.NoiseProbe``: the optimizer's own ``add_noise`` on zero sums, every generator
  state saved and restored) at seeded steps;
* ``after_noise`` (right after the optimizer's ``add_noise``): the noise it really added,
  ``p.grad - p.summed_grad`` on every tensor, sketched by ``noise_record.NoiseRecorder``, the
  squared norm of the noised sum itself (what the release must be, over the divisor; under
  DPDDP, where the release is the ranks' sum, every rank's noised sum sketched and summed over
  the ranks: ``ranks_release``), and the probe's comparison of that noise with the zero
  sum's;
* under adaptive clipping, the bound C_t each step used and its count of unclipped examples,
  before and after the optimizer's noise (``records.AdaptiveRecord``);
* ``on_release`` (after the accountant, or after DPDDP's all-reduce): every tensor's released
  sum (squared norm), the released sum at the noise probes (coordinates no example touches)
  minus the canaries inserted there, under DPDDP the release against the ranks' noised sums
  (``records.RanksRelease``), and the loader's batches since the last step
  (``sampling_record.SamplingRecorder``).

While attached it also compares the model with its copy around every private step
(``integrity.ModelIntegrity``) and records the batches the training loader yields. It records
every tensor the optimizer releases, whatever ``params`` the hook's canaries and scores use:
the checks are about the mechanism. ``records()`` gives the typed ``WhiteBoxRecords`` that
``run_audit``, the CLI and ``audit_report`` judge alike.
"""

from __future__ import annotations

import numpy as np
import torch
from opacus.optimizers import DPOptimizer

from dpaudit.capture.clip_check import ClippingCheck
from dpaudit.capture.gradient_canaries import GradientCanaries
from dpaudit.capture.integrity import ModelIntegrity
from dpaudit.capture.noise_probe import NoiseProbe
from dpaudit.capture.noise_record import NoiseRecorder
from dpaudit.capture.patching import InstancePatch
from dpaudit.capture.ranks_release import RanksReleaseRecorder
from dpaudit.capture.records import AdaptiveRecord, StepRecord, WhiteBoxRecords
from dpaudit.capture.sampling_record import SamplingRecorder
from dpaudit.capture.support import (
    clip_bound,
    clip_bounds,
    gradient_noise_multiplier,
    is_adaptive,
    is_per_layer,
)
from dpaudit.capture.view import CoordinateView, check_coordinates
from dpaudit.gradients.persample import unwrap_model


def optimizer_tensor_names(model, optimizer: DPOptimizer) -> list[str]:
    """The names of the optimizer's parameters in its order (``param i`` for one the model
    does not name)."""
    by_id = {id(p): n for n, p in unwrap_model(model).named_parameters()}
    return [by_id.get(id(p), f"param {i}") for i, p in enumerate(optimizer.params)]


class WhiteBoxRecorder:
    """Per-step white-box records of one training (module doc).

    Args:
        optimizer: the DP optimizer.
        model: the model (names its tensors).
        params / full_dim / coordinates: the hook's parameter selection, its size and its
            coordinate view (the probes index the selection; the canaries' values there are
            subtracted).
        canaries: the hook's canary sets.
        seed: seeds the clipping probes and the noise sample.
        noise_probes: indices into the flattened selection no example touches, or None.
        check_clipping: run the clipping probes.
        record_noise: recover and sketch the noise the optimizer added.
        distributed: Opacus' DPDDP (the noise is summed over the ranks).
        rank: this process's rank (0 without DPDDP).
        data_loader: the training loader whose batches are recorded, or None.
        check_integrity: compare the model with its copy around every private step.
        post_step: the declared post-processing of the parameters (``integrity``).
        check_noise_data: probe whether the noise ignores the data (``noise_probe``).
    """

    def __init__(self, optimizer: DPOptimizer, model, params, full_dim: int, coordinates,
                 canaries, seed: int, *, noise_probes=None, check_clipping: bool = False,
                 record_noise: bool = True, distributed: bool = False, rank: int = 0,
                 data_loader=None, check_integrity: bool = True, post_step=None,
                 check_noise_data: bool = True) -> None:
        self.optimizer = optimizer
        self.max_grad_norm = clip_bound(optimizer)
        self.names = optimizer_tensor_names(model, optimizer)
        self.dims = [int(p.numel()) for p in optimizer.params]
        self._selection = list(params)
        self._full_dim = int(full_dim)
        self._coordinates = coordinates
        self._probes = self._check_probes(noise_probes, canaries)
        self._clip = ClippingCheck(self.max_grad_norm, seed) if check_clipping else None
        self._noise = (NoiseRecorder(list(optimizer.params), self.names, seed, distributed)
                       if record_noise else None)
        self._steps: list[StepRecord] = []
        self._pending_batch: int | None = None
        self._rows: int | None = 0  # rows clipped since the last step (None: unknown)
        self._rows_patch: InstancePatch | None = None
        self._pending_noised: float | None = None
        self._distributed = bool(distributed)
        # DPDDP: the release against the ranks' noised sums, through a summed sketch
        self._ranks = RanksReleaseRecorder(list(optimizer.params)) if distributed else None
        if post_step is not None and not check_integrity:
            raise ValueError("post_step needs check_integrity=True (it declares what the "
                             "integrity check may see change between steps)")
        self._sampling = (SamplingRecorder(data_loader, seed, distributed=distributed)
                          if data_loader is not None else None)
        self._integrity = ModelIntegrity(optimizer, model, post_step) if check_integrity else None
        self._probe = (NoiseProbe(optimizer, self.names, seed, rank=rank,
                                  distributed=distributed) if check_noise_data else None)
        # adaptive clipping: (C_t, true count, examples counted, noisy count) of every step
        self._adaptive: list[tuple] | None = [] if is_adaptive(optimizer) else None
        self._pending_count: tuple | None = None

    @property
    def has_noise_probes(self) -> bool:
        return self._probes is not None

    @property
    def records_noise(self) -> bool:
        return self._noise is not None

    def _check_probes(self, probes, canaries) -> CoordinateView | None:
        """The noise probes' view (indices into the full selection, whatever the hook's own
        view) and the canary values there (what an inclusion adds), or None."""
        if probes is None:
            return None
        idx = check_coordinates(probes, self._full_dim)
        if idx.numel() < 3:
            raise ValueError(f"noise_probes: need at least 3 coordinates, got {idx.numel()}")
        cols = idx.numpy()
        pos = np.full(self._full_dim, -1, dtype=np.int64)  # full index -> probe column, or -1
        pos[cols] = np.arange(cols.size)
        dim = self._full_dim if self._coordinates is None else self._coordinates.numel()
        full = (  # hook coordinate -> index into the full selection
            np.arange(dim) if self._coordinates is None else self._coordinates.cpu().numpy()
        )
        # what an inclusion adds at the probes, as nonzero entries (canary, probe, value): a
        # Dirac canary touches one probe, and this is applied every step
        ks, js, vs, first = [], [], [], 0
        for c in canaries:
            if isinstance(c, GradientCanaries):
                if c.is_sparse:
                    ind = full[c.indices.cpu().numpy().reshape(len(c), -1)]
                    val = c.values.cpu().double().numpy().reshape(len(c), -1)
                else:
                    ind = np.broadcast_to(full, (len(c), full.size))
                    val = c.vectors.cpu().double().numpy()
                col = pos[ind]
                k, j = np.nonzero((col >= 0) & (val != 0.0))
                ks.append(first + k)
                js.append(col[k, j])
                vs.append(val[k, j])
            first += len(c)
        none = np.zeros(0, dtype=np.int64)
        self._probe_canary_values = (
            np.concatenate([none, *ks]),
            np.concatenate([none, *js]),
            np.concatenate([np.zeros(0), *vs]),
            cols.size,
        )
        return CoordinateView(self._selection, idx)

    def start(self, device: torch.device) -> None:
        if self._probes is not None:
            self._probes.to(device)

    def attach(self) -> None:
        """Start counting the rows each step clips, recording the loader's batches and
        watching the model around the private steps."""
        self._rows = 0
        self._rows_patch = InstancePatch(self.optimizer, "clip_and_accumulate",
                                         self._count_rows, "AuditHook").apply()
        try:
            if self._sampling is not None:
                self._sampling.attach()
            if self._integrity is not None:
                try:
                    self._integrity.attach()
                except Exception:
                    if self._sampling is not None:
                        self._sampling.detach()
                    raise
        except Exception:
            self._rows_patch.restore()
            raise

    def detach(self) -> None:
        """Undo ``attach`` (last in, first out)."""
        if self._integrity is not None:
            self._integrity.detach()
        if self._sampling is not None:
            self._sampling.detach()
        if self._rows_patch is not None:
            self._rows_patch.restore()
            self._rows_patch = None

    def _count_rows(self) -> None:
        """The optimizer's ``clip_and_accumulate``, counting the rows it clips (every physical
        batch of a logical one: BatchMemoryManager's steps that skip the noise included)."""
        rows = _clipped_rows(self.optimizer)
        self._rows = None if rows is None or self._rows is None else self._rows + rows
        self._rows_patch.original()

    def nbytes(self) -> dict[str, int]:
        """Bytes held by the records of the other doors: the loader's batches (O(n + T)) and
        the copy of the model (one model, whatever T)."""
        return {"sampling_by_example": 0 if self._sampling is None else self._sampling.nbytes(),
                "model_copy": 0 if self._integrity is None else self._integrity.nbytes()}

    @property
    def dataset_size(self) -> int | None:
        """The training loader's data set size (None without a loader)."""
        return None if self._sampling is None else self._sampling.n

    # ------------------------------------------------------------------ the three moments
    def before_noise(self, opt: DPOptimizer, step: int) -> None:
        """Before anything is added to the clipped sum: the batch size, the clipping probes."""
        self._pending_batch = self._rows if self._rows_patch is not None else None
        if self._adaptive is not None:  # the true count, the examples counted, the bound
            self._pending_count = (clip_bound(opt), int(opt.unclipped_num),
                                   int(opt.sample_size))
        if self._clip is not None:
            self._clip.run(opt, step)  # its probes call clip_and_accumulate: not counted
        self._rows = 0

    def probe_noise(self, opt: DPOptimizer, step: int, add_noise) -> None:
        """Right before the real ``add_noise``: the noise probe at its seeded steps."""
        if self._probe is not None:
            self._probe.before(opt, step, add_noise)

    @torch.no_grad()
    def after_noise(self, opt: DPOptimizer) -> None:
        """Right after ``add_noise``: the noise it added, and the noised sum's squared norm
        (under DPDDP, whose release is the ranks' sum, this rank's noised sum sketched and
        summed over the ranks: ``ranks_release``)."""
        if self._probe is not None:
            self._probe.after(opt)
        if self._ranks is not None:
            self._ranks.noised(opt)
        else:
            self._pending_noised = float(sum(
                torch.linalg.vector_norm(p.grad, dtype=torch.float64) ** 2
                for p in opt.params))
        if self._noise is not None:
            self._noise.record(opt, gradient_noise_multiplier(opt) * clip_bound(opt))
        if self._adaptive is not None:
            self._pending_count = (*self._pending_count, float(opt.unclipped_num))

    @torch.no_grad()
    def on_release(self, opt: DPOptimizer, step: int, noise_std: float, divisor: float,
                   inclusion: np.ndarray) -> None:
        """The released gradient of this step (after the accountant or the all-reduce)."""
        sq = torch.stack([torch.linalg.vector_norm(p.grad, dtype=torch.float64) ** 2
                          for p in opt.params])
        probe = None
        if self._probes is not None:
            values = self._probes.released().double().cpu().numpy() * divisor
            k, j, v, n = self._probe_canary_values
            included = inclusion.astype(np.float64)[k]
            probe = values - np.bincount(j, weights=included * v, minlength=n)
        if self._sampling is not None:
            self._sampling.step()
        ranks = None if self._ranks is None else self._ranks.released(opt, divisor)
        self._steps.append(StepRecord(
            step=step, noise_std=float(noise_std), divisor=float(divisor),
            batch_size=self._pending_batch, released_sq=sq.cpu().numpy() * divisor * divisor,
            probe_noise=probe, noised_sq=self._pending_noised,
            dtype_eps=max(float(torch.finfo(p.dtype).eps) for p in opt.params),
            clip_bound=clip_bound(opt), ranks_release=ranks,
        ))
        if self._adaptive is not None:
            self._adaptive.append(self._pending_count)
        self._pending_batch = self._pending_noised = self._pending_count = None

    # ------------------------------------------------------------------ results
    @property
    def steps(self) -> list[StepRecord]:
        return self._steps

    def clipping_summary(self) -> dict | None:
        return None if self._clip is None else self._clip.summary()

    def records(self, *, sampling: dict | None = None, accountant_history=None,
                distributed: bool = False, accountant: str | None = None,
                independence=None) -> WhiteBoxRecords:
        """The typed records of the steps so far (``WhiteBoxRecords``; ``accountant``: the
        name of the user's accountant, ``independence``: the hook's ``IndependenceRecord``)."""
        steps = tuple(self._steps)
        noise = None
        if self._noise is not None:
            sketches = self._noise.noise_steps()[: len(steps)]
            steps = tuple(
                StepRecord(**{**s.__dict__, "noise": n}) for s, n in
                zip(steps, sketches + [None] * (len(steps) - len(sketches)), strict=True)
            )
            noise = self._noise.run(
                "release minus the optimizer's clipped sum, read right after add_noise"
                + (", summed over the ranks (the all-reduced release)" if distributed else "")
            )
        by_example = None if self._sampling is None else self._sampling.record()
        if self._sampling is None:
            reason = ("the training loader was not given (AuditHook(data_loader=...)): which "
                      "examples each step used was not recorded")
        else:
            reason = self._sampling.reason
        return WhiteBoxRecords(
            names=list(self.names), dims=list(self.dims), max_grad_norm=self.max_grad_norm,
            steps=steps, noise=noise, clipping=self.clipping_summary(),
            sampling=None if sampling is None else dict(sampling),
            accountant_history=(None if accountant_history is None
                                else [list(h) for h in accountant_history]),
            by_example=by_example, by_example_reason=None if by_example else reason,
            integrity=None if self._integrity is None else self._integrity.record(),
            noise_source=None if self._probe is None else self._probe.record(),
            adaptive=self._adaptive_record(), independence=independence,
            accountant=accountant,
            layer_bounds=(tuple(float(c) for c in clip_bounds(self.optimizer))
                          if is_per_layer(self.optimizer) else None),
        )

    def _adaptive_record(self) -> AdaptiveRecord | None:
        """Adaptive clipping's bounds and counts (``records.AdaptiveRecord``), or None."""
        if self._adaptive is None:
            return None
        opt = self.optimizer
        rows = np.array(self._adaptive, dtype=np.float64).reshape(-1, 4)
        return AdaptiveRecord(
            sigma=float(opt.noise_multiplier), sigma_gradient=gradient_noise_multiplier(opt),
            sigma_count=float(opt.unclipped_num_std),
            target_quantile=float(opt.target_unclipped_quantile),
            learning_rate=float(opt.clipbound_learning_rate),
            min_bound=float(opt.min_clipbound), max_bound=float(opt.max_clipbound),
            bounds=rows[:, 0], counts=rows[:, 1], sizes=rows[:, 2], noisy_counts=rows[:, 3],
            next_bound=clip_bound(opt),
        )


def _clipped_rows(opt: DPOptimizer) -> int | None:
    """Rows of the per-sample gradients ``clip_and_accumulate`` is about to clip (None when
    there are none: ghost clipping)."""
    gs = getattr(opt.params[0], "grad_sample", None)
    if gs is None:
        return None
    return int(sum(g.shape[0] for g in gs) if isinstance(gs, list) else gs.shape[0])
