"""Precision estimators against dense float64 inverses and scikit-learn's shrinkage intensities."""

import numpy as np
import pytest
import torch
from sklearn.covariance import ledoit_wolf, oas

from dpaudit.covariance import (
    DENSE_MAX_DIM,
    dense_precision,
    diagonal_precision,
    estimate_precision,
    ledoit_wolf_intensity,
    noise_aware,
    oas_intensity,
    shrinkage_precision,
    woodbury_precision,
)


def _refs(n=40, d=12, seed=0):
    """Anisotropic correlated Gaussian references with a non-zero mean (float64)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d)) * np.linspace(0.2, 2.0, d)
    g = rng.normal(size=(n, d)) @ a.T + rng.normal(size=d)
    return torch.tensor(g, dtype=torch.float64)


def _cov_np(g, centred):
    x = g.numpy()
    if centred:
        x = x - x.mean(0)
    return x.T @ x / x.shape[0]


def _check_operator(op, expected_cov, v):
    """apply, mahalanobis and dense agree with the float64 inverse of expected_cov."""
    p = np.linalg.inv(expected_cov)
    np.testing.assert_allclose(op.dense().numpy(), p, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(op.apply(v).numpy(), v.numpy() @ p, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(op.apply(v[0]).numpy(), p @ v[0].numpy(), rtol=1e-8, atol=1e-10)
    maha = np.einsum("kd,de,ke->k", v.numpy(), p, v.numpy())
    np.testing.assert_allclose(op.mahalanobis(v).numpy(), maha, rtol=1e-8)


@pytest.mark.parametrize("centred", [True, False])
def test_dense_matches_inverse(centred):
    g = _refs()
    v = torch.randn(5, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    op = dense_precision(g, centred=centred, ridge=0.3)
    _check_operator(op, _cov_np(g, centred) + 0.3 * np.eye(12), v)
    np.testing.assert_allclose(op.mean.numpy(), g.numpy().mean(0), rtol=1e-12)


def test_dense_unregularised_full_rank_is_exact_inverse():
    g = _refs(n=40, d=12)
    op = dense_precision(g, ridge=0.0)
    v = torch.randn(3, 12, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _check_operator(op, _cov_np(g, True), v)


@pytest.mark.parametrize("centred", [True, False])
def test_diagonal_matches_inverse(centred):
    g = _refs()
    v = torch.randn(4, 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    op = diagonal_precision(g, centred=centred, ridge=0.1)
    _check_operator(op, np.diag(np.diag(_cov_np(g, centred))) + 0.1 * np.eye(12), v)


@pytest.mark.parametrize("centred", [True, False])
@pytest.mark.parametrize("n", [8, 40])  # n_r < d (singular C) and n_r > d
def test_woodbury_equals_dense_ridge_inverse(centred, n):
    g = _refs(n=n, d=12, seed=n)
    v = torch.randn(6, 12, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    op = woodbury_precision(g, ridge=0.05, centred=centred)
    _check_operator(op, _cov_np(g, centred) + 0.05 * np.eye(12), v)
    dense = dense_precision(g, centred=centred, ridge=0.05)
    np.testing.assert_allclose(op.apply(v).numpy(), dense.apply(v).numpy(), rtol=1e-8)


def test_woodbury_rank_truncation_keeps_top_eigenspace():
    g = _refs(n=40, d=12)
    op = woodbury_precision(g, ridge=0.2, rank=3)
    evals, evecs = np.linalg.eigh(_cov_np(g, True))
    top = evecs[:, -3:]
    cov3 = top @ np.diag(evals[-3:]) @ top.T + 0.2 * np.eye(12)
    v = torch.randn(3, 12, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    _check_operator(op, cov3, v)


def test_woodbury_float32_factor_close_to_float64():
    g = _refs(n=30, d=50, seed=7)
    v = torch.randn(4, 50, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    p64 = woodbury_precision(g, ridge=0.5).mahalanobis(v)
    p32 = woodbury_precision(g.float(), ridge=0.5).mahalanobis(v.float())
    assert p32.dtype == torch.float32
    np.testing.assert_allclose(p32.numpy(), p64.numpy(), rtol=1e-4)


@pytest.mark.parametrize("n,d", [(30, 12), (10, 50), (200, 5)])
def test_shrinkage_intensities_match_sklearn(n, d):
    g = _refs(n=n, d=d, seed=n + d)
    x = g.numpy()
    lw_cov, lw_alpha = ledoit_wolf(x)
    oas_cov, oas_alpha = oas(x)
    assert ledoit_wolf_intensity(g) == pytest.approx(lw_alpha, rel=1e-9, abs=1e-12)
    assert oas_intensity(g) == pytest.approx(oas_alpha, rel=1e-9, abs=1e-12)
    v = torch.randn(3, d, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    op = shrinkage_precision(g, "ledoit_wolf")
    assert op.intensity == pytest.approx(lw_alpha, rel=1e-9, abs=1e-12)
    _check_operator(op, lw_cov, v)
    _check_operator(shrinkage_precision(g, "oas"), oas_cov, v)


def test_noise_aware_shift_composes_with_every_estimator():
    g = _refs()
    v = torch.randn(3, 12, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    shift = 0.8**2 * 1.5**2 / 16
    for method, kwargs in [
        ("dense", {"ridge": 0.01}),
        ("diagonal", {}),
        ("ledoit_wolf", {}),
        ("woodbury", {"ridge": 0.01}),
    ]:
        base = estimate_precision(g, method, **kwargs)
        shifted = noise_aware(base, noise_multiplier=0.8, max_grad_norm=1.5, batch_size=16)
        cov = np.linalg.inv(base.dense().numpy()) + shift * np.eye(12)
        _check_operator(shifted, cov, v)


def test_noise_aware_makes_unregularised_low_rank_invertible():
    g = _refs(n=5, d=30)
    with pytest.raises(ValueError, match="ridge"):
        woodbury_precision(g, ridge=0.0)
    op = noise_aware(woodbury_precision(g, ridge=1e-12), 1.0, 1.0, 4.0)
    assert op.ridge == pytest.approx(0.25, rel=1e-9)


def test_singular_requests_raise():
    g = _refs(n=10, d=12)
    with pytest.raises(ValueError, match="singular"):
        dense_precision(g)  # centred, n_r <= d, no ridge
    with pytest.raises(ValueError, match="singular"):
        dense_precision(g[:, :10], centred=True)  # n_r = d: rank d - 1
    dense_precision(g[:, :10], centred=False)  # uncentred n_r = d is fine
    z = g.clone()
    z[:, 3] = 1.0
    with pytest.raises(ValueError, match="zero variance"):
        diagonal_precision(z)
    with pytest.raises(ValueError, match="method"):
        estimate_precision(g, "cholesky")
    with pytest.raises(ValueError, match="n_r"):
        woodbury_precision(g[:1], ridge=1.0)


def test_dense_refused_for_large_d():
    g = torch.zeros(3, DENSE_MAX_DIM + 1)
    with pytest.raises(ValueError, match="d x d"):
        dense_precision(g, ridge=1.0)
    op = woodbury_precision(
        torch.randn(3, DENSE_MAX_DIM + 1, generator=torch.Generator().manual_seed(0)), 1.0
    )
    with pytest.raises(ValueError, match="d x d"):
        op.dense()


def test_apply_rejects_wrong_shape():
    op = woodbury_precision(_refs(), ridge=0.1)
    with pytest.raises(ValueError, match="columns"):
        op.apply(torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        op.mahalanobis(torch.zeros(2, 2, 12, dtype=torch.float64))


@pytest.mark.parametrize("centred", [True, False])
@pytest.mark.parametrize("n", [8, 40])  # implicit (through G) and explicit basis
@pytest.mark.parametrize("frac", [None, 0.9])
def test_woodbury_quadratic_forms_match_dense_formula(centred, n, frac):
    """One-projection forms a'Pc, a'Pa, c'Pc equal the d x d float64 formula (1e-9)."""
    g = _refs(n=n, d=12, seed=n)
    gen = torch.Generator().manual_seed(8)
    g_star = torch.randn(5, 12, generator=gen, dtype=torch.float64)
    released = torch.randn(12, generator=gen, dtype=torch.float64)
    op = woodbury_precision(g, ridge=0.05, centred=centred, explained_variance=frac)
    cov = _cov_np(g, centred)
    evals, evecs = np.linalg.eigh(cov)
    r = op.rank_kept
    top = evecs[:, ::-1][:, :r]
    p = np.linalg.inv(top @ np.diag(evals[::-1][:r]) @ top.T + 0.05 * np.eye(12))
    mu = g.numpy().mean(0)
    a, c = g_star.numpy() - mu, released.numpy() - mu
    apc, apa, cpc = op.quadratic_forms(g_star, released)
    np.testing.assert_allclose(apc.numpy(), a @ p @ c, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(apa.numpy(), np.einsum("kd,de,ke->k", a, p, a), rtol=1e-9)
    assert float(cpc) == pytest.approx(c @ p @ c, rel=1e-9)


def test_woodbury_explained_variance_truncation_is_reported():
    g = _refs(n=40, d=12)
    evals = np.sort(np.linalg.eigvalsh(_cov_np(g, True)))[::-1]
    frac = np.cumsum(evals) / evals.sum()
    for target in (0.5, 0.9, 0.99):
        op = woodbury_precision(g, ridge=0.2, explained_variance=target)
        r = int(np.searchsorted(frac, target)) + 1  # fewest components reaching the target
        assert op.rank_kept == r
        assert op.explained_variance_kept == pytest.approx(frac[r - 1], rel=1e-10)
        s = op.summary()
        assert s["rank"] == r and s["explained_variance_requested"] == target
        assert s["n_refs"] == 40
        assert noise_aware(op, 1.0, 1.0, 4.0).rank_kept == r  # kept by with_ridge
    with pytest.raises(ValueError, match="explained_variance"):
        woodbury_precision(g, ridge=0.2, explained_variance=1.5)
    with pytest.raises(ValueError, match="woodbury"):
        estimate_precision(g, "ledoit_wolf", explained_variance=0.9)


def test_woodbury_keeps_the_references_without_a_centred_copy():
    g = _refs(n=40, d=12).float()
    op = woodbury_precision(g, rel_ridge=0.1)
    assert op.factor.data_ptr() == g.data_ptr() and op.offset is not None


def test_gram64_blocked_lower_triangle_equals_direct_product():
    """n > 64 rows: strip-wise lower triangle, mirrored, equals (X - o)(X - o)^T (float64)."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(150, 700, generator=gen, dtype=torch.float64)
    off = torch.randn(700, generator=gen, dtype=torch.float64)
    from dpaudit.covariance import gram64

    got = gram64(x, chunk_elems=1 << 15, offset=off)
    ref = (x - off) @ (x - off).T
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-12, atol=1e-9)
    assert torch.equal(got, got.T)


@pytest.mark.parametrize("n", [8, 40])  # through the references (with offset) and the basis
def test_one_pass_projection_by_column_chunks_equals_separate_projections(n):
    g = _refs(n=n, d=12, seed=n)
    op = woodbury_precision(g, ridge=0.05)
    gen = torch.Generator().manual_seed(10)
    a = torch.randn(5, 12, generator=gen, dtype=torch.float64)
    c = torch.randn(12, generator=gen, dtype=torch.float64)
    pair = op._project_pair(a, c, chunk_elems=3 * n)  # 3 columns per chunk: 4 chunks
    np.testing.assert_allclose(pair[:-1].numpy(), op._project(a).numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pair[-1].numpy(), op._project(c[None])[0].numpy(), rtol=1e-10)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("method", ["woodbury", "ledoit_wolf", "dense", "diagonal"])
def test_non_finite_references_are_refused(bad, method):
    g = _refs(n=40, d=12).float()
    g[17, 5] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        estimate_precision(g, method, ridge=0.1)
