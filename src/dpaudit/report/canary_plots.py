"""Figures of canary choice: candidates' Mahalanobis distribution with the chosen ones marked
(seed 001 Figure 7), and an image grid of easy / medium / hard input canaries (Figure 8).
matplotlib (Agg) is imported inside the functions.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from dpaudit._validate import check_scores
from dpaudit.canaries.ranking import Selection
from dpaudit.report.plots import pyplot as _pyplot
from dpaudit.report.plots import save_figure, score_bins

_COLOURS = {"easy": "tab:red", "medium": "tab:orange", "hard": "tab:blue", "top": "tab:red"}


def plot_score_distribution(
    scores, selection: Selection | None, path: str | Path, title: str = ""
) -> Path:
    """Histogram of candidates' scores (log x-axis when all positive), chosen ones as lines.

    Bins follow the number of candidates (``dpaudit.report.plots.score_bins``); the legend
    names the histogram and each selection label.
    """
    s = check_scores(scores, "scores")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    log = bool(np.all(s > 0)) and s.max() > s.min()
    if log:  # the sample-size rule on log scores, so bins look even on the log axis
        bins = np.exp(score_bins(np.log(s)))
    else:
        bins = score_bins(s)
    ax.hist(s, bins=bins, color="0.7", edgecolor="0.4", label=f"candidates (n={s.size})")
    if log:
        ax.set_xscale("log")
    if selection is not None:
        seen = set()
        for i, lab in zip(selection.indices, selection.labels, strict=True):
            colour = _COLOURS.get(lab, "tab:green")
            ax.axvline(s[i], color=colour, lw=1.5, label=None if lab in seen else lab)
            seen.add(lab)
    ax.legend(frameon=False, fontsize=8)
    ax.set_xlabel("Mahalanobis score  ||g - mu_0||^2_P")
    ax.set_ylabel("number of candidates")
    ax.set_title(title or f"{s.size} candidates")
    fig.tight_layout()
    return save_figure(fig, path)


def _to_image(x: torch.Tensor) -> np.ndarray:
    a = x.detach().cpu().double().numpy()
    if a.ndim == 3 and a.shape[0] in (1, 3):
        a = a[0] if a.shape[0] == 1 else np.transpose(a, (1, 2, 0))
    elif a.ndim == 1:
        side = math.isqrt(a.size)
        if side * side != a.size:
            raise ValueError(f"cannot show a flat input of length {a.size} as an image")
        a = a.reshape(side, side)
    if a.ndim == 3:  # colour: rescale to [0, 1]
        a = (a - a.min()) / max(a.max() - a.min(), 1e-12)
    return a


def plot_canary_grid(
    inputs_by_label: dict[str, torch.Tensor],
    path: str | Path,
    targets_by_label: dict[str, torch.Tensor] | None = None,
    scores_by_label: dict[str, np.ndarray] | None = None,
) -> Path:
    """One row per label (e.g. easy / medium / hard), one column per canary image."""
    if not inputs_by_label:
        raise ValueError("inputs_by_label is empty")
    plt = _pyplot()
    rows = len(inputs_by_label)
    cols = max(int(v.shape[0]) for v in inputs_by_label.values())
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols + 0.8, 1.8 * rows), squeeze=False)
    for r, (lab, xs) in enumerate(inputs_by_label.items()):
        for c in range(cols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= xs.shape[0]:
                ax.axis("off")
                continue
            ax.imshow(_to_image(xs[c]), cmap="gray")
            parts = []
            if targets_by_label is not None:
                parts.append(f"y={int(targets_by_label[lab][c])}")
            if scores_by_label is not None:
                parts.append(f"m={float(scores_by_label[lab][c]):.3g}")
            ax.set_title(" ".join(parts), fontsize=8)
            if c == 0:
                ax.set_ylabel(lab)
    fig.tight_layout()
    return save_figure(fig, path)
