"""CPU time of the default audit: this checkout against another one, paired seed by seed.

Each audit (``run_audit(seed=s)`` with the default settings, or the groups given as JSON) runs
in a fresh process with one thread; the process runs it ``--repeats`` times and reports the
smallest CPU seconds of ``run_audit`` alone (imports and start-up excluded; the minimum is the
figure least disturbed by the rest of a shared machine). The two checkouts alternate,
A B A B ..., on the same seeds, and the script prints the per-seed ratio A / B with its
median and range, next to the model size, the batch, the threads and the machine load.

``--workload mlp1m`` instead times the user's own loop on the 1M-parameter MLP of
``bench_capture.py`` (Flatten, Linear(3072, 320), ReLU, Linear(320, 10); CIFAR-shaped synthetic
data, Poisson batches of 64, ``--steps`` steps, 1000 Dirac gradient canaries) with
``AuditHook(optimizer, model, [canaries])`` at each checkout's defaults (given the training
loader, as the README's loop does, where the hook takes one) and
``audit_report(hook, privacy_engine=engine)``: training and the report, the whole cost a user
pays; it also prints the bytes the records of the other doors hold (the loader's batches,
O(n + T), and the copy of the model). ``--hook-kwargs`` passes the same extra hook
arguments to both (e.g. ``'{"check_clipping": true}'`` to compare with the clipping probes on
in both).

Run (the figures quoted in docs/evidence.md; the baseline is a checkout of an earlier commit,
e.g. ``git worktree add /tmp/base 8aef681``):

    OMP_NUM_THREADS=1 python benchmarks/bench_audit_cost.py --baseline /tmp/base --seeds 10
    OMP_NUM_THREADS=1 python benchmarks/bench_audit_cost.py --baseline /tmp/base --seeds 6 \
        --workload mlp1m
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


MLP1M = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
from dpaudit import audit_report
from dpaudit.capture import AuditHook, GradientCanaries
seed, opts, repeats = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
steps, kwargs = opts["steps"], opts["hook"]
import inspect
gives_loader = "data_loader" in inspect.signature(AuditHook).parameters  # the README's loop

def audit(s):
    torch.manual_seed(s)
    x, y = torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,))
    model = nn.Sequential(nn.Flatten(), nn.Linear(3072, 320), nn.ReLU(), nn.Linear(320, 10))
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=64), noise_multiplier=1.0,
        max_grad_norm=1.0)
    dim = sum(p.numel() for p in model.parameters())
    policy = ["every_step" if i % 2 else "never" for i in range(1000)]
    canaries = GradientCanaries.dirac(list(range(0, 3072 * 320, 983))[:1000], norm=1.0,
                                      dim=dim, policy=policy)
    extra = {"data_loader": loader} if gives_loader else {}
    hook = AuditHook(opt, model, [canaries], **extra, **kwargs)
    start = time.process_time()
    with hook:
        while hook.steps < steps:
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                if hook.steps >= steps:
                    break
    res = audit_report(hook, privacy_engine=engine, independent_canaries=True)
    held = hook.record_bytes() if hasattr(hook, "record_bytes") else {}
    return time.process_time() - start, res["verdict"]["status"], held

audit(seed + 1000)  # warm-up
best = min(audit(seed) for _ in range(repeats))
print(json.dumps({"cpu": best[0], "status": best[1], "bytes": best[2]}))
"""


def one(src: Path, seed: int, groups: dict, repeats: int, child: str = CHILD) -> dict:
    """One audit (its smallest CPU time over ``repeats``) in a fresh process importing dpaudit
    from ``src``."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", child, str(seed), json.dumps(groups), str(repeats)],
        env=env, capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="root of the other checkout (has src/)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="runs of each audit (the minimum)")
    p.add_argument("--workload", choices=("default", "mlp1m"), default="default")
    p.add_argument("--steps", type=int, default=20, help="mlp1m: optimizer steps")
    p.add_argument("--hook-kwargs", default="{}", help="mlp1m: extra AuditHook arguments")
    p.add_argument("groups", nargs="?", default="{}", help="run_audit groups as JSON")
    args = p.parse_args()
    here = Path(__file__).resolve().parents[1] / "src"
    base = Path(args.baseline).resolve() / "src"
    if not (base / "dpaudit").is_dir():
        p.error(f"--baseline: expected a checkout with src/dpaudit, got {args.baseline}")
    groups = json.loads(args.groups)
    child = CHILD
    if args.workload == "mlp1m":
        groups, child = {"steps": args.steps, "hook": json.loads(args.hook_kwargs)}, MLP1M
    rows = []
    for seed in range(args.seeds):
        a = one(here, seed, groups, args.repeats, child)
        b = one(base, seed, groups, args.repeats, child)
        rows.append((seed, a, b))
        print(f"seed {seed}: this {a['cpu']:.2f} s ({a['status']}), baseline {b['cpu']:.2f} s "
              f"({b['status']}), ratio {a['cpu'] / b['cpu']:.3f}", flush=True)
    ratios = [a["cpu"] / b["cpu"] for _, a, b in rows]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    held = rows[-1][1].get("bytes") or {}
    if held:
        print("records held by this checkout's hook (bytes): "
              + ", ".join(f"{k} {v:,}" for k, v in held.items()))
    if args.workload == "mlp1m":
        print(f"own loop, 1M-parameter MLP (3072-320-10), 1000 Dirac canaries, T = "
              f"{args.steps}, batch 64, hook at each checkout's defaults"
              f"{' + ' + args.hook_kwargs if groups['hook'] else ''}, audit_report; 1 thread, "
              f"{platform.machine()}, load {load}")
    else:
        from dpaudit.experiment.settings import AuditSettings

        s = AuditSettings.from_mappings(**groups)
        print(
            f"default audit{' ' + json.dumps(groups) if groups else ''}: model {s.model.name} "
            f"(width {getattr(s.model, 'width', '-')}), {s.canary.count} canaries, "
            f"T = {s.dp.steps}, batch {s.dp.batch_size}, 1 thread, {platform.machine()}, "
            f"load {load}"
        )
    print(
        f"CPU s per audit: this median {statistics.median(a['cpu'] for _, a, _ in rows):.2f}, "
        f"baseline median {statistics.median(b['cpu'] for _, _, b in rows):.2f}; "
        f"ratio this / baseline median {statistics.median(ratios):.3f} "
        f"[{min(ratios):.3f}, {max(ratios):.3f}] over {len(rows)} paired seeds"
    )


if __name__ == "__main__":
    main()
