"""Planted bugs do exactly what they claim, and the accountant never notices."""

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.experiment import plant_bug
from dpaudit.gradients import per_sample_clipped_grads


def private(n=64, d=400, batch=16, sigma=2.0, seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(d, 2)
    data = TensorDataset(torch.randn(n, d) * 3, torch.randint(0, 2, (n,)))
    engine = PrivacyEngine(accountant="prv")
    model, opt, _ = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=batch),
        noise_multiplier=sigma,
        max_grad_norm=1.0,
    )
    return model, opt, data


def backward(model, x, y):
    nn.functional.cross_entropy(model(x), y).backward()


def test_halved_noise_halves_the_noise_but_not_the_reported_sigma():
    _, opt, _ = private(d=4000)
    plant_bug(opt, "halved_noise")
    for p in opt.params:
        p.summed_grad = torch.zeros_like(p)
    opt.add_noise()
    w = opt.params[0].grad
    # 8000 N(0, (sigma C / 2)^2) draws: sd within 3% of 1.0 (MC sd of the sd ~ 0.8%).
    assert w.std().item() == pytest.approx(1.0, rel=0.03)
    assert opt.noise_multiplier == 2.0


@pytest.mark.parametrize("factor", [0.9, 0.7])
def test_scaled_noise_scales_the_noise_but_not_the_reported_sigma(factor):
    _, opt, _ = private(d=4000)
    remove = plant_bug(opt, "scaled_noise", factor=factor)
    for p in opt.params:
        p.summed_grad = torch.zeros_like(p)
    opt.add_noise()
    # 8000 N(0, (factor sigma C)^2) draws, sigma = 2: sd within 3% (MC sd of the sd ~ 0.8%).
    assert opt.params[0].grad.std().item() == pytest.approx(2.0 * factor, rel=0.03)
    assert opt.noise_multiplier == 2.0
    remove()
    assert "add_noise" not in opt.__dict__


def test_scaled_noise_factor_is_checked():
    _, opt, _ = private()
    with pytest.raises(ValueError, match="bug_factor"):
        plant_bug(opt, "scaled_noise", factor=1.5)


def test_realised_batch_size_divides_by_the_drawn_count():
    model, opt, data = private(sigma=0.0)
    plant_bug(opt, "realised_batch_size")
    x, y = data.tensors[0][:5], data.tensors[1][:5]
    opt.zero_grad()
    backward(model, x, y)
    opt.step_hook = None
    opt.pre_step()
    clipped = per_sample_clipped_grads(model, x, y, nn.functional.cross_entropy, 1.0)
    got = torch.cat([p.grad.reshape(-1) for p in opt.params])
    torch.testing.assert_close(got, clipped.sum(0) / 5, rtol=1e-4, atol=1e-6)


def test_unclipped_example_leaves_the_largest_gradient_unclipped():
    model, opt, data = private(sigma=0.0)
    remove = plant_bug(opt, "unclipped_example")
    x, y = data.tensors[0][:6], data.tensors[1][:6]
    opt.zero_grad()
    backward(model, x, y)
    opt.clip_and_accumulate()
    raw = per_sample_clipped_grads(model, x, y, nn.functional.cross_entropy, None)
    clipped = per_sample_clipped_grads(model, x, y, nn.functional.cross_entropy, 1.0)
    top = int(raw.norm(dim=1).argmax())
    assert raw[top].norm() > 2.0  # the bug matters: the largest gradient is far above C = 1
    expected = clipped.sum(0) - clipped[top] + raw[top]
    got = torch.cat([p.summed_grad.reshape(-1) for p in opt.params])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    remove()
    assert "clip_and_accumulate" not in opt.__dict__


def test_bad_bug_name():
    _, opt, _ = private()
    with pytest.raises(ValueError, match="bug must be one of"):
        plant_bug(opt, "typo")
    with pytest.raises(ValueError, match="DPOptimizer"):
        plant_bug(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), "halved_noise")
