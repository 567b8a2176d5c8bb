"""The noise the optimizer really added, recovered by the hook (``capture.noise_record``): what
it keeps equals the noise a patched ``add_noise`` planted, the CPU (numpy) and the torch paths
keep the same numbers, the rounding bound covers the recovery's error, long runs fold their
sketches within the budget, and the alignment statistic sees lag structure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from capture_support import digits_flat, logreg, private_run

from dpaudit.bugs import _noise_per_param
from dpaudit.capture import AuditHook, GradientCanaries
from dpaudit.capture import noise_record as nr
from dpaudit.capture.patching import InstancePatch

DATA, ZERO = digits_flat(pad=8, n_train=300)
NF = 72
D = NF * 10 + 10


def _planted_run(sigma=2.0, steps_noise=None, **hook_kw):
    """A run whose add_noise adds known tensors (``steps_noise(t, params)``, or Opacus' own)."""
    planted = []

    def hook_fn(opt, model):
        if steps_noise is not None:
            def add_noise():
                noises = steps_noise(len(planted), opt.params)
                planted.append([n.clone() for n in noises])
                _noise_per_param(opt, [], noises)

            InstancePatch(opt, "add_noise", add_noise, owner="test").apply()
        canaries = GradientCanaries.dirac([0, 1, 2], norm=1.0, dim=D, policy="every_step")
        # the planted add_noise counts its calls: the noise probe would add calls
        return AuditHook(opt, model, [canaries], **{"check_noise_data": False, **hook_kw})

    run = private_run(DATA, logreg(NF), hook_fn, sigma=sigma, epochs=2)
    return run, planted


def test_the_recorded_noise_is_what_add_noise_added():
    gen = torch.Generator().manual_seed(0)

    def known(t, params):
        return [torch.randn(p.shape, generator=gen) * 2.0 for p in params]

    run, planted = _planted_run(steps_noise=known)
    rec = run.hook.white_box_records()
    assert rec.noise is not None and len(planted) == rec.num_steps
    for step, noises in zip(rec.steps, planted, strict=True):
        expect = np.array([float((n.double() ** 2).sum()) for n in noises]) / 4.0
        # the recovery is exact up to the release's float32 rounding, which the bound covers
        err = step.noise.rounding * 2.0
        dims = np.array(rec.noise.dims)
        assert np.all(np.abs(np.sqrt(step.noise.sq * 4.0) - np.sqrt(expect * 4.0))
                      <= np.sqrt(dims) * err + 1e-9)
        assert 0 < step.noise.rounding < 1e-5
    assert rec.noise.names == ["weight", "bias"] or len(rec.noise.names) == 2


def test_numpy_and_torch_paths_keep_the_same_numbers():
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(40, 30)), torch.nn.Parameter(torch.randn(30))]
    for p in params:
        p.summed_grad = torch.randn_like(p) * 5
        p.grad = p.summed_grad + torch.randn_like(p) * 2
    out = []
    for numpy_path in (True, False):
        r = nr.NoiseRecorder(params, ["w", "b"], seed=3)
        r._start(torch.device("cpu"))
        if not numpy_path:
            r._numpy = False
            r._buf = torch.empty(r.total, dtype=torch.float64)
        out.append(r._reduce(2.0))
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-12, atol=1e-12)
    assert out[0][1] == out[1][1]


def test_a_correct_run_and_a_steps_noise_in_the_records():
    run, _ = _planted_run()
    rec = run.hook.white_box_records()
    steps = rec.noise_steps
    assert len(steps) == rec.num_steps >= 8
    # sq / d is the noise's variance over the claimed one: about 1 for Opacus' own noise
    ratio = np.stack([s.sq for s in steps]) / np.array(rec.noise.dims)
    assert np.median(ratio[:, 0]) == pytest.approx(1.0, abs=0.1)
    # every sampled coordinate lands in a bin; the first step is tested alone
    assert steps[0].counts.sum() == sum(min(d, max(nr.MIN_SAMPLE, math.ceil(
        nr.SAMPLE * d / sum(rec.noise.dims)))) for d in rec.noise.dims)
    assert set(steps[0].lag_z) == set(rec.noise.lags)
    assert rec.noise.tensor_counts.sum() == sum(s.counts.sum() for s in steps)


def test_record_noise_off_keeps_no_sketch():
    run, _ = _planted_run(record_noise=False)
    rec = run.hook.white_box_records()
    assert rec.noise is None and all(s.noise is None for s in rec.steps)


def test_sigma_zero_steps_are_not_sketched():
    run, _ = _planted_run(sigma=0.0)
    rec = run.hook.white_box_records()
    assert rec.noise_steps == [] and all(s.noise_std == 0.0 for s in rec.steps)


def test_long_runs_fold_their_sketches_within_the_budget(monkeypatch):
    monkeypatch.setattr(nr, "SKETCH_BUDGET", 3000)
    run, _ = _planted_run()
    rec = run.hook.white_box_records()
    steps = rec.noise_steps
    width = steps[0].sketch.size
    assert all(s.sketch.size == width for s in steps)
    assert width * len(steps) <= 3000 and rec.noise.segments[-1][2] == width
    assert steps[0].sketch_error >= 2 * steps[-1].rounding  # folded at least once


def test_lag_statistic_sees_a_repeat_and_stays_calm_without():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 2000))
    (power,) = nr._spectra([(x, [0.0])])
    calm = nr.lags_from_spectra(power, x.shape[1], nr.lag_slack(x, [0.0]))[0]
    assert calm.max() < math.sqrt(2 * math.log(2 * x.size / 1e-3))
    y = x.copy()[0]
    y[1000:1300] = y[200:500]  # a block repeated 800 coordinates later
    (power,) = nr._spectra([(y[None], [0.0])])
    z = nr.lags_from_spectra(power, y.size, nr.lag_slack(y[None], [0.0]))[0]
    assert int(np.argmax(z)) + 1 == 800 and z.max() > 6 > calm.max()
    # the direct sums agree with the FFT
    q = (y[:-800] * y[800:]).sum()
    v = ((y[:-800] * y[800:]) ** 2).sum()
    assert z[799] == pytest.approx(abs(q) / math.sqrt(v), rel=1e-8)
