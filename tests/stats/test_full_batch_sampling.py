"""The Poisson sampling check at q = 1: full batches, an exact deterministic test."""

from dpaudit.stats import poisson_sampling_test


def test_full_batches_pass_and_a_short_one_is_refuted():
    ok = poisson_sampling_test([100] * 20, 100, 1.0, level=1e-6)
    assert not ok.rejected and ok.p_value == 1.0 and "q = 1" in ok.statement
    short = poisson_sampling_test([100] * 19 + [99], 100, 1.0, level=1e-6)
    assert short.rejected and short.p_value == 0.0
    assert short.witness["steps_not_full"] == 1
