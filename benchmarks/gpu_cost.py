"""The audit's cost inside a user's own training loop at the scale people train.

Each set-up is trained with Opacus DP-SGD in an ordinary loop, (a) plainly and (b) with
``AuditHook`` at its defaults (1,000 Dirac gradient canaries and input canaries sized to the
batch, ceil(B / 16): 4 at B = 64, 16 at 256, 64 at 1,024, the
white-box records on, the training loader given to the hook so that the sampling, integrity and
noise-ignores-data checks run), alternated ``--repeats`` times on the same seed, **each
training in its own fresh process** (so that its peak memory is its own):

* ``resnet_b256``: a ResNet-18-shaped CNN (BasicBlocks [2, 2, 2, 2], widths 64-512 x
  ``--scale``, GroupNorm for DP) on CIFAR-shaped synthetic data (3 x 32 x 32, 10 classes),
  expected (Poisson) batch 256;
* ``resnet_b1024``: the same at an expected batch of 1,024 through Opacus'
  ``BatchMemoryManager`` (physical batches of 256);
* ``transformer_b64``: a small transformer classifier (token embedding 1,000 x 256 x
  ``--scale``, 4 blocks of Opacus' ``DPMultiheadAttention`` with 4 heads + an MLP 4x as wide),
  sequences of 128 tokens, expected batch 64.

The data set holds 16 expected batches (sample rate 1/16). Prints, per set-up, the median
seconds per *logical* step (optimizer steps that BatchMemoryManager skips are part of the next
real step's time) over the steps after ``--warmup`` (``torch.cuda.synchronize`` around each
on CUDA), the peak memory of each training (``torch.cuda.max_memory_allocated`` on CUDA; on
CPU the process's peak RSS during the training, VmHWM reset through ``/proc/self/clear_refs``
when training starts), the ratios audited / plain, and the device, threads and load. With
``--profile``, the 15 costliest operators of three audited steps (in the parent process).
``one_run_live_1e5`` has its own script: ``benchmarks/one_run_live_cost.py``.
``--input-canaries`` and ``--hook-kwargs`` change the audited training (what each part of the
hook costs: e.g. ``--hook-kwargs '{"check_clipping": false}'``). ``--floor`` also times the
plain training with K more rows per batch (K the input canaries): the cost of computing K
more per-example gradients per step the way Opacus computes the batch's, without the hook.

    python benchmarks/gpu_cost.py --device cuda
    OMP_NUM_THREADS=2 python benchmarks/gpu_cost.py --scale 0.25 --steps 8 --warmup 2  # CPU
    python benchmarks/gpu_cost.py --device cuda --profile --setups resnet_b256
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
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


SETUPS = {  # name: (model, expected batch, physical batch or None)
    "resnet_b256": ("resnet18", 256, None),
    "resnet_b1024": ("resnet18", 1024, 256),
    "transformer_b64": ("transformer", 64, None),
}
SEQ = 128
BATCHES = 16  # the data set holds this many expected batches


def data(name: str, n: int, gen: torch.Generator):
    y = torch.randint(0, 10, (n,), generator=gen)
    if name == "resnet18":
        return torch.randn(n, 3, 32, 32, generator=gen), y
    return torch.randint(0, 1000, (n, SEQ), generator=gen), y


def build(name: str, scale: float):
    return resnet18(scale) if name == "resnet18" else Transformer(scale, seq=SEQ)


def peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # the process's peak RSS from here on (Linux)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(setup: str, audited: bool, a, device: torch.device, profile: bool = False) -> dict:
    """One training of ``a.steps`` logical steps: seconds per step after warm-up, peak MB."""
    from opacus import PrivacyEngine
    from opacus.utils.batch_memory_manager import BatchMemoryManager
    from torch.utils.data import DataLoader, TensorDataset

    from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries

    name, batch, physical = SETUPS[setup]
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = data(name, BATCHES * batch, gen)
    model = build(name, a.scale).to(device)
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=batch + a.extra_rows),
        noise_multiplier=1.0, max_grad_norm=1.0)
    hook = None
    if audited:
        dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
        coords = torch.randperm(dim, generator=gen)[:1000].sort().values.tolist()
        policy = ["every_step" if i % 2 else "never" for i in range(1000)]
        grads = GradientCanaries.dirac(coords, norm=1.0, dim=dim, policy=policy)
        sets = [grads]
        k = input_canary_count(a.input_canaries, batch)
        if k:
            xc, yc = data(name, k, gen)
            sets.insert(0, InputCanaries(xc.to(device), yc.to(device)))
        hook = AuditHook(opt, model, sets, data_loader=loader, **json.loads(a.hook_kwargs))
    times: list[float] = []
    prof = None
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        prof = torch_profile(activities=acts, profile_memory=True)
    peak_reset(device)
    with (hook if hook is not None else _null()), \
            (BatchMemoryManager(data_loader=loader, max_physical_batch_size=physical,
                                optimizer=opt) if physical else _null(loader)) as batches:
        step, t0 = 0, None
        while step < a.steps:
            for xb, yb in batches:
                if t0 is None:
                    if prof is not None and step == a.warmup:
                        prof.__enter__()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                xb, yb = xb.to(device), yb.to(device)
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                if opt._is_last_step_skipped:  # a physical batch of a logical step
                    continue
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if step >= a.warmup:
                    times.append(time.perf_counter() - t0)
                t0 = None
                step += 1
                if prof is not None and step == a.warmup + 3:
                    prof.__exit__(None, None, None)
                    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
                    print(prof.key_averages().table(sort_by=key, row_limit=15))
                    prof = None
                if step >= a.steps:
                    break
    return {"seconds": statistics.median(times), "peak_mb": peak_mb(device),
            "weights": sum(p.numel() for p in model.parameters())}


class _null:
    def __init__(self, value=None):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


BATCH_SHARE = 16  # input canaries sized to the batch: one per 16 expected examples


def input_canary_count(option: str, batch: int) -> int:
    """``--input-canaries``: ``auto`` (the default) sizes them to the batch, ceil(B / 16)
    (4 at B = 64, 16 at 256, 64 at 1,024: each adds the same 1/16 of per-example gradient
    rows to a step), an integer fixes K (0: none)."""
    if option == "auto":
        return -(-batch // BATCH_SHARE)
    k = int(option)
    if k < 0:
        raise ValueError(f"--input-canaries must be 'auto' or a non-negative integer, got {k}")
    return k


def _in_fresh_process(setup: str, audited: bool, argv: list[str]) -> dict:
    """``train`` in a new interpreter: its JSON result (the last line it prints)."""
    cmd = [sys.executable, __file__, *argv, "--worker", setup, "--audited", str(int(audited))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--setups", default=",".join(SETUPS))
    p.add_argument("--steps", type=int, default=30, help="logical steps per training")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="width multiplier")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--input-canaries", default="auto",
                   help="input canaries: 'auto' (ceil(B / 16), sized to the batch) or K")
    p.add_argument("--hook-kwargs", default="{}",
                   help='AuditHook options as JSON, e.g. \'{"check_clipping": false}\'')
    p.add_argument("--floor", action="store_true",
                   help="also time plain training at the expected batch + the input canaries")
    p.add_argument("--extra-rows", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--audited", type=int, default=0, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    device = torch.device(a.device)
    if a.worker:
        print(json.dumps(train(a.worker, bool(a.audited), a, device)))
        return
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}; device {device} ({name}); "
          f"{a.steps} logical steps ({a.warmup} warm-up), scale {a.scale}, each training in "
          f"its own process, alternated {a.repeats}x")
    print("| set-up | weights | plain s/step | audited s/step | ratio | plain peak MB "
          "| audited peak MB | ratio |" + (" plain at B + K rows: time, memory ratio |"
                                          if a.floor else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if a.floor else ""))
    forward = [x for x in argv if x not in ("--profile", "--floor")]
    for setup in a.setups.split(","):
        plain, aud, floor = [], [], []
        for _ in range(a.repeats):
            plain.append(_in_fresh_process(setup, False, forward))
            aud.append(_in_fresh_process(setup, True, forward))
            if a.floor:  # the same training with K more rows per step, without the hook
                k = input_canary_count(a.input_canaries, SETUPS[setup][1])
                floor.append(_in_fresh_process(setup, False, [*forward, "--extra-rows", str(k)]))
        tp, ta = (statistics.median(r["seconds"] for r in rows) for rows in (plain, aud))
        mp, ma = (statistics.median(r["peak_mb"] for r in rows) for rows in (plain, aud))
        extra = ""
        if floor:
            tf = statistics.median(r["seconds"] for r in floor)
            mf = statistics.median(r["peak_mb"] for r in floor)
            extra = f" {tf / tp:.2f}, {mf / mp:.2f} |"
        print(f"| {setup} | {plain[0]['weights']:,} | {tp:.4f} | {ta:.4f} | {ta / tp:.2f} "
              f"| {mp:.0f} | {ma:.0f} | {ma / mp:.2f} |{extra}", flush=True)
        if a.profile:
            print(f"\n{setup}: the 15 costliest operators of 3 audited steps")
            train(setup, True, a, device, profile=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
