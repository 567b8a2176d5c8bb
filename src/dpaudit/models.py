"""Model zoo: small Opacus-compatible classifiers (no BatchNorm) for the audit experiments.

``build_model(name, input_shape, num_classes, width=...)`` builds ``"logreg"`` (one linear
layer, as seed 001's FMNIST model), ``"mlp"`` (one hidden layer) or ``"cnn"`` (seed 001's
CIFAR10 shape: three 3x3 conv layers and a linear head); ``register_model`` adds one. The CNN
uses padding, two stride-2 convolutions and adaptive average pooling to 2x2, so the same code
runs on 8x8 digits and 28x28 / 32x32 images. Every model passes
``opacus.validators.ModuleValidator.validate``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpaudit.registry import Registry, callable_entry

LOSS = nn.functional.cross_entropy
"""The loss every audited model is trained and scored with (logits of ``num_classes``)."""


def _logreg(shape: tuple[int, ...], num_classes: int, width: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), num_classes))


def _mlp(shape: tuple[int, ...], num_classes: int, width: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(shape), width), nn.ReLU(), nn.Linear(width, num_classes)
    )


def _cnn(shape: tuple[int, ...], num_classes: int, width: int) -> nn.Module:
    if len(shape) != 3:
        raise ValueError(f"cnn needs input_shape (channels, height, width), got {shape}")
    c = shape[0]
    return nn.Sequential(
        nn.Conv2d(c, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Conv2d(2 * width, 2 * width, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d((2, 2)),
        nn.Flatten(),
        nn.Linear(8 * width, num_classes),
    )


MODELS = Registry("model", {"logreg": _logreg, "mlp": _mlp, "cnn": _cnn},
                  check=callable_entry("model"))
"""Name -> builder ``(input_shape, num_classes, width) -> nn.Module`` (``model.name``)."""


def register_model(name: str, builder=None, *, replace: bool = False):
    """Make ``model.name=<name>`` build with ``builder`` (also usable as a decorator).

    Args:
        name: the new model's name.
        builder: ``builder(input_shape, num_classes, width)`` returning a fresh ``nn.Module``
            that Opacus accepts (no BatchNorm; ``opacus.validators.ModuleValidator``), whose
            output is (batch, num_classes) logits; ``width`` is ``model.width``.
        replace: allow replacing an existing entry.
    """
    return MODELS.register(name, builder, replace=replace)


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    width: int = 16,
    seed: int | None = None,
) -> nn.Module:
    """Return a freshly initialised model; ``seed`` (if given) fixes the initial weights."""
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"input_shape must be positive integers, got {input_shape}")
    if int(num_classes) < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if int(width) < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    builder = MODELS.get_or_fail(name, "name")
    if seed is None:
        model = builder(shape, int(num_classes), int(width))
    else:
        with torch.random.fork_rng(devices=[]):  # seeded init without touching global state
            torch.manual_seed(int(seed))
            model = builder(shape, int(num_classes), int(width))
    if not isinstance(model, nn.Module):
        raise TypeError(f"the builder of model {name!r} must return an nn.Module, "
                        f"got {type(model).__name__}")
    return model
