"""Figures of canary choice (seed 001 Figures 7 and 8): PNGs written, bad input refused."""

import numpy as np
import pytest
import torch

from dpaudit.canaries import select_canaries
from dpaudit.data import load_dataset
from dpaudit.report.canary_plots import plot_canary_grid, plot_score_distribution


def test_plots_write_pngs(tmp_path):
    train, _, _ = load_dataset("digits", seed=0)
    x, y = train.tensors
    scores = np.random.default_rng(0).lognormal(size=200)
    sel = select_canaries(scores, "easy_medium_hard", k=3)
    p1 = plot_score_distribution(scores, sel, tmp_path / "dist.png")
    groups = sel.by_label()
    p2 = plot_canary_grid(
        {k: x[torch.as_tensor(v)] for k, v in groups.items()},
        tmp_path / "grid.png",
        targets_by_label={k: y[torch.as_tensor(v)] for k, v in groups.items()},
        scores_by_label={k: scores[v] for k, v in groups.items()},
    )
    for p in (p1, p2):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000
    with pytest.raises(ValueError, match="empty"):
        plot_canary_grid({}, tmp_path / "none.png")
