"""Small own loops of the issue "One verdict, about your claim": the README's recipe on digits
(a linear model with the audit's canary block), ``make_private_with_epsilon`` with the user's
target epsilon and delta, the user's accountant (RDP, PRV or GDP), optionally under
``BatchMemoryManager`` iterating a plain shuffled ``DataLoader`` (the newcomer's loop), or with
a head trained by a second, plain optimizer. ``train`` returns what ``audit_report`` is given;
the tests call it in the ways users do.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from opacus import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader

from dpaudit import AuditHook, add_canary_block, load_dataset

warnings.filterwarnings("ignore", module="opacus")


@dataclass
class Trained:
    hook: AuditHook
    engine: PrivacyEngine
    dp_loader: DataLoader
    n: int


class Headed(nn.Module):
    """A private body and a head trained in the clear by a second optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.body(x))


def train(*, seed: int = 0, accountant: str = "prv", target_epsilon: float = 2.0,
          target_delta: float = 1e-5, epochs: int = 2, batch: int = 96,
          plain_loader: bool = False, give_loader: bool = True, head: bool = False,
          physical: int | None = None) -> Trained:
    """Train the loop once (module doc) and return the hook, engine and loaders.

    ``plain_loader``: iterate a plain shuffled loader (fixed-size batches) inside
    ``BatchMemoryManager`` while the DP loader exists; ``give_loader``: give the DP loader to
    the hook; ``head``: a head trained by a plain SGD optimizer, canaries picked over the whole
    model (the canary block's and the head's dead coordinates alike)."""
    torch.manual_seed(seed)
    train_set = load_dataset("digits", seed=0)[0]
    engine = PrivacyEngine(accountant=accountant)
    plain = DataLoader(train_set, batch_size=batch, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    if head:
        model = Headed()
        add_canary_block(model.body, 64)
        private = model.body
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        add_canary_block(model, 256)
        private = model
    optimizer = torch.optim.SGD(private.parameters(), lr=0.5)
    private, optimizer, dp_loader = engine.make_private_with_epsilon(
        module=private, optimizer=optimizer, data_loader=plain, target_epsilon=target_epsilon,
        target_delta=target_delta, epochs=epochs, max_grad_norm=1.0)
    if head:
        model.body = private
    else:
        model = private
    head_opt = torch.optim.SGD(model.head.parameters(), lr=0.1) if head else None
    canaries = None
    if head:  # canaries numbered over the whole model: the head's coordinates included
        from dpaudit.capture import GradientCanaries, trainable_dim

        d = trainable_dim(model)
        block = list(range(d - 170 - 64, d - 170))  # the canary block sits before the head
        canaries = GradientCanaries.dirac([*block[:32], d - 3, d - 4], norm=1.0, dim=d,
                                          policy=["every_step", "never"] * 17)
    hook = AuditHook(optimizer, model, canaries,
                     data_loader=dp_loader if give_loader else None, seed=seed)
    source = plain if plain_loader else dp_loader
    with hook:
        for _ in range(epochs):
            if physical is not None or plain_loader:
                with BatchMemoryManager(data_loader=source,
                                        max_physical_batch_size=physical or 32,
                                        optimizer=optimizer) as loader:
                    _epoch(model, optimizer, head_opt, loader)
            else:
                _epoch(model, optimizer, head_opt, source)
    return Trained(hook, engine, dp_loader, len(train_set))


def _epoch(model, optimizer, head_opt, loader) -> None:
    for x, y in loader:
        optimizer.zero_grad()
        if head_opt is not None:
            head_opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if head_opt is not None:
            head_opt.step()


def readme_loop_audit(seed: int = 0, *, bug: str | None = None, white_box: bool = True,
                      epochs: int = 10) -> dict:
    """The README's own loop exactly as written (digits, a linear model with
    ``add_canary_block``, ``make_private_with_epsilon(target_epsilon=4, target_delta=1e-5,
    epochs=10)``: n 1,348, q 1/22, T 220, sigma 1.064), the hook's defaults, seeded by
    ``torch.manual_seed(seed)`` and ``AuditHook(seed=seed)``, then ``audit_report`` with the
    user's delta. ``bug``: a zoo bug (``dpaudit.bugs.BUG_ZOO``) planted at its catastrophic
    severity, on the optimizer or the DP loader's sampler; ``white_box=False``: no white-box
    check runs (only the canaries can refute)."""
    from dpaudit import audit_report
    from dpaudit.bugs import BUG_ZOO, plant_bug, plant_sampler_bug

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    add_canary_block(model)
    engine, data = PrivacyEngine(), load_dataset("digits")[0]
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), target_epsilon=4.0,
        target_delta=1e-5, epochs=epochs, max_grad_norm=1.0,
        data_loader=DataLoader(data, batch_size=64))
    remove = None
    if bug is not None:
        spec = BUG_ZOO[bug]
        remove = (plant_bug(optimizer, bug, spec.catastrophic) if spec.optimizer
                  else plant_sampler_bug(loader, bug, spec.catastrophic))
    with AuditHook(optimizer, model, data_loader=loader, seed=seed) as hook:
        for _ in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
    if remove is not None:
        remove()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return audit_report(hook, privacy_engine=engine, delta=1e-5, white_box=white_box)
