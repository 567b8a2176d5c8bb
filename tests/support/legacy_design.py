"""``my_design.py`` as a user wrote it for dpaudit 0.1, whose design hooks took the whole
settings (``check(settings)``, ``sample_rate(settings, q)``, ``canary_norm(settings,
measured)``, ``ctx.settings`` in ``build``): the deprecated interface that still works, with
a ``DeprecationWarning``, for one release. ``register()`` adds it as
``canary.kind=sparse_sign_legacy``; the same canaries as ``my_design.SparseSignDesign``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dpaudit.capture import GradientCanaries
from dpaudit.experiment.canary_designs import (
    DESIGNS,
    BuildContext,
    CanaryDesign,
    CanarySetup,
    register_canary_design,
)

NAME = "sparse_sign_legacy"


@dataclass(frozen=True)
class SparseSignOptions:
    support: int = 4  # coordinates per canary


class SparseSignDesign(CanaryDesign):
    threat_kind = "gradient"
    Options = SparseSignOptions
    refused_scores = {"mixture_lr": "these canaries enter every step"}  # noqa: RUF012

    def check(self, settings) -> None:
        if self.options(settings.canary).support < 1:
            raise ValueError("canary.options.support must be a positive integer")

    def sample_rate(self, settings, data_rate):
        return 1.0  # every member enters every step

    def canary_norm(self, settings, measured):
        return measured

    def build(self, ctx: BuildContext) -> CanarySetup:
        support = self.options(ctx.settings.canary).support
        params = dict(ctx.model.named_parameters())
        dim = sum(params[n].numel() for n in ctx.param_names)
        norm = ctx.settings.dp.max_grad_norm
        count = ctx.settings.canary.count
        vectors = torch.zeros(count, dim)
        for k in range(count):
            coords = ctx.rng.choice(dim, size=support, replace=False)
            signs = torch.as_tensor(ctx.rng.choice([-1.0, 1.0], size=support), dtype=torch.float32)
            vectors[k, torch.as_tensor(coords)] = signs * norm / np.sqrt(support)
        policy = ["every_step" if b else "never" for b in ctx.membership]
        canaries = GradientCanaries(vectors.to(ctx.device), policy=policy)
        return ctx.setup(canaries, info={"norm": norm, "support": support, "dim": dim})


def register() -> None:
    register_canary_design(NAME, SparseSignDesign())


def unregister() -> None:
    if NAME in DESIGNS:
        DESIGNS.unregister(NAME)

