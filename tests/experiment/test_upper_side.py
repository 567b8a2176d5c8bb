"""The upper side on hand-built records (``experiment.judging.premises``, issue 65): composed
step by step from each step's smallest tensor's lower end, never with GDP (a GDP claim's
shortfall against PRV named), per-layer clipping combined per layer, adaptive clipping's
gradient and count composed at their measured scales with the count's sensitivity 1."""

from __future__ import annotations

import numpy as np
import pytest
from opacus.accountants.utils import get_noise_multiplier

from dpaudit.accounting import prv_history_bounds, rdp_history_epsilon
from dpaudit.capture.records import (
    AdaptiveRecord,
    NoiseRun,
    NoiseStep,
    StepRecord,
    WhiteBoxRecords,
)
from dpaudit.experiment.judging import noise_scale as ns
from dpaudit.experiment.judging.premises import (
    COUNT_SENSITIVITY,
    effective_multipliers,
    training_data_block,
)
from dpaudit.experiment.judging.user_claim import claim_of_run

N, Q, T = 1000, 0.05, 40
DIMS = [3000, 200, 10]


def _records(sigma=1.0, scales=(1.0, 1.0, 1.0), seed=0, accountant="prv", history=None,
             layer_bounds=None, adaptive=None, clip_ratio=1.0):
    """Records of T steps: each tensor's noise chi-square at its true ``scales``, batches of
    exactly n q examples, clipping probed at ``clip_ratio``."""
    rng = np.random.default_rng(seed)
    d = np.asarray(DIMS, dtype=float)
    names = ["w", "v", "b"]
    steps = []
    for t in range(T):
        sq = np.asarray(scales) ** 2 * rng.chisquare(d)
        noise = NoiseStep(sq=sq, m4=np.zeros(3), counts=np.zeros(1), rounding=0.0,
                          lag_z={}, lag_at={}, sketch=np.zeros(1), sketch_error=0.0)
        c = 1.0 if adaptive is None else float(adaptive.bounds[t])
        g = sigma if adaptive is None else adaptive.sigma_gradient
        steps.append(StepRecord(step=t, noise_std=g * c, divisor=1.0,
                                batch_size=int(N * Q), released_sq=np.ones(3), noise=noise,
                                clip_bound=None if adaptive is None else c))
    run = NoiseRun(names=names, dims=DIMS, source="test", vectors={}, lags={}, run_z={},
                   heads=[], fold=1, tensor_counts=np.zeros((3, 1)), segments=[])
    return WhiteBoxRecords(
        names=names, dims=DIMS, max_grad_norm=1.0, steps=tuple(steps), noise=run,
        clipping={"probes": 20, "max_ratio_single": clip_ratio,
                  "max_ratio_leave_one_out": None, "steps_checked": 10},
        sampling={"n": N, "q": Q, "loader": "poisson"},
        accountant_history=history or [(sigma, Q, T)], accountant=accountant,
        layer_bounds=layer_bounds, adaptive=adaptive)


def _block(records, training=None):
    claim = claim_of_run(training, delta=1e-5, accountant=records.accountant,
                         history=records.accountant_history)
    return training_data_block(records, {}, claim)


def test_the_upper_side_composes_each_steps_smallest_tensor():
    """The bias (10 coordinates) at 0.9 x the claim: each step is bounded by it (too few
    draws, named, binding), and the upper side is PRV on that history: above the true
    epsilon (every step at sigma 0.9, q as claimed), while the one-scale figure, which pools
    the bias away, is below it."""
    rec = _records(scales=(1.0, 1.0, 0.9), seed=1)
    td = _block(rec)
    true = prv_history_bounds([(0.9, Q, T)], 1e-5)[2]
    assert td["epsilon_upper"] >= true > td["epsilon_upper_one_scale"]
    noise = {p["name"]: p for p in td["premises"]}["noise_multiplier"]
    assert noise["too_few_draws"] == ["b"] and td["upper_noise"]["binding"] == ["b"]
    history = td["upper_design"]["history"]
    assert td["epsilon_upper"] == pytest.approx(prv_history_bounds(history, 1e-5)[2],
                                                rel=1e-12)
    assert td["upper_accountant"] == "prv" and "claim_shortfall" not in td
    # the rate's share and the noise's add up to 5%, chosen from the design
    design = td["upper_design"]
    assert design["alpha_noise"] + design["alpha_rate"] == pytest.approx(0.05)
    assert design["noise_share"] in ns.SHARES


def test_a_gdp_claim_is_checked_against_prv_and_the_upper_side_never_uses_gdp():
    """The engine on the GDP accountant, sigma chosen for GDP epsilon 4: PRV's lower end on the
    same history is above the claim, so the claim is named as no upper bound, by how much;
    the upper side is PRV's (with a note), above PRV's own epsilon of the history."""
    sigma = get_noise_multiplier(target_epsilon=4.0, target_delta=1e-5, sample_rate=Q,
                                 steps=T, accountant="gdp")
    rec = _records(sigma=sigma, accountant="gdp", seed=2)
    claimed = {"gdp": {"epsilon": 4.0}}
    td = _block(rec, claimed)
    short = td["claim_shortfall"]
    lower, _, upper = prv_history_bounds([(sigma, Q, T)], 1e-5)
    assert short["epsilon_sound_lower"] == pytest.approx(lower)
    assert short["epsilon_sound"] == pytest.approx(upper)
    assert short["claim_is_upper_bound"] is False and short["ratio"] > 1.05
    assert short["shortfall"] == pytest.approx(lower - 4.0)
    assert td["upper_accountant"] == "prv" and "GDP" in td["upper_accountant_note"]
    assert td["epsilon_upper"] > upper
    # an RDP user keeps RDP, an upper bound too
    td = _block(_records(accountant="rdp", seed=2), {"rdp": {"epsilon": 1.0}})
    assert td["upper_accountant"] == "rdp" and "claim_shortfall" not in td
    history = td["upper_design"]["history"]
    assert td["epsilon_upper"] == pytest.approx(rdp_history_epsilon(history, 1e-5))


def test_per_layer_clipping_combines_the_layers():
    """Per-layer bounds C_p^2 / C^2 = 0.5, 0.3, 0.2 with the bias at 0.9: each step's scale is
    (sum_p w_p / lb_p^2)^(-1/2), less pessimistic than the smallest tensor's, and the probes'
    per-part ratio scales every part."""
    bounds = tuple(np.sqrt([0.5, 0.3, 0.2]))
    rec = _records(scales=(1.0, 1.0, 0.9), seed=3, layer_bounds=bounds)
    flat = _records(scales=(1.0, 1.0, 0.9), seed=3)
    td, tf = _block(rec), _block(flat)
    assert td["upper_noise"]["rule"] == ns.PER_LAYER and tf["upper_noise"]["rule"] == ns.FLAT
    assert td["epsilon_upper"] < tf["epsilon_upper"]
    true = 1 / np.sqrt(0.5 + 0.3 + 0.2 / 0.81)
    assert td["epsilon_upper"] >= prv_history_bounds([(true, Q, T)], 1e-5)[2]
    scales = ns.measured_scales(rec, 0.02)
    lows = {t["tensor"]: t for t in scales.tensors}
    assert lows["b"]["runs"] == 1 and scales.atoms is None  # every cell counted


def test_adaptive_clipping_composes_gradient_and_count():
    """Adaptive clipping: the step releases the clipped sum (noise sigma_g C_t) and the count
    (noise sigma_u): at the measured lower ends r, r_u and clipping factor k, the step is the
    Gaussian step at (k^2 / (sigma_g r)^2 + 1 / (sigma_u r_u)^2)^(-1/2) (count sensitivity 1,
    Opacus' 0-or-1 count), below the claim's sigma even when everything is as claimed; a
    clipping factor above 1 scales the gradient's part only."""
    sigma, sigma_u = 1.0, 3.2
    sigma_g = (sigma**-2 - (2 * sigma_u) ** -2) ** -0.5
    rng = np.random.default_rng(4)
    counts = rng.integers(10, 40, T).astype(float)
    rec = AdaptiveRecord(sigma=sigma, sigma_gradient=sigma_g, sigma_count=sigma_u,
                         target_quantile=0.5, learning_rate=0.2, min_bound=0.01,
                         max_bound=100.0, bounds=np.linspace(1.0, 0.5, T), counts=counts,
                         noisy_counts=counts + sigma_u * rng.standard_normal(T),
                         sizes=np.full(T, 50.0), next_bound=0.5)
    records = _records(adaptive=rec, seed=5, clip_ratio=1.02)
    rho = np.full(T, 0.97)
    got = effective_multipliers(records, rho, {"ratio": 1.02}, 0.8)
    want = (1.02**2 / (sigma_g * 0.97) ** 2 + (COUNT_SENSITIVITY / (sigma_u * 0.8)) ** 2) ** -0.5
    np.testing.assert_allclose(got, want, rtol=1e-12)
    one = (sigma_g**-2 + sigma_u**-2) ** -0.5  # everything as claimed, count sensitivity 1
    np.testing.assert_allclose(effective_multipliers(records, np.ones(T), {"ratio": 1.0}, 1.0),
                               one, rtol=1e-12)
    assert one < sigma
    td = _block(records)
    up = td["adaptive_upper"]
    assert up["count_sensitivity"] == 1.0 and 0.5 < up["count_noise_lower"] < 1.0
    assert up["clip_factor"] == pytest.approx(1.02)
    assert td["epsilon_upper"] > prv_history_bounds([(one, Q, T)], 1e-5)[2]
    assert td["upper_design"]["alpha_count"] > 0
