"""The white-box checks in the audit: every bug of the zoo flagged at the PRIVACY BUG level by a
tiny default-shaped audit (one seed each, the fast part of benchmarks/bug_zoo.py), what fired
named in the verdict, the correct optimizer not flagged, evidence short of the bug level a
warning, and the deterministic bookkeeping check by hand."""

import numpy as np
import pytest

from dpaudit.bugs import BUG_ZOO
from dpaudit.capture.records import (
    ExampleSampling,
    RanksRelease,
    StepRecord,
    WhiteBoxRecords,
)
from dpaudit.experiment import run_audit
from dpaudit.experiment.judging.white_box import (
    bookkeeping_check,
    count_tests,
    describe,
    not_checked,
    white_box_evidence,
)

# the default audit's shape (MLP, Dirac canaries on its dead first-layer weights, every step),
# small: width 100 (300 dead coordinates), T = 30; without the canaries inserted like an
# example (their lower side is tests/experiment/test_lower_side_cli.py's)
TINY = {"model": {"name": "mlp", "width": 100}, "dp": {"steps": 30},
        "canary": {"count": 300, "lower_side": 0}, "progress": False}


def _audit(bug="none", factor=None, seed=1):
    dp = {**TINY["dp"], "bug": bug}
    if factor is not None:
        dp["bug_factor"] = factor
    return run_audit(**{**TINY, "dp": dp}, seed=seed)


# the statement(s) expected to fire for each bug at its catastrophic severity
EXPECTED = {
    "halved_noise": "noise_scale",
    "scaled_noise": "noise_scale",
    "noise_skipped_steps": "noise_scale",
    "noise_reused": "noise_freshness",
    "antithetic_noise": "noise_freshness",
    "noise_partial_tensors": "noise_scale",
    "laplace_noise": "noise_marginal",
    "rounded_noise": "noise_marginal",
    "broadcast_noise": "noise_alignment",
    "noise_shared_tensors": "noise_alignment",
    "unclipped_example": "clipping",
    "layer_clip_ignored": "clipping",
    "microbatch_clipping": "clipping",
    "realised_batch_size": "normalisation",
    "shuffled_batches": "sampling_by_example",
    "shuffled_binomial_batches": "sampling_by_example",
    "replayed_batches": "sampling_by_example",
    "duplicated_examples": "sampling_duplicates",
    "out_of_band_update": "model_integrity",
    "batch_seeded_noise": "noise_ignores_data",
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
    assert EXPECTED[bug].replace("_", " ") in v["message"].lower()
    assert v["refutation_level"] == 1e-6 and "failure probability 1e-06" in v["message"]


def test_correct_optimizer_passes_every_check():
    res = _audit()
    checks = res["white_box"]["checks"]
    assert set(checks) == {
        "noise_floor", "noise_scale", "noise_marginal", "noise_alignment", "noise_freshness",
        "poisson_sampling", "clipping", "bookkeeping", "normalisation", "sampling_by_example",
        "sampling_duplicates", "model_integrity", "noise_ignores_data", "loader_fed_training",
    }
    assert not any(c["rejected"] for c in checks.values())
    assert res["verdict"]["status"] != "privacy_bug"
    assert res["white_box"]["statistical_tests"] == 7
    # every check says what it examined; every tensor is checked, none listed as not checked
    assert all(c["checked"] for c in checks.values())
    assert res["white_box"]["not_checked"] == []
    assert "3.bias (d=10) x 30 steps" in checks["noise_scale"]["checked"]
    # each statistical check is judged at its share of 1e-6, warned at its share of 5%
    per = res["refutation_per_statement"]
    assert checks["noise_scale"]["level"] == pytest.approx(per) and per < 1e-6 / 7
    assert checks["noise_scale"]["warning_level"] == pytest.approx(0.05 / 7)


def test_bookkeeping_by_hand():
    ok = bookkeeping_check([(6.0, 0.05, 100)], np.full(100, 6.0), 0.05, 100)
    assert not ok.rejected and ok.witness["problems"] == [] and ok.p_value == 1.0
    bad = bookkeeping_check([(6.0, 0.05, 60), (12.0, 0.05, 40)], np.full(100, 6.0), 0.05, 100)
    assert bad.rejected and "noise multiplier 12 at step 60" in bad.witness["problems"][0]
    assert bad.level is None and not bad.warning
    few = bookkeeping_check([(6.0, 0.05, 50)], np.full(100, 6.0), 0.05, 100)
    assert "counted 50 steps" in few.witness["problems"][0]
    rate = bookkeeping_check([(6.0, 0.025, 100)], np.full(100, 6.0), 0.05, 100)
    assert "sample rate 0.025" in rate.witness["problems"][0]
    assert describe(rate).startswith("bookkeeping: the accountant was told sample rate")


def _records(steps=3, sq=1e4, sizes=None, **kw):
    return WhiteBoxRecords(
        names=["w"], dims=[100], max_grad_norm=1.0,
        steps=tuple(StepRecord(step=t, noise_std=1.0, divisor=1.0,
                               batch_size=None if sizes is None else sizes[t],
                               released_sq=np.array([sq])) for t in range(steps)), **kw)


def test_records_decide_which_tests_run():
    assert count_tests(None) == 0 and white_box_evidence(None, 0.01) == {}
    assert "multi-run" in not_checked(None, True, "a multi-run audit")[0]
    records = _records()
    assert count_tests(records) == 1
    assert set(white_box_evidence(records, 0.01)) == {"noise_floor"}
    said = " ".join(not_checked(records, False))
    for needle in ("scale, law, alignment and freshness", "noise independence",
                   "Poisson sampling", "clipping", "bookkeeping"):
        assert needle in said
    # batch sizes known but no dataset size: named with the argument that gives it
    said = " ".join(not_checked(_records(sizes=[3, 4, 5], sampling={"n": None, "q": 0.1}),
                                True))
    assert "dataset_size=" in said


def test_evidence_between_the_levels_is_a_warning():
    # a released floor far enough below the claim for 5% but not for 1e-6: a warning
    evidence = white_box_evidence(_records(steps=1, sq=65.0), 1e-7, 0.05)
    floor = evidence["noise_floor"]
    assert 1e-7 < floor.p_value < 0.05
    assert not floor.rejected and floor.warning
    assert "noise floor" in describe(floor) and f"p = {floor.p_value:.2g}" in describe(floor)


def test_normalisation_by_hand():
    # the release over the noised sum: a constant factor passes (a learning rate), a divisor
    # that changes from step to step (the realised batch size) is refuted, naming the steps
    def records(ratios, sizes):
        return WhiteBoxRecords(
            names=["w"], dims=[100], max_grad_norm=1.0,
            steps=tuple(StepRecord(step=t, noise_std=1.0, divisor=64.0, batch_size=b,
                                   released_sq=np.array([400.0 * r * r]), noised_sq=400.0)
                        for t, (r, b) in enumerate(zip(ratios, sizes, strict=True))))

    const = white_box_evidence(records([0.5, 0.5, 0.5 * (1 + 1e-6)], [60, 70, 64]), 1e-7, 0.05)
    assert not const["normalisation"].rejected
    real = white_box_evidence(records([64 / 60, 1.0, 64 / 70], [60, 64, 70]), 1e-7, 0.05)
    check = real["normalisation"]
    assert check.rejected and check.witness["steps"] == [2, 0]
    assert "batches of 70 and 60 examples" in describe(check)


def test_full_batches_at_rate_one_are_checked_by_example():
    # q = 1: Poisson sampling is every example in every batch, so the recorded batches are
    # checked exactly (p 0 or 1), not left unchecked as "rate 1"
    def records(counts, sizes):
        by = ExampleSampling(
            n=4, source="a full-batch loader", counts=np.array(counts), sizes=np.array(sizes),
            signatures=np.zeros((len(sizes), 1)), bucket_sizes=np.array([4]),
            bucket_signed=np.array([0]), set_hashes=np.zeros(len(sizes), dtype=np.uint64),
            duplicate_batches=0, duplicate_witness={}, out_of_range=0,
            optimizer_steps=len(sizes))
        return _records(steps=len(sizes), sizes=sizes, sampling={"n": 4, "q": 1.0},
                        by_example=by)

    full = records([3, 3, 3, 3], [4, 4, 4])
    checks = white_box_evidence(full, 1e-7, 0.05)
    assert checks["sampling_by_example"].p_value == 1.0
    assert not checks["sampling_by_example"].rejected
    assert not any(u.startswith("sampling by example") for u in not_checked(full, True))
    short = white_box_evidence(records([3, 3, 3, 2], [4, 4, 3]), 1e-7, 0.05)
    check = short["sampling_by_example"]
    assert check.rejected and check.p_value == 0.0
    assert check.witness["sampling_seen"] == ("1 of 4 examples were not in every batch, 1 of 3 "
                                              "batches did not hold all 4 examples")
    assert short["poisson_sampling"].rejected  # the sizes say it too


def test_ranks_normalisation_by_hand():
    # DPDDP: P(release x divisor) against P(S), S the ranks' noised sums. A release that is
    # c S (c constant, up to the rounding bound) passes; one whose factor changes between steps,
    # or that is not parallel to S (a rank's sum left out), is refuted, naming the step
    def records(factors, cosines, error=1e-6):
        steps = []
        for t, (c, cos) in enumerate(zip(factors, cosines, strict=True)):
            noised, released = 100.0, 100.0 * c * c  # ||P(S)||^2, ||P(R)||^2
            steps.append(StepRecord(
                step=t, noise_std=1.0, divisor=64.0, batch_size=60 + t,
                released_sq=np.array([1e4]), ranks_release=RanksRelease(
                    released=released, noised=noised, cross=cos * np.sqrt(released * noised),
                    error=error, ranks=2)))
        return WhiteBoxRecords(names=["w"], dims=[100], max_grad_norm=1.0, steps=tuple(steps))

    ok = white_box_evidence(records([0.5] * 3, [1.0, 1.0, 1.0 - 1e-12]), 1e-7, 0.05)
    assert not ok["normalisation"].rejected
    assert "sum of the 2 ranks' noised sums at 3 steps" in ok["normalisation"].checked[0]
    # within the rounding's bound (e_t = error / ||P(S)|| = 1e-3 here) is not a refutation
    assert not white_box_evidence(records([1.0, 1.0005, 1.0], [1.0, 1.0, 1.0], error=1e-2),
                                  1e-7, 0.05)["normalisation"].rejected
    varying = white_box_evidence(records([1.0, 64 / 61, 1.0], [1.0] * 3), 1e-7, 0.05)
    check = varying["normalisation"]
    assert check.rejected and check.witness["steps"] == [0, 1]
    assert "a divisor that changed between steps 0 and 1" in describe(check)
    skew = white_box_evidence(records([1.0, 1.0, 1.0], [1.0, 0.99, 1.0]), 1e-7, 0.05)
    check = skew["normalisation"]
    assert check.rejected and check.witness["step"] == 1
    assert check.witness["cosine"] == pytest.approx(0.99)
    assert "not a multiple of the sum of the 2 ranks' noised sums" in describe(check)
    # DPDDP records without the sketch (an older dpaudit): named, not checked
    old = WhiteBoxRecords(names=["w"], dims=[100], max_grad_norm=1.0, steps=tuple(
        StepRecord(step=t, noise_std=1.0, divisor=1.0, batch_size=None,
                   released_sq=np.array([1e4])) for t in range(3)))
    assert "normalisation" not in white_box_evidence(old, 1e-7, 0.05)
    assert any(u.startswith("normalisation: under DPDDP") for u in not_checked(old, True))


def test_the_floor_allows_the_dtypes_rounding_of_the_std_and_the_release():
    # torch draws with the std cast to the noise's dtype, and the release is rounded where
    # the sum is added and where it is divided: the floor is tested at the largest norm three
    # roundings allow (bfloat16's eps makes it visible)
    from dpaudit.stats.noise import noise_floor_test

    eps = float(np.finfo(np.float32).eps) * 2.0**16  # bfloat16's: 2^-7
    records = WhiteBoxRecords(
        names=["w"], dims=[100], max_grad_norm=1.0,
        steps=tuple(StepRecord(step=t, noise_std=1.0, divisor=1.0, batch_size=None,
                               released_sq=np.array([65.0]), dtype_eps=eps)
                    for t in range(2)))
    floor = white_box_evidence(records, 1e-7, 0.05)["noise_floor"]
    rho = 1.0 - (1.0 - eps / 2.0) ** 3
    expect = noise_floor_test(np.full((1, 2), 65.0), [100], 1.0, level=1e-7,
                              scale_rounding=rho)
    assert floor.p_value == pytest.approx(expect.p_value, rel=1e-12)
    exact = noise_floor_test(np.full((1, 2), 65.0), [100], 1.0, level=1e-7)
    assert floor.p_value > 1.5 * exact.p_value
