"""Tied scores, broken at random: the one rule every certified method uses for ties.

Discrete attack scores (a binary guess, a count) put many members and non-members on the same
value. A threshold rule "member iff score >= t" must then either take a whole tie group or
none of it, and a candidate set fixed from the sample sizes (``threshold_selection``) can miss
the only useful boundary: randomized response with 1000 scores per side has about 270
non-members at score 1, while the default candidates sit at own-side ranks 0, 3, 15, 62 and
249, all inside that group, so every candidate is "nobody" or "everybody".

The fix that keeps every proof intact is to break ties with independent uniforms U (seeded,
drawn without looking at membership) and to order scores lexicographically by (score, U). The
auditor then runs *randomized* tests (a tie group is split at a random point); randomized
tests are tests, so DP's trade-off curve binds them like any other, and (score, U) has no ties
almost surely, so each proof written for continuous scores applies verbatim (the randomized
probability integral transform U' = F(S-) + U (F(S) - F(S-)) is exactly uniform and orders
the sample as (S, U) does). Ties can then neither inflate evidence (no tied pair is ever split
in the auditor's favour) nor hide it (the rank candidates interpolate along the tie group).

Without ties nothing changes: ``break_ties`` returns None and no random number is drawn, so
continuous scores give the same numbers as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpaudit import seeds


def random_order(scores: np.ndarray, seed: int) -> np.ndarray:
    """Indices sorting ``scores`` ascending, ties in a seeded random order (``seeds.TIE_BREAK``).

    The uniforms are assigned by position, independently of any label: a permutation of
    i.i.d. uniforms that depends on the data is still i.i.d. uniform and independent of it.
    """
    u = seeds.stream(seed, seeds.TIE_BREAK).random(scores.size)
    return np.lexsort((u, scores))


def has_ties(*sorted_arrays: np.ndarray) -> bool:
    """True when the pooled values of the (each ascending) arrays contain a repeated value."""
    pooled = np.sort(np.concatenate(sorted_arrays), kind="stable")  # merges the sorted runs
    return bool(pooled.size > 1 and np.any(pooled[1:] == pooled[:-1]))


@dataclass(frozen=True)
class TieBreak:
    """Scores replaced by their pooled ranks 0..N-1 after a random tie-break.

    ``ranks_in`` / ``ranks_out``: ascending float ranks of the members / non-members (every
    order statistic and count of the ranks is that of (score, U)); ``values[r]``: the
    original score at rank r, to report thresholds on the user's scale.
    """

    ranks_in: np.ndarray
    ranks_out: np.ndarray
    values: np.ndarray
    seed: int

    def value(self, threshold) -> np.ndarray:
        """Original score of rank-space thresholds (a threshold between ranks r and r+1, e.g.
        just above a non-member's rank, reports the value at rank r)."""
        t = np.asarray(threshold, dtype=np.float64)
        idx = np.clip(np.floor(t), 0, self.values.size - 1).astype(np.int64)
        out = np.where(np.isfinite(t), self.values[idx], t)
        return out


def break_ties(s_in: np.ndarray, s_out: np.ndarray, seed: int) -> TieBreak | None:
    """Rank-space scores with ties broken at random, or None when there are no ties.

    ``s_in`` and ``s_out`` are ascending float arrays. Ranks are pooled (members first in the
    concatenation, which only fixes which uniform goes to which score).
    """
    if not has_ties(s_in, s_out):
        return None
    pooled = np.concatenate([s_in, s_out])
    order = random_order(pooled, seed)
    rank = np.empty(pooled.size, dtype=np.float64)
    rank[order] = np.arange(pooled.size, dtype=np.float64)
    return TieBreak(
        ranks_in=np.sort(rank[: s_in.size]),
        ranks_out=np.sort(rank[s_in.size :]),
        values=pooled[order],
        seed=int(seed),
    )
