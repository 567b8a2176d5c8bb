"""Certified one-run evidence on a claimed trade-off curve (proofs: ``docs/one_run_fdp.md``).

One training run, m canaries, each a member independently with probability 1/2, scores that
may depend on each other in any way (canaries trained together). The guess-count recursion of
Mahloujifar, Melis & Chaudhuri (arXiv 2410.22235, Algorithm 3; ``recursion``) bounds
how many of r released guesses can be right when the training is f-DP with respect to every
canary's inclusion, whatever the other canaries do. Testing it at the *claimed* curve is a
certified test of the claim, with no model of the scores:

* ``one_run_claim_test``: reject the claimed curve f (the accountant's: GDP every step, the
  PRV privacy profile's curve when subsampled) when the correct guesses could not come from
  an f-DP training;
* ``one_run_mu_lower``: the largest mu whose mu-GDP the same guesses refute ("not mu-GDP for
  any mu < mu_lower", certified);
* ``one_run_noise_upper_bound``: the smallest noise multiplier of the DP-SGD family (same q,
  T, C) whose curve they refute (a correct run's sigma stays below it).

The guesses (``claim_table``): ONE count of "in" guesses fixed by the claim before the scores
are seen (``design``), tested at the full level; or, on request, explicit candidates each at
(1 - confidence) / G (Bonferroni). The certified epsilon of the same recursion is
``bounds.fdp_one_run_certified_bound``.

What it does not do: model the guesses by order statistics of independent canaries (Xiang et
al. 2025). That model is false for canaries that interact: ``docs/one_run_fdp.md`` gives a
mechanism that is exactly mu-GDP for every canary whose correct-guess counts exceed the
independent-canary distribution with probability p of the designer's choosing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpaudit._jsonable import to_jsonable
from dpaudit.stats.claim import CurveError, smallest_rejected_sigma
from dpaudit.stats.one_run.design import (
    Family,
    check_design,
    claim_guess_pair,
    soonest_guess_pair,
)
from dpaudit.stats.one_run.guesses import (
    MIN_GUESSES,
    GuessTable,
    guess_table,
)
from dpaudit.stats.one_run.recursion import (
    EPSILON_CAP,
    MU_CAP,
    RocInverse,
    largest_refuted,
    refutes,
    roc_inverse_of,
    shrink_inverse,
)


@dataclass(frozen=True)
class OneRunClaimTest:
    """Outcome of the one-run claim test (certified for canaries that interact).

    ``rejected``: some candidate's correct guesses refute the claimed curve at
    ``level_per_candidate`` = (1 - confidence) / ``n_candidates``. The witness (``side``,
    counts, ``threshold``) is the refuting candidate with the most correct guesses per guess,
    or, when none refutes, the candidate with the best precision. ``note`` says why nothing
    could be tested (too few canaries).
    """

    rejected: bool
    confidence: float
    level_per_candidate: float
    n_candidates: int
    m: int
    side: str | None
    k_plus: int | None
    k_minus: int | None
    guesses: int | None
    correct: int | None
    threshold: float | None
    note: str = ""

    def to_dict(self) -> dict:
        """Plain-JSON dictionary."""
        return to_jsonable(dict(self.__dict__))


def _symmetric(tradeoff, tol: float = 1e-6) -> bool:
    """True when the curve is its own inverse on a grid: f(f(alpha)) = alpha wherever f is
    strictly decreasing (a symmetric trade-off curve; GDP and privacy profiles are)."""
    alpha = np.linspace(0.0, 1.0, 2001)
    f = np.asarray(tradeoff(alpha), dtype=np.float64)
    back = np.asarray(tradeoff(np.clip(f, 0.0, 1.0)), dtype=np.float64)
    strict = np.concatenate([np.diff(f) < -1e-12, [False]]) & (f > 0)
    return bool(np.all(np.abs(back - alpha)[strict] <= tol))


def _refuted(table: GuessTable, roc_inverse: RocInverse, level: float) -> np.ndarray:
    """Per candidate: do its guesses refute the curve whose inverse ROC is given?"""
    if not table.k_plus.size:
        return np.zeros(0, dtype=bool)
    return refutes(
        table.guesses, table.correct, 0.0, table.one_sided, m=table.m, level=level,
        roc_inverse=lambda y, _: shrink_inverse(np.asarray(roc_inverse(y), dtype=np.float64), y),
    )


def claim_counts(
    base: GuessTable, level: float, *, design_mu: float | None = None,
    roc_inverse: RocInverse | None = None, two_sided: bool = True,
) -> GuessTable:
    """``base`` (the scores, no candidates yet) with ONE pair of guess counts (k+ "in", k-
    "out") fixed by the claim for a test at ``level`` (``design``): ``claim_guess_pair`` for
    the GDP family at ``design_mu`` (the claim's mu), else ``soonest_guess_pair`` of the
    curve ``roc_inverse``; ``two_sided=False``: "in" guesses only. No candidate with fewer
    than 2 ``MIN_GUESSES`` canaries."""
    if base.m < 2 * MIN_GUESSES:
        return base
    if design_mu is not None:
        pair = claim_guess_pair(base.m, level, Family("gdp"), float(design_mu), two_sided)
    elif roc_inverse is not None:
        pair = soonest_guess_pair(base.m, level, roc_inverse, two_sided)
    else:
        raise ValueError("claim_counts needs design_mu or roc_inverse to fix the guess count")
    return base.counts([pair])


def claim_table(
    scores_in, scores_out, *, confidence: float, design_mu: float | None = None,
    roc_inverse: RocInverse | None = None, method: str = "one_run_claim", **options,
) -> GuessTable:
    """The guesses of a one-run claim test at the full level 1 - ``confidence``: ONE pair of
    guess counts fixed by the claim before the scores are seen (``claim_counts``: the
    claim's ``design_mu``, else the curve ``roc_inverse``; ``two_sided`` in ``options``,
    default True). With ``guess_fractions`` / ``sides`` in ``options`` the explicit
    candidates instead, each at (1 - confidence) / G. Options also: ``inclusion`` (1/2),
    ``seed``."""
    confidence = float(confidence)
    if not (np.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    two_sided = options.pop("two_sided", True)
    design_mu, explicit = check_design(method, design_mu, options)
    if explicit:
        return guess_table(scores_in, scores_out, method=method, **options)
    base = guess_table(scores_in, scores_out, method=method, pairs=[], **options)
    return claim_counts(base, 1.0 - confidence, design_mu=design_mu, roc_inverse=roc_inverse,
                        two_sided=two_sided)


def claim_test_on_table(
    table: GuessTable, roc_inverse: RocInverse, confidence: float
) -> OneRunClaimTest:
    """``one_run_claim_test`` on guesses already counted (``guess_table``, ``claim_table``)."""
    level = table.level(confidence)
    if not table.k_plus.size:
        return OneRunClaimTest(
            False, confidence, level, 0, table.m, None, None, None, None, None, None,
            note=f"no candidate with at least {MIN_GUESSES} guesses (m={table.m})",
        )
    refuted = _refuted(table, roc_inverse, level)
    precision = table.correct / np.maximum(table.guesses, 1)
    pool = np.flatnonzero(refuted) if refuted.any() else np.arange(table.k_plus.size)
    best = int(pool[np.argmax(precision[pool])])
    w = table.witness(best)
    threshold = table.threshold(best)
    return OneRunClaimTest(
        rejected=bool(refuted.any()),
        confidence=confidence,
        level_per_candidate=level,
        n_candidates=int(table.k_plus.size),
        m=table.m,
        side=w["side"],
        k_plus=w["k_plus"],
        k_minus=w["k_minus"],
        guesses=w["guesses"],
        correct=w["correct"],
        threshold=threshold,
    )


def one_run_claim_test(
    scores_in,
    scores_out,
    roc_inverse: RocInverse | None = None,
    *,
    tradeoff=None,
    confidence: float = 0.95,
    **options,
) -> OneRunClaimTest:
    """Certified one-run test of a claimed trade-off curve (module doc).

    Args:
        scores_in: scores (higher = member) of the canaries that were included.
        scores_out: scores of those excluded; each canary included independently w.p. 1/2.
        roc_inverse: the claim as its inverse ROC, tpr -> smallest FPR reaching it
            (``ThreatModel.roc_inverse``; exact or below the exact value).
        tradeoff: the claim as a trade-off curve FPR -> FNR instead (inverted by bisection,
            ``roc_inverse_of``). Exactly one of the two. The claim must be symmetric in the
            pair's order when ``sides`` includes "out" or "both" (GDP and privacy-profile
            curves are); the default "in"-only test needs no symmetry.
        confidence: probability that a true claim is not rejected.
        options: ``design_mu`` (the claim's mu: the guess count that maximises mu_lower
            when the scores are as claimed), or ``guess_fractions`` / ``sides`` (explicit
            candidates, Bonferroni), ``inclusion`` (1/2), ``seed``; by default the guess
            count that refutes the claim at the weakest ideal alternative (``claim_table``).
    """
    if (roc_inverse is None) == (tradeoff is None):
        raise ValueError("give exactly one of roc_inverse and tradeoff")
    if roc_inverse is None:
        roc_inverse = roc_inverse_of(tradeoff)
        sides = options.get("sides", ("in",))
        sides = (sides,) if isinstance(sides, str) else tuple(sides)
        if set(sides) - {"in"} and not _symmetric(tradeoff):
            raise ValueError(
                f"sides={list(sides)} needs a claim that is symmetric in the pair's order, but "
                "tradeoff is not its own inverse: use sides=('in',) for an asymmetric claim"
            )
    elif not callable(roc_inverse):
        raise CurveError(f"roc_inverse must be callable tpr -> FPR, got {roc_inverse!r}")
    table = claim_table(
        scores_in, scores_out, confidence=confidence, roc_inverse=roc_inverse,
        design_mu=options.pop("design_mu", None), **options,
    )
    return claim_test_on_table(table, roc_inverse, float(confidence))


def one_run_mu_lower(table: GuessTable, confidence: float) -> float:
    """Certified "not mu-GDP for any mu < mu_lower" from the table's guesses (0 if none)."""
    if not table.k_plus.size:
        return 0.0
    level = table.level(confidence)
    mu = largest_refuted(
        table.guesses, table.correct, table.one_sided, m=table.m, level=level, prune=True
    )
    return float(np.max(mu))


def one_run_noise_upper_bound(
    table: GuessTable,
    confidence: float,
    family: Callable[[float], RocInverse],
    sigma_start: float,
    *,
    sigma_min: float | None = None,
    rtol: float = 1e-2,
) -> float:
    """Smallest noise multiplier whose claimed curve ``family(sigma)`` (an inverse ROC) the
    table's guesses refute; +inf when none is (``claim.smallest_rejected_sigma``)."""
    level = table.level(confidence)
    if not table.k_plus.size:
        return float("inf")

    def rejected(sigma: float) -> bool:
        try:
            inverse = family(sigma)
            return bool(_refuted(table, inverse, level).any())
        except (ValueError, RuntimeError, FloatingPointError, OverflowError):
            return False  # the claim cannot be built at this sigma: no evidence

    return smallest_rejected_sigma(rejected, sigma_start, rtol=rtol, sigma_min=sigma_min)


__all__ = [
    "EPSILON_CAP",
    "MU_CAP",
    "OneRunClaimTest",
    "claim_counts",
    "claim_table",
    "claim_test_on_table",
    "one_run_claim_test",
    "one_run_mu_lower",
    "one_run_noise_upper_bound",
]
