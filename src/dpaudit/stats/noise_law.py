"""Certified tests of the law of the noise DP-SGD really added, from per-step sketches.

The claim behind every bound is that each step releases the clipped sum plus noise i.i.d.
N(0, (sigma C)^2) on every coordinate of every tensor, fresh at every step. In the white-box
setting the auditor reads both the optimizer's clipped sum and what it releases, so the noise
z = release - clipped sum is known at every coordinate (``capture.noise_record``, which keeps
sketches per step, never the vectors). Four tests, each with a conservative null that holds
for the generator that really runs (torch's on CPU, whose normals are bounded at 5.77 sigma,
and on CUDA; Opacus' ``secure_mode``), whatever the data:

* ``noise_scale_test``: per tensor and step, ||z||^2 / (sigma C)^2 against chi2's lower tail
  (the chi-square floor of ``stats.noise`` on the noise itself, so it needs no dominance
  argument and small tensors are tested as exactly as large ones).
* ``noise_marginal_test``: counts of z / (sigma C) in ``marginal_edges()`` bins (256 bins of
  equal Gaussian probability, the tails split at 3, 3.5, 4, 4.5 and 5) per step, per tensor
  and over the run. Under the claim each count is Binomial(n, p_b); every bin is tested both
  ways (only for excess beyond 5, where the generator's own law departs from the Gaussian),
  with p_b widened by the generator's tolerance and by the recovery's rounding. Power: bounded
  noise (empty tail bins), heavy tails (Laplace, Student: too full a centre and tails),
  discretised or rounded noise (every bin between two lattice points empty, for lattices
  coarser than about sigma C / 100).
* ``noise_alignment_test``: within a step, coordinates and tensors. For a vector h whose
  coordinates are independent and symmetric (the claim), conditionally on |h| the signs are
  i.i.d. Rademacher, and the products h_i h_{i+L} along the chains i, i+L, i+2L, ... are too;
  Hoeffding then gives P(|Q_L| >= Z sqrt(V_L)) <= 2 exp(-Z^2 / 2) for
  Q_L = sum_i h_i h_{i+L} and V_L = sum_i h_i^2 h_{i+L}^2, at every lag L, whatever the
  scale of each coordinate. ``capture.noise_record`` computes Z at every lag for two vectors
  per step: the whole model's noise folded to at most 8192 buckets (sums of coordinates, still
  independent and symmetric) and the concatenated heads of every tensor, and accumulates Q and
  V over the run (more Rademacher terms, the same bound). Power: noise broadcast along a
  dimension (lag 1 or the row length), repeated buffers, one tensor's noise reused for another
  at the same or a shifted alignment (the lag between their positions), noise that cancels
  between tensors.
* ``noise_freshness_test``: across steps. Each step's noise is sketched per tensor (each
  tensor folded to at most 256 buckets); between any two steps, the inner product of their
  sketches is again a Rademacher sum (signs independent across steps), and summed over all
  pairs at one lag it is too. Power: noise reused at any lag or period, antithetic (negated)
  draws, noise correlated with an earlier step's.

Every test returns a ``CheckResult`` (``stats.checks``) with its p-value corrected for the
cells, bins, lags and pairs it examined; ``rejected`` holds at ``level``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import binom

from dpaudit._validate import check_open_unit, check_real_array
from dpaudit.stats.checks import STATISTICAL, CheckResult
from dpaudit.stats.noise import chi2_floor

QUANTILE_BINS = 256  # bins of equal probability under N(0, 1)
TAIL_EDGES = (3.0, 3.5, 4.0, 4.5, 5.0)  # the tails, split further (both signs)
GENERATOR_TOLERANCE = 1e-3  # relative: a bin's probability under the generator vs Phi's
TAIL_TOLERANCE = 0.05  # relative, for the bins in [4, 5) (24-bit uniforms in Box-Muller)
FAR_TAIL = 5.0  # beyond: tested for excess only, against FAR_TAIL_FACTOR x the Gaussian's
FAR_TAIL_FACTOR = 2.0  # torch's CPU normals stop at 5.77: a deficit there is no bug
TRUNCATE = 3.0  # the truncated fourth moment: X = min(z^2, TRUNCATE^2)^2, X in [0, 81]
MOMENT_TOLERANCE = 1e-3  # relative, on its mean and variance under the generator
# x log2(size) x sum of squares: a bound on the error of a correlation computed by FFT
FFT_ERROR = 32 * 2.0**-52


@functools.lru_cache(maxsize=1)
def truncated_moment() -> tuple[float, float]:
    """(mean, variance) of X = min(z^2, 9)^2 for z ~ N(0, 1), exactly (closed forms of the
    truncated Gaussian moments: E[z^4; |z| < c] and E[z^8; |z| < c])."""
    c = TRUNCATE
    tail = 2.0 * float(ndtr(-c))
    phi = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    # E[z^{2k}; |z| < c] by the recursion m_k = (2k - 1) m_{k-1} - 2 c^{2k-1} phi(c)
    m = [1.0 - tail]
    for k in range(1, 5):
        m.append((2 * k - 1) * m[-1] - 2 * c ** (2 * k - 1) * phi)
    cap = c**4
    mean = m[2] + cap * tail
    second = m[4] + cap * cap * tail
    return mean, second - mean * mean


def _moment_log_p(sums: np.ndarray, n: np.ndarray, rounding: np.ndarray) -> np.ndarray:
    """log p (two-sided, Bernstein) that n i.i.d. X = min(z^2, 9)^2 of Gaussian z sum to
    ``sums``: every X lies in [0, 81], its mean and variance are ``truncated_moment()``
    within ``MOMENT_TOLERANCE``, and a coordinate known to within ``rounding`` moves X by at
    most 4 x 27 x rounding."""
    mean, var = truncated_moment()
    shift = n * 4 * TRUNCATE**3 * rounding
    dev = np.maximum.reduce([sums - n * mean * (1 + MOMENT_TOLERANCE) - shift,
                             n * mean * (1 - MOMENT_TOLERANCE) - sums - shift,
                             np.zeros_like(sums)])
    bound = TRUNCATE**4
    denom = 2.0 * (n * var * (1 + MOMENT_TOLERANCE) + bound * dev / 3.0)
    return np.minimum(math.log(2.0) - dev * dev / np.maximum(denom, 1e-300), 0.0)


@functools.lru_cache(maxsize=1)
def _edges() -> tuple[float, ...]:
    inner = ndtri(np.arange(1, QUANTILE_BINS) / QUANTILE_BINS)
    tails = np.asarray(TAIL_EDGES)
    return tuple(np.concatenate([-tails[::-1], inner, tails]).tolist())


def marginal_edges() -> np.ndarray:
    """The bin edges of z / (sigma C), increasing: bin b is [edges[b-1], edges[b]) with
    edges[-1] = -inf and edges[B-1] = +inf (``np.searchsorted(edges, x, side="right")`` and
    ``torch.bucketize(x, edges, right=True)`` give the bin)."""
    return np.asarray(_edges())


def marginal_bins(x) -> np.ndarray:
    """The bin of each value of ``x`` (in units of sigma C) among ``marginal_edges()``'s
    ``len(edges) + 1`` bins: through Phi for the 256 equal-probability bins (bin i of them
    holds Phi(x) in [i / 256, (i + 1) / 256)), by comparison in the tails beyond 3."""
    x = np.asarray(x, dtype=np.float64)
    tails = np.asarray(TAIL_EDGES)
    out = len(tails) + np.clip(np.floor(ndtr(x) * QUANTILE_BINS), 0,
                               QUANTILE_BINS - 1).astype(np.int64)
    low, high = x < -tails[0], x >= tails[0]
    out[low] = np.searchsorted(-tails[::-1], x[low], side="right")  # 0..len(tails) - 1
    out[high] = len(tails) + QUANTILE_BINS + np.searchsorted(tails, x[high], side="right") - 1
    return out


def marginal_null() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, tolerance, excess_only) per bin: the Gaussian probability of each bin, its relative
    tolerance for the generator that really runs, and whether only an excess is tested."""
    e = np.concatenate([[-np.inf], marginal_edges(), [np.inf]])
    p = ndtr(e[1:]) - ndtr(e[:-1])
    mid_abs = np.minimum(np.abs(e[1:]), np.abs(e[:-1]))  # the bin's distance from 0
    tol = np.where(mid_abs >= 4.0, TAIL_TOLERANCE, GENERATOR_TOLERANCE)
    excess_only = mid_abs >= FAR_TAIL
    return p, tol, excess_only


SCREEN_Z = 3.0  # bins whose count is this many standard deviations off get the exact tails


def _log_bin_p(counts: np.ndarray, rounding: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log p-value, expected count) per cell and bin: two-sided exact binomial tails against
    the bin's probability interval (excess only in the far tails).

    ``counts``: (cells, B); ``rounding``: (cells,) the largest recovery error of a coordinate,
    in units of sigma C: a value moves by at most that much, so a bin's probability by at
    most twice the largest density at its edges times it. The exact tails are computed for
    the bins a normal screen puts ``SCREEN_Z`` standard deviations off and each cell's most
    extreme bin; the others are given p = 1, which can only raise the smallest p-value."""
    p, tol, excess_only = marginal_null()
    e = marginal_edges()
    e_full = np.concatenate([[-np.inf], e, [np.inf]])
    dens = np.exp(-0.5 * np.minimum(e_full[1:] ** 2, e_full[:-1] ** 2)) / math.sqrt(2 * math.pi)
    widen = 2.0 * dens[None, :] * rounding[:, None]
    lo = np.clip(p[None, :] * (1.0 - tol[None, :]) - widen, 0.0, 1.0)
    hi = np.clip(p[None, :] * (1.0 + np.where(excess_only, FAR_TAIL_FACTOR - 1.0, tol))[None, :]
                 + widen, 0.0, 1.0)
    n = counts.sum(axis=1, keepdims=True)
    expected = n * p[None, :]
    z = np.abs(counts - expected) / np.sqrt(np.maximum(expected * (1 - p[None, :]), 1e-12))
    pick = z >= SCREEN_Z
    pick[np.arange(len(counts)), np.argmax(z, axis=1)] = True
    c, b = np.nonzero(pick)
    nn = n[c, 0]
    with np.errstate(divide="ignore"):
        log_low = np.where(excess_only[b], 0.0, binom.logcdf(counts[c, b], nn, lo[c, b]))
        log_high = binom.logsf(counts[c, b] - 1, nn, hi[c, b])
    log_p = np.zeros_like(counts, dtype=np.float64)
    log_p[c, b] = np.minimum(np.minimum(log_low, log_high)
                             + np.where(excess_only[b], 0.0, math.log(2.0)), 0.0)
    return log_p, expected


def noise_marginal_test(
    step_counts,
    tensor_counts,
    step_rounding,
    *,
    level: float,
    names=None,
    moments=None,
    dims=None,
) -> CheckResult:
    """Is the noise's marginal law the claimed Gaussian? (module doc)

    Args:
        step_counts: (T, B) counts of the sampled noise / (sigma C) in ``marginal_edges()``'s
            B bins at each step, pooled over tensors; None when only the run's counts per
            tensor were kept (a multi-run audit's compact records): the cells are then the
            tensors' and the run's.
        tensor_counts: (J, B) the same per tensor, summed over the steps.
        step_rounding: (T,) the largest recovery error of a sampled coordinate at each step,
            in units of sigma C (0 for exact recovery).
        level: the test's error probability; split over the T + J + 1 cells (steps, tensors,
            the run) and the B bins of each, and the moment cells.
        names: J tensor names for the report.
        moments: optional (T, J) sums of min(z^2, 9)^2 over every coordinate of each tensor
            at each step (all coordinates, not the sample): each (tensor, step), each tensor
            over the run and the whole run are tested against the Gaussian's truncated fourth
            moment (Bernstein; power against heavy or light tails on every coordinate).
        dims: (J,) coordinates per tensor (with ``moments``).
    """
    b_n = len(marginal_edges()) + 1
    per_step = step_counts is not None
    st = (np.asarray(check_real_array(step_counts, "step_counts"), dtype=np.float64)
          if per_step else np.zeros((0, b_n)))
    te = np.asarray(check_real_array(tensor_counts, "tensor_counts"), dtype=np.float64)
    r = check_real_array(step_rounding, "step_rounding").reshape(-1)
    if st.ndim != 2 or st.shape[1] != b_n or te.ndim != 2 or te.shape[1] != b_n:
        raise ValueError(f"step_counts and tensor_counts must be (., {b_n}) arrays of counts")
    if (per_step and r.size != st.shape[0]) or np.any(r < 0):
        raise ValueError(f"step_rounding must be {st.shape[0]} numbers >= 0")
    t_n = r.size  # the steps (their counts or not)
    level = check_open_unit(level, "level")
    names = [f"tensor {j}" for j in range(te.shape[0])] if names is None else list(names)
    worst = float(r.max()) if r.size else 0.0
    run = st.sum(axis=0, keepdims=True) if per_step else te.sum(axis=0, keepdims=True)
    cells = np.concatenate([st, te, run])
    labels = ([{"step": t} for t in range(st.shape[0])]
              + [{"tensor": n, "step": "all"} for n in names] + [{"step": "all"}])
    rounding = np.concatenate([r if per_step else np.zeros(0),
                               np.full(te.shape[0] + 1, worst)])
    keep = cells.sum(axis=1) > 0
    cells, rounding = cells[keep], rounding[keep]
    labels = [lab for lab, k in zip(labels, keep, strict=True) if k]
    log_p, expected = _log_bin_p(cells, rounding)
    tests = cells.shape[0] * b_n
    c, b = np.unravel_index(int(np.argmin(log_p)), log_p.shape)
    e = np.concatenate([[-np.inf], marginal_edges(), [np.inf]])
    best = float(log_p[c, b])
    witness = {
        **labels[c],
        "bin": [float(e[b]), float(e[b + 1])],
        "observed": int(cells[c, b]),
        "expected": float(expected[c, b]),
        "sampled": int(cells[c].sum()),
    }
    moment_note = []
    if moments is not None:
        m = np.asarray(check_real_array(moments, "moments"), dtype=np.float64)
        d = np.asarray(check_real_array(dims, "dims"), dtype=np.float64).reshape(-1)
        if m.shape != (t_n, d.size):
            raise ValueError(f"moments must be (T, J) = ({t_n}, {d.size}), got {m.shape}")
        n_cell = np.broadcast_to(d, m.shape)
        r_cell = np.broadcast_to(r[:, None], m.shape)
        sums = np.concatenate([m.ravel(), m.sum(axis=0), [m.sum()]])
        ns = np.concatenate([n_cell.ravel(), d * m.shape[0], [d.sum() * m.shape[0]]])
        rs = np.concatenate([r_cell.ravel(), np.full(d.size + 1, worst)])
        lp = _moment_log_p(sums, ns, rs)
        tests += lp.size
        k = int(np.argmin(lp))
        moment_note = [f"the truncated fourth moment of every coordinate: {m.size} "
                       "(tensor, step) cells, each tensor and the run"]
        if lp[k] < best:
            best = float(lp[k])
            if k < m.size:
                t, j = np.unravel_index(k, m.shape)
                where = {"tensor": names[j], "step": int(t)}
            elif k < m.size + d.size:
                where = {"tensor": names[k - m.size], "step": "all"}
            else:
                where = {"step": "all"}
            witness = {**where, "fourth_moment": float(sums[k] / ns[k]),
                       "expected_moment": truncated_moment()[0], "values": int(ns[k])}
    run_counts = (cells[-1] if labels and labels[-1] == {"step": "all"}
                  else run.reshape(-1))
    return _corrected(
        "noise_marginal", best, tests, level,
        statement=(
            "the noise added at each step has the claimed marginal law N(0, (sigma C)^2): "
            "neither bounded, nor heavy-tailed, nor discretised (exact binomial counts in "
            f"{b_n} bins per step, per tensor and over the run)"
        ),
        witness=witness,
        checked=[f"{int(te.sum())} noise values sampled over {t_n} steps and "
                 f"{te.shape[0]} tensors, in {b_n} bins"
                 + ("" if per_step else " (per tensor and over the run; no counts per step "
                    "kept)"), *moment_note],
        details={
            "tests": int(tests),
            "bins": b_n,
            "max_rounding": worst,
            "run_counts": run_counts.astype(int).tolist(),  # for the report's plot
        },
    )


def hoeffding_log_p(z) -> np.ndarray:
    """log of the two-sided Hoeffding bound 2 exp(-Z^2 / 2) (capped at 0) for Z >= 0."""
    z = np.asarray(z, dtype=np.float64)
    return np.minimum(math.log(2.0) - 0.5 * z * z, 0.0)


def _corrected(name: str, log_p: float, tests: int, level: float, **fields) -> CheckResult:
    """The check ``name`` whose smallest log p-value over ``tests`` comparisons is ``log_p``
    (Bonferroni: p = min(1, tests x e^log_p)), judged at ``level``."""
    log_adj = log_p + math.log(max(tests, 1))
    return CheckResult(name=name, kind=STATISTICAL, rejected=bool(log_adj < math.log(level)),
                       p_value=float(min(1.0, math.exp(log_adj))), level=level, **fields)


def noise_alignment_test(
    per_step,
    run_z,
    lags: dict[str, int],
    *,
    level: float,
    where: dict[str, str] | None = None,
    describe_lag=None,
) -> CheckResult:
    """Are the noise's coordinates and tensors independent within each step? (module doc)

    Args:
        per_step: vector name -> (step, Z, lag) for each step tested on its own: the largest
            Hoeffding statistic over the vector's lags that step, and where
            (``capture.noise_record``).
        run_z: vector name -> (n_lags,) Z at every lag of the Q and V sums over the run.
        lags: vector name -> how many lags each step (and the run) examined.
        level: the test's error probability, split over every (vector, step or run, lag).
        where: vector name -> what the vector is, for the report.
        describe_lag: optional (vector, lag) -> words naming what the lag joins.
    """
    level = check_open_unit(level, "level")
    if not lags:
        raise ValueError("lags: no vector to test")
    tests = 0
    candidates = []
    checked = []
    for vec, n_lags in lags.items():
        rows = list(per_step.get(vec, []))
        tests += (len(rows) + 1) * int(n_lags)
        checked.append(f"{(where or {}).get(vec, vec)}: {n_lags} lags over the run and on "
                       f"{len(rows)} steps alone")
        for t, z, lag in rows:
            candidates.append((float(hoeffding_log_p(z)),
                               {"vector": vec, "step": int(t), "lag": int(lag), "z": float(z)}))
        rz = np.asarray(run_z.get(vec, []), dtype=np.float64).reshape(-1)
        if rz.size:
            k = int(np.argmax(rz))
            candidates.append((float(hoeffding_log_p(rz[k])),
                               {"vector": vec, "step": "all", "lag": k + 1, "z": float(rz[k])}))
    best, witness = min(candidates, key=lambda c: c[0]) if candidates else (0.0, {})
    witness = dict(witness)
    if witness and describe_lag is not None:
        witness["joins"] = describe_lag(witness["vector"], witness["lag"])
    return _corrected(
        "noise_alignment", best, tests, level,
        statement=(
            "within each step the noise's coordinates and tensors are independent: no "
            "coordinate's noise repeats or cancels another's at any offset (broadcast noise, "
            "repeated buffers, one tensor's noise reused for another, at any alignment)"
        ),
        witness=witness,
        checked=checked,
        details={"tests": int(tests),
                 "max_z_over_run": {v: float(np.max(z)) if np.size(z) else None
                                    for v, z in run_z.items()}},
    )


def _pair_z(y: np.ndarray, err: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Q lower bound, V upper bound, slack) between every pair of rows of ``y`` (T, K) whose
    entries are known to within ``err`` (T,): Q = |<y_t, y_s>| - slack, V = sum_b
    (|y_tb| + err_t)^2 (|y_sb| + err_s)^2 (the Hoeffding variance of the true rows)."""
    q = y @ y.T
    l1 = np.abs(y).sum(axis=1)
    k = y.shape[1]
    slack = np.outer(l1, err) + np.outer(err, l1) + k * np.outer(err, err)
    a = (np.abs(y) + err[:, None]) ** 2
    v = a @ a.T
    return q, v, slack


def noise_freshness_test(
    sketches,
    errors,
    segments,
    *,
    level: float,
) -> CheckResult:
    """Is the noise of every step independent of every other step's? (module doc)

    Args:
        sketches: (T, K) each step's noise sketch (``capture.noise_record``: every tensor
            folded to at most 256 buckets, concatenated), in units of sigma C.
        errors: (T,) the largest recovery error of a sketch entry at each step (same units).
        segments: (name, start, stop) column ranges tested on their own: one per tensor
            large enough, and "all tensors" (every column).
        level: the test's error probability, split over every segment's pairs of steps
            (T (T - 1) / 2) and lags (T - 1).
    """
    y = check_real_array(sketches, "sketches")
    err = check_real_array(errors, "errors").reshape(-1)
    if y.ndim != 2 or y.shape[0] < 2:
        raise ValueError(f"sketches must be a (T >= 2, K) array, got shape {y.shape}")
    if err.size != y.shape[0] or np.any(err < 0):
        raise ValueError(f"errors must be {y.shape[0]} numbers >= 0")
    level = check_open_unit(level, "level")
    t_n = y.shape[0]
    iu = np.triu_indices(t_n, k=1)
    lag_of = iu[1] - iu[0]
    per_segment = t_n * (t_n - 1) // 2 + (t_n - 1)
    tests = per_segment * len(segments)
    candidates, lag_corr = [], []
    for name, a, b in segments:
        q, v, slack = _pair_z(y[:, a:b], err)
        z = np.maximum(np.abs(q) - slack, 0.0) / np.sqrt(np.maximum(v, 1e-300))
        norms = np.sqrt(np.maximum(np.diag(q), 1e-300))
        corr = q / np.outer(norms, norms)
        k = int(np.argmax(z[iu]))
        t, s = int(iu[0][k]), int(iu[1][k])
        candidates.append((float(hoeffding_log_p(z[t, s])),
                           {"tensors": name, "steps": [t, s], "z": float(z[t, s]),
                            "correlation": float(corr[t, s])}))
        # every pair at one lag: the chains t, t + lag, ... keep the signs independent
        lag_q, lag_v, lag_s = (np.bincount(lag_of, weights=m[iu], minlength=t_n)[1:]
                               for m in (q, v, slack))
        lag_z = np.maximum(np.abs(lag_q) - lag_s, 0.0) / np.sqrt(np.maximum(lag_v, 1e-300))
        m = int(np.argmax(lag_z))
        candidates.append((float(hoeffding_log_p(lag_z[m])),
                           {"tensors": name, "lag": m + 1, "z": float(lag_z[m]),
                            "correlation": float(np.mean(np.diag(corr, m + 1)))}))
        lag_corr = [float(np.mean(np.diag(corr, ell))) for ell in range(1, min(t_n, 11))]
    best_lp, witness = min(candidates, key=lambda c: c[0])
    return _corrected(
        "noise_freshness", best_lp, tests, level,
        statement=(
            "the noise of every step is independent of every other step's: not reused, "
            "negated or correlated at any lag (sketches of every tensor, every pair of steps)"
        ),
        witness=witness,
        checked=[f"{name} ({b - a} sketch entries) x {t_n} steps: {t_n * (t_n - 1) // 2} "
                 "pairs of steps" for name, a, b in segments],
        details={"tests": int(tests), "mean_correlation_by_lag": lag_corr},
    )


SCALE_STATEMENT = (
    "the noise the optimizer added has at least the claimed scale sigma C per coordinate, "
    "on every tensor at every step (chi-square floor of the noise itself)"
)


def noise_scale_test(noise_sq, dims, noise_std, rounding, *, level: float,
                     names=None, scale_rounding=0.0) -> CheckResult:
    """Does the noise the optimizer added have the claimed scale? (module doc)

    Args:
        noise_sq: (J, T) squared norms of the recovered noise per tensor and step.
        dims: (J,) coordinates per tensor.
        noise_std: the claimed sigma C, one number or (T,).
        rounding: (T,) the largest recovery error of one coordinate, in units of sigma C:
            the true noise's norm is at most the recovered one plus sqrt(d) times it, and the
            test (a lower tail) uses that upper bound.
        level: the test's error probability.
        names: J tensor names.
        scale_rounding: relative, in [0, 1): how far below the claimed sigma C the generator
            may draw for arithmetic reasons alone (torch casts the std to the noise's dtype:
            half an ulp); the floor is tested at the norm's bound / (1 - scale_rounding)
            (``stats.noise.chi2_floor``). 0: the std is exact.
    """
    x = check_real_array(noise_sq, "noise_sq")
    d = check_real_array(dims, "dims").reshape(-1)
    r = check_real_array(rounding, "rounding").reshape(-1)
    s = np.broadcast_to(check_real_array(noise_std, "noise_std").reshape(-1),
                        (x.shape[1],)) if x.ndim == 2 else None
    if x.ndim != 2 or r.size != x.shape[1]:
        raise ValueError("noise_sq must be (J, T) and rounding (T,)")
    upper = (np.sqrt(np.maximum(x, 0.0)) + np.sqrt(d)[:, None] * (r * s)[None, :]) ** 2
    return chi2_floor(upper, d, s, level=level, names=names, name="noise_scale",
                      statement=SCALE_STATEMENT, scale_rounding=scale_rounding)
