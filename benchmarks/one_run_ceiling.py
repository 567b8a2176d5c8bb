"""The sound ceiling of one-run count tests, beside what the certified methods reach.

For each eps of ``--eps`` (delta 1e-5, mu = gdp_mu(eps, delta)) and m of ``--ms``, on ideal
scores (each of m canaries a member with probability 1/2, score N(mu, 1) if a member, N(0, 1)
if not), one markdown row with fractions of the true epsilon:

* **sound ceiling**: ``dpaudit.validity.ceiling.count_test_ceiling(mu, m)``: the best guess
  count's median certified epsilon for a count test valid on every regime mixture
  ``RegimeMixture(mu', a)`` (a on ``DEFAULT_A_GRID``) and on independent canaries. Exact
  (no Monte Carlo); the best k and the binding nulls in brackets.
* **GDP claims, ours**: the certified mu_lower ("not mu'-GDP for any mu' < mu_lower") of
  ``epsilon_lower_bound(..., method="fdp_one_run")`` as the epsilon of mu_lower-GDP (that
  epsilon is an estimate: it assumes a GDP-shaped curve), with the
  guess count fixed by the claim (``design_mu`` = mu, as the audit's one-run claim test
  does) and with a count per claim (no claim given); the same family as the ceiling.
* **epsilon claims**: the ceilings of count tests of (eps', delta)-DP, one-sided
  (``epsilon_count_ceiling``) and two-sided ("in" for the k top, "out" for the k bottom:
  ``two_sided_epsilon_count_ceiling``; randomized response on independent canaries is such a
  null), then **fdp_one_run_certified** (one pair fixed by the claim, as the audit, one- or
  two-sided as the design picks; the same restricted to one-sided counts; a count per claim)
  and **Steinke one_run** (the paper's grid under Bonferroni; one pair fixed by the claim):
  ``epsilon_lower_bound(..., method=...)`` on ``--reps`` draws
  (random guess counts), median [min-max]; Steinke's counts 0 when not ``applicable``, and
  all count 0 on a draw whose member count they refuse as implausible under inclusion 1/2
  (two-sided p < 1e-3; the number of such draws is printed).
* **order statistics** (not valid under interaction): the count test whose critical values
  model the guesses as independent mu'-GDP canaries (``a_grid=()``), at its own best k for
  independent canaries; its certified fraction on the same draws, median [min-max], and in
  brackets k and its exact median (``count_test_ceiling(mu, m, a_grid=())``).
* **order statistics rejects a TRUE claim**: that test of the true mu, with its k, on
  ``RegimeMixture(mu, 0.1)``: the fraction of ``--regime-runs`` simulated runs (default 100)
  it rejects, and the exact rate. A valid level-5% test stays at or below 0.05. The runs'
  seeds do not depend on eps (common random numbers): the same runs are loud for every eps,
  and the test rejects about exactly those.

Run (defaults: eps 1, 2, 4, 8; m = 1e3, 1e4, 1e5; 20 draws; 100 regime runs):

    python benchmarks/one_run_ceiling.py
    python benchmarks/one_run_ceiling.py --eps 4 --json ceiling.json
    python benchmarks/one_run_ceiling.py --eps 1,8 --ms 1000,10000 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from dpaudit.stats import epsilon_lower_bound, gdp_epsilon
from dpaudit.stats.gdp import gdp_mu
from dpaudit.validity.ceiling import (
    INDEPENDENT,
    certified_mu,
    count_survival,
    count_test_ceiling,
    critical_values,
    epsilon_count_ceiling,
    two_sided_epsilon_count_ceiling,
)
from dpaudit.validity.interacting import RegimeMixture

DELTA = 1e-5
REGIME_A = 0.1


def med(xs) -> str:
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]" if xs else "n/a"


def ideal_draw(mu: float, m: int, rng: np.random.Generator):
    members = rng.random(m) < 0.5
    return rng.standard_normal(m) + mu * members, members


def top_k_correct(scores: np.ndarray, members: np.ndarray, k: int) -> int:
    return int(members[np.argpartition(-scores, k - 1)[:k]].sum())


def row(eps: float, m: int, reps: int, regime_runs: int, seed: int) -> dict:
    t0 = time.perf_counter()
    mu = gdp_mu(eps, DELTA)
    true_eps = gdp_epsilon(mu, DELTA)
    ceiling = count_test_ceiling(mu, m, delta=DELTA)
    order = count_test_ceiling(mu, m, delta=DELTA, a_grid=())  # its k: best if independent
    k_os = order["k"]
    out = {"eps": eps, "mu": mu, "m": m, "ceiling": ceiling["fraction"], "k": ceiling["k"],
           "binding": ceiling["binding"],
           "epsilon_ceiling": epsilon_count_ceiling(mu, m, delta=DELTA)["fraction"],
           "epsilon_ceiling_two_sided": two_sided_epsilon_count_ceiling(
               mu, m, delta=DELTA)["fraction"],
           "gdp_design": [], "gdp_default": [], "cert_design": [], "cert_design_one": [],
           "cert_default": [], "one_run": [], "one_run_design": [],
           "refused": 0, "order_statistics": [], "order_k": k_os,
           "order_statistics_ideal_ceiling": order["fraction"]}
    counts = []
    for r in range(reps):
        scores, members = ideal_draw(mu, m, np.random.default_rng([seed, m, r, round(eps * 1e3)]))
        s_in, s_out = scores[members], scores[~members]
        for key, method, opts in (
            ("gdp_design", "fdp_one_run", {"design_mu": mu}),
            ("gdp_default", "fdp_one_run", {}),
            ("cert_design", "fdp_one_run_certified", {"design_mu": mu}),
            ("cert_design_one", "fdp_one_run_certified", {"design_mu": mu,
                                                          "two_sided": False}),
            ("cert_default", "fdp_one_run_certified", {}),
            ("one_run", "one_run", {}),
            ("one_run_design", "one_run", {"design_mu": mu}),
        ):
            try:
                b = epsilon_lower_bound(s_in, s_out, delta=DELTA, method=method, **opts)
            except ValueError:  # a split implausible under 1/2: refused, certifies nothing
                out["refused"] += key == "one_run"  # all refuse the same draws
                out[key].append(0.0)
                continue
            out[key].append(b.epsilon / true_eps if b.applicable else 0.0)
        counts.append(top_k_correct(scores, members, k_os))
    cert = certified_mu(np.array(counts), k_os, m, 2 * mu, a_grid=())
    out["order_statistics"] = [gdp_epsilon(c, DELTA) / true_eps if c > 0 else 0.0 for c in cert]

    crit = int(critical_values(mu, m, k_os, a_grid=())[INDEPENDENT])
    mech = RegimeMixture(mu, REGIME_A)
    rejected = 0
    for r in range(regime_runs):
        scores, members = mech.draw(m, np.random.default_rng([seed, m, r, 77]))
        rejected += top_k_correct(scores, members, k_os) >= crit
    exact = sum(w * float(count_survival(mu, m, k_os, crit, lo=lo, hi=hi))
                for w, (lo, hi) in ((REGIME_A, mech.band(True)),
                                    (1 - REGIME_A, mech.band(False))))
    out.update(order_critical=crit, regime_rejects=rejected / regime_runs,
               regime_runs=regime_runs, regime_rejects_exact=exact,
               seconds=time.perf_counter() - t0)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eps", default="1,2,4,8", help="comma-separated epsilons (delta 1e-5)")
    p.add_argument("--ms", default="1000,10000,100000", help="comma-separated canary counts")
    p.add_argument("--reps", type=int, default=20, help="draws of ideal scores per row")
    p.add_argument("--regime-runs", type=int, default=100,
                   help="RegimeMixture(mu, 0.1) runs for the order-statistics test")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows here")
    a = p.parse_args(argv)
    epss = [float(x) for x in a.eps.split(",") if x]
    ms = [int(x) for x in a.ms.split(",") if x]
    print(f"{platform.machine()}, {platform.processor() or platform.system()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; delta {DELTA}; level 5%; "
          f"{a.reps} draws of ideal scores per row (random guess counts)")
    print("| eps | mu | m | GDP claims: sound ceiling of count tests (k; binding nulls) "
          "| ours: GDP eps of the certified mu_lower (an estimate), count fixed by the claim "
          "| same, count per claim "
          "| epsilon claims: sound ceiling of count tests, one-sided / two-sided "
          "| fdp_one_run_certified, pair fixed by the claim (one- or two-sided) "
          "| same, one-sided count fixed by the claim | same, count per claim "
          "| Steinke one_run, the paper's grid | Steinke one_run, one pair fixed by the claim "
          "| order statistics (not valid under interaction) (k) | order statistics rejects "
          "TRUE claim on RegimeMixture(mu, 0.1) (exact) | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    t0 = time.perf_counter()
    for eps in epss:
        for m in ms:
            r = row(eps, m, a.reps, a.regime_runs, a.seed)
            rows.append(r)
            n = r["refused"]
            refused = f" ({n} refused draw{'s' * (n > 1)}: 0)" if n else ""
            print(f"| {eps:g} | {r['mu']:.4f} | {m:,} | {r['ceiling']:.3f} ({r['k']}; "
                  f"{', '.join(r['binding'])}) | {med(r['gdp_design'])}{refused} "
                  f"| {med(r['gdp_default'])} | {r['epsilon_ceiling']:.3f} / "
                  f"{r['epsilon_ceiling_two_sided']:.3f} "
                  f"| {med(r['cert_design'])} | {med(r['cert_design_one'])} "
                  f"| {med(r['cert_default'])} "
                  f"| {med(r['one_run'])} | {med(r['one_run_design'])} "
                  f"| {med(r['order_statistics'])} (k {r['order_k']}; "
                  f"exact {r['order_statistics_ideal_ceiling']:.3f}) "
                  f"| {r['regime_rejects']:.2f} of {r['regime_runs']} "
                  f"({r['regime_rejects_exact']:.3f}) | {r['seconds']:.1f} |", flush=True)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"delta": DELTA, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
