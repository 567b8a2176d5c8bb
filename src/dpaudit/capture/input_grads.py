"""Input-canary gradients: the clipped per-example gradients of input canaries at theta_t.

At every real optimizer step the hook needs, for each ``InputCanaries`` set (and the reference
points, if any), the clipped gradients at the parameters the batch gradient was computed at,
clipped with Opacus' flat rule at C, in the hook's coordinates (selection, then view). Two ways:

* folded into the training batch's own forward/backward (``fold.BatchFold``; ``input_pass``
  ``"auto"`` when the model is a batch-first ``GradSampleModule``, or ``"batch"``, which
  requires it);
* one separate batched ``per_sample_clipped_grads`` call per set per step (``"separate"``, and the
  automatic fallback when no forward was folded in the step, and for models that draw random
  numbers in their training forward, e.g. dropout: ``fold.random_modules``, and under
  distributed training, where the fold was measured to drift by float rounding).

Either way training is unchanged bit for bit. The separate pass runs under
``torch.random.fork_rng`` with the global generators reseeded from ``(seed, step)``: the
canaries' dropout masks are drawn from a private stream, and the training's masks, Opacus' noise
(when it uses the global generator) and every later draw are those of training without the
audit. It calls the model with the canaries' own tensor arguments (``InputCanaries.args`` /
``kwargs``) plus what ``ForwardWatcher`` recorded of the step's training forward (the keyword
arguments the canaries do not carry, and the autocast state, replayed). Clipping is done in
float32 (or wider), so the canaries' clipped norms are <= C up to float32 rounding under bf16
autocast too.

``InputGradients`` owns both, plus the ``ForwardWatcher`` that refuses training forwards the
canaries cannot be replayed for. Interface used by the hook: ``attach()`` / ``detach()``,
``start(view, dtype)`` at the first step, then once per real step ``compute(step)`` ->
(per-set gradients in canary order, reference gradients or None), and ``folded_steps``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from opacus.optimizers import DPOptimizer
from torch import nn

from dpaudit._validate import require_choice
from dpaudit.capture.fold import BatchFold, random_modules, row_coupled_modules
from dpaudit.capture.forward_watch import ForwardWatcher, Replay
from dpaudit.capture.input_canaries import InputCanaries, argument_kind
from dpaudit.capture.support import clip_bounds, is_distributed, world_size
from dpaudit.capture.view import CoordinateView
from dpaudit.gradients.persample import per_sample_clipped_grads, unwrap_model

INPUT_PASSES = ("auto", "batch", "separate")


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry is finite, from the row sums: a NaN or infinity makes its row's sum
    non-finite, and one reduction is ~20x cheaper than ``isfinite`` on a (K, d) tensor."""
    return bool(torch.isfinite(x.sum(dim=-1)).all())


def check_reference(reference: tuple | InputCanaries | None) -> InputCanaries | None:
    """``reference=(inputs, targets[, loss_fn])`` or an ``InputCanaries`` (for models whose
    forward takes more than one tensor) as an ``InputCanaries``, or None."""
    if reference is None or isinstance(reference, InputCanaries):
        return reference
    if not isinstance(reference, tuple | list) or len(reference) not in (2, 3):
        raise ValueError(
            "reference must be (inputs, targets), (inputs, targets, loss_fn) or an "
            "InputCanaries"
        )
    return InputCanaries(*reference)


def _private_seed(seed: int, step: int) -> int:
    """A 63-bit seed for the separate pass at ``step`` (splitmix64 of the pair)."""
    z = (seed * 0x9E3779B97F4A7C15 + step + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 1


class InputGradients:
    """Clipped gradients of the input canary sets (and references) at each real step.

    Args:
        model: the model the optimizer trains (usually Opacus' ``GradSampleModule``).
        optimizer: the ``DPOptimizer`` (the fold wraps its ``clip_and_accumulate``).
        sets: the ``InputCanaries`` sets, in canary order.
        reference: reference points (``InputCanaries``) or None; returned apart.
        param_names: the hook's parameter selection (names in the unwrapped model).
        max_grad_norm: the clip bound C at construction (the optimizer's own rule is read
            at every step: flat, per-layer, or adaptive clipping's current bound).
        input_pass: ``"auto"``, ``"batch"`` or ``"separate"`` (module doc).
        check_finite: raise ValueError on a non-finite canary gradient.
        seed: seeds the private random stream of the separate pass (module doc).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: DPOptimizer,
        sets: Sequence[InputCanaries],
        reference: InputCanaries | None,
        param_names: Sequence[str],
        max_grad_norm: float,
        input_pass: str = "auto",
        check_finite: bool = True,
        seed: int = 0,
    ) -> None:
        require_choice("input_pass", input_pass, INPUT_PASSES)
        self.model = model
        self.optimizer = optimizer
        self.sets = list(sets)
        self.reference = reference
        self.seed = int(seed)
        active = self.sets + ([reference] if reference is not None else [])
        signatures = {s.signature for s in active}
        if len(signatures) > 1:
            raise ValueError(
                "canaries: every InputCanaries set and the reference must take the same forward "
                "arguments (number of positional tensors, keyword names), got "
                f"{sorted(signatures)}; pass reference= as an InputCanaries with the same args= "
                "/ kwargs= as the canaries"
            )
        kinds = {}
        for s in active:
            for key, t in s.slots().items():
                kind = argument_kind(t.dtype)
                if kinds.setdefault(key, kind) != kind:
                    raise ValueError(
                        f"canaries: argument {key!r} is of kind {kinds[key]} in one set and "
                        f"{kind} in another"
                    )
        self.param_names = list(param_names)
        self.max_grad_norm = float(max_grad_norm)
        self.input_pass = input_pass
        self.check_finite = bool(check_finite)
        self.fold = self._make_fold()
        self.watcher = (
            ForwardWatcher(model, signatures.pop(), kinds) if active else None
        )
        self.folded_steps = 0
        self._replay = Replay()
        self._view: CoordinateView | None = None
        self._dtype: torch.dtype | None = None

    @property
    def active(self) -> bool:
        """Whether there is anything to compute (input canaries or references)."""
        return bool(self.sets) or self.reference is not None

    def _make_fold(self) -> BatchFold | None:
        sets = self.sets + ([self.reference] if self.reference is not None else [])
        if self.input_pass == "separate" or not sets:
            return None
        if not BatchFold.possible(self.model):
            if self.input_pass == "batch":
                raise ValueError(
                    "input_pass='batch' needs the batch-first Opacus GradSampleModule that "
                    f"make_private returns as model, got {type(self.model).__name__}"
                )
            return None
        if self.input_pass == "auto" and (is_distributed(self.optimizer) or world_size() > 1):
            # Under DDP the fold drifted by float rounding (3.7e-9 on a masked transformer,
            # while one process was exact): "auto" takes the separate pass, exact by design.
            return None
        if self.input_pass == "auto" and row_coupled_modules(self.model):
            return None  # exact by design: the separate pass (fold.row_coupled_modules)
        drawing = random_modules(self.model)
        if drawing:
            if self.input_pass == "batch":
                raise ValueError(
                    f"input_pass='batch': the model draws random numbers in training mode "
                    f"({drawing[:3]}{' ...' if len(drawing) > 3 else ''}); folded canary rows "
                    "would shift the batch's dropout masks. Use input_pass='auto' or "
                    "'separate' (a separate pass under a forked RNG)"
                )
            return None
        return BatchFold(
            self.model,
            self.optimizer,
            sets,
            self.param_names,
            self.max_grad_norm,
            probe=self.input_pass == "auto",
        )

    def attach(self) -> None:
        """Attach the fold (forward hooks, ``clip_and_accumulate``) and the forward watcher."""
        if self.fold is not None:
            self.fold.attach()
        if self.watcher is not None:
            self.watcher.attach()

    def detach(self) -> None:
        """Undo ``attach`` exactly."""
        if self.fold is not None:
            self.fold.detach()
        if self.watcher is not None:
            self.watcher.detach()

    def start(self, view: CoordinateView, dtype: torch.dtype, lazy: bool = False) -> None:
        """Fix the coordinate view (on the model's device) and the dtype of the results;
        ``lazy``: the consumers read the rows only through products and norms, so folded rows
        may stay ``insertion.ClippedRows`` (without a coordinate view)."""
        self._view, self._dtype = view, dtype
        if self.fold is not None:  # the fold gathers the view itself (no K x d temporary)
            self.fold.set_view(view.index)
            self.fold.lazy = bool(lazy) and view.index is None

    def _bounds(self) -> float | dict[str, float]:
        """The optimizer's clip rule now, as ``per_sample_clipped_grads`` takes it: a float
        (flat; adaptive clipping's current C_t) or {parameter name: C_p} (per-layer)."""
        bounds = clip_bounds(self.optimizer)
        if not isinstance(bounds, list):
            return bounds
        by_id = {id(p): c for p, c in zip(self.optimizer.params, bounds, strict=True)}
        return {n: by_id[id(p)] for n, p in unwrap_model(self.model).named_parameters()
                if id(p) in by_id}

    def separate_pass(self, spec: InputCanaries, t: int) -> torch.Tensor:
        """Clipped gradients of ``spec`` at theta_t from one extra per-sample pass, with the
        canaries' own arguments and the step's replay, off the global RNG (module doc)."""
        device = next(self.model.parameters()).device
        cuda = [device.index or 0] if device.type == "cuda" else []
        replay = self._replay
        if replay.autocast is not None:
            amp = torch.autocast(replay.autocast[0], dtype=replay.autocast[1])
        else:
            amp = torch.autocast(device.type, enabled=False)
        with torch.random.fork_rng(devices=cuda), amp:
            seed = _private_seed(self.seed, t)
            torch.default_generator.manual_seed(seed)
            for d in cuda:
                torch.cuda.default_generators[d].manual_seed(seed)
            grads = per_sample_clipped_grads(
                self.model,
                spec.inputs,
                spec.targets,
                spec.loss_fn,
                self._bounds(),
                param_names=self.param_names,
                args=spec.args,
                kwargs=spec.kwargs,
                shared_kwargs=replay.shared_kwargs,
            )
        grads = self._view.gather(grads).to(self._dtype)
        if self.check_finite and not all_finite(grads):
            raise ValueError(f"non-finite canary gradient at optimizer step {t}")
        return grads

    def folded(self, t: int) -> list[torch.Tensor] | None:
        """This step's folded rows split per set (reference last), or None (no fold)."""
        if self.fold is None:
            return None
        taken = self.fold.take()
        if taken is None:
            if self.input_pass == "batch":
                raise RuntimeError(
                    f"input_pass='batch': no training forward was folded before optimizer step "
                    f"{t} (folding needs a grad-enabled training-mode call whose tensor "
                    "arguments match the canaries' inputs, args and kwargs in number, trailing "
                    "shape and kind)"
                )
            return None
        rows, norms, in_view = taken
        self.folded_steps += 1
        if self.check_finite and not bool(torch.isfinite(norms).all()):
            raise ValueError(f"non-finite canary gradient at optimizer step {t}")
        if not in_view:
            rows = self._view.gather(rows)
        rows = rows if rows.dtype == self._dtype else rows.to(self._dtype)
        sets = self.fold.sets
        return [rows] if len(sets) == 1 else list(rows.split([len(s) for s in sets]))

    def check_forward(self, t: int) -> None:
        """Raise if a training forward of this step cannot be replayed for the canaries; else
        keep what the separate pass replays of it."""
        if self.watcher is not None:
            self._replay = self.watcher.check(t)

    def compute(self, t: int) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """(clipped gradients of each set, in order; reference gradients or None) at step t."""
        folded = self.folded(t)
        if folded is not None:
            per_set = folded[: len(self.sets)]
            ref = folded[-1] if self.reference is not None else None
            return per_set, ref
        per_set = [self.separate_pass(s, t) for s in self.sets]
        ref = None if self.reference is None else self.separate_pass(self.reference, t)
        return per_set, ref
