"""Threshold policies (seed 003) and the orientation check."""

import warnings

import numpy as np
import pytest

from dpaudit.stats import (
    OrientationWarning,
    adaptive_threshold,
    apply_threshold,
    check_orientation,
    fixed_threshold,
    neyman_pearson_threshold,
    orientation_test,
)


def test_fixed_and_adaptive():
    assert fixed_threshold(1.5) == 1.5
    with pytest.raises(ValueError, match="value"):
        fixed_threshold(np.nan)
    assert adaptive_threshold([1.0, 5.0, 3.0, 4.0], 2) == pytest.approx(4.5)
    with pytest.raises(ValueError, match="n_top"):
        adaptive_threshold([1.0, 2.0], 3)


def test_neyman_pearson_level_holds_on_fresh_non_members():
    # k = floor(alpha (n + 1)) = 9 for n = 999, alpha = 0.01: expected FPR = 9 / 1000 <= alpha.
    rng = np.random.default_rng(0)
    fprs = []
    for _ in range(200):
        t = neyman_pearson_threshold(rng.normal(size=999), 0.01)
        fprs.append(np.mean(apply_threshold(rng.normal(size=2000), t)))
    mean = np.mean(fprs)
    assert mean <= 0.01 + 3 * np.std(fprs) / np.sqrt(200)
    assert mean == pytest.approx(0.009, abs=0.0015)
    assert neyman_pearson_threshold([0.0, 1.0], 0.1) == np.inf
    with pytest.raises(ValueError, match="alpha"):
        neyman_pearson_threshold([0.0, 1.0], 1.0)


def test_orientation_warns_only_when_flipped():
    rng = np.random.default_rng(1)
    s_in, s_out = rng.normal(0.5, 1, 500), rng.normal(0, 1, 500)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_orientation(s_in, s_out) > 0.5
        check_orientation(rng.normal(0, 1, 500), s_out)  # no signal: no warning
    with pytest.warns(OrientationWarning, match="flipped"):
        a = check_orientation(-s_in, s_out)
    assert a < 0.5


def test_orientation_test_returns_auc_z_and_flag_without_warning():
    rng = np.random.default_rng(2)
    s_in, s_out = rng.normal(0.5, 1, 300), rng.normal(0, 1, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a, z, flipped = orientation_test(-s_in, s_out)
    assert a < 0.5 and z < -3 and flipped
    a, z, flipped = orientation_test(s_in, s_out)
    assert a > 0.5 and z > 0 and not flipped
