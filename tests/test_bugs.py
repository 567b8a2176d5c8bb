"""The bug zoo: each planted bug does exactly what it claims, and the accountant never notices."""

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.bugs import BUG_ZOO, check_bug
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
    assert "clip_and_accumulate" not in opt.__dict__ and "pre_step" not in opt.__dict__


def test_unclipped_example_at_half_severity_hits_every_other_batch_whoever_clips():
    # batches counted by pre_step: the bug is on batches 1 and 3 of 0..3, and a second
    # clipping of the same batch (an audit's probe) sees exactly what the batch saw
    model, opt, data = private(sigma=0.0)
    plant_bug(opt, "unclipped_example", factor=0.5)
    opt.step_hook = None
    x, y = data.tensors[0][:6], data.tensors[1][:6]
    raw = per_sample_clipped_grads(model, x, y, nn.functional.cross_entropy, None)
    clipped = per_sample_clipped_grads(model, x, y, nn.functional.cross_entropy, 1.0)
    top = int(raw.norm(dim=1).argmax())
    buggy = clipped.sum(0) - clipped[top] + raw[top]
    for batch in range(4):
        opt.zero_grad()
        backward(model, x, y)
        samples = [p.grad_sample.clone() for p in opt.params]
        opt.pre_step()
        expected = buggy if batch % 2 else clipped.sum(0)
        for probe in range(2):
            if probe:  # clip the same rows again, as the clipping check does
                for p, g in zip(opt.params, samples, strict=True):
                    p.grad_sample, p.summed_grad = g.clone(), None
                opt.clip_and_accumulate()
            got = torch.cat([p.summed_grad.reshape(-1) for p in opt.params])
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_bad_bug_name():
    _, opt, _ = private()
    with pytest.raises(ValueError, match="bug must be one of"):
        plant_bug(opt, "typo")
    with pytest.raises(ValueError, match="DPOptimizer"):
        plant_bug(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), "halved_noise")


# ------------------------------------------------------------------------------------------
# the rest of the zoo: each bug does what its description says


def _noise(opt):
    """One add_noise on a zero clipped sum: the noise itself, per parameter."""
    for p in opt.params:
        p.summed_grad = torch.zeros_like(p)
    opt.add_noise()
    return [p.grad.clone() for p in opt.params]


def test_zoo_entries_say_what_they_are():
    for name, spec in BUG_ZOO.items():
        assert spec.name == name and spec.bug_class and spec.origin and spec.severity
        assert spec.valid(spec.catastrophic) and spec.valid(spec.mild)
    with pytest.raises(ValueError, match="bug_factor"):
        check_bug("noise_skipped_steps", 1.5)
    with pytest.raises(ValueError, match="bug_factor"):
        check_bug("microbatch_clipping", 0.8)


def _step_noise(model, opt, data):
    """One real step's pre-step on a batch of 8: the noise it released, per parameter (the
    release times the expected batch size, minus the clipped sum)."""
    opt.zero_grad()
    backward(model, data.tensors[0][:8], data.tensors[1][:8])
    opt.step_hook = None
    opt.pre_step()
    return [p.grad * opt.expected_batch_size - p.summed_grad for p in opt.params]


def test_noise_skipped_steps_releases_a_fraction_of_steps_without_noise():
    model, opt, data = private(d=400)
    plant_bug(opt, "noise_skipped_steps", factor=0.25)  # steps 3, 7, 11, ... are noiseless
    # the bug counts real steps, not add_noise calls: extra calls (an audit's noise probe)
    # leave it on the same steps
    zero = []
    for _ in range(8):
        _noise(opt)  # an extra add_noise call between the steps
        zero.append(all(bool(g.abs().max() < 1e-4) for g in _step_noise(model, opt, data)))
    assert zero == [False, False, False, True, False, False, False, True]


def test_noise_reused_repeats_or_correlates_the_noise():
    _, opt, _ = private(d=4000)
    plant_bug(opt, "noise_reused", factor=1.0)
    a, b = _noise(opt)[0], _noise(opt)[0]
    assert torch.equal(a, b) and a.std().item() == pytest.approx(2.0, rel=0.03)
    _, opt, _ = private(d=4000)
    plant_bug(opt, "noise_reused", factor=0.5)
    a, b = _noise(opt)[0].flatten(), _noise(opt)[0].flatten()
    assert torch.corrcoef(torch.stack([a, b]))[0, 1].item() == pytest.approx(0.5, abs=0.05)
    assert b.std().item() == pytest.approx(2.0, rel=0.03)  # each step still has full noise


def test_noise_partial_tensors_leaves_the_last_tensors_noiseless():
    _, opt, _ = private(d=400)
    plant_bug(opt, "noise_partial_tensors", factor=1.0)  # weight noised, bias not
    w, b = _noise(opt)
    assert w.std().item() > 1.0 and bool((b == 0).all())


def test_layer_clip_ignored_and_microbatches_exceed_the_sensitivity():
    for bug, factor in (("layer_clip_ignored", 1.0), ("microbatch_clipping", 0.5)):
        model, opt, data = private(sigma=0.0)
        plant_bug(opt, bug, factor=factor)
        x, y = data.tensors[0][:2], data.tensors[1][:2]
        opt.zero_grad()
        backward(model, x, y)
        opt.clip_and_accumulate()
        summed = torch.cat([p.summed_grad.reshape(-1) for p in opt.params])
        raw = per_sample_clipped_grads(model, x, y, nn.functional.cross_entropy, None)
        if bug == "layer_clip_ignored":  # factor from the weight's norm only: bias unclipped
            w = raw[:, :-2].norm(dim=1)
            factor_ = torch.clamp(1.0 / (w + 1e-6), max=1.0)
            expected = (factor_[:, None] * raw).sum(0)
        else:  # the two examples' sum clipped as one example
            s = raw.sum(0)
            expected = s * min(1.0, 1.0 / (float(s.norm()) + 1e-6))
        torch.testing.assert_close(summed, expected, rtol=1e-4, atol=1e-5)


def test_accountant_bugs_misreport_to_the_accountant():
    for bug, factor in (("accountant_sigma", 0.5), ("accountant_sample_rate", 0.5),
                        ("accountant_steps", 0.5)):
        torch.manual_seed(0)
        model = nn.Linear(40, 2)
        data = TensorDataset(torch.randn(64, 40), torch.randint(0, 2, (64,)))
        engine = PrivacyEngine(accountant="prv")
        model, opt, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=16), noise_multiplier=2.0, max_grad_norm=1.0,
        )
        plant_bug(opt, bug, factor=factor)
        steps = 0
        for x, y in loader:
            if len(x) == 0:
                continue
            opt.zero_grad()
            backward(model, x, y)
            opt.step()
            steps += 1
        hist = engine.accountant.history
        assert opt.noise_multiplier == 2.0  # training's own value is untouched
        if bug == "accountant_sigma":
            assert {h[0] for h in hist} == {4.0}
        elif bug == "accountant_sample_rate":
            assert {h[1] for h in hist} == {0.125}  # 16 / 64 x 0.5
        else:
            assert sum(h[2] for h in hist) == steps // 2


def test_sampling_bugs_are_not_optimizer_patches():
    _, opt, _ = private()
    with pytest.raises(ValueError, match="plant_sampler_bug"):
        plant_bug(opt, "shuffled_batches")


def test_layer_clip_ignored_leaves_out_the_models_own_layers_not_a_canary_block():
    """With ``add_canary_block`` (the hook's default canaries' parameters, no data gradient,
    the last tensor), the bug at severity 0.5 still leaves the model's own last layer (the
    second Linear's weight and bias) out of the norm, not the block and one bias: the block's
    zero gradient never makes the bug harmless."""
    from dpaudit import add_canary_block

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(400, 8), nn.Linear(8, 2))
    add_canary_block(model, size=50)
    data = TensorDataset(torch.randn(64, 400) * 3, torch.randint(0, 2, (64,)))
    model, opt, _ = PrivacyEngine(accountant="prv").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=16), noise_multiplier=0.0, max_grad_norm=1.0)
    assert [tuple(p.shape) for p in opt.params][-1] == (1, 50)
    plant_bug(opt, "layer_clip_ignored", factor=0.5)
    x, y = data.tensors[0][:2], data.tensors[1][:2]
    opt.zero_grad()
    backward(model, x, y)
    opt.clip_and_accumulate()
    # the per-example norms counted: the first layer's (weight and bias) alone
    g = [p.grad_sample.reshape(2, -1) for p in opt.params]
    counted = torch.cat(g[:2], dim=1).norm(dim=1)
    factor = torch.clamp(1.0 / (counted + 1e-6), max=1.0)
    assert float(torch.cat(g[2:4], dim=1).norm()) > 0  # the left-out layer has gradient
    for p, gs in zip(opt.params, g, strict=True):
        torch.testing.assert_close(p.summed_grad.reshape(-1), (factor[:, None] * gs).sum(0),
                                   rtol=1e-4, atol=1e-5)
