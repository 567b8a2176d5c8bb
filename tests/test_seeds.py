"""The named seed streams keep the values the published numbers were drawn with."""

import numpy as np
import pytest

from dpaudit import seeds
from dpaudit.experiment.plan import draw_membership, plan_audit
from dpaudit.experiment.settings import AuditSettings


def test_stream_tags_are_the_historical_values():
    # Changing any of these changes every audit's numbers (experiments/README.md).
    assert seeds.MEMBERSHIP == 0xC0FFEE
    assert (seeds.CANARY_SETUP, seeds.DIRAC_TIEBREAK, seeds.BERNOULLI_INCLUSION) == (1, 2, 3)
    assert (seeds.LIVE_PLACEMENT, seeds.RUN_BIT, seeds.POWER_SIMULATION) == (4, 7, 0xB0B)
    assert seeds.FIGURE3_GAME == 3  # shared value, separate experiment (see seeds.py)
    audit_tags = [seeds.MEMBERSHIP, seeds.CANARY_SETUP, seeds.DIRAC_TIEBREAK,
                  seeds.BERNOULLI_INCLUSION, seeds.LIVE_PLACEMENT, seeds.POWER_SIMULATION]
    assert len(set(audit_tags)) == len(audit_tags)  # one audit's streams never overlap


def test_derived_draws_are_unchanged():
    # Values recorded before the tags were named (numpy's SeedSequence is stable).
    assert seeds.run_seed(0, 1) == 3964924996 and seeds.run_seed(5, 3) == 727168946
    assert seeds.stream(0, seeds.MEMBERSHIP).random(3) == pytest.approx(
        [0.37542387796676535, 0.19925795097216392, 0.5266419246314594], abs=0)
    three = plan_audit(AuditSettings.from_mappings(canary={"count": 3}, device="cpu"))
    assert np.array_equal(draw_membership(three), np.array([True, True, False]))
    assert np.random.default_rng([0, 2, seeds.RUN_BIT]).random() == 0.7314810047386062


def test_as_generator_seeds_every_draw():
    g = np.random.default_rng(0)
    assert seeds.as_generator(g) is g
    assert seeds.as_generator(np.int64(4)).random() == np.random.default_rng(4).random()
    assert seeds.as_generator([1, 2]).random() == np.random.default_rng([1, 2]).random()
    for bad in (None, True):
        with pytest.raises(ValueError, match="rng must be a numpy"):
            seeds.as_generator(bad, "rng")
