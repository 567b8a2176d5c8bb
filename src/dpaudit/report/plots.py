"""Plots of an audit: empirical ROC over the theoretical curves, and score histograms.

matplotlib is imported inside each function with the Agg backend, so importing dpaudit never
needs a display.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from dpaudit.stats import roc_curve


def pyplot():
    """matplotlib.pyplot with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Save ``fig`` to ``path`` (parent folders created) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def plot_roc(
    scores: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | Path,
    theory: Mapping[str, np.ndarray] | None = None,
    title: str = "",
    points: Mapping[str, tuple[float, float]] | None = None,
    note: str = "",
) -> Path:
    """ROC of each attack (solid) with theoretical curves (dotted), linear and log-log panels.

    ``scores`` maps an attack name to (scores_in, scores_out); ``theory`` maps a label to a
    TPR curve over ``theory_fpr()`` (the claimed curve, a certified GDP curve, ...);
    ``points`` maps a label to one (FPR, TPR) point to mark (e.g. a certified operating
    point); ``note`` is printed under the title (e.g. the verdict).
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    grid = theory_fpr()
    for ax, log in zip(axes, (False, True), strict=True):
        for name, (s_in, s_out) in scores.items():
            fpr, tpr, _ = roc_curve(s_in, s_out)
            ax.step(fpr, tpr, where="post", label=f"{name} (empirical)")
        for label, tpr in (theory or {}).items():
            ax.plot(grid, tpr, ":", lw=2, label=label)
        for label, (x, y) in (points or {}).items():
            ax.plot([x], [y], "o", ms=7, mfc="none", mew=2, label=label)
        ax.plot([1e-6, 1], [1e-6, 1], color="grey", lw=0.5, label="chance")
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            lo = 0.5 / max(len(s[1]) for s in scores.values())
            ax.set_xlim(lo, 1)
            ax.set_ylim(lo, 1)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(("log-log " if log else "") + "ROC")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def theory_fpr() -> np.ndarray:
    """The FPR grid on which theoretical ROC curves are evaluated for plotting."""
    return np.logspace(-5, 0, 200)


def plot_score_histograms(
    scores: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | Path, title: str = ""
) -> Path:
    """One panel per attack: histograms of member (in) and non-member (out) scores."""
    plt = pyplot()
    k = len(scores)
    fig, axes = plt.subplots(1, k, figsize=(4.5 * k, 3.5), squeeze=False)
    for ax, (name, (s_in, s_out)) in zip(axes[0], scores.items(), strict=True):
        both = np.concatenate([s_in, s_out])
        bins = np.linspace(both.min(), both.max(), 50)
        ax.hist(s_out, bins=bins, alpha=0.6, label=f"out (n={len(s_out)})", density=True)
        ax.hist(s_in, bins=bins, alpha=0.6, label=f"in (n={len(s_in)})", density=True)
        ax.set_title(name)
        ax.set_xlabel("score")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)
