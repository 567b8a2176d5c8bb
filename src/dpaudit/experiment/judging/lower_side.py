"""The lower side of the user's epsilon, from canaries inserted like an example (DESIGN 4.5,
"the user's epsilon, from both sides").

Dirac gradient canaries of norm C on coordinates no data gradient reaches, each member
inserted with probability q per step (the data's rate), non-members never, scored by the
summed per-step mixture log-likelihood ratio: each canary is an independent experiment whose
pair has the accountant's own privacy curve. ``data_rate_lower_side`` evaluates every
statement ``stats.data_rate`` fixes from the claim before the scores are seen
(``forecast.data_rate_plan``), in two kinds never mixed:

* ``epsilon`` (``epsilon_lower``): CERTIFIED, valid for any mechanism, at the user's delta;
* ``within_family``: "behaves as if its noise multiplier were at most X (certified), hence
  epsilon at least Y if the mechanism is a Poisson-subsampled Gaussian": conditional on that
  family, and named so;

and the claim test of the user's claimed curve (the accountant's, PRV with its error bounds:
sound whatever accountant the user reads, GDP included): rejected at the bounds' confidence is
a warning, at the PRIVACY BUG level (``refuted``) a PRIVACY BUG about the user's epsilon,
reached end to end without the white-box checks. The count ceiling (what such canaries can
certify at this K on a correct run) is reported beside.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dpaudit.forecast import data_rate_ceiling, data_rate_evidence, data_rate_plan
from dpaudit.threat_model import ThreatModel

SCORE = "mixture_lr"  # the data-rate canaries' statistic (attacks.mixture.MixtureLR)


def accounted_threat(threat: ThreatModel, history) -> tuple[ThreatModel, str]:
    """The canaries' claim as the user's accountant composes it: its history's noise
    multiplier, rate and steps (the least private entry's sigma and q over all the steps where
    they vary: an upper bound on the claimed curve, so the claim test stays valid), at the
    canaries' norm and delta; ``threat`` itself (the optimizer's settings) without a history.
    An accountant told more noise, fewer steps or a smaller rate than the canaries saw then
    claims a curve they can refute, end to end."""
    if not history:
        return threat, "the optimizer's settings as the hook read them"
    sigma = min(float(h[0]) for h in history)
    q = max(float(h[1]) for h in history)
    steps = sum(int(h[2]) for h in history)
    if sigma <= 0 or not 0 < q < 1 or steps < 1:
        return threat, "the optimizer's settings (the accountant's history is not a Poisson one)"
    vary = len({(float(h[0]), float(h[1])) for h in history}) > 1
    where = ("the accountant's history" + (" (its least private entry over every step)"
                                           if vary else ""))
    # the hook's threat model with the history's parameters (assembled once, in plan)
    return replace(threat, noise_multiplier=sigma, sample_rate=q, steps=steps,
                   training_sample_rate=q), where


def data_rate_lower_side(scores_in, scores_out, threat: ThreatModel, *, confidence: float,
                         refutation_level: float, ceiling: bool = False,
                         history=None) -> dict:
    """The lower side's block (module doc) from the data-rate canaries' summed mixture log-LR
    scores (members, non-members) under ``threat`` (Poisson at the data's q, norm C, the
    claimed sigma, T and the user's delta).

    Args:
        scores_in / scores_out: the member and non-member canaries' scores.
        threat: their ``ThreatModel`` (realising the training data's).
        confidence: the certified statements' confidence.
        refutation_level: the claim test's share of the PRIVACY BUG level.
        history: the user's accountant's history (``accounted_threat``): the claim tested.
        ceiling: also compute the count ceiling over every rank design (exact, on the
            claimed score law; seconds): the report otherwise gives the pre-registered
            design's own median on a correct run (``expected``), which is that ceiling or
            within a count step of it (``benchmarks/data_rate_ceiling.py``).
    """
    s_in = np.asarray(scores_in, dtype=np.float64).reshape(-1)
    s_out = np.asarray(scores_out, dtype=np.float64).reshape(-1)
    if s_in.size == 0 or s_out.size == 0:
        raise ValueError(f"the data-rate canaries have {s_in.size} members and {s_out.size} "
                         "non-members: the lower side needs both")
    threat, claim_from = accounted_threat(threat, history)
    plan = data_rate_plan(threat, s_in.size, s_out.size, confidence=confidence,
                          refutation_level=refutation_level)
    ev = data_rate_evidence(plan, threat, s_in, s_out)
    sigma = ev.sigma_upper
    out = {
        "epsilon": float(ev.epsilon_lower.epsilon),
        "by": "canaries inserted like an example (mixture LR, pre-registered count test)",
        "kind": "certified (valid for any mechanism)",
        "confidence": float(confidence),
        "canaries": [int(s_in.size), int(s_out.size)],
        "within_family": {
            "sigma_upper": sigma if np.isfinite(sigma) else None,
            "epsilon": ev.epsilon_within_family,
            "kind": "certified noise bound; its epsilon conditional on the family",
            "conditional_on": ev.conditional_on,
        },
        "claim_test": {"p_value": ev.claim_p_value, "rejected": ev.claim_rejected,
                       "refute_p_value": ev.refute_p_value, "refuted": ev.refuted,
                       "refutation_level": float(refutation_level),
                       "curve": "the accountant's curve at the claimed sigma, q, T, C (PRV "
                                "with its error bounds)", "claim_from": claim_from,
                       "claimed": {"noise_multiplier": threat.noise_multiplier,
                                   "sample_rate": threat.sample_rate,
                                   "steps": threat.steps}},
        "refuted": bool(ev.refuted),
        "expected": plan.expected,
        "expected_kind": "on a correct run of the claim, exact: the median certified epsilon of "
                         "the pre-registered design (the count ceiling, or within a count step "
                         "of it), and the noise multipliers the claim test rejects",
        "note": "canaries inserted like a training example (Poisson at the data's rate, norm C, "
                "the same noise): their certified bound is one on the training data's epsilon",
        "evidence": ev.to_dict(),
    }
    if ceiling:
        out["ceiling"] = data_rate_ceiling(threat, s_in.size, s_out.size,
                                           confidence=confidence)
    return out
