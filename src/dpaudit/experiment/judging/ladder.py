"""The threat-model ladder: one training's canaries judged as each adversary would see them.

The white-box adversary sees every released gradient; the hidden-state adversary only the
initial and final parameters; the black-box adversary only the final model's outputs. Each
weaker view is a function of the releases (post-processing), so every rung has the same
claim, the accountant's for the canaries' threat model; what differs is the evidence
(docs/threat_models.md):

* ``white_box``: the hook's attack scores (the scalar product of each canary with every
  release, ...);
* ``hidden_state``: sparse gradient canaries scored from theta_T - theta_0 on their own
  coordinates (``capture.final_state``); independent experiments exactly when the white-box
  canaries are and the base optimizer updates each coordinate from its own history;
* ``black_box``: input canaries scored by the final model (negative loss, logit margin);
  canaries trained together are not independent (the one-run methods certify), one canary per
  run of a multi-run audit is.

``ladder_block`` evaluates every rung with ``evaluate_scores`` on its own scores, at the
audit's confidence, methods and PRIVACY BUG level, without the white-box checks (those are
the verdict's, whichever rung it is about): each rung's statements hold jointly as an auditor
with only that view would state them, so their numbers compare like with like. The block
(``threat_model_ladder`` in results.json) has a row per rung, its certified epsilon and
estimate and their ratios to the white-box rung's; the black-box row forecasts what more
canaries would certify. ``ladder_warnings`` names a rung other than the verdict's that
refutes the claim.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dpaudit import seeds
from dpaudit.experiment.judging.evaluation import (
    Evidence,
    evaluate_scores,
    independence_broken,
    split_scores,
)
from dpaudit.forecast import per_side_points
from dpaudit.names import THREAT_MODELS
from dpaudit.report.results import PRIVACY_BUG
from dpaudit.threat_model import ThreatModel

RUNGS = THREAT_MODELS
SEES = {
    "white_box": "every released gradient",
    "hidden_state": "theta_0 and the final parameters",
    "black_box": "the final model's outputs",
}
NOT_JUDGED = ("the ladder judges each rung's canary scores alone; the white-box checks are the "
              "verdict's")
FORECAST_PER_SIDE = (1_000, 10_000)


@dataclass(frozen=True)
class RungInput:
    """One rung's scores (attack name -> (K,)) and whether each canary's score is an
    independent one-canary experiment; or ``reason`` why the rung has none."""

    scores: dict | None = None
    independent: bool = False
    reason: str | None = None
    summary: dict | None = None


def rung_inputs(white: dict, rungs: dict | None, *, independent: bool,
                per_run: bool) -> dict[str, RungInput]:
    """The ladder's inputs from what a training recorded: ``white`` the hook's attack scores,
    ``rungs`` the weaker rungs' records (``capture.final_state.rung_scores``, pooled over the
    runs of a multi-run audit); ``independent``: the white-box canaries are independent
    experiments; ``per_run``: one canary per run (each run an independent experiment whatever
    the optimizer)."""
    out = {"white_box": RungInput(scores=white, independent=independent)}
    for rung in RUNGS[1:]:
        rec = (rungs or {}).get(rung)
        if rec is None:
            out[rung] = RungInput(reason="not recorded by this training")
        elif "scores" not in rec:
            out[rung] = RungInput(reason=rec["reason"])
        else:
            summary = rec.get("summary")
            ok = independent
            if rung == "hidden_state" and not per_run:
                ok = ok and bool((summary or {}).get("coordinatewise"))
            out[rung] = RungInput(scores=rec["scores"], independent=ok, summary=summary)
    return out


def _best_mu(e: Evidence) -> float | None:
    rows = [c for c in e.claim.values() if c.certified]
    rows += [c for c in e.one_run_claim.values() if c.applicable is not False]
    mus = [c.mu_lower for c in rows if c.mu_lower is not None]
    return max(mus) if mus else None


def _anchor(e: Evidence) -> dict | None:
    rows = [b for b in e.bounds if b.method == "anchor_gdp" and np.isfinite(b.epsilon)]
    best = max(rows, key=lambda b: b.epsilon, default=None)
    return None if best is None else {"epsilon": best.epsilon, "by": best.attack,
                                      "kind": "estimate (the anchor's uncorrected GDP figure)"}


def forecast_more_canaries(s_in, s_out, threat: ThreatModel, confidence: float,
                           independent: bool, inclusion: float, seed: int = 0) -> dict:
    """What more canaries scoring like these would certify: the scores' separation as a
    Gaussian shift (mu = sqrt(2) Phi^-1(AUC), the binormal model), then the certified method
    that applies (independent canaries: Clopper-Pearson at the expected counts,
    ``forecast.expected_count_bound``; canaries trained together: ``fdp_one_run_certified``
    on seeded N(mu, 1) / N(0, 1) scores) at 10^3 / 10^4 per side. A forecast under that
    model, never a bound."""
    from scipy.special import ndtri

    from dpaudit.forecast import expected_count_bound
    from dpaudit.stats import auc, epsilon_lower_bound

    a = float(np.clip(auc(np.asarray(s_in), np.asarray(s_out)), 1e-9, 1 - 1e-9))
    mu = float(max(np.sqrt(2.0) * ndtri(a), 0.0))
    at = {}
    for n in FORECAST_PER_SIDE:
        if independent:
            eps = expected_count_bound(mu, n, confidence, threat.delta)
        else:
            rng = seeds.stream(seed, seeds.POWER_SIMULATION)
            member = rng.random(2 * n) < inclusion
            s = rng.standard_normal(2 * n) + mu * member
            eps = epsilon_lower_bound(s[member], s[~member], delta=threat.delta,
                                      confidence=confidence, method="fdp_one_run_certified",
                                      inclusion=inclusion).epsilon
        at[str(n)] = float(eps)
    method = "clopper_pearson" if independent else "fdp_one_run_certified"
    return {"auc": a, "mu": mu, "method": method, "epsilon_at_per_side": at,
            "kind": "forecast (binormal model at the measured AUC; not a bound)"}


def _row(rung: str, e: Evidence, inp: RungInput) -> dict:
    v = e.verdict
    return {
        "rung": rung, "sees": SEES[rung], "available": True,
        "scores": sorted(inp.scores), "independent_canaries": e.independent_canaries,
        "certified_epsilon": v.best_lower_bound,
        "certified_by": f"{v.best_attack}/{v.best_method}" if v.best_attack else None,
        "estimate": v.best_estimate,
        "estimate_by": f"{v.estimate_attack}/{v.estimate_method}" if v.estimate_attack
        else None,
        "mu_lower": _best_mu(e),
        "anchor_gdp": _anchor(e),
        "auc": {a: s["auc"] for a, s in e.attacks.items()},
        "status": v.status,
        "claim_rejected_by": list(v.claim_rejected_by),
        "per_test_confidence": e.per_test_confidence,
        "summary": inp.summary,
    }


def ladder_block(inputs: dict[str, RungInput], membership, threat: ThreatModel, *,
                 methods, confidence: float, inclusion: float, refutation_level: float,
                 selected: str, forecast: bool = True, records=None,
                 canary_set: int | None = None) -> dict:
    """``threat_model_ladder`` of results.json (module doc): a row per rung in ``RUNGS``
    order, each with its evidence (or why it has none) and its ratios to the white-box
    rung's certified epsilon and estimate; ``selected`` is the verdict's rung. ``records``:
    the training's ``WhiteBoxRecords`` (``canary_set``: the hook's set index), whose canary
    independence record withdraws every rung's independence when the data reached the
    canaries, as the verdict's evaluation does."""
    member = np.asarray(membership, dtype=bool)
    if independence_broken(records, canary_set) is not None:
        inputs = {k: dataclasses.replace(v, independent=False) for k, v in inputs.items()}
    rows, evidence = [], {}
    for rung in RUNGS:
        inp = inputs.get(rung) or RungInput(reason="not recorded")
        if inp.scores is None:
            rows.append({"rung": rung, "sees": SEES[rung], "available": False,
                         "reason": inp.reason})
            continue
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in inp.scores.items()}
        split = split_scores(arrays, member)
        e = evaluate_scores(split, threat, methods=methods, confidence=confidence,
                            independent=inp.independent, inclusion=inclusion,
                            refutation_level=refutation_level, white_box=None,
                            white_box_reason=NOT_JUDGED)
        evidence[rung] = e
        row = _row(rung, e, inp)
        if forecast and rung == "black_box":
            best = v_attack(e)
            s_in, s_out = split[best]
            row["forecast"] = forecast_more_canaries(s_in, s_out, threat, confidence,
                                                     e.independent_canaries, inclusion)
        rows.append(row)
    base = next((r for r in rows if r["rung"] == "white_box" and r["available"]), None)
    for r in rows:
        if not r["available"]:
            continue
        for key, ratio in (("certified_epsilon", "certified_ratio"), ("estimate",
                                                                       "estimate_ratio")):
            ref = None if base is None else base[key]
            r[ratio] = r[key] / ref if ref and ref > 0 else None
    return {"selected": selected, "claimed_epsilon": threat.claimed_epsilon(),
            "accountant": threat.accountant_name, "threat_model": threat.describe(),
            "confidence": confidence, "note": (
                "every rung has the accountant's claim (a weaker view is post-processing of "
                "the releases); each rung's statements hold jointly at the confidence on their "
                f"own; {NOT_JUDGED}"),
            "rungs": rows}


def v_attack(e: Evidence) -> str:
    """The attack with the largest AUC (the black-box forecast's scores)."""
    return max(e.attacks, key=lambda a: e.attacks[a]["auc"])


def ladder_warnings(block: dict) -> list[str]:
    """A sentence for each rung other than the verdict's whose claim test refutes the claim
    at its PRIVACY BUG level."""
    out = []
    for r in block["rungs"]:
        if r["available"] and r["rung"] != block["selected"] and r["status"] == PRIVACY_BUG:
            out.append(f"the {r['rung']} rung of the threat-model ladder refutes the claim "
                       f"({', '.join(r['claim_rejected_by']) or 'its claim test'}; "
                       "threat_model_ladder)")
    return out


def with_ladder_warnings(verdict, block: dict):
    """``verdict`` (a ``report.results.Verdict``) for the ladder's selected rung: its message
    names the rung and what its adversary sees, and ``ladder_warnings`` join its warnings
    (its status stays the selected rung's)."""
    rung = block["selected"]
    extra = ladder_warnings(block)
    message = f"{verdict.message} [verdict's adversary: {rung}, who sees {SEES[rung]}]"
    if extra:
        message += " LADDER: " + "; ".join(extra) + "."
    return dataclasses.replace(verdict, warnings=[*verdict.warnings, *extra], message=message)


def _num(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def ladder_report_blocks(block: dict | None) -> list[dict]:
    """The ladder as report blocks (``outputs.report_blocks``: the console table and the
    HTML page): a table of the rungs and their notes; none without a ladder."""
    if not block:
        return []
    rows, lines = [], []
    for r in block["rungs"]:
        if not r["available"]:
            rows.append({"rung": r["rung"], "sees": r["sees"], "certified eps": "n/a",
                         "x white box": "-", "estimate": "n/a", "x white box ": "-",
                         "mu_lower": "-", "independent": "-", "status": r["reason"]})
            continue
        rows.append({
            "rung": r["rung"] + (" (verdict)" if r["rung"] == block["selected"] else ""),
            "sees": r["sees"], "certified eps": _num(r["certified_epsilon"]),
            "x white box": _num(r.get("certified_ratio")), "estimate": _num(r["estimate"]),
            "x white box ": _num(r.get("estimate_ratio")), "mu_lower": _num(r["mu_lower"]),
            "independent": "yes" if r["independent_canaries"] else "no (one-run)",
            "status": r["status"]})
        if r.get("anchor_gdp"):
            lines.append(f"{r['rung']}: the anchor's GDP figure (uncorrected, an estimate) "
                         f"{r['anchor_gdp']['epsilon']:.4g} ({r['anchor_gdp']['by']})")
        s = r.get("summary") or {}
        if s.get("sums_releases_reason"):
            lines.append(f"{r['rung']}: {s['base_optimizer']}: {s['sums_releases_reason']}")
        fc = r.get("forecast")
        if fc:
            lines.append(f"{r['rung']}: more canaries scoring alike (AUC {fc['auc']:.3f}, mu "
                         f"{fc['mu']:.3g}) would certify about {per_side_points(fc)} "
                         f"({fc['method']}; "
                         f"{fc['kind']})")
    lines.append(f"claim on every rung: {block['accountant']}, epsilon "
                 f"{block['claimed_epsilon']:.4g}; {block['note']}")
    return [{"id": "ladder", "gap": True, "title": "threat-model ladder (the same training, "
             "each adversary's view):", "table": rows, "lines": lines}]
