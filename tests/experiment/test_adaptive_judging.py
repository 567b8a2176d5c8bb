"""Adaptive clipping's release judged (``experiment.judging.adaptive``) on records simulated
from the update rule: the count-noise test is calibrated (uniform p-values at the claimed
std, over 2,000 simulated runs) and rejects a count noised at half its std or not at all;
the bound check passes the rule and names a bound moved by the true count; the accounting
check's composition is the closed form sigma_1 = (sigma_g^-2 + sigma_u^-2)^(-1/2) and only
ever warns."""

import numpy as np
import pytest

from dpaudit.capture.records import AdaptiveRecord
from dpaudit.experiment.judging.adaptive import (
    accounting_check,
    bound_check,
    count_noise_test,
    describe_adaptive,
)
from dpaudit.experiment.judging.clipping import clipping_cost

SIGMA, SIGMA_U = 1.0, 2.0


def simulate(seed: int, steps: int = 50, count_std: float = SIGMA_U, true_update=False):
    """An AdaptiveRecord from Opacus' rule: counts ~ Binomial(size, 0.6), the bound updated by
    the noisy count (or, ``true_update``, by the true one)."""
    rng = np.random.default_rng(seed)
    sizes = rng.binomial(640, 0.05, steps).astype(float)
    counts = rng.binomial(sizes.astype(int), 0.6).astype(float)
    noisy = counts + count_std * rng.standard_normal(steps)
    bounds, c = [], 1.0
    for t in range(steps):
        bounds.append(c)
        used = counts[t] if true_update else noisy[t]
        c = float(np.clip(c * np.exp(-0.2 * (used / sizes[t] - 0.5)), 0.01, 100.0))
    sigma_g = (SIGMA**-2 - (2 * SIGMA_U) ** -2) ** -0.5
    return AdaptiveRecord(sigma=SIGMA, sigma_gradient=sigma_g, sigma_count=SIGMA_U,
                          target_quantile=0.5, learning_rate=0.2, min_bound=0.01,
                          max_bound=100.0, bounds=np.array(bounds), counts=counts,
                          noisy_counts=noisy, sizes=sizes, next_bound=c)


def test_count_noise_p_values_are_uniform_at_the_claimed_std():
    p = np.array([count_noise_test(simulate(s), 1e-6).p_value for s in range(2000)])
    # P(p < a) = a for a continuous exact null: within 4 binomial s.e. at three levels
    for a in (0.01, 0.1, 0.5):
        se = np.sqrt(a * (1 - a) / p.size)
        assert abs((p < a).mean() - a) < 4 * se, (a, (p < a).mean())


@pytest.mark.parametrize("std", [SIGMA_U / 2, 0.0])
def test_count_noise_rejects_a_count_with_less_noise(std):
    res = count_noise_test(simulate(0, steps=100, count_std=std), 1e-6)
    assert res.rejected and res.p_value < 1e-6
    assert "count noise" in describe_adaptive(res)


def test_the_bound_check_passes_the_rule_and_names_a_bound_moved_by_the_true_count():
    ok = bound_check(simulate(1))
    assert not ok.rejected and ok.details["largest_gap"] < 1e-12
    bad = bound_check(simulate(1, true_update=True))
    assert bad.rejected
    w = bad.witness
    assert w["step"] == 0 and w["bound"] == pytest.approx(w["from_true_count"], rel=1e-12)
    assert "from the true count" in describe_adaptive(bad)


def test_accounting_is_the_closed_form_and_only_warns():
    rec = simulate(2)
    res = accounting_check(rec, 0.05, 1e-5)
    one = (rec.sigma_gradient**-2 + SIGMA_U**-2) ** -0.5
    # sigma_g^-2 + sigma_u^-2 = sigma^-2 + (3/4) sigma_u^-2: the count of sensitivity 1
    assert one**-2 == pytest.approx(SIGMA**-2 + 0.75 * SIGMA_U**-2, rel=1e-12)
    assert res.witness["sigma_sensitivity_one"] == pytest.approx(one, rel=1e-12)
    want = clipping_cost(SIGMA / one, [SIGMA] * rec.bounds.size, 0.05, 1e-5)
    assert res.witness["implied_epsilon"] == pytest.approx(want["implied_epsilon"], rel=1e-12)
    assert res.witness["epsilon_excess"] > 0
    assert not res.rejected and res.warning
