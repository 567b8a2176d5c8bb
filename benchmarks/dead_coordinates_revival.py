"""How many coordinates ``dead_coordinates`` returns of each kind, and how many come alive.

For each seed: a model of the zoo (``dpaudit.models``) on digits at theta_0; the structurally
dead coordinates (``kind="structural"``) and the ones dead at theta_0 (``kind="at_theta0"``)
with the time each took; then plain (non-private) SGD training for ``--epochs`` epochs, and
how many of each kind receive data gradient at the end (dead at theta_0 minus dead at the end,
per-example gradients over the whole training set). The structural ones must stay dead (0 come
alive, whatever the training); the others may not. Prints the per-seed rows, then the median
and range over the seeds.

    OMP_NUM_THREADS=1 python benchmarks/dead_coordinates_revival.py --model cnn --width 16
    OMP_NUM_THREADS=1 python benchmarks/dead_coordinates_revival.py --model mlp --width 100
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from dpaudit.capture import dead_coordinates
from dpaudit.data import load_dataset
from dpaudit.models import build_model


def one_seed(name: str, width: int, epochs: int, lr: float, seed: int) -> dict:
    train, _, info = load_dataset("digits", seed=0)
    model = build_model(name, info.input_shape, info.num_classes, width=width, seed=seed)
    start = time.perf_counter()
    structural = set(dead_coordinates(model, train).tolist())
    mid = time.perf_counter()
    at_theta0 = set(dead_coordinates(model, train, kind="at_theta0").tolist())
    end = time.perf_counter()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for xb, yb in DataLoader(train, batch_size=64, shuffle=True, generator=gen):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    after = set(dead_coordinates(model, train, kind="at_theta0").tolist())
    return {"structural": len(structural), "at_theta0": len(at_theta0),
            "structural_alive": len(structural - after), "at_theta0_alive": len(at_theta0 - after),
            "seconds_structural": mid - start, "seconds_at_theta0": end - mid}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seeds", type=int, default=5)
    a = parser.parse_args()
    rows = [one_seed(a.model, a.width, a.epochs, a.lr, s) for s in range(a.seeds)]
    for s, r in enumerate(rows):
        print(f"seed {s}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in r.items()))
    print(f"{a.model} width {a.width} on digits, {a.epochs} epochs of SGD (lr {a.lr}, batch "
          f"64), {a.seeds} seeds: median [min, max]")
    for key in rows[0]:
        v = np.array([r[key] for r in rows], dtype=float)
        print(f"  {key:20s} {np.median(v):.3g} [{v.min():.3g}, {v.max():.3g}]")


if __name__ == "__main__":
    main()
