"""The upper side's coverage (issue 65): how often "verified at most U" falls below the epsilon
the training really has, with deviations planted where the accountant cannot see them.

Each setting is ``tests/support/coverage_loops.py``'s own loop (the ReLU CNN on digits of
``premise_loops``: AdamW, StepLR, BatchMemoryManager, 60 Dirac canaries on the audit's block,
88 steps at q = 1/22, sigma for epsilon 4 by the engine's accountant) with a planted
deviation (a rate, every tensor's noise, the head's bias's noise, a few steps' noise, and
combinations; the PRV, RDP and GDP engines; flat, per-layer and adaptive clipping), and the
true epsilon composed with a worst-case example by PRV (the upper end of its bracket: a run
counts as a failure when U is below it, which can only count more failures than the exact
epsilon would). Per setting: runs, failures (U < true epsilon), their fraction with its
Clopper-Pearson 95% interval, U / true and U / claimed (median [min, max]), the one-scale
figure over the claim, and what the verdict printed.

Rows are appended to ``--out`` as JSON lines as they finish; a rerun skips the (setting,
seed) pairs already there (resumable). Run (the table in docs/evidence.md):

    OMP_NUM_THREADS=1 python benchmarks/upper_coverage.py --seeds 60 --jobs 1
    OMP_NUM_THREADS=1 python benchmarks/upper_coverage.py --seeds 60 --settings issue
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from scipy.stats import beta

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from coverage_loops import ISSUE_TABLE, SETTINGS

DEFAULT_OUT = Path("outputs") / "upper_coverage.jsonl"


def one(args: tuple) -> dict:
    """One audit of ``setting`` at ``seed``: its row."""
    name, seed = args
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from coverage_loops import coverage_run

    return coverage_run(name, seed)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact two-sided interval of a binomial fraction k / n."""
    a = 1.0 - confidence
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.isf(a / 2, k + 1, n - k))
    return lo, hi


def _range(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def _printed(rows: list[dict]) -> str:
    words = {"verified": "verified", "not verified": "not verified", "refuted": "refuted",
             "not measured": "not measured"}
    upper = {}
    for r in rows:
        upper[words.get(r["upper_status"], r["upper_status"])] = upper.get(
            words.get(r["upper_status"], r["upper_status"]), 0) + 1
    verdict = {}
    for r in rows:
        verdict[r["status"]] = verdict.get(r["status"], 0) + 1
    return (", ".join(f"{k} {v}" for k, v in upper.items()) + "; "
            + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in verdict.items()))


def table(rows: list[dict]) -> list[str]:
    out = ["| setting | true epsilon | runs | U < true | fraction [CP 95%] | U / true | "
           "U / claimed | one-scale / claimed | one-scale < true | printed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    order = [s for s in SETTINGS if any(r["setting"] == s for r in rows)]
    for name in order:
        rs = [r for r in rows if r["setting"] == name and r["upper"] is not None]
        n = len(rs)
        fails = sum(r["upper"] < r["true"] for r in rs)
        lo, hi = clopper_pearson(fails, n)
        one_fails = sum((r["upper_one_scale"] or 0) < r["true"] for r in rs)
        trues = sorted({round(r["true"], 3) for r in rs})
        true = f"{trues[0]:.3f}" if len(trues) == 1 else f"{trues[0]:.3f}-{trues[-1]:.3f}"
        out.append(
            f"| {name} | {true} | {n} | {fails} | {fails / n:.3f} [{lo:.3f}, {hi:.3f}] | "
            f"{_range([r['upper'] / r['true'] for r in rs])} | "
            f"{_range([r['upper'] / r['claimed'] for r in rs])} | "
            f"{_range([r['upper_one_scale'] / r['claimed'] for r in rs if r['upper_one_scale']])}"
            f" | {one_fails} | {_printed(rs)} |")
    return out


def _load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="all",
                   help="'all', 'issue' (the issue's table) or names joined by ';'")
    p.add_argument("--seeds", type=int, default=60)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--table-only", action="store_true", help="print the table of --out")
    args = p.parse_args()
    if args.settings == "all":
        names = list(SETTINGS)
    elif args.settings == "issue":
        names = list(ISSUE_TABLE)
    else:
        names = [s.strip() for s in args.settings.split(";")]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        p.error(f"--settings: unknown {unknown}; expected 'all', 'issue' or names from "
                f"{list(SETTINGS)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["setting"], r["seed"]) for r in _load(args.out)}
    tasks = [(n, s) for s in range(args.first_seed, args.first_seed + args.seeds)
             for n in names if (n, s) not in done]
    t0 = time.perf_counter()
    if not args.table_only and tasks:
        with args.out.open("a") as f:
            if args.jobs > 1:
                with ProcessPoolExecutor(args.jobs) as pool:
                    for row in pool.map(one, tasks):
                        f.write(json.dumps(row) + "\n")
                        f.flush()
            else:
                for task in tasks:
                    f.write(json.dumps(one(task)) + "\n")
                    f.flush()
    rows = [r for r in _load(args.out) if r["setting"] in names]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    cpu = sum(r["cpu"] for r in rows)
    print(f"upper side's coverage (issue 65): {len(rows)} audits ({len(tasks)} run now in "
          f"{time.perf_counter() - t0:.0f} s wall, {args.jobs} job(s)); "
          f"{cpu / max(1, len(rows)):.2f} s CPU per audit; {platform.machine()}, load {load}")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
