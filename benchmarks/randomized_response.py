"""Tied scores: certified bounds on randomized response, where every score is 0 or 1.

eps0-randomized response reports a canary's membership bit truthfully with probability
e^eps0 / (1 + e^eps0): pure eps0-DP, and its scores are all tied. For each eps0 it draws
``--reps`` samples of ``--n`` member and ``--n`` non-member scores (the validity suite's
``randomized_response`` scenario) and prints, median [min, max] over the samples:

* the default certified bounds: ``clopper_pearson`` and ``one_run`` (ties broken at random,
  seeded; ``dpaudit.stats.ties``), with the fraction of samples above the true epsilon;
* the claim test against a claim of perfect privacy (f(a) = 1 - a): how often it rejects;
* the claim test against the true curve (a correct claim): how often it rejects (at most
  1 - confidence, up to noise).

Run:

    python benchmarks/randomized_response.py --reps 200
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from dpaudit.stats import epsilon_lower_bound
from dpaudit.stats.claim import claim_test
from dpaudit.validity import randomized_response


def _perfect(a):
    return 1.0 - np.asarray(a, dtype=np.float64)


def one(eps0: float, n: int, reps: int, seed: int) -> dict:
    scen = randomized_response(eps0)
    rng = np.random.default_rng([seed, round(eps0 * 1000)])
    cp, one_run, perfect, correct = [], [], 0, 0
    for _ in range(reps):
        s_in, s_out = scen.sample(n, n, rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kw = {"delta": 1e-5, "confidence": 0.95}
            cp.append(epsilon_lower_bound(s_in, s_out, method="clopper_pearson", **kw).epsilon)
            one_run.append(epsilon_lower_bound(s_in, s_out, method="one_run", **kw).epsilon)
            perfect += claim_test(s_in, s_out, _perfect).rejected
            correct += claim_test(
                s_in, s_out, scen.tradeoff, tradeoff_reverse=scen.tradeoff_reverse
            ).rejected
    return {
        "truth": scen.true_epsilon(1e-5),
        "clopper_pearson": np.array(cp),
        "one_run": np.array(one_run),
        "perfect_rejected": perfect / reps,
        "correct_rejected": correct / reps,
    }


def _mr(x: np.ndarray, truth: float) -> str:
    """median [min, max] and the fraction above the truth."""
    return f"{np.median(x):.3f} [{np.min(x):.3f}, {np.max(x):.3f}] >{np.mean(x > truth):.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eps0", default="0.5,1,2")
    p.add_argument("--n", type=int, default=1000, help="scores per side")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(f"randomized response, {args.n} scores per side, {args.reps} samples, delta 1e-5, 95%")
    head = (
        f"{'eps0':>5} {'truth':>6} {'clopper_pearson (> truth)':>33} {'one_run (> truth)':>33} "
        f"{'rejects perfect':>15} {'rejects truth':>13} {'s':>4}"
    )
    print(head)
    for e in (float(x) for x in args.eps0.split(",")):
        t0 = time.perf_counter()
        r = one(e, args.n, args.reps, args.seed)
        print(
            f"{e:5g} {r['truth']:6.3f} {_mr(r['clopper_pearson'], r['truth']):>33} "
            f"{_mr(r['one_run'], r['truth']):>33} "
            f"{r['perfect_rejected']:15.3f} {r['correct_rejected']:13.3f} "
            f"{time.perf_counter() - t0:4.0f}"
        )


if __name__ == "__main__":
    main()
