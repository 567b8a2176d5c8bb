"""``AuditHook``: the white-box view of Opacus DP-SGD, recorded without changing the loop.

Attached to the ``DPOptimizer`` that ``PrivacyEngine.make_private`` returns, the hook

* wraps the optimizer's ``add_noise`` (on the instance) to add the included gradient canaries
  to ``p.summed_grad`` *before* noise, drawing the inclusions per real step by policy;
* chains Opacus' step hook (the accountant's one slot): after the accountant has run, it reads
  the released gradient g_t from ``p.grad`` (after noise and ``scale_grad``, before the base
  optimizer mutates anything), so g_t = (clipped sum [+ canaries] + noise) / B_exp for any base
  optimizer (SGD, momentum, Adam);
* computes the input canaries' (and reference points') clipped gradients at the current
  parameters theta_t (the ones the batch gradient was computed at), with Opacus' flat clip rule,
  on the model's device: by default folded into the training batch's own forward/backward
  (``input_pass="auto"``, ``dpaudit.capture.fold``: K more rows in a pass that runs anyway,
  stripped before Opacus clips the batch, so training is unchanged), or in one separate batched
  ``per_sample_clipped_grads`` call per step (``input_pass="separate"``, and the automatic
  fallback for models or forward calls that cannot be folded);
* streams every ``StepScore`` into per-canary accumulators (``aggregate`` ``"sum"`` or
  ``"max"``), optionally keeping the K x T per-step values, and optionally writes a ``Trace``.

Coordinate view (``coordinates=``): an optional 1-D list of distinct indices into the flattened
parameter selection. Everything recorded and scored then lives in those coordinates only — a
coordinate-level parameter selection: the released gradient and the input canaries' (and
references') clipped gradients are gathered at them, gradient canaries are given as (K, |view|)
vectors in view coordinates and scattered into the full vector for insertion before noise, and
traces / scores see vectors of length |view|. What a score cannot see outside the view does not
enter it; for Dirac canaries on the view's coordinates (the union of their supports) the
scores are those of the full run. This is what makes K = 10^4 Dirac canaries cheap on a model
with d ~ 10^5 parameters: O(K |view|) per step instead of O(K d).

Only real optimizer steps are recorded: ``BatchMemoryManager`` virtual steps (skipped steps)
never reach ``add_noise`` or the step hook, so the whole logical batch is captured once.
Canary index order: the canaries list in order, each set's canaries in its own order.
``detach()`` restores the optimizer's ``step_hook`` and ``add_noise`` exactly.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch
from opacus.optimizers import DPOptimizer
from torch import nn

from dpaudit.attacks.base import StepContext, StepScore
from dpaudit.attacks.scalar import ScalarProduct
from dpaudit.capture.canaries import (
    Canaries,
    GradientCanaries,
    InputCanaries,
    as_canary_list,
)
from dpaudit.capture.fold import BatchFold
from dpaudit.capture.forward_watch import ForwardWatcher
from dpaudit.capture.persample import per_sample_clipped_grads, unwrap_model
from dpaudit.capture.selection import resolve_parameter_names
from dpaudit.capture.support import check_optimizer_supported
from dpaudit.capture.trace import Trace

_NORM_SLACK = 1e-6  # relative float slack on the ||g*|| <= C check
INPUT_PASSES = ("auto", "batch", "separate")


def _all_finite(x: torch.Tensor) -> bool:
    """Whether every entry is finite, from the row sums: a NaN or infinity makes its row's sum
    non-finite, and one reduction is ~20x cheaper than ``isfinite`` on a (K, d) tensor."""
    return bool(torch.isfinite(x.sum(dim=-1)).all())


def infer_sample_rate(step_hook: object) -> float | None:
    """The ``sample_rate`` captured by Opacus' accountant hook closure, if there is one."""
    owner = getattr(step_hook, "__self__", None)
    if isinstance(owner, AuditHook):  # another audit hook already chained in front
        return owner.sample_rate
    code = getattr(step_hook, "__code__", None)
    closure = getattr(step_hook, "__closure__", None)
    if code is None or closure is None or "sample_rate" not in code.co_freevars:
        return None
    value = closure[code.co_freevars.index("sample_rate")].cell_contents
    return float(value) if isinstance(value, numbers.Real) else None


class AuditHook:
    """Record released gradients, canary gradients and streaming scores of an Opacus run.

    ``hook = AuditHook(optimizer, model, canaries, scores=(ScalarProduct(),))`` then
    ``hook.attach()`` (or ``with hook:``) around the unchanged training loop; afterwards
    ``hook.scores()`` gives each score's (K,) accumulated values. ``params`` selects parameter
    or module names (default: all trainable) for everything recorded and scored.
    ``reference=(inputs, targets[, loss_fn])`` provides reference points whose clipped
    gradients at theta_t are passed to scores with ``requires_reference_grads``.
    ``sample_rate`` defaults to the one in Opacus' accountant hook. ``coordinates`` restricts
    everything recorded and scored to those indices of the flattened selection (module doc);
    gradient canaries, trace bases and scores then have ``dim = len(coordinates)`` columns,
    ``full_dim`` is the selection's size. ``input_pass`` says how input canaries' and reference
    gradients are computed: ``"auto"`` folds them into the batch's forward/backward when the
    model is a batch-first Opacus ``GradSampleModule`` and the step's forward can be folded,
    else a separate pass; ``"batch"`` requires folding (error otherwise); ``"separate"``
    always uses the separate pass.
    """

    def __init__(
        self,
        optimizer: DPOptimizer,
        model: nn.Module,
        canaries: Canaries | Sequence[Canaries],
        scores: Sequence[StepScore] = (ScalarProduct(),),
        params: str | Sequence[str] | None = None,
        keep_per_step: bool = False,
        trace: Trace | None = None,
        reference: tuple | None = None,
        sample_rate: float | None = None,
        check_finite: bool = True,
        coordinates: Sequence[int] | np.ndarray | torch.Tensor | None = None,
        input_pass: str = "auto",
    ) -> None:
        if not isinstance(optimizer, DPOptimizer):
            raise ValueError(
                "optimizer must be an Opacus DPOptimizer (from PrivacyEngine.make_private), "
                f"got {type(optimizer).__name__}"
            )
        check_optimizer_supported(optimizer)
        if not isinstance(optimizer.max_grad_norm, numbers.Real):
            raise ValueError("optimizer: per-layer clipping is not supported (needs one float C)")
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch nn.Module, got {type(model).__name__}")
        self.optimizer = optimizer
        self.model = model
        self.max_grad_norm = float(optimizer.max_grad_norm)
        self.param_names = resolve_parameter_names(model, params)
        named = dict(unwrap_model(model).named_parameters())
        self._params = [named[n] for n in self.param_names]
        optimized = {id(p) for p in optimizer.params}
        missing = [
            n for n, p in zip(self.param_names, self._params, strict=True) if id(p) not in optimized
        ]
        if missing:
            raise ValueError(f"params: not optimized by the DP optimizer: {missing}")
        self.full_dim = sum(p.numel() for p in self._params)
        self.coordinates = self._check_coordinates(coordinates, self.full_dim)
        self.dim = self.full_dim if self.coordinates is None else int(self.coordinates.numel())

        self.canaries = as_canary_list(canaries)
        self.num_canaries = sum(len(c) for c in self.canaries)
        self._check_gradient_canaries()

        self.score_fns = list(scores)
        if not self.score_fns:
            raise ValueError("scores must contain at least one StepScore")
        names = []
        for s in self.score_fns:
            if not isinstance(s, StepScore):
                raise ValueError(f"scores must be StepScore objects, got {type(s).__name__}")
            if s.aggregate not in ("sum", "max"):
                raise ValueError(f"score {s.name!r}: aggregate must be 'sum' or 'max'")
            names.append(s.name)
        if len(set(names)) != len(names):
            raise ValueError(f"scores must have distinct names, got {names}")
        self.reference = self._check_reference(reference)
        if any(s.requires_reference_grads for s in self.score_fns) and self.reference is None:
            raise ValueError("reference=(inputs, targets) is required by a score that needs it")
        if sample_rate is None:
            sample_rate = infer_sample_rate(optimizer.step_hook)
        if sample_rate is None or not 0.0 < float(sample_rate) <= 1.0:
            raise ValueError(
                "sample_rate must be in (0, 1]; it could not be read from the optimizer's "
                f"accountant hook, got {sample_rate!r}: pass sample_rate="
            )
        self.sample_rate = float(sample_rate)
        if trace is not None and not isinstance(trace, Trace):
            raise ValueError(f"trace must be a dpaudit.capture.Trace, got {type(trace).__name__}")
        if trace is not None and trace.basis is not None and trace.basis.shape[1] != self.dim:
            raise ValueError(
                f"trace: basis must have d = {self.dim} columns (the parameter selection "
                "or coordinate view), "
                f"got shape {tuple(trace.basis.shape)}"
            )
        self.trace = trace
        self.keep_per_step = bool(keep_per_step)
        self.check_finite = bool(check_finite)
        self.input_pass = input_pass
        self._fold = self._make_fold()
        has_inputs = self.reference is not None or any(
            isinstance(c, InputCanaries) for c in self.canaries
        )
        self._watcher = ForwardWatcher(model) if has_inputs else None

        self._attached = False
        self._started = False
        self._steps = 0
        self._pending_inclusion: np.ndarray | None = None
        self._fixed_row: np.ndarray | None = None
        self._folded_steps = 0
        self._inclusions: list[np.ndarray] = []
        self._acc: dict[str, torch.Tensor] = {}
        self._buffer: dict[str, list[torch.Tensor]] = {n: [] for n in names}
        self._per_step: dict[str, list[np.ndarray]] = {n: [] for n in names}

    # ------------------------------------------------------------------ validation helpers
    @staticmethod
    def _check_coordinates(coordinates, full_dim: int) -> torch.Tensor | None:
        """The view as a (|view|,) int64 CPU tensor of distinct indices in [0, full_dim)."""
        if coordinates is None:
            return None
        arr = np.asarray(
            coordinates.detach().cpu().numpy()
            if isinstance(coordinates, torch.Tensor)
            else coordinates
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

    def _check_gradient_canaries(self) -> None:
        for c in self.canaries:
            if not isinstance(c, GradientCanaries):
                continue
            if c.dim != self.dim:
                raise ValueError(
                    f"canaries: gradient canary vectors must have d = {self.dim} columns "
                    f"(parameters {self.param_names}"
                    + (", in view coordinates" if self.coordinates is not None else "")
                    + f"), got shape {tuple(c.vectors.shape)}"
                )
            norms = c.vectors.double().norm(dim=1)
            too_big = (norms > self.max_grad_norm * (1 + _NORM_SLACK)).nonzero().flatten()
            if too_big.numel():
                raise ValueError(
                    f"canaries: gradient canaries must have norm <= C = {self.max_grad_norm}; "
                    f"canaries {too_big.tolist()} have norms {norms[too_big].tolist()}"
                )

    @staticmethod
    def _check_reference(reference: tuple | None) -> InputCanaries | None:
        if reference is None:
            return None
        if not isinstance(reference, tuple | list) or len(reference) not in (2, 3):
            raise ValueError("reference must be (inputs, targets) or (inputs, targets, loss_fn)")
        return InputCanaries(*reference)

    def _make_fold(self) -> BatchFold | None:
        if self.input_pass not in INPUT_PASSES:
            raise ValueError(f"input_pass must be one of {INPUT_PASSES}, got {self.input_pass!r}")
        sets = [c for c in self.canaries if isinstance(c, InputCanaries)]
        if self.reference is not None:
            sets.append(self.reference)
        if self.input_pass == "separate" or not sets:
            return None
        if not BatchFold.possible(self.model):
            if self.input_pass == "batch":
                raise ValueError(
                    "input_pass='batch' needs the batch-first Opacus GradSampleModule that "
                    f"make_private returns as model, got {type(self.model).__name__}"
                )
            return None
        return BatchFold(self.model, self.optimizer, sets, self.param_names, self.max_grad_norm)

    # ------------------------------------------------------------------ attach / detach
    def attach(self) -> AuditHook:
        """Chain into the optimizer's step hook and wrap its ``add_noise``; returns self."""
        if self._attached:
            raise RuntimeError("AuditHook is already attached")
        opt = self.optimizer
        if getattr(opt, "_dpaudit_hook", None) is not None:
            raise RuntimeError("another AuditHook is attached to this optimizer")
        self._prev_step_hook = opt.step_hook
        self._had_instance_add_noise = "add_noise" in opt.__dict__
        self._prev_add_noise = opt.__dict__.get("add_noise")
        self._orig_add_noise = opt.add_noise  # bound method (or a previous wrapper)
        self._our_step_hook = self._step_hook
        opt.step_hook = self._our_step_hook
        if any(isinstance(c, GradientCanaries) for c in self.canaries):
            opt.add_noise = self._add_noise
        if self._fold is not None:
            self._fold.attach()
        if self._watcher is not None:
            self._watcher.attach()
        opt._dpaudit_hook = self
        self._attached = True
        return self

    def detach(self) -> None:
        """Restore the optimizer exactly as it was and flush the trace."""
        if not self._attached:
            return
        opt = self.optimizer
        if opt.step_hook is not self._our_step_hook:
            raise RuntimeError(
                "optimizer.step_hook was replaced while the AuditHook was attached; "
                "cannot restore it safely"
            )
        opt.step_hook = self._prev_step_hook
        if self._had_instance_add_noise:
            opt.add_noise = self._prev_add_noise
        else:
            opt.__dict__.pop("add_noise", None)
        if self._fold is not None:
            self._fold.detach()
        if self._watcher is not None:
            self._watcher.detach()
        del opt._dpaudit_hook
        self._attached = False
        if self.trace is not None and self._started:
            self.trace.flush()

    def __enter__(self) -> AuditHook:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # ------------------------------------------------------------------ per-step machinery
    def _start(self, device: torch.device, dtype: torch.dtype) -> None:
        self._device, self._dtype = device, dtype
        self._grad_vectors = [
            c.vectors.to(device=device, dtype=dtype) if isinstance(c, GradientCanaries) else None
            for c in self.canaries
        ]
        self._always = [
            np.array(c.policies) == "every_step" if isinstance(c, GradientCanaries) else None
            for c in self.canaries
        ]
        fixed = [
            vec[torch.from_numpy(always).to(device)].sum(0)
            for vec, always in zip(self._grad_vectors, self._always, strict=True)
            if vec is not None and always.any()
        ]
        self._every_step_sum = torch.stack(fixed).sum(0) if fixed else None
        self._rngs = [
            np.random.default_rng(c.seed)
            if isinstance(c, GradientCanaries) and "bernoulli" in c.policies
            else None
            for c in self.canaries
        ]
        self._offsets = np.cumsum([0] + [p.numel() for p in self._params]).tolist()
        self._view = None if self.coordinates is None else self.coordinates.to(device)
        for s in self.score_fns:
            s.start(self.num_canaries, self.dim, device)
            fill = 0.0 if s.aggregate == "sum" else -float("inf")
            self._acc[s.name] = torch.full((self.num_canaries,), fill, device=device).double()
        if self.trace is not None:
            self.trace.start(
                self.dim,
                device,
                {
                    "param_names": self.param_names,
                    "num_canaries": self.num_canaries,
                    "coordinates": None if self.coordinates is None else self.coordinates.tolist(),
                },
            )
        if not any(self._rngs):
            self._fixed_row = self._draw_inclusions()
        # gradient canaries are checked finite once, in GradientCanaries
        self._started = True

    def _draw_inclusions(self) -> np.ndarray:
        """One (K,) bool row of inclusions for this step (input canaries: False)."""
        if self._fixed_row is not None:  # nothing random: the same row every step
            return self._fixed_row.copy()
        row = []
        for c, rng in zip(self.canaries, self._rngs, strict=True):
            if isinstance(c, InputCanaries):
                row.append(np.zeros(len(c), dtype=bool))
                continue
            pol = np.array(c.policies)
            inc = pol == "every_step"
            bern = pol == "bernoulli"
            if bern.any():
                inc[bern] = rng.random(int(bern.sum())) < float(c.inclusion_prob)
            row.append(inc)
        return np.concatenate(row)

    def _add_noise(self) -> None:
        """Add the included gradient canaries to ``p.summed_grad``, then Opacus' noise."""
        p0 = self._params[0]
        if not self._started:
            self._start(p0.device, p0.dtype)
        row = self._draw_inclusions()
        self._pending_inclusion = row
        if row.any():
            # every-step canaries: their fixed sum; Bernoulli ones: the rows drawn this step
            blocks = [] if self._every_step_sum is None else [self._every_step_sum]
            start = 0
            for c, vec, always in zip(self.canaries, self._grad_vectors, self._always, strict=True):
                n = len(c)
                if vec is not None:
                    mask = row[start : start + n] & ~always
                    if mask.any():
                        idx = torch.from_numpy(np.flatnonzero(mask)).to(vec.device)
                        blocks.append(vec.index_select(0, idx).sum(0))
                start += n
            total = torch.stack(blocks).sum(0)
            if self._view is not None:  # view coordinates -> the full flattened selection
                full = total.new_zeros(self.full_dim)
                total = full.index_copy_(0, self._view, total)
            for p, a, b in zip(self._params, self._offsets[:-1], self._offsets[1:], strict=True):
                if p.summed_grad is None:
                    raise RuntimeError(f"parameter has no summed_grad at step {self._steps}")
                p.summed_grad.add_(total[a:b].view_as(p.summed_grad).to(p.summed_grad.dtype))
        self._orig_add_noise()

    def _separate_pass(self, spec: InputCanaries, t: int) -> torch.Tensor:
        """Clipped gradients of ``spec`` at theta_t from one extra per-sample pass."""
        grads = per_sample_clipped_grads(
            self.model,
            spec.inputs,
            spec.targets,
            spec.loss_fn,
            self.max_grad_norm,
            param_names=self.param_names,
        )
        if self._view is not None:
            grads = grads.index_select(1, self._view)
        grads = grads.to(self._dtype)
        if self.check_finite and not _all_finite(grads):
            raise ValueError(f"non-finite canary gradient at optimizer step {t}")
        return grads

    def _input_grads(self, t: int) -> list[torch.Tensor] | None:
        """This step's folded rows split per input set (reference last), or None (no fold)."""
        if self._fold is None:
            return None
        taken = self._fold.take()
        if taken is None:
            if self.input_pass == "batch":
                raise RuntimeError(
                    f"input_pass='batch': no training forward was folded before optimizer step "
                    f"{t} (folding needs one grad-enabled training-mode call model(x) with one "
                    "tensor argument shaped like the canaries)"
                )
            return None
        rows, norms = taken
        self._folded_steps += 1
        if self.check_finite and not bool(torch.isfinite(norms).all()):
            raise ValueError(f"non-finite canary gradient at optimizer step {t}")
        if self._view is not None:
            rows = rows.index_select(1, self._view)
        rows = rows if rows.dtype == self._dtype else rows.to(self._dtype)
        sets = self._fold.sets
        return [rows] if len(sets) == 1 else list(rows.split([len(s) for s in sets]))

    def _canary_grads(self, folded: list[torch.Tensor] | None, t: int) -> torch.Tensor:
        blocks, i = [], 0
        for c, vec in zip(self.canaries, self._grad_vectors, strict=True):
            if vec is not None:
                blocks.append(vec)
            elif folded is not None:
                blocks.append(folded[i])
                i += 1
            else:
                blocks.append(self._separate_pass(c, t))
        return torch.cat(blocks) if len(blocks) > 1 else blocks[0]

    def _step_hook(self, opt: DPOptimizer) -> None:
        """Chained step hook: accountant first, then record this step."""
        if self._prev_step_hook is not None:
            self._prev_step_hook(opt)
        self._record(opt)

    @torch.no_grad()
    def _released(self) -> torch.Tensor:
        full = torch.cat([p.grad.reshape(-1) for p in self._params])
        return full if self._view is None else full.index_select(0, self._view)

    def _record(self, opt: DPOptimizer) -> None:
        t = self._steps
        p0 = self._params[0]
        if not self._started:
            self._start(p0.device, p0.dtype)
        if self._pending_inclusion is None:  # no gradient canaries: nothing was drawn
            self._pending_inclusion = self._draw_inclusions()
        self._inclusions.append(self._pending_inclusion)
        self._pending_inclusion = None
        if self._watcher is not None:
            self._watcher.check(t)
        released = self._released()
        folded = self._input_grads(t)
        canary_grads = self._canary_grads(folded, t)
        if self.check_finite:
            if not _all_finite(released):  # canary gradients: checked where computed
                raise ValueError(f"non-finite released gradient at optimizer step {t}")
        if opt.loss_reduction == "mean":
            divisor = float(opt.expected_batch_size * opt.accumulated_iterations)
        else:
            divisor = 1.0
        ref = None
        if self.reference is not None:
            ref = folded[-1] if folded is not None else self._separate_pass(self.reference, t)
        ctx = StepContext(
            step=t,
            noise_multiplier=float(opt.noise_multiplier),
            max_grad_norm=self.max_grad_norm,
            expected_batch_size=divisor,
            sample_rate=self.sample_rate,
            reference_grads=ref,
        )
        with torch.no_grad():
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
                    buf.append(v)
                    if len(buf) >= 256:
                        self._flush_buffer(s.name)
        if self.trace is not None:
            context = {
                k: getattr(ctx, k)
                for k in ("noise_multiplier", "max_grad_norm", "sample_rate", "expected_batch_size")
            }
            self.trace.write(released, canary_grads, context)
        self._steps += 1

    def _flush_buffer(self, name: str) -> None:
        buf = self._buffer[name]
        if buf:
            self._per_step[name].append(torch.stack(buf, dim=1).cpu().numpy())
            buf.clear()

    # ------------------------------------------------------------------ results
    @property
    def steps(self) -> int:
        """Number of real optimizer steps recorded so far."""
        return self._steps

    @property
    def folded_steps(self) -> int:
        """Steps whose input-canary gradients came from the batch's own pass (the rest, if any
        input canaries or references exist, used the separate pass)."""
        return self._folded_steps

    def _require_steps(self) -> None:
        if self._steps == 0:
            raise RuntimeError("no optimizer step has been recorded yet")

    def scores(self) -> dict[str, np.ndarray]:
        """Score name -> (K,) float64 array of accumulated scores (sum or max over steps)."""
        self._require_steps()
        return {n: a.cpu().numpy().copy() for n, a in self._acc.items()}

    def per_step(self) -> dict[str, np.ndarray]:
        """Score name -> (K, T) array of per-step values (needs ``keep_per_step=True``)."""
        if not self.keep_per_step:
            raise RuntimeError("per-step values were not kept: pass keep_per_step=True")
        self._require_steps()
        for n in self._buffer:
            self._flush_buffer(n)
        return {n: np.concatenate(parts, axis=1) for n, parts in self._per_step.items()}

    def inclusions(self) -> np.ndarray:
        """(K, T) bool array: gradient canary k was added at step t (input canaries: False)."""
        self._require_steps()
        return np.stack(self._inclusions, axis=1)


WhiteBoxRecorder = AuditHook
