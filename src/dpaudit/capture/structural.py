"""Coordinates no data gradient can ever reach, by the model's structure: exact, conservative.

A layer that reads the model's input itself has a weight gradient that is a product with that
input, at every step and whatever the parameters: ``nn.Linear``'s per-example gradient is
``backprop (x) input``, so the column of an input feature that is zero in every training
example is zero; a convolution's weight entry (output channel, input channel, kernel offset)
multiplies the (padded) input at the positions that offset visits, so it is zero when every
one of them is zero (or padding) in every example; an ``nn.Embedding`` /
``nn.EmbeddingBag`` row gets gradient only from the token ids that select it. Opacus' per-sample
gradients are these products (``grad_sample``), and so are autograd's, so such coordinates
carry nothing but the noise (and canaries) through the whole training: a Dirac canary there
stays an independent experiment. Coordinates that are merely dead at the initial parameters
(weights of ReLU units no example activates at theta_0) are another kind: training can
revive them (``dead_coordinates(kind="at_theta0")``).

``structurally_dead`` establishes the first kind from one forward pass over the data, and
calls a coordinate dead only when it is proven so:

* the layer is one of those above with PyTorch's own ``forward`` (a subclass that overrides it
  is not trusted), and every call of it in the pass reads the model's input itself: the very
  tensor, or a view of its memory in the same element order (``nn.Flatten``, ``reshape``),
  not modified in place (its version counter unchanged). A layer after anything that computes
  (a normalisation, ``x / 255``, dropout) proves nothing;
* its weight receives gradient from those calls only: the autograd graph of the pass has
  exactly one edge into the weight per call (a weight tied to another layer, or used in a
  ``forward`` of its own elsewhere, has more);
* the input is as ``data`` yields it: the zeros are those of the examples given (a data set
  that draws random augmentations is read twice and refused when the reads differ).

Biases, normalisation weights and every deeper layer are never structurally dead here. The
pass runs with the model's module hooks suspended (Opacus' capture hooks see nothing) and the
global random streams restored afterwards (dropout's draws do not move the user's stream).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from dpaudit.gradients.persample import suspended_module_hooks, unwrap_model

_LINEAR = (nn.Linear,)
_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_EMBEDDING = (nn.Embedding, nn.EmbeddingBag)


def structurally_dead(model: nn.Module, batches: Iterable[torch.Tensor],
                      param_names: list[str]) -> np.ndarray:
    """(d,) booleans over the flattened ``param_names`` (model order, as the audit hook
    flattens its selection): True where no example of ``batches`` can ever send gradient, by
    the model's structure (module doc).

    Args:
        model: the model (Opacus' wrapper is looked through); its parameters are not changed.
        batches: the training inputs, batch by batch (every example once, on the model's
            device).
        param_names: the selected trainable parameters' names (``resolve_parameter_names``).
    """
    module = unwrap_model(model)
    named = dict(module.named_parameters())
    layers = {name: m for name, m in module.named_modules() if _trusted(m)}
    watched = {id(m.weight): name for name, m in layers.items()
               if f"{name}.weight".lstrip(".") in param_names}
    reached = {name: None for name in watched.values()}  # name -> union of "may be non-zero"
    raw_only = dict.fromkeys(watched.values(), True)
    devices = [p.device for p in named.values() if p.device.type == "cuda"]
    with torch.random.fork_rng(devices=sorted({d.index or 0 for d in devices})), \
            suspended_module_hooks(module), torch.enable_grad():
        for x in batches:
            calls = _one_pass(module, layers, watched, x)
            for name, seen in calls.items():
                if seen is None:
                    raw_only[name] = False
                elif raw_only[name]:
                    reached[name] = seen if reached[name] is None else reached[name] | seen
    out = []
    for n in param_names:
        p = named[n]
        layer = next((name for name in watched.values() if f"{name}.weight".lstrip(".") == n),
                     None)
        if layer is None or not raw_only[layer] or reached[layer] is None:
            out.append(np.zeros(p.numel(), dtype=bool))
        else:
            out.append(~reached[layer].reshape(-1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


def _trusted(m: nn.Module) -> bool:
    """A layer whose weight gradient is a product with its input: PyTorch's own forward."""
    w = getattr(m, "weight", None)
    if not isinstance(w, nn.Parameter) or not w.requires_grad:
        return False
    if isinstance(m, _LINEAR):
        return type(m).forward is nn.Linear.forward
    if isinstance(m, _CONV):
        base = next(c for c in _CONV if isinstance(m, c))
        return (type(m).forward is base.forward
                and type(m)._conv_forward is base._conv_forward)
    if isinstance(m, _EMBEDDING):
        base = next(c for c in _EMBEDDING if isinstance(m, c))
        return type(m).forward is base.forward
    return False


def _one_pass(module: nn.Module, layers: dict[str, nn.Module], watched: dict[int, str],
              x: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """One forward of ``x``: per watched layer, the union over its calls of the weight entries
    the input may reach (None when a call did not read the raw input, or when the weight gets
    gradient from anything but these calls)."""
    x = x.contiguous()
    version = x._version
    seen: dict[str, torch.Tensor | None] = {}
    counts: dict[str, int] = {}
    handles = []

    def pre_hook(name: str, m: nn.Module):
        def hook(_m, args):
            counts[name] = counts.get(name, 0) + 1
            t = args[0] if args else None
            reach = _reach(m, t) if _is_raw(t, x, version) else None
            if name in seen and (seen[name] is None or reach is None):
                seen[name] = None
            else:
                seen[name] = reach if name not in seen else seen[name] | reach
        return hook

    for name in watched.values():
        m = layers[name]
        handles.append(m.register_forward_pre_hook(pre_hook(name, m)))
    try:
        out = module(x)
    finally:
        for h in handles:
            h.remove()
    edges = _edges_into_leaves(out)
    for key, name in watched.items():
        if name in seen and edges.get(key, 0) != counts.get(name, 0):
            seen[name] = None  # the weight is used elsewhere too (tied, or functional)
    return seen


def _is_raw(t, x: torch.Tensor, version: int) -> bool:
    """``t`` is the model's input itself or a same-order view of it, unmodified."""
    if not isinstance(t, torch.Tensor):
        return False
    if t is x:
        return t._version == version
    return (t.dtype == x.dtype and t.device == x.device and t.numel() == x.numel()
            and t.data_ptr() == x.data_ptr() and t.is_contiguous() and x.is_contiguous()
            and t._version == version)


def _reach(m: nn.Module, t: torch.Tensor) -> torch.Tensor:
    """Booleans of the weight's shape: the entries an input ``t`` (raw) may send gradient to."""
    w = m.weight
    with torch.no_grad():
        if isinstance(m, _EMBEDDING):
            used = torch.zeros(w.shape[0], dtype=torch.bool, device=w.device)
            used[t.reshape(-1).long()] = True
            return used[:, None].expand(w.shape).clone()
        if isinstance(m, _LINEAR):
            nonzero = (t != 0).reshape(-1, w.shape[1]).any(0)
            return nonzero[None, :].expand(w.shape).clone()
    # a convolution: d sum(conv(A, W)) / dW counts the non-zero inputs (A: where any example
    # is non-zero) each entry multiplies, with the layer's own padding, stride and dilation
    union = (t != 0).any(0, keepdim=True).to(torch.float32)
    probe = torch.zeros(w.shape, dtype=torch.float32, device=w.device, requires_grad=True)
    (hits,) = torch.autograd.grad(m._conv_forward(union, probe, None).sum(), probe)
    return hits != 0


def _edges_into_leaves(out) -> dict[int, int]:
    """id(leaf tensor) -> how many edges of ``out``'s autograd graph end in it."""
    roots = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
    counts: dict[int, int] = {}
    seen, stack = set(roots), list(roots)
    while stack:
        fn = stack.pop()
        for nxt, _ in fn.next_functions:
            if nxt is None:
                continue
            leaf = getattr(nxt, "variable", None)
            if leaf is not None:
                counts[id(leaf)] = counts.get(id(leaf), 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return counts


def _tensors(out) -> list[torch.Tensor]:
    """The tensors of a model's output (a tensor, or nested tuples / lists / dicts)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []
