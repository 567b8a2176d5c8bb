"""Time and memory per step of ``experiment=one_run_live_1e5`` next to plain DP-SGD training.

The preset's set-up (``prepare_run``: mnist5k, the MLP of width 400, K random live Dirac
gradient canaries in their own coordinate view) is built once; then, alternated ``--repeats``
times on the same seed:

* (a) plain: the same Opacus DP-SGD training without the audit (same data, model at theta_0,
  expected batch, T, sigma: ``experiment.trainings.training.train_plain``);
* (b) audited: the audit's training with the capture hook and K canaries, white-box records on
  (``audit_run``, as ``dpaudit experiment=one_run_live_1e5`` trains);

and prints, per K, the median seconds per optimizer step (each training's wall time, Opacus'
``make_private`` and, for (b), the hook's start and records included, over its T steps) and
the peak memory of each training: on CUDA ``torch.cuda.max_memory_allocated`` (reset before
each training), on CPU the process's peak RSS during the training (VmHWM, reset through
``/proc/self/clear_refs``; where that is refused, the process's peak since start). The set-up
(the data's gradient activity at theta_0, which finds the live coordinates) is timed once.
``--dense-rows`` gives the canaries to the scores as a dense (K, K) matrix (the path before
``capture.insertion.DiracRows``: K^2 memory and work per step; K <= 40,000 here). The device
follows the model: ``--device cuda`` runs the same code on a GPU. Prints the machine, cores,
torch threads and load.

    OMP_NUM_THREADS=1 python benchmarks/one_run_live_cost.py
    OMP_NUM_THREADS=1 python benchmarks/one_run_live_cost.py --counts 10000,30000,100000 \
        --steps 20
    OMP_NUM_THREADS=1 python benchmarks/one_run_live_cost.py --counts 10000,30000 --steps 20 \
        --dense-rows
    python benchmarks/one_run_live_cost.py --device cuda --repeats 3

Extra Hydra overrides of the preset go after ``--`` (e.g. ``-- model.width=300``).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import re
import resource
import statistics
import time
import warnings

import torch

PRESET = "one_run_live_1e5"


def compose_settings(overrides: list[str]):
    """The preset's ``AuditSettings`` with ``overrides`` (Hydra compose, as the CLI)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from dpaudit.experiment.settings import AuditSettings

    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={PRESET}", *overrides])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    keys = ("data", "model", "dp", "canary", "attack", "audit", "seed", "device", "progress")
    return AuditSettings.from_mappings(**{k: task[k] for k in keys})


class PeakMemory:
    """Peak memory of a block: CUDA allocated bytes, or the process's RSS high-water mark."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.how = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak RSS"

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_mb = torch.cuda.memory_allocated(self.device) / 2**20
        else:
            self.start_mb = _status_mb("VmRSS")
            try:  # Linux: resets VmHWM to the current RSS
                with open("/proc/self/clear_refs", "w") as fh:
                    fh.write("5")
            except OSError:
                self.how = "peak RSS since start (clear_refs refused)"
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - self.start
        if self.device.type == "cuda":
            self.mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        self.mb = _status_mb("VmHWM")
        if self.mb is None:
            self.mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    @property
    def extra_mb(self) -> float | None:
        """The peak over the memory in use when the block started."""
        return None if self.start_mb is None else self.mb - self.start_mb


def _status_mb(field: str) -> float | None:
    """``field`` of /proc/self/status in MB (None where there is no such file)."""
    try:
        with open("/proc/self/status") as fh:
            return int(re.search(rf"{field}:\s+(\d+)", fh.read()).group(1)) / 1024
    except (OSError, AttributeError):
        return None


def dense_rows(prepared):
    """The prepared run with its sparse Dirac canaries as dense (K, K) rows (the old path)."""
    from dpaudit.capture import GradientCanaries

    c = prepared.setup.canaries
    dense = GradientCanaries(c.vectors, policy=list(c.policies), inclusion_prob=c.inclusion_prob,
                             seed=c.seed)
    out = copy.copy(prepared)
    out.setup = copy.copy(prepared.setup)
    out.setup.canaries = dense
    return out


def measure(settings, repeats: int, dense: bool) -> dict:
    """Set-up once, then plain and audited trainings alternated ``repeats`` times."""
    from dpaudit.experiment.plan import plan_audit
    from dpaudit.experiment.trainings.run import audit_run, prepare_run
    from dpaudit.experiment.trainings.training import train_plain

    plan = plan_audit(settings)
    device = plan.device
    with PeakMemory(device) as setup:
        prepared = prepare_run(plan)
    if dense:
        prepared = dense_rows(prepared)
    steps = prepared.derived.steps
    plain, audited = [], []
    for _ in range(repeats):
        model = copy.deepcopy(prepared.model)
        with PeakMemory(device) as m:
            _, done = train_plain(model, prepared.setup.train_set, settings.dp,
                                  prepared.sample_rate, steps, seed=settings.seed)
        plain.append((m.seconds / done, m.mb, m.extra_mb))
        del model
        with PeakMemory(device) as m:
            run = audit_run(plan, prepared=prepared)
        audited.append((m.seconds / run.steps, m.mb, m.extra_mb))
        del run
    return {
        "K": settings.canary.count, "steps": steps, "setup_s": setup.seconds,
        "setup_mb": setup.mb, "memory": setup.how,
        "plain_s": statistics.median(p[0] for p in plain),
        "plain_mb": max(p[1] for p in plain),
        "plain_extra_mb": _max_or_none(p[2] for p in plain),
        "audited_s": statistics.median(a[0] for a in audited),
        "audited_mb": max(a[1] for a in audited),
        "audited_extra_mb": _max_or_none(a[2] for a in audited),
        "n_train": len(prepared.setup.train_set),
        "batch": settings.dp.batch_size,
        "params": sum(p.numel() for p in prepared.model.parameters()),
        "live": prepared.setup.info["dim"] - prepared.setup.info["zero_gradient_coordinates"],
    }


def _max_or_none(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _mb(value) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (the model's device)")
    p.add_argument("--counts", default="100000", help="canary counts K, comma-separated")
    p.add_argument("--steps", type=int, default=None, help="T (default: the preset's, 100)")
    p.add_argument("--repeats", type=int, default=2, help="plain / audited pairs (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: OMP_NUM_THREADS, else torch's default)")
    p.add_argument("--dense-rows", action="store_true",
                   help="score the canaries as a dense (K, K) matrix (the old path)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the preset")
    a = p.parse_args(argv)
    threads = a.threads or (int(os.environ["OMP_NUM_THREADS"])
                            if os.environ.get("OMP_NUM_THREADS") else None)
    if threads:
        torch.set_num_threads(threads)
    warnings.simplefilter("ignore")
    counts = [int(k) for k in a.counts.split(",")]
    if a.dense_rows and max(counts) > 40000:
        p.error("--dense-rows needs K x K x 4 bytes of memory: K <= 40000")
    gpu = (torch.cuda.get_device_name(torch.device(a.device))
           if a.device.startswith("cuda") and torch.cuda.is_available() else "")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"machine {platform.node()} {platform.machine()} {platform.processor() or ''}"
          f"{' ' + gpu if gpu else ''}; {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()}, torch {torch.__version__}, load "
          f"{'n/a' if load is None else ', '.join(f'{x:.2f}' for x in load)}; device "
          f"{a.device}; {'DENSE (K, K) rows' if a.dense_rows else 'DiracRows'}", flush=True)
    rows = []
    for k in counts:
        ov = [f"canary.count={k}", f"seed={a.seed}", f"device={a.device}", "progress=false",
              *([f"dp.steps={a.steps}"] if a.steps else []), *a.overrides]
        r = measure(compose_settings(ov), a.repeats, a.dense_rows)
        rows.append(r)
        print(f"  K={k}: set-up {r['setup_s']:.1f} s ({r['setup_mb']:.0f} MB peak), plain "
              f"{r['plain_s']:.4f} s/step, audited {r['audited_s']:.4f} s/step", flush=True)
    r0 = rows[0]
    print(f"\n{PRESET}: MLP on mnist5k ({r0['params']:,} weights, {r0['live']:,} live), "
          f"{r0['n_train']} training examples, expected batch {r0['batch']}, T = {r0['steps']} "
          f"steps, seed {a.seed}, {a.repeats} plain / audited pairs (median time, max "
          f"memory); memory: {r0['memory']} during each training")
    print("| K | plain s/step | audited s/step | time ratio | plain peak MB (+ over start) "
          "| audited peak MB (+ over start) | peak ratio | set-up s (peak MB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['K']:,} | {r['plain_s']:.4f} | {r['audited_s']:.4f} "
              f"| {r['audited_s'] / r['plain_s']:.2f} "
              f"| {r['plain_mb']:.0f} (+{_mb(r['plain_extra_mb'])}) "
              f"| {r['audited_mb']:.0f} (+{_mb(r['audited_extra_mb'])}) "
              f"| {r['audited_mb'] / r['plain_mb']:.2f} | {r['setup_s']:.1f} "
              f"({r['setup_mb']:.0f}) |")


if __name__ == "__main__":
    main()
