"""The noise Opacus really draws against what the hook's records recover and test, cell by
cell (issue 61's harness, ``tests/support/noise_capture.py``): the claimed std is Opacus' own at
every step, the recovered noise is the drawn one up to half an ulp of the float32 release at
every coordinate, the squared norm ``noise_scale`` tests is the drawn noise's within the
records' rounding bound (so its chi-square p-value is the drawn noise's own, conservatively),
and torch draws a float32 tensor's noise with its std cast to float32 (what the chi-square
floors' ``scale_rounding`` accounts for)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from noise_capture import compare, drawn_noise
from opacus.optimizers.optimizer import _generate_noise
from own_loop_models import own_loop_audit
from scipy.stats import chi2


def _check_cells(cap, steps: int) -> dict:
    c = compare(cap)
    tensors = {cell.tensor for cell in cap.cells}
    assert c["cells"] == steps * len(tensors)
    # the claim is Opacus' std, at every step (adaptive clipping's C_t: float32 products)
    rel = cap.array("claimed_std") / cap.array("opacus_std") - 1.0
    assert np.all(np.abs(rel) <= 2.0**-23)
    assert np.array_equal(cap.array("record_std"), cap.array("claimed_std"))
    # recovery: at every coordinate within half an ulp of the release (fl(s + n)'s rounding)
    assert c["max_error_over_ulp_bound"] <= 1.0
    # the recorded squared norm is the drawn one within the bound noise_scale adds
    d, r = cap.array("dim"), cap.array("rounding")
    gap = np.abs(np.sqrt(cap.array("recorded_sq")) - np.sqrt(cap.array("drawn_sq")))
    assert np.all(gap <= np.sqrt(d) * r) and np.all(r < 1e-5)
    # so each cell's p-value from the records is the drawn noise's, conservatively
    assert c["conservative"] and c["max_log10_p_gap"] < 1e-3
    return c


@pytest.mark.parametrize("clipping", ["flat", "per_layer", "adaptive"])
def test_recovered_noise_is_the_drawn_noise_cell_by_cell(clipping):
    with drawn_noise() as cap:
        res = own_loop_audit("linear", seed=3, clipping=clipping)
    names = list(dict.fromkeys(cell.tensor for cell in cap.cells))
    steps = len(cap.cells) // len(names)
    c = _check_cells(cap, steps)
    assert steps >= 20
    # the audit's noise_scale p-value is the drawn noise's own: its smallest cell (each
    # tensor and step, and each tensor over the run), Bonferroni over the cells
    drawn = cap.array("drawn_sq").reshape(steps, len(names))
    d = cap.array("dim")[: len(names)]
    log_p = min(float(np.min(chi2.logcdf(drawn, d))),
                float(np.min(chi2.logcdf(drawn.sum(axis=0), d * steps))))
    cells = (steps + 1) * len(names)
    scale = res["white_box"]["checks"]["noise_scale"]
    assert math.log10(scale["p_value"]) == pytest.approx(
        math.log10(min(1.0, cells * math.exp(log_p))), abs=1e-3)
    assert c["smallest_cell"]["log10_p_recorded"] >= c["smallest_cell"]["log10_p_drawn"] - 1e-9


@pytest.mark.parametrize("size", [16, 64, 400])
def test_torch_draws_float32_noise_with_its_std_cast_to_float32(size):
    # what scale_rounding accounts for: std and its float32 rounding draw the same bits
    std = 0.7000001234  # float32 rounds it down by 2.3e-8 relative
    low = float(np.float32(std))
    assert low < std
    draws = []
    for s in (std, low):
        torch.manual_seed(11)
        draws.append(_generate_noise(s, torch.zeros(size)))
    assert torch.equal(draws[0], draws[1])
