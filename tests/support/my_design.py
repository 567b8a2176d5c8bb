"""A user's canary design, in one file outside the package: sparse random-sign gradient
canaries, each of norm C spread evenly over ``support`` random coordinates with random signs,
inserted at every step. ``register()`` adds it as ``canary.kind=sparse_sign``; importing the
module from a config's ``plugins`` list registers it too (``REGISTER_ON_IMPORT``).

It reads no settings field: its own options (``SparseSignOptions``, from ``canary.options``),
the typed context (``ctx.count``, ``ctx.max_grad_norm``) and the model; it says what it
realises in a ``Realisation`` (docs/plugins.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from dpaudit.capture import GradientCanaries
from dpaudit.experiment.canary_designs import (
    DESIGNS,
    BuildContext,
    CanaryDesign,
    CanarySetup,
    DesignContext,
    Realisation,
    register_canary_design,
)

NAME = "sparse_sign"


@dataclass(frozen=True)
class SparseSignOptions:
    support: int = 4  # coordinates per canary


class SparseSignDesign(CanaryDesign):
    threat_kind = "gradient"
    Options = SparseSignOptions
    refused_scores = {"mixture_lr": "these canaries enter every step"}  # noqa: RUF012

    def check(self, options: SparseSignOptions, ctx: DesignContext) -> None:
        if options.support < 1:
            raise ValueError("canary.options.support must be a positive integer")

    def realises(self, options, ctx: DesignContext, setup=None) -> Realisation:
        # every member enters every step, with norm C; random supports overlap the data's
        return Realisation(kind="gradient", member_rate=1.0, norm=ctx.max_grad_norm,
                           on_dead_coordinates=None if setup is None else False)

    def build(self, ctx: BuildContext) -> CanarySetup:
        support, norm, count = ctx.options.support, ctx.max_grad_norm, ctx.count
        params = dict(ctx.model.named_parameters())
        dim = sum(params[n].numel() for n in ctx.param_names)
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


if os.environ.get("MY_DESIGN_REGISTER_ON_IMPORT") == "1":
    register()
