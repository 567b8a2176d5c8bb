"""dpaudit/forecast.py: what an audit can certify at all with its counts (said in the report)."""

import pytest

from dpaudit.forecast import (
    ceiling_sentence,
    certifiable_ceiling,
    expected_certified_bound,
)


@pytest.mark.parametrize("n,claimed", [(500, 8.0), (100, 4.0), (2000, 7.5)])
def test_needed_canaries_certify_the_claim_and_half_as_many_do_not(n, claimed):
    c = certifiable_ceiling(n, n, claimed, 0.95, 1e-5)
    assert c["epsilon"] == expected_certified_bound(n, n, None, 0.95, 1e-5) < claimed
    need = c["needed_per_side"]
    assert expected_certified_bound(need, need, None, 0.95, 1e-5) >= claimed
    assert expected_certified_bound(need // 4, need // 4, None, 0.95, 1e-5) < claimed
    assert f"{need:,} canaries on each side" in ceiling_sentence(c)


def test_out_of_reach_and_within_reach():
    far = certifiable_ceiling(15, 15, 49.5, 0.95, 1e-5)  # the README's own-loop example
    assert far["needed_per_side"] is None and "out of reach" in ceiling_sentence(far)
    near = certifiable_ceiling(5000, 5000, 2.0, 0.95, 1e-5)
    assert near["needed_per_side"] == 0 and ceiling_sentence(near) == ""
