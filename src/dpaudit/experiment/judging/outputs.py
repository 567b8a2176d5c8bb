"""Write an audit's outputs: results.json, ROC / histogram / candidate plots, console table.

The table and the plots keep the two kinds of evidence apart: certified numbers (the claim
test, mu_lower, sigma_upper, certified bounds) and estimates (each with the model it assumes).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from dpaudit.experiment.judging.ladder import ladder_report_blocks
from dpaudit.forecast import ceiling_sentence, per_side_points
from dpaudit.report import (
    format_table,
    plot_roc,
    plot_score_histograms,
    plot_white_box,
    write_json,
)
from dpaudit.report.files import p_cell
from dpaudit.report.numbers import level as level_words
from dpaudit.report.numbers import lower, point, upper
from dpaudit.report.numbers import lower as lower_num
from dpaudit.report.provenance import stamped
from dpaudit.report.results import AuditResult
from dpaudit.stats import gdp_tradeoff
from dpaudit.stats.gdp import gdp_mu
from dpaudit.stats.roc import theory_fpr
from dpaudit.threat_model import ThreatModel


def _fmt(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    return "inf" if np.isinf(x) else f"{x:.4g}"


def console_table(result: dict) -> str:
    """Claim evidence per attack, bounds per (attack, method) by kind, and the verdict: the
    blocks of ``report_blocks`` as text (``report/html.py`` renders the same blocks)."""
    lines: list[str] = []
    for block in report_blocks(result):
        if block.get("gap"):
            lines.append("")
        if block.get("title"):
            lines.append(block["title"])
        if "table" in block:
            rows = [{k: _short(v, CONSOLE_WIDTHS[k]) if k in CONSOLE_WIDTHS else v
                     for k, v in row.items()} for row in block["table"]]
            lines.append(format_table(rows) if rows else "(none)")
        lines += block.get("lines", [])
    return "\n".join(lines)


def report_blocks(result: dict) -> list[dict]:
    """The report of ``result`` as ordered blocks, each ``{"id", "title", "lines"}`` or
    ``{"id", "title", "table": rows}`` (``gap``: a blank line before it on the console): one
    formatting of every statistic for the console table and the HTML page."""
    th, v = result["theory"], result["verdict"]
    claim_rows = [
        {
            "attack": name,
            "claim rejected": _rejected_word(c),
            "kind": "certified" if c["certified"] else "estimate",
            "mu_lower": c["mu_lower"],
            "sigma_upper": _fmt(c["sigma_upper"]),
            "eps@sigma_upper": _fmt(c.get("epsilon_at_sigma_upper")),
            "auc": result["attacks"][name]["auc"],
        }
        for name, c in result.get("claim", {}).items()
    ] + [
        {
            "attack": f"{name} (one-run)",
            "claim rejected": (
                _rejected_word(c) if c.get("applicable", True) else "n/a"
            ),
            "kind": "certified" if c.get("applicable", True) else "not applicable",
            "mu_lower": c["mu_lower"],
            "sigma_upper": _fmt(c["sigma_upper"]),
            "eps@sigma_upper": _fmt(c.get("epsilon_at_sigma_upper")),
            "auc": result["attacks"][name]["auc"],
        }
        for name, c in (result.get("one_run_claim") or {}).items()
    ]
    bound_rows = [
        {
            "attack": b["attack"],
            "method": b["method"],
            "kind": b.get("kind", ""),
            "epsilon": "n/a" if b.get("kind") == "not applicable" else b["epsilon"],
            "valid": "yes" if b["valid"] else "no",
            "assumes": b.get("assumption") or b.get("error") or "",
        }
        for b in result["bounds"]
    ]
    per = result.get("per_test_confidence")
    blocks = [{"id": "message", "title": verdict_title(v), "lines": [v["message"]]}]
    blocks += training_blocks(v.get("training_data"))
    stress = v.get("stress_test")
    blocks += [
        {"id": "threat", "gap": True,
         "title": ("the mechanism's stress test (canaries of another threat model: their "
                   "claim is not your epsilon):" if stress else "the canaries:"),
         "lines": [
            f"threat model: {v['threat_model']}",
            f"claim: {v['accountant']}, epsilon {v['claimed_epsilon']:.3f}"
            + (f" (RDP {th['accountants']['rdp']['epsilon']:.3f}, "
               f"PRV {th['accountants']['prv']['epsilon']:.3f})"),
            f"confidence {v['confidence']:.0%} for all statements together"
            + (f" (each at {per:.4g}, Bonferroni)" if per else "")
            + (f"; a PRIVACY BUG needs a refutation at failure probability "
               f"{v['refutation_level']:.2g}" if v.get("refutation_level") else ""),
        ]},
        {"id": "claim", "gap": True, "title": "claim test (certified unless marked):",
         "table": claim_rows},
        {"id": "bounds", "gap": True,
         "title": "epsilon lower bounds (certified) and estimates (under the model named):",
         "table": bound_rows},
    ]
    if stress:
        blocks.append({"id": "stress_test", "gap": True,
                       "lines": [f"stress test: {stress['message']}"]})
    pld = {a: r for a, r in (th.get("histogram_pld") or {}).items() if r.get("epsilon")}
    if pld:
        blocks.append({"id": "pld", "gap": True, "lines": [
            "per-step histogram PLD composed over the steps (estimate, no confidence; "
            "Koskela & Mohammadi Sec. 9.2): "
            + ", ".join(f"{a} epsilon {r['epsilon']:.3f}" for a, r in pld.items())]})
    blocks += white_box_blocks(result.get("white_box"), th.get("training_data"))
    blocks += ladder_report_blocks(result.get("threat_model_ladder"))
    notes = []
    expected = (result.get("canary_info") or {}).get("expected_certified_epsilon") or {}
    if expected.get("advice"):  # said before training too: a 0 above is no surprise
        notes.append(f"as said before training: {expected['advice']}")
    elif expected and v.get("certified_bound_applies") and not v["best_lower_bound"] > 0:
        cp_certified = any(
            b["method"] == "clopper_pearson" and b.get("kind") == "certified"
            for b in result["bounds"]
        )
        notes.append(
            f"certified 0 where about {expected['epsilon']:.3g} was expected before training "
            f"for {expected['for']} (a simulated Clopper-Pearson bound): these attacks fell "
            "short of that one, or the draw was unlucky"
            if cp_certified
            else "certified 0: these canaries are not independent experiments, so only the "
            "one-run methods certify here (one_run, fdp_one_run_certified and the one-run "
            "claim test), and they need many canaries that each leak much; the "
            "Clopper-Pearson row is an estimate"
        )
    ceiling = ceiling_sentence((result.get("canary_info") or {}).get("certifiable_ceiling"))
    if ceiling:  # about the audited canaries: the stress test's, when they are one
        notes.append(("stress test: " + ceiling if stress else
                      ceiling[0].upper() + ceiling[1:]) + ".")
    note = (th.get("training_data") or {}).get("note")
    if note:
        notes.append(note)
    blocks += [{"id": "note", "gap": True, "lines": [n]} for n in notes]
    return blocks


STATUS_WORDS = {"privacy_bug": "PRIVACY BUG", "estimate_above_claim": "ESTIMATE ABOVE CLAIM",
                "not_verified": "NOT VERIFIED", "consistent": "CONSISTENT"}


def verdict_title(v: dict) -> str:
    """The verdict's heading (the console's first line, the report's title): about the
    user's claim when there is one."""
    word = STATUS_WORDS.get(v["status"], v["status"].replace("_", " ").upper())
    if v.get("training_data") is None:
        return f"verdict: {word}"
    return {"privacy_bug": "verdict: PRIVACY BUG: your epsilon is refuted",
            "estimate_above_claim": "verdict: ESTIMATE ABOVE CLAIM (not certified)",
            "not_verified": "verdict: NOT VERIFIED: a premise of your epsilon was not seen",
            "consistent": "verdict: VERIFIED, CONSISTENT"}.get(v["status"], f"verdict: {word}")


def _premise_value(p: dict) -> str:
    """A premise's measured value (and interval) in words, for the table."""
    if p.get("status") == "not observed":
        return "-"
    name = p["name"]
    conf = f"{p.get('confidence', 0):.0%}"
    if name == "noise_multiplier":
        lo, hi = p.get("sigma_interval") or p["interval"]
        scale = p.get("configured") or 1.0
        unit = "sigma" if p.get("sigma_interval") else "x configured"
        return (f"{unit} in [{lo:.4g}, {hi:.4g}] ({conf}; {p['draws']:,} draws); at least "
                f"{scale * p['least_favourable']:.4g} ({p['bound_confidence']:.1%}) used")
    if name == "sample_rate":
        lo, hi = p["interval"]
        return (f"q in [{lo:.4g}, {hi:.4g}] ({conf}; configured {p['configured']:.4g}); at "
                f"most {p['least_favourable']:.4g} ({p['bound_confidence']:.1%}) used")
    if name == "clipping":
        return (f"largest {p['ratio']:.6g} C ({p['probes']} probes on {p['steps_probed']} of "
                f"{p['steps']} steps)")
    if name == "steps":
        acc = p.get("accountant_steps")
        return f"{p['measured']} taken" + ("" if acc is None else f", {acc} accounted")
    return ", ".join(p.get("checks") or []) or "-"


def training_blocks(training: dict | None) -> list[dict]:
    """The user's question first: the training's epsilon from both sides and the premises
    it rests on, as report blocks (none when nothing was measured)."""
    if not training:
        return []
    rows = [{"premise": p["name"], "status": p["status"], "measured": _premise_value(p),
             "note": p.get("reason") or p.get("assumes") or ""}
            for p in training.get("premises", [])]
    lines = []
    lower = training.get("lower") or {}
    measured = "within_family" in lower  # by canaries inserted like an example: a block
    if lower.get("note") and not measured:
        lines.append(f"lower side: {lower['note']}")
    if lower.get("data_rate_canaries"):
        lines.append(f"canaries inserted like an example: {lower['data_rate_canaries']}")
    fc = lower.get("forecast")
    if fc:
        lines.append(f"canaries inserted like an example would certify about: "
                     f"{per_side_points(fc)} "
                     f"({fc['kind']})")
    if training.get("conditional_on"):
        lines.append("the upper side assumes the structure the checks test but cannot prove: "
                     + "; ".join(training["conditional_on"]))
    blocks = [{"id": "premises", "gap": True, "title": "your accountant's premises, measured "
               f"({training['accountant'].upper()}, delta {training['delta']:.2g}):",
               "table": rows, "lines": lines}]
    if measured:
        blocks.append({"id": "lower_side", "gap": True,
                       "title": "your epsilon's lower side, from canaries inserted like an "
                                "example (certified, and conditional on the family):",
                       "lines": data_rate_lines(lower)})
    return blocks


def data_rate_lines(lower: dict) -> list[str]:
    """The lower side of the canaries inserted like an example (``judging.lower_side``) in
    words, each statement labelled with its kind: the certified epsilon (any mechanism), the
    within-family side (a certified noise bound, its epsilon conditional on the family), the
    claim test of the user's curve, and the count ceiling (what they certify on a correct run)."""
    conf = f"{lower.get('confidence', 0.95):.0%}"
    counts = lower.get("canaries")
    if not isinstance(counts, list):  # the verdict may keep its canaries' message there
        design = (lower.get("ceiling") or {}).get("design") or {}
        counts = [design.get("n_in"), design.get("n_out")]
    eps = lower.get("epsilon")
    lines = [f"certified (valid for any mechanism, {conf}): epsilon >= "
             f"{'-' if eps is None else lower_num(eps)}, from {_count(counts[0])} member and "
             f"{_count(counts[1])} non-member canaries inserted like an example (Poisson at the "
             "data's rate, norm C, the same noise; mixture LR, a pre-registered count test)"]
    fam = lower.get("within_family") or {}
    sig, fam_eps = fam.get("sigma_upper"), fam.get("epsilon")
    if sig is None:
        lines.append("within the family: no noise bound (the canaries reject no noise "
                     "multiplier's curve)")
    else:
        lines.append(
            f"within the family, conditional on {fam.get('conditional_on')}: "
            f"noise multiplier at most {upper(sig)} (certified, {conf}), hence epsilon >= "
            f"{'-' if fam_eps is None else lower_num(fam_eps)} (conditional on the family, "
            "not a certified bound)")
    test = lower.get("claim_test") or {}
    if test:
        word = ("REFUTED at the PRIVACY BUG level" if test.get("refuted") else
                f"rejected at {conf} only" if test.get("rejected") else "not rejected")
        lines.append(f"claim test of your curve by these canaries: {word} (p = "
                     f"{test.get('p_value', 1.0):.2g}; at the PRIVACY BUG level p = "
                     f"{test.get('refute_p_value', 1.0):.2g})")
    ceiling = lower.get("ceiling") or {}
    expected = (lower.get("expected") or {}).get("epsilon_lower")
    claimed = (test.get("claimed") or {})
    if ceiling.get("count_ceiling") is not None:
        lines.append(
            f"what these canaries certify on a correct run (exact, on the claimed score law): "
            f"{ceiling['count_ceiling']:.3g} at the median (the count test's ceiling); no valid "
            f"method's median exceeds {ceiling['universal_ceiling']:.3g}, of the claimed "
            f"{ceiling['claimed']:.3g}")
    elif expected is not None:
        sigma = claimed.get("noise_multiplier")
        lines.append(
            f"what these canaries certify on a correct run (exact, on the claimed score law): "
            f"{lower_num(expected)} at the median (the pre-registered design's; the count "
            f"test's ceiling or within a count step of it)"
            + (f", for the claimed noise multiplier {sigma:.4g}" if sigma else ""))
    return lines


def _count(n) -> str:
    return "?" if n is None else f"{int(n):,}"


def _rejected_word(claim: dict) -> str:
    """REFUTED (at the PRIVACY BUG level), "at conf. only" (a warning), or no."""
    if claim.get("refuted"):
        return "REFUTED"
    return "yes, short of bug level" if claim["rejected"] else "no"


def sampling_lines(white_box: dict, training: dict | None = None) -> list[str]:
    """The sampling the by-example records saw, and beside the training data's claim the
    lower bound on its true epsilon when that sampling is shuffled fixed-size batches."""
    check = (white_box.get("checks") or {}).get("sampling_by_example")
    if not check:
        return []
    seen = (check.get("details") or {}).get("sampling_seen") or {}
    lines = [f"sampling seen: {seen.get('text', '-')}"]
    bound = seen.get("lower_bound")
    if bound:
        claim = (training or {}).get("opacus_epsilon")
        lines.append(
            f"shuffled fixed-size batches ({bound['batches_per_pass']} per pass, "
            f"{bound['passes']} passes, noise multiplier {bound['noise_multiplier']:.4g}): the "
            f"true epsilon for the training data is at least {bound['epsilon']:.4g} at delta "
            f"{bound['delta']:.2g} (a sound lower bound: {bound['source']})"
            + (f"; Opacus claims {claim:.4g} (Poisson sampling)" if claim is not None else ""))
    return lines


def white_box_blocks(white_box: dict | None, training: dict | None = None) -> list[dict]:
    """The white-box checks (a table) and what they could not examine, as report blocks;
    ``training``: the theory's training-data entry (the claim beside a lower bound)."""
    if not white_box:
        return []
    rows = []
    for name, c in (white_box.get("checks") or {}).items():
        stat = c.get("kind", "").endswith("(statistical)")
        rows.append(
            {
                "check": name,
                "claim refuted": "YES" if c["rejected"] else (
                    "warning" if c.get("warning") else "no"),
                "kind": "statistical" if stat else "deterministic",
                "p": p_cell(c.get("p_value")) if stat else "-",
                "checked": "; ".join(c.get("checked") or []),
            }
        )
    missing = white_box.get("not_checked") or []
    lines = sampling_lines(white_box, training)
    if missing:
        lines.append("not checked: " + "; ".join(missing))
    return [{"id": "white_box", "gap": True,
             "title": "white-box checks of the mechanism (certified; a statistical one refutes "
             "the claim at its share of the PRIVACY BUG level, warns at its share of the "
             "bounds'):", "table": rows, "lines": lines}]


# columns the console cuts to a width (the HTML page and results.json keep the full text)
CONSOLE_WIDTHS = {"assumes": 48, "checked": 60, "note": 48, "measured": 72, "sees": 44,
                  "status": 60}


def _short(text, width: int = 48):
    if not isinstance(text, str):
        return text
    return text if len(text) <= width else text[: width - 3] + "..."


AUDIT_MODES = {
    "one_run": "one training run; each of the K canaries is a member independently (the "
    "one-run game; not the bound method 'one_run')",
    "multi_run": "R training runs; all canaries of a run share one membership bit drawn from "
    "the seed (the fixed-target game)",
    "own_loop": "scores from the user's own training loop (audit_report)",
}


def audit_mode(name: str) -> dict:
    """The results' ``audit_mode`` entry: the setting's value and what game it names.

    (A bare ``mode: one_run`` read like the bound method ``one_run``.)
    """
    return {"name": name, "game": AUDIT_MODES.get(name, name)}


def confidence_block(result: dict) -> dict:
    """How the confidences fit together: the verdict's, each statement's, and why they differ."""
    overall = float(result["verdict"]["confidence"])
    per = result.get("per_test_confidence")
    if per is None or per >= 1.0 or per == overall:
        return {"overall": overall, "per_statement": overall, "statements": 1, "correction": None}
    n = max(1, round((1.0 - overall) / (1.0 - per)))
    return {
        "overall": overall,
        "per_statement": per,
        "statements": n,
        "correction": (
            f"Bonferroni: each of the {n} statements (every attack's claim test and every "
            f"(attack, method) bound) holds at 1 - {1 - overall:.3g}/{n} = {per:.4g}, so all "
            f"hold together at {overall:.0%}; the per-bound 'confidence' is that share"
        ),
    }


def _verdict_line(v: dict) -> str:
    """The verdict in a few words (the report's banner, the figures' note), led by what
    decided it, every number through ``report.numbers`` and each level where it is used:
    the user's claim first; the canaries' stress test after it, apart."""
    word = STATUS_WORDS.get(v["status"], v["status"].replace("_", " ").upper())
    bug = level_words(failure=v["refutation_level"]) if v.get("refutation_level") else None
    head = f"{word} ({bug})" if v["status"] == "privacy_bug" and bug else word
    decided = []
    if v.get("white_box_fired"):
        decided.append(f"white-box check refuted the claim: {', '.join(v['white_box_fired'])}")
    if v.get("claim_rejected_by"):
        decided.append("the canaries' claim test refuted their claimed curve")
    if v["status"] != "privacy_bug" and v.get("warnings"):
        decided.append(f"{len(v['warnings'])} warning(s) short of a PRIVACY BUG")
    td = v.get("training_data")
    conf = level_words(v["confidence"])
    if not td:  # no claim about training data: the canaries' own verdict
        nums = (f"certified eps >= {lower(v.get('best_lower_bound'))} ({conf}), estimate "
                f"{point(v.get('best_estimate'))}, claimed {point(v.get('claimed_epsilon'))}")
        return f"{head}: " + " | ".join([*decided, nums])
    if v["status"] == "not_verified":
        decided.insert(0, "not seen: " + ", ".join(u["plain"] for u in td.get("unseen") or [])
                       if td.get("unseen") else "not verified")
    up, low = td.get("epsilon_upper"), td.get("epsilon_lower")
    words = {"verified": "verified <=", "not verified": "measured <=",
             "refuted": "measured <="}.get(td["upper_status"])
    yours = (f"your epsilon {point(td['epsilon_claimed'])} ({td['accountant'].upper()}, delta "
             f"{td['delta']:.2g}): "
             + (f"{words} {upper(up)} ({conf})" if up is not None and words
                else "upper side not measured")
             + (f", certified >= {lower(low)} ({conf})" if low is not None
                else ", no certified lower side"))
    line = f"{head}: " + " | ".join([*decided, yours])
    stress = v.get("stress_test")
    if stress:
        line += (f" || stress test ({stress['status']}): certified eps >= "
                 f"{lower(stress['certified_epsilon'])} vs its claim "
                 f"{point(stress['claimed_epsilon'])}")
    return line


def _figure_title(result: dict, threat: ThreatModel, split: dict) -> str:
    v = result["verdict"]
    n_in = sum(len(s[0]) for s in split.values()) // max(1, len(split))
    n_out = sum(len(s[1]) for s in split.values()) // max(1, len(split))
    mode = result.get("audit_mode", {}).get("name", "")
    q = result.get("sample_rate")
    data = f"training data q={q:.4g}, " if isinstance(q, (int, float)) else ""
    return (
        f"{threat.describe()}\n"
        f"claim: {threat.accountant_name}, epsilon {v['claimed_epsilon']:.3f} at "
        f"delta={threat.delta:g}; {data}{mode or 'audit'}: {n_in} member / {n_out} "
        f"non-member scores"
    )


def _estimate_curves(result: dict, grid, delta: float) -> dict:
    """Per attack, the curve of its largest estimate in the bounds table: the mu-GDP curve
    whose epsilon at ``delta`` is that row's epsilon (the confidence-adjusted number the table
    and the banner show, not a point estimate; docs/evidence.md, "The ROC plot")."""
    best: dict = {}
    for b in result["bounds"]:
        eps = b.get("epsilon")
        if b.get("kind") != "estimate" or not isinstance(eps, (int, float)):
            continue
        if not np.isfinite(eps) or eps <= 0:
            continue
        if b["attack"] not in best or eps > best[b["attack"]]["epsilon"]:
            best[b["attack"]] = b
    curves = {}
    for attack, b in best.items():
        mu = gdp_mu(b["epsilon"], delta)
        checked = "" if b.get("valid") else ", model not validated"
        label = (f"estimate: mu-GDP, mu={mu:.2f} = epsilon {b['epsilon']:.3f} "
                 f"({attack}, {b['method']}{checked})")
        curves[label] = gdp_tradeoff(grid, mu)
    return curves


PLOT_CAPTIONS = {
    "roc": "ROC of each attack against the claimed trade-off curve",
    "histograms": "score histograms, members and non-members",
    "white_box": "white-box records: the noise the optimizer added",
    "candidates": "Algorithm 3's candidates and the canaries chosen",
}


def write_page(result: dict, out: Path, banner: str, staged: dict[str, Path]) -> Path:
    """``report.html`` beside results.json: the same blocks as the console, the verdict
    banner, the plots embedded (``report.html``)."""
    from dpaudit.report.files import atomic_text
    from dpaudit.report.html import audit_page

    images = {PLOT_CAPTIONS.get(k, k): path for k, path in staged.items() if path.exists()}
    title = verdict_title(result["verdict"]).replace("verdict: ", "dpaudit audit: ", 1)
    text = audit_page(result, report_blocks(result), banner, images, title=title)
    return atomic_text(out / "report.html", text)


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
    """Plots and results.json (with provenance) in ``out``, results.json last; prints the table.

    The plots are rendered to temporary files first, then results.json is written, then the
    plots are renamed into place: a failure before results.json leaves the previous report
    (JSON and plots) untouched, so new plots never sit beside an old result. results.json
    records each plot's sha256, so a reader can check that the pair belongs together.

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
    plots_start = time.perf_counter()
    if "mode" in result and "audit_mode" not in result:
        result["audit_mode"] = audit_mode(result.pop("mode"))
    result["confidence"] = confidence_block(result)
    for b in result.get("bounds", []):
        b["confidence_is"] = "per statement (Bonferroni share), see results' confidence block"
    threat = ThreatModel.from_dict(result["theory"]["threat_model"])
    grid = theory_fpr()
    v = result["verdict"]
    claimed = f"claimed: {threat.accountant_name.split(' (')[0]}, eps={v['claimed_epsilon']:.3f}"
    curves = {claimed: threat.roc_curve(grid)}
    points = {}
    for name, c in result.get("claim", {}).items():
        kind = "certified" if c["certified"] else "estimate (uncertified)"
        per = c["test"].get("confidence", v["confidence"])
        if c["mu_lower"] > 0:
            label = f"{kind}: mu >= {c['mu_lower']:.2f} ({name}, {per:.4g} lower bound)"
            curves[label] = gdp_tradeoff(grid, c["mu_lower"])
        t = c["test"]
        if t.get("fpr_upper") is not None:
            points[f"{kind} operating point (FPR_u, 1-FNR_u), {name}"] = (
                t["fpr_upper"],
                1.0 - t["fnr_upper"],
            )
    curves.update(_estimate_curves(result, grid, threat.delta))
    title = _figure_title(result, threat, split)
    note = _verdict_line(v)
    thresholds = {n: c["test"].get("threshold") for n, c in result.get("claim", {}).items()}
    staged: dict[str, tuple[Path, Path]] = {}

    def stage(key: str, name: str) -> Path:
        tmp = out / f".{name}.staged.png"
        staged[key] = (tmp, out / name)
        return tmp

    try:
        plot_roc(
            split,
            stage("roc", "roc.png"),
            curves,
            title=title,
            points=points,
            note=note,
            status=v["status"],
        )
        plot_score_histograms(
            split,
            stage("histograms", "score_histograms.png"),
            title=title,
            thresholds=thresholds,
            note=note,
            status=v["status"],
        )
        checks = (result.get("white_box") or {}).get("checks") or {}
        if {"noise_floor", "noise_independence"} & set(checks):
            tmp = stage("white_box", "white_box.png")
            if plot_white_box(checks, tmp, title=title, note=note, status=v["status"]) is None:
                del staged["white_box"]
        if candidate_scores is not None:
            from dpaudit.canaries import Selection
            from dpaudit.report.canary_plots import plot_score_distribution

            cand = np.asarray(candidate_scores)
            idx = np.asarray(chosen, dtype=np.int64)
            sel = Selection(idx, [selection] * len(idx), cand[idx])
            plot_score_distribution(
                cand,
                sel,
                stage("candidates", "candidates_mahalanobis.png"),
                title="Algorithm 3: candidates' scores",
            )
        result["plots"] = {k: final.name for k, (_, final) in staged.items()}
        result["plot_sha256"] = {
            final.name: hashlib.sha256(tmp.read_bytes()).hexdigest()
            for tmp, final in staged.values()
        }
        if isinstance(result.get("timing"), dict):
            result["timing"]["report_seconds"] = time.perf_counter() - plots_start
        result.update(stamped({}, device))
        canonical = AuditResult.from_dict(result).to_dict()  # the schema's serialisation
        result.clear()
        result.update(canonical)
        path = write_json(out / "results.json", result)
        for tmp, final in staged.values():
            os.replace(tmp, final)
        write_page(result, out, note, staged={k: f for k, (_, f) in staged.items()})
    finally:
        for tmp, _ in staged.values():
            if tmp.exists():
                tmp.unlink()
    if not quiet:
        print("\n" + console_table(result))
        print(f"results: {path}")
    return path

