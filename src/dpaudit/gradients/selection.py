"""Parameter selection for the audit hook: which coordinates are recorded and scored.

A selection is a list of parameter names (``"fc.weight"``) and/or module names (``"fc"``, all
trainable parameters under that module), relative to the plain model (an Opacus
``GradSampleModule``'s ``_module.`` prefix is accepted and dropped). The result is always in
the model's ``named_parameters`` order, without duplicates, so that the flattened coordinate
layout is the same for canary vectors, released gradients, traces and per-sample gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from dpaudit._validate import did_you_mean
from dpaudit.gradients.persample import trainable_parameter_names, unwrap_model


def _strip(name: str) -> str:
    return name[len("_module.") :] if name.startswith("_module.") else name


def resolve_parameter_names(model: nn.Module, params: str | Sequence[str] | None) -> list[str]:
    """Return the selected trainable parameter names (model order); ``None`` selects all."""
    trainable = trainable_parameter_names(model)
    if params is None:
        if not trainable:
            raise ValueError("params: the model has no trainable parameters")
        return trainable
    if isinstance(params, str):
        params = [params]
    module = unwrap_model(model)
    named_params = dict(module.named_parameters())
    named_modules = dict(module.named_modules())
    chosen: set[str] = set()
    unknown: list[str] = []
    for raw in params:
        name = _strip(str(raw))
        if name in named_params:
            if name not in trainable:
                raise ValueError(f"params: parameter {name!r} does not require gradients")
            chosen.add(name)
        elif name in named_modules and name != "":
            prefix = name + "."
            under = [n for n in trainable if n.startswith(prefix)]
            if not under:
                raise ValueError(f"params: module {name!r} has no trainable parameters")
            chosen.update(under)
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"params: not parameter or module names of the model: {unknown}"
            f"{did_you_mean(unknown[0], [*trainable, *named_modules])}; parameters are "
            f"{trainable}"
        )
    if not chosen:
        raise ValueError("params: the selection is empty")
    return [n for n in trainable if n in chosen]
