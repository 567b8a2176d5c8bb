"""The clipping check (``capture.clip_check``) on real Opacus runs: no violation and an unchanged
trajectory on the correct optimizer (every grad-sample mode, BatchMemoryManager, folded input
canaries), every clipping bug of the zoo caught, ghost clipping said to be unchecked."""

from __future__ import annotations

import pytest
import torch
from capture_support import digits_flat, flat_params, private_run
from torch import nn

from dpaudit.bugs import plant_bug
from dpaudit.capture import AuditHook, InputCanaries
from dpaudit.capture.clip_check import TOLERANCE, ClippingCheck

DATA, _ = digits_flat(pad=8, n_train=400)
NF = 72


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(NF, 16), nn.ReLU(), nn.Linear(16, 10))


def _run(model_fn=mlp, bug=None, check=True, **kw):
    def hook_fn(opt, model):
        if bug is not None:
            plant_bug(opt, bug)
        x, y = DATA.tensors
        return AuditHook(opt, model, [InputCanaries(x[:4], y[:4])], check_clipping=check)

    return private_run(DATA, model_fn, hook_fn, sigma=0.5, lr=0.2, **kw)


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"grad_sample_mode": "functorch"},
        {"grad_sample_mode": "ew"},
        {"physical_batch": 16},
        {"optimizer": "adam"},
    ],
)
def test_correct_optimizer_passes_and_training_is_unchanged(opts):
    checked = _run(**opts)
    summary = checked.hook.clipping_check()
    assert summary["violations"] == 0 and summary["unchecked"] is None
    assert summary["steps_seen"] == checked.hook.steps >= 5
    assert 1 <= summary["leave_one_out_steps"] <= summary["steps_checked"] <= checked.hook.steps
    # a correctly clipped example contributes at most C, and the largest-norm ones reach it
    assert 0.99 <= summary["max_ratio_single"] <= 1 + TOLERANCE
    assert summary["max_ratio_leave_one_out"] <= 1 + TOLERANCE
    plain = _run(check=False, **opts)
    assert plain.hook.clipping_check() is None
    assert torch.equal(flat_params(checked.model), flat_params(plain.model))


@pytest.mark.parametrize(
    "bug,kind", [
        ("unclipped_example", "single"),
        ("layer_clip_ignored", "single"),
        ("microbatch_clipping", "leave_one_out"),
    ],
)
def test_clipping_bugs_are_caught(bug, kind):
    summary = _run(bug=bug).hook.clipping_check()
    assert summary["violations"] > 0, summary
    worst = summary["worst"]
    assert worst["ratio"] > 1 + TOLERANCE and worst["kind"] in ("single", "leave_one_out")
    assert summary[f"max_ratio_{kind}"] > 1 + TOLERANCE


@pytest.mark.parametrize(
    "rates,match",
    [((0.0, 0.0), "probe_rate"), ((1.5, 0.1), "probe_rate"), ((0.2, 0.3), "leave_one_out_rate"),
     ((0.5, -0.1), "leave_one_out_rate")],
)
def test_bad_rates_are_refused_by_name(rates, match):
    with pytest.raises(ValueError, match=match):
        ClippingCheck(1.0, seed=0, probe_rate=rates[0], leave_one_out_rate=rates[1])


def test_ghost_clipping_is_reported_unchecked():
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from dpaudit.capture import GradientCanaries

    torch.manual_seed(0)
    model = nn.Linear(NF, 10)
    model, opt, crit, loader = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(DATA, batch_size=64),
        criterion=nn.CrossEntropyLoss(),
        noise_multiplier=0.5,
        max_grad_norm=1.0,
        grad_sample_mode="ghost",
    )
    canaries = GradientCanaries.dirac([0, 1, 2], norm=1.0, dim=NF * 10 + 10, policy="every_step")
    hook = AuditHook(opt, model, [canaries], check_clipping=True)
    with hook:
        for xb, yb in list(loader)[:3]:
            opt.zero_grad()
            crit(model(xb), yb).backward()
            opt.step()
    summary = hook.clipping_check()
    assert summary["steps_checked"] == 0 and "ghost" in summary["unchecked"]
