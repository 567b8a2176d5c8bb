"""A user's extension of dpaudit, written as a user would, outside the package: one data set,
one model, one attack score and one bound method, registered with ``register_*``.

``register_all()`` registers the four (the tests undo it with ``unregister_all()``); the CLI
loads ``my_extension_plugin``, which calls it, through ``plugins=[my_extension_plugin]``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

import dpaudit
from dpaudit.attacks import StepScore
from dpaudit.data import DATASETS, DatasetInfo
from dpaudit.experiment.trainings.scores import SCORES
from dpaudit.models import MODELS
from dpaudit.stats.bounds import METHOD_REGISTRY
from dpaudit.stats.clopper_pearson import threshold_bound

NAMES = {"dataset": "blobs", "model": "two_layer", "score": "cosine", "bound": "cp_estimate"}


def blobs(seed, test_fraction, n_train, root=None, download=False, **_):
    """Two Gaussian blobs in 12 dimensions, 600 points, split by ``seed``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 600)
    x = (rng.standard_normal((600, 12)) + 1.5 * y[:, None]).astype(np.float32)
    n_test = int(600 * test_fraction)
    train = TensorDataset(torch.from_numpy(x[n_test:]), torch.from_numpy(y[n_test:]))
    test = TensorDataset(torch.from_numpy(x[:n_test]), torch.from_numpy(y[:n_test]))
    return train, test, DatasetInfo("blobs", 2, (12,), 600 - n_test, n_test)


def two_layer(shape, num_classes, width):
    return nn.Sequential(nn.Linear(shape[0], width), nn.Tanh(), nn.Linear(width, num_classes))


class Cosine(StepScore):
    """Cosine of each canary's gradient with the released gradient, summed over steps."""

    def step(self, canary_grads, released, ctx):
        norms = canary_grads.norm(dim=1).clamp_min(1e-12) * released.norm().clamp_min(1e-12)
        return canary_grads @ released / norms


def cp_estimate(scores_in, scores_out, *, delta, confidence):
    """Clopper-Pearson's number, registered without declaring it certified."""
    return threshold_bound("clopper_pearson", scores_in, scores_out, delta=delta,
                           confidence=confidence)


def register_all() -> None:
    dpaudit.register_dataset(NAMES["dataset"], blobs)
    dpaudit.register_model(NAMES["model"], two_layer)
    dpaudit.register_score(NAMES["score"], lambda ctx: Cosine())
    dpaudit.register_bound(NAMES["bound"], cp_estimate)


def unregister_all() -> None:
    for registry, key in ((DATASETS, "dataset"), (MODELS, "model"), (SCORES, "score"),
                          (METHOD_REGISTRY, "bound")):
        if NAMES[key] in registry:
            registry.unregister(NAMES[key])
