"""ROC / AUC / TPR@FPR against hand-computed examples, including ties."""

import numpy as np
import pytest

from dpaudit.stats import auc, roc_curve, tpr_at_fpr
from dpaudit.stats.roc import SUMMARY_FPRS, roc_summary, tpr_key


def test_roc_small_example_with_ties():
    # in = [3, 2, 2], out = [2, 1]; thresholds +inf, 3, 2, 1.
    fpr, tpr, thr = roc_curve([3, 2, 2], [2, 1])
    np.testing.assert_array_equal(thr, [np.inf, 3, 2, 1])
    np.testing.assert_allclose(tpr, [0, 1 / 3, 1, 1])
    np.testing.assert_allclose(fpr, [0, 0, 0.5, 1])


def test_ties_do_not_inflate_tpr():
    # Every score tied: the only operating points are (0,0) and (1,1); no point (0, 1) exists.
    fpr, tpr, _ = roc_curve([1.0, 1.0, 1.0], [1.0, 1.0])
    np.testing.assert_allclose(fpr, [0, 1])
    np.testing.assert_allclose(tpr, [0, 1])
    assert tpr_at_fpr([1.0, 1.0, 1.0], [1.0, 1.0], 0.5) == 0.0
    assert auc([1.0, 1.0, 1.0], [1.0, 1.0]) == 0.5


def test_auc_hand_computed_mann_whitney():
    # pairs (in, out): (3,2)=1 (3,1)=1 (2,2)=1/2 (2,1)=1 twice -> 5/6
    assert auc([3, 2, 2], [2, 1]) == pytest.approx(5 / 6)
    assert auc([0, 0], [1, 1]) == 0.0
    assert auc([5], [1, 2, 3]) == 1.0


def test_tpr_at_fpr_hand_computed_and_array():
    s_in, s_out = [4, 3, 2, 1], [3.5, 2.5, 0.5, 0]
    # member iff >= t: t=4 -> (0, 1/4); t=3.5 -> (1/4, 1/4); t=3 -> (1/4, 2/4); t=2.5 -> (2/4, 2/4)
    assert tpr_at_fpr(s_in, s_out, 0.0) == 0.25
    assert tpr_at_fpr(s_in, s_out, 0.25) == 0.5
    np.testing.assert_allclose(tpr_at_fpr(s_in, s_out, [0.0, 0.3, 0.5, 1.0]), [0.25, 0.5, 1.0, 1.0])


def test_roc_summary_is_the_one_spelling_of_an_attacks_summary():
    s_in, s_out = [4, 3, 2, 1], [3.5, 2.5, 0.5, 0]  # as above
    row = roc_summary(s_in, s_out, (0.0, 0.3))
    assert row == {"auc": auc(s_in, s_out), "tpr_at_fpr_0": 0.25, "tpr_at_fpr_0.3": 0.5,
                   "n_in": 4, "n_out": 4}
    assert list(roc_summary(s_in, s_out)) == ["auc", "tpr_at_fpr_0.001", "tpr_at_fpr_0.01",
                                               "tpr_at_fpr_0.1", "n_in", "n_out"]
    assert [tpr_key(f) for f in SUMMARY_FPRS] == list(roc_summary(s_in, s_out))[1:4]


def test_roc_matches_bruteforce_on_random_discrete_scores():
    rng = np.random.default_rng(0)
    s_in = rng.integers(0, 6, 40).astype(float)
    s_out = rng.integers(0, 5, 30).astype(float)
    fpr, tpr, thr = roc_curve(s_in, s_out)
    for f, t, h in zip(fpr, tpr, thr, strict=True):
        assert t == np.mean(s_in >= h) and f == np.mean(s_out >= h)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    brute = np.mean((s_in[:, None] > s_out[None, :]) + 0.5 * (s_in[:, None] == s_out[None, :]))
    assert auc(s_in, s_out) == pytest.approx(brute)


@pytest.mark.parametrize("bad", [[], [1.0, np.nan], [np.inf]])
def test_roc_bad_scores(bad):
    with pytest.raises(ValueError, match="scores_in"):
        roc_curve(bad, [1.0])
    with pytest.raises(ValueError, match="scores_out"):
        auc([1.0], bad)


def test_tpr_at_fpr_bad_target():
    with pytest.raises(ValueError, match="fpr"):
        tpr_at_fpr([1.0], [0.0], 1.5)
