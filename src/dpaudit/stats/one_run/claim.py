"""Certified one-run evidence on a claimed trade-off curve (proofs: ``docs/one_run_fdp.md``).

One training run, m canaries, each a member independently with probability 1/2, scores that
may depend on each other in any way (canaries trained together). The guess-count recursion of
Mahloujifar, Melis & Chaudhuri (arXiv 2410.22235, Algorithm 3; ``stats.fdp_one_run``) bounds
how many of r released guesses can be right when the training is f-DP with respect to every
canary's inclusion, whatever the other canaries do. Testing it at the *claimed* curve is a
certified test of the claim, with no model of the scores:

* ``one_run_claim_test``: reject the claimed curve f (the accountant's: GDP every step, the
  PRV privacy profile's curve when subsampled) when some candidate's correct guesses could not
  come from an f-DP training at its level;
* ``one_run_mu_lower``: the largest mu whose mu-GDP the same guesses refute ("not mu-GDP for
  any mu < mu_lower", certified);
* ``one_run_noise_upper_bound``: the smallest noise multiplier of the DP-SGD family (same q,
  T, C) whose curve they refute (a correct run's sigma stays below it);
* ``fdp_one_run_certified_bound``: the largest epsilon whose (epsilon, delta)-DP they refute,
  a certified epsilon lower bound (the ``"fdp_one_run_certified"`` method).

Every statement tests each of the G candidate guess sets (fixed from m and the options only)
at (1 - confidence) / G (Bonferroni). The candidates, ties and inclusion rules are those of
``stats.fdp_one_run.guess_table``.

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
from dpaudit.stats.claim import CurveError, check_curve, smallest_rejected_sigma
from dpaudit.stats.fdp_one_run import (
    DEFAULT_SIDES,
    MIN_GUESSES,
    MU_CAP,
    GuessTable,
    _refutes,
    guess_table,
    largest_refuted,
)
from dpaudit.stats.result import EpsilonBound

RocInverse = Callable[[np.ndarray], np.ndarray]
EPSILON_CAP = 50.0  # search limit for the certified epsilon
_INVERSE_SAFETY = 1.0 - 1e-12  # shrink closed-form inverses below float rounding ...
_INVERSE_ABS = 1e-15  # ... and absolutely: 1 - delta - e^eps (1 - y) cancels at ulp(1)
_BISECT_STEPS = 60


def epsdelta_roc_inverse(delta: float):
    """The (epsilon, delta)-DP family as ``roc_inverse(tpr, epsilon)`` for the recursion.

    (eps, delta)-DP's ROC is max(alpha, min(1, delta + e^eps alpha, 1 - e^-eps (1 - delta -
    alpha))); the smallest alpha reaching y < 1 is min(y, max(0, (y - delta) e^-eps,
    1 - delta - e^eps (1 - y))).
    """

    def inverse(tpr, eps):
        y = np.asarray(tpr, dtype=np.float64)
        e = np.asarray(eps, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            reach = np.maximum((y - delta) * np.exp(-e), 1.0 - delta - np.exp(e) * (1.0 - y))
        reach = np.nan_to_num(reach, nan=0.0, neginf=0.0)
        return _shrink(np.minimum(y, np.maximum(reach, 0.0)), y)

    return inverse


def _shrink(alpha, tpr):
    """An inverse ROC value moved below its float rounding (the recursion must not use a
    value above the exact inverse): relative 1e-12 and absolute 1e-15 (several ulp of 1,
    the rounding of the lines' cancellations), floored at 0. ``tpr`` is unused: kept so
    every inverse passes through one place."""
    del tpr
    return np.maximum(alpha * _INVERSE_SAFETY - _INVERSE_ABS, 0.0)


def roc_inverse_of(tradeoff, name: str = "tradeoff") -> RocInverse:
    """The inverse ROC of any claimed trade-off curve, by bisection (for curves without one).

    Returns y -> the largest alpha found with 1 - f(alpha) < y, within 2^-60 of the exact
    smallest alpha reaching y and never above it, so the recursion stays conservative. The
    curve is checked first (``check_curve``: a ``CurveError`` names ``name``).
    """
    curve = check_curve(tradeoff, name)

    def inverse(tpr):
        y = np.asarray(tpr, dtype=np.float64)
        lo, hi = np.zeros_like(y), y.copy()  # the ROC is >= alpha, so the answer is <= y
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            reached = 1.0 - np.asarray(curve(mid), dtype=np.float64) >= y
            hi = np.where(reached, mid, hi)
            lo = np.where(reached, lo, mid)
        return lo

    return inverse


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
    return _refutes(
        table.guesses, table.correct, 0.0, table.one_sided, m=table.m, level=level,
        roc_inverse=lambda y, _: _shrink(np.asarray(roc_inverse(y), dtype=np.float64), y),
    )


def _table(scores_in, scores_out, confidence, options, method) -> tuple[GuessTable, float]:
    confidence = float(confidence)
    if not (np.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return guess_table(scores_in, scores_out, method=method, **options), confidence


def claim_test_on_table(
    table: GuessTable, roc_inverse: RocInverse, confidence: float
) -> OneRunClaimTest:
    """``one_run_claim_test`` on guesses already counted (``fdp_one_run.guess_table``)."""
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
            curves are); the "in"-only test needs no symmetry.
        confidence: probability that a true claim is not rejected.
        options: ``guess_fractions``, ``sides``, ``inclusion`` (1/2), ``seed`` as for
            ``fdp_one_run_bound``.
    """
    if (roc_inverse is None) == (tradeoff is None):
        raise ValueError("give exactly one of roc_inverse and tradeoff")
    if roc_inverse is None:
        roc_inverse = roc_inverse_of(tradeoff)
        sides = options.get("sides", DEFAULT_SIDES)
        sides = (sides,) if isinstance(sides, str) else tuple(sides)
        if set(sides) - {"in"} and not _symmetric(tradeoff):
            raise ValueError(
                f"sides={list(sides)} needs a claim that is symmetric in the pair's order, but "
                "tradeoff is not its own inverse: use sides=('in',) for an asymmetric claim"
            )
    elif not callable(roc_inverse):
        raise CurveError(f"roc_inverse must be callable tpr -> FPR, got {roc_inverse!r}")
    table, confidence = _table(scores_in, scores_out, confidence, options, "one_run_claim")
    return claim_test_on_table(table, roc_inverse, confidence)


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


def fdp_one_run_certified_bound(
    scores_in,
    scores_out,
    *,
    delta: float,
    confidence: float,
    **options,
) -> EpsilonBound:
    """Certified epsilon lower bound: the largest epsilon whose (epsilon, delta)-DP the
    guesses refute (Mahloujifar et al.'s recursion on the (epsilon, delta) curve).

    Valid for canaries trained together (any interaction), each included independently w.p.
    1/2. ``delta`` in [0, 1), ``confidence`` in (0, 1); options as ``fdp_one_run_bound``
    (``guess_fractions``, ``sides``, ``inclusion``, ``seed``). ``details``: the design, the
    winning candidate (side, counts, thresholds) and each candidate's refuted epsilon.
    """
    delta = float(delta)
    if not (np.isfinite(delta) and 0.0 <= delta < 1.0):
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
    table, confidence = _table(
        scores_in, scores_out, confidence, options, "fdp_one_run_certified"
    )
    details = dict(table.details)
    common = {
        "method": "fdp_one_run_certified",
        "confidence": confidence,
        "delta": delta,
        "n_in": int(np.size(scores_in)),
        "n_out": int(np.size(scores_out)),
    }
    if not table.k_plus.size:
        details["note"] = f"no candidate with at least {MIN_GUESSES} guesses (m={table.m})"
        return EpsilonBound(epsilon=0.0, details=details, **common)
    level = table.level(confidence)
    eps = largest_refuted(
        table.guesses, table.correct, table.one_sided, m=table.m, level=level,
        roc_inverse=epsdelta_roc_inverse(delta), cap=EPSILON_CAP, prune=True,
    )
    best, report = table.best(eps, "epsilon", level)
    details.update(report)
    return EpsilonBound(
        epsilon=float(eps[best]),
        threshold=table.threshold(best) if eps[best] > 0 else None,
        details=details,
        **common,
    )


__all__ = [
    "EPSILON_CAP",
    "MU_CAP",
    "OneRunClaimTest",
    "claim_test_on_table",
    "epsdelta_roc_inverse",
    "fdp_one_run_certified_bound",
    "one_run_claim_test",
    "one_run_mu_lower",
    "one_run_noise_upper_bound",
    "roc_inverse_of",
]
