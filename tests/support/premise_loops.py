"""The user's own loop of issue "Your epsilon, answered", with the premises it can break.

A small ReLU CNN on scikit-learn's digits, AdamW with weight decay, a StepLR schedule, Opacus'
PRV accountant, ``make_private_with_epsilon(target_epsilon=4)``, ``BatchMemoryManager`` with
physical batches of 32 and the README's recipe (Dirac gradient canaries on coordinates no data
gradient reaches, ``independent_canaries=True``: here on the audit's own parameter block,
``add_canary_block``). ``premise_loop(case, seed)`` trains it and
returns ``audit_report``'s result; the cases (``CASES``):

* ``correct``: the DP loader inside ``BatchMemoryManager``, given to the hook;
* ``plain_loader`` / ``plain_loader_no_hook_loader``: the training iterates a plain shuffled
  ``DataLoader`` inside ``BatchMemoryManager`` (fixed-size logical batches), with the DP
  loader given to the hook, or no loader given;
* ``second_optimizer``: the last layer (the head) trained by a plain SGD optimizer beside the
  DP optimizer, the whole model given to the hook;
* ``alive_canaries``: the canaries on coordinates dead only at the initial parameters
  (weights of ReLU units dead at theta_0, some of which come alive during training);
* ``inflated_rate``: the Poisson sampler draws at q (1 + ``factor``) while the accountant
  accounts q (a sampler giving the accountant the wrong rate, a few percent: too small to
  refute in one training);
* ``halved_noise``: the zoo's bug, noise at sigma / 2.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader

from dpaudit.bugs import plant_bug
from dpaudit.capture import (
    AuditHook,
    GradientCanaries,
    add_canary_block,
    dead_coordinates,
    trainable_dim,
)
from dpaudit.data import load_dataset
from dpaudit.experiment import audit_report
from dpaudit.sampler_bugs import patch_sampler

warnings.filterwarnings("ignore", module="opacus")

CASES = ("correct", "plain_loader", "plain_loader_no_hook_loader", "second_optimizer",
         "alive_canaries", "inflated_rate", "halved_noise")
BATCH, PHYSICAL, EPOCHS, CANARIES = 64, 32, 4, 60


class SmallCNN(nn.Module):
    """Two ReLU convolutions on the 8x8 digits, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Linear(16 * 3 * 3, 10)

    def forward(self, x):
        return self.head(self.body(x.reshape(-1, 1, 8, 8)))


def _barely_dead(model: SmallCNN, train, seed: int) -> list[int]:
    """Make four channels of the second convolution dead at theta_0 by a margin of 0.001 to
    0.01 (their bias lowered below every example's largest pre-activation) and return their
    weights' coordinates: dead at the initial parameters (``dead_coordinates`` finds them),
    alive once training moves the first layer or their bias."""
    x = train.tensors[0]
    conv = model.body[2]
    with torch.no_grad():
        pre = conv(torch.relu(model.body[0](x.reshape(-1, 1, 8, 8))))
        top = pre.amax(dim=(0, 2, 3))
        channels = np.random.default_rng(seed).choice(conv.out_channels, 4, replace=False)
        for c, margin in zip(channels.tolist(), (0.001, 0.003, 0.005, 0.01), strict=True):
            conv.bias[c] -= top[c] + margin
    dead = set(dead_coordinates(model, train, kind="at_theta0").tolist())
    offset = sum(p.numel() for p in model.body[0].parameters())
    per = conv.weight[0].numel()
    coords = [offset + c * per + j for c in channels.tolist() for j in range(per)]
    if not set(coords) <= dead:
        raise RuntimeError("the lowered channels are not dead at theta_0")
    return sorted(np.random.default_rng(seed + 1).choice(coords, CANARIES, replace=False)
                  .tolist())


def premise_loop(case: str, seed: int = 0, *, factor: float = 0.05, steps: int | None = None,
                 **report) -> dict:
    """Train the loop of ``case`` (module doc) and return ``audit_report``'s result."""
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    torch.manual_seed(seed)
    train, _, _ = load_dataset("digits", seed=0)
    model = SmallCNN()
    alive = case == "alive_canaries"
    coords = _barely_dead(model, train, seed) if alive else None
    # the audit's own block, independent by construction, as the body's last layer
    block = None if alive else add_canary_block(model.body, 256)
    second = case == "second_optimizer"
    # second_optimizer: only the body is made private; the head is trained in the clear
    private = model.body if second else model
    optimizer = torch.optim.AdamW(private.parameters(), lr=0.01, weight_decay=0.05)
    plain = DataLoader(train, batch_size=BATCH, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine(accountant="prv")
    private, optimizer, dp_loader = engine.make_private_with_epsilon(
        module=private, optimizer=optimizer, data_loader=plain, target_epsilon=4.0,
        target_delta=1e-5, epochs=EPOCHS, max_grad_norm=1.0)
    if second:
        model.body = private  # the whole model: private body, plain head
    else:
        model = private
    head_opt = torch.optim.SGD(model.head.parameters(), lr=0.05) if second else None
    if case == "halved_noise":
        plant_bug(optimizer, "halved_noise")
    if case == "inflated_rate":
        patch_sampler(dp_loader, "inflated_rate", factor)
    sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    if alive:  # the README's recipe on coordinates dead at theta_0 only
        members = np.random.default_rng(seed).random(CANARIES) < 0.5
        canaries = GradientCanaries.dirac(
            coords, norm=1.0, dim=trainable_dim(model),
            policy=["every_step" if m else "never" for m in members])
    else:
        canaries = block.canaries(model, CANARIES, seed=seed)
    trained_on = plain if case.startswith("plain_loader") else dp_loader
    hook_loader = None if case == "plain_loader_no_hook_loader" else dp_loader
    hook = AuditHook(optimizer, model, [canaries], seed=seed, data_loader=hook_loader)
    loss_fn = nn.CrossEntropyLoss()
    total = steps if steps is not None else EPOCHS * len(dp_loader)
    with hook, BatchMemoryManager(data_loader=trained_on, max_physical_batch_size=PHYSICAL,
                                  optimizer=optimizer) as batches:
        while hook.steps < total:
            for x, y in batches:
                optimizer.zero_grad()
                if head_opt is not None:
                    head_opt.zero_grad()
                loss_fn(model(x), y).backward()
                before = hook.steps
                optimizer.step()
                if hook.steps > before:
                    sched.step()
                    if head_opt is not None:  # the head's plain step, after the private one
                        head_opt.step()
                if hook.steps >= total:
                    break
    return audit_report(hook, privacy_engine=engine, independent_canaries=True,
                        dataset_size=len(train), **report)
