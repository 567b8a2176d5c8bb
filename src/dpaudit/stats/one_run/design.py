"""How many guesses a one-run test makes, fixed before the scores are seen
(argument: ``docs/one_run_fdp.md``, "Guess counts fixed by the claim").

A count test is valid for ANY guess count chosen without looking at the scores, so the count
can be chosen per claim, at the full level, instead of trying ~20 counts under a Bonferroni
split. The choice only decides power; it is made against ideal scores (each canary a member
with probability 1/2, members N(mu, 1), non-members N(0, 1): the Gaussian mechanism, DP-SGD's
shape every step). The candidates are pairs (k+, k-): "in" for the k+ top scores and "out"
for the k- bottom ones, one-sided (k, 0) (the recursion's sharper bound, the factor 2 of
``recursion``) and two-sided (k, k) (the paper's bound, for twice the guesses): which wins
depends on m and the claim (two-sided from about 10^3 canaries at epsilon 4), and the design
picks it before the scores are seen (``two_sided=False``: one-sided pairs only).

* ``claim_guess_pair``: a claimed curve is known (the accountant's, of design mu): the pair
  that maximises the median certified parameter of a family of claims when the scores are
  exactly as claimed (the binomial model's best candidates re-ranked by their exact median,
  ``ideal``). One pair for the whole family, so refutation is monotone in the
  parameter and the largest refuted parameter is the infimum of the confidence set of claims
  not refuted.
* ``soonest_guess_pair``: one claimed curve is tested: the pair that refutes it at the
  weakest ideal alternative (the pair whose median count first reaches the claim's critical
  count).
* ``PieceRule``: no claim is known. The parameter axis is cut into pieces (a geometric grid);
  each piece gets the k whose median count, under the weakest ideal alternative, first
  reaches the piece's critical count: the k that refutes that claim soonest. The certified
  value is the infimum of the claims not refuted (``confidence_set``), valid whether or not
  refutation is monotone across pieces.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr
from scipy.stats import binom

from dpaudit.stats.one_run.guesses import MIN_GUESSES
from dpaudit.stats.one_run.ideal import ideal_posterior, median_count, pair_count_pmf
from dpaudit.stats.one_run.recursion import (
    EPSILON_CAP,
    MU_CAP,
    epsdelta_roc_inverse,
    gdp_roc_inverse,
    largest_refuted,
    refutes,
)

PER_OCTAVE = 8  # guess counts tried per halving of k
_ALT_MU = np.concatenate([np.linspace(0.0, 2.0, 401)[1:], np.linspace(2.0, 12.0, 201)[1:]])


def check_design(method: str, design_mu, options: dict) -> tuple[float | None, bool]:
    """(design_mu as a float or None, whether explicit candidates were asked for): the two
    ways of fixing guess counts, refused together, and design_mu refused by name unless it
    is a finite mu > 0 (the claim's mu)."""
    explicit = "guess_fractions" in options or "sides" in options
    if design_mu is None:
        return None, explicit
    if explicit:
        raise ValueError(
            f"{method}: give design_mu (one guess count fixed by the claim) or guess_fractions"
            " / sides (explicit candidates under Bonferroni), not both"
        )
    try:
        mu = float(design_mu)
    except (TypeError, ValueError):
        mu = float("nan")
    if not (np.isfinite(mu) and mu > 0):
        raise ValueError(f"design_mu must be a finite mu > 0 (the claim's mu), got {design_mu!r}")
    return mu, False


def guess_count_grid(m: int) -> np.ndarray:
    """Candidate one-sided guess counts: round(m/2 2^(-j/8)), at least ``MIN_GUESSES``."""
    j = np.arange(0, PER_OCTAVE * max(1, int(np.ceil(np.log2(max(m, 2))))) + 1)
    ks = np.unique(np.round(m / 2 * 2.0 ** (-j / PER_OCTAVE)))
    return ks[ks >= MIN_GUESSES]


def expected_correct(k, mu, m: int) -> np.ndarray:
    """E[correct] of the k top "in" guesses on ideal scores at shift ``mu`` (m/2 members):
    (m/2) P[N(mu, 1) > t] with t the score exceeded by k canaries in expectation."""
    k, mu = np.broadcast_arrays(np.asarray(k, dtype=np.float64), np.asarray(mu, dtype=float))
    lo, hi = np.full(k.shape, -40.0), np.full(k.shape, 40.0)
    for _ in range(64):  # bisection on t to ~1e-17
        t = 0.5 * (lo + hi)
        above = (m / 2) * (ndtr(mu - t) + ndtr(-t)) > k
        lo, hi = np.where(above, t, lo), np.where(above, hi, t)
    return (m / 2) * ndtr(mu - 0.5 * (lo + hi))


def median_correct(k, mu, m: int, k_minus=0) -> np.ndarray:
    """Median correct guesses of k top "in" and ``k_minus`` bottom "out" guesses,
    Binomial(k + k-, E[correct] / (k + k-)) (the power calculation's model). The bottom
    "out" guesses are the top "in" guesses of the reflected scores mu - s, which swap the
    members' and non-members' laws: the same expected count at k-."""
    k, mu, km = np.broadcast_arrays(np.asarray(k, dtype=np.float64),
                                    np.asarray(mu, dtype=np.float64),
                                    np.asarray(k_minus, dtype=np.float64))
    e = expected_correct(k, mu, m) + np.where(km > 0, expected_correct(np.maximum(km, 1), mu,
                                                                      m), 0.0)
    r = k + km
    return binom.ppf(0.5, r.astype(np.int64), np.clip(e / np.maximum(r, 1), 0.0, 1.0))


def guess_pairs(m: int, two_sided: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Candidate (k+, k-) of the claim-fixed design: (k, 0) for k of ``guess_count_grid(m)``
    (k <= m / 2) and, ``two_sided``, (k, k) for those with 2k <= m - 1."""
    ks = guess_count_grid(m)
    both = ks[2 * ks <= m - 1] if two_sided else ks[:0]  # the pair leaves a canary unguessed
    return np.concatenate([ks, both]), np.concatenate([np.zeros_like(ks), both])


@dataclass(frozen=True)
class Family:
    """A one-parameter family of claims for the recursion, less private as ``param`` grows:
    ``"gdp"`` (mu-GDP, cap ``MU_CAP``) or ``"epsdelta"`` ((epsilon, delta)-DP at ``delta``,
    cap ``EPSILON_CAP``)."""

    name: str
    delta: float = 0.0

    def __post_init__(self):
        if self.name not in ("gdp", "epsdelta"):
            raise ValueError(f"family must be 'gdp' or 'epsdelta', got {self.name!r}")

    @property
    def roc_inverse(self):
        return gdp_roc_inverse if self.name == "gdp" else epsdelta_roc_inverse(self.delta)

    @property
    def cap(self) -> float:
        return MU_CAP if self.name == "gdp" else EPSILON_CAP


@functools.lru_cache(maxsize=64)
def claim_guess_pair(m: int, level: float, family: Family, design_mu: float,
                     two_sided: bool = True) -> tuple[int, int]:
    """The (k+, k-) of ``guess_pairs`` that maximises the median largest refuted parameter of
    ``family`` at ``level`` when the scores are ideal at ``design_mu`` (the claim's own mu).

    Depends on m, the level, the family and the claim only (cached). Returns at least
    ``MIN_GUESSES`` "in" guesses ((``MIN_GUESSES``, 0) when nothing is refuted).
    """
    kp, km = guess_pairs(m, two_sided)
    if not kp.size or not (np.isfinite(design_mu) and design_mu > 0):
        return MIN_GUESSES, 0

    def value(v, idx, prune=False):
        return largest_refuted(kp[idx] + km[idx], v, km[idx] == 0, m=m, level=level,
                               roc_inverse=family.roc_inverse, cap=family.cap, prune=prune)

    every = np.arange(kp.size)
    # the model's values refined only where they could lead (``prune``: the others' are
    # refuted values below the leaders'), then the leaders ranked by their exact median
    got = value(median_correct(kp, design_mu, m, km), every, prune=True)
    # the binomial model's median can be one count off, and one count moves the certified
    # value by a tooth: the leading candidates are ranked again by their exact median
    top = np.argsort(-got, kind="stable")[:EXACT_CANDIDATES]
    exact = np.array([exact_median(m, float(design_mu), int(kp[i]), int(km[i])) for i in top])
    best = int(top[int(np.argmax(value(exact, top)))])
    return int(kp[best]), int(km[best])


EXACT_CANDIDATES = 6  # the model's best pairs re-ranked by their exact median


@functools.lru_cache(maxsize=4096)
def exact_median(m: int, mu: float, k_plus: int, k_minus: int) -> int:
    """The exact median correct count of the pair on ideal scores at ``mu``
    (``ideal.pair_count_pmf``; cached)."""
    pmf = pair_count_pmf(ideal_posterior(mu), m, k_plus, k_minus, nodes=EXACT_NODES)
    return median_count(pmf)


EXACT_NODES = 16  # per order statistic: the median, an integer, is settled long before


def claim_guess_count(m: int, level: float, family: Family, design_mu: float) -> int:
    """The one-sided count of ``claim_guess_pair(..., two_sided=False)``."""
    return claim_guess_pair(m, level, family, design_mu, False)[0]


def _critical_counts(ks, params, m, level, inv, k_minus=0) -> np.ndarray:
    """Smallest correct count refuting each (pair, param) of the family ``inv(tpr, param)``
    (+inf where even every guess correct does not); pairs (ks, ``k_minus``), one-sided where
    k- = 0."""
    ks, km, params = np.broadcast_arrays(np.asarray(ks, dtype=np.float64),
                                         np.asarray(k_minus, dtype=np.float64),
                                         np.asarray(params, dtype=np.float64))
    r, one = ks + km, km == 0
    full = refutes(r, r, params, one, m=m, level=level, roc_inverse=inv)
    lo, hi = np.zeros_like(r), r.copy()  # lo not refuting (v = 0 never refutes), hi refuting
    while np.any(hi - lo > 1):
        mid = np.floor(0.5 * (lo + hi))
        res = refutes(r, mid, params, one, m=m, level=level, roc_inverse=inv)
        hi, lo = np.where(res, mid, hi), np.where(res, lo, mid)
    return np.where(full, hi, np.inf)


def _weakest_alternative(ks: np.ndarray, crit: np.ndarray, m: int, k_minus=None) -> np.ndarray:
    """Per claim (rows) and pair (columns): the smallest ideal shift mu_a (on a grid) whose
    median count of the pair's guesses reaches the critical count (+inf if none)."""
    km = np.zeros_like(ks) if k_minus is None else np.asarray(k_minus)
    med = median_correct(ks[:, None], _ALT_MU[None, :], m, km[:, None])  # rising in mu
    alt = np.full(crit.shape, np.inf)
    for j in range(ks.size):
        idx = np.searchsorted(med[j], crit[:, j], side="left")
        alt[:, j] = np.where(idx < _ALT_MU.size, _ALT_MU[np.minimum(idx, _ALT_MU.size - 1)],
                             np.inf)
    return alt


def soonest_guess_pair(m: int, level: float, roc_inverse,
                       two_sided: bool = True) -> tuple[int, int]:
    """The (k+, k-) of ``guess_pairs`` that refutes the claimed curve (its inverse ROC, tpr ->
    smallest FPR) at the weakest ideal alternative: argmin over the pairs of the smallest
    shift whose median count reaches the claim's critical count. Depends on m, level and the
    claim only."""
    kp, km = guess_pairs(m, two_sided)
    if not kp.size:
        return MIN_GUESSES, 0
    crit = _critical_counts(kp, np.zeros(kp.size), m, level, lambda y, _: roc_inverse(y), km)
    best = int(np.argmin(_weakest_alternative(kp, crit[None, :], m, km)[0]))
    return int(kp[best]), int(km[best])


def soonest_guess_count(m: int, level: float, roc_inverse) -> int:
    """The one-sided count of ``soonest_guess_pair(..., two_sided=False)``."""
    return soonest_guess_pair(m, level, roc_inverse, False)[0]


@dataclass(frozen=True)
class PieceRule:
    """Claim-free guess counts: pieces [starts[i], starts[i+1]) of the parameter axis, each
    tested with its own one-sided guess count ``ks[i]`` (the last piece runs to the cap)."""

    family: Family
    m: int
    level: float
    starts: np.ndarray
    ks: np.ndarray


@functools.lru_cache(maxsize=16)
def piece_rule(m: int, level: float, family: Family, ratio: float = 1.05) -> PieceRule:
    """``PieceRule`` for m canaries at ``level`` (cached: it depends on nothing else).

    Pieces: [0, 0.01) and a geometric grid of ``ratio`` up to the family's cap. Piece i gets
    argmin over k of the smallest ideal shift mu_a whose median count reaches the critical
    count of the claim starts[i] (the weakest alternative the piece's test refutes half the
    time); the first piece uses the second's k.
    """
    ks = guess_count_grid(m)
    grid = 0.01 * ratio ** np.arange(int(np.log(family.cap / 0.01) / np.log(ratio)) + 1)
    starts = np.concatenate([[0.0], grid[grid < family.cap]])
    if not ks.size:
        return PieceRule(family, m, level, starts, np.full(starts.size, MIN_GUESSES))
    crit = _critical_counts(
        np.tile(ks, grid.size), np.repeat(grid, ks.size), m, level, family.roc_inverse
    ).reshape(grid.size, ks.size)
    chosen = ks[np.argmin(_weakest_alternative(ks, crit, m), axis=1)]
    chosen = chosen[: starts.size - 1]
    return PieceRule(family, m, level, starts, np.concatenate([[chosen[0]], chosen]))


__all__ = [
    "Family",
    "PieceRule",
    "check_design",
    "claim_guess_count",
    "claim_guess_pair",
    "expected_correct",
    "guess_count_grid",
    "guess_pairs",
    "median_correct",
    "piece_rule",
    "soonest_guess_count",
    "soonest_guess_pair",
]
