"""The certified parameter of a one-run audit: the infimum of the claims its guesses do not
refute (argument: ``docs/one_run_fdp.md``, "Guess counts fixed by the claim").

Each claim theta of a family (mu-GDP, (epsilon, delta)-DP) is tested at the full level with a
guess count fixed in advance (``design``). The claims not refuted form a confidence set: a true
claim is refuted with probability at most the level, so "the mechanism satisfies no claim below
the infimum" fails with at most that probability, however the guess count varies with the claim
and whether or not refutation is monotone across claims.

With the count constant on pieces [s_i, s_{i+1}), refutation IS monotone inside a piece (a
claim with a larger parameter is weaker), so a piece's refuted claims are [s_i, L_i] with L_i
its count's largest refuted parameter. Scanning pieces from the bottom, the first piece with
L_i < s_{i+1} holds the infimum: s_i if L_i < s_i (s_i itself survives), else L_i (a refuted
value, below the exact infimum by at most the search's tolerance).
"""

from __future__ import annotations

import numpy as np

from dpaudit.stats.one_run.design import PieceRule
from dpaudit.stats.one_run.guesses import GuessTable
from dpaudit.stats.one_run.recursion import largest_refuted


def infimum_not_refuted(table: GuessTable, rule: PieceRule) -> tuple[float, int]:
    """(certified parameter, index of the piece that holds it) for a table whose candidates
    are the rule's distinct guess counts ("in" only; ``guesses.GuessTable.counts``)."""
    uniq, inverse = np.unique(rule.ks, return_inverse=True)
    kinds = np.asarray(table.k_plus)
    pos = np.minimum(np.searchsorted(kinds, uniq), max(kinds.size - 1, 0))
    if not kinds.size or np.any(kinds[pos] != uniq) or np.any(table.k_minus[pos] != 0):
        raise ValueError("the table does not hold the rule's guess counts")
    ends = np.concatenate([rule.starts[1:], [rule.family.cap]])
    # each distinct count's largest refuted parameter, once
    top = largest_refuted(
        uniq, np.asarray(table.correct, dtype=np.float64)[pos], True, m=table.m,
        level=rule.level, roc_inverse=rule.family.roc_inverse, cap=rule.family.cap,
    )[inverse]
    stops = np.flatnonzero(top < ends)
    if not stops.size:
        return float(rule.family.cap), rule.starts.size - 1
    i = int(stops[0])
    return float(max(rule.starts[i], top[i])), i


__all__ = ["infimum_not_refuted"]
