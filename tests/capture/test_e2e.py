"""End-to-end checks of the audit hook on real Opacus training (CPU; one CUDA case).

* Dirac gradient canaries inserted every step on coordinates where the data's gradients vanish
  (weights of always-zero input features): epoch-summed scalar scores are Gaussian with mean
  T C^2 / B_exp (in) or 0 (out) and standard deviation sqrt(T) sigma C^2 / B_exp, i.e. GDP
  mu = sqrt(T) / sigma. Tolerances are stated next to each assertion (Monte-Carlo error only:
  the noise is exactly Gaussian).
* BatchMemoryManager: identical records with and without virtual steps for the same seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from capture_support import digits_flat, dirac_coords, private_run
from scipy import stats

from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries, Trace, load_trace
from dpaudit.models import build_model
from dpaudit.stats import auc, gdp_auc


def _dirac_audit(model_fn, coords, dim, seed, sigma, clip, epochs=1, optimizer="sgd", pad=50):
    """One run with half the Dirac canaries in (every step) and half out; standardised scores."""
    data, _ = digits_flat(pad=pad)
    rng = np.random.default_rng(seed)
    member = rng.permutation(len(coords)) < len(coords) // 2
    policy = ["every_step" if m else "never" for m in member]
    can = GradientCanaries.dirac(coords, clip, dim, policy=policy)
    run = private_run(
        data,
        model_fn,
        lambda o, m: AuditHook(o, m, can),
        seed=seed,
        sigma=sigma,
        clip=clip,
        epochs=epochs,
        optimizer=optimizer,
    )
    t, bexp = run.hook.steps, run.optimizer.expected_batch_size
    # z = score / (sqrt(T) sigma C^2 / B_exp): in ~ N(sqrt(T)/sigma, 1), out ~ N(0, 1)
    z = run.hook.scores()["scalar"] / (np.sqrt(t) * sigma * clip**2 / bexp)
    assert np.array_equal(run.hook.inclusions().all(axis=1), member)
    return z[member], z[~member], np.sqrt(t) / sigma


def _check_gaussian(z_in, z_out, mu):
    n_in, n_out = len(z_in), len(z_out)
    # means: 4 standard errors of a unit-variance mean
    assert abs(z_in.mean() - mu) < 4 / np.sqrt(n_in)
    assert abs(z_out.mean()) < 4 / np.sqrt(n_out)
    # standard deviations: 4 standard errors, SE(sd) ~ 1 / sqrt(2 (n - 1))
    assert abs(z_in.std(ddof=1) - 1) < 4 / np.sqrt(2 * (n_in - 1))
    assert abs(z_out.std(ddof=1) - 1) < 4 / np.sqrt(2 * (n_out - 1))
    # shape: Kolmogorov-Smirnov against the predicted normals, p > 1e-3
    assert stats.kstest(z_in, "norm", args=(mu, 1)).pvalue > 1e-3
    assert stats.kstest(z_out, "norm").pvalue > 1e-3
    # separation: empirical AUC vs the GDP prediction Phi(mu / sqrt 2), 4 Hanley-McNeil SEs
    a = gdp_auc(mu)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    se = np.sqrt(
        (a * (1 - a) + (n_in - 1) * (q1 - a * a) + (n_out - 1) * (q2 - a * a)) / (n_in * n_out)
    )
    assert abs(auc(z_in, z_out) - a) < 4 * se


def test_dirac_canaries_scores_are_gaussian_with_gdp_separation():
    """Logistic regression on digits + 50 blank features: 500 Dirac canaries in one run."""
    nf = 64 + 50
    _, zero = digits_flat(pad=50)
    coords = dirac_coords(zero, nf)[:500]
    z_in, z_out, mu = _dirac_audit(
        lambda: build_model("logreg", (nf,), 10), coords, nf * 10 + 10, seed=0, sigma=2.0, clip=1.0
    )
    assert len(z_in) == len(z_out) == 250 and mu == pytest.approx(np.sqrt(22) / 2.0)
    _check_gaussian(z_in, z_out, mu)


@pytest.mark.slow
def test_dirac_canaries_gaussian_mlp_momentum_pooled_runs():
    """MLP (first-layer weights of blank features get no data gradient), SGD with momentum,
    two epochs, 3 seeds x 800 canaries pooled."""
    nf, width = 64 + 50, 16
    _, zero = digits_flat(pad=50)
    coords = [h * nf + j for j in zero for h in range(width)][:800]
    dim = nf * width + width + width * 10 + 10
    zs_in, zs_out = [], []
    for seed in range(3):
        z_in, z_out, mu = _dirac_audit(
            lambda: build_model("mlp", (nf,), 10, width=width),
            coords,
            dim,
            seed=seed,
            sigma=3.0,
            clip=0.5,
            epochs=2,
            optimizer="momentum",
        )
        zs_in.append(z_in)
        zs_out.append(z_out)
    _check_gaussian(np.concatenate(zs_in), np.concatenate(zs_out), mu)


def test_batch_memory_manager_identical_records(tmp_path):
    """Same seed, logical batches of ~64 split into physical batches of <= 16: same steps,
    inclusion draws, released gradients, per-step scores and epsilon as without splitting."""
    data, zero = digits_flat(pad=4, n_train=600)
    nf = 68
    x, y = data.tensors
    records = []
    for sub, physical in (("plain", None), ("bmm", 16)):
        can = [
            InputCanaries(x[:6], y[:6]),
            GradientCanaries.dirac(
                dirac_coords(zero, nf)[:8],
                1.0,
                nf * 10 + 10,
                policy="bernoulli",
                inclusion_prob=0.5,
                seed=11,
            ),
        ]
        run = private_run(
            data,
            lambda: build_model("logreg", (nf,), 10),
            lambda o, m, c=can, s=sub: AuditHook(
                o, m, c, keep_per_step=True, trace=Trace(tmp_path / s)
            ),
            physical_batch=physical,
            epochs=2,
        )
        records.append((run, load_trace(tmp_path / sub)["released"]))
    (a, rel_a), (b, rel_b) = records
    assert b.n_batches > a.n_batches == a.hook.steps == b.hook.steps  # virtual steps happened
    np.testing.assert_array_equal(a.hook.inclusions(), b.hook.inclusions())
    np.testing.assert_allclose(rel_a, rel_b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        a.hook.per_step()["scalar"], b.hook.per_step()["scalar"], rtol=1e-4, atol=1e-6
    )
    assert a.engine.get_epsilon(1e-5) == pytest.approx(b.engine.get_epsilon(1e-5), rel=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_records_on_device(tmp_path):
    data, zero = digits_flat(pad=8, n_train=400)
    nf = 72
    x, y = data.tensors
    can = [
        InputCanaries(x[:4], y[:4]),
        GradientCanaries.dirac(dirac_coords(zero, nf)[:4], 1.0, nf * 10 + 10),
    ]
    run = private_run(
        data,
        lambda: build_model("logreg", (nf,), 10),
        lambda o, m: AuditHook(
            o, m, can, keep_per_step=True, trace=Trace(tmp_path / "cuda", include_canaries=True)
        ),
        device="cuda",
    )
    assert next(run.model.parameters()).is_cuda
    tr = load_trace(tmp_path / "cuda")
    manual = np.einsum("tkd,td->kt", tr["canaries"], tr["released"])
    np.testing.assert_allclose(run.hook.per_step()["scalar"], manual, rtol=1e-4, atol=1e-6)
    assert run.hook.inclusions()[4:].all()
