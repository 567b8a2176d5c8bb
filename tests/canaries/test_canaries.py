"""Canary sources, Algorithm 3 ranking and selection, Algorithm 6, predicted leakage."""

import numpy as np
import pytest
import torch
from scipy.special import ndtr
from torch import nn

from dpaudit.canaries import (
    INPUT_SOURCES,
    InputCandidates,
    blank_inputs,
    dirac_canaries,
    in_distribution,
    mahalanobis_scores,
    mislabeled,
    predicted_leakage,
    random_direction_canaries,
    rank_along_trajectory,
    rank_candidates,
    scale_to_norm,
    select_canaries,
)
from dpaudit.covariance import DensePrecision, estimate_precision, noise_aware
from dpaudit.gradients import per_sample_clipped_grads
from dpaudit.stats import gdp_auc, gdp_epsilon
from dpaudit.stats.roc import auc


def _anisotropic(d=20, seed=0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    evals = np.geomspace(1e-3, 1.0, d)
    return rng, q, evals, q @ np.diag(evals) @ q.T


@pytest.mark.parametrize(
    "method,kwargs",
    [("dense", {"ridge": 1e-4}), ("ledoit_wolf", {}), ("oas", {}), ("woodbury", {"ridge": 1e-4})],
)
def test_mahalanobis_ranking_recovers_planted_outlier(method, kwargs):
    """An outlier along the lowest-variance direction, with a small Euclidean norm, ranks first
    under every covariance estimator, although 50 ordinary candidates have larger norms."""
    rng, q, _, cov = _anisotropic()
    refs = torch.tensor(rng.multivariate_normal(np.zeros(20), cov, size=300))
    cands = rng.multivariate_normal(np.zeros(20), cov, size=200)
    planted = 1.5 * q[:, 0]  # 47 standard deviations along the lowest-variance direction
    cands = np.vstack([cands[:117], planted, cands[117:]])
    grads = torch.tensor(cands)
    assert np.sum(np.linalg.norm(cands, axis=1) > np.linalg.norm(planted)) >= 50
    op = estimate_precision(refs, method, **kwargs)
    scores = mahalanobis_scores(grads, op).numpy()
    sel = select_canaries(scores, "top", k=1)
    assert sel.indices.tolist() == [117]


def _digits_setup():
    from dpaudit.data import load_dataset
    from dpaudit.models import build_model

    train, _, info = load_dataset("digits", seed=0)
    x, y = train.tensors
    model = build_model("logreg", info.input_shape, info.num_classes, seed=0)
    return x, y, info, model


def test_rank_candidates_is_algorithm_3_and_dirac_on_dead_coordinate_closed_form():
    x, y, info, model = _digits_setup()
    loss = nn.functional.cross_entropy
    ranking = rank_candidates(model, (x[:200], y[:200]), (x[200:260], y[200:260]), loss, 1.0)
    ref = per_sample_clipped_grads(model, x[:200], y[:200], loss, 1.0)
    cand = per_sample_clipped_grads(model, x[200:260], y[200:260], loss, 1.0)
    op = estimate_precision(ref, "ledoit_wolf")
    np.testing.assert_allclose(ranking.scores, mahalanobis_scores(cand, op).numpy(), rtol=1e-5)
    # weight (class 0, pixel p) with p a pixel that is identically zero in the data: no
    # reference gradient has mass there (mu_j = 0, C e_j = 0), so P e_j = e_j / rho and the
    # Dirac of norm C scores ||C e_j - mu||_P^2 = C^2 / rho + ||mu||_P^2.
    pixel = info.extra["zero_features"][0]
    op = ranking.precision
    dirac = dirac_canaries(op.dim, [pixel], norm=1.0)
    m = float(mahalanobis_scores(dirac, op)[0])
    assert m == pytest.approx(1.0 / op.ridge + float(op.mahalanobis(op.mean)), rel=1e-4)
    assert m > ranking.scores.max()


def test_selection_strategies_known_answers():
    scores = np.array([5.0, 1.0, 9.0, 3.0, 7.0, 0.0, 8.0, 2.0, 6.0, 4.0])  # a permutation
    assert select_canaries(scores, "top", k=2).indices.tolist() == [2, 6]
    emh = select_canaries(scores, "easy_medium_hard", k=2)
    groups = emh.by_label()
    assert groups["easy"].tolist() == [2, 6]
    assert sorted(scores[groups["medium"]].tolist()) == [4.0, 5.0]  # the two around the median
    assert groups["hard"].tolist() == [5, 1]
    strat = select_canaries(scores, "stratified", k=1, num_strata=5, seed=3)
    for j, idx in enumerate(strat.indices):  # stratum j holds scores {2j, 2j + 1}
        assert scores[idx] in (2 * j, 2 * j + 1)
        assert strat.labels[j] == f"stratum_{j}"
    assert np.array_equal(
        strat.indices, select_canaries(scores, "stratified", k=1, num_strata=5, seed=3).indices
    )
    capped = select_canaries(scores, "in_distribution", k=2, cap_quantile=0.5)
    assert scores[capped.indices].tolist() == [4.0, 3.0]  # highest at or below the median 4.5
    with pytest.raises(ValueError, match="strategy"):
        select_canaries(scores, "random")
    with pytest.raises(ValueError, match="seed"):
        select_canaries(scores, "stratified", k=1)
    with pytest.raises(ValueError, match="at least"):
        select_canaries(scores, "easy_medium_hard", k=4)
    with pytest.raises(ValueError, match="non-finite"):
        select_canaries(np.array([1.0, np.nan]), "top")


def test_candidate_sources():
    x, y, info, _ = _digits_setup()
    ind = in_distribution(x, y, num=30, seed=1)
    assert len(ind) == 30 and torch.equal(ind.inputs, x[torch.as_tensor(ind.source)])
    mis = mislabeled(x, y, num_classes=10, num=30, seed=1)
    assert torch.all(mis.targets != y[torch.as_tensor(mis.source)])
    assert torch.all((mis.targets >= 0) & (mis.targets < 10))
    blank = blank_inputs(info.input_shape, 10)
    assert blank.inputs.shape == (10, *info.input_shape) and float(blank.inputs.abs().sum()) == 0
    both = InputCandidates.concat([ind, mis, blank])
    assert len(both) == 70 and both.kind[-1] == "blank" and both.subset([0, 69]).kind[1] == "blank"
    dirac = dirac_canaries(50, [3, 7], norm=2.0)
    assert torch.allclose(dirac.norm(dim=1), torch.full((2,), 2.0))
    rnd = random_direction_canaries(50, 4, norm=1.5, seed=0)
    assert torch.allclose(rnd.norm(dim=1), torch.full((4,), 1.5))
    assert torch.equal(rnd, random_direction_canaries(50, 4, norm=1.5, seed=0))
    clipped = scale_to_norm(torch.tensor([[3.0, 4.0], [0.3, 0.4]]), 1.0, clip_only=True)
    assert torch.allclose(clipped.norm(dim=1), torch.tensor([1.0, 0.5]))
    with pytest.raises(ValueError, match="coordinates"):
        dirac_canaries(5, [5], 1.0)
    with pytest.raises(ValueError, match="seed"):
        in_distribution(x, y, num=3, seed=None)


def test_input_source_registry():
    """Every registered source builds candidates from the training data with the audit's
    caps; only in_distribution's candidates are training rows held out of the data."""
    x, y, _, _ = _digits_setup()
    sizes = {"in_distribution": 40, "mislabeled": 40, "blank": 10, "crafted": 40,
             "crafted_distinct": 40}
    assert set(INPUT_SOURCES) == set(sizes)
    for name, source in INPUT_SOURCES.items():
        cand = source.make(x, y, 10, 40, np.random.default_rng(0), 5.0)
        assert len(cand) == sizes[name] and set(cand.kind) == {name}
        assert source.held_out == (name == "in_distribution")
    held = INPUT_SOURCES["in_distribution"].make(x, y, 10, 10**6, np.random.default_rng(0), 1.0)
    assert len(held) == len(x) // 2  # at most half the training data is held out
    crafted = INPUT_SOURCES["crafted"].make(x, y, 10, 10**6, None, 5.0)
    assert len(crafted) == 64 * 10 and float(crafted.inputs.max()) == 5.0


def test_rank_along_trajectory_puts_planted_outlier_first_every_step():
    """Seed 000 Algorithm 6: an input with mass on dead pixels is the farthest at every step."""
    x, y, info, model = _digits_setup()
    cands_x = x[300:320].clone()
    dead = info.extra["zero_features"]
    planted = cands_x[7].clone().reshape(-1)
    planted[dead] = 25.0
    cands_x[7] = planted.reshape(info.input_shape)
    before = [p.detach().clone() for p in model.parameters()]
    kwargs = dict(
        num_canaries=3,
        steps=4,
        sample_rate=0.5,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        lr=0.5,
        seed=11,
    )
    loss = nn.functional.cross_entropy
    out = rank_along_trajectory(model, (x[:300], y[:300]), (cands_x, y[300:320]), loss, **kwargs)
    assert out.steps_used == 4
    assert out.selected[0] == 7
    assert out.rank_sum[7] == 19 * out.steps_used  # the top rank (n_c - 1) at every step
    again = rank_along_trajectory(model, (x[:300], y[:300]), (cands_x, y[300:320]), loss, **kwargs)
    assert np.array_equal(out.rank_sum, again.rank_sum)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_predicted_leakage_closed_form_and_epoch_sum_simulation():
    """Per-step / composed mu match the closed forms; the epoch-summed covariance score's AUC
    in a Gaussian simulation (T = 10 steps, one inclusion, 4000 runs per side) matches the
    predicted AUC within 0.03."""
    rng, q, _, cov = _anisotropic(d=6, seed=1)
    mu = rng.normal(size=6)
    g = torch.tensor(np.stack([mu + 0.5 * q[:, 0], mu + 0.2 * q[:, -1]]))
    base = DensePrecision(torch.tensor(mu), torch.tensor(cov))
    sigma, clip, b, steps = 0.05, 1.0, 8.0, 10
    pred = predicted_leakage(g, base, sigma, clip, b, inclusions=3, total_steps=steps)
    sig = cov + sigma**2 * clip**2 / b * np.eye(6)
    diff = g.numpy() - mu
    m = np.einsum("kd,de,ke->k", diff, np.linalg.inv(sig), diff) / b
    np.testing.assert_allclose(pred.m_tilde, m, rtol=1e-9)
    np.testing.assert_allclose(pred.mu_composed, np.sqrt(3 * m), rtol=1e-9)
    assert pred.epsilon[0] == pytest.approx(gdp_epsilon(np.sqrt(3 * m[0]), 1e-5))
    np.testing.assert_allclose(pred.auc_summed_score, [gdp_auc(3 * np.sqrt(x / steps)) for x in m])

    one = predicted_leakage(g[:1], base, sigma, clip, b, inclusions=1, total_steps=steps)
    op = noise_aware(base, sigma, clip, b)
    a = op.apply(g[:1] - op.mean).numpy()[0]
    n = 4000
    noise = rng.multivariate_normal(np.zeros(6), sig / b, size=(2, n, steps))
    shift = np.zeros((2, n, steps, 6))
    shift[1, np.arange(n), rng.integers(0, steps, size=n)] = diff[0] / b  # one inclusion
    s = ((noise + shift) @ a - a @ diff[0] / (2 * b)).sum(axis=2)
    assert auc(s[1], s[0]) == pytest.approx(float(one.auc_summed_score[0]), abs=0.03)
    assert float(one.auc_summed_score[0]) == pytest.approx(ndtr(np.sqrt(m[0] / steps) / np.sqrt(2)))


def test_heldout_prediction_is_one_when_the_estimate_is_the_heldout_covariance():
    """heldout_ratio = sqrt(q / v) is exactly 1 when the estimator's covariance is the held-out
    rows' (unbiased) covariance, and exactly 1/2 when the held-out spread is twice the
    estimate's (without DP noise)."""
    rng = np.random.default_rng(3)
    held = torch.tensor(rng.normal(size=(50, 5)) @ rng.normal(size=(5, 5)))
    mean = held.mean(0)
    base = DensePrecision(mean, torch.cov(held.T))  # torch.cov: the unbiased (n - 1) estimate
    g = torch.tensor(rng.normal(size=(3, 5)))
    pred = predicted_leakage(g, base, 0.3, 1.0, 4.0, total_steps=5, heldout_grads=held)
    np.testing.assert_allclose(pred.heldout_ratio, 1.0, rtol=1e-9)
    np.testing.assert_allclose(pred.auc_summed_score_heldout, pred.auc_summed_score, rtol=1e-9)
    wide = mean + 2.0 * (held - mean)
    half = predicted_leakage(
        g, base, 0.3, 1.0, 4.0, total_steps=5, heldout_grads=wide, add_noise=False
    )
    np.testing.assert_allclose(half.heldout_ratio, 0.5, rtol=1e-9)
    with pytest.raises(ValueError, match="heldout_grads"):
        predicted_leakage(g, base, 0.3, 1.0, 4.0, heldout_grads=held)  # no total_steps


def test_heldout_prediction_matches_a_simulation_where_the_estimate_is_wrong():
    """The data's covariance is not the estimate's (the estimate is isotropic, the truth is
    not): the epoch-summed covariance score, simulated with the true covariance (T = 10, one
    inclusion, 4000 runs per side), has the AUC that the held-out prediction gives within 0.03,
    while the plug-in prediction misses it by more than 0.05."""
    rng, q, _, cov = _anisotropic(d=6, seed=2)
    mu = rng.normal(size=6)
    est = DensePrecision(torch.tensor(mu), torch.tensor(np.eye(6) * np.trace(cov) / 6))
    sigma, clip, b, steps = 0.05, 1.0, 8.0, 10
    g = torch.tensor(mu + 0.6 * q[:, 0])[None]
    held = torch.tensor(rng.multivariate_normal(mu, cov, size=20000))
    pred = predicted_leakage(g, est, sigma, clip, b, total_steps=steps, heldout_grads=held)
    op = noise_aware(est, sigma, clip, b)
    diff = g.numpy()[0] - mu
    a = op.apply(g - op.mean).numpy()[0]
    sig = cov + sigma**2 * clip**2 / b * np.eye(6)
    n = 4000
    noise = rng.multivariate_normal(np.zeros(6), sig / b, size=(2, n, steps))
    shift = np.zeros((2, n, steps, 6))
    shift[1, np.arange(n), rng.integers(0, steps, size=n)] = diff / b
    s = ((noise + shift) @ a).sum(axis=2)
    measured = auc(s[1], s[0])
    assert measured == pytest.approx(float(pred.auc_summed_score_heldout[0]), abs=0.03)
    assert abs(measured - float(pred.auc_summed_score[0])) > 0.05
