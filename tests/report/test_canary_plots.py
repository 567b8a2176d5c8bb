"""Figures of canary choice (seed 001 Figures 7 and 8): PNGs written, bad input refused."""

import numpy as np
import pytest
import torch

from dpaudit.canaries import select_canaries
from dpaudit.data import load_dataset
from dpaudit.report.canary_plots import (
    plot_canary_grid,
    plot_roc_by_class,
    plot_score_distribution,
)


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


def test_roc_by_class_draws_a_panel_per_class_with_auc_and_predictions(tmp_path, monkeypatch):
    """Figure 3's layout: one panel per class; each attack's legend carries its AUC and each
    prediction the mean of Phi(mu_k / sqrt 2) over its targets (mu = 0: AUC 0.5 exactly)."""
    from dpaudit.report import canary_plots

    rng = np.random.default_rng(0)
    scores = {
        c: {a: (rng.normal(m, 1, 200), rng.normal(0, 1, 200)) for a in ("covariance", "scalar")}
        for c, m in (("easy", 2.0), ("hard", 0.1))
    }
    predicted = {"predicted": {"easy": [0.0, 0.0], "hard": [0.0]}}
    figures = []
    real = canary_plots.save_figure
    monkeypatch.setattr(
        canary_plots, "save_figure", lambda fig, path: figures.append(fig) or real(fig, path)
    )
    path = plot_roc_by_class(scores, tmp_path / "roc.png", predicted, title="t")
    assert path.stat().st_size > 0
    (fig,) = figures
    assert [ax.get_title() for ax in fig.axes] == ["easy", "hard"]
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels[0].startswith("covariance (AUC 0.9") and labels[2] == "predicted (AUC 0.500)"
