"""Figures of canary choice: candidates' Mahalanobis distribution with the chosen ones marked
(seed 001 Figure 7), an image grid of easy / medium / hard input canaries (Figure 8), and the
ROC of each attack per target class with the predicted leakage (Figure 3).
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
from dpaudit.stats import gdp_auc, gdp_tradeoff
from dpaudit.stats.roc import auc, roc_curve, theory_fpr

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


def plot_roc_by_class(
    scores: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]],
    path: str | Path,
    predicted: dict[str, dict[str, np.ndarray]] | None = None,
    title: str = "",
) -> Path:
    """Seed 001 Figure 3's layout: one log-log ROC panel per target class, every attack in it.

    Args:
        scores: class (e.g. "easy") -> attack -> (scores_in, scores_out).
        path: the PNG to write.
        predicted: label -> class -> the per-target separations mu of a Gaussian prediction;
            each drawn dashed / dotted as the mean over targets of Phi(Phi^-1(FPR) + mu_k),
            the ROC that pooling the targets' standardised scores would have if it held.
        title: the figure title.
    """
    plt = _pyplot()
    k = len(scores)
    fig, axes = plt.subplots(1, k, figsize=(4.2 * k, 4.6), squeeze=False)
    grid = theory_fpr()
    for ax, (cls, by_attack) in zip(axes[0], scores.items(), strict=True):
        n_out = 1
        for attack, (s_in, s_out) in by_attack.items():
            fpr, tpr, _ = roc_curve(s_in, s_out)
            label = f"{attack} (AUC {auc(s_in, s_out):.3f})"
            ax.step(fpr, tpr, where="post", lw=1.6, label=label)
            n_out = max(n_out, len(s_out))
        styles = ("--", ":", "-.")
        for (label, by_class), style in zip((predicted or {}).items(), styles, strict=False):
            mus = by_class.get(cls)
            if mus is None or not len(mus):
                continue
            tpr = np.mean([gdp_tradeoff(grid, float(u)) for u in mus], axis=0)
            area = float(np.mean([gdp_auc(float(u)) for u in mus]))
            ax.plot(grid, tpr, style, color="k", lw=1.2, label=f"{label} (AUC {area:.3f})")
        lo = 0.5 / n_out
        ax.plot([lo, 1], [lo, 1], color="grey", lw=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, 1)
        ax.set_ylim(lo, 1)
        ax.set_title(cls, fontsize=10)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.legend(fontsize=8, loc="lower right", frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
