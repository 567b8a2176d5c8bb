"""Write an audit's report: results.json, ROC / histogram / candidate plots, console table.

The table and the plots keep the two kinds of evidence apart: certified numbers (the claim
test, mu_lower, sigma_upper, certified bounds) and estimates (each with the model it assumes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpaudit.experiment.evaluation import split_scores
from dpaudit.experiment.run import resolve_device
from dpaudit.report import format_table, plot_roc, plot_score_histograms, write_json
from dpaudit.report.plots import theory_fpr
from dpaudit.report.provenance import provenance
from dpaudit.stats import gdp_tradeoff
from dpaudit.threat_model import ThreatModel


def _fmt(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    return "inf" if np.isinf(x) else f"{x:.4g}"


def console_table(result: dict) -> str:
    """Claim evidence per attack, bounds per (attack, method) by kind, and the verdict."""
    th, v = result["theory"], result["verdict"]
    claim_rows = [
        {
            "attack": name,
            "claim rejected": "YES" if c["rejected"] else "no",
            "kind": "certified" if c["certified"] else "estimate",
            "mu_lower": c["mu_lower"],
            "sigma_upper": _fmt(c["sigma_upper"]),
            "eps@sigma_upper": _fmt(c.get("epsilon_at_sigma_upper")),
            "auc": result["attacks"][name]["auc"],
        }
        for name, c in result.get("claim", {}).items()
    ]
    bound_rows = [
        {
            "attack": b["attack"],
            "method": b["method"],
            "kind": b.get("kind", ""),
            "epsilon": "n/a" if b.get("kind") == "not applicable" else b["epsilon"],
            "valid": "yes" if b["valid"] else "no",
            "assumes": _short(b.get("assumption") or b.get("error") or ""),
        }
        for b in result["bounds"]
    ]
    per = result.get("per_test_confidence")
    lines = [
        f"threat model: {v['threat_model']}",
        f"claim: {v['accountant']}, epsilon {v['claimed_epsilon']:.3f}"
        + (f" (RDP {th['accountants']['rdp']['epsilon']:.3f}, "
           f"PRV {th['accountants']['prv']['epsilon']:.3f})"),
        f"confidence {v['confidence']:.0%} for all statements together"
        + (f" (each at {per:.4g}, Bonferroni)" if per else ""),
        "",
        "claim test (certified unless marked):",
        format_table(claim_rows),
        "",
        "epsilon lower bounds (certified) and estimates (under the model named):",
        format_table(bound_rows),
    ]
    note = (th.get("training_data") or {}).get("note")
    if note:
        lines += ["", note]
    lines += ["", v["message"]]
    return "\n".join(lines)


def _short(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def write_audit_report(
    result: dict,
    split: dict,
    out: str | Path,
    *,
    candidate_scores=None,
    chosen=None,
    selection: str = "",
    quiet: bool = False,
    device: str | None = None,
) -> Path:
    """Plots, then results.json (written last, with provenance) in ``out``; prints the table.

    Args:
        result: the evaluation result (``evaluate_scores`` plus context).
        split: attack name -> (member scores, non-member scores).
        out: output directory.
        candidate_scores, chosen, selection: Algorithm 3's candidates, for the candidate plot.
        quiet: do not print the table.
        device: the device the audit ran on (recorded in the provenance block).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    threat = ThreatModel.from_dict(result["theory"]["threat_model"])
    grid = theory_fpr()
    v = result["verdict"]
    curves = {f"claimed: {threat.accountant_name.split(' (')[0]}": threat.roc_curve(grid)}
    points = {}
    for name, c in result.get("claim", {}).items():
        kind = "certified" if c["certified"] else "estimate"
        if c["mu_lower"] > 0:
            curves[f"{kind}: not mu-GDP below mu={c['mu_lower']:.2f} ({name})"] = gdp_tradeoff(
                grid, c["mu_lower"]
            )
        t = c["test"]
        if t.get("fpr_upper") is not None:
            points[f"{kind} operating point (FPR_u, 1-FNR_u), {name}"] = (
                t["fpr_upper"],
                1.0 - t["fnr_upper"],
            )
    title = f"audit ROC — {threat.describe()}; claimed epsilon {v['claimed_epsilon']:.3f}"
    note = v["status"].replace("_", " ").upper() + f" at {v['confidence']:.0%}"
    plots = {
        "roc": plot_roc(split, out / "roc.png", curves, title=title, points=points,
                        note=note).name,
        "histograms": plot_score_histograms(split, out / "score_histograms.png").name,
    }
    if candidate_scores is not None:
        from dpaudit.canaries import Selection, plot_score_distribution

        cand = np.asarray(candidate_scores)
        idx = np.asarray(chosen, dtype=np.int64)
        sel = Selection(idx, [selection] * len(idx), cand[idx])
        path = out / "candidates_mahalanobis.png"
        plot_score_distribution(cand, sel, path, title="Algorithm 3: candidates' scores")
        plots["candidates"] = path.name
    result["plots"] = plots
    result["provenance"] = provenance(device)
    result["schema_version"] = result["provenance"]["schema_version"]
    path = write_json(out / "results.json", result)
    if not quiet:
        print("\n" + console_table(result))
        print(f"results: {path}")
    return path


def write_report(result: dict, run, out: Path, settings) -> None:
    """``write_audit_report`` for an audit's ``RunRecord`` and its ``AuditSettings``."""
    split = split_scores({k: np.asarray(v) for k, v in run.scores.items()}, run.membership)
    write_audit_report(
        result,
        split,
        out,
        candidate_scores=run.candidate_scores,
        chosen=run.chosen,
        selection=settings.canary.selection,
        device=str(resolve_device(settings)),
    )
