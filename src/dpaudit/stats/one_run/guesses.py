"""Guesses from scores: which canaries a one-run audit calls "in" or "out", and how many of
those guesses are right.

Every one-run statement (``steinke``, ``claim``, ``bounds``) guesses "in" for exactly the k+
highest scores and "out" for exactly the k- lowest, ties between scores ordered at random by a
seed (``stats.ties``, drawn without looking at membership), so the number of guesses is fixed
in advance as the theorems require. The candidate (k+, k-) pairs are made here and only here:

* ``fraction_candidates``: fractions of m on chosen sides ("in", "out", "both"), for the
  recursion's explicit candidate sets (Bonferroni over them);
* ``grid_candidates``: every (k+, k-) pair of a grid of fractions, for Steinke et al.;
* one guess count fixed by the claim before the scores are seen: ``design``.

``guess_table`` validates the options, counts the correct guesses of every candidate and
returns them as a ``GuessTable``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from dpaudit._validate import check_seed, require_known
from dpaudit.stats.inclusion import check_inclusion, require_plausible
from dpaudit.stats.ties import random_order

SIDES = ("in", "out", "both")
DEFAULT_SIDES = ("in", "both")
DEFAULT_GUESS_FRACTIONS = tuple(2.0**-j for j in range(17))  # 1, 1/2, ..., 2^-16
MIN_GUESSES = 10  # fewer guesses cannot refute anything at usual levels; not a candidate
GUESS_OPTIONS = ("guess_fractions", "inclusion", "seed", "sides")


def guess_counts(labels_by_score: np.ndarray, k_plus, k_minus) -> np.ndarray:
    """Correct guesses when "in" is guessed for exactly the k+ highest scores and "out" for
    exactly the k- lowest.

    ``labels_by_score``: each canary's label (True = member, or the virtual label), ordered by
    ascending score with ties in random order (``ties.random_order``). ``k_plus``/``k_minus``:
    equal-length integer arrays with k+ + k- <= m.
    """
    lab = np.asarray(labels_by_score, dtype=bool)
    m = lab.size
    members_below = np.concatenate([[0], np.cumsum(lab)])  # labels True among the i lowest
    kp, km = np.asarray(k_plus, dtype=np.int64), np.asarray(k_minus, dtype=np.int64)
    return (members_below[m] - members_below[m - kp]) + (km - members_below[km])


def ranked_guesses(scores: np.ndarray, labels: np.ndarray, k_plus, k_minus, seed: int):
    """(correct, t_plus, t_minus) of exactly k+ top "in" and k- bottom "out" guesses.

    ``scores`` and ``labels`` (True = member, or the virtual label) are per canary, in any
    order; ties are broken by ``ties.random_order(scores, seed)``. t+ is the lowest score
    guessed "in" (+inf if none), t- the highest guessed "out" (-inf if none).
    """
    order = random_order(scores, seed)
    ranked = scores[order]
    m = scores.size
    kp, km = np.asarray(k_plus, dtype=np.int64), np.asarray(k_minus, dtype=np.int64)
    t_plus = np.where(kp > 0, ranked[np.clip(m - kp, 0, m - 1)], np.inf)
    t_minus = np.where(km > 0, ranked[np.clip(km - 1, 0, m - 1)], -np.inf)
    return guess_counts(labels[order], kp, km), t_plus, t_minus


def fraction_candidates(m: int, fractions, sides: tuple[str, ...]) -> list[tuple[int, int]]:
    """Distinct (k+, k-) guess counts with at least ``MIN_GUESSES`` guesses, one per fraction
    of m and side.

    One-sided candidates guess at most m // 2 canaries (about half are members: more "in"
    guesses than that are partly wrong by construction).
    """
    pairs = []
    for side in sides:
        for f in fractions:
            k = round(float(f) * m)
            if side != "both":
                k = min(k, m // 2)
            if k < MIN_GUESSES:
                continue
            pair = {"in": (k, 0), "out": (0, k), "both": (k - k // 2, k // 2)}[side]
            if pair not in pairs:
                pairs.append(pair)
    return pairs


def grid_candidates(m: int, grid) -> list[tuple[int, int]]:
    """Every (k+, k-) pair with k+ and k- in round(grid * m), at least one guess and
    k+ + k- <= m (Steinke et al.'s grid)."""
    ks = np.unique(np.round(np.asarray(grid, dtype=np.float64) * m).astype(np.int64))
    return [(int(a), int(b)) for a in ks for b in ks if (a > 0 or b > 0) and a + b <= m]


def check_sides(sides) -> tuple[str, ...]:
    """``sides`` as a tuple of distinct names from ``SIDES`` (ValueError naming it else)."""
    items = (sides,) if isinstance(sides, str) else sides
    try:
        items = tuple(items)
    except TypeError:
        raise ValueError(f"sides must be a sequence of {SIDES}, got {sides!r}") from None
    if not items or any(not isinstance(s, str) or s not in SIDES for s in items):
        raise ValueError(f"sides must be a non-empty sequence of {SIDES}, got {sides!r}")
    return tuple(dict.fromkeys(items))


def check_fractions(guess_fractions) -> np.ndarray:
    """``guess_fractions`` as a 1-d array of fractions in (0, 1] (ValueError naming it)."""
    bad = ValueError(
        "guess_fractions must be a non-empty 1-d sequence of fractions in (0, 1], "
        f"got {guess_fractions!r}"
    )
    if isinstance(guess_fractions, (str, bytes)) or isinstance(guess_fractions, numbers.Number):
        raise bad
    try:
        fr = np.asarray(guess_fractions, dtype=np.float64)
    except (TypeError, ValueError):
        raise bad from None
    if fr.ndim != 1 or fr.size == 0 or not np.all(np.isfinite(fr)):
        raise bad
    if np.any((fr <= 0) | (fr > 1)):
        raise bad
    return fr


@dataclass(frozen=True)
class GuessTable:
    """The candidate guess sets of a one-run audit and how many guesses each got right.

    One entry per candidate: ``k_plus`` "in" guesses on the top scores, ``k_minus`` "out"
    guesses on the bottom ones, ``correct`` of them right, ``t_plus`` / ``t_minus`` the
    thresholds, ``one_sided`` when every guess points the same way. ``m``: the canaries.
    ``details``: the design (sides, inclusion, split p-value, seed) for reports.
    ``scores``: the sorted (in, out) scores, so that ``counts`` can count other pairs.
    """

    m: int
    k_plus: np.ndarray
    k_minus: np.ndarray
    correct: np.ndarray
    t_plus: np.ndarray
    t_minus: np.ndarray
    details: dict
    scores: tuple[np.ndarray, np.ndarray] = field(repr=False, compare=False)

    @property
    def guesses(self) -> np.ndarray:
        return self.k_plus + self.k_minus

    @property
    def one_sided(self) -> np.ndarray:
        return (self.k_plus == 0) | (self.k_minus == 0)

    def level(self, confidence: float) -> float:
        """Each candidate's level: (1 - confidence) / the number of candidates (Bonferroni)."""
        return (1.0 - confidence) / max(1, self.k_plus.size)

    def threshold(self, i: int) -> float:
        """Candidate ``i``'s threshold: t+ when it guesses "in", else t-."""
        return float(self.t_plus[i] if self.k_plus[i] > 0 else self.t_minus[i])

    def best(self, values: np.ndarray, name: str, level: float) -> tuple[int, dict]:
        """The candidate with the largest ``values`` (a refuted parameter per candidate) and
        the details reports show: the level, its witness and every candidate's counts and
        ``name`` value."""
        best = int(np.argmax(values))
        return best, {
            "level_per_candidate": level,
            **self.witness(best),
            "candidates": {
                "k_plus": self.k_plus.tolist(),
                "k_minus": self.k_minus.tolist(),
                "correct": self.correct.tolist(),
                name: np.asarray(values).tolist(),
            },
        }

    def witness(self, i: int) -> dict:
        """Candidate ``i`` for reports: side, counts and thresholds."""
        kp, km = int(self.k_plus[i]), int(self.k_minus[i])
        return {
            "side": "in" if km == 0 else ("out" if kp == 0 else "both"),
            "k_plus": kp,
            "k_minus": km,
            "guesses": kp + km,
            "correct": int(self.correct[i]),
            "t_plus": float(self.t_plus[i]),
            "t_minus": float(self.t_minus[i]),
        }

    def counts(self, pairs) -> GuessTable:
        """The table of other (k+, k-) pairs on the same scores."""
        return _counted(*self.scores, pairs, self.details)


def _counted(s_in, s_out, pairs, details) -> GuessTable:
    kp, km = np.array(pairs, dtype=np.int64).reshape(-1, 2).T
    if kp.size:
        is_in = np.concatenate([np.ones(s_in.size, bool), np.zeros(s_out.size, bool)])
        correct, t_plus, t_minus = ranked_guesses(
            np.concatenate([s_in, s_out]), is_in, kp, km, details["seed"]
        )
    else:
        correct = t_plus = t_minus = np.zeros(0)
    details = {**details, "n_candidates": int(kp.size)}
    return GuessTable(int(s_in.size + s_out.size), kp, km, np.asarray(correct),
                      np.asarray(t_plus), np.asarray(t_minus), details, (s_in, s_out))


def guess_table(scores_in, scores_out, *, method: str, pairs=None, **options) -> GuessTable:
    """Validate the guess options and count the correct guesses of every candidate.

    ``scores_in`` / ``scores_out``: the scores (higher = member) of the canaries that were
    included / excluded, each included independently with probability 1/2. ``pairs``: the
    candidate (k+, k-) pairs when fixed by the caller (``design``); else they are
    ``fraction_candidates`` of the options. Options (anything else raises ValueError naming it
    and ``method``): ``guess_fractions``, ``sides``, ``inclusion`` (only 0.5), ``seed``. A
    split implausible under 1/2 raises ValueError naming ``inclusion``. The candidates depend
    on m and the options only, never on the scores.
    """
    require_known(f"option of {method}", sorted(options), GUESS_OPTIONS)
    fractions = check_fractions(options.get("guess_fractions", DEFAULT_GUESS_FRACTIONS))
    sides = check_sides(options.get("sides", DEFAULT_SIDES))
    inclusion = check_inclusion(options.get("inclusion", 0.5))
    seed = check_seed(options.get("seed", 0))
    if inclusion != 0.5:
        raise ValueError(
            f"inclusion={inclusion:g}: {method} is derived for canaries included with "
            "probability 1/2 only (its guess-count recursion is written for fair coins; "
            "for p != 1/2 the virtual fair-coin design makes the curve a subsampled one, not "
            "derived here); use method='one_run', which takes any inclusion probability"
        )
    s_in = np.sort(np.asarray(scores_in, dtype=np.float64))
    s_out = np.sort(np.asarray(scores_out, dtype=np.float64))
    split_pv = require_plausible(s_in.size, s_out.size, inclusion, method)
    m = s_in.size + s_out.size
    if pairs is None:
        pairs = fraction_candidates(m, fractions, sides)
        design = {"sides": list(sides)}
    else:
        design = {"guess_counts": "fixed by the claim (stats.one_run.design)"}
    details = {
        "m": m,
        **design,
        "inclusion": inclusion,
        "split_p_value": split_pv,
        "seed": seed,
    }
    return _counted(s_in, s_out, pairs, details)
