"""The clipping check's judgement (``experiment.judging.clipping``): a contribution of r C above
C costs the epsilon of the claim at sigma / r; beyond +10% it refutes the claim, below it is a
reported warning, and float32 rounding (r <= 1 + 1e-4) passes. The heterogeneous composition
is checked against Opacus' own RDP accountant; the rule's margins against the measured
bfloat16 excess (about 1.008 C at most, ``benchmarks/mixed_precision.py``) and a 2 C bug."""

import itertools
import math

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from dpaudit.capture.clip_check import TOLERANCE
from dpaudit.experiment.judging.clipping import (
    EPSILON_TOLERANCE,
    clipping_check,
    clipping_cost,
    describe_clipping,
)

CONFIGS = [(1.0, 0.045, 44), (0.5, 0.01, 1000), (0.7, 0.004, 10_000), (2.0, 0.1, 100),
           (6.0, 1.0, 100), (10.0, 0.03, 100)]


def _summary(ratio: float, **extra) -> dict:
    return {"steps_seen": 50, "steps_checked": 12, "leave_one_out_steps": 4, "probes": 60,
            "max_ratio_single": ratio, "max_ratio_leave_one_out": min(ratio, 1.0),
            "violations": int(ratio > 1 + TOLERANCE), "unchecked": None,
            "worst": {"step": 7, "example": 3, "kind": "single", "ratio": ratio}, **extra}


@pytest.mark.parametrize("sigma,q,steps", CONFIGS)
def test_the_cost_is_the_claim_at_sigma_over_r(sigma, q, steps):
    base = clipping_cost(1.0, [sigma] * steps, q, 1e-5)
    assert base["epsilon_excess"] == 0.0 and base["implied_epsilon"] == base["claimed_epsilon"]
    r = 1.3
    cost = clipping_cost(r, [sigma] * steps, q, 1e-5)
    assert cost["implied_epsilon"] == pytest.approx(
        clipping_cost(1.0, [sigma / r] * steps, q, 1e-5)["claimed_epsilon"], rel=1e-12)
    excesses = [clipping_cost(x, [sigma] * steps, q, 1e-5)["epsilon_excess"]
                for x in (1.001, 1.01, 1.1, 2.0)]
    assert all(a < b for a, b in itertools.pairwise(excesses))


def test_heterogeneous_steps_compose_as_opacus_rdp_accountant():
    sigmas = np.array([1.0] * 30 + [0.8] * 20 + [1.5] * 10)
    acc = RDPAccountant()
    acc.history = [(1.0, 0.05, 30), (0.8, 0.05, 20), (1.5, 0.05, 10)]
    cost = clipping_cost(1.0, sigmas, 0.05, 1e-5)
    assert cost["claimed_epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


@pytest.mark.parametrize("sigma,q,steps", CONFIGS)
def test_bfloat16_excess_warns_and_a_2c_bug_refutes(sigma, q, steps):
    sigmas = [sigma] * steps
    bf16 = clipping_check(_summary(1.01), sigmas, q, 1e-5)  # above bf16's largest (1.008)
    assert not bf16.rejected and bf16.warning and bf16.noted
    assert 0 < bf16.witness["epsilon_excess"] < EPSILON_TOLERANCE / 2
    bug = clipping_check(_summary(2.0), sigmas, q, 1e-5)
    assert bug.rejected and not bug.warning
    assert bug.witness["epsilon_excess"] > 5 * EPSILON_TOLERANCE


def test_float32_rounding_passes_silently():
    res = clipping_check(_summary(1 + TOLERANCE / 2), [1.0] * 50, 0.05, 1e-5)
    assert not res.rejected and not res.warning
    assert "cost" not in res.details and "float32 rounding" in res.checked[-1]


def test_the_refutation_line_names_the_epsilon_it_implies():
    res = clipping_check(_summary(1.5), [1.0] * 50, 0.05, 1e-5)
    line = describe_clipping(res)
    assert "example 3 at step 7 changed the clipped sum by 1.5 C" in line
    assert f"against the claimed {res.witness['claimed_epsilon']:.4g}" in line
    assert res.to_dict()["warning"] is False and res.to_dict()["rejected"] is True


def test_unknown_rate_and_noiseless_claims():
    cost = clipping_cost(1.05, [1.0] * 20, None, None)
    assert "q = 1 composition" in cost["basis"] and "delta 1e-05" in cost["basis"]
    noiseless = clipping_check(_summary(3.0), [0.0] * 20, 0.05, 1e-5)
    # a claim of no privacy (noise multiplier 0) cannot be refuted by any sensitivity
    assert math.isinf(noiseless.details["cost"]["claimed_epsilon"])
    assert not noiseless.rejected
