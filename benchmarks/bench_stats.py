"""Time ROC + every epsilon lower bound on 2e5 scores per side, as ratios to one np.sort.

Run: python benchmarks/bench_stats.py. Prints time(method) / time(np.sort of the 2e5 scores),
all measured in this run (best of 3 repeats), so the numbers are comparable across machines.
"""

from __future__ import annotations

import time

import numpy as np

from dpaudit.stats import epsilon_lower_bound, roc_curve

N = 200_000
DELTA = 1e-6


def best_of(fn, repeats: int = 3) -> float:
    """Smallest wall time of ``repeats`` calls (least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    rng = np.random.default_rng(0)
    s_in, s_out = rng.normal(2.0, 1.0, N), rng.normal(0.0, 1.0, N)
    base = best_of(lambda: np.sort(s_in))
    print(f"np.sort of {N} scores: reference = 1.0")
    rows = [("roc_curve", lambda: roc_curve(s_in, s_out))]
    for method in ("clopper_pearson", "gdp", "one_run", "density", "density_tv"):
        rows.append(
            (method, lambda m=method: epsilon_lower_bound(s_in, s_out, delta=DELTA, method=m))
        )
    total = 0.0
    for name, fn in rows:
        t = best_of(fn)
        total += t
        print(f"{name:>16s}: {t / base:8.1f} x np.sort")
    print(f"{'all':>16s}: {total / base:8.1f} x np.sort")


if __name__ == "__main__":
    main()
