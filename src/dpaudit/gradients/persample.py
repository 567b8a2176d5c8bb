"""Clipped per-sample gradients of a batch of examples, in one batched call.

Used wherever an auditor needs g*(x) at the current parameters: input canaries during training
(capture), reference and candidate gradients at theta_0 (canaries, covariance estimators). The
clip rule is Opacus' flat clipping: factor min(1, C / (||g||_2 + 1e-6)) with the norm taken
over *all* trainable parameters, as the DP optimizer does, even when only a subset of the
parameters is returned.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpaudit._validate import did_you_mean

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module under Opacus' GradSampleModule (or the model itself)."""
    return getattr(model, "_module", model)


_IN_PASS: ContextVar[bool] = ContextVar("dpaudit_per_sample_pass", default=False)


def in_per_sample_pass() -> bool:
    """True inside a ``per_sample_clipped_grads`` pass (training-time hooks stay out of it)."""
    return _IN_PASS.get()


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


@contextmanager
def suspended_module_hooks(module: nn.Module) -> Iterator[None]:
    """Temporarily remove every module hook under ``module`` (restored exactly on exit)."""
    saved = []
    for m in module.modules():
        saved.append((m, [getattr(m, a) for a in _HOOK_DICTS]))
        for a in _HOOK_DICTS:
            setattr(m, a, OrderedDict())
    try:
        yield
    finally:
        for m, dicts in saved:
            for a, d in zip(_HOOK_DICTS, dicts, strict=True):
                setattr(m, a, d)


def trainable_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters with ``requires_grad``, in ``named_parameters`` order."""
    return [n for n, p in unwrap_model(model).named_parameters() if p.requires_grad]


def per_sample_clipped_grads(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn,
    max_grad_norm: float | Mapping[str, float] | None,
    param_names: Sequence[str] | None = None,
    chunk_size: int | None = 256,
    backend: str = "auto",
    args: Sequence[torch.Tensor] = (),
    kwargs: Mapping[str, torch.Tensor] | None = None,
    shared_kwargs: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Return an (n, d) tensor of clipped per-example gradients, flattened and concatenated.

    Example i's gradient is that of ``loss_fn(model(inputs[i:i+1], *args_i, **kwargs_i,
    **shared_kwargs), targets[i:i+1])``: ``args`` and ``kwargs`` are further per-example
    tensor arguments (each (n, ...)), ``shared_kwargs`` keyword arguments passed unchanged to
    every call (e.g. ``need_weights=False``). ``loss_fn(output, target)`` is the per-example
    loss (it receives a batch of one and must return a scalar, e.g.
    ``nn.functional.cross_entropy``). ``param_names`` selects which parameters' coordinates are
    returned (default: all trainable); clipping always uses the norm over all trainable
    parameters, in at least float32 (so the result has norm <= C up to float32 rounding also
    when the gradients are bfloat16); a mapping {parameter name: C_p} over every trainable
    parameter clips each parameter's part to its own bound (Opacus' per-layer clipping).
    ``max_grad_norm=None`` returns unclipped gradients.
    The result lives on the model's device; the model's parameters are not modified.
    ``backend``: ``"auto"`` (default), ``"func"`` or ``"opacus"`` (see the module docstring).
    """
    module = unwrap_model(model)
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"inputs and targets disagree on the number of examples: "
            f"{inputs.shape[0]} vs {targets.shape[0]}"
        )
    args = tuple(args)
    kwargs = dict(kwargs or {})
    shared_kwargs = dict(shared_kwargs or {})
    for label, t in [*((f"args[{i}]", a) for i, a in enumerate(args)),
                     *((f"kwargs[{k!r}]", v) for k, v in kwargs.items())]:
        if not isinstance(t, torch.Tensor) or t.ndim < 1 or t.shape[0] != inputs.shape[0]:
            raise ValueError(
                f"{label} must be a tensor with the {inputs.shape[0]} examples on its first "
                f"axis, got {tuple(getattr(t, 'shape', ())) or type(t).__name__}"
            )
    clash = sorted(set(kwargs) & set(shared_kwargs))
    if clash:
        raise ValueError(f"shared_kwargs repeats per-example kwargs {clash}")
    named = dict(module.named_parameters())
    trainable = [n for n, p in named.items() if p.requires_grad]
    if not trainable:
        raise ValueError("model has no trainable parameters")
    bounds = _check_bounds(max_grad_norm, trainable)
    selected = list(trainable if param_names is None else param_names)
    unknown = [n for n in selected if n not in named or not named[n].requires_grad]
    if unknown:
        raise ValueError(f"param_names not among the model's trainable parameters: {unknown}"
                         f"{did_you_mean(unknown[0], trainable)}")
    if backend not in ("auto", "func", "opacus"):
        raise ValueError(f"backend must be 'auto', 'func' or 'opacus', got {backend!r}")
    device = next(iter(named.values())).device
    inputs = inputs.to(device)
    targets = targets.to(device)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    n = inputs.shape[0]
    use_opacus = _opacus_backend_ok(model)
    if backend == "opacus" and not use_opacus:
        raise ValueError(
            "backend='opacus' needs a training-mode, batch-first opacus GradSampleModule"
        )
    if n == 0:
        width = sum(named[k].numel() for k in selected)
        return torch.zeros(0, width, device=device, dtype=named[selected[0]].dtype)
    if use_opacus and backend != "func":
        grads = _grads_via_opacus(
            model, (inputs, *args), {**kwargs, **shared_kwargs}, targets, loss_fn, trainable
        )
    else:
        grads = _grads_via_func(
            module, (inputs, *args), kwargs, shared_kwargs, targets, loss_fn, trainable,
            chunk_size,
        )
    if max_grad_norm is None:
        return torch.cat([grads[k].reshape(n, -1) for k in selected], dim=1)
    clipped, _ = clip_rows(
        [grads[k] for k in trainable], [grads[k] for k in selected], bounds
    )
    return clipped


def _check_bounds(max_grad_norm, trainable: Sequence[str]):
    """The clip bound as ``clip_rows`` takes it: a float (flat), a list aligned with
    ``trainable`` (per-layer, from a {name: C_p} mapping) or None."""
    if max_grad_norm is None:
        return None
    if isinstance(max_grad_norm, Mapping):
        missing = [n for n in trainable if n not in max_grad_norm]
        if missing:
            raise ValueError(f"max_grad_norm: per-layer bounds missing for {missing}")
        bounds = [float(max_grad_norm[n]) for n in trainable]
        if not all(b > 0 for b in bounds):
            raise ValueError(f"max_grad_norm: per-layer bounds must be positive, got {bounds}")
        return bounds
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be positive or None, got {max_grad_norm!r}")
    return float(max_grad_norm)


def clip_factor(norms: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
    """Opacus' per-sample clip factor min(1, C / (norm + 1e-6))."""
    return (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)


def clip_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype clipping works in: at least float32 (bfloat16 / float16 gradients are clipped
    in float32, so that the clipped norm is <= C up to float32 rounding)."""
    return torch.promote_types(dtype, torch.float32)


def clip_rows(
    per_param: Sequence[torch.Tensor],
    selected: Sequence[torch.Tensor],
    max_grad_norm: float | Sequence[float],
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Opacus' clipping of per-sample gradients given per parameter as (n, *shape).

    Flat (``max_grad_norm`` a float C): the norm of each row is taken over ``per_param`` (all
    parameters the optimizer clips) and every part is scaled by min(1, C / (norm + 1e-6)).
    Per-layer (a sequence of bounds C_p aligned with ``per_param``, as Opacus'
    ``DPPerLayerOptimizer`` clips): each parameter's part is scaled by its own factor from its
    own norm; ``selected`` must then be tensors of ``per_param`` (matched by identity).
    Returns the (n, d_selected) clipped rows of the ``selected`` tensors, flattened and
    concatenated in order, and the (n,) norms before clipping (over every parameter). Norms,
    factors and the result are in ``clip_dtype`` (at least float32). The rows are read once for
    the norms and once while they are scaled straight into the result: ``out`` (an
    (n, d_selected) tensor of that dtype, e.g. a buffer reused across steps) or a new tensor.
    """
    n = per_param[0].shape[0]
    dtype = clip_dtype(per_param[0].dtype)
    _, norms, factors = clip_factors(per_param, selected, max_grad_norm)
    widths = [math.prod(g.shape[1:]) for g in selected]
    if out is None:
        out = selected[0].new_empty((n, sum(widths)), dtype=dtype)
    elif out.shape != (n, sum(widths)) or out.dtype != dtype:
        raise ValueError(
            f"out must be a ({n}, {sum(widths)}) {dtype} tensor, got "
            f"{tuple(out.shape)} {out.dtype}"
        )
    start = 0
    for g, w, f in zip(selected, widths, factors, strict=True):  # clip into the output
        torch.mul(g.reshape(n, w), f, out=out[:, start : start + w])
        start += w
    return out, norms


def clip_factors(per_param, selected, max_grad_norm) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Opacus' clip factors of n per-sample gradients given per parameter as (n, *shape):
    ((n, len(per_param)) part norms, (n,) norms over every parameter, the (n, 1) factor of each
    ``selected`` tensor), all in ``clip_dtype``. One flat factor from the norms for a float C;
    under per-layer bounds (a sequence aligned with ``per_param``, ``selected`` among its
    tensors, matched by identity) each part's own from its own norm."""
    n = per_param[0].shape[0]
    dtype = clip_dtype(per_param[0].dtype)
    part_norms = torch.stack(
        [torch.linalg.vector_norm(g.reshape(n, -1), dim=1, dtype=dtype) for g in per_param], 1
    )
    norms = part_norms.norm(2, dim=1)
    if not isinstance(max_grad_norm, Sequence):
        flat = clip_factor(norms, float(max_grad_norm)).unsqueeze(1)
        return part_norms, norms, [flat] * len(selected)
    if len(max_grad_norm) != len(per_param):
        raise ValueError(f"max_grad_norm: {len(max_grad_norm)} per-layer bounds for "
                         f"{len(per_param)} parameters")
    index = {id(g): i for i, g in enumerate(per_param)}
    if any(id(g) not in index for g in selected):
        raise ValueError("per-layer clipping: the selected tensors must be among per_param")
    return part_norms, norms, [
        clip_factor(part_norms[:, index[id(g)]], float(max_grad_norm[index[id(g)]]))
        .unsqueeze(1) for g in selected]


def _opacus_backend_ok(model: nn.Module) -> bool:
    try:
        from opacus.grad_sample import GradSampleModule
    except ImportError:  # pragma: no cover - opacus is a dependency
        return False
    return (
        type(model) is GradSampleModule  # not ghost clipping / expanded weights subclasses
        and bool(getattr(model, "hooks_enabled", False))
        and model.training
        and bool(getattr(model, "batch_first", False))
    )


# Classification losses for which, with (N, C) outputs and (N,) class targets, reduction="sum"
# is exactly the sum of the per-example losses (each a scalar): one call instead of a vmap.
_SUMMABLE_LOSSES = frozenset({nn.functional.cross_entropy, nn.functional.nll_loss})


def summed_loss(loss_fn: LossFn, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of ``loss_fn`` applied to each example alone."""
    if loss_fn in _SUMMABLE_LOSSES and out.ndim == 2 and targets.ndim == 1:
        return loss_fn(out, targets, reduction="sum")
    return vmap(lambda o, t: loss_fn(o.unsqueeze(0), t.unsqueeze(0)))(out, targets).sum()


def summed_loss_output_grad(
    loss_fn: LossFn, out: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Gradient of ``summed_loss`` with respect to the outputs ``out`` (same shape).

    Closed forms for (N, C) outputs and (N,) class targets: cross-entropy gives
    softmax(out) - onehot(target), NLL gives -onehot(target); any other loss goes through
    autograd.
    """
    closed = out.ndim == 2 and targets.ndim == 1 and not targets.is_floating_point()
    if closed and loss_fn in _SUMMABLE_LOSSES:
        if loss_fn is nn.functional.cross_entropy:
            grad = torch.softmax(out.detach(), dim=1)
        else:
            grad = torch.zeros_like(out, dtype=out.dtype)
        return grad.scatter_add_(1, targets.unsqueeze(1), grad.new_full((len(grad), 1), -1.0))
    with torch.enable_grad():
        leaf = out.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(summed_loss(loss_fn, leaf, targets), leaf)
    return grad


def _grads_via_opacus(model, args, kwargs, targets, loss_fn, trainable) -> dict[str, torch.Tensor]:
    """Per-example gradients from one pass through the GradSampleModule's hooks."""
    named = dict(model._module.named_parameters())
    params = [named[k] for k in trainable]
    saved = [(p.grad, getattr(p, "grad_sample", None)) for p in params]
    n = args[0].shape[0]
    token = _IN_PASS.set(True)
    try:
        for p in params:
            p.grad = None
            p.grad_sample = None
        with torch.enable_grad():
            out = model(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or out.ndim == 0 or out.shape[0] != n:
                raise ValueError(
                    "per-example gradients need a model returning one tensor with the "
                    f"{n} examples on its first axis, got {type(out).__name__} "
                    f"{tuple(getattr(out, 'shape', ()))}"
                )
            total = summed_loss(loss_fn, out.float() if out.dtype in _LOW else out, targets)
            if model.loss_reduction == "mean":  # the hooks multiply backprops by n
                total = total / n
            torch.autograd.backward(total, inputs=params)
        grads = {}
        for k, p in zip(trainable, params, strict=True):
            gs = p.grad_sample
            grads[k] = p.new_zeros((n, *p.shape)) if gs is None else gs.detach()
        return grads
    finally:
        for p, (g, gs) in zip(params, saved, strict=True):
            p.grad = g
            p.grad_sample = gs
        _IN_PASS.reset(token)


_LOW = (torch.bfloat16, torch.float16)


def _grads_via_func(module, args, kwargs, shared, targets, loss_fn, trainable, chunk_size):
    """Per-example gradients by torch.func (vmap of grad), module hooks suspended. Random
    operations (dropout in training mode) draw a different mask per example."""
    named = dict(module.named_parameters())
    params = {n: named[n].detach() for n in trainable}
    buffers = {n: b.detach() for n, b in module.named_buffers()}

    def loss_one(p, xs, kw, y):
        call_args = tuple(x.unsqueeze(0) for x in xs)
        call_kw = {k: v.unsqueeze(0) for k, v in kw.items()}
        out = functional_call(module, (p, buffers), call_args, {**call_kw, **shared})
        if out.dtype in _LOW:
            out = out.float()
        return loss_fn(out, y.unsqueeze(0))

    with suspended_module_hooks(module):
        return vmap(
            grad(loss_one),
            in_dims=(None, 0, 0, 0),
            chunk_size=chunk_size,
            randomness="different",
        )(params, args, kwargs, targets)
