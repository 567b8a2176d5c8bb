"""Plot and JSON helpers of the mean-lab tasks (empirical solid, theory dotted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpaudit.report.files import write_json as report_write_json
from dpaudit.report.plots import pyplot as _pyplot
from dpaudit.report.plots import save_figure, score_bins
from dpaudit.report.provenance import stamped

FPR_GRID = np.linspace(0.0, 1.0, 201)


def write_json(output_dir, obj: dict, name: str = "results.json", task: str | None = None) -> Path:
    """Write ``obj`` as JSON into ``output_dir`` (atomically, via ``dpaudit.report``), with
    the schema version, provenance and ``task`` name every results file carries (added to
    ``obj`` too, so that what a task returns is what it wrote; ``dpaudit-aggregate`` lists a
    sweep's non-audit jobs by their task)."""
    if task is not None:
        obj.setdefault("task", task)
    obj.update(stamped(obj))
    return report_write_json(Path(output_dir) / name, obj)


def _save(fig, path) -> Path:
    return save_figure(fig, path, dpi=110)


def roc_figure(path, panels: list[dict], title: str = "") -> Path:
    """One ROC panel per dict: {"title", "curves": [{"label", "fpr", "tpr", "theory": [
    {"label", "fpr", "tpr", "style"}]}]}. Empirical curves solid, theory dotted/dashed."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.6), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for i, c in enumerate(panel["curves"]):
            color = f"C{i}"
            ax.plot(c["fpr"], c["tpr"], "-", color=color, lw=1.6, label=f"{c['label']} (empirical)")
            for th in c.get("theory", []):
                ax.plot(
                    th["fpr"],
                    th["tpr"],
                    th.get("style", ":"),
                    color=color,
                    lw=1.6,
                    label=th["label"],
                )
        ax.plot([0, 1], [0, 1], color="0.8", lw=0.8, label="chance")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(panel.get("title", ""))
        ax.legend(fontsize=7, loc="lower right")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.01)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def histogram_figure(path, panels: list[dict]) -> Path:
    """Histograms of the score under H0 / H1 with the N(-m/2, m), N(m/2, m) densities dotted
    (bins from the sample size, ``score_bins``; y-axis a density)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.2), squeeze=False)
    for ax, p in zip(axes[0], panels, strict=True):
        m = p["m"]
        lo = min(p["out"].min(), p["in"].min())
        hi = max(p["out"].max(), p["in"].max())
        bins = score_bins(np.concatenate([p["out"], p["in"]]))
        ax.hist(p["out"], bins, density=True, alpha=0.45, color="C0", label="H0 (out)")
        ax.hist(p["in"], bins, density=True, alpha=0.45, color="C3", label="H1 (in)")
        x = np.linspace(lo, hi, 400)
        for mu, color, lab in ((-m / 2, "C0", "N(-m*/2, m*)"), (m / 2, "C3", "N(m*/2, m*)")):
            dens = np.exp(-((x - mu) ** 2) / (2 * m)) / np.sqrt(2 * np.pi * m)
            ax.plot(x, dens, ":", color=color, lw=2, label=lab)
        ax.set_title(f"{p['title']} (m* = {m:.2f})")
        ax.set_xlabel("LR score (Eq. 5)")
        ax.set_ylabel("density")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def line_figure(
    path, series: list[dict], xlabel: str, ylabel: str, title: str = "", logx: bool = False
) -> Path:
    """Lines {"x", "y", "label", "style"} on one axis (empirical "-o", theory ":")."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4.4))
    for i, s in enumerate(series):
        ax.plot(
            s["x"],
            s["y"],
            s.get("style", "-o"),
            color=s.get("color", f"C{i}"),
            lw=1.6,
            ms=4,
            label=s["label"],
        )
    if logx:
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.set_xscale("log")
        ax.set_xticks(sorted({float(v) for s in series for v in s["x"]}))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)
