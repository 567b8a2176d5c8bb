"""Ghost clipping (``grad_sample_mode="ghost"``) in one process: gradient canaries, exactly.

The independent instrument is a pre-hook on the optimizer Opacus wraps, recording the gradient
really applied at each step. Dirac canaries sit on weights of input features that are zero in
every example, so they never change the forward pass: a run with the hook must apply exactly
the un-hooked run's gradient (same seeds, same noise) plus the included canaries divided by the
expected batch size, the hook must score that applied gradient, and the scalar scores' in/out
mean shift must match its closed form T C^2 / B_exp.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from capture_support import digits_flat, dirac_coords
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader

from dpaudit.attacks import StepScore
from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries

warnings.filterwarnings("ignore", module="opacus")

DATA, ZERO = digits_flat(pad=6, n_train=320)
NF = 70
D = NF * 10 + 10
SIGMA, CLIP, BATCH = 1.0, 1.0, 64


class Released(StepScore):
    """Test score: keeps the released gradient the hook scores; returns <g*, g_t>."""

    name = "released"

    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def step(self, canary_grads, released, ctx):
        self.seen.append(released.clone())
        return canary_grads @ released


def ghost_run(hook_fn=None, epochs=2, reduction="mean"):
    """One seeded ghost-clipping run; returns (applied gradients per step, hook, optimizer)."""
    torch.manual_seed(0)
    model = nn.Linear(NF, 10)
    loader = DataLoader(DATA, batch_size=BATCH, generator=torch.Generator().manual_seed(0))
    model, opt, crit, loader = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=loader,
        criterion=nn.CrossEntropyLoss(reduction=reduction),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        grad_sample_mode="ghost",
        loss_reduction=reduction,
        noise_generator=torch.Generator().manual_seed(1),
    )
    applied = []
    opt.original_optimizer.register_step_pre_hook(
        lambda o, a, k: applied.append(
            torch.cat([p.grad.reshape(-1).clone() for g in o.param_groups for p in g["params"]])
        )
    )
    hook = hook_fn(opt, model) if hook_fn else None
    if hook:
        hook.attach()
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            crit(model(xb), yb).backward()
            opt.step()
    if hook:
        hook.detach()
    return torch.stack(applied), hook, opt


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_ghost_gradient_canaries_enter_the_applied_gradient_once_and_are_scored_on_it(reduction):
    coords = dirac_coords(ZERO, NF)
    k = len(coords) - len(coords) % 3
    coords = coords[:k]
    pols = ["every_step", "never", "bernoulli"] * (k // 3)
    can = GradientCanaries.dirac(coords, CLIP, D, policy=pols, inclusion_prob=0.5, seed=3)
    score = Released()
    base, _, opt = ghost_run(reduction=reduction)
    applied, hook, _ = ghost_run(
        lambda o, m: AuditHook(o, m, can, scores=(score,)), reduction=reduction
    )
    assert type(opt).__name__ == "DPOptimizerFastGradientClipping"
    assert not hook.routed  # a test score: dense rows, full released gradient
    inc = hook.inclusions()  # (K, T)
    assert inc[0::3].all() and not inc[1::3].any() and 0 < inc[2::3].mean() < 1
    b_exp = opt.expected_batch_size if reduction == "mean" else 1.0
    expected = base.clone()
    for t in range(len(base)):
        for j, c in enumerate(coords):
            expected[t, c] += float(inc[j, t]) * CLIP / b_exp
    torch.testing.assert_close(applied, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.stack(score.seen), applied, rtol=0, atol=0)
    # closed form: sum_t <C e_c, g_t> has mean C^2 / B_exp per inclusion, sd sqrt(T) sigma C^2/B
    s = hook.scores()["released"]
    t_steps = len(base)
    unit = CLIP**2 / b_exp
    shift = s[0::3].mean() - s[1::3].mean()
    sd = np.sqrt(t_steps * 2 / (k // 3)) * SIGMA * unit
    assert abs(shift - t_steps * unit) < 5 * sd, (shift, t_steps * unit, sd)


def test_ghost_refuses_input_canaries_by_name():
    model = nn.Linear(NF, 10)
    _, opt, _, _ = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(DATA, batch_size=BATCH),
        criterion=nn.CrossEntropyLoss(),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        grad_sample_mode="ghost",
    )
    x, y = DATA.tensors
    with pytest.raises(ValueError, match=r'grad_sample_mode="ghost".*gradient canaries'):
        AuditHook(opt, model, InputCanaries(x[:2], y[:2]))
    grad = GradientCanaries.dirac([0], CLIP, D)
    with pytest.raises(ValueError, match='grad_sample_mode="ghost"'):
        AuditHook(opt, model, grad, reference=(x[:2], y[:2]))
