"""Time ROC + every epsilon lower bound at n scores per side, in seconds and as x np.sort.

Run: python benchmarks/bench_stats.py [--sizes 1e4 1e5 1e6] [--delta 1e-6] [--repeats 3]

Scores: members N(2, 1), non-members N(0, 1), n of each (m = 2n canaries for one_run). Each
time is the best of ``--repeats`` calls (least disturbed by other load); the ratio to one
np.sort of the n member scores, measured in the same run, makes the numbers comparable across
machines. The machine load (os.getloadavg) and torch/numpy threads are printed beside them.
one_run's line also shows m*delta and whether its bound was applicable (it needs m*delta << 1).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from dpaudit.stats import epsilon_lower_bound, roc_curve

METHODS = ("clopper_pearson", "gdp", "one_run", "density", "density_tv")


def best_of(fn, repeats: int = 3) -> tuple[float, object]:
    """Smallest wall time of ``repeats`` calls and the last call's result."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def run(n: int, delta: float, repeats: int) -> None:
    """Print one block of timings at n scores per side."""
    rng = np.random.default_rng(0)
    s_in, s_out = rng.normal(2.0, 1.0, n), rng.normal(0.0, 1.0, n)
    base, _ = best_of(lambda: np.sort(s_in), repeats)
    print(f"n = {n} scores per side, delta = {delta:g}; np.sort = {base * 1e3:.2f} ms")
    rows = [("roc_curve", lambda: roc_curve(s_in, s_out))]
    for method in METHODS:
        rows.append(
            (method, lambda m=method: epsilon_lower_bound(s_in, s_out, delta=delta, method=m))
        )
    total = 0.0
    for name, fn in rows:
        t, res = best_of(fn, repeats)
        total += t
        extra = ""
        if name == "one_run":
            extra = f"  eps {res.epsilon:.3f}, m*delta {res.details['m_delta']:.3g}, {res.kind}"
        print(f"{name:>16s}: {t:8.3f} s {t / base:8.1f} x np.sort{extra}")
    print(f"{'all':>16s}: {total:8.3f} s {total / base:8.1f} x np.sort")
    print(f"{'load':>16s}: {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"cpus={os.cpu_count()}, load {os.getloadavg()}"
    )
    for n in args.sizes:
        run(int(n), args.delta, args.repeats)


if __name__ == "__main__":
    main()
