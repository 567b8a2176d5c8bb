"""``InstancePatch``: exact save/restore of the optimizer attributes dpaudit patches."""

from __future__ import annotations

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.bugs import plant_bug
from dpaudit.capture import AuditHook, GradientCanaries
from dpaudit.capture.patching import InstancePatch


def dp_optimizer():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    data = TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,)))
    model, opt, _ = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=4),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    return model, opt


def test_restore_uncovers_the_class_method_and_puts_back_an_instance_attribute():
    _, opt = dp_optimizer()
    assert "add_noise" not in opt.__dict__ and "step_hook" in opt.__dict__
    accountant_hook = opt.step_hook
    calls = []
    noise = InstancePatch(opt, "add_noise", lambda: calls.append(1), "t").apply()
    hook = InstancePatch(opt, "step_hook", lambda o: None, "t").apply()
    assert noise.original.__func__ is type(opt).add_noise  # the bound class method
    assert hook.original is accountant_hook
    opt.add_noise()
    assert calls == [1]
    hook.restore()
    noise.restore()
    assert "add_noise" not in opt.__dict__ and opt.step_hook is accountant_hook
    assert "_dpaudit_patches" not in opt.__dict__


def test_double_patching_and_out_of_order_restore_are_refused():
    _, opt = dp_optimizer()
    first = InstancePatch(opt, "add_noise", lambda: None, "owner").apply()
    with pytest.raises(RuntimeError, match="already patched add_noise"):
        InstancePatch(opt, "add_noise", lambda: None, "owner").apply()
    with pytest.raises(RuntimeError, match="already patched by this patch"):
        first.apply()
    second = InstancePatch(opt, "add_noise", lambda: None, "other").apply()  # stacks
    assert second.original is first.replacement
    with pytest.raises(RuntimeError, match="last-in first-out"):
        first.restore()
    second.restore()
    first.restore()
    assert "add_noise" not in opt.__dict__


def test_planted_bug_under_a_hook_is_restored_exactly():
    model, opt = dp_optimizer()
    remove = plant_bug(opt, "halved_noise")
    bugged = opt.__dict__["add_noise"]
    hook = AuditHook(opt, model, GradientCanaries.dirac([0], norm=1.0, dim=8))
    with hook:
        assert opt.__dict__["add_noise"] is not bugged
    assert opt.__dict__["add_noise"] is bugged
    remove()
    assert "add_noise" not in opt.__dict__ and "_dpaudit_patches" not in opt.__dict__
