"""Validity of the data-rate canaries' statements: coverage, false alarms, power.

Part ``coverage``: the certified ``epsilon_lower`` (``stats.data_rate.certify_epsilon``) on
mechanisms whose epsilon at delta 1e-5 is known exactly, with the designs the plan makes from
a claim (the README loop's mechanism at 10^3 canaries per side, the anchor's at eps 4 and
5,000 per side); the design is fixed from the claim, the mechanism is not the claim's:

* the Poisson-subsampled Gaussian (q 0.0445, T 224) at noise 0.8, 1 and 1.5 x the claimed
  sigma (exact draws; the score keeps the claimed parameters; epsilon from its exact law);
* the tight (eps, delta)-DP pair (randomised response with a delta atom on each side: its
  ROC is the (eps, delta) boundary; three score values, ties broken by seeded uniforms, a
  fresh seed per run) at eps 1, 2, 4;
* Laplace(mu) against Laplace(0) (epsilon mu + 2 log(1 - delta)) at mu 1 and 3;
* Gaussian scores N(mu, 1) against N(0, 1) (mu-GDP) at mu 2.

A miss is a certified epsilon above the truth; the table counts the runs whose p-value at the
true epsilon is <= 5% (every miss is one of them: the p-value increases with epsilon), with
the exact binomial 95% upper end of the rate. It must stay <= 5%.

Part ``claim``: the claim test of the user's curve (the plan's curve designs, the
accountant's curve with its error bounds: ``ThreatModel.roc_curve``) on correct runs (false
alarms: at the bounds' 95% and at the PRIVACY BUG level 1e-6; 0 refutations expected) and on
mechanisms that double the epsilon or more (sigma halved; q doubled), for the README loop
(10^4 per side, exact draws) and the anchor at eps 4 (5,000 per side, draws from the score's
exact law on its grid, labelled so: T = 2,500 steps per canary are 1.5 s a run), with the
exact rejection probabilities beside (``design.power`` under the law).

Part ``anchors``: why a figure above the count ceiling need not be certified. The anchor
mechanism (5,000 canaries per side) capped at e (``ceiling.capped_pair``: its score law with
the likelihood ratio clipped to [e^-e, e^e] beyond the points where its ROC meets the lines
of slope e^e: an (e, 0)-DP pair, equal to the mechanism elsewhere) is sampled on the law's
grid, and every method runs on it: a valid certified bound exceeds the pair's epsilon
(computed exactly on the grid, <= e) in at most 5% of the runs; the f-DP one-run's GDP
estimate (the kind of figure the anchor's f-DP audit reports) is not bound by that.

Run (one core, measured: 9, 9 and 2 minutes):

    OMP_NUM_THREADS=1 python benchmarks/data_rate_validity.py --part coverage --reps 2000
    OMP_NUM_THREADS=1 python benchmarks/data_rate_validity.py --part claim --reps 1000
    OMP_NUM_THREADS=1 python benchmarks/data_rate_validity.py --part anchors --reps 50
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
from scipy.stats import beta as beta_law

from dpaudit.stats import epsilon_lower_bound
from dpaudit.stats.data_rate import (
    capped_pair,
    certify_epsilon,
    count,
    design_epsilon,
    mixture_score_law,
    null_p_value,
    plan_data_rate,
    power,
    simulate_mixture_scores,
)
from dpaudit.stats.data_rate.count_test import dp_roc
from dpaudit.stats.gdp import gdp_epsilon
from dpaudit.threat_model import ThreatModel

DELTA = 1e-5
README = (0.0445, 224, 1.0563408)  # q, T, sigma: PRV epsilon 4.000 at delta 1e-5
ANCHOR = (0.0819, 2500, 4.519172)  # PRV epsilon 4.000


def upper95(k: int, n: int) -> float:
    return float(beta_law.ppf(0.95, k + 1, n - k)) if k < n else 1.0


def tight(eps, n, member, rng):
    e = np.exp(eps)
    p1 = (1 - DELTA) * e / (1 + e)
    u = rng.random(n)
    if member:
        return np.where(u < DELTA, 2.0, np.where(u < DELTA + p1, 1.0, 0.0))
    return np.where(u < DELTA, -1.0, np.where(u < DELTA + p1, 0.0, 1.0))


def mechanisms():
    q, steps, sigma = README
    out = []
    for f in (0.8, 1.0, 1.5):
        law = mixture_score_law(steps, q, sigma * f)
        out.append((f"subsampled Gaussian, noise {f} x sigma (eps {law.epsilon(DELTA):.3f})",
                    law.epsilon(DELTA),
                    lambda n, rng, f=f: simulate_mixture_scores(
                        n, n, steps=steps, sample_rate=q, noise_multiplier=sigma,
                        true_noise=sigma * f, rng=rng)))
    for e in (1.0, 2.0, 4.0):
        out.append((f"tight ({e:g}, 1e-5)-DP pair (ties)", e,
                    lambda n, rng, e=e: (tight(e, n, True, rng), tight(e, n, False, rng))))
    for mu in (1.0, 3.0):
        out.append((f"Laplace mu {mu:g}", mu + 2 * np.log1p(-DELTA),
                    lambda n, rng, mu=mu: (rng.laplace(mu, 1, n), rng.laplace(0, 1, n))))
    out.append(("Gaussian scores, mu 2 (GDP)", gdp_epsilon(2.0, DELTA),
                lambda n, rng: (rng.normal(2, 1, n), rng.normal(0, 1, n))))
    return out


def coverage(reps: int, seed: int) -> None:
    designs = []
    for name, (q, steps, sigma), n in (("README 10^3/side", README, 1000),
                                        ("anchor 5,000/side", ANCHOR, 5000)):
        law = mixture_score_law(steps, q, sigma)
        d = design_epsilon(law, n, n, delta=DELTA, confidence=0.95).design
        designs.append((name, d, n))
    print(f"coverage of epsilon_lower at 95%, delta {DELTA}, {reps} runs per cell: runs "
          "rejecting the TRUE epsilon (>= the misses) / runs, [exact binomial 95% upper end]")
    print("| mechanism (true epsilon) | " + " | ".join(
        f"{nm} (ranks {d.k_hi}/{d.k_lo})" for nm, d, _ in designs) + " | s |")
    print("|---|" + "---|" * len(designs) + "---|")
    for label, truth, draw in mechanisms():
        cells = []
        t0 = time.perf_counter()
        for _, d, n in designs:
            rng = np.random.default_rng([seed, n, sum(map(ord, label))])
            roc = dp_roc(truth, DELTA)
            rejected = 0
            for r in range(reps):
                s_in, s_out = draw(n, rng)
                c = count(s_in, s_out, dataclasses.replace(d, tie_seed=r))
                rejected += null_p_value(d, c, roc) <= 0.05
            cells.append(f"{rejected} / {reps} [{upper95(rejected, reps):.4f}]")
        print(f"| {label} ({truth:.4f}) | " + " | ".join(cells)
              + f" | {time.perf_counter() - t0:.0f} |", flush=True)


def claim(reps: int, seed: int) -> None:
    print(f"claim test of the user's curve (PRV with its error bounds): runs rejecting at 95% "
          f"(warning) / at 1e-6 (PRIVACY BUG) out of {reps}; exact probabilities in brackets")
    print("| mechanism | canaries per side | truth | rejected at 95% | rejected at 1e-6 "
          "| draws | s |")
    print("|---|---|---|---|---|---|---|")
    for name, (q, steps, sigma), n, exact_draws in (("README loop", README, 10_000, True),
                                                    ("anchor eps 4", ANCHOR, 5_000, False)):
        threat = ThreatModel(noise_multiplier=sigma, max_grad_norm=1.0, sample_rate=q,
                             steps=steps, delta=DELTA, canary_kind="gradient",
                             canary_norm=1.0)

        def claimed(a, threat=threat):
            return threat.roc_curve(a)

        plan = plan_data_rate(steps=steps, sample_rate=q, noise_multiplier=sigma, delta=DELTA,
                              n_in=n, n_out=n, confidence=0.95, refutation_level=1e-6)
        truths = (("correct", {}), ("sigma halved", {"true_noise": sigma / 2}),
                  ("q doubled", {"true_rate": 2 * q}))
        for label, kw in truths:
            t0 = time.perf_counter()
            law = mixture_score_law(steps, q, sigma, **kw)
            ex95 = power(plan.family, claimed, law)
            ex6 = power(plan.refute, claimed, law)
            runs = reps if label == "correct" else max(20, reps // 10)
            rng = np.random.default_rng([seed, n, sum(map(ord, label))])
            r95 = r6 = 0
            for r in range(runs):
                if exact_draws:
                    s_in, s_out = simulate_mixture_scores(n, n, steps=steps, sample_rate=q,
                                                          noise_multiplier=sigma, rng=rng,
                                                          **kw)
                else:
                    s_in = rng.choice(law.values_in, size=n, p=law.pmf_in)
                    s_out = rng.choice(law.values_out, size=n, p=law.pmf_out)
                fam = dataclasses.replace(plan.family, tie_seed=r)
                ref = dataclasses.replace(plan.refute, tie_seed=r)
                r95 += null_p_value(fam, count(s_in, s_out, fam), claimed) <= 0.05
                r6 += null_p_value(ref, count(s_in, s_out, ref), claimed) <= 1e-6
            how = "exact (T steps each)" if exact_draws else "the exact law's grid"
            print(f"| {name} (q {q}, T {steps}, sigma {sigma:.4f}) | {n:,} | {label} "
                  f"| {r95} / {runs} [{ex95:.3g}] | {r6} / {runs} [{ex6:.3g}] | {how} "
                  f"| {time.perf_counter() - t0:.0f} |", flush=True)


def _pair_epsilon(v, p, q) -> float:
    """The (epsilon, 1e-5) of a pair of pmfs on one grid (both orders), by bisection."""
    def delta(e):
        c = np.exp(e)
        return max(np.maximum(p - c * q, 0).sum(), np.maximum(q - c * p, 0).sum())
    lo, hi = 0.0, 64.0
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if delta(mid) > DELTA else (lo, mid)
    return hi


def anchors(reps: int, seed: int) -> None:
    import warnings

    q, steps = ANCHOR[0], ANCHOR[1]
    n = 5000
    print(f"the anchor mechanism capped at e, {n:,} canaries per side, {reps} runs per row: "
          "median of each method / runs above the capped pair's epsilon (valid: <= 5%)")
    print("| claim | capped at e (pair's epsilon) | ours: certified epsilon_lower | CP + "
          "Bonferroni | Steinke one-run | f-DP one-run certified | f-DP one-run GDP estimate "
          "(not a bound) | s |")
    print("|---|---|---|---|---|---|---|---|")
    for eps, sigma, caps in ((4.0, ANCHOR[2], (None, 1.8, 2.2, 2.72)),
                             (8.0, 2.5778206, (None, 3.6, 4.0, 4.8))):
        law = mixture_score_law(steps, q, sigma)
        design = design_epsilon(law, n, n, delta=DELTA, confidence=0.95).design
        for cap in caps:
            t0 = time.perf_counter()
            if cap is None:
                v, p_in, p_out = law.values_out, law.pmf_in, law.pmf_out
                truth = law.epsilon(DELTA)
            else:
                v, p_in, p_out = capped_pair(law, cap)
                truth = _pair_epsilon(v, p_in, p_out)
            p_in, p_out = p_in / p_in.sum(), p_out / p_out.sum()
            rng = np.random.default_rng([seed, int(eps), int((cap or 0) * 100)])
            vals = {k: [] for k in ("ours", "cp", "steinke", "fdp_cert", "fdp_est")}
            for r in range(reps):
                s_in = rng.choice(v, size=n, p=p_in)
                s_out = rng.choice(v, size=n, p=p_out)
                vals["ours"].append(certify_epsilon(
                    s_in, s_out, dataclasses.replace(design, tie_seed=r), delta=DELTA).epsilon)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    for k, m in (("cp", "clopper_pearson"), ("steinke", "one_run"),
                                 ("fdp_cert", "fdp_one_run_certified"),
                                 ("fdp_est", "fdp_one_run")):
                        try:
                            b = epsilon_lower_bound(s_in, s_out, delta=DELTA, method=m)
                            vals[k].append(b.epsilon if b.applicable else 0.0)
                        except ValueError:
                            vals[k].append(0.0)
            cells = [f"{np.median(x):.3f} / {sum(y > truth for y in x)}" for x in vals.values()]
            what = "none (the mechanism)" if cap is None else f"{cap:g}"
            print(f"| eps {eps:g} (sigma {sigma:.4f}) | {what} ({truth:.3f}) | "
                  + " | ".join(cells) + f" | {time.perf_counter() - t0:.0f} |", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("coverage", "claim", "anchors"), required=True)
    p.add_argument("--reps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    {"coverage": coverage, "claim": claim, "anchors": anchors}[a.part](a.reps, a.seed)


if __name__ == "__main__":
    main()
