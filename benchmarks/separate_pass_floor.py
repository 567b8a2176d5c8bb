"""The floor of a separate input-canary pass: what K rows cost on their own, next to a step.

A model that ``input_pass="auto"`` never folds (Opacus' attention and recurrent layers:
``capture.fold.row_coupled_modules``) computes its K input canaries' clipped gradients in a pass
of their own at every step. Whatever that pass does, it runs the model forward and backward on
K rows, so a bare forward and backward of K rows is its floor.
This script times, on one of ``gpu_cost.py``'s set-ups, in one process, the median over
``--rounds`` of:

* ``step``: one plain DP-SGD step of the expected batch B (forward, backward, ``optimizer.step``);
* ``bare``: a forward and backward of the K canary rows on the user's module without Opacus'
  per-sample hooks (the floor: no per-sample gradient at all);
* ``hooked``: the same through the ``GradSampleModule`` (per-sample hooks on, no clipping);
* ``opacus`` / ``func``: ``per_sample_clipped_grads`` of the K rows with either backend (what the
  hook's separate pass calls),

and prints each against ``step``, with the model size, B, K, the threads and the load.

    OMP_NUM_THREADS=2 python benchmarks/separate_pass_floor.py --setup transformer_b64 \
        --scale 0.25 --k 4
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_cost  # the set-ups' models and data


def _median_ms(fn, rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setup", default="transformer_b64", choices=sorted(gpu_cost.SETUPS))
    p.add_argument("--scale", type=float, default=0.25)
    p.add_argument("--k", type=int, default=4, help="input canaries (rows of the pass)")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    if a.k < 1 or a.rounds < 1:
        raise SystemExit(f"--k and --rounds must be positive, got {a.k} and {a.rounds}")
    warnings.simplefilter("ignore")
    from dpaudit.gradients import per_sample_clipped_grads

    name, batch, _ = gpu_cost.SETUPS[a.setup]
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = gpu_cost.data(name, gpu_cost.BATCHES * batch, gen)
    model, opt = _private(name, a.scale, x, y, batch)
    xb, yb = x[:batch], y[:batch]
    xc, yc = gpu_cost.data(name, a.k, gen)
    loss = nn.functional.cross_entropy

    def step():
        opt.zero_grad()
        loss(model(xb), yb).backward()
        opt.step()

    def bare():  # Opacus' hooks switched off: they return at once, nothing is captured
        opt.zero_grad()
        model.disable_hooks()
        try:
            loss(model(xc), yc).backward()
        finally:
            model.enable_hooks()

    def hooked():
        opt.zero_grad()
        loss(model(xc), yc).backward()

    def backend(which):
        return lambda: per_sample_clipped_grads(model, xc, yc, loss, 1.0, backend=which)

    ms = {"step": _median_ms(step, a.rounds), "bare": _median_ms(bare, a.rounds),
          "hooked": _median_ms(hooked, a.rounds),
          "opacus": _median_ms(backend("opacus"), a.rounds),
          "func": _median_ms(backend("func"), a.rounds)}
    weights = sum(q.numel() for q in model.parameters())
    print(f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}; {a.setup} at scale "
          f"{a.scale}: {weights:,} weights, B = {batch}, K = {a.k}, median of {a.rounds}")
    print("| pass | ms | / step |\n|---|---|---|")
    for key, label in [("step", f"plain step of B = {batch}"),
                       ("bare", f"forward + backward of K = {a.k}, no hooks (the floor)"),
                       ("hooked", f"forward + backward of K = {a.k}, Opacus' hooks"),
                       ("opacus", "per_sample_clipped_grads, Opacus' hooks"),
                       ("func", "per_sample_clipped_grads, torch.func")]:
        print(f"| {label} | {ms[key]:.1f} | {ms[key] / ms['step']:.3f} |")


def _private(name: str, scale: float, x, y, batch: int):
    """The set-up's model and optimizer after ``make_private`` (Opacus' GradSampleModule)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    module = gpu_cost.build(name, scale)
    model, opt, _ = PrivacyEngine().make_private(
        module=module, optimizer=torch.optim.SGD(module.parameters(), lr=0.05),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=batch), noise_multiplier=1.0,
        max_grad_norm=1.0)
    return model, opt


if __name__ == "__main__":
    main()
