"""Certified tests of DP-SGD's sampling: which examples each step used (DESIGN 4.5, "the
mechanism's other doors").

The accountant's premise is Poisson sampling at the claimed rate q: at every step each of the
n examples enters the batch independently with probability q, fresh at every step, once (one
example is one row). Real loaders break it while every per-step check passes: a sampler
re-seeded at each pass replays its batches (sizes stay Binomial), shuffled passes use each
example once per pass, duplicated rows make one example two. Two views of a run are tested
here, each against an exact null and with no assumption on the data:

* ``poisson_sampling_test``: the batch sizes B_t alone (i.i.d. Binomial(n, q) under the claim):
  their total (the rate), their spread in both directions (too regular: fixed-size batches;
  too spread: duplicated or clustered draws) and the count of steps at the expected size;
* ``sampling_by_example_test``: which examples each step used, kept in O(n + T) memory
  (``capture.sampling_record``): the participation count c_i of every example (i.i.d.
  Binomial(T, q) under the claim; its spread is tested in both directions: shuffled passes
  make the counts almost constant, replayed passes multiply them) and the overlap of the
  batches at every lag, read from a count sketch of each step's index set (replayed passes
  share whole batches, shuffled passes avoid each other within a pass).

The spread tests are Chernoff bounds on a sum of i.i.d. squared deviations, whose moment
generating function is computed exactly over the binomial support. The overlap test is a
martingale test: the centred sketch y_t = sum_i (x_it - q) r_i (x_it = 1 when example i is in
batch t, r_i its signed bucket) gives Q_L = sum_t <y_t, y_{t+L}>, a sum over t of terms
whose conditional law given the earlier steps is a sum of independent centred Bernoulli
variables with known coefficients; Bernoulli(q) - q is sub-Gaussian with variance proxy
(1 - 2q) / (2 log((1 - q) / q)) (Kearns & Saul 1998), so exp(lam Q_L - lam^2 V_L / 2) is a
supermartingale for every lam, and its normal mixture (Robbins) gives the p-value
sqrt((V_L + rho) / rho) exp(-Q_L^2 / (2 (V_L + rho))) whatever the data (Ville's inequality),
rho fixed in advance. Bonferroni over the lags.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import scipy.fft
from scipy.stats import binom

from dpaudit._validate import check_open_unit, check_real_array
from dpaudit.stats.checks import STATISTICAL, CheckResult
from dpaudit.stats.noise_law import FFT_ERROR

# the Chernoff parameter grid, in units of 1 / Var: every lam gives a valid bound
_LAM_GRID = np.geomspace(1e-4, 1e2, 121)
_CHUNK = 1 << 16  # binomial support points per block of the exact moment generating function


@functools.lru_cache(maxsize=4)
def _support(n: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """Binomial(n, q)'s log pmf and squared deviations (k - n q)^2 over its support."""
    k = np.arange(n + 1)
    return binom.logpmf(k, n, q), (k - n * q) ** 2


def _log_mgf_sq_dev(lam: np.ndarray, n: int, q: float) -> np.ndarray:
    """log E[exp(lam (X - n q)^2)] for X ~ Binomial(n, q), each lam of either sign, exactly
    (a log-sum over the whole support, in blocks so that memory stays bounded)."""
    lam = np.asarray(lam, dtype=np.float64)
    logpmf, dev2 = _support(int(n), float(q))
    total = np.full(lam.shape, -np.inf)
    for start in range(0, n + 1, _CHUNK):
        a = logpmf[None, start : start + _CHUNK] + lam[:, None] * dev2[None, start : start + _CHUNK]
        top = a.max(axis=1)
        block = top + np.log(np.exp(a - top[:, None]).sum(axis=1))
        total = np.logaddexp(total, block)
    return total


def bonferroni(parts) -> tuple[float, str]:
    """The p-value of several exact tests at once, (name, p) pairs: the smallest p times their
    number (capped at 1), and the name of the test that gave it."""
    name, smallest = min(parts, key=lambda x: x[1])
    return min(1.0, len(parts) * smallest), name


def spread_tails(values, n: int, q: float) -> tuple[float, float]:
    """Chernoff p-values of both tails of V = sum_i (X_i - n q)^2 for X_1, ..., X_m i.i.d.
    Binomial(n, q): P(V <= v) <= min_lam e^(lam v) E[e^(-lam (X - n q)^2)]^m and
    P(V >= v) <= min_lam e^(-lam v) E[e^(lam (X - n q)^2)]^m, lam > 0 on a fixed grid (each
    lam gives a valid bound, so the smallest does too). Returns (p_low, p_high)."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    m = x.size
    v = float(((x - n * q) ** 2).sum())
    var = max(n * q * (1.0 - q), 1e-12)
    lam = _LAM_GRID / var
    log_low = float(np.min(lam * v + m * _log_mgf_sq_dev(-lam, n, q)))
    # the upper tail needs lam below the binomial's own curvature to be useful; larger lam
    # are still valid (the support is finite), merely weak
    lam_up = np.geomspace(1e-4, 0.5, 61) / var
    log_high = float(np.min(-lam_up * v + m * _log_mgf_sq_dev(lam_up, n, q)))
    return float(min(1.0, np.exp(log_low))), float(min(1.0, np.exp(log_high)))


def _size_components(b: np.ndarray, n: int, q: float) -> dict[str, float]:
    """The four exact p-values of ``poisson_sampling_test`` at one n (module doc)."""
    t_n = b.size
    total = int(b.sum())
    p_sum = min(1.0, 2.0 * min(binom.cdf(total, n * t_n, q), binom.sf(total - 1, n * t_n, q)))
    p_reg, p_spread = spread_tails(b, n, q)
    k = np.arange(n + 1)
    near = np.abs(k - n * q) <= 1.0
    p_near_one = float(np.exp(binom.logpmf(k[near], n, q)).sum()) if near.any() else 0.0
    hits = int((np.abs(b - n * q) <= 1.0).sum())
    p_close = float(binom.sf(hits - 1, t_n, min(1.0, p_near_one))) if hits else 1.0
    return {"rate": float(p_sum), "regularity": p_reg, "spread": p_spread,
            "expected size": p_close, "hits": hits}


# candidate sizes examined when n is known only to a range (every one when it is this narrow)
_RANGE_POINTS = 41


def _candidates(lo: int, hi: int, b: np.ndarray, q: float) -> list[int]:
    """The sizes in [lo, hi] a range test examines: every one in a narrow range, else an even
    grid with the ends and the size that fits the batches' mean best (each component's p is
    a smooth function of n; its largest value on the range is taken)."""
    lo = max(int(lo), int(b.max()))
    if hi < lo:
        return []
    if hi - lo < _RANGE_POINTS:
        return list(range(lo, hi + 1))
    grid = set(np.linspace(lo, hi, _RANGE_POINTS).round().astype(int).tolist())
    grid.add(int(min(hi, max(lo, round(float(b.mean()) / q)))))
    return sorted(grid)


def poisson_sampling_test(batch_sizes, n: int, q: float, *, level: float,
                          n_high: int | None = None, test_rate: bool = True) -> CheckResult:
    """Were the batches drawn by Poisson sampling at rate ``q`` from ``n`` examples?

    Under the claim the batch sizes B_t are i.i.d. Binomial(n, q). Four exact tests, each at
    ``level`` / 4:

    * the total sum_t B_t ~ Binomial(n T, q), two-sided (a wrong rate);
    * too regular: V = sum_t (B_t - n q)^2 far below its law, as fixed-size shuffled batches
      give (``spread_tails``, lower tail);
    * too spread: V far above its law, as duplicated draws give (each drawn example twice, at
      half the rate: the same mean, twice the variance) (``spread_tails``, upper tail);
    * too many steps at the expected size: the count of |B_t - n q| <= 1 is Binomial(T, p1)
      with p1 = P(|B - n q| <= 1), upper tail (fixed-size batches whose epoch ends in a
      smaller one: the few short batches swamp V, not this count).

    Args:
        batch_sizes: the T realised batch sizes (integers >= 0).
        n: the number of examples sampled from (with ``n_high``: the smallest it may be).
        q: the claimed sample rate, in (0, 1]; at 1 (full batches) the test is exact
            (``_full_batch_test``).
        level: the test's error probability.
        n_high: when n is known only to lie in [n, n_high] (e.g. from the optimizer's
            expected batch size, int(n q)): each test's p-value is its largest over that
            range, so the test stays valid for every n in it.
        test_rate: False leaves the rate's test out (three tests at ``level`` / 3; its p-value
            is still reported): where n is inferred rather than read, a total off the
            expected one may be another data set at the claimed rate, not a wrong rate.
    """
    b = check_real_array(batch_sizes, "batch_sizes").reshape(-1)
    if b.size < 2 or np.any(b < 0) or np.any(b != np.round(b)):
        raise ValueError(f"batch_sizes must be >= 2 integers >= 0, got {b.size} values")
    if isinstance(n, bool) or int(n) != n or n < 1 or np.any(b > (n if n_high is None
                                                                      else n_high)):
        raise ValueError(f"n must be a positive integer >= every batch size, got {n!r}")
    if n_high is not None and (isinstance(n_high, bool) or int(n_high) != n_high
                               or n_high < n):
        raise ValueError(f"n_high must be an integer >= n = {n}, got {n_high!r}")
    if q == 1.0:  # full batches: every example in every step, the sizes exactly n
        if n_high is not None and n_high != n:
            raise ValueError("n_high: at q = 1 every batch holds all n examples, so n must "
                             "be known exactly")
        return _full_batch_test(b, int(n), check_open_unit(level, "level"))
    q = check_open_unit(q, "q")
    level = check_open_unit(level, "level")
    t_n = b.size
    lo, hi = int(n), int(n if n_high is None else n_high)
    runs = [(m, _size_components(b, m, q)) for m in _candidates(lo, hi, b, q)]
    names = ("rate", "regularity", "spread", "expected size")
    worst = {k: max(r[k] for _, r in runs) for k in names}  # each at its least favourable n
    tested = names if test_rate else names[1:]
    p, which = bonferroni([(k, worst[k]) for k in tested])
    m_best = min(runs, key=lambda r: abs(r[0] * q - float(b.mean())))[0]
    var = m_best * q * (1.0 - q)
    where = (f"n = {lo}" if lo == hi else f"n in [{lo}, {hi}], each test at its least "
             "favourable n")
    return CheckResult(
        name="poisson_sampling",
        kind=STATISTICAL,
        rejected=bool(p < level),
        p_value=p,
        level=level,
        statement=(
            f"the {t_n} batches were drawn by Poisson sampling at rate q = {q:.4g} from "
            f"{where} examples (batch sizes i.i.d. Binomial(n, q))"
        ),
        witness={
            "failed": which,
            "mean_batch": float(b.mean()),
            "expected_mean": m_best * q,
            "batch_sd": float(b.std()),
            "expected_sd": float(np.sqrt(var)),
        },
        checked=[f"{t_n} realised batch sizes"],
        details={"p_rate": worst["rate"], "p_regularity": worst["regularity"],
                 "p_spread": worst["spread"], "p_expected_size": worst["expected size"],
                 "steps_at_expected_size": int(dict(runs)[m_best]["hits"]),
                 "tests": len(tested), "rate_tested": bool(test_rate),
                 "n_range": [lo, hi]},
    )


def _full_batch_test(b: np.ndarray, n: int, level: float) -> CheckResult:
    """``poisson_sampling_test`` at q = 1: Binomial(n, 1) is the constant n, so the test is
    exact and deterministic: rejected (p = 0) when a batch held other than all n examples."""
    off = int((b != n).sum())
    return CheckResult(
        name="poisson_sampling", kind=STATISTICAL, rejected=off > 0,
        p_value=0.0 if off else 1.0, level=level,
        statement=(f"the {b.size} batches were drawn by Poisson sampling at rate q = 1 from "
                   f"n = {n} examples (every batch holds all n)"),
        witness={"failed": "full batch" if off else None, "mean_batch": float(b.mean()),
                 "expected_mean": float(n), "batch_sd": float(b.std()), "expected_sd": 0.0,
                 "steps_not_full": off},
        checked=[f"{b.size} realised batch sizes"],
        details={"q": 1.0, "steps_not_full": off},
    )


def subgaussian_variance(q: float) -> float:
    """The optimal sub-Gaussian variance proxy of Bernoulli(q) - q (Kearns & Saul 1998;
    Berend & Kontorovich 2013): (1 - 2q) / (2 log((1 - q) / q)), 1/4 at q = 1/2:
    E exp(lam (X - q)) <= exp(lam^2 s / 2) for every real lam."""
    q = float(q)
    if not 0.0 < q < 1.0:
        return 0.0
    if abs(q - 0.5) < 1e-9:
        return 0.25
    return (1.0 - 2.0 * q) / (2.0 * math.log((1.0 - q) / q))


def overlap_lags(signatures, bucket_sizes, bucket_signed, q: float) -> dict:
    """The overlap statistics of every lag L = 1..T-1 from the steps' count sketches.

    Args:
        signatures: (T, m) each step's raw sketch sum_{i in B_t} r_i (r_i: the signed unit
            vector of example i's bucket).
        bucket_sizes: (m,) how many of the n examples each bucket holds.
        bucket_signed: (m,) the sum of the signs in each bucket (sum_i r_i).
        q: the claimed sample rate.

    Returns:
        {"q": (T-1,) Q_L, "v": (T-1,) V_L, "rho": (T-1,) rho_L, "log_p": (T-1,) each lag's
        log p-value (module doc), "slack": the FFT's error bound on Q}.
    """
    s = np.asarray(signatures, dtype=np.float64)
    t_n = s.shape[0]
    sizes = np.asarray(bucket_sizes, dtype=np.float64).reshape(-1)
    y = s - q * np.asarray(bucket_signed, dtype=np.float64)[None, :]  # centred sketches
    size = 1 << (2 * t_n - 1).bit_length()
    f = scipy.fft.rfft(y, size, axis=0, workers=1)
    acf = scipy.fft.irfft((f.real**2 + f.imag**2).sum(axis=1), size, workers=1)[1:t_n]
    sq = (y * y).sum()
    slack = 2.0 * FFT_ERROR * size.bit_length() * sq  # the columns' errors add up
    kappa = subgaussian_variance(q)
    w = (y * y) @ sizes  # sum_j n_j y_t[j]^2: the next step's conditional variance weight
    lags = np.arange(1, t_n)
    v = kappa * np.cumsum(w)[t_n - 1 - lags]  # V_L = kappa sum_{t < T - L} w_t
    rho = kappa * (t_n - lags) * q * (1.0 - q) * float((sizes * sizes).sum())
    rho = np.maximum(rho, 1e-300)
    qq = np.maximum(np.abs(acf) - slack, 0.0)
    log_p = 0.5 * np.log((v + rho) / rho) - qq * qq / (2.0 * (v + rho))
    return {"q": acf, "v": v, "rho": rho, "log_p": np.minimum(log_p, 0.0), "slack": slack}


def _identical_batches(set_hashes, sizes) -> dict:
    """Batches that repeat an earlier one exactly (equal multiset hashes, at least two
    examples): how many, and the lag most of them repeat at."""
    if set_hashes is None:
        return {"repeats": 0, "lag": None}
    h = np.asarray(set_hashes, dtype=np.uint64)
    first: dict[int, int] = {}
    lags: list[int] = []
    for t, (key, b) in enumerate(zip(h.tolist(), np.asarray(sizes).tolist(), strict=True)):
        if b < 2:
            continue
        if key in first:
            lags.append(t - first[key])
        first[key] = t
    if not lags:
        return {"repeats": 0, "lag": None}
    values, counts = np.unique(lags, return_counts=True)
    return {"repeats": len(lags), "lag": int(values[np.argmax(counts)])}


def describe_sampling(counts, sizes, q: float, *, duplicate_batches: int = 0,
                      set_hashes=None, overlap: dict | None = None) -> dict:
    """Name the sampling that ran, from its by-example records (a description for the
    report, not a test): duplicated examples, replayed batches with period L, shuffled
    passes (fixed-size batches or not), fixed-size batches, or Poisson sampling at the rate
    seen.

    Returns {"kind", "text"} and, where they apply, "period" (steps), "batch_size",
    "steps_per_pass", "passes", "rate".
    """
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    b = np.asarray(sizes, dtype=np.float64).reshape(-1)
    n, t_n = c.size, b.size
    rate = float(b.sum() / max(1, n * t_n))
    if duplicate_batches:
        return {"kind": "duplicated examples",
                "text": f"examples drawn more than once within a step, in {duplicate_batches} "
                        f"of {t_n} batches (one example counted as several rows)"}
    same = _identical_batches(set_hashes, b)
    if same["repeats"] and same["repeats"] >= 0.05 * t_n:
        return {"kind": "replayed batches", "period": same["lag"],
                "text": f"replayed batches: {same['repeats']} of {t_n} batches repeat an "
                        f"earlier batch exactly, most of them {same['lag']} steps later "
                        f"(period {same['lag']})"}
    expected = t_n * rate * (1.0 - rate)
    spread = float(c.var()) / expected if expected > 0 else 1.0
    fixed = b.size > 1 and np.unique(b[:-1]).size == 1
    mean_b = float(b.mean()) if t_n else 0.0
    if spread < 0.25 and rate > 0 and t_n >= 2:
        per_pass = round(n / mean_b) if mean_b > 0 else None
        lo, hi = int(c.min()), int(c.max())
        used = f"{lo}" if lo == hi else f"{lo}-{hi}"
        out = {"kind": "shuffled passes", "steps_per_pass": per_pass,
               "passes": float(t_n / per_pass) if per_pass else None, "rate": rate}
        if fixed or _fixed_within_passes(b, n):
            size = int(np.bincount(b.astype(int)).argmax())
            out.update(kind="shuffled passes of fixed-size batches", batch_size=size)
            out["text"] = (f"shuffled passes of fixed-size batches of {size}: every example "
                           f"used {used} times in {t_n} steps (each once per pass of about "
                           f"{per_pass} steps)")
        else:
            out["text"] = (f"shuffled passes with batches of varying size: every example used "
                           f"{used} times in {t_n} steps (each once per pass of about "
                           f"{per_pass} steps)")
        return out
    if overlap is not None and overlap.get("z", 0.0) > 8.0 and overlap.get("sign", 0) > 0:
        lag = overlap["lag"]
        return {"kind": "replayed batches", "period": lag,
                "text": f"batches sharing examples with the batches {lag} steps earlier far "
                        f"beyond chance (period {lag})"}
    if fixed:
        return {"kind": "fixed-size batches", "batch_size": int(b[0]),
                "text": f"fixed-size batches of {int(b[0])} (Poisson sampling draws "
                        "Binomial sizes)"}
    return {"kind": "poisson", "rate": rate,
            "text": f"Poisson sampling as far as seen: {t_n} batches at rate {rate:.4g} "
                    f"(claimed {q:.4g})"}


def _fixed_within_passes(sizes: np.ndarray, n: int) -> bool:
    """Fixed-size batches whose pass ends in a smaller one: every size is the mode except
    about one per n examples drawn."""
    b = sizes.astype(int)
    if b.size < 2:
        return False
    mode = int(np.bincount(b).argmax())
    odd = int((b != mode).sum())
    return mode > 0 and odd <= math.ceil(b.sum() / n) + 1


def ranks_alike_test(rank_sizes, rank_examples, q: float) -> tuple[float, dict]:
    """Under DPDDP: do the ranks draw alike? Each rank samples its own share of the data at
    rate q, independently of the others under the claim, so rank r's batch size equals rank
    0's at a step with probability p_r = sum_k P(X_0 = k) P(X_r = k) (X_r ~ Binomial(n_r, q);
    the larger of that and its value given non-empty batches, which Opacus' distributed
    sampler alone yields), independently across steps: the count of equal steps is at most
    Binomial(T, p_r) (upper tail, Bonferroni over the ranks). Ranks seeded alike draw the
    same masks and have equal sizes at every step. Returns (p-value, witness)."""
    sizes = np.asarray(rank_sizes, dtype=np.int64)
    t_n, world = sizes.shape
    best, witness = 1.0, {}
    for r in range(1, world):
        k = np.arange(max(rank_examples[0], rank_examples[r]) + 1)
        a, b = binom.pmf(k, rank_examples[0], q), binom.pmf(k, rank_examples[r], q)
        p_eq = float((a * b).sum())
        nonempty = (1.0 - a[0]) * (1.0 - b[0])
        if nonempty > 0:
            p_eq = max(p_eq, float((a[1:] * b[1:]).sum() / nonempty))
        equal = int((sizes[:, 0] == sizes[:, r]).sum())
        p = float(min(1.0, (world - 1) * binom.sf(equal - 1, t_n, min(1.0, p_eq))))
        if p < best or not witness:
            best, witness = min(best, p), {"rank": r, "equal_steps": equal, "steps": t_n,
                                           "chance": p_eq}
    return best, witness


SAMPLING_STATEMENT = (
    "each step's batch was drawn by Poisson sampling at the claimed rate: every example "
    "independently with probability q, fresh at every step (participation counts i.i.d. "
    "Binomial(T, q), batches overlapping only by chance at every lag)"
)


def sampling_by_example_test(counts, sizes, signatures, bucket_sizes, bucket_signed, q: float,
                             *, level: float, set_hashes=None, duplicate_batches: int = 0,
                             rank_sizes=None, rank_examples=None) -> CheckResult:
    """Did every step use a fresh Poisson sample of the examples? (module doc)

    Three exact tests, each at ``level`` / 3: the participation counts' spread below and
    above Binomial(T, q)'s, and the batches' overlap at every lag (both signs, Bonferroni over
    the T - 1 lags); under DPDDP a fourth (each at ``level`` / 4): whether the ranks draw
    alike (``ranks_alike_test``).

    Args:
        counts: (n,) how many of the T batches each example was in.
        sizes: (T,) the batch sizes (examples, with repetitions).
        signatures: (T, m) the steps' count sketches (``overlap_lags``).
        bucket_sizes / bucket_signed: (m,) the sketch's bucket sizes and sign sums.
        q: the claimed sample rate, in (0, 1).
        level: the test's error probability.
        set_hashes: (T,) an exact hash of each batch's multiset of indices (names replays).
        duplicate_batches: batches with an example drawn twice (names the sampling seen).
        rank_sizes / rank_examples: under DPDDP, (T, ranks) each rank's own batch sizes and
            each rank's share of the data.
    """
    c = check_real_array(counts, "counts").reshape(-1)
    b = check_real_array(sizes, "sizes").reshape(-1)
    q = check_open_unit(q, "q")
    level = check_open_unit(level, "level")
    n, t_n = c.size, b.size
    if n < 1 or t_n < 2:
        raise ValueError(f"counts and sizes need n >= 1 examples and T >= 2 batches, got "
                         f"{n} and {t_n}")
    if np.any(c < 0) or np.any(c != np.round(c)) or np.any(c > t_n):
        raise ValueError(f"counts must be integers in [0, T = {t_n}] (batches an example was "
                         "in)")
    if abs(float(c.sum()) - float(b.sum())) > 0.5:
        raise ValueError(f"counts and sizes disagree: the counts sum to {c.sum():g}, the "
                         f"batch sizes to {b.sum():g}")
    sig = check_real_array(signatures, "signatures")
    m = np.asarray(bucket_sizes).reshape(-1).size
    if sig.ndim != 2 or sig.shape[0] != t_n or sig.shape[1] != m or m < 1:
        raise ValueError(f"signatures must be a (T = {t_n}, m) array with m = "
                         f"len(bucket_sizes) = {m}, got shape {sig.shape}")
    if np.asarray(bucket_signed).reshape(-1).size != m:
        raise ValueError(f"bucket_signed must have m = {m} entries, one per bucket")
    p_low, p_high = spread_tails(c, t_n, q)
    lag = overlap_lags(signatures, bucket_sizes, bucket_signed, q)
    k = int(np.argmin(lag["log_p"]))
    p_overlap = float(min(1.0, (t_n - 1) * np.exp(lag["log_p"][k])))
    parts = [("participation too regular", p_low), ("participation too spread", p_high),
             ("overlap", p_overlap)]
    ranks = {}
    if rank_sizes is not None and rank_examples is not None:
        p_ranks, ranks = ranks_alike_test(rank_sizes, rank_examples, q)
        parts.append(("ranks drawing alike", p_ranks))
    p, which = bonferroni(parts)
    z = float(abs(lag["q"][k]) / math.sqrt(lag["v"][k] + lag["rho"][k]))
    overlap = {"lag": k + 1, "z": z, "sign": int(np.sign(lag["q"][k])),
               "mean_excess": float(lag["q"][k] / (t_n - k - 1))}
    seen = describe_sampling(c, b, q, set_hashes=set_hashes, overlap=overlap,
                             duplicate_batches=duplicate_batches)
    if which == "ranks drawing alike" and parts[-1][1] < 0.01:
        seen = {"kind": "ranks drawing alike", "text": (
            f"the ranks draw alike: rank {ranks['rank']}'s own batch had rank 0's size at "
            f"{ranks['equal_steps']} of {ranks['steps']} steps (chance {ranks['chance']:.3g} "
            "a step): the same masks on every rank, a sampler seeded alike, so the examples at "
            "one shard position are sampled together")}
    expected_var = t_n * q * (1.0 - q)
    witness = {
        "failed": which,
        "participation_sd": float(c.std()),
        "expected_sd": float(math.sqrt(expected_var)),
        "counts_range": [int(c.min()), int(c.max())],
        "lag": overlap["lag"],
        "overlap_z": z,
        "overlap_sign": "more examples than chance" if overlap["sign"] > 0 else "fewer "
                        "examples than chance",
        "sampling_seen": seen["text"],
    }
    return CheckResult(
        name="sampling_by_example",
        kind=STATISTICAL,
        rejected=bool(p < level),
        p_value=p,
        level=level,
        statement=SAMPLING_STATEMENT,
        witness=witness,
        checked=[f"which of n = {n} examples each of {t_n} batches used (participation "
                 f"counts; batch overlaps at lags 1-{t_n - 1} through a {len(bucket_sizes)}-"
                 "bucket sketch)"],
        details={"p_participation_low": p_low, "p_participation_high": p_high,
                 "p_overlap": p_overlap, "overlap": overlap, "sampling_seen": seen,
                 "expected_mean_overlap": float(n * q * q), "ranks": ranks},
    )
