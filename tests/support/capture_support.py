"""Shared helpers for the capture tests: one seeded Opacus training run on digits (no tests here).

``private_run`` builds the model, a seeded data loader and noise generator, runs Opacus
DP-SGD with Poisson sampling for ``epochs`` epochs (optionally through ``BatchMemoryManager``),
with an ``AuditHook`` built by ``hook_fn(optimizer, model)`` attached around the unchanged loop.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from types import SimpleNamespace

import torch
from opacus import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.data import load_dataset
from dpaudit.models import build_model

warnings.filterwarnings("ignore", module="opacus")


def digits_flat(pad: int = 0, n_train: int | None = None) -> tuple[TensorDataset, list[int]]:
    """Digits as flat (N, 64 + pad) features; returns the dataset and its all-zero features.

    The ``pad`` extra features are identically zero, like digits' three blank pixels, so a
    linear model's weights on them receive no gradient from the data (Dirac-canary slots).
    """
    train, _, info = load_dataset("digits", seed=0, n_train=n_train)
    x, y = train.tensors
    x = x.flatten(1)
    if pad:
        x = torch.cat([x, torch.zeros(len(x), pad)], dim=1)
    zero = list(info.extra["zero_features"]) + list(range(64, 64 + pad))
    return TensorDataset(x, y), zero


def dirac_coords(zero_features: list[int], num_features: int, num_classes: int = 10) -> list[int]:
    """Flat indices of ``Linear.weight[c, j]`` for zero features j (weight is (classes, feat))."""
    return [c * num_features + j for j in zero_features for c in range(num_classes)]


def private_run(
    data: TensorDataset,
    model_fn: Callable[[], nn.Module],
    hook_fn: Callable | None = None,
    seed: int = 0,
    sigma: float = 1.0,
    clip: float = 1.0,
    batch_size: int = 64,
    epochs: int = 1,
    optimizer: str = "sgd",
    lr: float = 0.1,
    physical_batch: int | None = None,
    grad_sample_mode: str = "hooks",
    loss_reduction: str = "mean",
    device: str | torch.device = "cpu",
    on_batch: Callable | None = None,
    after_step: Callable | None = None,
) -> SimpleNamespace:
    """One seeded DP-SGD run; returns model, optimizer, engine, hook, number of batches."""
    torch.manual_seed(seed)
    model = model_fn().to(device)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    elif optimizer == "momentum":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    elif optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        raise ValueError(optimizer)
    loader = DataLoader(data, batch_size=batch_size, generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=opt,
        data_loader=loader,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        poisson_sampling=True,
        grad_sample_mode=grad_sample_mode,
        loss_reduction=loss_reduction,
        noise_generator=torch.Generator(device=device).manual_seed(seed + 1),
    )
    hook = hook_fn(opt, model) if hook_fn is not None else None
    reduction = "mean" if loss_reduction == "mean" else "sum"
    n_batches = n_empty = 0
    with hook if hook is not None else contextlib.nullcontext():
        for _ in range(epochs):
            ctx = (
                BatchMemoryManager(
                    data_loader=loader, max_physical_batch_size=physical_batch, optimizer=opt
                )
                if physical_batch
                else contextlib.nullcontext(loader)
            )
            with ctx as dl:
                for i, (xb, yb) in enumerate(dl):
                    if on_batch is not None:
                        xb = on_batch(i, xb)
                    xb, yb = xb.to(device), yb.to(device)
                    n_batches += 1
                    n_empty += len(xb) == 0
                    opt.zero_grad()
                    loss = nn.functional.cross_entropy(model(xb), yb, reduction=reduction)
                    loss.backward()
                    opt.step()
                    if after_step is not None:
                        after_step(model, opt)
    return SimpleNamespace(
        model=model,
        optimizer=opt,
        engine=engine,
        hook=hook,
        n_batches=n_batches,
        n_empty=n_empty,
        loader=loader,
    )


def logreg(num_features: int) -> Callable[[], nn.Module]:
    """Factory of a logistic regression on flat features (10 digit classes)."""
    return lambda: build_model("logreg", (num_features,), 10)


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters of (the module under) ``model``, flattened in named_parameters order."""
    module = getattr(model, "_module", model)
    return torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])


def spawn_ranks(worker: Callable, out_dir, world: int) -> list:
    """Run ``worker(rank, port, out_dir)`` in ``world`` spawned processes (gloo on a free local
    port) and load what each rank saved as ``out_dir/rank{r}.pt``."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, str(out_dir)), nprocs=world, join=True)
    return [torch.load(f"{out_dir}/rank{r}.pt", weights_only=False) for r in range(world)]
