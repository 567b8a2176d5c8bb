"""The noise ignores the data (``capture.noise_probe``): Opacus' own noise passes the probe, from
torch's global generator, a noise generator or in secure mode, and training is bit for bit the
same with and without it; noise seeded by the clipped sum is caught as depending on the batch,
noise seeded by the per-sample gradients as not following the generator; a correct noise from a
generator the probe cannot reach is never a finding (the step is inconclusive), and a generator
whose state cannot be restored, or an add_noise that refuses extra calls, is named."""

from __future__ import annotations

import warnings

import torch
from opacus import PrivacyEngine
from opacus.optimizers.optimizer import _generate_noise
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.bugs import _noise_per_param, plant_bug
from dpaudit.capture import AuditHook, GradientCanaries
from dpaudit.capture.patching import InstancePatch
from dpaudit.experiment.judging.doors import door_checks, noise_source_check
from dpaudit.experiment.judging.white_box import not_checked

warnings.filterwarnings("ignore", module="opacus")
STEPS = 24


def _run(plant=None, probe=True, generator=True, secure=False, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(240, 6, generator=g), torch.randint(0, 3, (240,), generator=g))
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=24), noise_multiplier=1.0, max_grad_norm=1.0,
        noise_generator=torch.Generator().manual_seed(seed + 1) if generator else None)
    opt.secure_mode = secure
    if plant:
        plant(opt)
    can = GradientCanaries.dirac([0], norm=1.0, dim=83, policy="never")
    hook = AuditHook(opt, model, [can], check_noise_data=probe)
    done = 0
    with hook:
        while done < STEPS:
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                done += 1
                if done >= STEPS:
                    break
    state = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hook, state


def test_opacus_noise_passes_and_training_is_unchanged():
    for kwargs in ({}, {"generator": False}, {"secure": True}):
        hook, state = _run(**kwargs)
        rec = hook.white_box_records().noise_source
        assert rec.reason is None and rec.steps_probed >= 1 and rec.inconclusive == 0
        assert rec.conclusive == rec.steps_probed
        assert not rec.data_dependent.any() and not rec.stale.any()
        assert not noise_source_check(hook.white_box_records()).rejected
        _, unprobed = _run(probe=False, **kwargs)
        assert torch.equal(state, unprobed), kwargs  # every state restored: bit for bit


def _seeded_by(source):
    """An add_noise whose generator is seeded from the batch (``source(opt)``)."""
    def plant(opt):
        def add_noise():
            seed = int(abs(float(source(opt))) * 1e6) % (2**62)
            gen = torch.Generator().manual_seed(seed)
            std = opt.noise_multiplier * opt.max_grad_norm
            _noise_per_param(opt, [], [_generate_noise(std=std, reference=p.summed_grad,
                                                       generator=gen) for p in opt.params])

        InstancePatch(opt, "add_noise", add_noise, owner="test").apply()
    return plant


def test_noise_seeded_by_the_clipped_sum_depends_on_the_batch():
    hook, _ = _run(plant=_seeded_by(lambda o: sum(p.summed_grad.sum() for p in o.params)))
    check = noise_source_check(hook.white_box_records())
    assert check.rejected and check.witness["kind"] == "depends on the clipped sum"
    assert check.witness["step"] == 0 and check.witness["difference"] > 0.1
    assert set(check.witness["tensors"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_noise_seeded_by_the_per_sample_gradients_does_not_follow_the_generator():
    hook, _ = _run(plant=lambda o: plant_bug(o, "batch_seeded_noise", 0.01))
    check = noise_source_check(hook.white_box_records())
    assert check.rejected and check.witness["kind"] == ("did not change when the generator "
                                                        "advanced")
    assert check.witness["tensors"] == ["2.bias"]  # only the last tensor is seeded


def test_a_correct_noise_from_a_generator_out_of_reach_is_not_a_finding():
    def plant(opt):
        private = torch.Generator().manual_seed(123)  # in a closure: the probe cannot reach it

        def add_noise():
            std = opt.noise_multiplier * opt.max_grad_norm
            _noise_per_param(opt, [], [_generate_noise(std=std, reference=p.summed_grad,
                                                       generator=private) for p in opt.params])

        InstancePatch(opt, "add_noise", add_noise, owner="test").apply()

    hook, _ = _run(plant=plant)
    rec = hook.white_box_records()
    assert rec.noise_source.conclusive == 0 and rec.noise_source.inconclusive >= 1
    assert "noise_ignores_data" not in door_checks(rec, 1e-7, None)
    assert any("a state the probe cannot restore" in s for s in not_checked(rec, True))


class _Stateless:
    """A generator whose state cannot be read (like torchcsprng's /dev/urandom device)."""

    def get_state(self):
        raise RuntimeError("a random device has no state")


def test_a_generator_that_cannot_be_restored_is_named():
    def plant(opt):
        opt.generator = _Stateless()
        InstancePatch(opt, "add_noise", lambda: _noise_per_param(
            opt, [], [torch.randn_like(p.summed_grad) for p in opt.params]),
            owner="test").apply()

    hook, _ = _run(plant=plant)
    rec = hook.white_box_records()
    assert rec.noise_source.steps_probed == 0 and "cannot be saved and restored" in \
        rec.noise_source.reason
    assert any("torchcsprng" in s for s in not_checked(rec, True))


def test_an_add_noise_that_refuses_the_probe_leaves_training_going():
    def plant(opt):
        original = opt.add_noise

        def add_noise():  # refuses a clipped sum of zeros (the probe's)
            if all(not bool(p.summed_grad.any()) for p in opt.params):
                raise RuntimeError("refusing an empty clipped sum")
            original()

        InstancePatch(opt, "add_noise", add_noise, owner="test").apply()

    hook, state = _run(plant=plant, seed=3)
    rec = hook.white_box_records()
    src = rec.noise_source
    assert src.failures >= 1 and "refusing" in src.failure and src.conclusive == 0
    assert any("the probe's add_noise calls raised" in s for s in not_checked(rec, True))
    _, plain = _run(seed=3, probe=False)
    assert torch.equal(state, plain)  # the real calls went on as without the probe
