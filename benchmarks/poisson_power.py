"""Power of the claim test for canaries inserted like real examples (Poisson, q per step).

A Dirac gradient canary of norm C on a coordinate no example touches sees, at each step, its
own coordinate of the noisy sum, in units of C: u_t = B_t + N(0, (factor sigma)^2), with
B_t ~ Bernoulli(q) for a member and 0 for a non-member, over T steps (what the audit hook
records for ``canary=gradient_poisson``). This script draws those observations exactly, for
K canaries (each a member with probability 1/2), at a true noise of factor x sigma, and runs
the audit's claim test of the configured sigma (``ThreatModel``: the Poisson-subsampled
Gaussian's curve at q, T, sigma) on two scores of the same observations:

* ``scalar``: the epoch-summed scalar product sum_t u_t;
* ``mixture_lr``: the per-step mixture likelihood ratio sum_t log(1 - q + q e^(D u_t - D^2/2)),
  D = 1 / sigma (the configured sigma: the score may not know the truth), computed by
  ``dpaudit.attacks.mixture.mixture_log_lr``, the function the audit uses.

It prints, per (q, factor), the fraction of repetitions whose claim test rejects (factor 1.0:
the false-alarm rate, which must stay <= 1 - confidence), with a binomial standard error. The
claim test runs at the audit's per-statement confidence for one attack and the default five
methods (95% split over 6 statements: 0.99167). Run:

    python benchmarks/poisson_power.py --reps 200
    python benchmarks/poisson_power.py --sigma 1.0 --reps 200 --qs 0.1
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
import torch

from dpaudit.attacks.mixture import mixture_log_lr
from dpaudit.stats.claim import claim_test
from dpaudit.threat_model import ThreatModel

PER_TEST = 1.0 - 0.05 / 6  # one attack, five methods + its claim test: the audit's split


def observations(k: int, steps: int, q: float, noise: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """(member bits, (K, T) per-step observations in units of C) at true noise ``noise``."""
    member = rng.random(k) < 0.5
    present = (rng.random((k, steps)) < q) & member[:, None]
    return member, present + rng.normal(0.0, noise, (k, steps))


def scores(u: np.ndarray, q: float, sigma: float) -> dict[str, np.ndarray]:
    """Both scores of the same observations (the mixture at the configured sigma)."""
    d = torch.tensor(1.0 / sigma, dtype=torch.float64)
    lr = mixture_log_lr(torch.from_numpy(u / sigma), d, q).sum(dim=1).numpy()
    return {"scalar": u.sum(axis=1), "mixture_lr": lr}


def power(q, factor, *, sigma, steps, k, reps, seed) -> dict[str, float]:
    """Rejection rate of the claim at ``sigma`` when the truth is ``factor`` x sigma."""
    threat = ThreatModel(
        noise_multiplier=sigma, max_grad_norm=1.0, sample_rate=q, steps=steps, delta=1e-5,
        canary_kind="gradient", canary_norm=1.0,
    )
    rejected = {"scalar": 0, "mixture_lr": 0}
    rng = np.random.default_rng([seed, round(q * 1e6), round(factor * 1e3)])
    for _ in range(reps):
        member, u = observations(k, steps, q, factor * sigma, rng)
        for name, s in scores(u, q, sigma).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = claim_test(s[member], s[~member], threat.tradeoff, confidence=PER_TEST)
            rejected[name] += bool(res.rejected)
    return {name: n / reps for name, n in rejected.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sigma", type=float, default=6.0, help="configured noise multiplier")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--k", type=int, default=1000, help="canaries (each a member w.p. 1/2)")
    p.add_argument("--qs", default="0.1,0.01", help="per-step inclusion probabilities")
    p.add_argument("--factors", default="1.0,0.9,0.8", help="true noise / configured")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(
        f"sigma {args.sigma:g}, T = {args.steps}, K = {args.k} canaries (members w.p. 1/2), "
        f"{args.reps} repetitions, claim test at {PER_TEST:.5f}; rejection rate +- s.e."
    )
    print(f"{'q':>6} {'factor':>7} {'scalar':>16} {'mixture_lr':>16} {'s':>5}")
    for q in (float(x) for x in args.qs.split(",")):
        for f in (float(x) for x in args.factors.split(",")):
            t0 = time.perf_counter()
            r = power(q, f, sigma=args.sigma, steps=args.steps, k=args.k, reps=args.reps,
                      seed=args.seed)
            cells = [
                f"{r[n]:.3f} +- {math.sqrt(r[n] * (1 - r[n]) / args.reps):.3f}"
                for n in ("scalar", "mixture_lr")
            ]
            print(f"{q:6g} {f:7.2f} {cells[0]:>16} {cells[1]:>16} "
                  f"{time.perf_counter() - t0:5.0f}")


if __name__ == "__main__":
    main()
