"""The bug zoo against the canaries inserted like an example alone (issue 66, "end to end"):
with the white-box checks off, which zoo bugs do the data-rate canaries refute by themselves?

The README's own loop (digits, a linear model with ``add_canary_block``, the PRV accountant,
``make_private_with_epsilon(target_epsilon=4, target_delta=1e-5, epochs=10)``, batch 64, T =
220, the hook's default canaries: 10^4 per side inserted like an example) is trained with
each zoo bug planted at its catastrophic severity (``dpaudit.bugs.BUG_ZOO``: optimizer bugs on
the optimizer, sampler bugs on the DP loader's sampler) and judged by
``audit_report(hook, privacy_engine=engine, delta=1e-5, white_box=False)``: no white-box
check runs, so a PRIVACY BUG can only come from the canaries (the data-rate canaries' claim
test of the accountant's curve, or the every-step canaries' claim test). Per bug: the status,
whether the data-rate canaries' claim test refuted (and its p-value), their certified epsilon,
and whether the bug reaches the canaries at all (a bug on the data's clipping or sampling
leaves canaries inserted by the hook, at the hook's own draws, untouched: no canary test can
see it, the white-box checks do).

    OMP_NUM_THREADS=1 python benchmarks/data_rate_zoo.py --seeds 1 --jobs 2
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

from task_pool import run_tasks


def one(args: tuple) -> dict:
    """One audit of ``bug`` (``none``: correct) at ``seed`` with the white-box checks off."""
    bug, seed = args
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    from claim_loops import readme_loop_audit

    start = time.process_time()
    res = readme_loop_audit(seed, bug=None if bug == "none" else bug, white_box=False)
    v = res["verdict"]
    low = (v.get("training_data") or {}).get("lower") or {}
    test = low.get("claim_test") or {}
    return {"bug": bug, "seed": seed, "status": v["status"],
            "data_rate_refuted": bool(low.get("refuted")),
            "p": test.get("refute_p_value"), "certified": low.get("epsilon"),
            "stress_refuted": bool(v.get("claim_rejected_by")),
            "claimed": (v.get("training_data") or {}).get("epsilon_claimed"),
            "cpu": time.process_time() - start}


def main() -> None:
    from dpaudit.bugs import BUG_ZOO

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bugs", default="none," + ",".join(BUG_ZOO))
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args()
    bugs = args.bugs.split(",")
    unknown = [b for b in bugs if b != "none" and b not in BUG_ZOO]
    if unknown:
        p.error(f"--bugs: unknown {unknown}; expected none or names from {list(BUG_ZOO)}")
    tasks = [(b, s) for b in bugs for s in range(args.seeds)]
    rows, wall, load = run_tasks(one, tasks, args.jobs)
    print(f"the README loop (epsilon 4, T = 220, 10^4 canaries per side inserted like an "
          f"example), white-box checks off, seeds 0-{args.seeds - 1}: {len(rows)} audits in "
          f"{wall:.0f} s wall, {args.jobs} job(s), 1 thread each, "
          f"{platform.machine()}, load {load}")
    print("| bug | class | audits | PRIVACY BUG | by the data-rate canaries | their p (median) "
          "| certified epsilon (median) |")
    print("|---|---|---|---|---|---|---|")
    for bug in bugs:
        rs = [r for r in rows if r["bug"] == bug]
        ps = [r["p"] for r in rs if r["p"] is not None]
        cert = [r["certified"] for r in rs if r["certified"] is not None]
        cls = "-" if bug == "none" else BUG_ZOO[bug].bug_class
        p_text = f"{statistics.median(ps):.2g}" if ps else "-"
        c_text = f"{statistics.median(cert):.3g}" if cert else "-"
        print(f"| {bug} | {cls} | {len(rs)} | {sum(r['status'] == 'privacy_bug' for r in rs)} | "
              f"{sum(r['data_rate_refuted'] for r in rs)} | {p_text} | {c_text} |")


if __name__ == "__main__":
    main()
