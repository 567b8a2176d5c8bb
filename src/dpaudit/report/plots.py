"""Plots of an audit: empirical ROC over the theoretical curves, and score histograms.

Figures meant to stand alone in a paper: the title names the threat model and its numbers,
every panel has a legend and labelled axes, certified and estimated curves say which they are,
histogram bins follow the sample size, and the verdict is marked on the figure.

matplotlib is imported inside each function with the Agg backend, so importing dpaudit never
needs a display. Figures are written atomically (temp file + rename), so a reader never sees
half a PNG.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from dpaudit.report.files import atomic_write, p_text
from dpaudit.report.results import STATUSES
from dpaudit.stats import roc_curve
from dpaudit.stats.roc import theory_fpr

MAX_BINS = 50
# The verdict's colour on a figure: red for a certified violation, orange for an estimate
# above the claim, grey-blue for a claim whose premises could not all be seen (never the
# green of a verified claim), green for a verified claim with no evidence against it.
VERDICT_COLOURS = dict(zip(STATUSES, ("#c0392b", "#d68910", "#5d6d7e", "#1e8449"),
                           strict=True))


def pyplot():
    """matplotlib.pyplot with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Save ``fig`` to ``path`` atomically (parent folders created, format from the suffix,
    permissions from the umask like any file) and close it."""
    path = Path(path)
    fmt = path.suffix.lstrip(".") or "png"
    try:
        return atomic_write(path, lambda fh: fig.savefig(fh, dpi=dpi, format=fmt), binary=True)
    finally:
        pyplot().close(fig)


def score_bins(values, cap: int = MAX_BINS) -> np.ndarray:
    """Histogram bin edges chosen from the sample: numpy's 'auto' rule (the larger of
    Freedman-Diaconis and Sturges bins, i.e. about log2(n) + 1 for small n), at most ``cap``.

    For 20 scores this gives 6 bins, not 50 bins of which most are empty.
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    x = x[np.isfinite(x)]
    if x.size == 0:
        raise ValueError("values: no finite score to bin")
    if x.max() == x.min():
        return np.array([x.min() - 0.5, x.max() + 0.5])
    edges = np.histogram_bin_edges(x, bins="auto")
    if len(edges) - 1 > cap:
        edges = np.linspace(x.min(), x.max(), cap + 1)
    return edges


def verdict_colour(status: str | None) -> str:
    """The colour the verdict ``status`` is marked with (grey for an unknown status)."""
    return VERDICT_COLOURS.get(status or "", "0.3")


def _wrap(text: str, width_in: float, fontsize: float = 9) -> list[str]:
    """``text``'s lines wrapped to a figure ``width_in`` inches wide."""
    chars = max(40, int(width_in * 72 / (0.55 * fontsize)))
    return [w for line in text.splitlines() for w in (textwrap.wrap(line, chars) or [""])]


def add_header(fig, title: str, note: str = "", status: str | None = None) -> float:
    """The figure's header: ``title`` (wrapped to the width) and the verdict ``note`` in a box
    coloured by ``status``. Returns the figure fraction left below it for the panels."""
    w, h = fig.get_size_inches()
    lines = _wrap(title, w) if title else []
    line_in = 9 * 1.35 / 72
    used = 0.08
    if lines:
        fig.text(
            0.5, 1 - used / h, "\n".join(lines), ha="center", va="top", fontsize=9, gid="title"
        )
    used += len(lines) * line_in
    if note:
        colour = verdict_colour(status)
        note_lines = _wrap(note, w * 0.92, fontsize=9.5)  # bold text is a little wider
        fig.text(
            0.5,
            1 - (used + 0.1) / h,
            "\n".join(note_lines),
            ha="center",
            va="top",
            fontsize=9.5,
            fontweight="bold",
            color="white",
            gid="verdict",
            bbox={"boxstyle": "round,pad=0.3", "facecolor": colour, "edgecolor": colour},
        )
        used += 0.1 + 0.15 + len(note_lines) * 9.5 * 1.35 / 72
    return 1 - (used + 0.1) / h


def _common_prefix(texts: list[str]) -> str:
    """The longest common leading text (character by character)."""
    first = min(texts, key=len)
    n = next((i for i, ch in enumerate(first) if any(t[i] != ch for t in texts)), len(first))
    return first[:n]


def _merged_label(labels: list[str]) -> str:
    """One legend label for curves that coincide: the parts in which their labels differ
    joined by ' = ' ('certified: mu >= 1.23 (scalar = mixture_lr, 0.9971 lower bound)')."""
    if len(labels) == 1:
        return labels[0]
    prefix = _common_prefix(labels)
    prefix = prefix[: max((i + 1 for i, ch in enumerate(prefix) if not ch.isalnum()
                           and ch != "_"), default=0)]
    rest = [label[len(prefix):] for label in labels]
    suffix = _common_prefix([r[::-1] for r in rest])[::-1]
    cut = next((i for i, ch in enumerate(suffix) if not ch.isalnum() and ch != "_"), len(suffix))
    suffix = suffix[cut:]
    middles = [r[: len(r) - len(suffix)] if suffix else r for r in rest]
    return prefix + " = ".join(dict.fromkeys(middles)) + suffix


def _coinciding(items, same, kind=lambda label: "") -> list[tuple[str, object]]:
    """(label, value) pairs of one ``kind`` with equal values (``same``) merged into one, first
    value kept: a curve drawn exactly over another would hide it and leave its legend entry
    unexplained. Different kinds (a claim and a certified curve that coincide) stay apart."""
    groups: list[tuple[list[str], object]] = []
    for label, value in items:
        for labels, kept in groups:
            if kind(labels[0]) == kind(label) and same(kept, value):
                labels.append(label)
                break
        else:
            groups.append(([label], value))
    return [(_merged_label(labels), value) for labels, value in groups]


def _same_arrays(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def roc_figure(
    scores: Mapping[str, tuple[np.ndarray, np.ndarray]],
    theory: Mapping[str, np.ndarray] | None = None,
    title: str = "",
    points: Mapping[str, tuple[float, float]] | None = None,
    note: str = "",
    status: str | None = None,
):
    """The ROC figure of ``plot_roc`` (a matplotlib Figure, not saved)."""
    plt = pyplot()
    empirical = _coinciding(
        [(f"empirical: {name} ({len(s_in)} in, {len(s_out)} out)", roc_curve(s_in, s_out)[:2])
         for name, (s_in, s_out) in scores.items()], _same_arrays)
    curves = _coinciding(list((theory or {}).items()), np.array_equal,
                         kind=lambda label: label.split(":", 1)[0])
    marks = _coinciding(list((points or {}).items()), _same_arrays)
    n_items = len(empirical) + len(curves) + len(marks) + 1
    fig, axes = plt.subplots(1, 2, figsize=(12, 6.2 + 0.16 * n_items))
    grid = theory_fpr()
    for ax, log in zip(axes, (False, True), strict=True):
        for label, (fpr, tpr) in empirical:
            ax.step(fpr, tpr, where="post", lw=1.8, label=label)
        for label, tpr in curves:
            if label.startswith("certified"):
                style = ":"
            elif label.startswith("estimate"):
                style = "--"
            else:
                style = "-."
            ax.plot(grid, tpr, style, lw=2, label=label)
        for label, (x, y) in marks:
            ax.plot([x], [y], "o", ms=7, mfc="none", mew=2, label=label, clip_on=False)
        ax.plot([1e-6, 1], [1e-6, 1], color="grey", lw=0.5, label="chance")
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            lo = 0.5 / max(len(s[1]) for s in scores.values())
            ax.set_xlim(lo, 1)
            ax.set_ylim(lo, 1)
        else:
            ax.set_xlim(-0.01, 1.01)
            ax.set_ylim(-0.01, 1.01)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(("log-log ROC (low-FPR regime)" if log else "ROC"), fontsize=10)
        # below the panel: a legend inside would hide curves or the operating points
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    top = add_header(fig, title, note, status)
    entries = len(axes[0].get_legend_handles_labels()[0])
    bottom = (0.75 + 0.16 * entries) / fig.get_size_inches()[1]
    fig.subplots_adjust(
        left=0.07, right=0.98, wspace=0.25, top=top - 0.35 / fig.get_size_inches()[1], bottom=bottom
    )
    return fig


def plot_roc(
    scores: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | Path,
    theory: Mapping[str, np.ndarray] | None = None,
    title: str = "",
    points: Mapping[str, tuple[float, float]] | None = None,
    note: str = "",
    status: str | None = None,
) -> Path:
    """ROC of each attack (solid) with theoretical curves, linear and log-log panels.

    Args:
        scores: attack name -> (scores_in, scores_out).
        path: the PNG (or other suffix) to write.
        theory: label -> TPR curve over ``theory_fpr()``. Labels starting with "certified"
            are drawn dotted, "estimate" dashed, others (the claim) dash-dotted.
        title: the figure title (threat model, numbers).
        points: label -> one (FPR, TPR) point to mark (e.g. a certified operating point).
        note: the verdict line, boxed under the title.
        status: the verdict's status (``privacy_bug``, ``estimate_above_claim``,
            ``consistent``): the box's colour.

    Curves or points that coincide exactly (two scores that rank the canaries alike) are
    drawn once, with one legend entry naming both.
    """
    return save_figure(roc_figure(scores, theory, title, points, note, status), path)


def histogram_figure(
    scores: Mapping[str, tuple[np.ndarray, np.ndarray]],
    title: str = "",
    thresholds: Mapping[str, float] | None = None,
    note: str = "",
    status: str | None = None,
):
    """The figure of ``plot_score_histograms`` (a matplotlib Figure, not saved)."""
    plt = pyplot()
    k = len(scores)
    header = 1.0 + 0.17 * len(_wrap(title, max(7.0, 5.2 * k))) if title else 0.6
    fig, axes = plt.subplots(1, k, figsize=(max(7.0, 5.2 * k), 3.8 + header), squeeze=False)
    for ax, (name, (s_in, s_out)) in zip(axes[0], scores.items(), strict=True):
        both = np.concatenate([np.asarray(s_in), np.asarray(s_out)])
        bins = score_bins(both)
        ax.hist(
            s_out, bins=bins, alpha=0.6, label=f"non-members (out, n={len(s_out)})", density=True
        )
        ax.hist(s_in, bins=bins, alpha=0.6, label=f"members (in, n={len(s_in)})", density=True)
        t = (thresholds or {}).get(name)
        if isinstance(t, (int, float)) and np.isfinite(t):
            ax.axvline(t, color="k", ls="--", lw=1, label=f"claim-test threshold {t:.3g}")
        ax.set_title(f"{name}: {len(bins) - 1} bins for {both.size} scores", fontsize=10)
        ax.set_xlabel(f"{name} score")
        ax.set_ylabel("density")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout(rect=(0, 0, 1, add_header(fig, title, note, status)))
    return fig


def plot_score_histograms(
    scores: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | Path,
    title: str = "",
    thresholds: Mapping[str, float] | None = None,
    note: str = "",
    status: str | None = None,
) -> Path:
    """One panel per attack: densities of member (in) and non-member (out) scores.

    Args:
        scores: attack name -> (scores_in, scores_out).
        path: the PNG to write.
        title: the figure title (threat model, numbers).
        thresholds: attack name -> the claim test's threshold, drawn as a vertical line.
        note, status: the verdict, boxed under the title (see ``plot_roc``).

    Bins follow the pooled sample size (``score_bins``); the y-axis is a density, so groups
    of different sizes compare.
    """
    return save_figure(histogram_figure(scores, title, thresholds, note, status), path)


def white_box_figure(checks: Mapping[str, dict], title: str = "", note: str = "",
                     status: str | None = None):
    """The per-step white-box evidence: the noise per tensor and step against the claim (the
    noise the optimizer added when it was recorded, else the released noise floor), the
    noise's marginal law against the Gaussian (bin by bin), and the correlation of the noise
    across steps (the sketches' mean correlation by lag, or consecutive steps at the
    coordinates no example touches). A matplotlib Figure, not saved."""
    plt = pyplot()
    scale = checks.get("noise_scale") or checks.get("noise_floor") or {}
    ratios = (scale.get("details") or {}).get("ratio_per_step")
    marginal = checks.get("noise_marginal") or {}
    counts = (marginal.get("details") or {}).get("run_counts")
    fresh = checks.get("noise_freshness") or checks.get("noise_independence") or {}
    lags = (fresh.get("details") or {}).get("mean_correlation_by_lag") or (
        fresh.get("details") or {}).get("cosine_lag1")
    panels_wanted = [x for x in (ratios, counts, lags) if x is not None]
    if not panels_wanted:
        return None
    width = 5.5 * len(panels_wanted)
    header = 1.0 + 0.17 * len(_wrap(title, width)) if title else 0.6
    fig, axes = plt.subplots(1, len(panels_wanted), figsize=(width, 3.8 + header),
                             squeeze=False)
    panels = iter(axes[0])

    def verdict(check):
        word = "REFUTED" if check.get("rejected") else (
            "warning" if check.get("warning") else "passed")
        return f"{word}, {p_text(check.get('p_value', 1))}"

    if ratios is not None:
        ax = next(panels)
        names = list((scale.get("details") or {}).get("tensors", {}))
        r = np.asarray(ratios, dtype=float)
        for j in range(r.shape[0]):
            label = names[j] if j < len(names) else f"tensor {j}"
            ax.plot(np.arange(r.shape[1]), r[j], lw=1, label=label)
        ax.axhline(1.0, color="k", ls="--", lw=1, label="claimed noise (sigma C)")
        what = "added" if scale.get("name") == "noise_scale" else "released"
        ax.set_title(f"noise {what}, per tensor ({scale.get('name')}: {verdict(scale)})",
                     fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(f"{what} noise / claimed\n(sqrt(||noise||^2 / d) / sigma C)")
        positive = r[r > 0]
        if positive.size and positive.max() / positive.min() > 10:
            ax.set_yscale("log")
        ax.legend(fontsize=7, loc="best")
    if counts is not None:
        from dpaudit.stats.noise_law import marginal_edges, marginal_null

        ax = next(panels)
        c = np.asarray(counts, dtype=float)
        p, _, _ = marginal_null()
        expected = c.sum() * p
        e = marginal_edges()
        centre = np.concatenate([[e[0] - 0.25], (e[1:] + e[:-1]) / 2, [e[-1] + 0.25]])
        ax.plot(centre, c / np.maximum(expected, 1e-12), ".", ms=3, color="C0",
                label="observed / Gaussian expected, per bin")
        sd = 3.0 / np.sqrt(np.maximum(expected, 1e-12))
        inner = expected >= 5
        ax.fill_between(centre[inner], 1 - sd[inner], 1 + sd[inner], color="0.85",
                        label="+-3 sd of a Gaussian's counts")
        ax.axhline(1.0, color="k", ls="--", lw=1)
        ax.set_yscale("symlog", linthresh=1.0)  # empty bins (0) and far tails (x 100) alike
        ax.set_xlim(-5.5, 5.5)
        ax.set_title(f"noise marginal law ({verdict(marginal)})", fontsize=9)
        ax.set_xlabel("noise / sigma C (bin centre)")
        ax.set_ylabel("count / expected count")
        ax.legend(fontsize=7, loc="best")
    if lags is not None:
        ax = next(panels)
        c = np.asarray(lags, dtype=float)
        if fresh.get("name") == "noise_freshness":
            ax.plot(np.arange(1, c.size + 1), c, "o-", lw=1, color="C3",
                    label="mean correlation of steps this many apart")
            ax.set_xlabel("steps apart")
        else:
            sd = float((fresh.get("details") or {}).get("null_sd", 0.0))
            ax.plot(np.arange(1, c.size + 1), c, lw=1, color="C3",
                    label="cos(noise_t, noise_t+1) at untouched coordinates")
            if sd > 0:
                ax.axhspan(-3 * sd, 3 * sd, color="0.85", label="+-3 sd of independent noise")
            ax.set_xlabel("optimizer step")
        ax.axhline(0.0, color="k", ls="--", lw=1)
        ax.set_ylim(-1.05, 1.05)
        ax.set_title(f"noise across steps ({fresh.get('name')}: {verdict(fresh)})", fontsize=9)
        ax.set_ylabel("correlation")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout(rect=(0, 0, 1, add_header(fig, title, note, status)))
    return fig


def plot_white_box(checks: Mapping[str, dict], path: str | Path, title: str = "",
                   note: str = "", status: str | None = None) -> Path | None:
    """``white_box_figure`` saved to ``path`` (None when there is nothing per step to draw).

    Args:
        checks: the audit's white-box checks (``results["white_box"]["checks"]``).
        path: the PNG to write.
        title, note, status: the figure's header and verdict box (see ``plot_roc``).
    """
    fig = white_box_figure(checks, title, note, status)
    return None if fig is None else save_figure(fig, path)


def plot_sweep(rows: list[dict], key: str, path: str | Path, title: str = "") -> Path | None:
    """A sweep's swept setting ``key`` against the certified, estimated and claimed epsilon
    (left) and the effective noise's upper bound against the configured one (right), each
    job's point in its verdict's colour. ``rows``: ``collect_sweep``'s jobs, with ``key``'s
    value in ``row["x"]``. None when no row has a numeric x."""
    pts = sorted((r for r in rows if isinstance(r.get("x"), (int, float))), key=lambda r: r["x"])
    if not pts:
        return None
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    x = [r["x"] for r in pts]

    def finite(v):
        return float(v) if isinstance(v, (int, float)) and np.isfinite(v) else np.nan

    for name, style in (("eps_claimed", "--"), ("eps_estimate", ":"), ("eps_certified", "-")):
        left.plot(x, [finite(r[name]) for r in pts], style, label=name.replace("_", " "))
    left.scatter(x, [finite(r["eps_certified"]) for r in pts], zorder=3,
                 c=[verdict_colour(r["status"]) for r in pts])
    left.set_xlabel(key)
    left.set_ylabel("epsilon")
    left.legend(fontsize=8)
    right.plot(x, [finite(r.get("sigma_configured")) for r in pts], "--", label="configured sigma")
    right.plot(x, [finite(r.get("sigma_upper")) for r in pts], "-", label="sigma_upper (certified)")
    right.scatter(x, [finite(r.get("sigma_upper")) for r in pts], zorder=3,
                  c=[verdict_colour(r["status"]) for r in pts])
    right.set_xlabel(key)
    right.set_ylabel("noise multiplier")
    right.set_yscale("log")
    right.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
