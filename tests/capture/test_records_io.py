"""The white-box records a multi-run audit's run file keeps (``capture.records_io``): compacted
to O(steps x tensors) numbers, written as plain JSON and read back exactly; the same checks run
on them with the same outcome, the premises' numbers (and so the training data's upper side)
unchanged; the compacted freshness and marginal tests still refute the zoo's noise bugs."""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass

import numpy as np
import pytest

from dpaudit._jsonable import to_jsonable
from dpaudit.capture.records_io import (
    FRESHNESS_BUCKETS,
    SAMPLING_BUCKETS,
    compact,
    records_from_dict,
    records_to_dict,
)
from dpaudit.experiment.judging.premises import training_data_block
from dpaudit.experiment.judging.user_claim import claim_of_run
from dpaudit.experiment.judging.white_box import not_checked, white_box_evidence
from dpaudit.experiment.plan import plan_audit
from dpaudit.experiment.settings import AuditSettings
from dpaudit.experiment.trainings.run import audit_run

LEVEL, WARN = 1e-7, 0.05
# the checks whose inputs compaction keeps as they are: the same p-value
UNCHANGED = ("noise_floor", "noise_scale", "poisson_sampling", "clipping", "bookkeeping",
             "normalisation", "model_integrity", "noise_ignores_data", "sampling_duplicates",
             "loader_fed_training", "count_noise", "adaptive_bound", "adaptive_accounting")


def _records(steps=24, seed=0, **dp):
    settings = AuditSettings.from_mappings(dp={"steps": steps, **dp}, seed=seed,
                                           progress=False)
    return audit_run(plan_audit(settings)).white_box


def _through_json(records):
    text = json.dumps(to_jsonable(records_to_dict(records)), allow_nan=False)
    return records_from_dict(json.loads(text)), len(text)


def _same(a, b, where="records"):
    """Deep equality of records (arrays compared exactly, with their dtypes' kinds)."""
    if is_dataclass(a):
        assert type(a) is type(b), where
        for f in fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.shape == b.shape, where
        assert a.dtype.kind == b.dtype.kind, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _judged(records):
    checks = white_box_evidence(records, LEVEL, WARN, delta=1e-5)
    claim = claim_of_run(None, delta=1e-5, accountant=records.accountant)
    block = training_data_block(records, checks, claim, unchecked=not_checked(records, True))
    return checks, block


@pytest.mark.parametrize("dp", [{}, {"clipping": "adaptive"},
                                {"max_physical_batch_size": 16, "batch_size": 40}],
                         ids=["flat", "adaptive", "batch_memory_manager"])
def test_compact_records_round_trip_and_judge_as_the_full_ones(dp):
    full = _records(**dp)
    small = compact(full)
    back, chars = _through_json(small)
    _same(small, back)  # exact: every float, count, hash and flag
    steps = full.num_steps
    assert chars < 600 * steps + 12_000, chars  # O(T J), not O(d) or O(T x 256)
    # the freshness sketch and the batches' sketches are folded, the per-step counts dropped
    assert all(s.noise.sketch.size == FRESHNESS_BUCKETS and s.noise.counts is None
               for s in back.steps)
    assert back.by_example.signatures.shape == (full.by_example.batches, SAMPLING_BUCKETS)
    (c_full, b_full), (c_back, b_back) = _judged(full), _judged(back)
    assert set(c_back) == set(c_full)  # every check still runs
    for name, check in c_full.items():
        assert c_back[name].rejected == check.rejected, name
        if name in UNCHANGED:
            assert c_back[name].p_value == check.p_value, name
    # the premises' numbers are per-step sums: the upper side is the same number
    assert b_back["upper_status"] == b_full["upper_status"] == "verified"
    assert b_back["epsilon_upper"] == b_full["epsilon_upper"]
    assert not_checked(back, True) == not_checked(full, True) == []


@pytest.mark.parametrize("bug,check", [("noise_reused", "noise_freshness"),
                                       ("laplace_noise", "noise_marginal")])
def test_compact_noise_tests_still_refute_the_zoos_noise_bugs(bug, check):
    # folding each step's sketch to 8 numbers and keeping only the run's marginal counts
    # loses power, not all of it: the zoo's catastrophic noise bugs are still refuted
    back, _ = _through_json(compact(_records(steps=40, bug=bug)))
    res = white_box_evidence(back, LEVEL, WARN)[check]
    assert res.rejected and res.p_value < LEVEL, (check, res.p_value)


def test_malformed_records_are_named():
    good = records_to_dict(compact(_records(steps=4)))
    with pytest.raises(ValueError, match="format 99"):
        records_from_dict({**good, "format": 99})
    with pytest.raises(ValueError, match="lack 'steps'"):
        records_from_dict({k: v for k, v in good.items() if k != "steps"})
    broken = json.loads(json.dumps(good))
    broken["steps"]["released_sq"]["base64"] = "not base64!"
    with pytest.raises(ValueError, match=r"steps\.released_sq is not an array record"):
        records_from_dict(broken)
