"""Input canaries folded into the training batch's own forward and backward pass.

The audit hook needs, at every real optimizer step, the clipped per-sample gradients of K input
canaries at the parameters theta_t the batch gradient was computed at. A separate pass costs a
second forward/backward through Opacus' hooks every step, which on small models is as slow as
the training step itself. ``BatchFold`` instead appends the canaries to the first training
forward after each real step, so Opacus computes their per-sample gradients with the batch's:

1. a forward pre-hook on the ``GradSampleModule`` concatenates the canary inputs behind the B
   batch examples (only for a grad-enabled, training-mode call with a single tensor argument);
2. a forward hook hands the caller only the B batch outputs, through an autograd function whose
   backward feeds the canary rows the gradient of their own (summed per-example) loss. With
   ``loss_reduction="mean"`` Opacus multiplies backprops by the rows it saw (B + K), so batch
   rows are scaled by B / (B + K) and canary rows by 1 / (B + K): every per-sample gradient
   Opacus records is exactly the one it would record without the canaries;
3. the optimizer's ``clip_and_accumulate`` is wrapped (on the instance) to take the K canary
   rows out of every ``p.grad_sample`` before Opacus clips and sums the batch, then clip them
   with the optimizer's flat rule (norm over all its parameters).

The training is therefore unchanged (same clipped sum, same noise, same accountant), and the
canaries' gradients cost K more rows in a pass that runs anyway. Only a training forward of the
wrapped model is folded, never one inside ``per_sample_clipped_grads``; when no fold happened in
a logical step (e.g. a multi-argument forward), ``take()`` returns None and the hook falls back
to the separate pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from opacus.optimizers import DPOptimizer
from torch import nn

from dpaudit.capture.canaries import InputCanaries
from dpaudit.capture.persample import (
    clip_rows,
    in_per_sample_pass,
    summed_loss_output_grad,
)


class _FoldOutputs(torch.autograd.Function):
    """Forward: the first ``b`` rows of ``full``. Backward: the caller's gradient on those rows
    (times ``scale``) stacked over the precomputed canary-row gradient."""

    @staticmethod
    def forward(ctx, full, canary_grad, scale, b):
        ctx.canary_grad, ctx.scale = canary_grad, scale
        return full[:b].clone()

    @staticmethod
    def backward(ctx, grad_out):
        batch = grad_out if ctx.scale == 1.0 else grad_out * ctx.scale
        canary = ctx.canary_grad.to(dtype=grad_out.dtype)
        return torch.cat([batch, canary]), None, None, None


class BatchFold:
    """Compute input canaries' clipped gradients inside the batch's forward/backward (module doc).

    ``sets`` are the InputCanaries (and reference points) whose rows are folded, in the order
    ``take()`` returns them; ``param_names`` selects the returned coordinates (names in the
    unwrapped module).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: DPOptimizer,
        sets: Sequence[InputCanaries],
        param_names: Sequence[str],
        max_grad_norm: float,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.sets = list(sets)
        self.num_rows = sum(len(s) for s in self.sets)
        shapes = {tuple(s.inputs.shape[1:]) for s in self.sets}
        self._shape = shapes.pop() if len(shapes) == 1 else None  # None: sets never fold
        named = dict(model._module.named_parameters())
        self._selected = [named[n] for n in param_names]
        self.max_grad_norm = float(max_grad_norm)
        self._inputs: dict[tuple, torch.Tensor] = {}
        self._target_cache: dict[torch.device, list[torch.Tensor]] = {}
        self._handles: list = []
        self._in_call = False  # the current forward call was folded
        self._folded_b: int | None = None  # batch rows of the folded forward, until clipped
        # clipped rows and norms, from clipping until take(); folding waits while they are set
        self._result: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def possible(model: nn.Module) -> bool:
        """A batch-first Opacus ``GradSampleModule`` (hooks or functorch mode): what folding
        relies on (expanded-weights and ghost-clipping modules are not)."""
        from opacus.grad_sample import GradSampleModule

        return type(model) is GradSampleModule and bool(getattr(model, "batch_first", False))

    # ------------------------------------------------------------------ attach / detach
    def attach(self) -> None:
        """Register the forward hooks and wrap ``clip_and_accumulate`` on the optimizer."""
        self._handles = [
            self.model.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
            self.model.register_forward_hook(self._post_forward, with_kwargs=True),
        ]
        opt = self.optimizer
        self._had_instance_clip = "clip_and_accumulate" in opt.__dict__
        self._prev_clip = opt.__dict__.get("clip_and_accumulate")
        self._orig_clip = opt.clip_and_accumulate
        opt.clip_and_accumulate = self._clip_and_accumulate

    def detach(self) -> None:
        """Remove the hooks and restore ``clip_and_accumulate`` exactly."""
        for h in self._handles:
            h.remove()
        self._handles = []
        opt = self.optimizer
        if self._had_instance_clip:
            opt.clip_and_accumulate = self._prev_clip
        else:
            opt.__dict__.pop("clip_and_accumulate", None)

    # ------------------------------------------------------------------ forward
    def _canary_inputs(self, like: torch.Tensor) -> torch.Tensor:
        key = (like.device, like.dtype)
        if key not in self._inputs:
            self._inputs[key] = torch.cat([s.inputs for s in self.sets]).to(
                device=like.device, dtype=like.dtype
            )
        return self._inputs[key]

    def _targets(self, device: torch.device) -> list[torch.Tensor]:
        if device not in self._target_cache:
            self._target_cache[device] = [s.targets.to(device) for s in self.sets]
        return self._target_cache[device]

    def _pre_forward(self, module, args, kwargs):
        self._in_call = False
        if (
            self._result is not None
            or self._folded_b is not None
            or in_per_sample_pass()
            or not torch.is_grad_enabled()
            or not module.training
            or not getattr(module, "hooks_enabled", False)
            or kwargs
            or len(args) != 1
            or not isinstance(args[0], torch.Tensor)
            or not args[0].is_floating_point()
            or tuple(args[0].shape[1:]) != self._shape
        ):
            return None
        x = args[0]
        self._in_call = True
        self._folded_b = int(x.shape[0])
        return (torch.cat([x, self._canary_inputs(x)]),), kwargs

    def _post_forward(self, module, args, kwargs, output):
        if not self._in_call:
            return None
        self._in_call = False
        b, k = self._folded_b, self.num_rows
        if not isinstance(output, torch.Tensor) or output.ndim == 0 or output.shape[0] != b + k:
            raise RuntimeError(
                "input canaries could not be folded into the training batch: the model must "
                "return one tensor with the batch on its first axis, got "
                f"{type(output).__name__} {tuple(getattr(output, 'shape', ()))} for "
                f"{b} + {k} rows; pass input_pass='separate' to AuditHook"
            )
        out, grads, start = output[b:], [], 0
        for st, target in zip(self.sets, self._targets(out.device), strict=True):
            grads.append(summed_loss_output_grad(st.loss_fn, out[start : start + len(st)], target))
            start += len(st)
        canary_grad = torch.cat(grads) if len(grads) > 1 else grads[0]
        if module.loss_reduction == "mean":  # Opacus multiplies backprops by b + k
            canary_grad, scale = canary_grad / (b + k), b / (b + k)
        else:
            scale = 1.0
        return _FoldOutputs.apply(output, canary_grad, scale, b)

    # ------------------------------------------------------------------ clipping
    def _clip_and_accumulate(self) -> None:
        if self._folded_b is not None:
            self._strip_and_clip()
        self._orig_clip()

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
        self._result = clip_rows(
            list(rows.values()), [rows[p] for p in self._selected], self.max_grad_norm
        )

    # ------------------------------------------------------------------ results
    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This logical step's (rows, d_selected) clipped canary gradients and the (rows,)
        norms before clipping (over all parameters; non-finite iff a gradient entry is), or
        None if no forward was folded; re-arms folding for the next logical step."""
        result, self._result, self._folded_b = self._result, None, None
        return result
