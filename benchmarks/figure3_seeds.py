"""Seed 001 Figure 3 over seeds: median [min-max] of every AUC and the paper's two findings.

Runs a Figure 3 preset (``fig3_mnist5k`` by default: logistic regression on 28x28 MNIST,
d = 7850) once per seed, in this process, and prints per target class (easy / medium / hard)
the covariance and scalar AUC, the predicted AUC of the covariance attack, TPR at FPR 0.1 and
the mean Mahalanobis score, as median [min-max] over seeds; then the checks of issue 32:

* covariance AUC above scalar AUC, for every class and seed;
* easy > medium > hard for the covariance attack, for every seed;
* |covariance AUC - predicted| <= 0.05, per class and seed (where not, the rows say by how much),
  for the prediction at theta_0 and for the same prediction with the variance along each
  attack direction measured on held-out gradients instead of taken from the estimate;
* the covariance AUC within 0.03 of the bracket [min, max] of those two predictions;

and the time per seed (set-up, runs, per run), the process's peak memory, threads and load.
Each seed's ``figure3.json`` and plots go to ``--out/seed_<s>/``. Runs:

    OMP_NUM_THREADS=1 python benchmarks/figure3_seeds.py --seeds 3
    OMP_NUM_THREADS=1 python benchmarks/figure3_seeds.py --seeds 3 -- model=cnn 'task.params=["8"]'
    python benchmarks/figure3_seeds.py --seeds 1 -- device=cuda

Extra Hydra overrides for every seed go after ``--``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict_power import med_range

CLASSES = ("easy", "medium", "hard")
PREDICTION_TOLERANCE = 0.05
BRACKET_SLACK = 0.03


def run_seed(preset: str, seed: int, overrides: list[str], out: Path) -> tuple[dict, float]:
    """(figure3 report, wall seconds) of ``preset`` at ``seed`` with Hydra ``overrides``."""
    from hydra import compose, initialize_config_module
    from hydra.utils import call

    with initialize_config_module("dpaudit.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[f"experiment={preset}", f"seed={seed}", "progress=false", *overrides],
        )
    if cfg.task["_target_"] != "dpaudit.tasks.figure3.figure3":
        raise SystemExit(f"--preset {preset}: not a Figure 3 preset ({cfg.task['_target_']})")
    start = time.perf_counter()
    report = call(cfg.task, output_dir=str(out / f"seed_{seed}"))
    return report, time.perf_counter() - start


def checks(report: dict) -> dict[str, list[str]]:
    """The findings of one seed: name -> the failures (empty: it holds)."""
    res = report["results"]
    cov = {c: res[c]["covariance"]["auc"] for c in CLASSES}
    out = {
        "covariance > scalar (every class)": [
            f"{c}: {cov[c]:.3f} <= {res[c]['scalar']['auc']:.3f}"
            for c in CLASSES
            if cov[c] <= res[c]["scalar"]["auc"]
        ],
        "easy > medium > hard (covariance)": []
        if cov["easy"] > cov["medium"] > cov["hard"]
        else [" / ".join(f"{cov[c]:.3f}" for c in CLASSES)],
    }
    for key, name in (("predicted_auc_covariance", "predicted"),
                      ("predicted_auc_covariance_heldout", "held-out predicted")):
        out[f"|covariance - {name}| <= {PREDICTION_TOLERANCE}"] = [
            f"{c}: {cov[c] - res[c][key]:+.3f}"
            for c in CLASSES
            if res[c][key] is not None and abs(cov[c] - res[c][key]) > PREDICTION_TOLERANCE
        ]
    bracket = []
    for c in CLASSES:
        pred = [res[c][k] for k in ("predicted_auc_covariance", "predicted_auc_covariance_heldout")]
        pred = [x for x in pred if x is not None]
        if not min(pred) - BRACKET_SLACK <= cov[c] <= max(pred) + BRACKET_SLACK:
            bracket.append(f"{c}: {cov[c]:.3f} outside [{min(pred):.3f}, {max(pred):.3f}]")
    out[f"covariance within {BRACKET_SLACK} of the two predictions' bracket"] = bracket
    return out


def table(reports: list[dict]) -> str:
    """Median [min-max] over seeds, one row per class."""
    head = ["class", "AUC covariance", "AUC scalar", "predicted", "held-out predicted",
            "TPR@0.1 cov", "TPR@0.1 scalar", "mahalanobis"]
    rows = [head]
    for c in CLASSES:
        e = [r["results"][c] for r in reports]
        rows.append([
            c,
            med_range([x["covariance"]["auc"] for x in e]),
            med_range([x["scalar"]["auc"] for x in e]),
            med_range([x["predicted_auc_covariance"] for x in e]),
            med_range([x["predicted_auc_covariance_heldout"] for x in e]),
            med_range([x["covariance"].get("tpr_at_fpr_0.1") for x in e]),
            med_range([x["scalar"].get("tpr_at_fpr_0.1") for x in e]),
            med_range([sum(x["mahalanobis"]) / len(x["mahalanobis"]) for x in e]),
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="fig3_mnist5k")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="each seed's files (default: a temp dir)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="Secure RNG turned off")  # once per training
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    print(
        f"{args.preset} {' '.join(extra)}: seeds {args.first_seed}-"
        f"{args.first_seed + args.seeds - 1}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}), {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        reports, failures = [], 0
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            load = os.getloadavg()[0]
            rep, wall = run_seed(args.preset, seed, extra, out)
            reports.append(rep)
            c = rep["config"]
            print(
                f"seed {seed}: {wall:.1f} s ({rep['seconds'] - rep['seconds_runs']:.1f} s set-up, "
                f"{c['runs']} runs x {c['steps_per_run']} steps, {rep['seconds_per_run']:.3f} s "
                f"per run), d = {c['dim']}, device {c['device']}, load {load:.2f}",
                flush=True,
            )
            for name, bad in checks(rep).items():
                failures += bool(bad)
                print(f"  {'holds' if not bad else 'FAILS'}: {name}{': ' if bad else ''}"
                      + "; ".join(bad))
        print("\nmedian [min-max] over seeds\n" + table(reports))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak memory of this process: {peak:.0f} MB; findings failing: {failures}")
        if args.out:
            print(f"files: {out}/seed_<s>/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
