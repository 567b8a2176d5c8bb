"""The ROC figure's legend: curves that coincide exactly are drawn once and named together."""

import numpy as np

from dpaudit.report.plots import _merged_label, roc_figure
from dpaudit.stats.roc import theory_fpr


def test_merged_label_joins_what_differs_at_word_boundaries():
    assert _merged_label(["certified: mu >= 1.23 (scalar, 0.99 lower bound)",
                          "certified: mu >= 1.23 (mixture_lr, 0.99 lower bound)"]) == (
        "certified: mu >= 1.23 (scalar = mixture_lr, 0.99 lower bound)")
    assert _merged_label(["point, scalar", "point, score"]) == "point, scalar = score"
    assert _merged_label(["only one"]) == "only one"


def test_identical_attacks_share_their_legend_entries():
    # the claim coincides with the estimates here too, but a claim is not merged with them
    rng = np.random.default_rng(0)
    s_in, s_out = rng.normal(1, 1, 50), rng.normal(0, 1, 60)
    grid = theory_fpr()
    curve = grid ** 0.5
    fig = roc_figure(
        {"scalar": (s_in, s_out), "mixture_lr": (2 * s_in + 1, 2 * s_out + 1),
         "covariance": (s_in[::-1] * 0 + rng.normal(0, 1, 50), s_out)},
        theory={"claimed: x": curve.copy(), "estimate: mu (scalar, gdp)": curve,
                "estimate: mu (mixture_lr, gdp)": curve.copy()},
        points={"op, scalar": (0.1, 0.5), "op, mixture_lr": (0.1, 0.5)},
    )
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == [
        "empirical: scalar = mixture_lr (50 in, 60 out)", "empirical: covariance (50 in, 60 out)",
        "claimed: x", "estimate: mu (scalar = mixture_lr, gdp)", "op, scalar = mixture_lr",
        "chance"]
