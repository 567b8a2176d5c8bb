"""The score's exact law and its simulator (``stats.data_rate.law`` / ``simulate``): closed
forms at T = 1, the hook's own ``MixtureLR``, exact simulation, the accountant."""

import numpy as np
import pytest
import torch
from scipy.special import ndtr
from scipy.stats import kstwo

from dpaudit.accounting import prv_epsilon
from dpaudit.attacks.base import StepContext
from dpaudit.attacks.mixture import MixtureLR
from dpaudit.stats.data_rate import mixture_score_law, simulate_mixture_scores, step_log_lr

Q, SIGMA = 0.1, 1.0


def _ks_p(sample, cdf):
    x = np.sort(sample)
    n = x.size
    f = cdf(x)
    d = max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))
    return float(kstwo.sf(d, n))


def test_one_step_law_is_the_closed_form():
    # T = 1: P(l(u) < x) = Phi(u(x)) for a non-member, u(x) = l's inverse; the grid's cells
    # have width sd / 4000, so the CDFs agree to a cell's mass (< 1e-3)
    law = mixture_score_law(1, Q, SIGMA)
    d = 1.0 / SIGMA
    x = np.linspace(np.log1p(-Q) + 0.01, 1.5, 50)
    u = (np.log(np.expm1(x) + Q) - np.log(Q) + d * d / 2) / d
    assert np.allclose(law.cdf_out(x), ndtr(u), atol=1e-3)
    member = (1 - Q) * ndtr(u) + Q * ndtr(u - d)
    assert np.allclose(law.cdf_in(x), member, atol=1e-3)


def test_step_score_is_the_hooks_mixture_lr():
    # the simulator's per-step score equals MixtureLR.step on the same release: a Dirac canary
    # of norm C on coordinate j sees u = released_j * divisor / (sigma C)
    rng = np.random.default_rng(0)
    sigma, c, divisor, q = 1.3, 0.7, 64.0, 0.05
    scorer = MixtureLR(inclusion_prob=q)
    total_hook = np.zeros(3)
    total_ours = np.zeros(3)
    grads = torch.zeros(3, 5, dtype=torch.float64)
    grads[0, 0] = grads[1, 2] = grads[2, 4] = c  # three Dirac canaries of norm C
    for step in range(4):
        u = rng.standard_normal(5) + (rng.random(5) < q) / sigma
        released = torch.tensor(u * sigma * c / divisor)
        ctx = StepContext(step=step, noise_multiplier=sigma, max_grad_norm=c, divisor=divisor,
                          sample_rate=q)
        total_hook += scorer.step(grads, released, ctx).numpy()
        total_ours += step_log_lr(u[[0, 2, 4]], q, 1.0 / sigma)
    assert np.allclose(total_hook, total_ours, rtol=1e-12, atol=1e-12)


def test_simulated_scores_follow_the_law():
    # 20,000 exact draws per side at T = 50 against the law's CDFs (KS, p > 1e-3)
    law = mixture_score_law(50, Q, SIGMA)
    s_in, s_out = simulate_mixture_scores(20_000, 20_000, steps=50, sample_rate=Q,
                                          noise_multiplier=SIGMA,
                                          rng=np.random.default_rng(1), chunk=100_000)
    assert _ks_p(s_in, law.cdf_in) > 1e-3
    assert _ks_p(s_out, law.cdf_out) > 1e-3


def test_a_mismatched_mechanism_is_simulated_and_computed_alike():
    # less noise than claimed, scored with the claim's parameters: both shift down
    law = mixture_score_law(30, Q, SIGMA, true_noise=0.6)
    s_in, s_out = simulate_mixture_scores(20_000, 20_000, steps=30, sample_rate=Q,
                                          noise_multiplier=SIGMA, true_noise=0.6,
                                          rng=np.random.default_rng(2))
    assert _ks_p(s_in, law.cdf_in) > 1e-3
    assert _ks_p(s_out, law.cdf_out) > 1e-3
    assert law.mean(False) < mixture_score_law(30, Q, SIGMA).mean(False)


def test_exact_epsilon_sits_just_below_the_prv_accountant():
    # Opacus' PRV returns its upper estimate (eps_error 0.01): the exact pair's epsilon at
    # delta is below it by at most that, and the hockey stick there is <= delta
    steps, q, sigma = 224, 0.0445, 1.0563408
    law = mixture_score_law(steps, q, sigma)
    exact = law.epsilon(1e-5)
    prv = prv_epsilon(sigma, q, steps, 1e-5)
    assert prv - 0.02 <= exact <= prv
    d1, d2 = law.hockey_stick(exact)
    assert d1[0] <= 1e-5 and d2[0] <= 1e-5


def test_finer_grid_changes_the_rates_by_less_than_1e_4():
    coarse = mixture_score_law(100, Q, SIGMA)
    fine = mixture_score_law(100, Q, SIGMA, resolution=8000)
    t = np.linspace(-2, 4, 13)
    assert np.allclose(coarse.sf_out(t), fine.sf_out(t), atol=1e-4)
    assert np.allclose(coarse.sf_in(t), fine.sf_in(t), atol=1e-4)


def test_roc_is_a_roc():
    law = mixture_score_law(100, Q, SIGMA)
    x = np.linspace(0, 1, 201)
    r = law.roc(x)
    assert np.all(np.diff(r) >= -1e-12) and np.all(r >= x - 1e-9) and r[-1] == pytest.approx(1)
    y = law.roc_reverse(x)
    assert np.all(np.diff(y) >= -1e-12) and np.all(y >= x - 1e-9)


@pytest.mark.parametrize("kwargs, name", [
    ({"steps": 0}, "steps"), ({"sample_rate": 1.0}, "sample_rate"),
    ({"noise_multiplier": -1.0}, "noise_multiplier"), ({"true_rate": 1.5}, "true_rate"),
])
def test_bad_arguments_name_the_parameter(kwargs, name):
    args = {"steps": 10, "sample_rate": 0.1, "noise_multiplier": 1.0} | kwargs
    with pytest.raises(ValueError, match=name):
        mixture_score_law(args.pop("steps"), args.pop("sample_rate"),
                          args.pop("noise_multiplier"), **args)
    args = {"steps": 10, "sample_rate": 0.1, "noise_multiplier": 1.0} | kwargs
    with pytest.raises(ValueError, match=name):
        simulate_mixture_scores(3, 3, rng=np.random.default_rng(0), **args)
