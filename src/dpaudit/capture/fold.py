"""Input canaries folded into the training batch's own forward and backward pass.

The audit hook needs, at every real optimizer step, the clipped per-sample gradients of K input
canaries at the parameters theta_t the batch gradient was computed at. A separate pass costs a
second forward/backward through Opacus' hooks every step, which on small models is as slow as
the training step itself. ``BatchFold`` instead appends the canaries to the first training
forward after each real step, so Opacus computes their per-sample gradients with the batch's:

1. a forward pre-hook on the ``GradSampleModule`` concatenates each tensor argument the
   canaries carry (the positional inputs, and keyword tensors such as a padding mask) behind
   the B batch rows (only for a grad-enabled, training-mode call whose tensor arguments match
   the canaries' by position, name, trailing shape and dtype kind);
2. a forward hook hands the caller only the B batch outputs, through an autograd function whose
   backward passes the caller's gradient on those rows through unchanged and feeds the canary
   rows the gradient of their own per-example loss (computed in float32 under autocast);
3. with ``loss_reduction="mean"`` Opacus multiplies backprops by the rows it saw (B + K); an
   instance override of the module's ``rearrange_grad_samples`` multiplies the batch rows by B
   exactly as Opacus does without the canaries and leaves the canary rows as they are, so every
   per-sample gradient of the batch is bit-for-bit the one Opacus records without the fold;
4. the optimizer's ``clip_and_accumulate`` is wrapped (``patching.InstancePatch``) to take the
   K canary rows out of every ``p.grad_sample`` before Opacus clips and sums the batch, and to
   clip them with the optimizer's flat rule (norm over all its parameters) in float32, straight
   into one (K, d) buffer that is reused from step to step unless a consumer still holds it;
   with a coordinate view (``set_view``) only the view's K x |view| entries are gathered and
   scaled (no K x d tensor at all); when the hook's scores read the rows only through products
   and norms (``lazy``), they stay the views of Opacus' per-sample gradients they are, with
   their clip factors (``insertion.ClippedRows``: no K x d buffer either).

Training is therefore unchanged bit for bit (same clipped sum, same noise, same accountant):
the batch rows' arithmetic is row-independent. A forward that draws random numbers (dropout)
would draw them for B + K rows and shift the batch's masks and every later draw, so a model
with such modules in training mode is never folded (``random_modules``), nor under "auto" a model
with Opacus' recurrent or attention layers (``row_coupled_modules``: their per-sample gradients,
which the probe does not compare, drift in the last bits), and every folded
forward is checked to leave the global RNG untouched (RuntimeError otherwise). Bit-for-bit
also needs kernels that compute each row independently of how many rows there are: true of
CPU matrix products from 4 rows up on some CPUs (measured), never for 1-3 rows (small-matrix
kernels), not on every CPU (an AVX-512 Xeon was found where a small model never folds), and not
promised by GPU libraries. So under ``input_pass="auto"`` batches of fewer than
``MIN_FOLD_ROWS`` rows take the separate pass, and the first forward with at least that many
rows (forwards before it run as they are, watched) is replayed once with the canary rows
appended (no grad, forked RNG): if the batch's outputs change by a bit, nothing is ever folded.
Whether a machine folds is therefore its own business; exactness is not. Under
BatchMemoryManager, when a logical batch spans several physical ones, "auto" does not fold:
the canary rows would raise the physical batch the user capped, so the separate pass runs
after the logical step's last backward (measured: 1.38x peak memory folded, against 1.0x for
the same training with K more examples, on a ResNet at a logical batch of 1,024 in physical
batches of 256).
``input_pass="batch"`` folds regardless (exact up to such rounding). Only a training
forward of the wrapped model is folded, never one inside ``per_sample_clipped_grads``; when no
fold happened in a logical step (a forward that does not match), ``take()`` returns None and the
hook falls back to the separate pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from opacus.optimizers import DPOptimizer
from torch import nn

from dpaudit.capture.input_canaries import InputCanaries, argument_kind
from dpaudit.capture.insertion import ClippedRows
from dpaudit.capture.patching import InstancePatch
from dpaudit.capture.support import clip_bounds
from dpaudit.gradients.persample import (
    clip_dtype,
    clip_factors,
    clip_rows,
    in_per_sample_pass,
    summed_loss_output_grad,
)

# Batches of 1 to 3 rows are not folded under input_pass="auto": CPU matrix kernels for so few
# rows round differently from the blocked kernels used once the canary rows are appended.
MIN_FOLD_ROWS = 4

# Modules that draw random numbers in training mode, with the attribute giving their rate.
_RANDOM_MODULES: tuple[tuple[type, str], ...] = (
    (nn.modules.dropout._DropoutNd, "p"),
    (nn.MultiheadAttention, "dropout"),
    (nn.RNNBase, "dropout"),
    (nn.RReLU, ""),
)


def row_coupled_modules(model: nn.Module) -> list[str]:
    """Names of Opacus' recurrent and attention layers (``DPRNNBase``: DPRNN, DPGRU, DPLSTM;
    ``DPMultiheadAttention``). Their forward outputs pass the fold's probe bit for bit, but
    the per-sample gradients Opacus records for them can change in the last bits when canary
    rows are appended (measured: a DPGRU 4.7e-10 on 3 coordinates after 12 steps; attention
    biases 7.5e-9), which the probe, comparing outputs, cannot see: ``input_pass="auto"``
    takes the separate pass for them."""
    from opacus.layers import DPMultiheadAttention
    from opacus.layers.dp_rnn import DPRNNBase

    return [name or type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, (DPRNNBase, DPMultiheadAttention))]


def random_modules(model: nn.Module) -> list[str]:
    """Names of the submodules that draw random numbers in training mode (dropout with p > 0,
    attention or RNN dropout, RReLU), including Opacus' DPLSTM / DPMultiheadAttention (built
    from ``nn.Dropout``). A forward that calls ``torch.nn.functional.dropout`` itself is not
    seen here; ``BatchFold`` catches it at run time."""
    found = []
    for name, m in model.named_modules():
        for cls, attr in _RANDOM_MODULES:
            if isinstance(m, cls) and (not attr or float(getattr(m, attr, 0.0) or 0.0) > 0.0):
                found.append(name or type(m).__name__)
                break
    return found


def rng_states(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The global CPU generator's state and that of every CUDA device among ``tensors``."""
    states = [torch.get_rng_state()]
    devices = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
    states += [torch.cuda.get_rng_state(d) for d in devices]
    return states


def _same_states(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _exclusively_held(t: torch.Tensor) -> bool:
    """Whether nothing but this tensor object references its storage (no view, no numpy array
    kept by a score or a trace): then it may be overwritten. False when torch cannot say. Only
    views of ``t`` may be handed out: other references to ``t`` itself are not counted."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:  # pragma: no cover - private API; fall back to a fresh buffer
        return False
    return count(t.untyped_storage()._cdata) <= 2  # the tensor + the temporary storage object


class _FoldOutputs(torch.autograd.Function):
    """Forward: the first ``b`` rows of ``full``. Backward: the caller's gradient on those rows,
    unchanged, stacked over the precomputed canary-row gradient."""

    @staticmethod
    def forward(ctx, full, canary_grad, b):
        ctx.canary_grad = canary_grad
        return full[:b].clone()

    @staticmethod
    def backward(ctx, grad_out):
        canary = ctx.canary_grad.to(dtype=grad_out.dtype)
        return torch.cat([grad_out, canary]), None, None


class BatchFold:
    """Compute input canaries' clipped gradients inside the batch's forward/backward (module doc).

    Args:
        model: the batch-first Opacus ``GradSampleModule`` (``possible(model)``).
        optimizer: its ``DPOptimizer`` (``clip_and_accumulate`` is wrapped).
        sets: the ``InputCanaries`` (and reference points) whose rows are folded, in the order
            ``take()`` returns them; they must take the same forward arguments (``signature``).
        param_names: the returned coordinates (names in the unwrapped module).
        max_grad_norm: the clip bound C at construction (the optimizer's own rule is read
            when it clips: flat, per-layer, or adaptive clipping's current bound).
        probe: True (``input_pass="auto"``): the first training forward runs unfolded and is
            watched; folding starts only if it left the global RNG untouched. False
            (``"batch"``): fold from the first forward (each folded forward is still checked).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: DPOptimizer,
        sets: Sequence[InputCanaries],
        param_names: Sequence[str],
        max_grad_norm: float,
        probe: bool = True,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.sets = list(sets)
        self.num_rows = sum(len(s) for s in self.sets)
        signatures = {s.signature for s in self.sets}
        if len(signatures) != 1:
            raise ValueError(
                "canaries: every InputCanaries set (and the reference) must take the same "
                f"forward arguments to be folded into one batch, got {sorted(signatures)}"
            )
        self.signature = signatures.pop()
        slots = [s.slots() for s in self.sets]
        self._slot_shapes = {
            key: {tuple(sl[key].shape[1:]) for sl in slots} for key in slots[0]
        }
        # slots whose trailing shapes differ between sets can never be concatenated
        self._foldable = all(len(v) == 1 for v in self._slot_shapes.values())
        self._slot_shapes = {k: next(iter(v)) for k, v in self._slot_shapes.items()}
        self._slot_kinds = {key: argument_kind(t.dtype) for key, t in slots[0].items()}
        named = dict(model._module.named_parameters())
        self._selected = [named[n] for n in param_names]
        self.max_grad_norm = float(max_grad_norm)
        self._cat_cache: dict[tuple, torch.Tensor] = {}
        self._target_cache: dict[torch.device, list[torch.Tensor]] = {}
        self._handles: list = []
        # None: not probed yet; True: never fold (random forward, or rows not independent)
        self._random: bool | None = None if probe else False
        self._min_rows = MIN_FOLD_ROWS if probe else 0
        self._probing = False
        self._armed = True  # folding allowed until this logical step's first forward
        self._rng_before: list[torch.Tensor] | None = None
        self._in_call = False  # the current forward call was folded
        self._folded_b: int | None = None  # batch rows of the folded forward, until clipped
        self._out: torch.Tensor | None = None  # the (K, d) clip buffer, reused when free
        self._view_blocks: tuple[list, torch.Tensor] | None = None  # set_view
        # the hook's scores read the rows only through products and norms: keep them as
        # ClippedRows (no K x d buffer), except on a step BatchMemoryManager will skip, whose
        # per-sample gradients the views would keep alive until the logical step ends
        self.lazy = False
        # clipped rows and norms, from clipping until take(); folding waits while they are set
        self._result: tuple[torch.Tensor, torch.Tensor, bool] | None = None

    @staticmethod
    def possible(model: nn.Module) -> bool:
        """A batch-first Opacus ``GradSampleModule`` (hooks or functorch mode): what folding
        relies on (expanded-weights and ghost-clipping modules are not)."""
        from opacus.grad_sample import GradSampleModule

        return type(model) is GradSampleModule and bool(getattr(model, "batch_first", False))

    def set_view(self, index: torch.Tensor | None) -> None:
        """Return only the coordinates ``index`` (into the flattened selection, on the model's
        device) of the clipped rows; None: all of them."""
        if index is None:
            self._view_blocks = None
            return
        widths = [p.numel() for p in self._selected]
        order = torch.argsort(index)
        srt = index.index_select(0, order)
        locals_, start = [], 0
        for w in widths:
            lo = int(torch.searchsorted(srt, start))
            hi = int(torch.searchsorted(srt, start + w))
            locals_.append(srt[lo:hi] - start if hi > lo else None)
            start += w
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        self._view_blocks = (locals_, back)

    # ------------------------------------------------------------------ attach / detach
    def attach(self) -> None:
        """Register the forward hooks and patch ``clip_and_accumulate`` (optimizer) and
        ``rearrange_grad_samples`` (model) on their instances."""
        self._handles = [
            self.model.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
            self.model.register_forward_hook(self._post_forward, with_kwargs=True),
        ]
        self._clip_patch = InstancePatch(
            self.optimizer, "clip_and_accumulate", self._clip_and_accumulate, "BatchFold"
        ).apply()
        self._rearrange_patch = InstancePatch(
            self.model, "rearrange_grad_samples", self._rearrange, "BatchFold"
        ).apply()

    def detach(self) -> None:
        """Remove the hooks and restore both patched methods exactly."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._rearrange_patch.restore()
        self._clip_patch.restore()

    # ------------------------------------------------------------------ forward
    def _canary_slot(self, key: int | str, like: torch.Tensor) -> torch.Tensor:
        cache_key = (key, like.device, like.dtype)
        if cache_key not in self._cat_cache:
            parts = [s.slots()[key] for s in self.sets]
            self._cat_cache[cache_key] = torch.cat(parts).to(device=like.device, dtype=like.dtype)
        return self._cat_cache[cache_key]

    def _targets(self, device: torch.device) -> list[torch.Tensor]:
        if device not in self._target_cache:
            self._target_cache[device] = [s.targets.to(device) for s in self.sets]
        return self._target_cache[device]

    def _batch_rows(self, args: tuple, kwargs: dict) -> int | None:
        """The batch rows B if this call's tensor arguments match the canaries' (else None)."""
        npos, names = self.signature
        if len(args) != npos or not set(names) <= set(kwargs):
            return None
        call = dict(enumerate(args))
        call.update({n: kwargs[n] for n in names})
        first = args[0]
        if not isinstance(first, torch.Tensor) or first.ndim == 0:
            return None
        b = int(first.shape[0])
        for key, value in call.items():
            if (
                not isinstance(value, torch.Tensor)
                or value.ndim == 0
                or value.shape[0] != b
                or tuple(value.shape[1:]) != self._slot_shapes[key]
                or argument_kind(value.dtype) != self._slot_kinds[key]
            ):
                return None
        for name, value in kwargs.items():  # per-example data the canaries do not carry
            if name not in names and isinstance(value, torch.Tensor) and value.ndim and (
                value.shape[0] == b
            ):
                return None
        return b

    def _pre_forward(self, module, args, kwargs):
        self._in_call = False
        if (
            not self._armed
            or self._result is not None
            or self._folded_b is not None
            or in_per_sample_pass()
            or not torch.is_grad_enabled()
            or not module.training
            or not getattr(module, "hooks_enabled", False)
            or self._random
        ):
            return None
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if self._random is None:  # probe: this forward runs as is, watched
            self._probing, self._armed = True, False
            self._rng_before = rng_states(tensors)
            return None
        if self._min_rows and _step_skipped(self.optimizer):
            # BatchMemoryManager splits this logical batch: folding would raise the physical
            # batch the user capped by K rows, so under "auto" this logical step takes the
            # separate pass (after its last backward) instead
            self._armed = False
            return None
        b = self._batch_rows(args, kwargs) if self._foldable else None
        if b is None:
            return None
        if 0 < b < self._min_rows:
            return None
        self._rng_before = rng_states(tensors)
        self._in_call = True
        self._folded_b = b
        return self._concat(args, kwargs)

    def _concat(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call's arguments with the canaries' rows behind each tensor they carry."""
        npos, names = self.signature
        new_args = tuple(
            torch.cat([a, self._canary_slot(i, a)]) if i < npos else a for i, a in enumerate(args)
        )
        new_kwargs = dict(kwargs)
        for n in names:
            new_kwargs[n] = torch.cat([kwargs[n], self._canary_slot(n, kwargs[n])])
        return new_args, new_kwargs

    def _rows_independent(self, module, args, kwargs, output) -> bool:
        """Whether the probed forward's batch outputs come out bit for bit the same with the
        canary rows appended (one extra no-grad forward, off the global RNG): matrix kernels
        that pick their algorithm by the number of rows would change the batch's rounding."""
        b = self._batch_rows(args, kwargs) if self._foldable else None
        if b is None or not isinstance(output, torch.Tensor):
            return True  # not a call the canaries' rows can join: such calls are never folded
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        cuda = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
        new_args, new_kwargs = self._concat(args, kwargs)
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            full = module(*new_args, **new_kwargs)
        return (
            isinstance(full, torch.Tensor)
            and full.shape[0] == b + self.num_rows
            and bool(torch.equal(full[:b], output.detach()))
        )

    def _post_forward(self, module, args, kwargs, output):
        if self._probing:
            self._probing = False
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            self._random = not _same_states(self._rng_before, rng_states(tensors))
            self._rng_before = None
            if self._random:
                return None  # never fold: the canary rows would shift the batch's draws
            b = self._batch_rows(args, kwargs) if self._foldable else None
            if b is not None and b < self._min_rows:
                self._random = None  # nothing to compare rows on: probe the next forward too
            elif not self._rows_independent(module, args, kwargs, output):
                self._random = True  # never fold: the batch's arithmetic would change
            return None
        if not self._in_call:
            return None
        self._in_call = False
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if not _same_states(self._rng_before, rng_states(tensors)):
            raise RuntimeError(
                "input canaries were folded into a training forward that draws random numbers "
                "(e.g. torch.nn.functional.dropout called in forward): the batch's random draws "
                "are no longer those of training without the audit. Pass input_pass='separate' "
                "to AuditHook (it computes the canaries under a forked RNG)"
            )
        self._rng_before = None
        b, k = self._folded_b, self.num_rows
        if not isinstance(output, torch.Tensor) or output.ndim == 0 or output.shape[0] != b + k:
            raise RuntimeError(
                "input canaries could not be folded into the training batch: the model must "
                "return one tensor with the batch on its first axis, got "
                f"{type(output).__name__} {tuple(getattr(output, 'shape', ()))} for "
                f"{b} + {k} rows; pass input_pass='separate' to AuditHook"
            )
        out = output[b:].detach()
        out = out.to(clip_dtype(out.dtype))  # canary losses in float32 under autocast
        grads, start = [], 0
        with torch.autocast(out.device.type, enabled=False):
            for st, target in zip(self.sets, self._targets(out.device), strict=True):
                piece = out[start : start + len(st)]
                grads.append(summed_loss_output_grad(st.loss_fn, piece, target))
                start += len(st)
        canary_grad = torch.cat(grads) if len(grads) > 1 else grads[0]
        return _FoldOutputs.apply(output, canary_grad, b)

    # ------------------------------------------------------------------ backward (Opacus)
    def _rearrange(self, *, module, backprops, loss_reduction, batch_first):
        """Opacus' ``rearrange_grad_samples`` with the folded rows' "mean" scaling done here:
        batch rows times B (bit for bit Opacus' own ``backprops * n`` without the fold),
        canary rows as they are (their own loss gradient), then Opacus with "sum"."""
        b = self._folded_b
        if b is not None and loss_reduction == "mean" and not in_per_sample_pass():
            from opacus.layers.dp_rnn import RNNLinear

            dim = 0 if batch_first or type(module) is RNNLinear else 1
            if backprops.shape[dim] == b + self.num_rows:
                scaled = torch.empty_like(backprops)
                torch.mul(backprops.narrow(dim, 0, b), b, out=scaled.narrow(dim, 0, b))
                scaled.narrow(dim, b, self.num_rows).copy_(
                    backprops.narrow(dim, b, self.num_rows)
                )
                backprops, loss_reduction = scaled, "sum"
        return self._rearrange_patch.original(
            module=module, backprops=backprops, loss_reduction=loss_reduction,
            batch_first=batch_first,
        )

    # ------------------------------------------------------------------ clipping
    def _clip_and_accumulate(self) -> None:
        if self._folded_b is not None:
            self._strip_and_clip()
        self._clip_patch.original()

    def _strip_and_clip(self) -> None:
        b, k = self._folded_b, self.num_rows
        self._folded_b = None
        rows = {}
        for p in self.optimizer.params:
            gs = p.grad_sample
            first = gs[0] if isinstance(gs, list) else gs
            if not isinstance(first, torch.Tensor) or first.shape[0] != b + k:
                raise RuntimeError(
                    "input canaries were folded into a forward pass whose per-sample gradients "
                    f"are not the ones being clipped (expected {b} + {k} rows, got "
                    f"{None if first is None else tuple(first.shape)}); this happens when the "
                    "model runs several grad-enabled training forwards per step: pass "
                    "input_pass='separate' to AuditHook"
                )
            rows[p] = first[b:]
            if isinstance(gs, list):
                gs[0] = first[:b]
            else:
                p.grad_sample = first[:b]
        selected = [rows[p] for p in self._selected]
        if self._view_blocks is not None:
            self._result = (*self._clip_view(list(rows.values()), selected, k), True)
            return
        if self.lazy and not _step_skipped(self.optimizer):
            self._result = (*self._clip_lazy(list(rows.values()), selected, k), True)
            return
        width = sum(g[0].numel() for g in selected)
        dtype = clip_dtype(selected[0].dtype)
        out = self._out
        if (
            out is None
            or out.shape != (k, width)
            or out.dtype != dtype
            or out.device != selected[0].device
            or not _exclusively_held(out)
        ):
            out = torch.empty((k, width), dtype=dtype, device=selected[0].device)
        self._out = out
        _, norms = clip_rows(list(rows.values()), selected, clip_bounds(self.optimizer),
                             out=out)
        # handed out as a view: whoever keeps it holds a reference to the storage, which
        # _exclusively_held sees at the next step (the buffer itself is only ever ours)
        self._result = (out.view(out.shape), norms, False)

    def _clip_lazy(self, per_param, selected, k):
        """The clipped rows as ``ClippedRows`` over the canary rows' own views (no K x d
        buffer; module doc, step 4): the norms and factors, nothing written."""
        part_norms, norms, factors = clip_factors(per_param, selected,
                                                  clip_bounds(self.optimizer))
        index = {id(g): i for i, g in enumerate(per_param)}
        mine = part_norms[:, [index[id(g)] for g in selected]]
        dtype = clip_dtype(selected[0].dtype)
        return ClippedRows([g.reshape(k, -1) for g in selected], factors, mine, dtype), norms

    def _clip_view(self, per_param, selected, k):
        """Clipped rows at the view's coordinates only: norms over every parameter, then the
        K x |view| gathered entries scaled (no K x d temporary)."""
        _, norms, factors = clip_factors(per_param, selected, clip_bounds(self.optimizer))
        dtype = clip_dtype(selected[0].dtype)
        locals_, back = self._view_blocks
        parts = [
            g.reshape(k, -1).index_select(1, local).to(dtype) * f
            for g, local, f in zip(selected, locals_, factors, strict=True)
            if local is not None
        ]
        gathered = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        return gathered.index_select(1, back), norms

    # ------------------------------------------------------------------ results
    def take(self) -> tuple[torch.Tensor, torch.Tensor, bool] | None:
        """This logical step's (rows, d_selected) clipped canary gradients (float32 or wider;
        valid until the next step unless kept, in which case the next step writes a new
        buffer), the (rows,) norms before clipping (over all parameters; non-finite iff a
        gradient entry is) and whether the rows are already in view coordinates (``set_view``
        was in force when they were clipped), or None if no forward was folded; re-arms
        folding for the next logical step."""
        result, self._result, self._folded_b = self._result, None, None
        self._armed = True
        return result


def _step_skipped(optimizer) -> bool:
    """Whether the optimizer step of this physical batch will be skipped (BatchMemoryManager
    signalled it: Opacus pops the signal in ``pre_step``, after the clipping)."""
    queue = getattr(optimizer, "_step_skip_queue", None)
    return bool(queue) and bool(queue[0])
