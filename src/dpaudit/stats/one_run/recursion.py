"""f-DP one-run auditing (Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in
One Run", arXiv 2410.22235, ICML 2025): an *estimate* of epsilon from m canaries in one run.

Setting (as in Steinke et al.'s one-run audit, ``one_run``): each of the m canaries is included
independently with probability 1/2. From the scores the auditor guesses "in" for some canaries
and "out" for others and abstains on the rest: r guesses, v of them correct.

Test of a trade-off curve f (the paper's Algorithm 3, "audit_rh_with_cap": guesses with
abstention). Claim: the mechanism is f-DP and P[>= v correct] >= tau. With C the number of
correct guesses, R_j = E[C 1{C >= j}] / m and H_j = E[(r - C) 1{C >= j}] / m:

* R_v >= tau v / m, and probability mass at C = c adds c / m to R_j and (r - c) / m to H_j
  for every j <= c, so R_j - R_{j+1} = j / (r - j) (H_j - H_{j+1});
* f-DP ties correct guesses above level j to wrong guesses at level j (fbar = 1 - f, the ROC
  of the optimal test): R_{j+1} <= fbar(H_j) for guesses both ways (the paper's bound), and
  R_{j+1} <= fbar(2 H_j) / 2 when every guess says "in" (or every guess says "out"). The
  one-sided form is our sharpening: for a fixed canary i, "guessed and right" and "guessed
  and wrong" are then the *same* event of the output under S_i = +1 and S_i = -1, each world
  of probability 1/2; Jensen (fbar is concave) over the other canaries and over i gives the
  factor 2 ("out" guesses use f in the other direction: G_mu is symmetric). With guesses
  both ways the two directions add up and the factor is lost.

Starting from all the mass tau at C = v and descending j = v-1, ..., 0 with the smallest H_j
these allow (``_refutes``) gives r_0 + h_0 <= R_0 + H_0 = r / m (by induction on j,
R_j >= r_j and R_j - c H_j >= r_j - c h_j for c = j / (r - j)). If the recursion exceeds r / m,
then P[>= v correct] < tau: the claim is refuted at level tau.

Why an estimate: the claim tested is "the mechanism is mu-GDP" (f = G_mu); the result is the
largest refuted mu (``mu_lower``) converted to epsilon of mu-GDP at ``delta``
(``gdp_epsilon``). That epsilon is what a mechanism with a GDP-shaped trade-off curve and
parameter mu_lower has; it is not implied for mechanisms whose curve has another shape.

Guesses and correction: candidate guess sets are fixed fractions of m (``guess_fractions``) on
the chosen ``sides`` ("in": top scores, "out": bottom scores, at most m/2 of them; "both":
half of the guesses each way); exactly that many guesses, ties broken in a seeded random order
drawn without looking at membership (``stats.ties``).

Design: each canary a member independently with probability 1/2 (``inclusion``; other values
are refused, and so is a member count implausible under 1/2: ``stats.inclusion``).
Each candidate is tested at level (1 - confidence) / G, G the number of distinct candidates
(Bonferroni; G depends only on m and the options, never on the scores).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from dpaudit._validate import check_seed
from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.stats.inclusion import check_inclusion, require_plausible
from dpaudit.stats.one_run import ranked_guesses
from dpaudit.stats.result import EpsilonBound

ASSUME_FDP_ONE_RUN = (
    "GDP-shaped trade-off curve (f-DP one-run, Mahloujifar et al. 2024; epsilon of the mu-GDP "
    "curve at the lower confidence value of mu)"
)
SIDES = ("in", "out", "both")
DEFAULT_SIDES = ("in", "both")
DEFAULT_GUESS_FRACTIONS = tuple(2.0**-j for j in range(17))  # 1, 1/2, ..., 2^-16
MIN_GUESSES = 10  # fewer guesses cannot refute anything at usual levels; not a candidate
MU_CAP = 50.0  # search limit for mu (reported as mu_lower if still refuted there)
_POINTS = 63  # mu values tried per candidate per refinement round
_REL_TOL = 1e-6


def gdp_roc_inverse(tpr, mu):
    """Smallest FPR at which mu-GDP's ROC reaches ``tpr``: Phi(Phi^-1(tpr) - mu) (vectorised)."""
    return ndtr(ndtri(tpr) - mu)


def _refutes(
    guesses, correct, param, one_sided, *, m: int, level: float, roc_inverse=gdp_roc_inverse
) -> np.ndarray:
    """Vectorised Algorithm-3 test: True where the claim ``param`` is refuted at ``level``.

    ``roc_inverse(tpr, param)``: the smallest FPR at which the claimed ROC (1 - f) reaches
    ``tpr``, vectorised over both (default: mu-GDP, ``param`` = mu). It must never exceed the
    exact inverse (a larger value could refute a true claim). All array arguments broadcast
    together (one entry per test). The recursion runs over the levels j = v-1, ..., 0 for all
    entries at once; an entry leaves when its wrong-guess bound stops growing (nothing changes
    after that) or as soon as the bounds exceed r / m.
    """
    arrs = np.broadcast_arrays(
        np.asarray(guesses, dtype=np.float64),
        np.asarray(correct, dtype=np.float64),
        np.asarray(param, dtype=np.float64),
        np.where(np.asarray(one_sided, dtype=bool), 2.0, 1.0),
    )
    k, v, mus, lam = (a.ravel() for a in arrs)
    # (r_v, h_v): if P[C >= v] >= level, then R_v >= r_v and R_v - c H_v >= r_v - c h_v for
    # every c <= v / (k - v); below v, h_j is a lower bound on H_j (docs/one_run_fdp.md)
    r = level * v / m
    h = level * (k - v) / m
    # R_j <= E[C] / m <= 1 / lam (one-sided: C <= number of canaries in, or out), so a start
    # above it is already a contradiction; R_j + H_j <= k / m ends the recursion.
    refuted = (v >= 1) & (lam * r > 1.0)
    act = np.flatnonzero((v >= 1) & ~refuted)
    r, h, j, k, mus, lam = r[act], h[act], v[act] - 1.0, k[act], mus[act], lam[act]
    cap = k / m
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        while act.size:
            # smallest H_j that R_{j+1} = r allows
            h_new = np.asarray(roc_inverse(lam * r, mus), dtype=np.float64) / lam
            r_new = r + j / (k - j) * (h_new - h)
            grows = h_new > h
            hit = grows & ((r_new + h_new > cap) | (lam * r_new > 1.0))
            refuted[act[hit]] = True
            keep = grows & ~hit & (j >= 1.0)
            if not keep.all():
                act, k, mus, lam, cap = act[keep], k[keep], mus[keep], lam[keep], cap[keep]
                r_new, h_new, j = r_new[keep], h_new[keep], j[keep]
            r, h, j = r_new, h_new, j - 1.0
    return refuted.reshape(arrs[0].shape)


def refutes_gdp(guesses, correct, mu, *, m: int, level: float, one_sided: bool = True):
    """True where r = ``guesses`` guesses with v = ``correct`` right refute mu-GDP at ``level``.

    ``m``: number of canaries (each included independently with probability 1/2);
    ``one_sided``: all guesses say "in" (or all say "out"), which allows the sharper bound
    (module doc). Arrays broadcast; returns a bool array (a bool for scalar input).
    """
    out = _refutes(guesses, correct, mu, one_sided, m=int(m), level=float(level))
    return bool(out) if out.ndim == 0 else out


def largest_refuted(
    guesses,
    correct,
    one_sided,
    *,
    m: int,
    level: float,
    roc_inverse=gdp_roc_inverse,
    cap: float = MU_CAP,
    prune: bool = False,
) -> np.ndarray:
    """For each candidate, the largest parameter of a claim family that its guesses refute.

    ``roc_inverse(tpr, param)`` describes the family (``_refutes``; default mu-GDP); the
    family must grow less private with the parameter, so that refutation is monotone (mu of
    GDP, epsilon of (epsilon, delta)-DP). Returns 0 where not even the parameter 0 is refuted.
    A bracket [lo, hi] (lo refuted, hi not) is found by doubling from 1 and then shrunk by
    trying 63 values per candidate per round, all candidates at once, to a relative width of
    1e-6. The lower end is returned (a refuted value), capped at ``cap``. ``prune``: stop
    refining a candidate once its bracket lies below the best lower end (only the maximum is
    then exact; the other values are still refuted ones).
    """
    k = np.atleast_1d(np.asarray(guesses, dtype=np.float64))
    v = np.atleast_1d(np.asarray(correct, dtype=np.float64))
    sided = np.broadcast_to(np.asarray(one_sided, dtype=bool), k.shape)
    lo = np.zeros(k.size)
    hi = np.ones(k.size)

    def test(idx, params):
        return _refutes(
            k[idx, None], v[idx, None], params, sided[idx, None], m=m, level=level,
            roc_inverse=roc_inverse,
        )

    alive = np.flatnonzero(test(np.arange(k.size), np.zeros((k.size, 1)))[:, 0])
    hi[np.setdiff1d(np.arange(k.size), alive)] = 0.0  # not even the parameter 0 is refuted
    while alive.size:  # doubling
        grow = alive[test(alive, hi[alive, None])[:, 0]]
        lo[grow] = hi[grow]
        hi[grow] = np.minimum(2.0 * hi[grow], cap)
        alive = grow[lo[grow] < cap]
    frac = np.arange(1, _POINTS + 1) / (_POINTS + 1.0)
    fine = np.arange(k.size)
    while True:
        fine = fine[hi[fine] - lo[fine] > _REL_TOL * np.maximum(lo[fine], 1e-3)]
        if prune:
            fine = fine[hi[fine] > lo.max()]
        if not fine.size:
            return lo
        grid = lo[fine, None] + (hi[fine] - lo[fine])[:, None] * frac[None, :]
        res = test(fine, grid)
        n_ok = np.where(res.all(axis=1), _POINTS, np.argmin(res, axis=1))  # first not refuted
        has = n_ok > 0
        lo[fine[has]] = grid[has, n_ok[has] - 1]
        below = n_ok < _POINTS
        hi[fine[below]] = grid[below, n_ok[below]]


def largest_refuted_mu(
    guesses, correct, one_sided, *, m: int, level: float, prune: bool = False
) -> np.ndarray:
    """For each candidate, the largest mu that its guesses refute at ``level`` (0 if none):
    ``largest_refuted`` for the mu-GDP family, capped at ``MU_CAP``."""
    return largest_refuted(guesses, correct, one_sided, m=m, level=level, prune=prune)


def _candidates(m: int, fractions: np.ndarray, sides: tuple[str, ...]):
    """Distinct (k+, k-) guess counts with at least ``MIN_GUESSES`` guesses.

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


def _guess_counts(s_in: np.ndarray, s_out: np.ndarray, k_plus, k_minus, seed: int):
    """Correct guesses when "in" is guessed for the k+ top and "out" for the k- bottom scores.

    Exactly k+ + k- guesses; tied scores are ordered at random (``ties.random_order``, drawn
    without looking at membership), so ties neither help nor hurt the auditor. Returns
    (correct, t_plus, t_minus) (``one_run.ranked_guesses``).
    """
    is_in = np.concatenate([np.ones(s_in.size, bool), np.zeros(s_out.size, bool)])
    return ranked_guesses(np.concatenate([s_in, s_out]), is_in, k_plus, k_minus, seed)


def _check_sides(sides) -> tuple[str, ...]:
    items = (sides,) if isinstance(sides, str) else sides
    try:
        items = tuple(items)
    except TypeError:
        raise ValueError(f"sides must be a sequence of {SIDES}, got {sides!r}") from None
    if not items or any(not isinstance(s, str) or s not in SIDES for s in items):
        raise ValueError(f"sides must be a non-empty sequence of {SIDES}, got {sides!r}")
    return tuple(dict.fromkeys(items))


def _check_fractions(guess_fractions) -> np.ndarray:
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


GUESS_OPTIONS = ("guess_fractions", "inclusion", "seed", "sides")


@dataclass(frozen=True)
class GuessTable:
    """The candidate guess sets of a one-run audit and how many guesses each got right.

    One entry per candidate: ``k_plus`` "in" guesses on the top scores, ``k_minus`` "out"
    guesses on the bottom ones, ``correct`` of them right, ``t_plus`` / ``t_minus`` the
    thresholds, ``one_sided`` when every guess points the same way. ``m``: the canaries.
    ``details``: the design (sides, inclusion, split p-value, seed) for reports.
    """

    m: int
    k_plus: np.ndarray
    k_minus: np.ndarray
    correct: np.ndarray
    t_plus: np.ndarray
    t_minus: np.ndarray
    details: dict

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


def guess_table(scores_in, scores_out, *, method: str, **options) -> GuessTable:
    """Validate the guess options and count the correct guesses of every candidate.

    ``scores_in`` / ``scores_out``: the scores (higher = member) of the canaries that were
    included / excluded, each included independently with probability 1/2. Options (anything
    else raises ValueError naming it and ``method``): ``guess_fractions``, ``sides``,
    ``inclusion`` (only 0.5), ``seed`` (see ``fdp_one_run_bound``). A split implausible under
    1/2 raises ValueError naming ``inclusion``. The candidates depend on m and the options
    only, never on the scores.
    """
    unknown = sorted(set(options) - set(GUESS_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for {method}; allowed: {list(GUESS_OPTIONS)}"
        )
    fractions = _check_fractions(options.get("guess_fractions", DEFAULT_GUESS_FRACTIONS))
    sides = _check_sides(options.get("sides", DEFAULT_SIDES))
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
    pairs = _candidates(m, fractions, sides)
    details = {
        "m": m,
        "n_candidates": len(pairs),
        "sides": list(sides),
        "inclusion": inclusion,
        "split_p_value": split_pv,
        "seed": seed,
    }
    kp, km = (np.array(pairs, dtype=np.int64).reshape(-1, 2).T)
    if pairs:
        correct, t_plus, t_minus = _guess_counts(s_in, s_out, kp, km, seed)
    else:
        correct = t_plus = t_minus = np.zeros(0)
    return GuessTable(m, kp, km, np.asarray(correct), t_plus, t_minus, details)


def fdp_one_run_bound(
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    *,
    delta: float,
    confidence: float,
    **options,
) -> EpsilonBound:
    """Epsilon estimate from the f-DP one-run audit, assuming a GDP-shaped trade-off curve.

    ``scores_in``: scores (higher = member) of the canaries that were included,
    ``scores_out``: of those excluded; 1-d float64 arrays, each canary included independently
    with probability 1/2 (a split implausible under 1/2 raises ValueError naming
    ``inclusion``). ``delta`` in (0, 1): epsilon is that of mu_lower-GDP at this delta
    (delta = 0 is refused: every mu > 0 has infinite epsilon there). ``confidence`` in (0, 1).

    Options (anything else raises ValueError naming it):

    * ``guess_fractions``: fractions of m = n_in + n_out giving the number of guesses of each
      candidate; default ``DEFAULT_GUESS_FRACTIONS`` = 1, 1/2, 1/4, ..., 2^-16. One-sided
      candidates are capped at m // 2 guesses; candidates with fewer than ``MIN_GUESSES`` = 10
      guesses are dropped and duplicates merged.
    * ``sides``: any of "in" (guess "in" for the top scores), "out" (guess "out" for the
      bottom scores), "both" (half of the guesses each way); default ("in", "both").
    * ``inclusion``: the design's inclusion probability; only 0.5 (the default) is derived.
    * ``seed``: the random order of tied scores (default 0).

    Each candidate is tested at level (1 - confidence) / G, G the number of distinct
    candidates; the best is kept. ``details``: per candidate (``candidates``) k+, k-, correct
    guesses and a refuted mu (the largest for the chosen one; candidates that cannot win are
    not refined), and the chosen one's side, counts and thresholds t+ / t-.
    """
    delta = float(delta)
    if not (np.isfinite(delta) and 0.0 < delta < 1.0):
        raise ValueError(
            f"delta must lie in (0, 1) for fdp_one_run (epsilon of mu-GDP is infinite at "
            f"delta = 0), got {delta!r}"
        )
    confidence = float(confidence)
    if not (np.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    table = guess_table(scores_in, scores_out, method="fdp_one_run", **options)
    m, details = table.m, dict(table.details)
    common = {
        "method": "fdp_one_run",
        "confidence": confidence,
        "delta": delta,
        "n_in": int(np.size(scores_in)),
        "n_out": int(np.size(scores_out)),
        "assumption": ASSUME_FDP_ONE_RUN,
    }
    if not table.k_plus.size:
        details["note"] = f"no candidate with at least {MIN_GUESSES} guesses (m={m})"
        return EpsilonBound(epsilon=0.0, mu_lower=0.0, details=details, **common)

    level = table.level(confidence)
    mu = largest_refuted_mu(
        table.guesses, table.correct, table.one_sided, m=m, level=level, prune=True
    )
    best, report = table.best(mu, "mu", level)
    details.update(report)
    mu_lower = float(mu[best])
    epsilon = gdp_epsilon(mu_lower, delta) if mu_lower > 0 else 0.0
    return EpsilonBound(
        epsilon=float(epsilon),
        threshold=table.threshold(best) if mu_lower > 0 else None,
        mu_lower=mu_lower,
        details=details,
        **common,
    )
