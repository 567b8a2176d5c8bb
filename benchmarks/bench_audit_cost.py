"""CPU time of the default audit: this checkout against another one, paired seed by seed.

Each audit (``run_audit(seed=s)`` with the default settings, or the groups given as JSON) runs
in a fresh process with one thread; the process runs it ``--repeats`` times and reports the
smallest CPU seconds of ``run_audit`` alone (imports and start-up excluded; the minimum is the
figure least disturbed by the rest of a shared machine). The two checkouts alternate,
A B A B ..., on the same seeds, and the script prints the per-seed ratio A / B with its
median and range, next to the model size, the batch, the threads and the machine load.

Run (the figure quoted in docs/evidence.md; the baseline is a checkout of an earlier commit,
e.g. ``git worktree add /tmp/base 645d927``):

    OMP_NUM_THREADS=1 python benchmarks/bench_audit_cost.py --baseline /tmp/base --seeds 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
from dpaudit.experiment import run_audit
seed, groups, repeats = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
run_audit(seed=seed + 1000, progress=False, **groups)  # warm-up: lazy imports, caches
cpu = []
for _ in range(repeats):
    start = time.process_time()
    res = run_audit(seed=seed, progress=False, **groups)
    cpu.append(time.process_time() - start)
print(json.dumps({"cpu": min(cpu), "status": res["verdict"]["status"]}))
"""


def one(src: Path, seed: int, groups: dict, repeats: int) -> dict:
    """One audit (its smallest CPU time over ``repeats``) in a fresh process importing dpaudit
    from ``src``."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(seed), json.dumps(groups), str(repeats)],
        env=env, capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="root of the other checkout (has src/)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="runs of each audit (the minimum)")
    p.add_argument("groups", nargs="?", default="{}", help="run_audit groups as JSON")
    args = p.parse_args()
    here = Path(__file__).resolve().parents[1] / "src"
    base = Path(args.baseline).resolve() / "src"
    if not (base / "dpaudit").is_dir():
        p.error(f"--baseline: expected a checkout with src/dpaudit, got {args.baseline}")
    groups = json.loads(args.groups)
    rows = []
    for seed in range(args.seeds):
        a, b = one(here, seed, groups, args.repeats), one(base, seed, groups, args.repeats)
        rows.append((seed, a, b))
        print(f"seed {seed}: this {a['cpu']:.2f} s ({a['status']}), baseline {b['cpu']:.2f} s "
              f"({b['status']}), ratio {a['cpu'] / b['cpu']:.3f}", flush=True)
    ratios = [a["cpu"] / b["cpu"] for _, a, b in rows]
    from dpaudit.experiment.settings import AuditSettings

    s = AuditSettings.from_mappings(**groups)
    print(
        f"default audit{' ' + json.dumps(groups) if groups else ''}: model {s.model.name} "
        f"(width {getattr(s.model, 'width', '-')}), {s.canary.count} canaries, "
        f"T = {s.dp.steps}, batch {s.dp.batch_size}, 1 thread, {platform.machine()}, "
        f"load {os.getloadavg() if hasattr(os, 'getloadavg') else None}"
    )
    print(
        f"CPU s per audit: this median {statistics.median(a['cpu'] for _, a, _ in rows):.2f}, "
        f"baseline median {statistics.median(b['cpu'] for _, _, b in rows):.2f}; "
        f"ratio this / baseline median {statistics.median(ratios):.3f} "
        f"[{min(ratios):.3f}, {max(ratios):.3f}] over {len(rows)} paired seeds"
    )


if __name__ == "__main__":
    main()
