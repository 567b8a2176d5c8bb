"""Epsilon from one run by the guess-count recursion: the certified epsilon lower bound
(``fdp_one_run_certified_bound``) and the GDP estimate (``fdp_one_run_bound``).

Both are the same loop with a different kernel (the family of claims refuted): the guesses'
counts are tested against every claim of the family, and the certified parameter is the
infimum of the claims not refuted (``confidence_set``). How many guesses (``design``):

* default: no claim is known, each piece of the parameter axis gets its own guess count
  (``design.piece_rule``), every claim tested at the full level;
* ``design_mu``: the claim is known (an audit passes the accountant's mu): one pair of guess
  counts (k+ "in" on the top scores, k- "out" on the bottom ones; ``design.claim_guess_pair``),
  the one that maximises the median result when the scores are ideal at that mu, full level;
  one-sided (k, 0) or two-sided (k, k), whichever the design prefers (``two_sided=False``:
  one-sided only);
* ``guess_fractions`` / ``sides``: an explicit candidate set (fractions of m on the sides),
  each candidate tested at (1 - confidence) / G (Bonferroni), the best kept.

Design: each canary a member independently with probability 1/2 (``inclusion``; other values
are refused, and so is a member count implausible under 1/2: ``stats.inclusion``).
"""

from __future__ import annotations

import numpy as np

from dpaudit._validate import check_delta
from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.stats.one_run.confidence_set import infimum_not_refuted
from dpaudit.stats.one_run.design import Family, check_design, claim_guess_pair, piece_rule
from dpaudit.stats.one_run.guesses import MIN_GUESSES, GuessTable, guess_table
from dpaudit.stats.one_run.recursion import largest_refuted
from dpaudit.stats.result import EpsilonBound

ASSUME_FDP_ONE_RUN = (
    "GDP-shaped trade-off curve (f-DP one-run, Mahloujifar et al. 2024; epsilon of the mu-GDP "
    "curve at the lower confidence value of mu)"
)
DESIGN_OPTIONS = ("design_mu", "two_sided")


def certified_parameter(
    scores_in, scores_out, family: Family, confidence: float, method: str, **options
) -> tuple[float, GuessTable, int | None, dict]:
    """The largest parameter of ``family`` certified refuted by the guesses: (value, table,
    index of the witness candidate or None, details). Options: ``design_mu`` (with
    ``two_sided``, default True) or the explicit candidates' ``guess_fractions`` / ``sides``
    (not both), ``inclusion``, ``seed``."""
    two_sided = options.pop("two_sided", True)
    if not isinstance(two_sided, bool):
        raise ValueError(f"two_sided must be True or False, got {two_sided!r}")
    design_mu, explicit = check_design(method, options.pop("design_mu", None), options)
    level = 1.0 - confidence
    if explicit:
        table = guess_table(scores_in, scores_out, method=method, **options)
        details = {**table.details, "guess_counts": "explicit candidates (Bonferroni)"}
        if not table.k_plus.size:
            return 0.0, table, None, details
        level = table.level(confidence)
        values = largest_refuted(
            table.guesses, table.correct, table.one_sided, m=table.m, level=level,
            roc_inverse=family.roc_inverse, cap=family.cap, prune=True,
        )
        best, report = table.best(values, "mu" if family.name == "gdp" else "epsilon", level)
        return float(values[best]), table, best, {**details, **report}
    base = guess_table(scores_in, scores_out, method=method, pairs=[], **options)
    m = base.m
    if m < 2 * MIN_GUESSES:
        return 0.0, base, None, {**base.details,
                                 "note": f"fewer than {2 * MIN_GUESSES} canaries (m={m})"}
    if design_mu is not None:
        pair = claim_guess_pair(m, level, family, design_mu, two_sided)
        table = base.counts([pair])
        value = float(largest_refuted(
            table.guesses, table.correct, table.one_sided, m=m, level=level,
            roc_inverse=family.roc_inverse, cap=family.cap,
        )[0])
        details = {**table.details, "design_mu": design_mu, "level": level,
                   "two_sided": two_sided, **table.witness(0)}
        return value, table, 0, details
    rule = piece_rule(m, level, family)
    table = base.counts([(int(k), 0) for k in np.unique(rule.ks)])
    value, piece = infimum_not_refuted(table, rule)
    k = int(rule.ks[piece])
    witness = int(np.searchsorted(table.k_plus, k))
    details = {**table.details, "guess_counts": "per claim (design.piece_rule)",
               "level": level, "pieces": int(rule.starts.size), **table.witness(witness)}
    return value, table, witness, details


def _common(method, confidence, delta, scores_in, scores_out) -> dict:
    return {
        "method": method,
        "confidence": confidence,
        "delta": delta,
        "n_in": int(np.size(scores_in)),
        "n_out": int(np.size(scores_out)),
    }


def _confidence(confidence) -> float:
    confidence = float(confidence)
    if not (np.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return confidence


def fdp_one_run_bound(
    scores_in, scores_out, *, delta: float, confidence: float, **options
) -> EpsilonBound:
    """Epsilon estimate from the f-DP one-run audit, assuming a GDP-shaped trade-off curve:
    epsilon at ``delta`` of mu_lower-GDP, mu_lower the certified "not mu-GDP for any smaller
    mu" (module doc for the guess counts).

    ``scores_in`` / ``scores_out``: scores (higher = member) of the canaries included /
    excluded, each included independently with probability 1/2 (a split implausible under 1/2
    raises ValueError naming ``inclusion``). ``delta`` in (0, 1) (delta = 0 is refused: every
    mu > 0 has infinite epsilon there); ``confidence`` in (0, 1). Options: ``design_mu``,
    ``guess_fractions``, ``sides``, ``inclusion`` (only 0.5), ``seed`` (the random order of
    tied scores, default 0), ``two_sided`` (with ``design_mu``: allow "out" guesses too,
    default True). ``details``: the design and the witness guess count.
    """
    delta = check_delta(delta, why="for fdp_one_run (epsilon of mu-GDP is infinite at "
                        "delta = 0)")
    confidence = _confidence(confidence)
    mu_lower, table, best, details = certified_parameter(
        scores_in, scores_out, Family("gdp"), confidence, "fdp_one_run", **options
    )
    epsilon = gdp_epsilon(mu_lower, delta) if mu_lower > 0 else 0.0
    return EpsilonBound(
        epsilon=float(epsilon),
        threshold=table.threshold(best) if mu_lower > 0 and best is not None else None,
        mu_lower=mu_lower,
        details=details,
        assumption=ASSUME_FDP_ONE_RUN,
        **_common("fdp_one_run", confidence, delta, scores_in, scores_out),
    )


def fdp_one_run_certified_bound(
    scores_in, scores_out, *, delta: float, confidence: float, **options
) -> EpsilonBound:
    """Certified epsilon lower bound: the infimum of the epsilons whose (epsilon, delta)-DP
    the guesses do not refute (Mahloujifar et al.'s recursion on the (epsilon, delta) curve).

    Valid for canaries trained together (any interaction), each included independently w.p.
    1/2. ``delta`` in [0, 1), ``confidence`` in (0, 1); options as ``fdp_one_run_bound``
    (``design_mu``, ``two_sided``, ``guess_fractions``, ``sides``, ``inclusion``, ``seed``).
    ``details``: the design and the witness guess count (side, counts, thresholds).
    """
    delta = check_delta(delta, zero_ok=True)
    confidence = _confidence(confidence)
    eps, table, best, details = certified_parameter(
        scores_in, scores_out, Family("epsdelta", delta), confidence, "fdp_one_run_certified",
        **options,
    )
    return EpsilonBound(
        epsilon=float(eps),
        threshold=table.threshold(best) if eps > 0 and best is not None else None,
        details=details,
        **_common("fdp_one_run_certified", confidence, delta, scores_in, scores_out),
    )


__all__ = [
    "ASSUME_FDP_ONE_RUN",
    "DESIGN_OPTIONS",
    "certified_parameter",
    "fdp_one_run_bound",
    "fdp_one_run_certified_bound",
]
