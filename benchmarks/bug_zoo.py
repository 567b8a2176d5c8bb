"""The bug zoo against the default audit: does it flag each bug, and which statement fires?

For every bug of ``dpaudit.experiment.BUG_ZOO`` at its ``catastrophic`` and ``mild`` severity
(``dp.bug_factor``), and for the correct optimizer, runs the default audit (``run_audit()``:
DP-SGD on digits, MLP of width 400, 1000 Dirac canaries on dead first-layer weights, every
step, T = 100, sigma = 1, and 10,000 per side inserted like an example on a canary block:
the lower side of the training data's epsilon 3.35) over ``--seeds`` seeds and prints per
(bug, severity):

* flagged / seeds (the verdict PRIVACY BUG, a refutation at failure probability 1e-6; for the
  correct optimizer these are false alarms);
* which certified statements refuted the claim, with counts over the seeds: the white-box
  checks (noise_scale, noise_marginal, noise_alignment, noise_freshness, noise_floor,
  noise_independence, poisson_sampling, sampling_by_example, sampling_duplicates, clipping,
  bookkeeping, normalisation, model_integrity, noise_ignores_data) and the claim test (claim);
* the median of the smallest white-box p-value (each corrected inside its check), the median
  sigma_upper / sigma (the effective-noise bound from the claim test) and the median smallest
  noise ratio the noise-scale check saw (added noise / claimed, per tensor and step; 1 means
  the claimed noise);
* the median CPU seconds per audit.

Run (the numbers in docs/evidence.md):

    OMP_NUM_THREADS=1 python benchmarks/bug_zoo.py --seeds 5 --jobs 2 --json zoo.json

False alarms of the default audit on the correct optimizer alone (40 seeds not used above):

    OMP_NUM_THREADS=1 python benchmarks/bug_zoo.py --bugs none --seeds 40 --first-seed 100 --jobs 2

Extra ``run_audit`` group settings as JSON after ``--`` (e.g. ``-- '{"device": "cuda"}'``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import warnings

from task_pool import run_tasks

STATEMENTS = ("noise_scale", "noise_marginal", "noise_alignment", "noise_freshness",
              "noise_floor", "noise_independence", "poisson_sampling", "sampling_by_example",
              "sampling_duplicates", "clipping", "bookkeeping", "normalisation",
              "model_integrity", "noise_ignores_data", "claim")


def one(args: tuple) -> dict:
    """One audit: (bug, severity label, factor, seed, extra settings) -> its summary."""
    bug, label, factor, seed, extra = args
    import torch

    from dpaudit.experiment import run_audit

    torch.set_num_threads(1)
    dp = {"bug": bug}
    if factor is not None:
        dp["bug_factor"] = factor
    groups = dict(extra)
    groups["dp"] = {**groups.get("dp", {}), **dp}
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_audit(seed=seed, progress=False, **groups)
    v = res["verdict"]
    fired = list(v.get("white_box_fired", []))
    if v.get("claim_rejected_by"):
        fired.append("claim")
    checks = res.get("white_box", {}).get("checks", {})
    scale = checks.get("noise_scale") or checks.get("noise_floor") or {}
    ratio = (scale.get("witness") or {}).get("noise_ratio")
    p_values = [c["p_value"] for c in checks.values() if c.get("level") is not None]
    sig = v.get("sigma_upper")
    return {
        "bug": bug,
        "severity": label,
        "factor": factor,
        "seed": seed,
        "status": v["status"],
        "fired": fired,
        "sigma_ratio": sig / v["noise_multiplier"] if sig and sig != float("inf") else None,
        "noise_ratio": ratio,
        "min_p": min(p_values) if p_values else None,
        "warnings": len(v.get("warnings") or []),
        "cpu_seconds": time.process_time() - start,
        "message": v["message"],
    }


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _fmt(x, digits=3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pfmt(p) -> str:
    return "-" if p is None else ("< 1e-300" if p < 1e-300 else f"{p:.1e}")


def table(rows: list[dict]) -> list[str]:
    """Markdown table: one line per (bug, severity)."""
    from dpaudit.bugs import BUG_ZOO

    out = [
        "| class | bug | severity (bug_factor) | flagged | statements that refuted (seeds) | "
        "smallest white-box p | sigma_upper / sigma | noise ratio | CPU s / audit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = []
    for r in rows:
        k = (r["bug"], r["severity"], r["factor"])
        if k not in keys:
            keys.append(k)
    for bug, label, factor in keys:
        rs = [r for r in rows if (r["bug"], r["severity"], r["factor"]) == (bug, label, factor)]
        n = len(rs)
        flagged = sum(r["status"] == "privacy_bug" for r in rs)
        counts = {s: sum(s in r["fired"] for r in rs) for s in STATEMENTS}
        fired = ", ".join(f"{s} {c}" for s, c in counts.items() if c) or "-"
        cls = BUG_ZOO[bug].bug_class if bug in BUG_ZOO else "correct optimizer"
        sev = label if factor is None else f"{label} ({factor:g})"
        out.append(
            f"| {cls} | {bug} | {sev} | {flagged}/{n} | {fired} | "
            f"{_pfmt(_median(r['min_p'] for r in rs))} | "
            f"{_fmt(_median(r['sigma_ratio'] for r in rs))} | "
            f"{_fmt(_median(r['noise_ratio'] for r in rs))} | "
            f"{_fmt(_median(r['cpu_seconds'] for r in rs), 1)} |"
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--bugs", default="all",
                   help="comma-separated names, all, or none (the correct optimizer only)")
    p.add_argument("--severities", default="catastrophic,mild")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--json", default=None, help="write every audit's summary here")
    p.add_argument("extra", nargs="?", default="{}", help="run_audit groups as JSON")
    args = p.parse_args()
    from dpaudit.bugs import BUG_ZOO

    names = {"all": list(BUG_ZOO), "none": []}.get(args.bugs, args.bugs.split(","))
    unknown = [n for n in names if n not in BUG_ZOO]
    if unknown:
        p.error(f"--bugs: unknown {unknown}; expected all, none or names from {list(BUG_ZOO)}")
    extra = json.loads(args.extra)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    tasks = [("none", "correct", None, s, extra) for s in seeds]
    for bug in names:
        spec = BUG_ZOO[bug]
        for label in args.severities.split(","):
            factor = getattr(spec, label)
            if label == "mild" and factor == spec.catastrophic:
                continue  # no severity: one row
            tasks += [(bug, label, factor, s, extra) for s in seeds]
    rows, wall, load = run_tasks(one, tasks, args.jobs)
    print(
        f"default audit ({json.dumps(extra) if extra else 'no overrides'}), seeds "
        f"{seeds.start}-{seeds.stop - 1}, {len(tasks)} audits in {wall:.0f} s wall, "
        f"{args.jobs} job(s), 1 thread each, {platform.machine()}, load {load}"
    )
    print("\n".join(table(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
