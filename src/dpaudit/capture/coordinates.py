"""Flat coordinates of a user's model, for Dirac gradient canaries in their own loop.

``GradientCanaries.dirac(coords, ...)`` takes coordinates of the flattened trainable
parameters, in ``named_parameters`` order (what the audit hook and Opacus' clipping see):
``flat_coordinate`` turns (parameter name, index) into one and ``parameter_at`` back.
``dead_coordinates`` finds the coordinates no example's gradient reaches at the current
parameters (weights of pixels blank in every image, embedding rows of token ids the data never
use, inputs of units dead on every example): a Dirac canary there is the only signal on its
coordinate, so every canary is an independent experiment and the audit is tightest. Names may
carry Opacus' ``_module.`` prefix (after ``make_private``) or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import nn

from dpaudit._validate import quoted

_WRAPPER = "_module."  # Opacus' GradSampleModule (and DPDDP) prefix


def trainable_parameters(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) of the trainable parameters in ``named_parameters`` order, names
    without Opacus' wrapper prefix."""
    return [(_plain(n), p) for n, p in model.named_parameters() if p.requires_grad]


def trainable_dim(model: nn.Module) -> int:
    """How many flat coordinates the trainable parameters have (``GradientCanaries``' dim)."""
    return sum(p.numel() for _, p in trainable_parameters(model))


def flat_coordinate(model: nn.Module, name: str, index: int | Iterable[int]) -> int:
    """The flat coordinate of ``name[index]`` (``index`` an int into the flattened tensor or a
    tuple of per-dimension indices, negative ones counted from the end).

    Args:
        model: the model (wrapped by Opacus or not).
        name: a trainable parameter's name, e.g. ``"0.weight"`` or ``"_module.0.weight"``.
        index: the entry of that parameter.
    """
    offset, params = 0, trainable_parameters(model)
    want = _plain(name)
    for n, p in params:
        if n == want:
            return offset + _flat_index(p, index, n)
        offset += p.numel()
    names = [n for n, _ in params]
    frozen = [_plain(n) for n, p in model.named_parameters() if not p.requires_grad]
    why = " (it is frozen: requires_grad=False)" if want in frozen else ""
    raise ValueError(f"flat_coordinate: no trainable parameter {name!r}{why}; the trainable "
                     f"ones are {quoted(names, 8)}")


def parameter_at(model: nn.Module, coordinate: int) -> tuple[str, tuple[int, ...]]:
    """(parameter name, per-dimension index) of a flat coordinate (``flat_coordinate``'s
    inverse)."""
    dim = trainable_dim(model)
    if not (isinstance(coordinate, int | np.integer) and 0 <= coordinate < dim):
        raise ValueError(f"parameter_at: coordinate must be an integer in [0, {dim}), got "
                         f"{coordinate!r}")
    offset = 0
    for n, p in trainable_parameters(model):
        if coordinate < offset + p.numel():
            return n, tuple(int(i) for i in np.unravel_index(int(coordinate) - offset, p.shape))
        offset += p.numel()
    raise AssertionError("unreachable")  # pragma: no cover


def dead_coordinates(
    model: nn.Module,
    data,
    loss_fn: Callable = nn.functional.cross_entropy,
    batch_size: int = 256,
    params: Iterable[str] | None = None,
) -> np.ndarray:
    """Sorted flat coordinates where every example's gradient is exactly zero at the model's
    current parameters (module doc), over the whole of ``data``.

    Args:
        model: the model (wrapped by Opacus or not); its parameters are not changed.
        data: a ``Dataset`` of (input, target) pairs, a ``DataLoader`` (its dataset is read in
            order, every example once: a Poisson loader would skip some), or (inputs, targets).
        loss_fn: the per-example loss, ``loss_fn(output, target)`` on a batch of one.
        batch_size: examples per vectorised pass.
        params: restrict to these parameters' coordinates (still numbered over all trainable
            parameters); default all.

    Structural zeros (blank inputs, unused embedding rows) stay zero through training; a
    unit dead at theta_0 may come alive later, so prefer the structural ones for long runs.
    """
    from dpaudit.gradients import per_sample_clipped_grads

    inner = getattr(model, "_module", model)
    x_all, y_all = _examples(data)
    if len(x_all) == 0:
        raise ValueError("dead_coordinates: data has no examples")
    device = next(inner.parameters()).device
    total = None
    for start in range(0, len(x_all), batch_size):
        g = per_sample_clipped_grads(inner, x_all[start:start + batch_size].to(device),
                                     y_all[start:start + batch_size].to(device), loss_fn, None)
        part = g.abs().sum(0).double()
        total = part if total is None else total + part
    dead = torch.nonzero(total == 0).reshape(-1).cpu().numpy()
    if params is not None:
        keep = np.zeros(trainable_dim(model), dtype=bool)
        offset = 0
        wanted = {_plain(n) for n in params}
        for n, p in trainable_parameters(model):
            if n in wanted:
                keep[offset:offset + p.numel()] = True
            offset += p.numel()
        unknown = wanted - {n for n, _ in trainable_parameters(model)}
        if unknown:
            raise ValueError("dead_coordinates: no trainable parameter(s) "
                             f"{quoted(sorted(unknown))}")
        dead = dead[keep[dead]]
    return np.sort(dead)


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


def _examples(data) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.utils.data import DataLoader, TensorDataset

    if isinstance(data, DataLoader):
        data = data.dataset
    if isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        return data[0], data[1]
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return data.tensors[0], data.tensors[1]
    try:
        pairs = [data[i] for i in range(len(data))]
    except (TypeError, IndexError) as err:
        raise ValueError("dead_coordinates: data must be a Dataset of (input, target) pairs, a "
                         "DataLoader over one, or an (inputs, targets) pair of tensors") from err
    xs = torch.stack([torch.as_tensor(x) for x, _ in pairs])
    ys = torch.stack([torch.as_tensor(y) for _, y in pairs])
    return xs, ys
