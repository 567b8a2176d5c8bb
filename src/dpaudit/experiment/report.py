"""Write an audit's report: results.json, ROC / histogram / candidate plots, console table."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpaudit.experiment.evaluation import split_scores, theory_curve
from dpaudit.experiment.settings import AuditSettings
from dpaudit.report import format_table, plot_roc, plot_score_histograms, write_json
from dpaudit.report.plots import theory_fpr
from dpaudit.stats import gdp_tradeoff


def console_table(result: dict) -> str:
    """Bounds per (attack, method) next to the theory, and the verdict line."""
    th, v = result["theory"], result["verdict"]
    rows = []
    for b in result["bounds"]:
        att = result["attacks"][b["attack"]]
        rows.append(
            {
                "attack": b["attack"],
                "method": b["method"],
                "eps_lower": b["epsilon"],
                "valid": "yes" if b["valid"] else "no",
                "auc": att["auc"],
                "tpr@1%": att["tpr_at_fpr_0.01"],
            }
        )
    acc = th["accountants"]
    tm = th["threat_model"]
    lines = [
        format_table(rows),
        "",
        f"threat model: {tm['canary']} canaries ({tm['policy']}), q={tm['sample_rate']:.4g}, "
        f"T={tm['steps']}, sigma={tm['noise_multiplier']:g}, delta={tm['delta']:g}",
        "accountants: "
        + ", ".join(f"{k}={a['epsilon']:.3f}" for k, a in acc.items())
        + (f", exact Gaussian={th['gaussian_epsilon']:.3f}" if "gaussian_epsilon" in th else ""),
        v["message"] + f" (best: {v['best_attack']}/{v['best_method']}, ratio {v['ratio']:.2f})",
    ]
    return "\n".join(lines)


def write_report(result: dict, run: dict, out: Path, settings: AuditSettings) -> None:
    """results.json + plots in ``out``; prints the console table."""
    out.mkdir(parents=True, exist_ok=True)
    split = split_scores({k: np.asarray(v) for k, v in run["scores"].items()}, run["membership"])
    theory = {"accountant (mechanism)": theory_curve(settings, result["theory"])}
    fitted = [b for b in result["bounds"] if b.get("mu_lower") and b["method"] == "gdp"]
    if fitted:
        best = max(fitted, key=lambda b: b["mu_lower"])
        theory[f"GDP fit mu={best['mu_lower']:.2f} ({best['attack']})"] = gdp_tradeoff(
            theory_fpr(), best["mu_lower"]
        )
    plots = {
        "roc": plot_roc(split, out / "roc.png", theory, title="audit ROC vs theory").name,
        "histograms": plot_score_histograms(split, out / "score_histograms.png").name,
    }
    if run.get("candidate_scores") is not None:
        from dpaudit.canaries import Selection, plot_score_distribution

        cand = np.asarray(run["candidate_scores"])
        chosen = np.asarray(run["chosen"], dtype=np.int64)
        sel = Selection(chosen, [settings.canary.selection] * len(chosen), cand[chosen])
        path = out / "candidates_mahalanobis.png"
        plot_score_distribution(cand, sel, path, title="Algorithm 3: candidates' scores")
        plots["candidates"] = path.name
    result["plots"] = plots
    write_json(out / "results.json", result)
    print("\n" + console_table(result))
    print(f"results: {out / 'results.json'}")
