"""From per-canary scores to evidence and a verdict (DESIGN 3 steps 5-6, DESIGN 4.5).

Two kinds of evidence, never mixed up:

* **certified** (valid whatever the scores' distribution, at the stated confidence): the
  claim test of the threat model's trade-off curve, the statement "not mu-GDP for any
  mu < mu_lower", the effective-noise bound sigma_upper, and the certified epsilon bounds
  (Clopper-Pearson, one-run, density);
* **estimates** under a named model (gdp, gaussian, density_tv, fdp_one_run, and the
  accountant's epsilon at sigma_upper for the subsampled case).

All certified bounds of an audit hold *simultaneously*: the failure probability
1 - confidence is split evenly (Bonferroni) over every (attack, method) pair and every attack's
claim test (and one-run claim test), so the bounds' confidence is the stated one. Estimates are
computed at the same per-test confidence so they can be compared. The white-box tests are a
family of their own (``white_box``): no bound rests on them.

A PRIVACY BUG must be beyond doubt: a gate that fails one correct run in twenty is switched
off, while real bugs leave p-values many orders smaller. So the statements that can refute the
claim (each attack's claim test, the one-run claim tests, the white-box checks) are also judged
at their own, much smaller failure probability ``refutation_level`` (1e-6 by default), split
evenly over them. Only a refutation at that level makes the verdict ``privacy_bug``; evidence
at the bounds' level but not at the refutation level (a claim test or a white-box check
rejecting at 95% only, a certified epsilon above the claim) is a warning in the verdict
(``warnings``), named with its p-value or level.

The threshold-based certified methods and the claim test need each canary's (score,
membership) to be an independent draw of the one-canary experiment; when the audit's design
does not give that (``independent``, from the trainings wing's
``threat.independent_canaries``), their numbers are reported
as estimates under that assumption. What certifies then covers canaries trained together: the
one-run claim test (``one_run_claim_evidence``: the claimed curve, mu_lower and sigma_upper
from the guess-count recursion of Mahloujifar et al., ``stats.one_run``; one more
statement per attack in the Bonferroni split) and the one_run / fdp_one_run_certified epsilon
bounds.

Verdict: ``privacy_bug`` only when certified evidence rejects the claim;
``estimate_above_claim`` when only an estimate exceeds it; ``consistent`` otherwise.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.experiment.judging.white_box import (
    count_tests,
    describe,
    fired,
    not_checked,
    warned,
    white_box_evidence,
)
from dpaudit.report.results import CONSISTENT, ESTIMATE_ABOVE_CLAIM, PRIVACY_BUG
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
REFUTATION_LEVEL = 1e-6  # the PRIVACY BUG verdict's failure probability (module doc)
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


def theory_summary(threat: ThreatModel, training_accountants: dict | None = None) -> dict:
    """The claim's numbers for reports: accountants for the threat model, the exact answer
    where known, the claimed epsilon, and what Opacus reports for the training data."""
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
    if training_accountants:
        prv = training_accountants.get("prv", {})
        eps = prv.get("epsilon") if isinstance(prv, dict) else getattr(prv, "epsilon", None)
        out["training_data"] = {
            "sample_rate": threat.training_sample_rate,
            "opacus_epsilon": eps,
            "accountants": training_accountants,
            "note": training_note(threat, eps),
        }
    return out


def training_note(threat: ThreatModel, training_epsilon: float | None) -> str:
    """How the audited threat model differs from Opacus' epsilon for the training data."""
    if training_epsilon is None:
        return ""
    same = (
        threat.training_sample_rate is not None
        and abs(threat.sample_rate - threat.training_sample_rate) < 1e-12
        and threat.sensitivity == 1.0
    )
    if same:
        return (
            f"Opacus reports epsilon {training_epsilon:.3f} for the training data; the canaries "
            "are inserted like a training example, so that is the same claim."
        )
    return (
        f"Opacus reports epsilon {training_epsilon:.3f} for the training data (sample rate "
        f"{threat.training_sample_rate:.4g}); the canaries realise a different threat model "
        f"({threat.describe()}), whose claimed epsilon is {threat.claimed_epsilon():.3f}: the "
        "verdict tests that claim, not the training data's."
    )


def per_test_confidence(
    confidence: float, n_attacks: int, n_methods: int, extra: int = 0
) -> float:
    """Bonferroni: the confidence of each of the n_attacks x (n_methods + 1) statements, plus
    ``extra`` (the one-run claim tests)."""
    return 1.0 - (1.0 - confidence) / max(1, n_attacks * (n_methods + 1) + extra)


# what epsilon_at_sigma_upper is (threat.estimated_epsilon)
EPS_AT_SIGMA_UPPER_KIND = "estimate (DP-SGD family: same q, T, C; PRV accountant)"
SIGMA_UPPER_FLOOR = 0.5  # effective noise multiplier below which sigma_upper is not resolved


def claim_evidence(
    s_in, s_out, threat: ThreatModel, confidence: float, *, certified: bool = True,
    refutation: float | None = None,
) -> dict:
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
    eps_at = _epsilon_at(threat, sigma_ub)
    return {
        "test": test.to_dict(),
        "rejected": test.rejected,
        "refuted": refuted,
        "refutation_level": refutation,
        "certified": certified,
        "mu_lower": mu_lb,
        "sigma_upper": sigma_ub,
        "noise_multiplier": threat.noise_multiplier,
        "epsilon_at_sigma_upper": eps_at,
        "epsilon_at_sigma_upper_kind": EPS_AT_SIGMA_UPPER_KIND,
    }


def _family_curve(threat: ThreatModel, sigma: float):
    return functools.partial(threat.tradeoff, noise_multiplier=sigma)


ONE_RUN_CLAIM_METHOD = (
    "one-run guess counts (Mahloujifar et al. 2024, Algorithm 3, on the claimed curve): valid "
    "for canaries trained together"
)


def one_run_claim_evidence(
    s_in, s_out, threat: ThreatModel, confidence: float, *, inclusion: float = 0.5,
    refutation: float | None = None,
) -> dict:
    """Certified claim test, mu_lower and sigma_upper of one attack for canaries trained
    together (``stats.one_run.claim``), at ``confidence`` (``refuted``: also at
    ``1 - refutation``); the same keys as ``claim_evidence`` plus ``applicable`` (False, with
    ``error``, when the design is not the fair-coin one the theorem needs or there are too
    few canaries)."""
    base_row = {
        "certified": True,
        "method": ONE_RUN_CLAIM_METHOD,
        "noise_multiplier": threat.noise_multiplier,
        "epsilon_at_sigma_upper_kind": EPS_AT_SIGMA_UPPER_KIND,
    }
    claim_inverse = threat.roc_inverse
    try:
        base = guess_table(s_in, s_out, method="the one-run claim test", pairs=[],
                           inclusion=inclusion)
    except ValueError as err:
        return {**base_row, "applicable": False, "error": str(err), "rejected": False,
                "refuted": False, "refutation_level": refutation,
                "mu_lower": 0.0, "sigma_upper": float("inf"), "epsilon_at_sigma_upper": None}
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
    return {
        **base_row,
        "applicable": test.n_candidates > 0,
        "error": test.note or None,
        "test": test.to_dict(),
        "rejected": test.rejected,
        "refuted": refuted,
        "refutation_level": refutation,
        "mu_lower": mu_lb,
        "sigma_upper": sigma_ub,
        "epsilon_at_sigma_upper": _epsilon_at(threat, sigma_ub),
    }


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
) -> list[dict]:
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
            row = {"attack": attack, "method": method, "confidence": confidence}
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
                assumption = res.assumption
                if (
                    assumption is None
                    and not independent
                    and not METHOD_REGISTRY[method].dependent_ok
                ):
                    assumption = INDEPENDENCE
                row.update(
                    epsilon=res.epsilon,
                    valid=res.valid,
                    mu_lower=res.mu_lower,
                    kind="certified" if assumption is None else "estimate",
                    assumption=assumption,
                    result=res.to_dict(),
                )
                if not res.applicable:  # e.g. one_run with m*delta not << 1: not evidence
                    row.update(epsilon=float("nan"), kind="not applicable", error=res.note)
            except ValueError as err:
                row.update(
                    epsilon=float("nan"), valid=False, kind="not applicable", error=str(err)
                )
            rows.append(row)
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


def evaluate_scores(
    split: dict,
    threat: ThreatModel,
    *,
    methods,
    confidence: float = 0.95,
    independent: bool = True,
    training_accountants: dict | None = None,
    inclusion: float = 0.5,
    white_box: WhiteBoxRecords | None = None,
    white_box_reason: str | None = None,
    per_step: dict | None = None,
    refutation_level: float = REFUTATION_LEVEL,
) -> dict:
    """Attack summaries, claim evidence, bounds, theory, white-box checks and the verdict.

    Args:
        split: attack name -> (member scores, non-member scores).
        threat: the audit's ``ThreatModel`` (the claim under test).
        methods: names of ``epsilon_lower_bound`` methods to report.
        confidence: the bounds' confidence; split over every statement (module doc).
        independent: whether canaries' scores are independent one-canary experiments.
        training_accountants: Opacus' epsilons for the training data (reported beside).
        inclusion: the probability with which each canary was made a member (the one-run
            methods' design; see ``bound_rows``).
        white_box: the run's ``WhiteBoxRecords`` for the white-box checks
            (``experiment.judging.white_box``); None: not run, and ``white_box_reason`` says
            why in the report.
        per_step: attack name -> (members' (K_in, T), non-members' (K_out, T)) per-step
            scores, for the per-step histogram PLD estimate (``pld_rows``).
        refutation_level: the PRIVACY BUG verdict's failure probability, split over the
            statements that can refute the claim (module doc); in (0, 1 - confidence].
    """
    check_split(split)
    refutation_level = check_refutation_level(refutation_level, confidence)
    methods = list(methods)
    n_white = count_tests(white_box)
    n_one_run = 0 if independent else len(split)  # the one-run claim test, one per attack
    per = per_test_confidence(confidence, len(split), len(methods), n_one_run)
    refute_each = refutation_level / max(1, len(split) + n_one_run + n_white)
    # the white-box tests are no bound: judged at their share of the refutation level, they
    # warn at their share of the bounds' failure probability, as a family of their own
    warn_each = (1.0 - confidence) / max(1, n_white)
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

    theory = theory_summary(threat, training_accountants)
    theory["histogram_pld"] = pld_estimates(per_step, threat.delta)
    checks = white_box_evidence(white_box, level=refute_each, warning_level=warn_each)
    return {
        "attacks": attack_summaries(split),
        "claim": claims,
        "one_run_claim": one_run_claims,
        "bounds": bounds,
        "theory": theory,
        "white_box": {
            "checks": {k: c.to_dict() for k, c in checks.items()},
            "statistical_tests": n_white,
            "not_checked": not_checked(white_box, independent, white_box_reason),
        },
        "per_test_confidence": per,
        "refutation_per_statement": refute_each,
        "independent_canaries": independent,
        "verdict": verdict(
            bounds, claims, threat, confidence, theory.get("training_data"), checks,
            one_run_claims, refutation_level=refutation_level,
        ),
    }


def check_refutation_level(level: float, confidence: float) -> float:
    """The PRIVACY BUG level: a number in (0, 1 - confidence] (it may not be weaker than the
    bounds' own failure probability), else a ValueError naming it."""
    if (isinstance(level, bool) or not isinstance(level, (int, float))
            or not 0.0 < float(level) <= 1.0 - confidence + 1e-12):
        raise ValueError(
            "refutation_level (audit.refutation_level) is the PRIVACY BUG verdict's failure "
            f"probability: a number in (0, 1 - confidence] = (0, {1.0 - confidence:.3g}], "
            f"got {level!r}"
        )
    return float(level)


def _best(rows: list[dict], kind: str) -> dict | None:
    ok = [b for b in rows if b.get("kind") == kind and b["valid"] and np.isfinite(b["epsilon"])]
    return max(ok, key=lambda b: b["epsilon"], default=None)


def verdict(
    bounds: list[dict],
    claims: dict,
    threat: ThreatModel,
    confidence: float,
    training: dict | None = None,
    white_box: dict | None = None,
    one_run_claims: dict | None = None,
    *,
    refutation_level: float = REFUTATION_LEVEL,
) -> dict:
    """Three states (module doc), naming the threat model and the accountant compared with.

    ``white_box``: name -> ``CheckResult`` (``experiment.judging.white_box``); one that
    refutes the claim at its share of ``refutation_level`` is certified evidence and makes the
    verdict a privacy bug, named in the message; one whose evidence only reaches the bounds'
    level is a warning. ``one_run_claims``: attack -> ``one_run_claim_evidence`` (canaries
    trained together), named "<attack> (one-run)" in the verdict. sigma_upper is the smallest
    certified one when any is finite, else the smallest estimate."""
    claimed = threat.claimed_epsilon()
    cert, est = _best(bounds, "certified"), _best(bounds, "estimate")
    cert_eps = cert["epsilon"] if cert else 0.0
    est_eps = est["epsilon"] if est else 0.0
    evidence = dict(claims)
    evidence.update({f"{a} (one-run)": c for a, c in (one_run_claims or {}).items()})
    refuted_by = [a for a, c in evidence.items() if c.get("refuted") and c["certified"]]
    rejected_only = [a for a, c in evidence.items()
                     if c["rejected"] and c["certified"] and not c.get("refuted")]
    est_rejected = [a for a, c in evidence.items() if c["rejected"] and not c["certified"]]
    sigma_ubs = {a: c["sigma_upper"] for a, c in evidence.items()}
    certified_sigmas = {
        a: v for a, v in sigma_ubs.items() if evidence[a]["certified"] and np.isfinite(v)
    }
    pool = certified_sigmas or sigma_ubs
    best_sigma_attack = min(pool, key=pool.get) if pool else None
    sigma_ub = sigma_ubs[best_sigma_attack] if best_sigma_attack else float("inf")
    sigma_certified = bool(best_sigma_attack and evidence[best_sigma_attack]["certified"])
    white_box = white_box or {}
    white_fired, white_warned = fired(white_box), warned(white_box)
    if refuted_by or white_fired:
        status = PRIVACY_BUG
    elif est_eps > claimed or est_rejected:
        status = ESTIMATE_ABOVE_CLAIM
    else:
        status = CONSISTENT
    level_words = f"PRIVACY BUG level {refutation_level:.2g}"
    warnings_ = [describe(white_box[k]) for k in white_warned]
    warnings_ += [
        f"the {a} attack's claim test rejects the claimed curve at {confidence:.0%} but not "
        f"at the {level_words}" for a in rejected_only
    ]
    if cert_eps > claimed:
        warnings_.append(
            f"certified epsilon >= {cert_eps:.3f} ({cert['attack']}/{cert['method']}) exceeds "
            f"the claimed {claimed:.3f} at {confidence:.0%}"
            + ("" if status == PRIVACY_BUG else f"; no statement refutes the claim at the "
               f"{level_words}")
        )
    where = f"{threat.describe()}; claim: {threat.accountant_name}, epsilon {claimed:.3f}"
    noise = (
        f"effective noise multiplier <= {sigma_ub:.4g} (configured {threat.noise_multiplier:g}"
        f"{'' if sigma_certified else ', estimate'})"
        if np.isfinite(sigma_ub)
        else "no upper bound on the effective noise"
    )
    if status == PRIVACY_BUG:
        reasons = [describe(white_box[k]) for k in white_fired]
        if refuted_by:
            reasons.append(
                f"the {', '.join(refuted_by)} attack's error rates fall below the claimed "
                "trade-off curve"
            )
        why = "; ".join(reasons)
        message = (f"PRIVACY BUG (failure probability {refutation_level:.2g}): {why}; "
                   f"{noise}. [{where}]")
    elif status == ESTIMATE_ABOVE_CLAIM:
        what = (
            f"estimate {est_eps:.3f} ({est['attack']}/{est['method']}, assumes "
            f"{est['assumption']})"
            if est_eps > claimed
            else f"the claim test of {', '.join(est_rejected)} (assumes independent canaries)"
        )
        message = (
            f"ESTIMATE ABOVE CLAIM (not certified): {what} exceeds the claim, but no certified "
            f"evidence rejects it at {confidence:.0%}; {noise}. [{where}]"
        )
    else:
        certified = (
            f"certified epsilon >= {cert_eps:.3f}"
            if cert
            else "no certified epsilon bound applies: every bound here is an estimate or not "
            "applicable (canaries that are not independent certify only through the one-run "
            "methods)"
        )
        message = (
            f"consistent: no certified evidence refutes the claim at the {level_words} "
            f"({certified} at {confidence:.0%}, best estimate {est_eps:.3f} vs claimed "
            f"{claimed:.3f}); {noise}. [{where}]"
        )
    if warnings_ and status != PRIVACY_BUG:
        message += " WARNING (evidence short of a PRIVACY BUG): " + "; ".join(warnings_) + "."
    return {
        "status": status,
        "privacy_bug": status == PRIVACY_BUG,
        "message": message,
        "confidence": confidence,
        "refutation_level": refutation_level,
        "threat_model": threat.describe(),
        "accountant": threat.accountant_name,
        "claimed_epsilon": claimed,
        "best_lower_bound": cert_eps,
        "certified_bound_applies": cert is not None,
        "best_attack": cert["attack"] if cert else None,
        "best_method": cert["method"] if cert else None,
        "ratio": cert_eps / claimed if claimed > 0 else float("nan"),
        "best_estimate": est_eps,
        "estimate_attack": est["attack"] if est else None,
        "estimate_method": est["method"] if est else None,
        "estimate_assumption": est["assumption"] if est else None,
        "estimate_ratio": est_eps / claimed if claimed > 0 else float("nan"),
        "claim_rejected_by": refuted_by,
        "white_box_fired": white_fired,
        "white_box_warned": white_warned,
        "warnings": warnings_,
        "claim_rejected_uncertified": est_rejected,
        "sigma_upper": sigma_ub,
        "sigma_upper_attack": best_sigma_attack,
        "sigma_upper_certified": sigma_certified,
        "noise_multiplier": threat.noise_multiplier,
        "training_data_note": (training or {}).get("note", ""),
    }
