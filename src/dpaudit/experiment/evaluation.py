"""From per-canary scores to the audit's verdict (DESIGN 3, steps 5-6).

Every (attack, method) pair gives an epsilon lower bound. The audit reports the largest valid
one, so the bounds are made *simultaneously* valid: each is computed at confidence
1 - (1 - confidence) / M for M pairs (Bonferroni), and the maximum is then a lower bound at
the stated confidence. The theoretical side follows the threat model: canaries inserted like
a real example are compared with the accountant at the sample rate q (or q_c); gradient
canaries inserted at every step with the q = 1 composition, where the exact answer is the
Gaussian mechanism with mu = sqrt(T) ||g*|| / (sigma C).
"""

from __future__ import annotations

import warnings

import numpy as np

from dpaudit.accounting import (
    all_accountants,
    gaussian_mechanism_epsilon,
    subsampled_gaussian_tradeoff,
)
from dpaudit.experiment.settings import AuditSettings
from dpaudit.report.plots import theory_fpr
from dpaudit.stats import auc, epsilon_lower_bound, gdp_tradeoff, tpr_at_fpr


def reference_sample_rate(settings: AuditSettings, sample_rate: float) -> float:
    """The sample rate of the threat model the canaries realise."""
    c = settings.canary
    if c.kind == "gradient" and c.policy == "every_step":
        return 1.0
    if c.kind == "gradient" and c.inclusion_prob is not None:
        return float(c.inclusion_prob)
    return float(sample_rate)


def theory(settings: AuditSettings, steps: int, sample_rate: float, canary_norm=None) -> dict:
    """Accountants (RDP, PRV, GDP) for the threat model, the exact q = 1 answer where it
    applies, and the upper bound an audit must not exceed (min of RDP and PRV)."""
    dp = settings.dp
    q = reference_sample_rate(settings, sample_rate)
    acc = all_accountants(dp.noise_multiplier, q, steps, dp.delta)
    out = {
        "threat_model": {
            "canary": settings.canary.kind,
            "policy": settings.canary.policy if settings.canary.kind == "gradient" else "data",
            "sample_rate": q,
            "steps": steps,
            "noise_multiplier": dp.noise_multiplier,
            "delta": dp.delta,
        },
        "accountants": {k: v.to_dict() for k, v in acc.items()},
        "upper_bound": min(acc["rdp"].epsilon, acc["prv"].epsilon),
    }
    if q == 1.0:
        ratio = 1.0 if canary_norm is None else canary_norm / dp.max_grad_norm
        mu = np.sqrt(steps) * ratio / dp.noise_multiplier
        out["gaussian_mu"] = float(mu)
        out["gaussian_epsilon"] = gaussian_mechanism_epsilon(
            dp.noise_multiplier / ratio, steps, dp.delta
        )
        out["upper_bound"] = min(out["upper_bound"], out["gaussian_epsilon"])
    return out


def theory_curve(settings: AuditSettings, th: dict) -> np.ndarray:
    """The mechanism's ROC upper curve on ``theory_fpr()`` for the threat model."""
    tm = th["threat_model"]
    if "gaussian_mu" in th:
        return gdp_tradeoff(theory_fpr(), th["gaussian_mu"])
    return subsampled_gaussian_tradeoff(
        theory_fpr(), tm["noise_multiplier"], tm["sample_rate"], tm["steps"]
    )


def split_scores(scores: dict[str, np.ndarray], membership: np.ndarray) -> dict:
    """Attack name -> (scores of members, scores of non-members)."""
    m = np.asarray(membership, dtype=bool)
    return {k: (np.asarray(v)[m], np.asarray(v)[~m]) for k, v in scores.items()}


def attack_summaries(split: dict) -> dict:
    """AUC and TPR at FPR 0.1% / 1% / 10% of each attack."""
    out = {}
    for name, (s_in, s_out) in split.items():
        tprs = tpr_at_fpr(s_in, s_out, np.array([1e-3, 1e-2, 1e-1]))
        out[name] = {
            "auc": auc(s_in, s_out),
            "tpr_at_fpr_0.001": float(tprs[0]),
            "tpr_at_fpr_0.01": float(tprs[1]),
            "tpr_at_fpr_0.1": float(tprs[2]),
            "n_in": len(s_in),
            "n_out": len(s_out),
        }
    return out


def lower_bounds(split: dict, methods, delta: float, confidence: float) -> list[dict]:
    """Every (attack, method) bound at the Bonferroni-corrected confidence."""
    pairs = [(a, m) for a in split for m in methods]
    per_pair = 1.0 - (1.0 - confidence) / max(1, len(pairs))
    rows = []
    for attack, method in pairs:
        s_in, s_out = split[attack]
        row = {"attack": attack, "method": method, "confidence": per_pair}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = epsilon_lower_bound(
                    s_in, s_out, delta=delta, confidence=per_pair, method=method
                )
            row.update(epsilon=res.epsilon, valid=res.valid, mu_lower=res.mu_lower)
            row["result"] = res.to_dict()
        except ValueError as err:
            row.update(epsilon=float("nan"), valid=False, error=str(err))
        rows.append(row)
    return rows


def verdict(bounds: list[dict], th: dict, confidence: float) -> dict:
    """The best valid lower bound, compared with the theoretical upper bound."""
    valid = [b for b in bounds if b["valid"] and np.isfinite(b["epsilon"])]
    best = max(valid, key=lambda b: b["epsilon"], default=None)
    eps = best["epsilon"] if best else 0.0
    upper = th["upper_bound"]
    return {
        "best_lower_bound": eps,
        "best_attack": best["attack"] if best else None,
        "best_method": best["method"] if best else None,
        "upper_bound": upper,
        "ratio": eps / upper if upper > 0 else float("nan"),
        "confidence": confidence,
        "privacy_bug": bool(eps > upper),
        "message": (
            f"PRIVACY BUG: empirical epsilon >= {eps:.3f} exceeds the accountant's "
            f"{upper:.3f} at {confidence:.0%} confidence"
            if eps > upper
            else f"consistent: empirical lower bound {eps:.3f} <= accountant {upper:.3f}"
        ),
    }
