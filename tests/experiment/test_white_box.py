"""The white-box checks in the audit: every bug of the zoo flagged by a tiny default-shaped audit
(one seed each, the fast part of benchmarks/bug_zoo.py), what fired named in the verdict, the
correct optimizer not flagged, and the deterministic bookkeeping check by hand."""

import numpy as np
import pytest

from dpaudit.bugs import BUG_ZOO
from dpaudit.experiment import run_audit
from dpaudit.experiment.judging.white_box import (
    bookkeeping_check,
    count_tests,
    describe,
    not_checked,
    white_box_evidence,
)

# the default audit's shape (MLP, Dirac canaries on its dead first-layer weights, every step),
# small: width 100 (300 dead coordinates), T = 30
TINY = {"model": {"name": "mlp", "width": 100}, "dp": {"steps": 30},
        "canary": {"count": 300}, "progress": False}


def _audit(bug="none", factor=None, seed=1):
    dp = {**TINY["dp"], "bug": bug}
    if factor is not None:
        dp["bug_factor"] = factor
    return run_audit(**{**TINY, "dp": dp}, seed=seed)


# the statement(s) expected to fire for each bug at its catastrophic severity
EXPECTED = {
    "halved_noise": "noise_floor",
    "scaled_noise": "noise_floor",
    "noise_skipped_steps": "noise_floor",
    "noise_reused": "noise_independence",
    "noise_partial_tensors": "noise_floor",
    "unclipped_example": "clipping",
    "layer_clip_ignored": "clipping",
    "microbatch_clipping": "clipping",
    "realised_batch_size": "noise_floor",
    "shuffled_batches": "bookkeeping",
    "accountant_sigma": "bookkeeping",
    "accountant_sample_rate": "bookkeeping",
    "accountant_steps": "bookkeeping",
}


def test_every_bug_has_an_expected_statement():
    assert set(EXPECTED) == set(BUG_ZOO)


@pytest.mark.parametrize("bug", list(BUG_ZOO))
def test_every_bug_of_the_zoo_is_flagged_and_named(bug):
    v = _audit(bug)["verdict"]
    assert v["status"] == "privacy_bug", v["message"]
    assert EXPECTED[bug] in v["white_box_fired"], (v["white_box_fired"], v["message"])
    assert EXPECTED[bug].split("_")[0] in v["message"].lower()


def test_correct_optimizer_passes_every_check():
    res = _audit()
    checks = res["white_box"]["checks"]
    assert set(checks) == {
        "noise_floor", "noise_independence", "poisson_sampling", "clipping", "bookkeeping"
    }
    assert not any(c["rejected"] for c in checks.values())
    assert res["verdict"]["status"] != "privacy_bug"
    assert res["white_box"]["statistical_tests"] == 3
    # every check says what it examined
    assert all(c["checked"] for c in checks.values())
    # the final bias (10 coordinates) is too small for the floor to see missing noise
    assert any("3.bias" in s for s in res["white_box"]["not_checked"])


def test_bookkeeping_by_hand():
    ok = bookkeeping_check([(6.0, 0.05, 100)], np.full(100, 6.0), 0.05, 100)
    assert not ok["rejected"] and ok["witness"]["problems"] == []
    bad = bookkeeping_check([(6.0, 0.05, 60), (12.0, 0.05, 40)], np.full(100, 6.0), 0.05, 100)
    assert bad["rejected"] and "noise multiplier 12 at step 60" in bad["witness"]["problems"][0]
    few = bookkeeping_check([(6.0, 0.05, 50)], np.full(100, 6.0), 0.05, 100)
    assert "counted 50 steps" in few["witness"]["problems"][0]
    rate = bookkeeping_check([(6.0, 0.025, 100)], np.full(100, 6.0), 0.05, 100)
    assert "sample rate 0.025" in rate["witness"]["problems"][0]
    assert describe(rate).startswith("bookkeeping: the accountant was told sample rate")


def test_records_decide_which_tests_run():
    assert count_tests(None) == 0 and white_box_evidence(None, 0.01) == {}
    assert "multi-run" in not_checked(None, True)[0]
    records = {"released_sq": np.full((1, 3), 1e4), "dims": [100], "names": ["w"],
               "noise_stds": np.ones(3), "max_grad_norm": 1.0, "steps": 3,
               "batch_sizes": [None, None, None], "probe_noise": None, "clipping": None,
               "accountant_history": None}
    assert count_tests(records) == 1
    assert set(white_box_evidence(records, 0.01)) == {"noise_floor"}
    said = " ".join(not_checked(records, False))
    for needle in ("noise independence", "Poisson sampling", "clipping", "bookkeeping"):
        assert needle in said
