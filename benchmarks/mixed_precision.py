"""The own-loop families under mixed precision: correct training, the halved noise, 2 C clipping.

Each family of ``tests/support/own_loop_models.py`` (an ordinary Opacus loop with an
``AuditHook``, judged by ``audit_report``) trains with its forward and loss under
``torch.autocast("cpu", dtype=bfloat16)`` (``--dtype float16``: float16, no GradScaler). Per
family: the verdicts of the correct training over ``--seeds`` seeds, the largest clipped
contribution the clipping check measured (median and largest over the seeds, in units of C) and
the epsilon it implies over the claim's (``experiment.judging.clipping``: a warning within
+10%, a PRIVACY BUG beyond), and how often two planted bugs are PRIVACY BUG: ``halved_noise``
and a clipping bug of 2 C (``own_loop_models.clip_at_twice_the_norm``). The ``ew`` family is
left out: Opacus' ExpandedWeights fails under autocast without the hook ("expected m1 and m2 to
have the same dtype").

    OMP_NUM_THREADS=1 python benchmarks/mixed_precision.py --seeds 20 --bug-seeds 5 --jobs 2
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

SKIP = ("ew",)  # Opacus' ExpandedWeights fails under autocast (module doc)


def _one(job: tuple) -> dict:
    import torch
    from own_loop_models import clip_at_twice_the_norm, own_loop_audit

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    family, bug, seed, dtype = job
    planted = clip_at_twice_the_norm if bug == "clip_2C" else None
    res = own_loop_audit(family, bug="none" if bug == "clip_2C" else bug, seed=seed,
                         planted=planted, autocast=getattr(torch, dtype))
    v, clip = res["verdict"], res["white_box"]["checks"].get("clipping", {})
    w = clip.get("witness", {})
    details = clip.get("details", {})
    ratio = max(r for r in (details.get("max_ratio_single"),
                            details.get("max_ratio_leave_one_out"), 0.0) if r is not None)
    return {"family": family, "bug": bug, "seed": seed, "status": v["status"],
            "fired": v["white_box_fired"], "warned": v["white_box_warned"], "ratio": ratio,
            "excess": w.get("epsilon_excess", 0.0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20, help="seeds of the correct training")
    p.add_argument("--bug-seeds", type=int, default=5, help="seeds of each planted bug")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--families", default="all", help="comma-separated, or all")
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args()
    from own_loop_models import FAMILIES

    families = [f for f in (FAMILIES if args.families == "all" else args.families.split(","))
                if f not in SKIP]
    jobs = [(f, "none", s, args.dtype) for f in families for s in range(args.seeds)]
    jobs += [(f, b, s, args.dtype) for f in families for b in ("halved_noise", "clip_2C")
             for s in range(args.bug_seeds)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(_one, jobs))
    print(f"| family ({args.dtype} autocast) | correct: consistent | warned (clipping) | "
          "largest contribution / C, median [max] | epsilon excess, median [max] | "
          "halved_noise flagged | 2 C clipping flagged |")
    print("|---|---|---|---|---|---|---|")
    totals = {"correct": 0, "consistent": 0, "bug": 0, "flagged": 0}
    for f in families:
        ok = [r for r in rows if r["family"] == f and r["bug"] == "none"]
        ratios = np.array([r["ratio"] for r in ok])
        excess = np.array([r["excess"] for r in ok])
        cells = [f"{sum(r['status'] == 'consistent' for r in ok)}/{len(ok)}",
                 f"{sum('clipping' in r['warned'] for r in ok)}/{len(ok)}",
                 f"{np.median(ratios):.4f} [{ratios.max():.4f}]",
                 f"{np.median(excess):+.2%} [{excess.max():+.2%}]"]
        totals["correct"] += len(ok)
        totals["consistent"] += sum(r["status"] == "consistent" for r in ok)
        for bug in ("halved_noise", "clip_2C"):
            bad = [r for r in rows if r["family"] == f and r["bug"] == bug]
            hit = [r for r in bad if r["status"] == "privacy_bug"]
            names = sorted({n for r in hit for n in r["fired"]})
            cells.append(f"{len(hit)}/{len(bad)} ({', '.join(names) or '-'})")
            totals["bug"] += len(bad)
            totals["flagged"] += len(hit)
        print(f"| {f} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{totals['consistent']} of {totals['correct']} correct trainings consistent; "
          f"{totals['flagged']} of {totals['bug']} planted bugs PRIVACY BUG; "
          f"{len(jobs)} audits in {time.perf_counter() - start:.0f} s, {args.jobs} job(s), "
          f"1 thread each, {platform.machine()}, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
