"""The data-rate canaries' evidence about the user's epsilon: one plan, made before scoring.

The canaries realise the training data's threat model (a Dirac gradient canary of norm r C
inserted with probability q per step, the data's rate, on a coordinate of its own), so their
pair's privacy is the user's claim itself. ``plan_data_rate`` fixes every test from the claim
and the sample sizes alone (no score is read: no selection to correct for):

* ``epsilon`` (``design.design_epsilon``): the count test whose median certified epsilon is
  largest when the scores follow the claim. Its answer, ``epsilon_lower``, is CERTIFIED: the
  canary's pair is not (e, delta)-DP for any e <= it, at ``confidence``, for ANY mechanism
  (only the canaries' independence is assumed: coordinates no data gradient reaches).
* ``family`` (``design.design_curve``, at the bounds' level): the count test most powerful
  against the claimed mechanism with a little less noise. It tests the claimed curve of every
  noise multiplier sigma (same q, T, C; ``family_roc(sigma)``): the smallest sigma whose curve
  it rejects is ``sigma_upper`` (certified: every larger sigma's curve is rejected too, since
  the nulls are nested and the statistic fixed). ``epsilon_within_family`` = the accountant's
  epsilon at sigma_upper is CONDITIONAL: a lower side for the user's epsilon only if the
  mechanism is a Poisson-subsampled Gaussian at this q, T and C (named so, never mixed with
  ``epsilon_lower``). The claim test at the bounds' level is the same test at the claimed
  sigma: rejected exactly when sigma_upper <= the claimed sigma.
* ``refute`` (``design.design_curve`` at ``refutation_level``): the claim test at the PRIVACY
  BUG level; a rejection is a certified refutation of the user's claimed curve (the
  accountant's, with its error bounds) at failure probability ``refutation_level``.

``DataRatePlan.expected`` holds the exact medians under the claim (what the audit should
show on a correct run: the count ceiling, ``ceiling``), ``evaluate`` the evidence.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dpaudit._validate import check_count, check_delta, check_open_unit, check_positive
from dpaudit.stats.claim import smallest_rejected_sigma
from dpaudit.stats.data_rate.count_test import (
    CertifiedEpsilon,
    Counts,
    RankDesign,
    Ranked,
    Roc,
    certify_epsilon_at,
    null_p_value,
)
from dpaudit.stats.data_rate.design import (
    EpsilonDesign,
    _best_exact,
    _curve_surrogate,
    design_epsilon,
    surrogate_epsilon,
)
from dpaudit.stats.data_rate.law import MixtureScoreLaw, mixture_score_law

CONDITIONAL_ON = ("the mechanism being a Poisson-subsampled Gaussian at the claimed sample rate, "
                  "steps and clip norm (only its noise multiplier unknown)")
_KAPPAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8)  # relative noise deficits tried as alternatives


@dataclass(frozen=True)
class DataRatePlan:
    """Every test of the data-rate canaries, fixed from the claim (module doc)."""

    steps: int
    sample_rate: float
    noise_multiplier: float
    canary_norm: float
    delta: float
    confidence: float
    refutation_level: float
    n_in: int
    n_out: int
    epsilon: EpsilonDesign
    family: RankDesign
    refute: RankDesign
    kappa_family: float
    kappa_refute: float
    power_family: float
    power_refute: float
    law: MixtureScoreLaw = field(repr=False, compare=False)

    @property
    def expected(self) -> dict:
        """What a correct run should show: the median certified epsilon under the claim (the
        chosen design's count ceiling), and for each curve test the larger noise multiplier
        sigma (1 + kappa) whose curve it rejects with probability ``power`` (>= 1/2 where
        some kappa of ``_KAPPAS`` allows) when the scores follow the claim."""
        return {"epsilon_lower": self.epsilon.expected,
                "family_rejects_sigma": self.noise_multiplier * (1 + self.kappa_family),
                "family_power": self.power_family,
                "refute_rejects_sigma": self.noise_multiplier * (1 + self.kappa_refute),
                "refute_power": self.power_refute}

    def to_dict(self) -> dict:
        """Plain dictionary (the designs and what they were made for)."""
        return {"steps": self.steps, "sample_rate": self.sample_rate,
                "noise_multiplier": self.noise_multiplier, "canary_norm": self.canary_norm,
                "delta": self.delta, "confidence": self.confidence,
                "refutation_level": self.refutation_level, "n_in": self.n_in,
                "n_out": self.n_out, "epsilon_design": self.epsilon.to_dict(),
                "family_design": self.family.to_dict(), "refute_design": self.refute.to_dict(),
                "expected": self.expected}

    def evaluate(self, scores_in, scores_out, *, family_roc: Callable[[float], Roc],
                 epsilon_of_sigma: Callable[[float], float] | None = None,
                 sigma_rtol: float = 2e-3, sigma_floor: float = 0.25) -> DataRateEvidence:
        """The evidence of these scores (module doc).

        Args:
            scores_in, scores_out: the member and non-member canaries' summed mixture
                log-LR scores (``attacks.mixture.MixtureLR``), ``n_in`` and ``n_out`` of them.
            family_roc: sigma -> the claimed ROC upper curve (FPR -> largest TPR) of the
                Poisson-subsampled Gaussian at noise multiplier sigma, same q, T, C, each an
                upper bound on the true ROC (PRV with its error bounds:
                ``ThreatModel.roc_curve(alpha, noise_multiplier=sigma)``); the claim is
                ``family_roc(noise_multiplier)``.
            epsilon_of_sigma: sigma -> the accountant's epsilon at ``delta`` (the user's
                accountant; ``ThreatModel.estimated_epsilon``); None: not converted.
            sigma_rtol: relative width of the sigma_upper search.
            sigma_floor: the search stops at this fraction of the claimed sigma (a run
                rejected even there reports sigma_upper = that floor: "at most"); below it
                the accountant's curves cost GBs at thousands of steps (Opacus' PRV at sigma
                0.3, T 2,500: 5.8 GB), and such a run is refuted anyway.
        """
        sorted_once: dict[int, Ranked] = {}

        def count(a, b, design: RankDesign) -> Counts:  # the scores sorted once per tie seed
            if design.tie_seed not in sorted_once:
                sorted_once[design.tie_seed] = Ranked(a, b, design.tie_seed)
            return sorted_once[design.tie_seed].count(design)

        c_eps = count(scores_in, scores_out, self.epsilon.design)
        eps, p_eps = certify_epsilon_at(self.epsilon.design, c_eps, delta=self.delta,
                                        confidence=self.confidence,
                                        guess=self._epsilon_guess(c_eps))
        certified = CertifiedEpsilon(float(eps), self.delta, self.confidence, float(p_eps),
                                     c_eps, self.epsilon.design)
        beta = 1.0 - self.confidence
        c_fam = count(scores_in, scores_out, self.family)
        claimed = family_roc(self.noise_multiplier)
        p_claim = null_p_value(self.family, c_fam, claimed)
        sigma_upper = noise_upper_bound_counts(
            self.family, c_fam, family_roc, self.noise_multiplier, level=beta,
            rtol=sigma_rtol, sigma_min=sigma_floor * self.noise_multiplier)
        eps_family = None
        if epsilon_of_sigma is not None and np.isfinite(sigma_upper):
            eps_family = float(epsilon_of_sigma(sigma_upper))
        c_ref = count(scores_in, scores_out, self.refute)
        p_ref = null_p_value(self.refute, c_ref, claimed)
        return DataRateEvidence(
            epsilon_lower=certified,
            sigma_upper=float(sigma_upper),
            epsilon_within_family=eps_family,
            conditional_on=CONDITIONAL_ON,
            claim_p_value=float(p_claim),
            claim_rejected=bool(p_claim <= beta),
            refute_p_value=float(p_ref),
            refuted=bool(p_ref <= self.refutation_level),
            family_counts=c_fam,
            refute_counts=c_ref,
            plan=self,
        )

    def _epsilon_guess(self, counts: Counts) -> float | None:
        """Where ``certify_epsilon_at`` starts (the answer does not depend on it): the normal
        surrogate's certified epsilon at these counts, moved by the gap between the exact and
        the surrogate's value at the claim's median."""
        d = self.epsilon.design
        if counts.crossed:
            return None
        at_median = surrogate_epsilon(d, self.epsilon.median_statistic, self.delta)
        return surrogate_epsilon(d, counts.statistic, self.delta) + (
            self.epsilon.expected - at_median)


@dataclass(frozen=True)
class DataRateEvidence:
    """What the data-rate canaries show (``DataRatePlan.evaluate``).

    * ``epsilon_lower`` (CERTIFIED, any mechanism): the canary's pair is not (e, delta)-DP for
      any e <= ``epsilon_lower.epsilon``, at the plan's confidence.
    * ``sigma_upper`` (CERTIFIED): every noise multiplier above it, at the claimed q, T, C,
      has its curve rejected (+inf: none is); ``epsilon_within_family`` (CONDITIONAL on
      ``conditional_on``): the accountant's epsilon at sigma_upper.
    * the claim test: ``claim_p_value`` of the user's claimed curve with the family's test
      (``claim_rejected`` at the bounds' confidence: a warning), and ``refute_p_value``
      with the refutation test (``refuted`` at the plan's ``refutation_level``: a PRIVACY
      BUG about the user's epsilon).
    """

    epsilon_lower: CertifiedEpsilon
    sigma_upper: float
    epsilon_within_family: float | None
    conditional_on: str
    claim_p_value: float
    claim_rejected: bool
    refute_p_value: float
    refuted: bool
    family_counts: Counts
    refute_counts: Counts
    plan: DataRatePlan = field(repr=False, compare=False)

    def to_dict(self) -> dict:
        """Plain dictionary (infinite sigma_upper as the string "inf")."""
        return {
            "epsilon_lower": self.epsilon_lower.to_dict(),
            "sigma_upper": self.sigma_upper if np.isfinite(self.sigma_upper) else "inf",
            "epsilon_within_family": self.epsilon_within_family,
            "within_family_conditional_on": self.conditional_on,
            "claim_p_value": self.claim_p_value, "claim_rejected": self.claim_rejected,
            "refute_p_value": self.refute_p_value, "refuted": self.refuted,
            "family_counts": self.family_counts.to_dict(),
            "refute_counts": self.refute_counts.to_dict(),
            "plan": self.plan.to_dict(),
        }


def noise_upper_bound_counts(design: RankDesign, statistic,
                             family_roc: Callable[[float], Roc], sigma_start: float, *,
                             level: float, rtol: float = 2e-3,
                             sigma_min: float | None = None) -> float:
    """Smallest noise multiplier whose claimed curve ``family_roc(sigma)`` the count test
    rejects at ``level`` with the observed ``statistic`` (``Counts`` or S), by
    ``stats.claim.smallest_rejected_sigma``'s search (+inf when none up
    to 10^4 x ``sigma_start`` is). The statistic is fixed and a larger sigma claims a lower
    curve (a smaller null), so the p-value decreases with sigma: every sigma above the one
    returned is rejected too. The search goes no lower than ``sigma_min`` (returned when it
    is itself rejected: "at most")."""
    level = check_open_unit(level, "level")

    def rejected(sigma: float) -> bool:
        return null_p_value(design, statistic, family_roc(sigma)) <= level

    return smallest_rejected_sigma(rejected, sigma_start, rtol=rtol, sigma_min=sigma_min)


def _curve_design(law: MixtureScoreLaw, args: dict, n_in: int, n_out: int,
                  level: float, memo: dict | None = None) -> tuple[RankDesign, float, float]:
    """(design, kappa, power): ``design_curve`` with the claim as the truth and, as the
    null, the claimed mechanism at sigma (1 + kappa) (its exact curve, a stand-in for the
    accountant's), for the smallest kappa of ``_KAPPAS`` whose best design rejects it with
    probability >= 1/2 (the largest kappa otherwise). The normal surrogate skips the kappas
    it finds hopeless; the exact power decides."""
    best = None
    for kappa in _KAPPAS:
        null = _plan_law(args["steps"], args["sample_rate"],
                         args["noise_multiplier"] * (1 + kappa), args["canary_norm"])
        cands, pw = _curve_surrogate(law, null.roc, null.roc_reverse, n_in, n_out, level,
                                     "best")
        if kappa != _KAPPAS[-1] and float(np.max(pw)) < 0.4:
            continue
        d, p = _best_exact(cands, pw, law, null.roc, null.roc_reverse, n_in, n_out, level,
                           3, memo)
        best = (d, kappa, p)
        if p >= 0.5:
            break
    return best


def plan_resolution(steps: int) -> float:
    """The resolution (the score's sd over the grid width) of the laws a plan uses: 20 sqrt(T)
    within [500, 4000] (``law.mixture_score_law``'s default is 4000). The grid's rounding
    adds a relative variance of about T / (12 resolution^2) <= 2e-4 to the score; the ROC
    moves by a relative 1e-4 to 4e-4 at the rates designs look at (README loop, anchor),
    against 2-7 s of FFT per plan at 4000."""
    return float(np.clip(20.0 * np.sqrt(steps), 500.0, 4000.0))


@functools.lru_cache(maxsize=32)
def _plan_law(steps: int, sample_rate: float, noise_multiplier: float,
              canary_norm: float) -> MixtureScoreLaw:
    """``mixture_score_law`` at ``plan_resolution``, memoised per claim (the laws are
    immutable): a plan's curve designs share their alternatives' laws, and repeated audits
    of one configuration compute them once."""
    return mixture_score_law(steps, sample_rate, noise_multiplier, canary_norm=canary_norm,
                             resolution=plan_resolution(steps))


def plan_data_rate(*, steps: int, sample_rate: float, noise_multiplier: float, delta: float,
                   n_in: int, n_out: int, confidence: float, refutation_level: float,
                   canary_norm: float = 1.0, law: MixtureScoreLaw | None = None
                   ) -> DataRatePlan:
    """Make every test of the data-rate canaries from the claim alone (module doc).

    Args:
        steps, sample_rate, noise_multiplier: the claim (T, q, sigma) for the canaries, the
            training data's own.
        delta: the delta of the user's (epsilon, delta).
        n_in, n_out: the member and non-member canaries that will be scored.
        confidence: the bounds' confidence (each statement's share, as the audit splits it).
        refutation_level: the PRIVACY BUG refutation's failure probability (its share).
        canary_norm: the canaries' norm over the clip norm (<= 1).
        law: the claimed law, when already computed (``mixture_score_law``); None: at
            ``plan_resolution``, and the plan memoised per pre-data parameters (the plan is
            immutable: repeated audits of one configuration make it once).

    Cost (one core, README loop's claim with 10^4 canaries per side, anchor's with 5,000):
    0.3-0.45 s in a fresh process (0.1-0.15 s of it the Beta quantiles and 0.1 s the laws,
    memoised), 0.1-0.15 s for another split of the canaries, nothing for the same one.
    """
    steps = check_count(steps, "steps", 1)
    q = check_open_unit(sample_rate, "sample_rate")
    sigma = check_positive(noise_multiplier, "noise_multiplier")
    delta = check_delta(delta)
    n_in, n_out = check_count(n_in, "n_in", 1), check_count(n_out, "n_out", 1)
    confidence = check_open_unit(confidence, "confidence")
    refutation_level = check_open_unit(refutation_level, "refutation_level")
    r = check_positive(canary_norm, "canary_norm")
    if law is None:
        return _memoised_plan(steps, q, sigma, delta, n_in, n_out, confidence,
                              refutation_level, r)
    return _make_plan(steps, q, sigma, delta, n_in, n_out, confidence, refutation_level, r,
                      law)


@functools.lru_cache(maxsize=4)
def _memoised_plan(steps: int, q: float, sigma: float, delta: float, n_in: int, n_out: int,
                   confidence: float, refutation_level: float, r: float) -> DataRatePlan:
    return _make_plan(steps, q, sigma, delta, n_in, n_out, confidence, refutation_level, r,
                      _plan_law(steps, q, sigma, r))


def _make_plan(steps: int, q: float, sigma: float, delta: float, n_in: int, n_out: int,
               confidence: float, refutation_level: float, r: float,
               law: MixtureScoreLaw) -> DataRatePlan:
    eps_design = design_epsilon(law, n_in, n_out, delta=delta, confidence=confidence)
    args = {"steps": steps, "sample_rate": q, "noise_multiplier": sigma, "canary_norm": r}
    memo: dict = {}  # the claim's StatisticLaw per ranks, shared by the two curve designs
    family, k_fam, p_fam = _curve_design(law, args, n_in, n_out, 1.0 - confidence, memo)
    refute, k_ref, p_ref = _curve_design(law, args, n_in, n_out, refutation_level, memo)
    return DataRatePlan(steps, q, sigma, r, delta, confidence, refutation_level, n_in, n_out,
                        eps_design, family, refute, k_fam, k_ref, p_fam, p_ref, law)
