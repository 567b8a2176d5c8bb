"""Trainable parameters outside the DP optimizer (a head trained in the clear) are watched, not
refused: the hook attaches on the whole model, canaries numbered over the whole model are
mapped to the DP optimizer's parameters (or refused, naming the parameter, where they touch
the head), and the head moving after the private step is the integrity finding."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit import audit_report
from dpaudit.capture import AuditHook, GradientCanaries, add_canary_block, trainable_dim

warnings.filterwarnings("ignore", module="opacus")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 8), nn.Tanh())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x))


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = Net()
    block = add_canary_block(model.body, 64)
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(256, 10, generator=g), torch.randint(0, 3, (256,),
                                                                          generator=g))
    engine = PrivacyEngine()
    body, opt, loader = engine.make_private(
        module=model.body, optimizer=torch.optim.SGD(model.body.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=32), noise_multiplier=1.0, max_grad_norm=1.0)
    model.body = body  # a private body, a head in the clear
    return model, block, opt, loader, engine


def test_the_hook_selects_the_dp_parameters_and_maps_whole_model_canaries():
    model, block, opt, loader, _ = _setup()
    canaries = block.canaries(model, 16)  # numbered over the whole model, head included
    assert canaries.dim == trainable_dim(model)
    hook = AuditHook(opt, model, [canaries], data_loader=loader)
    assert hook.outside_optimizer == ["head.weight", "head.bias"]
    assert "head.weight" not in hook.param_names and hook.full_dim == trainable_dim(model) - 27
    # the same coordinates of the same parameter, in the selection's numbering
    mapped = hook.canaries[0]
    assert mapped.dim == hook.full_dim
    assert (canaries.indices - mapped.indices).unique().tolist() == [0]  # the head is last
    with pytest.raises(ValueError, match=r"every gradient canary touches \['head.weight'\]"):
        AuditHook(opt, model, [GradientCanaries.dirac([trainable_dim(model) - 5], norm=1.0,
                                                      dim=trainable_dim(model))])
    # canaries over the whole model: those on the head are dropped and named, the rest kept
    d = trainable_dim(model)
    mixed = GradientCanaries.dirac([*canaries.indices[:4, 0].tolist(), d - 5, d - 6],
                                   norm=1.0, dim=d,
                                   policy=["every_step", "never"] * 3)
    hook = AuditHook(opt, model, [mixed])
    assert len(hook.canaries[0]) == 4 and hook.canaries[0].policies == (
        "every_step", "never", "every_step", "never")
    assert hook.dropped_canaries == [{"count": 2, "of": 6, "parameters": ["head.weight"],
                                      "why": hook.dropped_canaries[0]["why"]}]
    with pytest.raises(ValueError, match="not updated by the DP optimizer"):
        AuditHook(opt, model, [canaries], params=["head"])


def test_a_head_trained_in_the_clear_is_the_integrity_finding():
    model, block, opt, loader, engine = _setup(1)
    head_opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    hook = AuditHook(opt, model, [block.canaries(model, 32)], data_loader=loader)
    with hook:
        for _ in range(2):
            for x, y in loader:
                opt.zero_grad()
                head_opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                head_opt.step()
    res = audit_report(hook, privacy_engine=engine, independent_canaries=True)
    assert res["verdict"]["status"] == "privacy_bug"
    assert res["verdict"]["white_box_fired"] == ["model_integrity"]
    moved = res["white_box"]["checks"]["model_integrity"]["witness"]
    assert moved["tensor"] == "head.weight" and moved["kind"] == "other"
    premises = {p["name"]: p for p in res["verdict"]["training_data"]["premises"]}
    assert premises["only_private_step_moves_model"]["status"] == "refuted"
    assert res["verdict"]["training_data"]["upper_status"] == "refuted"
