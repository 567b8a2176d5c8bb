"""The upper side's coverage (issue 65): the own loop of ``premise_loops`` with deviations
planted where the accountant cannot see them, and the true epsilon of each by a sound
accountant.

The loop is ``premise_loops``' ReLU CNN on digits (AdamW, StepLR, BatchMemoryManager with
physical batches of 32, 60 Dirac canaries on the audit's own block, 88 steps at q = 1/22),
made private for epsilon 4 by the engine's accountant (its sigma computed once per
accountant, as ``make_private_with_epsilon`` does), with flat, per-layer (every trainable
tensor at C / sqrt(L)) or adaptive clipping (from C = 1: target 0.5, rate 0.2, bounds
[0.01, 100], count noise max(B / 20, 2 sigma)). ``Setting`` plants, all at once:

* ``rate``: the Poisson sampler draws at q (1 + rate) (``sampler_bugs.inflated_rate``);
* ``noise``: every tensor's noise at that factor (``bugs.scaled_noise``'s law);
* ``tensor``: the last tensor's (the head's bias, 10 coordinates) at that factor;
* ``steps``: every tensor's noise at ``step_factor`` on those steps.

The noise planters draw each tensor's noise from the optimizer's own generator at the
planted std (keyed to the real step's index, so the audit's noise probe, which calls the
same patched ``add_noise``, sees the same law). ``true_epsilon`` composes the steps as they
ran with a worst-case example (the smallest scale of the tensors an example reaches under flat and
adaptive clipping, the per-layer combination under per-layer clipping; adaptive clipping's
count composed with sensitivity 1, as the upper side does) by the PRV accountant: Gopi et
al.'s bracket (lower, upper). ``coverage_run(setting, seed)`` trains, audits and returns the
summary a study row needs.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.accountants.utils import get_noise_multiplier
from opacus.optimizers.optimizer import _generate_noise
from opacus.utils.batch_memory_manager import BatchMemoryManager
from premise_loops import BATCH, EPOCHS, PHYSICAL, SmallCNN
from torch import nn
from torch.utils.data import DataLoader

from dpaudit.accounting import prv_history_bounds
from dpaudit.bugs import _noise_per_param, _on_steps
from dpaudit.capture import AuditHook, add_canary_block
from dpaudit.capture.support import clip_bound, gradient_noise_multiplier, is_adaptive
from dpaudit.data import load_dataset
from dpaudit.experiment import audit_report
from dpaudit.experiment.judging.noise_scale import reached
from dpaudit.sampler_bugs import patch_sampler

warnings.filterwarnings("ignore", module="opacus")

TARGET, DELTA, CANARIES = 4.0, 1e-5, 60
ACCOUNTANTS = ("prv", "rdp", "gdp")
CLIPPINGS = ("flat", "per_layer", "adaptive")


@dataclass(frozen=True)
class Setting:
    """One study setting (module doc)."""

    name: str
    accountant: str = "prv"
    clipping: str = "flat"
    rate: float = 0.0
    noise: float = 1.0
    tensor: float = 1.0
    steps: tuple[int, ...] = ()
    step_factor: float = 1.0

    def factors(self, tensors: int, steps: int) -> np.ndarray:
        """(J, T) each tensor's noise factor at each step, as planted."""
        f = np.full((tensors, steps), float(self.noise))
        f[-1] *= self.tensor
        if self.steps:
            f[:, list(self.steps)] *= self.step_factor
        return f


EVERY_ELEVENTH = tuple(range(5, 88, 11))  # 8 steps spread over the training
SETTINGS = {s.name: s for s in (
    # the issue's table (PRV engine, flat clipping)
    Setting("correct"),
    Setting("rate x1.05", rate=0.05),
    Setting("noise x0.97", noise=0.97),
    Setting("noise x0.98, rate x1.03", noise=0.98, rate=0.03),
    Setting("head bias x0.95", tensor=0.95),
    Setting("head bias x0.90", tensor=0.90),
    Setting("gdp engine", accountant="gdp"),
    # what the study adds
    Setting("8 spread steps x0.8", steps=EVERY_ELEVENTH, step_factor=0.8),
    Setting("first 8 steps x0.8", steps=tuple(range(8)), step_factor=0.8),
    Setting("head bias x0.95, rate x1.03", tensor=0.95, rate=0.03),
    Setting("head bias x0.95, 8 spread steps x0.9", tensor=0.95, steps=EVERY_ELEVENTH,
            step_factor=0.9),
    Setting("rdp engine", accountant="rdp"),
    Setting("rdp engine, head bias x0.90", accountant="rdp", tensor=0.90),
    Setting("gdp engine, head bias x0.90", accountant="gdp", tensor=0.90),
    Setting("per-layer", clipping="per_layer"),
    Setting("per-layer, head bias x0.90", clipping="per_layer", tensor=0.90),
    Setting("per-layer, noise x0.98, rate x1.03", clipping="per_layer", noise=0.98,
            rate=0.03),
    Setting("adaptive", clipping="adaptive"),
    Setting("adaptive, head bias x0.90", clipping="adaptive", tensor=0.90),
    Setting("adaptive, noise x0.98, rate x1.03", clipping="adaptive", noise=0.98, rate=0.03),
)}
ISSUE_TABLE = ("correct", "rate x1.05", "noise x0.97", "noise x0.98, rate x1.03",
               "head bias x0.95", "head bias x0.90", "gdp engine")


@functools.cache
def _data():
    return load_dataset("digits", seed=0)[0]


@functools.cache
def claimed_sigma(accountant: str) -> float:
    """``make_private_with_epsilon(4)``'s sigma for the engine's accountant (sample rate
    1 / len(loader), 4 epochs), computed once."""
    steps_per_epoch = math.ceil(len(_data()) / BATCH)
    return float(get_noise_multiplier(target_epsilon=TARGET, target_delta=DELTA,
                                      sample_rate=1 / steps_per_epoch, epochs=EPOCHS,
                                      accountant=accountant))


def plant_noise_factors(optimizer, factors: np.ndarray):
    """Draw tensor j's noise at real step t with std factors[j, t] x the optimizer's own (its
    ``add_noise`` with a per-tensor std, from its own generator; adaptive clipping's count
    noise as Opacus adds it); steps whose factors are all 1 run the optimizer's own
    ``add_noise``. Returns the restore."""
    original = optimizer.add_noise

    def add_noise(t: int) -> None:
        column = factors[:, min(t, factors.shape[1] - 1)]
        if np.all(column == 1.0):
            original()
            return
        std = gradient_noise_multiplier(optimizer) * clip_bound(optimizer)
        _noise_per_param(optimizer, [std * float(f) for f in column])
        if is_adaptive(optimizer):  # AdaClipDPOptimizer.add_noise's count noise
            noise = _generate_noise(std=optimizer.unclipped_num_std,
                                    reference=optimizer.unclipped_num.float(),
                                    generator=optimizer.generator)
            optimizer.unclipped_num = float(optimizer.unclipped_num)
            optimizer.unclipped_num += noise

    return _on_steps(optimizer, add_noise)


def _clipping(setting: Setting, model: nn.Module, sigma: float) -> dict:
    if setting.clipping == "per_layer":
        n = sum(1 for p in model.parameters() if p.requires_grad)
        return {"clipping": "per_layer", "max_grad_norm": [n**-0.5] * n}
    if setting.clipping == "adaptive":
        return {"clipping": "adaptive", "max_grad_norm": 1.0, "target_unclipped_quantile": 0.5,
                "clipbound_learning_rate": 0.2, "min_clipbound": 0.01, "max_clipbound": 100.0,
                "unclipped_num_std": max(BATCH / 20, 2 * sigma)}
    return {"max_grad_norm": 1.0}


def true_epsilon(setting: Setting, names: list[str], steps: int, sigma: float, q: float,
                 adaptive=None) -> tuple[float, float]:
    """PRV's bracket (lower, upper) of the epsilon the planted training really has: each step
    at its worst-case example's scale (module doc), at q (1 + rate)."""
    reach = reached(names)
    f = setting.factors(len(names), steps)[reach]
    if setting.clipping == "per_layer":
        scale = (np.mean(1.0 / f**2, axis=0) * reach.sum() / reach.size) ** -0.5
    else:
        scale = f.min(axis=0)
    if adaptive is not None:
        sigmas = ((adaptive.sigma_gradient * scale) ** -2 + adaptive.sigma_count**-2) ** -0.5
    else:
        sigmas = sigma * scale
    values, counts = np.unique(sigmas, return_counts=True)
    history = [(float(v), min(1.0, q * (1 + setting.rate)), int(c))
               for v, c in zip(values, counts, strict=True)]
    lower, _, upper = prv_history_bounds(history, DELTA)
    return lower, upper


def coverage_run(name: str, seed: int) -> dict:
    """Train the loop of setting ``name`` at ``seed``, audit it, and return a study row."""
    setting = SETTINGS[name]
    start = time.process_time()
    torch.manual_seed(seed)
    train = _data()
    model = SmallCNN()
    block = add_canary_block(model.body, 256)
    sigma = claimed_sigma(setting.accountant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    plain = DataLoader(train, batch_size=BATCH, shuffle=True,
                       generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine(accountant=setting.accountant)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=plain, noise_multiplier=sigma,
        **_clipping(setting, model, sigma))
    total = EPOCHS * len(loader)
    names = None
    if setting.noise != 1.0 or setting.tensor != 1.0 or setting.steps:
        plant_noise_factors(optimizer, setting.factors(len(optimizer.params), total))
    if setting.rate:
        patch_sampler(loader, "inflated_rate", setting.rate)
    sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    canaries = block.canaries(model, CANARIES, seed=seed)
    hook = AuditHook(optimizer, model, [canaries], seed=seed, data_loader=loader)
    loss_fn = nn.CrossEntropyLoss()
    with hook, BatchMemoryManager(data_loader=loader, max_physical_batch_size=PHYSICAL,
                                  optimizer=optimizer) as batches:
        while hook.steps < total:
            for x, y in batches:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                before = hook.steps
                optimizer.step()
                if hook.steps > before:
                    sched.step()
                if hook.steps >= total:
                    break
    res = audit_report(hook, privacy_engine=engine, independent_canaries=True,
                       dataset_size=len(train))
    records = hook.white_box_records()
    names = list(records.names)
    q = 1 / len(loader)
    low, up = true_epsilon(setting, names, total, sigma, q, records.adaptive)
    v, td = res["verdict"], res["verdict"]["training_data"]
    return {
        "setting": name, "seed": seed, **{k: v_ for k, v_ in asdict(setting).items()
                                          if k != "name"},
        "sigma": sigma, "true_lower": low, "true": up,
        "claimed": td["epsilon_claimed"], "upper": td["epsilon_upper"],
        "upper_one_scale": td.get("epsilon_upper_one_scale"),
        "upper_status": td["upper_status"], "upper_accountant": td.get("upper_accountant"),
        "status": v["status"],
        "fired": list(v["white_box_fired"]) + list(v["claim_rejected_by"]),
        "binding": (td.get("upper_noise") or {}).get("binding"),
        "shortfall": td.get("claim_shortfall"),
        "noise_share": (td.get("upper_design") or {}).get("noise_share"),
        "cpu": time.process_time() - start,
    }
