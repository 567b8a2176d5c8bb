"""Choosing a count test before the scores are seen: from the claim and the sample sizes.

A design (``count_test.RankDesign``: which ranks carry the "in" and "out" guesses) may use
anything but the scores: here the claimed mechanism's score law (``law.mixture_score_law``
at the claimed q, T, sigma), the sample sizes, delta and the level. Whatever the true
mechanism, the test it defines is valid at its full level (one test: nothing to correct
for); the claim only decides how powerful it is.

* ``design_epsilon``: the design whose median certified epsilon is largest when the scores
  follow the claim. Candidates: "in" guesses only, "out" only, or both, at ranks on a log grid
  (``rank_grid``). A normal surrogate of the p-value ranks them all (vectorised); the best
  few are evaluated exactly (the median of the statistic under the claim,
  ``StatisticLaw``, and the certified epsilon there), and the best is returned with its
  median certified epsilon as ``expected``.
* ``design_curve``: the design most powerful against a given truth when the null is a given
  ROC bound (the claimed mechanism's curve at a slightly larger noise, for the
  effective-noise bound and the claim test), at a level.

Because the certified epsilon of a design increases with its statistic S, its median is the
certification at S's median, which is how ``expected`` and the count ceiling
(``ceiling.count_ceiling``) are computed without simulation. ``StatisticLaw`` is the law of S
for given true ROCs: N_hi is a Beta-mixture of Binomial(n_hi, roc(x) / (1 - y)) and M_lo of
Binomial(m_lo, roc_reverse(y) / (1 - x)); the coupling factor 1 / (1 - y) (and 1 / (1 - x))
is taken at y's (x's) mean, which moves the rates by less than y's spread (below 1e-3 at the
ranks designs use), and the crossing of the thresholds (probability below 1e-30 there) is
ignored. It is a computation of the law, not a bound: the tests' p-values never use it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy.special import betaincinv, ndtr

from dpaudit._validate import check_count, check_delta, check_open_unit
from dpaudit.stats.data_rate.count_test import (
    _COMPUTED,
    _TOL,
    _U_GRID,
    FALLBACK,
    NullTail,
    RankDesign,
    Roc,
    _beta_nodes,
    _first_nonzero,
    _log_factorials,
    _Mixture,
    certify_epsilon_at,
    dp_roc,
    null_p_value,
)
from dpaudit.stats.data_rate.law import MixtureScoreLaw

_RANKS = 30  # ranks per side on the log grid
_TOP_EXACT = 6  # surrogate's best candidates evaluated exactly
_BISECT = 24  # surrogate bisection steps on [0, 32]
_GRID = 2.0 ** np.floor(np.log2(_TOL))  # the certified epsilons' grid (certify_epsilon_at)
_LAW_DROP = 1e-12  # StatisticLaw: the Beta cells of total weight below this at the top left out
_LAW_SD = 9.0  # StatisticLaw: each binomial's support, mean +- 9 sd (+ 9): mass beyond < 1e-18


def rank_grid(n: int) -> np.ndarray:
    """Candidate ranks for a side of ``n`` scores: 0 and a log grid up to n / 4 (about 30)."""
    return _rank_grid(int(n)).copy()


@functools.lru_cache(maxsize=64)
def _rank_grid(n: int) -> np.ndarray:
    top = max(n / 4.0, 1.0)
    r = np.unique(np.round(np.geomspace(1.0, top, _RANKS)).astype(np.int64)) - 1
    r = r[r < n]
    r.setflags(write=False)
    return r


@functools.lru_cache(maxsize=512)
def _mid_nodes(k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(x at the cells' midpoints in u, weights) of Beta(k + 1, n - k) on ``_U_GRID``
    (memoised per (k, n), read-only)."""
    u = 0.5 * (_U_GRID[1:] + _U_GRID[:-1])
    x, w = np.ones(u.size), np.diff(_U_GRID)
    x[:_COMPUTED] = betaincinv(k + 1.0, float(n - k), u[:_COMPUTED])  # the rest: as _beta_nodes
    x.setflags(write=False)
    w.setflags(write=False)
    return x, w


class StatisticLaw:
    """The law of a design's statistic S = N_hi + M_lo when the canaries' score ROCs are
    ``roc`` ("in" side) and ``roc_reverse`` ("out" side) (module doc)."""

    def __init__(self, design: RankDesign, roc: Roc, roc_reverse: Roc):
        self.design = design
        table = _log_factorials(max(design.n_in, design.n_out))
        parts = []
        x_mean = 0.0 if design.k_hi is None else (design.k_hi + 1.0) / (design.n_out + 1.0)
        y_mean = 0.0 if design.k_lo is None else (design.k_lo + 1.0) / (design.n_in + 1.0)
        if design.k_hi is not None:
            x, w = _mid_nodes(design.k_hi, design.n_out)
            r = np.minimum(1.0, np.asarray(roc(x), dtype=np.float64) / (1.0 - y_mean))
            parts.append(_Mixture(design.n_hi, r, w, _LAW_DROP, table, _LAW_SD).pmf())
        if design.k_lo is not None:
            y, w = _mid_nodes(design.k_lo, design.n_in)
            r = np.minimum(1.0, np.asarray(roc_reverse(y), dtype=np.float64) / (1.0 - x_mean))
            parts.append(_Mixture(design.m_lo, r, w, _LAW_DROP, table, _LAW_SD).pmf())
        pmf = parts[0]
        if len(parts) == 2:  # one convolution over the two supports
            a, b = parts
            ia, ib = _first_nonzero(a), _first_nonzero(b)
            pmf = np.zeros(a.size + b.size - 1)
            part = np.convolve(a[ia:], b[ib:])
            pmf[ia + ib : ia + ib + part.size] = part
        self.pmf = pmf / pmf.sum()
        self._sf = np.concatenate([np.cumsum(self.pmf[::-1])[::-1], [0.0]])

    def sf(self, s: int) -> float:
        """P[S >= s]."""
        if s <= 0:
            return 1.0
        return float(self._sf[min(int(s), self._sf.size - 1)])

    def median(self) -> int:
        """The largest s with P[S >= s] >= 1/2."""
        return int(np.flatnonzero(self._sf >= 0.5)[-1])


def statistic_law(design: RankDesign, law: MixtureScoreLaw) -> StatisticLaw:
    """``StatisticLaw`` of ``design`` when the scores follow ``law``."""
    return StatisticLaw(design, law.roc, law.roc_reverse)


class _Moments:
    """Per rank of one side: the Beta nodes, to average a rate function over x; and their
    prefix sums, to average the (e, delta)-DP bound (piecewise linear in x) in O(log cells)."""

    def __init__(self, ranks: np.ndarray, n: int):
        self.ranks = ranks
        self.n = n
        nodes = [_beta_nodes(int(k), n) for k in ranks]
        self.x = np.stack([a for a, _ in nodes])  # (ranks, cells), upper ends
        self.w = np.stack([b for _, b in nodes])
        cells = self.x.shape[1]
        zero = np.zeros((len(ranks), 1))
        self.p0 = np.concatenate([zero, np.cumsum(self.w, axis=1)], axis=1)
        self.p1 = np.concatenate([zero, np.cumsum(self.w * self.x, axis=1)], axis=1)
        self.p2 = np.concatenate([zero, np.cumsum(self.w * self.x**2, axis=1)], axis=1)
        # rows side by side (x in [0, 1] + 2 x row): one sorted array for every row's search
        self.flat = (self.x + 2.0 * np.arange(len(ranks))[:, None]).reshape(-1)
        self.cells = cells

    @functools.cached_property
    def xm(self) -> np.ndarray:
        """(ranks, cells): the cells' midpoints in u."""
        return np.stack([_mid_nodes(int(k), self.n)[0] for k in self.ranks])

    def dp_parts(self, rows: np.ndarray, e: np.ndarray, delta: float
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Per entry (row, epsilon): (E r, Var r) over the row's cells (upper ends) of the
        (e, delta)-DP bound r(x) = max(x, min(1, e^e x + delta, 1 - e^-e (1 - delta - x))),
        which is e^e x + delta up to x1 = (1 - delta) / (e^e + 1), 1 - e^-e (1 - delta - x)
        up to 1 - delta and 1 beyond (e >= 0): sums of w, w x, w x^2 over each piece. The
        same numbers as summing over the cells (to rounding)."""
        rows = np.where(rows >= 0, rows, 0)  # placeholders for a side switched off
        c = np.exp(e)
        cells = self.cells
        x1 = (1.0 - delta) / (c + 1.0)
        i1 = np.searchsorted(self.flat, x1 + 2.0 * rows, side="right") - rows * cells
        i2 = np.searchsorted(self.flat, (1.0 - delta) + 2.0 * rows, side="right") - rows * cells
        i1, i2 = np.clip(i1, 0, cells), np.clip(i2, 0, cells)
        i2 = np.maximum(i2, i1)
        a0, a1, a2 = self.p0[rows, i1], self.p1[rows, i1], self.p2[rows, i1]
        b0, b1, b2 = (self.p0[rows, i2] - a0, self.p1[rows, i2] - a1,
                      self.p2[rows, i2] - a2)
        c0 = self.p0[rows, cells] - self.p0[rows, i2]
        ab, bb = 1.0 - (1.0 - delta) / c, 1.0 / c
        e1 = c * a1 + delta * a0 + ab * b0 + bb * b1 + c0
        e2 = (c * c * a2 + 2.0 * c * delta * a1 + delta * delta * a0
              + ab * ab * b0 + 2.0 * ab * bb * b1 + bb * bb * b2 + c0)
        return e1, np.maximum(e2 - e1 * e1, 0.0)


def _candidates(n_in: int, n_out: int, sides: str):
    """(k_hi, k_lo) pairs: None switches a side off."""
    hi, lo = rank_grid(n_out), rank_grid(n_in)
    out = []
    if sides in ("best", "in"):
        out += [(int(k), None) for k in hi]
    if sides in ("best", "out"):
        out += [(None, int(k)) for k in lo]
    if sides in ("best", "both"):
        out += [(int(a), int(b)) for a in hi for b in lo]
    if not out:
        raise ValueError(f"sides must be 'best', 'both', 'in' or 'out', got {sides!r}")
    return out


class _Surrogate:
    """Normal approximations of S's law, vectorised over candidate designs."""

    def __init__(self, cands, n_in: int, n_out: int, ranks: tuple | None = None):
        self.cands = cands
        self.n_in, self.n_out = n_in, n_out
        hi, lo = (rank_grid(n_out), rank_grid(n_in)) if ranks is None else ranks
        self.hi = _Moments(np.asarray(hi, dtype=np.int64), n_out)
        self.lo = _Moments(np.asarray(lo, dtype=np.int64), n_in)
        ih = {int(k): i for i, k in enumerate(self.hi.ranks)}
        il = {int(k): i for i, k in enumerate(self.lo.ranks)}
        self.i_hi = np.array([ih.get(a, -1) if a is not None else -1 for a, _ in cands])
        self.i_lo = np.array([il.get(b, -1) if b is not None else -1 for _, b in cands])
        self.n_hi = np.array([n_in - (0 if b is None else b + 1) for _, b in cands], float)
        self.m_lo = np.array([n_out - (0 if a is None else a + 1) for a, _ in cands], float)

    def law(self, roc: Roc, rev: Roc, upper: bool) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of S per candidate under ROCs (at the cells' upper ends when
        ``upper``, as the p-value; at their midpoints otherwise, as the truth's law)."""
        xh = self.hi.x if upper else self.hi.xm
        xl = self.lo.x if upper else self.lo.xm
        rh = np.clip(np.asarray(roc(xh.reshape(-1)), float).reshape(xh.shape), 0, 1)
        rl = np.clip(np.asarray(rev(xl.reshape(-1)), float).reshape(xl.shape), 0, 1)
        eh, vh = _parts(rh, self.hi.w)
        el, vl = _parts(rl, self.lo.w)
        return self._combine(eh[self.i_hi], vh[self.i_hi], el[self.i_lo], vl[self.i_lo])

    def dp_law(self, e: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of the p-value's S per candidate under (e_c, delta)-DP, one
        epsilon per candidate (``_Moments.dp_parts``)."""
        eh, vh = self.hi.dp_parts(self.i_hi, e, delta)
        el, vl = self.lo.dp_parts(self.i_lo, e, delta)
        return self._combine(eh, vh, el, vl)

    def _combine(self, eh, vh, el, vl):
        on_h, on_l = self.i_hi >= 0, self.i_lo >= 0
        mean = np.where(on_h, eh * self.n_hi, 0.0) + np.where(on_l, el * self.m_lo, 0.0)
        var = (np.where(on_h, (eh - eh * eh - vh) * self.n_hi + vh * self.n_hi**2, 0.0)
               + np.where(on_l, (el - el * el - vl) * self.m_lo + vl * self.m_lo**2, 0.0))
        return mean, var


def _parts(r: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: (E r, Var r) over the cells' weights."""
    e1 = np.sum(w * r, axis=1)
    e2 = np.sum(w * r * r, axis=1)
    return e1, np.maximum(e2 - e1 * e1, 0.0)


def _p_normal(s, mean, var):
    return ndtr((mean - (s - 0.5)) / np.sqrt(var + 0.25))


def surrogate_epsilon(design: RankDesign, s: float, delta: float) -> float:
    """The normal surrogate's certified epsilon of ``design`` at statistic ``s`` (the largest
    e on [0, 32], to 2e-6, whose surrogate p-value is <= the design's level): a starting
    point for ``certify_epsilon_at``, not a bound."""
    hi = [design.k_hi if design.k_hi is not None else 0]
    lo = [design.k_lo if design.k_lo is not None else 0]
    sur = _Surrogate([(design.k_hi, design.k_lo)], design.n_in, design.n_out, (hi, lo))
    a, b = np.zeros(1), np.full(1, 32.0)
    for _ in range(_BISECT):
        mid = 0.5 * (a + b)
        m, v = sur.dp_law(mid, delta)
        rej = _p_normal(float(s), m, v) <= design.level
        a, b = np.where(rej, mid, a), np.where(rej, b, mid)
    return float(a[0])


@dataclass(frozen=True)
class EpsilonDesign:
    """``design_epsilon``'s answer: the ``design``, its median certified epsilon under the
    claim (``expected``) and the statistic's median there (``median_statistic``)."""

    design: RankDesign
    expected: float
    median_statistic: int

    def to_dict(self) -> dict:
        """Plain dictionary."""
        return {"design": self.design.to_dict(), "expected": self.expected,
                "median_statistic": self.median_statistic}


def design_epsilon(law: MixtureScoreLaw, n_in: int, n_out: int, *, delta: float,
                   confidence: float, sides: str = "best", top: int = _TOP_EXACT
                   ) -> EpsilonDesign:
    """The rank design with the largest median certified epsilon under ``law`` (module doc).

    Args:
        law: the claimed mechanism's score law (``law.mixture_score_law``).
        n_in, n_out: the member and non-member canaries the audit will score.
        delta: the delta at which epsilon is certified.
        confidence: the certified bound's confidence (the test's level is 1 - confidence).
        sides: ``"best"`` (in, out or both, whichever is best), ``"both"``, ``"in"`` or
            ``"out"``: restrict the candidates.
        top: how many of the surrogate's best are evaluated exactly (and the best "in",
            "out" and two-sided candidate each).
    """
    n_in, n_out = check_count(n_in, "n_in", 1), check_count(n_out, "n_out", 1)
    delta = check_delta(delta, zero_ok=True)
    level = 1.0 - check_open_unit(confidence, "confidence")
    cands = _candidates(n_in, n_out, sides)
    sur = _Surrogate(cands, n_in, n_out)
    s_mean, _ = sur.law(law.roc, law.roc_reverse, upper=False)
    lo, hi = np.zeros(len(cands)), np.full(len(cands), 32.0)
    for _ in range(_BISECT):
        mid = 0.5 * (lo + hi)
        m, v = sur.dp_law(mid, delta)
        rej = _p_normal(s_mean, m, v) <= level
        lo, hi = np.where(rej, mid, lo), np.where(rej, hi, mid)
    order = list(np.argsort(-lo)[: max(1, int(top))])
    kinds = np.array([("in" if b is None else "out" if a is None else "both")
                      for a, b in cands])
    for kind in ("in", "out", "both"):  # the best of each kind is evaluated exactly too
        idx = np.flatnonzero(kinds == kind)
        if idx.size:
            i = int(idx[np.argmax(lo[idx])])
            if i not in order:
                order.append(i)
    best = None
    for i in order:
        k_hi, k_lo = cands[i]
        d = RankDesign(k_hi, k_lo, n_in, n_out, level,
                       f"design_epsilon: ranks k_hi={k_hi}, k_lo={k_lo} (surrogate "
                       f"{lo[i]:.3f})")
        med = statistic_law(d, law).median()
        if best is not None and not _certifies_above(d, med, best.expected, delta):
            continue  # it certifies at most the best's epsilon at its median
        guess = lo[i] if best is None else max(lo[i], best.expected + _GRID)
        eps, _ = certify_epsilon_at(d, med, delta=delta, guess=guess)
        if best is None or eps > best.expected:
            best = EpsilonDesign(d, float(eps), int(med))
    return best


def _certifies_above(design: RankDesign, s: int, e: float, delta: float) -> bool:
    """Whether ``certify_epsilon_at(design, s)`` exceeds ``e`` (a value it returned, on its
    grid of ``_GRID``): whether the next grid point's p-value is <= the level (the p-value
    increases with epsilon). One p-value instead of a certification."""
    nxt = e + _GRID
    if nxt > 64.0:
        return False
    return null_p_value(design, s, dp_roc(nxt, delta)) <= design.level


def critical_value(design: RankDesign, roc: Roc, roc_reverse: Roc | None = None) -> int:
    """The smallest statistic whose p-value under "ROC <= roc" is <= the design's level
    (the test rejects exactly when S >= it; p-values decrease with S): from one
    ``NullTail`` (the bound at every S), n_in + n_out + 1 when no S is rejected."""
    rev = roc if roc_reverse is None else roc_reverse
    tail = NullTail(design, roc, rev)
    share = (1.0 - FALLBACK) if design.sides == "both" else 1.0
    s = np.arange(1, tail.sf.size + 1)  # p(0) = 1; beyond sf's support the bound is flat
    ok = np.flatnonzero(tail.p(s) / share <= design.level)
    return int(s[ok[0]]) if ok.size else design.n_in + design.n_out + 1


def power(design: RankDesign, roc: Roc, truth: MixtureScoreLaw,
          roc_reverse: Roc | None = None) -> float:
    """P[the design rejects "ROC <= roc"] when the scores follow ``truth``: P[S >= the
    critical value] under ``statistic_law`` (a computation, not a bound)."""
    return statistic_law(design, truth).sf(critical_value(design, roc, roc_reverse))


def _curve_surrogate(truth: MixtureScoreLaw, null_roc: Roc, rev: Roc, n_in: int, n_out: int,
                     level: float, sides: str):
    """(candidates, the normal surrogate's power of each) for ``design_curve``."""
    from scipy.special import ndtri

    cands = _candidates(n_in, n_out, sides)
    sur = _Surrogate(cands, n_in, n_out)
    m0, v0 = sur.law(null_roc, rev, upper=True)
    m1, v1 = sur.law(truth.roc, truth.roc_reverse, upper=False)
    crit = m0 + 0.5 - ndtri(level) * np.sqrt(v0 + 0.25)
    return cands, _p_normal(crit, m1, v1)


def surrogate_power(truth: MixtureScoreLaw, null_roc: Roc, n_in: int, n_out: int, *,
                    level: float, null_roc_reverse: Roc | None = None,
                    sides: str = "best") -> float:
    """The normal surrogate's power of the best candidate design (a search aid:
    ``design_curve`` evaluates its best ones exactly)."""
    rev = null_roc if null_roc_reverse is None else null_roc_reverse
    return float(np.max(_curve_surrogate(truth, null_roc, rev, n_in, n_out, level, sides)[1]))


def design_curve(truth: MixtureScoreLaw, null_roc: Roc, n_in: int, n_out: int, *,
                 level: float, null_roc_reverse: Roc | None = None, sides: str = "best",
                 top: int = 3) -> tuple[RankDesign, float]:
    """(the rank design most powerful against ``truth`` when the null is "ROC <=
    ``null_roc``" at ``level``, its power): the surrogate ranks every candidate, the best
    ``top`` are evaluated exactly (``power``)."""
    n_in, n_out = check_count(n_in, "n_in", 1), check_count(n_out, "n_out", 1)
    level = check_open_unit(level, "level")
    rev = null_roc if null_roc_reverse is None else null_roc_reverse
    cands, pw = _curve_surrogate(truth, null_roc, rev, n_in, n_out, level, sides)
    return _best_exact(cands, pw, truth, null_roc, rev, n_in, n_out, level, top)


def _best_exact(cands, pw, truth: MixtureScoreLaw, null_roc: Roc, rev: Roc, n_in: int,
                n_out: int, level: float, top: int, memo: dict | None = None
                ) -> tuple[RankDesign, float]:
    """``design_curve``'s exact step: the surrogate's best ``top`` by exact power (``memo``:
    the truth's ``StatisticLaw`` per ranks, kept across calls with the same truth)."""
    memo = {} if memo is None else memo
    best, best_power = None, -1.0
    for i in np.argsort(-pw)[: max(1, int(top))]:
        k_hi, k_lo = cands[i]
        d = RankDesign(k_hi, k_lo, n_in, n_out, level,
                       f"design_curve: ranks k_hi={k_hi}, k_lo={k_lo}")
        if (k_hi, k_lo) not in memo:
            memo[(k_hi, k_lo)] = statistic_law(d, truth)
        p = memo[(k_hi, k_lo)].sf(critical_value(d, null_roc, rev))
        if p > best_power:
            best, best_power = d, p
    return best, float(best_power)
