"""From per-canary scores to typed evidence (DESIGN 3 steps 5-6, DESIGN 4.5).

Two kinds of evidence, never mixed up:

* **certified** (valid whatever the scores' distribution, at the stated confidence): the
  claim test of the threat model's trade-off curve, the statement "not mu-GDP for any
  mu < mu_lower", the effective-noise bound sigma_upper, and the certified epsilon bounds
  (Clopper-Pearson, one-run, density);
* **estimates** under a named model (gdp, gaussian, density_tv, fdp_one_run, and the
  accountant's epsilon at sigma_upper for the subsampled case).

Each piece is built typed where it is made: a claim test is a ``ClaimRow``, a bound a
``BoundRow``, a white-box check a ``CheckResult``, the verdict a ``Verdict`` (``verdict.py``);
``evaluate_scores`` returns them together as ``Evidence``, which becomes the audit's
``AuditResult`` with its context (``Evidence.result``). How the confidence and the PRIVACY BUG
level are split over the statements is ``levels.py``.

The threshold-based certified methods and the claim test need each canary's (score,
membership) to be an independent draw of the one-canary experiment; when the audit's design
does not give that (``independent``: ``plan.independent_canaries``), their numbers are
reported as estimates under that assumption. What certifies then covers canaries trained
together: the one-run claim test (``one_run_claim_evidence``: the claimed curve, mu_lower and
sigma_upper from the guess-count recursion of Mahloujifar et al., ``stats.one_run``; one more
statement per attack in the Bonferroni split) and the one_run / fdp_one_run_certified epsilon
bounds.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass

import numpy as np

from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.experiment.judging.levels import REFUTATION_LEVEL, split_levels
from dpaudit.experiment.judging.premises import training_data_block
from dpaudit.experiment.judging.user_claim import UserClaim
from dpaudit.experiment.judging.verdict import verdict
from dpaudit.experiment.judging.white_box import count_tests, not_checked, white_box_evidence
from dpaudit.report.results import AuditResult, BoundRow, ClaimRow, Verdict
from dpaudit.stats import epsilon_lower_bound
from dpaudit.stats.bounds import METHOD_REGISTRY
from dpaudit.stats.claim import claim_test, mu_lower_bound, noise_upper_bound
from dpaudit.stats.one_run.claim import (
    claim_counts,
    claim_test_on_table,
    one_run_mu_lower,
    one_run_noise_upper_bound,
)
from dpaudit.stats.one_run.guesses import guess_table
from dpaudit.stats.pld import histogram_pld_epsilon
from dpaudit.stats.roc import SUMMARY_FPRS, roc_summary
from dpaudit.threat_model import ThreatModel

DEFAULT_METHODS = ("clopper_pearson", "one_run", "fdp_one_run_certified", "gdp", "gaussian")
INDEPENDENCE = (
    "canaries' scores independent of each other (one training run whose canaries can "
    "influence each other's scores; only the one_run method covers that dependence)"
)


def split_scores(scores: dict[str, np.ndarray], membership: np.ndarray) -> dict:
    """Attack name -> (scores of members, scores of non-members)."""
    m = np.asarray(membership, dtype=bool)
    return {k: (np.asarray(v)[m], np.asarray(v)[~m]) for k, v in scores.items()}


def check_split(split: dict) -> None:
    """Every attack needs members and non-members: say so before any statistics."""
    for name, (s_in, s_out) in split.items():
        if len(s_in) == 0 or len(s_out) == 0:
            raise ValueError(
                f"attack {name!r} has {len(s_in)} member and {len(s_out)} non-member canaries: "
                "an audit needs both (raise canary.count or audit.runs, or set audit.inclusion "
                "away from 0 and 1)"
            )


def attack_summaries(split: dict) -> dict:
    """AUC and TPR at FPR 0.1% / 1% / 10% of each attack."""
    out = {}
    for name, (s_in, s_out) in split.items():
        out[name] = roc_summary(s_in, s_out, SUMMARY_FPRS)
    return out


def theory_summary(threat: ThreatModel, claim: UserClaim | None = None) -> dict:
    """The claim's numbers for reports: accountants for the threat model, the exact answer
    where known, the claimed epsilon, and what Opacus reports for the training data (the
    user's own accountant first, ``claim``)."""
    acc = threat.accountants()
    out = {
        "threat_model": threat.to_dict(),
        "accountant": threat.accountant_name,
        "accountants": {k: v.to_dict() for k, v in acc.items()},
        "claimed_epsilon": threat.claimed_epsilon(),
    }
    if threat.every_step:
        out["gaussian_mu"] = threat.mu()
        out["gaussian_epsilon"] = threat.exact_epsilon()
    if claim is not None and claim.engine_epsilons:
        eps = claim.epsilon()
        out["training_data"] = {
            "sample_rate": threat.training_sample_rate,
            "accountant": claim.accountant,
            "delta": claim.delta,
            "opacus_epsilon": eps,
            "accountants": claim.engine_epsilons,
            "note": training_note(threat, eps, claim.accountant),
        }
    return out


def training_note(threat: ThreatModel, training_epsilon: float | None,
                  accountant: str = "prv") -> str:
    """How the audited threat model differs from Opacus' epsilon for the training data (by
    the user's ``accountant``)."""
    if training_epsilon is None:
        return ""
    same = (
        threat.training_sample_rate is not None
        and abs(threat.sample_rate - threat.training_sample_rate) < 1e-12
        and threat.sensitivity == 1.0
    )
    if same:
        return (
            f"Opacus' {accountant.upper()} accountant reports epsilon {training_epsilon:.3f} for "
            "the training data; the canaries are inserted like a training example, so that is "
            "the same claim."
        )
    return (
        f"Opacus' {accountant.upper()} accountant reports epsilon {training_epsilon:.3f} for "
        f"the training data (sample rate {threat.training_sample_rate:.4g}); the canaries "
        "realise a different threat model "
        f"({threat.describe()}), whose claimed epsilon is {threat.claimed_epsilon():.3f}: "
        "they are the mechanism's stress test, judged against that claim and reported apart; "
        "the verdict is about the training data's epsilon."
    )


# what epsilon_at_sigma_upper is (threat.estimated_epsilon)
EPS_AT_SIGMA_UPPER_KIND = "estimate (DP-SGD family: same q, T, C; PRV accountant)"
SIGMA_UPPER_FLOOR = 0.5  # effective noise multiplier below which sigma_upper is not resolved


def independence_broken(records: WhiteBoxRecords | None, canary_set: int | None) -> dict | None:
    """The ``IndependenceRecord`` entry of the audited canary set when the data reached its
    canaries' coordinates at some step (None when they stayed out of reach, or nothing was
    watched). ``canary_set``: the hook's set index; None takes every watched set."""
    rec = None if records is None else records.independence
    if rec is None:
        return None
    sets = [s for s in rec.sets if s.get("watched")
            and (canary_set is None or s["set"] == canary_set)]
    live = [s for s in sets if s["live_canaries"] > 0]
    return min(live, key=lambda s: s["first_step"]) if live else None


def independence_sentence(entry: dict) -> str:
    """The verdict's words for canaries the data reached."""
    first = entry["first_live"][0] if entry["first_live"] else {}
    where = (f"{first.get('parameter')}{list(first.get('position', []))}"
             if first else "their coordinates")
    return (f"canary independence: the data's clipped gradient reached {entry['live_canaries']} "
            f"of {entry['canaries']} gradient canaries ({entry['live_coordinates']} "
            f"coordinates; first {where} at step {entry['first_step']}): the statements that "
            "assume independent canaries are withdrawn (reported as estimates; the one-run "
            "methods certify)")


def claim_evidence(
    s_in, s_out, threat: ThreatModel, confidence: float, *, certified: bool = True,
    refutation: float | None = None,
) -> ClaimRow:
    """Claim test, mu_lower and sigma_upper of one attack (certified when ``certified``) at
    ``confidence``; ``refuted``: the test also rejects at ``1 - refutation`` (this
    statement's share of the PRIVACY BUG level; checked only when it rejects at
    ``confidence``, as a smaller error probability can only widen the bounds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        test = claim_test(s_in, s_out, threat.tradeoff, confidence=confidence)
        refuted = bool(test.rejected and refutation is not None and claim_test(
            s_in, s_out, threat.tradeoff, confidence=1.0 - refutation).rejected)
    rows = test.rows
    mu_lb = mu_lower_bound(rows) if test.note == "" else 0.0
    if test.note:
        sigma_ub = float("inf")
    elif threat.every_step:  # GDP family: rejected exactly when mu(sigma) < mu_lower
        sigma_ub = threat.clt_noise_for_mu(mu_lb)
    else:
        family = functools.partial(_family_curve, threat)
        guess = threat.clt_noise_for_mu(mu_lb)
        start = guess if np.isfinite(guess) else threat.noise_multiplier
        # below an effective noise of SIGMA_UPPER_FLOOR the PRV accountant's cost explodes
        # (q = 1/2, T = 48: 1 s at 0.5, 23 s at 0.1, 114 s at 0.05): "at most the floor"
        floor = SIGMA_UPPER_FLOOR * threat.sensitivity
        sigma_ub = noise_upper_bound(rows, family, start, sigma_min=floor)
    return ClaimRow(
        rejected=test.rejected,
        certified=certified,
        mu_lower=mu_lb,
        sigma_upper=sigma_ub,
        noise_multiplier=threat.noise_multiplier,
        epsilon_at_sigma_upper=_epsilon_at(threat, sigma_ub),
        epsilon_at_sigma_upper_kind=EPS_AT_SIGMA_UPPER_KIND,
        test=test.to_dict(),
        refuted=refuted,
        refutation_level=refutation,
    )


def _family_curve(threat: ThreatModel, sigma: float):
    return functools.partial(threat.tradeoff, noise_multiplier=sigma)


ONE_RUN_CLAIM_METHOD = (
    "one-run guess counts (Mahloujifar et al. 2024, Algorithm 3, on the claimed curve): valid "
    "for canaries trained together"
)


def one_run_claim_evidence(
    s_in, s_out, threat: ThreatModel, confidence: float, *, inclusion: float = 0.5,
    refutation: float | None = None,
) -> ClaimRow:
    """Certified claim test, mu_lower and sigma_upper of one attack for canaries trained
    together (``stats.one_run.claim``), at ``confidence`` (``refuted``: also at
    ``1 - refutation``); a ``ClaimRow`` like ``claim_evidence``'s, naming its ``method``, not
    ``applicable`` (with ``error``) when the design is not the fair-coin one the theorem needs
    or there are too few canaries."""
    row = functools.partial(
        ClaimRow, certified=True, method=ONE_RUN_CLAIM_METHOD,
        noise_multiplier=threat.noise_multiplier,
        epsilon_at_sigma_upper_kind=EPS_AT_SIGMA_UPPER_KIND, refutation_level=refutation,
    )
    claim_inverse = threat.roc_inverse
    try:
        base = guess_table(s_in, s_out, method="the one-run claim test", pairs=[],
                           inclusion=inclusion)
    except ValueError as err:
        return row(rejected=False, mu_lower=0.0, sigma_upper=float("inf"),
                   epsilon_at_sigma_upper=None, applicable=False, error=str(err),
                   refuted=False)
    # the claim test's guess count refutes the claimed curve soonest; mu_lower's and
    # sigma_upper's maximises mu_lower when the run is as claimed (stats.one_run.design)
    table = claim_counts(base, 1.0 - confidence, roc_inverse=claim_inverse)
    bounds_table = claim_counts(base, 1.0 - confidence, design_mu=design_mu(threat),
                                roc_inverse=claim_inverse)
    test = claim_test_on_table(table, claim_inverse, confidence)
    refuted = False
    if test.rejected and refutation is not None:
        # the PRIVACY BUG test is a test of its own, its guess count fixed at its own level
        strict = claim_counts(base, refutation, roc_inverse=claim_inverse)
        refuted = claim_test_on_table(strict, claim_inverse, 1.0 - refutation).rejected
    mu_lb = one_run_mu_lower(bounds_table, confidence)
    if mu_lb <= 0:
        sigma_ub = float("inf")
    elif threat.every_step:  # GDP family: refuted exactly when mu(sigma) <= mu_lower
        sigma_ub = threat.clt_noise_for_mu(mu_lb)
    else:
        sigma_ub = one_run_noise_upper_bound(
            bounds_table,
            confidence,
            lambda sigma: functools.partial(threat.roc_inverse, noise_multiplier=sigma),
            threat.clt_noise_for_mu(mu_lb),
            sigma_min=SIGMA_UPPER_FLOOR * threat.sensitivity,
        )
    return row(rejected=test.rejected, mu_lower=mu_lb, sigma_upper=sigma_ub,
               epsilon_at_sigma_upper=_epsilon_at(threat, sigma_ub), test=test.to_dict(),
               applicable=test.n_candidates > 0, error=test.note or None, refuted=refuted)


def design_mu(threat: ThreatModel) -> float | None:
    """The claim's mu, for fixing the one-run guess counts before the scores are seen
    (``stats.one_run.design``): sqrt(T) r / sigma every step, else the CLT's
    q sqrt(T (e^{1/s^2} - 1)), s = sigma / r (None when not finite and positive)."""
    mu = threat.mu()
    if mu is None:
        s = threat.effective_noise()
        with np.errstate(over="ignore"):
            mu = threat.sample_rate * np.sqrt(threat.steps * np.expm1(1.0 / s**2))
    return float(mu) if np.isfinite(mu) and mu > 0 else None


def _epsilon_at(threat: ThreatModel, sigma_ub: float) -> float | None:
    if not (np.isfinite(sigma_ub) and sigma_ub > 0):
        return None
    try:
        return threat.estimated_epsilon(sigma_ub)
    except (ValueError, RuntimeError, OverflowError):
        return float("inf")  # beyond what the accountant can compute


def bound_rows(
    split: dict,
    methods,
    delta: float,
    confidence: float,
    *,
    independent: bool = True,
    inclusion: float = 0.5,
    design_mu: float | None = None,
) -> list[BoundRow]:
    """Every (attack, method) bound at ``confidence`` (already the per-test confidence).

    ``inclusion``: the probability with which each canary (multi-run: each run) was made a
    member, passed to the methods that take it (the one-run methods, whose theorems assume
    that design; a split implausible under it makes their row "not applicable").
    ``design_mu``: the claim's mu, passed to the methods that take it (the recursion's guess
    count fixed by the claim: ``stats.one_run.design``).
    """
    rows = []
    for attack, (s_in, s_out) in split.items():
        for method in methods:
            row = functools.partial(BoundRow, attack=attack, method=method,
                                    confidence=confidence)
            takes_inclusion = "inclusion" in METHOD_REGISTRY[method].options
            opts = {"inclusion": inclusion} if takes_inclusion else {}
            if design_mu is not None and "design_mu" in METHOD_REGISTRY[method].options:
                opts["design_mu"] = design_mu
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res = epsilon_lower_bound(
                        s_in, s_out, delta=delta, confidence=confidence, method=method, **opts
                    )
            except ValueError as err:
                rows.append(row(epsilon=float("nan"), kind="not applicable", valid=False,
                                error=str(err)))
                continue
            assumption = res.assumption
            if (
                assumption is None
                and not independent
                and not METHOD_REGISTRY[method].dependent_ok
            ):
                assumption = INDEPENDENCE
            kind = "certified" if assumption is None else "estimate"
            rows.append(row(
                epsilon=res.epsilon if res.applicable else float("nan"),
                kind=kind if res.applicable else "not applicable",  # e.g. one_run, m delta ~ 1
                valid=res.valid, mu_lower=res.mu_lower, assumption=assumption,
                result=res.to_dict(), error=None if res.applicable else res.note,
            ))
    return rows


PLD_ASSUMPTION = (
    "per-step scores i.i.d. across steps: histogram PLD of one step (members vs non-members, "
    "pooled over steps) composed T times (Koskela & Mohammadi, Sec. 9.2; no confidence)"
)


def pld_estimates(per_step: dict | None, delta: float) -> dict[str, dict]:
    """The per-step histogram PLD estimate of each attack (seed 002, Sec. 9.2), reported next
    to the accountants.

    Each attack's per-step scores, members against non-members pooled over the T steps, give
    one step's histogram privacy-loss distribution; composed T times (FFT) it gives an
    estimated epsilon at ``delta`` (``stats.pld.histogram_pld_epsilon``). An estimate under
    ``PLD_ASSUMPTION``, with no confidence attached (its histogram and grid rounding lean
    upwards): it is shown beside the accountants, never in the bounds or the verdict.
    """
    out = {}
    for attack, (s_in, s_out) in (per_step or {}).items():
        s_in, s_out = np.asarray(s_in), np.asarray(s_out)
        if s_in.ndim != 2 or s_in.size == 0 or s_out.size == 0:
            continue
        steps = s_in.shape[1]
        row = {"kind": "estimate", "assumption": PLD_ASSUMPTION, "steps": steps,
               "per_step_scores": [int(s_in.size), int(s_out.size)]}
        try:
            row["epsilon"] = float(
                histogram_pld_epsilon(s_in.ravel(), s_out.ravel(), delta=delta, steps=steps)
            )
        except ValueError as err:
            row.update(epsilon=None, error=str(err))
        out[attack] = row
    return out


@dataclass(frozen=True)
class LowerInput:
    """The scores of canaries inserted like an example (members, non-members) and their
    ``ThreatModel`` (realising the training data's): the lower side's input."""

    scores_in: np.ndarray
    scores_out: np.ndarray
    threat: ThreatModel
    history: tuple | None = None  # the user's accountant's: the claim tested

    def evaluate(self, confidence: float, refutation: float) -> dict:
        """``lower_side.data_rate_lower_side`` of these scores."""
        from dpaudit.experiment.judging.lower_side import data_rate_lower_side

        return data_rate_lower_side(self.scores_in, self.scores_out, self.threat,
                                    confidence=confidence, refutation_level=refutation,
                                    history=self.history)


@dataclass(frozen=True)
class Evidence:
    """What ``evaluate_scores`` establishes, typed: the attacks' ROC summaries, the claim tests
    (``ClaimRow`` per attack; ``one_run_claim`` for canaries trained together), the bounds
    (``BoundRow`` s), the theory (the threat model and its accountants), the white-box checks,
    how the confidence was split, whether the canaries are independent, and the ``Verdict``."""

    attacks: dict
    claim: dict[str, ClaimRow]
    one_run_claim: dict[str, ClaimRow]
    bounds: tuple[BoundRow, ...]
    theory: dict
    white_box: dict
    per_test_confidence: float
    refutation_per_statement: float
    independent_canaries: bool
    verdict: Verdict

    def result(self, **context) -> AuditResult:
        """The ``AuditResult`` of this evidence with its ``context`` (``settings``,
        ``audit_mode``, ``steps``, ...: ``AuditResult``'s fields; other keys go to its
        ``extra``, as ``wall_seconds`` does)."""
        names = {f.name for f in dataclasses.fields(AuditResult)} - {"extra"}
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        known = {k: v for k, v in context.items() if k in names}
        extra = {k: v for k, v in context.items() if k not in names}
        return AuditResult(**own, **known, extra=extra)


def evaluate_scores(
    split: dict,
    threat: ThreatModel,
    *,
    methods,
    confidence: float = 0.95,
    independent: bool = True,
    claim: UserClaim | None = None,
    inclusion: float = 0.5,
    white_box: WhiteBoxRecords | None = None,
    white_box_reason: str | None = None,
    per_step: dict | None = None,
    refutation_level: float = REFUTATION_LEVEL,
    canary_set: int | None = None,
    canary_notes: list[str] | None = None,
    lower: LowerInput | None = None,
) -> Evidence:
    """Attack summaries, claim evidence, bounds, theory, white-box checks, the training data's
    epsilon (``premises``) and the verdict.

    Args:
        split: attack name -> (member scores, non-member scores).
        threat: the audit's ``ThreatModel`` (the claim under test).
        methods: names of ``epsilon_lower_bound`` methods to report.
        confidence: the bounds' confidence; split over every statement (``levels``).
        independent: whether canaries' scores are independent one-canary experiments.
        claim: the user's claim about the training data (``user_claim.UserClaim``: their
            accountant, its history, their delta); the verdict is about it. None: no claim
            about training data (raw scores and a threat model).
        inclusion: the probability with which each canary was made a member (the one-run
            methods' design; see ``bound_rows``).
        white_box: the run's ``WhiteBoxRecords`` for the white-box checks
            (``experiment.judging.white_box``); None: not run, and ``white_box_reason`` says
            why in the report.
        per_step: attack name -> (members' (K_in, T), non-members' (K_out, T)) per-step
            scores, for the per-step histogram PLD estimate (``pld_estimates``).
        refutation_level: the PRIVACY BUG verdict's failure probability, split over the
            statements that can refute the claim (``levels``); in (0, 1 - confidence].
        canary_set: the index of the audited canary set in the hook (its independence record
            is read); None: every watched set.
        canary_notes: what the audit's own set-up changed (canaries dropped), each reported
            as a warning about the canaries.
        lower: the scores of canaries inserted like an example beside the audited ones (the
            hook's default second set): the lower side of the user's epsilon and a claim test
            of it (``lower_side``), one more refuting statement.
    """
    check_split(split)
    broken = independence_broken(white_box, canary_set) if independent else None
    if broken is not None:  # the premise failed: what assumed it is withdrawn
        independent = False
    methods = list(methods)
    n_white = count_tests(white_box)
    levels = split_levels(confidence, refutation_level, attacks=len(split), methods=len(methods),
                          one_run_claims=0 if independent else len(split),
                          white_box_tests=n_white, lower_side_tests=int(lower is not None))
    per, refute_each = levels.per_statement, levels.refute_each
    claims = {
        name: claim_evidence(s_in, s_out, threat, per, certified=independent,
                             refutation=refute_each)
        for name, (s_in, s_out) in split.items()
    }
    one_run_claims = {
        name: one_run_claim_evidence(s_in, s_out, threat, per, inclusion=inclusion,
                                     refutation=refute_each)
        for name, (s_in, s_out) in split.items()
        if not independent
    }
    bounds = bound_rows(
        split, methods, threat.delta, per, independent=independent, inclusion=inclusion,
        design_mu=design_mu(threat),
    )
    theory = theory_summary(threat, claim)
    theory["histogram_pld"] = pld_estimates(per_step, threat.delta)
    checks = white_box_evidence(white_box, level=refute_each, warning_level=levels.warn_each,
                                delta=threat.delta)
    unchecked = not_checked(white_box, independent, white_box_reason)
    lower_block = None if lower is None else lower.evaluate(confidence, refute_each)
    training_data = training_data_block(
        white_box, checks, claim, threat=threat, bounds=bounds,
        confidence=confidence, reason=white_box_reason, unchecked=unchecked,
        lower=lower_block)
    white = {
        "checks": {k: c.to_dict() for k, c in checks.items()},
        "statistical_tests": n_white,
        "not_checked": unchecked,
    }
    if white_box is not None and white_box.independence is not None:
        white["canary_independence"] = {"steps": white_box.independence.steps,
                                        "sets": white_box.independence.sets,
                                        "withdrawn": broken is not None}
    return Evidence(
        attacks=attack_summaries(split),
        claim=claims,
        one_run_claim=one_run_claims,
        bounds=tuple(bounds),
        theory=theory,
        white_box=white,
        per_test_confidence=per,
        refutation_per_statement=refute_each,
        independent_canaries=independent,
        verdict=verdict(
            bounds, claims, threat, confidence, theory.get("training_data"), checks,
            one_run_claims, refutation_level=levels.refutation_level,
            training_data=training_data,
            premise_warnings=([] if broken is None else [independence_sentence(broken)])
            + list(canary_notes or []),
        ),
    )
