"""Model zoo: small Opacus-compatible classifiers (no BatchNorm) for the audit experiments.

``build_model(name, input_shape, num_classes, width=...)`` builds ``"logreg"`` (one linear
layer, as seed 001's FMNIST model), ``"mlp"`` (one hidden layer) or ``"cnn"`` (seed 001's
CIFAR10 shape: three 3x3 conv layers and a linear head). The CNN uses padding, two stride-2
convolutions and adaptive average pooling to 2x2, so the same code runs on 8x8 digits and
28x28 / 32x32 images. Every model passes ``opacus.validators.ModuleValidator.validate``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

MODELS = ("logreg", "mlp", "cnn")


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
    if name not in MODELS:
        raise ValueError(f"name must be one of {MODELS}, got {name!r}")
    if seed is None:
        return _build(name, shape, int(num_classes), int(width))
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the global state
        torch.manual_seed(int(seed))
        return _build(name, shape, int(num_classes), int(width))


def _build(name: str, shape: tuple[int, ...], num_classes: int, width: int) -> nn.Module:
    d = math.prod(shape)
    if name == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(d, num_classes))
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(d, width), nn.ReLU(), nn.Linear(width, num_classes)
        )
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
