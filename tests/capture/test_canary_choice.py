"""Canaries for any model in one call: the audit's own block, else structurally dead
coordinates, else an error saying what to do; ``AuditHook(canaries=None)`` picks them, and
``audit_report``'s default ``independent_canaries="auto"`` certifies them as independent
experiments exactly when the hook saw the data never reach them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from capture_support import digits_flat, logreg, private_run
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit import audit_report
from dpaudit.capture import (
    AuditHook,
    GradientCanaries,
    add_canary_block,
    dead_coordinates,
    pick_canaries,
    trainable_dim,
)
from dpaudit.experiment.judging.loop_report import auto_independence

warnings.filterwarnings("ignore", module="opacus")

DATA, _ = digits_flat(pad=8, n_train=400)


def test_the_block_comes_first_then_structural_coordinates_then_an_error():
    model = nn.Sequential(nn.Linear(72, 10))
    structural = set(dead_coordinates(model, DATA).tolist())
    picked = pick_canaries(model, DATA, 20, seed=1)
    assert len(picked) == 20 and set(picked.indices[:, 0].tolist()) <= structural
    assert picked.dim == trainable_dim(model)
    block = add_canary_block(model, 50)
    on_block = pick_canaries(model, DATA, seed=1)  # count: all 50 available
    assert len(on_block) == 50
    assert sorted(on_block.indices[:, 0].tolist()) == block.coordinates(model)
    members = np.array(on_block.policies) == "every_step"
    assert 10 < members.sum() < 40  # each a member with probability 1/2
    tanh = nn.Sequential(nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 3))
    dense = TensorDataset(torch.randn(64, 12), torch.randint(0, 3, (64,)))
    with pytest.raises(ValueError, match="add_canary_block"):
        pick_canaries(tanh, dense)
    with pytest.raises(ValueError, match="no data was given"):
        pick_canaries(tanh)


def test_the_hook_picks_them_and_the_report_certifies_them_as_independent():
    def hook_fn(opt, model):
        return AuditHook(opt, model, data_loader=None)  # canaries=None, no loader: the block

    def with_block():
        model = logreg(72)()
        add_canary_block(model, 400)
        return model

    run = private_run(DATA, with_block, hook_fn, epochs=2, sigma=1.0)
    # two sets on the block's 400 coordinates: the every-step stress test (a third) and the
    # rest inserted like an example (at the data's rate), the shortfall from 10^4 per side said
    stress, rate = run.hook.canaries
    assert len(stress) == 133 and len(rate) == 267
    assert set(stress.policies) == {"every_step", "never"}
    assert set(rate.policies) == {"bernoulli", "never"}
    assert rate.inclusion_prob == run.hook.sample_rate
    assert "133 canaries per side inserted like an example" in run.hook.canary_note
    ok, why = auto_independence(run.hook, 0)
    assert ok and "exactly zero" in why
    res = audit_report(run.hook, privacy_engine=run.engine)  # independent_canaries="auto"
    assert res["independent_canaries"] is True
    assert res["verdict"]["best_lower_bound"] > 0
    # no loader given to the hook: which examples each step used is unseen, and said
    assert res["verdict"]["status"] == "not_verified"
    assert "not seen: Poisson sampling" in res["verdict"]["message"]


def test_auto_is_false_where_the_data_reach_the_canaries():
    # a live coordinate in the set (the bias of class 0, which every example's gradient
    # reaches): auto says no, and why; True given by hand is withdrawn
    policy = ["every_step" if i % 2 else "never" for i in range(12)]

    def hook_fn(opt, model):
        coords = [720] + [c * 72 + 64 for c in range(10)] + [71]
        return AuditHook(opt, model, [GradientCanaries.dirac(coords, norm=1.0, dim=730,
                                                             policy=policy)])

    run = private_run(DATA, logreg(72), hook_fn, epochs=1)
    ok, why = auto_independence(run.hook, 0)
    assert not ok and "the data reached 1 canaries (first at step 0)" in why
    assert audit_report(run.hook, privacy_engine=run.engine)["independent_canaries"] is False
    forced = audit_report(run.hook, privacy_engine=run.engine, independent_canaries=True)
    assert forced["independent_canaries"] is False
    with pytest.raises(ValueError, match="independent_canaries"):
        audit_report(run.hook, privacy_engine=run.engine, independent_canaries="yes")


def test_a_tanh_mlp_on_random_data_gets_a_verdict_from_the_quickstart():
    """The quickstart's lines added to a plain Opacus loop of a model with no dead coordinate:
    the block, the hook with picked canaries and the loader, the report."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 20, generator=g), torch.randint(0, 3, (512,),
                                                                          generator=g))
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 3))
    add_canary_block(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(data, batch_size=64),
        noise_multiplier=1.0, max_grad_norm=1.0)
    with AuditHook(optimizer, model, data_loader=loader) as hook:
        for _ in range(3):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
    report = audit_report(hook, privacy_engine=engine)
    td = report["verdict"]["training_data"]
    assert report["verdict"]["status"] == "consistent" and report["independent_canaries"]
    assert td["upper_status"] == "verified" and td["epsilon_upper"] >= td["epsilon_claimed"]
