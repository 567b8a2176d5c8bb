"""Cost of the covariance (Woodbury) and GLiR scores: per score step and per audited step.

Two parts, each size in a fresh subprocess (peak memory is per process), one torch thread
unless ``--threads``; the machine load (``os.getloadavg``) is printed beside every ratio.
Times are wall clock and process CPU time (``time.process_time``); on a loaded machine the
CPU-time ratios are the less disturbed ones (waiting for a core is not counted).

1. ``score``: synthetic float32 references (n_r x d, N(0, 1)) and K canary gradients that
   change every step (as input canaries), at d = 1e5 and 1e6. Prints the set-up time of the
   noise-aware Woodbury precision, and paired per-round ratios (median [min-max]) of one
   covariance-score step to one scalar-score step: the current algorithm (one projection per
   vector, ``PrecisionOperator.quadratic_forms``) and the previous one (P applied to the K
   canaries: project and lift). Memory: the process' peak resident set while building the
   precision and scoring 3 steps, minus the resident set before the references existed, as a
   ratio to the reference matrix (1.0 = nothing beyond the references).
2. ``audit``: the 1M-parameter MLP of ``bench_capture.py`` (Flatten, Linear(3072, 320), ReLU,
   Linear(320, 10): 0.99M parameters) on synthetic CIFAR-shaped inputs whose coordinate
   variances decay as 1/k (a power-law spectrum, as images have; N(0, I) inputs would give
   reference gradients with a flat spectrum, where no truncation helps), trained with Opacus
   (fixed batches B = 64, sigma = 1, C = 1) with K input canaries (``AuditHook``), scored by
   the scalar product, the covariance score or GLiR (n_r clipped per-sample gradients of the
   model at theta_0 as references, Woodbury precision with rel_ridge = 1e-3, noise-aware), and
   the covariance score with a truncated reference span (``--explained``). The configurations
   start from the same seed (same batches) and run one step each per round in a
   rotated order; printed: median [min-max] of the per-round ratios covariance-step /
   scalar-step (and GLiR / scalar), the set-up time (Woodbury + noise shift, no truncation and
   with ``explained_variance``), and peak memory while building the precision and running
   covariance-scored steps, as a ratio to (reference matrix + model parameters): the
   process' peak minus its resident set before the build, plus the references and the model;
   and the peak of two covariance-scored steps minus that of two scalar-scored steps.

Run: ``python benchmarks/bench_covariance.py`` (both parts; ``--part score|audit``,
``--dims 1e5 1e6``, ``--canaries 16``, ``--refs 256``, ``--rounds 8``, ``--threads 1``).
glibc is told to return freed blocks >= 64 KiB at once (``MALLOC_MMAP_THRESHOLD_``) so that the
resident set follows the tensors.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn

from dpaudit.attacks import CovarianceScore, GLiRScore, ScalarProduct, StepContext
from dpaudit.covariance import PrecisionOperator, noise_aware, woodbury_precision

warnings.filterwarnings("ignore")


def _rss() -> int:
    """Current resident set size in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    """Reset the kernel's peak resident set (VmHWM) to the current one (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak() -> int:
    """Peak resident set size (VmHWM) in bytes since the last ``_reset_peak``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _summary(ratios) -> str:
    r = np.asarray(ratios)
    return f"{np.median(r):.2f} [{r.min():.2f}-{r.max():.2f}]"


def _old_llr(op: PrecisionOperator, g_star, released, b: float) -> torch.Tensor:
    """The previous algorithm: P applied to the K centred canaries (project, then lift)."""
    diff = g_star - op.mean
    pdiff = op.apply(diff)
    return pdiff @ (released - op.mean) - (pdiff * diff).sum(1) / (2.0 * b)


def score_part(d: int, n_r: int, k: int, rounds: int) -> dict:
    """Part 1 at one d (run in a fresh subprocess)."""
    gen = torch.Generator().manual_seed(d)
    canaries = [torch.randn(k, d, generator=gen) for _ in range(2)]  # alternate: no cache hit
    released = torch.randn(d, generator=gen)
    gc.collect()
    base = _rss()
    refs = torch.randn(n_r, d, generator=gen)
    refs_bytes = refs.numel() * refs.element_size()
    ctx = StepContext(0, 1.0, 1.0, 64.0, 64.0 / 60_000)
    gc.collect()
    _reset_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    op = noise_aware(woodbury_precision(refs, rel_ridge=0.1), 1.0, 1.0, 64.0)
    setup, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
    cov = CovarianceScore(op)
    for i in range(3):
        cov.step(canaries[i % 2], released, ctx)
    peak = _peak() - base
    scal = ScalarProduct()
    ratios_new, ratios_old, t_scal, cpu_new, cpu_old = [], [], [], [], []
    for i in range(rounds + 1):
        c = canaries[i % 2]
        t, u = [time.perf_counter()], [time.process_time()]
        for fn in (
            lambda c=c: scal.step(c, released, ctx),
            lambda c=c: cov.step(c, released, ctx),
            lambda c=c: _old_llr(op, c, released, 64.0),
        ):
            fn()
            t.append(time.perf_counter())
            u.append(time.process_time())
        if i:  # the first round warms up
            s, n, o = np.diff(t)
            su, nu, ou = np.diff(u)
            ratios_new.append(n / s)
            ratios_old.append(o / s)
            cpu_new.append(nu / su)
            cpu_old.append(ou / su)
            t_scal.append(s)
    return {
        "d": d,
        "setup_s": setup,
        "setup_cpu_s": setup_cpu,
        "new_over_scalar": _summary(ratios_new),
        "old_over_scalar": _summary(ratios_old),
        "new_over_scalar_cpu": _summary(cpu_new),
        "old_over_scalar_cpu": _summary(cpu_old),
        "scalar_ms": 1e3 * float(np.median(t_scal)),
        "peak_over_refs": peak / refs_bytes,
        "refs_MB": refs_bytes / 2**20,
        "load": os.getloadavg(),
    }


def _mlp(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3072, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _inputs(n: int, gen: torch.Generator) -> torch.Tensor:
    """(n, 3, 32, 32) inputs, coordinate k with variance proportional to 1/(k+1), mean 1."""
    scale = 1.0 / torch.arange(1, 3073, dtype=torch.float32).sqrt()
    scale *= (3072 / (scale**2).sum()).sqrt()
    return (torch.randn(n, 3072, generator=gen) * scale).reshape(n, 3, 32, 32)


def _reference_grads(model: nn.Module, x, y, clip: float, chunk: int = 32) -> torch.Tensor:
    """Clipped per-sample gradients (n, d) of ``model`` at its current parameters."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}
    d = sum(p.numel() for p in params.values())

    def loss(p, xi, yi):
        return nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
    out = torch.empty(x.shape[0], d)
    for i in range(0, x.shape[0], chunk):
        gs = per_sample(params, x[i : i + chunk], y[i : i + chunk])
        flat = torch.cat([g.reshape(g.shape[0], -1) for g in gs.values()], 1)
        flat *= (clip / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)
        out[i : i + chunk] = flat
    return out


def audit_part(hidden: int, n_r: int, k: int, rounds: int, explained: float) -> dict:
    """Part 2 (run in a fresh subprocess)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from dpaudit.capture import AuditHook, InputCanaries

    gen = torch.Generator().manual_seed(0)
    n_data, batch = 64 * 40, 64
    x = _inputs(n_data + k + n_r, gen)
    y = torch.randint(0, 10, (n_data + k + n_r,), generator=gen)
    xc, yc = x[n_data : n_data + k], y[n_data : n_data + k]
    xr, yr = x[n_data + k :], y[n_data + k :]

    def setup(scores_fn):
        torch.manual_seed(0)
        model = _mlp(hidden)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = DataLoader(
            TensorDataset(x[:n_data], y[:n_data]),
            batch_size=batch,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
        )
        model, opt, loader = PrivacyEngine().make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=False,
        )
        hook = AuditHook(opt, model, InputCanaries(xc, yc), scores=scores_fn()).attach()
        return model, opt, loader, hook

    torch.manual_seed(0)
    plain = _mlp(hidden)
    d = sum(p.numel() for p in plain.parameters())
    model_bytes = 4 * d
    refs = _reference_grads(plain, xr, yr, 1.0)
    refs_bytes = refs.numel() * refs.element_size()
    b_exp = float(batch)

    def build(ev=None):
        return noise_aware(
            woodbury_precision(refs, rel_ridge=1e-3, explained_variance=ev), 1, 1, b_exp
        )

    build()  # warm-up (BLAS / LAPACK initialisation)
    gc.collect()
    before = _rss()
    _reset_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    op = build()
    setup_s, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_build = _peak() - before
    gc.collect()
    before = _rss()
    _reset_peak()
    t0 = time.perf_counter()
    op_ev = build(explained)
    setup_ev_s = time.perf_counter() - t0
    peak_build_ev = _peak() - before
    configs = {
        "scalar": lambda: [ScalarProduct()],
        "covariance": lambda: [CovarianceScore(op)],
        "glir": lambda: [GLiRScore(op)],
        f"cov ev={explained}": lambda: [CovarianceScore(op_ev)],
    }
    runs = {name: setup(fn) for name, fn in configs.items()}
    streams = {name: _endless(r[2]) for name, r in runs.items()}

    def one_step(name):
        model, opt, _, _ = runs[name]
        xb, yb = next(streams[name])
        t, c = time.perf_counter(), time.process_time()
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        return time.perf_counter() - t, time.process_time() - c

    names = list(configs)
    for name in names:  # warm-up
        one_step(name)
    gc.collect()
    before_steps = _rss()
    _reset_peak()
    times = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(one_step(name))
    peak_steps = _peak() - before_steps
    step_peaks = {}
    for name in ("scalar", "covariance"):
        gc.collect()
        _reset_peak()
        for _ in range(2):
            one_step(name)
        step_peaks[name] = _peak()
    wall = {n: np.array([t[0] for t in v]) for n, v in times.items()}
    cpu = {n: np.array([t[1] for t in v]) for n, v in times.items()}
    scal, scal_cpu = wall["scalar"], cpu["scalar"]
    out = {
        "d": d,
        "K": k,
        "n_r": n_r,
        "B": batch,
        "setup_s": setup_s,
        "setup_ev_s": setup_ev_s,
        "rank": op.rank_kept,
        "rank_ev": op_ev.rank_kept,
        "ev_kept": op_ev.explained_variance_kept,
        "scalar_step_ms": 1e3 * float(np.median(scal)),
        "setup_cpu_s": setup_cpu,
        "scalar_step_cpu_ms": 1e3 * float(np.median(scal_cpu)),
        "ratios": {n: _summary(wall[n] / scal) for n in names if n != "scalar"},
        "ratios_cpu": {n: _summary(cpu[n] / scal_cpu) for n in names if n != "scalar"},
        # peak: (refs + model + the extra of building both operators) / (refs + model)
        "peak_build_ratio": (refs_bytes + model_bytes + peak_build) / (refs_bytes + model_bytes),
        "peak_build_ev_ratio": (refs_bytes + model_bytes + peak_build_ev)
        / (refs_bytes + model_bytes),
        "peak_steps_extra_MB": peak_steps / 2**20,
        "cov_step_peak_minus_scalar_MB": (step_peaks["covariance"] - step_peaks["scalar"]) / 2**20,
        "refs_MB": refs_bytes / 2**20,
        "load": os.getloadavg(),
    }
    return out


def _endless(loader):
    while True:
        yield from loader


def _child(args) -> None:
    torch.set_num_threads(args.threads)
    if args.child == "score":
        res = score_part(int(args.d), args.refs, args.canaries, args.rounds)
    else:
        res = audit_part(args.hidden, args.refs, args.canaries, args.rounds, args.explained)
    print("RESULT " + json.dumps(res))


def _run_child(argv: list[str]) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, __file__, *argv], env=env, capture_output=True, text=True, check=True
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["score", "audit", "both"], default="both")
    parser.add_argument("--dims", nargs="+", type=float, default=[1e5, 1e6])
    parser.add_argument("--refs", type=int, default=256)
    parser.add_argument("--canaries", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=320)  # 3072*320 + 320 + 3210: 0.99M
    parser.add_argument("--explained", type=float, default=0.9)
    parser.add_argument("--child", choices=["score", "audit"], help=argparse.SUPPRESS)
    parser.add_argument("--d", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    common = ["--refs", str(args.refs), "--canaries", str(args.canaries)]
    common += ["--rounds", str(args.rounds), "--threads", str(args.threads)]
    print(
        f"n_r = {args.refs}, K = {args.canaries}, float32, {args.threads} thread(s), "
        f"{os.cpu_count()} cpus, load {os.getloadavg()}"
    )
    if args.part in ("score", "both"):
        print("\n[score] covariance step / scalar step (K canaries changing every step)")
        print(
            f"{'d':>9} {'setup s':>8} {'(cpu)':>6} {'new/scalar':>18} {'old/scalar':>18} "
            f"{'new/scalar cpu':>18} {'old/scalar cpu':>18} {'scalar ms':>9} {'peak/refs':>9} "
            f"{'refs MB':>8}  load"
        )
        for d in args.dims:
            r = _run_child(["--child", "score", "--d", str(d), *common])
            print(
                f"{r['d']:>9d} {r['setup_s']:>8.2f} {r['setup_cpu_s']:>6.2f} "
                f"{r['new_over_scalar']:>18} {r['old_over_scalar']:>18} "
                f"{r['new_over_scalar_cpu']:>18} {r['old_over_scalar_cpu']:>18} "
                f"{r['scalar_ms']:>9.2f} {r['peak_over_refs']:>9.2f} "
                f"{r['refs_MB']:>8.0f}  {tuple(round(v, 2) for v in r['load'])}"
            )
    if args.part in ("audit", "both"):
        r = _run_child(
            [
                "--child",
                "audit",
                *("--hidden", str(args.hidden), "--explained", str(args.explained)),
                *common,
            ]
        )
        print(
            f"\n[audit] MLP d = {r['d']}, B = {r['B']}, K = {r['K']} input canaries, "
            f"n_r = {r['n_r']} clipped per-sample reference gradients"
        )
        print(
            f"scalar-scored audited step: {r['scalar_step_ms']:.0f} ms wall, "
            f"{r['scalar_step_cpu_ms']:.0f} ms CPU (median)"
        )
        for name, ratio in r["ratios"].items():
            print(f"{name:>16s} / scalar step: wall {ratio}, CPU {r['ratios_cpu'][name]}")
        print(
            f"set-up (woodbury + noise shift): {r['setup_s']:.2f} s wall, "
            f"{r['setup_cpu_s']:.2f} s CPU, rank {r['rank']}; with "
            f"explained_variance={args.explained}: {r['setup_ev_s']:.2f} s, rank {r['rank_ev']} "
            f"({r['ev_kept']:.3f} of the variance)"
        )
        print(
            f"peak memory while building: {r['peak_build_ratio']:.2f} x (references "
            f"{r['refs_MB']:.0f} MB + model {4 * r['d'] / 2**20:.0f} MB), "
            f"{r['peak_build_ev_ratio']:.2f} x with explained_variance; extra peak during the "
            f"audited steps (all four configurations): {r['peak_steps_extra_MB']:.0f} MB; "
            f"covariance-step peak - scalar-step peak: {r['cov_step_peak_minus_scalar_MB']:.0f} MB"
        )
        print(f"load {tuple(round(v, 2) for v in r['load'])}")


if __name__ == "__main__":
    main()
