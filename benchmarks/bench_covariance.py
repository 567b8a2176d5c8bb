"""Covariance score per step with the Woodbury estimator at d = 1e4, 1e5, 1e6 (n_r = 512).

Prints, per d, the time of one covariance-score step (K canaries whose gradients change every
step, as input canaries: O(K n_r d)) as a ratio to the scalar score and to one training step
(forward + backward, batch 64) of an MLP with ~d parameters,
and the peak resident memory added by building the estimator and scoring (measured RSS:
peak minus the RSS just before, each size in a fresh subprocess), as a ratio to the n_r x d
reference matrix itself: a constant ratio means memory linear in d, whereas a d x d float32
matrix alone would be d / n_r times the references (20x at d = 1e4, 2000x at d = 1e6).
"fixed/scalar" is the step with fixed gradient canaries (P (g* - mu_0) cached: O(K d)). Run:

    python benchmarks/bench_covariance.py [--dims 1e4 1e5 1e6] [--canaries 8]
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import resource
import time

import torch
from torch import nn

from dpaudit.attacks import CovarianceScore, ScalarProduct, StepContext, covariance_llr
from dpaudit.covariance import noise_aware, woodbury_precision


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _mlp_with_params(d: int, inputs: int = 64, classes: int = 10) -> nn.Module:
    hidden = max(1, round((d - classes) / (inputs + 1 + classes)))
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def bench(d: int, n_r: int, k: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(d)
    refs = torch.randn(n_r, d, generator=gen)
    refs_bytes = refs.numel() * refs.element_size()
    canaries = torch.randn(k, d, generator=gen)
    released = torch.randn(d, generator=gen)
    ctx = StepContext(0, 1.0, 1.0, 64.0, 0.01)

    gc.collect()
    before = _rss_bytes()
    t0 = time.perf_counter()
    op = noise_aware(woodbury_precision(refs, rel_ridge=0.1), 1.0, 1.0, 64.0)
    setup = time.perf_counter() - t0
    cov = CovarianceScore(op)
    cov.step(canaries, released, ctx)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before

    scal = ScalarProduct()
    t_cov = _time(lambda: covariance_llr(canaries, released, op.mean, op, 64.0), repeats)
    t_cached = _time(lambda: cov.step(canaries, released, ctx), repeats)
    t_scal = _time(lambda: scal.step(canaries, released, ctx), repeats)
    model = _mlp_with_params(d)
    x = torch.randn(64, 64, generator=gen)
    y = torch.randint(0, 10, (64,), generator=gen)

    def train_step():
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()

    t_train = _time(train_step, repeats)
    out = {
        "d": d,
        "mlp_params": sum(p.numel() for p in model.parameters()),
        "setup_s": setup,
        "cov_over_scalar": t_cov / t_scal,
        "cov_over_train_step": t_cov / t_train,
        "cached_over_scalar": t_cached / t_scal,
        "peak_extra_over_refs": peak / refs_bytes,
        "refs_MB": refs_bytes / 2**20,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    parser.add_argument("--refs", type=int, default=512)
    parser.add_argument("--canaries", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(f"n_r = {args.refs}, K = {args.canaries} canaries, float32, {threads} threads")
    print(
        f"{'d':>9} {'MLP d':>9} {'setup s':>8} {'cov/scalar':>11} {'cov/train':>10} "
        f"{'peak+/refs':>10} {'refs MB':>8} {'fixed/scalar':>12}"
    )
    ctx = mp.get_context("spawn")
    for d in args.dims:
        with ctx.Pool(1) as pool:  # a fresh process per size: peak RSS is per size
            r = pool.apply(bench, (int(d), args.refs, args.canaries, args.repeats))
        print(
            f"{r['d']:>9d} {r['mlp_params']:>9d} {r['setup_s']:>8.2f} "
            f"{r['cov_over_scalar']:>11.1f} "
            f"{r['cov_over_train_step']:>10.2f} {r['peak_extra_over_refs']:>10.2f} "
            f"{r['refs_MB']:>8.0f} {r['cached_over_scalar']:>12.1f}"
        )


if __name__ == "__main__":
    main()
