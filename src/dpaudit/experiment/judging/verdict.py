"""The verdict of an audit and its message (DESIGN 4.5): three states from the typed evidence.

``privacy_bug`` only when a certified statement refutes the claim at its share of the PRIVACY
BUG level (a claim test, a one-run claim test or a white-box check); ``estimate_above_claim``
when only an estimate exceeds the claim (or an uncertified claim test rejects it);
``consistent`` otherwise. Evidence at the bounds' level but short of the refutation level is a
warning in the verdict, named with its level. The verdict is built as a
``report.results.Verdict`` directly from ``BoundRow`` s and ``ClaimRow`` s.
"""

from __future__ import annotations

import numpy as np

from dpaudit.experiment.judging.levels import REFUTATION_LEVEL
from dpaudit.experiment.judging.white_box import describe, fired, warned
from dpaudit.report.results import (
    CONSISTENT,
    ESTIMATE_ABOVE_CLAIM,
    PRIVACY_BUG,
    BoundRow,
    ClaimRow,
    Verdict,
)
from dpaudit.threat_model import ThreatModel


def best(rows: list[BoundRow], kind: str) -> BoundRow | None:
    """The valid finite row of ``kind`` with the largest epsilon (None when there is none)."""
    ok = [b for b in rows if b.kind == kind and b.valid and np.isfinite(b.epsilon)]
    return max(ok, key=lambda b: b.epsilon, default=None)


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
    """Three states (module doc), naming the threat model and the accountant compared with.

    ``training_data``: the training data's epsilon, measured (``premises``): its sentence
    opens the message, in the user's numbers, and the canaries' threat-model verdict follows;
    the measured noise multiplier replaces the canary-derived bound in the message (which
    keeps its own name). ``premise_warnings``: premises of the audit itself that failed
    (canaries the data reached), each a warning.

    ``white_box``: name -> ``CheckResult`` (``experiment.judging.white_box``); one that
    refutes the claim at its share of ``refutation_level`` is certified evidence and makes the
    verdict a privacy bug, named in the message; one whose evidence only reaches the bounds'
    level is a warning. ``one_run_claims``: attack -> ``one_run_claim_evidence`` (canaries
    trained together), named "<attack> (one-run)" in the verdict. sigma_upper is the smallest
    certified one when any is finite, else the smallest estimate."""
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
    if refuted_by or white_fired:
        status = PRIVACY_BUG
    elif est_eps > claimed or est_rejected:
        status = ESTIMATE_ABOVE_CLAIM
    else:
        status = CONSISTENT
    level_words = f"PRIVACY BUG level {refutation_level:.2g}"
    warnings_ = [describe(white_box[k]) for k in white_warned]
    warnings_ += list(premise_warnings or [])
    warnings_ += [
        f"the {a} attack's claim test rejects the claimed curve at {confidence:.0%} but not "
        f"at the {level_words}" for a in rejected_only
    ]
    if cert_eps > claimed:
        warnings_.append(
            f"certified epsilon >= {cert_eps:.3f} ({cert.attack}/{cert.method}) exceeds "
            f"the claimed {claimed:.3f} at {confidence:.0%}"
            + ("" if status == PRIVACY_BUG else f"; no statement refutes the claim at the "
               f"{level_words}")
        )
    where = f"{threat.describe()}; claim: {threat.accountant_name}, epsilon {claimed:.3f}"
    noise = (
        f"the canaries' claim test: effective noise multiplier <= {sigma_ub:.4g} (configured "
        f"{threat.noise_multiplier:g}{'' if sigma_certified else ', estimate'})"
        if np.isfinite(sigma_ub)
        else "the canaries' claim test gives no upper bound on the effective noise"
    )
    measured = measured_noise_words(training_data)
    if measured:
        noise = f"{measured}; {noise}"
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
            f"estimate {est_eps:.3f} ({est.attack}/{est.method}, assumes "
            f"{est.assumption})"
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
    if training_data and training_data.get("sentence"):
        message = f"{training_data['sentence']} Canaries: {message}"
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
    )


def measured_noise_words(training_data: dict | None) -> str:
    """The measured noise multiplier's interval, in words (empty when not measured)."""
    premises = {p["name"]: p for p in (training_data or {}).get("premises", [])}
    noise = premises.get("noise_multiplier")
    if not noise or "interval" not in noise:
        return ""
    conf = f"{noise['confidence']:.0%}"
    if noise.get("sigma_interval"):
        a, b = noise["sigma_interval"]
        return (f"measured noise multiplier in [{a:.4g}, {b:.4g}] (configured "
                f"{noise['configured']:g}; {noise['draws']:,} noise draws, {conf})")
    a, b = noise["interval"]
    return (f"measured noise in [{a:.4g}, {b:.4g}] x the configured one ({noise['draws']:,} "
            f"noise draws, {conf})")
