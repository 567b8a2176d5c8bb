"""The user's epsilon, answered: the premise breaks of issue 58 in the user's own loop, over
seeds, and the measured upper side against Opacus' epsilon.

Each case is ``tests/support/premise_loops.py``'s loop (a ReLU CNN on digits, AdamW with weight
decay, StepLR, the PRV accountant, ``make_private_with_epsilon(target_epsilon=4)``,
BatchMemoryManager with physical batches of 32, Dirac canaries on the audit's own block, 88
steps): the correct loop, a plain shuffled loader under BatchMemoryManager (with the DP loader
given to the hook, or none), a head trained by a second optimizer, canaries on coordinates dead
only at theta_0, a sampling rate 5% above the claimed one, and a halved noise. Per case: the
verdicts, the checks that refuted the claim (PRIVACY BUG) and warned, whether the loader was
named as not feeding the training, whether the independence of the canaries was withdrawn, and
the measured upper side over Opacus' epsilon (median [min, max]).

Run (the table in docs/evidence.md and the closing note of issue 58):

    OMP_NUM_THREADS=1 python benchmarks/premises.py --seeds 5 --jobs 2
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from premise_loops import CASES
from task_pool import run_tasks


def one(args: tuple) -> dict:
    """One audit of ``case`` at ``seed``: its summary."""
    case, seed = args
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from premise_loops import premise_loop

    start = time.process_time()
    res = premise_loop(case, seed)
    v, td = res["verdict"], res["verdict"]["training_data"]
    checks = res["white_box"]["checks"]
    return {
        "case": case, "seed": seed, "status": v["status"],
        "fired": list(v["white_box_fired"]) + list(v["claim_rejected_by"]),
        "warned": list(v["white_box_warned"]),
        "loader_named": bool(checks.get("loader_fed_training", {}).get("warning")),
        "withdrawn": bool(res["white_box"].get("canary_independence", {}).get("withdrawn")),
        "claimed": td["epsilon_claimed"], "upper": td["epsilon_upper"],
        "upper_status": td["upper_status"], "cpu": time.process_time() - start,
    }


def _range(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def table(rows: list[dict]) -> list[str]:
    out = ["| case | audits | PRIVACY BUG | refuted by | warned | loader named | independence "
           "withdrawn | upper side / Opacus' epsilon, median [min, max] | upper status |",
           "|---|---|---|---|---|---|---|---|---|"]
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        fired = sorted({f for r in rs for f in r["fired"]})
        warned = sorted({w for r in rs for w in r["warned"]})
        ratios = [r["upper"] / r["claimed"] for r in rs if r["upper"] and r["claimed"]]
        statuses = sorted({r["upper_status"] for r in rs})
        out.append(
            f"| {case} | {len(rs)} | {sum(r['status'] == 'privacy_bug' for r in rs)} | "
            f"{', '.join(fired) or '-'} | {', '.join(warned) or '-'} | "
            f"{sum(r['loader_named'] for r in rs)} | {sum(r['withdrawn'] for r in rs)} | "
            f"{_range(ratios)} | {', '.join(statuses)} |")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {unknown}; expected names from {list(CASES)}")
    tasks = [(c, s) for c in cases for s in range(args.seeds)]
    rows, wall, load = run_tasks(one, tasks, args.jobs)
    print(f"the own loop of issue 58 (ReLU CNN on digits, AdamW, StepLR, PRV, "
          f"make_private_with_epsilon(4), BatchMemoryManager 32, 88 steps), seeds "
          f"0-{args.seeds - 1}: {len(rows)} audits in {wall:.0f} s wall, "
          f"{args.jobs} job(s), 1 thread each, {platform.machine()}, load {load}")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
