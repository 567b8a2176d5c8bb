"""The default audit's bracket of the user's epsilon over seeds: the numbers in the default
preset's comment (``src/dpaudit/conf/experiment/default.yaml``) and docs/cli.md.

For each seed, ``run_audit(seed=S)`` (the CLI's ``dpaudit seed=S``, without writing a report)
and one row: the epsilon the training's accountant claims (PRV, delta 1e-5), the verified
upper side (and the tighter figure that assumes one noise scale for every tensor and step),
the certified lower side from the canaries inserted like an example
(``canary.lower_side``), the within-family side (the certified noise bound sigma_upper and the
accountant's epsilon there, conditional on a Poisson-subsampled Gaussian), the count ceiling
(what such canaries certify at the median on a correct run), the verdict's status, and where
the time went (training with the hook, the rest of the run, the evaluation, the whole wall
time). Then the median and range of every column. Run:

    OMP_NUM_THREADS=1 python benchmarks/default_lower_side.py --seeds 5
    OMP_NUM_THREADS=1 python benchmarks/default_lower_side.py --seeds 5 -- '{"dp": {"steps": 200}}'

Extra ``run_audit`` group settings as JSON after ``--`` (e.g. another preset to compare).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings

import numpy as np

COLUMNS = ("claimed", "upper", "upper_one_scale", "lower", "sigma_upper", "within_family",
           "ceiling", "training_s", "run_s", "evaluation_s", "wall_s")


def one(seed: int, groups: dict) -> dict:
    """One seed's row (module doc)."""
    from dpaudit.experiment import run_audit

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_audit(seed=seed, progress=False, **groups)
    wall = time.perf_counter() - start
    td = res["verdict"]["training_data"]
    lower = td.get("lower") or {}
    fam = lower.get("within_family") or {}
    t = res["timing"]
    return {"seed": seed, "claimed": td["epsilon_claimed"], "upper": td["epsilon_upper"],
            "upper_one_scale": td.get("epsilon_upper_one_scale"),
            "lower": td["epsilon_lower"], "sigma_upper": fam.get("sigma_upper"),
            "within_family": fam.get("epsilon"),
            # the pre-registered design's exact median on a correct run (the count ceiling or
            # within a count step of it; the full ceiling only where it was computed)
            "ceiling": ((lower.get("ceiling") or {}).get("count_ceiling")
                        or (lower.get("expected") or {}).get("epsilon_lower")),
            "status": res["verdict"]["status"], "training_s": t["training_seconds"],
            "run_s": t["run_seconds"], "evaluation_s": t["evaluation_seconds"], "wall_s": wall,
            "canaries": lower.get("canaries")}


def _cell(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("extra", nargs="?", default="{}", help="run_audit groups as JSON")
    args = ap.parse_args(argv)
    groups = json.loads(args.extra)
    print(f"threads OMP={os.environ.get('OMP_NUM_THREADS')}, cores {os.cpu_count()}, load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {platform.processor() or '?'}; "
          f"groups {groups}")
    rows = []
    for seed in range(args.seeds):
        rows.append(one(seed, groups))
        r = rows[-1]
        print(" ".join(f"{k}={_cell(r[k])}" for k in ("seed", *COLUMNS, "status")), flush=True)
    print("median [min-max]:")
    for k in COLUMNS:
        v = np.array([r[k] for r in rows if r[k] is not None], dtype=float)
        if v.size:
            print(f"  {k}: {np.median(v):.3f} [{v.min():.3f}-{v.max():.3f}]")
    print("statuses:", {s: sum(r["status"] == s for r in rows) for s in
                        sorted({r["status"] for r in rows})})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
