"""Flat coordinates of a user's model, for Dirac gradient canaries in their own loop.

``GradientCanaries.dirac(coords, ...)`` takes coordinates of the flattened parameters the audit
hook records: its ``params`` selection (default every trainable parameter), in
``named_parameters`` order (what the hook and Opacus' clipping see). ``trainable_dim(model,
params=...)`` is that selection's dimension (the canaries' ``dim``), ``flat_coordinate`` turns
(parameter name, index) into a coordinate and ``parameter_at`` back.

``dead_coordinates`` finds coordinates no example's gradient reaches, of one of two kinds, and
says which by its ``kind`` argument (``DEAD_KINDS``):

* ``"structural"`` (the default): no data gradient can reach them whatever the parameters, by
  the model's structure: first-layer weights of input features that are zero in every
  example (pixels blank in every image, a zero border under a convolution), embedding rows of
  token ids the data never use (``structural``). A Dirac canary there is the only signal on
  its coordinate through the whole training: every canary is an independent experiment.
* ``"at_theta0"``: the gradient of every example is exactly zero at the model's current
  parameters (theta_0 when called before training). This adds, e.g., the weights of ReLU
  units no example activates at theta_0, and those can come alive during training: a canary
  there may stop being independent.

Names may carry Opacus' ``_module.`` prefix (after ``make_private``) or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from dpaudit._validate import quoted, require_choice
from dpaudit.gradients.selection import resolve_parameter_names

_WRAPPER = "_module."  # Opacus' GradSampleModule (and DPDDP) prefix
DEAD_KINDS = ("structural", "at_theta0")
"""``dead_coordinates``' kinds: dead by the model's structure at every step, or only at the
current parameters (module doc)."""

Params = str | Sequence[str] | None


def trainable_parameters(model: nn.Module, params: Params = None
                         ) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) of the selected trainable parameters in ``named_parameters`` order,
    names without Opacus' wrapper prefix.

    Args:
        model: the model (wrapped by Opacus or not).
        params: parameter or module names, as ``AuditHook(params=...)`` takes them (default:
            every trainable parameter).
    """
    inner = getattr(model, "_module", model)
    named = dict(inner.named_parameters())
    if params is None:
        return [(_plain(n), p) for n, p in model.named_parameters() if p.requires_grad]
    return [(n, named[n]) for n in resolve_parameter_names(model, params)]


def trainable_dim(model: nn.Module, params: Params = None) -> int:
    """How many flat coordinates the selected trainable parameters have: the dimension the
    audit hook records with the same ``params`` (``GradientCanaries``' ``dim``).

    Args:
        model: the model (wrapped by Opacus or not).
        params: parameter or module names, as ``AuditHook(params=...)`` takes them (default:
            every trainable parameter).
    """
    return sum(p.numel() for _, p in trainable_parameters(model, params))


def flat_coordinate(model: nn.Module, name: str, index: int | Iterable[int],
                    params: Params = None) -> int:
    """The flat coordinate of ``name[index]`` (``index`` an int into the flattened tensor or a
    tuple of per-dimension indices, negative ones counted from the end).

    Args:
        model: the model (wrapped by Opacus or not).
        name: a trainable parameter's name, e.g. ``"0.weight"`` or ``"_module.0.weight"``.
        index: the entry of that parameter.
        params: the audit hook's ``params`` selection the coordinate is numbered in (default:
            every trainable parameter).
    """
    offset, selected = 0, trainable_parameters(model, params)
    want = _plain(name)
    for n, p in selected:
        if n == want:
            return offset + _flat_index(p, index, n)
        offset += p.numel()
    names = [n for n, _ in selected]
    frozen = [_plain(n) for n, p in model.named_parameters() if not p.requires_grad]
    why = " (it is frozen: requires_grad=False)" if want in frozen else ""
    if not why and params is not None and want in dict(trainable_parameters(model)):
        why = f" in the selection params={params!r}"
    raise ValueError(f"flat_coordinate: no trainable parameter {name!r}{why}; the "
                     f"{'selected' if params is not None else 'trainable'} ones are "
                     f"{quoted(names, 8)}")


def parameter_at(model: nn.Module, coordinate: int,
                 params: Params = None) -> tuple[str, tuple[int, ...]]:
    """(parameter name, per-dimension index) of a flat coordinate (``flat_coordinate``'s
    inverse).

    Args:
        model: the model (wrapped by Opacus or not).
        coordinate: a flat coordinate in [0, ``trainable_dim(model, params)``).
        params: the audit hook's ``params`` selection it is numbered in (default: every
            trainable parameter).
    """
    dim = trainable_dim(model, params)
    if not (isinstance(coordinate, int | np.integer) and 0 <= coordinate < dim):
        raise ValueError(f"parameter_at: coordinate must be an integer in [0, {dim}), got "
                         f"{coordinate!r}")
    offset = 0
    for n, p in trainable_parameters(model, params):
        if coordinate < offset + p.numel():
            return n, tuple(int(i) for i in np.unravel_index(int(coordinate) - offset, p.shape))
        offset += p.numel()
    raise AssertionError("unreachable")  # pragma: no cover


def dead_coordinates(
    model: nn.Module,
    data,
    loss_fn: Callable = nn.functional.cross_entropy,
    batch_size: int = 256,
    params: Params = None,
    kind: str = "structural",
) -> np.ndarray:
    """Sorted flat coordinates that no example of ``data`` sends gradient to, of the ``kind``
    asked for (module doc): ``"structural"`` (default), dead whatever the parameters, so
    for the whole training; ``"at_theta0"``, dead at the model's current parameters only
    (a superset: it adds, e.g., weights of ReLU units dead at theta_0, which training can
    revive).

    Args:
        model: the model (wrapped by Opacus or not); its parameters are not changed.
        data: a ``Dataset`` of (input, target) pairs, a ``DataLoader`` (its dataset is read in
            order, every example once: a Poisson loader would skip some), or (inputs, targets).
            The training data as the model sees them: structural zeros are those of these
            examples.
        loss_fn: the per-example loss, ``loss_fn(output, target)`` on a batch of one
            (``"at_theta0"`` only: structural deadness holds for any loss).
        batch_size: examples per vectorised pass.
        params: parameter or module names, as ``AuditHook(params=...)`` takes them; the
            coordinates are numbered in that selection, as the hook's (default: every
            trainable parameter).
        kind: ``"structural"`` or ``"at_theta0"`` (``DEAD_KINDS``).

    An empty result means the model has none of that kind (e.g. a tanh MLP on data with no
    all-zero feature has no structural ones): ``GradientCanaries.dirac`` then says what to do.
    """
    require_choice("dead_coordinates: kind", kind, DEAD_KINDS)
    names = resolve_parameter_names(model, params)
    x_all, y_all = _examples(data, twice=kind == "structural")
    if len(x_all) == 0:
        raise ValueError("dead_coordinates: data has no examples")
    inner = getattr(model, "_module", model)
    device = next(inner.parameters()).device
    chunks = range(0, len(x_all), batch_size)
    if kind == "structural":
        from dpaudit.capture.structural import structurally_dead

        dead = structurally_dead(
            inner, (x_all[s:s + batch_size].to(device) for s in chunks), names)
        return np.flatnonzero(dead)
    from dpaudit.gradients import per_sample_clipped_grads

    total = None
    for start in chunks:
        g = per_sample_clipped_grads(inner, x_all[start:start + batch_size].to(device),
                                     y_all[start:start + batch_size].to(device), loss_fn, None,
                                     param_names=names)
        part = g.abs().sum(0).double()
        total = part if total is None else total + part
    return np.sort(torch.nonzero(total == 0).reshape(-1).cpu().numpy())


def _plain(name: str) -> str:
    while name.startswith(_WRAPPER):
        name = name[len(_WRAPPER):]
    return name


def _flat_index(p: torch.Tensor, index, name: str) -> int:
    if isinstance(index, int | np.integer):
        i = int(index) + (p.numel() if index < 0 else 0)
        if not 0 <= i < p.numel():
            raise ValueError(f"flat_coordinate: index {index} is outside {name} "
                             f"({p.numel()} entries, shape {tuple(p.shape)})")
        return i
    idx = tuple(int(i) for i in index)
    if len(idx) != p.dim() or any(not -s <= i < s for i, s in zip(idx, p.shape, strict=True)):
        raise ValueError(f"flat_coordinate: index {idx} does not fit {name} of shape "
                         f"{tuple(p.shape)}")
    return int(np.ravel_multi_index(tuple(i % s for i, s in zip(idx, p.shape, strict=True)),
                                    tuple(p.shape)))


def _examples(data, twice: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of every example of ``data``; ``twice``: a data set that is not held
    in tensors is read a second time and refused when the reads differ (random
    augmentations: one read does not show the zeros of the others)."""
    from torch.utils.data import DataLoader, TensorDataset

    if isinstance(data, DataLoader):
        data = data.dataset
    if isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        return data[0], data[1]
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return data.tensors[0], data.tensors[1]
    xs, ys = _read(data)
    if twice and not torch.equal(xs, _read(data)[0]):
        raise ValueError(
            "dead_coordinates: data gives different inputs on two reads (random "
            "augmentations?), so the zeros of one read are not those of every step; pass "
            "data=(inputs, targets) tensors whose zeros every augmentation keeps, or choose "
            "canaries that need no dead coordinates (GradientCanaries.dirac's message)")
    return xs, ys


def _read(data) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        pairs = [data[i] for i in range(len(data))]
    except (TypeError, IndexError) as err:
        raise ValueError("dead_coordinates: data must be a Dataset of (input, target) pairs, a "
                         "DataLoader over one, or an (inputs, targets) pair of tensors") from err
    xs = torch.stack([torch.as_tensor(x) for x, _ in pairs])
    ys = torch.stack([torch.as_tensor(y) for _, y in pairs])
    return xs, ys
