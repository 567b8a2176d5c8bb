"""Attack scores against exact Gaussian likelihood ratios and closed-form ROC separations."""

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, ndtr
from scipy.stats import multivariate_normal

from dpaudit.attacks import (
    CovarianceScore,
    GLiRScore,
    MixtureLR,
    PerStepCovarianceScore,
    ScalarProduct,
    StepContext,
    aggregate_steps,
    covariance_llr,
    ncx2_logcdf,
    score_trace,
)
from dpaudit.attacks.glir import sankaran_logcdf
from dpaudit.covariance import DensePrecision, estimate_precision, noise_aware
from dpaudit.stats.roc import auc

D = 8


def _gaussian_setup(seed=0, d=D):
    """Anisotropic covariance (eigenvalues 0.01 .. 4), mean, and a canary gradient."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    evals = np.geomspace(0.01, 4.0, d)
    cov = q @ np.diag(evals) @ q.T
    mu = rng.normal(size=d)
    # canary: mostly along the lowest-variance direction, plus a large high-variance part
    g_star = mu + 0.3 * q[:, 0] + 1.5 * q[:, -1]
    return rng, cov, mu, g_star


def _ctx(b, sigma=0.0, clip=1.0, q=0.01, refs=None):
    return StepContext(
        step=0,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        divisor=b,
        sample_rate=q,
        reference_grads=refs,
    )


def _draw_released(rng, cov, mu, g_star, b, n, member):
    """Released batch mean: N(mu, cov/b), shifted by (g* - mu)/b for members."""
    x = rng.multivariate_normal(mu, cov / b, size=n)
    return x + (g_star - mu) / b if member else x


def test_covariance_score_is_the_exact_gaussian_log_lr():
    rng, cov, mu, g_star = _gaussian_setup()
    b = 16.0
    x = np.concatenate([_draw_released(rng, cov, mu, g_star, b, 200, m) for m in (False, True)])
    exact = multivariate_normal(mu + (g_star - mu) / b, cov / b).logpdf(x) - multivariate_normal(
        mu, cov / b
    ).logpdf(x)
    op = DensePrecision(torch.tensor(mu), torch.tensor(cov))
    score = CovarianceScore(op)
    ours = np.array(
        [float(score.step(torch.tensor(g_star)[None], torch.tensor(xi), _ctx(b))[0]) for xi in x]
    )
    slope, intercept = np.polyfit(exact, ours, 1)
    assert slope == pytest.approx(1.0, abs=1e-9)
    assert intercept == pytest.approx(0.0, abs=1e-9)
    np.testing.assert_allclose(ours, exact, rtol=1e-9, atol=1e-9)


def test_noise_aware_covariance_score_is_exact_log_lr_under_dp_noise():
    rng, cov, mu, g_star = _gaussian_setup(seed=1)
    b, sigma, clip = 10.0, 0.7, 2.0
    shift = sigma**2 * clip**2 / b
    eff = cov + shift * np.eye(D)  # covariance of the released mean, times b
    x = _draw_released(rng, eff, mu, g_star, b, 100, True)
    exact = multivariate_normal(mu + (g_star - mu) / b, eff / b).logpdf(x) - multivariate_normal(
        mu, eff / b
    ).logpdf(x)
    op = noise_aware(DensePrecision(torch.tensor(mu), torch.tensor(cov)), sigma, clip, b)
    gs = torch.tensor(g_star)[None]
    ours = np.array([float(covariance_llr(gs, torch.tensor(xi), op.mean, op, b)[0]) for xi in x])
    np.testing.assert_allclose(ours, exact, rtol=1e-9, atol=1e-9)


def test_covariance_beats_scalar_on_anisotropic_gradients():
    """Empirical AUCs match the closed forms Phi(mu/sqrt2) within 0.03 (n = 3000 per side).

    The covariance score uses a Ledoit-Wolf estimate from 400 references, not the true C.
    """
    rng, cov, mu, g_star = _gaussian_setup(seed=2)
    b, n = 4.0, 3000
    refs = torch.tensor(rng.multivariate_normal(mu, cov, size=400))
    op = estimate_precision(refs, "ledoit_wolf")
    x_out = torch.tensor(_draw_released(rng, cov, mu, g_star, b, n, False))
    x_in = torch.tensor(_draw_released(rng, cov, mu, g_star, b, n, True))
    gs = torch.tensor(g_star)[None]
    cov_score = CovarianceScore(op)
    scal = ScalarProduct()
    res = {}
    for name, sc in (("cov", cov_score), ("scal", scal)):
        s_in = np.array([float(sc.step(gs, xi, _ctx(b))[0]) for xi in x_in])
        s_out = np.array([float(sc.step(gs, xo, _ctx(b))[0]) for xo in x_out])
        res[name] = auc(s_in, s_out)
    diff = g_star - mu
    mu_cov = np.sqrt(diff @ np.linalg.solve(cov, diff) / b)
    mu_scal = (g_star @ diff / b) / np.sqrt(g_star @ cov @ g_star / b)
    assert res["cov"] == pytest.approx(ndtr(mu_cov / np.sqrt(2)), abs=0.03)
    assert res["scal"] == pytest.approx(ndtr(mu_scal / np.sqrt(2)), abs=0.03)
    assert res["cov"] > res["scal"] + 0.1


def test_per_step_variant_reestimates_and_aggregates():
    rng, cov, mu, g_star = _gaussian_setup(seed=3)
    b, steps = 8.0, 5
    refs = [torch.tensor(rng.multivariate_normal(mu, cov, size=50)) for _ in range(steps)]
    released = torch.tensor(_draw_released(rng, cov, mu, g_star, b, steps, True))
    grads = torch.tensor(np.stack([g_star, mu]))

    def ctx_fn(t):
        return StepContext(t, 0.5, 1.0, b, 0.1, refs[t])

    score = PerStepCovarianceScore(aggregate="max", method="ledoit_wolf")
    agg, table = score_trace(score, grads, released, ctx_fn, per_step=True)
    assert table.shape == (2, steps)
    for t in range(steps):
        op = noise_aware(estimate_precision(refs[t], "ledoit_wolf"), 0.5, 1.0, b)
        expected = covariance_llr(grads, released[t], op.mean, op, b)
        np.testing.assert_allclose(table[:, t].numpy(), expected.numpy(), rtol=1e-10)
    np.testing.assert_allclose(agg.numpy(), table.max(1).values.numpy())
    summed = score_trace(PerStepCovarianceScore(aggregate="sum"), grads, released, ctx_fn)
    np.testing.assert_allclose(summed.numpy(), table.sum(1).numpy(), rtol=1e-10)
    with pytest.raises(ValueError, match="reference_grads"):
        score.step(grads, released[0], _ctx(b))


@pytest.mark.parametrize("q_c", [1.0, 0.3, 0.01])
def test_mixture_lr_is_exact_log_lr_of_subsampled_gaussian(q_c):
    rng = np.random.default_rng(4)
    d, sigma, clip, bexp = 5, 1.3, 0.8, 32.0
    g_star = rng.normal(size=d)
    g_star *= 0.9 * clip / np.linalg.norm(g_star)
    noise_sd = sigma * clip
    sums = rng.normal(scale=noise_sd, size=(300, d))
    sums[::2] += g_star  # half the steps carry the canary
    log_p0 = multivariate_normal(np.zeros(d), noise_sd**2 * np.eye(d)).logpdf(sums)
    log_p1 = logsumexp(
        [
            np.log1p(-q_c) + log_p0 if q_c < 1 else np.full_like(log_p0, -np.inf),
            np.log(q_c) + multivariate_normal(g_star, noise_sd**2 * np.eye(d)).logpdf(sums),
        ],
        axis=0,
    )
    exact = log_p1 - log_p0
    score = MixtureLR(inclusion_prob=q_c)
    ctx = _ctx(bexp, sigma=sigma, clip=clip, q=0.5)
    ours = np.array(
        [
            float(score.step(torch.tensor(g_star)[None], torch.tensor(s / bexp), ctx)[0])
            for s in sums
        ]
    )
    np.testing.assert_allclose(ours, exact, rtol=1e-9, atol=1e-9)


def test_mixture_lr_stable_for_extreme_projections_and_validates():
    score = MixtureLR(inclusion_prob=0.01)
    g = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    ctx = _ctx(1.0, sigma=0.01, clip=1.0)
    big = score.step(g, torch.tensor([1e6, 0.0], dtype=torch.float64), ctx)
    small = score.step(g, torch.tensor([-1e6, 0.0], dtype=torch.float64), ctx)
    assert torch.isfinite(big).all() and float(small) == pytest.approx(np.log1p(-0.01))
    with pytest.raises(ValueError, match="noise_multiplier"):
        score.step(g, torch.zeros(2, dtype=torch.float64), _ctx(1.0, sigma=0.0))
    with pytest.raises(ValueError, match="inclusion_prob"):
        MixtureLR(inclusion_prob=0.0)


def test_glir_p_values_uniform_under_h0_and_score_separates():
    """Under H0 exp(-score) is a p-value: P(p <= 0.1) = 0.1 +- 0.03 (n = 1500)."""
    rng, cov, mu, g_star = _gaussian_setup(seed=5)
    b, n = 4.0, 1500
    op = DensePrecision(torch.tensor(mu), torch.tensor(cov))
    score = GLiRScore(op)
    gs = torch.tensor(g_star)[None]
    s_out = np.array(
        [
            float(score.step(gs, torch.tensor(x), _ctx(b))[0])
            for x in _draw_released(rng, cov, mu, g_star, b, n, False)
        ]
    )
    s_in = np.array(
        [
            float(score.step(gs, torch.tensor(x), _ctx(b))[0])
            for x in _draw_released(rng, cov, mu, g_star, b, n, True)
        ]
    )
    assert np.mean(np.exp(-s_out) <= 0.1) == pytest.approx(0.1, abs=0.03)
    assert auc(s_in, s_out) > 0.75


def test_ncx2_logcdf_tail_fallback_is_finite_and_accurate():
    """Sankaran's approximation is within 2% of scipy's log-CDF in the moderate lower tail."""
    from scipy.stats import ncx2

    df, nc = 1000.0, 500.0
    m, s = df + nc, np.sqrt(2 * (df + 2 * nc))
    for z in (-3.0, -6.0):
        exact = float(ncx2.logcdf(m + z * s, df, nc))
        approx = float(sankaran_logcdf(np.array(m + z * s), df, np.array(nc)))
        assert approx == pytest.approx(exact, rel=0.02)
    far = ncx2_logcdf(np.array([m - 20 * s, m - 6 * s]), df, np.array(nc))
    assert np.all(np.isfinite(far)) and far[0] < far[1] < 0


def test_score_trace_replays_like_live_steps():
    rng = np.random.default_rng(6)
    released = torch.tensor(rng.normal(size=(7, D)))
    grads = torch.tensor(rng.normal(size=(3, D)))
    agg, table = score_trace(ScalarProduct(), grads, released, _ctx(4.0), per_step=True)
    np.testing.assert_allclose(table.numpy(), (grads @ released.T).numpy())
    np.testing.assert_allclose(agg.numpy(), (grads @ released.T).sum(1).numpy())
    per_step_grads = torch.tensor(rng.normal(size=(7, 3, D)))
    agg2 = score_trace(ScalarProduct(), per_step_grads, released, _ctx(4.0))
    np.testing.assert_allclose(
        agg2.numpy(), torch.einsum("tkd,td->k", per_step_grads, released).numpy()
    )
    assert torch.equal(aggregate_steps(table, "max"), table.max(1).values)
    with pytest.raises(ValueError, match="aggregate"):
        aggregate_steps(table, "mean")
    with pytest.raises(ValueError, match="steps"):
        score_trace(ScalarProduct(), per_step_grads[:3], released, _ctx(4.0))


def test_covariance_score_checks_dimension():
    op = estimate_precision(torch.randn(20, 5, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="d=5"):
        CovarianceScore(op).start(2, 6, torch.device("cpu"))


def _woodbury_case(d=12, n=30, k=4, seed=11, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    refs = torch.tensor(rng.normal(size=(n, d)) * np.linspace(0.3, 2.0, d) + 0.5, dtype=dtype)
    g_star = torch.tensor(rng.normal(size=(k, d)) * 2.0, dtype=dtype)
    released = torch.tensor(rng.normal(size=(6, d)), dtype=dtype)
    return refs, g_star, released


def test_woodbury_covariance_and_glir_scores_match_dense_formula():
    """Scores through one projection per vector equal the d x d formulas (float64, 1e-9)."""
    from scipy.stats import ncx2

    refs, g_star, released = _woodbury_case()
    b, sigma = 8.0, 0.5
    op = noise_aware(estimate_precision(refs, "woodbury", rel_ridge=0.05), sigma, 1.0, b)
    p = op.dense().numpy()
    # dense reference: the covariance of the references + ridge, inverted in float64
    x = refs.numpy() - refs.numpy().mean(0)
    p_ref = np.linalg.inv(x.T @ x / x.shape[0] + op.ridge * np.eye(x.shape[1]))
    np.testing.assert_allclose(p, p_ref, rtol=1e-8)
    mu = refs.numpy().mean(0)
    cov, glir = CovarianceScore(op), GLiRScore(op)
    for g in released:
        a, c = g_star.numpy() - mu, g.numpy() - mu
        llr = a @ p @ c - np.einsum("kd,de,ke->k", a, p, a) / (2 * b)
        np.testing.assert_allclose(cov.step(g_star, g, _ctx(b)).numpy(), llr, rtol=1e-9)
        diff = c - a
        s = b * np.einsum("kd,de,ke->k", diff, p, diff)
        nc = b * np.einsum("kd,de,ke->k", a, p, a)
        expected = -ncx2.logcdf(s, x.shape[1], nc)
        np.testing.assert_allclose(glir.step(g_star, g, _ctx(b)).numpy(), expected, rtol=1e-7)


def test_fixed_canary_cache_reuses_projections_and_sees_in_place_changes():
    refs, g_star, released = _woodbury_case()
    op = estimate_precision(refs, "woodbury", rel_ridge=0.05)
    cached, fresh = CovarianceScore(op), CovarianceScore(op)
    first = cached.step(g_star, released[0], _ctx(4.0))
    prep = cached._cache[2]
    second = cached.step(g_star, released[1], _ctx(4.0))
    assert cached._cache[2] is prep  # same tensor, unmodified: projections reused
    torch.testing.assert_close(second, fresh.step(g_star.clone(), released[1], _ctx(4.0)))
    g_star.mul_(2.0)  # in place: the version changes, the cache must not be used
    third = cached.step(g_star, released[1], _ctx(4.0))
    assert cached._cache[2] is not prep
    torch.testing.assert_close(third, fresh.step(g_star.clone(), released[1], _ctx(4.0)))
    assert not torch.allclose(first, third)


def test_woodbury_score_float32_close_to_float64_at_moderate_d():
    """float32 references and gradients (d = 3000, noise-aware): within 1e-4 of float64."""
    refs, g_star, released = _woodbury_case(d=3000, n=64, k=8)
    b = 64.0
    out = []
    for dtype in (torch.float64, torch.float32):
        op = noise_aware(estimate_precision(refs.to(dtype), "woodbury", rel_ridge=0.1), 1, 1, b)
        out.append(covariance_llr(g_star.to(dtype), released[0].to(dtype), op.mean, op, b))
    np.testing.assert_allclose(out[1].numpy(), out[0].numpy(), rtol=1e-4, atol=1e-4)


def test_per_step_covariance_on_equal_references_is_the_noise_scaled_scalar_product():
    """References all zero (Dirac canaries on dead coordinates): the noise's ridge is in the
    estimate itself, so the precision is I / (sigma^2 C^2 / b), never singular, and the score is
    (g* . g) / r - ||g*||^2 / (2 b r) with r = sigma^2 C^2 / b."""
    torch.manual_seed(0)
    b, sigma, clip = 16.0, 0.5, 1.0
    grads, released = torch.randn(3, D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    refs = torch.zeros(10, D, dtype=torch.float64)
    ctx = StepContext(0, sigma, clip, b, 0.1, refs)
    r = sigma**2 * clip**2 / b
    for method in ("ledoit_wolf", "oas", "diagonal", "dense"):
        got = PerStepCovarianceScore(method=method).step(grads, released, ctx)
        want = grads @ released / r - (grads**2).sum(1) / (2 * b * r)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
