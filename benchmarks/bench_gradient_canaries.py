"""K Dirac gradient canaries on a 1M-parameter MLP: time and peak memory against plain Opacus.

Each measurement runs in its own process (peak RSS is per process): ``plain`` trains with
Opacus only, ``dirac`` attaches an ``AuditHook`` with K ``GradientCanaries.dirac`` canaries
(built as the README shows, no ``coordinates=``). Rounds alternate plain / dirac; the script
prints per-round time ratios (median [min-max]), the peak-RSS ratio, the set-up time, the
threads and the machine load.

    python benchmarks/bench_gradient_canaries.py --k 1000 --steps 20 --rounds 3
    python benchmarks/bench_gradient_canaries.py --k 1000 --steps 40 --interleaved

``--interleaved`` times both in one process, stepping a plain and an audited copy alternately
(paired per-step ratios of wall and CPU time), which a loaded machine disturbs far less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings


def _make_private(model, x, y, batch: int):
    """Opacus DP-SGD on fixed batches of ``batch`` rows of (x, y): (model, optimizer)."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    model, opt, _ = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=batch),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=False,
    )
    return model, opt


def _dirac_hook(opt, model, dim: int, k: int):
    """An attached AuditHook with k Dirac canaries on random coordinates (half in, half out)."""
    import torch

    from dpaudit.capture import AuditHook, GradientCanaries

    coords = torch.randperm(dim, generator=torch.Generator().manual_seed(1))[:k]
    pols = ["every_step", "never"] * (k // 2) + ["never"] * (k % 2)
    canaries = GradientCanaries.dirac(coords.tolist(), 1.0, dim, policy=pols)
    return AuditHook(opt, model, canaries).attach()


def _step(model, opt, x, y, batch: int, i: int) -> None:
    """One DP-SGD step on the (i mod 4)-th fixed batch."""
    from torch import nn

    rows = slice((i % 4) * batch, (i % 4 + 1) * batch)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
    opt.step()


def child(mode: str, k: int, steps: int, batch: int, width: int) -> dict:
    """One process: build, warm up 3 steps, time ``steps`` steps; return the measurements."""
    import torch
    from torch import nn

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    dim = sum(p.numel() for p in model.parameters())
    x, y = torch.randn(batch * 4, width), torch.randint(0, 10, (batch * 4,))
    model, opt = _make_private(model, x, y, batch)
    t0 = time.perf_counter()
    hook = None
    if mode == "dirac":
        hook = _dirac_hook(opt, model, dim, k)
    setup = time.perf_counter() - t0

    def step(i: int) -> None:
        _step(model, opt, x, y, batch, i)

    for i in range(3):
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    per_step = (time.perf_counter() - t0) / steps
    if hook is not None:
        assert hook.steps == steps + 3 and hook.routed
        hook.detach()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "step_s": per_step, "setup_s": setup, "maxrss_mb": rss_mb, "dim": dim}


def interleaved(k: int, steps: int, batch: int, width: int) -> dict:
    """One process, two identical models (one plain, one audited) stepped alternately: per-step
    paired ratios of wall time and of this process's CPU time (robust to machine load)."""
    import torch
    from torch import nn

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    x, y = torch.randn(batch * 4, width), torch.randint(0, 10, (batch * 4,))
    runs = []
    for audited in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
        dim = sum(p.numel() for p in model.parameters())
        model, opt = _make_private(model, x, y, batch)
        if audited:
            _dirac_hook(opt, model, dim, k)
        runs.append((model, opt))

    def step(model, opt, i):
        _step(model, opt, x, y, batch, i)

    wall, cpu = [], []
    for i in range(steps + 3):
        pair = []
        for model, opt in runs if i % 2 == 0 else runs[::-1]:
            w0, c0 = time.perf_counter(), time.process_time()
            step(model, opt, i)
            pair.append((time.perf_counter() - w0, time.process_time() - c0))
        if i % 2:
            pair = pair[::-1]
        if i >= 3:
            wall.append(pair[1][0] / pair[0][0])
            cpu.append(pair[1][1] / pair[0][1])
    return {"wall": sorted(wall), "cpu": sorted(cpu), "dim": dim}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=1000)
    ap.add_argument("--child", default=None)
    ap.add_argument("--interleaved", action="store_true", help="time only, one process")
    a = ap.parse_args()
    if a.interleaved:
        r = interleaved(a.k, a.steps, a.batch, a.width)
        w, c = r["wall"], r["cpu"]
        print(
            f"interleaved d={r['dim']} B={a.batch} K={a.k} threads=1 steps={len(w)}: "
            f"wall ratio median {w[len(w) // 2]:.3f} [{w[0]:.3f}-{w[-1]:.3f}], CPU-time ratio "
            f"median {c[len(c) // 2]:.3f} [{c[0]:.3f}-{c[-1]:.3f}], load {os.getloadavg()}"
        )
        return
    if a.child:
        print(json.dumps(child(a.child, a.k, a.steps, a.batch, a.width)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rows = []
    for r in range(a.rounds):
        res = {}
        for mode in ("plain", "dirac") if r % 2 == 0 else ("dirac", "plain"):
            cmd = [sys.executable, __file__, "--child", mode, "--k", str(a.k)]
            cmd += ["--steps", str(a.steps), "--batch", str(a.batch), "--width", str(a.width)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(res)
        t = res["dirac"]["step_s"] / res["plain"]["step_s"]
        m = res["dirac"]["maxrss_mb"] / res["plain"]["maxrss_mb"]
        print(
            f"round {r}: d={res['plain']['dim']} B={a.batch} K={a.k} threads=1 "
            f"plain {res['plain']['step_s'] * 1e3:.1f} ms/step {res['plain']['maxrss_mb']:.0f} MB, "
            f"dirac {res['dirac']['step_s'] * 1e3:.1f} ms/step {res['dirac']['maxrss_mb']:.0f} MB "
            f"(set-up {res['dirac']['setup_s']:.2f} s): time x{t:.3f}, peak RSS x{m:.3f}, "
            f"load {os.getloadavg()[0]:.2f}"
        )
    ts = sorted(r["dirac"]["step_s"] / r["plain"]["step_s"] for r in rows)
    ms = sorted(r["dirac"]["maxrss_mb"] / r["plain"]["maxrss_mb"] for r in rows)
    med = ts[len(ts) // 2]
    print(
        f"time ratio median {med:.3f} [{ts[0]:.3f}-{ts[-1]:.3f}], peak RSS ratio median "
        f"{ms[len(ms) // 2]:.3f} [{ms[0]:.3f}-{ms[-1]:.3f}], load {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
