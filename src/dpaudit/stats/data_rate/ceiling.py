"""What independent data-rate canaries can certify at all, on the mechanism itself.

Two ceilings at (n_in, n_out), both computed from the mechanism's exact score law (no
simulation):

* ``count_ceiling``: the largest MEDIAN certified epsilon of the pre-registered rank count
  tests (``count_test``: "in" guesses above a non-member rank, "out" guesses below a member
  rank, or both) when the scores follow the mechanism. For a design the certified epsilon
  increases with its statistic S, so its median is the certification at S's median
  (``design.StatisticLaw``); the ceiling is the best design's (the surrogate's best
  ``top`` and the integer ranks around the best, evaluated exactly). "Within one count step"
  compares an audit's certified value with it: ``step`` is what one more correct guess (S + 1)
  adds at the median.
* ``universal_ceiling``: an upper bound on the median of ANY valid certified lower bound,
  whatever statistic it uses. A valid bound L at confidence 1 - beta makes {L > e} a level-beta
  test of every (e, delta)-DP pair, in particular of the mechanism capped at e: the pair
  (P', Q') with P' equal to e^e Q (Q the non-members' law) above the score s_e where the
  mechanism's ROC meets the line TPR = e^e FPR (P' equals P below s_e and gives the region the
  same mass: P'(S > s_e) = e^e Q(S > s_e) = P(S > s_e)), and likewise Q' = e^e P below the
  point where the pair's other order meets its line (``capped_pair``). Every likelihood
  ratio of (P', Q') lies in [e^-e, e^e]: it is (e, 0)-DP, and it differs from the mechanism
  only on the scores beyond those two points. By Neyman-Pearson, P[L > e] <= the power of
  the likelihood-ratio test of (P', Q') against (P, Q) with n_in members and n_out
  non-members (``np_power``: a member's log-likelihood ratio is S - e in the upper region, a
  non-member's -S - e in the lower one, 0 elsewhere; their sums' laws by FFT on the score
  law's grid, rounded to 0.01). Where that power is below 1/2, no valid method's median
  exceeds e: the ceiling is the smallest such e (bisection).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpaudit._validate import check_count, check_delta, check_open_unit
from dpaudit.stats.data_rate.count_test import RankDesign, certify_epsilon_at
from dpaudit.stats.data_rate.design import EpsilonDesign, design_epsilon, statistic_law
from dpaudit.stats.data_rate.law import MixtureScoreLaw


@dataclass(frozen=True)
class CountCeiling:
    """``count_ceiling``'s answer: ``epsilon`` (the best median certified epsilon), its
    ``design`` and ``median_statistic``, ``step`` (certified at median + 1 minus at the
    median), and the best one-sided ("in" guesses only) design's median (``one_sided``)."""

    epsilon: float
    design: RankDesign
    median_statistic: int
    step: float
    one_sided: float

    def to_dict(self) -> dict:
        """Plain dictionary."""
        return {"epsilon": self.epsilon, "design": self.design.to_dict(),
                "median_statistic": self.median_statistic, "step": self.step,
                "one_sided": self.one_sided}


def _median_certified(d: RankDesign, law: MixtureScoreLaw, delta: float) -> EpsilonDesign:
    med = statistic_law(d, law).median()
    return EpsilonDesign(d, float(certify_epsilon_at(d, med, delta=delta)[0]), int(med))


def count_ceiling(law: MixtureScoreLaw, n_in: int, n_out: int, *, delta: float,
                  confidence: float, top: int = 16) -> CountCeiling:
    """The count ceiling of ``law`` at (n_in, n_out) (module doc)."""
    n_in, n_out = check_count(n_in, "n_in", 1), check_count(n_out, "n_out", 1)
    delta = check_delta(delta, zero_ok=True)
    confidence = check_open_unit(confidence, "confidence")
    best = design_epsilon(law, n_in, n_out, delta=delta, confidence=confidence, top=top)
    one = design_epsilon(law, n_in, n_out, delta=delta, confidence=confidence, sides="in",
                         top=max(4, top // 2))
    if one.expected > best.expected:
        best = one
    seen = {(best.design.k_hi, best.design.k_lo)}
    improved = True
    while improved:  # integer ranks around the best, until none is better
        improved = False
        d0 = best.design
        for dh in (-2, -1, 0, 1, 2):
            for dl in (-2, -1, 0, 1, 2):
                k_hi = None if d0.k_hi is None else d0.k_hi + dh
                k_lo = None if d0.k_lo is None else d0.k_lo + dl
                if (k_hi, k_lo) in seen or (k_hi is not None and not 0 <= k_hi < n_out) or \
                        (k_lo is not None and not 0 <= k_lo < n_in):
                    continue
                seen.add((k_hi, k_lo))
                d = RankDesign(k_hi, k_lo, n_in, n_out, d0.level,
                               f"count_ceiling: ranks k_hi={k_hi}, k_lo={k_lo}")
                cand = _median_certified(d, law, delta)
                if cand.expected > best.expected + 1e-9:
                    best, improved = cand, True
    up = certify_epsilon_at(best.design, best.median_statistic + 1, delta=delta)[0]
    return CountCeiling(best.expected, best.design, best.median_statistic,
                        float(up - best.expected), max(one.expected, 0.0))


def _region(tail_a: np.ndarray, tail_b: np.ndarray, c: float, cut: int) -> tuple[int, float]:
    """(first atom j of the capped region, fraction theta of atom j - 1 added) such that the
    region's mass under A equals c times its mass under B: A(region) = c B(region).

    The tails are suffix sums over ascending atoms (``tail[j]`` = mass of atoms >= j). With
    A = e^S B, A(S >= s) - c B(S >= s) grows as s falls from +inf to log c and shrinks below
    it, so the region is the suffix above the last atom below ``cut`` (the atom of log c)
    where that difference is negative (atoms above the cut are left out of the test: there
    the laws are at the FFT's rounding floor), with a fraction of the next atom to make the
    masses equal. (number of atoms, 0) when nothing is to cap."""
    diff = tail_a[:-1] - c * tail_b[:-1]
    bad = np.flatnonzero(diff[:cut] < 0)
    if bad.size == 0 or bad[-1] + 1 >= diff.size:
        return diff.size, 0.0
    j = int(bad[-1]) + 1
    a = tail_a[j - 1] - tail_a[j]
    b = tail_b[j - 1] - tail_b[j]
    theta = diff[j] / (c * b - a) if c * b - a > 0 else 0.0
    return j, float(min(max(theta, 0.0), 1.0))


def capped_pair(law: MixtureScoreLaw, epsilon: float) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """The mechanism capped at ``epsilon`` (module doc) on the law's grid: (score values,
    member pmf P', non-member pmf Q'). P' = e^eps Q on the members' upper region (the scores
    above the point where the ROC meets TPR = e^eps FPR, a fraction of the boundary atom
    included so that the region keeps its mass) and P elsewhere; Q' = e^eps P on the
    non-members' lower region, likewise. Every atom's likelihood ratio P'/Q' then lies in
    [e^-eps, e^eps]: the pair is (epsilon, 0)-DP. Needs a correct run's law."""
    if not law.exact_pair:
        raise ValueError("capped_pair needs the exact pair's law (the score is the log-LR)")
    v, q, p = law.values_out, law.pmf_out, law.pmf_in  # one grid (law.mixture_score_law)
    if p.size != q.size:
        raise ValueError("capped_pair needs the member and non-member laws on one grid")
    c = float(np.exp(epsilon))
    p2, q2 = p.copy(), q.copy()
    tq = np.concatenate([np.cumsum(q[::-1])[::-1], [0.0]])
    tp = np.concatenate([np.cumsum(p[::-1])[::-1], [0.0]])
    j, th = _region(tp, tq, c, int(np.searchsorted(v, epsilon)))
    if j < v.size:
        p2[j:] = c * q[j:]
        if j > 0:
            p2[j - 1] = (1 - th) * p[j - 1] + th * c * q[j - 1]
    hq = np.concatenate([[0.0], np.cumsum(q)])  # mass of atoms < i
    hp = np.concatenate([[0.0], np.cumsum(p)])
    j2, th2 = _region(hq[::-1], hp[::-1], c, int(v.size - np.searchsorted(v, -epsilon)))
    m = v.size - j2  # atoms 0..m - 1 in the region, and th2 of atom m
    if m > 0:
        q2[:m] = c * p[:m]
        if m < v.size:
            q2[m] = (1 - th2) * q[m] + th2 * c * p[m]
    return v, p2, q2


def _sample_law(w_true: np.ndarray, w_null: np.ndarray, ell: np.ndarray, h: float):
    """A sample's log-LR ``ell`` (per atom) on the grid h * integers: (first index, pmf under
    the truth, pmf under the null)."""
    idx = np.round(ell / h).astype(np.int64)
    lo, hi = int(idx.min()), int(idx.max())
    p1, p0 = np.zeros(hi - lo + 1), np.zeros(hi - lo + 1)
    np.add.at(p1, idx - lo, w_true)
    np.add.at(p0, idx - lo, w_null)
    return lo, p1 / p1.sum(), p0 / p0.sum()


def _compound(lo: int, pmf: np.ndarray, n: int, size: int) -> np.ndarray:
    """The rfft of the law of the sum of n i.i.d. draws of ``pmf`` (values (lo + i) h), on a
    circle of ``size`` cells (a value's index is its grid index mod size)."""
    a = np.zeros(size)
    np.add.at(a, np.mod(np.arange(pmf.size) + lo, size), pmf)
    return np.fft.rfft(a) ** n


def np_power(law: MixtureScoreLaw, epsilon: float, n_in: int, n_out: int, level: float,
             h: float = 0.01) -> float:
    """Power of the likelihood-ratio test of the mechanism capped at ``epsilon``
    (``capped_pair``, an (epsilon, 0)-DP pair) against the mechanism itself, at ``level``,
    with ``n_in`` members and ``n_out`` non-members (module doc). A sample's log-LR is rounded
    to a grid of ``h`` (a computation, accurate to that rounding)."""
    _, p2, q2 = capped_pair(law, epsilon)
    p, q = law.pmf_in, law.pmf_out
    with np.errstate(divide="ignore", invalid="ignore"):
        ell_m = np.where(p2 > 0, np.log(np.where(p > 0, p, 1.0) / np.where(p2 > 0, p2, 1.0)), 0)
        ell_n = np.where(q2 > 0, np.log(np.where(q > 0, q, 1.0) / np.where(q2 > 0, q2, 1.0)), 0)
    ell_m = np.where((p > 0) & (p2 > 0), ell_m, 0.0)
    ell_n = np.where((q > 0) & (q2 > 0), ell_n, 0.0)
    laws, mean1, mean0, var = [], 0.0, 0.0, 0.0
    for n, w1, w0, ell in ((n_in, p, p2, ell_m), (n_out, q, q2, ell_n)):
        lo, p1, p0 = _sample_law(w1, w0, ell, h)
        x = (lo + np.arange(p1.size)) * h
        for pp in (p1, p0):
            var += n * float(((x - x @ pp) ** 2) @ pp)
        mean1 += n * float(x @ p1)
        mean0 += n * float(x @ p0)
        laws.append((n, lo, p1, p0))
    sd = np.sqrt(var) + 1.0
    start = int(np.floor((min(mean0, mean1) - 40 * sd) / h))
    stop = int(np.ceil((max(mean0, mean1) + 40 * sd) / h))
    size = 1 << int(np.ceil(np.log2(stop - start + 1)))
    if size > 1 << 24:
        raise ValueError("np_power: the statistic's window is too wide for the grid h")
    f1 = f0 = 1.0
    for n, lo, p1, p0 in laws:
        f1 = f1 * _compound(lo, p1, n, size)
        f0 = f0 * _compound(lo, p0, n, size)
    # read the circle on the window [start, start + size): index i holds value start + i
    g1 = np.roll(np.maximum(np.fft.irfft(f1, size), 0.0), -np.mod(start, size))
    g0 = np.roll(np.maximum(np.fft.irfft(f0, size), 0.0), -np.mod(start, size))
    g1, g0 = g1 / g1.sum(), g0 / g0.sum()
    # the statistic is the log-LR: reject its largest values, randomise on the boundary cell
    t0 = np.concatenate([np.cumsum(g0[::-1])[::-1], [0.0]])
    t1 = np.concatenate([np.cumsum(g1[::-1])[::-1], [0.0]])
    k = int(np.flatnonzero(t0 > level)[-1]) if np.any(t0 > level) else 0
    gamma = (level - t0[k + 1]) / g0[k] if g0[k] > 0 else 0.0
    return float(min(1.0, t1[k + 1] + gamma * g1[k]))


def universal_ceiling(law: MixtureScoreLaw, n_in: int, n_out: int, *, confidence: float,
                      tol: float = 0.01) -> float:
    """The smallest epsilon at which the Neyman-Pearson power (``np_power``) falls below 1/2
    (module doc): no valid certified lower bound, of any form, has a median above it with
    ``n_in`` members and ``n_out`` non-members."""
    n_in, n_out = check_count(n_in, "n_in", 1), check_count(n_out, "n_out", 1)
    level = 1.0 - check_open_unit(confidence, "confidence")
    lo, hi = 0.0, 1.0
    while np_power(law, hi, n_in, n_out, level) >= 0.5:
        lo, hi = hi, 2 * hi
        if hi > 100:
            return float("inf")
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if np_power(law, mid, n_in, n_out, level) >= 0.5:
            lo = mid
        else:
            hi = mid
    return hi
