"""Designs fixed from the claim, the plan of every statement, the ceilings
(``stats.data_rate.design`` / ``plan`` / ``ceiling``, ``forecast.data_rate_*``)."""

import json

import numpy as np
import pytest

from dpaudit.forecast import data_rate_ceiling, data_rate_evidence, data_rate_plan
from dpaudit.stats.data_rate import (
    RankDesign,
    certify_epsilon_at,
    count,
    count_ceiling,
    critical_value,
    design_epsilon,
    mixture_score_law,
    np_power,
    power,
    simulate_mixture_scores,
    statistic_law,
    universal_ceiling,
)
from dpaudit.threat_model import ThreatModel

STEPS, Q, SIGMA, DELTA = 50, 0.1, 1.0, 1e-5


@pytest.fixture(scope="module")
def law():
    return mixture_score_law(STEPS, Q, SIGMA)


def _threat(sigma=SIGMA, q=Q):
    return ThreatModel(noise_multiplier=sigma, max_grad_norm=1.0, sample_rate=q, steps=STEPS,
                       delta=DELTA, canary_kind="gradient", canary_norm=1.0)


def test_statistic_law_matches_simulated_counts(law):
    # 300 exact runs of 400 + 400 canaries: S's simulated median and mean against the law's
    d = RankDesign(3, 3, 400, 400, 0.05)
    rng = np.random.default_rng(0)
    s = [count(*simulate_mixture_scores(400, 400, steps=STEPS, sample_rate=Q,
                                        noise_multiplier=SIGMA, rng=rng), d).statistic
         for _ in range(300)]
    sl = statistic_law(d, law)
    mean = float(np.arange(sl.pmf.size) @ sl.pmf)
    assert abs(np.mean(s) - mean) < 3 * np.std(s) / np.sqrt(300)
    assert abs(np.median(s) - sl.median()) <= 3


def test_design_epsilon_is_the_certification_at_the_median_and_beats_neighbours(law):
    res = design_epsilon(law, 400, 400, delta=DELTA, confidence=0.95)
    d = res.design
    assert res.median_statistic == statistic_law(d, law).median()
    assert res.expected == certify_epsilon_at(d, res.median_statistic, delta=DELTA)[0]
    again = design_epsilon(law, 400, 400, delta=DELTA, confidence=0.95)
    assert again == res  # a function of the claim and the sizes only
    for other in (RankDesign(0, None, 400, 400, 0.05), RankDesign(50, 50, 400, 400, 0.05)):
        med = statistic_law(other, law).median()
        assert certify_epsilon_at(other, med, delta=DELTA)[0] <= res.expected + 1e-9


def test_a_true_claim_is_rejected_at_most_at_the_level_and_a_false_one_often(law):
    # exact computations: the claim's own ROC (the law's) as the null
    d = RankDesign(40, 40, 400, 400, 0.05)
    assert power(d, law.roc, law, law.roc_reverse) <= 0.05
    leaky = mixture_score_law(STEPS, Q, SIGMA, true_noise=SIGMA / 2)
    assert power(d, law.roc, leaky, law.roc_reverse) > 0.9
    c = critical_value(d, law.roc, law.roc_reverse)
    assert statistic_law(d, law).sf(c) <= 0.05


def test_plan_on_a_correct_run_and_on_halved_noise():
    threat = _threat()
    plan = data_rate_plan(threat, 400, 400, confidence=0.95, refutation_level=1e-6)
    json.dumps(plan.to_dict())
    rng = np.random.default_rng(4)
    ok = data_rate_evidence(plan, threat, *simulate_mixture_scores(
        400, 400, steps=STEPS, sample_rate=Q, noise_multiplier=SIGMA, rng=rng))
    exact = plan.law.epsilon(DELTA)
    assert 0 < ok.epsilon_lower.epsilon < exact
    assert not ok.refuted and not ok.claim_rejected
    assert ok.sigma_upper > SIGMA and ok.epsilon_within_family < threat.claimed_epsilon()
    assert "Poisson-subsampled Gaussian" in ok.conditional_on
    json.dumps(ok.to_dict())
    bug = data_rate_evidence(plan, threat, *simulate_mixture_scores(
        400, 400, steps=STEPS, sample_rate=Q, noise_multiplier=SIGMA, true_noise=SIGMA / 2,
        rng=rng))
    assert bug.refuted and bug.claim_rejected and SIGMA / 4 < bug.sigma_upper < SIGMA
    # with a floor the data reject, the search stops there ("at most")
    floored = data_rate_evidence(plan, threat, *simulate_mixture_scores(
        400, 400, steps=STEPS, sample_rate=Q, noise_multiplier=SIGMA, true_noise=SIGMA / 20,
        rng=rng), sigma_floor=0.75)
    assert floored.refuted and floored.sigma_upper == pytest.approx(0.75 * SIGMA)


def test_plan_refuses_every_step_canaries():
    with pytest.raises(ValueError, match="sample_rate=1"):
        data_rate_plan(_threat(q=1.0), 10, 10, confidence=0.95, refutation_level=1e-6)


def test_ceilings_order(law):
    c = count_ceiling(law, 400, 400, delta=DELTA, confidence=0.95)
    assert c.one_sided <= c.epsilon + 1e-9 and c.step >= 0
    u = universal_ceiling(law, 400, 400, confidence=0.95)
    assert c.epsilon <= u <= law.epsilon(DELTA) + 0.5
    # power falls with the cap; far above the pair's epsilon the capped pair is the pair
    top = law.epsilon(DELTA) + 2.0
    p = [np_power(law, e, 400, 400, 0.05) for e in (0.5, 1.0, 2.0, top)]
    assert np.all(np.diff(p) <= 1e-9) and p[0] > 0.5 and p[-1] <= 0.06
    forecast = data_rate_ceiling(_threat(), 400, 400, confidence=0.95)
    assert forecast["count_ceiling"] == pytest.approx(c.epsilon)
