"""The verdict of an audit: about the user's claim, its message and the canaries' stress test
(DESIGN 4.5, "the claim as the user made it" and "Verdict").

The status, the report's title and colour, the console's first line and the CLI's exit code
belong to the user's claim about their training data (``user_claim.UserClaim``: their
accountant, history and delta), four states, worst first:

* ``privacy_bug``: certified evidence refutes it at the PRIVACY BUG level: a refuted premise
  or white-box door (the mechanism the accountant composes is not the one that ran), a claim
  test in the user's threat model, or the every-step canaries' claim test (it refutes the
  mechanism the user's epsilon rests on);
* ``estimate_above_claim``: only an estimate (or an uncertified claim test) exceeds it;
* ``not_verified``: a premise of the user's epsilon could not be observed (named, with how to
  observe it): the upper side is not verified, whatever else holds;
* ``consistent``: every premise measured, nothing refutes it.

The message's first paragraph is the user's claim in plain words: the epsilon they read, at
their delta (or dpaudit's, said), its bracket, and the cause of a finding first; at most a
few hundred characters for a verified, consistent run. Canaries of another threat model (the
every-step canaries, q = 1 composition: a strong test of the mechanism that says nothing from
below about the user's epsilon) are the *stress test*: a section of their own
(``Verdict.stress_test``) with their own claim and numbers, never in a sentence with the
user's epsilon. Without a claim about training data (scores passed with a threat model
only), the verdict is the canaries' own, as before schema 6.
"""

from __future__ import annotations

import numpy as np

from dpaudit.experiment.judging.claim_words import bracket_words, claim_head, sentence_case
from dpaudit.experiment.judging.levels import REFUTATION_LEVEL
from dpaudit.experiment.judging.white_box import describe, fired, warned
from dpaudit.report.numbers import level as level_words
from dpaudit.report.numbers import lower, point, upper
from dpaudit.report.results import (
    CONSISTENT,
    ESTIMATE_ABOVE_CLAIM,
    NOT_VERIFIED,
    PRIVACY_BUG,
    BoundRow,
    ClaimRow,
    Verdict,
)
from dpaudit.threat_model import ThreatModel

# the checks whose failure is the cause of what the others then see: said first
CAUSES = ("loader_fed_training",)


def best(rows: list[BoundRow], kind: str) -> BoundRow | None:
    """The valid finite row of ``kind`` with the largest epsilon (None when there is none)."""
    ok = [b for b in rows if b.kind == kind and b.valid and np.isfinite(b.epsilon)]
    return max(ok, key=lambda b: b.epsilon, default=None)


def realises_training(threat: ThreatModel) -> bool:
    """Whether the canaries are inserted like a training example (Poisson at the data's
    rate, norm C): then their evidence is about the user's claim itself."""
    q = threat.training_sample_rate
    return (q is not None and abs(threat.sample_rate - q) <= 1e-12 * max(1.0, q)
            and threat.sensitivity == 1.0)


def verdict(
    bounds: list[BoundRow],
    claims: dict[str, ClaimRow],
    threat: ThreatModel,
    confidence: float,
    training: dict | None = None,
    white_box: dict | None = None,
    one_run_claims: dict[str, ClaimRow] | None = None,
    *,
    refutation_level: float = REFUTATION_LEVEL,
    training_data: dict | None = None,
    premise_warnings: list[str] | None = None,
) -> Verdict:
    """The verdict (module doc).

    Args:
        bounds / claims / one_run_claims: the audited canaries' evidence (``BoundRow`` s,
            attack -> ``ClaimRow``; ``one_run_claims`` for canaries trained together, named
            "<attack> (one-run)").
        threat: the canaries' ``ThreatModel``.
        confidence: the bounds' confidence.
        training: the theory's training-data entry (its ``note``).
        white_box: name -> ``CheckResult``: one that refutes at its share of
            ``refutation_level`` makes a PRIVACY BUG; one at the bounds' level only warns.
        refutation_level: the PRIVACY BUG verdict's failure probability.
        training_data: the user's claim, bracketed (``premises.training_data_block``); None:
            no claim about training data, and the verdict is the canaries' own.
        premise_warnings: premises of the audit itself that failed (canaries the data
            reached), each a warning.
    """
    claimed = threat.claimed_epsilon()
    cert, est = best(bounds, "certified"), best(bounds, "estimate")
    cert_eps = cert.epsilon if cert else 0.0
    est_eps = est.epsilon if est else 0.0
    evidence = dict(claims)
    evidence.update({f"{a} (one-run)": c for a, c in (one_run_claims or {}).items()})
    refuted_by = [a for a, c in evidence.items() if c.refuted and c.certified]
    rejected_only = [a for a, c in evidence.items()
                     if c.rejected and c.certified and not c.refuted]
    est_rejected = [a for a, c in evidence.items() if c.rejected and not c.certified]
    sigma_ubs = {a: c.sigma_upper for a, c in evidence.items()}
    certified_sigmas = {
        a: v for a, v in sigma_ubs.items() if evidence[a].certified and np.isfinite(v)
    }
    pool = certified_sigmas or sigma_ubs
    best_sigma_attack = min(pool, key=pool.get) if pool else None
    sigma_ub = sigma_ubs[best_sigma_attack] if best_sigma_attack else float("inf")
    sigma_certified = bool(best_sigma_attack and evidence[best_sigma_attack].certified)
    white_box = white_box or {}
    white_fired, white_warned = fired(white_box), warned(white_box)
    canaries_status = _canaries_status(refuted_by, rejected_only, est_eps > claimed,
                                       est_rejected)
    data_lower = (training_data or {}).get("lower") or {}  # not ``lower``: the rounding
    lower_test = data_lower.get("claim_test") or {}
    if refuted_by or white_fired or data_lower.get("refuted"):
        status = PRIVACY_BUG
    elif est_eps > claimed or est_rejected:
        status = ESTIMATE_ABOVE_CLAIM
    elif training_data is not None and training_data.get("upper_status") != "verified":
        status = NOT_VERIFIED
    else:
        status = CONSISTENT
    bug_level = level_words(failure=refutation_level)
    canary_warnings = list(premise_warnings or [])
    canary_warnings += [
        f"the {a} attack's claim test rejects the claimed curve at {level_words(confidence)} "
        f"but not at the PRIVACY BUG level ({bug_level})" for a in rejected_only
    ]
    if cert_eps > claimed:
        canary_warnings.append(
            f"certified epsilon >= {lower(cert_eps)} ({cert.attack}/{cert.method}) exceeds "
            f"the canaries' claimed {point(claimed)} at {level_words(confidence)}")
    warnings_ = [describe(white_box[k]) for k in white_warned] + canary_warnings
    if lower_test.get("rejected") and not data_lower.get("refuted"):
        warnings_.append(
            f"the canaries inserted like an example reject your claimed curve at "
            f"{level_words(confidence)} (p = {lower_test['p_value']:.2g}) but not at the PRIVACY "
            f"BUG level ({bug_level})")
    canary_message = _canary_message(
        canaries_status, threat, confidence, refutation_level, cert, est, claimed,
        refuted_by, est_rejected, sigma_ub, sigma_certified, training_data, canary_warnings)
    stress = None
    if training_data is not None and not realises_training(threat):
        stress = {
            "role": "the mechanism's stress test: canaries of another threat model than the "
                    "training data's, whose claim is not your epsilon",
            "status": canaries_status, "message": canary_message,
            "threat_model": threat.describe(), "accountant": threat.accountant_name,
            "claimed_epsilon": claimed, "certified_epsilon": cert_eps,
            "estimate": est_eps, "sigma_upper": sigma_ub,
            "sigma_upper_certified": sigma_certified,
            "noise_multiplier": threat.noise_multiplier,
            "refuted_by": refuted_by, "warnings": canary_warnings,
        }
    if training_data is None:  # no claim about training data: the canaries' verdict
        message = _legacy_message(status, canary_message, white_box, white_fired,
                                  refutation_level, warnings_)
    else:
        message = claim_paragraph(status, training_data, white_box, white_fired,
                                  refuted_by, stress is not None, est, claimed, est_rejected,
                                  refutation_level)
        training_data = {**training_data, "sentence": message}
        if stress is None:  # the canaries realise the training data's threat model: their
            # own claim test is about the user's claim, kept beside its lower side
            training_data["lower"] = {**(training_data.get("lower") or {}),
                                      "canaries": canary_message}
    return Verdict(
        status=status,
        privacy_bug=status == PRIVACY_BUG,
        message=message,
        confidence=confidence,
        refutation_level=refutation_level,
        threat_model=threat.describe(),
        accountant=threat.accountant_name,
        claimed_epsilon=claimed,
        best_lower_bound=cert_eps,
        certified_bound_applies=cert is not None,
        best_attack=cert.attack if cert else None,
        best_method=cert.method if cert else None,
        ratio=cert_eps / claimed if claimed > 0 else float("nan"),
        best_estimate=est_eps,
        estimate_attack=est.attack if est else None,
        estimate_method=est.method if est else None,
        estimate_assumption=est.assumption if est else None,
        estimate_ratio=est_eps / claimed if claimed > 0 else float("nan"),
        claim_rejected_by=refuted_by,
        white_box_fired=white_fired,
        white_box_warned=white_warned,
        warnings=warnings_,
        claim_rejected_uncertified=est_rejected,
        sigma_upper=sigma_ub,
        sigma_upper_attack=best_sigma_attack,
        sigma_upper_certified=sigma_certified,
        noise_multiplier=threat.noise_multiplier,
        training_data_note=(training or {}).get("note", ""),
        training_data=training_data,
        claim=None if training_data is None else training_data.get("claim"),
        verified=(None if training_data is None
                  else training_data.get("upper_status") == "verified"),
        stress_test=stress,
    )


def _canaries_status(refuted_by, rejected_only, estimate_above, est_rejected) -> str:
    """The canaries' own finding about their own claim, in words."""
    if refuted_by:
        return "refuted"
    if estimate_above or est_rejected:
        return "estimate above its claim"
    if rejected_only:
        return "rejected short of the PRIVACY BUG level"
    return "consistent"


def _canary_message(status, threat, confidence, refutation_level, cert, est, claimed,
                    refuted_by, est_rejected, sigma_ub, sigma_certified, training_data,
                    warnings_) -> str:
    """The canaries' own verdict about their own claim, in one paragraph."""
    conf = level_words(confidence)
    where = (f"{threat.describe()}; claim: {threat.accountant_name}, epsilon "
             f"{point(claimed)}")
    noise = (
        f"effective noise multiplier <= {upper(sigma_ub)} (configured "
        f"{threat.noise_multiplier:g}{'' if sigma_certified else ', estimate'})"
        if np.isfinite(sigma_ub)
        else "no upper bound on the effective noise"
    )
    if status == "refuted":
        text = (f"REFUTED ({level_words(failure=refutation_level)}): the "
                f"{', '.join(refuted_by)} attack's error rates fall below the claimed "
                f"trade-off curve; {noise}")
    elif status == "estimate above its claim":
        est_eps = est.epsilon if est else 0.0
        what = (f"estimate {point(est_eps)} ({est.attack}/{est.method}, assumes "
                f"{est.assumption})" if est is not None and est_eps > claimed
                else f"the claim test of {', '.join(est_rejected)} (assumes independent "
                "canaries)")
        text = (f"ESTIMATE ABOVE CLAIM (not certified): {what} exceeds the claim, but no "
                f"certified evidence rejects it at {conf}; {noise}")
    else:
        certified = (f"certified epsilon >= {lower(cert.epsilon)}" if cert else
                     "no certified epsilon bound applies (canaries that are not independent "
                     "certify only through the one-run methods)")
        text = (f"consistent: no certified evidence refutes the claim ({certified} at {conf}, "
                f"best estimate {point(est.epsilon if est else 0.0)} vs claimed "
                f"{point(claimed)}); {noise}")
    text += f". [{where}]"
    if warnings_:
        text += " WARNING (short of a PRIVACY BUG): " + "; ".join(warnings_) + "."
    return text


def _legacy_message(status, canary_message, white_box, white_fired, refutation_level,
                    warnings_) -> str:
    """The verdict's message without a claim about training data: the canaries' own, with
    the white-box checks that fired first."""
    if status == PRIVACY_BUG and white_fired:
        why = "; ".join(describe(white_box[k]) for k in _cause_first(white_fired))
        return (f"PRIVACY BUG ({level_words(failure=refutation_level)}): {why}. Canaries: "
                f"{canary_message}")
    if status == PRIVACY_BUG:
        return f"PRIVACY BUG: canaries {canary_message}"
    extra = [w for w in warnings_ if w not in canary_message]
    if extra:
        canary_message += " WARNING: " + "; ".join(extra) + "."
    return canary_message


def _cause_first(names: list[str]) -> list[str]:
    return sorted(names, key=lambda n: (n not in CAUSES, names.index(n)))


def claim_paragraph(status, td, white_box, white_fired, refuted_by, has_stress, est,
                    claimed, est_rejected, refutation_level) -> str:
    """The message's first paragraph (module doc): the user's claim, its bracket, and the
    cause of a finding first, in plain words."""
    head = claim_head(td)
    bracket = bracket_words(td)
    if status == PRIVACY_BUG:
        # a cause the checks found (a loader that did not feed the training) leads, even
        # when by itself it is only a warning: what it causes is the refutation that follows
        causes = [k for k in CAUSES if k in white_box and white_box[k].warning]
        reasons = [describe(white_box[k]) for k in causes + _cause_first(white_fired)]
        lower = td.get("lower") or {}
        if lower.get("refuted"):
            test = lower.get("claim_test") or {}
            reasons.append(
                "the canaries inserted like an example refute your claimed curve (their "
                f"counts are impossible under it: p = {test.get('refute_p_value', 0):.2g})")
        if refuted_by:
            who = "the every-step canaries" if has_stress else "the canaries"
            reasons.append(f"{who}' claim test refutes the mechanism's claim (their error "
                           "rates fall below its trade-off curve)")
        text = (f"PRIVACY BUG ({level_words(failure=refutation_level)}): {head} is refuted: "
                + "; ".join(reasons) + f". {sentence_case(bracket)}.")
    elif status == ESTIMATE_ABOVE_CLAIM:
        what = (f"the canaries' estimate {point(est.epsilon)} exceeds their claim "
                f"{point(claimed)} ({est.attack}/{est.method}, assumes {est.assumption})"
                if est is not None and est.epsilon > claimed else
                f"the claim test of {', '.join(est_rejected)} rejects the canaries' claim "
                "(assumes independent canaries)")
        text = (f"{sentence_case(head)}: ESTIMATE ABOVE CLAIM (not certified): {what}. "
                f"{sentence_case(bracket)}.")
    elif status == NOT_VERIFIED:
        unseen = [f"{u['plain']} ({u['reason']})" for u in td.get("unseen") or []]
        if not unseen:  # no premise unseen: the upper side itself could not be computed
            unseen = list(td.get("upper_reasons") or [])
        text = (f"{sentence_case(head)}: NOT VERIFIED, not seen: {'; '.join(unseen)}. "
                f"{sentence_case(bracket)}.")
    else:
        text = (f"{sentence_case(head)}: {bracket}. Nothing refutes it at the PRIVACY BUG "
                f"level ({level_words(failure=refutation_level)}).")
    text += "".join(f" {sentence_case(n)}." for n in td.get("notes") or [])
    if td.get("warnings") and status != PRIVACY_BUG:
        text += (" Warning, short of a PRIVACY BUG: " + ", ".join(td["warnings"])
                 + " at the bounds' level.")
    return text
