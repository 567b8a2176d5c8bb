"""Tightness of the audit presets, certified and estimated, over seeds.

For each configuration (``default``; ``tight_every_step`` at eps 2 / 4 / 8, i.e.
``dp.noise_multiplier`` 19.938 / 10.812 / 6.0023; ``tight_poisson``) and ``--seeds`` seeds,
runs the preset on the correct optimizer and prints median [min-max] over seeds of

* certified: the claim test's mu_lower / mu (every-step threat models, where mu exists),
  sigma / sigma_upper (1 = the data pin the noise down to the configured one), and the
  Clopper-Pearson epsilon / claimed epsilon;
* estimates (labelled so; never bounds): gdp, gaussian and fdp_one_run epsilon / claimed
  epsilon (fdp_one_run only where ``dpaudit.stats.METHODS`` has it);

with the time per run. Each audit's methods are the preset's plus any of clopper_pearson,
gdp, gaussian, fdp_one_run it lacks (printed: more methods split the 5% more ways). Runs:

    OMP_NUM_THREADS=1 python benchmarks/tightness.py --seeds 3
    OMP_NUM_THREADS=1 python benchmarks/tightness.py --configs default,tight_eps4 --seeds 10

Extra Hydra overrides for every configuration go after ``--``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict_power import med_range, run_preset

CONFIGS = {
    "default": ("default", []),
    "tight_eps2": ("tight_every_step", ["dp.noise_multiplier=19.938"]),
    "tight_eps4": ("tight_every_step", ["dp.noise_multiplier=10.811618495202332"]),
    "tight_eps8": ("tight_every_step", ["dp.noise_multiplier=6.0023"]),
    "tight_poisson": ("tight_poisson", []),
}
WANTED = ("clopper_pearson", "gdp", "gaussian", "fdp_one_run")
ESTIMATES = ("gdp", "gaussian", "fdp_one_run")


def methods_for(preset: str) -> list[str]:
    from verdict_power import compose_groups

    from dpaudit.stats import METHODS

    have = list(compose_groups(preset, [])["audit"]["methods"])
    return have + [m for m in WANTED if m in METHODS and m not in have]


def best(result: dict, method: str) -> dict | None:
    """The largest epsilon of ``method`` over attacks (valid or not, flagged)."""
    rows = [b for b in result["bounds"] if b["method"] == method and b["epsilon"] == b["epsilon"]]
    return max(rows, key=lambda b: b["epsilon"], default=None)


def summarise(result: dict, seconds: float) -> dict:
    theory, v = result["theory"], result["verdict"]
    claimed = v["claimed_epsilon"]
    mu = theory.get("gaussian_mu")
    cert = [c for c in result["claim"].values() if c["certified"]]
    s = {
        "status": v["status"],
        "claimed_epsilon": claimed,
        "mu_ratio": max(c["mu_lower"] for c in cert) / mu if (mu and cert) else None,
        "sigma_ratio": v["noise_multiplier"] / v["sigma_upper"] if v["sigma_upper"] else None,
        "sigma_certified": v["sigma_upper_certified"],
        "seconds": seconds,
    }
    for m in ("clopper_pearson", *ESTIMATES):
        b = best(result, m)
        s[m] = b["epsilon"] / claimed if b else None
        s[f"{m}_kind"] = b["kind"] if b else None
        s[f"{m}_valid"] = b["valid"] if b else None
    return s


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    from dpaudit.stats import METHODS

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    table = []
    for name in a.configs.split(","):
        preset, ov = CONFIGS[name]
        methods = methods_for(preset)
        ov = [*ov, f"audit.methods=[{','.join(methods)}]", *a.overrides]
        runs = []
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            load = os.getloadavg()[0]
            result, _groups, secs = run_preset(preset, [*ov, f"seed={seed}"])
            s = summarise(result, secs)
            s.update(seed=seed, load=load, config=name, methods=methods)
            runs.append(s)
            print(
                f"  {name} seed={seed}: "
                + ", ".join(
                    f"{k}={val:.3f}" if isinstance(val, float) else f"{k}={val}"
                    for k, val in s.items()
                    if k not in ("methods", "config")
                ),
                flush=True,
            )
        table.append((name, preset, ov, runs))

    print(
        f"\nthreads {torch.get_num_threads()}, {os.cpu_count()} cores, {platform.machine()}; "
        f"fdp_one_run {'registered' if 'fdp_one_run' in METHODS else 'NOT registered: left out'}"
    )
    print(
        "\n| config | claimed eps | seeds | certified: mu_lower / mu | sigma / sigma_upper "
        "| clopper_pearson / claimed | estimate: gdp / claimed | estimate: gaussian / claimed "
        "| estimate: fdp_one_run / claimed | s per run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, _, _, runs in table:
        gauss = med_range([r["gaussian"] for r in runs])
        bad = sum(r["gaussian_valid"] is False for r in runs)
        if bad:
            gauss += f" (check failed in {bad}/{len(runs)})"
        print(
            f"| {name} | {runs[0]['claimed_epsilon']:.3f} | {len(runs)} "
            f"| {med_range([r['mu_ratio'] for r in runs])} "
            f"| {med_range([r['sigma_ratio'] for r in runs])} "
            f"| {med_range([r['clopper_pearson'] for r in runs])} "
            f"| {med_range([r['gdp'] for r in runs])} | {gauss} "
            f"| {med_range([r['fdp_one_run'] for r in runs])} "
            f"| {med_range([r['seconds'] for r in runs])} |"
        )
    for name, preset, ov, _ in table:
        print(f"  {name}: experiment={preset} {' '.join(ov)}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump([r for *_, runs in table for r in runs], fh, indent=1)


if __name__ == "__main__":
    main()
