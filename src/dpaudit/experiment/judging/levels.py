"""How an audit's error probabilities are split over its statements (DESIGN 4.5).

All certified bounds of an audit hold *simultaneously*: the failure probability
1 - confidence is split evenly (Bonferroni) over every (attack, method) pair, every attack's
claim test and every one-run claim test, so the bounds' confidence is the stated one. The
statements that can refute the claim (each attack's claim test, the one-run claim tests, the
white-box checks) are also judged at their share of the PRIVACY BUG verdict's much smaller
failure probability ``refutation_level``; the white-box tests, which are no bound, warn at their
share of the bounds' failure probability, as a family of their own. ``split_levels`` makes
these shares once, as a ``Levels`` record.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpaudit._validate import require_level

REFUTATION_LEVEL = 1e-6  # the PRIVACY BUG verdict's failure probability (module doc)


@dataclass(frozen=True)
class Levels:
    """The shares of one audit: ``per_statement`` (each bound's and claim test's confidence),
    ``refute_each`` (each refuting statement's share of ``refutation_level``) and
    ``warn_each`` (each white-box test's share of 1 - ``confidence``)."""

    confidence: float
    refutation_level: float
    per_statement: float
    refute_each: float
    warn_each: float


def per_test_confidence(
    confidence: float, n_attacks: int, n_methods: int, extra: int = 0
) -> float:
    """Bonferroni: the confidence of each of the n_attacks x (n_methods + 1) statements, plus
    ``extra`` (the one-run claim tests)."""
    return 1.0 - (1.0 - confidence) / max(1, n_attacks * (n_methods + 1) + extra)


def split_levels(confidence: float, refutation_level: float, *, attacks: int, methods: int,
                 one_run_claims: int, white_box_tests: int, lower_side_tests: int = 0
                 ) -> Levels:
    """The ``Levels`` of an audit with these many attacks, bound methods, one-run claim tests,
    statistical white-box tests and claim tests of the canaries inserted like an example
    (``lower_side_tests``: each refutes at its share of the PRIVACY BUG level; their bounds
    are the lower side's own statements, at ``confidence``); ``refutation_level`` must lie in
    (0, 1 - confidence] (a ValueError names it)."""
    level = require_level("refutation_level (audit.refutation_level)", refutation_level,
                          confidence)
    return Levels(
        confidence=confidence,
        refutation_level=level,
        per_statement=per_test_confidence(confidence, attacks, methods, one_run_claims),
        refute_each=level / max(1, attacks + one_run_claims + white_box_tests
                                + lower_side_tests),
        warn_each=(1.0 - confidence) / max(1, white_box_tests),
    )
