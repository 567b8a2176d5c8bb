"""Cost of auditing: step time and peak memory of audited vs plain Opacus training.

Models: logistic regression and the small CNN (``dpaudit.models``) on digits. Audited runs use
K in {1, 16, 64} input canaries and the scalar score; the logical batch is ~270 so that
K = 64 <= B / 4. Printed numbers are ratios measured in one run:

* time: paired per-iteration ratios audited / plain with one torch thread. All configurations
  (plain, K=1, K=16, K=64) start from the same seed and run one iteration each per round, in
  an order rotated every round, so round r trains every configuration on the same Poisson
  batch and a slow spell of the machine hits all of them alike; the printed ratio is the median
  over rounds of t_K / t_plain. "iteration" is a whole training iteration (loading the batch
  from the DataLoader, forward, backward, ``optimizer.step()``) - the target's "training" -
  and "compute" the same without the loading. A fifth configuration, plain training with the
  64 canary examples appended to every batch as training rows, gives the floor for K = 64:
  what computing 64 more per-sample gradients costs by itself;
* memory: each configuration runs in a fresh subprocess. On CUDA the peak is
  ``torch.cuda.max_memory_allocated`` over the training steps (after a reset); on CPU it is the
  growth of the process' peak resident set (``resource.getrusage(...).ru_maxrss``) over its
  resident set after one warm-up step, i.e. the extra memory the steps needed, with glibc told
  to mmap every block >= 64 KiB (``MALLOC_MMAP_THRESHOLD_``) so that freed tensors leave the
  resident set at once (otherwise malloc's cache hides MB-scale differences). CPU RSS is
  coarse (MB), so the tensor memory the hook itself holds after T steps is also printed
  (exact: bytes of the tensors reachable from the hook): it must not grow with T. It is reported
  for two numbers of steps T (memory must grow with K d, not with T) next to K d in MB.

Run: ``python benchmarks/bench_capture.py`` (``--quick`` for a short smoke run).
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
from torch.utils.data import DataLoader

from dpaudit.capture import AuditHook, InputCanaries
from dpaudit.data import load_dataset
from dpaudit.models import build_model

warnings.filterwarnings("ignore")
KS = (1, 16, 64)
BATCH = 320  # DataLoader batch size; Opacus' expected logical batch is N / ceil(N / 320)


def _setup(model_name: str, k: int, device: str, seed: int = 0):
    train, test, info = load_dataset("digits", seed=seed, test_fraction=0.1)
    torch.manual_seed(seed)
    model = build_model(model_name, info.input_shape, info.num_classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(train, batch_size=BATCH, generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0
    )
    hook = None
    if k:
        x, y = test.tensors
        hook = AuditHook(opt, model, InputCanaries(x[:k], y[:k])).attach()
    return model, opt, loader, hook


def _batches(loader):
    """An endless stream of the loader's batches (epoch after epoch)."""
    while True:
        yield from loader


def _iteration(model, opt, batches, device: str) -> tuple[float, float]:
    """One training iteration; returns (seconds with loading, seconds without loading)."""
    start = time.perf_counter()
    xb, yb = next(batches)
    xb, yb = xb.to(device), yb.to(device)
    loaded = time.perf_counter()
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    end = time.perf_counter()
    return end - start, end - loaded


def _steps(model, opt, loader, device: str, n: int) -> None:
    """Run n training iterations (the memory runs)."""
    batches = _batches(loader)
    for _ in range(n):
        _iteration(model, opt, batches, device)


def time_ratios(model_name: str, device: str, rounds: int) -> dict:
    """Paired per-iteration ratios audited / plain (module docstring).

    Every configuration starts from the same seed, so in round r all of them train on the same
    Poisson batch (same size); the configurations run one iteration each per round, in an
    order rotated every round, so a slow spell of the machine hits all of them alike. The ratio
    reported for K is the median over rounds of t_K(r) / t_plain(r), for the whole iteration
    (loading + forward + backward + step) and for the compute alone (batch already loaded).
    """
    keys = (0, *KS, "floor")
    setups = {k: _setup(model_name, 0 if k == "floor" else k, device) for k in keys}
    streams = {k: _batches(s[2]) for k, s in setups.items()}
    _, test, _ = load_dataset("digits", seed=0, test_fraction=0.1)
    streams["floor"] = _appended(streams["floor"], *(t[: max(KS)] for t in test.tensors))
    for k, s in setups.items():  # warm-up, same number of batches for every configuration
        for _ in range(3):
            _iteration(s[0], s[1], streams[k], device)
    full: dict[int, list[float]] = {k: [] for k in keys}
    compute: dict[int, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            t_full, t_compute = _iteration(setups[k][0], setups[k][1], streams[k], device)
            full[k].append(t_full)
            compute[k].append(t_compute)

    def ratio(times, k):
        return float(np.median(np.array(times[k]) / np.array(times[0])))

    d = sum(p.numel() for p in setups[0][0].parameters())
    return {
        "d": d,
        "B": setups[0][1].expected_batch_size,
        "plain_ms": float(np.median(full[0])) * 1e3,
        "plain_compute_ms": float(np.median(compute[0])) * 1e3,
        "iteration": {k: ratio(full, k) for k in KS},
        "compute": {k: ratio(compute, k) for k in KS},
        "floor": (ratio(full, "floor"), ratio(compute, "floor")),
    }


def _appended(batches, x, y):
    """The batches with the same K examples appended as training rows: plain training on B + K
    rows, the least any method pays that computes K more per-sample gradients."""
    for xb, yb in batches:
        yield torch.cat([xb, x]), torch.cat([yb, y])


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _tensor_bytes(obj, seen: set | None = None) -> int:
    """Bytes of the distinct tensors reachable from ``obj`` through dicts/lists/attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v, seen) for v in obj)
    if isinstance(obj, AuditHook | InputCanaries):
        return _tensor_bytes(vars(obj), seen)
    return 0


def hook_state_bytes(hook: AuditHook) -> int:
    """Tensor memory the hook itself holds (canary inputs, vectors, accumulators, buffers)."""
    skip = ("optimizer", "model", "_params")  # the model's own parameters are not hook state
    state = {k: v for k, v in vars(hook).items() if k not in skip}
    return _tensor_bytes(state)


def memory_child(model_name: str, k: int, steps: int, device: str) -> None:
    """Subprocess body: print the extra peak memory (bytes) of ``steps`` training steps."""
    torch.set_num_threads(1)
    model, opt, loader, hook = _setup(model_name, k, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _steps(model, opt, loader, device, steps)
        extra = torch.cuda.max_memory_allocated() - base
    else:
        base = _rss_bytes()
        _steps(model, opt, loader, device, steps)
        extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    held = hook_state_bytes(hook) if hook is not None else 0
    print(json.dumps({"extra": extra, "held": held}))


def memory(model_name: str, k: int, steps: int, device: str) -> tuple[float, float]:
    """(extra peak memory, tensor memory held by the hook) in MB, from a fresh subprocess."""
    # Large blocks (>= 64 KiB: every tensor that scales with K d) are mmap'ed and returned to
    # the OS on free, so the resident set follows live tensor memory instead of malloc's cache.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, __file__, "--child", model_name, str(k), str(steps), device],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    rec = json.loads(out.strip().splitlines()[-1])
    return rec["extra"] / 2**20, rec["held"] / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        name, k, steps, dev = args.child
        memory_child(name, int(k), int(steps), dev)
        return
    torch.set_num_threads(1)
    plan = {"logreg": (600, 10, 40), "cnn": (150, 4, 16)}  # rounds, T1, T2 (memory)
    if args.quick:
        plan = {"logreg": (30, 3, 9), "cnn": (6, 2, 6)}
    print(f"device: {device}; threads: {torch.get_num_threads()}")
    for name, (rounds, t_short, t_long) in plan.items():
        r = time_ratios(name, device, rounds)
        print(
            f"\n{name}: d = {r['d']}, expected batch B = {r['B']}, plain iteration "
            f"{r['plain_ms']:.1f} ms of which compute {r['plain_compute_ms']:.1f} ms "
            f"(medians over {rounds} rounds)"
        )
        print(
            f"  K   K/B    time: iteration (compute)   peak extra MB T={t_short}/T={t_long} "
            f"(plain)   hook-held MB T={t_short}/T={t_long}   K d MB"
        )
        plain = memory(name, 0, t_short, device)[0], memory(name, 0, t_long, device)[0]
        for k in KS:
            (p1, h1), (p2, h2) = memory(name, k, t_short, device), memory(name, k, t_long, device)
            print(
                f"  {k:<3d} {k / r['B']:.3f}  {r['iteration'][k]:5.2f}x ({r['compute'][k]:5.2f}x)"
                f"            {p1:7.2f} / {p2:7.2f} ({plain[0]:.2f} / {plain[1]:.2f})     "
                f"{h1:8.4f} / {h2:8.4f}       {k * r['d'] * 4 / 2**20:.3f}"
            )
        print(
            f"  (reference: plain training on B + {max(KS)} rows costs "
            f"{r['floor'][0]:.2f}x ({r['floor'][1]:.2f}x))"
        )


if __name__ == "__main__":
    main()
