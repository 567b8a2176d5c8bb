"""The audit's cost inside a user's own training loop at the scale people train on GPUs.

Two models, each trained with Opacus DP-SGD in an ordinary loop, (a) plainly and (b) with
``AuditHook`` (1,000 Dirac gradient canaries and 64 input canaries, the white-box records on:
the hook's defaults), alternated ``--repeats`` times on the same seed:

* ``resnet18``: a ResNet-18-shaped CNN (BasicBlocks [2, 2, 2, 2], widths 64-512, GroupNorm for
  DP, 11.2M weights) on CIFAR-shaped synthetic data (3 x 32 x 32, 10 classes);
* ``transformer``: a small transformer classifier (token embedding 1,000 x 256, 4 blocks of
  Opacus' ``DPMultiheadAttention`` with 4 heads + a 1,024-wide MLP, sequences of 64 tokens).

Prints, per model, the median seconds per optimizer step over the steps after ``--warmup``
(``torch.cuda.synchronize`` around each step on CUDA), the peak memory of each training
(``torch.cuda.max_memory_allocated`` on CUDA, the process's peak RSS on CPU), their ratios,
and with ``--profile`` the 15 operators that take the most time in three audited steps.
Prints the device, threads and load. ``--scale`` shrinks the widths (a CPU smoke test).

    python benchmarks/gpu_cost.py --device cuda
    python benchmarks/gpu_cost.py --device cuda --profile --models resnet18
    OMP_NUM_THREADS=2 python benchmarks/gpu_cost.py --scale 0.125 --steps 3 --warmup 1 \
        --batch 8 --repeats 1          # CPU smoke test
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
import warnings

import torch
from torch import nn


def _gn(c: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(32, c), c)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = _gn(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = _gn(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _gn(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        out = torch.relu(self.n1(self.c1(x)))
        return torch.relu(self.n2(self.c2(out)) + self.short(x))


def resnet18(scale: float = 1.0, classes: int = 10) -> nn.Module:
    w = [max(4, int(c * scale)) for c in (64, 128, 256, 512)]
    layers = [nn.Conv2d(3, w[0], 3, 1, 1, bias=False), _gn(w[0]), nn.ReLU()]
    cin = w[0]
    for i, c in enumerate(w):
        for j in range(2):
            layers.append(BasicBlock(cin, c, 2 if (j == 0 and i > 0) else 1))
            cin = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        from opacus.layers import DPMultiheadAttention

        self.attn = DPMultiheadAttention(d, heads, batch_first=True)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))

    def forward(self, x):
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class Transformer(nn.Module):
    def __init__(self, scale: float = 1.0, vocab: int = 1000, seq: int = 64, classes: int = 10):
        super().__init__()
        d = max(8, int(256 * scale)) // 4 * 4
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*(Block(d, 4, 4 * d) for _ in range(4)))
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = self.blocks(self.tok(tokens) + self.pos(pos))
        return self.head(x.mean(dim=1))


def data(name: str, n: int, gen: torch.Generator):
    y = torch.randint(0, 10, (n,), generator=gen)
    if name == "resnet18":
        return torch.randn(n, 3, 32, 32, generator=gen), y
    return torch.randint(0, 1000, (n, 64), generator=gen), y


def build(name: str, scale: float):
    return resnet18(scale) if name == "resnet18" else Transformer(scale)


def peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(name: str, audited: bool, a, device: torch.device, profile: bool = False):
    """One training of ``a.steps`` steps: (seconds per step after warm-up, peak MB)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = data(name, 64 * a.batch, gen)
    model = build(name, a.scale).to(device)
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=a.batch),
        noise_multiplier=1.0, max_grad_norm=1.0)
    hook = None
    if audited:
        dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
        coords = torch.randperm(dim, generator=gen)[:1000].sort().values.tolist()
        policy = ["every_step" if i % 2 else "never" for i in range(1000)]
        grads = GradientCanaries.dirac(coords, norm=1.0, dim=dim, policy=policy)
        xc, yc = data(name, 64, gen)
        hook = AuditHook(opt, model, [InputCanaries(xc.to(device), yc.to(device)), grads])
    times = []
    peak_reset(device)
    prof = None
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        prof = torch_profile(activities=acts)
    ctx = hook if hook is not None else _null()
    with ctx:
        step = 0
        while step < a.steps:
            for xb, yb in loader:
                xb, yb = xb.to(device), yb.to(device)
                if prof is not None and step == a.warmup:
                    prof.__enter__()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if step >= a.warmup:
                    times.append(time.perf_counter() - t0)
                step += 1
                if prof is not None and step == a.warmup + 3:
                    prof.__exit__(None, None, None)
                    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
                    print(prof.key_averages().table(sort_by=key, row_limit=15))
                    prof = None
                if step >= a.steps:
                    break
    return statistics.median(times), peak_mb(device), sum(p.numel() for p in model.parameters())


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="resnet18,transformer")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64, help="expected (Poisson) batch size")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="width multiplier")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    device = torch.device(a.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}; device {device} ({name}); "
          f"{a.steps} steps ({a.warmup} warm-up), expected batch {a.batch}, scale {a.scale}")
    print("| model | weights | plain s/step | audited s/step | ratio | plain peak MB "
          "| audited peak MB | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for model in a.models.split(","):
        plain, aud = [], []
        for _ in range(a.repeats):
            plain.append(train(model, False, a, device))
            aud.append(train(model, True, a, device))
        tp, ta = (statistics.median(r[0] for r in rows) for rows in (plain, aud))
        mp, ma = (max(r[1] for r in rows) for rows in (plain, aud))
        print(f"| {model} | {plain[0][2]:,} | {tp:.4f} | {ta:.4f} | {ta / tp:.2f} | {mp:.0f} "
              f"| {ma:.0f} | {ma / mp:.2f} |", flush=True)
        if a.profile:
            print(f"\n{model}: the 15 costliest operators of 3 audited steps")
            train(model, True, a, device, profile=True)


if __name__ == "__main__":
    main()
