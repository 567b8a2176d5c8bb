"""One-run auditing (Steinke, Nasr & Jagielski, NeurIPS 2023, "Privacy auditing with one (1)
training run"): an epsilon lower bound from m canaries trained in one run.

Setting (their Section 3): each of the m canaries is included independently with
probability 1/2 (S uniform on {-1, +1}^m). The auditor sees one output, guesses "in" for r+
canaries, "out" for r- others and abstains on the rest (r = r+ + r- guesses); v of the guesses
are correct. If the mechanism is (eps, delta)-DP then (their Theorem 5.2 / Corollary 5.4)

    P[V >= v] <= P[Bin(r, q) >= v] + 2 m delta * max_{1<=i<=v} P[v - i <= Bin(r, q) < v] / i,
    q = e^eps / (1 + e^eps),

so eps is rejected at level beta when that p-value is < beta; the lower bound is the largest
rejected eps (found by bisection, as in their Appendix D). The implementation below is ours,
vectorised over i, with a conservative truncation of the max (documented in ``p_value``).

Inclusion probability p (``inclusion``, default 1/2): the design of the audit that produced
the memberships. A split implausible under p is refused (``stats.inclusion.require_plausible``,
a ValueError naming ``inclusion``). For p != 1/2 the theorem is applied to virtual fair-coin
labels drawn after training (``stats.inclusion``; derivation in ``docs/one_run_inclusion.md``):
guesses are scored against those labels and eps is rejected when the theorem rejects
eps' = log(1 + gamma (e^eps - 1)) at delta' = gamma delta, gamma = 2 min(p, 1 - p).

Guesses from scores: "in" for exactly the k+ highest scores, "out" for exactly the k- lowest,
ties between scores broken in a seeded random order drawn without looking at membership
(``stats.ties``), so r = k+ + k- is fixed, as the theorem requires. The paper's recipe (the
default): the (k+, k-) pairs form a small fixed grid of fractions of m
(``guesses.grid_candidates``) and the significance is Bonferroni-corrected over the grid. With
``design_mu`` (the claim's mu): ONE pair fixed by the claim before the scores are seen
(``claim_pair``: the pair of ``design.guess_pairs`` whose median count on ideal scores at that
mu rejects the largest epsilon), tested at the full level; the theorem holds for any pair
chosen without the scores, so no correction is needed.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.special import bdtr, bdtrc, expit
from scipy.stats import binom

from dpaudit._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_open_unit,
    check_seed,
)
from dpaudit.stats.bracket import largest_accepted
from dpaudit.stats.inclusion import (
    amplification,
    amplified_epsilon,
    check_inclusion,
    require_plausible,
    virtual_labels,
)
from dpaudit.stats.one_run.design import (
    EXACT_CANDIDATES,
    exact_median,
    guess_pairs,
    median_correct,
)
from dpaudit.stats.one_run.guesses import grid_candidates, ranked_guesses
from dpaudit.stats.result import EpsilonBound
from dpaudit.stats.ties import has_ties

DEFAULT_GRID = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
_WINDOW_SD = 40.0  # binomial mass further than this many sd below the mean is bounded, not summed
_WINDOW_MAX = 50_000


def p_value(
    m: int, r: int, v: int, epsilon: float, delta: float, inclusion: float = 0.5
) -> float:
    """Upper bound on P[>= v correct of r guesses] under (epsilon, delta)-DP (m canaries).

    ``inclusion``: the design's inclusion probability p; for p != 1/2, ``v`` counts guesses
    right about the virtual fair-coin labels (module doc) and the bound is the p = 1/2 one at
    eps' = log(1 + gamma (e^eps - 1)), delta' = gamma delta, gamma = 2 min(p, 1 - p).

    The max over i is taken on a window of i that covers the binomial mass down to 40 sd
    below the mean (at most 50,000 values of i); beyond it sum_i / i is bounded by
    (sum_W + P[Bin < v - W]) / (W + 1). That only increases the p-value, so the derived
    epsilon can only get smaller (never invalid). Inside the window the max is found by a
    bracketing search (``_window_max``) in O(log W) binomial evaluations, not W.
    """
    m, r, v = check_count(m, "m"), check_count(r, "r"), check_count(v, "v")
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")
    epsilon = check_nonnegative(epsilon, "epsilon")
    delta = check_delta(delta, zero_ok=True)
    inclusion = check_inclusion(inclusion)
    if inclusion != 0.5:
        gamma = amplification(inclusion)
        epsilon, delta = float(amplified_epsilon(epsilon, gamma)), gamma * delta
    q = float(expit(epsilon))
    tail = 1.0 if v == 0 else float(bdtrc(v - 1, r, q))  # P[Bin >= v]
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    sd = np.sqrt(r * q * (1.0 - q))
    lowest = max(int(np.floor(r * q - _WINDOW_SD * sd)), 0)
    w = int(min(v, max(v - lowest, 1), _WINDOW_MAX))
    below_v = float(bdtr(v - 1, r, q))  # P[Bin <= v - 1]
    alpha, sum_w = _window_max(r, v, q, w, below_v)
    if w < v:
        rest = float(bdtr(v - w - 1, r, q))  # mass not yet summed
        alpha = max(alpha, (sum_w + rest) / (w + 1))
    return min(tail + alpha * delta * 2.0 * m, 1.0)


_SEARCH_POINTS = 33  # grid size of one bracketing round in ``_window_max``


def _window_sums(r: int, v: int, q: float, i: np.ndarray, below_v: float) -> np.ndarray:
    """S(i) = P[v - i <= Bin(r, q) <= v - 1] for an integer array i >= 1."""
    lower = np.where(v - i - 1 >= 0, bdtr(np.maximum(v - i - 1, 0), r, q), 0.0)
    return below_v - lower


def _window_max(r: int, v: int, q: float, w: int, below_v: float) -> tuple[float, float]:
    """(max_{1<=i<=w} S(i)/i, S(w)) with S(i) = P[v - i <= Bin(r, q) <= v - 1].

    S(i)/i is the running mean of the pmf read downwards from v - 1; the binomial pmf is
    unimodal (log-concave), so that running mean rises while the next pmf value exceeds it and
    falls after: it is unimodal in i. Each round evaluates it on a grid of 33 points and keeps
    the two grid cells around the grid's argmax, which contain the maximiser; the last <= 64
    values are evaluated exhaustively. The maximum is the same number as a full scan's.
    """
    lo, hi = 1, w
    while hi - lo + 1 > 2 * _SEARCH_POINTS:
        grid = np.unique(np.linspace(lo, hi, _SEARCH_POINTS).round().astype(np.int64))
        means = _window_sums(r, v, q, grid, below_v) / grid
        j = int(np.argmax(means))
        lo, hi = int(grid[max(j - 1, 0)]), int(grid[min(j + 1, grid.size - 1)])
    i = np.arange(lo, hi + 1, dtype=np.int64)
    best = float(np.max(_window_sums(r, v, q, i, below_v) / i))
    sum_w = float(_window_sums(r, v, q, np.array([w]), below_v)[0])
    return best, sum_w


def _largest_rejected(
    m: int, r: int, v: int, delta: float, significance: float, tol: float, inclusion: float
) -> float:
    """lo with p(lo) < significance <= p(lo + tol * max(1, lo)) (0 when nothing is rejected)."""
    if r == 0 or p_value(m, r, v, 0.0, delta, inclusion) >= significance:
        return 0.0
    hi = 1.0
    while p_value(m, r, v, hi, 0.0, inclusion) < significance:  # p grows with delta
        hi *= 2.0
        if hi > 1e4:
            break
    return _bisect(m, r, v, delta, significance, tol, inclusion, 0.0, hi)


def _bisect(m, r, v, delta, significance, tol, inclusion, lo: float, hi: float) -> float:
    """From p(lo) < significance (lo = 0 checked by the caller) and p(hi) >= significance to
    hi - lo <= tol * max(1, lo); returns the rejected end lo (``bracket.largest_accepted``)."""
    return largest_accepted(
        lambda eps: p_value(m, r, v, eps, delta, inclusion),
        lambda value: value < significance,
        significance,
        lo,
        hi,
        tol,
    )


def _p_value_lower(
    m: int, r: np.ndarray, v: np.ndarray, epsilon: float, delta: float, inclusion: float
) -> np.ndarray:
    """A lower bound on ``p_value`` for arrays of (r, v): the i = 1 term of its max, i.e.
    P[Bin >= v] + 2 m delta P[Bin = v - 1] (the same amplified eps and delta)."""
    if inclusion != 0.5:
        gamma = amplification(inclusion)
        epsilon, delta = float(amplified_epsilon(epsilon, gamma)), gamma * delta
    q = float(expit(epsilon))
    tail = np.where(v == 0, 1.0, bdtrc(np.maximum(v - 1, 0), r, q))
    pmf = np.where(v == 0, 0.0, binom.pmf(v - 1, r, q))
    # shaved by a relative 1e-9 so that rounding can never lift it above the exact p-value
    return np.minimum(tail + 2.0 * m * delta * pmf, 1.0) * (1.0 - 1e-9)


def _tail_upper_ends(
    m: int, r: np.ndarray, v: np.ndarray, significance: float, inclusion: float
) -> np.ndarray:
    """Per pair, an eps at which the delta = 0 p-value P[Bin(r, q) >= v] is >= significance
    (0 where eps = 0 is not rejected), to relative width 1e-3: every pair at once."""
    gamma = amplification(inclusion)

    def p0(eps: np.ndarray) -> np.ndarray:
        e = amplified_epsilon(eps, gamma) if inclusion != 0.5 else eps
        return np.where(v == 0, 1.0, bdtrc(np.maximum(v - 1, 0), r, expit(e)))

    live = (r > 0) & (p0(np.zeros(r.size)) < significance)
    hi = np.where(live, 1.0, 0.0)
    grow = live.copy()
    while grow.any():
        grow &= p0(hi) < significance
        grow &= hi <= 1e4
        hi = np.where(grow, 2.0 * hi, hi)
    lo = np.zeros(r.size)
    while True:
        open_ = live & (hi - lo > 1e-3 * np.maximum(1.0, lo))
        if not open_.any():
            return hi
        mid = 0.5 * (lo + hi)
        rejected = p0(mid) < significance
        lo = np.where(open_ & rejected, mid, lo)
        hi = np.where(open_ & ~rejected, mid, hi)


def epsilon_from_guesses(
    m: int,
    r: int,
    v: int,
    *,
    delta: float,
    significance: float,
    tol: float = 1e-6,
    inclusion: float = 0.5,
) -> float:
    """Largest eps rejected at ``significance``: p_value(m, r, v, eps, delta, inclusion) <
    significance (``inclusion``: see ``p_value``)."""
    significance = check_open_unit(significance, "significance")
    p_value(m, r, v, 0.0, delta, inclusion)  # checks m, r, v, delta and inclusion by name
    return _largest_rejected(m, r, v, delta, significance, tol, inclusion)


@functools.lru_cache(maxsize=64)
def claim_pair(m: int, level: float, delta: float, design_mu: float,
               inclusion: float = 0.5) -> tuple[int, int]:
    """The (k+, k-) of ``design.guess_pairs(m)`` whose median correct count on ideal scores at
    ``design_mu`` (``design.median_correct``) gives the largest epsilon rejected at ``level``
    by the theorem's p-value (``p_value``, its delta term included). Depends on m, the level,
    delta, the claim and the design only (cached)."""
    kp, km = guess_pairs(m)
    if not kp.size:
        raise ValueError(f"one_run: m={m} canaries are too few for a guess pair")
    v = median_correct(kp, design_mu, m, km).astype(np.int64)
    r = (kp + km).astype(np.int64)
    ubs = _tail_upper_ends(m, r, v, level, inclusion)  # delta = 0 upper ends, best first
    scored = []  # (eps at the model's median, index), for every pair that could lead
    for i in np.argsort(-ubs):
        if scored and ubs[i] <= scored[0][0]:
            break  # its delta = 0 upper end is below the best: it cannot lead
        eps = _largest_rejected(m, int(r[i]), int(v[i]), delta, level, 1e-3, inclusion)
        scored = sorted([*scored, (eps, int(i))], reverse=True)[:EXACT_CANDIDATES]
    # the leading candidates ranked again by their exact median (``design.exact_median``)
    best, pair = -1.0, (int(kp[0]), int(km[0]))
    for _, i in scored:
        ve = exact_median(m, float(design_mu), int(kp[i]), int(km[i]))
        eps = _largest_rejected(m, int(r[i]), ve, delta, level, 1e-4, inclusion)
        if eps > best:
            best, pair = eps, (int(kp[i]), int(km[i]))
    return pair


def one_run_bound(
    scores_in: np.ndarray,
    scores_out: np.ndarray,
    *,
    delta: float,
    confidence: float,
    grid=DEFAULT_GRID,
    inclusion: float = 0.5,
    seed: int = 0,
    design_mu: float | None = None,
) -> EpsilonBound:
    """Steinke-Nasr-Jagielski lower bound, best over a Bonferroni-corrected (k+, k-) grid.

    ``scores_in`` are the canaries that were included, ``scores_out`` those excluded.
    ``inclusion``: the probability p with which each canary was included, independently
    (default 1/2); a split implausible under it raises ValueError naming ``inclusion``, and
    p != 1/2 uses the virtual fair-coin reduction (module doc). ``grid``: fractions of m for
    k+ and k- (pairs with k+ + k- <= m, not both 0). ``seed``: the random order of tied
    scores and, for p != 1/2, the virtual labels (both drawn independently of the scores'
    membership; the bound holds for every seed).

    ``design_mu``: the claim's mu; ONE (k+, k-) pair fixed by it (``claim_pair``) is tested at
    the full level instead of the grid (``grid`` is then not used).

    The bound needs m * delta << 1. When its result is 0 only because of the 2 m delta term
    (the same guesses would reject epsilon = 0 at delta = 0), the result is marked
    ``applicable=False`` with the reason in ``note`` instead of reporting a bare 0; an
    applicable result with m * delta >= 0.1 carries a looseness caveat in ``note``.
    """
    fracs = np.asarray(grid, dtype=np.float64)
    if fracs.ndim != 1 or fracs.size == 0 or np.any((fracs < 0) | (fracs > 1)):
        raise ValueError(
            f"grid must be a non-empty 1-d sequence of fractions in [0, 1], got {grid!r}"
        )
    p = check_inclusion(inclusion)
    seed = check_seed(seed)
    s_in, s_out = np.asarray(scores_in), np.asarray(scores_out)
    split_pv = require_plausible(s_in.size, s_out.size, p, "one_run")
    m = s_in.size + s_out.size
    if design_mu is not None:
        mu = float(design_mu)
        if not (np.isfinite(mu) and mu > 0):
            raise ValueError(f"design_mu must be a finite mu > 0 (the claim's mu), got "
                             f"{design_mu!r}")
        delta = check_delta(delta, zero_ok=True)
        pairs = [claim_pair(m, 1.0 - float(confidence), delta, mu, p)]
    else:
        pairs = grid_candidates(m, fracs)
    if not pairs:
        raise ValueError(f"grid {grid!r} gives no (k+, k-) pair with at least one guess for m={m}")
    significance = (1.0 - confidence) / len(pairs)
    kp, km = np.array(pairs, dtype=np.int64).T
    pooled = np.concatenate([s_in, s_out])
    labels = virtual_labels(s_in.size, s_out.size, p, seed)
    v_all, tp_all, tm_all = ranked_guesses(pooled, labels, kp, km, seed)
    r_all = kp + km
    r_all, v_all = r_all.astype(np.int64), np.asarray(v_all, dtype=np.int64)
    # coarse delta = 0 brackets of every pair at once: their upper ends bound eps(delta) from
    # above (p grows in delta), so pairs are visited best first and the rest dismissed
    ubs = _tail_upper_ends(m, r_all, v_all, significance, p)
    rows = sorted(
        (
            (float(ubs[i]), int(kp[i]), int(km[i]), int(r_all[i]), int(v_all[i]),
             float(tp_all[i]), float(tm_all[i]))
            for i in range(len(pairs))
        ),
        key=lambda row: -row[0],
    )
    best = (0.0, None)
    dismissed = np.zeros(len(rows), dtype=bool)
    for j, (ub, a, b, r, v, tp, tm) in enumerate(rows):
        if best[1] is not None and j == 1:
            # one vectorised pass with a lower bound on every pair's p-value at the first
            # best eps dismisses most pairs at once (the best only grows)
            r_rows = np.array([row[3] for row in rows], dtype=np.int64)
            v_rows = np.array([row[4] for row in rows], dtype=np.int64)
            dismissed = _p_value_lower(m, r_rows, v_rows, best[0], delta, p) >= significance
        if dismissed[j]:
            continue
        if best[1] is not None:
            # a pair that cannot reject the best eps so far cannot beat it (p grows in eps)
            if ub <= best[0] or p_value(m, r, v, best[0], delta, p) >= significance:
                continue
            eps = _bisect(m, r, v, delta, significance, 1e-6, p, best[0], ub)
        else:
            eps = epsilon_from_guesses(
                m, r, v, delta=delta, significance=significance, inclusion=p
            )
        if eps > best[0] or best[1] is None:
            best = (eps, (a, b, r, v, tp, tm))
    gamma = amplification(p)
    details: dict = {
        "m": m,
        "design": ("one pair fixed by the claim (design_mu)" if design_mu is not None
                   else "the paper's grid of pairs (Bonferroni)"),
        "n_pairs": len(pairs),
        "significance_per_pair": significance,
        "m_delta": m * delta,
        "inclusion": p,
        "split_p_value": split_pv,
        "seed": seed,
        "ties_broken_at_random": has_ties(np.sort(pooled)),
    }
    if p != 0.5:
        details.update(
            gamma=gamma,
            virtual_members=int(labels.sum()),
            reduction=(
                f"virtual fair-coin labels: eps rejected when eps' = log(1 + {gamma:.4g} "
                f"(e^eps - 1)) is rejected at delta' = {gamma:.4g} delta"
            ),
        )
    threshold = None
    if best[1] is not None:
        a, b, r, v, tp, tm = best[1]
        details.update(k_plus=a, k_minus=b, guesses=r, correct=v, t_plus=tp, t_minus=tm)
        threshold = tp
    applicable, note = True, None
    if best[0] == 0.0 and delta > 0.0:
        blocked = [row for row in rows if p_value(m, row[3], row[4], 0.0, 0.0, p) < significance]
        if blocked:
            # the guesses reject eps = 0 without the delta term: the 0 is the delta term's
            applicable = False
            note = (
                f"not applicable: m*delta = {m * delta:.3g} is not << 1 (the bound's 2 m delta "
                f"term is {2 * m * gamma * delta:.3g}); without it these guesses would reject "
                "epsilon = 0, so the 0 comes from m*delta, not from the scores (Steinke et al. "
                "need m*delta << 1: use fewer canaries or a smaller delta)"
            )
    elif m * delta >= 0.1:
        note = (
            f"m*delta = {m * delta:.3g} is not << 1: the bound holds but its delta term "
            "(2 m delta) makes it loose"
        )
    return EpsilonBound(
        epsilon=float(best[0]),
        method="one_run",
        confidence=confidence,
        delta=delta,
        n_in=int(s_in.size),
        n_out=int(s_out.size),
        threshold=threshold,
        details=details,
        applicable=applicable,
        note=note,
    )
