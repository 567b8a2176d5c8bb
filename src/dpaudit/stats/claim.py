"""The claim test (DESIGN 4.5): do the attack's error rates fall below the claimed curve?

An accountant claims a whole trade-off curve f for the canaries' neighbouring pair: every test
that decides "member" must have FNR >= f(FPR). At a threshold t the true rates are bounded
above by Clopper-Pearson bounds (FPR_u, FNR_u), jointly over every threshold a
``ThresholdStrategy`` examines. Since f is decreasing, FNR >= f(FPR) >= f(FPR_u), so
FNR_u < f(FPR_u) at any examined threshold rejects the claim at the stated confidence, with
no assumption on the scores' distribution. The same rows test the pair in the other order
(the test "non-member iff score < t" has error rates (FNR, FPR)): FPR_u < f_rev(FNR_u).

Companions, from the same jointly valid rows:

* ``mu_lower_bound``: "the mechanism is not mu-GDP for any mu < mu_lb", with
  mu_lb = max over rows of z(1 - FPR_u) - z(FNR_u) (a statement about the GDP parameter, valid
  for any mechanism);
* ``noise_upper_bound``: given a family of claims indexed by the noise multiplier (same q, T,
  C), the smallest sigma whose claim the rows reject; every larger sigma is rejected too
  (more noise means a higher curve). A correct run has sigma <= sigma_ub except with the
  stated probability.

Validity needs each canary's (score, membership) pair to be an independent draw of the
one-canary experiment (multi-run audits; one-run audits whose canaries cannot influence each
other, e.g. Dirac gradient canaries on coordinates no data gradient touches).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtri

from dpaudit._jsonable import to_jsonable
from dpaudit._validate import check_open_unit, check_positive, check_scores
from dpaudit.stats.threshold_selection import DEFAULT_SELECTION, check_selection
from dpaudit.stats.thresholds import OrientationWarning, orientation_test

Curve = Callable[[np.ndarray], np.ndarray]

# FPRs at which a claimed curve is checked before it is used (``check_curve``).
PROBE_FPR = np.unique(np.concatenate([np.linspace(0.0, 1.0, 201), np.geomspace(1e-12, 1e-2, 41)]))
_CURVE_TOL = 1e-9  # slack for float rounding in the curve's monotonicity and range checks


class CurveError(ValueError):
    """A claimed trade-off curve is not one: not callable, not finite, outside [0, 1 - FPR]
    or increasing somewhere (``check_curve``)."""


def check_curve(curve, name: str = "tradeoff") -> Curve:
    """Check that ``curve`` is a trade-off curve on ``PROBE_FPR``; return it.

    A trade-off curve maps FPR alpha in [0, 1] to the smallest FNR any test can have: finite,
    in [0, 1 - alpha] (the coin-flip test reaches 1 - alpha) and non-increasing. Vectorised
    evaluation must return one value per alpha. Raises ``CurveError`` (a ValueError) naming
    ``name`` and the first violation: a NaN, a 2.0 or an increasing curve would otherwise turn
    into a silent non-rejection or a false one.
    """
    if not callable(curve):
        raise CurveError(f"{name} must be a callable trade-off curve FPR -> FNR, got {curve!r}")
    try:
        raw = np.asarray(curve(PROBE_FPR.copy()))
    except CurveError:
        raise
    except Exception as err:  # report any failure as a bad curve, by name
        raise CurveError(f"{name} could not be evaluated on an array of FPRs: {err!r}") from err
    if raw.dtype.kind not in "biuf":
        raise CurveError(f"{name} must return real numbers, got dtype {raw.dtype}")
    f = raw.astype(np.float64).reshape(-1)
    if f.size != PROBE_FPR.size:
        raise CurveError(
            f"{name} must return one value per FPR: {PROBE_FPR.size} FPRs gave {f.size} values"
        )
    bad = ~np.isfinite(f)
    if bad.any():
        a = PROBE_FPR[np.argmax(bad)]
        raise CurveError(f"{name} must be finite, got {f[np.argmax(bad)]} at FPR {a:g}")
    high = f > 1.0 - PROBE_FPR + _CURVE_TOL
    if (f < -_CURVE_TOL).any() or high.any():
        i = int(np.argmax(high | (f < -_CURVE_TOL)))
        raise CurveError(
            f"{name} must lie in [0, 1 - FPR] (no test does worse than a coin flip), got "
            f"{f[i]:.6g} at FPR {PROBE_FPR[i]:g}"
        )
    rising = np.diff(f) > _CURVE_TOL
    if rising.any():
        i = int(np.argmax(rising))
        raise CurveError(
            f"{name} must be non-increasing, but it rises from {f[i]:.6g} at FPR "
            f"{PROBE_FPR[i]:g} to {f[i + 1]:.6g} at FPR {PROBE_FPR[i + 1]:g}"
        )
    return curve


@dataclass(frozen=True)
class ClaimTest:
    """Outcome of the claim test (certified: valid for any score distribution).

    ``margin`` is the largest f(FPR_u) - FNR_u over the examined thresholds and both orders of
    the pair; the claim is rejected when it is > 0. ``threshold``, ``fpr_upper``,
    ``fnr_upper`` and ``claimed_error`` describe the row that attains it (the witness): in
    ``order`` "in vs out", ``claimed_error`` = f(FPR_u), the smallest FNR the claim allows;
    in "out vs in" (the pair's other order), f_rev(FNR_u), the smallest allowed FPR.
    """

    rejected: bool
    margin: float
    confidence: float
    n_in: int
    n_out: int
    threshold: float | None
    fpr_upper: float | None
    fnr_upper: float | None
    claimed_error: float | None
    order: str
    strategy: str
    n_thresholds: int
    note: str = ""
    rows: Any = field(default=None, repr=False, compare=False)  # the RateBounds examined

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dictionary (without the rows)."""
        return to_jsonable({k: v for k, v in self.__dict__.items() if k != "rows"})


def rate_bounds(scores_in, scores_out, *, confidence: float, selection=None, objective=None):
    """Jointly valid upper bounds on FPR and FNR at the thresholds ``selection`` examines.

    Returns the strategy's ``RateBounds`` (``dpaudit.stats.threshold_selection``); with prob
    >= ``confidence`` every row's true rates lie below its bounds simultaneously.
    """
    s_in = np.sort(check_scores(scores_in, "scores_in"))
    s_out = np.sort(check_scores(scores_out, "scores_out"))
    beta = 1.0 - check_open_unit(confidence, "confidence")
    strategy = DEFAULT_SELECTION if selection is None else check_selection(selection)
    return strategy.rate_bounds(s_in, s_out, beta, objective)


def _check_rows(rows) -> None:
    if not all(hasattr(rows, k) for k in ("fpr_upper", "fnr_upper", "thresholds")):
        raise ValueError(
            "rows must be the RateBounds of rate_bounds() (or a ClaimTest's .rows), got "
            f"{type(rows).__name__}"
        )


def _margins(rows, tradeoff: Curve, tradeoff_reverse: Curve):
    forward = np.asarray(tradeoff(np.asarray(rows.fpr_upper)), dtype=np.float64) - rows.fnr_upper
    reverse = (
        np.asarray(tradeoff_reverse(np.asarray(rows.fnr_upper)), dtype=np.float64) - rows.fpr_upper
    )
    return forward, reverse


def _reversed(scores_in, scores_out) -> bool:
    """True (and an ``OrientationWarning``) when members score significantly lower."""
    auc, z, flipped = orientation_test(scores_in, scores_out)
    if flipped:
        warnings.warn(
            f"AUC = {auc:.4f} is significantly below 0.5 (z = {z:.2f}): members score lower "
            "than non-members, the score looks flipped, so the claim test finds no evidence "
            "(higher score must mean 'member')",
            OrientationWarning,
            stacklevel=3,
        )
    return flipped


def claim_test(
    scores_in,
    scores_out,
    tradeoff: Curve,
    *,
    confidence: float = 0.95,
    selection=None,
    tradeoff_reverse: Curve | None = None,
) -> ClaimTest:
    """Test the claim "every test has FNR >= tradeoff(FPR)" at ``confidence``.

    Args:
        scores_in: attack scores of member canaries (higher = member).
        scores_out: attack scores of non-member canaries.
        tradeoff: the claimed trade-off curve, vectorised: FPR -> smallest allowed FNR.
        confidence: probability that a true claim is not rejected.
        selection: a ``ThresholdStrategy`` (default: ``DEFAULT_SELECTION``).
        tradeoff_reverse: the claim for the pair in the other order (default: ``tradeoff``,
            right for symmetric claims such as GDP and a two-sided privacy profile).
    """
    check_curve(tradeoff, "tradeoff")
    rev = tradeoff
    if tradeoff_reverse is not None:
        rev = check_curve(tradeoff_reverse, "tradeoff_reverse")
    s_in = check_scores(scores_in, "scores_in")
    s_out = check_scores(scores_out, "scores_out")
    confidence = check_open_unit(confidence, "confidence")

    def objective(fpr_u, fnr_u):
        return np.maximum(
            np.asarray(tradeoff(np.asarray(fpr_u)), dtype=np.float64) - fnr_u,
            np.asarray(rev(np.asarray(fnr_u)), dtype=np.float64) - fpr_u,
        )

    rows = rate_bounds(s_in, s_out, confidence=confidence, selection=selection, objective=objective)
    common = {
        "confidence": float(confidence),
        "n_in": int(s_in.size),
        "n_out": int(s_out.size),
        "strategy": rows.strategy,
        "n_thresholds": int(np.size(rows.thresholds)),
        "rows": rows,
    }
    if _reversed(s_in, s_out):
        return ClaimTest(
            False,
            float("-inf"),
            threshold=None,
            fpr_upper=None,
            fnr_upper=None,
            claimed_error=None,
            order="none",
            note="scores look flipped (members lower): no evidence",
            **common,
        )
    forward, reverse = _margins(rows, tradeoff, rev)
    i_f, i_r = int(np.argmax(forward)), int(np.argmax(reverse))
    if forward[i_f] >= reverse[i_r]:
        i, margin, order = i_f, float(forward[i_f]), "in vs out"
        claimed = float(forward[i_f] + rows.fnr_upper[i_f])
    else:
        i, margin, order = i_r, float(reverse[i_r]), "out vs in"
        claimed = float(reverse[i_r] + rows.fpr_upper[i_r])
    return ClaimTest(
        rejected=bool(margin > 0),
        margin=margin,
        threshold=float(np.asarray(rows.thresholds)[i]),
        fpr_upper=float(rows.fpr_upper[i]),
        fnr_upper=float(rows.fnr_upper[i]),
        claimed_error=claimed,
        order=order,
        **common,
    )


def mu_lower_bound(rows) -> float:
    """Certified "not mu-GDP for mu < mu_lb": max over rows of z(1 - FPR_u) - z(FNR_u), >= 0.

    GDP is symmetric, so the other order of the pair gives the same value.
    """
    _check_rows(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = ndtri(1.0 - np.asarray(rows.fpr_upper)) - ndtri(np.asarray(rows.fnr_upper))
    mu = np.nan_to_num(mu, nan=0.0, neginf=0.0)
    return float(max(0.0, np.max(mu))) if mu.size else 0.0


def rejects(rows, tradeoff: Curve, tradeoff_reverse: Curve | None = None) -> bool:
    """True when some row lies strictly below the claimed curve (in either order).

    Both curves are checked first (``check_curve``: a ``CurveError`` names the bad one).
    """
    _check_rows(rows)
    check_curve(tradeoff, "tradeoff")
    rev = tradeoff
    if tradeoff_reverse is not None:
        rev = check_curve(tradeoff_reverse, "tradeoff_reverse")
    forward, reverse = _margins(rows, tradeoff, rev)
    return bool(np.max(forward) > 0 or np.max(reverse) > 0)


def noise_upper_bound(
    rows,
    family: Callable[[float], Curve],
    sigma_start: float,
    *,
    rtol: float = 1e-2,
    span: float = 1e4,
    step: float = 1.25,
    sigma_min: float | None = None,
) -> float:
    """Smallest noise multiplier whose claimed curve ``family(sigma)`` the rows reject.

    ``family(sigma)`` returns the claimed trade-off curve at noise multiplier sigma (same
    q, T, C); curves must increase with sigma. Returns +inf when even ``sigma_start * span``
    is not rejected (no evidence of too little noise). The search brackets from
    ``sigma_start`` (a good guess saves evaluations: each may build a privacy profile) in
    factors of ``step`` and bisects in log space to relative width ``rtol``; the value
    returned is the bracket's upper end, a sigma that is rejected, so every larger one is too.
    The search never goes below ``sigma_start / span`` nor ``sigma_min`` (when given: e.g.
    where the family's accountant becomes too costly); when that floor is itself rejected it
    is returned, still a sigma that is rejected ("at most the floor").

    Rows with ``mu_lower_bound(rows) == 0`` return +inf without building any curve: a row
    rejects a curve f only if FNR_u < f(FPR_u) <= 1 - FPR_u (or the same in the other
    order), which is exactly a positive z(1 - FPR_u) - z(FNR_u).
    """

    def rejected(sigma: float) -> bool:
        try:
            curve = check_curve(family(sigma), f"family({sigma:g})")
        except CurveError as err:
            if err.__cause__ is None:  # a malformed curve is an error, not "no evidence"
                raise
            return False  # the claim cannot be evaluated (e.g. epsilon out of range)
        except (ValueError, RuntimeError, FloatingPointError, OverflowError):
            return False  # the claim cannot be built at this sigma: no evidence
        return rejects(rows, curve)

    if not callable(family):
        raise ValueError(f"family must be a callable sigma -> trade-off curve, got {family!r}")
    if mu_lower_bound(rows) == 0.0:  # no row lies below the coin-flip line: nothing rejects
        check_positive(sigma_start, "sigma_start")
        return float("inf")
    return smallest_rejected_sigma(
        rejected, sigma_start, rtol=rtol, span=span, step=step, sigma_min=sigma_min
    )


def smallest_rejected_sigma(
    rejected: Callable[[float], bool],
    sigma_start: float,
    *,
    rtol: float = 1e-2,
    span: float = 1e4,
    step: float = 1.25,
    sigma_min: float | None = None,
) -> float:
    """Smallest noise multiplier sigma with ``rejected(sigma)`` True, for a monotone family.

    ``rejected`` must be monotone: if a sigma is rejected, every smaller one is too (less
    noise, a lower claimed curve). Brackets from ``sigma_start`` in factors of ``step`` and
    bisects in log space to relative width ``rtol``; returns the bracket's upper end (a
    rejected sigma), +inf when even ``sigma_start * span`` is not rejected, and the floor
    (max of ``sigma_start / span`` and ``sigma_min``) when that is itself rejected.
    """
    sigma0 = check_positive(sigma_start, "sigma_start")
    rtol = check_positive(rtol, "rtol")
    span = check_positive(span, "span")
    step = check_positive(step, "step")
    if step <= 1.0 or span <= 1.0:
        raise ValueError(f"step and span must exceed 1, got step={step!r}, span={span!r}")
    floor = sigma0 / span
    if sigma_min is not None:
        floor = max(floor, check_positive(sigma_min, "sigma_min"))
        sigma0 = max(sigma0, floor)
    if rejected(sigma0):  # walk down to a sigma that is not rejected
        hi = sigma0
        while True:
            if hi <= floor:
                return hi
            below = max(hi / step, floor)
            if not rejected(below):
                lo = below
                break
            hi = below
    else:  # walk up to a sigma that is rejected
        lo = sigma0
        while not rejected(lo * step):
            lo *= step
            if lo > sigma0 * span:
                return float("inf")
        hi = lo * step
    while hi / lo - 1.0 > rtol:
        mid = float(np.sqrt(lo * hi))
        if rejected(mid):
            hi = mid
        else:
            lo = mid
    return hi

