"""The lower side of the user's epsilon in their own loop (issue 66): the README's loop with
the hook's defaults (10^4 canaries per side inserted like an example) brackets the claimed
epsilon from both sides, and with the white-box checks off those canaries alone refute a
training whose noise was halved."""

from __future__ import annotations

import pytest
from claim_loops import readme_loop_audit as readme_loop


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_the_readme_loop_is_bracketed_from_both_sides(seed):
    """Known answers (benchmarks/false_alarms.py's ``own_default``; over seeds 0-9 the
    certified side measured 0.23-0.61x of the claim, median 0.50x; the within-family side
    0.83-0.93x): the design's exact median on a correct run is about half the claim, the
    certified side is positive and below the claim, the within-family side at least 0.6x, and
    the claim test keeps the correct run."""
    res = readme_loop(seed)
    v = res["verdict"]
    td = v["training_data"]
    lower, claimed = td["lower"], td["epsilon_claimed"]
    assert claimed == pytest.approx(4.0, abs=0.01)
    assert lower["canaries"][0] + lower["canaries"][1] == 20_000
    assert 0.45 * claimed <= lower["expected"]["epsilon_lower"] <= 0.6 * claimed
    assert 0 < td["epsilon_lower"] == lower["epsilon"] < claimed < td["epsilon_upper"]
    assert lower["within_family"]["epsilon"] >= 0.6 * claimed
    assert not lower["refuted"] and v["status"] == "consistent"


@pytest.mark.parametrize("bug", ["halved_noise",
                                 pytest.param("accountant_sample_rate", marks=pytest.mark.slow)])
def test_with_the_white_box_checks_off_they_refute_alone(bug):
    """Known answers: Opacus' noise halved (the zoo's ``halved_noise``), or the accountant
    told half the rate the loader draws at (``accountant_sample_rate``: the canaries are drawn
    at the loader's rate, the claim tested is the accountant's history); with no white-box
    check running, the canaries inserted like an example refute the accountant's curve at the
    PRIVACY BUG level by themselves (p about 1e-10 to 1e-9 at seeds 0-1, against its share of
    1e-6), and the verdict names them."""
    res = readme_loop(0, bug=bug, white_box=False)
    v = res["verdict"]
    lower = v["training_data"]["lower"]
    test = lower["claim_test"]
    assert "white_box" not in res or not (res.get("white_box") or {}).get("checks")
    assert lower["refuted"] and test["refute_p_value"] < test["refutation_level"] < 1e-6
    assert v["status"] == "privacy_bug"
    assert "the canaries inserted like an example refute your claimed curve" in v["message"]
