"""The clipping check's judgement: when does a contribution above C refute the claim?

``capture.clip_check`` measures the largest change r C that one probed example made to the
optimizer's clipped sum. r > 1 is a fact about the arithmetic that ran, but not every such fact
is a privacy bug: under bfloat16 autocast Opacus computes the per-example norms and clip factors
from bfloat16 per-sample gradients, and the clipped contribution reaches about 1.001-1.01 C on
correct code (three roundings of 2^-8 each); float32 sums round at about 1e-7.

The rule (DESIGN 4.5, "Arithmetic precision is not a bug by itself"), one for every precision:
a sensitivity of r C with noise sigma C is the claimed mechanism at noise multiplier sigma / r,
so the excess costs epsilon(sigma / r) - epsilon(sigma), by the same accountant (RDP), at the
training's sample rate, steps and delta (the per-step noise multipliers the optimizer used).

* r <= 1 + ``clip_check.TOLERANCE`` (1e-4): float32 rounding of the sums; the check passes.
* otherwise the excess is reported exactly (the largest contribution, where, the epsilon it
  implies beside the claim's); it **refutes** the claim (PRIVACY BUG) when the implied epsilon
  exceeds the claim by more than ``EPSILON_TOLERANCE`` (10%), and is a **warning** below that.

A clipping bug of 2 C at sigma = 1 implies several times the claimed epsilon; bfloat16's largest
excess over the own-loop families (1.008 C) implies about 2.5% more. Without the sample rate
(no loader, no dataset size) the implied epsilon is the q = 1 composition's (said in the check).
"""

from __future__ import annotations

import math

import numpy as np

from dpaudit.accounting import accountant_epsilon, history_epsilon
from dpaudit.capture.clip_check import TOLERANCE
from dpaudit.stats.checks import deterministic

EPSILON_TOLERANCE = 0.10  # relative excess of the implied epsilon over the claim that refutes
DEFAULT_DELTA = 1e-5  # only when no claim's delta is known
ACCOUNTANT = "rdp"


def largest_ratio(summary: dict) -> float | None:
    """The largest contribution / C over every probe (single and leave-one-out), or None."""
    ratios = [summary.get(f"max_ratio_{k}") for k in ("single", "leave_one_out")]
    ratios = [float(r) for r in ratios if r is not None]
    return max(ratios) if ratios else None


def _epsilon(multipliers: np.ndarray, sample_rate: float, delta: float) -> float:
    """RDP epsilon of the steps' noise multipliers (runs of equal ones composed together)."""
    if multipliers.size == 0:
        return 0.0
    if np.any(multipliers <= 0):
        return math.inf
    values, counts = np.unique(np.round(multipliers, 12), return_counts=True)
    if len(values) == 1:
        return accountant_epsilon(float(values[0]), sample_rate, int(counts[0]), delta,
                                  ACCOUNTANT).epsilon
    history = [(float(v), float(sample_rate), int(c)) for v, c in zip(values, counts,
                                                                      strict=True)]
    return history_epsilon(history, delta, ACCOUNTANT).epsilon


def clipping_cost(ratio: float, noise_multipliers, sample_rate: float | None,
                  delta: float | None) -> dict:
    """The epsilon a sensitivity of ``ratio`` C implies, beside the claim's (module doc).

    Args:
        ratio: the largest contribution over C (>= 1).
        noise_multipliers: the noise multiplier of every step (noise std / C).
        sample_rate: the training's sample rate, or None (then q = 1, said in ``basis``).
        delta: the claim's delta, or None (then ``DEFAULT_DELTA``).
    """
    sigmas = np.asarray(noise_multipliers, dtype=float)
    q = float(sample_rate) if sample_rate else 1.0
    d = float(delta) if delta else DEFAULT_DELTA
    claimed = _epsilon(sigmas, q, d)
    implied = _epsilon(sigmas / float(ratio), q, d)
    excess = (implied / claimed - 1.0) if 0 < claimed < math.inf else 0.0
    basis = (f"{ACCOUNTANT.upper()}, q = {q:.4g}, {sigmas.size} steps, delta {d:g}"
             + ("" if sample_rate else "; the sample rate is unknown: the q = 1 composition"))
    return {"ratio": float(ratio), "claimed_epsilon": claimed, "implied_epsilon": implied,
            "epsilon_excess": excess, "tolerance": EPSILON_TOLERANCE, "basis": basis}


def clipping_check(summary: dict, noise_multipliers, sample_rate: float | None = None,
                   delta: float | None = None):
    """The clipping check's summary judged by the module's rule (a deterministic check that
    refutes, warns or passes).

    Args:
        summary: ``ClippingCheck.summary()``.
        noise_multipliers: the noise multiplier of every step (noise std / C).
        sample_rate: the training's sample rate (None: unknown).
        delta: the claim's delta (None: ``DEFAULT_DELTA``).
    """
    ratio = largest_ratio(summary)
    checked = [
        f"{summary.get('probes', 0)} probes on {summary.get('steps_checked', 0)} of "
        f"{summary.get('steps_seen', 0)} steps ({summary.get('leave_one_out_steps', 0)} "
        "with leave-one-out; the first step and a seeded random share of the others)"
    ]
    statement = (
        "no probed example changed the optimizer's clipped sum by more than C (its own "
        "clipping, run on the example alone and on the batch without it), beyond what moves "
        f"the claimed epsilon by {EPSILON_TOLERANCE:.0%}"
    )
    details = dict(summary)
    witness = dict(summary.get("worst") or {})
    refuted = noted = False
    if ratio is not None and ratio > 1.0 + TOLERANCE:
        cost = clipping_cost(ratio, noise_multipliers, sample_rate, delta)
        details["cost"] = cost
        witness.update({k: cost[k] for k in ("claimed_epsilon", "implied_epsilon",
                                              "epsilon_excess")})
        refuted = cost["epsilon_excess"] > EPSILON_TOLERANCE
        noted = not refuted
        checked.append(
            f"largest contribution {ratio:.6g} C: epsilon {cost['implied_epsilon']:.4g} "
            f"against the claim's {cost['claimed_epsilon']:.4g} ({cost['basis']}); refutes "
            f"above +{EPSILON_TOLERANCE:.0%}"
        )
    elif ratio is not None:
        checked.append(f"largest contribution {ratio:.6g} C (float32 rounding: at most "
                       f"1 + {TOLERANCE:g})")
    group = summary.get("max_group_ratio")
    if group is not None:  # per-layer clipping: each parameter's part against its C_p
        checked.append(f"largest part of one parameter {group:.6g} C_p (its own bound)")
        if group > 1.0 + TOLERANCE and not refuted:
            # the total stays within C (the claim's sensitivity), but the rule is not Opacus'
            noted = True
            witness.setdefault("group_ratio", group)
    return deterministic(
        "clipping", refuted, statement, witness=witness, checked=checked,
        unchecked=[summary["unchecked"]] if summary.get("unchecked") else [],
        details=details, warn=noted,
    )


def describe_clipping(check) -> str:
    """The clipping check's line for the verdict."""
    w = check.witness or {}
    if not w:
        return "clipping: a probed example changed the clipped sum by more than C"
    where = (f"clipping: example {w.get('example')} at step {w.get('step')} changed the "
             f"clipped sum by {w.get('ratio', float('nan')):.4g} C ({w.get('kind')})")
    if "implied_epsilon" not in w:
        return where
    return (f"{where}, which implies epsilon {w['implied_epsilon']:.4g} against the claimed "
            f"{w['claimed_epsilon']:.4g} ({w['epsilon_excess']:+.1%}; refutes above "
            f"+{EPSILON_TOLERANCE:.0%})")
