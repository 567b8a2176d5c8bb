"""Cost of input canaries: audited Opacus steps against plain training on B and on B + K rows.

Models (CIFAR-shaped synthetic inputs, 3 x 32 x 32, 10 classes; no download):

* ``mlp``: Flatten, Linear(3072, 320), ReLU, Linear(320, 10): 0.99M parameters;
* ``resnet``: a GroupNorm ResNet (3x3 stem, three basic blocks of widths 24 / 48 / 72 with
  stride-2 downsampling and 1x1 projection shortcuts, global average pooling, linear head):
  ~126k parameters.

One DP-SGD step (forward, backward, ``optimizer.step()``: Opacus' per-sample gradients, clip,
noise) at batch B = 64 (fixed-size batches, ``poisson_sampling=False``, so every configuration
trains on exactly B rows), one torch thread. Configurations, all from the same seed:

* ``plain``: training on the B rows;
* ``floor K``: plain training on B + K rows (the K canaries appended as training examples):
  the least any method pays that computes K more per-sample gradients;
* ``fold K``: training on the B rows with an ``AuditHook`` and K input canaries folded into the
  batch's forward/backward (``input_pass="auto"``; the scalar score);
* ``separate K``: the same with ``input_pass="separate"`` (one extra per-sample pass per step).

Timing is paired: each round runs one step of every configuration, in an order rotated every
round, so a slow spell of the (shared) machine hits all of them alike; a ratio is the median
over rounds of t_a(r) / t_b(r), printed with its [min - max] over rounds. The target of
issue 13 is ``fold K / floor K <= 1.05`` for K <= B / 4. Model size, batch, threads and
``os.getloadavg()`` (before and after) are printed beside the numbers.

With ``--memory``, each configuration also runs in a fresh subprocess that reports the growth
of its peak resident set over T steps (CPU; glibc told to mmap blocks >= 64 KiB so that freed
tensors leave the resident set) and the tensor memory the hook holds: it must not grow with T.

Run: ``python benchmarks/bench_capture.py`` (``--quick`` for a smoke run; ``--rounds``,
``--ks``, ``--models``, ``--memory`` to choose).
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

import numpy as np
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.capture import AuditHook, InputCanaries

warnings.filterwarnings("ignore")
B = 64
SHAPE = (3, 32, 32)
CLASSES = 10


class _Block(nn.Module):
    """Basic residual block: conv-GN-ReLU-conv-GN plus a (projected) shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = nn.GroupNorm(8, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = nn.GroupNorm(8, cout)
        self.short = (
            nn.Conv2d(cin, cout, 1, stride, bias=False)
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        h = torch.relu(self.n1(self.c1(x)))
        return torch.relu(self.n2(self.c2(h)) + self.short(x))


def build(name: str) -> nn.Module:
    """The benchmark's ``mlp`` (1M parameters) or GroupNorm ``resnet`` (~126k)."""
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3072, 320), nn.ReLU(), nn.Linear(320, 10))
    if name == "resnet":
        return nn.Sequential(
            nn.Conv2d(3, 24, 3, 1, 1, bias=False),
            nn.GroupNorm(8, 24),
            nn.ReLU(),
            _Block(24, 24, 1),
            _Block(24, 48, 2),
            _Block(48, 72, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(72, CLASSES),
        )
    raise ValueError(f"model must be 'mlp' or 'resnet', got {name!r}")


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *SHAPE, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def setup(model_name: str, config: str, k: int, seed: int = 0):
    """(model, optimizer, endless batch iterator, hook or None) for one configuration."""
    torch.manual_seed(seed)
    module = build(model_name)
    x, y = _data(40 * B, seed)
    loader = DataLoader(
        TensorDataset(x, y), batch_size=B, generator=torch.Generator().manual_seed(seed)
    )
    model, opt, loader = PrivacyEngine().make_private(
        module=module,
        optimizer=torch.optim.SGD(module.parameters(), lr=0.05),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=False,
        noise_generator=torch.Generator().manual_seed(seed + 1),
    )
    cx, cy = _data(max(k, 1), seed + 2)
    hook = None
    if config in ("fold", "separate"):
        pass_ = "auto" if config == "fold" else "separate"
        hook = AuditHook(opt, model, InputCanaries(cx, cy), input_pass=pass_).attach()

    def batches():
        while True:
            for xb, yb in loader:
                if config == "floor":
                    xb, yb = torch.cat([xb, cx]), torch.cat([yb, cy])
                yield xb, yb

    return model, opt, batches(), hook


def step(model, opt, batches) -> tuple[float, float]:
    """One training iteration on an already built batch stream; returns its (wall, CPU)
    seconds (CPU: ``time.process_time``, user + system time of this process, which a busy
    shared machine perturbs less than wall time)."""
    xb, yb = next(batches)
    wall, cpu = time.perf_counter(), time.process_time()
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
    return time.perf_counter() - wall, time.process_time() - cpu


def _summary(a: list[float], b: list[float]) -> str:
    r = np.asarray(a) / np.asarray(b)
    return f"{np.median(r):.3f} [{r.min():.3f}-{r.max():.3f}]"


def time_ratios(model_name: str, ks: list[int], rounds: int, warmup: int = 3) -> dict:
    """Paired per-round step times of every configuration (module doc)."""
    configs = [("plain", 0)]
    for k in ks:
        configs += [("floor", k), ("fold", k), ("separate", k)]
    setups = {c: setup(model_name, *c) for c in configs}
    for model, opt, batches, _ in setups.values():
        for _ in range(warmup):  # the fold's first step is its RNG probe (separate pass)
            step(model, opt, batches)
    times: dict[tuple, list[float]] = {c: [] for c in configs}
    cpu: dict[tuple, list[float]] = {c: [] for c in configs}
    for r in range(rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for c in order:
            model, opt, batches, _ = setups[c]
            wall, used = step(model, opt, batches)
            times[c].append(wall)
            cpu[c].append(used)
    folded = {k: setups[("fold", k)][3].folded_steps for k in ks}
    steps = {k: setups[("fold", k)][3].steps for k in ks}
    d = sum(p.numel() for p in setups[configs[0]][0].parameters())
    return {"d": d, "times": times, "cpu": cpu, "folded": folded, "steps": steps}


# ---------------------------------------------------------------------------- memory
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _tensor_bytes(obj, seen: set) -> int:
    """Bytes of the distinct tensors reachable from ``obj`` through containers/attributes."""
    if id(obj) in seen or isinstance(obj, nn.Module | torch.optim.Optimizer):
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple | set):
        return sum(_tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("dpaudit"):
        return _tensor_bytes(vars(obj), seen)
    return 0


def memory_child(model_name: str, config: str, k: int, steps: int) -> None:
    """Subprocess body: print the extra peak memory (bytes) of ``steps`` steps and the tensor
    bytes the hook holds (parameters excluded)."""
    torch.set_num_threads(1)
    model, opt, batches, hook = setup(model_name, config, k)
    step(model, opt, batches)
    base = _rss_bytes()
    for _ in range(steps):
        step(model, opt, batches)
    extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    seen = {id(p) for p in model.parameters()}
    held = _tensor_bytes(hook, seen) if hook is not None else 0
    print(json.dumps({"extra": extra, "held": held}))


def memory(model_name: str, config: str, k: int, steps: int) -> tuple[float, float]:
    """(extra peak MB, hook-held MB) from a fresh subprocess."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, __file__, "--child", model_name, config, str(k), str(steps)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    rec = json.loads(out.strip().splitlines()[-1])
    return rec["extra"] / 2**20, rec["held"] / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--rounds", type=int, default=None, help="paired rounds per model")
    parser.add_argument("--ks", default="16", help="comma-separated K values (default 16)")
    parser.add_argument("--models", default="mlp,resnet")
    parser.add_argument("--memory", action="store_true", help="also measure peak memory")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, config, k, steps = args.child
        memory_child(name, config, int(k), int(steps))
        return
    torch.set_num_threads(1)
    ks = [int(k) for k in args.ks.split(",")]
    rounds = args.rounds or (3 if args.quick else 15)
    print(
        f"device: cpu; torch threads: {torch.get_num_threads()}; batch B = {B}; K = {ks}; "
        f"{rounds} paired rounds; load average before: {os.getloadavg()}"
    )
    for name in args.models.split(","):
        r = time_ratios(name, ks, rounds, warmup=1 if args.quick else 3)
        print(
            f"\n{name}: d = {r['d']:,} parameters, B = {B}, plain step "
            f"{np.median(r['times'][('plain', 0)]) * 1e3:.0f} ms wall / "
            f"{np.median(r['cpu'][('plain', 0)]) * 1e3:.0f} ms CPU (medians); load average "
            f"after: {os.getloadavg()}"
        )
        print("  time  K   K/B    fold/floor             floor/plain            fold/plain"
              "             separate/plain")
        for clock in ("cpu", "times"):
            t = r[clock]
            plain = t[("plain", 0)]
            for k in ks:
                fold, floor, sep = t[("fold", k)], t[("floor", k)], t[("separate", k)]
                print(
                    f"  {'CPU ' if clock == 'cpu' else 'wall'}  {k:<3d} {k / B:.3f}  "
                    f"{_summary(fold, floor):22s} {_summary(floor, plain):22s} "
                    f"{_summary(fold, plain):22s} {_summary(sep, plain)}"
                )
        for k in ks:
            assert r["folded"][k] == r["steps"][k] - 1, "the fold path was not taken"
        if args.memory:
            t1, t2 = (2, 6) if args.quick else (4, 12)
            print(f"  peak extra MB over T = {t1} / {t2} steps, hook-held MB:")
            for config, k in [("plain", 0)] + [(c, k) for k in ks for c in ("floor", "fold")]:
                (p1, h1), (p2, h2) = memory(name, config, k, t1), memory(name, config, k, t2)
                print(
                    f"    {config:8s} K={k:<3d} {p1:8.1f} / {p2:8.1f}    held {h1:.3f} / {h2:.3f}"
                    f"    (K d = {k * r['d'] * 4 / 2**20:.1f} MB)"
                )


if __name__ == "__main__":
    main()
