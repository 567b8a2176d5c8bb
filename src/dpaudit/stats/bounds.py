"""``epsilon_lower_bound``: one entry point for every empirical epsilon lower bound (DESIGN 4.5).

Methods and their options (anything else raises ValueError naming the option):

* ``"clopper_pearson"``, ``"gdp"``: threshold_selection ("bonferroni" | "split" | "naive"),
  seed (split only), n_candidates (bonferroni only). See ``clopper_pearson``.
* ``"one_run"``: grid (fractions of m for k+ / k-). See ``one_run``.
* ``"density"``, ``"density_tv"``: bin_rule ("eq4.2" | "eq4.1"), n_bins, end_quantiles,
  edges. See ``density``; ``density_tv`` assumes a Gaussian mechanism.
* ``"gaussian"``: check_level. Parametric fit assuming Gaussian equal-variance scores
  (checked and reported); see ``gaussian_fit``.
"""

from __future__ import annotations

from typing import Any

from dpaudit.stats._validate import check_open_unit, check_scores
from dpaudit.stats.clopper_pearson import threshold_bound
from dpaudit.stats.density import density_bound
from dpaudit.stats.gaussian_fit import gaussian_bound
from dpaudit.stats.one_run import one_run_bound
from dpaudit.stats.result import EpsilonBound

_BIN_OPTIONS = frozenset({"bin_rule", "n_bins", "end_quantiles", "edges"})
METHOD_OPTIONS: dict[str, frozenset[str]] = {
    "clopper_pearson": frozenset({"threshold_selection", "seed", "n_candidates"}),
    "gdp": frozenset({"threshold_selection", "seed", "n_candidates"}),
    "one_run": frozenset({"grid"}),
    "density": _BIN_OPTIONS,
    "density_tv": _BIN_OPTIONS,
    "gaussian": frozenset({"check_level"}),
}
METHODS = tuple(METHOD_OPTIONS)


def epsilon_lower_bound(
    scores_in,
    scores_out,
    *,
    delta: float,
    confidence: float = 0.95,
    method: str,
    **options: Any,
) -> EpsilonBound:
    """Certified (at ``confidence``) lower bound on epsilon at ``delta`` from attack scores.

    Higher score = "member". ``scores_in``: scores of the targets that were in the training
    set (or canaries included); ``scores_out``: those that were not. Perfect separation is a
    normal case: the result is the largest epsilon the sample sizes can certify.
    """
    if method not in METHOD_OPTIONS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    unknown = sorted(set(options) - METHOD_OPTIONS[method])
    if unknown:
        raise ValueError(
            f"option(s) {unknown} do not belong to method={method!r}; "
            f"allowed: {sorted(METHOD_OPTIONS[method])}"
        )
    s_in = check_scores(scores_in, "scores_in")
    s_out = check_scores(scores_out, "scores_out")
    delta = check_open_unit(delta, "delta")
    confidence = check_open_unit(confidence, "confidence")
    common = {"delta": delta, "confidence": confidence}
    if method in ("clopper_pearson", "gdp"):
        sel = options.get("threshold_selection", "bonferroni")
        if "seed" in options and sel != "split":
            raise ValueError("option 'seed' only applies to threshold_selection='split'")
        if "n_candidates" in options and sel != "bonferroni":
            raise ValueError(
                "option 'n_candidates' only applies to threshold_selection='bonferroni'"
            )
        return threshold_bound(method, s_in, s_out, **common, **options)
    if method == "one_run":
        return one_run_bound(s_in, s_out, **common, **options)
    if method == "gaussian":
        return gaussian_bound(s_in, s_out, **common, **options)
    return density_bound(s_in, s_out, **common, tv_only=method == "density_tv", **options)
