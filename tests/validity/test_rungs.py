"""The threat-model ladder's rungs in the validity suite (``dpaudit.validity.rungs``): their
truth against an independent computation, and every certified method and the claim test on
them (the slow tier): above the truth in at most 5% of the repetitions, up to 3 standard
errors of a fraction at that rate."""

import numpy as np
import pytest

from dpaudit.stats import METHOD_REGISTRY, gdp_epsilon
from dpaudit.validity import claim_study, validity_study
from dpaudit.validity.rungs import (
    RUNG_SCENARIOS,
    BlackBoxFinalLoss,
    HiddenStateAdam,
    HiddenStateMomentum,
)

CERTIFIED = [m for m, s in METHOD_REGISTRY.items() if s.assumption is None]


def test_momentum_view_is_the_gaussian_shift_of_its_weights():
    """theta_T of SGD with momentum is a fixed linear map of the releases: the weights by a
    direct recursion on unit impulses, and the sample's mean shift in units of its sd."""
    s = HiddenStateMomentum(noise=6.0, steps=30, beta=0.8)
    impulses = np.eye(30)  # release s alone = 1: theta_T moves by -w_s
    np.testing.assert_allclose(s._score(impulses), s.weights, rtol=1e-12)
    w = s.weights
    assert s.truth_mu == pytest.approx(np.sqrt(30) / 6.0 * w.sum() / np.sqrt(30 * (w * w).sum()))
    a, b = s.sample(20000, 20000, np.random.default_rng(0))
    assert (a.mean() - b.mean()) / b.std() == pytest.approx(s.truth_mu, abs=0.05)
    plain = HiddenStateMomentum(noise=3.0, steps=25, beta=0.0)
    assert plain.truth_mu == pytest.approx(25**0.5 / 3.0)  # plain SGD: the white box's mu
    assert plain.true_epsilon(1e-5) == pytest.approx(gdp_epsilon(25**0.5 / 3.0, 1e-5))


def test_bounded_views_do_not_beat_the_composition():
    """Adam and the black box carry at most the composition's mu (simulated AUC's binormal
    mu, 4,000 per side: s.e. about 0.03); a smaller value is what post-processing costs."""
    from scipy.special import ndtri

    from dpaudit.stats import auc

    for s in (HiddenStateAdam(noise=6.0, steps=100), BlackBoxFinalLoss(noise=5.0, steps=100)):
        a, b = s.sample(4000, 4000, np.random.default_rng(1))
        mu = np.sqrt(2) * ndtri(auc(a, b))
        assert 0.5 * s.truth_mu < mu < s.truth_mu + 0.12, (s.name, mu, s.truth_mu)
    assert "upper bound" in HiddenStateAdam.exactness


@pytest.mark.slow
def test_certified_methods_stay_below_the_rungs_truth(record_property):
    rows = validity_study(CERTIFIED, RUNG_SCENARIOS, reps=200, n_in=1000, n_out=1000,
                          delta=1e-5, seed=3)
    bad = []
    for r in rows:
        record_property(f"{r['method']}|{r['scenario']}", r["frac_above"])
        if r["kind"] == "certified" and r["frac_above"] > r["nominal"] + 3 * r["nominal_se"]:
            bad.append((r["method"], r["scenario"], r["frac_above"]))
    assert bad == []
    assert {r["kind"] for r in rows} <= {"certified", "not applicable"}


@pytest.mark.slow
def test_claim_test_keeps_its_level_on_the_rungs():
    rows = claim_study(RUNG_SCENARIOS, reps=200, n_in=1000, n_out=1000, seed=4)
    for r in rows:
        assert r["frac_rejected"] <= r["nominal"] + 3 * r["nominal_se"], r
