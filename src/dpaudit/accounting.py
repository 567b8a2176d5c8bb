"""The theoretical side of an audit: Opacus' accountants and the mechanism's trade-off curve.

Upper bounds on epsilon come from Opacus' own accountants (RDP, PRV, GDP), never
re-implemented here. The GDP accountant is a central-limit approximation that Opacus itself
warns can underestimate epsilon; every GDP result carries ``may_underestimate=True``.

For drawing the mechanism under an empirical ROC, ``tradeoff_from_profile`` turns a privacy
profile delta(eps) into the largest TPR any test can reach at each FPR (seed 002 Lemma 2.7:
the envelope of the (eps, delta) trade-off lines), and ``subsampled_gaussian_profile`` gives
that profile for the Poisson-subsampled Gaussian composed over T steps (PRV discretisation,
shifted by its error bounds so the curve stays an upper bound).
"""

from __future__ import annotations

import copy
import functools
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from opacus.accountants import GaussianAccountant, PRVAccountant, RDPAccountant
from opacus.accountants.analysis.prv import (
    DiscretePRV,
    Domain,
    PoissonSubsampledGaussianPRV,
    TruncatedPrivacyRandomVariable,
    compose_heterogeneous,
)
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from dpaudit._validate import check_open_unit, check_positive

ACCOUNTANTS = ("rdp", "prv", "gdp")
_CLASSES = {"rdp": RDPAccountant, "prv": PRVAccountant, "gdp": GaussianAccountant}


@dataclass(frozen=True)
class AccountantEpsilon:
    """An accountant's epsilon (an upper bound, except where ``may_underestimate``)."""

    accountant: str
    epsilon: float
    delta: float
    may_underestimate: bool
    note: str = ""

    def __float__(self) -> float:
        return self.epsilon

    def to_dict(self) -> dict:
        return asdict(self)


def _check_accountant(accountant: str) -> str:
    if accountant not in _CLASSES:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def _make(accountant: str):
    with warnings.catch_warnings():
        # The GDP accountant warns at construction; we surface that in the result instead.
        warnings.simplefilter("ignore", UserWarning)
        return _CLASSES[accountant]()


def _epsilon_from_history(history, delta: float, accountant: str) -> AccountantEpsilon:
    key = tuple(tuple(entry) for entry in history)
    return _epsilon_of(key, float(delta), accountant)


@functools.lru_cache(maxsize=256)
def _epsilon_of(history: tuple, delta: float, accountant: str) -> AccountantEpsilon:
    """Memoised: a pure function of its (hashable) arguments, and slow (RDP with fractional
    orders, PRV domain search) while the same history recurs in every run of an audit."""
    acc = _make(accountant)
    acc.history = copy.deepcopy(list(history))
    gdp = accountant == "gdp"
    note = "GDP accountant: CLT approximation, can underestimate epsilon" if gdp else ""
    if not acc.history:
        return AccountantEpsilon(accountant, 0.0, delta, gdp, "no steps taken")
    try:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            eps = float(acc.get_epsilon(delta))
    except ValueError as err:  # e.g. GDP with a varying noise multiplier or sample rate
        return AccountantEpsilon(accountant, float("nan"), delta, gdp, f"not computable: {err}")
    # Opacus' RDP warns when the best order is at the end of its range (the epsilon is then
    # looser than it could be): kept in the result's note rather than printed on every call
    edge = [str(w.message) for w in caught if "Optimal order" in str(w.message)]
    if edge:
        note = "; ".join([note, edge[0]] if note else edge[:1])
    return AccountantEpsilon(accountant, eps, delta, gdp, note)


def accountant_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "prv",
) -> AccountantEpsilon:
    """Epsilon of T steps of the Poisson-subsampled Gaussian by one of Opacus' accountants.

    ``sample_rate=1`` is the threat model of a canary inserted at every step; there the exact
    answer is the Gaussian mechanism, mu = sqrt(T) / sigma (see ``gaussian_mechanism_epsilon``).
    """
    check_positive(noise_multiplier, "noise_multiplier")
    if not 0.0 < float(sample_rate) <= 1.0:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    check_open_unit(delta, "delta")
    history = [(float(noise_multiplier), float(sample_rate), int(steps))] if steps else []
    return _epsilon_from_history(history, delta, _check_accountant(accountant))


def history_epsilon(history, delta: float, accountant: str = "prv") -> AccountantEpsilon:
    """Epsilon of a heterogeneous history, entries (noise multiplier, sample rate, steps),
    by one of Opacus' accountants (as ``PrivacyEngine.accountant.history`` holds it)."""
    check_open_unit(delta, "delta")
    return _epsilon_from_history(history, delta, _check_accountant(accountant))


def all_accountants(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float
) -> dict[str, AccountantEpsilon]:
    """``accountant_epsilon`` for RDP, PRV and GDP."""
    return {
        a: accountant_epsilon(noise_multiplier, sample_rate, steps, delta, a) for a in ACCOUNTANTS
    }


def engine_epsilons(privacy_engine, delta: float) -> dict[str, AccountantEpsilon]:
    """Epsilon of a live ``opacus.PrivacyEngine``'s history by all three accountants.

    The engine's own accountant is read, never stepped; its history (noise multiplier, sample
    rate, steps) is replayed in fresh RDP, PRV and GDP accountants.
    """
    acc = getattr(privacy_engine, "accountant", None)
    if acc is None or not hasattr(acc, "history"):
        raise ValueError("privacy_engine must be an opacus.PrivacyEngine with an accountant")
    check_open_unit(delta, "delta")
    return {a: _epsilon_from_history(acc.history, delta, a) for a in ACCOUNTANTS}


def gaussian_mechanism_epsilon(noise_multiplier: float, steps: int, delta: float) -> float:
    """Exact epsilon of T non-subsampled Gaussian steps: sqrt(T)/sigma-GDP converted at delta."""
    from dpaudit.stats.gdp import gdp_epsilon

    check_positive(noise_multiplier, "noise_multiplier")
    check_positive(steps, "steps")
    return gdp_epsilon(np.sqrt(steps) / noise_multiplier, delta)


def _profile_columns(epsilons, deltas) -> tuple[np.ndarray, np.ndarray]:
    """A privacy profile's epsilons and deltas as checked column vectors."""
    e = np.asarray(epsilons, dtype=np.float64).reshape(-1, 1)
    d = np.asarray(deltas, dtype=np.float64).reshape(-1, 1)
    if e.shape != d.shape or e.size == 0:
        raise ValueError("epsilons and deltas must be non-empty and of equal length")
    if np.any(e < 0) or np.any((d < 0) | (d > 1)):
        raise ValueError("epsilons must be >= 0 and deltas in [0, 1]")
    return e, d


def tradeoff_from_profile(alpha, epsilons, deltas) -> np.ndarray:
    """Largest TPR at FPR ``alpha`` allowed by every (eps_i, delta_i) pair of a privacy profile.

    (eps, delta)-DP forces FNR >= max(0, 1 - delta - e^eps FPR, e^-eps (1 - delta - FPR)), so
    TPR <= min(1, delta + e^eps FPR, 1 - e^-eps (1 - delta - FPR)); the envelope is the minimum
    over the profile's points. Returns an array shaped like ``alpha``.
    """
    a = np.atleast_1d(np.asarray(alpha, dtype=np.float64))
    if np.any((a < 0) | (a > 1)) or not np.all(np.isfinite(a)):
        raise ValueError("alpha must lie in [0, 1]")
    e, d = _profile_columns(epsilons, deltas)
    with np.errstate(over="ignore", invalid="ignore"):
        line1 = np.where(a > 0.0, d + np.exp(e) * a, d)  # e^eps * 0 is 0, also when e^eps = inf
    line2 = 1.0 - np.exp(-e) * (1.0 - d - a)
    tpr = np.minimum(1.0, np.minimum(line1, line2).min(axis=0))
    return np.maximum(tpr, a).reshape(np.shape(alpha))


def roc_inverse_from_profile(tpr, epsilons, deltas) -> np.ndarray:
    """Smallest FPR at which ``tradeoff_from_profile``'s ROC reaches ``tpr``, in closed form.

    That ROC is max(alpha, min(1, L(alpha))) with L the minimum of the profile's lines
    delta_i + e^eps_i alpha and 1 - e^-eps_i (1 - delta_i - alpha), all increasing. For a TPR
    y < 1 the smallest alpha is min(y, max(0, max_i of each line's inverse)): the lines reach
    y at (y - delta_i) e^-eps_i and 1 - delta_i - e^eps_i (1 - y). y >= 1 gives the smallest
    alpha where every line is >= 1 (at most 1). Returns an array shaped like ``tpr``.
    """
    y = np.atleast_1d(np.asarray(tpr, dtype=np.float64))
    if np.any((y < 0) | (y > 1)) or not np.all(np.isfinite(y)):
        raise ValueError("tpr must lie in [0, 1]")
    e, d = _profile_columns(epsilons, deltas)
    flat = y.reshape(1, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        line1 = (flat - d) * np.exp(-e)
        line2 = 1.0 - d - np.exp(e) * (1.0 - flat)
    reach = np.nan_to_num(np.maximum(line1, line2), nan=1.0, neginf=0.0).max(axis=0)
    alpha = np.minimum(flat[0], np.clip(reach, 0.0, 1.0))
    return alpha.reshape(np.shape(tpr))


class ProfileRoc:
    """``tradeoff_from_profile`` of one fixed profile, for many calls: the minimum of the
    profile's 2n lines (delta_i + e^eps_i alpha and 1 - e^-eps_i (1 - delta_i - alpha), all
    increasing in alpha) is a concave piecewise-linear function, so its lower envelope is
    built once (the hull of lines, by decreasing slope) and each alpha finds its line by
    binary search and takes the minimum over that line and ``_WINDOW`` neighbours on each
    side, each evaluated in the profile's own form: O(log n) per alpha instead of O(n), and
    the same numbers wherever the window holds the minimising line (a line the rounding of
    a breakpoint moves out of the window can only give a larger value: every line is itself
    an upper bound on the TPR). alpha = 0 takes every line, as ``tradeoff_from_profile``
    does."""

    def __init__(self, epsilons, deltas):
        e, d = _profile_columns(epsilons, deltas)
        e, d = e.ravel(), d.ravel()
        with np.errstate(over="ignore"):
            slopes = np.concatenate([np.exp(e), np.exp(-e)])
            inter = np.concatenate([d, 1.0 - np.exp(-e) * (1.0 - d)])
        kind = np.concatenate([np.zeros(e.size, dtype=np.int8), np.ones(e.size, dtype=np.int8)])
        ee, dd = np.concatenate([e, e]), np.concatenate([d, d])
        keep = np.flatnonzero(np.isfinite(slopes) & np.isfinite(inter))
        keep = keep[np.lexsort((inter[keep], -slopes[keep]))]  # slope down, intercept up
        first = np.concatenate([[True], slopes[keep][1:] != slopes[keep][:-1]])
        keep = keep[first]  # per slope, the smallest intercept
        a, b = slopes[keep].tolist(), inter[keep].tolist()  # Python floats: a faster loop
        hull: list[int] = []
        for i in range(len(a)):
            while len(hull) >= 2:
                j, k = hull[-2], hull[-1]
                # line k is useless when line i undercuts line j no later than k does
                if (b[k] - b[j]) * (a[k] - a[i]) >= (b[i] - b[k]) * (a[j] - a[k]):
                    hull.pop()
                else:
                    break
            hull.append(i)
        h = keep[hull]
        # breakpoints: where line k+1 undercuts line k (increasing in alpha)
        self._x = (inter[h][1:] - inter[h][:-1]) / (slopes[h][:-1] - slopes[h][1:])
        self._e, self._d, self._kind = ee[h], dd[h], kind[h]
        self._profile = (e, d)

    def __call__(self, alpha) -> np.ndarray:
        a = np.atleast_1d(np.asarray(alpha, dtype=np.float64))
        if np.any((a < 0) | (a > 1)) or not np.all(np.isfinite(a)):
            raise ValueError("alpha must lie in [0, 1]")
        flat = a.reshape(-1)
        k = np.searchsorted(self._x, flat, side="right")
        k = np.clip(k[None, :] + np.arange(-_WINDOW, _WINDOW + 1)[:, None], 0,
                    self._e.size - 1)
        e, d = self._e[k], self._d[k]
        with np.errstate(over="ignore", invalid="ignore"):
            lines = np.where(self._kind[k] == 0, d + np.exp(e) * flat,
                             1.0 - np.exp(-e) * (1.0 - d - flat))
        tpr = np.minimum(1.0, np.nan_to_num(lines, nan=np.inf).min(axis=0))
        zero = flat == 0.0
        if zero.any():  # e^eps * 0 is 0, also on the lines left out of the hull
            tpr[zero] = tradeoff_from_profile(flat[zero], *self._profile)
        return np.maximum(tpr, flat).reshape(np.shape(alpha))


_WINDOW = 3  # hull lines on each side of the breakpoints' choice that are evaluated too
_NEAR_ONE = 1e-6  # TPRs this close to 1 are answered by every line


class ProfileRocInverse:
    """``roc_inverse_from_profile`` of one fixed profile, for many calls: the maximum of the
    profile's 2n inverse lines is a convex piecewise-linear function of the TPR, so its upper
    envelope is built once (sorted slopes, the classic hull of lines) and each call finds a
    TPR's line by binary search: O(log n) per TPR instead of O(n). A line the rounding of an
    intersection puts on the wrong side can only be a lower line, so the value is never above
    the exact inverse (what a claim test needs: ``fdp_one_run._refutes``)."""

    def __init__(self, epsilons, deltas):
        e, d = _profile_columns(epsilons, deltas)
        e, d = e.ravel(), d.ravel()
        with np.errstate(over="ignore"):
            slopes = np.concatenate([np.exp(-e), np.exp(e)])
            inter = np.concatenate([-d * np.exp(-e), 1.0 - d - np.exp(e)])
        kind = np.concatenate([np.zeros(e.size, dtype=np.int8), np.ones(e.size, dtype=np.int8)])
        ee, dd = np.concatenate([e, e]), np.concatenate([d, d])
        keep = np.flatnonzero(np.isfinite(slopes) & np.isfinite(inter))
        keep = keep[np.lexsort((inter[keep], slopes[keep]))]
        last = np.concatenate([slopes[keep][1:] != slopes[keep][:-1], [True]])
        keep = keep[last]  # per slope, the largest intercept
        a, b = slopes[keep], inter[keep]
        hull: list[int] = []
        for i in range(a.size):
            while len(hull) >= 2:
                j, k = hull[-2], hull[-1]
                # line k is useless when line i overtakes line j no later than k does
                if (b[j] - b[i]) * (a[k] - a[j]) <= (b[j] - b[k]) * (a[i] - a[j]):
                    hull.pop()
                else:
                    break
            hull.append(i)
        h = keep[hull]
        # breakpoints: where line k+1 overtakes line k; each line is then evaluated in the
        # profile's own form (as roc_inverse_from_profile does), not slope-intercept form
        self._x = (inter[h][:-1] - inter[h][1:]) / (slopes[h][1:] - slopes[h][:-1])
        self._e, self._d, self._kind = ee[h], dd[h], kind[h]
        self._profile = (e, d)

    def __call__(self, tpr) -> np.ndarray:
        y = np.atleast_1d(np.asarray(tpr, dtype=np.float64))
        if np.any((y < 0) | (y > 1)) or not np.all(np.isfinite(y)):
            raise ValueError("tpr must lie in [0, 1]")
        # the line the breakpoints give and its neighbours: a breakpoint that cancellation
        # moved (lines of slope e^eps for large eps, near y = 1) costs nothing then
        k = np.searchsorted(self._x, y, side="right")
        k = np.clip(k[None, :] + np.arange(-_WINDOW, _WINDOW + 1)[:, None], 0, self._e.size - 1)
        e, d = self._e[k], self._d[k]
        with np.errstate(over="ignore", invalid="ignore"):
            lines = np.where(self._kind[k] == 0, (y - d) * np.exp(-e),
                             1.0 - d - np.exp(e) * (1.0 - y))
        reach = np.nan_to_num(lines, nan=1.0, neginf=0.0).max(axis=0)
        alpha = np.minimum(y, np.clip(reach, 0.0, 1.0))
        # within 1e-6 of TPR 1 the lines of slope e^eps (eps up to ~60) cancel in the
        # breakpoints: every line there, as roc_inverse_from_profile does
        near_one = y > 1.0 - _NEAR_ONE
        if near_one.any():
            alpha[near_one] = roc_inverse_from_profile(y[near_one], *self._profile)
        return alpha.reshape(np.shape(tpr))


def subsampled_gaussian_profile(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    epsilons,
    eps_error: float = 0.01,
    delta_error: float = 1e-10,
) -> np.ndarray:
    """Upper bound on delta(eps) of T Poisson-subsampled Gaussian steps, at each eps.

    Uses Opacus' PRV discretisation (Gopi et al. 2021). Its estimate satisfies
    delta(eps) <= delta_hat(eps - eps_error) + delta_error, which is what is returned.
    """
    check_positive(noise_multiplier, "noise_multiplier")
    if not 0.0 < float(sample_rate) <= 1.0:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    check_positive(steps, "steps")
    dprv = discrete_prv(noise_multiplier, sample_rate, steps, eps_error, delta_error, fast=True)
    eps = np.atleast_1d(np.asarray(epsilons, dtype=np.float64))
    return _delta_upper(dprv, eps, eps_error, delta_error)


# RDP orders for the PRV's safe domain: a subset of Opacus' default (1.1, 1.2, ..., 10.9 and
# 12-63). The integers 2-63 always; the fractional orders below 2 (where small noise needs
# them) only when the integers' best order is 2, the smallest: their series converges slowly
# (0.2-0.3 s at q = 1/2) and elsewhere the best order lies among the integers. Any subset gives
# an RDP epsilon >= Opacus' own, so a domain >= its own, whichever orders were used.
_INTEGER_ORDERS = tuple(float(a) for a in range(2, 64))
_LOW_ORDERS = tuple(1 + x / 10 for x in range(1, 10))
_DOMAIN_ORDERS = _LOW_ORDERS + _INTEGER_ORDERS
# Opacus' RDP accountant's fractional orders (its DEFAULT_ALPHAS: 1.1 ... 10.9 by 0.1)
_FRACTIONAL_ORDERS = tuple(1 + x / 10 for x in range(1, 100) if x % 10)


@functools.lru_cache(maxsize=512)
def _rdp_per_step(noise_multiplier: float, sample_rate: float, orders: tuple) -> np.ndarray:
    """RDP of one Poisson-subsampled Gaussian step at ``orders`` (T steps: T times this, as
    Opacus' ``compute_rdp`` itself composes). Memoised: a domain needs it twice per sigma."""
    rdp = compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=orders)
    out = np.asarray(rdp, dtype=np.float64)
    out.setflags(write=False)
    return out


def _rdp_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """RDP epsilon of T steps at ``delta`` over the domain's orders (comment above)."""
    sigma, q = float(noise_multiplier), float(sample_rate)
    rdp = _rdp_per_step(sigma, q, _INTEGER_ORDERS) * steps
    with warnings.catch_warnings():  # "optimal order is the smallest / largest alpha"
        warnings.simplefilter("ignore", UserWarning)
        eps, best = get_privacy_spent(orders=list(_INTEGER_ORDERS), rdp=rdp, delta=delta)
        if best > _INTEGER_ORDERS[0]:
            return float(eps)
        low = _rdp_per_step(sigma, q, _LOW_ORDERS) * steps
        orders, both = list(_LOW_ORDERS + _INTEGER_ORDERS), np.concatenate([low, rdp])
        return float(get_privacy_spent(orders=orders, rdp=both, delta=delta)[0])


def _safe_domain(noise_multiplier, sample_rate, steps, eps_error, delta_error) -> Domain:
    """Opacus' PRV domain (Gopi et al. 2021, remark 5.6, as Opacus' ``_get_domain``) with the
    RDP epsilons over (part of) ``_DOMAIN_ORDERS``. An epsilon from fewer orders is an upper
    bound on the one from all of them, so the domain is at least Opacus' own: still safe, same
    mesh."""
    size, mesh = _safe_size_mesh(noise_multiplier, sample_rate, steps, eps_error, delta_error)
    return Domain.create_aligned(-size, size, mesh)


def _safe_domain_of(size: float, mesh: float) -> Domain:
    """Opacus' aligned domain [-size, size] at ``mesh``."""
    return Domain.create_aligned(-size, size, mesh)


def _safe_size_mesh(noise_multiplier, sample_rate, steps, eps_error,
                    delta_error) -> tuple[float, float]:
    """``_safe_domain``'s half-width and mesh."""
    size = max(
        _rdp_epsilon(noise_multiplier, sample_rate, steps, delta_error / 4),
        _rdp_epsilon(noise_multiplier, sample_rate, 1, delta_error / (8 * steps)),
        eps_error,
    ) + 3
    mesh = eps_error / np.sqrt(steps * np.log(12 / delta_error) / 2)
    return size, mesh


def discrete_prv(noise_multiplier, sample_rate, steps, eps_error, delta_error, *,
                 fast: bool = False):
    """Opacus' discretised PRV of T Poisson-subsampled Gaussian steps (``PRVAccountant.
    _get_dprv``), on ``_safe_domain``; ``fast``: on that domain widened by a few cells to a
    length the FFT computes fast (``_fast_domain``: same mesh, still safe; the composition's
    FFTs 3-15x faster where Opacus' length has a large prime factor)."""
    sigma, q, steps = float(noise_multiplier), float(sample_rate), int(steps)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        size, mesh = _safe_size_mesh(sigma, q, steps, eps_error, delta_error)
        domain = (_fast_domain if fast else _safe_domain_of)(size, mesh)
        prv = PoissonSubsampledGaussianPRV(q, sigma)
        truncated = TruncatedPrivacyRandomVariable(prv, domain.t_min, domain.t_max)
        return compose_heterogeneous(
            dprvs=[_discretize(truncated, domain)], num_self_compositions=[steps]
        )


def _discretize(truncated: TruncatedPrivacyRandomVariable, domain: Domain) -> DiscretePRV:
    """Opacus' ``discretize`` (the PRV's mass per cell, the grid shifted so that its mean is
    the continuous one), with the continuous mean from ``_truncated_mean``."""
    t = domain.ts
    pmf = truncated.cdf(t + domain.dt / 2) - truncated.cdf(t - domain.dt / 2)
    shift = _truncated_mean(truncated) - np.dot(t, pmf)
    if np.abs(shift) >= domain.dt / 2:
        raise RuntimeError("Discrete mean differs significantly from continuous mean.")
    return DiscretePRV(pmf=pmf, domain=domain.shift_right(shift))


_MEAN_NODES = (128, 256)  # Gauss-Legendre nodes per piece: the two orders compared
_MEAN_AGREE = 1e-10  # their largest difference accepted (a shift of the grid by as much)


@functools.cache
def _gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's n-point Gauss-Legendre nodes and weights on [-1, 1], computed once (an
    eigenproblem: 3 ms at n = 256)."""
    x, w = np.polynomial.legendre.leggauss(n)
    x.setflags(write=False)
    w.setflags(write=False)
    return x, w


def _truncated_mean(truncated: TruncatedPrivacyRandomVariable) -> float:
    """The truncated PRV's mean, as Opacus' ``TruncatedPrivacyRandomVariable.mean``
    (E t = sum over pieces of [t F(t)] - integral of F, on its pieces), with the pieces' integrals
    by Gauss-Legendre quadrature in one vectorised evaluation instead of ``scipy.integrate.quad``
    on scalars (10 ms per PRV). log(1 - q), where the PRV's support starts, is one more piece
    boundary (the same integral; F is smooth on each piece). Where two orders differ by more
    than 1e-10 (small noise: sigma 0.3), Opacus' own ``mean`` is returned."""
    t_min, t_max = truncated.t_min, truncated.t_max
    points = np.concatenate([
        [t_min], -np.logspace(int(np.log10(np.abs(t_min))), -5, 10), [0],
        np.logspace(-5, int(np.log10(t_max)), 10), [t_max]])
    q = float(truncated._prv.sample_rate)
    if q < 1 and t_min < np.log1p(-q) < t_max:
        points = np.sort(np.append(points, np.log1p(-q)))
    a, b = points[:-1], points[1:]
    half, mid = (b - a) / 2, (b + a) / 2
    ends = np.sum(b * truncated.cdf(b) - a * truncated.cdf(a))
    means = []
    for n in _MEAN_NODES:
        x, w = _gauss_legendre(n)
        values = truncated.cdf(mid[:, None] + half[:, None] * x[None, :])
        means.append(float(ends - np.sum((values @ w) * half)))
    if abs(means[0] - means[1]) <= _MEAN_AGREE:
        return means[1]
    return float(truncated.mean())


def prv_epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, eps_error: float = 0.01
) -> float:
    """Opacus' PRV accountant's epsilon (``PRVAccountant.get_epsilon``: its upper estimate,
    delta_error = delta / 1000) of T Poisson-subsampled Gaussian steps, on ``_safe_domain``
    widened to a fast FFT length (``discrete_prv(fast=True)``).

    The same discretisation and formula as Opacus on a domain at least as wide with the same
    mesh, so it equals Opacus' number to rounding (``tests/test_accounting.py``), at a fraction
    of the cost at large q (no slow fractional-order RDP series) and wherever Opacus' domain
    length has a large prime factor. Used where many sigmas are
    converted (the effective-noise estimate); the claim itself is Opacus' own accountants.
    """
    check_positive(noise_multiplier, "noise_multiplier")
    check_positive(steps, "steps")
    check_open_unit(delta, "delta")
    delta_error = delta / 1000
    dprv = discrete_prv(noise_multiplier, sample_rate, steps, eps_error, delta_error, fast=True)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(dprv.compute_epsilon(delta, delta_error, eps_error)[2])


def _merged(history) -> list[tuple[float, float, int]]:
    """A history's entries (noise multiplier, sample rate, steps) with equal (sigma, q) merged
    wherever they stand: composition does not depend on the order of the steps."""
    counts: dict[tuple[float, float], int] = {}
    for entry in history:
        sigma, q, steps = float(entry[0]), float(entry[1]), int(entry[2])
        if steps < 0 or int(entry[2]) != entry[2]:
            raise ValueError(f"history: steps must be non-negative integers, got {entry!r}")
        check_positive(sigma, "history's noise multiplier")
        if not 0.0 < q <= 1.0:
            raise ValueError(f"history: sample rates must lie in (0, 1], got {entry!r}")
        if steps:
            counts[(sigma, q)] = counts.get((sigma, q), 0) + steps
    return [(s, q, k) for (s, q), k in counts.items()]


def rdp_history_epsilon(history, delta: float) -> float:
    """RDP epsilon of a heterogeneous history: the integer orders 2-63, then Opacus' fractional
    orders (1.1 ... 10.9) within one of the best integer order. Every order set gives an upper
    bound; this one reaches Opacus' own RDP epsilon wherever its best order lies near the best
    integer (as it does: the RDP curve is unimodal in practice), at a few fractional-order
    series per entry instead of 90 (0.15 s per entry in Opacus' accountant)."""
    check_open_unit(delta, "delta")
    entries = _merged(history)
    if not entries:
        return 0.0
    rdp = sum(_rdp_per_step(s, q, _INTEGER_ORDERS) * k for s, q, k in entries)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        eps, best = get_privacy_spent(orders=list(_INTEGER_ORDERS), rdp=rdp, delta=delta)
        near = tuple(a for a in _FRACTIONAL_ORDERS if abs(a - best) < 1.0)
        if not near:
            return float(eps)
        frac = sum(_rdp_per_step(s, q, near) * k for s, q, k in entries)
        return float(min(eps, get_privacy_spent(orders=list(near), rdp=frac, delta=delta)[0]))


def prv_history_bounds(history, delta: float, eps_error: float = 0.01
                       ) -> tuple[float, float, float]:
    """Opacus' PRV accountant on a heterogeneous history: (lower, estimate, upper) of its
    ``DiscretePRV.compute_epsilon`` (Gopi et al. 2021: the true epsilon of the composed
    Poisson-subsampled Gaussians lies between lower and upper; ``PRVAccountant.get_epsilon``
    returns upper), delta_error = delta / 1000 as Opacus.

    The same discretisation as Opacus on one common domain at least as wide as Opacus' (the
    RDP epsilons of remark 5.6 over a subset of its orders, for the least private step taken
    at every step: each an upper bound on Opacus' own) with the same mesh; each distinct
    (sigma, q) is discretised once (``_discretize``, the continuous mean by Gauss-Legendre)
    and composed by ``compose_heterogeneous``. Entries
    with equal (sigma, q) are merged wherever they stand (``_merged``). About 10 ms per
    distinct entry at T = 100, against 0.2 s in Opacus' accountant."""
    check_open_unit(delta, "delta")
    entries = _merged(history)
    if not entries:
        return 0.0, 0.0, 0.0
    total = sum(k for _, _, k in entries)
    delta_error = delta / 1000
    # the domain of remark 5.6 from the least private step (smallest sigma, largest q) taken
    # at every step: its RDP epsilons bound every entry's, so the domain is at least the
    # history's own (safe), at the cost of one RDP series instead of one per entry
    worst = (min(s for s, _, _ in entries), max(q for _, q, _ in entries))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        size = max(
            _rdp_epsilon(*worst, total, delta_error / 4),
            _rdp_epsilon(*worst, 1, delta_error / (8 * total)),
            eps_error,
        ) + 3
        mesh = eps_error / np.sqrt(total * np.log(12 / delta_error) / 2)
        domain = _fast_domain(size, mesh)
        dprvs = [_discretize(TruncatedPrivacyRandomVariable(
            PoissonSubsampledGaussianPRV(q, s), domain.t_min, domain.t_max), domain)
            for s, q, _ in entries]
        composed = compose_heterogeneous(dprvs=dprvs,
                                         num_self_compositions=[k for _, _, k in entries])
        lower, estimate, upper = composed.compute_epsilon(delta, delta_error, eps_error)
    return float(lower), float(estimate), float(upper)


def _fast_domain(size: float, mesh: float) -> Domain:
    """Opacus' aligned domain [-size, size] at ``mesh``, widened by a few cells so that its
    length is one the FFT computes fast (``scipy.fft.next_fast_len``): the self-compositions'
    circular convolutions run at the domain's length, which is otherwise any even number
    (a large prime factor made each 5-10x slower). A wider domain with the same mesh is still
    safe (remark 5.6 asks for at least ``size``)."""
    from scipy.fft import next_fast_len

    domain = Domain.create_aligned(-size, size, mesh)
    target = domain.size
    while True:
        target = next_fast_len(target, real=True)
        if target % 2 == 0:
            break
        target += 1
    wider = size
    for _ in range(8):  # create_aligned rounds the ends outward: settle in a step or two
        if domain.size >= target:
            return domain
        wider += (target - domain.size) / 2 * mesh
        domain = Domain.create_aligned(-wider, wider, mesh)
    return domain


def sound_epsilon(history, delta: float, accountant: str = "prv") -> float:
    """An upper bound on the epsilon of a heterogeneous history that never underestimates:
    PRV's upper end (``prv_history_bounds``) or RDP's (``rdp_history_epsilon``); GDP, a
    central-limit approximation, is refused."""
    if accountant == "prv":
        return prv_history_bounds(history, delta)[2]
    if accountant == "rdp":
        return rdp_history_epsilon(history, delta)
    raise ValueError(f"accountant must be 'prv' or 'rdp' (an upper bound; GDP can "
                     f"underestimate), got {accountant!r}")


def _delta_upper(dprv, eps: np.ndarray, eps_error: float, delta_error: float) -> np.ndarray:
    """delta_hat(eps - eps_error) + delta_error for an array of eps, vectorised.

    delta_hat(e) = sum_{t_i >= e} p_i (1 - e^{e - t_i}) on the discretised privacy loss
    (the same sum as Opacus' ``compute_delta_estimate``), from two suffix sums. The suffix
    sums' float64 rounding (at most ~1e-16 per term) is added, so the result stays an upper
    bound: it differs from Opacus' term-by-term sum by < 1e-9 on 5e5-point domains.
    """
    return _DeltaUpper(dprv, eps_error, delta_error)(eps)


class _DeltaUpper:
    """``_delta_upper`` of one discretised PRV for many calls: its suffix sums computed once
    (the same numbers)."""

    def __init__(self, dprv, eps_error: float, delta_error: float):
        t = np.asarray(dprv.domain.ts, dtype=np.float64)
        p = np.asarray(dprv.pmf, dtype=np.float64)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            self.tail_p = np.concatenate([np.cumsum(p[::-1])[::-1], [0.0]])
            self.tail_pe = np.concatenate([np.cumsum((p * np.exp(-t))[::-1])[::-1], [0.0]])
        self.t = t
        self.eps_error, self.delta_error = eps_error, delta_error

    def __call__(self, eps) -> np.ndarray:
        t = self.t
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            e = np.maximum(np.asarray(eps, dtype=np.float64) - self.eps_error, 0.0)
            i = np.searchsorted(t, e, side="left")
            vals = self.tail_p[i] - np.exp(e) * self.tail_pe[i]
        vals = np.nan_to_num(np.maximum(vals, 0.0), nan=1.0) + 2e-16 * t.size
        return np.minimum(1.0, vals + self.delta_error)


def subsampled_gaussian_profile_grid(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    num_eps: int = 2000,
    delta_floor: float = 1e-10,
) -> tuple[np.ndarray, np.ndarray]:
    """(eps grid, upper bounds on delta(eps)) of T Poisson-subsampled Gaussian steps.

    The grid runs from 0 to the epsilon where delta falls to about ``delta_floor``. Every
    delta is an upper bound (the PRV's error bounds and the summation's rounding added); the
    PRV is discretised on the safe domain widened to a fast FFT length (``discrete_prv(fast=
    True)``: wider is still safe; 1.3-7x faster).
    """
    check_positive(noise_multiplier, "noise_multiplier")
    check_positive(steps, "steps")
    eps_error, delta_error = 0.01, delta_floor / 10
    dprv = discrete_prv(noise_multiplier, sample_rate, steps, eps_error, delta_error, fast=True)
    floor = delta_floor + 2e-16 * np.asarray(dprv.pmf).size
    upper = _DeltaUpper(dprv, eps_error, delta_error)
    hi = 1.0
    while upper(np.array([hi]))[0] > floor and hi < 1e4:
        hi *= 1.5
    eps_grid = np.linspace(0.0, hi, num_eps)
    return eps_grid, upper(eps_grid)


def subsampled_gaussian_tradeoff(
    alpha,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    num_eps: int = 2000,
    delta_floor: float = 1e-10,
) -> np.ndarray:
    """ROC upper curve (largest TPR at each FPR) of T Poisson-subsampled Gaussian steps.

    The envelope of the profile's (eps, delta) lines (``subsampled_gaussian_profile_grid``);
    beyond the grid the curve is at most delta_floor + e^eps FPR. Every point is an upper
    bound, so the curve is one too. The remove direction's profile (Opacus' PRV) also bounds
    the add direction for eps >= 0, so both lines of ``tradeoff_from_profile`` apply.
    """
    eps_grid, deltas = subsampled_gaussian_profile_grid(
        noise_multiplier, sample_rate, steps, num_eps, delta_floor
    )
    return tradeoff_from_profile(alpha, eps_grid, deltas)
