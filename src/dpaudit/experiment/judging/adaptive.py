"""Adaptive clipping's own release, judged (Opacus' ``AdaClipDPOptimizer``; DESIGN 4.5).

Besides the noised clipped sum, adaptive clipping (Andrew et al. 2021) releases, at every step,
a noisy count of the examples left unclipped, and moves the bound with it:
C_{t+1} = clamp(C_t exp(-eta (noisy count / batch size - target)), min, max). Opacus accounts
the pair as one Gaussian step at the noise multiplier sigma it is given, adding to the gradient
sigma_g = (sigma^-2 - (2 sigma_u)^-2)^(-1/2) and to the count sigma_u (the paper's Theorem 1).
The hook records C_t, the true and the noisy count and the examples counted
(``capture.records.AdaptiveRecord``), so three statements about that release can be checked:

* ``count_noise`` (statistical): the count's noise has at least the std sigma_u:
  sum_t (noisy_t - count_t)^2 / sigma_u^2 against the lower tail of chi-square with T degrees
  of freedom (a count released with less noise, or none, spends privacy the claim does not
  count).
* ``adaptive_bound`` (deterministic): every bound follows from the previous one and the
  *noisy* count by the update rule, up to float32 rounding (a bound moved by the true count,
  or by anything else, is a release the accountant never saw).
* ``adaptive_accounting`` (deterministic; a warning, never a refutation): Theorem 1 composes
  the gradient with a count of sensitivity 1/2 (values -1/2 or +1/2, normalised by the
  *expected* number of examples, as TensorFlow Privacy implements it). Opacus counts 0 or 1
  per example (sensitivity 1) and divides by the realised batch size. Composed with a count of
  sensitivity 1, the step is the Gaussian mechanism at sigma_1 = (sigma_g^-2 + sigma_u^-2)^(-1/2)
  < sigma; the check reports the epsilon of that composition beside the claim's. It is an upper
  bound's argument (the realised batch size in the denominator adds randomness of its own), so
  it is reported as a warning with its epsilon, not as a PRIVACY BUG.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from dpaudit.capture.records import AdaptiveRecord, WhiteBoxRecords
from dpaudit.experiment.judging.clipping import clipping_cost
from dpaudit.report.files import p_text
from dpaudit.stats.checks import STATISTICAL, CheckResult, deterministic

BOUND_TOLERANCE = 1e-4  # relative: Opacus updates the bound in float32
ADAPTIVE_TESTS = ("count_noise",)


def count_noise_test(rec: AdaptiveRecord, level: float) -> CheckResult:
    """``count_noise``: the noise on the released count has std >= sigma_u (module doc)."""
    z = rec.noisy_counts - rec.counts
    t = z.size
    stat = float(np.sum(z * z) / rec.sigma_count**2) if rec.sigma_count > 0 else 0.0
    p = float(stats.chi2.cdf(stat, t)) if rec.sigma_count > 0 else 0.0
    ratio = float(np.sqrt(stat / t)) if t else float("nan")
    return CheckResult(
        name="count_noise", kind=STATISTICAL, rejected=bool(p < level), p_value=p,
        level=level,
        statement=(f"the count of unclipped examples is released with noise of std at least "
                   f"sigma_u = {rec.sigma_count:g} (adaptive clipping)"),
        witness={"noise_ratio": ratio, "steps": t},
        checked=[f"{t} noisy counts against the true ones (chi-square, lower tail)"],
        details={"chi2": stat, "steps": t, "sigma_count": rec.sigma_count},
    )


def expected_bounds(rec: AdaptiveRecord) -> np.ndarray:
    """(T,) the bound after each step by the update rule, from the noisy counts."""
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = rec.noisy_counts / rec.sizes
    nxt = rec.bounds * np.exp(-rec.learning_rate * (frac - rec.target_quantile))
    return np.clip(nxt, rec.min_bound, rec.max_bound)


def bound_check(rec: AdaptiveRecord) -> CheckResult:
    """``adaptive_bound``: each C_{t+1} is the update rule's from C_t and the noisy count."""
    seen = np.append(rec.bounds[1:], rec.next_bound)
    want = expected_bounds(rec)
    ok = np.isfinite(want) & (rec.sizes > 0)
    gap = np.where(ok, np.abs(seen - want) / np.maximum(np.abs(want), 1e-300), 0.0)
    bad = np.flatnonzero(gap > BOUND_TOLERANCE)
    witness = {}
    if bad.size:
        t = int(bad[0])
        with np.errstate(divide="ignore", invalid="ignore"):
            from_true = float(np.clip(
                rec.bounds[t] * np.exp(-rec.learning_rate
                                       * (rec.counts[t] / rec.sizes[t] - rec.target_quantile)),
                rec.min_bound, rec.max_bound))
        witness = {"step": t, "bound": float(seen[t]), "expected": float(want[t]),
                   "from_true_count": from_true}
    return deterministic(
        "adaptive_bound", bool(bad.size),
        "every clip bound follows from the previous one and the noisy count by the update "
        "rule (the bound depends on the data only through the released count)",
        witness=witness,
        checked=[f"{int(ok.sum())} bound updates, relative tolerance {BOUND_TOLERANCE:g}"],
        details={"largest_gap": float(gap.max()) if gap.size else 0.0,
                 "steps_skipped": int((~ok).sum())},
    )


def accounting_check(rec: AdaptiveRecord, sample_rate: float | None,
                     delta: float | None) -> CheckResult:
    """``adaptive_accounting``: the claim's sigma against the gradient and a count of
    sensitivity 1 composed (a warning with its epsilon; module doc)."""
    one = (rec.sigma_gradient**-2 + rec.sigma_count**-2) ** -0.5
    steps = rec.bounds.size
    cost = clipping_cost(rec.sigma / one, [rec.sigma] * steps, sample_rate, delta)
    words = (f"the gradient (sigma_g = {rec.sigma_gradient:.4g}) and a count of sensitivity 1 "
             f"(sigma_u = {rec.sigma_count:.4g}) compose to sigma = {one:.4g} < {rec.sigma:g}: "
             f"epsilon {cost['implied_epsilon']:.4g} against the claim's "
             f"{cost['claimed_epsilon']:.4g} ({cost['basis']})")
    return deterministic(
        "adaptive_accounting", False,
        "the accountant's sigma covers what adaptive clipping releases (Theorem 1 assumes a "
        "count of sensitivity 1/2 over the expected batch size; Opacus counts 0 or 1 per "
        "example over the realised batch size)",
        witness={"sigma": rec.sigma, "sigma_sensitivity_one": one,
                 "claimed_epsilon": cost["claimed_epsilon"],
                 "implied_epsilon": cost["implied_epsilon"],
                 "epsilon_excess": cost["epsilon_excess"]},
        checked=[words, "an upper bound's argument: the realised batch size in the update "
                 "adds randomness the composition does not credit"],
        details=cost, warn=True,
    )


def adaptive_checks(records: WhiteBoxRecords, level: float, delta: float | None
                    ) -> dict[str, CheckResult]:
    """The three checks of adaptive clipping's release (none without an ``AdaptiveRecord``)."""
    rec = records.adaptive
    if rec is None or rec.bounds.size == 0:
        return {}
    q = (records.sampling or {}).get("q")
    return {"count_noise": count_noise_test(rec, level), "adaptive_bound": bound_check(rec),
            "adaptive_accounting": accounting_check(rec, q, delta)}


def describe_adaptive(check: CheckResult) -> str | None:
    """The verdict's line for one of these checks (None for any other check)."""
    w = check.witness or {}
    if check.name == "count_noise":
        return (f"count noise: adaptive clipping's count of unclipped examples carried "
                f"{w.get('noise_ratio', float('nan')):.3g} x the claimed noise std "
                f"({p_text(check.p_value)})")
    if check.name == "adaptive_bound":
        if not w:
            return "adaptive bound: a clip bound did not follow the update rule"
        return (f"adaptive bound: after step {w['step']} the clip bound was {w['bound']:.6g}, "
                f"not the update rule's {w['expected']:.6g} from the noisy count (from the "
                f"true count: {w['from_true_count']:.6g})")
    if check.name == "adaptive_accounting":
        return (f"adaptive accounting: with the count's real sensitivity (1), gradient and "
                f"count compose to noise multiplier {w.get('sigma_sensitivity_one', 0):.4g} "
                f"< {w.get('sigma', 0):g}, epsilon {w.get('implied_epsilon', 0):.4g} against "
                f"the claimed {w.get('claimed_epsilon', 0):.4g} "
                f"({w.get('epsilon_excess', 0):+.1%}; an upper bound's argument, not evidence)")
    return None
