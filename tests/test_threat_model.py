"""ThreatModel: the claim's curve, accountants and exact answers, and its input checks."""

import numpy as np
import pytest

from dpaudit.accounting import accountant_epsilon, subsampled_gaussian_tradeoff
from dpaudit.stats import gdp_epsilon, gdp_tradeoff
from dpaudit.threat_model import ThreatModel


def every_step(**kw):
    args = {"noise_multiplier": 6.0, "max_grad_norm": 1.0, "sample_rate": 1.0, "steps": 100,
            "delta": 1e-5, "canary_kind": "gradient"}
    args.update(kw)
    return ThreatModel(**args)


def test_every_step_claim_is_the_gaussian_mechanism():
    t = every_step()
    assert t.mu() == pytest.approx(10 / 6)
    assert t.claimed_epsilon() == pytest.approx(gdp_epsilon(10 / 6, 1e-5))
    alpha = np.array([1e-4, 1e-2, 0.3])
    np.testing.assert_allclose(t.tradeoff(alpha), 1 - gdp_tradeoff(alpha, 10 / 6), rtol=1e-12)


def test_canary_norm_scales_the_sensitivity():
    half = every_step(canary_norm=0.5)
    assert half.mu() == pytest.approx(0.5 * 10 / 6)
    assert half.effective_noise() == pytest.approx(12.0)
    with pytest.raises(ValueError, match="canary_norm"):
        every_step(canary_norm=1.01)


def test_subsampled_claim_is_prv_and_a_lower_trade_off_than_its_epsilon_lines():
    t = every_step(noise_multiplier=1.0, sample_rate=0.05, steps=200)
    prv = accountant_epsilon(1.0, 0.05, 200, 1e-5, "prv").epsilon
    assert t.claimed_epsilon() <= prv + 1e-9
    alpha = np.logspace(-6, -0.01, 30)
    beta = t.tradeoff(alpha)
    # (eps, delta)-DP implies FNR >= 1 - delta - e^eps FPR: the claimed curve never says less
    # privacy than that... and it is the same curve as the plotted ROC upper curve.
    assert np.all(beta >= 1 - 1e-5 - np.exp(prv) * alpha - 1e-9)
    np.testing.assert_allclose(
        1 - beta, subsampled_gaussian_tradeoff(alpha, 1.0, 0.05, 200), atol=1e-12
    )
    assert np.all(np.diff(beta) <= 1e-12)  # decreasing


def test_curves_increase_with_noise():
    for t in (every_step(), every_step(noise_multiplier=1.0, sample_rate=0.1, steps=50)):
        alpha = np.array([1e-3, 0.05, 0.5])
        assert np.all(t.tradeoff(alpha, 2 * t.noise_multiplier) >= t.tradeoff(alpha) - 1e-12)


def test_clt_guess_inverts_mu():
    t = every_step()
    assert t.clt_noise_for_mu(t.mu()) == pytest.approx(6.0)
    sub = every_step(noise_multiplier=2.0, sample_rate=0.1, steps=1000)
    mu = 0.1 * np.sqrt(1000 * np.expm1(1 / 4))
    assert sub.clt_noise_for_mu(mu) == pytest.approx(2.0)


def test_round_trip_and_description():
    t = every_step(training_sample_rate=0.05)
    assert ThreatModel.from_dict(t.to_dict()) == t
    assert "every step" in t.describe() and "sigma=6" in t.describe()
    assert "with probability q=0.1" in every_step(sample_rate=0.1).describe()


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": float("inf")}, "noise_multiplier"),
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"steps": 0}, "steps"),
        ({"delta": 0.0}, "delta"),
        ({"canary_kind": "data"}, "canary_kind"),
    ],
)
def test_bad_values_name_the_field(kw, name):
    with pytest.raises(ValueError, match=name):
        every_step(**kw)
