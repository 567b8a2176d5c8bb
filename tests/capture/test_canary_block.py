"""The audit's own parameter block: the model computes the same numbers, no data gradient
reaches the block, Opacus noises it like any parameter, and Dirac canaries on it are
independent experiments in a model that has no dead coordinates at all (a tanh MLP on dense
random data)."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit import audit_report
from dpaudit.capture import AuditHook, add_canary_block, dead_coordinates, trainable_dim

warnings.filterwarnings("ignore", module="opacus")


class Pair(nn.Module):
    """A non-Sequential model whose forward returns (logits, hidden) or a dict of them."""

    def __init__(self, as_dict: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.as_dict = nn.Linear(6, 5), nn.Linear(5, 3), as_dict

    def forward(self, x):
        h = torch.tanh(self.a(x))
        out = self.b(h)
        return {"logits": out, "hidden": h} if self.as_dict else (out, h)


def _tanh_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))


def _data(n: int = 256, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g))


@pytest.mark.parametrize("make", [_tanh_mlp, Pair, lambda: Pair(as_dict=True)])
def test_the_model_computes_the_same_numbers(make):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(9, 12 if isinstance(model, nn.Sequential) else 6)
    before = model(x)
    state = torch.random.get_rng_state()
    block = add_canary_block(model, 32)
    assert torch.equal(torch.random.get_rng_state(), state)  # the user's stream untouched
    after = model(x)
    flat = (lambda o: [o]) if isinstance(before, torch.Tensor) else (
        lambda o: list(o.values()) if isinstance(o, dict) else list(o))
    assert all(torch.equal(a, b) for a, b in zip(flat(before), flat(after), strict=True))
    assert trainable_dim(model) == sum(p.numel() for p in model.parameters()) and \
        block.coordinates(model)[-1] == trainable_dim(model) - 1  # the block comes last
    block.remove()
    assert "dpaudit_canaries.linear.weight" not in model.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(flat(before), flat(model(x)), strict=True))


def test_refusals_name_what_to_do():
    model = _tanh_mlp()
    add_canary_block(model, 8)
    with pytest.raises(ValueError, match="already"):
        add_canary_block(model, 8)
    with pytest.raises(ValueError, match="size"):
        add_canary_block(_tanh_mlp(), 0)
    from opacus import GradSampleModule

    with pytest.raises(ValueError, match="before make_private"):
        add_canary_block(GradSampleModule(_tanh_mlp()), 8)


def _train(block_size: int, steps: int, seed: int = 0, **hook_kwargs):
    torch.manual_seed(seed)
    model = _tanh_mlp()
    block = add_canary_block(model, block_size) if block_size else None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=DataLoader(_data(), batch_size=32),
        noise_multiplier=1.0, max_grad_norm=1.0,
        noise_generator=torch.Generator().manual_seed(seed + 5))
    hook = (AuditHook(opt, model, [block.canaries(model, seed=seed)], data_loader=loader,
                      seed=seed, **hook_kwargs) if block is not None else None)
    done = 0
    with hook if hook is not None else contextlib.nullcontext():
        while done < steps:
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                done += 1
                if done == steps:
                    break
    return model, hook, engine


def test_first_step_is_the_step_without_the_block():
    """The block's noise is drawn after every other parameter's: the first step is bit for bit
    the same (later steps draw further on the same generator: another draw, module doc)."""
    plain, _, _ = _train(0, 1)
    with_block, _, _ = _train(64, 1)
    for a, b in zip(plain.parameters(), with_block.parameters(), strict=False):  # block last
        assert torch.equal(a, b)


def test_no_data_gradient_reaches_the_block_and_canaries_there_certify():
    """A tanh MLP on dense random data has no dead coordinate; on the block, the data's
    clipped sum is exactly zero at every step (the hook's independence record), Opacus'
    noise there has the claimed scale, and 256 Dirac canaries certify a positive epsilon as
    independent experiments."""
    assert all(dead_coordinates(_tanh_mlp(), _data(), kind=k).size == 0
               for k in ("structural", "at_theta0"))
    _, hook, engine = _train(256, 24)
    res = audit_report(hook, privacy_engine=engine, independent_canaries=True)
    ind = res["white_box"]["canary_independence"]
    assert ind["sets"][0]["live_canaries"] == 0 and not ind["withdrawn"]
    assert ind["steps"] == 24
    assert res["independent_canaries"] and res["verdict"]["status"] == "consistent"
    assert res["verdict"]["best_lower_bound"] > 0
    noise = {p["name"]: p for p in res["verdict"]["training_data"]["premises"]}
    measured = noise["noise_multiplier"]
    # the noise on every tensor, the block's included, as claimed: within 4 sd of 1
    assert abs(measured["ratio"] - 1.0) < 4.0 / np.sqrt(2 * measured["draws"])
    assert any(t["tensor"] == "dpaudit_canaries.linear.weight" for t in measured["tensors"])
    assert np.isclose(noise["sample_rate"]["configured"], 32 / 256)
