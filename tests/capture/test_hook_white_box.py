"""The hook's white-box records on real Opacus runs: per-tensor released norms against the
released gradient itself, the noise at dead coordinates (exactly zero without noise, the claimed
noise with it), realised batch sizes and the claimed noise per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from capture_support import digits_flat, dirac_coords, logreg, private_run

from dpaudit.attacks import StepScore
from dpaudit.capture import AuditHook, GradientCanaries
from dpaudit.stats import noise_floor_test, noise_independence_test

DATA, ZERO = digits_flat(pad=8, n_train=400)
NF = 72
D = NF * 10 + 10
COORDS = dirac_coords(ZERO, NF)  # weights of always-zero features: no example touches them


class Released(StepScore):
    name = "released"

    def __init__(self):
        self.seen, self.divisors = [], []

    def step(self, canary_grads, released, ctx):
        self.seen.append(released.double().clone())
        self.divisors.append(ctx.divisor)
        return canary_grads @ released


def _run(sigma=1.0, policy=None, physical_batch=None, rows=None):
    keeper = Released()
    pol = policy or ["every_step" if i % 3 else "never" for i in range(len(COORDS))]

    def hook_fn(opt, model):
        canaries = GradientCanaries.dirac(COORDS, norm=1.0, dim=D, policy=pol,
                                          inclusion_prob=0.5, seed=3)
        return AuditHook(opt, model, [canaries], scores=[keeper], noise_probes=COORDS,
                         coordinates=None)

    def on_batch(i, xb):
        if rows is not None:
            rows.append(len(xb))
        return xb

    run = private_run(DATA, logreg(NF), hook_fn, sigma=sigma, lr=0.3,
                      physical_batch=physical_batch, on_batch=on_batch)
    return run, keeper


def test_released_norms_are_the_released_gradients_norms():
    rows = []
    run, keeper = _run(rows=rows)
    hook = run.hook
    sq = hook.released_squared_norms()
    assert sq.shape == (2, hook.steps) and hook.tensor_dims == [NF * 10, 10]
    for t, (g, div) in enumerate(zip(keeper.seen, keeper.divisors, strict=True)):
        parts = [g[: NF * 10], g[NF * 10 :]]
        expect = [float((p * div).pow(2).sum()) for p in parts]
        np.testing.assert_allclose(sq[:, t], expect, rtol=1e-6)
    np.testing.assert_array_equal(hook.noise_stds(), np.full(hook.steps, 1.0))
    assert hook.batch_sizes() == rows  # the rows of every step's batch


def test_probe_noise_is_the_noise_at_dead_coordinates():
    # without noise the released sum at the dead coordinates is exactly the canaries inserted
    # there, which the hook subtracts: zero (float tolerance); members every step, some
    # Bernoulli ones included at random steps
    pol = ["every_step" if i % 3 == 0 else ("bernoulli" if i % 3 == 1 else "never")
           for i in range(len(COORDS))]
    run, _ = _run(sigma=0.0, policy=pol)
    z = run.hook.probe_noise()
    assert z.shape == (len(COORDS), run.hook.steps)
    np.testing.assert_allclose(z, 0.0, atol=1e-5)
    # with noise, it is i.i.d. N(0, (sigma C)^2): the tests do not reject a correct run
    run, _ = _run(sigma=2.0, policy=pol)
    z = run.hook.probe_noise()
    assert np.std(z) == pytest.approx(2.0, rel=0.05)
    assert not noise_independence_test(z, 2.0, level=0.05).rejected
    sq, dims = run.hook.released_squared_norms(), run.hook.tensor_dims
    assert not noise_floor_test(sq, dims, run.hook.noise_stds(), level=0.05).rejected


def test_batch_sizes_under_batch_memory_manager_are_the_logical_batches():
    # the same seeds draw the same Poisson batches whether BatchMemoryManager splits them or
    # not: each step's size is the logical batch, summed over its physical batches (and the
    # clipping probes' own calls of clip_and_accumulate are not counted)
    rows = []
    whole, _ = _run(rows=rows)
    split, _ = _run(physical_batch=16)
    assert whole.hook.batch_sizes() == rows
    assert split.hook.batch_sizes() == rows and max(rows) > 16


def test_noise_probes_are_checked():
    for bad, match in (([0, 1], "at least 3"), ([0, 0, 1], "distinct"), ([0, 1, D], "")):
        with pytest.raises(ValueError, match=match):
            _run_bad(bad)


def _run_bad(probes):
    def hook_fn(opt, model):
        return AuditHook(opt, model, [GradientCanaries.dirac(COORDS[:3], norm=1.0, dim=D,
                                                             policy="every_step")],
                         noise_probes=probes)

    torch.manual_seed(0)
    private_run(DATA, logreg(NF), hook_fn, epochs=1)
