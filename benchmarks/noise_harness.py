"""The noise Opacus draws against what the audit's records recover and test, cell by cell.

For each correct audit of the false-alarm configurations (``false_alarms.CONFIGS``, seeds as
there), Opacus' ``_generate_noise`` is wrapped (``tests/support/noise_capture.py``) and every
(tensor, step) cell compared: the std Opacus drew with against the claimed one
(``NoiseRecorder.record``'s and ``StepRecord.noise_std``), the recovered noise (release minus
clipped sum) against the drawn one coordinate by coordinate (against half an ulp of the
float32 release, the rounding of fl(s + n)), the squared norm ``noise_scale`` tests against the
drawn noise's, and each cell's chi-square p-value from the records against the drawn noise's.
``own_ddp`` is left out: its ranks run in forked processes, whose draws the wrapper cannot
bring back. Last, every cell's chi-square p-value from the records (the per-cell law that the
audits' Bonferroni over cells rests on), counted below 1e-2 ... 1e-5.

Run (the numbers in docs/evidence.md, "The noise checks' tail"):

    OMP_NUM_THREADS=1 python benchmarks/noise_harness.py --seeds 30 --first-seed 3000
    OMP_NUM_THREADS=1 python benchmarks/noise_harness.py --configs default --first-seed 732 \
        --seeds 1 --no-offset
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.stats import chi2

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from calibration import clopper_pearson, within_valid
from false_alarms import CONFIGS, config_seed, run_config
from noise_capture import compare, drawn_noise

HARNESSED = [n for n in CONFIGS if n not in ("own_ddp", "multi_run")]  # multi_run: no records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(HARNESSED))
    p.add_argument("--seeds", type=int, default=3, help="audits per configuration")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--no-offset", action="store_true",
                   help="use the seeds as given (not 1000 x the configuration's index + s)")
    args = p.parse_args()
    names = args.configs.split(",")
    bad = [n for n in names if n not in HARNESSED]
    if bad:
        p.error(f"--configs: {bad} not harnessed; expected names from {HARNESSED}")
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print("| configuration | seed | cells | claimed / Opacus std - 1 | max |h - n| / (sigma C) "
          "| max |h - n| / half-ulp | max recorded sq / drawn - 1 | max log10 p gap | "
          "conservative | smallest cell (drawn ratio, log10 p drawn / recorded) | p scale |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    worst = {"std": 0.0, "ulp": 0.0, "sq": 0.0}
    cell_log_p: list[np.ndarray] = []
    for name in names:
        for s in range(args.first_seed, args.first_seed + args.seeds):
            seed = s if args.no_offset else config_seed(name, s)
            with drawn_noise() as cap:
                res = run_config(name, seed, "/tmp/dpaudit_noise_harness")
            c = compare(cap)
            d, r = cap.array("dim"), cap.array("rounding")
            upper = (np.sqrt(cap.array("recorded_sq")) + np.sqrt(d) * r) ** 2
            cell_log_p.append(chi2.logcdf(upper, d))
            k = c["smallest_cell"]
            std = max(c["max_claimed_std_rel_error"], c["max_record_std_rel_error"])
            worst = {"std": max(worst["std"], std),
                     "ulp": max(worst["ulp"], c["max_error_over_ulp_bound"]),
                     "sq": max(worst["sq"], c["max_sq_rel_error"])}
            scale = res["white_box"]["checks"]["noise_scale"]["p_value"]
            print(f"| {name} | {seed} | {c['cells']} | {std:.1e} | "
                  f"{c['max_recovery_error']:.2e} | {c['max_error_over_ulp_bound']:.3f} | "
                  f"{c['max_sq_rel_error']:.1e} | {c['max_log10_p_gap']:.1e} | "
                  f"{c['conservative']} | {k['tensor']} (d={k['dim']}) step {k['step']}: "
                  f"{k['drawn_ratio']:.4f}, {k['log10_p_drawn']:.3f} / "
                  f"{k['log10_p_recorded']:.3f} | {scale:.3g} |", flush=True)
    n = sum(x.size for x in cell_log_p)
    lp = np.concatenate(cell_log_p) if cell_log_p else np.zeros(0)
    print(f"\nevery cell's chi-square lower-tail p-value from the records ({n} cells, "
          "noise_scale's conservative bound; a valid law: the fraction below a is <= a):")
    print("| level | cells below | expected | 95% CP | within 3 SE |\n|---|---|---|---|---|")
    for a in (1e-2, 1e-3, 1e-4, 1e-5):
        k = int(np.sum(lp < np.log(a)))
        lo, hi = clopper_pearson(k, max(n, 1))
        print(f"| {a:g} | {k} | {n * a:.1f} | [{lo:.1e}, {hi:.1e}] | "
              f"{'yes' if within_valid(k, max(n, 1), a) else 'NO'} |")
    print(f"worst over all: claimed std rel. error {worst['std']:.1e}, recovery error / half-ulp "
          f"{worst['ulp']:.3f}, recorded sq rel. error {worst['sq']:.1e}; "
          f"{time.perf_counter() - t0:.0f} s wall; numpy {np.__version__}")


if __name__ == "__main__":
    main()
