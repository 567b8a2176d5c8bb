"""Data-rate canaries on the mechanism itself: certified, ceiling, within-family, the anchors.

For each mechanism of ``--configs`` (the anchor of a public white-box benchmark on CIFAR-10:
q 0.0819, T 2,500 at epsilon 4 and 8, delta 1e-5, PRV; the README loop: q 0.0445, T 224,
epsilon 4) and each canary count of ``--sizes`` (in all, half members, half non-members),
one markdown row, every epsilon as a fraction of the claimed one (PRV):

* the plan (``forecast.data_rate_plan``-equivalent: ``stats.data_rate.plan_data_rate``),
  made from the claim and the sizes before any score is drawn; its designs in brackets;
* on ``--draws`` exact draws of the scores (``simulate_mixture_scores``: T steps of
  Bernoulli(q) inclusions and Gaussian noise per canary, the audit's mixture log-LR), the
  plan's statements (``DataRatePlan.evaluate`` with the accountant's curves,
  ``ThreatModel.roc_curve``): the CERTIFIED epsilon_lower, median [min-max]; the
  within-family epsilon at sigma_upper (CONDITIONAL on a Poisson-subsampled Gaussian); how
  many draws the claim test rejects at 95% and at the PRIVACY BUG level (1e-6): 0 expected;
* the count ceiling (``count_ceiling``: the best pre-registered count test's exact median
  certified epsilon) with the count step at its median, and the plan's design's exact median;
* an upper bound on the median of ANY valid certified bound (``universal_ceiling``: the
  Neyman-Pearson power against the mechanism capped at e falls below 1/2 there);
* the existing methods on the same draws: Clopper-Pearson with the default Bonferroni
  candidates, Steinke et al.'s one-run (the paper's grid), the f-DP one-run certified
  (``fdp_one_run_certified``) and its GDP estimate (``fdp_one_run``, an estimate, not a
  bound), and the anchors' figures (Steinke 0.50 / 0.43, f-DP 0.68 / 0.60 at eps 4 / 8 with
  10^4 canaries).

Every statement is at 95% (the audit splits its 5% over its statements). One core
(``OMP_NUM_THREADS=1``); the seconds per row are printed. Run (measured on the shared 2-core
machine, load 2-4: 3.7, 1.7, 4.8 and 5.2 minutes, at most 1.5 GB; the ceilings' table 10):

    OMP_NUM_THREADS=1 python benchmarks/data_rate_ceiling.py --configs anchor4,anchor8 \\
        --sizes 1000,10000
    OMP_NUM_THREADS=1 python benchmarks/data_rate_ceiling.py --configs anchor4 --sizes 100000
    OMP_NUM_THREADS=1 python benchmarks/data_rate_ceiling.py --configs anchor8 --sizes 100000
    OMP_NUM_THREADS=1 python benchmarks/data_rate_ceiling.py --configs readme \\
        --sizes 2000,20000

``--ceilings-at 0.5,1,2,4,8 --sizes 2000,20000,200000`` prints instead, for the README
loop's q and T with sigma set to each claimed epsilon, the ceilings alone (no draws; exact):
why the lower side is weak at small epsilon.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings

import numpy as np
from scipy.optimize import brentq

from dpaudit.accounting import prv_epsilon
from dpaudit.stats import epsilon_lower_bound
from dpaudit.stats.data_rate import (
    count_ceiling,
    plan_data_rate,
    simulate_mixture_scores,
    universal_ceiling,
)
from dpaudit.threat_model import ThreatModel

DELTA = 1e-5
CONFIDENCE = 0.95
REFUTATION = 1e-6
CONFIGS = {  # name: (q, T, claimed epsilon, anchors' (Steinke, f-DP) fractions or None)
    "anchor4": (0.0819, 2500, 4.0, (0.50, 0.68)),
    "anchor8": (0.0819, 2500, 8.0, (0.43, 0.60)),
    "readme": (0.0445, 224, 4.0, None),
}


def sigma_for(q: float, steps: int, eps: float) -> float:
    """The noise multiplier whose PRV epsilon at delta is ``eps`` (to 1e-6). Bracketed from
    above in factors of 1.5: a PRV at a far too small sigma (0.3 at T = 2,500) takes GBs."""
    hi = 50.0
    lo = hi / 1.5
    while prv_epsilon(lo, q, steps, DELTA) < eps:
        hi, lo = lo, lo / 1.5
    return float(brentq(lambda s: prv_epsilon(s, q, steps, DELTA) - eps, lo, hi, xtol=1e-6))


def med(xs, scale=1.0) -> str:
    xs = [x / scale for x in xs if x is not None and np.isfinite(x)]
    if not xs:
        return "n/a"
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"


def existing(s_in, s_out) -> dict:
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, method in (("cp_bonferroni", "clopper_pearson"), ("steinke", "one_run"),
                            ("fdp_certified", "fdp_one_run_certified"),
                            ("fdp_estimate", "fdp_one_run")):
            try:
                b = epsilon_lower_bound(s_in, s_out, delta=DELTA, confidence=CONFIDENCE,
                                        method=method)
                out[key] = b.epsilon if b.applicable else 0.0
            except ValueError:
                out[key] = 0.0
    return out


def row(name: str, total: int, draws: int, seed: int) -> dict:
    q, steps, eps, anchors = CONFIGS[name]
    t0 = time.perf_counter()
    sigma = sigma_for(q, steps, eps)
    n = total // 2
    threat = ThreatModel(noise_multiplier=sigma, max_grad_norm=1.0, sample_rate=q, steps=steps,
                         delta=DELTA, canary_kind="gradient", canary_norm=1.0)
    plan = plan_data_rate(steps=steps, sample_rate=q, noise_multiplier=sigma, delta=DELTA,
                          n_in=n, n_out=n, confidence=CONFIDENCE, refutation_level=REFUTATION)
    t_plan = time.perf_counter() - t0
    ceil = count_ceiling(plan.law, n, n, delta=DELTA, confidence=CONFIDENCE)
    univ = universal_ceiling(plan.law, n, n, confidence=CONFIDENCE)
    t_ceil = time.perf_counter() - t0 - t_plan

    def family_roc(s):
        return lambda a: threat.roc_curve(a, noise_multiplier=s)

    out = {"config": name, "q": q, "steps": steps, "epsilon": eps, "sigma": sigma,
           "total": total, "per_side": n, "plan": plan.to_dict(), "ceiling": ceil.to_dict(),
           "universal": univ, "certified": [], "within_family": [], "sigma_upper": [],
           "claim_95": 0, "claim_refuted": 0, "cp_bonferroni": [], "steinke": [],
           "fdp_certified": [], "fdp_estimate": [], "anchors": anchors}
    t_sim = t_eval = t_exist = 0.0
    for r in range(draws):
        rng = np.random.default_rng([seed, sum(map(ord, name)), total, r])
        t1 = time.perf_counter()
        s_in, s_out = simulate_mixture_scores(n, n, steps=steps, sample_rate=q,
                                              noise_multiplier=sigma, rng=rng)
        t2 = time.perf_counter()
        ev = plan.evaluate(s_in, s_out, family_roc=family_roc,
                           epsilon_of_sigma=threat.estimated_epsilon)
        t3 = time.perf_counter()
        for k, v in existing(s_in, s_out).items():
            out[k].append(v)
        t4 = time.perf_counter()
        t_sim, t_eval, t_exist = t_sim + t2 - t1, t_eval + t3 - t2, t_exist + t4 - t3
        out["certified"].append(ev.epsilon_lower.epsilon)
        out["within_family"].append(ev.epsilon_within_family)
        out["sigma_upper"].append(ev.sigma_upper)
        out["claim_95"] += ev.claim_rejected
        out["claim_refuted"] += ev.refuted
    out["seconds"] = {"plan": t_plan, "ceilings": t_ceil, "simulation": t_sim,
                      "evaluation": t_eval, "existing_methods": t_exist,
                      "total": time.perf_counter() - t0}
    return out


def print_row(r: dict) -> None:
    e = r["epsilon"]
    p = r["plan"]
    d = p["epsilon_design"]["design"]
    fam = p["family_design"]
    anchors = r["anchors"]
    anc = (f"Steinke {anchors[0]:.2f}, f-DP {anchors[1]:.2f}" if anchors and r["total"] ==
           10_000 else "-")
    s = r["seconds"]
    print(f"| {r['config']} (eps {e:g}, sigma {r['sigma']:.4f}) | {r['total']:,} "
          f"| {med(r['certified'], e)} (ranks {d['k_hi']}/{d['k_lo']}) "
          f"| {p['expected']['epsilon_lower'] / e:.3f} "
          f"| {r['ceiling']['epsilon'] / e:.3f} (step {r['ceiling']['step'] / e:.4f}; "
          f"one-sided {r['ceiling']['one_sided'] / e:.3f}) "
          f"| {r['universal'] / e:.3f} "
          f"| {med(r['within_family'], e)} (sigma_upper / sigma "
          f"{med(r['sigma_upper'], r['sigma'])}; ranks {fam['k_hi']}/{fam['k_lo']}) "
          f"| {r['claim_95']} / {r['claim_refuted']} "
          f"| {med(r['cp_bonferroni'], e)} | {med(r['steinke'], e)} "
          f"| {med(r['fdp_certified'], e)} | {med(r['fdp_estimate'], e)} | {anc} "
          f"| {s['total']:.0f} (plan {s['plan']:.0f}, ceilings {s['ceilings']:.0f}, "
          f"draws {s['simulation']:.0f} + {s['evaluation']:.0f} + "
          f"{s['existing_methods']:.0f}) |", flush=True)


def ceilings_at(epsilons, sizes) -> None:
    """The count ceiling and the upper bound for any valid method across claimed epsilons
    (the README loop's q and T), as fractions of the claim, per canary count."""
    q, steps = CONFIGS["readme"][0], CONFIGS["readme"][1]
    print("| claimed epsilon (sigma) | canaries in all | count ceiling / claim (one-sided) "
          "| upper bound, any valid method / claim | s |")
    print("|---|---|---|---|---|")
    for eps in epsilons:
        sigma = sigma_for(q, steps, eps)
        law = None
        for total in sizes:
            t0 = time.perf_counter()
            from dpaudit.stats.data_rate import mixture_score_law

            law = law or mixture_score_law(steps, q, sigma)
            n = total // 2
            c = count_ceiling(law, n, n, delta=DELTA, confidence=CONFIDENCE)
            u = universal_ceiling(law, n, n, confidence=CONFIDENCE)
            print(f"| {eps:g} ({sigma:.4f}) | {total:,} | {c.epsilon / eps:.3f} "
                  f"({c.one_sided / eps:.3f}) | {u / eps:.3f} "
                  f"| {time.perf_counter() - t0:.0f} |", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="anchor4,anchor8,readme")
    p.add_argument("--sizes", default="1000,10000", help="canaries in all (half per side)")
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="append the rows here (JSON lines)")
    p.add_argument("--ceilings-at", default=None,
                   help="comma-separated claimed epsilons: ceilings only (README q, T)")
    a = p.parse_args(argv)
    if a.ceilings_at:
        ceilings_at([float(x) for x in a.ceilings_at.split(",")],
                    [int(x) for x in a.sizes.split(",")])
        return
    print(f"{platform.machine()}, {platform.processor() or platform.system()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; delta {DELTA}, every "
          f"statement at {CONFIDENCE:.0%}, refutation at {REFUTATION:g}; {a.draws} exact draws "
          "per row; fractions of the claimed epsilon (PRV)")
    print("| mechanism | canaries in all | certified epsilon_lower, median [range] (design "
          "ranks in/out) | the design's exact median | count ceiling (exact) | upper bound, "
          "any valid method | within-family epsilon at sigma_upper (conditional) | claim "
          "rejected at 95% / at 1e-6 | CP + Bonferroni | Steinke one-run | f-DP one-run "
          "certified | f-DP one-run GDP estimate (not a bound) | anchors' figures | s |")
    print("|" + "---|" * 14)
    for name in a.configs.split(","):
        for total in (int(x) for x in a.sizes.split(",")):
            r = row(name, total, a.draws, a.seed)
            print_row(r)
            if a.json:
                with open(a.json, "a") as fh:
                    fh.write(json.dumps(r, default=float) + "\n")


if __name__ == "__main__":
    main()
