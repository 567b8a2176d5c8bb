"""The count test of independent canaries: two pre-registered ranks, one exact p-value.

Setting: n_in member and n_out non-member scores, each canary an independent experiment
(member scores i.i.d. from P, non-member scores i.i.d. from Q, for ANY P and Q). A
``RankDesign`` fixed before the scores are seen (from the claim and the sample sizes:
``design``) names two ranks, and the test reads two counts:

* "in" guesses: t_hi is the (k_hi + 1)-th largest non-member score, A = {score > t_hi}
  (exactly k_hi non-members in A); N_hi = the members in A;
* "out" guesses: t_lo is the (k_lo + 1)-th smallest member score, B = {score < t_lo}
  (exactly k_lo members in B); M_lo = the non-members in B;

and one statistic, S = N_hi + M_lo (more correct guesses: more leakage). Either side may be
switched off (its count is 0). When both are on, the two-sided p-value is spent at
1 - ``FALLBACK`` of the level, and when t_lo >= t_hi (A and B would overlap: the scores
separate members from non-members almost perfectly) the "in" side alone is tested at the
remaining ``FALLBACK`` (weighted Bonferroni over the two cases: valid, and a near-perfect
separation still certifies a large epsilon).
Thresholds at ranks rather than at fixed scores keep the test's power when the true scores
are shifted against the claimed ones (less noise than claimed shifts every mixture log-LR
down: a fixed threshold would then see no canary at all).

**The null.** A claim about the canary's pair is a bound R on the ROC: a test of "member" at
false-positive rate x has true-positive rate <= R(x), and in the pair's other order a test of
"non-member" at rate y (members called non-members) has rate <= R_rev(y). (epsilon,
delta)-DP is R(x) = min(1, e^eps x + delta, 1 - e^-eps (1 - delta - x)) both ways
(``dp_roc``); a claimed trade-off curve f is R = 1 - f.

**The law under the null.** With x = Q(A) and y = P(B): x is the upper-tail mass above the
(k_hi + 1)-th largest of n_out i.i.d. scores, exactly Beta(k_hi + 1, n_out - k_hi), and y is
exactly Beta(k_lo + 1, n_in - k_lo); x and y are independent (non-members vs members). Given
both thresholds (t_lo < t_hi), the n_in - k_lo - 1 members above t_lo are i.i.d. from P
conditioned on (score > t_lo), so N_hi ~ Binomial(n_in - k_lo - 1, P(A) / (1 - y)), and
likewise M_lo ~ Binomial(n_out - k_hi - 1, Q(B) / (1 - x)), independent given the thresholds.
Under the claim P(A) <= R(x) and Q(B) <= R_rev(y). Outside the events {x <= x_c}, {y <= y_c}
(x_c, y_c the Betas' (1 - eta)-quantiles, eta = 1e-4 x the level; their probability 2 eta is
added), N_hi is stochastically below N' ~ Binomial(n_in - k_lo - 1, min(1, R(x) / (1 - y_c)))
and M_lo below M' ~ Binomial(n_out - k_hi - 1, min(1, R_rev(y) / (1 - x_c))), whose rates
depend on x alone and y alone: N' and M' are independent mixtures of binomials. Each
mixture's survival function is a monotone function of the Beta quantile u, so an upper
Riemann sum over a fine partition of u (``_U_GRID``: 100 equal cells on [0, 1/2], then cells
shrinking by 4% towards 1) bounds it from above and is itself the mixture of a distribution
that dominates it. Hence

    P[S >= s] <= 2 eta + sum_m P[M^u = m] P[N^u >= s - m],

computed exactly (the binomials' tails beyond 12 sd are left out, and the mixtures' top
cells beyond eta' = 1e-4 x the level are counted as exceedances). The p-value is that bound:
valid whatever P and Q are, for a design that does not depend on the scores. Tied scores are
ordered by (score, U) with seeded uniforms U (``stats.ties``, as every certified method
does), which makes the tests randomised tests, bound by the claim like any other, and the
Beta laws exact again.

**The certified epsilon.** The statistic does not depend on the claim and the nulls are
nested (a larger epsilon allows more), so the p-value increases with epsilon: every epsilon
at or below one whose p-value is <= beta is rejected too. ``certify_epsilon`` reports the
largest such epsilon (bisection to 1e-3): "the canary's pair is not (epsilon, delta)-DP for
any epsilon <= this", with probability >= 1 - beta, whatever the mechanism. The same p-value
against a claimed curve is the claim test (``curve_p_value``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import betaincinv, gammaln, ndtri

from dpaudit._validate import check_count, check_delta, check_open_unit, check_scores
from dpaudit.stats.ties import break_ties

Roc = Callable[[np.ndarray], np.ndarray]

_ETA = 1e-4  # the caps' and the mixtures' dropped tails, relative to the level
_SD = 12.0  # binomial supports: mean +- 12 sd (+ 12); beyond, mass < 1e-30
_TOL = 1e-3  # the certified epsilon's bisection width
_SLACK = 1e-20  # the binomial tails beyond 12 sd (each < 1e-30) and float rounding
# the summation's rounding, relative: a p-value is a sum of up to ~10^5 rounded terms (relative
# error below 10^5 x 2^-53 ~ 1e-11); the bound is raised by far more than that
_RELATIVE_SLACK = 1e-9
FALLBACK = 0.01  # share of a two-sided design's level kept for crossed thresholds


def _u_grid() -> np.ndarray:
    """The partition of the Beta quantile u: 100 equal cells on [0, 1/2], then 1 - u shrinking
    by a factor 1.04 per cell down to 1e-17, then 1."""
    top = 1.0 - np.geomspace(0.5, 1e-17, int(np.ceil(np.log(0.5e17) / np.log(1.04))) + 1)
    return np.concatenate([np.linspace(0.0, 0.5, 101)[:-1], top, [1.0]])


_U_GRID = _u_grid()


def dp_roc(epsilon: float, delta: float) -> Roc:
    """The ROC bound of (epsilon, delta)-DP: x -> min(1, e^eps x + delta,
    1 - e^-eps (1 - delta - x)), at least x (the pair's two orders have the same bound)."""
    e = float(epsilon)
    if not np.isfinite(e) or e < 0:
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    d = check_delta(delta, zero_ok=True)
    c, ci = np.exp(e), np.exp(-e)

    def roc(x):
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            r = np.minimum(np.minimum(np.where(x > 0, c * x, 0.0) + d,
                                      1.0 - ci * (1.0 - d - x)), 1.0)
        return np.maximum(r, x)

    return roc


@dataclass(frozen=True)
class RankDesign:
    """A count test fixed before the scores are seen (module doc).

    ``k_hi``: "in" guesses above the (k_hi + 1)-th largest non-member (None: none);
    ``k_lo``: "out" guesses below the (k_lo + 1)-th smallest member (None: none);
    ``n_in`` / ``n_out``: the sample sizes it is for (others are refused); ``level``: the
    failure probability it was designed for; ``note``: how it was chosen; ``tie_seed``: the
    seed of the uniforms that order tied scores.
    """

    k_hi: int | None
    k_lo: int | None
    n_in: int
    n_out: int
    level: float
    note: str = ""
    tie_seed: int = 0

    def __post_init__(self):
        n_in = check_count(self.n_in, "n_in", 1)
        n_out = check_count(self.n_out, "n_out", 1)
        if self.k_hi is None and self.k_lo is None:
            raise ValueError("a design needs k_hi or k_lo (some guesses), got neither")
        if self.k_hi is not None and not check_count(self.k_hi, "k_hi") < n_out:
            raise ValueError(f"k_hi must be < n_out={n_out}, got {self.k_hi}")
        if self.k_lo is not None and not check_count(self.k_lo, "k_lo") < n_in:
            raise ValueError(f"k_lo must be < n_in={n_in}, got {self.k_lo}")
        check_open_unit(self.level, "level")

    @property
    def sides(self) -> str:
        """``"in"``, ``"out"`` or ``"both"``."""
        if self.k_lo is None:
            return "in"
        return "out" if self.k_hi is None else "both"

    @property
    def n_hi(self) -> int:
        """The binomial size of N_hi: members not among the k_lo + 1 lowest."""
        return self.n_in - (0 if self.k_lo is None else self.k_lo + 1)

    @property
    def m_lo(self) -> int:
        """The binomial size of M_lo: non-members not among the k_hi + 1 highest."""
        return self.n_out - (0 if self.k_hi is None else self.k_hi + 1)

    def to_dict(self) -> dict:
        """Plain dictionary."""
        return {"k_hi": self.k_hi, "k_lo": self.k_lo, "n_in": self.n_in, "n_out": self.n_out,
                "level": self.level, "note": self.note, "tie_seed": self.tie_seed}


@dataclass(frozen=True)
class Counts:
    """A design's counts on one set of scores: ``n_hi`` members above t_hi, ``m_lo``
    non-members below t_lo, the statistic S = n_hi + m_lo, the thresholds on the scores'
    scale, and ``crossed`` (both sides on and t_lo >= t_hi: the "in" side alone is tested,
    module doc)."""

    n_hi: int
    m_lo: int
    statistic: int
    t_hi: float
    t_lo: float
    crossed: bool = False

    def to_dict(self) -> dict:
        """Plain dictionary (infinite thresholds as strings)."""
        def num(v):
            return float(v) if np.isfinite(v) else ("inf" if v > 0 else "-inf")
        return {"n_hi": self.n_hi, "m_lo": self.m_lo, "statistic": self.statistic,
                "t_hi": num(self.t_hi), "t_lo": num(self.t_lo), "crossed": self.crossed}


def count(scores_in, scores_out, design: RankDesign) -> Counts:
    """The design's counts on these scores (module doc); the sizes must be the design's."""
    return Ranked(scores_in, scores_out, design.tie_seed).count(design)


class Ranked:
    """The scores sorted once, ties broken by ``tie_seed`` (``stats.ties``): the counts of
    any designs with that seed (``count``), each a search."""

    def __init__(self, scores_in, scores_out, tie_seed: int = 0):
        s_in = np.sort(check_scores(scores_in, "scores_in"))
        s_out = np.sort(check_scores(scores_out, "scores_out"))
        tb = break_ties(s_in, s_out, tie_seed)
        self.tie_seed = tie_seed
        self.a_in, self.a_out = (s_in, s_out) if tb is None else (tb.ranks_in, tb.ranks_out)
        self.value = (lambda t: t) if tb is None else (lambda t: float(tb.value(t)))

    def count(self, design: RankDesign) -> Counts:
        """``count`` of ``design`` (its tie seed must be this one's)."""
        a_in, a_out, value = self.a_in, self.a_out, self.value
        if (a_in.size, a_out.size) != (design.n_in, design.n_out):
            raise ValueError(
                f"the design was made for n_in={design.n_in}, n_out={design.n_out} scores, "
                f"got {a_in.size} and {a_out.size}: make the design for these sizes (before "
                "looking at the scores)")
        if design.tie_seed != self.tie_seed:
            raise ValueError(f"the design's tie seed {design.tie_seed} is not {self.tie_seed}")
        n_hi = m_lo = 0
        t_hi, t_lo = np.inf, -np.inf
        if design.k_hi is not None:
            t = a_out[a_out.size - 1 - design.k_hi]
            n_hi = int(a_in.size - np.searchsorted(a_in, t, side="right"))
            t_hi = value(t)
        if design.k_lo is not None:
            t = a_in[design.k_lo]
            m_lo = int(np.searchsorted(a_out, t, side="left"))
            t_lo = value(t)
        overlap = (design.k_hi is not None and design.k_lo is not None
                   and not a_in[design.k_lo] < a_out[a_out.size - 1 - design.k_hi])
        return Counts(n_hi, m_lo, n_hi + m_lo, float(t_hi), float(t_lo), bool(overlap))


def log_factorials(n: int) -> np.ndarray:
    """log k! for k = 0..n."""
    return _log_factorials(int(n)).copy()


@functools.lru_cache(maxsize=16)
def _log_factorials(n: int) -> np.ndarray:
    out = gammaln(np.arange(n + 1, dtype=np.float64) + 1.0)
    out.setflags(write=False)
    return out


_NODE_FLOOR = 1e-12  # cells whose weight and every later one's sum to less: x = 1 there
_COMPUTED = int(np.count_nonzero(1.0 - _U_GRID[:-1] >= _NODE_FLOOR))  # cells with quantiles


@functools.lru_cache(maxsize=256)
def _beta_nodes(k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(x at each cell's upper end, cell weight) of Beta(k + 1, n - k) on ``_U_GRID``
    (memoised per (k, n), read-only). The cells beyond the first ``_COMPUTED`` (their total
    weight below ``_NODE_FLOOR``, 1e-12) get x = 1, the largest upper end there is: an
    upper Riemann sum still (the p-values leave them out anyway at levels >= 1e-8, and the
    laws' computations below 1e-12)."""
    u = _U_GRID
    x = np.ones(u.size - 1)
    x[:_COMPUTED] = betaincinv(k + 1.0, float(n - k), u[1 : _COMPUTED + 1])
    x[-1] = 1.0
    w = np.diff(u)
    x.setflags(write=False)
    w.setflags(write=False)
    return x, w


def beta_quantile(k: int, n: int, prob: float) -> float:
    """The prob-quantile of Beta(k + 1, n - k): the law of the tail mass beyond the (k+1)-th
    most extreme of n i.i.d. scores."""
    return float(betaincinv(k + 1.0, float(n - k), prob))


class _Mixture:
    """A mixture over Beta cells of Binomial(size, rate_c), weights w_c (``_beta_nodes``),
    cells of total weight <= ``drop`` at the top left out (their mass counted as exceedance
    by the caller)."""

    def __init__(self, size: int, rates: np.ndarray, weights: np.ndarray, drop: float,
                 table: np.ndarray, width: float = _SD):
        keep = _kept(weights, drop)
        self.dropped = _dropped(weights, drop)
        self.size = size
        self.rates = np.clip(rates[:keep], 0.0, 1.0)
        self.weights = weights[:keep]
        self.table = table
        self.width = width

    def _support(self) -> tuple[np.ndarray, np.ndarray]:
        n, p, c = self.size, self.rates, self.width
        sd = np.sqrt(n * p * (1.0 - p))
        lo = np.clip(np.floor(n * p - c * sd - c), 0, n).astype(np.int64)
        hi = np.clip(np.ceil(n * p + c * sd + c), 0, n).astype(np.int64)
        return lo, hi

    def pmf(self) -> np.ndarray:
        """The mixture's pmf on 0..max support (rows' tails beyond 12 sd left out).

        Each row's log-pmf is log C(n, k) + k logit(p) + n log(1 - p): one table of
        log C(n, k) shared by the rows (the terms of xlogy(k, p) + xlog1py(n - k, -p)
        regrouped); rates 0 and 1 are point masses at 0 and n."""
        lo, hi = self._support()
        n = self.size
        top = int(hi.max()) if hi.size else 0
        out = np.zeros(top + 1)
        p, w = self.rates, self.weights
        inner = (p > 0.0) & (p < 1.0)
        if not np.all(inner):
            out[0] += float(w[p <= 0.0].sum())
            if np.any(p >= 1.0):
                out[n] += float(w[p >= 1.0].sum())
            p, w, lo, hi = p[inner], w[inner], lo[inner], hi[inner]
        if p.size == 0:
            return out
        a0 = int(lo.min())
        kk = np.arange(a0, top + 1)
        log_choose = self.table[n] - self.table[kk] - self.table[n - kk]
        logit = np.log(p) - np.log1p(-p)
        base = n * np.log1p(-p)
        # rows in bands of similar support, each a dense block
        order = np.argsort(lo, kind="stable")
        for band in np.array_split(order, max(1, order.size // 64)):
            a, b = int(lo[band].min()), int(hi[band].max())
            k = kk[a - a0 : b - a0 + 1]
            logp = (log_choose[a - a0 : b - a0 + 1][None, :] + logit[band][:, None] * k
                    + base[band][:, None])
            out[a : b + 1] += w[band] @ np.exp(logp)
        return out

    def sf(self) -> np.ndarray:
        """P[X >= i] of the mixture for i = 0..max support + 1 (from ``pmf``)."""
        return _suffix(self.pmf())


def _kept(weights: np.ndarray, drop: float) -> int:
    """How many leading cells a mixture keeps: the top cells of total weight <= ``drop``
    are left out."""
    top = np.cumsum(weights[::-1])[::-1]  # weight of this cell and every later one
    return int(np.count_nonzero(top > drop))


def _dropped(weights: np.ndarray, drop: float) -> float:
    """The weight of the cells ``_kept`` leaves out."""
    top = np.cumsum(weights[::-1])[::-1]
    keep = int(np.count_nonzero(top > drop))
    return float(top[keep]) if keep < top.size else 0.0


def _first_nonzero(pmf: np.ndarray) -> int:
    """The first index of a non-zero entry (0 for an all-zero array)."""
    nz = np.flatnonzero(pmf)
    return int(nz[0]) if nz.size else 0


def _suffix(pmf: np.ndarray) -> np.ndarray:
    """P[X >= i] for i = 0..len(pmf) (the last 0), capped at 1."""
    return np.minimum(np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]]), 1.0)


def _sf_at(sf: np.ndarray, i: np.ndarray) -> np.ndarray:
    """A survival function on 0..len - 1 read at integers ``i`` (1 below 0, 0 beyond)."""
    i = np.asarray(i, dtype=np.int64)
    out = sf[np.clip(i, 0, sf.size - 1)]
    return np.where(i <= 0, 1.0, np.where(i >= sf.size, 0.0, out))


class NullTail:
    """The p-value bound of the module doc for EVERY statistic at once: P[S' >= s] of the
    dominating law (``sf``, s = 0..len - 1, 0 beyond) plus the constant ``extra`` (the caps'
    2 eta, the mixtures' dropped top cells, the binomials' tails), for one design and one
    null; ``p(s)`` is ``_p_value``'s bound at s (without the fallback's share). One
    computation of the two mixtures serves every s (critical values, powers, p-values)."""

    def __init__(self, design: RankDesign, roc: Roc, roc_reverse: Roc | None = None):
        rev = roc if roc_reverse is None else roc_reverse
        level = design.level
        eta = _ETA * level
        table = _log_factorials(max(design.n_in, design.n_out))
        extra = 0.0
        if design.k_hi is not None:
            xs, wx = _beta_nodes(design.k_hi, design.n_out)
        if design.k_lo is not None:
            ys, wy = _beta_nodes(design.k_lo, design.n_in)
        if design.sides == "both":
            x_cap = beta_quantile(design.k_hi, design.n_out, 1.0 - eta)
            y_cap = beta_quantile(design.k_lo, design.n_in, 1.0 - eta)
            extra += 2.0 * eta
            keep_x, keep_y = _kept(wx, eta), _kept(wy, eta)
            r_hi = np.minimum(1.0, _flat(roc, xs[:keep_x]) / (1.0 - y_cap))
            r_lo = np.minimum(1.0, _flat(rev, ys[:keep_y]) / (1.0 - x_cap))
            n = _Mixture(design.n_hi, _pad(r_hi, wx), wx, eta, table)
            m = _Mixture(design.m_lo, _pad(r_lo, wy), wy, eta, table)
            pm, pn = m.pmf(), n.pmf()
            # P[N + M >= s] = sum_m P[M = m] P[N >= s - m], with P[N >= j] = 1 for j <= 0:
            # the suffix sums of N + M's pmf (one convolution over the two supports), plus
            # N's missing mass (1 - its total) wherever m >= s
            am, an = _first_nonzero(pm), _first_nonzero(pn)
            ps = np.zeros(pm.size + pn.size - 1)
            part = np.convolve(pm[am:], pn[an:])
            ps[am + an : am + an + part.size] = part
            sf = _suffix(ps)
            sf[: pm.size + 1] += max(0.0, 1.0 - float(pn.sum())) * _suffix(pm)
            extra += n.dropped + m.dropped
        elif design.sides == "in":
            keep_x = _kept(wx, eta)
            n = _Mixture(design.n_hi, _pad(np.minimum(1.0, _flat(roc, xs[:keep_x])), wx), wx,
                         eta, table)
            sf = n.sf()
            extra += n.dropped
        else:
            keep_y = _kept(wy, eta)
            m = _Mixture(design.m_lo, _pad(np.minimum(1.0, _flat(rev, ys[:keep_y])), wy), wy,
                         eta, table)
            sf = m.sf()
            extra += m.dropped
        self.sf = np.minimum(sf, 1.0)
        self.extra = float(extra + _SLACK)

    def p(self, s) -> np.ndarray:
        """The bound at statistic(s) ``s`` (1 at s <= 0), at most 1, raised by
        ``_RELATIVE_SLACK`` over the summation's rounding (never below the exact sum)."""
        return np.minimum(1.0, (_sf_at(self.sf, s) + self.extra) * (1.0 + _RELATIVE_SLACK))


def _pad(rates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Rates of the kept cells, padded with 1 to the weights' length (the padded cells are the
    dropped ones: ``_Mixture`` leaves them out again)."""
    out = np.ones(weights.size)
    out[: rates.size] = rates
    return out


def null_p_value(design: RankDesign, s, roc: Roc, roc_reverse: Roc | None = None) -> float:
    """The p-value of observed ``Counts`` (or of a statistic S = ``s`` whose thresholds did
    not cross) under the null "ROC <= roc" (and ``roc_reverse`` in the pair's other order;
    default ``roc``), module doc. A two-sided design's p-value is its two-sided bound over
    1 - ``FALLBACK``, or, for crossed thresholds, the "in" side's over ``FALLBACK``."""
    if isinstance(s, Counts):
        if s.crossed:
            one = dataclasses.replace(design, k_lo=None)
            return float(min(1.0, _p_value(one, s.n_hi, roc, roc_reverse) / FALLBACK))
        s = s.statistic
    p = _p_value(design, int(s), roc, roc_reverse)
    if design.sides == "both":
        p = p / (1.0 - FALLBACK)
    return float(min(1.0, p))


def _p_value(design: RankDesign, s: int, roc: Roc, roc_reverse: Roc | None) -> float:
    """The bound of the module doc for statistic ``s``, without the fallback's share."""
    return float(NullTail(design, roc, roc_reverse).p(np.array([s]))[0])


def _flat(roc: Roc, v: np.ndarray) -> np.ndarray:
    """``roc`` on a 1-d array (claimed curves take 1-d arrays), as float64, at least ``v``."""
    out = np.asarray(roc(np.asarray(v, dtype=np.float64).reshape(-1)), dtype=np.float64)
    return np.maximum(out.reshape(np.shape(v)), 0.0)


@dataclass(frozen=True)
class CertifiedEpsilon:
    """``certify_epsilon``'s answer: the canary's pair is not (e, delta)-DP for any
    e <= ``epsilon`` (0.0: nothing shown), at ``confidence``, whatever the mechanism.
    ``p_value`` is the p-value at ``epsilon`` (<= 1 - confidence; at 0 when nothing is
    shown), ``counts`` the design's counts, ``design`` the test."""

    epsilon: float
    delta: float
    confidence: float
    p_value: float
    counts: Counts
    design: RankDesign

    def to_dict(self) -> dict:
        """Plain dictionary."""
        return {"epsilon": self.epsilon, "delta": self.delta, "confidence": self.confidence,
                "p_value": self.p_value, "counts": self.counts.to_dict(),
                "design": self.design.to_dict()}

    def to_epsilon_bound(self):
        """The same statement as the package's common result (``stats.result.EpsilonBound``,
        certified: no assumption), method ``"data_rate_count"``, the counts and the design
        in ``details``."""
        from dpaudit.stats.result import EpsilonBound

        return EpsilonBound(
            epsilon=self.epsilon, method="data_rate_count", confidence=self.confidence,
            delta=self.delta, n_in=self.design.n_in, n_out=self.design.n_out,
            threshold=self.counts.t_hi if np.isfinite(self.counts.t_hi) else None,
            details={"p_value": self.p_value, "counts": self.counts.to_dict(),
                     "design": self.design.to_dict()})


def certify_epsilon_at(design: RankDesign, s, *, delta: float,
                       confidence: float | None = None, tol: float = _TOL,
                       e_max: float = 64.0, guess: float | None = None) -> tuple[float, float]:
    """(largest epsilon found whose p-value is <= 1 - confidence, that p-value) for observed
    ``Counts`` or a statistic ``s`` (module doc); (0.0, p at 0) when epsilon 0 is not
    rejected. ``confidence`` defaults to 1 - the design's level.

    The answer is the bisection's: the p-value increases with epsilon, the doubling 1, 2, 4,
    ... (up to ``e_max``) brackets the boundary in [lo, 2 lo] (or [0, 1]), and bisecting
    that bracket to width ``tol`` ends at the largest point of the bracket's dyadic grid
    (spacing width / 2^i <= ``tol``) whose p-value is <= 1 - confidence. The same grid
    point is found here with fewer p-values (``_boundary``: a secant on the p-values'
    normal scores, from ``guess`` when given, else from 1), whatever the guess; p-values far
    above the boundary, the costliest (their binomials spread over every count), are
    computed only where the answer needs them."""
    beta = design.level if confidence is None else 1.0 - check_open_unit(confidence,
                                                                         "confidence")
    delta = check_delta(delta, zero_ok=True)
    memo: dict[float, float] = {}

    def p(e: float) -> float:
        if e not in memo:
            memo[e] = null_p_value(design, s, dp_roc(e, delta))
        return memo[e]

    ends = [0.0, 1.0]
    while ends[-1] < e_max:
        ends.append(min(2.0 * ends[-1], e_max))
    g = 1.0 if guess is None or not np.isfinite(guess) else float(np.clip(guess, 0.0, e_max))
    b = int(np.clip(np.searchsorted(ends, g, side="right") - 1, 0, len(ends) - 2))
    while True:  # bracket b: [ends[b], ends[b + 1]]
        lo, hi = ends[b], ends[b + 1]
        cells = 1
        while (hi - lo) / cells > tol:
            cells *= 2
        step = (hi - lo) / cells

        def grid(m: int, lo=lo, hi=hi, step=step, cells=cells) -> float:
            return lo + m * step if m < cells else hi

        m = _boundary(lambda i, grid=grid: p(grid(i)), beta, cells,
                      start=int(np.clip(np.floor((g - lo) / step), 0, cells - 1)),
                      first_step=max(1, cells // (8 if guess is None else 64)))
        if m == 0 and p(lo) > beta:  # below this bracket
            if b == 0:
                return 0.0, p(0.0)
            b, g = b - 1, lo
            continue
        if m == cells - 1 and p(hi) <= beta:  # above it
            if b + 2 == len(ends):
                return hi, p(hi)
            b, g = b + 1, hi
            continue
        return grid(m), p(grid(m))


def _boundary(value: Callable[[int], float], beta: float, cells: int, *, start: int,
              first_step: int) -> int:
    """The largest i in [0, cells) with ``value(i)`` <= ``beta`` for a ``value``
    non-decreasing in i, assuming that 0 qualifies and ``cells`` does not (the caller checks
    those ends; they are not evaluated here): the integer a bisection finds, in fewer calls.
    On the normal scores z(i) = ndtri(value(i)) - ndtri(beta) (about linear in i): from
    ``start``, a second point ``first_step`` away towards the boundary, secant
    extrapolations (overshooting a little) until both sides are seen, then regula falsi
    (Illinois) rounded into the bracket."""
    z: dict[int, float] = {}

    def score(i: int) -> float:
        if i not in z:
            v = min(max(float(value(i)), 0.0), 1.0)
            with np.errstate(divide="ignore"):
                z[i] = float(ndtri(v) - ndtri(beta)) if v > 0 else -np.inf
        return z[i]

    lo, hi = 0, cells  # lo qualifies, hi does not (assumed until evaluated)
    i, prev, side = int(np.clip(start, 0, cells - 1)), None, 0
    z_lo = z_hi = None  # the bracket ends' scores as regula falsi uses them (Illinois)
    step = max(1, int(first_step))
    while True:
        if score(i) <= 0.0:
            lo, z_lo = i, z[i]
            if side == -1 and z_hi is not None:
                z_hi /= 2.0
            side = -1
        else:
            hi, z_hi = i, z[i]
            if side == 1 and z_lo is not None:
                z_lo /= 2.0
            side = 1
        if hi - lo <= 1:
            return lo
        seen_lo, seen_hi = lo in z, hi in z
        nxt = None
        if seen_lo and seen_hi and np.isfinite(z_lo) and np.isfinite(z_hi) and z_hi > z_lo:
            x = lo + (hi - lo) * (-z_lo) / (z_hi - z_lo)
            nxt = int(np.floor(x))
        elif prev is not None and np.isfinite(z[i]) and np.isfinite(z[prev]) and \
                z[i] != z[prev] and (z[i] - z[prev]) * (i - prev) > 0:
            x = i - z[i] * (i - prev) / (z[i] - z[prev])  # secant through the last two
            over = max(2.0, 0.25 * abs(x - i))
            nxt = int(np.floor(x + over)) if seen_lo and not seen_hi else int(np.ceil(x - over))
        if nxt is None:
            nxt = i + step if i == lo else i - step
            step *= 2
        prev, i = i, int(np.clip(nxt, lo + 1, hi - 1))


def certify_epsilon(scores_in, scores_out, design: RankDesign, *, delta: float,
                    confidence: float | None = None) -> CertifiedEpsilon:
    """Certified lower bound on epsilon at ``delta`` from a pre-registered design (module doc):
    valid for ANY mechanism whose canaries are independent experiments, at ``confidence``
    (default: 1 - the design's level), provided ``design`` was fixed without looking at these
    scores."""
    c = count(scores_in, scores_out, design)
    conf = 1.0 - design.level if confidence is None else confidence
    eps, p = certify_epsilon_at(design, c, delta=delta, confidence=conf)
    return CertifiedEpsilon(float(eps), float(delta), float(conf), float(p), c, design)


def curve_p_value(scores_in, scores_out, design: RankDesign, roc: Roc,
                  roc_reverse: Roc | None = None) -> tuple[float, Counts]:
    """(p-value, counts) of the claim "every test has TPR <= roc(FPR)" (and ``roc_reverse``
    in the pair's other order; default ``roc``) on these scores: the claim test of a curve,
    rejected at level alpha when the p-value is <= alpha."""
    c = count(scores_in, scores_out, design)
    return null_p_value(design, c, roc, roc_reverse), c
