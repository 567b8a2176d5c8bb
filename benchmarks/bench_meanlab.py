"""Mean-lab benchmark: the seed 001 Figure 2 setting (n = 1000, d = 5000, 2000 rounds).

For each mechanism, times one full fixed-target game (sampling + oracle LR score) and prints
the ratio to drawing the same number (rounds x d) of Binomial(n, p) variates, measured in the
same run. Run: ``python benchmarks/bench_meanlab.py [--rounds R] [--repeats K]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpaudit.meanlab import (
    ExactMean,
    NoisyMean,
    PoissonSubsampledMean,
    SubsampledMean,
    bernoulli_product,
    easy_target,
    fixed_target_game,
)


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    """Print game time / Binomial-draw time for each mechanism."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--d", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    dist = bernoulli_product(args.d, 0.25, 0)
    z = easy_target(dist)
    rng = np.random.default_rng(1)
    base = _best(lambda: rng.binomial(args.n, dist.mean, size=(args.rounds, args.d)), args.repeats)
    print(f"n={args.n} d={args.d} rounds={args.rounds}; best of {args.repeats}")
    print(f"baseline: {args.rounds} x {args.d} Binomial(n, p) draws = 1.00")
    mechs = {
        "exact mean": ExactMean(args.n),
        "noisy mean (gamma=1)": NoisyMean(args.n, 1.0),
        "sub-sampled shared (rho=0.5)": SubsampledMean(args.n, 0.5, "shared"),
        "sub-sampled independent (rho=0.5)": SubsampledMean(args.n, 0.5, "independent"),
        "Poisson (q=0.5)": PoissonSubsampledMean(args.n, 0.5),
    }
    for name, mech in mechs.items():
        t = _best(lambda m=mech: fixed_target_game(dist, m, z, args.rounds, seed=2), args.repeats)
        print(f"{name:36s} game / baseline = {t / base:5.2f}")


if __name__ == "__main__":
    main()
